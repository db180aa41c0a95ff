"""A commit group's cache budget bounds the bytes all its topics' caches keep alive
together (wal/cache.py, CacheBudget): the largest caches give up their oldest entries
first, no cache is left with a hole, nothing is lost (readers read trimmed positions from
the segment files), the budget never waits for a busy WAL, and a closed WAL gives its
share back."""
from __future__ import annotations

import itertools
import random
import threading

import pytest

import native
from tests.wal.helpers import check_payload, open_in_group, payload_for, read_all, small_config, wait_until
from wal.cache import CacheBudget, FrameCache, _water_level
from wal.group import CommitGroup
from wal.testing import FaultFs
from tests.wal.helpers import GROUP_ROOT


def _cache(budget: CacheBudget, messages_max: int = 1000, bytes_max: int = 1 << 20) -> FrameCache:
    return FrameCache(messages_max, bytes_max, budget, threading.Lock())


def _fill(cache: FrameCache, first: int, count: int, size: int) -> bool:
    over = False
    for offset in range(first, first + count):
        frame = native.encode_frame(offset, 1, None, None, payload_for(offset, size=size))
        over = cache.add(offset, offset, [frame]) or over
    return over


def _contiguous(cache: FrameCache) -> list[int]:
    """The offsets the cache holds; asserts they are contiguous (no hole)."""
    entries = cache.find(cache._firsts[0]) if cache._firsts else []
    offsets = [o for first, last, _p, _s, _n in entries for o in range(first, last + 1)]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True
    return offsets


@pytest.mark.parametrize("seed", range(20))
def test_water_level_frees_enough_and_spares_the_smaller(seed):
    rng = random.Random(seed)
    sizes = sorted((rng.randrange(0, 1000) for _ in range(rng.randrange(1, 30))), reverse=True)
    excess = rng.randrange(1, sum(sizes) + 2)
    level = _water_level(sizes, excess)
    freed = sum(max(0, s - level) for s in sizes)
    assert freed >= min(excess, sum(sizes))
    if level > 0:
        # The highest such level: one byte higher would not free enough.
        assert sum(max(0, s - (level + 1)) for s in sizes) < excess


def test_the_total_stays_under_the_budget_and_the_largest_caches_pay_first():
    budget = CacheBudget(100_000)
    big = [_cache(budget) for _ in range(3)]
    small = [_cache(budget) for _ in range(5)]
    for cache in small:
        _fill(cache, 0, 20, 100)  # ~2.6 KB each
    small_bytes = [c.bytes for c in small]
    over = False
    for round_ in range(200):
        for cache in big:
            over = _fill(cache, round_ * 5, 5, 100) or over
            if over:
                budget.trim()
                over = False
            assert budget.bytes <= budget.bytes_max + 5 * 200, "at most one add past the bound"
    assert budget.bytes <= budget.bytes_max
    assert budget.bytes == sum(c.bytes for c in big + small), "the budget counts exactly what the caches keep"
    assert [c.bytes for c in small] == small_bytes, "the small caches kept everything: the largest paid"
    assert budget.trimmed_bytes > 0
    for cache in big + small:
        offsets = _contiguous(cache)
        assert offsets[-1] == cache._chunks[-1][1], "trimming keeps the newest entries"


def test_trimming_passes_over_a_busy_cache():
    budget = CacheBudget(20_000)
    busy, free = _cache(budget), _cache(budget)
    _fill(busy, 0, 100, 100)
    _fill(free, 0, 100, 100)  # as large: both are over the level
    busy_bytes = busy.bytes
    assert budget.bytes > budget.bytes_max
    assert busy.owner_lock is not None
    busy.owner_lock.acquire()  # its WAL holds its lock: the trim must not wait for it for long
    try:
        budget.trim()
    finally:
        busy.owner_lock.release()
    assert busy.bytes == busy_bytes, "a cache whose lock is held is left alone"
    assert free.bytes < busy_bytes, "the other caches still paid"
    budget.trim()
    assert budget.bytes <= budget.bytes_max


def test_a_detached_cache_gives_its_bytes_back_and_counts_nothing_more():
    budget = CacheBudget(1 << 20)
    a, b = _cache(budget), _cache(budget)
    _fill(a, 0, 10, 100)
    _fill(b, 0, 10, 100)
    b_bytes = b.bytes
    a.detach()
    assert budget.bytes == b_bytes and budget.caches == 1
    assert not _fill(a, 10, 5, 100)
    assert budget.bytes == b_bytes, "a detached cache (closed WAL) is not counted"


def test_clear_and_a_restarted_window_are_counted_exactly():
    budget = CacheBudget(1 << 20)
    cache = _cache(budget, messages_max=8)
    _fill(cache, 0, 20, 50)  # evicts by its own bound along the way
    assert budget.bytes == cache.bytes
    _fill(cache, 100, 3, 50)  # not contiguous: the window restarts
    assert budget.bytes == cache.bytes
    big = native.encode_frame(200, 1, None, None, b"x" * 5000)
    cache.add(200, 200 + 9, [big] * 10)  # more messages than it may keep: cleared
    assert cache.bytes == 0 and budget.bytes == 0
    _fill(cache, 300, 4, 50)
    cache.clear()
    assert budget.bytes == 0


@pytest.mark.parametrize("journaled", [False, True])
def test_a_group_keeps_its_topics_caches_under_its_budget_and_loses_nothing(journaled):
    """Twenty topics, each allowed 64 KiB of cache, share 48 KiB. Tail readers that follow
    every topic from offset 0 and readers from the start afterwards get every message
    exactly once, in order: what the budget trimmed is read from the files."""
    from wal.journal import JournalConfig

    fs = FaultFs()
    journal = JournalConfig(file_bytes=1 << 20, checkpoint_bytes=1 << 30, checkpoint_interval_s=3600.0) \
        if journaled else None
    group = CommitGroup(GROUP_ROOT, fs, journal=journal, cache_bytes_max=48 * 1024)
    budget = group.cache_budget
    assert budget is not None
    config = small_config(segment_bytes_max=1 << 20, cache_bytes_max=64 * 1024, cache_messages_max=4096)
    wals = [open_in_group(fs, group, i, config) for i in range(20)]
    readers = [wal.reader(0) for wal in wals]
    seen: list[list[int]] = [[] for _ in wals]
    per_topic = 150
    for n in range(per_topic):
        for wal in wals:
            wal.append(payload_for(n, size=300))
        if n % 10 == 9:
            for wal in wals:
                wal.flush()
            # The budget's thread trims (the rounds only ask it to).
            wait_until(lambda: budget.bytes <= budget.bytes_max)
            for index, reader in enumerate(readers):
                for record in itertools.islice(reader, 10):
                    seen[index].append(check_payload(record.payload)[0])
    for index, reader in enumerate(readers):
        for record in itertools.islice(reader, per_topic - len(seen[index])):
            seen[index].append(check_payload(record.payload)[0])
        reader.close()
    assert budget.trimmed_bytes > 0, "20 x 150 x 300 B cannot all fit 48 KiB"
    assert all(s == list(range(per_topic)) for s in seen), "every message exactly once, in order"
    for wal in wals:
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(per_topic))
    for wal in wals:
        wal.close()
    assert budget.bytes == 0 and budget.caches == 0, "closed WALs gave their share back"
    group.close()


def test_an_empty_cache_is_no_candidate_and_bad_bounds_are_refused():
    """Only caches that hold anything are sorted by a trim (atk82 F1: every cache that
    ever cached stayed a candidate, and each over-budget add sorted them all)."""
    budget = CacheBudget(1 << 20)
    caches = [_cache(budget) for _ in range(5)]
    for cache in caches:
        _fill(cache, 0, 3, 50)
    assert budget.caches == 5
    big = native.encode_frame(10, 1, None, None, b"x" * 5000)
    caches[0].add(10, 10 + 2000, [big])  # more messages than it may keep: cleared
    caches[1].clear()
    assert budget.caches == 3 and budget.bytes == sum(c.bytes for c in caches)
    for bad in (0, -1, 1.5, True, float("nan"), float("inf"), "1", None):
        with pytest.raises(ValueError):
            CacheBudget(bad)  # type: ignore[arg-type]


def test_a_trim_runs_on_the_budgets_thread_not_the_callers():
    """enforce() only asks: the sort and the trimming (hundreds of milliseconds for a tenth
    of a large budget, atk82 F1) happen on the budget's own thread."""
    budget = CacheBudget(10_000)
    caches = [_cache(budget) for _ in range(4)]
    for cache in caches:
        _fill(cache, 0, 30, 100)
    assert budget.bytes > budget.bytes_max and budget.trimmed_bytes == 0
    trimmer = threading.current_thread()
    caches[0].owner_lock.acquire()  # type: ignore[union-attr]
    try:
        budget.enforce()  # returns although a cache's lock is held by this very thread
    finally:
        caches[0].owner_lock.release()  # type: ignore[union-attr]
    wait_until(lambda: budget.bytes <= budget.bytes_max)
    assert budget._thread is not None and budget._thread is not trimmer
    budget.close()
    assert not budget._thread.is_alive()
