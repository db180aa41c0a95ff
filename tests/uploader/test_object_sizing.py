"""Objects are cut by size and age, not by pass; waiters and seals still upload at once.

Event-driven: a fake clock and passes driven directly (``is_due`` / ``run_background_pass``,
as the background thread and the pool call them), so nothing here sleeps on the age bound.
"""
from __future__ import annotations

import asyncio
import math
import time

from tiered.archive import list_descriptors
from uploader.sizing import DurableAges

from .invariants import assert_archive
from .memwal import MemWal, frame_for

FRAME_BYTES = len(frame_for(0))  # MemWal frames: 100-byte payloads, fixed size


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _uploader(env, wal, clock, **config):
    up = env.uploader(wal, **config)
    up._clock = clock  # noqa: SLF001 - the constructor argument, set after the env's factory
    up._next_due_s = clock() + up.config.interval_s  # noqa: SLF001
    up._listen_durable()  # noqa: SLF001 - the WAL's durable listener, as start() adds it
    return up


def _trickle(up, wal, clock, *, seconds: float, step_s: float, per_step: int) -> tuple[int, dict[int, float]]:
    """Append ``per_step`` durable messages every ``step_s`` for ``seconds`` of fake time,
    running a pass whenever the uploader says one is due; returns (passes, durable_at)."""
    passes = 0
    durable_at: dict[int, float] = {}
    for _ in range(int(seconds / step_s)):
        clock.now_s += step_s
        last = wal.append_n(per_step)
        for offset in range(last - per_step + 1, last + 1):
            durable_at[offset] = clock.now_s
        if up.is_due():
            up.run_background_pass()
            passes += 1
    return passes, durable_at


def _ranges(env) -> list[tuple[int, int]]:
    return [(d.start_offset, d.end_offset) for d in list_descriptors(env.raw_metadata, env.topic)]


def test_a_steady_trickle_cuts_objects_by_size_not_by_pass(local_env):
    clock = FakeClock()
    wal = MemWal(segment_frames=10_000)
    target = 40 * FRAME_BYTES
    up = _uploader(local_env, wal, clock, interval_s=2.0, object_target_bytes=target, object_age_max_s=3600)
    passes, _ = _trickle(up, wal, clock, seconds=600, step_s=0.5, per_step=2)  # 4 msg/s
    ranges = _ranges(local_env)
    archived = ranges[-1][1] + 1
    # Without sizing every pass (one per interval at least: >= 300) cut an object.
    assert passes >= 300
    assert len(ranges) == archived // 40 and len(ranges) <= math.ceil(2400 / 40)
    assert all(end - start + 1 == 40 for start, end in ranges), ranges  # every object full
    assert wal.next_offset - archived < 40  # only a not-yet-full tail is left
    assert_archive(local_env, wal.frames, 0, archived - 1)


def test_a_slow_trickle_is_cut_by_the_age_of_its_oldest_frame(local_env):
    clock = FakeClock()
    wal = MemWal(segment_frames=10_000)
    up = _uploader(local_env, wal, clock, interval_s=2.0, object_age_max_s=60.0)  # target: 32 MiB
    passes, durable_at = _trickle(up, wal, clock, seconds=600, step_s=1.0, per_step=1)
    descriptors = list_descriptors(local_env.raw_metadata, local_env.topic)
    assert passes >= 300
    assert 9 <= len(descriptors) <= 11  # ~one per age bound, not one per pass
    for d in descriptors:
        # Cut when its oldest frame reached the age bound, at the latest one interval
        # later (the pass cadence), plus the merge slack of the age marks.
        oldest_s, newest_s = durable_at[d.start_offset], durable_at[d.end_offset]
        assert 59.0 <= newest_s - oldest_s <= 62.0, (d, oldest_s, newest_s)
    # Every frame older than the bound (plus one interval) is archived.
    done = descriptors[-1].end_offset
    assert all(clock.now_s - t < 60.0 + 2.0 for o, t in durable_at.items() if o > done)


def test_a_pass_that_finds_less_than_the_target_uploads_nothing(local_env):
    clock = FakeClock()
    wal = MemWal()
    up = _uploader(local_env, wal, clock, object_target_bytes=100 * FRAME_BYTES, object_age_max_s=60)
    wal.append_n(99)
    clock.now_s += 59
    up.run_background_pass()  # neither full nor old
    assert up.committed_through is None and _ranges(local_env) == []
    wal.append_n(150)
    up.run_background_pass()  # two full objects; the young rest waits
    assert _ranges(local_env) == [(0, 99), (100, 199)]
    clock.now_s += 59
    up.run_background_pass()
    assert _ranges(local_env) == [(0, 99), (100, 199)]
    clock.now_s += 1  # the rest's oldest frame reaches the age bound
    assert up.is_due()
    up.run_background_pass()
    assert _ranges(local_env) == [(0, 99), (100, 199), (200, 248)]
    assert_archive(local_env, wal.frames, 0, 248)


def test_an_estimate_that_overshoots_reads_but_uploads_nothing(local_env):
    """The lag estimate seeds at 256 B per frame; real frames are smaller. A pass that reads
    less than the target learns the real size and cuts nothing."""
    clock = FakeClock()
    wal = MemWal()
    target = 60 * FRAME_BYTES
    up = _uploader(local_env, wal, clock, object_target_bytes=target, object_age_max_s=60)
    wal.append_n(40)  # 40 * 256 estimated >= target > 40 * 126 real
    assert up.is_due()
    up.run_background_pass()
    assert up.committed_through is None
    assert not up.is_due()  # learned: 40 real frames are below the target
    wal.append_n(20)
    up.run_background_pass()
    assert _ranges(local_env) == [(0, 59)]


def test_wal_retention_limits_tighten_both_bounds(local_env):
    from uploader.config import RetentionConfig

    clock = FakeClock()
    wal = MemWal()
    up = _uploader(local_env, wal, clock, object_age_max_s=3600,
                   retention=RetentionConfig(bytes_max=20 * FRAME_BYTES, age_max_s=30.0))
    assert up.config.target_bytes() == 10 * FRAME_BYTES and up.config.age_max_s() == 30.0
    wal.append_n(25)
    up.run_background_pass()
    assert _ranges(local_env) == [(0, 9), (10, 19)]  # pressure: cut at half the WAL limit
    clock.now_s += 30
    up.run_background_pass()
    assert _ranges(local_env)[-1] == (20, 24)  # the retention age bounds the tail's wait


def test_archived_waiters_and_requests_do_not_wait_for_the_bounds(local_env):
    clock = FakeClock()  # never advances: the age bound never falls due
    wal = MemWal()
    up = _uploader(local_env, wal, clock, object_age_max_s=3600)
    wal.append_n(3)
    up.request_upload()  # what an archived produce does before it waits
    assert up.is_due()
    up.run_background_pass()  # the request forces the pass, even if the waiter is not in yet
    assert up.committed_through == 2
    wal.append_n(2)
    up.upload_once()  # explicit: everything durable now
    assert up.committed_through == 4


def test_archived_ack_completes_promptly_on_the_background_thread(local_env):
    wal = MemWal()
    up = local_env.uploader(wal, interval_s=3600, poll_interval_s=0.02, object_age_max_s=3600)
    up.start()
    try:
        wal.append_n(5)
        t0 = time.monotonic()
        assert up.wait_archived(4, timeout_s=10)
        wal.append_n(5)
        assert asyncio.run(up.wait_archived_async(9, timeout_s=10))
        assert time.monotonic() - t0 < 5.0  # the age bound is an hour
        wal.append_n(5)  # no waiter: these wait for size or age
        time.sleep(0.2)
        assert up.committed_through == 9
    finally:
        assert up.stop(5)
    assert_archive(local_env, wal.frames, 0, 9)


def test_seal_drain_archives_exactly_to_the_tip_whatever_the_bounds(env):
    clock = FakeClock()
    wal = MemWal()
    up = _uploader(env, wal, clock, object_age_max_s=3600)
    wal.append_n(7)
    up.run_background_pass()
    assert up.committed_through is None  # small and young: nothing yet
    wal.append_n(3)
    assert up.drain(timeout_s=10) == 9
    assert _ranges(env) == [(0, 9)]
    assert_archive(env, wal.frames, 0, 9)


def test_frames_durable_before_the_uploader_started_count_as_old(local_env):
    clock = FakeClock()
    wal = MemWal()
    wal.append_n(5)  # e.g. a WAL recovered after a crash
    up = _uploader(local_env, wal, clock, object_age_max_s=3600)
    assert up.is_due()
    up.run_background_pass()
    assert up.committed_through == 4


def test_durable_ages_merge_early_never_late():
    ages = DurableAges(granularity_s=1.0, durable_at_start=None)
    ages.note(10, 100.0)
    ages.note(20, 100.5)  # within the granularity: joins the mark at 100.0 (older, early)
    ages.note(30, 102.0)
    assert (ages.since_s(0), ages.since_s(20), ages.since_s(21), ages.since_s(31)) == (100.0, 100.0, 102.0, None)
    ages.forget_through(20)
    assert ages.since_s(21) == 102.0 and len(ages) == 1
    for i in range(5000):  # bounded: past MARKS_MAX newer offsets join the last mark
        ages.note(31 + i, 200.0 + 10 * i)
    from uploader.sizing import MARKS_MAX
    assert len(ages) <= MARKS_MAX
    assert ages.since_s(31 + 4999) <= 200.0 + 10 * 4999


def test_the_durable_listener_wakes_the_worker_once_the_estimate_reaches_the_target(local_env):
    # The listener runs once per topic per commit round, so its size test is one comparison
    # with an offset worked out ahead (_set_size_cut_at); it must agree with the estimate.
    clock = FakeClock()
    wal = MemWal(segment_frames=10_000)
    target = 40 * FRAME_BYTES
    up = _uploader(local_env, wal, clock, object_target_bytes=target, object_age_max_s=3600)
    wake = up._wake  # noqa: SLF001 - what the listener sets

    def woken_at_append() -> int:
        """Appends one message at a time until the listener wakes the worker: the durable
        offset it woke at, checked against the lag estimate at that moment."""
        wake.clear()
        while not wake.is_set():
            durable = wal.append_n(1)
            lag_bytes = up._lag_estimate()[1]  # noqa: SLF001
            assert wake.is_set() == (lag_bytes >= target), (durable, lag_bytes)
        return durable

    assert FRAME_BYTES < 256
    assert woken_at_append() == math.ceil(target / 256.0) - 1  # the seed estimate: 256 B a frame
    up.run_background_pass()  # reads, learns the real frame size: not full yet, nothing archived
    assert up.committed_through is None
    assert woken_at_append() == 39  # 40 real frames
    up.run_background_pass()
    assert up.committed_through == 39
    assert woken_at_append() == 79  # the next full object's last offset
