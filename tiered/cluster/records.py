"""The load manager's keys and stored records (the runtime's side; the decision core
never sees these, only the :class:`~tiered.cluster.view.ClusterView` built from them).

The keys are built in :mod:`tiered.metadata.keys`:

==================================================  ===========================================
key                                                 value
==================================================  ===========================================
/cluster/leader                                     :class:`LeaderRecord` (leader's lease);
                                                    the term is the key's ``create_revision``
/cluster/placement/<ns>/<topic>                     :class:`PlacementRecord`, the authority
                                                    on where a topic lives (one CAS per change)
/cluster/broker_state/<broker>                      :class:`BrokerStateRecord` (operator mode)
/cluster/load/<broker>                              :class:`LoadReportRecord` (session lease)
/cluster/rebalancing_history/<ms:020d>-<move_id>    :class:`HistoryRecord`
/cluster/lm/config                                  :class:`LmOverrides` (pause/resume)
/cluster/lm/rebalance_request                       :class:`RebalanceRequestRecord`
==================================================  ===========================================

Existing keys it uses: ``/cluster/registered/<b>`` (liveness, read only),
``/cluster/brokers/<b>/<ns>/<t>`` (assignments), ``/cluster/unassigned/<ns>/<t>``
(markers), and the topic's owner/state records under ``/storage/`` (read only: the load
manager never writes ``/storage/*`` or cursors).

None of these keys sit under ``/cluster/brokers/`` (Danube keeps broker state there,
which the assignment watcher would read as a topic).

Records are JSON objects; :func:`decode` raises :class:`~tiered.errors.MalformedRecord`
naming the key. Unknown fields are ignored so newer writers stay readable.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from tiered.errors import MalformedRecord
from tiered.metadata import keys
# Spelled in tiered.metadata.keys with every other key; re-exported as the load
# manager's vocabulary.
from tiered.metadata.keys import (
    BROKER_STATE_PREFIX,
    HISTORY_PREFIX,
    LEADER_KEY,
    LM_CONFIG_KEY,
    LOAD_PREFIX,
    PLACEMENT_PREFIX,
    REBALANCE_REQUEST_KEY,
    broker_from_key,
    broker_state_key,
    history_key,
    load_key,
    placement_key,
)

R = TypeVar("R")


def encode(record: Any) -> bytes:
    return keys.encode_json(asdict(record))


def decode(cls: type[R], key: str, raw: bytes) -> R:
    """Build ``cls`` from JSON, keeping only known fields; missing required fields and
    wrong basic types are :class:`MalformedRecord`."""
    data = keys.decode_json_object(key, raw)
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except (TypeError, ValueError) as e:
        raise MalformedRecord(key, str(e)) from e


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """Who leads. ``nonce`` makes every campaign's bytes unique (a value compare can
    never confuse two terms of the same candidate)."""

    broker_id: str
    elected_at: float
    nonce: str


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """State machine of one topic's placement (see :class:`~tiered.cluster.view.PlacementState`):
    free → assigning → owned → releasing → assigning → owned ...

    ``history_key`` names the history entry of the move under way (completed when the
    topic is owned again)."""

    state: str
    broker: str | None
    created_at: float
    updated_at: float
    target: str | None = None
    move_id: str | None = None
    kind: str | None = None
    attempts: int = 0
    reason: str | None = None
    term: int = 0
    history_key: str | None = None

    def __post_init__(self) -> None:
        if self.state not in ("free", "assigning", "owned", "releasing"):
            raise ValueError(f"unknown placement state {self.state!r}")
        if self.state != "free" and not isinstance(self.broker, str):
            raise ValueError(f"state {self.state} without a broker")
        # Keys are built from these ids (assignments, registrations): a record naming an
        # impossible broker is malformed, skipped and reported, never acted on.
        for name in ("broker", "target"):
            value = getattr(self, name)
            if value is not None and not keys.is_broker_id(value):
                raise ValueError(f"{name} {value!r} is not a broker id")
        if not (_rate(self.created_at) and _rate(self.updated_at) and _count(self.attempts) and _count(self.term)):
            raise ValueError("created_at/updated_at must be times, attempts/term counts")
        for name in ("target", "move_id", "kind", "reason", "history_key"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string or null")


@dataclass(frozen=True, slots=True)
class BrokerStateRecord:
    mode: str
    reason: str | None = None
    since: float = 0.0
    by: str | None = None

    def __post_init__(self) -> None:
        if not _rate(self.since):
            raise ValueError("since must be a time")
        if self.mode not in ("active", "draining", "drained"):
            raise ValueError(f"unknown broker mode {self.mode!r}")


@dataclass(frozen=True, slots=True)
class TopicReport:
    topic: str
    epoch: int = 0
    msg_in_rate: float = 0.0
    bytes_in_rate: float = 0.0
    bytes_out_rate: float = 0.0
    producers: float = 0.0
    consumers: float = 0.0
    subscriptions: float = 0.0
    backlog: float = 0.0


@dataclass(frozen=True, slots=True)
class LoadReportRecord:
    """A broker's load at ``ts`` (its wall clock), written under its session lease so
    it vanishes with the broker. Rates are per second over the last interval."""

    broker_id: str
    seq: int
    ts: float
    cpu_pct: float = 0.0
    mem_pct: float = 0.0
    cpu_cores: float = 1.0
    mem_bytes: float = 1.0
    net_in_bps: float = 0.0
    net_out_bps: float = 0.0
    topics: list = field(default_factory=list)  # list[dict] of TopicReport fields
    #: The process's disk reads + writes, bytes/s over the interval.
    disk_io_bps: float = 0.0
    #: The broker's network (each direction) and disk capacity, bytes/s; null: unknown.
    nic_bps: float | None = None
    disk_bps: float | None = None

    def __post_init__(self) -> None:
        # A bad report must be skipped, never reach the decision core (which refuses a view
        # holding one, and would stall every step on it). Every number has a ceiling no
        # real broker reaches: sums and squares of a few thousand of them stay finite.
        if not isinstance(self.broker_id, str) or not _count(self.seq):
            raise ValueError("broker_id must be a string and seq a non-negative integer")
        for name, ceiling in (("ts", TIME_MAX), ("cpu_pct", 100.0), ("mem_pct", 100.0), ("net_in_bps", RATE_MAX),
                              ("net_out_bps", RATE_MAX), ("disk_io_bps", RATE_MAX)):
            if not _rate(getattr(self, name), ceiling):
                raise ValueError(f"{name} must be a number in [0, {ceiling:g}], got {getattr(self, name)!r}")
        for name, ceiling in (("cpu_cores", CORES_MAX), ("mem_bytes", RATE_MAX)):
            if not _rate(getattr(self, name), ceiling) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a number in (0, {ceiling:g}], got {getattr(self, name)!r}")
        for name in ("nic_bps", "disk_bps"):
            value = getattr(self, name)
            if value is not None and (not _rate(value, RATE_MAX) or value <= 0):
                raise ValueError(f"{name} must be null or a number in (0, {RATE_MAX:g}], got {value!r}")
        if not isinstance(self.topics, list):
            raise ValueError("topics must be a list")

    def topic_reports(self) -> list[TopicReport]:
        """The well-formed topic entries (a malformed entry is dropped, not trusted)."""
        known = {f.name for f in fields(TopicReport)}
        out = []
        for item in self.topics:
            if not isinstance(item, dict) or not isinstance(item.get("topic"), str):
                continue
            values = {k: v for k, v in item.items() if k in known}
            if all(_rate(v, RATE_MAX) for k, v in values.items() if k != "topic"):
                out.append(TopicReport(**values))
        return out


#: Ceilings of what a load report may say (a value above is malformed): rates in bytes or
#: messages per second and counts up to 10^15 (a petabyte per second), times up to 10^11 s
#: (year 5138), a million cores. Far beyond any broker, far below where a sum of thousands
#: of them, or its square, overflows a float.
RATE_MAX = 1e15
TIME_MAX = 1e11
CORES_MAX = 1e6


def _rate(value: Any, ceiling: float = math.inf) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 <= value <= ceiling


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One move (seed fields plus ours); written when it starts, completed when the
    topic is owned again. The hourly limit and cooldowns are computed from these."""

    move_id: str
    topic: str
    from_broker: str | None
    to_broker: str
    kind: str
    reason: str
    started_at: float
    term: int
    estimated_load: float = 0.0
    completed_at: float | None = None
    timestamp: float = 0.0

    def __post_init__(self) -> None:
        for name in ("move_id", "topic", "to_broker", "kind", "reason"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string")
        if not (_rate(self.started_at, TIME_MAX) and _rate(self.estimated_load, RATE_MAX)) or \
                (self.completed_at is not None and not _rate(self.completed_at, TIME_MAX)):
            raise ValueError("started_at/completed_at must be times, estimated_load a number >= 0")


@dataclass(frozen=True, slots=True)
class LmOverrides:
    """Operator overrides the leader applies on top of its configuration."""

    paused: bool = False


@dataclass(frozen=True, slots=True)
class RebalanceRequestRecord:
    """``dnb cluster rebalance``: an operator asks for one rebalancing cycle now.

    The operator writes it ``pending`` (create-if-absent, or over an answered one); the
    leader answers it in place (``answered``) in a transaction fenced by its leader
    record and compared on the request's ``mod_revision``. When the cycle moves a topic,
    the answer lands in the same transaction as the move, so a request is answered at
    most once and never makes two moves, whichever leader sees it. An operator that
    stops waiting deletes its still-pending request (compared on its revision)."""

    request_id: str
    requested_at: float
    by: str | None = None
    state: str = "pending"
    #: "moved", or why nothing moved (the check's skip reason).
    outcome: str | None = None
    moves: list = field(default_factory=list)  # list[dict]: topic, from, to, cv_before, cv_after
    term: int = 0
    answered_at: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not _rate(self.requested_at):
            raise ValueError("request_id must be a string and requested_at a time")
        if self.state not in ("pending", "answered"):
            raise ValueError(f"unknown request state {self.state!r}")
        if not isinstance(self.moves, list):
            raise ValueError("moves must be a list")
