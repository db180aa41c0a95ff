"""Placement of new topics: round-robin within 10 % of the minimum, model updated per pick."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from tiered.cluster import (
    Assign,
    BrokerInfo,
    BrokerMode,
    ClusterView,
    CoreState,
    DropMarker,
    LoadManagerConfig,
    Transfer,
    UnassignedMarker,
    decide,
)
from tiered.cluster.placement import band, round_robin
from tiered.cluster.scoring import ScoreModel

from tests.cluster.helpers import NOW, READY, cluster, load, owned, report, with_broker


def markers(*topics: str, **kw) -> dict[str, UnassignedMarker]:
    return {t: UnassignedMarker(t, created_at=NOW - 1, **kw) for t in topics}


def assigned(decision) -> dict[str, str]:
    return {a.topic: a.broker for a in decision.actions if isinstance(a, Assign)}


def test_band_is_ten_percent_of_the_minimum() -> None:
    view = cluster({"a": [], "b": [], "c": []}, cpu={"a": 100.0, "b": 111.0, "c": 112.0},
                   mem={"a": 0.0, "b": 0.0, "c": 0.0})
    m = ScoreModel(view, LoadManagerConfig(), NOW)  # scores 35, 38.85, 39.2; limit 38.5
    assert band(m, ["a", "b", "c"], 0.10, 0.0) == ["a"]
    view = cluster({"a": [], "b": [], "c": []}, cpu={"a": 100.0, "b": 109.0, "c": 112.0},
                   mem={"a": 0.0, "b": 0.0, "c": 0.0})
    m = ScoreModel(view, LoadManagerConfig(), NOW)
    assert band(m, ["a", "b", "c"], 0.10, 0.0) == ["a", "b"]


def test_round_robin_goes_on_after_the_last_pick() -> None:
    assert round_robin(["a", "b", "c"], None) == "a"
    assert round_robin(["a", "b", "c"], "a") == "b"
    assert round_robin(["a", "c"], "b") == "c"
    assert round_robin(["a", "b", "c"], "c") == "a"
    assert round_robin([], "a") is None


def test_equal_brokers_get_new_topics_in_rotation_across_calls() -> None:
    view = cluster({"a": [], "b": [], "c": []})
    cfg = LoadManagerConfig(assignment_strategy="fair")
    state, picks = READY, []
    for i in range(6):
        d = decide(replace(view, markers=markers(f"/n/{i}")), cfg, state, NOW)
        state = d.state
        picks += list(assigned(d).values())
    assert picks == ["a", "b", "c", "a", "b", "c"]


def test_a_burst_spreads_because_each_pick_counts_at_once() -> None:
    """500 new topics in one call: Danube's integer scores send them all to one broker until
    its next report; the float model with a placeholder per pick spreads them evenly."""
    loads = {f"/old/{i}": load(1.0, 2) for i in range(30)}
    view = cluster({"a": [f"/old/{i}" for i in range(10)], "b": [f"/old/{i}" for i in range(10, 20)],
                    "c": [f"/old/{i}" for i in range(20, 30)]}, loads,
                   cpu={"a": 40.0, "b": 40.0, "c": 40.0}, mem={"a": 30.0, "b": 30.0, "c": 30.0})
    burst = markers(*(f"/new/{i:03d}" for i in range(500)))
    d = decide(replace(view, markers=burst), LoadManagerConfig(), READY, NOW)
    counts = Counter(assigned(d).values())
    assert sum(counts.values()) == 500
    assert max(counts.values()) - min(counts.values()) <= 2


def test_burst_prefers_the_idle_broker_until_it_catches_up() -> None:
    loads = {f"/old/{i}": load(1.0, 2) for i in range(20)}
    view = cluster({"a": [f"/old/{i}" for i in range(10)], "b": [f"/old/{i}" for i in range(10, 20)], "new": []},
                   loads, cpu={"a": 40.0, "b": 40.0, "new": 1.0}, mem={"a": 30.0, "b": 30.0, "new": 5.0})
    d = decide(replace(view, markers=markers(*(f"/n/{i:03d}" for i in range(60)))), LoadManagerConfig(), READY, NOW)
    counts = Counter(assigned(d).values())
    assert counts["new"] > counts["a"] and counts["new"] > counts["b"]
    assert counts["a"] > 0 and counts["b"] > 0  # it stops being the only choice once it caught up


def test_to_broker_hint_is_honoured_when_eligible_and_from_broker_is_excluded() -> None:
    view = cluster({"a": [], "b": [], "c": []})
    cfg = LoadManagerConfig(assignment_strategy="fair")
    d = decide(replace(view, markers=markers("/x/1", to_broker="c")), cfg, READY, NOW)
    assert assigned(d) == {"/x/1": "c"}
    drained = with_broker(view, "c", mode=BrokerMode.DRAINING)
    d = decide(replace(drained, markers=markers("/x/1", to_broker="c", from_broker="a")), cfg, READY, NOW)
    assert assigned(d) == {"/x/1": "b"}


def test_never_places_on_draining_drained_dead_or_stale_brokers() -> None:
    view = cluster({"ok": [], "dr": [], "dd": [], "dead": [], "stale": []})
    view = with_broker(view, "dr", mode=BrokerMode.DRAINING)
    view = with_broker(view, "dd", mode=BrokerMode.DRAINED)
    view = with_broker(view, "dead", registered=False, unregistered_since=NOW - 5)
    view = with_broker(view, "stale", report=report(1, 1, ts=NOW - 1000))
    d = decide(replace(view, markers=markers(*(f"/x/{i}" for i in range(20)))), LoadManagerConfig(), READY, NOW)
    assert set(assigned(d).values()) == {"ok"}


def test_no_reports_yet_still_places_by_topic_count() -> None:
    view = ClusterView({b: BrokerInfo(b) for b in "ab"}, {}, markers=markers("/x/1", "/x/2", "/x/3", "/x/4"))
    d = decide(view, LoadManagerConfig(), CoreState(), NOW)
    assert Counter(assigned(d).values()) == {"a": 2, "b": 2}


def test_max_topics_per_broker_is_respected() -> None:
    view = cluster({"a": ["/o/1"], "b": []})
    cfg = LoadManagerConfig(assignment_strategy="fair", max_topics_per_broker=2)
    d = decide(replace(view, markers=markers("/x/1", "/x/2", "/x/3", "/x/4")), cfg, READY, NOW)
    assert Counter(assigned(d).values()) == {"a": 1, "b": 2}
    assert any(a.kind == "NoTarget" for a in d.alarms)


def test_marker_for_a_placed_topic_is_dropped_or_completed() -> None:
    view = cluster({"a": ["/x/1", "/x/2"], "b": []})
    ms = {"/x/1": UnassignedMarker("/x/1"),                              # a creator's duplicate
          "/x/2": UnassignedMarker("/x/2", reason="unload", from_broker="a")}  # an operator's unload
    d = decide(replace(view, markers=ms), LoadManagerConfig(assignment_strategy="fair"), READY, NOW)
    kinds = {type(a).__name__: a for a in d.actions}
    assert isinstance(kinds["DropMarker"], DropMarker) and kinds["DropMarker"].topic == "/x/1"
    t = kinds["Transfer"]
    assert isinstance(t, Transfer) and (t.topic, t.from_broker, t.to_broker) == ("/x/2", "a", "b")


def test_marker_of_a_move_under_way_is_left_alone() -> None:
    from tiered.cluster import PlacementState
    view = cluster({"a": [], "b": []})
    p = replace(owned("/x/1", "a"), state=PlacementState.RELEASING, target="b")
    v = ClusterView(view.brokers, {"/x/1": p}, markers={"/x/1": UnassignedMarker("/x/1", "rebalance", "a", "b")})
    assert decide(v, LoadManagerConfig(), READY, NOW).actions == ()
