"""Appends, durability waits, readers, errors, rotation, retention, restore, metrics."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter

import pytest

from tests.wal.helpers import check_payload, payload_for, read_all, small_config
from wal import (
    InitialOffsetMismatch,
    InvalidTopicName,
    Message,
    MessageTooLarge,
    OffsetBelowRetention,
    WalClosed,
    WalConfig,
    WriteAheadLog,
)
from wal.testing import FaultFs


@pytest.fixture
def wal(tmp_path):
    log = WriteAheadLog.open(str(tmp_path), "/ns/topic", small_config())
    yield log
    log.close()


def test_append_flush_read_and_reopen(tmp_path):
    log = WriteAheadLog.open(str(tmp_path), "/ns/t")
    assert (log.first_offset, log.next_offset, log.durable_offset) == (0, 0, None)
    assert log.append(b"a", key=b"k", attributes={"x": "y"}, publish_time=7) == 0
    assert log.append_batch([b"b", Message(b"c", key=b""), (b"d", None, {"p": "q"}, 9)]) == 1
    log.flush()
    assert log.durable_offset == 3
    records = read_all(log)
    assert [r.offset for r in records] == [0, 1, 2, 3]
    assert records[0] == (0, 7, b"k", {"x": "y"}, b"a")
    assert records[2].key == b"" and records[3].attributes == {"p": "q"} and records[3].publish_time == 9
    log.close()
    again = WriteAheadLog.open(str(tmp_path), "ns/t")
    assert (again.first_offset, again.next_offset, again.durable_offset) == (0, 4, 3)
    assert read_all(again) == records
    assert again.append(b"e") == 4
    again.close()


def test_typed_errors(tmp_path, wal):
    for bad in ("../x", "/a/b/c", "/ns/..", "", "/ns/a b"):
        with pytest.raises(InvalidTopicName):
            WriteAheadLog.open(str(tmp_path), bad)
    small = WriteAheadLog.open(str(tmp_path), "/ns/small", WalConfig(max_message_bytes=100))
    with pytest.raises(MessageTooLarge):
        small.append(b"x" * 101)
    with pytest.raises(MessageTooLarge):
        small.append(b"x" * 80, key=b"k" * 20)  # fits as payload, not as a record
    with pytest.raises(MessageTooLarge):
        small.append_batch([b"ok", b"x" * 100])
    with pytest.raises(MessageTooLarge):
        small.append_batch([Message(b"ok", attributes={"a": "b" * 95})])
    assert small.next_offset == 0, "a refused message must not consume an offset"
    small.close()
    with pytest.raises(WalClosed):
        small.append(b"late")
    with pytest.raises(WalClosed):
        small.append_batch([b"late"])


def test_concurrent_appenders_and_readers_see_every_offset_once_in_order(wal):
    threads_n, per_thread = 4, 1500
    total = threads_n * per_thread
    seen: list[list] = [[] for _ in range(3)]

    def follow(sink: list) -> None:
        with wal.reader(0) as reader:
            for record in reader:
                sink.append((record.offset, record.payload))
                if len(sink) == total:
                    return

    def produce(thread_id: int) -> None:
        sequence = 0
        while sequence < per_thread:
            if sequence % 10 == 0:  # mix batch and single appends
                wal.append_batch([b"%d:%d" % (thread_id, sequence + k) for k in range(5)])
                sequence += 5
            else:
                wal.append(b"%d:%d" % (thread_id, sequence))
                sequence += 1

    readers = [threading.Thread(target=follow, args=(s,)) for s in seen]
    producers = [threading.Thread(target=produce, args=(t,)) for t in range(threads_n)]
    for thread in readers + producers:
        thread.start()
    for thread in producers:
        thread.join(60)
    assert wal.next_offset == total
    wal.flush()
    for thread in readers:
        thread.join(60)
        assert not thread.is_alive(), "a reader stalled before seeing every offset"
    for sink in seen:
        assert [offset for offset, _ in sink] == list(range(total)), "gap, duplicate or reorder"
        assert sink == seen[0]
    # Each producer's messages are in the log exactly once and in the order it appended them.
    last_seq = {t: -1 for t in range(threads_n)}
    for _offset, payload in seen[0]:
        thread_id, sequence = map(int, payload.split(b":"))
        assert sequence == last_seq[thread_id] + 1
        last_seq[thread_id] = sequence
    assert all(v == per_thread - 1 for v in last_seq.values())


def test_readers_never_see_non_durable_offsets():
    fs = FaultFs()
    log = WriteAheadLog.open("/wal", "/ns/t", small_config(), fs=fs)
    log.append_batch([b"a", b"b"])
    log.flush()
    fs.hold_syncs()  # the next fsync blocks: appended data stays non-durable
    try:
        log.append_batch([b"c", b"d"])
        deadline = time.monotonic() + 5
        while fs.syncs_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert fs.syncs_waiting == 1 and fs.unsynced_bytes() > 0, "writer should be stuck in fsync"
        assert log.durable_offset == 1
        assert [r.offset for r in read_all(log)] == [0, 1]
        assert log.read_frames(2, 1 << 20) == (b"", 2, 1)
        live = log.reader(0)
        assert [next(live).offset for _ in range(2)] == [0, 1]
        got = []
        follower = threading.Thread(target=lambda: got.append(next(live).offset))
        follower.start()
        follower.join(0.2)
        assert follower.is_alive() and got == [], "a reader saw a non-durable offset"
        assert log.wait_durable(2, 0.05) is False
    finally:
        fs.release_syncs()
    follower.join(5)
    assert got == [2]
    assert log.wait_durable(3, 5)
    live.close()
    log.close()


def test_wait_durable_async_and_async_reader(wal):
    """An async reader waiting for records never blocks its event loop: it never makes the
    blocking wait from the loop's thread, and the loop keeps running meanwhile. (Counted,
    not timed: the loop once had to tick 10 times within 50 ms, which a loaded machine
    did not always give it.)"""
    blocking = wal._read_hooks.wait_durable

    def wait_durable(*args):
        assert threading.current_thread() is not threading.main_thread(), "a blocking wait on the loop"
        return blocking(*args)

    wal._read_hooks = wal._read_hooks._replace(wait_durable=wait_durable)

    async def scenario() -> list[int]:
        offset = wal.append(b"x")
        assert await wal.wait_durable_async(offset, 5)
        reader = wal.reader(0)
        got = []

        async def consume() -> None:
            async for record in reader:
                got.append(record.offset)
                if record.offset == 200:
                    return

        ticker_ran = 0

        async def ticker() -> None:  # proves the loop is not blocked while readers wait
            nonlocal ticker_ran
            while len(got) < 201:
                ticker_ran += 1
                await asyncio.sleep(0.001)

        task = asyncio.ensure_future(consume())
        tick = asyncio.ensure_future(ticker())
        while ticker_ran <= 10:  # the loop runs while the reader waits for offset 1
            await asyncio.sleep(0.001)
        assert got == [0]
        await asyncio.to_thread(lambda: [wal.append(b"y") for _ in range(200)])
        await asyncio.wait_for(task, 10)
        await tick
        reader.close()
        return got

    assert asyncio.run(scenario()) == list(range(201))


@pytest.mark.parametrize("next_await", ["at once", "after the read finished"])
def test_an_async_poll_cancelled_during_a_file_read_loses_and_repeats_nothing(tmp_path, monkeypatch, next_await):
    """``asyncio.wait_for(anext(reader), t)`` timing out while the reader's file read runs
    in a worker thread: the next await waits for that same read instead of starting a
    second one at the same position (which would hand its records out twice), or, if it
    finished meanwhile, hands out its records and then reads on."""
    gate = threading.Event()
    gate.set()
    real = WriteAheadLog._read_records

    def read_records(self, position, limit, max_bytes):  # type: ignore[no-untyped-def]
        if threading.current_thread() is not threading.main_thread():
            gate.wait(60)  # a cold disk: held until the poll below has given up
        return real(self, position, limit, max_bytes)

    monkeypatch.setattr(WriteAheadLog, "_read_records", read_records)
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config(cache_messages_max=8, cache_bytes_max=4096))
    try:
        for i in range(100):
            log.append(b"m%d" % i)
        log.flush()

        async def consume() -> list[int]:
            reader = log.reader(0, live=False)  # offset 0 is out of the cache: a file read
            it = reader.__aiter__()
            gate.clear()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(it.__anext__(), 0.05)
            gate.set()
            if next_await == "after the read finished":
                while not reader._fill_task.done():  # type: ignore[union-attr]
                    await asyncio.sleep(0.01)
            return [record.offset async for record in it]

        assert asyncio.run(consume()) == list(range(100))
    finally:
        log.close()


def test_durable_listener_reports_monotonic_durable_offsets(wal):
    reported = []
    wal.add_durable_listener(reported.append)
    for _ in range(50):
        wal.append(b"z")
    wal.flush()
    assert reported and reported[-1] == 49 and reported == sorted(set(reported))


def test_rotation_retention_and_offset_below_retention(tmp_path):
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config(segment_bytes_max=2048))
    for offset in range(400):
        assert log.append(payload_for(offset)) == offset
        if offset % 25 == 0:
            log.flush()
    log.flush()
    infos = log.segments()
    assert len(infos) > 3
    for previous, current in zip(infos, infos[1:]):
        assert current.base_offset == previous.last_offset + 1 and previous.sealed
        assert os.path.basename(current.path) == f"{current.base_offset:020d}.seg"
    assert not infos[-1].sealed
    cut = infos[2].base_offset + 1
    removed = log.truncate_before(cut)
    assert removed == 2 and log.first_offset == infos[2].base_offset
    assert not os.path.exists(infos[0].path) and os.path.exists(infos[2].path)
    with pytest.raises(OffsetBelowRetention) as caught:
        log.reader(infos[0].base_offset)
    assert caught.value.first_offset == infos[2].base_offset
    with pytest.raises(OffsetBelowRetention):
        log.read_frames(0, 1024)
    assert log.truncate_before(10**9) == len(infos) - 3, "the active segment is never deleted"
    assert log.segments()[0].base_offset == infos[-1].base_offset
    records = read_all(log)
    assert [r.offset for r in records] == list(range(infos[-1].base_offset, 400))
    assert all(check_payload(r.payload)[0] == r.offset for r in records)
    log.close()
    again = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    assert (again.first_offset, again.next_offset) == (infos[-1].base_offset, 400)
    again.close()


def _many_segments(fs: FaultFs) -> tuple[WriteAheadLog, list]:
    """A WAL on ``fs`` with 200 messages over several small segments, and its segments."""
    log = WriteAheadLog.open("/r", "/ns/t", small_config(segment_bytes_max=2048), fs=fs)
    for offset in range(200):
        log.append(payload_for(offset))
        if offset % 25 == 0:
            log.flush()
    log.flush()
    return log, log.segments()


def test_retention_that_cannot_record_its_first_offset_frees_the_space_once_it_can():
    """truncate_before records the new first offset before it unlinks anything; when that
    record cannot be written (an I/O error), the segments stay readable and in the WAL, and
    the next call frees them: a failure never leaves files nothing will delete."""
    fs = FaultFs()
    log, infos = _many_segments(fs)
    assert len(infos) > 3
    real_open_rw = fs.open_rw

    def open_rw_fails(path: str):
        raise OSError(5, "Input/output error (injected)", path)

    fs.open_rw = open_rw_fails  # type: ignore[method-assign]
    with pytest.raises(OSError):
        log.truncate_before(infos[-1].base_offset)
    assert log.first_offset == 0 and [s.path for s in log.segments()] == [s.path for s in infos]
    assert [check_payload(r.payload)[0] for r in read_all(log)] == list(range(200)), "nothing was lost"
    fs.open_rw = real_open_rw  # type: ignore[method-assign]
    assert log.truncate_before(infos[-1].base_offset) == len(infos) - 1
    assert [name for name in fs.listdir("/r/ns/t") if name.endswith(".seg")] == [os.path.basename(infos[-1].path)]
    log.close()


def test_retention_frees_space_on_a_full_disk():
    """The checkpoint is rewritten in place (wal/checkpoint.py), so recording the new first
    offset needs no new file: retention frees a full disk instead of failing on it."""
    fs = FaultFs()
    log, infos = _many_segments(fs)
    fs.disk_full = True
    assert log.truncate_before(infos[-1].base_offset) == len(infos) - 1
    assert [name for name in fs.listdir("/r/ns/t") if name.endswith(".seg")] == [os.path.basename(infos[-1].path)]
    fs.disk_full = False
    log.close()
    reopened = WriteAheadLog.open("/r", "ns/t", fs=fs)
    assert reopened.first_offset == infos[-1].base_offset and reopened.next_offset == 200
    reopened.close()


def test_retention_retries_the_unlinks_that_failed():
    fs = FaultFs()
    log, infos = _many_segments(fs)
    real_remove = fs.remove

    def remove_fails_once(path: str) -> None:
        del fs.remove
        raise OSError(5, "Input/output error (injected)")

    fs.remove = remove_fails_once  # type: ignore[method-assign]
    with pytest.raises(OSError):
        log.truncate_before(infos[-1].base_offset)
    assert fs.remove == real_remove
    log.truncate_before(infos[-1].base_offset)  # nothing more to drop, but the files left go now
    assert [name for name in fs.listdir("/r/ns/t") if name.endswith(".seg")] == [os.path.basename(infos[-1].path)]
    log.close()


def test_a_close_waits_for_a_retention_in_progress_before_letting_the_directory_go():
    """atk74 F2: a close that let the directory go while retention was still unlinking let
    a new instance open in between, recover the doomed segments and record them in its
    checkpoint; once they were gone its next open refused (CorruptLog)."""
    from wal.errors import WalLocked
    fs = FaultFs()
    log, infos = _many_segments(fs)
    entered, release = threading.Event(), threading.Event()
    real_remove = fs.remove

    def remove_waits(path: str) -> None:
        if path.endswith(".seg"):
            entered.set()
            assert release.wait(30)
        real_remove(path)

    fs.remove = remove_waits  # type: ignore[method-assign]
    retention = threading.Thread(target=log.truncate_before, args=(infos[-1].base_offset,))
    retention.start()
    assert entered.wait(30)  # unlinking, its checkpoint already written
    closing = threading.Thread(target=log.close)
    closing.start()
    closing.join(1.0)  # a close that does not wait for the retention has let go by now
    try:
        with pytest.raises(WalLocked):  # the directory is still held: nobody opens in between
            WriteAheadLog.open("/r", "/ns/t", small_config(segment_bytes_max=2048), fs=fs).close()
    finally:
        release.set()
        retention.join(30)
        closing.join(30)
    fs.remove = real_remove  # type: ignore[method-assign]
    with pytest.raises(WalClosed):
        log.truncate_before(infos[-1].base_offset)  # after the close: refused, nothing unlinked
    for _ in range(2):  # opens, and opens again
        reopened = WriteAheadLog.open("/r", "/ns/t", small_config(segment_bytes_max=2048), fs=fs)
        assert reopened.first_offset == infos[-1].base_offset
        assert [r.offset for r in read_all(reopened, reopened.first_offset)][-1] == 199
        reopened.close()


def test_rotation_by_age(tmp_path):
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config(segment_age_max_s=0.05))
    log.append(b"a")
    log.flush()
    time.sleep(0.08)
    log.append(b"b")
    log.flush()
    assert [s.base_offset for s in log.segments()] == [0, 1]
    log.close()


def test_topics_opened_together_reach_their_age_limit_spread_out():
    """A segment is cut by age up to a tenth early, by an amount that differs per segment:
    1,000 topics opened together must not all cut their segments in one commit round (each
    cut takes three syncs), and none may be cut later than the limit."""
    from wal.writer import AGE_JITTER, _age_jitter_ms
    age_ms = 3_600_000.0
    paths = [f"/wal/ns/t{i}/{0:020d}.seg" for i in range(1000)]
    jitters = [_age_jitter_ms(path, age_ms) for path in paths]
    assert all(0 <= j < AGE_JITTER * age_ms for j in jitters)
    buckets = Counter(int(j / (AGE_JITTER * age_ms) * 100) for j in jitters)  # 100 slices of the tenth
    assert len(buckets) > 90 and max(buckets.values()) < 30, buckets.most_common(3)
    assert _age_jitter_ms(paths[0], age_ms) == jitters[0], "the same segment, the same limit"


def test_topics_fed_alike_cut_their_segments_by_size_spread_out():
    """Topics fed alike (partitions of one stream, round-robin) fill their segments in the
    same rounds; each cut takes three syncs on the round's thread. A segment is cut by size
    up to a tenth early, by an amount that differs per segment, and never past the bound
    by more than one round."""
    from wal.testing import FaultFs
    from wal.group import CommitGroup
    from wal.writer import SIZE_JITTER
    fs = FaultFs()
    bytes_max = 32 * 1024
    group = CommitGroup("/wal", fs)
    config = small_config(segment_bytes_max=bytes_max)
    wals = [WriteAheadLog.open("/wal", f"/ns/t{i}", config, fs=fs, group=group) for i in range(40)]
    for _ in range(60):
        for wal in wals:
            wal.append(b"x" * 1000)
        for wal in wals:
            wal.flush()
    first_cuts = Counter(wal.segments()[1].base_offset for wal in wals)
    assert len(first_cuts) > 1, "every topic cut its first segment at the same offset"
    for wal in wals:
        for segment in wal.segments()[:-1]:
            assert (1 - SIZE_JITTER) * bytes_max - 1100 <= segment.size_bytes <= bytes_max + 1100
        wal.close()
    group.close()


def test_read_frames_returns_whole_validated_durable_frames(wal):
    from native import scan_frames
    for offset in range(300):
        wal.append(payload_for(offset))
    wal.flush()
    position, collected = 0, []
    while position < 300:
        frames, first, last = wal.read_frames(position, 700)
        assert first == position and last >= first
        result = scan_frames(frames, expected_offset=first)
        assert result.error is None and result.end == len(frames) and result.last_offset == last
        collected.extend(result.records)
        position = last + 1
    assert [r.offset for r in collected] == list(range(300))
    assert wal.read_frames(300, 700) == (b"", 300, 299)


def test_cache_misses_fall_back_to_files_for_slow_readers(wal):
    slow = wal.reader(0)
    for offset in range(2000):  # far more than the 64-message cache holds
        wal.append(payload_for(offset))
    wal.flush()
    assert wal._cache.messages <= 64
    assert [check_payload(r.payload)[0] for r in slow if r.offset < 1999 or slow.close()] == list(range(1999))


def test_restore_with_initial_offset(tmp_path):
    log = WriteAheadLog.open(str(tmp_path), "/ns/moved", initial_offset=22)
    assert (log.first_offset, log.next_offset, log.durable_offset) == (22, 22, None)
    with pytest.raises(OffsetBelowRetention) as caught:
        log.reader(14)
    assert caught.value.first_offset == 22
    assert log.append(b"m") == 22
    log.close()
    again = WriteAheadLog.open(str(tmp_path), "/ns/moved", initial_offset=23)
    assert again.next_offset == 23
    again.close()
    with pytest.raises(InitialOffsetMismatch):
        WriteAheadLog.open(str(tmp_path), "/ns/moved", initial_offset=5)
    with pytest.raises(InitialOffsetMismatch):
        WriteAheadLog.open(str(tmp_path), "/ns/moved", initial_offset=30)


def test_close_then_delete(tmp_path):
    log = WriteAheadLog.open(str(tmp_path), "/ns/gone")
    log.append(b"a")
    with pytest.raises(Exception):
        log.delete()
    log.close()
    log.delete()
    assert not os.path.exists(os.path.join(tmp_path, "ns", "gone"))


def test_metrics_per_instance_and_shared_registry(tmp_path):
    from prometheus_client import CollectorRegistry
    shared = CollectorRegistry()
    a = WriteAheadLog.open(str(tmp_path), "/ns/a", small_config(), metrics_registry=shared)
    b = WriteAheadLog.open(str(tmp_path), "/ns/b", small_config(), metrics_registry=shared)
    solo = WriteAheadLog.open(str(tmp_path), "/ns/c", small_config())
    a.append_batch([b"x"] * 10)
    b.append(b"y")
    a.flush()
    b.flush()
    reader = a.reader(0)
    assert shared.get_sample_value("dnb_wal_appends_total", {"topic": "/ns/a"}) == 10
    assert shared.get_sample_value("dnb_wal_appends_total", {"topic": "/ns/b"}) == 1
    assert shared.get_sample_value("dnb_wal_fsync_seconds_count", {"topic": "/ns/a"}) >= 1
    assert shared.get_sample_value("dnb_wal_records_per_fsync_sum", {"topic": "/ns/a"}) == 10
    assert shared.get_sample_value("dnb_wal_reader_lag_records", {"topic": "/ns/a"}) == 10
    next(reader)
    assert shared.get_sample_value("dnb_wal_reader_lag_records", {"topic": "/ns/a"}) == 9
    assert solo.metrics.registry is not shared
    for log in (a, b, solo):
        log.close()


def test_close_from_another_thread_wakes_a_reader_waiting_for_new_records(wal, monkeypatch):
    """A live reader blocked in next() (caught up, waiting for new records) ends as soon
    as another thread closes it, not when its wait slice runs out: the broker's long
    poll closes readers at their deadline, and each answer waited out the slice. The
    slice is made huge here, so only the wake-up can end the wait within the bound."""
    import wal.reader as wal_reader

    monkeypatch.setattr(wal_reader, "_WAIT_SLICE_S", 3600.0)
    wal.append(b"x")
    reader = wal.reader(0)
    assert next(reader).offset == 0
    ended = threading.Event()

    def follow() -> None:
        for _ in reader:  # blocks: nothing more is appended
            pass
        ended.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    time.sleep(0.1)  # let it block (a shorter sleep only makes the test weaker, never flaky)
    reader.close()
    assert ended.wait(30), "the reader kept waiting after close()"


def test_aggregated_wal_counters_never_go_down_while_wals_close_during_scrapes(tmp_path):
    """A closing WAL moves its counts into the registry's retired totals; a scrape racing
    that must count them once (a counter that drops is read as a reset)."""
    import threading

    from prometheus_client import CollectorRegistry

    from wal.metrics import set_per_topic

    registry = CollectorRegistry()
    set_per_topic(registry, False)
    wals = [WriteAheadLog.open(str(tmp_path), f"/ns/m{i}", small_config(), metrics_registry=registry)
            for i in range(30)]
    for wal in wals:
        wal.append(b"x")
        wal.flush()
    seen: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            seen.append(registry.get_sample_value("dnb_wal_appends_total", {"topic": "_all"}) or 0.0)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for wal in wals:
            wal.close()
    finally:
        stop.set()
        scraper.join(30)
    seen.append(registry.get_sample_value("dnb_wal_appends_total", {"topic": "_all"}) or 0.0)
    assert all(a <= b for a, b in zip(seen, seen[1:])), "a counter went down"
    assert seen[-1] == 30
