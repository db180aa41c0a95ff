"""Leader election through the metadata store (SQLite and real etcd): one leader, the
fence refuses a stale leader's writes, stepping down before the lease can lapse."""
from __future__ import annotations

import threading

import pytest

from tiered.cluster import records
from tiered.cluster.leader import LeaderElection, read_leader
from tiered.errors import StorageUnavailable
from tiered.metadata import open_metadata
from tiered.metadata.base import Put
from tiered.metadata.testing.faults import FaultyMetadataStore
from tests.cluster.lm_fixtures import store_url, wait_for  # noqa: F401 - fixture

TTL_S = 2.0


def test_exactly_one_leader_among_candidates(store_url):
    stores = [open_metadata(store_url) for _ in range(3)]
    elections = [LeaderElection(s, f"c{i}", ttl_s=TTL_S) for i, s in enumerate(stores)]
    barrier = threading.Barrier(3)

    def campaign(e: LeaderElection) -> None:
        barrier.wait()
        e.tick()

    threads = [threading.Thread(target=campaign, args=(e,)) for e in elections]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    leaders = [e for e in elections if e.is_leader()]
    assert len(leaders) == 1
    stored = read_leader(stores[0])
    assert stored is not None and stored.broker_id == leaders[0].candidate_id
    assert stored.term == leaders[0].current().term
    # A second round of campaigns changes nothing while the leader lives.
    for e in elections:
        e.tick()
    assert [e for e in elections if e.is_leader()] == leaders
    # Resigning lets exactly one other candidate win, with a higher term.
    old_term = leaders[0].current().term
    leaders[0].resign()
    for e in elections:
        if e is not leaders[0]:
            e.tick()
    new = [e for e in elections if e.is_leader()]
    assert len(new) == 1 and new[0] is not leaders[0]
    assert new[0].current().term > old_term
    for s in stores:
        s.close()


def test_stale_leader_writes_fail_their_fence(store_url):
    """Two leaders briefly: A's lease is gone (revoked behind its back, as if it expired
    while A was paused) and B won; A still holds its token. Every fenced write of A fails."""
    a_store, b_store = open_metadata(store_url), open_metadata(store_url)
    a = LeaderElection(a_store, "A", ttl_s=TTL_S)
    b = LeaderElection(b_store, "B", ttl_s=TTL_S)
    a.tick()
    stale = a.current()
    assert stale is not None
    b_store.revoke_lease(stale.lease_id)  # A's lease lapses; A does not know yet
    b.tick()
    fresh = b.current()
    assert fresh is not None and fresh.term > stale.term
    key = "/cluster/placement/default/t"
    assert not a_store.txn(stale.fencing, [Put(key, b"stale")]).succeeded
    assert a_store.get(key) is None
    assert b_store.txn(fresh.fencing, [Put(key, b"fresh")]).succeeded
    assert not a_store.txn(stale.fencing, [Put(key, b"stale")]).succeeded
    assert a_store.get(key).value == b"fresh"
    # A learns it on its next refresh (the lease is gone) and on check_lost.
    assert a.check_lost(stale) is True
    assert not a.is_leader()
    a_store.close()
    b_store.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_steps_down_before_the_lease_can_lapse(tmp_path):
    """Refreshes fail (store unreachable): leadership ends at ``sent + ttl - margin`` of
    the last refresh that worked, before the server can expire the lease."""
    clock = FakeClock()
    store = FaultyMetadataStore(open_metadata(f"sqlite:///{tmp_path}/m.db"))
    e = LeaderElection(store, "A", ttl_s=10.0, margin_s=3.0, clock=clock)
    e.tick()
    token = e.current()
    assert token is not None
    clock.now += 3.0
    e.tick()  # a refresh that worked at t=1003: the lease lives until >= 1013
    assert e.is_leader()
    store.faults.fail("refresh_lease", error=StorageUnavailable)
    clock.now = 1009.9
    e.tick()
    assert e.is_leader()  # 0.1 s more than the margin is certain
    clock.now = 1010.0
    assert not e.is_leader()  # the clock alone ends it, even before the thread notices
    e.tick()
    assert e.step_downs and "refresh" in e.step_downs[-1][1]
    assert e.current() is None
    # Stepping down revoked the lease (best effort; here the store is reachable for it):
    # a follower can win at once instead of waiting for expiry.
    assert store.get(records.LEADER_KEY) is None
    store.close()


def test_real_step_down_when_cut_off(store_url):
    """With a running election thread: cut the leader off the store (every call fails);
    it steps down, and the time it did so is before its lease could lapse."""
    base = open_metadata(store_url)
    store = FaultyMetadataStore(open_metadata(store_url))
    stepped = threading.Event()
    e = LeaderElection(store, "A", ttl_s=TTL_S, margin_s=0.7,
                       on_change=lambda token: stepped.set() if token is None else None)
    e.start()
    try:
        wait_for(e.is_leader, "A to lead")
        term = e.current().term
        store.faults.fail(None, error=StorageUnavailable)  # every call from now on
        assert stepped.wait(10.0)
        assert not e.is_leader()
        # Another candidate wins only after the old key is gone: its term is newer.
        b = LeaderElection(base, "B", ttl_s=TTL_S)
        wait_for(lambda: (b.tick(), b.is_leader())[1], "B to lead")
        assert b.current().term > term
    finally:
        store.faults.clear()
        e.stop(resign=False)
        store.close()
        base.close()


@pytest.mark.parametrize("margin_s", [0.5])
def test_follower_takes_over_when_leader_resigns(store_url, margin_s):
    stores = [open_metadata(store_url) for _ in range(2)]
    a = LeaderElection(stores[0], "A", ttl_s=TTL_S, margin_s=margin_s).start()
    wait_for(a.is_leader, "A to lead")
    b = LeaderElection(stores[1], "B", ttl_s=TTL_S, margin_s=margin_s).start()
    try:
        assert not b.is_leader()
        a.stop(resign=True)
        wait_for(b.is_leader, "B to take over")
        assert read_leader(stores[1]).broker_id == "B"
    finally:
        b.stop()
        for s in stores:
            s.close()


def test_session_health_follows_refreshes(tmp_path):
    """A failing refresh marks the session unhealthy (failovers suspended by the core);
    the next good one starts a new stable period."""
    clock = FakeClock()
    walls = iter(range(5000, 6000))
    store = FaultyMetadataStore(open_metadata(f"sqlite:///{tmp_path}/m.db"))
    e = LeaderElection(store, "A", ttl_s=10.0, margin_s=3.0, clock=clock, wall_clock=lambda: float(next(walls)))
    e.tick()
    assert e.healthy_since == 5000.0
    store.faults.fail("refresh_lease", error=StorageUnavailable, times=1)
    clock.now += 1.0
    e.tick()
    assert e.is_leader() and e.healthy_since is None
    clock.now += 1.0
    e.tick()
    assert e.healthy_since is not None and e.healthy_since > 5000.0
    store.close()
