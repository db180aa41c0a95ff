"""Bounded cache of recent *durable* frames, kept encoded exactly as on disk.

The writer thread adds one entry per fsync (the tail of what it just wrote), so the
append path does no per-message cache work. Readers decode entries with the codec. It is
bounded in messages and in bytes; whatever it evicts is still in the segment files, so a
reader that misses the cache falls back to files and never loses a message.

An entry holds the append core's chunks themselves (immutable bytes the writer has just
written), not a copy: joining the tail of every commit round into one fresh bytes object
copied up to ``bytes_max`` per round (8 MiB by default, so for large messages about one
extra copy of everything written). The tail may start inside a chunk: that chunk is then
kept as a ``memoryview`` from the tail's first frame on, which keeps the whole chunk alive,
so the cache counts the whole chunk: ``bytes_max`` bounds the memory the cache keeps
alive, not only the frames it can serve. Only when a view would pass ``bytes_max`` is that
first piece copied (at most one chunk, never the whole tail).
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from native.format import Buffer


class CacheChunk(NamedTuple):
    first_offset: int
    last_offset: int
    #: Whole frames for first_offset..last_offset, back to back across the parts; each part
    #: holds whole frames (so each decodes on its own, continuing the previous one's offsets).
    parts: tuple[Buffer, ...]
    nbytes: int  # bytes this entry keeps alive (a view keeps all of its chunk alive)


#: How an entry is kept: a CacheChunk's fields in a plain tuple. The cyclic collector stops
#: tracking a plain tuple of untracked items (ints, a tuple of bytes) at the first young
#: collection it survives; it tracks a named tuple for as long as it lives. A cache entry
#: lives long (one per topic per commit round, up to ``messages_max`` per topic), so kept as
#: CacheChunk, 1,000 topics' caches held up to a million tracked objects, and every full
#: collection walked them all with the GIL held: 33 ms stalls after 15 s at 20,000 msg/s,
#: growing as the caches filled (``tests/wal/test_wal_cache.py``). ``find`` hands out
#: CacheChunks.
_Entry = tuple[int, int, tuple[Buffer, ...], int]


class FrameCache:
    """Not thread-safe on its own: the WAL calls it under its lock."""

    def __init__(self, messages_max: int, bytes_max: int) -> None:
        self._messages_max = messages_max
        self._bytes_max = bytes_max
        self._chunks: deque[_Entry] = deque()
        self._firsts: deque[int] = deque()
        self._messages = 0
        self._bytes = 0

    def add(self, first_offset: int, last_offset: int, chunks: Sequence[bytes], skip: int = 0,
            nbytes: int = -1) -> None:
        """Caches frames first_offset..last_offset: ``chunks`` joined, from byte ``skip`` of
        the first chunk on (a frame start). The chunks must be immutable and hold whole frames.
        ``nbytes``: their total length when the caller knows it (the commit round's hot path
        does), else -1 to count them here."""
        assert chunks and 0 <= skip < len(chunks[0])
        if nbytes < 0:
            nbytes = sum(map(len, chunks))
        if skip:
            parts: list[Buffer] = list(chunks)
            if nbytes <= self._bytes_max:
                parts[0] = memoryview(chunks[0])[skip:]  # no copy; keeps chunks[0] alive (counted)
            else:
                parts[0] = chunks[0][skip:]  # a view would pass the bound: copy this piece only
                nbytes -= skip
            kept = tuple(parts)
        else:
            kept = tuple(chunks)
        count = last_offset - first_offset + 1
        if count > self._messages_max or nbytes > self._bytes_max:
            self.clear()  # too big to cache; keeping older chunks would leave a hole
            return
        chunks_now = self._chunks
        if chunks_now and first_offset != chunks_now[-1][1] + 1:
            # Only the tail of a big batch was cached: the window restarts so it stays contiguous.
            self.clear()
        chunks_now.append((first_offset, last_offset, kept, nbytes))
        self._firsts.append(first_offset)
        self._messages += count
        self._bytes += nbytes
        if self._messages > self._messages_max or self._bytes > self._bytes_max:
            self._evict()

    def _evict(self) -> None:
        while self._messages > self._messages_max or self._bytes > self._bytes_max:
            first_offset, last_offset, _parts, nbytes = self._chunks.popleft()
            self._firsts.popleft()
            self._messages -= last_offset - first_offset + 1
            self._bytes -= nbytes
        assert self._messages >= 0 and self._bytes >= 0

    def clear(self) -> None:
        self._chunks.clear()
        self._firsts.clear()
        self._messages = 0
        self._bytes = 0

    def find(self, offset: int) -> list[CacheChunk]:
        """Chunks from the one holding ``offset`` to the newest; [] if not cached."""
        if not self._chunks or offset < self._firsts[0] or offset > self._chunks[-1][1]:
            return []
        at = bisect.bisect_right(self._firsts, offset) - 1
        chunks = self._chunks
        return [tuple.__new__(CacheChunk, chunks[i]) for i in range(at, len(chunks))]

    @property
    def messages(self) -> int:
        return self._messages

    @property
    def bytes(self) -> int:
        """Bytes the cache keeps alive (at most ``bytes_max``)."""
        return self._bytes
