"""The object store interface: the S3 subset the archive needs.

Semantics every backend follows (checked by the contract suite in ``tests/stores``):

* Keys are relative ``/``-separated paths: no leading ``/``, no empty, ``.`` or
  ``..`` segments, no NUL, at most 1,024 UTF-8 bytes. Build them with
  :func:`tiered.archive.naming.object_key` from a validated ``TopicName``.
* ``put`` is atomic: readers see the whole old object or the whole new one, never a
  part. ``if_absent=True`` makes exactly one of several concurrent writers win; the
  others get :class:`~tiered.errors.PreconditionFailed`.
* Byte ranges are one type, :data:`ByteRequest`: ``RangeByteRequest(start, end)`` is
  bytes ``[start, end)`` (end exclusive, as a Python slice), ``SuffixByteRequest(n)`` the
  last ``n`` bytes. ``get_range(key, RangeByteRequest(start, end))`` clips ``end`` to
  the object; a ``start`` at or past the end raises :class:`~tiered.errors.InvalidRange`.
  ``get_range(key, SuffixByteRequest(n))`` returns the last ``n`` bytes (the whole object
  if smaller); ``get_tail(key, n)`` returns them with the object's total size, from the
  same response where the backend can (a reader checks that size against the descriptor).
* ``list(prefix)`` yields objects in key order (byte-wise). ``delete`` of a missing
  key is not an error (as in S3).
"""
from __future__ import annotations

import abc
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tiered.errors import InvalidKey

KEY_BYTES_MAX = 1024


@dataclass(frozen=True, slots=True)
class RangeByteRequest:
    """Bytes ``[start, end)`` of an object (end exclusive; clipped to the object's size)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (_is_index(self.start) and _is_index(self.end)) or self.end <= self.start:
            raise ValueError(f"bad byte range [{self.start}, {self.end})")

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class SuffixByteRequest:
    """The last ``suffix`` bytes of an object (the whole object when it is smaller)."""

    suffix: int

    def __post_init__(self) -> None:
        if not _is_index(self.suffix):
            raise ValueError(f"suffix length must be an int >= 0, got {self.suffix!r}")


#: What a ranged read asks for: the one byte-range type of every object store.
ByteRequest = RangeByteRequest | SuffixByteRequest


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: float  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class Capabilities:
    #: ``put(if_absent=True)`` is enforced by the store itself (not emulated racily). For
    #: S3 this is what a probe of the server found, never just assumed.
    conditional_put: bool = True
    #: Puts are all-or-nothing under the final key.
    atomic_put: bool = True
    #: Large puts are split into parts.
    multipart: bool = False


_DEFAULT_CAPABILITIES = Capabilities()


def check_key(key: str) -> str:
    """Validate an object key (see module docstring); returns it unchanged."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"object key must be a non-empty str, got {key!r}")
    if "\x00" in key or "\\" in key:
        raise InvalidKey(f"object key {key!r} contains NUL or a backslash")
    if len(key.encode()) > KEY_BYTES_MAX:
        raise InvalidKey(f"object key is longer than {KEY_BYTES_MAX} bytes")
    if key.startswith("/"):
        raise InvalidKey(f"object key {key!r} is absolute")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidKey(f"object key {key!r} has an empty, '.' or '..' segment")
    return key


def check_prefix(prefix: str) -> str:
    """A list prefix may be empty or end with '/'; otherwise it follows key rules."""
    if prefix == "":
        return prefix
    check_key(prefix.rstrip("/") or "x/")
    return prefix


Data = bytes | bytearray | memoryview | os.PathLike[str] | str


#: Keys one :meth:`ObjectStore.delete_many` takes (S3's ``DeleteObjects`` limit).
DELETE_MANY_MAX = 1000


class ObjectStore(abc.ABC):
    """Abstract object store. See the module docstring for the semantics."""

    @property
    def capabilities(self) -> Capabilities:
        """What this store guarantees: a class attribute in stores that know it up front, a
        property in stores that learn it at run time (S3 probes its server)."""
        return _DEFAULT_CAPABILITIES

    @abc.abstractmethod
    def put(self, key: str, data: Data, if_absent: bool = False) -> ObjectInfo:
        """Store ``data`` (bytes, or a path to a file) under ``key`` atomically."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def get_range(self, key: str, byte_range: ByteRequest) -> bytes:
        """The bytes ``byte_range`` names, in one request (a suffix: a footer)."""

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """(the last ``length`` bytes, the object's total size).

        The default asks twice (HEAD, then a ranged GET of exactly that size's tail), so an
        object replaced in between gives a short or mismatched answer that callers detect.
        """
        size = self.head(key).size
        if length <= 0 or size == 0:
            return b"", size
        return self.get_range(key, RangeByteRequest(max(0, size - length), size)), size

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete every key in ``keys`` (at most :data:`DELETE_MANY_MAX`); a missing key
        is no error. Stores with a batch request override this (S3 ``DeleteObjects``:
        one request); the default deletes one by one. On an error some keys may be
        deleted and others not: callers only pass keys safe to delete in any order."""
        if len(keys) > DELETE_MANY_MAX:
            raise ValueError(f"delete_many takes at most {DELETE_MANY_MAX} keys, got {len(keys)}")
        from tiered.errors import ObjectNotFound

        for key in keys:
            try:
                self.delete(key)
            except ObjectNotFound:
                continue

    def exists(self, key: str) -> bool:
        from tiered.errors import ObjectNotFound

        try:
            self.head(key)
        except ObjectNotFound:
            return False
        return True

    def check(self) -> None:
        """Raise now if the store cannot serve at all (S3: the bucket is missing or the
        endpoint unreachable), so a process learns it when it opens the store rather than
        at its first upload. The default (a store that cannot be missing) does nothing."""

    def close(self) -> None:
        """Release connections; the default has nothing to release."""

    def __enter__(self) -> "ObjectStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_byte_request(byte_range: object) -> ByteRequest:
    """``byte_range`` if it is a :data:`ByteRequest`; TypeError otherwise (a bare tuple
    would leave open whether its end is inclusive)."""
    if not isinstance(byte_range, (RangeByteRequest, SuffixByteRequest)):
        raise TypeError(f"byte_range must be a RangeByteRequest or SuffixByteRequest, got {byte_range!r}")
    return byte_range
