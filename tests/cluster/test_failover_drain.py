"""Failover (grace, cancel, suspension), moves in flight, stuck states, and draining."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from tiered.cluster import (
    BrokerMode,
    CompleteTransfer,
    FailoverConfig,
    LeaderHealth,
    LoadManagerConfig,
    MarkDrained,
    MoveKind,
    PlacementState,
    Reassign,
    RetryAssign,
    Transfer,
    decide,
)

from tests.cluster.helpers import NOW, OLD, READY, cluster, owned, record, with_broker

STABLE = LeaderHealth(session_healthy=True, healthy_since=OLD)
CFG = LoadManagerConfig(assignment_strategy="fair")


def three(dead_since: float | None = None, **view_kw):
    view = cluster({"a": ["/a/1", "/a/2", "/a/3", "/a/4"], "b": ["/b/1"], "c": ["/c/1"]}, leader=STABLE, **view_kw)
    if dead_since is not None:
        view = with_broker(view, "a", registered=False, unregistered_since=dead_since)
    return view


def of(decision, kind):
    return [a for a in decision.actions if isinstance(a, kind)]


def test_failover_waits_for_the_grace_then_reassigns_everything_spread_out() -> None:
    waiting = decide(three(dead_since=NOW - 29), CFG, READY, NOW)
    assert of(waiting, Reassign) == [] and waiting.next_wakeup_at == NOW + 1
    d = decide(three(dead_since=NOW - 30), CFG, READY, NOW)
    moves = of(d, Reassign)
    assert sorted(m.topic for m in moves) == ["/a/1", "/a/2", "/a/3", "/a/4"]
    assert all(m.from_broker == "a" and m.reason == "failover" for m in moves)
    assert Counter(m.to_broker for m in moves) == {"b": 2, "c": 2}


def test_a_broker_that_re_registers_within_the_grace_keeps_its_topics() -> None:
    assert decide(three(), CFG, READY, NOW + 1000).actions == ()


def test_grace_is_longer_while_the_leaders_session_is_new() -> None:
    view = replace(three(dead_since=NOW - 100), leader=LeaderHealth(True, healthy_since=NOW - 30))
    d = decide(view, CFG, READY, NOW)
    assert of(d, Reassign) == [] and d.next_wakeup_at == NOW - 100 + 180
    assert of(decide(view, CFG, READY, NOW + 80), Reassign)


def test_failover_is_suspended_while_the_leaders_session_is_unhealthy() -> None:
    view = replace(three(dead_since=NOW - 1000), leader=LeaderHealth(session_healthy=False))
    d = decide(view, CFG, READY, NOW)
    assert of(d, Reassign) == [] and [a.kind for a in d.alarms] == ["FailoverSuspended"]


def test_failover_is_suspended_when_most_brokers_vanish_at_once() -> None:
    layout = {b: [f"/{b}/1"] for b in "abcde"}
    view = cluster(layout, leader=STABLE)
    for b, t in zip("abc", (NOW - 40, NOW - 35, NOW - 33)):  # 3 of 5 within 10 s of each other
        view = with_broker(view, b, registered=False, unregistered_since=t)
    d = decide(view, CFG, READY, NOW)
    assert of(d, Reassign) == [] and {a.kind for a in d.alarms} == {"FailoverSuspended"}
    assert d.next_wakeup_at == NOW - 33 + 180
    later = decide(view, CFG, READY, NOW - 33 + 180)
    assert sorted(m.topic for m in of(later, Reassign)) == ["/a/1", "/b/1", "/c/1"]
    # two of five (not more than half) is ordinary failover
    view2 = with_broker(view, "c", registered=True, unregistered_since=None)
    assert len(of(decide(view2, CFG, READY, NOW), Reassign)) == 2


def test_failover_is_exempt_from_limits_and_never_targets_a_draining_broker() -> None:
    view = three(dead_since=NOW - 60)
    view = with_broker(view, "c", mode=BrokerMode.DRAINING)
    # the hourly budget is spent and every topic moved a moment ago: failover goes on
    hist = [record(t, "b", "a", NOW - 20 - i) for i, t in enumerate(["/a/1", "/a/2", "/a/3", "/a/4"] * 3)]
    d = decide(replace(view, history=hist), CFG, READY, NOW)
    assert len(of(d, Reassign)) == 4
    assert {m.to_broker for m in of(d, Reassign)} == {"b"}


def test_completing_a_move_uses_the_planned_target_or_picks_another() -> None:
    view = three()
    p = replace(owned("/b/1", "b"), state=PlacementState.RELEASING, target="c", source_released=True, move_id="m1")
    placements = {**view.placements, "/b/1": p}
    [c] = of(decide(replace(view, placements=placements), CFG, READY, NOW), CompleteTransfer)
    assert (c.to_broker, c.retargeted, c.move_id) == ("c", False, "m1")
    gone = with_broker(replace(view, placements=placements), "c", registered=False, unregistered_since=NOW - 1)
    [c] = of(decide(gone, CFG, READY, NOW), CompleteTransfer)
    assert c.retargeted and c.to_broker == "a"
    not_yet = {**view.placements, "/b/1": replace(p, source_released=False)}
    assert of(decide(replace(view, placements=not_yet), CFG, READY, NOW), CompleteTransfer) == []


def test_source_dies_before_releasing_the_move_becomes_a_failover_to_the_planned_target() -> None:
    view = three(dead_since=NOW - 60)
    p = replace(owned("/a/1", "a"), state=PlacementState.RELEASING, target="c", updated_at=NOW - 70)
    d = decide(replace(view, placements={**view.placements, "/a/1": p}), CFG, READY, NOW)
    [m] = [m for m in of(d, Reassign) if m.topic == "/a/1"]
    assert m.to_broker == "c"


def test_stuck_assignment_is_re_put_then_retargeted() -> None:
    view = three()
    p = replace(owned("/b/1", "b"), state=PlacementState.ASSIGNING, updated_at=NOW - 46, attempts=0)
    view = replace(view, placements={**view.placements, "/b/1": p})
    [r] = of(decide(view, CFG, READY, NOW), RetryAssign)
    assert (r.broker, r.attempt) == ("b", 1)
    exhausted = replace(view, placements={**view.placements, "/b/1": replace(p, attempts=3)})
    [m] = of(decide(exhausted, CFG, READY, NOW), Reassign)
    assert m.reason == "retarget" and m.to_broker != "b"
    fresh = replace(view, placements={**view.placements, "/b/1": replace(p, updated_at=NOW - 10)})
    d = decide(fresh, CFG, READY, NOW)
    assert of(d, RetryAssign) == [] and d.next_wakeup_at == NOW + 35


def test_stuck_release_raises_an_alarm_and_forces_nothing() -> None:
    view = three()
    p = replace(owned("/b/1", "b"), state=PlacementState.RELEASING, target="c", updated_at=NOW - 151)
    d = decide(replace(view, placements={**view.placements, "/b/1": p}), CFG, READY, NOW)
    assert d.actions == () and [a.kind for a in d.alarms] == ["ReleaseStuck"]


def test_drain_moves_topics_at_bounded_parallelism_ignoring_blacklist_and_age() -> None:
    topics = [f"/system/{i}" for i in range(10)]
    view = cluster({"a": topics, "b": [], "c": []}, modes={"a": BrokerMode.DRAINING})
    view = replace(view, placements={t: owned(t, "a", created_at=NOW - 1) for t in topics})
    cfg = LoadManagerConfig(assignment_strategy="fair", drain_parallel=4).with_rebalancing(
        enabled=True, blacklist_topics=("/system/*",))
    d = decide(view, cfg, READY, NOW)
    moves = of(d, Transfer)
    assert len(moves) == 4 and all(m.kind is MoveKind.DRAIN and m.to_broker in "bc" for m in moves)
    # two already releasing: only two more start
    placements = dict(view.placements)
    for t in topics[:2]:
        placements[t] = replace(placements[t], state=PlacementState.RELEASING, target="b")
    assert len(of(decide(replace(view, placements=placements), cfg, READY, NOW), Transfer)) == 2


def test_drained_when_nothing_names_the_broker() -> None:
    view = cluster({"a": [], "b": ["/b/1"]}, modes={"a": BrokerMode.DRAINING})
    assert of(decide(view, CFG, READY, NOW), MarkDrained) == [MarkDrained("a")]
    incoming = replace(owned("/b/1", "b"), state=PlacementState.RELEASING, target="a")
    view = replace(view, placements={"/b/1": incoming})
    assert of(decide(view, CFG, READY, NOW), MarkDrained) == []


def test_failover_grace_settings_come_from_config() -> None:
    cfg = LoadManagerConfig(assignment_strategy="fair", failover=FailoverConfig(grace_s=0.0))
    assert of(decide(three(dead_since=NOW), cfg, READY, NOW), Reassign)
