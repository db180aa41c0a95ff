"""EMA smoothing of load data, view validation, and the seed's metrics."""
from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from tiered.cluster import (
    BrokerInfo,
    InvalidView,
    LoadManagerConfig,
    Placement,
    PlacementState,
    TopicLoad,
    UnassignedMarker,
    decide,
)
from tiered.cluster.metrics import LoadManagerMetrics
from tiered.cluster.smoothing import ema, smooth_report, smooth_topic_load, smooth_topic_loads

from tests.cluster.helpers import NOW, READY, cluster, fair, load, report


def test_ema_weights_the_newest_sample_by_alpha() -> None:
    assert ema(None, 10.0, 0.3) == 10.0
    assert ema(10.0, 20.0, 0.3) == pytest.approx(13.0)
    value = 0.0
    for _ in range(5):
        value = ema(value, 100.0, 0.3)
    assert value == pytest.approx(100 * (1 - 0.7**5))  # 83 % of a step after five reports


def test_topic_averages_follow_the_topic_not_the_broker() -> None:
    averages = smooth_topic_loads({}, {"/t/1": load(10.0), "/t/2": load(4.0)}, 0.3)  # from broker a
    averages = smooth_topic_loads(averages, {"/t/1": load(20.0)}, 0.3)             # /t/1 now on b
    assert averages["/t/1"].bytes_in_rate == pytest.approx(13e6)
    assert averages["/t/2"].bytes_in_rate == pytest.approx(4e6)  # not in b's report: kept
    assert smooth_topic_load(None, load(1.0), 0.3) == load(1.0)


def test_report_smoothing_keeps_the_samples_time_and_topics() -> None:
    old = report(50.0, 40.0, ["/t/1"], ts=NOW - 30)
    new = report(80.0, 40.0, ["/t/2"], ts=NOW)
    smoothed = smooth_report(old, new, 0.3)
    assert smoothed.cpu_pct == pytest.approx(59.0) and smoothed.mem_pct == pytest.approx(40.0)
    assert smoothed.ts == NOW and smoothed.topics == frozenset({"/t/2"})


@pytest.mark.parametrize("break_it, where", [
    (lambda v: replace(v, brokers={"x": BrokerInfo("y")}), "brokers['x']"),
    (lambda v: replace(v, brokers={**v.brokers, "a": BrokerInfo("a", registered=False)}), "brokers['a']"),
    (lambda v: replace(v, placements={"/t/1": Placement("/t/1", PlacementState.OWNED, "ghost", 0, 0)}),
     "placements['/t/1']"),
    (lambda v: replace(v, placements={"/t/1": Placement("/t/1", PlacementState.OWNED, None, 0, 0)}),
     "placements['/t/1']"),
    (lambda v: replace(v, topic_loads={"/t/1": TopicLoad(bytes_in_rate=float("inf"))}), "topic_loads['/t/1']"),
    (lambda v: replace(v, topic_loads={"/t/1": TopicLoad(producers=-1)}), "topic_loads['/t/1']"),
    (lambda v: replace(v, markers={"/t/1": UnassignedMarker("/t/2")}), "markers['/t/1']"),
    (lambda v: replace(v, brokers={"a": BrokerInfo("a", report=replace(report(1, 1), cpu_pct=float("nan")))}),
     "brokers['a'].report"),
])
def test_a_self_contradicting_view_is_a_typed_error(break_it, where: str) -> None:
    with pytest.raises(InvalidView) as e:
        decide(break_it(cluster({"a": ["/t/1"]})), LoadManagerConfig(), READY, NOW)
    assert e.value.where == where


def test_metrics_carry_the_seeds_names_with_a_dnb_prefix() -> None:
    registry = CollectorRegistry()
    metrics = LoadManagerMetrics(registry)
    view = cluster({"a": ["/a/1", "/a/2", "/a/3", "/a/4"], "b": []}, {"/a/1": load(2.0)})
    d = decide(replace(view, markers={"/n/1": UnassignedMarker("/n/1")}), fair(), READY, NOW)
    metrics.observe(d, view, duration_s=0.01)
    get = registry.get_sample_value
    assert get("dnb_cluster_balance_cv") == pytest.approx(d.balance.cv)
    assert get("dnb_cluster_active_brokers") == 2
    assert get("dnb_rebalancing_checks_total") == 1
    assert get("dnb_rebalancing_moves_total", {"kind": "auto"}) == 1
    assert get("dnb_topic_assignments_total", {"broker_id": "b", "action": "assign"}) == 1
    assert get("dnb_broker_topics_owned", {"broker_id": "a"}) == 4
    assert get("dnb_broker_throughput_mbps", {"broker_id": "a"}) == pytest.approx(2.0)
    assert get("dnb_rebalancing_cycle_duration_seconds_count") == 1
    for name in ("dnb_cluster_balance_mean_load", "dnb_cluster_balance_max_load", "dnb_cluster_balance_min_load",
                 "dnb_cluster_balance_std_dev"):
        assert get(name) is not None
    assert get("dnb_broker_cpu_usage", {"broker_id": "a"}) == 10.0
    metrics.failed()
    assert get("dnb_rebalancing_failures_total") == 1
    blocked = decide(view, fair(paused=True), READY, NOW)
    metrics.observe(blocked, view)
    assert get("dnb_lm_skipped_checks_total", {"reason": "Paused"}) == 1
