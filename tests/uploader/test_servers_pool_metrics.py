"""etcd really stopped under the uploader, the pool at scale, metrics, drain progress."""
from __future__ import annotations

import logging
import threading
import time

import pytest

from tests.fixtures.servers import EtcdServer
from tiered.archive import list_descriptors
from tiered.errors import StorageError, StorageUnavailable
from tiered.metadata.etcd import EtcdMetadataStore
from tiered.metadata.sqlite import SqliteMetadataStore
from tiered.objects.local import LocalObjectStore
from uploader import DrainTimeout, UploaderPool
from wal.topics import TopicName

from .conftest import Env
from .invariants import assert_archive
from .memwal import MemWal, frame_for

DOWN_BOUND_S = 3.0  # a pass with etcd gone fails within this


@pytest.fixture
def stoppable_env(tmp_path, topic):
    """Uploader env on a PRIVATE etcd (the test stops and restarts it) + a local dir."""
    server = EtcdServer().start()
    metadata = EtcdMetadataStore([server.endpoint], root="/up", timeout_s=1.0)
    env = Env(metadata, LocalObjectStore(str(tmp_path / "objects")), topic)
    env.server = server
    yield env
    metadata.close()
    server.cleanup()


@pytest.mark.etcd
def test_etcd_stopped_mid_pass_and_during_drain_then_restarted(stoppable_env):
    env = stoppable_env
    wal = MemWal(segment_frames=10)
    wal.append_n(40)
    stop_at = {"n": 0}

    def hook(step: str) -> None:
        if step == "after_put":  # the second object is in S3, its descriptor not yet in etcd
            stop_at["n"] += 1
            if stop_at["n"] == 2:
                env.server.stop()

    up = env.uploader(wal, object_bytes_max=2_000, retry_attempts_max=3, fault_hook=hook,
                      drain_timeout_s=5.0)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        up.upload_once()
    assert time.monotonic() - started < DOWN_BOUND_S
    assert isinstance(info.value, StorageUnavailable) and info.value.retryable
    done_before = up.committed_through
    assert done_before is not None and done_before < 39  # the first object committed, no more
    assert wal.truncations == [] and wal.first_offset == 0

    wal.append_n(30)  # more durable frames while etcd is down
    started = time.monotonic()
    with pytest.raises(DrainTimeout) as info:
        up.drain(timeout_s=1.0)
    assert time.monotonic() - started < 1.0 + DOWN_BOUND_S
    assert isinstance(info.value.__cause__, StorageUnavailable)
    assert wal.truncations == [] and wal.first_offset == 0  # drain never touches the WAL

    env.server.start()  # same data dir: the chain written before the outage is back
    assert up.drain(timeout_s=10) == 69
    assert_archive(env, wal.frames, 0, 69)  # contiguous, exact frames, no orphan after GC


def test_pool_archives_200_topics_on_4_workers_and_a_failing_topic_does_not_stall(tmp_path):
    metadata = SqliteMetadataStore(str(tmp_path / "meta.db"))
    objects = LocalObjectStore(str(tmp_path / "objects"))
    threads_before = set(threading.enumerate())  # other tests' threads may end meanwhile
    pool = UploaderPool(workers=4, tick_s=0.02)
    uploaders, wals = [], []
    try:
        bad_wal = MemWal()
        bad_wal.append_n(5)

        def broken(data: bytes) -> bytes:
            time.sleep(0.2)  # slow AND failing: it holds one worker at a time, never all
            raise OSError("disk on fire")

        bad_wal.read_hook = broken
        bad_env = Env(metadata, objects, TopicName.parse("/pool/bad"))
        bad = bad_env.uploader(bad_wal, interval_s=0.01)
        bad.start(pool=pool)
        for i in range(200):
            env = Env(metadata, objects, TopicName.parse(f"/pool/t{i:03d}"))
            wal = MemWal()
            wal.append_n(5 + i % 7, size=60)
            up = env.uploader(wal, interval_s=3600)
            up.start(pool=pool)
            up.request_upload()
            uploaders.append((env, up))
            wals.append(wal)
        assert len(set(threading.enumerate()) - threads_before) <= 5  # 4 workers + the scheduler
        deadline = time.monotonic() + 30
        for (env, up), wal in zip(uploaders, wals):
            assert up.wait_archived(wal.next_offset - 1, timeout_s=max(0.0, deadline - time.monotonic())), env.topic
        assert len(set(threading.enumerate()) - threads_before) <= 5
        for (env, _), wal in zip(uploaders[::40], wals[::40]):
            assert_archive(env, wal.frames, 0, wal.next_offset - 1)
        assert bad.committed_through is None
        # The broken topic keeps being retried (and keeps failing) while the others were
        # served: wait for its second counted failure instead of assuming that, on a
        # loaded machine, it already happened by the time the other 200 were archived.
        failures = lambda: bad_env.registry.get_sample_value("dnb_uploader_failures_total", {"kind": "other"}) or 0
        guard = time.monotonic() + 60
        while failures() < 2:
            assert time.monotonic() < guard, f"hang guard: the broken topic was retried {failures()} times"
            time.sleep(0.01)
        assert bad.committed_through is None
    finally:
        for _, up in uploaders:
            up.stop(1)
        bad.stop(1)
        assert pool.close(5)
        metadata.close()


def _sample(env, name, labels=None):
    return env.registry.get_sample_value(name, labels or {}) or 0.0


def test_metrics_move_as_expected(local_env):
    env = local_env
    topic = str(env.topic)
    wal = MemWal()
    wal.append_n(100, durable=False)
    wal.make_durable(upto=59)
    up = env.uploader(wal, object_bytes_max=3_000, retry_attempts_max=2)
    assert up.upload_once() == 59
    descriptors = list_descriptors(env.raw_metadata, env.topic)
    assert _sample(env, "dnb_uploader_lag_offsets", {"topic": topic}) == 0
    assert _sample(env, "dnb_uploader_objects_total", {"how": "new"}) == len(descriptors)
    assert _sample(env, "dnb_uploader_object_bytes_count") == len(descriptors)
    assert _sample(env, "dnb_uploader_object_bytes_sum") == sum(d.size for d in descriptors)
    assert _sample(env, "dnb_uploader_upload_seconds_count") == len(descriptors)
    assert 0 < _sample(env, "dnb_uploader_upload_seconds_sum") < 10
    assert _sample(env, "dnb_uploader_frame_bytes_total") == len(wal.frames(0, 59))

    # Puts fail: lag is reported even though the pass failed; failures counted by kind.
    wal.make_durable()
    fault = env.faulty_objects.faults.fail("put", times=None)
    with pytest.raises(StorageUnavailable):
        up.upload_once()
    assert _sample(env, "dnb_uploader_lag_offsets", {"topic": topic}) == 40
    frame_bytes = len(frame_for(60))
    assert _sample(env, "dnb_uploader_lag_bytes", {"topic": topic}) == pytest.approx(40 * frame_bytes, rel=0.1)
    assert _sample(env, "dnb_uploader_failures_total", {"kind": "put"}) == 2
    assert _sample(env, "dnb_uploader_failures_total", {"kind": "unavailable"}) == 2
    fault.times = 0

    # A commit that fails once, then heals.
    env.faulty_metadata.faults.fail("txn", times=1)
    assert up.upload_once() == 99
    assert _sample(env, "dnb_uploader_failures_total", {"kind": "commit"}) == 1
    assert _sample(env, "dnb_uploader_lag_offsets", {"topic": topic}) == 0
    assert _sample(env, "dnb_uploader_lag_bytes", {"topic": topic}) == 0
    total = list_descriptors(env.raw_metadata, env.topic)
    assert _sample(env, "dnb_uploader_object_bytes_sum") >= sum(d.size for d in total)
    assert _sample(env, "dnb_uploader_frame_bytes_total") == len(wal.frames(0, 99))

    # Fenced out: counted as ownership, and the per-topic series go away on stop.
    env.take_over()
    wal.append_n(3)
    with pytest.raises(Exception):
        up.upload_once()
    assert _sample(env, "dnb_uploader_failures_total", {"kind": "ownership"}) == 1
    up.stop(1)
    assert env.registry.get_sample_value("dnb_uploader_lag_offsets", {"topic": topic}) is None


def test_drain_reports_progress_per_object(local_env, caplog):
    wal = MemWal()
    wal.append_n(200, durable=False)
    wal.make_durable(upto=49)
    up = local_env.uploader(wal, object_bytes_max=2_500)
    assert up.upload_once() == 49  # a drain reports from where the chain already is
    wal.make_durable()
    calls: list[tuple] = []
    with caplog.at_level(logging.INFO, logger="uploader.uploader"):
        assert up.drain(timeout_s=10, progress=lambda done, target: calls.append((done, target))) == 199
    descriptors = list_descriptors(local_env.raw_metadata, local_env.topic)
    new = [d for d in descriptors if d.start_offset > 49]
    assert calls[0] == (49, 199)
    assert calls[1:] == [(d.end_offset, 199) for d in new]  # one call per committed object
    lines = [r.getMessage() for r in caplog.records if "drain committed" in r.getMessage()]
    assert len(lines) == len(new) > 3
    assert lines[-1].endswith("through 199 of 199 (100%)")
    assert up.drain(timeout_s=1, progress=lambda *a: calls.append(a)) == 199  # nothing left:
    assert calls[len(new) + 1:] == [(199, 199)]  # only the opening report


def test_a_failing_progress_callback_never_fails_the_drain(local_env):
    wal = MemWal()
    wal.append_n(30)
    up = local_env.uploader(wal, object_bytes_max=1_500)

    def boom(done, target):
        raise RuntimeError("ui went away")

    assert up.drain(timeout_s=10, progress=boom) == 29
    assert_archive(local_env, wal.frames, 0, 29)
