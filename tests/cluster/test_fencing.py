"""Two leaders briefly: every write of the stale one is refused by its fence, whatever
the action, and the fresh leader's same writes land (SQLite and real etcd)."""
from __future__ import annotations

import time

import pytest

from tiered.cluster import records
from tiered.cluster.actions import (
    Assign,
    CompleteTransfer,
    DropMarker,
    MarkDrained,
    Reassign,
    RetryAssign,
    Transfer,
)
from tiered.cluster.leader import LeaderElection
from tiered.cluster.observe import read_snapshot
from tiered.cluster.runtime import Executor, Fenced
from tiered.cluster.view import MoveKind
from tiered.lifecycle.ownership import registered_key
from tiered.metadata import keys, open_metadata
from tests.cluster.lm_fixtures import store_url  # noqa: F401 - fixture


def _placement(state: str, broker: str, **kw) -> bytes:
    now = time.time()
    return records.encode(records.PlacementRecord(state=state, broker=broker, created_at=now, updated_at=now, **kw))


def _seed(store) -> None:
    """Brokers x (live), y (live), z (dead); topics in every state an action applies to."""
    lease = store.grant_lease(30)
    for b in ("x", "y"):
        store.put(registered_key(b), b"{}", lease.id)
    store.put(keys.unassigned_key("/ns/new"), keys.Unassigned("new", None).to_json())
    store.put(records.placement_key("/ns/owned"), _placement("owned", "x"))
    store.put(keys.assignment_key("x", "/ns/owned"), keys.Assignment(0.0).to_json())
    store.put(records.placement_key("/ns/released"), _placement("releasing", "x", target="y", move_id="m1",
                                                                kind="manual"))
    store.put(records.placement_key("/ns/dead"), _placement("owned", "z"))
    store.put(keys.assignment_key("z", "/ns/dead"), keys.Assignment(0.0).to_json())
    store.put(records.placement_key("/ns/stuck"), _placement("assigning", "y"))
    store.put(keys.assignment_key("y", "/ns/stuck"), keys.Assignment(0.0).to_json())
    store.put(keys.unassigned_key("/ns/owned"), keys.Unassigned("new", None).to_json())
    store.put(records.broker_state_key("y"), records.encode(records.BrokerStateRecord("draining")))


ACTIONS = [
    Assign("/ns/new", "y", "new"),
    Transfer("/ns/owned", "x", "y", MoveKind.AUTO, "1-1", 1.0),
    CompleteTransfer("/ns/released", "x", "y", "m1", retargeted=False),
    Reassign("/ns/dead", "z", "x", "failover", "1-2"),
    RetryAssign("/ns/stuck", "y", 1),
    DropMarker("/ns/owned", "duplicate"),
    MarkDrained("y"),
]


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: type(a).__name__)
def test_every_write_of_a_stale_leader_is_refused(store_url, action):
    a_store, b_store = open_metadata(store_url), open_metadata(store_url)
    try:
        _seed(b_store)
        a = LeaderElection(a_store, "A", ttl_s=5.0)
        a.tick()
        stale = a.current()
        b_store.revoke_lease(stale.lease_id)  # A's lease is gone while A is paused
        b = LeaderElection(b_store, "B", ttl_s=5.0)
        b.tick()
        fresh = b.current()
        assert fresh is not None and fresh.term > stale.term
        snap = read_snapshot(a_store, owners_for="all")
        before = a_store.current_revision()
        with pytest.raises(Fenced):
            Executor(a_store).apply(action, snap, stale)  # A still believes it leads
        assert a_store.current_revision() == before  # nothing landed
        # The same write from the fresh leader, on the same snapshot, lands.
        assert Executor(b_store).apply(action, snap, fresh) is True
        assert b_store.current_revision() > before
    finally:
        a_store.close()
        b_store.close()


def test_a_write_made_with_no_leader_at_all_is_refused(store_url):
    store = open_metadata(store_url)
    try:
        _seed(store)
        a = LeaderElection(store, "A", ttl_s=5.0)
        a.tick()
        token = a.current()
        store.revoke_lease(token.lease_id)  # the key is gone; nobody has won since
        before = store.current_revision()
        with pytest.raises(Fenced):
            Executor(store).apply(ACTIONS[0], read_snapshot(store), token)
        assert store.current_revision() == before
        assert store.get(records.LEADER_KEY) is None
        store.put("/unrelated", b"x")  # the store itself still works
    finally:
        store.close()


def test_failover_reassign_refused_while_the_broker_is_registered(store_url):
    """I2: a failover is written only while the old broker's registration is absent: a
    broker that re-registered at the last moment keeps its topic."""
    store = open_metadata(store_url)
    try:
        _seed(store)
        e = LeaderElection(store, "A", ttl_s=5.0)
        e.tick()
        snap = read_snapshot(store)
        lease = store.grant_lease(30)
        store.put(registered_key("z"), b"{}", lease.id)  # z is back
        assert Executor(store).apply(Reassign("/ns/dead", "z", "x", "failover", "1-3"), snap, e.current()) is False
        assert store.get(keys.assignment_key("z", "/ns/dead")) is not None
        assert store.get(keys.assignment_key("x", "/ns/dead")) is None
    finally:
        store.close()


def test_a_malformed_load_report_is_skipped_not_fatal(tmp_path):
    """A report with NaN, negative or non-numeric load never reaches the core (which
    would refuse the whole view and stall the leader)."""
    from tiered.cluster.config import LoadManagerConfig
    from tiered.cluster.decide import decide
    from tiered.cluster.observe import ViewBuilder

    store = open_metadata(f"sqlite:///{tmp_path}/m.db")
    try:
        lease = store.grant_lease(30)
        for b, body in (("x", b'{"broker_id":"x","seq":1,"ts":1.0,"cpu_pct":NaN}'),
                        ("y", b'{"broker_id":"y","seq":1,"ts":1.0,"cpu_pct":"high"}'),
                        ("z", b'{"broker_id":"z","seq":1,"ts":1.0,"topics":[{"topic":"/ns/t","msg_in_rate":-5},'
                              b'{"topic":"/ns/u","msg_in_rate":3}]}')):
            store.put(registered_key(b), b"{}", lease.id)
            store.put(records.load_key(b), body, lease.id)
        snap = read_snapshot(store)
        assert sorted(snap.reports) == ["z"] and len(snap.malformed) == 2
        assert [t.topic for t in snap.reports["z"].topic_reports()] == ["/ns/u"]
        view = ViewBuilder(LoadManagerConfig()).build(snap, 2.0)
        decide(view, LoadManagerConfig(), None, 2.0)  # does not raise
    finally:
        store.close()


def test_history_is_pruned_by_age_and_count_but_never_the_last_hour(tmp_path):
    from tiered.cluster import admin
    from tiered.cluster.runtime import LoadManager, RuntimeConfig

    store = open_metadata(f"sqlite:///{tmp_path}/m.db")
    now = 10 * 86_400.0
    try:
        def put(started: float, done: bool, n: int) -> None:
            h = records.HistoryRecord(f"m{n}", "/ns/t", "x", "y", "auto", "auto", started, 1, 0.0,
                                      started + 1 if done else None, started)
            store.put(records.history_key(started, f"m{n}"), records.encode(h))

        put(now - 8 * 86_400, True, 1)   # too old: pruned
        put(now - 8 * 86_400, False, 2)  # too old but never completed: kept
        for n in range(3, 8):
            put(now - 2 * 86_400 + n, True, n)  # within retention; the two oldest exceed the count
        put(now - 60, True, 8)          # the last hour: kept whatever the count
        lm = LoadManager(store, "A", runtime=RuntimeConfig(history_entries_max=5), clock=lambda: now)
        lm.election.tick()
        lm.step()
        left = sorted(h["move_id"] for h in admin.history(store)["history"])
        assert left == ["m2", "m5", "m6", "m7", "m8"]
        lm.election.resign()
    finally:
        store.close()


def test_load_report_rates_follow_the_topic_epoch(tmp_path):
    """Rates are deltas per (topic, epoch): none in a topic's first interval, then the
    messages and WAL bytes written since the previous report."""
    from tiered.cluster.reports import LoadReporter
    from tests.tiered.helpers_lifecycle import FAST_BROKER, local_stores
    from tiered.lifecycle import BrokerHost

    metadata, objects = local_stores(str(tmp_path))
    host = BrokerHost("r1", str(tmp_path / "wal"), metadata, objects, FAST_BROKER)
    clock = [100.0]
    try:
        hosted = host.load("/ns/rated")
        reporter = LoadReporter(host, interval_s=3600.0, clock=lambda: clock[0])
        assert reporter.report_once()
        first = read_snapshot(metadata).reports["r1"].topic_reports()
        assert [(t.topic, t.msg_in_rate) for t in first] == [("/ns/rated", 0.0)]
        for i in range(10):
            hosted.produce(b"x" * 100)
        clock[0] += 2.0
        assert reporter.report_once()
        [t] = read_snapshot(metadata).reports["r1"].topic_reports()
        assert t.msg_in_rate == 5.0 and t.bytes_in_rate >= 500.0 and t.epoch == hosted.token.epoch
    finally:
        host.close(unload=False)
        metadata.close()


def test_a_write_delayed_past_the_term_never_lands(store_url):
    """A leader's transaction stuck in a paused store member (the caller saw a timeout)
    is applied after another leader won: its fence fails then, so nothing of the old
    term lands, even late."""
    from tiered.errors import OperationTimeout
    from tiered.metadata.testing.faults import FaultyMetadataStore

    a_store = FaultyMetadataStore(open_metadata(store_url))
    b_store = open_metadata(store_url)
    try:
        _seed(b_store)
        a = LeaderElection(a_store, "A", ttl_s=5.0)
        a.tick()
        stale = a.current()
        snap = read_snapshot(a_store)
        a_store.faults.delay_write("txn")
        with pytest.raises(OperationTimeout):
            Executor(a_store).apply(ACTIONS[1], snap, stale)  # the Transfer, stuck
        a.resign()  # A gives up (or its lease lapses); B wins
        b = LeaderElection(b_store, "B", ttl_s=5.0)
        b.tick()
        assert b.is_leader()
        before = b_store.current_revision()
        [result] = a_store.faults.apply_delayed()
        assert not result.succeeded
        assert b_store.current_revision() == before
        placement = records.decode(records.PlacementRecord, "k",
                                   b_store.get(records.placement_key("/ns/owned")).value)
        assert placement.state == "owned" and b_store.get(keys.assignment_key("x", "/ns/owned")) is not None
    finally:
        a_store.close()
        b_store.close()
