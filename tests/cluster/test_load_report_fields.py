"""Load reports carry bytes out, connections and backlog measured on the real paths
(the broker's HTTP produce/read routes, the tiered readers, subscription cursors), and
the leader's score reflects them."""
from __future__ import annotations

import asyncio
from dataclasses import asdict, replace

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tiered.broker.server import BrokerServer
from tiered.cluster import LoadManagerConfig
from tiered.cluster.config import Strategy
from tiered.cluster.observe import ViewBuilder, read_snapshot
from tiered.cluster.reports import LoadReporter
from tiered.cluster.scoring import ScoreModel
from tiered.cluster.view import BrokerCapacity, BrokerInfo, ClusterView, LoadReport, Placement, PlacementState, TopicLoad
from tiered.lifecycle import BrokerHost
from tests.tiered.helpers_lifecycle import FAST_BROKER, local_stores

PATH = "/topics/ns/measured/messages"


@pytest.fixture
def measured(tmp_path):
    """A broker hosting /ns/measured, its reporter on a hand-driven clock (first report
    written: it starts the rates), and the metadata store."""
    metadata, objects = local_stores(str(tmp_path))
    host = BrokerHost("r1", str(tmp_path / "wal"), metadata, objects, FAST_BROKER)
    clock = [100.0]
    try:
        hosted = host.load("/ns/measured")
        reporter = LoadReporter(host, interval_s=3600.0, clock=lambda: clock[0])
        yield host, hosted, reporter, clock, metadata
    finally:
        host.close(unload=False)
        metadata.close()


def _report(metadata, broker="r1"):
    [t] = read_snapshot(metadata).reports[broker].topic_reports()
    return t, read_snapshot(metadata).reports[broker]


def test_report_has_bytes_out_connections_and_backlog_from_the_http_paths(measured):
    host, hosted, reporter, clock, metadata = measured
    assert reporter.report_once()  # the first report starts the rates

    async def scenario():
        server = TestServer(BrokerServer(host).app())
        await server.start_server()
        try:
            # Two producer connections and one consumer connection (separate sessions:
            # separate keep-alive connections).
            async with aiohttp.ClientSession() as p1, aiohttp.ClientSession() as p2, \
                    aiohttp.ClientSession() as c1:
                for session in (p1, p2):
                    for _ in range(5):
                        r = await session.post(server.make_url(PATH), json={"messages": [{"payload": "x" * 100}]})
                        assert r.status == 200
                r = await c1.get(server.make_url(PATH), params={"from": "0", "max": "100", "wait_s": "0"})
                assert len((await r.json())["messages"]) == 10
                r = await c1.post(server.make_url("/topics/ns/measured/subscriptions/s/ack"), json={"offset": 3})
                assert r.status == 200
        finally:
            await server.close()

    asyncio.run(scenario())
    clock[0] += 2.0
    assert reporter.report_once()
    t, record = _report(metadata)
    assert t.msg_in_rate == 5.0
    assert t.bytes_out_rate == 10 * 100 / 2.0  # ten 100-byte payloads served over 2 s
    assert (t.producers, t.consumers) == (2.0, 1.0)
    assert t.subscriptions == 1.0 and t.backlog == 10 - 4  # cursor 3: offsets 4..9 unacknowledged
    assert record.net_out_bps == t.bytes_out_rate and record.net_in_bps == t.bytes_in_rate > 0

    # Next interval: nobody connected, nothing served; the backlog stays until acked.
    clock[0] += 2.0
    assert reporter.report_once()
    t, _ = _report(metadata)
    assert (t.bytes_out_rate, t.producers, t.consumers, t.backlog) == (0.0, 0.0, 0.0, 6.0)
    hosted.subscribe("s").ack(9)
    clock[0] += 2.0
    assert reporter.report_once()
    assert _report(metadata)[0].backlog == 0.0


def test_an_open_in_process_reader_counts_as_a_consumer_and_its_bytes_out(measured):
    host, hosted, reporter, clock, metadata = measured
    for _ in range(4):
        hosted.produce(b"y" * 50, key=b"kk")
    assert reporter.report_once()
    reader = hosted.create_reader(0, live=True)
    got = [next(reader) for _ in range(4)]
    assert [m.offset for m in got] == [0, 1, 2, 3]
    clock[0] += 1.0
    assert reporter.report_once()
    t, _ = _report(metadata)
    assert t.bytes_out_rate == 4 * (50 + 2) and t.consumers == 1.0
    reader.close()
    clock[0] += 1.0
    assert reporter.report_once()
    assert _report(metadata)[0].consumers == 0.0


@pytest.mark.parametrize("per_topic", [True, False])
def test_bytes_in_are_each_topics_own_whatever_the_metrics_labels(tmp_path, per_topic):
    """Each topic's bytes-in rate is the payload and key bytes appended to it, also
    when the broker's metrics are one aggregate series (``metrics_per_topic`` off: the
    WAL's byte counter is then shared by every topic), and counted at the append (a
    report never depends on whether the WAL writer synced yet)."""
    from prometheus_client import CollectorRegistry

    metadata, objects = local_stores(str(tmp_path))
    host = BrokerHost("r1", str(tmp_path / "wal"), metadata, objects, FAST_BROKER,
                      metrics_registry=CollectorRegistry(), metrics_per_topic=per_topic)
    clock = [0.0]
    try:
        heavy, light = host.load("/ns/heavy"), host.load("/ns/light")
        reporter = LoadReporter(host, interval_s=3600.0, clock=lambda: clock[0])
        reporter.build()  # starts the rates
        for _ in range(10):
            heavy.produce(b"h" * 1000)
        heavy.produce_many([b"h" * 500, b"h" * 500], key=b"k" * 10)
        light.append(b"l" * 7, key=b"kk")
        light.wal.flush(10.0)
        clock[0] += 2.0
        rates = {t["topic"]: (t["msg_in_rate"], t["bytes_in_rate"]) for t in reporter.build().topics}
        assert rates == {"/ns/heavy": (6.0, (10 * 1000 + 2 * 510) / 2.0), "/ns/light": (0.5, 9 / 2.0)}
    finally:
        host.close(unload=False)
        metadata.close()


def test_capacity_and_disk_io_reach_the_leaders_view(measured):
    """The broker's configured NIC and disk capacity and its measured disk I/O travel in
    its report to the leader's view; a broker that configured none reports them unknown."""
    host, hosted, _, clock, metadata = measured
    for nic, disk in ((1.25e9, 5e8), (None, None)):
        reporter = LoadReporter(host, interval_s=3600.0, clock=lambda: clock[0], nic_bps=nic, disk_bps=disk)
        reporter.report_once()
        for _ in range(20):
            hosted.produce(b"d" * 4096)
        clock[0] += 1.0
        reporter.report_once()
        record = read_snapshot(metadata).reports["r1"]
        assert (record.nic_bps, record.disk_bps) == (nic, disk) and record.disk_io_bps >= 0.0
        report = ViewBuilder(LoadManagerConfig()).build(read_snapshot(metadata), clock[0]).brokers["r1"].report
        assert (report.capacity.nic_bps, report.capacity.disk_bps) == (nic, disk)
        assert report.disk_io_bps == record.disk_io_bps


def test_smoothing_folds_the_new_fields_like_the_others(tmp_path):
    """The leader's view smooths bytes out, connections and backlog with the same EMA."""
    from tiered.cluster import records
    from tiered.metadata.base import Put

    metadata, _ = local_stores(str(tmp_path))
    try:
        builder = ViewBuilder(LoadManagerConfig(smoothing_alpha=0.5))
        for seq, (out, consumers, backlog) in enumerate([(100.0, 2.0, 1000.0), (300.0, 4.0, 3000.0)], start=1):
            topic = records.TopicReport("/ns/t", 1, bytes_out_rate=out, consumers=consumers, backlog=backlog)
            record = records.LoadReportRecord("b", seq, float(seq), topics=[asdict(topic)])
            metadata.txn([], [Put(records.load_key("b"), records.encode(record))])
            view = builder.build(read_snapshot(metadata), float(seq))
        load = view.topic_loads["/ns/t"]
        assert (load.bytes_out_rate, load.consumers, load.backlog) == (200.0, 3.0, 2000.0)
    finally:
        metadata.close()


def _view(loads: dict[str, TopicLoad]) -> ClusterView:
    cap = BrokerCapacity(cpu_cores=4, mem_bytes=1e9, nic_bps=1e8, disk_bps=1e8)
    brokers = {b: BrokerInfo(b, report=LoadReport(ts=0.0, cpu_pct=20.0, mem_pct=20.0, capacity=cap,
                                                  topics=frozenset(t for t in loads if t.startswith(f"/{b}/"))))
               for b in ("a", "b")}
    placements = {t: Placement(t, PlacementState.OWNED, t.split("/")[1], 0.0, 0.0) for t in loads}
    return ClusterView(brokers=brokers, placements=placements, topic_loads=loads)


def test_weighted_load_scores_bytes_out_connections_and_backlog_per_the_seed_formula():
    """Two brokers identical but for one of the new numbers: the one carrying it scores
    higher, by the seed's weights (connections × 0.3, backlog/10^4 × 0.2 in the topic
    load; bytes out in throughput)."""
    base = TopicLoad(msg_rate=10, bytes_in_rate=1e5)
    config = LoadManagerConfig(assignment_strategy=Strategy.WEIGHTED_LOAD)
    for extra in ({"bytes_out_rate": 5e6}, {"consumers": 20.0}, {"backlog": 5e5}):
        heavy = replace(base, **extra)
        view = _view({"/a/t": heavy, "/b/t": base})
        model = ScoreModel(view, config, 0.0)
        assert model.score("a") > model.score("b"), extra
    # The seed's per-topic formula, by hand: 0.2·1 + 0.3·(thr MB/s) + 0.3·connections + 0.2·backlog/10^4.
    from tiered.cluster.scoring import topic_load_score
    load = TopicLoad(bytes_in_rate=1e6, bytes_out_rate=2e6, producers=1, consumers=3, backlog=2e4)
    assert abs(topic_load_score(load) - (0.2 + 0.3 * 3.0 + 0.3 * 4 + 0.2 * 2.0)) < 1e-9
