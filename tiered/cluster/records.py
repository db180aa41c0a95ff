"""The load manager's keys and stored records (the runtime's side; the decision core
never sees these, only the :class:`~tiered.cluster.view.ClusterView` built from them).

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

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from tiered.errors import MalformedRecord
from tiered.metadata import keys
from wal.topics import TopicName

LEADER_KEY = "/cluster/leader"
PLACEMENT_PREFIX = "/cluster/placement/"
BROKER_STATE_PREFIX = "/cluster/broker_state/"
LOAD_PREFIX = "/cluster/load/"
HISTORY_PREFIX = "/cluster/rebalancing_history/"
LM_CONFIG_KEY = "/cluster/lm/config"


def placement_key(topic: TopicName | str) -> str:
    t = TopicName.parse(topic)
    return f"{PLACEMENT_PREFIX}{t.namespace}/{t.name}"


def broker_state_key(broker_id: str) -> str:
    return BROKER_STATE_PREFIX + keys._segment("broker id", broker_id)


def load_key(broker_id: str) -> str:
    return LOAD_PREFIX + keys._segment("broker id", broker_id)


def history_key(started_at: float, move_id: str) -> str:
    return f"{HISTORY_PREFIX}{int(started_at * 1000):020d}-{keys._segment('move id', move_id)}"


def broker_from_key(key: str, prefix: str) -> str:
    if not key.startswith(prefix):
        raise MalformedRecord(key, f"key is not under {prefix!r}")
    return key[len(prefix):]


R = TypeVar("R")


def encode(record: Any) -> bytes:
    return json.dumps(asdict(record), sort_keys=True, separators=(",", ":")).encode()


def decode(cls: type[R], key: str, raw: bytes) -> R:
    """Build ``cls`` from JSON, keeping only known fields; missing required fields and
    wrong basic types are :class:`MalformedRecord`."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise MalformedRecord(key, f"not JSON: {e}") from e
    if not isinstance(data, dict):
        raise MalformedRecord(key, f"expected a JSON object, got {type(data).__name__}")
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


@dataclass(frozen=True, slots=True)
class BrokerStateRecord:
    mode: str
    reason: str | None = None
    since: float = 0.0
    by: str | None = None

    def __post_init__(self) -> None:
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

    def topic_reports(self) -> list[TopicReport]:
        out = []
        for item in self.topics:
            if isinstance(item, dict) and isinstance(item.get("topic"), str):
                known = {f.name for f in fields(TopicReport)}
                out.append(TopicReport(**{k: v for k, v in item.items() if k in known}))
        return out


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


@dataclass(frozen=True, slots=True)
class LmOverrides:
    """Operator overrides the leader applies on top of its configuration."""

    paused: bool = False
