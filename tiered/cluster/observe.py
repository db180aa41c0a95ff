"""Reading the cluster's stored state, and turning it into the decision core's view.

:func:`read_snapshot` reads everything the load manager acts on with range reads (never
from remembered events): registrations, broker modes, load reports, placement records,
assignments, unassigned markers, the move history, operator overrides, and the owner
record of every topic whose placement is in flux. Each item keeps its ``mod_revision``
so the runtime's writes can compare-and-swap against exactly what was read.

:class:`ViewBuilder` folds snapshots into :class:`~tiered.cluster.view.ClusterView`\\ s:
it smooths load reports (EMA per topic and per broker, each report folded once) and
remembers since when a broker's registration has been missing. Both memories are
rebuilt from scratch by a new leader (a lost EMA only restarts smoothing; a forgotten
``unregistered_since`` restarts the failover grace, which errs on the safe side).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tiered.cluster import records
from tiered.cluster.config import LoadManagerConfig
from tiered.cluster.smoothing import smooth_report, smooth_topic_load
from tiered.cluster.view import (
    BrokerCapacity,
    BrokerInfo,
    BrokerMode,
    ClusterView,
    LeaderHealth,
    LoadReport,
    MoveKind,
    MoveRecord,
    Placement,
    PlacementState,
    TopicLoad,
    UnassignedMarker,
)
from tiered.errors import MalformedRecord
from tiered.lifecycle.ownership import REGISTERED_PREFIX, OwnerRecord, owner_key
from tiered.metadata import keys
from tiered.metadata.base import KeyValue, MetadataStore, ReadView

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    revision: int
    registered: dict[str, KeyValue] = field(default_factory=dict)
    modes: dict[str, tuple[records.BrokerStateRecord, int]] = field(default_factory=dict)
    reports: dict[str, records.LoadReportRecord] = field(default_factory=dict)
    #: topic → (record, mod_revision)
    placements: dict[str, tuple[records.PlacementRecord, int]] = field(default_factory=dict)
    #: topic → {broker: mod_revision}
    assignments: dict[str, dict[str, int]] = field(default_factory=dict)
    #: topic → (marker, mod_revision)
    markers: dict[str, tuple[keys.Unassigned, int]] = field(default_factory=dict)
    #: history key → record
    history: dict[str, records.HistoryRecord] = field(default_factory=dict)
    overrides: records.LmOverrides = field(default_factory=records.LmOverrides)
    #: The operator's rebalance request, if pending: (record, mod_revision).
    rebalance_request: tuple[records.RebalanceRequestRecord, int] | None = None
    #: topic → (owner record or None, mod_revision; 0 = absent) for topics in flux
    owners: dict[str, tuple[OwnerRecord | None, int]] = field(default_factory=dict)
    #: Records that did not parse (key, problem): reported, never acted on.
    malformed: list[tuple[str, str]] = field(default_factory=list)

    def owner(self, topic: str) -> tuple[OwnerRecord | None, int]:
        return self.owners.get(topic, (None, 0))


def read_snapshot(metadata: MetadataStore, owners_for: str = "in_flux") -> Snapshot:
    """Read the load manager's state, all of it as of one revision (a decision made on
    two moments could, say, see a topic requested on a broker but not that broker's
    return to ``active`` written just before). ``owners_for``: "in_flux" reads the owner
    record of topics not simply owned (and unplaced assignments); "all" of every topic."""
    with metadata.snapshot() as view:
        return _read(view, owners_for)


def _read(view: ReadView, owners_for: str) -> Snapshot:
    snap = Snapshot(view.revision)
    for kv in view.range(REGISTERED_PREFIX):
        _parse(snap, kv, lambda kv=kv: snap.registered.__setitem__(
            records.broker_from_key(kv.key, REGISTERED_PREFIX), kv))
    for kv in view.range(records.BROKER_STATE_PREFIX):
        _parse(snap, kv, lambda: snap.modes.__setitem__(
            records.broker_from_key(kv.key, records.BROKER_STATE_PREFIX),
            (records.decode(records.BrokerStateRecord, kv.key, kv.value), kv.mod_revision)))
    for kv in view.range(records.LOAD_PREFIX):
        _parse(snap, kv, lambda: snap.reports.__setitem__(
            records.broker_from_key(kv.key, records.LOAD_PREFIX),
            records.decode(records.LoadReportRecord, kv.key, kv.value)))
    for kv in view.range(records.PLACEMENT_PREFIX):
        _parse(snap, kv, lambda: snap.placements.__setitem__(
            str(keys.topic_from_key(kv.key, records.PLACEMENT_PREFIX)),
            (records.decode(records.PlacementRecord, kv.key, kv.value), kv.mod_revision)))
    for kv in view.range(keys.ASSIGNMENTS_PREFIX):
        broker, _, rest = kv.key[len(keys.ASSIGNMENTS_PREFIX):].partition("/")

        def add(kv=kv, broker=broker) -> None:
            keys.check_broker_id(broker, kv.key)
            topic = str(keys.topic_from_key(kv.key, keys.broker_assignments_prefix(broker)))
            snap.assignments.setdefault(topic, {})[broker] = kv.mod_revision
        _parse(snap, kv, add)
    for kv in view.range(keys.UNASSIGNED_PREFIX):
        def marker(kv=kv) -> None:
            topic = str(keys.topic_from_key(kv.key, keys.UNASSIGNED_PREFIX))
            # The seed's creators write an empty value for a new topic.
            value = keys.Unassigned("new", None) if not kv.value.strip() else \
                keys.Unassigned.from_json(kv.key, kv.value)
            snap.markers[topic] = (value, kv.mod_revision)
        _parse(snap, kv, marker)
    for kv in view.range(records.HISTORY_PREFIX):
        _parse(snap, kv, lambda: snap.history.__setitem__(
            kv.key, records.decode(records.HistoryRecord, kv.key, kv.value)))
    kv = view.get(records.LM_CONFIG_KEY)
    if kv is not None:
        _parse(snap, kv, lambda: setattr(snap, "overrides", records.decode(records.LmOverrides, kv.key, kv.value)))
    kv = view.get(records.REBALANCE_REQUEST_KEY)
    if kv is not None:
        def request(kv=kv) -> None:
            record = records.decode(records.RebalanceRequestRecord, kv.key, kv.value)
            if record.state == "pending":
                snap.rebalance_request = (record, kv.mod_revision)
        _parse(snap, kv, request)
    wanted = set(snap.placements) | set(snap.assignments) if owners_for == "all" else \
        {t for t, (p, _) in snap.placements.items() if p.state != "owned"} | \
        {t for t in snap.assignments if t not in snap.placements}
    for topic in sorted(wanted):
        kv = view.get(owner_key(topic))
        if kv is None:
            snap.owners[topic] = (None, 0)
        else:
            _parse(snap, kv, lambda kv=kv, topic=topic: snap.owners.__setitem__(
                topic, (OwnerRecord.decode(kv.key, kv.value), kv.mod_revision)))
    return snap


def _parse(snap: Snapshot, kv: KeyValue, fn) -> None:
    try:
        fn()
    except (MalformedRecord, ValueError, TypeError) as e:
        snap.malformed.append((kv.key, str(e)))
        log.warning("load manager: ignoring malformed record %s: %s", kv.key, e)


class ViewBuilder:
    """Snapshots → views, with the smoothing and liveness memory of one leader term."""

    def __init__(self, config: LoadManagerConfig) -> None:
        self.config = config
        self.unregistered_since: dict[str, float] = {}
        self._reports: dict[str, tuple[int, float, LoadReport]] = {}  # broker → (seq, ts, smoothed)
        self._topic_loads: dict[str, TopicLoad] = {}
        self._folded: set[tuple[str, int, float]] = set()

    def build(self, snap: Snapshot, now: float, leader: LeaderHealth | None = None) -> ClusterView:
        names: set[str] = set(snap.registered) | set(snap.modes) | set(snap.reports)
        for p, _ in snap.placements.values():
            names.update(b for b in (p.broker, p.target) if b is not None)
        for brokers in snap.assignments.values():
            names.update(brokers)
        for b in names:
            if b in snap.registered:
                self.unregistered_since.pop(b, None)
            else:
                self.unregistered_since.setdefault(b, now)
        brokers = {}
        for b in sorted(names):
            mode = BrokerMode(snap.modes[b][0].mode) if b in snap.modes else BrokerMode.ACTIVE
            report = self._fold_report(b, snap.reports.get(b))
            brokers[b] = BrokerInfo(b, mode, b in snap.registered, self.unregistered_since.get(b), report)
        for b in [b for b in self._reports if b not in names]:
            del self._reports[b]
        # A topic's smoothed load lives while a current report names it or it is placed (a
        # moving topic keeps its average for the target's first report): a deleted topic,
        # or one a bad report named once, is forgotten.
        kept = set().union(*(r.topics for _, _, r in self._reports.values()))
        kept.update(t for t, (p, _) in snap.placements.items() if p.state != "free")
        for topic in [t for t in self._topic_loads if t not in kept]:
            del self._topic_loads[topic]
        placements = {}
        for topic, (p, _) in snap.placements.items():
            if p.state == "free" or p.broker is None:
                placements[topic] = Placement(topic, PlacementState.FREE, None, p.created_at, p.updated_at)
                continue
            released = False
            if p.state == "releasing":
                owner, _ = snap.owner(topic)
                released = owner is None or owner.holder is None
            placements[topic] = Placement(
                topic, PlacementState(p.state), p.broker, p.created_at, p.updated_at,
                target=p.target, source_released=released, move_id=p.move_id,
                kind=MoveKind(p.kind) if p.kind else None, attempts=p.attempts)
        markers = {topic: UnassignedMarker(topic, m.reason, m.from_broker, m.to_broker, float(rev))
                   for topic, (m, rev) in snap.markers.items()}
        history = [MoveRecord(h.move_id, h.topic, h.from_broker, h.to_broker, MoveKind(h.kind), h.started_at,
                              h.completed_at, h.estimated_load)
                   for h in snap.history.values() if h.kind in MoveKind._value2member_map_]
        return ClusterView(brokers=brokers, placements=placements, topic_loads=dict(self._topic_loads),
                           markers=markers, history=history, leader=leader or LeaderHealth(),
                           rebalance_request=snap.rebalance_request[0].request_id if snap.rebalance_request else None)

    def _fold_report(self, broker: str, record: records.LoadReportRecord | None) -> LoadReport | None:
        if record is None:
            self._reports.pop(broker, None)
            return None
        seen = self._reports.get(broker)
        if seen is not None and (seen[0], seen[1]) == (record.seq, record.ts):
            return seen[2]
        sample = LoadReport(
            ts=record.ts, cpu_pct=record.cpu_pct, mem_pct=record.mem_pct,
            capacity=BrokerCapacity(cpu_cores=max(record.cpu_cores, 1e-9), mem_bytes=max(record.mem_bytes, 1.0),
                                    nic_bps=record.nic_bps, disk_bps=record.disk_bps),
            net_in_bps=record.net_in_bps, net_out_bps=record.net_out_bps, disk_io_bps=record.disk_io_bps,
            topics=frozenset(t.topic for t in record.topic_reports()))
        alpha = self.config.smoothing_alpha
        smoothed = smooth_report(seen[2] if seen is not None else None, sample, alpha)
        for t in record.topic_reports():
            load = TopicLoad(msg_rate=t.msg_in_rate, bytes_in_rate=t.bytes_in_rate, bytes_out_rate=t.bytes_out_rate,
                             producers=t.producers, consumers=t.consumers, subscriptions=t.subscriptions,
                             backlog=t.backlog)
            self._topic_loads[t.topic] = smooth_topic_load(self._topic_loads.get(t.topic), load, alpha)
        self._reports[broker] = (record.seq, record.ts, smoothed)
        return smoothed
