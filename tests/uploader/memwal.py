"""An in-memory WAL with the agreed ``WriteAheadLog`` surface, for precise control.

It lets tests hold the durable watermark behind the tip, cut segments at chosen offsets
and hand out deliberately broken frames. Frames come from the real codec.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import native


@dataclass(frozen=True, slots=True)
class SegInfo:
    base_offset: int
    last_offset: int
    path: str
    size_bytes: int
    created_ms: int
    sealed: bool


def payload_for(offset: int, size: int = 100) -> bytes:
    """Deterministic payload: the same offset always yields the same frame."""
    head = f"m{offset}:".encode()
    return (head * (size // len(head) + 1))[:size]


def frame_for(offset: int, size: int = 100, salt: int = 0) -> bytes:
    return native.encode_frame(offset, 1_700_000_000_000 + offset + salt, None, None, payload_for(offset + salt, size))


class MemWal:
    def __init__(self, first_offset: int = 0, segment_frames: int = 50) -> None:
        self.first_offset = first_offset
        self.next_offset = first_offset
        self.durable_offset: int | None = None
        self.segment_frames = segment_frames
        self._frames: dict[int, bytes] = {}
        self._created_ms: dict[int, int] = {}
        self._listeners: list[Callable[[int], None]] = []
        self._cond = threading.Condition()
        self.truncations: list[int] = []
        self.read_hook: Callable[[bytes], bytes] | None = None

    def append_n(self, count: int, size: int = 100, durable: bool = True, salt: int = 0) -> int:
        with self._cond:
            for _ in range(count):
                offset = self.next_offset
                self._frames[offset] = frame_for(offset, size, salt)
                self._created_ms.setdefault(self._seg_base(offset), time.time_ns() // 1_000_000)
                self.next_offset += 1
        if durable:
            self.make_durable()
        return self.next_offset - 1

    def make_durable(self, upto: int | None = None) -> None:
        with self._cond:
            self.durable_offset = self.next_offset - 1 if upto is None else upto
            if self.durable_offset < self.first_offset:
                self.durable_offset = None
            self._cond.notify_all()
            durable = self.durable_offset
        for cb in list(self._listeners):
            cb(durable)

    def add_durable_listener(self, cb: Callable[[int], None]) -> None:
        self._listeners.append(cb)

    def wait_durable(self, offset: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: self.durable_offset is not None and self.durable_offset >= offset, timeout_s)

    def flush(self, timeout_s: float) -> None:
        self.make_durable()

    def read_frames(self, from_offset: int, max_bytes: int) -> tuple[bytes, int, int]:
        with self._cond:
            if from_offset < self.first_offset:
                from wal.errors import OffsetBelowRetention
                raise OffsetBelowRetention(from_offset, self.first_offset)
            out, size, offset = [], 0, from_offset
            while self.durable_offset is not None and offset <= self.durable_offset:
                frame = self._frames[offset]
                if out and size + len(frame) > max_bytes:
                    break
                out.append(frame)
                size += len(frame)
                offset += 1
        data = b"".join(out)
        if self.read_hook is not None:
            data = self.read_hook(data)
        return data, from_offset, offset - 1

    def frames(self, first: int, last: int) -> bytes:
        return b"".join(frame_for_existing for frame_for_existing in (self._frames[o] for o in range(first, last + 1)))

    def _seg_base(self, offset: int) -> int:
        return offset - offset % self.segment_frames

    def segments(self) -> list[SegInfo]:
        with self._cond:
            bases = sorted({self._seg_base(o) for o in self._frames})
            out = []
            for base in bases:
                offsets = [o for o in range(base, base + self.segment_frames) if o in self._frames]
                last = max(offsets)
                sealed = last == base + self.segment_frames - 1
                out.append(SegInfo(base, last, f"mem/{base}", sum(len(self._frames[o]) for o in offsets),
                                   self._created_ms.get(base, 0), sealed))
            return out

    def truncate_before(self, offset: int) -> None:
        with self._cond:
            self.truncations.append(offset)
            for seg in self.segments():
                if seg.last_offset < offset:
                    for o in range(seg.base_offset, seg.last_offset + 1):
                        self._frames.pop(o, None)
            remaining = [o for o in self._frames]
            self.first_offset = min(remaining) if remaining else self.next_offset
