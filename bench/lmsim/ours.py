"""Our load manager in the simulator: the production decision core, unchanged.

The adapter does what the runtime will do: it keeps placement records, the persisted
move history and per-broker smoothed reports, builds a :class:`ClusterView` and calls
:func:`tiered.cluster.decide` when something happened (new topics, a broker vanished or
draining) or when the previous decision asked to be woken. Per-topic loads are the
simulator's EMA-smoothed reports. A move completes after its measured duration, before
the next call; a drain calls the core again as its moves complete (``drain_parallel``
at a time), within the step.
"""
from __future__ import annotations

from dataclasses import replace

from bench.lmsim.world import STEP_S, World
from tiered.cluster import (
    Assign,
    BrokerCapacity,
    BrokerInfo,
    BrokerMode,
    ClusterView,
    CompleteTransfer,
    CoreState,
    LeaderHealth,
    LoadManagerConfig,
    LoadReport,
    MarkDrained,
    MoveKind,
    MoveRecord,
    Placement,
    PlacementState,
    Reassign,
    TopicLoad,
    Transfer,
    UnassignedMarker,
    decide,
)
from tiered.cluster.smoothing import smooth_report

MODES = {"active": BrokerMode.ACTIVE, "draining": BrokerMode.DRAINING, "drained": BrokerMode.DRAINED}
HISTORY_KEEP_S = 2 * 3600.0


class Ours:
    def __init__(self, world: World, strategy: str = "balanced", **rebalancing) -> None:
        self.name = f"ours/{strategy}"
        self.world = world
        rebalancing.setdefault("enabled", True)
        self.config = LoadManagerConfig(assignment_strategy=strategy).with_rebalancing(**rebalancing)
        self.state: CoreState | None = CoreState(started_at=-3600.0)
        self.next_wakeup_at: float | None = 0.0
        self.placements: dict[str, Placement] = {}
        for i, b in enumerate(world.owner):
            name = world.topics.names[i]
            self.placements[name] = Placement(name, PlacementState.OWNED, b, world.topics.created_at[i], -3600.0)
        self.index = {name: i for i, name in enumerate(world.topics.names)}
        self.history: list[MoveRecord] = []
        self.smoothed: dict[str, LoadReport] = {}
        self.decisions = 0

    # -- per step --------------------------------------------------------------------
    def step(self) -> None:
        w = self.world
        for b, r in w.reports.items():
            s = w.brokers[b]
            sample = LoadReport(ts=r.ts, cpu_pct=r.cpu_pct, mem_pct=r.mem_pct,
                                capacity=BrokerCapacity(s.cores, s.mem_bytes, s.nic_bps, 4 * s.nic_bps),
                                net_in_bps=r.net_in_bps, net_out_bps=r.net_out_bps, disk_io_bps=r.disk_io_bps)
            self.smoothed[b] = smooth_report(self.smoothed.get(b), sample, self.config.smoothing_alpha)
        if w.leader_changed_at is not None and w.leader_changed_at <= w.now:
            # The leader died with its broker: a new leader starts from stored state only.
            w.leader_changed_at = None
            self.state = None
        for i in w.pending:
            name = w.topics.names[i]
            self.placements.setdefault(name, Placement(name, PlacementState.FREE, None, w.topics.created_at[i], w.now))
            self.index[name] = i
        self._report_topics = None  # built at the first decision of the step (as reported)
        # Call the core when something happened or it asked to be woken; again as the
        # moves it started complete (a drain), and at its wake-up time (a failover's
        # grace ending) if that falls within this step.
        now, end = w.now, w.now + STEP_S
        while now < end:
            if self._needed(now):
                busy_s = self._decide(now)
                if busy_s is not None:
                    now += busy_s
                    continue
            wake = self.next_wakeup_at
            if wake is None or not now < wake < end:
                break
            now = wake

    def _needed(self, now: float) -> bool:
        w = self.world
        if w.pending or self.state is None:
            return True
        if self.next_wakeup_at is not None and now >= self.next_wakeup_at:
            return True
        for b, s in w.brokers.items():
            if s.mode == "draining" or (w.on[b] and (s.mode != "active" or not w.registered(b))):
                return True
        return False

    # -- one decision ----------------------------------------------------------------
    def _decide(self, now: float) -> float | None:
        """Run the core once and carry its actions out; returns how long the started
        moves take (None when none started)."""
        w = self.world
        view = self._view(now)
        decision = decide(view, self.config, self.state, now)
        self.decisions += 1
        self.state = decision.state
        self.next_wakeup_at = decision.next_wakeup_at
        longest = None
        for action in decision.actions:
            if isinstance(action, Assign):
                w.assign(self.index[action.topic], action.broker)
                self._own(action.topic, action.broker, now)
            elif isinstance(action, (Transfer, Reassign)):
                kind = action.kind.value if isinstance(action, Transfer) else MoveKind.FAILOVER.value
                if isinstance(action, Reassign) and action.reason != MoveKind.FAILOVER.value:
                    kind = MoveKind.MANUAL.value
                seconds = w.move(self.index[action.topic], action.to_broker, kind, now)
                self.history.append(MoveRecord(action.move_id, action.topic, action.from_broker, action.to_broker,
                                               MoveKind(kind), now, now + seconds,
                                               getattr(action, "estimated_load", 0.0)))
                self._own(action.topic, action.to_broker, now + seconds)
                longest = max(longest or 0.0, seconds)
            elif isinstance(action, MarkDrained):
                w.mark_drained(action.broker)
            elif isinstance(action, CompleteTransfer):  # pragma: no cover - moves complete inside the adapter
                raise AssertionError("the adapter never leaves a move half done")
        cutoff = now - HISTORY_KEEP_S
        self.history = [r for r in self.history if r.last_at >= cutoff]
        return longest

    def _own(self, topic: str, broker: str, at: float) -> None:
        self.placements[topic] = replace(self.placements[topic], state=PlacementState.OWNED, broker=broker,
                                         updated_at=at)

    def _view(self, now: float) -> ClusterView:
        w = self.world
        if self._report_topics is None:
            names = w.topics.names
            self._report_topics = {b: frozenset([names[i] for i in w.on[b]]) for b in w.reports}
        brokers = {}
        for b, s in w.brokers.items():
            registered = w.registered(b)
            report = self.smoothed.get(b) if s.alive else None
            if report is not None:
                report = replace(report, topics=self._report_topics.get(b, frozenset()))
            brokers[b] = BrokerInfo(b, MODES[s.mode], registered, None if registered else w.unregistered_since(b),
                                    report)
        loads = {}
        for name, p in self.placements.items():
            i = self.index[name]
            if p.broker is None or w.topics.created_at[i] >= w.report_ts:
                continue  # not reported yet
            bytes_in, bytes_out, producers, consumers, backlog = w.topic_report(i, smoothed=True)
            loads[name] = TopicLoad(bytes_in / 1024.0, bytes_in, bytes_out, producers, consumers, consumers, backlog)
        markers = {w.topics.names[i]: UnassignedMarker(w.topics.names[i], "new", created_at=w.topics.created_at[i])
                   for i in w.pending}
        return ClusterView(brokers, self.placements, loads, markers, self.history,
                           LeaderHealth(True, healthy_since=-86_400.0))
