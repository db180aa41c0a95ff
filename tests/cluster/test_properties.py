"""Property tests of the decision core on random views.

Whatever the view: targets are registered active brokers; a topic gets at most one
action; at most one automatic move per call and never beyond the hourly limit; an
automatic move never takes a blacklisted, young, cooling or ping-ponging topic, always
lowers the imbalance it was computed on and CPU's CV, and leaves the scores' CV no
higher than it was or the stop band; drains respect their parallelism; failover
respects grace and suspension; and the same view gives the same decision, whatever
order its mappings were built in.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tiered.cluster import (
    Assign,
    BrokerCapacity,
    BrokerInfo,
    BrokerMode,
    ClusterView,
    CompleteTransfer,
    CoreState,
    DropMarker,
    LeaderHealth,
    LoadManagerConfig,
    LoadReport,
    MarkDrained,
    MoveKind,
    MoveRecord,
    MoveRequest,
    Placement,
    PlacementState,
    Reassign,
    RejectRequest,
    RetryAssign,
    TopicLoad,
    Transfer,
    UnassignedMarker,
    decide,
)
from tiered.cluster.history import HistoryIndex
from tiered.cluster.rebalance import Spreads, blacklist_matcher
from tiered.cluster.scoring import ScoreModel

NOW = 50_000.0
BROKERS = [f"b{i}" for i in range(8)]
TOPICS = [f"/{ns}/t{i}" for ns in ("default", "system") for i in range(20)]
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def reports(draw) -> LoadReport | None:
    kind = draw(st.sampled_from(["fresh", "fresh", "fresh", "stale", "none"]))
    if kind == "none":
        return None
    age = draw(st.floats(0, 80)) if kind == "fresh" else draw(st.floats(91, 5000))
    return LoadReport(ts=NOW - age, cpu_pct=draw(st.floats(0, 100)), mem_pct=draw(st.floats(0, 100)),
                      capacity=BrokerCapacity(cpu_cores=draw(st.sampled_from([2.0, 4.0, 8.0])), mem_bytes=8e9,
                                              nic_bps=1.25e9, disk_bps=5e8),
                      net_in_bps=draw(st.floats(0, 1e9)), net_out_bps=draw(st.floats(0, 1e9)),
                      disk_io_bps=draw(st.floats(0, 4e8)))


@st.composite
def brokers(draw) -> dict[str, BrokerInfo]:
    n = draw(st.integers(1, 8))
    out = {}
    for b in BROKERS[:n]:
        registered = draw(st.booleans()) or draw(st.booleans()) or draw(st.booleans())
        out[b] = BrokerInfo(
            b, mode=draw(st.sampled_from([BrokerMode.ACTIVE] * 4 + [BrokerMode.DRAINING, BrokerMode.DRAINED])),
            registered=registered, unregistered_since=None if registered else NOW - draw(st.floats(0, 400)),
            report=draw(reports()))
    return out


@st.composite
def views(draw) -> ClusterView:
    bs = draw(brokers())
    ids = sorted(bs)
    topics = draw(st.lists(st.sampled_from(TOPICS), unique=True, max_size=40))
    placements, markers, loads = {}, {}, {}
    for t in topics:
        state = draw(st.sampled_from([PlacementState.OWNED] * 5 + list(PlacementState)))
        broker = draw(st.sampled_from(ids))
        created = NOW - draw(st.sampled_from([10.0, 299.0, 301.0, 5000.0]))
        updated = NOW - draw(st.floats(0, 400))
        if state is PlacementState.FREE:
            placements[t] = Placement(t, state, None, created, updated)
        elif state is PlacementState.RELEASING:
            placements[t] = Placement(t, state, broker, created, updated, target=draw(st.sampled_from(ids)),
                                      source_released=draw(st.booleans()), move_id="m", kind=MoveKind.AUTO)
        else:
            placements[t] = Placement(t, state, broker, created, updated, attempts=draw(st.integers(0, 4)),
                                      kind=draw(st.sampled_from([None, MoveKind.AUTO])))
        if draw(st.integers(0, 9)) < 8:
            loads[t] = TopicLoad(bytes_in_rate=draw(st.floats(0, 5e7)), bytes_out_rate=draw(st.floats(0, 5e7)),
                                 producers=draw(st.integers(0, 20)), consumers=draw(st.integers(0, 20)),
                                 backlog=draw(st.floats(0, 1e6)))
    for t in draw(st.lists(st.sampled_from(TOPICS), unique=True, max_size=10)):
        markers[t] = UnassignedMarker(t, draw(st.sampled_from(["new", "unload"])),
                                      draw(st.sampled_from([None, *ids])), draw(st.sampled_from([None, *ids])),
                                      created_at=NOW - draw(st.floats(0, 100)))
    for b, info in bs.items():
        if info.report is not None:
            covered = [t for t, p in placements.items() if p.broker == b]
            bs[b] = replace(info, report=replace(info.report, topics=frozenset(covered)))
    history = [MoveRecord(f"h{i}", draw(st.sampled_from(TOPICS)), draw(st.sampled_from(ids)),
                          draw(st.sampled_from(ids)), draw(st.sampled_from(list(MoveKind))),
                          started_at=(s := NOW - draw(st.floats(0, 7200))),
                          completed_at=draw(st.sampled_from([None, s + 5])))
               for i in range(draw(st.integers(0, 25)))]
    healthy = draw(st.booleans()) or draw(st.booleans())
    leader = LeaderHealth(healthy, NOW - draw(st.floats(0, 200)) if healthy else None)
    requests = [MoveRequest(f"r{i}", draw(st.sampled_from(TOPICS)), draw(st.sampled_from([None, *ids, "zz"])))
                for i in range(draw(st.integers(0, 3)))]
    return ClusterView(bs, placements, loads, markers, history, leader, requests)


@st.composite
def calm_views(draw) -> ClusterView:
    """Views that pass the rebalancing gates (every broker registered, active and fresh,
    nothing in flight), so that automatic moves are exercised often."""
    n = draw(st.integers(2, 6))
    ids = BROKERS[:n]
    topics = draw(st.lists(st.sampled_from(TOPICS), unique=True, min_size=2, max_size=40))
    skew = draw(st.sampled_from([1.0, 3.0, 10.0]))
    placements, loads = {}, {}
    for t in topics:
        b = draw(st.sampled_from(ids))
        placements[t] = Placement(t, PlacementState.OWNED, b, NOW - draw(st.sampled_from([10.0, 5000.0])),
                                  NOW - 5000)
        loads[t] = TopicLoad(bytes_in_rate=draw(st.floats(0, 5e7)) * (skew if b == ids[0] else 1.0),
                             bytes_out_rate=draw(st.floats(0, 5e7)), producers=draw(st.integers(0, 5)),
                             consumers=draw(st.integers(0, 5)), backlog=draw(st.floats(0, 1e5)))
    bs = {}
    for b in ids:
        covered = frozenset(t for t, p in placements.items() if p.broker == b)
        share = sum(loads[t].throughput_bps for t in covered) / 2e8
        bs[b] = BrokerInfo(b, report=LoadReport(
            ts=NOW - draw(st.floats(0, 30)), cpu_pct=min(100.0, 2 + 100 * share), mem_pct=draw(st.floats(5, 60)),
            capacity=BrokerCapacity(cpu_cores=draw(st.sampled_from([4.0, 8.0])), mem_bytes=8e9, nic_bps=1.25e9,
                                    disk_bps=5e8), topics=covered))
    history = [MoveRecord(f"h{i}", draw(st.sampled_from(topics)), draw(st.sampled_from(ids)),
                          draw(st.sampled_from(ids)), draw(st.sampled_from([MoveKind.AUTO, MoveKind.MANUAL])),
                          started_at=(s := NOW - draw(st.floats(200, 7200))), completed_at=s + 5)
               for i in range(draw(st.integers(0, 12)))]
    return ClusterView(bs, placements, loads, history=history, leader=LeaderHealth(True, NOW - 1000))


@st.composite
def configs(draw) -> LoadManagerConfig:
    return LoadManagerConfig(
        assignment_strategy=draw(st.sampled_from(["fair", "balanced", "weighted_load"])),
        drain_parallel=draw(st.integers(1, 4)),
        max_topics_per_broker=draw(st.sampled_from([None, None, 5])),
    ).with_rebalancing(
        enabled=draw(st.booleans()) or draw(st.booleans()),
        aggressiveness=draw(st.sampled_from(["conservative", "balanced", "aggressive"])),
        hit_count=draw(st.integers(1, 2)),
        max_moves_per_hour=draw(st.sampled_from([None, 1, 3])),
        blacklist_topics=draw(st.sampled_from([(), ("/system/*",), ("/default/t1?",)])),
        gain_ratio_min=draw(st.sampled_from([0.0, 0.02])),
    )


@st.composite
def states(draw) -> CoreState:
    return CoreState(started_at=NOW - draw(st.sampled_from([10.0, 10_000.0])),
                     last_check_at=draw(st.sampled_from([None, NOW - 10, NOW - 10_000])),
                     hits=draw(st.integers(0, 3)), rebalancing=draw(st.booleans()),
                     rr_last=draw(st.sampled_from([None, *BROKERS])))


def target_of(action) -> str | None:
    if isinstance(action, Assign):
        return action.broker
    if isinstance(action, (Transfer, CompleteTransfer, Reassign)):
        return action.to_broker
    return None


def topic_of(action) -> str | None:
    return getattr(action, "topic", None)


def check_targets_are_always_registered_active_brokers(view, cfg, state, d) -> None:
    for action in d.actions:
        target = target_of(action)
        if target is not None:
            info = view.brokers[target]
            assert info.registered and info.mode is BrokerMode.ACTIVE, action
        if isinstance(action, (Transfer, Reassign, CompleteTransfer)):
            assert action.to_broker != action.from_broker, action


def check_one_action_per_topic_and_only_known_actions(view, cfg, state, d) -> None:
    topics = [topic_of(a) for a in d.actions if not isinstance(a, (MarkDrained, RejectRequest))]
    assert len(topics) == len(set(topics))
    allowed = (Assign, Transfer, CompleteTransfer, Reassign, RetryAssign, DropMarker, MarkDrained, RejectRequest)
    assert all(isinstance(a, allowed) for a in d.actions)
    for a in d.actions:
        if isinstance(a, Transfer):  # a transfer always starts from the current owner
            p = view.placements[a.topic]
            assert p.state is PlacementState.OWNED and p.broker == a.from_broker


def check_automatic_moves_respect_every_limit_and_rule(view, cfg, state, d) -> None:
    auto = [a for a in d.actions if isinstance(a, Transfer) and a.kind is MoveKind.AUTO]
    assert len(auto) <= 1
    if not auto:
        return
    [move] = auto
    r = cfg.rebalancing
    eff = r.effective()
    history = HistoryIndex(view.history)
    assert history.moves_in_last_hour(NOW) + 1 <= eff.max_moves_per_hour
    assert not blacklist_matcher(r.blacklist_topics)(move.topic)
    p = view.placements[move.topic]
    assert NOW - p.created_at >= r.min_topic_age_s
    last = history.last_moved_at(move.topic)
    assert last is None or NOW - last >= eff.cooldown_s
    assert not history.left_since(move.topic, move.to_broker, NOW - r.pingpong_window_s)
    assert move.cv_after < move.cv_before


def check_an_automatic_move_lowers_the_cv_of_the_scores_it_targets(view, cfg, state, d) -> None:
    for move in (a for a in d.actions if isinstance(a, Transfer) and a.kind is MoveKind.AUTO):
        # The scores as the core saw them at its check: after this call's earlier actions.
        model = ScoreModel(view, cfg, NOW)
        for a in d.actions:
            if a is not move and target_of(a) is not None:
                model.place(a.topic, target_of(a))
        before = Spreads(model)
        model.place(move.topic, move.to_broker)
        after = Spreads(model)
        assert after.imbalance < before.imbalance
        # The score may give up balance it has to spare (up to the stop band); CPU's CV falls.
        band = cfg.rebalancing.stop_ratio * cfg.rebalancing.effective().cv_threshold
        assert after.score.cv <= max(before.score.cv, band) + 1e-12
        if before.cpu is not None:
            assert after.cpu.cv < before.cpu.cv
        assert abs(before.imbalance - move.cv_before) < 1e-9 and abs(after.imbalance - move.cv_after) < 1e-9


def check_drains_respect_their_parallelism(view, cfg, state, d) -> None:
    for broker in view.brokers:
        started = sum(1 for a in d.actions if isinstance(a, Transfer) and a.kind is MoveKind.DRAIN
                      and a.from_broker == broker)
        in_flight = sum(1 for p in view.placements.values()
                        if p.state is PlacementState.RELEASING and p.broker == broker)
        assert started == 0 or started + in_flight <= cfg.drain_parallel


def check_failover_only_after_grace_and_never_while_suspended(view, cfg, state, d) -> None:
    f = cfg.failover
    leader = view.leader
    stable = leader.healthy_since is not None and NOW - leader.healthy_since >= f.stable_after_s
    for a in d.actions:
        if isinstance(a, RetryAssign):
            assert view.brokers[a.broker].registered
        if isinstance(a, Reassign) and a.reason == "failover":
            gone = view.brokers[a.from_broker]
            assert not gone.registered and leader.session_healthy
            assert NOW - gone.unregistered_since >= (f.grace_s if stable else f.grace_unstable_s)
            cohort = [b for b in view.brokers.values() if not b.registered
                      and abs(b.unregistered_since - gone.unregistered_since) <= f.mass_window_s]
            if len(cohort) > f.mass_fraction * len(view.brokers):
                assert NOW >= max(b.unregistered_since for b in cohort) + f.mass_hold_s


def check_same_view_same_decision_whatever_the_order(view, cfg, state, first) -> None:
    assert decide(view, cfg, state, NOW) == first
    shuffled = ClusterView(
        dict(reversed(list(view.brokers.items()))), dict(reversed(list(view.placements.items()))),
        dict(reversed(list(view.topic_loads.items()))), dict(reversed(list(view.markers.items()))),
        list(reversed(view.history)), view.leader, list(reversed(view.requests)))
    assert decide(shuffled, cfg, state, NOW) == first


CHECKS = [
    check_targets_are_always_registered_active_brokers,
    check_one_action_per_topic_and_only_known_actions,
    check_automatic_moves_respect_every_limit_and_rule,
    check_an_automatic_move_lowers_the_cv_of_the_scores_it_targets,
    check_drains_respect_their_parallelism,
    check_failover_only_after_grace_and_never_while_suspended,
    check_same_view_same_decision_whatever_the_order,
]


def check_all(view, cfg, state) -> None:
    d = decide(view, cfg, state, NOW)
    kinds = {type(a).__name__ + (f":{a.kind.value}" if isinstance(a, Transfer) else "") for a in d.actions}
    for kind in sorted(kinds):
        event(kind)
    for check in CHECKS:
        check(view, cfg, state, d)


@PROPERTY
@given(views(), configs(), states())
def test_decisions_keep_every_invariant(view, cfg, state) -> None:
    """One generated example is checked against every property (generation dominates the
    cost, so this keeps the file to a few seconds)."""
    check_all(view, cfg, state)


@PROPERTY
@given(calm_views(), configs(), st.booleans(), st.integers(0, 3))
def test_rebalancing_decisions_keep_every_invariant(view, cfg, rebalancing, hits) -> None:
    check_all(view, cfg, CoreState(started_at=NOW - 10_000, rebalancing=rebalancing, hits=hits))
