"""Malformed or hostile records in the metadata store (a buggy or hostile second process
wrote them): each is refused as malformed and reported, and the load manager keeps
deciding for everything else. One bad load report or placement record must never stall
failover and placement for the whole cluster, nor outlive its correction."""
from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from tiered.cluster import admin, decide, records
from tiered.cluster.history import HistoryIndex
from tiered.cluster.observe import read_snapshot
from tiered.cluster.view import InvalidView, MoveKind, TopicLoad, validate
from tiered.errors import MalformedRecord
from tiered.metadata import keys, open_metadata
from tests.cluster.helpers import NOW, READY, cluster, fair, record
from tests.cluster.lm_fixtures import lm_cluster, wait_for  # noqa: F401 - lm_cluster is a fixture
from tests.cluster.test_rebalance import skewed, transfers
from tests.cluster.test_runtime import (TOPICS, all_owned, check_continuity, place_all, placements, produce,
                                      start_cluster)


def report_json(**fields) -> bytes:
    base = {"broker_id": "b1", "seq": 1, "ts": 1_700_000_000.0, "cpu_pct": 10.0, "mem_pct": 10.0}
    return json.dumps({**base, **fields}).encode()


@pytest.mark.parametrize("field,value", [
    ("cpu_pct", 1e200), ("cpu_pct", 100.5), ("mem_pct", 1e308), ("net_in_bps", 1e300), ("net_out_bps", 1e16),
    ("disk_io_bps", 1e20), ("ts", 1e300), ("cpu_cores", 1e300), ("mem_bytes", 1e300), ("nic_bps", 1e300),
    ("disk_bps", 1e300),
])
def test_a_load_report_with_an_impossible_number_is_malformed(field, value):
    with pytest.raises(MalformedRecord):
        records.decode(records.LoadReportRecord, "/cluster/load/b1", report_json(**{field: value}))


def test_topic_entries_with_impossible_numbers_are_dropped_and_the_rest_kept():
    entries = [{"topic": "/default/ok", "bytes_in_rate": 1e6},
               {"topic": "/default/huge", "bytes_in_rate": 1e308, "bytes_out_rate": 1e308},
               {"topic": "/default/big-count", "producers": 1e16}]
    rec = records.decode(records.LoadReportRecord, "/cluster/load/b1", report_json(topics=entries))
    assert [t.topic for t in rec.topic_reports()] == ["/default/ok"]


@pytest.mark.parametrize("field,value", [("broker", "bad/../id"), ("broker", ""), ("broker", ".."),
                                         ("target", "a/b"), ("target", "x" * 129)])
def test_a_placement_naming_an_impossible_broker_is_malformed(field, value):
    rec = {"state": "releasing", "broker": "b1", "target": "b2", "created_at": 1.0, "updated_at": 1.0, field: value}
    with pytest.raises(MalformedRecord):
        records.decode(records.PlacementRecord, "/cluster/placement/default/t", json.dumps(rec).encode())


def test_keys_naming_impossible_brokers_are_reported_not_raised(tmp_path):
    metadata = open_metadata(f"sqlite:///{tmp_path}/m.db")
    try:
        metadata.put("/cluster/registered/bad..id/x", b"{}")
        metadata.put(records.LOAD_PREFIX + "..", report_json())
        metadata.put(keys.ASSIGNMENTS_PREFIX + "a b/default/t", b"{}")
        snap = read_snapshot(metadata)
        assert not snap.registered and not snap.reports and not snap.assignments
        assert len(snap.malformed) == 3
    finally:
        metadata.close()


def test_a_view_too_large_to_add_up_names_the_problem():
    view = cluster({"b1": ["t"]}, loads={"t": TopicLoad(bytes_in_rate=1e308, bytes_out_rate=1e308)})
    with pytest.raises(InvalidView, match="too large"):
        validate(view)


def test_the_hourly_limit_counts_moves_an_earlier_leader_dated_ahead_of_our_clock():
    # The previous leader's clock ran 15 min ahead: its move says it started in our future.
    index = HistoryIndex([record("t", "b1", "b2", NOW + 900.0, MoveKind.AUTO, done=NOW + 901.0)])
    assert index.moves_in_last_hour(NOW) == 1


def test_hostile_records_do_not_stall_failover_or_placement(lm_cluster):
    """One broker's report names a topic with rates past a float's range (their sum is
    infinite), another reports 1e200 % CPU, a stray placement names broker ``bad/../id``;
    then a broker dies. Its topics still fail over, a new topic is still placed, and
    every acknowledged offset is read back exactly once."""
    cluster = lm_cluster
    start_cluster(cluster)
    acked = place_all(cluster)
    produce(cluster, acked, 3, ack="archived")

    now = time.time()
    ghost = [{"topic": "/default/ghost", "bytes_in_rate": 1e308, "bytes_out_rate": 1e308}]
    cluster.metadata.put(records.load_key("1"), report_json(broker_id="1", seq=10**6, ts=now, topics=ghost))
    cluster.metadata.put(records.load_key("3"), report_json(broker_id="3", seq=10**6, ts=now, cpu_pct=1e200))
    cluster.metadata.put(records.placement_key("/default/bogus"), json.dumps(
        {"state": "owned", "broker": "bad/../id", "created_at": now, "updated_at": now}).encode())

    dead = "2"
    moved = [t for t, p in placements(cluster).items() if p.broker == dead]
    assert moved
    cluster.kill(dead)
    wait_for(lambda: all_owned(cluster, TOPICS, {"1", "3"}), "the dead broker's topics failed over")
    admin.request_topic(cluster.metadata, "/default/after")
    wait_for(lambda: all_owned(cluster, ["/default/after"], {"1", "3"}), "a new topic placed")
    produce(cluster, acked, 3, ack="archived")
    check_continuity(cluster, acked)


def test_a_move_dated_far_ahead_blocks_nothing_and_raises_an_alarm():
    """A history entry dated a day ahead (a leader whose clock was a day off, or a hostile
    writer) is counted by no rule: rebalancing is neither rate-limited nor settling on
    it. One dated within the tolerated skew still counts."""
    config = fair(max_moves_per_hour=1)
    far = record("/x", "a", "b", NOW + 86_400.0, MoveKind.AUTO, done=NOW + 86_401.0)
    d = decide(replace(skewed(), history=[far]), config, READY, NOW)
    assert transfers(d), d.skipped
    assert [a.kind for a in d.alarms] == ["HistoryFromTheFuture"]
    near = record("/x", "a", "b", NOW + 600.0, MoveKind.AUTO, done=NOW + 601.0)
    d = decide(replace(skewed(), history=[near]), config, READY, NOW)
    assert not transfers(d) and d.skipped and not d.alarms
