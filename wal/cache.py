"""Bounded cache of recent *durable* frames, kept encoded exactly as on disk.

The writer thread adds one chunk per fsync (the tail of what it just wrote), so the
append path does no per-message cache work. Readers decode chunks with the codec. It is
bounded in messages and in bytes; whatever it evicts is still in the segment files, so a
reader that misses the cache falls back to files and never loses a message.
"""
from __future__ import annotations

import bisect
from collections import deque
from typing import NamedTuple


class CacheChunk(NamedTuple):
    first_offset: int
    last_offset: int
    data: bytes  # whole frames for first_offset..last_offset, back to back


class FrameCache:
    """Not thread-safe on its own: the WAL calls it under its lock."""

    def __init__(self, messages_max: int, bytes_max: int) -> None:
        self._messages_max = messages_max
        self._bytes_max = bytes_max
        self._chunks: deque[CacheChunk] = deque()
        self._firsts: deque[int] = deque()
        self._messages = 0
        self._bytes = 0

    def add(self, first_offset: int, last_offset: int, data: bytes) -> None:
        count = last_offset - first_offset + 1
        if count > self._messages_max or len(data) > self._bytes_max:
            self.clear()  # too big to cache; keeping older chunks would leave a hole
            return
        if self._chunks and first_offset != self._chunks[-1].last_offset + 1:
            # Only the tail of a big batch was cached: the window restarts so it stays contiguous.
            self.clear()
        assert not self._chunks or first_offset == self._chunks[-1].last_offset + 1
        self._chunks.append(CacheChunk(first_offset, last_offset, data))
        self._firsts.append(first_offset)
        self._messages += count
        self._bytes += len(data)
        self._evict()

    def _evict(self) -> None:
        while self._messages > self._messages_max or self._bytes > self._bytes_max:
            chunk = self._chunks.popleft()
            self._firsts.popleft()
            self._messages -= chunk.last_offset - chunk.first_offset + 1
            self._bytes -= len(chunk.data)
        assert self._messages >= 0 and self._bytes >= 0

    def clear(self) -> None:
        self._chunks.clear()
        self._firsts.clear()
        self._messages = 0
        self._bytes = 0

    def find(self, offset: int) -> list[CacheChunk]:
        """Chunks from the one holding ``offset`` to the newest; [] if not cached."""
        if not self._chunks or offset < self._firsts[0] or offset > self._chunks[-1].last_offset:
            return []
        at = bisect.bisect_right(self._firsts, offset) - 1
        return [self._chunks[i] for i in range(at, len(self._chunks))]

    @property
    def messages(self) -> int:
        return self._messages

    @property
    def bytes(self) -> int:
        return self._bytes
