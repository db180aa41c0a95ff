"""Subscription cursors: resume where a consumer left off, on whichever broker.

A cursor is the last acknowledged offset of a subscription, stored at
``/topics/<ns>/<topic>/subscriptions/<name>/cursor`` (see ``tiered.metadata.keys``).

* ``subscribe(name)`` resumes at ``cursor + 1``; without a cursor it starts at the
  topic's latest (next) offset, or its earliest with ``initial="earliest"``. A new
  subscription that starts above 0 pins its position at once (``cursor = start - 1``,
  create-if-absent), so a consumer that crashes before its first ack does not jump
  forward to a newer "latest" when it comes back.
* ``ack(offset)`` advances an in-memory cursor; it never moves backward (an older ack
  is ignored). Acking an offset the topic never had raises :class:`InvalidAck`.
* Cursors are written every ``flush_every_acks`` acks or ``flush_interval_s`` seconds in
  the background, and on ``flush()`` / ``flush_all()`` / ``close()``. Acks never write
  themselves, so an ack is cheap and never blocks an event loop on the network. The
  background writes are a job on a :class:`tiered.timers.Scheduler`: a broker passes one
  scheduler to the managers of all its topics (one thread, whatever the topic count);
  a manager given none runs its own.
* Every cursor write is compared on the cursor key's revision as last seen, so a
  delayed older write never lands after a newer one (:mod:`tiered.metadata.owned`).
* Every cursor write is one transaction carrying the manager's fencing compares (the
  topic owner's ``value_is(owner_key, held)``): a fenced or stale owner's write fails
  with :class:`CursorFenced` and the subscription refuses further acks.
* ``unsubscribe(name)`` deletes a subscription: its cursor record (fenced like a write)
  and its in-memory cursor, whose later acks and flushes are refused. A loss path by
  design: the position is gone, and the name subscribed again starts afresh. No flush
  of the deleted subscription runs after it (one in flight is waited for), and no load
  of the same name interleaves with it, so nothing writes the record back.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Literal


from tiered.read.reader import earliest_offset, topic_next_offset
from tiered.errors import MalformedRecord, StorageError
from tiered.logs import FailureLog
from tiered.metadata import keys
from tiered.metadata.base import Compare, Delete, MetadataStore, Put, TxnResult, absent, mod_revision_is, value_is
from tiered.metadata.owned import OwnedRecord, RecordFenced
from tiered.read.errors import CursorFenced, CursorWriteFailed, InvalidAck, SubscriptionClosed, TooManySubscriptions
from tiered.read.metrics import ReadMetrics
from tiered.timers import Scheduler
from wal.api import WalOffsets
from wal.topics import TopicName

log = logging.getLogger(__name__)

Fencing = Callable[[], Sequence[Compare]] | Sequence[Compare]
Initial = Literal["latest", "earliest"]

#: Bound on how long close() waits for a background flush in flight to finish.
FLUSHER_JOIN_TIMEOUT_S = 10.0
#: Locks that loads and deletes of subscription names take by a hash of the name.
_NAME_LOCK_STRIPES = 64
#: Reads and deletes of a cursor key that a late write kept changing before giving up.
_DELETE_ATTEMPTS = 3


class TopicBounds:
    """The topic's earliest and next offsets, from callables, the WAL or the archive.

    Preference: explicit callables, then the local WAL, then the committed descriptors
    (a topic not hosted here). The archive answers "earliest" when it holds anything,
    because the WAL only keeps the newest part of the topic.
    """

    def __init__(self, topic: TopicName, metadata: MetadataStore, wal: WalOffsets | None = None,
                 earliest: Callable[[], int] | None = None,
                 next_offset: Callable[[], int] | None = None) -> None:
        self._topic = topic
        self._metadata = metadata
        self._wal = wal
        self._earliest = earliest
        self._next = next_offset

    def next_offset(self) -> int:
        if self._next is not None:
            return self._next()
        # Without a WAL: past the committed descriptors, and at least the archive start (a
        # re-created topic that archived nothing yet starts at its incarnation's first
        # offset; "latest" there must not pin a cursor below it).
        return topic_next_offset(self._topic, self._wal, self._metadata)

    def earliest_offset(self) -> int:
        if self._earliest is not None:
            return self._earliest()
        # The first *retained* offset: below the archive start is gone (archive retention).
        return earliest_offset(self._topic, self._wal, self._metadata)


class Subscription:
    """One subscription's in-memory cursor. Thread-safe; created by the manager."""

    def __init__(self, manager: "SubscriptionManager", name: str, start_offset: int,
                 stored_cursor: int | None, record: OwnedRecord) -> None:
        self.name = name
        self._record = record  # the cursor key, written compare-and-swap on its revision
        self._manager = manager
        self._lock = threading.Lock()
        # Held across read-cursor-then-write: two flushes (background flusher and
        # flush_all at unload) racing could otherwise land an older cursor last.
        self._flush_lock = threading.Lock()
        self._cursor = start_offset - 1  # last acknowledged (-1: nothing yet)
        self._flushed = stored_cursor  # what the store holds (None: no cursor key)
        self._acks_since_flush = 0
        self._known_next = 0  # a next offset of the topic seen earlier (a lower bound)
        self._fenced = False
        self._closed = False
        self._deleted = False  # unsubscribed: nothing of it is written again

    @property
    def start_offset(self) -> int:
        """Where a reader of this subscription starts: cursor + 1. It follows the acks, so
        a consumer that subscribes again (the same object on this broker) resumes after
        what it acknowledged, as it would on any other broker."""
        return self._cursor + 1

    @property
    def cursor(self) -> int:
        """Last acknowledged offset (in memory), -1 when nothing was ever acked."""
        return self._cursor

    @property
    def flushed_cursor(self) -> int | None:
        """The cursor as last written to (or read from) the metadata store."""
        return self._flushed

    @property
    def dirty(self) -> bool:
        return self._cursor >= 0 and self._cursor != self._flushed

    def ack(self, offset: int) -> bool:
        """Acknowledge everything up to ``offset``; True if the cursor moved.

        Cumulative: the cursor becomes ``max(cursor, offset)``. An offset at or
        beyond the topic's next offset raises :class:`InvalidAck`.
        """
        self._check_usable()
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidAck(self.name, offset, self._manager.bounds.next_offset())
        if offset <= self._cursor:
            return False  # Never move backward; a repeated or older ack is a no-op.
        if offset >= self._known_next:
            # Topics only grow, so a next offset seen once stays a valid bound: ask the
            # bounds (possibly a metadata read) only for acks beyond it.
            self._known_next = self._manager.bounds.next_offset()
            if offset >= self._known_next:
                raise InvalidAck(self.name, offset, self._known_next)
        with self._lock:
            # Checked again under the lock close() takes: an ack that passed the check
            # above while the manager closed must not move a cursor the final flush has
            # already written (the next owner would redeliver it).
            self._check_usable()
            if offset <= self._cursor:
                return False
            self._cursor = offset
            self._acks_since_flush += 1
            due = self._acks_since_flush >= self._manager.flush_every_acks
        self._manager.metrics.acks.inc()
        if due:
            self._manager._wake_flusher()
        return True

    def flush(self) -> bool:
        """Write the cursor if it moved since the last write; True if written."""
        self._check_usable()
        return self._flush()

    def _flush(self) -> bool:
        with self._flush_lock:
            return self._flush_locked()

    def _flush_locked(self) -> bool:
        with self._lock:
            cursor = self._cursor
            if self._deleted or cursor < 0 or cursor == self._flushed:
                return False
            acks = self._acks_since_flush
            self._acks_since_flush = 0
        try:
            self._manager._write_cursor(self, cursor)
        except CursorFenced:
            self._fenced = True
            self._manager._notify_fenced()
            raise
        except BaseException:
            with self._lock:
                self._acks_since_flush += acks  # still due: the write did not happen
            raise
        with self._lock:
            self._flushed = max(cursor, self._flushed if self._flushed is not None else -1)
        return True

    def was_deleted(self) -> bool:
        """Whether ``unsubscribe`` deleted it (its acks and flushes are refused)."""
        return self._deleted

    def _check_usable(self) -> None:
        if self._fenced:
            raise CursorFenced(self.name, self._cursor)
        if self._deleted:
            raise SubscriptionClosed(f"subscription {self.name!r} was deleted (subscribe again to start afresh)")
        if self._closed:
            raise SubscriptionClosed(f"subscription {self.name!r} is closed")

    def __repr__(self) -> str:
        return f"Subscription({self.name!r}, start={self.start_offset}, cursor={self._cursor})"


class SubscriptionManager:
    """The subscriptions of one topic on its owning broker. See the module docstring.

    ``fencing`` is either a sequence of compares or a callable returning them (called
    at every write, so an owner can hand in its current ownership record). Bounds come
    from ``earliest_offset`` / ``next_offset`` callables, else ``wal``, else the archive.
    ``scheduler`` runs the background flushes (shared by many managers); None: a
    scheduler of its own, closed with the manager.
    """

    def __init__(self, topic: TopicName | str, metadata: MetadataStore, *, fencing: Fencing = (),
                 flush_every_acks: int = 1000, flush_interval_s: float = 5.0, wal: WalOffsets | None = None,
                 earliest_offset: Callable[[], int] | None = None,
                 next_offset: Callable[[], int] | None = None, metrics: ReadMetrics | None = None,
                 scheduler: Scheduler | None = None, subscriptions_max: int | None = None) -> None:
        if flush_every_acks < 1 or flush_interval_s <= 0:
            raise ValueError("flush_every_acks must be >= 1 and flush_interval_s > 0")
        if subscriptions_max is not None and subscriptions_max < 1:
            raise ValueError("subscriptions_max must be >= 1 (or None: no bound)")
        #: Subscriptions (stored cursors) a topic may have: a new one past it is refused
        #: with TooManySubscriptions. None: no bound.
        self.subscriptions_max = subscriptions_max
        self._stored_cursors: int | None = None  # counted at the first new name (_reserve_room_for)
        self.topic = TopicName.parse(topic)
        self.metrics = metrics if metrics is not None else ReadMetrics.create()
        self.metadata = metadata
        self.flush_every_acks = flush_every_acks
        self.flush_interval_s = flush_interval_s
        self.bounds = TopicBounds(self.topic, metadata, wal, earliest_offset, next_offset)
        self._fencing = fencing
        #: Called when a cursor write is refused by fencing (the owner uses it to stop
        #: acknowledging produces at once).
        self.on_fenced: Callable[[], None] | None = None
        self._subs: dict[str, Subscription] = {}
        self._lock = threading.Lock()
        #: Held (the one of a name's stripe) by a load of a subscription not in memory and
        #: by ``unsubscribe``: a load must not adopt a record a delete is removing. Striped,
        #: so loads of other names do not wait for a slow one (atk75 F5).
        self._name_locks = [threading.Lock() for _ in range(_NAME_LOCK_STRIPES)]
        self._stop = threading.Event()
        self._close_lock = threading.Lock()  # one close() at a time stops the flusher
        #: Per subscription: the first flush failure and the recovery logged, repeats rate-limited.
        self._flush_failures: dict[str, FailureLog] = {}
        self._own_scheduler: Scheduler | None = None
        if scheduler is None:
            scheduler = self._own_scheduler = Scheduler(f"dnb-cursors{self.topic}")
        self._flusher = scheduler.every(flush_interval_s, self._flush_background, f"cursors of {self.topic}")

    # -- public API ----------------------------------------------------------
    def subscribe(self, name: str, initial: Initial = "latest") -> Subscription:
        """The subscription ``name``, resuming at its cursor + 1 (see module docstring)."""
        if initial not in ("latest", "earliest"):
            raise ValueError(f"initial must be 'latest' or 'earliest', got {initial!r}")
        self._check_open()
        with self._lock:
            existing = self._subs.get(name)
            if existing is not None:
                return existing
        with self._name_lock(name):
            with self._lock:
                existing = self._subs.get(name)
                if existing is not None:
                    return existing
            sub = self._load(name, initial)
            with self._lock:
                # Checked again where close() looks: a subscription added after close() took
                # its list would take acks that its final flush never writes (atk30 F2).
                self._check_open()
                return self._subs.setdefault(name, sub)

    def unsubscribe(self, name: str) -> bool:
        """Delete the subscription ``name``; True if it existed (in memory or stored).

        A loss path, by design: its acknowledged position is gone, and the name, if
        subscribed again (a consumer still reading or acking it does so), starts afresh at
        the topic's latest or earliest offset. Precondition: this manager is the topic's
        owner's (or fenced on the topic staying unowned). The delete is one transaction
        carrying the fencing compares and the cursor key's revision as read here, so a
        stale owner's changes nothing (:class:`CursorFenced`), and a delete applied late
        (its answer lost) never removes a cursor written after it was sent. The in-memory
        subscription is retired first, under its flush lock: its acks and flushes are
        refused from then on (:class:`SubscriptionClosed`), and a flush in flight ends
        before the delete. A load of the same name waits for it (loads and deletes of
        names in other stripes of ``_name_locks`` do not). A delete refused because the
        topic was released while the manager closes (a seal) is ``SubscriptionClosed``,
        never mistaken for a fence. If the outcome is unknown (``CursorWriteFailed``) the
        subscription stays retired; calling again completes it."""
        key = keys.cursor_key(self.topic, name)  # validates the name
        try:
            with self._name_lock(name):
                self._check_open()
                with self._lock:
                    sub = self._subs.get(name)
                if sub is not None:
                    with sub._flush_lock:  # a flush in flight ends first; later ones see _deleted
                        with sub._lock:
                            sub._deleted = True
                    with self._lock:
                        self._subs.pop(name, None)
                self._flush_failures.pop(name, None)
                try:
                    deleted = self._delete_cursor(name, key, sub)
                except CursorWriteFailed:
                    self._count_again()  # it may be gone
                    raise
        except CursorFenced:
            if self._stop.is_set():
                # Closing: the seal that follows close() released the topic meanwhile (the
                # delete did not happen). Not a newer owner's doing: no fence (atk75 F6).
                raise SubscriptionClosed(f"subscription manager of {self.topic} is closed: {name!r} was not "
                                         "deleted") from None
            self._notify_fenced()  # with no lock of ours held: the listener may close us
            raise
        if deleted or sub is not None:
            log.info("subscription %s of %s deleted", name, self.topic)
        return deleted or sub is not None

    def _delete_cursor(self, name: str, key: str, sub: Subscription | None) -> bool:
        """Delete the cursor key as read here (fenced, compared on its revision); True if
        there was one. A key written meanwhile (a flush sent before the subscription was
        retired, applied late) is read again and deleted in its new state."""
        fencing = self._fencing() if callable(self._fencing) else self._fencing
        for _ in range(_DELETE_ATTEMPTS):
            try:
                kv = self.metadata.get(key)
                if kv is None:
                    return False
                result = self.metadata.txn([*fencing, mod_revision_is(key, kv.mod_revision)], [Delete(key)], [])
                if result.succeeded:
                    with self._lock:
                        if self._stored_cursors is not None:
                            self._stored_cursors = max(self._stored_cursors - 1, 0)
                    return True
                fenced = not self.metadata.txn(list(fencing), []).succeeded
            except StorageError as e:
                raise CursorWriteFailed(f"deleting {key!r} failed (its outcome is unknown; delete again): {e}") from e
            if fenced:
                raise CursorFenced(name, sub.cursor if sub is not None else -1)
        raise CursorWriteFailed(f"{key!r} kept changing under {_DELETE_ATTEMPTS} deletes in a row")

    def _name_lock(self, name: str) -> threading.Lock:
        return self._name_locks[hash(name) % _NAME_LOCK_STRIPES]

    def get(self, name: str) -> Subscription | None:
        return self._subs.get(name)

    @property
    def subscriptions(self) -> dict[str, Subscription]:
        with self._lock:
            return dict(self._subs)

    def flush_all(self) -> int:
        """Write every moved cursor now; returns how many were written.

        Tries every subscription even when one fails, then raises the first error.
        """
        return self._flush_subs(skip_fenced=False)

    def _flush_subs(self, skip_fenced: bool) -> int:
        written, first_error = 0, None
        for sub in self.subscriptions.values():
            if sub._fenced and skip_fenced:
                continue  # already reported to whoever acked or flushed it
            try:
                if sub._fenced:
                    raise CursorFenced(sub.name, sub.cursor)
                written += sub._flush()
            except Exception as e:  # noqa: BLE001 - re-raised below, after the others
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return written

    def close(self, flush: bool = True) -> None:
        """Stop the flusher, write moved cursors (unless ``flush=False``), refuse more acks.

        Subscriptions already known to be fenced are skipped (their error was raised to
        the caller that acked or flushed); any other write failure is raised. Closing
        again with ``flush`` writes what is still unwritten: a final flush that failed
        (a metadata timeout during a seal) is tried again by the abandon that follows,
        rather than dropping acks already given (atk30 F1).
        """
        with self._close_lock:
            if not self._stop.is_set():
                self._stop.set()
                # No background flush starts from now on, and one in flight has ended: the
                # final flush below is the last write (and runs on the caller's thread).
                self._flusher.cancel(FLUSHER_JOIN_TIMEOUT_S)
                if self._own_scheduler is not None:
                    self._own_scheduler.close(FLUSHER_JOIN_TIMEOUT_S)
                # Refuse acks BEFORE the final flush (each under its subscription's lock,
                # which ack holds while it moves the cursor): whatever was acknowledged is
                # then written, and nothing is acknowledged after it. (Taken under the
                # manager's lock after _stop is set: subscribe() adds nothing after it.)
                for sub in self.subscriptions.values():
                    with sub._lock:
                        sub._closed = True
        if flush:
            self._flush_subs(skip_fenced=True)

    def unwritten_cursors(self) -> dict[str, int]:
        """Cursors acknowledged here but not written (a failed final flush): what a copy
        that replaces this one in the same process writes for it (``BrokerHost``'s reopen
        of a failed WAL), so those acks are not delivered again."""
        return {name: sub.cursor for name, sub in self.subscriptions.items() if sub.dirty and not sub._fenced}

    def __enter__(self) -> "SubscriptionManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------
    def _load(self, name: str, initial: Initial) -> Subscription:
        key = keys.cursor_key(self.topic, name)  # validates the name
        kv = self.metadata.get(key)
        if kv is not None:
            stored = keys.Cursor.from_json(key, kv.value).last_acked_offset
            return Subscription(self, name, stored + 1, stored, OwnedRecord(self.metadata, key, kv))
        reserved = self._reserve_room_for(name)
        try:
            start = self.bounds.earliest_offset() if initial == "earliest" else self.bounds.next_offset()
            # Pinned even at 0 (cursor -1): "latest" on an empty topic must still mean "from
            # here", not "whatever is latest when the consumer next connects".
            return self._create_pinned(name, key, start, reserved)
        except BaseException:
            if reserved:
                self._count_again()  # it may or may not have been created
            raise

    def _reserve_room_for(self, name: str) -> bool:
        """A new subscription only while the topic has fewer than ``subscriptions_max``
        stored cursors (any client can name new ones; each is kept until deleted). They are
        counted once per manager (a scan of up to ``subscriptions_max`` keys) and then
        followed in memory: a scan per refused name made a flood of new names slow every
        ack (atk70 F3). The place is taken here, before the create, so creators racing at
        once never pass the bound (atk76 E4); True when one was taken (False: no bound)."""
        if self.subscriptions_max is None:
            return False
        with self._lock:
            stored = self._stored_cursors
        if stored is None:
            counted = len(self.metadata.range(keys.subscriptions_prefix(self.topic), limit=self.subscriptions_max))
            with self._lock:
                if self._stored_cursors is None:
                    self._stored_cursors = counted
        with self._lock:
            assert self._stored_cursors is not None
            if self._stored_cursors >= self.subscriptions_max:
                raise TooManySubscriptions(f"topic {self.topic} has {self.subscriptions_max} subscriptions already "
                                           f"(broker.subscriptions_max): {name!r} is not created; delete unused "
                                           "ones (dnb unsubscribe)")
            self._stored_cursors += 1
        return True

    def _count_again(self) -> None:
        """The count of stored cursors is unsure (a create or delete whose outcome is
        unknown, or a place taken for a create that did not happen): scan again at the
        next new name."""
        with self._lock:
            self._stored_cursors = None

    def _create_pinned(self, name: str, key: str, start: int, reserved: bool) -> Subscription:
        """Write ``cursor = start - 1`` if no cursor exists yet; adopt a racing creator's.
        ``reserved``: a place under the bound was taken for it (given back on adoption)."""
        value = keys.Cursor(start - 1).to_json()
        result = self._txn([absent(key)], key, value)
        if result.succeeded:
            return Subscription(self, name, start, start - 1, OwnedRecord(self.metadata, key))
        kv = self.metadata.get(key)
        if kv is None:  # The compare failed on fencing, not on the cursor key.
            if self._stop.is_set():
                # Closing: the seal that follows close() released the topic meanwhile. Not a
                # newer owner's doing: no fence to report (atk76 E6).
                raise SubscriptionClosed(f"subscription manager of {self.topic} is closed")
            self._notify_fenced()
            raise CursorFenced(name, start - 1)
        if reserved:
            self._count_again()  # another creator's record: ours was not needed
        stored = keys.Cursor.from_json(key, kv.value).last_acked_offset
        return Subscription(self, name, stored + 1, stored, OwnedRecord(self.metadata, key, kv))

    def _write_cursor(self, sub: "Subscription", cursor: int) -> None:
        """Write ``cursor``: fenced, and compared on the revision this subscription last
        saw, so a delayed older write can never land after a newer one (OwnedRecord)."""
        key = sub._record.key

        def covers(stored: bytes) -> bool:
            try:
                return keys.Cursor.from_json(key, stored).last_acked_offset >= cursor
            except MalformedRecord:
                return False  # junk in the store says nothing: ours replaces it

        fencing = self._fencing() if callable(self._fencing) else self._fencing
        try:
            sub._record.write(keys.Cursor(cursor).to_json(), fencing, covers)
        except RecordFenced:
            self.metrics.cursor_flushes.labels("fenced").inc()
            raise CursorFenced(sub.name, cursor) from None
        except StorageError as e:
            self.metrics.cursor_flushes.labels("error").inc()
            raise CursorWriteFailed(f"writing {key!r} failed (re-read before the next write): {e}") from e
        self.metrics.cursor_flushes.labels("ok").inc()

    def _txn(self, compares: list[Compare], key: str, value: bytes) -> TxnResult:
        fencing = self._fencing() if callable(self._fencing) else self._fencing
        try:
            return self.metadata.txn(list(fencing) + compares, [Put(key, value)], [])
        except StorageError as e:
            self.metrics.cursor_flushes.labels("error").inc()
            raise CursorWriteFailed(f"writing {key!r} failed: {e}") from e

    def _notify_fenced(self) -> None:
        if self.on_fenced is not None:
            try:
                self.on_fenced()
            except Exception:  # noqa: BLE001 - the fenced error itself must still surface
                log.exception("subscriptions of %s: on_fenced listener failed", self.topic)

    def _wake_flusher(self) -> None:
        self._flusher.wake()

    def _flush_background(self) -> None:
        """The scheduler's job: every interval, or early when one hit flush_every_acks."""
        if not self._stop.is_set():
            self._flush_due()

    def _flush_due(self) -> None:
        for sub in self.subscriptions.values():
            if sub._fenced or sub._deleted or not sub.dirty:
                continue
            failure_log = self._flush_failures.get(sub.name)
            if failure_log is None:
                failure_log = self._flush_failures[sub.name] = FailureLog(
                    log, f"subscription {sub.name} of {self.topic}: cursor flush")
                if sub.was_deleted():
                    # Deleted since the check above: unsubscribe sets _deleted before it
                    # drops the entry, so one made after that drop is dropped here (atk76 E5).
                    self._flush_failures.pop(sub.name, None)
                    continue
            try:
                sub._flush()
                failure_log.succeeded()
            except CursorFenced:
                log.error("subscription %s of %s: cursor write fenced; stopping its flushes", sub.name, self.topic)
            except Exception as e:  # noqa: BLE001 - a background flush retries next tick
                failure_log.failed(e, "failed; will retry")

    def _check_open(self) -> None:
        if self._stop.is_set():
            raise SubscriptionClosed(f"subscription manager of {self.topic} is closed")


#: Cursors read per page while clamping (bounds memory for topics with many subscriptions).
CLAMP_PAGE_KEYS = 1000


def clamp_cursors(metadata: MetadataStore, topic: TopicName | str, next_offset: int,
                  fencing: Sequence[Compare], metrics: ReadMetrics | None = None) -> dict[str, int]:
    """Move every cursor at or past ``next_offset`` back to ``next_offset - 1``.

    The one deliberate backward move of a cursor (docs/LIFECYCLE.md, "Cursors after a
    failover"): after a takeover the new owner numbers new messages from
    ``next_offset``, so a cursor that acknowledged the dead owner's never-archived tail
    would otherwise skip the new messages written at those offsets. With
    ``next_offset == 0`` the cursor becomes -1 (nothing acknowledged: resume at 0), never
    deleted, since a missing cursor would restart at "latest" and skip messages.

    Each clamp is its own transaction with ``fencing`` plus ``value == what we read``, so
    a stale owner changes nothing. Returns ``{subscription: old cursor}`` of the clamped
    ones; raises CursorFenced when ownership was lost meanwhile. Each clamp is counted in
    ``metrics`` (a fresh registry's when None).
    """
    metrics = metrics if metrics is not None else ReadMetrics.create()
    topic = TopicName.parse(topic)
    prefix = keys.subscriptions_prefix(topic)
    clamped: dict[str, int] = {}
    after: str | None = None
    while True:
        page = metadata.range(prefix, limit=CLAMP_PAGE_KEYS, start_after=after)
        for kv in page:
            if not kv.key.endswith("/cursor"):
                continue
            # A damaged record fails the load (typed, nothing changed): the clamp cannot
            # tell whether it acknowledged offsets about to be reused, and a record skipped
            # now would never be clamped once repaired.
            old = keys.Cursor.from_json(kv.key, kv.value).last_acked_offset
            if old < next_offset:
                continue
            name = kv.key[len(prefix):-len("/cursor")]
            op = Put(kv.key, keys.Cursor(next_offset - 1).to_json())
            result = metadata.txn([*fencing, value_is(kv.key, kv.value)], [op], [])
            if not result.succeeded:
                raise CursorFenced(name, old)
            metrics.cursor_clamps.inc()
            log.warning("topic %s: subscription %s cursor clamped from %d to %s: offsets past %s were never "
                        "archived and are reassigned to new messages", topic, name, old,
                        next_offset - 1, next_offset - 1)
            clamped[name] = old
        if len(page) < CLAMP_PAGE_KEYS:
            return clamped
        after = page[-1].key


__all__ = ["Subscription", "SubscriptionManager", "TopicBounds", "clamp_cursors"]
