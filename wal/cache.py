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

Many topics: each cache is bounded on its own (``cache_bytes_max``, 8 MiB by default), so a
broker with thousands of busy topics could keep gigabytes alive in them (10,000 topics
x 8 MiB = 80 GB). A :class:`CacheBudget` bounds them together: every WAL of one commit group
(one broker's WAL root) shares its group's budget (``cache_group_bytes_max``). Past it, the
largest caches give up their oldest entries first, down to one common level, until the
total is back under nine tenths of the budget (on the budget's own thread, not the round's). Losing an entry loses nothing: it is still in
the segment files, and a reader that finds its position no longer cached reads them.
"""
from __future__ import annotations

import bisect
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

#: One cache entry: ``(first_offset, last_offset, parts, skip, nbytes)``. The frames for
#: first_offset..last_offset lie back to back across ``parts`` (immutable bytes), from byte
#: ``skip`` of the first part on; each part holds whole frames (so each decodes on its own,
#: continuing the previous one's offsets). ``nbytes``: the bytes the entry keeps alive (all
#: of its parts).
CacheEntry = tuple[int, int, tuple[bytes, ...], int, int]

_log = logging.getLogger(__name__)


class _OwnerLock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


class FrameCache:
    """Not thread-safe on its own: the WAL calls it under its lock (``owner_lock``, which a
    shared :class:`CacheBudget` takes too before it trims this cache)."""

    def __init__(self, messages_max: int, bytes_max: int, budget: "CacheBudget | None" = None,
                 owner_lock: _OwnerLock | None = None) -> None:
        if budget is not None and owner_lock is None:
            raise ValueError("a cache under a shared budget needs the lock it is used under")
        self._messages_max = messages_max
        self._bytes_max = bytes_max
        self._chunks: deque[CacheEntry] = deque()
        self._firsts: deque[int] = deque()
        self._messages = 0
        self._bytes = 0
        self._budget = budget
        self.owner_lock = owner_lock
        self._detached = False

    def add(self, first_offset: int, last_offset: int, chunks: Sequence[bytes], skip: int = 0,
            nbytes: int = -1) -> bool:
        """Caches frames first_offset..last_offset: ``chunks`` joined, from byte ``skip`` of
        the first chunk on (a frame start). The chunks must be immutable and hold whole frames.
        ``nbytes``: their total length when the caller knows it (the commit round's hot path
        does), else -1 to count them here.

        Returns True when the shared budget is now exceeded: the caller then calls
        ``CacheBudget.enforce`` once it no longer holds the cache's lock (it trims other
        caches under their own locks, and two WAL locks are never held at once)."""
        before = self._bytes
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
            self._clear()  # too big to cache; keeping older chunks would leave a hole
        else:
            chunks_now = self._chunks
            if chunks_now and first_offset != chunks_now[-1][1] + 1:
                # Only the tail of a big batch was cached: the window restarts so it stays contiguous.
                self._clear()
            chunks_now.append((first_offset, last_offset, kept, skip, nbytes))
            self._firsts.append(first_offset)
            self._messages += count
            self._bytes += nbytes
            if self._messages > self._messages_max or self._bytes > self._bytes_max:
                self._evict()
        # Inline, not a second method: this runs for every topic of every commit round.
        budget = self._budget
        if budget is None or self._detached:
            return False
        after = self._bytes
        if not before or not after:
            budget.candidate(self)  # it becomes, or stops being, a candidate for trimming
        if not budget.single_adder:
            # Many writer threads add, under the budget's lock. The trimming thread competes
            # with all of them for the GIL and that lock, and alone it fell far behind
            # (atk88 F1: 100 topics held 40 times a 64 KiB budget), so an add that leaves
            # the budget exceeded first trims its own cache to its share (the owner lock
            # is held here, as the trimming thread holds it to trim).
            share = budget.adjust_for_owner(after - before)
            if share is None:
                return False
            got = self.trim(share)
            return budget.trimmed_by_owner(self, got) if got else True
        # Only the commit group's thread adds (it calls every member's ``add``), so this
        # count needs no lock: a lock cost about 2,900 instructions per topic-round, 5 % of
        # the round; inline, as a call cost about 1,000 more. Other threads' changes go
        # through ``adjust``, counted apart in ``_others``.
        total = budget._from_round + after - before
        budget._from_round = total
        return total + budget._others > budget.bytes_max

    def _evict(self) -> None:
        while self._messages > self._messages_max or self._bytes > self._bytes_max:
            first_offset, last_offset, _parts, _skip, nbytes = self._chunks.popleft()
            self._firsts.popleft()
            self._messages -= last_offset - first_offset + 1
            self._bytes -= nbytes
        assert self._messages >= 0 and self._bytes >= 0

    def clear(self) -> None:
        freed = self._bytes
        self._clear()
        if self._budget is not None and freed and not self._detached:
            self._budget.candidate(self)
            self._budget.adjust(-freed)

    def _clear(self) -> None:
        self._chunks.clear()
        self._firsts.clear()
        self._messages = 0
        self._bytes = 0

    def detach(self) -> None:
        """Empty the cache and leave its budget for good (its WAL closed): later adds
        cache nothing the budget would have to count. Called under the owner lock."""
        self.clear()
        if self._budget is not None and not self._detached:
            self._detached = True
            self._budget.leave(self)

    def trim(self, bytes_level: int) -> int:
        """Evict the oldest entries until at most ``bytes_level`` bytes are kept (the
        budget's call, under the owner lock); returns the bytes freed."""
        freed = 0
        while self._bytes > bytes_level and self._chunks:
            first_offset, last_offset, _parts, _skip, nbytes = self._chunks.popleft()
            self._firsts.popleft()
            self._messages -= last_offset - first_offset + 1
            self._bytes -= nbytes
            freed += nbytes
        return freed

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


class CacheBudget:
    """A bound on the bytes that many :class:`FrameCache` objects keep alive together (see
    the module docstring). Thread-safe.

    The commit round pays a few operations per topic and no lock (``FrameCache.add``); an
    add that leaves the total over the bound only asks for a trim (``enforce``). The trim itself runs on the
    budget's own thread, started at the first one (``trim``: a sort of the caches that hold
    anything, then their oldest entries), so a trim of a tenth of a large budget, hundreds
    of thousands of entries at 10,000 topics, never holds up a commit round (atk82 F1).
    ``close()`` stops that thread."""

    def __init__(self, bytes_max: int, on_trimmed: Callable[[int], object] | None = None,
                 name: str = "", single_adder: bool = True) -> None:
        """``on_trimmed(nbytes)``: called after each trim (a metric's ``inc``); ``name``
        goes into the trimming thread's name. ``single_adder``: the caches' ``add`` is
        only ever called from one thread (a commit group's), so it is counted without a
        lock; False when each WAL has its own writer thread (then it goes through
        ``adjust``, under the lock)."""
        if not isinstance(bytes_max, int) or isinstance(bytes_max, bool) or bytes_max <= 0:
            raise ValueError(f"a cache budget must be a positive number of bytes, not {bytes_max!r}")
        self.bytes_max = bytes_max
        self.single_adder = single_adder
        #: Trimming goes down to this (nine tenths): it runs once per tenth of the budget
        #: added, not once per round.
        self.bytes_low = bytes_max - bytes_max // 10
        self._lock = threading.Lock()
        self._trimming = threading.Lock()  # one trim at a time
        # What the caches keep, in two counts that together are the total: changes made by
        # ``add`` (the commit group's thread alone writes this one) and all others (under
        # ``_lock``).
        self._from_round = 0
        self._others = 0
        #: The caches that hold anything: the candidates for trimming.
        self._caches: dict[FrameCache, None] = {}
        #: Bytes trimmed off caches so far (each still in its WAL's segment files).
        self.trimmed_bytes = 0
        self._on_trimmed = on_trimmed
        self._name = name
        self._wanted = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def bytes(self) -> int:
        """Bytes the caches under this budget keep alive now."""
        return self._from_round + self._others

    @property
    def caches(self) -> int:
        """How many caches hold anything counted by this budget."""
        with self._lock:
            return len(self._caches)

    def adjust(self, delta: int) -> bool:
        """A change of ``delta`` bytes made off the commit round (a clear, a detach, a
        trim); True if the budget is exceeded."""
        with self._lock:
            self._others += delta
            return self._from_round + self._others > self.bytes_max

    def candidate(self, cache: FrameCache) -> None:
        """``cache`` began or stopped holding anything: (no longer) a candidate for trimming."""
        with self._lock:
            if cache._bytes:
                self._caches[cache] = None
            else:
                self._caches.pop(cache, None)

    def adjust_for_owner(self, delta: int) -> int | None:
        """``adjust`` for an add by one of many writer threads, in one hold of the lock:
        None if the budget is not exceeded, else the bytes the adding cache may keep, which
        its owner then trims it to: an equal share of ``bytes_low`` among the caches that
        hold anything. Not the last trim's level, which is relative to the sizes it saw:
        caches all trimmed to it by their owners could together keep 10 times the budget
        (a rerun of atk88's repro)."""
        with self._lock:
            self._others += delta
            if self._from_round + self._others <= self.bytes_max:
                return None
            return self.bytes_low // max(1, len(self._caches))

    def trimmed_by_owner(self, cache: FrameCache, nbytes: int) -> bool:
        """``cache``'s owner trimmed ``nbytes`` off it (``adjust_for_owner``), under its
        lock; True if the budget is still exceeded."""
        with self._lock:
            self._others -= nbytes
            self.trimmed_bytes += nbytes
            if not cache._bytes:
                self._caches.pop(cache, None)
            over = self._from_round + self._others > self.bytes_max
        if self._on_trimmed is not None:
            self._on_trimmed(nbytes)
        return over

    def leave(self, cache: FrameCache) -> None:
        """A detached (empty) cache: no longer a candidate for trimming."""
        with self._lock:
            self._caches.pop(cache, None)

    def enforce(self) -> None:
        """Ask for a trim (the total passed the bound); returns at once. The caller holds
        no cache's lock (the trimming thread's start takes none either)."""
        self._wanted.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._closed:
                    self._thread = threading.Thread(target=self._run, name=f"wal-cache-trim:{self._name}",
                                                    daemon=True)
                    self._thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the trimming thread (the caches stay as they are)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wanted.set()
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            if self._closed:
                return
            self._wanted.clear()
            try:
                self.trim()
            except Exception:  # a bug here must not stop trimming for good
                _log.exception("cache budget %s: trim failed", self._name)

    def trim(self) -> int:
        """Trim the largest caches, oldest entries first, down to one common level, until
        the total is at most ``bytes_low``; returns the bytes freed. A cache whose lock stays
        held (its WAL busy) for ``_LOCK_WAIT_S`` is passed over (a later trim gets it). The
        caller holds no cache's lock; the trimming thread calls this."""
        with self._trimming:
            with self._lock:
                excess = self._from_round + self._others - self.bytes_low
                caches = list(self._caches)
            freed = 0
            if excess > 0:
                # Sizes read without the caches' locks: a hint for the level, re-checked by
                # trim() under each one's lock.
                sizes = sorted(((cache._bytes, id(cache), cache) for cache in caches), reverse=True)
                level = _water_level([size for size, _id, _cache in sizes], excess)
                for size, _id, cache in sizes:
                    if size <= level or freed >= excess:
                        break
                    lock = cache.owner_lock
                    assert lock is not None
                    # Waiting is safe: this thread holds no other cache's lock, and no one
                    # holding a cache's lock waits for ``_trimming``.
                    if not lock.acquire(timeout=_LOCK_WAIT_S):
                        continue
                    try:
                        got = 0 if cache._detached else cache.trim(level)
                    finally:
                        lock.release()
                    freed += got
                    with self._lock:
                        self._others -= got
                        self.trimmed_bytes += got
                        if not cache._bytes:
                            self._caches.pop(cache, None)
        if freed and self._on_trimmed is not None:
            self._on_trimmed(freed)
        return freed


#: How long a trim waits for one cache's lock before passing it over.
_LOCK_WAIT_S = 0.05


def _water_level(sizes: list[int], excess: int) -> int:
    """The level L such that cutting every size in ``sizes`` (sorted, largest first) down
    to L frees at least ``excess`` (the most L that does): the largest caches pay first,
    and those that pay end up equal."""
    total = 0
    for count, size in enumerate(sizes, start=1):
        total += size
        following = sizes[count] if count < len(sizes) else 0
        # Cutting the first ``count`` down to ``following`` frees total - count * following.
        if total - count * following >= excess:
            return max(following, (total - excess) // count)
    return 0
