"""The metadata key layout and its typed records: the only place keys are spelled.

Every key is built from a validated :class:`wal.topics.TopicName` (a raw string is
parsed, and rejected, first), so a hostile topic name can never address another
topic's keys or escape a prefix. Subscription names and broker ids follow the same
segment rule (1-128 of ``[A-Za-z0-9._-]``, not ``.``/``..``).

=====================================================  ==============================
key                                                    value
=====================================================  ==============================
/storage/topics/<ns>/<topic>/objects/<start:020d>      :class:`ObjectDescriptor`
/storage/topics/<ns>/<topic>/state                     :class:`SealedState`
/storage/topics/<ns>/<topic>/owner                     :class:`Ownership` (fencing)
/storage/topics/<ns>/<topic>/progress                  the owner's durable tip (lifecycle)
/storage/topics/<ns>/<topic>/tombstone                 :class:`TopicTombstone` (topic delete)
/storage/topics/<ns>/<topic>/archive_start             :class:`ArchiveStart` (archive retention)
/topics/<ns>/<topic>/subscriptions/<name>/cursor       :class:`Cursor`
/topics/<ns>/<topic>/delivery                          delivery settings (opaque here)
/cluster/brokers/<broker_id>/<ns>/<topic>              :class:`Assignment`
/cluster/unassigned/<ns>/<topic>                       :class:`Unassigned`
/cluster/registered/<broker_id>                        a broker's registration (lifecycle)
/cluster/leader                                        the load manager leader's lease
/cluster/placement/<ns>/<topic>                        where a topic lives (load manager)
/cluster/broker_state/<broker_id>                      a broker's operator mode (load manager)
/cluster/load/<broker_id>                              a broker's load report (load manager)
/cluster/rebalancing_history/<ms:020d>-<move_id>       one move's history (load manager)
/cluster/lm/config                                     load manager overrides (pause/resume)
=====================================================  ==============================

The load manager's records are typed in :mod:`tiered.cluster.records`.

Lost ranges (one per failover) live at
``/storage/topics/<ns>/<topic>/lost/<start:020d>-<epoch:020d>`` as :class:`LostRange`.

Object keys (in the object store, not in metadata) are built and parsed in
:mod:`tiered.archive.naming`: ``<ns>/<topic>/<object_id>.dnb1`` relative to the store's
prefix, with the ``object_id`` a descriptor records (``data-<start>-<end>-e<epoch>``).

Records are JSON objects. ``from_json(key, raw)`` validates types and invariants and
raises :class:`~tiered.errors.MalformedRecord` naming the key and the problem;
unknown fields are ignored so newer writers stay readable.
"""
from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeVar

from tiered.errors import MalformedRecord
from native.format import MAX_OFFSET
from wal.topics import TopicName

OFFSET_DIGITS = 20
_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
# Long enough for ``data-<start>-<end>-e<epoch>-<nonce>`` with 20-digit numbers.
OBJECT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,100}")
#: ``data-<start>-<end>[-e<epoch>[-<nonce>]]``: the uploader's object ids (tiered.archive.naming).
_DATA_ID_RE = re.compile(r"data-(\d{1,20})-(\d{1,20})(?:-[A-Za-z0-9_-]*)?")
_BLOCK_CRCS_RE = re.compile(r"(?:[0-9a-f]{8})+")

R = TypeVar("R", bound="_Record")


def _topic(topic: TopicName | str) -> TopicName:
    return TopicName.parse(topic)


def _segment(kind: str, value: str) -> str:
    if not isinstance(value, str) or value in (".", "..") or not _SEGMENT_RE.fullmatch(value):
        raise ValueError(f"{kind} {value!r} must be 1-128 characters of [A-Za-z0-9._-]")
    return value


#: The largest NEXT offset: one past the last message of a full topic (the WAL assigns
#: offsets up to MAX_OFFSET and then refuses with OffsetOverflow). Records and keys that
#: name where numbering goes on (a tombstone's next offset, a lost range's start) may
#: hold it, so a full topic can still be deleted or taken over; a message's offset never
#: does.
NEXT_OFFSET_MAX = MAX_OFFSET + 1


def _offset(offset: int, limit: int = MAX_OFFSET) -> str:
    if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= limit:
        raise ValueError(f"offset must be an int in [0, {limit}], got {offset!r}")
    return f"{offset:0{OFFSET_DIGITS}d}"


# -- keys -----------------------------------------------------------------
#: Every topic's storage records (descriptors, state, owner, progress, lost ranges).
STORAGE_TOPICS_PREFIX = "/storage/topics/"
#: Everything about brokers and placement (assignments, registrations, the load manager).
CLUSTER_PREFIX = "/cluster/"


def storage_prefix(topic: TopicName | str) -> str:
    t = _topic(topic)
    return f"{STORAGE_TOPICS_PREFIX}{t.namespace}/{t.name}/"


def objects_prefix(topic: TopicName | str) -> str:
    return storage_prefix(topic) + "objects/"


def descriptor_key(topic: TopicName | str, start_offset: int) -> str:
    return objects_prefix(topic) + _offset(start_offset)


def descriptor_start_offset(key: str) -> int:
    """Start offset encoded in a descriptor key (validated)."""
    tail = key.rsplit("/", 1)[-1]
    if len(tail) != OFFSET_DIGITS or not tail.isdigit():
        raise MalformedRecord(key, "descriptor key does not end in a 20-digit offset")
    return int(tail)


def state_key(topic: TopicName | str) -> str:
    return storage_prefix(topic) + "state"


def owner_key(topic: TopicName | str) -> str:
    return storage_prefix(topic) + "owner"


def progress_key(topic: TopicName | str) -> str:
    """The owner's published durable tip (a ``Progress`` record of the lifecycle)."""
    return storage_prefix(topic) + "progress"


def archive_start_key(topic: TopicName | str) -> str:
    """The first offset the archive retains (an :class:`ArchiveStart`; absent: 0). Only the
    owner raises it, fenced (``uploader/archive_retention.py``); it never goes down."""
    return storage_prefix(topic) + "archive_start"


def lost_prefix(topic: TopicName | str) -> str:
    return storage_prefix(topic) + "lost/"


def lost_key(topic: TopicName | str, start_offset: int, epoch: int) -> str:
    """One record per failover: the new owner restarted numbering at ``start_offset`` after
    the owner of ``epoch`` died. The epoch is in the key because two failovers can restart
    at the same offset (nothing archived in between), each losing its own owner's tail."""
    return lost_prefix(topic) + f"{_offset(start_offset, NEXT_OFFSET_MAX)}-{_offset(epoch)}"


def tombstone_key(topic: TopicName | str) -> str:
    """The topic's :class:`TopicTombstone`: written first by a delete, kept afterwards
    (the last epoch and next offset a re-created topic continues from)."""
    return storage_prefix(topic) + "tombstone"


def topic_prefix(topic: TopicName | str) -> str:
    t = _topic(topic)
    return f"/topics/{t.namespace}/{t.name}/"


def subscriptions_prefix(topic: TopicName | str) -> str:
    return topic_prefix(topic) + "subscriptions/"


def cursor_key(topic: TopicName | str, subscription: str) -> str:
    return subscriptions_prefix(topic) + f"{_segment('subscription', subscription)}/cursor"


def delivery_key(topic: TopicName | str) -> str:
    return topic_prefix(topic) + "delivery"


ASSIGNMENTS_PREFIX = "/cluster/brokers/"


def broker_assignments_prefix(broker_id: str) -> str:
    return f"{ASSIGNMENTS_PREFIX}{_segment('broker id', broker_id)}/"


def topic_assignments(metadata: Any, topic: TopicName | str) -> list[str]:
    """Broker ids ``topic`` is assigned to (normally zero or one)."""
    t = _topic(topic)
    found = []
    for kv in metadata.range(ASSIGNMENTS_PREFIX):
        broker, _, rest = kv.key[len(ASSIGNMENTS_PREFIX):].partition("/")
        if rest == f"{t.namespace}/{t.name}":
            found.append(broker)
    return found


def assignment_key(broker_id: str, topic: TopicName | str) -> str:
    t = _topic(topic)
    return broker_assignments_prefix(broker_id) + f"{t.namespace}/{t.name}"


REGISTERED_PREFIX = "/cluster/registered/"


def registered_key(broker_id: str) -> str:
    """A live broker's registration (under its session lease; its advertised address)."""
    return REGISTERED_PREFIX + _segment("broker id", broker_id)


UNASSIGNED_PREFIX = "/cluster/unassigned/"


def unassigned_key(topic: TopicName | str) -> str:
    t = _topic(topic)
    return UNASSIGNED_PREFIX + f"{t.namespace}/{t.name}"


LEADER_KEY = "/cluster/leader"
PLACEMENT_PREFIX = "/cluster/placement/"
BROKER_STATE_PREFIX = "/cluster/broker_state/"
LOAD_PREFIX = "/cluster/load/"
HISTORY_PREFIX = "/cluster/rebalancing_history/"
LM_CONFIG_KEY = "/cluster/lm/config"
#: An operator's request for one rebalancing cycle now, answered in place by the leader.
REBALANCE_REQUEST_KEY = "/cluster/lm/rebalance_request"


def placement_key(topic: TopicName | str) -> str:
    t = _topic(topic)
    return f"{PLACEMENT_PREFIX}{t.namespace}/{t.name}"


def broker_state_key(broker_id: str) -> str:
    return BROKER_STATE_PREFIX + _segment("broker id", broker_id)


def load_key(broker_id: str) -> str:
    return LOAD_PREFIX + _segment("broker id", broker_id)


def history_key(started_at: float, move_id: str) -> str:
    return f"{HISTORY_PREFIX}{int(started_at * 1000):020d}-{_segment('move id', move_id)}"


def broker_from_key(key: str, prefix: str) -> str:
    """The broker id a key under ``prefix`` names (MalformedRecord if it is not under it
    or does not end in a valid broker id: keys are built from it again)."""
    if not key.startswith(prefix):
        raise MalformedRecord(key, f"key is not under {prefix!r}")
    return check_broker_id(key[len(prefix):], key)


def check_broker_id(value: object, key: str) -> str:
    """``value`` if it is a valid broker id, else MalformedRecord naming ``key``: an id read
    from a stored key or record, which a buggy or hostile writer may have put there."""
    if not is_broker_id(value):
        raise MalformedRecord(key, f"broker id {value!r} must be 1-128 characters of [A-Za-z0-9._-]")
    return value  # type: ignore[return-value]


def is_broker_id(value: object) -> bool:
    """Whether ``value`` can name a broker (and so a key segment)."""
    return isinstance(value, str) and value not in (".", "..") and _SEGMENT_RE.fullmatch(value) is not None


def topic_from_key(key: str, prefix: str) -> TopicName:
    """The topic at the end of an assignment/unassigned key under ``prefix``."""
    if not key.startswith(prefix):
        raise MalformedRecord(key, f"key is not under {prefix!r}")
    try:
        return TopicName.parse("/" + key[len(prefix):])
    except ValueError as e:
        raise MalformedRecord(key, f"bad topic in key: {e}") from e


# -- records --------------------------------------------------------------
def _is_int(v: Any) -> bool:
    """A JSON integer that a signed 64-bit store holds: offsets never pass MAX_OFFSET
    (2**63 - 1), so a record claiming more is malformed, not a huge topic."""
    return isinstance(v, int) and not isinstance(v, bool) and -MAX_OFFSET - 1 <= v <= MAX_OFFSET


_CHECKS: dict[str, Callable[[object], bool]] = {
    "int": _is_int,
    "int|None": lambda v: v is None or _is_int(v),
    # A next offset (NEXT_OFFSET_MAX): never negative, at most one past MAX_OFFSET.
    "next": lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= NEXT_OFFSET_MAX,
    "str": lambda v: isinstance(v, str),
    "str|None": lambda v: v is None or isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    # Finite only: NaN or an infinity is no time (and no JSON a strict reader takes).
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "number|None": lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)
                                           and math.isfinite(v)),
}


def encode_json(body: Mapping[str, object]) -> bytes:
    """The stored bytes of a JSON record: sorted keys, no spaces (every record written
    through here has one byte form, so a value compare can match it)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_json_object(key: str, raw: bytes) -> dict[str, object]:
    """``raw`` parsed as a JSON object; anything else is :class:`MalformedRecord` naming ``key``."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise MalformedRecord(key, f"not JSON: {e!r}") from e
    if not isinstance(data, dict):
        raise MalformedRecord(key, f"expected a JSON object, got {type(data).__name__}")
    return data


class _Record:
    """JSON (de)serialisation with per-field type checks and an invariant hook."""

    _TYPES: ClassVar[dict[str, str]] = {}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> bytes:
        """The record's bytes; ValueError (nothing written) for a record its own reader
        would refuse as malformed: the same type checks and bounds as ``from_json``."""
        values = asdict(self)  # type: ignore[call-overload]
        for name, value in values.items():
            if value is None and name in self._OPTIONAL:
                continue
            if not _CHECKS[self._TYPES[name]](value):
                raise ValueError(f"refusing to write invalid {type(self).__name__}: field {name!r} should be "
                                 f"{self._TYPES[name]}, got {value!r}")
        problem = self._problem()
        if problem:
            raise ValueError(f"refusing to write invalid {type(self).__name__}: {problem}")
        return encode_json(values)

    @classmethod
    def from_json(cls: type[R], key: str, raw: bytes) -> R:
        data = decode_json_object(key, raw)
        values: dict[str, object] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                if f.name in cls._OPTIONAL:
                    continue
                raise MalformedRecord(key, f"missing field {f.name!r}")
            if not _CHECKS[cls._TYPES[f.name]](data[f.name]):
                raise MalformedRecord(key, f"field {f.name!r} should be {cls._TYPES[f.name]}, got {data[f.name]!r}")
            values[f.name] = data[f.name]
        record = cls(**values)
        problem = record._problem()
        if problem:
            raise MalformedRecord(key, problem)
        return record

    def _problem(self) -> str | None:
        return None


@dataclass(frozen=True, slots=True)
class ObjectDescriptor(_Record):
    """One archived object: offsets ``start_offset..end_offset`` (inclusive).

    ``size`` is the object's exact length and ``footer_crc32c`` / ``block_crc32c`` its
    content digest (``native.object_format.object_digest``): readers serve nothing from an
    object that does not match them. Both digest fields are required: a descriptor without
    them cannot be checked, so it is malformed rather than trusted.
    """

    start_offset: int
    end_offset: int
    object_id: str
    size: int
    etag: str
    created_at: float
    broker_id: str
    epoch: int
    footer_crc32c: int
    block_crc32c: str
    format: str = "dnb1"
    compression: str | None = None

    _TYPES: ClassVar[dict[str, str]] = {
        "start_offset": "int", "end_offset": "int", "object_id": "str", "size": "int", "etag": "str",
        "created_at": "number", "broker_id": "str", "epoch": "int", "footer_crc32c": "int",
        "block_crc32c": "str", "format": "str", "compression": "str|None",
    }  # fmt: skip
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"format", "compression"})

    def _problem(self) -> str | None:
        if self.start_offset < 0:
            return f"start_offset {self.start_offset} is negative"
        if self.end_offset < self.start_offset:
            return f"end_offset {self.end_offset} < start_offset {self.start_offset}"
        if self.size <= 0:
            return f"size {self.size} is not positive"
        if not OBJECT_ID_RE.fullmatch(self.object_id):
            return f"object_id {self.object_id!r} is not 1-100 of [A-Za-z0-9_-]"
        if self.object_id.startswith("data-"):
            # The uploader's ids name the object's range: one naming another range would
            # point this descriptor at another range's object.
            named = _DATA_ID_RE.fullmatch(self.object_id)
            if named is None or named.groups() != (str(self.start_offset), str(self.end_offset)):
                return f"object_id {self.object_id!r} does not name offsets {self.start_offset}-{self.end_offset}"
        if self.epoch < 0:
            return f"epoch {self.epoch} is negative"
        if not 0 <= self.footer_crc32c < 1 << 32:
            return f"footer_crc32c {self.footer_crc32c} is not a 32-bit CRC"
        if not _BLOCK_CRCS_RE.fullmatch(self.block_crc32c):
            return "block_crc32c is not 8 lowercase hex digits per block"
        return None

    def check_key(self, key: str) -> "ObjectDescriptor":
        """Assert the descriptor sits under the key its start offset names."""
        if descriptor_start_offset(key) != self.start_offset:
            raise MalformedRecord(key, f"key offset differs from start_offset {self.start_offset}")
        return self


@dataclass(frozen=True, slots=True)
class SealedState(_Record):
    """Seal written when a topic is unloaded.

    ``last_committed_offset`` is None when the topic never had a message: the next
    owner starts at 0 (not at 1).
    """

    sealed: bool
    last_committed_offset: int | None
    broker_id: str
    timestamp: float
    #: The owner epoch that wrote it (None in records from before it was kept): a local WAL
    #: marked with an older epoch of the same broker is not the history this one continued.
    epoch: int | None = None
    #: The id (``.walid``, hex) of the WAL the open epoch wrote (open states only; None in
    #: records from before it was kept): a load tells that history's WAL from another WAL
    #: of the same broker by it, whatever its ``.owner`` marker says or whether it reads.
    wal_id: str | None = None

    _TYPES: ClassVar[dict[str, str]] = {
        "sealed": "bool", "last_committed_offset": "int|None", "broker_id": "str", "timestamp": "number",
        "epoch": "int|None", "wal_id": "str|None",
    }  # fmt: skip
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"epoch", "wal_id"})

    def _problem(self) -> str | None:
        if self.last_committed_offset is not None and self.last_committed_offset < 0:
            return f"last_committed_offset {self.last_committed_offset} is negative (use null for empty)"
        return None

    @property
    def next_offset(self) -> int:
        return 0 if self.last_committed_offset is None else self.last_committed_offset + 1


@dataclass(frozen=True, slots=True)
class ArchiveStart(_Record):
    """The archive's first retained offset, raised by archive retention.

    Every offset below ``first_offset`` is gone from the archive for good: readers asking
    for one get ``OffsetBelowRetention`` naming ``first_offset``. It always names a
    descriptor boundary (the descriptor starting there existed when it was written) and
    never passes the chain's last descriptor. ``broker_id``/``epoch`` name the owner that
    raised it.
    """

    first_offset: int
    broker_id: str
    epoch: int
    timestamp: float

    _TYPES: ClassVar[dict[str, str]] = {
        "first_offset": "int", "broker_id": "str", "epoch": "int", "timestamp": "number",
    }  # fmt: skip

    def _problem(self) -> str | None:
        if self.first_offset < 0:
            return f"first_offset {self.first_offset} is negative"
        if self.epoch < 0:
            return f"epoch {self.epoch} is negative"
        return None


@dataclass(frozen=True, slots=True)
class Cursor(_Record):
    """Last acknowledged offset of a subscription; -1 = nothing acknowledged yet.

    -1 is a real position, not "no cursor": a subscription that started on an empty topic
    (or whose cursor a failover clamped to before offset 0) resumes at 0, whereas a missing
    cursor means "start at the subscribe-time initial position" (latest by default), which
    would skip whatever was written in between."""

    last_acked_offset: int

    _TYPES: ClassVar[dict[str, str]] = {"last_acked_offset": "int"}

    def _problem(self) -> str | None:
        return None if self.last_acked_offset >= -1 else "last_acked_offset is below -1"


@dataclass(frozen=True, slots=True)
class LostRange(_Record):
    """Offsets a dead owner made durable but never archived, reassigned after a failover.

    Written first by the broker that took over (``exact: false``: ``end_offset`` is the
    dead owner's last *published* durable tip, a lower bound, or null when it published
    none past ``start_offset``), then rewritten by the dead owner when it comes back and
    quarantines its WAL (``exact: true``: ``end_offset`` is its durable tip, null when it
    held nothing past ``start_offset``; ``quarantine_path`` names where the WAL went).
    A third writer is an operator discarding a WAL that does not open (``exact: false``
    with a ``quarantine_path``: the range from ``start_offset`` on is unknown unless the
    epoch's published tip says "at least", and the unreadable files are kept at that
    path). ``broker_id``/``epoch`` name the owner whose WAL held the offsets. A record
    never shrinks; once it names a quarantine path, another copy of that history can only
    lengthen it (``exact: false``), and the path stays the first WAL's.
    """

    start_offset: int
    end_offset: int | None
    broker_id: str
    epoch: int
    exact: bool
    quarantine_path: str | None
    reported_by: str
    timestamp: float
    #: The ``.walid`` (hex) of the WAL moved to ``quarantine_path``, when it read: another
    #: copy of that WAL, or the rest of it after an interrupted move, is then known to be
    #: given up from metadata alone, whatever the quarantine directory still says.
    wal_id: str | None = None

    _TYPES: ClassVar[dict[str, str]] = {
        "start_offset": "next", "end_offset": "int|None", "broker_id": "str", "epoch": "int", "exact": "bool",
        "quarantine_path": "str|None", "reported_by": "str", "timestamp": "number", "wal_id": "str|None",
    }  # fmt: skip
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"wal_id"})

    def _problem(self) -> str | None:
        if self.start_offset < 0:
            return f"start_offset {self.start_offset} is negative"
        if self.end_offset is not None and self.end_offset < self.start_offset:
            return f"end_offset {self.end_offset} < start_offset {self.start_offset} (use null for none lost)"
        if self.epoch < 0:
            return f"epoch {self.epoch} is negative"
        return None

    @property
    def count(self) -> int:
        """How many offsets were lost (0: none)."""
        return 0 if self.end_offset is None else self.end_offset - self.start_offset + 1

    def check_key(self, key: str) -> "LostRange":
        """Assert the record sits under the key its start offset and epoch name."""
        tail = key.rsplit("/", 1)[-1]
        if tail != f"{self.start_offset:0{OFFSET_DIGITS}d}-{self.epoch:0{OFFSET_DIGITS}d}":
            raise MalformedRecord(key, f"key differs from start_offset {self.start_offset} / epoch {self.epoch}")
        return self


def read_lost_ranges(metadata: Any, topic: TopicName | str) -> list[LostRange]:
    """Every lost-range record of ``topic``, ascending by start offset (MalformedRecord on junk)."""
    return [LostRange.from_json(kv.key, kv.value).check_key(kv.key) for kv in metadata.range(lost_prefix(topic))]


@dataclass(frozen=True, slots=True)
class Ownership(_Record):
    """Who owns a topic. Immutable while held: a write fenced with
    ``value_is(owner_key, held.to_json())`` fails once another broker took over
    with ``epoch + 1``."""

    broker_id: str
    epoch: int
    acquired_at: float

    _TYPES: ClassVar[dict[str, str]] = {"broker_id": "str", "epoch": "int", "acquired_at": "number"}

    def _problem(self) -> str | None:
        return None if self.epoch >= 0 else f"epoch {self.epoch} is negative"

    def successor(self, broker_id: str) -> "Ownership":
        return Ownership(broker_id, self.epoch + 1, time.time())


@dataclass(frozen=True, slots=True)
class Assignment(_Record):
    """Value under ``/cluster/brokers/<broker>/<ns>/<topic>``."""

    assigned_at: float
    reason: str | None = None

    _TYPES: ClassVar[dict[str, str]] = {"assigned_at": "number", "reason": "str|None"}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"reason"})


@dataclass(frozen=True, slots=True)
class Unassigned(_Record):
    """Value under ``/cluster/unassigned/<ns>/<topic>``."""

    reason: str
    from_broker: str | None
    to_broker: str | None = None

    _TYPES: ClassVar[dict[str, str]] = {"reason": "str", "from_broker": "str|None", "to_broker": "str|None"}
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"to_broker"})


#: Tombstone phases: deleting (written first, before anything is removed), deleted (every
#: record and object of the topic is gone), recreated (the name is in use again, numbering
#: continued at ``next_offset``; kept as the new incarnation's first offset).
TOMBSTONE_PHASES = ("deleting", "deleted", "recreated")


@dataclass(frozen=True, slots=True)
class TopicTombstone(_Record):
    """A topic delete, written under compare-and-swap before anything is removed.

    ``epoch`` is the last ownership epoch of the deleted incarnation and ``next_offset``
    the first offset it never used as far as metadata knew when the tombstone was written
    (seal, chain end, published durable tip, lost ranges): a topic created again under the
    same name takes ownership at a higher epoch and numbers from ``next_offset`` on, so a
    zombie owner of the old incarnation stays fenced. A dead owner's offsets acknowledged
    ``durable`` past its last published tip may lie at or above ``next_offset`` (the bound
    a failover has too); a stale local WAL of it is never resumed nor recorded as a loss of
    the new incarnation (``tiered.lifecycle.retire``).
    """

    phase: str
    epoch: int
    next_offset: int
    deleted_by: str
    deleted_at: float
    recreated_at: float | None = None

    _TYPES: ClassVar[dict[str, str]] = {
        "phase": "str", "epoch": "int", "next_offset": "next", "deleted_by": "str", "deleted_at": "number",
        "recreated_at": "number|None",
    }  # fmt: skip
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"recreated_at"})

    def _problem(self) -> str | None:
        if self.phase not in TOMBSTONE_PHASES:
            return f"phase {self.phase!r} is not one of {TOMBSTONE_PHASES}"
        if self.epoch < 0:
            return f"epoch {self.epoch} is negative"
        if self.next_offset < 0:
            return f"next_offset {self.next_offset} is negative"
        return None

    @property
    def blocks(self) -> bool:
        """The name is deleted (or being deleted): nothing may load, write or read it."""
        return self.phase != "recreated"


def read_tombstone(metadata: Any, topic: TopicName | str) -> tuple[TopicTombstone | None, bytes | None]:
    """(the topic's tombstone, its stored bytes for a compare); (None, None) when absent."""
    kv = metadata.get(tombstone_key(topic))
    if kv is None:
        return None, None
    return TopicTombstone.from_json(kv.key, kv.value), kv.value
