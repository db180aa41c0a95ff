"""Pure-Python twin of ``native/_append.pyx``: ``AppendBuffer``, the WAL's append core.

The reference for the compiled class: same API, same bytes, same errors. The frames it
produces are ``native/format.py`` frames; their records are encoded by
``native/_frames_py.py``.
"""
from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from native._frames_py import _as_bytes, as_u64, crc32c, encode_record
from native.errors import CodecError, OffsetOverflow
from native.format import FRAME_HEADER, MAX_OFFSET, MAX_RECORD_BYTES

#: Bytes [4, 16) of a frame header (length, offset): where its CRC32C starts (native/format.py).
_LENGTH_OFFSET = struct.Struct("<IQ")
#: Bytes [0, 4) of a frame header: the CRC32C.
_CRC = struct.Struct("<I")
_FRAME_HEADER_BYTES = FRAME_HEADER.size
#: Payloads shorter than this are copied into their frame's first piece: for a small payload
#: a second piece and a second CRC call cost more than copying it.
_INLINE_PAYLOAD_BYTES = 1024
assert _CRC.size + _LENGTH_OFFSET.size == _FRAME_HEADER_BYTES

IMPLEMENTATION = "python"

__all__ = ["AppendBuffer", "PendingBudget"]


class PendingBudget:
    """Reference twin of the compiled ``PendingBudget`` (see its docstring in _append.pyx):
    pending bytes counted together by many cores of this twin. Cores update it under its own
    lock (each core's lock guards only that core)."""

    def __init__(self, bytes_max: int) -> None:
        if bytes_max <= 0:
            raise ValueError("bytes_max must be positive")
        self.bytes_max = bytes_max
        self.used = 0
        #: Appends waiting for room (see the compiled twin): while any wait, every append
        #: queues behind them.
        self.waiting = 0
        #: While appends wait, newcomers join them only at or above this (see the compiled twin).
        self.resume_bytes = bytes_max - bytes_max // 8
        self._lock = threading.Lock()

    @property
    def full(self) -> bool:
        """Whether the budget is full."""
        return self.used >= self.bytes_max

    @property
    def must_wait(self) -> bool:
        """Whether an append calls ``wait_for_room`` first (see the compiled twin)."""
        return self.used >= self.bytes_max or (self.waiting > 0 and self.used >= self.resume_bytes)

    def _add(self, delta: int) -> None:
        with self._lock:
            self.used += delta


class AppendBuffer:
    """Reference twin of the compiled ``AppendBuffer`` (see its docstring in _append.pyx).

    Same API, same bytes, same errors. Where the compiled class gets its atomicity from
    running one C step under the GIL, this twin takes ``_lock`` around the step: check the
    refusal, allocate the offset, encode the frame, count it. Validation, and every callback
    (wait_for_room, wake, refusal, too_large, normalize), runs outside the lock, so a callback
    that takes the WAL lock cannot deadlock with a writer holding the WAL lock in take().

    A payload of 1 KiB or more is copied once, as in the compiled class: its pending frame is
    kept as two pieces, its header with the record's fields before the payload (small), and
    the payload itself (a bytes payload as given; other buffers are snapshot as bytes, since
    they may change), its CRC32C computed over both; ``take()`` joins all pieces into one
    chunk. Building each record and frame as bytes and joining those again copied it four
    times. A smaller payload is copied into one piece with its header (cheaper than a second
    piece and a second CRC call at that size).
    """

    def __init__(self, next_offset: int, *, max_message_bytes: int, pending_bytes_max: int,
                 batch_bytes: int, tail_messages_max: int, tail_bytes_max: int,
                 wake: Callable[[], None], wait_for_room: Callable[[], None],
                 too_large: Callable[[str], BaseException],
                 normalize: Callable[[object], tuple[object, ...]],
                 shared: PendingBudget | None = None) -> None:
        if shared is not None and type(shared) is not PendingBudget:
            raise TypeError(f"shared must be None or this twin's PendingBudget, not {type(shared).__name__}")
        self._next = self._first = as_u64(next_offset, "next_offset")
        if self._next > MAX_OFFSET + 1:
            raise OffsetOverflow(f"next_offset {self._next} is past MAX_OFFSET {MAX_OFFSET} + 1")
        if not 1 <= max_message_bytes <= MAX_RECORD_BYTES:
            raise ValueError(f"max_message_bytes must be in [1, {MAX_RECORD_BYTES}]")
        if pending_bytes_max < max_message_bytes or batch_bytes <= 0:
            raise ValueError("pending_bytes_max must hold one maximal message, batch_bytes > 0")
        if tail_messages_max <= 0 or tail_bytes_max <= 0:
            raise ValueError("tail_messages_max and tail_bytes_max must be positive")
        self.max_message_bytes = max_message_bytes
        self.pending_bytes_max = pending_bytes_max
        self.batch_bytes = batch_bytes
        self._tail_messages_max = tail_messages_max
        self._tail_bytes_max = tail_bytes_max
        self._wake = wake
        self._wait_for_room = wait_for_room
        self._too_large = too_large
        self._normalize = normalize
        self._lock = threading.Lock()
        # Pending frames in offset order, two pieces each (see the class docstring).
        self._pieces: list[bytes] = []
        self._sizes: list[int] = []  # each pending frame's size in bytes
        self._bytes = 0
        self._idle = False
        self._refusal: Callable[[], BaseException] | None = None
        self._shared = shared

    # -------------------------------------------------------------- appends
    def append(self, payload: bytes, key: bytes | None = None, attributes: Mapping[str, str] | None = None,
               publish_time: int | None = None) -> int:
        """Appends one message; returns its offset."""
        shared = self._shared  # read once: leave_shared() may set it to None meanwhile
        if self._bytes >= self.pending_bytes_max or (shared is not None and shared.must_wait):
            self._wait_for_room()
        publish_time = _now_ms() if publish_time is None else as_u64(publish_time, "publish_time")
        record = self._record(publish_time, key, attributes, payload)
        return self._add([record])

    def append_batch(self, messages: Sequence[object], publish_time: int | None = None) -> int:
        """Appends messages (see the compiled twin); returns the first offset. All or nothing."""
        items = list(messages)  # a snapshot, as the compiled twin takes (callbacks may edit the caller's)
        if not items:
            raise ValueError("append_batch needs at least one message")
        default_time = _now_ms() if publish_time is None else as_u64(publish_time, "publish_time")
        shared = self._shared  # read once: leave_shared() may set it to None meanwhile
        if self._bytes >= self.pending_bytes_max or (shared is not None and shared.must_wait):
            self._wait_for_room()
        records = []
        for message in items:
            fields: tuple[object, ...]
            if type(message) in (bytes, bytearray, memoryview):
                fields = (message,)
            elif isinstance(message, tuple) and type(message) is tuple:
                fields = message
            else:
                fields = self._normalize(message)
                if type(fields) is not tuple:
                    raise CodecError("normalize must return a tuple")
            if not 1 <= len(fields) <= 4:
                raise CodecError("each message must be payload or a (payload, key, attributes, "
                                 "publish_time) tuple")
            payload, key, attributes, when = fields + (None,) * (4 - len(fields))
            when = default_time if when is None else as_u64(when, "publish_time")
            records.append(self._record(when, key, attributes, payload))
        return self._add(records)

    def _record(self, publish_time: int, key: object, attributes: object,
                payload: object) -> tuple[bytes, bytes]:
        """The record as (its fields before the payload, the payload as bytes): what
        ``encode_record`` would return, joined, without copying the payload into it."""
        # encode_record checks each field's type (CodecError), as the compiled twin does; with
        # an empty payload it returns exactly the record's bytes before the payload (whose
        # length is implied by the frame's), and the payload is checked last, as it does.
        head = encode_record(publish_time, key, attributes, b"")  # type: ignore[arg-type]
        body = _as_bytes(payload, "payload")
        size = len(head) + len(body)
        if size > self.max_message_bytes:
            raise self._too_large(f"record of {size} bytes exceeds max_message_bytes "
                                  f"{self.max_message_bytes}")
        return head, body

    def _add(self, records: list[tuple[bytes, bytes]]) -> int:
        """The atomic step, under the lock; then wakes the writer outside it if needed."""
        with self._lock:
            if self._refusal is not None:
                raise self._refusal()
            first = self._next
            if first + len(records) - 1 > MAX_OFFSET:
                raise OffsetOverflow(f"offset {first + len(records) - 1} would pass MAX_OFFSET {MAX_OFFSET}: "
                                     "the topic is full")
            pieces, sizes, offset, added = self._pieces, self._sizes, first, 0
            for head, payload in records:
                size = len(head) + len(payload)
                if len(payload) < _INLINE_PAYLOAD_BYTES:
                    body = _LENGTH_OFFSET.pack(size, offset) + head + payload
                    pieces.append(_CRC.pack(crc32c(body)) + body)
                else:
                    header = _LENGTH_OFFSET.pack(size, offset) + head
                    pieces += (_CRC.pack(crc32c(payload, crc32c(header))) + header, payload)
                sizes.append(_FRAME_HEADER_BYTES + size)
                added += _FRAME_HEADER_BYTES + size
                offset += 1
            self._bytes += added
            if self._shared is not None:
                self._shared._add(added)
            self._next = first + len(records)
            assert self._first + len(self._sizes) == self._next
            wake = self._idle or self._bytes - added < self.batch_bytes <= self._bytes
            if wake:
                self._idle = False
        if wake:
            self._wake()
        return first

    # -------------------------------------------------------------- the writer's side
    def take(self) -> tuple[list[bytes], int, int, int, int, int]:
        """``(chunks, first_offset, last_offset, nbytes, tail_position, tail_count)``."""
        with self._lock:
            pieces, sizes, first, last = self._pieces, self._sizes, self._first, self._next - 1
            data = b"".join(pieces)  # the one copy of every payload
            assert len(data) == self._bytes and first + len(sizes) == last + 1
            tail_count, tail_bytes = 0, 0
            for size in reversed(sizes):
                if (tail_count + 1 > self._tail_messages_max
                        or tail_bytes + size > self._tail_bytes_max):
                    break
                tail_count += 1
                tail_bytes += size
            self._pieces = []
            self._sizes = []
            if self._shared is not None:
                self._shared._add(-self._bytes)
            self._bytes = 0
            self._first = self._next
        # One chunk: how frames are split into chunks is not part of the contract.
        return [data] if data else [], first, last, len(data), len(data) - tail_bytes, tail_count

    def leave_shared(self) -> None:
        """Stop counting into the shared budget, giving back what is pending. Idempotent."""
        with self._lock:
            shared, self._shared = self._shared, None
            if shared is not None:
                shared._add(-self._bytes)

    def park(self) -> bool:
        with self._lock:
            if self._sizes:
                return False
            self._idle = True
            return True

    def unpark(self) -> None:
        with self._lock:
            self._idle = False

    # -------------------------------------------------------------- state
    @property
    def refusal(self) -> Callable[[], BaseException] | None:
        return self._refusal

    @refusal.setter
    def refusal(self, factory: Callable[[], BaseException] | None) -> None:
        if factory is not None and not callable(factory):
            raise TypeError("refusal must be None or a callable returning an exception")
        with self._lock:  # serialised with in-flight appends, like the GIL does for the C twin
            self._refusal = factory

    @property
    def next_offset(self) -> int:
        return self._next

    @property
    def pending_first(self) -> int:
        return self._first

    @property
    def pending_count(self) -> int:
        return len(self._sizes)

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    @property
    def shared_budget(self) -> PendingBudget | None:
        return self._shared

    @property
    def writer_idle(self) -> bool:
        return self._idle

    @property
    def busy(self) -> bool:
        return self._lock.locked()


def _now_ms() -> int:
    """Wall clock in ms since the epoch (the compiled twin reads the same clock in C)."""
    return time.time_ns() // 1_000_000
