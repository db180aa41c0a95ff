"""The simulated workloads: brokers, topics with Zipf-skewed loads, and timed events.

Every number comes from a seeded ``random.Random``: the same seed gives the same topics,
loads, phases and event targets for every algorithm.

A topic's true load at time τ (bytes/s in): ``base · mult · (1 + a · sin(2πτ/day + φ))``,
with ``base`` drawn from Zipf(s) over the topic ranks, ``a`` the workload's daily
amplitude, and ``φ`` one of a few regional phases (a region's topics peak together).
Each consumer reads everything (``out = in · consumers``). A broker's true work is
``Σ (in + out) + 1 KiB/s per connection``; its utilisation is work / capacity, where a
standard broker carries 200 MB/s of work at 100 % CPU and a big one twice that.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

STANDARD_CAPACITY_BPS = 200e6
CONNECTION_COST_BPS = 1024.0
DAY_S = 86_400.0


@dataclass(frozen=True)
class Event:
    at_s: float
    kind: str  # step | burst | add_broker | drain | crash
    arg: object = None


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    #: (broker id, capacity factor): 1.0 standard, 2.0 twice the CPU, memory and NIC.
    brokers: tuple[tuple[str, float], ...]
    topics: int
    duration_s: float
    zipf_s: float = 1.1
    daily_amplitude: float = 0.0
    regions: int = 4
    #: Mean utilisation of the initial brokers at t=0.
    utilisation: float = 0.5
    events: tuple[Event, ...] = field(default_factory=tuple)
    description: str = ""


def _brokers(n: int, big: int) -> tuple[tuple[str, float], ...]:
    return tuple((f"b{i:02d}", 2.0 if i >= n - big else 1.0) for i in range(n))


WORKLOADS: dict[str, WorkloadSpec] = {w.name: w for w in (
    WorkloadSpec("zipf-static", _brokers(10, 3), 5000, 8 * 3600.0,
                 description="10 brokers (3 at 2x), 5,000 Zipf(1.1) topics, steady load, 8 h"),
    WorkloadSpec("diurnal", _brokers(20, 5), 20_000, DAY_S, daily_amplitude=0.6,
                 description="20 brokers (5 at 2x), 20,000 topics, daily waves in 4 regions, 24 h"),
    WorkloadSpec("steps", _brokers(8, 2), 4000, 8 * 3600.0, events=(Event(2 * 3600.0, "step", (0.01, 10.0)),),
                 description="8 brokers (2 at 2x), 4,000 topics, x10 on 1 % of topics at 2 h, 8 h"),
    WorkloadSpec("burst", _brokers(6, 2), 2000, 6 * 3600.0, events=(Event(2 * 3600.0, "burst", (500, 10.0)),),
                 description="6 brokers (2 at 2x), 2,000 topics, 500 new topics within 10 s at 2 h, 6 h"),
    WorkloadSpec("scale", _brokers(5, 1), 3000, 6 * 3600.0,
                 events=(Event(3600.0, "add_broker", ("b05", 2.0)), Event(2 * 3600.0, "drain", "b00"),
                         Event(3 * 3600.0, "crash", "b01")),
                 description="5 brokers (1 at 2x), 3,000 topics; a 2x broker added at 1 h, "
                             "b00 drained at 2 h, b01 (the leader) crashes at 3 h, 6 h"),
    WorkloadSpec("small", _brokers(3, 1), 1000, 6 * 3600.0, daily_amplitude=0.3,
                 description="3 brokers (1 at 2x), 1,000 topics, mild daily wave, 6 h"),
)}


@dataclass
class TopicSet:
    """Per-topic attributes, index-aligned lists (the simulator is pure Python)."""

    names: list[str]
    base_in: list[float]      # bytes/s, before daily wave and steps
    consumers: list[int]
    producers: list[int]
    backlog: list[float]
    cos_phi: list[float]
    sin_phi: list[float]
    created_at: list[float]


def zipf_weight(rank: int, s: float) -> float:
    return rank ** -s


def make_topics(spec: WorkloadSpec, rng: random.Random) -> tuple[TopicSet, float]:
    """The initial topics and the load scale (bytes/s of work per unit of Zipf weight)."""
    n = spec.topics
    ranks = list(range(1, n + 1))
    rng.shuffle(ranks)
    topics = TopicSet([], [], [], [], [], [], [], [])
    weights = []
    for i in range(n):
        weights.append(zipf_weight(ranks[i], spec.zipf_s))
        _append(topics, f"/ns{i % 16:02d}/t{i:05d}", rng, spec, created_at=-DAY_S)
    capacity = sum(STANDARD_CAPACITY_BPS * factor for _, factor in spec.brokers)
    connections = sum(CONNECTION_COST_BPS * (p + c) for p, c in zip(topics.producers, topics.consumers))
    fan = [1 + c for c in topics.consumers]
    # Scale so the initial brokers run at the target utilisation on average.
    scale = (spec.utilisation * capacity - connections) / sum(w for w in weights)
    for i in range(n):
        topics.base_in[i] = scale * weights[i] / fan[i]
    return topics, scale


def new_topic(topics: TopicSet, spec: WorkloadSpec, rng: random.Random, scale: float, name: str,
              created_at: float) -> int:
    """Append a topic whose weight is drawn from the same Zipf law (a random rank)."""
    _append(topics, name, rng, spec, created_at)
    rank = rng.randint(1, spec.topics)
    i = len(topics.names) - 1
    topics.base_in[i] = scale * zipf_weight(rank, spec.zipf_s) / (1 + topics.consumers[i])
    return i


def _append(topics: TopicSet, name: str, rng: random.Random, spec: WorkloadSpec, created_at: float) -> None:
    region = rng.randrange(max(spec.regions, 1))
    phi = 2 * math.pi * region / max(spec.regions, 1) + rng.uniform(-0.3, 0.3)
    topics.names.append(name)
    topics.base_in.append(0.0)
    topics.consumers.append(rng.choice((1, 1, 1, 2, 3)))
    topics.producers.append(rng.randint(1, 3))
    topics.backlog.append(rng.choice((0.0, 0.0, 0.0, rng.uniform(0, 2e5))))
    topics.cos_phi.append(math.cos(phi))
    topics.sin_phi.append(math.sin(phi))
    topics.created_at.append(created_at)
