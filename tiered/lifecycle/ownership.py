"""Topic ownership with epochs, and broker liveness.

Layout (docs/ARCHITECTURE.md, "Fencing"):

* ``/storage/topics/<ns>/<topic>/owner`` holds an :class:`OwnerRecord`. While a broker
  holds a topic the record is never rewritten, so ``value(owner key) == the bytes this
  broker wrote`` is a compare that fences every write of a stale owner: the moment
  another broker takes over (``epoch + 1``) the bytes differ and the stale write fails.
* Releasing does not delete the record: it writes a *released* record (``released_at``
  set) that keeps the epoch, so epochs grow for the topic's whole life and a released
  record can never equal any holder's bytes.
* ``/cluster/registered/<broker_id>`` is written under the broker's session lease
  (:class:`BrokerSession`). A record held by a broker that is no longer registered
  belongs to a dead broker and may be taken over (failover); a record held by a live
  broker may not, unless the caller forces it (operator override).

Taking ownership is ONE transaction that also checks the revision of the owner record
it read (and of the topic's sealed state, see :func:`acquire`), so two brokers racing
to load a topic produce exactly one winner; the loser gets :class:`OwnershipConflict`
or :class:`TopicOwnedElsewhere`.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tiered.errors import (  # noqa: F401 - OwnershipError re-exported: callers import it from here
    LeaseNotFound, MalformedRecord, OwnershipError, OwnershipLost, StorageError, TopicDeleted, TopicHeld,
)
from tiered.backoff import Backoff
from tiered.logs import FailureLog
from tiered.metadata import keys
from tiered.metadata.base import (
    Compare,
    KeyValue,
    MetadataStore,
    Op,
    Put,
    absent,
    lease_clock,
    mod_revision_is,
    value_is,
)
from tiered.metadata.keys import REGISTERED_PREFIX, registered_key  # noqa: F401 - defined in keys.py; importable from here
from wal.topics import TopicName

log = logging.getLogger(__name__)

SESSION_TTL_S_DEFAULT = 10.0


# -- keys --------------------------------------------------------------------------


def owner_key(topic: TopicName | str) -> str:
    return keys.owner_key(topic)


def unowned_fencing(metadata: MetadataStore, topic: TopicName) -> list[Compare]:
    """Compares that hold while ``topic``'s owner record stays as it is now (absent, or
    released): a writer that does not own the topic fences its writes on them, so they
    fail once any broker takes the topic; :class:`~tiered.errors.TopicHeld` if one holds
    it already (the compares are built from the record they check, in one read). They also hold only while the topic is not
    deleted: a deleted topic raises :class:`~tiered.errors.TopicDeleted` here, and a delete
    that begins later rewrites the owner record, so the fenced write fails."""
    tomb, raw = keys.read_tombstone(metadata, topic)
    if tomb is not None and tomb.blocks:
        raise TopicDeleted(topic, tomb.phase, tomb.next_offset)
    kv = metadata.get(owner_key(topic))
    if kv is not None:
        record = OwnerRecord.decode(kv.key, kv.value)
        if record.holder is not None:
            # Taken since the caller looked: fencing on this record would fence on the
            # new owner's hold, and a write under it would pass as that owner's (atk75 F1).
            raise TopicHeld(topic, record.holder, record.epoch)
    tombstone = [absent(keys.tombstone_key(topic))] if raw is None else [value_is(keys.tombstone_key(topic), raw)]
    return [absent(owner_key(topic)) if kv is None else value_is(kv.key, kv.value), *tombstone]


def _check_broker_id(broker_id: str) -> None:
    # Broker ids become key segments; keys.py owns the segment rule.
    keys.broker_assignments_prefix(broker_id)


def _valid_broker_id(broker_id: str) -> bool:
    try:
        _check_broker_id(broker_id)
    except ValueError:
        return False
    return True


#: At most this many inherited histories in one owner record. Each one takes a takeover
#: (by another broker) that was itself taken over before it opened the topic, so a longer
#: list in a record is damage. The load that finally opens the topic records each one in
#: its mark-open transaction, which etcd caps at 128 operations (``--max-txn-ops``), so
#: this stays well below that. A takeover that would need more is refused
#: (:class:`TooManyUnopenedTakeovers`) rather than forgetting the oldest history: that
#: history's acknowledged offsets would then be renumbered with no loss record.
INHERITS_MAX = 64


def _decode_inherits(key: str, raw: object) -> tuple[tuple[str, int], ...]:
    if not isinstance(raw, list) or len(raw) > INHERITS_MAX:
        raise MalformedRecord(key, f"inherits should be a list of at most {INHERITS_MAX} [broker_id, epoch]")
    pairs = []
    for item in raw:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or not _valid_broker_id(item[0]) or not isinstance(item[1], int) or isinstance(item[1], bool)
                or item[1] < 1):
            raise MalformedRecord(key, f"inherits entry {item!r} is not [broker_id, epoch >= 1]")
        pairs.append((item[0], item[1]))
    return tuple(pairs)


# -- errors ------------------------------------------------------------------------


class TopicOwnedElsewhere(OwnershipError):
    """Another live broker holds the topic."""

    def __init__(self, topic: TopicName, holder: str, epoch: int) -> None:
        super().__init__(f"topic {topic} is owned by live broker {holder!r} (epoch {epoch})")
        self.topic = topic
        self.holder = holder
        self.epoch = epoch


class OwnershipConflict(OwnershipError):
    """The owner record changed between our read and our transaction: another broker
    raced us and won. Not retried here on purpose: the winner owns the topic now."""

    def __init__(self, topic: TopicName, detail: str) -> None:
        super().__init__(f"topic {topic}: lost the ownership race ({detail})")
        self.topic = topic


#: The one ownership-lost error (``tiered.errors.OwnershipLost``), under the name the
#: lifecycle's callers (broker server, harness, tests) import.
OwnershipLostError = OwnershipLost


class TooManyUnopenedTakeovers(OwnershipError):
    """A takeover would have to carry more than :data:`INHERITS_MAX` unrecorded histories:
    that many takeovers in a row failed before opening the topic. Refused, so that no
    history is forgotten. The current holder's own reload still works (a restart inherits
    nothing new): find why every load of the topic fails, then load it on that broker id
    (started again if it is gone)."""

    def __init__(self, topic: TopicName, count: int) -> None:
        super().__init__(f"topic {topic}: taking it over would carry {count} histories of takeovers that "
                         f"never opened it (at most {INHERITS_MAX}); refused so that none is forgotten. "
                         "Find why its loads fail (dnb verify), then load it on its current holder's broker id")
        self.topic = topic
        self.count = count


class BrokerIdInUse(OwnershipError):
    """Another live process is registered under this broker id."""

    def __init__(self, broker_id: str) -> None:
        super().__init__(f"broker id {broker_id!r} is registered by another live process (its lease kept "
                         "being refreshed); two processes with one id would number the same topics twice")
        self.broker_id = broker_id


def _revoke_quietly(metadata: MetadataStore, lease_id: int) -> None:
    try:
        metadata.revoke_lease(lease_id)
    except StorageError as e:
        log.warning("revoking unused lease %x failed (it will expire): %s", lease_id, e)


# -- records -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """The owner record: :class:`tiered.metadata.keys.Ownership`'s fields plus two
    optional ones (readers of ``Ownership`` ignore them). ``broker_id`` is the last
    holder; ``released_at`` set means it let go (sealed), so nobody holds the topic."""

    broker_id: str
    epoch: int
    acquired_at: float
    released_at: float | None = None
    previous_broker_id: str | None = None
    #: Unsealed histories (broker id, epoch) this holder took over and whose loss it must
    #: record (a LostRange each) when it opens the topic. Written by :func:`acquire` in the
    #: same transaction that takes ownership, so a load that fails (or whose acquire reply
    #: is lost) and is retried cannot forget the obligation: the retry inherits it.
    inherits: tuple[tuple[str, int], ...] = ()

    def encode(self) -> bytes:
        body = keys.Ownership(self.broker_id, self.epoch, self.acquired_at).to_json()
        extra: dict[str, object] = {"released_at": self.released_at, "previous_broker_id": self.previous_broker_id}
        if self.inherits:
            extra["inherits"] = [list(pair) for pair in self.inherits]
        return keys.encode_json({**json.loads(body), **extra})

    @classmethod
    def decode(cls, key: str, raw: bytes) -> "OwnerRecord":
        base = keys.Ownership.from_json(key, raw)
        body = json.loads(raw)
        released_at, previous = body.get("released_at"), body.get("previous_broker_id")
        if released_at is not None and not isinstance(released_at, (int, float)):
            raise MalformedRecord(key, f"released_at should be a number, got {released_at!r}")
        if previous is not None and not isinstance(previous, str):
            raise MalformedRecord(key, f"previous_broker_id should be a str, got {previous!r}")
        for name, value in (("broker_id", base.broker_id), ("previous_broker_id", previous)):
            if value is not None and not _valid_broker_id(value):
                raise MalformedRecord(key, f"{name} {value!r} is not a valid broker id")
        return cls(base.broker_id, base.epoch, base.acquired_at, released_at, previous,
                   _decode_inherits(key, body.get("inherits", [])))

    @property
    def holder(self) -> str | None:
        """Who holds the topic now (None once released)."""
        return None if self.released_at is not None else self.broker_id


@dataclass(frozen=True, slots=True)
class OwnerToken:
    """Proof of ownership: the exact bytes written when the topic was taken."""

    topic: TopicName
    broker_id: str
    epoch: int
    held_bytes: bytes
    #: The owner record as it was before we took it (None: the topic was never owned).
    previous: OwnerRecord | None
    revision: int
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def key(self) -> str:
        return owner_key(self.topic)

    @property
    def fencing(self) -> list[Compare]:
        """Compares every write about the topic must include."""
        return [value_is(self.key, self.held_bytes)]


# -- liveness ----------------------------------------------------------------------


def is_broker_registered(metadata: MetadataStore, broker_id: str) -> bool:
    return metadata.get(registered_key(broker_id)) is not None


@dataclass(frozen=True, slots=True)
class TopicOwner:
    """Who serves a topic now: the holder of its owner record and, while that broker is
    registered (alive), the address it advertised (None when it advertised none)."""

    broker_id: str
    epoch: int
    live: bool
    address: str | None


def lookup(metadata: MetadataStore, topic: TopicName | str) -> TopicOwner | None:
    """The topic's current owner (None: nobody holds it, e.g. sealed or never loaded).

    Read from the owner record, the same record every fenced write compares against, so
    the answer names the only broker that can acknowledge writes for the topic; then its
    registration for liveness and address. A client sending to a broker named here that
    no longer owns the topic gets a redirect or TopicMoved, never a silent answer."""
    record, _kv = read_owner(metadata, TopicName.parse(topic))
    if record is None or record.holder is None:
        return None
    kv = metadata.get(registered_key(record.holder))
    address = None
    if kv is not None:
        try:
            found = json.loads(kv.value).get("address")
            address = found if isinstance(found, str) else None
        except (ValueError, AttributeError, RecursionError):
            address = None  # a registration from an older broker or junk: alive, no address
    return TopicOwner(record.holder, record.epoch, kv is not None, address)


def read_owner(metadata: MetadataStore, topic: TopicName) -> tuple[OwnerRecord | None, KeyValue | None]:
    kv = metadata.get(owner_key(topic))
    if kv is None:
        return None, None
    return OwnerRecord.decode(kv.key, kv.value), kv


# -- acquire / release -------------------------------------------------------------


def acquire(
    metadata: MetadataStore,
    topic: TopicName | str,
    broker_id: str,
    *,
    force: bool = False,
    extra_compares: Sequence[Compare] = (),
    extra_ops: Sequence[Op] = (),
) -> OwnerToken:
    """Take ownership of ``topic`` with epoch + 1 in one transaction.

    Allowed when the record is absent, released, held by ``broker_id`` itself (a
    restart) or held by a broker that is no longer registered (it died). ``force``
    takes it from a live broker (operator override; the old owner is fenced).
    ``extra_compares``/``extra_ops`` join the same transaction, e.g. the lifecycle's
    check that the sealed state did not change since it was read.
    """
    topic = TopicName.parse(topic)
    _check_broker_id(broker_id)
    previous, kv = read_owner(metadata, topic)
    compares = [absent(owner_key(topic)) if kv is None else mod_revision_is(kv.key, kv.mod_revision)]
    compares += _holder_compares(metadata, topic, broker_id, previous, force)
    record = OwnerRecord(
        broker_id=broker_id,
        epoch=(previous.epoch if previous else 0) + 1,
        acquired_at=time.time(),
        previous_broker_id=previous.broker_id if previous else None,
        inherits=inherited_histories(previous, broker_id, topic, _opened(metadata, topic, previous)),
    )
    held = record.encode()
    result = metadata.txn([*compares, *extra_compares], [Put(owner_key(topic), held), *extra_ops])
    if not result.succeeded:
        raise OwnershipConflict(topic, f"owner record or guarded keys changed since revision {kv.mod_revision if kv else 0}")
    log.info("topic %s: broker %s took ownership at epoch %d (previous holder %s)",
             topic, broker_id, record.epoch, record.previous_broker_id)
    return OwnerToken(topic, broker_id, record.epoch, held, previous, result.revision)


def inherited_histories(previous: OwnerRecord | None, broker_id: str, topic: TopicName,
                        previous_opened: bool = False) -> tuple[tuple[str, int], ...]:
    """The histories a new holder must account for that no LostRange may record yet:
    nothing after a release (a seal, or a failed load that had nothing to lose); a restart
    by the same broker carries its previous epoch's unfinished obligations; taking a topic
    from another holder adds that holder's history. The lifecycle records each one that
    has no LostRange yet.

    ``previous_opened``: the previous holder's epoch marked the topic open. Its mark-open
    recorded every history it inherited, in the same transaction as the open state, and
    records are never removed while the topic lives, so those are dropped here: the list
    holds only what takeovers that never opened the topic passed on, and it does not grow
    with every successful failover. Never drops a history that may be unrecorded: past
    :data:`INHERITS_MAX` it raises :class:`TooManyUnopenedTakeovers`."""
    if previous is None or previous.holder is None:
        return ()
    carried = () if previous_opened else previous.inherits
    if previous.holder == broker_id:
        return carried
    pairs = tuple(dict.fromkeys([*carried, (previous.broker_id, previous.epoch)]))
    if len(pairs) > INHERITS_MAX:
        raise TooManyUnopenedTakeovers(topic, len(pairs))
    return pairs


def _opened(metadata: MetadataStore, topic: TopicName, previous: OwnerRecord | None) -> bool:
    """Whether the topic's state names the previous holder's epoch: only that epoch's
    mark-open or seal writes it, and a seal comes after a mark-open. Stays true until the
    owner record changes (a delete releases it), which the acquire's transaction compares."""
    if previous is None or previous.holder is None:
        return False
    kv = metadata.get(keys.state_key(topic))
    if kv is None:
        return False
    try:
        state = keys.SealedState.from_json(kv.key, kv.value)
    except MalformedRecord:
        return False
    return state.broker_id == previous.broker_id and state.epoch == previous.epoch


def _holder_compares(
    metadata: MetadataStore, topic: TopicName, broker_id: str, previous: OwnerRecord | None, force: bool
) -> list[Compare]:
    holder = previous.holder if previous else None
    if holder is None or holder == broker_id or force:
        return []
    if is_broker_registered(metadata, holder):
        raise TopicOwnedElsewhere(topic, holder, previous.epoch)  # type: ignore[union-attr]
    # The holder looked dead; make the takeover conditional on it staying dead.
    return [absent(registered_key(holder))]


def release_ops(token: OwnerToken) -> list[Op]:
    """Ops that release ``token`` (run them in a txn guarded by ``token.fencing``)."""
    held = OwnerRecord.decode(token.key, token.held_bytes)
    # Released by a seal (every inherited loss was recorded when the topic opened) or by
    # a failed load that had no unsealed history: nothing left to account for.
    released = OwnerRecord(held.broker_id, held.epoch, held.acquired_at, time.time(), held.previous_broker_id)
    return [Put(token.key, released.encode())]


def release(metadata: MetadataStore, token: OwnerToken) -> None:
    """Release ownership (fenced: a stale token changes nothing)."""
    result = metadata.txn(token.fencing, release_ops(token))
    if not result.succeeded:
        raise OwnershipLostError(token.topic, "release ownership")


def still_owner(metadata: MetadataStore, token: OwnerToken) -> bool:
    kv = metadata.get(token.key)
    return kv is not None and kv.value == token.held_bytes


# -- broker session ----------------------------------------------------------------


class BrokerSession:
    """A lease kept alive by a background thread, with the broker's registration key
    attached. While it lives, other brokers will not take this broker's topics.

    It also tells the host how long the lease is certainly still alive
    (:meth:`remaining_s`): a refresh sent at time ``t`` (:func:`lease_clock`) that succeeded keeps
    the lease until at least ``t + ttl_s`` on the server, whose countdown starts when
    the request arrives, never before it was sent. The host acknowledges ``durable``
    writes only while that remainder exceeds a safety margin, so a paused or
    partitioned broker stops acknowledging before its lease can lapse and another
    broker can take its topics over.

    A lease that lapsed anyway (the server says it is gone) is replaced by a new one
    and the registration written again; ``generation`` counts those, and the host
    re-checks that it still owns each topic before acknowledging under a new one."""

    def __init__(self, metadata: MetadataStore, broker_id: str, ttl_s: float = SESSION_TTL_S_DEFAULT,
                 address: str | None = None) -> None:
        _check_broker_id(broker_id)
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.metadata = metadata
        self.broker_id = broker_id
        self.address = address  # where clients reach this broker (advertised in the registration)
        self.ttl_s = ttl_s
        self.lease_id = 0
        self.generation = 0
        self._valid_until = 0.0  # lease_clock(); 0: no live lease known
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.keepalive_failures = 0
        # First failure with its cause, repeats at most every 30 s, one recovery line.
        self._keepalive_log = FailureLog(log, f"broker {broker_id}: lease keep-alive")

    def start(self) -> "BrokerSession":
        self._register()
        self._thread = threading.Thread(target=self._keepalive, name=f"dnb-session-{self.broker_id}", daemon=True)
        self._thread.start()
        return self

    def _register(self) -> None:
        """Grant a lease and create the registration under it, if nobody else holds it.

        Two live processes with one broker id would both pass the "restart by the same
        broker" rule of :func:`acquire` and number the same topic twice. A registration
        left by a crashed incarnation of this broker lapses within one TTL, so a
        conflicting one is waited out for up to 1.5 TTL; one that stays is another live
        process: :class:`BrokerIdInUse`. A store that is briefly unavailable (a leader
        election, a restart, an overloaded server) is retried for up to one TTL before the
        error is raised: nothing is written before the lease exists."""
        deadline = time.monotonic() + self.ttl_s
        backoff = Backoff(0.05, 1.0)
        while True:
            sent = lease_clock()
            try:
                lease = self.metadata.grant_lease(self.ttl_s)
                break
            except StorageError as e:
                left = deadline - time.monotonic()
                if not e.retryable or left <= 0:
                    raise
                log.info("broker %s: registering: %r; retrying", self.broker_id, e)
                time.sleep(backoff.next_s(left))
        body = json.dumps({"broker_id": self.broker_id, "started_at": time.time(),
                           "address": self.address}).encode()
        key = registered_key(self.broker_id)
        deadline = time.monotonic() + 1.5 * self.ttl_s
        while not self.metadata.txn([absent(key)], [Put(key, body, lease.id)]).succeeded:
            if time.monotonic() >= deadline:
                _revoke_quietly(self.metadata, lease.id)
                raise BrokerIdInUse(self.broker_id)
            time.sleep(min(0.1, self.ttl_s / 10))
        with self._changed:
            self.lease_id = lease.id
            # The generation before the lease: readers without the lock read the lease
            # first (HostedTopic._ownership_certain), so a new lease is never seen with
            # the old generation.
            self.generation += 1
            self._valid_until = sent + self.ttl_s
            self._changed.notify_all()

    def remaining_s(self) -> float:
        """Seconds the lease is certainly still alive on the server (<= 0: maybe not)."""
        return self._valid_until - lease_clock()

    def wait_remaining(self, margin_s: float, timeout_s: float) -> bool:
        """Wait (bounded) until more than ``margin_s`` of the lease is certain."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.remaining_s() <= margin_s:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._changed.wait(min(left, self.ttl_s / 3))
            return True

    def _keepalive(self) -> None:
        # Refresh at a third of the TTL so two missed refreshes still keep the lease.
        interval_s = self.ttl_s / 3
        while not self._stop.wait(interval_s):
            try:
                sent = lease_clock()
                try:
                    self.metadata.refresh_lease(self.lease_id)
                    with self._changed:
                        self._valid_until = sent + self.ttl_s
                        self._changed.notify_all()
                except LeaseNotFound:
                    # Lapsed (this process was paused or cut off longer than the TTL):
                    # other brokers may have taken topics over. Register again; the host
                    # re-checks each topic's owner record before acknowledging.
                    log.warning("broker %s: session lease %x lapsed; registering a new one",
                                self.broker_id, self.lease_id)
                    self._register()
                self._keepalive_log.succeeded()
                self.keepalive_failures = 0
            except StorageError as e:
                self.keepalive_failures += 1
                self._keepalive_log.failed(e, f"failed ({self.remaining_s():.1f}s of the lease certain)")

    def stop(self, revoke: bool = True) -> None:
        """Stop refreshing; ``revoke`` ends the lease now (deregisters the broker)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl_s)
        if revoke:
            with self._changed:
                self._valid_until = 0.0  # nothing is acknowledged under a lease we give up
                self._changed.notify_all()
        if revoke and self.lease_id:
            try:
                self.metadata.revoke_lease(self.lease_id)
            except StorageError as e:
                log.warning("broker %s: revoking lease failed (it will expire): %s", self.broker_id, e)
