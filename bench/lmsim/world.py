"""The simulated cluster: ground truth, noisy reports, moves, and what is measured.

Time advances in steps of one report interval (30 s). In each step: the workload's
events fire, every live broker reports (true utilisation with ±5 % noise), the algorithm
decides and acts, and the step's true imbalance is recorded. Algorithms read only
reports (:meth:`World.report`, :meth:`World.topic_report`); the truth is for measuring.

Per-broker sums of the topics' load terms are kept incrementally (a topic's daily wave
``1 + a·sin(ωτ + φ)`` expands into ``sin ωτ·cos φ + cos ωτ·sin φ``), so a step costs
O(brokers), not O(topics), and a 20,000-topic day runs in seconds.
"""
from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field

from bench.lmsim.workloads import (
    CONNECTION_COST_BPS,
    DAY_S,
    STANDARD_CAPACITY_BPS,
    WorkloadSpec,
    make_topics,
    new_topic,
)

STEP_S = 30.0
SESSION_TTL_S = 10.0
REPORT_NOISE = 0.05
MSG_BYTES = 1024.0
#: EMA(0.3) of a noisy report keeps sqrt(0.3 / 1.7) of its noise.
SMOOTHED_NOISE = REPORT_NOISE * math.sqrt(0.3 / 1.7)
_NOISE_TABLE_SIZE = 1 << 16

# -- aggregate slots --------------------------------------------------------------------
N, I, IC, IS, B, BC, BS, C, CONN, BACKLOG = range(10)


@dataclass(frozen=True)
class MoveModel:
    """Unavailability of a topic during a move, from ``bench/bench_moves.py`` (etcd+moto):
    unload+load with nothing to drain, plus draining the un-archived bytes (the uploader
    archives every 30 s, so a topic carries ~15 s of its input; at most 64 MiB)."""

    base_s: float = 0.0099
    drain_bps: float = 64 * 2**20 / (1.1801 - 0.0099)
    unarchived_s: float = 15.0
    unarchived_max_bytes: float = 64 * 2**20

    def seconds(self, bytes_in_rate: float) -> float:
        return self.base_s + min(bytes_in_rate * self.unarchived_s, self.unarchived_max_bytes) / self.drain_bps


@dataclass
class SimBroker:
    broker_id: str
    factor: float
    mode: str = "active"           # active | draining | drained
    alive: bool = True
    down_at: float | None = None

    @property
    def capacity_bps(self) -> float:
        return STANDARD_CAPACITY_BPS * self.factor

    @property
    def cores(self) -> float:
        return 8.0 * self.factor

    @property
    def nic_bps(self) -> float:
        return 1.25e9 * self.factor

    @property
    def mem_bytes(self) -> float:
        return 32e9 * self.factor


@dataclass
class BrokerReport:
    """What a broker reports (raw, noisy): resources and the totals of its topics."""

    ts: float
    cpu_pct: float
    mem_pct: float
    net_in_bps: float
    net_out_bps: float
    disk_io_bps: float
    topics: int
    bytes_in_rate: float
    bytes_out_rate: float
    connections: float
    backlog: float


@dataclass
class MoveEvent:
    at_s: float
    topic: int
    source: str | None
    target: str
    kind: str  # auto | manual | drain | failover | shed | new
    seconds: float
    futile: bool = False
    pingpong: bool = False


@dataclass
class Metrics:
    cv: list[float] = field(default_factory=list)
    max_over_mean: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    moves: list[MoveEvent] = field(default_factory=list)
    unavailable_s: float = 0.0
    burst: Counter = field(default_factory=Counter)


class World:
    def __init__(self, spec: WorkloadSpec, seed: int, move_model: MoveModel | None = None) -> None:
        self.spec = spec
        self.seed = seed
        rng = random.Random(f"{seed}:{spec.name}:topics")
        self.topics, self.scale = make_topics(spec, rng)
        self._topic_rng = rng
        self.move_model = move_model or MoveModel()
        self.brokers: dict[str, SimBroker] = {b: SimBroker(b, f) for b, f in spec.brokers}
        self.owner: list[str | None] = []
        self.on: dict[str, set[int]] = {b: set() for b in self.brokers}
        self.agg: dict[str, list[float]] = {b: [0.0] * 10 for b in self.brokers}
        self.mult: list[float] = [1.0] * len(self.topics.names)
        self.step_at: dict[int, tuple[float, float]] = {}  # topic → (time, factor) of its step
        self.now = 0.0
        self.step = 0
        self.reports: dict[str, BrokerReport] = {}
        self.report_ts = -STEP_S
        self.pending: list[int] = []          # new topics waiting for a broker
        self.burst_topics: set[int] = set()
        self.left: dict[int, list[tuple[float, str]]] = {}
        self.leader_changed_at: float | None = None
        self.metrics = Metrics()
        noise_rng = random.Random(f"{seed}:noise")
        self._noise = [noise_rng.gauss(0.0, 1.0) for _ in range(_NOISE_TABLE_SIZE)]
        # initial placement: the topics were created over time by a count-based placement
        # (round-robin in creation order), before any of the compared algorithms ran.
        ids = sorted(self.brokers)
        for i in range(len(self.topics.names)):
            self.owner.append(None)
            self._place(i, ids[i % len(ids)])
        rng_events = random.Random(f"{seed}:{spec.name}:events")
        self._events = sorted(spec.events, key=lambda e: e.at_s)
        self._event_rng = rng_events

    # -- truth -----------------------------------------------------------------------
    def wave(self) -> tuple[float, float, float]:
        a = self.spec.daily_amplitude
        x = 2 * math.pi * self.now / DAY_S
        return a, math.sin(x), math.cos(x)

    def topic_in(self, i: int) -> float:
        a, s, c = self.wave()
        t = self.topics
        return t.base_in[i] * self.mult[i] * (1 + a * (s * t.cos_phi[i] + c * t.sin_phi[i]))

    def topic_work(self, i: int) -> float:
        t = self.topics
        return self.topic_in(i) * (1 + t.consumers[i]) + CONNECTION_COST_BPS * (t.producers[i] + t.consumers[i])

    def broker_in(self, b: str) -> float:
        a, s, c = self.wave()
        g = self.agg[b]
        return g[I] + a * (s * g[IC] + c * g[IS])

    def broker_work(self, b: str) -> float:
        a, s, c = self.wave()
        g = self.agg[b]
        return g[B] + a * (s * g[BC] + c * g[BS]) + g[C]

    def utilisation(self, b: str) -> float:
        return self.broker_work(b) / self.brokers[b].capacity_bps

    def balanced_brokers(self) -> list[str]:
        """Brokers that should share the load: alive and active."""
        return [b for b, s in sorted(self.brokers.items()) if s.alive and s.mode == "active"]

    def true_cv(self, utils: dict[str, float] | None = None) -> float:
        utils = utils if utils is not None else {b: self.utilisation(b) for b in self.balanced_brokers()}
        return _cv(list(utils.values()))

    # -- bookkeeping -----------------------------------------------------------------
    def _vector(self, i: int) -> list[float]:
        t = self.topics
        m = self.mult[i]
        base = t.base_in[i] * m
        fan = base * (1 + t.consumers[i])
        conns = t.producers[i] + t.consumers[i]
        return [1.0, base, base * t.cos_phi[i], base * t.sin_phi[i], fan, fan * t.cos_phi[i], fan * t.sin_phi[i],
                CONNECTION_COST_BPS * conns, float(conns), t.backlog[i]]

    def _place(self, i: int, b: str | None) -> None:
        old = self.owner[i]
        vec = self._vector(i)
        if old is not None:
            g = self.agg[old]
            for k in range(10):
                g[k] -= vec[k]
            self.on[old].discard(i)
        if b is not None:
            g = self.agg[b]
            for k in range(10):
                g[k] += vec[k]
            self.on[b].add(i)
        self.owner[i] = b

    # -- reports (what algorithms see) -----------------------------------------------
    def noise(self, key: int) -> float:
        return self._noise[key % _NOISE_TABLE_SIZE]

    def _report(self, b: str) -> BrokerReport:
        s = self.brokers[b]
        util = self.utilisation(b)
        k = self.step * 7919 + zlib.crc32(b.encode()) % 104_729
        g = self.agg[b]
        n_scale = STANDARD_CAPACITY_BPS / s.capacity_bps
        cpu = 100 * min(1.0, 0.02 + util) * (1 + REPORT_NOISE * self.noise(k))
        mem = 100 * min(1.0, 0.15 + 0.25 * util + 0.00015 * g[N] * n_scale) * (1 + 0.02 * self.noise(k + 1))
        bytes_in = self.broker_in(b) * (1 + REPORT_NOISE * self.noise(k + 2))
        work = self.broker_work(b)
        bytes_out = max(work - g[C] - self.broker_in(b), 0.0) * (1 + REPORT_NOISE * self.noise(k + 3))
        return BrokerReport(self.now, max(cpu, 0.0), max(mem, 0.0), bytes_in, bytes_out, 2 * bytes_in,
                            int(g[N]), bytes_in, bytes_out, g[CONN], g[BACKLOG])

    def report(self, b: str) -> BrokerReport | None:
        return self.reports.get(b)

    def topic_report(self, i: int, smoothed: bool) -> tuple[float, float, float, float, float]:
        """(bytes in/s, bytes out/s, producers, consumers, backlog) as last reported;
        ``smoothed`` = after an EMA(0.3) of the reports (less noise, lags a step)."""
        t = self.topics
        true_in = self.topic_in(i)
        z = self.noise(i * 7919 + self.step)
        if smoothed:
            factor = 1 + SMOOTHED_NOISE * z
            step = self.step_at.get(i)
            if step is not None and step[0] <= self.now:
                reports = int((self.now - step[0]) // STEP_S) + 1
                seen = 1 + (step[1] - 1) * (1 - 0.7 ** reports)
                factor *= seen / step[1]
        else:
            factor = 1 + REPORT_NOISE * z
        bytes_in = max(true_in * factor, 0.0)
        return bytes_in, bytes_in * t.consumers[i], float(t.producers[i]), float(t.consumers[i]), t.backlog[i]

    def long_term_msg_rate(self, i: int) -> float:
        """Messages in + out per second averaged over a day (Pulsar's long-term data)."""
        t = self.topics
        return t.base_in[i] * self.mult[i] * (1 + t.consumers[i]) / MSG_BYTES

    def registered(self, b: str) -> bool:
        s = self.brokers[b]
        return s.alive or (s.down_at is not None and self.now < s.down_at + SESSION_TTL_S)

    def unregistered_since(self, b: str) -> float | None:
        s = self.brokers[b]
        return None if self.registered(b) else s.down_at + SESSION_TTL_S

    # -- the step ------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step
        self.now = step * STEP_S
        while self._events and self._events[0].at_s < self.now + STEP_S:
            self._fire(self._events.pop(0))
        self.reports = {b: self._report(b) for b, s in self.brokers.items() if s.alive}
        self.report_ts = self.now

    def end_step(self) -> None:
        live = self.balanced_brokers()
        utils = {b: self.utilisation(b) for b in live}
        self.metrics.times.append(self.now)
        self.metrics.cv.append(_cv(list(utils.values())))
        ideal = sum(self.broker_work(b) for b in live) / sum(self.brokers[b].capacity_bps for b in live)
        self.metrics.max_over_mean.append(max(utils.values()) / ideal if ideal > 0 else 1.0)

    def _fire(self, event) -> None:
        rng = self._event_rng
        if event.kind == "step":
            fraction, factor = event.arg
            chosen = rng.sample(range(len(self.topics.names)), max(1, int(fraction * len(self.topics.names))))
            for i in chosen:
                b = self.owner[i]
                self._place(i, None)
                self.mult[i] *= factor
                self.step_at[i] = (event.at_s, factor)
                self._place(i, b)
        elif event.kind == "burst":
            count, _within_s = event.arg
            for k in range(count):
                i = new_topic(self.topics, self.spec, self._topic_rng, self.scale, f"/burst/t{k:04d}", event.at_s)
                self.owner.append(None)
                self.mult.append(1.0)
                self.pending.append(i)
                self.burst_topics.add(i)
        elif event.kind == "add_broker":
            broker_id, factor = event.arg
            self.brokers[broker_id] = SimBroker(broker_id, factor)
            self.on[broker_id] = set()
            self.agg[broker_id] = [0.0] * 10
        elif event.kind == "drain":
            self.brokers[event.arg].mode = "draining"
        elif event.kind == "crash":
            s = self.brokers[event.arg]
            s.alive, s.down_at = False, event.at_s
            # the crashed broker was the load manager's leader
            self.leader_changed_at = event.at_s + SESSION_TTL_S

    # -- actions (what algorithms do) ------------------------------------------------------
    def assign(self, i: int, b: str) -> None:
        """Place a new topic."""
        assert self.owner[i] is None and self.brokers[b].alive, (i, b)
        self._place(i, b)
        if i in self.pending:
            self.pending.remove(i)
        if i in self.burst_topics:
            self.metrics.burst[b] += 1

    def move(self, i: int, b: str, kind: str, at: float | None = None) -> float:
        """Move topic ``i`` to ``b`` at ``at`` (default: the step's start; a decision made
        within the step passes its own time). Returns how long the move takes."""
        at = self.now if at is None else at
        src = self.owner[i]
        assert src is not None and src != b and self.brokers[b].alive, (i, src, b)
        event = MoveEvent(at, i, src, b, kind, 0.0)
        if kind in ("auto", "manual", "shed"):
            live = self.balanced_brokers()
            utils = {x: self.utilisation(x) for x in live}
            before = _cv(list(utils.values()))
            work = self.topic_work(i)
            if src in utils:
                utils[src] -= work / self.brokers[src].capacity_bps
            if b in utils:
                utils[b] += work / self.brokers[b].capacity_bps
            event.futile = _cv(list(utils.values())) >= before - 1e-12
            event.pingpong = any(x == b and at - t <= 3600.0 for t, x in self.left.get(i, ()))
        if kind == "failover":  # nothing to seal: the time since the crash, then a load
            duration = self.move_model.seconds(0.0)
            event.seconds = (at - (self.brokers[src].down_at or at)) + duration
        else:
            duration = event.seconds = self.move_model.seconds(self.topic_in(i))
        self.metrics.unavailable_s += event.seconds
        self.left.setdefault(i, []).append((at, src))
        self._place(i, b)
        self.metrics.moves.append(event)
        return duration

    def mark_drained(self, b: str) -> None:
        if not self.on[b]:
            self.brokers[b].mode = "drained"


def _cv(values: list[float]) -> float:
    if not values:
        return 0.0
    mean = sum(values) / len(values)
    if mean <= 0:
        return 0.0
    return math.sqrt(max(sum((v - mean) ** 2 for v in values) / len(values), 0.0)) / mean
