"""The seed's load-manager metrics, with a ``dnb_`` prefix, fed from decisions.

The runtime calls :meth:`LoadManagerMetrics.observe` after each decision (it measures
the cycle's duration; the core reads no clock) and :meth:`failed` when carrying out an
action fails. Skipped checks are counted by reason, alarms by kind.
"""
from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from tiered.cluster.actions import Assign, CompleteTransfer, Decision, Reassign, Transfer
from tiered.cluster.view import ClusterView, MoveKind, PlacementState


class LoadManagerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = REGISTRY if registry is None else registry
        self.cv = Gauge("dnb_cluster_balance_cv", "Coefficient of variation of broker load scores", registry=r)
        self.mean = Gauge("dnb_cluster_balance_mean_load", "Mean broker load score", registry=r)
        self.max = Gauge("dnb_cluster_balance_max_load", "Max broker load score", registry=r)
        self.min = Gauge("dnb_cluster_balance_min_load", "Min broker load score", registry=r)
        self.std = Gauge("dnb_cluster_balance_std_dev", "Standard deviation of broker load scores", registry=r)
        self.active = Gauge("dnb_cluster_active_brokers", "Registered active brokers with fresh load reports",
                            registry=r)
        self.checks = Counter("dnb_rebalancing_checks_total", "Rebalancing checks run", registry=r)
        self.moves = Counter("dnb_rebalancing_moves_total", "Moves started, by kind", ["kind"], registry=r)
        self.failures = Counter("dnb_rebalancing_failures_total", "Actions that could not be carried out",
                                registry=r)
        self.cycle = Histogram("dnb_rebalancing_cycle_duration_seconds", "Duration of one decision cycle",
                               registry=r)
        self.assignments = Counter("dnb_topic_assignments_total", "Topic assignments",
                                   ["broker_id", "action"], registry=r)
        self.topics_owned = Gauge("dnb_broker_topics_owned", "Topics placed on a broker", ["broker_id"], registry=r)
        self.cpu = Gauge("dnb_broker_cpu_usage", "Broker CPU % (smoothed)", ["broker_id"], registry=r)
        self.memory = Gauge("dnb_broker_memory_usage", "Broker memory % (smoothed)", ["broker_id"], registry=r)
        self.throughput = Gauge("dnb_broker_throughput_mbps", "Broker topic throughput, MB/s in + out",
                                ["broker_id"], registry=r)
        self.skipped = Counter("dnb_lm_skipped_checks_total", "Rebalancing checks that moved nothing, by reason",
                               ["reason"], registry=r)
        self.alarms = Counter("dnb_lm_alarms_total", "Alarms raised by the decision core, by kind", ["kind"],
                              registry=r)
        # The runtime's own (set by tiered.cluster.runtime).
        self.is_leader = Gauge("dnb_lm_is_leader", "1 while this process is the load-manager leader", registry=r)
        self.term = Gauge("dnb_lm_term", "Term of the leadership held (0: not leader)", registry=r)
        self.fenced = Counter("dnb_lm_fenced_writes_total", "Writes refused by the leader fence", registry=r)
        self.refused = Counter("dnb_lm_cas_refused_total", "Writes whose compare-and-swap lost (state moved on)",
                               registry=r)

    def observe(self, decision: Decision, view: ClusterView, duration_s: float | None = None) -> None:
        b = decision.balance
        if b is not None:
            for gauge, value in ((self.cv, b.cv), (self.mean, b.mean), (self.max, b.max_load),
                                 (self.min, b.min_load), (self.std, b.std_dev)):
                gauge.set(value)
            self.active.set(b.brokers)
        if decision.checked:
            self.checks.inc()
        for reason in decision.skipped:
            self.skipped.labels(reason).inc()
        for alarm in decision.alarms:
            self.alarms.labels(alarm.kind).inc()
        for action in decision.actions:
            self._count(action)
        if duration_s is not None:
            self.cycle.observe(duration_s)
        owned: dict[str, int] = {}
        for p in view.placements.values():
            if p.broker is not None and p.state is not PlacementState.FREE:
                owned[p.broker] = owned.get(p.broker, 0) + 1
        throughput: dict[str, float] = {}
        for topic, p in view.placements.items():
            load = view.topic_loads.get(topic)
            if load is not None and p.broker is not None:
                throughput[p.broker] = throughput.get(p.broker, 0.0) + load.throughput_mb_s
        for broker_id, info in view.brokers.items():
            self.topics_owned.labels(broker_id).set(owned.get(broker_id, 0))
            self.throughput.labels(broker_id).set(throughput.get(broker_id, 0.0))
            if info.report is not None:
                self.cpu.labels(broker_id).set(info.report.cpu_pct)
                self.memory.labels(broker_id).set(info.report.mem_pct)

    def failed(self) -> None:
        self.failures.inc()

    def _count(self, action) -> None:
        if isinstance(action, Assign):
            self.assignments.labels(action.broker, "assign").inc()
        elif isinstance(action, Transfer):
            self.moves.labels(action.kind.value).inc()
            self.assignments.labels(action.from_broker, "unassign").inc()
        elif isinstance(action, CompleteTransfer):
            self.assignments.labels(action.to_broker, "assign").inc()
        elif isinstance(action, Reassign):
            self.moves.labels(MoveKind.FAILOVER.value if action.reason == MoveKind.FAILOVER.value
                              else action.reason).inc()
            self.assignments.labels(action.from_broker, "unassign").inc()
            self.assignments.labels(action.to_broker, "assign").inc()
