"""The strategies' formulas and the score model, against hand-computed examples."""
from __future__ import annotations

import math

import pytest

from tiered.cluster import BrokerCapacity, BrokerInfo, ClusterView, LoadManagerConfig, Strategy, TopicLoad
from tiered.cluster.scoring import (
    BOTTLENECK_WEIGHTS,
    EVEN_WEIGHTS,
    ScoreModel,
    balance_stats,
    balanced_score,
    bottleneck_weights,
    cv_of,
    topic_load_score,
    weighted_load_score,
    weighted_topic_load,
)

from tests.cluster.helpers import NOW, cluster, load, owned, report


def model(view: ClusterView, strategy: str = "balanced", topic_load: str = "absolute") -> ScoreModel:
    """The literal formulas unless ``topic_load="relative"`` (the default configuration)."""
    return ScoreModel(view, LoadManagerConfig(assignment_strategy=strategy, balanced_topic_load=topic_load), NOW)


def test_seed_worked_cv_example() -> None:
    """Broker loads 45, 30, 25: mean 33.33, σ 8.50, CV 25.5 %; overloaded above 41.83 → broker 1;
    underloaded needs < 24.83 and < 16.67 → none."""
    stats = balance_stats({"1": 45.0, "2": 30.0, "3": 25.0})
    assert stats.mean == pytest.approx(33.333, abs=1e-3)
    assert stats.std_dev == pytest.approx(8.50, abs=5e-3)
    assert stats.cv == pytest.approx(0.255, abs=5e-4)
    assert (stats.min_load, stats.max_load) == (25.0, 45.0)
    assert stats.overloaded == ("1",) and stats.underloaded == ()
    assert cv_of(3, 100.0, 45**2 + 30**2 + 25**2) == pytest.approx(stats.cv)


def test_classification_underloaded_needs_both_conditions() -> None:
    stats = balance_stats({"a": 100.0, "b": 100.0, "c": 100.0, "d": 10.0})
    assert stats.underloaded == ("d",)  # 10 < 77.5 − 38.97 and 10 < 38.75
    assert balance_stats({"a": 0.0, "b": 0.0}).cv == 0.0  # no load: balanced, not a division by zero
    assert balance_stats({}) is None


def test_weighted_topic_load_and_topic_score() -> None:
    # 2 topics, 6 MB/s, 4 connections, 20 000 backlog: 0.4 + 1.8 + 1.2 + 0.4
    assert weighted_topic_load(2, 6.0, 4, 20_000) == pytest.approx(3.8)
    t = TopicLoad(bytes_in_rate=4e6, bytes_out_rate=1e6, producers=2, consumers=1, backlog=10_000)
    assert topic_load_score(t) == pytest.approx(0.2 + 0.3 * 5 + 0.3 * 3 + 0.2 * 1)


def test_balanced_formula() -> None:
    assert balanced_score(3.8, 40.0, 50.0) == pytest.approx(0.3 * 3.8 + 0.35 * 40 + 0.35 * 50)


def test_balanced_model_matches_the_formula_on_reported_data() -> None:
    loads = {"/a/t1": load(5.0, 3, 20_000), "/a/t2": load(1.0, 1)}
    view = cluster({"a": ["/a/t1", "/a/t2"], "b": []}, loads, cpu={"a": 40.0, "b": 5.0}, mem={"a": 50.0, "b": 20.0})
    m = model(view)
    assert m.score("a") == pytest.approx(32.64)  # 0.3·3.8 + 0.35·40 + 0.35·50
    assert m.score("b") == pytest.approx(0.35 * 5 + 0.35 * 20)


def test_balanced_relative_topic_term_is_a_percentage_of_the_average() -> None:
    """The default: wtl 3.8 vs 0 averages 1.9, so a's topic term is 200 (%), b's 0."""
    loads = {"/a/t1": load(5.0, 3, 20_000), "/a/t2": load(1.0, 1)}
    view = cluster({"a": ["/a/t1", "/a/t2"], "b": []}, loads, cpu={"a": 40.0, "b": 5.0}, mem={"a": 50.0, "b": 20.0})
    m = model(view, topic_load="relative")
    assert m.score("a") == pytest.approx(0.3 * 200 + 0.35 * 40 + 0.35 * 50)
    assert m.score("b") == pytest.approx(0.35 * 5 + 0.35 * 20)
    assert ScoreModel(view, LoadManagerConfig(), NOW).score("a") == pytest.approx(m.score("a"))


def test_fair_is_the_topic_count() -> None:
    view = cluster({"a": ["/a/1", "/a/2", "/a/3"], "b": ["/b/1"], "c": []})
    m = model(view, "fair")
    assert [m.score(b) for b in "abc"] == [3.0, 1.0, 0.0]
    assert m.rankings() == (("c", 0.0), ("b", 1.0), ("a", 3.0))


def test_scores_are_floats_and_a_placeholder_changes_the_ranking() -> None:
    """Danube truncates Balanced to an integer, so one new topic (0.2 · 0.3 = 0.06) never
    changes a ranking; here it does."""
    view = cluster({"a": [], "b": []}, cpu={"a": 10.0, "b": 10.0}, mem={"a": 10.0, "b": 10.0})
    m = model(view)
    assert m.score("a") == m.score("b") == pytest.approx(7.0)
    m.place("/new/t", "a")
    assert m.score("a") == pytest.approx(7.06)
    assert m.rankings()[0][0] == "b"


def test_capacity_weight_divides_the_topic_term() -> None:
    """Same topics on a broker with twice the cores: half the wtl term (CPU/mem are % already)."""
    loads = {f"/t/{i}": load(1.0, 1) for i in range(4)}
    view = cluster({"small": ["/t/0", "/t/1"], "big": ["/t/2", "/t/3"], "other": []}, loads,
                   cpu={"small": 0.0, "big": 0.0, "other": 0.0}, mem={"small": 0.0, "big": 0.0, "other": 0.0},
                   cores={"small": 4.0, "big": 8.0, "other": 4.0})
    m = model(view)
    wtl = weighted_topic_load(2, 2.0, 2, 0)
    assert m.score("small") == pytest.approx(0.3 * wtl)
    assert m.score("big") == pytest.approx(0.3 * wtl / 2)


def test_model_reflects_placements_made_after_the_report() -> None:
    """A topic placed on b after b's report adds its share of CPU/memory at once: the
    estimate scales the reported per-cost usage, so b looks as loaded as a at once."""
    loads = {"/x/1": load(10.0), "/x/2": load(10.0)}
    view = cluster({"a": ["/x/1"], "b": ["/x/2"]}, loads, cpu={"a": 40.0, "b": 40.0}, mem={"a": 20.0, "b": 20.0})
    m = model(view)
    before = m.score("b")
    out_a, into_b = m.contribution("/x/1", "a"), m.contribution("/x/1", "b")
    m.place("/x/1", "b")
    assert m.score("b") == pytest.approx(before + into_b)
    assert m.score("a") == pytest.approx(0.0)  # everything a reported was that topic's
    # 40 % CPU and 20 % memory per 10 MB/s topic, plus its wtl term, land on b
    assert into_b == pytest.approx(out_a) == pytest.approx(0.3 * weighted_topic_load(1, 10.0, 0, 0) + 0.35 * 60)


def test_empty_broker_borrows_the_clusters_cost_per_byte_scaled_by_capacity() -> None:
    loads = {"/x/1": load(10.0)}
    view = cluster({"a": ["/x/1"], "b": [], "c": []}, loads, cpu={"a": 40.0, "b": 2.0, "c": 2.0},
                   mem={"a": 0.0, "b": 0.0, "c": 0.0}, cores={"a": 4.0, "b": 8.0, "c": 4.0})
    m = model(view)
    m.place("/x/1", "b")
    # b keeps its idle 2 %, and the topic costs half the CPU % on twice the cores (median 4).
    wtl_term = 0.3 * weighted_topic_load(1, 10.0, 0, 0) / 2.0
    assert m.score("b") == pytest.approx(wtl_term + 0.35 * (2.0 + 20.0))


def test_new_topic_counts_as_the_mean_topic_load() -> None:
    loads = {"/x/1": load(2.0, 2), "/x/2": load(4.0, 0)}
    view = cluster({"a": ["/x/1", "/x/2"], "b": []}, loads)
    m = model(view)
    guess = m.load_of("/x/new")
    assert guess.bytes_in_rate == pytest.approx(3e6) and guess.producers == pytest.approx(1.0)


def test_no_fresh_report_anywhere_falls_back_to_topic_load_for_every_live_broker() -> None:
    view = cluster({"a": ["/x/1"], "b": []})
    stale = ClusterView({b: BrokerInfo(b, report=None) for b in view.brokers}, view.placements)
    m = model(stale)
    assert m.no_data and m.eligible_targets() == ["a", "b"]
    assert m.score("a") == pytest.approx(0.3 * 0.2) and m.score("b") == 0.0


def test_weighted_load_bottleneck_gets_half_the_weight() -> None:
    u = {"cpu": 0.9, "mem": 0.4, "thr": 0.2, "net": 0.2, "disk": 0.1, "topic": 0.5}
    metric, weights = bottleneck_weights(u, 0.7)
    assert metric == "cpu" and weights == BOTTLENECK_WEIGHTS["cpu"]
    assert weighted_load_score(u, weights) == pytest.approx(100 * (0.5 * 0.9 + 0.2 * 0.4 + 0.15 * 0.2 + 0.15 * 0.5))
    metric, weights = bottleneck_weights({k: 0.5 for k in u}, 0.7)
    assert metric is None and weights == EVEN_WEIGHTS
    for row in [*BOTTLENECK_WEIGHTS.values(), EVEN_WEIGHTS]:
        assert math.isclose(sum(row.values()), 1.0)


def test_weighted_load_picks_one_bottleneck_for_the_whole_cluster() -> None:
    loads = {"/x/1": load(10.0), "/x/2": load(10.0)}
    view = cluster({"hot": ["/x/1"], "cool": ["/x/2"]}, loads, cpu={"hot": 90.0, "cool": 30.0},
                   mem={"hot": 20.0, "cool": 20.0})
    m = model(view, "weighted_load")
    assert m.bottleneck == "cpu" and m.weights == BOTTLENECK_WEIGHTS["cpu"]
    # the cool broker is scored with the same (cpu-heavy) weights; topic term relative to the max
    thr = 10e6 / (2 * 1.25e9)
    expected_cool = 100 * (0.5 * 0.30 + 0.2 * 0.20 + 0.15 * thr + 0.15 * 1.0)
    assert m.score("cool") == pytest.approx(expected_cool)


def test_weighted_load_relative_topic_term_is_not_a_bottleneck() -> None:
    """With the topic term relative to the busiest broker (always 1.0), treating it as a
    utilisation would make 'topic' the bottleneck forever (Danube's behaviour)."""
    view = cluster({"a": ["/x/1"], "b": []}, {"/x/1": load(1.0)}, cpu={"a": 30.0, "b": 30.0})
    m = model(view, "weighted_load")
    assert m.bottleneck is None and m.weights == EVEN_WEIGHTS


def test_weighted_load_unknown_link_capacity_is_relative_and_never_the_bottleneck() -> None:
    """A broker that reports no NIC capacity: its link use is measured against the
    busiest broker's (1.0 there), so it cannot hide a real bottleneck. Divided by a
    placeholder capacity of 1 B/s instead, any traffic made 'thr' the bottleneck and the
    broker at 95 % CPU looked idle next to two at 10 % CPU carrying 1 MB/s."""
    from dataclasses import replace as dc_replace

    loads = {"/x/hot": load(0.001), "/x/b": load(1.0), "/x/c": load(1.0)}
    view = cluster({"hot": ["/x/hot"], "b": ["/x/b"], "c": ["/x/c"]}, loads,
                   cpu={"hot": 95.0, "b": 10.0, "c": 10.0}, mem={"hot": 30.0, "b": 30.0, "c": 30.0})
    unknown = {k: dc_replace(info, report=dc_replace(info.report, capacity=BrokerCapacity(cpu_cores=4.0,
                                                                                          mem_bytes=16e9)))
               for k, info in view.brokers.items()}
    m = model(dc_replace(view, brokers=unknown), "weighted_load")
    assert m.bottleneck == "cpu" and m.weights == BOTTLENECK_WEIGHTS["cpu"]
    assert max(m.rankings(), key=lambda x: x[1])[0] == "hot"
    # thr relative to the busiest link: 1.0 on b and c, 0.001 on hot.
    assert m.score("b") == pytest.approx(100 * (0.5 * 0.10 + 0.2 * 0.30 + 0.15 * 1.0 + 0.15 * 1.0))


def test_weighted_load_with_a_topic_capacity_can_be_topic_bound() -> None:
    cfg = LoadManagerConfig(assignment_strategy="weighted_load")
    cfg = cfg.__class__(assignment_strategy=Strategy.WEIGHTED_LOAD,
                        weighted_load=cfg.weighted_load.__class__(topic_load_capacity=1.0))
    view = cluster({"a": ["/x/1", "/x/2", "/x/3", "/x/4"], "b": []}, cpu={"a": 10.0, "b": 10.0})
    m = ScoreModel(view, cfg, NOW)
    assert m.bottleneck == "topic"


def test_stale_report_is_not_eligible_and_not_in_the_balance_set() -> None:
    view = cluster({"a": [], "b": []})
    brokers = dict(view.brokers)
    brokers["b"] = BrokerInfo("b", report=report(10, 10, ts=NOW - 91))
    m = model(ClusterView(brokers, view.placements))
    assert m.eligible_targets() == ["a"] and m.balance_set == ["a"]


def test_releasing_topic_counts_on_its_target() -> None:
    from dataclasses import replace
    from tiered.cluster import PlacementState
    view = cluster({"a": ["/x/1"], "b": []}, {"/x/1": load(5.0)}, cpu={"a": 30.0, "b": 5.0})
    p = replace(owned("/x/1", "a"), state=PlacementState.RELEASING, target="b")
    m = model(ClusterView(view.brokers, {"/x/1": p}, view.topic_loads))
    assert m.count("b") == 1 and m.count("a") == 0


def test_a_broker_whose_cpu_report_may_be_capped_stays_out_of_the_cpu_fit() -> None:
    """Three brokers on the line CPU % = 1 % per MB/s (4 cores each, nothing idle) and one
    whose topics carry 140 MB/s reporting 92 %: a CPU report cannot show more than 100 %,
    and report noise takes a saturated broker's reading anywhere down to about 90 %.
    Fitted with the others, that point pulled the line to 12.6 % idle and 0.57 % per MB/s
    (least squares through (5, 20), (7.5, 30), (10, 40), (35, 92) MB/s per core), so a
    20 MB/s topic counted 11.5 % of a broker instead of 20 %, and the rebalancer, picking a
    heavy topic for a gap it seemed to fit, overshot (the diurnal workload's futile
    moves). Left out, the fit is exact, and the saturated broker's topics show that it
    needs 140 %."""
    hot = [f"/h/{i}" for i in range(7)]
    loads = {**{t: load(20.0) for t in hot}, "/a/1": load(20.0), "/b/1": load(30.0), "/c/1": load(40.0)}
    view = cluster({"hot": hot, "a": ["/a/1"], "b": ["/b/1"], "c": ["/c/1"]}, loads,
                   cpu={"hot": 92.0, "a": 20.0, "b": 30.0, "c": 40.0}, mem={b: 30.0 for b in ("hot", "a", "b", "c")})
    m = model(view)
    assert m.idle_cpu == pytest.approx(0.0, abs=1e-9)
    assert m.cpu("hot") == pytest.approx(1.40)
    assert [m.cpu(b) for b in ("a", "b", "c")] == pytest.approx([0.20, 0.30, 0.40])
    assert m.cpu_contribution("/h/0", "a") == pytest.approx(0.20)
