"""The cache of recent durable frames keeps the writer's chunks, not copies of them, and
bounds the memory it keeps alive; readers served from it get exactly what the files hold."""
from __future__ import annotations

import gc
import tracemalloc

import pytest

import native
from tests.wal.helpers import check_payload, payload_for, read_all, small_config
from wal import WriteAheadLog
from wal.cache import FrameCache
from wal.log import _cache_tail
from wal.writer import Batch


def _frames(first: int, count: int, size: int) -> list[bytes]:
    return [native.encode_frame(first + i, 1, None, None, payload_for(first + i, size=size))
            for i in range(count)]


def test_whole_chunks_are_kept_as_they_are():
    chunks = [b"".join(_frames(0, 3, 50)), b"".join(_frames(3, 2, 50))]
    cache = FrameCache(100, 10_000)
    cache.add(0, 4, chunks)
    [(first, last, parts, skip, nbytes)] = cache.find(0)
    assert (first, last, skip) == (0, 4, 0)
    assert all(part is chunk for part, chunk in zip(parts, chunks, strict=True)), "no copy"
    assert cache.bytes == nbytes == sum(map(len, chunks))


def test_a_tail_starting_inside_a_chunk_keeps_that_chunk_whole_and_counts_it():
    """No copy and no memoryview (which the collector would track for the entry's whole
    life, atk79 S2): the chunk itself and the byte the entry's frames start at."""
    first = _frames(0, 4, 50)
    chunks = [b"".join(first), b"".join(_frames(4, 2, 50))]
    skip = len(first[0]) + len(first[1])
    cache = FrameCache(100, 10_000)
    cache.add(2, 5, chunks, skip)
    [entry] = cache.find(2)
    _first, _last, parts, kept_skip, nbytes = entry
    assert parts[0] is chunks[0] and kept_skip == skip and parts[1] is chunks[1]
    assert cache.bytes == nbytes == sum(map(len, chunks)), "the entry keeps all of chunks[0] alive"
    gc.collect()
    gc.collect()  # the first untracks the entry's parts, the next the entry (atk81 F1)
    assert not gc.is_tracked(entry), "the collector walks this entry for as long as it is cached"


def test_a_view_that_would_pass_the_byte_bound_is_copied_instead():
    first = _frames(0, 4, 50)
    chunks = [b"".join(first), b"".join(_frames(4, 2, 50))]
    skip = len(first[0])
    tail_bytes = sum(map(len, chunks)) - skip
    cache = FrameCache(100, tail_bytes)  # room for the frames, not for all of chunks[0]
    cache.add(1, 5, chunks, skip)
    [(_first, _last, parts, kept_skip, nbytes)] = cache.find(1)
    assert type(parts[0]) is bytes and parts[0] == chunks[0][skip:] and kept_skip == 0
    assert cache.bytes == nbytes == tail_bytes <= 10_000


def test_eviction_follows_the_bytes_kept_alive():
    cache = FrameCache(100, 1000)
    for first in range(0, 30, 3):
        cache.add(first, first + 2, [b"".join(_frames(first, 3, 60))])
        assert cache.bytes <= 1000
    oldest = min(o for o in range(30) if cache.covers(o))
    entries = cache.find(oldest)
    assert oldest > 0 and entries[-1][1] == 29, "evicted from the front"
    assert sum(nbytes for *_rest, nbytes in entries) == cache.bytes
    assert not cache.covers(oldest - 1) and not cache.find(oldest - 1)


def test_readers_get_the_files_bytes_from_a_cache_of_many_chunk_rounds(tmp_path):
    """Rounds of large messages span several of the core's chunks; the cache holds their
    newest frames as views and whole chunks, within its byte bound."""
    config = small_config(max_message_bytes=100_000, cache_messages_max=1000,
                          cache_bytes_max=600_000, segment_bytes_max=64 << 20)
    with WriteAheadLog.open(str(tmp_path), "/ns/t", config) as wal:
        for round_id in range(4):
            first = wal.next_offset
            wal.append_batch([payload_for(first + i, round_id, 30_000 + i) for i in range(40)])
            for i in range(5):
                wal.append(payload_for(first + 40 + i, round_id, 70_000))
            wal.flush()
            assert 0 < wal._cache.bytes <= config.cache_bytes_max
        last = wal.next_offset - 1
        cached = [o for o in range(last + 1) if wal._cache_covers(o)]
        assert cached and cached[-1] == last and cached == list(range(cached[0], last + 1))
        from_cache = wal._read_records(cached[0], last, 1 << 30)
        from_files = read_all(wal, cached[0])
        assert from_cache == from_files
        assert [check_payload(r.payload)[0] for r in from_cache] == cached


@pytest.mark.parametrize("tail_messages", [3, 2])
def test_caching_a_round_copies_none_of_it(codec, tail_messages):
    """The round's tail goes into the cache as the core's chunks (or a view of the first):
    feeding the cache allocates nothing in proportion to the round."""
    core = codec.AppendBuffer(0, max_message_bytes=1_000_000, pending_bytes_max=1 << 30,
                              batch_bytes=1 << 30, tail_messages_max=tail_messages,
                              tail_bytes_max=8 << 20, wake=lambda: None, wait_for_room=lambda: None,
                              too_large=ValueError, normalize=tuple)
    for i in range(3):  # 1.8 MB: more than one chunk of the compiled core
        core.append(payload_for(i, size=600_000), publish_time=1)
    batch = Batch(*core.take())
    cache = FrameCache(1000, 8 << 20)
    tracemalloc.start()
    try:
        tail = _cache_tail(batch)
        assert tail is not None
        assert tail[4] == sum(map(len, tail[2])), "the tail's byte count is its chunks' (from the one it starts in)"
        cache.add(*tail)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20_000, f"{peak} bytes allocated to cache {batch.nbytes - tail_position} bytes of frames"
    records = [r for _first, _last, parts, skip, _nbytes in cache.find(3 - tail_messages)
               for index, part in enumerate(parts)
               for r in native.scan_frames(part, pos=skip if index == 0 else 0).records]
    assert [check_payload(r.payload)[0] for r in records] == list(range(3 - tail_messages, 3))


def _tracked() -> int:
    gc.collect()
    gc.collect()  # an entry is untracked by the second collection it survives (atk81 F1)
    return len(gc.get_objects())


def test_cached_rounds_leave_the_collector_nothing_to_walk(tmp_path):
    """Entries live as long as the cache keeps them (one per topic per commit round, up to
    ``cache_messages_max``): each one the cyclic collector kept tracking, every full
    collection walked with the GIL held. 1,000 topics' caches held up to a million (119,646
    after 6 s at 20,000 msg/s), each full collection longer as they filled. Here 400 cached rounds
    must leave (about) no more tracked objects than 10 do."""
    config = small_config(cache_messages_max=10_000, cache_bytes_max=8 << 20, segment_bytes_max=64 << 20)
    with WriteAheadLog.open(str(tmp_path), "/ns/gc", config) as wal:
        for offset in range(10):
            wal.append(payload_for(offset))
            wal.flush()
        before = _tracked()
        for offset in range(10, 400):
            wal.append(payload_for(offset))
            wal.flush()
        grown = _tracked() - before
        assert wal._cache_covers(0), "every round is still cached"
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(400))
    assert grown < 50, f"{grown} more objects tracked after 390 more cached rounds"
