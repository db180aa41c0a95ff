"""The shared upload pool: one busy topic cannot starve the others, and a topic that
stops (seal cleanup, abandon, unload) while its pass is queued or running in the pool
is never uploaded by the pool afterwards."""
from __future__ import annotations

import threading

import pytest

from tiered.archive import list_descriptors
from tiered.metadata.sqlite import SqliteMetadataStore
from tiered.objects.local import LocalObjectStore
from uploader import UploaderPool
from uploader.uploader import OBJECTS_PER_PASS_MAX
from wal.topics import TopicName

from .conftest import Env
from .memwal import MemWal

WAIT_S = 30.0  # generous bound for anything that should happen promptly


@pytest.fixture
def stores(tmp_path):
    metadata = SqliteMetadataStore(str(tmp_path / "meta.db"))
    yield metadata, LocalObjectStore(str(tmp_path / "objects"))
    metadata.close()


class Gate:
    """A fault hook that records steps and can hold one step until released."""

    def __init__(self, name: str, events: list, hold: str | None = None) -> None:
        self.name, self.events, self.hold = name, events, hold
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, step: str) -> None:
        self.events.append((self.name, step))
        if step == self.hold and not self.release.is_set():
            self.reached.set()
            assert self.release.wait(WAIT_S), "hang guard: the gate was never released"


def _gated(stores, name: str, frames: int, gate: Gate, **config):
    """An uploader of a new topic holding ``frames`` durable frames, hooked to ``gate``."""
    metadata, objects = stores
    wal = MemWal()
    wal.append_n(frames, size=100)
    return Env(metadata, objects, TopicName.parse(f"/pool/{name}")).uploader(
        wal, interval_s=3600, fault_hook=gate, **config), wal


def test_a_topic_always_due_goes_behind_the_topics_that_became_due_meanwhile(stores):
    pool = UploaderPool(workers=1, tick_s=0.01)
    events: list = []
    busy_gate = Gate("busy", events, hold="before_put")
    # three full passes of one-frame objects
    busy, busy_wal = _gated(stores, "busy", 3 * OBJECTS_PER_PASS_MAX, busy_gate, object_bytes_max=100)
    quiet, _ = _gated(stores, "quiet", 3, Gate("quiet", events))
    try:
        busy.start(pool)
        busy.request_upload()
        assert busy_gate.reached.wait(WAIT_S)  # the only worker is inside busy's pass
        quiet.start(pool)
        quiet.request_upload()  # queued while busy runs
        busy.request_upload()  # busy stays due, but is not queued twice
        busy_gate.release.set()
        assert quiet.wait_archived(2, WAIT_S)
        commits = [name for name, step in events if step == "after_commit"]
        quiet_first = commits.index("quiet")
        # busy's first pass ended after OBJECTS_PER_PASS_MAX objects; quiet ran next.
        assert commits[:quiet_first] == ["busy"] * OBJECTS_PER_PASS_MAX
        assert busy.wait_archived(busy_wal.next_offset - 1, WAIT_S)
    finally:
        busy_gate.release.set()
        busy.stop(5)
        quiet.stop(5)
        assert pool.close(5)


def test_a_topic_stuck_in_a_pass_holds_one_worker_not_the_others_archived_waiters(stores):
    metadata, objects = stores
    pool = UploaderPool(workers=2, tick_s=0.01)
    events: list = []
    stuck_gate = Gate("stuck", events, hold="before_commit")
    stuck, _ = _gated(stores, "stuck", 5, stuck_gate)
    others = []
    try:
        stuck.start(pool)
        stuck.request_upload()
        assert stuck_gate.reached.wait(WAIT_S)
        for i in range(10):
            wal = MemWal()
            wal.append_n(2 + i)
            up = Env(metadata, objects, TopicName.parse(f"/pool/o{i}")).uploader(wal, interval_s=3600)
            up.start(pool)
            others.append((up, wal))
        for up, wal in others:
            assert up.wait_archived(wal.next_offset - 1, WAIT_S), up.topic
        assert stuck.committed_through is None  # still held, while all the others archived
    finally:
        stuck_gate.release.set()
        stuck.stop(5)
        for up, _ in others:
            up.stop(5)
        assert pool.close(5)


def test_a_topic_stopped_while_queued_is_never_run_by_the_pool(stores):
    metadata, objects = stores
    pool = UploaderPool(workers=1, tick_s=0.01)
    events: list = []
    blocker_gate = Gate("blocker", events, hold="before_put")
    blocker, _ = _gated(stores, "blocker", 2, blocker_gate)
    env = Env(metadata, objects, TopicName.parse("/pool/leaving"))
    wal = MemWal()
    wal.append_n(4)
    leaving = env.uploader(wal, interval_s=3600, fault_hook=Gate("leaving", events))
    try:
        blocker.start(pool)
        blocker.request_upload()
        assert blocker_gate.reached.wait(WAIT_S)  # the one worker is busy
        leaving.start(pool)
        leaving.request_upload()  # queued behind the blocker
        assert leaving.stop(WAIT_S)  # e.g. the topic is sealed or abandoned now
        blocker_gate.release.set()
        assert blocker.wait_archived(1, WAIT_S)
        # The worker is free and has drained the queue; the stopped topic never ran.
        pool.close(WAIT_S)
        assert [e for e in events if e[0] == "leaving"] == []
        assert list_descriptors(env.raw_metadata, env.topic) == []
    finally:
        blocker_gate.release.set()
        blocker.stop(5)
        pool.close(5)


def test_stop_waits_for_a_pass_running_in_the_pool_and_fencing_refuses_its_commit(stores):
    """What seal cleanup and abandon rely on before they close the WAL: once stop()
    returns True no pass of the topic runs in the pool. And a topic taken over while
    its pass runs commits nothing (the fenced descriptor transaction)."""
    metadata, objects = stores
    pool = UploaderPool(workers=2, tick_s=0.01)
    events: list = []
    gate = Gate("moving", events, hold="before_commit")
    env = Env(metadata, objects, TopicName.parse("/pool/moving"))
    wal = MemWal()
    wal.append_n(4)
    up = env.uploader(wal, interval_s=3600, fault_hook=gate)
    stopped = threading.Event()
    result: list[bool] = []
    try:
        up.start(pool)
        up.request_upload()
        assert gate.reached.wait(WAIT_S)  # the object is stored, the commit not yet made
        assert pool.running(up)
        env.take_over("2")  # another broker owns the topic now

        def stop() -> None:
            result.append(up.stop(WAIT_S))
            stopped.set()

        threading.Thread(target=stop, daemon=True).start()
        assert not stopped.wait(0.2), "stop() returned while a pass of the topic was still running"
        gate.release.set()
        assert stopped.wait(WAIT_S) and result == [True]
        assert not pool.running(up)
        assert list_descriptors(env.raw_metadata, env.topic) == []  # the fenced commit was refused
        assert up.committed_through is None
        steps_after_stop = len(events)
        up.request_upload()  # a late trigger: the pool must not pick the topic up again
        pool.close(WAIT_S)
        assert len(events) == steps_after_stop
    finally:
        gate.release.set()
        pool.close(5)
