"""A topic this broker hosts: :class:`HostedTopic`, the producing path with its acks,
fencing, readers and the published durable tip.

Acks:

* ``durable`` — the message is fsynced in this broker's WAL and this broker still owns
  the topic (see the fencing rules below), so it keeps its offset.
* ``archived`` — the message is in an object the descriptor chain names.

A produce appends under the topic's append lock (so unload's "refuse appends" is a
clean cut, and a batch is contiguous and all or nothing), then waits for its ack
outside the lock.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, NoReturn, Protocol

from tiered.errors import MalformedRecord, StorageError
from tiered.logs import describe
from tiered.archive.chain import DescriptorChain
from tiered.metadata.keys import progress_key, read_lost_ranges
from tiered.metadata.owned import OwnedRecord, RecordFenced
from tiered.lifecycle.activity import TopicActivity
from tiered.lifecycle.errors import ProduceTimeout, TopicUnloading
from tiered.lifecycle.losses import RetiredWal
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.metrics import LifecycleMetrics
from tiered.lifecycle.ownership import BrokerSession, OwnerRecord, OwnershipLostError, OwnerToken
from tiered.lifecycle.restore import Progress
from tiered.lifecycle.wal_root import durable_tip
from tiered.metadata.base import MetadataStore
from tiered.objects.base import ObjectStore
from tiered.read.metrics import ReadMetrics
from tiered.read.reader import Start, TieredReader, create_reader
from tiered.read.subscriptions import Subscription, SubscriptionManager
from uploader import Uploader
from uploader.errors import UploaderStopped
from wal.api import Wal
from wal.errors import WalClosed
from wal.topics import TopicName


class TopicHost(Protocol):
    """What a hosted topic uses of the host that loaded it (:class:`BrokerHost` is one):
    the stores, the broker's config and session lease, and where metrics go. Typed as
    this interface so the topic does not import the host that composes it."""

    metadata: MetadataStore
    objects: ObjectStore
    config: BrokerConfig
    session: BrokerSession | None
    metrics: LifecycleMetrics
    read_metrics: ReadMetrics

    def topic(self, name: TopicName | str) -> "HostedTopic":
        """The copy of ``name`` hosted now (raises when none is)."""
        ...

    def acquired_here(self, topic: TopicName, epoch: int) -> bool:
        """Whether this host took ``topic`` at ``epoch`` (a load of it here)."""
        ...


class AppendSlot(Protocol):
    """A share of the threads appends run on (``produce_many_async``): the broker's HTTP
    server gives each topic a few of them. Both calls are made on the event loop's thread."""

    async def acquire(self) -> None:
        """Wait for a slot (holding no thread)."""
        ...

    def release(self) -> None:
        """Give one back: called once the thread is done with the append."""
        ...


log = logging.getLogger(__name__)

Ack = Literal["durable", "archived"]



class TopicState(enum.Enum):
    OPEN = "open"
    UNLOADING = "unloading"  # appends refused; unload may be retried
    SEALED = "sealed"  # seal txn landed; only local cleanup may remain
    CLOSED = "closed"  # unloaded, abandoned or fenced: nothing works any more


@dataclass(frozen=True, slots=True)
class RestoreReport:
    start_offset: int
    recovered_local_wal: bool
    previous_owner: str | None
    #: >0 only on failover: offsets of the dead owner's WAL never archived (lower bound).
    unarchived_at_least: int
    load_s: float
    #: Cursors moved back to ``start_offset - 1`` at this load: {subscription: old cursor}.
    clamped_cursors: dict[str, int] = field(default_factory=dict)
    #: This broker's own stale WAL of the topic, retired during this load.
    retired_local_wal: RetiredWal | None = None


class HostedTopic:
    """A topic this broker owns. Thread-safe."""

    def __init__(self, host: TopicHost, token: OwnerToken, wal: Wal, uploader: Uploader,
                 subscriptions: SubscriptionManager, report: RestoreReport, owner_checked_generation: int = 0) -> None:
        self.host = host
        self.topic = token.topic
        self.token = token
        self.wal = wal
        self.uploader = uploader
        self.subscriptions = subscriptions
        self.report = report
        self.state = TopicState.OPEN
        self.last_committed_offset: int | None = None
        #: The copy the host reopened from this copy's own WAL files after its WAL failed
        #: on its own (same files, same offsets): where ``archived`` waits move to.
        self.reopened_as: HostedTopic | None = None
        #: Guards ``state`` against appends and counts the appends inside the WAL now:
        #: ``refuse_appends`` waits for them to end. No lock is held across an append, so
        #: one waiting for room (up to append_timeout_s) holds up neither the topic's
        #: other appends nor its unload (atk87 F1: behind a lock, 16 appends timed out
        #: one after the other, the last after 16 x append_timeout_s, and so did the unload).
        self._append_state = threading.Condition()
        self._appends_in_flight = 0
        self._readers: "weakref.WeakSet[TieredReader]" = weakref.WeakSet()
        #: Bytes served and client connections, for the broker's load report.
        self.activity = TopicActivity()
        self._progress_lock = threading.Lock()
        self._progress_published: int | None = -1
        #: Set once this broker learns a newer owner exists; appends and acks refuse.
        self._fenced: OwnershipLostError | None = None
        self._diverged_at: int | None = None  # fenced: where the new owner continues (see fence)
        self._fence_lock = threading.Lock()
        #: The session lease generation under which the owner record was last seen ours:
        #: the one current BEFORE the acquire (a lease that lapsed and was replaced while
        #: the topic loaded must make the first ack re-read the owner record).
        self._owner_checked_generation = owner_checked_generation
        # Compared on its revision: a delayed older tip never lands after a newer one.
        self._progress_record = OwnedRecord(host.metadata, progress_key(token.topic))

    # -- producing ---------------------------------------------------------------
    def produce(self, payload: bytes, key: bytes | None = None, attributes: dict[str, str] | None = None,
                publish_time: int | None = None, *, ack: Ack = "durable",
                timeout_s: float | None = None) -> int:
        """Append one message and wait for ``ack``; returns its offset."""
        _check_ack(ack)
        offset = self.append(payload, key, attributes, publish_time)
        self._wait_ack(offset, ack, self._timeout(timeout_s))
        return offset

    def produce_many(self, payloads: "Iterable[bytes]", key: bytes | None = None, *, ack: Ack = "durable",
                     timeout_s: float | None = None) -> tuple[int | None, int | None]:
        """Append every payload as ONE batch, then wait once for ``ack`` of the last one
        (the WAL is in order, so that covers them all; one fsync can cover the batch).
        Returns (first offset, last offset), (None, None) for no payload.

        The batch is all or nothing and its offsets are contiguous: no other producer's
        message lands between them (however long backpressure blocks), and a bad or
        oversized message appends none of the batch, so a retry cannot duplicate part
        of it."""
        _check_ack(ack)
        first, last = self._append_many(payloads, key)
        if last is not None:
            self._wait_ack(last, ack, self._timeout(timeout_s))
        return first, last

    async def produce_many_async(self, payloads: "Iterable[bytes]", key: bytes | None = None, *,
                                 ack: Ack = "durable", timeout_s: float | None = None,
                                 executor: "concurrent.futures.Executor | None" = None,
                                 append_slot: "AppendSlot | None" = None) -> tuple[int | None, int | None]:
        """``produce_many`` for asyncio: the append (which may block on WAL backpressure)
        runs on ``executor`` (the loop's default when None), once ``append_slot`` (if any,
        with an ``executor``) lets it, which it holds until that thread is done with the
        append; the ack is awaited, holding no thread, however long the store takes to
        archive."""
        _check_ack(ack)
        loop = asyncio.get_running_loop()
        if append_slot is None:
            first, last = await loop.run_in_executor(executor, self._append_many, payloads, key)
        else:
            assert executor is not None, "an append slot goes with the executor whose threads it counts"
            await append_slot.acquire()
            try:
                job = executor.submit(self._append_many, payloads, key)
            except BaseException as exc:
                append_slot.release()
                if isinstance(exc, RuntimeError):  # the executor was shut down: its server is closing
                    raise TopicUnloading(self.topic, "append", "the broker is shutting down") from exc
                raise
            # Given back when the thread is done with the append, not when this call ends:
            # a caller cancelled meanwhile (a client gone, a timeout) must not leave the
            # thread busy and the slot free (atk94 F1).
            job.add_done_callback(lambda _job: _call_soon(loop, append_slot.release))
            first, last = await asyncio.wrap_future(job)
        if last is not None:
            await self._wait_ack_async(last, ack, self._timeout(timeout_s))
        return first, last

    def _append_many(self, payloads: "Iterable[bytes]", key: bytes | None) -> tuple[int | None, int | None]:
        messages = list(payloads)
        batch = messages if key is None else [(payload, key) for payload in messages]
        if not batch:
            return None, None
        self._begin_append()
        try:
            first = self.wal.append_batch(batch)
        except WalClosed:
            self._refused()
            raise
        finally:
            self._end_append()
        self.activity.received(sum(map(len, messages)) + len(messages) * len(key or b""))
        return first, first + len(batch) - 1

    async def produce_async(self, payload: bytes, key: bytes | None = None, attributes: dict[str, str] | None = None,
                            publish_time: int | None = None, *, ack: Ack = "durable",
                            timeout_s: float | None = None) -> int:
        """``produce`` for asyncio: the append (which may block on WAL backpressure) runs
        in a thread; the waits are awaited futures, not threads."""
        _check_ack(ack)
        offset = await asyncio.to_thread(self.append, payload, key, attributes, publish_time)
        await self._wait_ack_async(offset, ack, self._timeout(timeout_s))
        return offset

    async def _wait_ack_async(self, offset: int, ack: Ack, timeout_s: float) -> None:
        """``_wait_ack`` for asyncio: the waits are awaited futures, not threads."""
        deadline = time.monotonic() + timeout_s
        if not await self.wal.wait_durable_async(offset, timeout_s):
            raise ProduceTimeout(self.topic, "wait durable", f"offset {offset} not fsynced within {timeout_s}s")
        if ack == "durable" and not self._ownership_certain():
            await asyncio.to_thread(self._confirm_ownership, offset, deadline)
        if ack == "archived":
            self.uploader.request_upload()
            copy: HostedTopic = self
            while True:  # each reopen of the same WAL files during the wait: wait on its copy
                try:
                    archived = await copy.uploader.wait_archived_async(offset, max(0.0, deadline - time.monotonic()))
                    break
                except UploaderStopped as e:
                    copy = copy._reopened_copy(offset, e)
            if not archived:
                self._raise_not_archived(offset, timeout_s)

    def append(self, payload: bytes, key: bytes | None = None, attributes: dict[str, str] | None = None,
               publish_time: int | None = None) -> int:
        """Append one message WITHOUT waiting for any ack; returns its offset, which may
        not be durable yet (``produce`` waits). Refused once fenced or leaving."""
        # Counted in flight, so "refuse appends" is a clean cut: once unload set the state
        # no append is in flight, so the flush that follows covers every offset handed out.
        self._begin_append()
        try:
            offset = self.wal.append(payload, key=key, attributes=attributes, publish_time=publish_time)
        except WalClosed:
            self._refused()
            raise
        finally:
            self._end_append()
        self.activity.received(len(payload) + (len(key) if key else 0))
        return offset

    def refuse_appends(self) -> None:
        """Stop taking appends (the topic is leaving: unload or abandon). Once this returns
        no append is in flight, so a flush after it covers every offset handed out. The
        WAL refuses appends waiting for room at once (``Wal.refuse_appends``): they end
        with TopicUnloading, holding nothing up."""
        with self._append_state:
            self.state = TopicState.UNLOADING
        self.wal.refuse_appends()
        with self._append_state:
            while self._appends_in_flight:
                self._append_state.wait()

    def _begin_append(self) -> None:
        with self._append_state:
            self._check_appendable()
            self._appends_in_flight += 1

    def _end_append(self) -> None:
        with self._append_state:
            self._appends_in_flight -= 1
            if not self._appends_in_flight:
                self._append_state.notify_all()

    def _refused(self) -> None:
        """The WAL refused an append (WalClosed): if the topic is leaving or fenced, say
        that instead (the append used no offset)."""
        with self._append_state:
            self._check_appendable()

    def _check_appendable(self) -> None:
        if self._fenced is not None:
            raise self._fenced
        if self.state is not TopicState.OPEN:
            raise TopicUnloading(self.topic, "append", f"topic is {self.state.value}")

    def _wait_ack(self, offset: int, ack: Ack, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        if self.wal.wait_durable(offset, timeout_s) is False:
            raise ProduceTimeout(self.topic, "wait durable", f"offset {offset} not fsynced within {timeout_s}s")
        if ack == "durable" and not self._ownership_certain():
            self._confirm_ownership(offset, deadline)
        if ack == "archived":
            # Ask for an upload now: an archived waiter should not sit out a whole interval.
            self.uploader.request_upload()
            copy: HostedTopic = self
            while True:  # each reopen of the same WAL files during the wait: wait on its copy
                try:
                    archived = copy.uploader.wait_archived(offset, max(0.0, deadline - time.monotonic()))
                    break
                except UploaderStopped as e:
                    copy = copy._reopened_copy(offset, e)
            if archived is False:
                self._raise_not_archived(offset, timeout_s)

    def _reopened_copy(self, offset: int, stopped: UploaderStopped) -> "HostedTopic":
        """An ``archived`` wait whose uploader was closed: the copy of this topic that now
        holds ``offset`` when the host reopened the topic from its files (its WAL had
        failed on its own: the same files, so the same offsets), to wait on instead.
        Otherwise the topic left this broker unsealed (abandoned): TopicUnloading at once,
        rather than a ProduceTimeout after the whole timeout. Whether the offset is
        archived is then unknown: a producer that retries may write the message twice
        (reading it back first tells). Anything else: the uploader's own error."""
        if self.state is not TopicState.CLOSED:
            raise stopped
        # Only the copy the host reopened from this copy's own WAL files (followed through
        # later reopens) holds the same offsets; any other copy hosted here now may number
        # them after a history that replaced them (a move or failover and back meanwhile).
        current = self.reopened_as
        while current is not None and current.reopened_as is not None:
            current = current.reopened_as
        if current is not None and current.state is TopicState.OPEN:
            durable = current.wal.durable_offset
            if durable is not None and durable >= offset:
                current.uploader.request_upload()
                return current
        raise TopicUnloading(self.topic, "wait archived", f"the topic left this broker before offset {offset} "
                             "was known to be archived: its outcome is unknown") from stopped

    def _raise_not_archived(self, offset: int, timeout_s: float) -> NoReturn:
        """ProduceTimeout for an ``archived`` ack not reached in time, caused by (and
        naming) the uploader's last upload error when uploads are failing (storage
        unavailable, a missing bucket, ...)."""
        error = self.uploader.last_error
        detail = f"offset {offset} not archived within {timeout_s}s"
        if error is None:
            raise ProduceTimeout(self.topic, "wait archived", detail)
        raise ProduceTimeout(self.topic, "wait archived",
                             f"{detail}; last upload error: {describe(error)}") from error

    # -- fencing -----------------------------------------------------------------
    # A ``durable`` ack promises the message keeps its offset. That holds only while no
    # other broker can own the topic: after a takeover the new owner numbers from the
    # end of the archive and this WAL's tail becomes a recorded loss. So a durable ack
    # is given only (a) while the session lease is certain for more than the margin
    # (a paused or cut-off broker stops acking before its lease can lapse and anyone
    # can take over), (b) after a lapsed lease, once the owner record was re-read and
    # is still ours, and (c) never once this broker learned it is fenced (a fenced
    # write was refused) unless the offset is already archived under our epoch.
    # docs/SAFETY.md states what remains (a forced takeover of a live broker).

    def fence(self, step: str) -> None:
        """Record that a newer owner exists (``step`` names how this broker learned it):
        appends refuse at once with OwnershipLostError, and so does every ``durable``
        ack not yet given whose offset is not archived. Only ``abandon`` remains."""
        # Held while the divergence point is read, so a reader created meanwhile (or an
        # unload or abandon learning of the fence now) waits for it instead of leaving
        # with a plain TopicMoved past it (create_reader, check_ownership).
        with self._fence_lock:
            if self._fenced is not None:
                return
            self._fenced = OwnershipLostError(self.topic, f"{step} (fenced: a newer owner holds the topic)")
            self.host.metrics.fenced_topics.inc()
            # What this WAL holds past the archive is not the topic's history any more:
            # readers past where the new owner continues are told to resume there (also
            # readers created from now on: create_reader).
            self._diverged_at = self._diverged_from()
            self.move_readers_away(self._diverged_at)
        log.error("topic %s: fenced at epoch %d (%s): refusing appends and durable acks from now on",
                  self.topic, self.token.epoch, step)

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    def check_ownership(self) -> bool:
        """Re-read the owner record now; fence the topic if it is no longer ours.

        Fenced writes tell the owner within one upload, cursor or progress round; an
        embedding broker that learns of a move another way (a watch on the owner key,
        an operator, a client redirected to it) calls this to stop acknowledging at
        once. Returns True while the topic is still ours."""
        kv = self.host.metadata.get(self.token.key)
        if kv is None or kv.value != self.token.held_bytes:
            self.fence("owner record no longer ours")
        with self._fence_lock:  # a fence in progress on another thread has finished
            return self._fenced is None

    def _ownership_certain(self) -> bool:
        """The fast path of every durable ack: no metadata access, no lock.

        The lease is read before the generation. The keep-alive thread replaces a lapsed
        lease by raising the generation first and the lease after it
        (``BrokerSession._register``), so a long lease read here belongs to a generation
        the read after it sees. Read the other way round, a replacement landing between
        the two reads paired the old, checked generation with the new lease, and a broker
        whose topic another broker had taken over acknowledged without re-reading the
        owner record."""
        if self._fenced is not None:
            return False
        session = self.host.session
        if session is None:
            return True
        if session.remaining_s() <= self.host.config.ack_margin_s:
            return False
        return session.generation == self._owner_checked_generation

    def _confirm_ownership(self, offset: int, deadline: float) -> None:
        """The slow path: wait (bounded) for a certain lease, re-check the owner record
        after a lapsed one, and refuse when fenced."""
        margin_s = self.host.config.ack_margin_s
        while True:
            if self._fenced is not None:
                committed = self.uploader.committed_through
                if committed is not None and committed >= offset:
                    return  # archived under our epoch before the fencing: the ack is true
                raise self._fenced
            session = self.host.session
            if session is None:
                return
            if session.remaining_s() > margin_s:
                generation = session.generation
                if generation == self._owner_checked_generation:
                    return
                self._recheck_owner(generation)
                continue
            if not session.wait_remaining(margin_s, max(0.0, deadline - time.monotonic())):
                raise ProduceTimeout(self.topic, "confirm ownership",
                                     f"offset {offset} is durable here, but this broker's session lease is not "
                                     f"certain ({session.remaining_s():.2f}s left, margin {margin_s:.2f}s): not "
                                     "acknowledged, since another broker may take the topic over")

    def _recheck_owner(self, generation: int) -> None:
        try:
            kv = self.host.metadata.get(self.token.key)
        except StorageError as e:
            raise ProduceTimeout(self.topic, "confirm ownership",
                                 f"re-reading the owner record after a lapsed lease failed: {e}") from e
        if kv is None or kv.value != self.token.held_bytes:
            self.fence("owner record changed while the session lease had lapsed")
        else:
            self._owner_checked_generation = generation

    def _timeout(self, timeout_s: float | None) -> float:
        return self.host.config.produce_timeout_s if timeout_s is None else timeout_s

    # -- reading -----------------------------------------------------------------
    def create_reader(self, start: Start, live: bool = True, **options: int) -> TieredReader:
        """A tiered reader (cloud → WAL → live) starting at ``start``; ``options`` go to
        :func:`tiered.read.reader.create_reader` (prefetch_objects, memory_bytes_max)."""
        reader = create_reader(self.topic, self.wal, self.host.metadata, self.host.objects, start,
                               live=live, metrics=self.host.read_metrics, on_served=self.activity.served, **options)
        self._readers.add(reader)
        if self.state is not TopicState.OPEN or self._fenced is not None:
            # Created while the topic is leaving, or once fenced: nothing more is served.
            with self._fence_lock:  # a fence in progress has set its divergence point
                reader.move_away(self._diverged_at)
        return reader

    def open_readers(self) -> int:
        """Readers of this topic that are not closed (each one is a consumer being served)."""
        return sum(1 for reader in list(self._readers) if not reader.closed)

    def backlog(self) -> int:
        """Messages not yet acknowledged, summed over the subscriptions open here
        (``next offset − (cursor + 1)`` each)."""
        tip = self.next_offset
        return sum(max(tip - sub.cursor - 1, 0) for sub in list(self.subscriptions.subscriptions.values()))

    def move_readers_away(self, diverged_from: int | None = None) -> None:
        """Every reader of this topic ends with TopicMoved (carrying its next offset) now:
        once appends are refused the topic is leaving this broker, and acks of what a
        reader would still serve could no longer be written here. ``diverged_from``: see
        :meth:`TieredReader.move_away` (a fenced owner)."""
        for reader in list(self._readers):
            reader.move_away(diverged_from)

    def _diverged_from(self) -> int | None:
        """Fenced: the offset from which the new owner replaced this owner's history (where
        it continues numbering). The takeover's LostRange of this epoch says it exactly;
        before the takeover wrote it (or if it cannot be read) the archive's end does: it
        is read FIRST, so if no LostRange exists after it, the new owner had not opened
        yet, nor archived anything, when it was read. If neither can be read, this owner's
        own last commit: never past the new owner's start, so a consumer re-reads rather
        than skips. None when the newer owner is this broker itself (a reload of the same
        WAL at a newer epoch): the history goes on, nothing diverged."""
        try:
            archive_next = DescriptorChain(self.host.metadata, self.topic).next_offset()
            # A takeover of this epoch's history, or of a later epoch of this broker id's
            # continuing it (its own reloads), restarted numbering there.
            lost = [r.start_offset for r in read_lost_ranges(self.host.metadata, self.topic)
                    if r.broker_id == self.token.broker_id and r.epoch >= self.token.epoch]
            if lost:
                return min(lost)
            owner = self.host.metadata.get(self.token.key)
            if owner is not None:
                record = OwnerRecord.decode(owner.key, owner.value)
                if record.holder == self.token.broker_id and self.host.acquired_here(self.topic, record.epoch):
                    return None  # fenced by this host's own reload of the same WAL
            return archive_next
        except Exception as e:  # noqa: BLE001 - the conservative bound below
            log.warning("topic %s: fenced; could not read where the new owner continues (%s): readers resume "
                        "after this broker's own last archived offset", self.topic, e)
            committed = self.uploader.committed_through
            return 0 if committed is None else committed + 1

    def subscribe(self, name: str, initial: Literal["latest", "earliest"] = "latest") -> Subscription:
        return self.subscriptions.subscribe(name, initial)

    async def subscribe_async(self, name: str, initial: Literal["latest", "earliest"] = "latest") -> Subscription:
        """``subscribe`` for asyncio (it may read and write a cursor in the metadata store)."""
        return await asyncio.to_thread(self.subscribe, name, initial)

    def unsubscribe(self, name: str) -> bool:
        """Delete the subscription ``name`` (``SubscriptionManager.unsubscribe``: a loss
        path by design, fenced on this copy's ownership); True if it existed."""
        return self.subscriptions.unsubscribe(name)

    @property
    def next_offset(self) -> int:
        return self.wal.next_offset

    @property
    def max_message_bytes(self) -> int:
        """The largest message the topic's WAL takes (a larger one raises MessageTooLarge)."""
        return self.wal.config.max_message_bytes

    # -- progress ----------------------------------------------------------------
    def publish_progress(self, final: bool = False) -> bool:
        """Publish the durable tip (fenced) if it moved; True when written.

        Also while unloading: a seal that fails after its flush leaves the topic to a
        failover, which reports from this record. ``final``: an abandon's last publish,
        after its WAL closed (the copy is closed by then)."""
        # One writer at a time, so an older tip can never overwrite a newer one.
        with self._progress_lock:
            durable = durable_tip(self.wal)
            publishing = (TopicState.OPEN, TopicState.UNLOADING, TopicState.CLOSED) if final else \
                (TopicState.OPEN, TopicState.UNLOADING)
            if self.state not in publishing or durable == self._progress_published:
                return False
            record = Progress(self.token.broker_id, self.token.epoch, durable, time.time())
            try:
                self._progress_record.write(record.encode(), self.token.fencing, self._progress_covers(durable))
            except RecordFenced:
                self.fence("progress write refused")
                return False
            self._progress_published = durable
            return True

    def _progress_covers(self, durable: int | None) -> Callable[[bytes], bool]:
        def covers(stored: bytes) -> bool:
            try:
                found = Progress.decode(self._progress_record.key, stored)
            except MalformedRecord:
                return False
            return ((found.broker_id, found.epoch) == (self.token.broker_id, self.token.epoch)
                    and (found.durable_offset if found.durable_offset is not None else -1)
                    >= (durable if durable is not None else -1))
        return covers

    def __repr__(self) -> str:
        return f"HostedTopic({self.topic}, epoch={self.token.epoch}, state={self.state.value})"


def _call_soon(loop: asyncio.AbstractEventLoop, callback: "Callable[[], None]") -> None:
    """``callback`` on ``loop``'s thread, from any thread. Once the loop is closed nothing
    runs on it any more, so it is called here: what it counts may outlive the loop (a
    server served again on a new loop), and a slot never given back would leave its topic
    unable to produce there (atk95 F1)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        try:
            callback()
        except Exception:  # noqa: BLE001 - a waiter of the closed loop cannot be woken
            log.debug("callback after its event loop closed failed", exc_info=True)


def _check_ack(ack: str) -> None:
    if ack not in ("durable", "archived"):
        raise ValueError(f"ack must be 'durable' or 'archived', got {ack!r}")
