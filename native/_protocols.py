"""The contract the codec twins satisfy, one protocol per pair of twin modules.

Each pure-Python module and its compiled twin implement the same protocol:
:class:`FramesTwin` (``native._frames_py`` / ``native._frames``), :class:`AppendTwin`
(``native._append_py`` / ``native._append``) and :class:`ObjectsTwin` (``native._objects_py``
/ ``native._objects``). :class:`CodecTwin` is all three, which is what ``native.codec`` and
each entry of ``native.available_codecs()`` provide. The type checker holds each twin module
(the compiled ones through their ``.pyi`` stubs) to these in ``native/_twin_check.py``;
``tests/native/test_contract.py`` checks at run time that every module exposes the names
of :data:`PART_NAMES`. Signatures mirror the stubs ``native/_frames.pyi``, ``_append.pyi`` and
``_objects.pyi``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from native.format import Buffer, Record, ScanResult
# The object twins' protocol lives beside the object format it serves (object_format.py
# types its ``codec=`` parameters with it); named here with the other twins' protocols.
from native.object_format import Block, Footer, ObjectHeader, ObjectsTwin
Message = tuple[int, "bytes | None", "Mapping[str, str] | None", bytes]


class SharedPending(Protocol):
    """Pending bytes many append cores of one twin count together (``PendingBudget`` in each
    twin; see its docstring in _append.pyx). Construct with ``PendingBudget(bytes_max)``."""

    waiting: int

    @property
    def used(self) -> int: ...
    @property
    def bytes_max(self) -> int: ...
    @property
    def full(self) -> bool: ...
    @property
    def must_wait(self) -> bool: ...
    @property
    def resume_bytes(self) -> int: ...


class AppendCore(Protocol):
    """The WAL append core (``AppendBuffer`` in each twin); see its docstring in _append.pyx.

    Construct with ``AppendBuffer(next_offset, *, max_message_bytes, pending_bytes_max,
    batch_bytes, tail_messages_max, tail_bytes_max, wake, wait_for_room, too_large,
    normalize, shared=None)`` (``shared``: that twin's ``PendingBudget``).
    """

    max_message_bytes: int
    pending_bytes_max: int
    batch_bytes: int
    refusal: Callable[[], BaseException] | None

    def append(self, payload: bytes, key: bytes | None = None,
               attributes: Mapping[str, str] | None = None, publish_time: int | None = None) -> int: ...
    def append_batch(self, messages: Sequence[object], publish_time: int | None = None) -> int: ...
    #: (chunks, first_offset, last_offset, nbytes, tail_position, tail_count): a Batch's fields.
    def take(self) -> tuple[list[bytes], int, int, int, int, int]: ...
    def leave_shared(self) -> None: ...
    def park(self) -> bool: ...
    def unpark(self) -> None: ...
    @property
    def shared_budget(self) -> SharedPending | None: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def pending_first(self) -> int: ...
    @property
    def pending_count(self) -> int: ...
    @property
    def pending_bytes(self) -> int: ...
    @property
    def writer_idle(self) -> bool: ...
    @property
    def busy(self) -> bool: ...


@runtime_checkable
class FramesTwin(Protocol):
    """CRC32C, records, frames, frame scanning, segment headers, round markers."""

    CRC32C_HARDWARE: bool

    def crc32c(self, data: Buffer, value: int = 0) -> int: ...
    def encode_record(self, publish_time: int, key: bytes | None,
                      attributes: Mapping[str, str] | None, payload: bytes) -> bytes: ...
    def encode_frame(self, offset: int, publish_time: int, key: bytes | None,
                     attributes: Mapping[str, str] | None, payload: bytes) -> bytes: ...
    def encode_batch(self, first_offset: int, messages: Iterable[Message]) -> bytes: ...
    def decode_record(self, offset: int, record: Buffer) -> Record: ...
    def scan_frames(self, buf: Buffer, pos: int = 0, end: int | None = None,
                    expected_offset: int | None = None, decode: bool = True,
                    positions: bool = False, max_frames: int | None = None,
                    rounds: bool = False, marker_key: int | None = None) -> ScanResult: ...
    def encode_segment_header(self, base_offset: int, created_ms: int, version: int = ...,
                              marker_key: int = ...) -> bytes: ...
    def encode_round_marker(self, first_offset: int, marker_key: int | None = None) -> bytes: ...
    def decode_segment_header(self, buf: Buffer) -> tuple[int, int]: ...
    def write_rounds(self, fds: list[int], rounds: list[list[bytes]]) -> list[int]: ...


@runtime_checkable
class AppendTwin(Protocol):
    @property
    def AppendBuffer(self) -> Callable[..., AppendCore]:  # noqa: N802 - the class each twin exports
        """Builds the append core (a class in each twin)."""
        ...

    @property
    def PendingBudget(self) -> Callable[[int], SharedPending]:  # noqa: N802 - the class each twin exports
        """Builds a budget of pending bytes its cores share (a class in each twin)."""
        ...


@runtime_checkable
class CodecTwin(FramesTwin, AppendTwin, ObjectsTwin, Protocol):
    """One whole implementation of the codec (``native.codec``). Each twin module has its
    ``IMPLEMENTATION`` too, outside its ``__all__`` (a set holds it once, not per part)."""

    IMPLEMENTATION: str


#: Each part's public names (its modules' ``__all__``), by the part names native/__init__ uses.
PART_NAMES = {
    "frames": ("CRC32C_HARDWARE", "crc32c", "encode_record", "encode_frame", "encode_batch",
               "decode_record", "scan_frames", "encode_round_marker", "encode_segment_header",
               "decode_segment_header", "write_rounds"),
    "append": ("AppendBuffer", "PendingBudget"),
    "objects": ("object_encode", "object_footer_bytes_needed", "object_parse_footer",
                "object_parse_header", "object_decode_block"),
}
PART_PROTOCOLS = {"frames": FramesTwin, "append": AppendTwin, "objects": ObjectsTwin}
TWIN_NAMES = ("IMPLEMENTATION",) + tuple(name for names in PART_NAMES.values() for name in names)
