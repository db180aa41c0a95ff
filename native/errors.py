"""The root of every error this project raises, and the typed errors of the codecs.

:class:`DnbError` lives here because ``native`` is the bottom of the import graph: every
layer (``wal``, ``uploader``, ``tiered``) can import it without importing upwards. Each
layer has its own subtree under it (docs/ERRORS.md draws the tree). Both codec twins
raise exactly the codec errors below.
"""
from __future__ import annotations


class DnbError(Exception):
    """Root of every error raised by this project's packages.

    ``except DnbError`` catches any failure the storage layer reports on purpose, and
    nothing else (a bug's ``TypeError`` or ``AttributeError`` still escapes). Classes
    that also fit a built-in (``ValueError``, ``OSError``, ``TimeoutError`` ...) inherit
    it too, so callers catching the built-in keep working."""


class CodecError(DnbError, ValueError):
    """Bytes that do not follow the format, or input that cannot be encoded."""


class CorruptSegmentHeader(CodecError):
    """A WAL segment header with a wrong magic, version, flags or CRC."""


class CorruptObject(CodecError):
    """A dnb1 object that is truncated or fails validation; names the object and byte position."""

    def __init__(self, object_name: str, position: int, reason: str) -> None:
        super().__init__(f"dnb1 object {object_name!r}: {reason} at byte {position}")
        self.object_name = object_name
        self.position = position
        self.reason = reason


class OffsetOverflow(CodecError):
    """An offset past ``native.format.MAX_OFFSET`` (2**63 - 1) was asked for: the topic is
    full. Nothing was appended; offsets are never wrapped or reused."""


class ColumnsError(CodecError):
    """A frame or record the columnar decoder (``native.columns``) refuses; ``position`` is the
    frame's byte position."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"frame at byte {position}: {reason}")
        self.position = position
        self.reason = reason


class ColumnsTooLarge(CodecError):
    """The kept rows would not fit one Arrow array with int32 offsets; narrow the range."""

    def __init__(self, buffer: str, size: int, limit: int) -> None:
        super().__init__(f"{buffer} would hold {size} bytes, more than {limit}")
        self.buffer = buffer
        self.size = size
        self.limit = limit
