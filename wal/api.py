"""What the WAL's consumers may rely on: structural interfaces (``typing.Protocol``).

Code outside ``wal/`` types its WAL parameters with one of these instead of
``WriteAheadLog`` (or ``Any``), each holding only what that consumer calls, so an
in-memory double with the same methods stands in for the real log in tests and
benchmarks, and the consumer cannot reach into the log's internals:

* :class:`WalOffsets`: the offsets (a subscription's bounds).
* :class:`WalTailSource`: + tail readers (the tiered reader).
* :class:`WalFrameSource`: + raw durable frames, durability waits and notifications,
  segments and retention (the uploader).
* :class:`Wal`: everything the broker host does with a hosted topic's log, appends
  and close/delete included. ``wal.log.WriteAheadLog`` satisfies it.

Each is ``runtime_checkable`` so a test can assert that the log and its doubles
provide every member. All offsets are inclusive message offsets; ``durable_offset`` is ``None`` while nothing
is durable. The semantics are those documented on ``WriteAheadLog`` (docs/WAL.md).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from native.format import Record
from wal.config import WalConfig
from wal.segment import SegmentInfo

#: ``callback(durable_offset)``, run on the WAL's writer thread after each fsync.
DurableListener = Callable[[int], None]


@runtime_checkable
class WalOffsets(Protocol):
    @property
    def first_offset(self) -> int:
        """The oldest offset still in the log (retention moves it up)."""
        ...

    @property
    def next_offset(self) -> int:
        """The offset the next append gets."""
        ...

    @property
    def durable_offset(self) -> int | None:
        """The last fsynced offset, or None while nothing is durable."""
        ...


@runtime_checkable
class WalTailReader(Protocol):
    """A pull-based reader of durable records (``wal.reader.WalReader``), sync or async."""

    def __iter__(self) -> Iterator[Record]: ...

    def __next__(self) -> Record: ...

    def __aiter__(self) -> AsyncIterator[Record]: ...

    async def __anext__(self) -> Record: ...

    def close(self) -> None:
        """Safe from any thread; a blocked ``next()`` returns at once."""
        ...


@runtime_checkable
class WalTailSource(WalOffsets, Protocol):
    def reader(self, from_offset: int, live: bool = True) -> WalTailReader:
        """Durable records from ``from_offset``; raises ``OffsetBelowRetention`` below
        ``first_offset``. ``live=False`` stops at the durable tip of the moment."""
        ...


@runtime_checkable
class WalFrameSource(WalOffsets, Protocol):
    def read_frames(self, from_offset: int, max_bytes: int) -> tuple[bytes, int, int]:
        """Raw, validated, whole durable frames: ``(frames, first, last)``."""
        ...

    def wait_durable(self, offset: int, timeout_s: float) -> bool:
        """Blocks until ``offset`` is durable (True) or the timeout passes (False)."""
        ...

    def add_durable_listener(self, callback: DurableListener) -> None:
        """``callback(durable_offset)`` after each fsync, on the writer thread; keep it quick."""
        ...

    def segments(self) -> Sequence[SegmentInfo]: ...

    def truncate_before(self, offset: int) -> int:
        """Deletes whole sealed segments below ``offset``; returns how many."""
        ...


@runtime_checkable
class Wal(WalTailSource, WalFrameSource, Protocol):
    """A hosted topic's log, as the broker host drives it."""

    @property
    def closed(self) -> bool: ...

    @property
    def config(self) -> WalConfig:
        """The configuration the log was opened with."""
        ...

    @property
    def failed(self) -> bool: ...

    def append(self, payload: bytes, key: bytes | None = None, attributes: dict[str, str] | None = None,
               publish_time: int | None = None) -> int: ...

    def append_batch(self, messages: Sequence[object], publish_time: int | None = None) -> int: ...

    def refuse_appends(self) -> None:
        """Refuse every append from now on, also those waiting for room; nothing appended is lost."""
        ...

    async def wait_durable_async(self, offset: int, timeout_s: float | None = None) -> bool: ...

    def remove_durable_listener(self, callback: DurableListener) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...

    def close(self) -> None: ...

    def delete(self) -> None: ...
