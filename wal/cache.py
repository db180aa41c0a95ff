"""Bounded cache of recent *durable* frames, kept encoded exactly as on disk.

The writer thread adds one entry per fsync (the tail of what it just wrote), so the
append path does no per-message cache work. Readers decode entries with the codec. It is
bounded in messages and in bytes; whatever it evicts is still in the segment files, so a
reader that misses the cache falls back to files and never loses a message.

An entry holds the append core's chunks themselves (immutable bytes the writer has just
written), not a copy: joining the tail of every commit round into one fresh bytes object
copied up to ``bytes_max`` per round (8 MiB by default, so for large messages about one
extra copy of everything written). The tail may start inside a chunk: the entry then keeps
that whole chunk and the byte its frames start at, so the cache counts the whole chunk:
``bytes_max`` bounds the memory the cache keeps alive, not only the frames it can serve.
Only when keeping the whole chunk would pass ``bytes_max`` is the tail's piece of it copied
(at most one chunk, never the whole tail).

Entries are plain tuples of ints and bytes (``CacheEntry``), which the cyclic collector
stops tracking once it finds all their items untracked: the entry's ``parts`` at the first
collection it survives, the entry itself at the next (the collector checks the entry before
its parts; about one entry in eleven thus reaches the oldest generation still tracked and
is walked once by a full collection, atk81 F1). It tracks a named tuple, or a
``memoryview`` (which an entry once held for a tail starting inside a chunk, atk79 S2), for
as long as it lives. An entry lives long: one per topic per commit round, up to
``messages_max`` per topic. Kept as named tuples, 1,000 topics' caches held up to a million
tracked objects (119,646 after 6 s at 20,000 msg/s), and every full collection walked them
all with the GIL held, longer as the caches filled (``tests/wal/test_wal_cache.py``).
"""
from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Sequence

#: One cache entry: ``(first_offset, last_offset, parts, skip, nbytes)``. The frames for
#: first_offset..last_offset lie back to back across ``parts`` (immutable bytes), from byte
#: ``skip`` of the first part on; each part holds whole frames (so each decodes on its own,
#: continuing the previous one's offsets). ``nbytes``: the bytes the entry keeps alive (all
#: of its parts).
CacheEntry = tuple[int, int, tuple[bytes, ...], int, int]


class FrameCache:
    """Not thread-safe on its own: the WAL calls it under its lock."""

    def __init__(self, messages_max: int, bytes_max: int) -> None:
        self._messages_max = messages_max
        self._bytes_max = bytes_max
        self._chunks: deque[CacheEntry] = deque()
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
        if skip and nbytes > self._bytes_max:
            # Keeping all of chunks[0] would pass the bound: copy the tail's piece of it only.
            kept = (chunks[0][skip:], *chunks[1:])
            nbytes -= skip
            skip = 0
        else:
            kept = tuple(chunks)  # no copy; a skip keeps chunks[0] alive whole (counted)
        count = last_offset - first_offset + 1
        if count > self._messages_max or nbytes > self._bytes_max:
            self.clear()  # too big to cache; keeping older chunks would leave a hole
            return
        chunks_now = self._chunks
        if chunks_now and first_offset != chunks_now[-1][1] + 1:
            # Only the tail of a big batch was cached: the window restarts so it stays contiguous.
            self.clear()
        chunks_now.append((first_offset, last_offset, kept, skip, nbytes))
        self._firsts.append(first_offset)
        self._messages += count
        self._bytes += nbytes
        if self._messages > self._messages_max or self._bytes > self._bytes_max:
            self._evict()

    def _evict(self) -> None:
        while self._messages > self._messages_max or self._bytes > self._bytes_max:
            first_offset, last_offset, _parts, _skip, nbytes = self._chunks.popleft()
            self._firsts.popleft()
            self._messages -= last_offset - first_offset + 1
            self._bytes -= nbytes
        assert self._messages >= 0 and self._bytes >= 0

    def clear(self) -> None:
        self._chunks.clear()
        self._firsts.clear()
        self._messages = 0
        self._bytes = 0

    def covers(self, offset: int) -> bool:
        """Whether ``offset`` is cached (a reader at it would read no file)."""
        return bool(self._chunks) and self._firsts[0] <= offset <= self._chunks[-1][1]

    def find(self, offset: int) -> list[CacheEntry]:
        """Entries from the one holding ``offset`` to the newest; [] if not cached. The
        entries themselves: the WAL calls this under its lock, so it only copies references."""
        if not self.covers(offset):
            return []
        at = bisect.bisect_right(self._firsts, offset) - 1
        return list(itertools.islice(self._chunks, at, None))

    @property
    def messages(self) -> int:
        return self._messages

    @property
    def bytes(self) -> int:
        """Bytes the cache keeps alive (at most ``bytes_max``)."""
        return self._bytes
