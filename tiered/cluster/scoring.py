"""The three strategies' formulas and the one score model built from them.

The seed's formulas, as floats (units: CPU and memory in percent, throughput in MB/s,
backlog in messages scaled by 10^-4):

* **Fair**: ``score = topic_count``.
* **Balanced**: ``wtl = 0.2·count + 0.3·throughput + 0.3·connections + 0.2·backlog/10^4``;
  ``score = 0.3·wtl + 0.35·CPU + 0.35·Mem``.
* **WeightedLoad**: utilisations in [0, 1]; if the largest (the bottleneck) is above
  70 % it gets half of the weight (:data:`BOTTLENECK_WEIGHTS`), otherwise the weights are
  even (:data:`EVEN_WEIGHTS`); ``score = 100·Σ weight·utilisation``.

Three deliberate changes, so that a score means the same on every broker and its terms
weigh what the seed says they weigh:

* ``wtl`` is divided by the broker's **capacity weight** (its CPU cores over the median
  of the brokers'): CPU and memory are already percentages of the broker's own capacity,
  but raw ``wtl`` would make a broker with twice the cores look twice as loaded for the
  same share of its capacity.
* By default (``balanced_topic_load = "relative"``) Balanced expresses ``wtl`` as a
  percentage of the average broker's (per capacity weight), like CPU and memory. The
  seed's table gives the score as "topic_load 30 % + CPU 35 % + Memory 35 %", but with
  raw counts and connections the topic term is hundreds while CPU is at most 100: with
  ~500 topics per broker a broker at 99 % CPU and one at 16 % differ by 10 % of their
  scores, and the CV never reaches a threshold. ``"absolute"`` keeps the literal formula.
* WeightedLoad picks the bottleneck **once for the cluster** (the largest utilisation of
  any broker) and scores every broker with the same weights; picked per broker, two
  brokers' scores use different weights and cannot be compared or averaged. A network
  or disk capacity a broker did not report is unknown: that utilisation is measured
  against the busiest broker's (Danube's normalisation) and is never the bottleneck,
  since the busiest broker would always be at 100 % (dividing by a placeholder capacity
  instead made any traffic look like a saturated link, and hid a broker at 95 % CPU).

:class:`ScoreModel` turns a view into per-broker scores that are *linear in the topics a
broker holds*: the broker's reported CPU/memory/disk/network are split into a part that
does not depend on its topics and a per-topic part proportional to each topic's cost
(bytes in + out + a cost per connection). Placements made after the report (new topics,
moves in flight) are therefore reflected at once, a topic's contribution moves with it,
and the same numbers drive placement, the CV and every move decision.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping

from tiered.cluster.actions import BalanceStats
from tiered.cluster.config import LoadManagerConfig, Strategy
from tiered.cluster.view import BrokerInfo, BrokerMode, ClusterView, PlacementState, TopicLoad

# -- the seed's formulas -----------------------------------------------------------------

WTL_COUNT_WEIGHT = 0.2
WTL_THROUGHPUT_WEIGHT = 0.3
WTL_CONNECTIONS_WEIGHT = 0.3
WTL_BACKLOG_WEIGHT = 0.2
BACKLOG_SCALE = 1e4
BALANCED_WTL_WEIGHT = 0.3
BALANCED_CPU_WEIGHT = 0.35
BALANCED_MEM_WEIGHT = 0.35

METRICS = ("cpu", "mem", "thr", "net", "disk", "topic")
#: Weights when ``metric`` is the bottleneck (above the threshold).
BOTTLENECK_WEIGHTS: Mapping[str, Mapping[str, float]] = {
    "cpu": {"cpu": 0.5, "mem": 0.2, "thr": 0.15, "topic": 0.15},
    "mem": {"mem": 0.5, "cpu": 0.2, "thr": 0.15, "topic": 0.15},
    "thr": {"thr": 0.5, "net": 0.2, "cpu": 0.15, "mem": 0.15},
    "net": {"net": 0.5, "thr": 0.2, "cpu": 0.15, "mem": 0.15},
    "topic": {"topic": 0.5, "cpu": 0.2, "mem": 0.2, "thr": 0.1},
    "disk": {"disk": 0.5, "cpu": 0.2, "mem": 0.2, "thr": 0.1},
}
#: Weights when no utilisation is above the threshold ("25 % each" of the seed, with
#: the throughput quarter split between topic throughput and the NIC).
EVEN_WEIGHTS: Mapping[str, float] = {"topic": 0.25, "cpu": 0.25, "mem": 0.25, "thr": 0.15, "net": 0.10}


def weighted_topic_load(count: float, throughput_mb_s: float, connections: float, backlog: float) -> float:
    """The seed's ``weighted_topic_load`` (for one topic: its "topic load score")."""
    return (WTL_COUNT_WEIGHT * count + WTL_THROUGHPUT_WEIGHT * throughput_mb_s
            + WTL_CONNECTIONS_WEIGHT * connections + WTL_BACKLOG_WEIGHT * backlog / BACKLOG_SCALE)


def topic_load_score(load: TopicLoad) -> float:
    """The seed's per-topic score used to sort candidates (lightest first)."""
    return weighted_topic_load(1, load.throughput_mb_s, load.connections, load.backlog)


def balanced_score(wtl: float, cpu_pct: float, mem_pct: float) -> float:
    return BALANCED_WTL_WEIGHT * wtl + BALANCED_CPU_WEIGHT * cpu_pct + BALANCED_MEM_WEIGHT * mem_pct


def bottleneck_weights(utilisations: Mapping[str, float], threshold: float) -> tuple[str | None, Mapping[str, float]]:
    """(bottleneck metric or None, weights). Ties go to the earlier metric in :data:`METRICS`."""
    best, best_u = None, -math.inf
    for metric in METRICS:
        u = utilisations.get(metric)
        if u is not None and u > best_u:
            best, best_u = metric, u
    if best is not None and best_u > threshold:
        return best, BOTTLENECK_WEIGHTS[best]
    return None, EVEN_WEIGHTS


def weighted_load_score(utilisations: Mapping[str, float], weights: Mapping[str, float]) -> float:
    return 100.0 * sum(w * utilisations.get(metric, 0.0) for metric, w in weights.items())


def balance_stats(loads: Mapping[str, float]) -> BalanceStats | None:
    """Mean, population σ, CV = σ/mean (0 when the mean is 0) and the seed's classes."""
    if not loads:
        return None
    values = list(loads.values())
    mean = sum(values) / len(values)
    std = math.sqrt(max(sum((v - mean) ** 2 for v in values) / len(values), 0.0))
    cv = std / mean if mean > 0 else 0.0
    over = tuple(sorted(b for b, v in loads.items() if v > mean + std))
    under = tuple(sorted(b for b, v in loads.items() if v < mean - std and v < 0.5 * mean))
    return BalanceStats(len(values), mean, std, cv, min(values), max(values), over, under)


def cv_of(n: int, total: float, total_sq: float) -> float:
    """CV from the count, sum and sum of squares of the loads."""
    if n == 0 or total <= 0:
        return 0.0
    mean = total / n
    return math.sqrt(max(total_sq / n - mean * mean, 0.0)) / mean


# -- the score model ---------------------------------------------------------------------

# Per-topic cost vector: (count, cost weight w, wtl, throughput bytes/s, bytes in/s).
_N, _W, _WTL, _THR, _IN = range(5)
_COST_FLOOR = 1.0
#: Usage % from which a broker may be saturated (its report no longer grows with its
#: load): a report cannot show more than 100 %, and a few % of report noise takes a
#: saturated broker's reading down to about 90 % (at 95 %, a capped broker reading 94 %
#: sometimes entered the fit and halved every topic's estimated CPU cost).
_SATURATED = 90.0
#: Fit a line only when the brokers' cost per core differs by a few percent (CV ≥ 3 %).
_SPREAD_MIN = 0.03 ** 2


class ScoreModel:
    """Scores of every broker for one decision, updated in place as the decision places
    or moves topics. Coefficients are fixed when the model is built, so within one
    decision a score is a linear function of the broker's topics.

    ``eligible_targets`` are the brokers that may receive a topic: registered, active,
    with a fresh report (or, while no broker has one, every registered active broker),
    below ``max_topics_per_broker``. ``balance_set`` are the brokers whose loads make the
    CV: registered, active, with a fresh report.
    """

    def __init__(self, view: ClusterView, config: LoadManagerConfig, now: float,
                 topics_sorted: list[str] | None = None) -> None:
        self.config = config
        self.strategy = config.assignment_strategy
        self.now = now
        brokers = view.brokers
        stale_after_s = config.report_stale_after_s

        def fresh(b: BrokerInfo) -> bool:
            return b.report is not None and now - b.report.ts <= stale_after_s

        self.fresh = {b for b, info in brokers.items() if fresh(info)}
        self.live = {b for b, info in brokers.items() if info.registered}
        self.active = {b for b, info in brokers.items() if info.registered and info.mode is BrokerMode.ACTIVE}
        # Without any fresh report (a cluster starting up) placement still has to work:
        # it falls back to the load-independent part of the score for every live broker.
        self.no_data = not (self.fresh & self.active)
        self.balance_set = sorted(self.active & self.fresh)

        # Sums run in topic order so that the same view gives bit-identical scores
        # whatever order its mappings were built in.
        self.placeholder = _mean_load([load for _, load in sorted(view.topic_loads.items())])
        self._costs: dict[str, tuple[float, float, float, float, float]] = {}
        self._connection_cost = config.connection_cost_bps
        self._loads = view.topic_loads
        self.holder: dict[str, str] = {}
        self.agg: dict[str, list[float]] = {b: [0.0] * 5 for b in brokers}
        placements = view.placements
        for topic in topics_sorted if topics_sorted is not None else sorted(placements):
            where = _counted_on(placements[topic])
            if where is not None:
                self._add(topic, where)

        self._coef: dict[str, tuple[float, float, float, float, float, float]] = {}
        self._build_coefficients(view)

    # -- per-topic costs -------------------------------------------------------------
    def load_of(self, topic: str) -> TopicLoad:
        """The topic's reported (smoothed) load, or the cluster's mean topic load for a
        topic that has not been reported yet (a new topic is expected to be average)."""
        return self._loads.get(topic, self.placeholder)

    def cost(self, topic: str) -> tuple[float, float, float, float, float]:
        c = self._costs.get(topic)
        if c is None:
            load = self._loads.get(topic, self.placeholder)
            thr = load.bytes_in_rate + load.bytes_out_rate
            connections = load.producers + load.consumers
            wtl = (WTL_COUNT_WEIGHT + WTL_THROUGHPUT_WEIGHT * thr / 1e6 + WTL_CONNECTIONS_WEIGHT * connections
                   + WTL_BACKLOG_WEIGHT * load.backlog / BACKLOG_SCALE)
            c = (1.0, thr + self._connection_cost * connections, wtl, thr, load.bytes_in_rate)
            self._costs[topic] = c
        return c

    def _add(self, topic: str, broker: str) -> None:
        c, a = self.cost(topic), self.agg[broker]
        a[0] += c[0]
        a[1] += c[1]
        a[2] += c[2]
        a[3] += c[3]
        a[4] += c[4]
        self.holder[topic] = broker

    def _remove(self, topic: str) -> None:
        broker = self.holder.pop(topic)
        c, a = self.cost(topic), self.agg[broker]
        a[0] -= c[0]
        a[1] -= c[1]
        a[2] -= c[2]
        a[3] -= c[3]
        a[4] -= c[4]

    def place(self, topic: str, broker: str) -> None:
        """Record that ``topic`` now counts on ``broker`` (new, moved or reassigned)."""
        if topic in self.holder:
            self._remove(topic)
        self._add(topic, broker)

    def count(self, broker: str) -> int:
        return round(self.agg[broker][_N])

    # -- coefficients ----------------------------------------------------------------
    def _build_coefficients(self, view: ClusterView) -> None:
        reports = {b: info.report for b, info in view.brokers.items() if info.report is not None}
        cores = [r.capacity.cpu_cores for b, r in reports.items() if b in self.fresh] or [1.0]
        median_cores = statistics.median(cores)
        self.capacity_weight = {b: (reports[b].capacity.cpu_cores / median_cores if b in reports else 1.0)
                                for b in view.brokers}
        # Per-report totals of the topics it covered, with today's per-topic estimates.
        reported = {b: [0.0] * 5 for b in reports}
        for b, r in reports.items():
            for topic in sorted(r.topics):
                c = self.cost(topic)
                for i in range(5):
                    reported[b][i] += c[i]
        k_cpu, base_cpu, self.idle_cpu = self._resource(reports, reported, lambda r: r.cpu_pct)
        k_mem, base_mem, self.idle_mem = self._resource(reports, reported, lambda r: r.mem_pct)
        k_disk = self._per_unit(reports, reported, lambda r: r.disk_io_bps, _IN)
        base: dict[str, tuple[float, float, float, float]] = {}
        for b, r in reports.items():
            rep = reported[b]
            base[b] = (base_cpu[b], base_mem[b], max(r.net_in_bps + r.net_out_bps - rep[_THR], 0.0),
                       max(r.disk_io_bps - k_disk[b] * rep[_IN], 0.0))
        self._capacities(reports, k_disk, base)
        self.weights: Mapping[str, float] = {}
        self.bottleneck: str | None = None
        self.topic_ref = 1.0
        if self.strategy is Strategy.WEIGHTED_LOAD:
            self._choose_weights(reports, k_cpu, k_mem, k_disk, base)
        self.balanced_topic_scale = 1.0
        if self.strategy is Strategy.BALANCED and self.config.balanced_topic_load == "relative":
            scored = [self.agg[b][_WTL] / self.capacity_weight[b] for b in sorted(self.fresh & self.live)]
            mean = sum(scored) / len(scored) if scored else 0.0
            # 100 = the average broker's topic load per unit of capacity: a percentage
            # like CPU and memory, so the 30/35/35 weights mean what they say.
            self.balanced_topic_scale = 100.0 / mean if mean > 0 else 1.0
        for b in view.brokers:
            self._coef[b] = self._coefficients(b, reports.get(b), k_cpu.get(b, 0.0), k_mem.get(b, 0.0),
                                               k_disk.get(b, 0.0), base.get(b))
        # CPU utilisation (fraction of the broker's own capacity, idle included) as the same
        # linear model: the resource the rebalancing guard keeps from getting worse.
        self.guards_cpu = self.strategy is not Strategy.FAIR and not self.no_data
        self._cpu = {b: ((self.idle_cpu + base[b][0]) / 100.0, k_cpu[b] / 100.0) for b in reports}

    def _resource(self, reports, reported, metric) -> tuple[dict[str, float], dict[str, float], float]:
        """Split a broker's CPU or memory % into (per unit of topic cost, the rest) and the
        cluster's idle level.

        With three or more fresh, unsaturated brokers whose topic cost per core differs,
        a least-squares line ``usage = idle + slope · cost / cores`` gives the usage of an
        idle broker and the cost of a byte per core: every broker then gets the same
        per-core cost (capacity-consistent move predictions, free of one broker's report
        noise), the idle level is left out of the score (no placement changes it, and a
        flat 15 % of base memory on every broker would hide a broker at 99 % CPU from the
        CV), and what a broker uses beyond the line stays in its score as its own base.
        A broker that may be saturated (≥ 90 %) is left out of the fit and its topics'
        cost can show it needs more than 100 %. Otherwise everything a broker reports is attributed to
        its topics in proportion to their cost (and an empty broker borrows the median).
        """
        points = []
        for b in sorted(reports):
            r = reports[b]
            if b in self.fresh and b in self.live and reported[b][_W] >= _COST_FLOOR and metric(r) < _SATURATED:
                points.append((reported[b][_W] / r.capacity.cpu_cores, metric(r)))
        fit = _line(points)
        if fit is None:
            k = self._per_unit(reports, reported, metric, _W)
            return k, {b: max(metric(r) - k[b] * reported[b][_W], 0.0) for b, r in reports.items()}, 0.0
        idle, slope = fit
        k = {b: slope / r.capacity.cpu_cores for b, r in reports.items()}
        rest = {b: max(metric(r) - idle - k[b] * reported[b][_W], 0.0) for b, r in reports.items()}
        return k, rest, idle

    def _per_unit(self, reports, reported, metric, unit: int) -> dict[str, float]:
        """A broker's metric per unit of topic cost (e.g. CPU % per byte/s). Brokers with no
        reported cost (empty, or idle) borrow the cluster's median, scaled by capacity."""
        own: dict[str, float] = {}
        for b, r in reports.items():
            # Below one byte per second of topic traffic there is nothing to attribute to
            # (and a ratio with a vanishing denominator would be noise, or infinite).
            if reported[b][unit] >= _COST_FLOOR:
                own[b] = metric(r) / reported[b][unit]
        scaled = [own[b] * reports[b].capacity.cpu_cores for b in own if b in self.fresh]
        typical = statistics.median(scaled) if scaled else 0.0
        return {b: own.get(b, typical / r.capacity.cpu_cores) for b, r in reports.items()}

    def _capacities(self, reports, k_disk, base) -> None:
        """The denominators of the link (bytes in + out against twice the NIC) and disk
        utilisations. A capacity the broker did not report is unknown: its use is then
        measured against the busiest scored broker's (Danube's normalisation), and such a
        relative number is never taken for a bottleneck (the busiest broker would always
        be at 100 %), like the relative topic term."""
        scored = [b for b in sorted(reports) if b in self.fresh and b in self.live]
        link_ref = max([base[b][2] + self.agg[b][_THR] for b in scored] + [_COST_FLOOR])
        disk_ref = max([base[b][3] + k_disk[b] * self.agg[b][_IN] for b in scored] + [_COST_FLOOR])
        self._link: dict[str, float] = {}
        self._disk: dict[str, float] = {}
        self._relative: dict[str, frozenset[str]] = {}
        for b, r in reports.items():
            nic, disk = r.capacity.nic_bps, r.capacity.disk_bps
            self._link[b] = link_ref if nic is None else 2.0 * nic
            self._disk[b] = disk_ref if disk is None else disk
            self._relative[b] = frozenset((("thr", "net") if nic is None else ()) + (("disk",) if disk is None else ()))

    def _utilisations(self, b: str, k_cpu, k_mem, k_disk, base) -> dict[str, float]:
        a = self.agg[b]
        return {
            "cpu": (self.idle_cpu + base[0] + k_cpu * a[_W]) / 100.0,
            "mem": (self.idle_mem + base[1] + k_mem * a[_W]) / 100.0,
            "thr": a[_THR] / self._link[b],
            "net": (base[2] + a[_THR]) / self._link[b],
            "disk": (base[3] + k_disk * a[_IN]) / self._disk[b],
        }

    def _choose_weights(self, reports, k_cpu, k_mem, k_disk, base) -> None:
        cfg = self.config.weighted_load
        scored = [b for b in sorted(reports) if b in self.fresh and b in self.live]
        per_cw = [self.agg[b][_WTL] / self.capacity_weight[b] for b in scored]
        self.topic_ref = cfg.topic_load_capacity or max(per_cw + [1e-9])
        peak: dict[str, float] = {}
        for b in scored:
            u = self._utilisations(b, k_cpu[b], k_mem[b], k_disk[b], base[b])
            if cfg.topic_load_capacity is not None:
                u["topic"] = self.agg[b][_WTL] / self.capacity_weight[b] / cfg.topic_load_capacity
            for metric, value in u.items():
                if metric not in self._relative[b]:
                    peak[metric] = max(peak.get(metric, 0.0), value)
        self.bottleneck, self.weights = bottleneck_weights(peak, cfg.bottleneck_threshold)

    def _coefficients(self, b, report, k_cpu, k_mem, k_disk, base) -> tuple[float, float, float, float, float, float]:
        """(const, per count, per cost w, per wtl, per throughput, per bytes in)."""
        cw = self.capacity_weight[b]
        if self.strategy is Strategy.FAIR:
            return (0.0, 1.0, 0.0, 0.0, 0.0, 0.0)
        if self.strategy is Strategy.BALANCED:
            if report is None or self.no_data:
                return (0.0, 0.0, 0.0, BALANCED_WTL_WEIGHT / cw, 0.0, 0.0)
            return (BALANCED_CPU_WEIGHT * base[0] + BALANCED_MEM_WEIGHT * base[1], 0.0,
                    BALANCED_CPU_WEIGHT * k_cpu + BALANCED_MEM_WEIGHT * k_mem,
                    BALANCED_WTL_WEIGHT * self.balanced_topic_scale / cw, 0.0, 0.0)
        w = self.weights
        topic_ref = self.topic_ref
        if report is None or self.no_data:
            return (0.0, 0.0, 0.0, 100.0 / (cw * topic_ref), 0.0, 0.0)
        link, disk = self._link[b], self._disk[b]
        const = (w.get("cpu", 0.0) * base[0] + w.get("mem", 0.0) * base[1]
                 + 100.0 * w.get("net", 0.0) * base[2] / link + 100.0 * w.get("disk", 0.0) * base[3] / disk)
        return (const, 0.0, w.get("cpu", 0.0) * k_cpu + w.get("mem", 0.0) * k_mem,
                100.0 * w.get("topic", 0.0) / (cw * topic_ref),
                100.0 * (w.get("thr", 0.0) + w.get("net", 0.0)) / link,
                100.0 * w.get("disk", 0.0) * k_disk / disk)

    # -- scores ----------------------------------------------------------------------
    def has_score(self, broker: str) -> bool:
        return self.strategy is Strategy.FAIR or self.no_data or broker in self.fresh

    def score(self, broker: str) -> float:
        k, a = self._coef[broker], self.agg[broker]
        return k[0] + k[1] * a[_N] + k[2] * a[_W] + k[3] * a[_WTL] + k[4] * a[_THR] + k[5] * a[_IN]

    def contribution(self, topic: str, broker: str) -> float:
        """How much ``topic`` adds to ``broker``'s score."""
        k, c = self._coef[broker], self.cost(topic)
        return k[1] * c[_N] + k[2] * c[_W] + k[3] * c[_WTL] + k[4] * c[_THR] + k[5] * c[_IN]

    def rankings(self) -> tuple[tuple[str, float], ...]:
        scored = [(b, self.score(b)) for b in sorted(self.agg) if b in self.live and self.has_score(b)]
        return tuple(sorted(scored, key=lambda x: (x[1], x[0])))

    def cpu(self, broker: str) -> float:
        """Estimated CPU utilisation (1.0 = the broker's capacity; may exceed 1 when its
        topics need more than it has)."""
        c0, k = self._cpu[broker]
        return c0 + k * self.agg[broker][_W]

    def cpu_contribution(self, topic: str, broker: str) -> float:
        return self._cpu[broker][1] * self.cost(topic)[_W]

    def balance_cpu(self) -> dict[str, float]:
        return {b: self.cpu(b) for b in self.balance_set}

    def balance_loads(self) -> dict[str, float]:
        return {b: self.score(b) for b in self.balance_set}

    def eligible_targets(self, exclude: Iterable[str | None] = ()) -> list[str]:
        skip = set(exclude)
        limit = self.config.max_topics_per_broker
        pool = self.active if self.no_data else (self.active & self.fresh)
        return [b for b in sorted(pool) if b not in skip and (limit is None or self.count(b) < limit)]


def _line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through ``points``, or None when
    there are fewer than three, their x hardly differ, or the slope is not positive.
    The intercept is kept within [0, the smallest y]."""
    n = len(points)
    if n < 3:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if mx <= 0 or sxx <= _SPREAD_MIN * n * mx * mx:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    if slope <= 0:
        return None
    return min(max(my - slope * mx, 0.0), min(y for _, y in points)), slope


def _counted_on(p) -> str | None:
    """Where a placement's load counts: its owner or assignee, or the target of a move."""
    if p.state is PlacementState.FREE:
        return None
    if p.state is PlacementState.RELEASING and p.target is not None:
        return p.target
    return p.broker


def _mean_load(loads: Iterable[TopicLoad]) -> TopicLoad:
    totals = [0.0] * 7
    n = 0
    for v in loads:
        n += 1
        totals[0] += v.msg_rate
        totals[1] += v.bytes_in_rate
        totals[2] += v.bytes_out_rate
        totals[3] += v.producers
        totals[4] += v.consumers
        totals[5] += v.subscriptions
        totals[6] += v.backlog
    return TopicLoad(*(t / n for t in totals)) if n else TopicLoad()
