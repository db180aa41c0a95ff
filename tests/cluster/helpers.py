"""Small builders for cluster views (the decision core's input)."""
from __future__ import annotations

from dataclasses import replace

from tiered.cluster import (
    BrokerCapacity,
    BrokerInfo,
    BrokerMode,
    ClusterView,
    CoreState,
    LoadManagerConfig,
    LoadReport,
    MoveKind,
    MoveRecord,
    Placement,
    PlacementState,
    TopicLoad,
)

NOW = 100_000.0
OLD = NOW - 86_400.0
#: A state whose warm-up is over and whose next check is due.
READY = CoreState(started_at=OLD)


def capacity(cores: float = 4.0) -> BrokerCapacity:
    return BrokerCapacity(cpu_cores=cores, mem_bytes=16e9 * cores / 4, nic_bps=1.25e9, disk_bps=5e8)


def report(cpu: float, mem: float, topics=(), ts: float = NOW, cores: float = 4.0, **kw) -> LoadReport:
    return LoadReport(ts=ts, cpu_pct=cpu, mem_pct=mem, capacity=capacity(cores), topics=frozenset(topics), **kw)


def load(mb_s: float = 0.0, connections: float = 0.0, backlog: float = 0.0) -> TopicLoad:
    """A topic with ``mb_s`` MB/s in (nothing out) and ``connections`` producers."""
    return TopicLoad(bytes_in_rate=mb_s * 1e6, producers=connections, backlog=backlog)


def owned(topic: str, broker: str, created_at: float = OLD) -> Placement:
    return Placement(topic, PlacementState.OWNED, broker, created_at=created_at, updated_at=created_at)


def record(topic: str, src: str | None, dst: str, at: float, kind: MoveKind = MoveKind.AUTO,
           done: float | None = None, move_id: str | None = None) -> MoveRecord:
    return MoveRecord(move_id or f"m-{topic}-{at}", topic, src, dst, kind, started_at=at,
                      completed_at=at + 1 if done is None else done)


def cluster(layout: dict[str, list[str]], loads: dict[str, TopicLoad] | None = None,
            cpu: dict[str, float] | None = None, mem: dict[str, float] | None = None,
            cores: dict[str, float] | None = None, modes: dict[str, BrokerMode] | None = None,
            **view_kw) -> ClusterView:
    """Brokers holding the listed topics (owned, old), each with a fresh report covering them."""
    loads = loads or {}
    brokers, placements = {}, {}
    for broker, topics in layout.items():
        for t in topics:
            placements[t] = owned(t, broker)
        rep = report((cpu or {}).get(broker, 10.0), (mem or {}).get(broker, 10.0), topics,
                     cores=(cores or {}).get(broker, 4.0))
        brokers[broker] = BrokerInfo(broker, mode=(modes or {}).get(broker, BrokerMode.ACTIVE), report=rep)
    return ClusterView(brokers, placements, loads, **view_kw)


def with_broker(view: ClusterView, broker: str, **changes) -> ClusterView:
    brokers = dict(view.brokers)
    brokers[broker] = replace(brokers[broker], **changes)
    return replace(view, brokers=brokers)


def fair(**rebalancing) -> LoadManagerConfig:
    """Fair strategy with rebalancing on and a hit count of 1 unless overridden."""
    rebalancing.setdefault("enabled", True)
    rebalancing.setdefault("hit_count", 1)
    return LoadManagerConfig(assignment_strategy="fair").with_rebalancing(**rebalancing)


def balanced(**rebalancing) -> LoadManagerConfig:
    rebalancing.setdefault("enabled", True)
    rebalancing.setdefault("hit_count", 1)
    return LoadManagerConfig(assignment_strategy="balanced").with_rebalancing(**rebalancing)
