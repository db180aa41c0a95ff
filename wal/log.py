"""WriteAheadLog: the per-topic durable log (design: docs/WAL.md, format: native/format.py).

Threads: any number of appenders, one group-commit writer (wal/writer.py), any number of
readers. One lock guards the in-memory state; three conditions on it wake the writer
(work), blocked appenders (room) and durability waiters/readers (durable).
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import os
import struct
import time
import weakref
from collections.abc import Callable, Sequence
from threading import Condition, Lock

from native import encode_batch, encode_frame, scan_frames
from native.format import FRAME_HEADER_BYTES, STOP_TORN, Record
from wal.cache import FrameCache
from wal.checkpoint import read_checkpoint, write_checkpoint
from wal.config import WalConfig
from wal.errors import CorruptLog, MessageTooLarge, OffsetBelowRetention, WalClosed, WalError, WalFailed, WalTimeout
from wal.fs import FileSystem, RealFs
from wal.message import normalize_batch
from wal.metrics import WalMetrics
from wal.reader import WalReader
from wal.recovery import recover
from wal.segment import Segment, SegmentInfo
from wal.topics import TopicName
from wal.writer import Batch, GroupCommitWriter

_log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5  # bound on the writer's idle wait; it re-checks for close each time
_FOREVER = 1 << 64
_U32 = struct.Struct("<I")

DurableListener = Callable[[int], None]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class WriteAheadLog:
    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, root_dir: str, topic: "str | TopicName", config: WalConfig | None = None,
             initial_offset: int | None = None, fs: FileSystem | None = None,
             metrics_registry=None) -> "WriteAheadLog":
        """Opens (recovering) or creates the WAL of ``topic`` under ``root_dir/<ns>/<topic>``."""
        name = TopicName.parse(topic)
        config = config or WalConfig()
        fs = fs or RealFs()
        directory = os.path.join(root_dir, name.namespace, name.name)
        fs.makedirs(directory)
        fs.fsync_dir(os.path.dirname(directory))  # the topic directory's name must survive
        recovered = recover(fs, directory, read_checkpoint(fs, directory), initial_offset,
                            config.index_interval_bytes)
        wal = cls(name, directory, config, fs, recovered.segments, recovered.next_offset, metrics_registry)
        wal._write_checkpoint()
        wal._writer.start()
        _log.info("opened WAL %s at %s: offsets [%d, %d), %d torn bytes repaired", name, directory,
                  wal.first_offset, wal.next_offset, recovered.repaired_bytes)
        return wal

    def __init__(self, topic: TopicName, directory: str, config: WalConfig, fs: FileSystem,
                 segments: list[Segment], next_offset: int, metrics_registry) -> None:
        assert segments and segments[-1].last_offset + 1 == next_offset
        self.topic = topic
        self.directory = directory
        self.config = config
        self._fs = fs
        self._lock = Lock()
        self._work = Condition(self._lock)
        self._room = Condition(self._lock)
        self._durable = Condition(self._lock)
        self._segments = segments
        self._segment_bases = [s.base_offset for s in segments]
        self._origin_offset = segments[0].base_offset
        self._next_offset = next_offset
        self._durable_next = next_offset
        self._pending: list = []
        self._pending_counts: dict[int, int] = {}
        self._pending_bytes = 0
        self._pending_first = next_offset
        self._writer_idle = False
        self._room_waiters = 0
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        self._refusal: type[WalError] | None = None  # set once appends must be refused
        self._listeners: list[DurableListener] = []
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._readers: "weakref.WeakSet[WalReader]" = weakref.WeakSet()
        self._cache = FrameCache(config.cache_messages_max, config.cache_bytes_max)
        self._checkpoint_lock = Lock()
        self._max_message_bytes = config.max_message_bytes
        self._max_frame_bytes = config.max_message_bytes + FRAME_HEADER_BYTES
        self._pending_bytes_max = config.pending_bytes_max
        self._batch_bytes = config.fsync_batch_bytes
        self.metrics = WalMetrics(str(topic), metrics_registry)
        self.metrics.durable_offset.set(next_offset - 1)
        self.metrics.track_reader_lag(_lag_function(weakref.ref(self)))
        self._writer = GroupCommitWriter(self, fs, directory, config, segments[-1])

    def close(self) -> None:
        """Drains and fsyncs everything appended, stops the writer; idempotent."""
        with self._lock:
            already = self._closing
            self._closing = True
            if self._refusal is None:
                self._refusal = WalClosed
            self._work.notify_all()
            self._room.notify_all()
        drained = self._writer.join(self.config.close_timeout_s)
        if not drained:
            self._fail(WalTimeout(f"writer did not drain within {self.config.close_timeout_s} s"))
        with self._lock:
            self._closed = True
            self._durable.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
        _resolve_all(waiters, WalClosed(f"WAL {self.topic} closed"))
        if not already and self._failure is None:
            self._write_checkpoint()

    def delete(self) -> None:
        """Removes the topic's files (after a seal). The WAL must be closed first."""
        if not self._closed:
            raise WalError(f"WAL {self.topic} must be closed before delete()")
        for name in self._fs.listdir(self.directory):
            self._fs.remove(os.path.join(self.directory, name))
        self._fs.rmdir(self.directory)
        self._fs.fsync_dir(os.path.dirname(self.directory))
        _log.info("deleted WAL %s at %s", self.topic, self.directory)

    def __enter__(self) -> "WriteAheadLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------ properties
    @property
    def first_offset(self) -> int:
        return self._segment_bases[0]

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def durable_offset(self) -> int | None:
        last = self._durable_next - 1
        return last if last >= self._origin_offset else None

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ append
    def append(self, payload: bytes, key: bytes | None = None, attributes: dict[str, str] | None = None,
               publish_time: int | None = None) -> int:
        """Appends one message; returns its offset. Durable later: see wait_durable()."""
        if len(payload) > self._max_message_bytes:
            raise MessageTooLarge(f"payload of {len(payload)} bytes exceeds max_message_bytes "
                                  f"{self._max_message_bytes}")
        if publish_time is None:
            publish_time = time.time_ns() // 1_000_000
        with self._lock:
            if self._pending_bytes >= self._pending_bytes_max:
                self._wait_for_room()
            if self._refusal is not None:
                raise self._refusal_error()
            offset = self._next_offset
            # Encoded under the lock on purpose: the offset is inside the CRC'd frame, and
            # one codec call is cheaper than a second lock round trip (the GIL would
            # serialise an encode outside the lock anyway).
            frame = encode_frame(offset, publish_time, key, attributes, payload)
            if len(frame) > self._max_frame_bytes:
                raise MessageTooLarge(f"record of {len(frame) - FRAME_HEADER_BYTES} bytes exceeds "
                                      f"max_message_bytes {self._max_message_bytes}")
            self._pending.append(frame)
            self._pending_bytes += len(frame)
            self._next_offset = offset + 1
            if self._writer_idle or self._pending_bytes >= self._batch_bytes:
                self._work.notify()
        return offset

    def append_batch(self, messages: Sequence, publish_time: int | None = None) -> int:
        """Appends messages (see wal/message.py for accepted forms); returns the first offset."""
        tuples = normalize_batch(messages, _now_ms() if publish_time is None else publish_time,
                                 self._max_message_bytes)
        with self._lock:
            if self._pending_bytes >= self._pending_bytes_max:
                self._wait_for_room()
            if self._refusal is not None:
                raise self._refusal_error()
            first = self._next_offset
            data = encode_batch(first, tuples)  # one codec call for the whole batch
            self._pending_counts[len(self._pending)] = len(tuples)
            self._pending.append(data)
            self._pending_bytes += len(data)
            self._next_offset = first + len(tuples)
            if self._writer_idle or self._pending_bytes >= self._batch_bytes:
                self._work.notify()
        return first

    def _wait_for_room(self) -> None:
        """Backpressure with a bound; called with the lock held."""
        deadline = time.monotonic() + self.config.append_timeout_s
        self._room_waiters += 1
        try:
            while self._pending_bytes >= self._pending_bytes_max and self._refusal is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WalTimeout(f"append blocked {self.config.append_timeout_s} s on a full write buffer")
                self._room.wait(remaining)
        finally:
            self._room_waiters -= 1

    def _refusal_error(self) -> WalError:
        if self._failure is not None:
            error = WalFailed(f"WAL {self.topic} failed: {self._failure!r}")
            error.__cause__ = self._failure
            return error
        return WalClosed(f"WAL {self.topic} is closed")

    # ------------------------------------------------------------------ durability
    def wait_durable(self, offset: int, timeout_s: float) -> bool:
        """Blocks until ``offset`` is durable (True) or ``timeout_s`` passes (False)."""
        with self._lock:
            if offset >= self._next_offset:
                raise ValueError(f"offset {offset} was never appended (next is {self._next_offset})")
            return self._wait_durable_locked(offset, timeout_s)

    def _wait_durable_locked(self, offset: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._durable_next <= offset:
            if self._failure is not None or self._closed:
                raise self._refusal_error()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._durable.wait(remaining)
        return True

    async def wait_durable_async(self, offset: int, timeout_s: float | None = None) -> bool:
        """Awaits durability of ``offset`` without blocking the event loop."""
        if offset >= self._next_offset:
            raise ValueError(f"offset {offset} was never appended (next is {self._next_offset})")
        return await self._wait_durable_async(offset, timeout_s)

    async def _wait_durable_async(self, offset: int, timeout_s: float | None) -> bool:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._durable_next > offset:
                return True
            if self._failure is not None or self._closed:
                raise self._refusal_error()
            self._async_waiters.append((offset, loop, future))
        try:
            await asyncio.wait_for(future, timeout_s)
            return True
        except TimeoutError:
            with self._lock:
                self._async_waiters = [w for w in self._async_waiters if w[2] is not future]
            return False

    def flush(self, timeout_s: float = 30.0) -> None:
        """Returns once everything appended before the call is fsynced."""
        with self._lock:
            target = self._next_offset - 1
            if target < self._durable_next:
                if self._failure is not None:
                    raise self._refusal_error()
                return
            if not self._wait_durable_locked(target, timeout_s):
                raise WalTimeout(f"flush of offset {target} did not finish in {timeout_s} s")

    def add_durable_listener(self, callback: DurableListener) -> None:
        """``callback(durable_offset)`` runs on the writer thread after each fsync; keep it quick."""
        with self._lock:
            self._listeners = [*self._listeners, callback]

    def remove_durable_listener(self, callback: DurableListener) -> None:
        with self._lock:
            self._listeners = [c for c in self._listeners if c is not callback]

    # ------------------------------------------------------------------ writer hooks
    def _take_batch(self, last_sync_start: float) -> Batch | None:
        """Writer thread: the next batch to commit, or None when closing and drained."""
        interval_s = self.config.fsync_interval_ms / 1000.0
        with self._lock:
            while True:
                if self._failure is not None:
                    return None
                if self._pending:
                    wait_s = last_sync_start + interval_s - time.monotonic()
                    if wait_s <= 0 or self._pending_bytes >= self._batch_bytes or self._closing:
                        return self._detach_pending()
                    self._work.wait(wait_s)
                elif self._closing:
                    return None
                else:
                    self._writer_idle = True
                    self._work.wait(_IDLE_WAIT_S)
                    self._writer_idle = False

    def _detach_pending(self) -> Batch:
        batch = Batch(self._pending, self._pending_counts, self._pending_first, self._next_offset - 1,
                      self._pending_bytes)
        assert batch.first_offset == self._durable_next and batch.last_offset >= batch.first_offset
        self._pending = []
        self._pending_counts = {}
        self._pending_bytes = 0
        self._pending_first = self._next_offset
        if self._room_waiters:
            self._room.notify_all()
        return batch

    def _on_durable(self, batch: Batch, segment: Segment, position: int, size_bytes: int,
                    fsync_s: float) -> None:
        """Writer thread, after a successful fsync: publish the new durable watermark."""
        tail = _cache_tail(batch, self.config.cache_messages_max, self.config.cache_bytes_max)
        with self._lock:
            assert batch.first_offset == self._durable_next, "durable offsets must stay contiguous"
            segment.last_offset = batch.last_offset
            segment.size_bytes = size_bytes
            segment.add_index(batch.first_offset, position, self.config.index_interval_bytes)
            self._durable_next = batch.last_offset + 1
            if tail is None:
                self._cache.clear()
            else:
                self._cache.add(*tail)
            self._durable.notify_all()
            ready, self._async_waiters = _split_ready(self._async_waiters, self._durable_next)
            listeners = self._listeners
        assert self._durable_next == batch.last_offset + 1
        records = batch.last_offset - batch.first_offset + 1
        self.metrics.on_fsync(records, batch.nbytes, fsync_s, batch.last_offset)
        _resolve_all(ready, None)
        for callback in listeners:
            try:
                callback(batch.last_offset)
            except Exception:  # a listener must not take the writer down
                _log.exception("durable listener %r failed", callback)

    def _on_rotate(self, old: Segment, new: Segment) -> None:
        with self._lock:
            old.sealed = True
            self._segments.append(new)
            self._segment_bases.append(new.base_offset)
        self.metrics.segments.inc()
        self._write_checkpoint()

    def _fail(self, exc: BaseException) -> None:
        _log.error("WAL %s failed closed: %r", self.topic, exc)
        with self._lock:
            if self._failure is None:
                self._failure = exc
            self._refusal = WalFailed
            self._work.notify_all()
            self._room.notify_all()
            self._durable.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
            error = self._refusal_error()
        self.metrics.failed.set(1)
        _resolve_all(waiters, error)

    def _write_checkpoint(self) -> None:
        with self._checkpoint_lock:
            with self._lock:
                state = {"topic": str(self.topic), "first_offset": self._segment_bases[0],
                         "sealed_next_offset": self._segment_bases[-1], "next_offset": self._durable_next}
            write_checkpoint(self._fs, self.directory, state)

    # ------------------------------------------------------------------ retention
    def truncate_before(self, offset: int) -> int:
        """Deletes whole sealed segments whose offsets are all < ``offset``; returns how many."""
        with self._lock:
            doomed = []
            while len(self._segments) - len(doomed) > 1 and self._segments[len(doomed)].last_offset < offset:
                doomed.append(self._segments[len(doomed)])
            if not doomed:
                return 0
            del self._segments[:len(doomed)]
            del self._segment_bases[:len(doomed)]
            assert self._segment_bases[0] == doomed[-1].last_offset + 1
        self._write_checkpoint()  # before unlinking, so it never names a missing first segment
        for segment in doomed:
            self._fs.remove(segment.path)
        self._fs.fsync_dir(self.directory)
        _log.info("WAL %s: retention removed %d segments, first offset now %d", self.topic,
                  len(doomed), self.first_offset)
        return len(doomed)

    def segments(self) -> list[SegmentInfo]:
        with self._lock:
            return [SegmentInfo(s.base_offset, s.last_offset, s.path, s.size_bytes, s.created_ms, s.sealed)
                    for s in self._segments]

    # ------------------------------------------------------------------ reading
    def reader(self, from_offset: int, live: bool = True) -> WalReader:
        """A pull-based reader of durable records from ``from_offset`` (see wal/reader.py)."""
        with self._lock:
            if from_offset < self._segment_bases[0]:
                raise OffsetBelowRetention(from_offset, self._segment_bases[0])
            stop = None if live else self._durable_next - 1
        reader = WalReader(self, from_offset, stop)
        self._readers.add(reader)
        return reader

    def read_frames(self, from_offset: int, max_bytes: int) -> tuple[bytes, int, int]:
        """Raw, validated, whole durable frames from ``from_offset``: (frames, first, last).

        Returns at least one frame when any is durable (even if it alone exceeds
        ``max_bytes``) and stops at a segment end; ``(b"", from_offset, from_offset - 1)``
        when nothing at or after ``from_offset`` is durable yet.
        """
        found = self._read_segment(from_offset, _FOREVER, max_bytes, decode=False)
        if found is None:
            return b"", from_offset, from_offset - 1
        data, result, limit = found
        first_index = from_offset - result.first_offset
        last = min(result.last_offset, limit)
        last_index = last - result.first_offset
        end = result.positions[last_index + 1] if last_index + 1 < result.count else result.end
        frames = bytes(memoryview(data)[result.positions[first_index]:end])
        return frames, from_offset, last

    def _read_records(self, position: int, limit: int, max_bytes: int) -> list[Record]:
        """Decoded durable records [position, min(limit, durable)], from cache else files."""
        with self._lock:
            if position < self._segment_bases[0]:
                raise OffsetBelowRetention(position, self._segment_bases[0])
            limit = min(limit, self._durable_next - 1)
            if position > limit:
                return []
            chunks = self._cache.find(position)
        if chunks:
            return _decode_chunks(chunks, position, limit, max_bytes)
        found = self._read_segment(position, limit, max_bytes, decode=True)
        if found is None:
            return []
        _data, result, limit = found
        return [r for r in result.records if position <= r.offset <= limit]

    def _cache_covers(self, position: int) -> bool:
        with self._lock:
            return bool(self._cache.find(position))

    def _read_segment(self, position: int, limit: int, max_bytes: int, decode: bool):
        """Reads the segment holding ``position``: (data, scan result, limit) or None."""
        with self._lock:
            if position < self._segment_bases[0]:
                raise OffsetBelowRetention(position, self._segment_bases[0])
            limit = min(limit, self._durable_next - 1)
            if position > limit:
                return None
            segment = self._segments[bisect.bisect_right(self._segment_bases, position) - 1]
            path, end_pos = segment.path, segment.size_bytes
            offset, pos = segment.seek(position)
        try:
            handle = self._fs.open_read(path)
        except FileNotFoundError:
            if position < self.first_offset:  # retention removed it while we looked
                raise OffsetBelowRetention(position, self.first_offset) from None
            raise
        try:
            return _scan_until(handle, path, position, offset, pos, end_pos, max_bytes, decode) + (limit,)
        finally:
            handle.close()

    def _reader_lag(self) -> int:
        with self._lock:
            durable_next = self._durable_next
        readers = list(self._readers)
        return max((max(0, durable_next - r.consumed_offset) for r in readers if not r.closed), default=0)

    def __repr__(self) -> str:
        return (f"WriteAheadLog({self.topic}, first={self.first_offset}, next={self._next_offset}, "
                f"durable={self.durable_offset})")


def _scan_until(handle, path: str, position: int, offset: int, pos: int, end_pos: int, max_bytes: int,
                decode: bool) -> tuple:
    """Scans forward from an index point until a chunk holds ``position``; (data, result)."""
    want_bytes = max_bytes
    while pos < end_pos:
        want = min(end_pos - pos, max(want_bytes, FRAME_HEADER_BYTES))
        data = handle.pread(pos, want)
        if len(data) < want:
            raise CorruptLog(path, pos + len(data), "segment shorter than its durable size")
        result = scan_frames(data, expected_offset=offset, decode=decode, positions=True)
        if result.error is not None and not (result.error.reason == STOP_TORN and pos + want < end_pos):
            raise CorruptLog(path, pos + result.error.position, f"{result.error.reason}: {result.error.detail}")
        if result.count == 0:  # one frame larger than the read: read exactly that frame
            want_bytes = FRAME_HEADER_BYTES + _U32.unpack_from(data, 4)[0]
            continue
        if result.last_offset >= position:
            assert result.first_offset == offset and result.first_offset <= position
            return data, result
        offset, pos, want_bytes = result.last_offset + 1, pos + result.end, max_bytes
    raise CorruptLog(path, end_pos, f"offset {position} not found before the durable end of the segment")


def _decode_chunks(chunks: list, position: int, limit: int, max_bytes: int) -> list[Record]:
    records: list[Record] = []
    budget = max_bytes
    for chunk in chunks:
        if chunk.first_offset > limit or budget <= 0:
            break
        result = scan_frames(chunk.data, expected_offset=chunk.first_offset, decode=True)
        assert result.error is None and result.last_offset == chunk.last_offset, "cache chunk corrupt"
        records.extend(r for r in result.records if position <= r.offset <= limit)
        budget -= len(chunk.data)
    return records


def _cache_tail(batch: Batch, messages_max: int, bytes_max: int) -> tuple[int, int, bytes] | None:
    """The newest whole chunks of a batch that fit the cache bounds, joined; None if none fit."""
    count = nbytes = 0
    start = len(batch.chunks)
    while start > 0:
        chunk_count = batch.counts.get(start - 1, 1)
        chunk_bytes = len(batch.chunks[start - 1])
        if count + chunk_count > messages_max or nbytes + chunk_bytes > bytes_max:
            break
        count += chunk_count
        nbytes += chunk_bytes
        start -= 1
    if count == 0:
        return None
    data = batch.chunks[start] if start == len(batch.chunks) - 1 else b"".join(batch.chunks[start:])
    return batch.last_offset - count + 1, batch.last_offset, bytes(data)


def _split_ready(waiters: list, durable_next: int) -> tuple[list, list]:
    ready = [w for w in waiters if w[0] < durable_next]
    if not ready:
        return [], waiters
    return ready, [w for w in waiters if w[0] >= durable_next]


def _resolve_all(waiters: list, error: BaseException | None) -> None:
    for _offset, loop, future in waiters:
        try:
            loop.call_soon_threadsafe(_resolve, future, error)
        except RuntimeError:  # the loop was closed; nobody is waiting any more
            pass


def _resolve(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(True)
    else:
        future.set_exception(error)


def _lag_function(wal_ref: "weakref.ref[WriteAheadLog]") -> Callable[[], float]:
    def lag() -> float:
        wal = wal_ref()
        return float(wal._reader_lag()) if wal is not None else 0.0
    return lag
