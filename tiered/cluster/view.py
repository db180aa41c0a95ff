"""What the decision core sees: a frozen snapshot of the cluster, built by the caller.

The runtime builds a :class:`ClusterView` from stored state (registrations, broker modes,
load reports, placement records, unassigned markers, the persisted move history, its own
session health); the simulator builds one from its model. Nothing here reads a clock or
a store: ``now`` is passed to :func:`tiered.cluster.decide` beside the view.

Times are seconds on the caller's clock (wall-clock seconds in production, simulated
seconds in the simulator); only differences between them are used.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tiered.cluster.errors import InvalidView


class BrokerMode(str, enum.Enum):
    """Operator-controlled mode (``/cluster/broker_state/<id>``); liveness is separate."""

    ACTIVE = "active"
    DRAINING = "draining"
    DRAINED = "drained"


class PlacementState(str, enum.Enum):
    """State of a topic's placement record (the authority on where it lives).

    * ``owned``: ``broker`` hosts it.
    * ``assigning``: ``broker`` was told to load it and has not confirmed yet.
    * ``releasing``: ``broker`` was told to seal it; ``target`` gets it once released.
    * ``free``: nobody; an unassigned marker asks for a broker.
    """

    FREE = "free"
    ASSIGNING = "assigning"
    OWNED = "owned"
    RELEASING = "releasing"


class MoveKind(str, enum.Enum):
    AUTO = "auto"          # automatic rebalancing
    MANUAL = "manual"      # an operator's move (or an operator unload the LM completes)
    DRAIN = "drain"        # a draining broker hands its topics over
    FAILOVER = "failover"  # the owner's registration vanished


@dataclass(frozen=True, slots=True)
class TopicLoad:
    """One topic's load, as reported (usually smoothed, see :mod:`tiered.cluster.smoothing`)."""

    msg_rate: float = 0.0
    bytes_in_rate: float = 0.0
    bytes_out_rate: float = 0.0
    producers: float = 0.0
    consumers: float = 0.0
    subscriptions: float = 0.0
    backlog: float = 0.0

    @property
    def connections(self) -> float:
        return self.producers + self.consumers

    @property
    def throughput_bps(self) -> float:
        """Bytes in + out per second."""
        return self.bytes_in_rate + self.bytes_out_rate

    @property
    def throughput_mb_s(self) -> float:
        """Megabytes (10^6 bytes) in + out per second, the unit the seed's formulas use."""
        return self.throughput_bps / 1e6


@dataclass(frozen=True, slots=True)
class BrokerCapacity:
    """What a broker can carry. ``nic_bps`` (bytes/s, each direction) and ``disk_bps``
    (bytes/s) are None when the broker did not say: the weighted_load strategy then
    measures its network and disk use against the cluster's busiest broker instead."""

    cpu_cores: float = 1.0
    mem_bytes: float = 1.0
    nic_bps: float | None = None
    disk_bps: float | None = None


@dataclass(frozen=True, slots=True)
class LoadReport:
    """A broker's resource usage at ``ts`` (smoothed), and which topics the report covered.

    Per-topic numbers are not here but in :attr:`ClusterView.topic_loads`, keyed by topic,
    so they follow a topic when it moves."""

    ts: float
    cpu_pct: float
    mem_pct: float
    capacity: BrokerCapacity = field(default_factory=BrokerCapacity)
    net_in_bps: float = 0.0
    net_out_bps: float = 0.0
    disk_io_bps: float = 0.0
    topics: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: str
    mode: BrokerMode = BrokerMode.ACTIVE
    #: ``/cluster/registered/<id>`` exists (its session lease lives).
    registered: bool = True
    #: When the registration was last seen to vanish (None while registered). After a
    #: leader change the new leader uses the time it first saw it missing.
    unregistered_since: float | None = None
    report: LoadReport | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    topic: str
    state: PlacementState
    #: Owner (owned), assignee (assigning) or source (releasing); None when free.
    broker: str | None
    #: When the topic was created (for ``min_topic_age_s``).
    created_at: float
    #: When the record last changed state (for the assign/release timeouts).
    updated_at: float
    #: Destination chosen at unload time (releasing only).
    target: str | None = None
    #: The source sealed and released ownership (releasing only; from the owner record).
    source_released: bool = False
    move_id: str | None = None
    kind: MoveKind | None = None
    #: Assignments re-put so far in the current ``assigning`` state.
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class UnassignedMarker:
    """``/cluster/unassigned/<ns>/<topic>``: a topic asks for a broker."""

    topic: str
    reason: str = "new"
    from_broker: str | None = None
    to_broker: str | None = None
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class MoveRecord:
    """One entry of ``/cluster/rebalancing_history/``, written when the move starts and
    completed when the topic is owned again; the hourly limit, cooldowns and the ping-pong
    window are computed from these, so they survive leader changes."""

    move_id: str
    topic: str
    from_broker: str | None
    to_broker: str
    kind: MoveKind
    started_at: float
    completed_at: float | None = None
    estimated_load: float = 0.0

    @property
    def last_at(self) -> float:
        return self.started_at if self.completed_at is None else max(self.started_at, self.completed_at)


@dataclass(frozen=True, slots=True)
class LeaderHealth:
    """The leader's own metadata session (the caller's observation, not a clock read)."""

    session_healthy: bool = True
    #: Since when the session has been continuously healthy (None: unknown/unhealthy).
    healthy_since: float | None = None


@dataclass(frozen=True, slots=True)
class MoveRequest:
    """An operator's ``dnb lm move TOPIC [--to BROKER]``."""

    request_id: str
    topic: str
    to_broker: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    brokers: Mapping[str, BrokerInfo]
    placements: Mapping[str, Placement]
    topic_loads: Mapping[str, TopicLoad] = field(default_factory=dict)
    markers: Mapping[str, UnassignedMarker] = field(default_factory=dict)
    history: Sequence[MoveRecord] = ()
    leader: LeaderHealth = field(default_factory=LeaderHealth)
    requests: Sequence[MoveRequest] = ()
    #: A pending operator request for one rebalancing cycle now (its id), if any.
    rebalance_request: str | None = None


@dataclass(frozen=True, slots=True)
class CoreState:
    """What the core remembers between calls (returned in every decision, passed back in).

    Losing it (a new leader) is safe: checks restart their hysteresis from zero and
    round-robin restarts at the lowest broker id; everything that limits moves is derived
    from the persisted history instead."""

    started_at: float | None = None
    last_check_at: float | None = None
    hits: int = 0
    rebalancing: bool = False
    rr_last: str | None = None
    seq: int = 0


def validate(view: ClusterView) -> None:
    """Refuse a view the core cannot reason about; raises :class:`InvalidView`."""
    for key, broker in view.brokers.items():
        if broker.broker_id != key:
            raise InvalidView(f"brokers[{key!r}]", f"broker_id is {broker.broker_id!r}")
        if not broker.registered and broker.unregistered_since is None:
            raise InvalidView(f"brokers[{key!r}]", "unregistered without unregistered_since")
        if broker.report is not None:
            _finite(f"brokers[{key!r}].report", broker.report.ts, broker.report.cpu_pct, broker.report.mem_pct,
                    broker.report.net_in_bps, broker.report.net_out_bps, broker.report.disk_io_bps)
            cap = broker.report.capacity
            for name in ("cpu_cores", "mem_bytes", "nic_bps", "disk_bps"):
                value = getattr(cap, name)
                if value is None and name in ("nic_bps", "disk_bps"):
                    continue  # unknown: measured against the busiest broker
                if not (math.isfinite(value) and value > 0):
                    raise InvalidView(f"brokers[{key!r}].report.capacity.{name}", f"must be > 0, got {value!r}")
    for topic, p in view.placements.items():
        where = f"placements[{topic!r}]"
        if p.topic != topic:
            raise InvalidView(where, f"topic is {p.topic!r}")
        if p.state is PlacementState.FREE:
            continue
        if p.broker is None:
            raise InvalidView(where, f"state {p.state.value} without a broker")
        if p.broker not in view.brokers:
            raise InvalidView(where, f"names broker {p.broker!r}, which the view does not list")
        if p.state is PlacementState.RELEASING:
            if p.target is not None and p.target not in view.brokers:
                raise InvalidView(where, f"target {p.target!r} is not in the view")
    for topic, load in view.topic_loads.items():
        values = (load.msg_rate, load.bytes_in_rate, load.bytes_out_rate, load.producers, load.consumers,
                  load.subscriptions, load.backlog)
        try:  # fast path: a sum of finite non-negative numbers is finite (inf and nan propagate)
            ok = math.isfinite(sum(values)) and min(values) >= 0
        except TypeError:
            ok = False
        if not ok:
            _finite(f"topic_loads[{topic!r}]", *values)
            if min(values) < 0:
                raise InvalidView(f"topic_loads[{topic!r}]", "negative rate or count")
            raise InvalidView(f"topic_loads[{topic!r}]", "rates and counts too large to add up")
    for topic, marker in view.markers.items():
        if marker.topic != topic:
            raise InvalidView(f"markers[{topic!r}]", f"topic is {marker.topic!r}")


def _finite(where: str, *values: float) -> None:
    for value in values:
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidView(where, f"{value!r} is not a finite number")
