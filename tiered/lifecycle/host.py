"""Topic lifecycle on a broker: load (restore) and unload (seal) with ownership epochs.

One :class:`BrokerHost` per broker process hosts topics; each loaded topic is a
:class:`HostedTopic` holding its WAL, uploader and subscriptions. docs/LIFECYCLE.md
walks through the move; the rules in short:

* **load**: take ownership (epoch + 1, one txn) → plan where offsets continue
  (:mod:`tiered.lifecycle.restore`) → recover our own local WAL or retire a stale one
  (quarantined when it holds offsets past the archive) and open an empty WAL at the
  planned offset → mark the topic open (fenced; a failover also records a
  :class:`~tiered.metadata.keys.LostRange`) → clamp cursors past the new next offset →
  start the uploader seeded with the archived tip → subscriptions. A failover
  (previous owner died unsealed) is reported as a metric and a log line.
* **a broker coming back** retires (``retire_stale_wals``) the local WALs of topics it no
  longer holds: never deleted while they hold offsets that were not archived; those are
  quarantined under ``<wal root>/.quarantine/`` and reported exactly.
* **unload**, in order: refuse appends → flush + fsync the WAL → flush cursors →
  drain the uploader → write ``sealed: true`` and release ownership in one fenced txn
  → only then delete the local WAL. A failed step raises :class:`UnloadError` naming
  it, leaves the WAL and the topic unsealed, and ``unload`` again resumes.

Every blocking call has a bound; ``*_async`` variants run blocking work in threads so
an asyncio broker's loop never waits on disk or network.
"""
from __future__ import annotations

import asyncio
import enum
import errno
import inspect
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from crc32c import crc32c
from prometheus_client import REGISTRY, CollectorRegistry

from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.metrics import LifecycleMetrics
from tiered.errors import MalformedRecord, StorageError
from tiered.metadata import keys
from tiered.metadata.base import Delete, MetadataStore, Put
from tiered.metadata.owned import OwnedRecord, RecordFenced
from tiered.objects.base import ObjectStore
from tiered.lifecycle.ownership import (
    BrokerSession,
    TopicOwner,
    OwnershipLostError,
    OwnerRecord,
    OwnerToken,
    acquire,
    release_ops,
)
from tiered.lifecycle.restore import (
    Progress,
    RestorePlan,
    opened_state,
    plan_restore,
    progress_key,
    sealed_state,
    unarchived_by,
)
from tiered.read.metrics import ReadMetrics
from tiered.read.subscriptions import clamp_cursors
from native.errors import DnbError
from wal.errors import WalLocked
from wal.fs import LOCK_NAME, LockHeld, RealFs, crash_safe_order
from wal.topics import TopicName

log = logging.getLogger(__name__)

Ack = Literal["durable", "archived"]
#: Directory under a WAL root where stale WALs holding unarchived offsets are moved.
QUARANTINE_DIR = ".quarantine"
#: In a local WAL directory: which of this broker's epochs last opened the WAL.
OWNER_MARKER = ".owner"
#: In a WAL root: the broker id that first used it.
ROOT_IDENTITY = ".broker"
T = TypeVar("T")



# -- errors ------------------------------------------------------------------------


class LifecycleError(DnbError):
    """Base class of load/unload/produce errors; ``step`` names what failed."""

    def __init__(self, topic: TopicName, step: str, detail: str) -> None:
        super().__init__(f"topic {topic}: {step} failed: {detail}")
        self.topic = topic
        self.step = step


class LoadError(LifecycleError):
    """Loading failed at ``step``; ownership was released again when that was safe."""


class LocalWalUnreadable(LoadError):
    """This broker's local WAL of the topic exists but does not open (corrupt, disk full,
    I/O error). It may hold acknowledged messages nobody archived, so it is never moved
    aside or renumbered silently: the topic stays unloaded and owned by this broker until
    the WAL is repaired, or an operator discards it explicitly
    (``load(..., discard_local_wal=True)``, ``dnb restore --discard-local-wal``), which
    records the lost range first."""

    def __init__(self, topic: TopicName, path: str, cause: BaseException) -> None:
        super().__init__(topic, "open WAL", f"local WAL {path} does not open ({type(cause).__name__}: {cause}); "
                         "it is kept as it is and the topic stays owned by this broker. Repair it, or "
                         "discard it explicitly (dnb restore --discard-local-wal), which records the lost range")
        self.path = path


class WalRootOwnedByAnotherBroker(DnbError):
    """The WAL root was first used by another broker id (``<root>/.broker``). Retiring its
    WALs as stale under this id would throw that broker's unarchived history away, so
    the host refuses to start (Kafka refuses a ``broker.id`` that differs from its log
    directory's ``meta.properties`` for the same reason)."""

    def __init__(self, wal_root: str, found: str, broker_id: str) -> None:
        super().__init__(f"WAL root {wal_root} belongs to broker {found!r}, not {broker_id!r}: refused (a "
                         f"host started with the wrong --broker-id would retire that broker's WALs as stale)")
        self.wal_root = wal_root
        self.found = found
        self.broker_id = broker_id


class UnloadError(LifecycleError):
    """Unloading failed at ``step``; the WAL is intact and the topic unsealed. Retry
    ``unload`` to resume (a fenced topic cannot be sealed: see ``__cause__``)."""


class TopicNotHosted(LifecycleError, KeyError):
    def __init__(self, topic: TopicName) -> None:
        super().__init__(topic, "lookup", "not hosted on this broker")

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return Exception.__str__(self)


class TopicUnloading(LifecycleError):
    """An append arrived after unload began (or the topic was fenced/closed)."""


class ProduceTimeout(LifecycleError, TimeoutError):
    """The ack level was not reached in time; the message may still become durable."""


# -- hosted topic ------------------------------------------------------------------


class TopicState(enum.Enum):
    OPEN = "open"
    UNLOADING = "unloading"  # appends refused; unload may be retried
    SEALED = "sealed"  # seal txn landed; only local cleanup may remain
    CLOSED = "closed"  # unloaded, abandoned or fenced: nothing works any more


@dataclass(frozen=True, slots=True)
class RetiredWal:
    """A stale local WAL this broker let go of: deleted when everything it held was
    archived (``lost_start is None``), else quarantined at ``quarantine_path`` with the
    exact never-archived offsets ``lost_start..lost_end`` recorded as a LostRange."""

    topic: TopicName
    first_offset: int
    last_offset: int | None
    lost_start: int | None
    lost_end: int | None
    epoch: int
    quarantine_path: str | None
    #: It was the history of the owner record this load took over (not an older WAL of
    #: this broker whose history had already been taken over and recorded).
    current: bool = False


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

    def __init__(self, host: "BrokerHost", token: OwnerToken, wal: Any, uploader: Any,
                 subscriptions: Any, report: RestoreReport, owner_checked_generation: int = 0) -> None:
        self.host = host
        self.topic = token.topic
        self.token = token
        self.wal = wal
        self.uploader = uploader
        self.subscriptions = subscriptions
        self.report = report
        self.state = TopicState.OPEN
        self.last_committed_offset: int | None = None
        self._append_lock = threading.Lock()
        self._readers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._progress_lock = threading.Lock()
        self._progress_published: int | None = -1
        #: Set once this broker learns a newer owner exists; appends and acks refuse.
        self._fenced: OwnershipLostError | None = None
        #: The session lease generation under which the owner record was last seen ours:
        #: the one current BEFORE the acquire (a lease that lapsed and was replaced while
        #: the topic loaded must make the first ack re-read the owner record).
        self._owner_checked_generation = owner_checked_generation
        # Compared on its revision: a delayed older tip never lands after a newer one.
        self._progress_record = OwnedRecord(host.metadata, progress_key(token.topic))

    # -- producing ---------------------------------------------------------------
    def produce(self, payload: bytes, key: bytes | None = None, attributes: dict | None = None,
                publish_time: int | None = None, *, ack: Ack = "durable",
                timeout_s: float | None = None) -> int:
        """Append one message and wait for ``ack``; returns its offset."""
        _check_ack(ack)
        offset = self._append(payload, key, attributes, publish_time)
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
        batch = list(payloads) if key is None else [(payload, key) for payload in payloads]
        if not batch:
            return None, None
        with self._append_lock:
            self._check_appendable()
            first = self.wal.append_batch(batch)
        last = first + len(batch) - 1
        self._wait_ack(last, ack, self._timeout(timeout_s))
        return first, last

    async def produce_async(self, payload: bytes, key: bytes | None = None, attributes: dict | None = None,
                            publish_time: int | None = None, *, ack: Ack = "durable",
                            timeout_s: float | None = None) -> int:
        """``produce`` for asyncio: the append (which may block on WAL backpressure) runs
        in a thread; the waits are awaited futures, not threads."""
        _check_ack(ack)
        offset = await asyncio.to_thread(self._append, payload, key, attributes, publish_time)
        timeout_s = self._timeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        if not await self.wal.wait_durable_async(offset, timeout_s):
            raise ProduceTimeout(self.topic, "wait durable", f"offset {offset} not fsynced within {timeout_s}s")
        if ack == "durable" and not self._ownership_certain():
            await asyncio.to_thread(self._confirm_ownership, offset, deadline)
        if ack == "archived":
            self.uploader.request_upload()
            remaining_s = max(0.0, deadline - time.monotonic())
            if not await self.uploader.wait_archived_async(offset, remaining_s):
                raise ProduceTimeout(self.topic, "wait archived", f"offset {offset} not archived within {timeout_s}s")
        return offset

    def _append(self, payload: bytes, key: bytes | None, attributes: dict | None,
                publish_time: int | None) -> int:
        # The lock makes "refuse appends" a clean cut: once unload set the state no
        # append is in flight, so the flush that follows covers every offset handed out.
        with self._append_lock:
            self._check_appendable()
            return self.wal.append(payload, key=key, attributes=attributes, publish_time=publish_time)

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
            remaining_s = max(0.0, deadline - time.monotonic())
            if self.uploader.wait_archived(offset, remaining_s) is False:
                raise ProduceTimeout(self.topic, "wait archived", f"offset {offset} not archived within {timeout_s}s")

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
        if self._fenced is None:
            self._fenced = OwnershipLostError(self.topic, f"{step} (fenced: a newer owner holds the topic)")
            self.host.metrics.fenced_topics.inc()
            # What this WAL holds past the archive is not the topic's history any more.
            self._move_readers_away()
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
        return self._fenced is None

    def _ownership_certain(self) -> bool:
        """The fast path of every durable ack: no metadata access, no lock."""
        if self._fenced is not None:
            return False
        session = self.host.session
        return session is None or (session.generation == self._owner_checked_generation
                                   and session.remaining_s() > self.host.config.ack_margin_s)

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
    def create_reader(self, start: int | Literal["earliest", "latest"], live: bool = True, **options: Any) -> Any:
        """A tiered reader (cloud → WAL → live) starting at ``start``; ``options`` go to
        :func:`tiered.read.reader.create_reader` (prefetch_objects, memory_bytes_max)."""
        from tiered.read.reader import create_reader

        reader = create_reader(self.topic, self.wal, self.host.metadata, self.host.objects, start,
                               live=live, metrics=self.host.read_metrics, **options)
        self._readers.add(reader)
        if self.state is not TopicState.OPEN:
            reader.move_away()  # created while the topic is leaving: nothing more is served
        return reader

    def _move_readers_away(self) -> None:
        """Every reader of this topic ends with TopicMoved (carrying its next offset) now:
        once appends are refused the topic is leaving this broker, and acks of what a
        reader would still serve could no longer be written here."""
        for reader in list(self._readers):
            reader.move_away()

    def subscribe(self, name: str, initial: Literal["latest", "earliest"] = "latest") -> Any:
        return self.subscriptions.subscribe(name, initial)

    async def subscribe_async(self, name: str, initial: Literal["latest", "earliest"] = "latest") -> Any:
        """``subscribe`` for asyncio (it may read and write a cursor in the metadata store)."""
        return await asyncio.to_thread(self.subscribe, name, initial)

    @property
    def next_offset(self) -> int:
        return self.wal.next_offset

    # -- progress ----------------------------------------------------------------
    def publish_progress(self) -> bool:
        """Publish the durable tip (fenced) if it moved; True when written.

        Also while unloading: a seal that fails after its flush leaves the topic to a
        failover, which reports from this record."""
        # One writer at a time, so an older tip can never overwrite a newer one.
        with self._progress_lock:
            durable = _durable_tip(self.wal)
            if self.state not in (TopicState.OPEN, TopicState.UNLOADING) or durable == self._progress_published:
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


def _check_ack(ack: str) -> None:
    if ack not in ("durable", "archived"):
        raise ValueError(f"ack must be 'durable' or 'archived', got {ack!r}")


def _durable_tip(wal: Any) -> int | None:
    """Highest fsynced offset (None when nothing is durable)."""
    durable = wal.durable_offset
    return durable if durable is None or durable >= 0 else None


# -- broker host -------------------------------------------------------------------


class BrokerHost:
    """Hosts topics for one broker process. Thread-safe; see the module docstring."""

    def __init__(self, broker_id: str, wal_root: str | os.PathLike[str], metadata: MetadataStore,
                 objects: ObjectStore, config: BrokerConfig | None = None, *, wal_fs: Any = None,
                 retire_stale_wals: bool = True, metrics_registry: CollectorRegistry | None = None) -> None:
        """``wal_fs`` is the file layer every WAL of this host runs on (``wal.fs``; the
        real disk by default). ``retire_stale_wals`` scans the WAL root at start for
        WALs of topics this broker no longer holds (see :meth:`retire_stale_wals`).
        ``metrics_registry`` receives the host's, its readers' and its uploaders'
        metrics; the host is a composition root, so it defaults to prometheus_client's
        process-wide ``REGISTRY``."""
        keys.broker_assignments_prefix(broker_id)  # validates the id as a key segment
        self.broker_id = broker_id
        self.wal_root = os.fspath(wal_root)
        self.metadata = metadata
        self.objects = objects
        self.config = config or BrokerConfig()
        self.wal_fs = wal_fs
        self.metrics_registry = metrics_registry if metrics_registry is not None else REGISTRY
        self.metrics = LifecycleMetrics.create(self.metrics_registry)
        self.read_metrics = ReadMetrics.create(self.metrics_registry)
        #: Every lookup of the WAL root goes through the WAL's own file layer: a WAL on
        #: a fault-injecting (or any non-OS) file system does not exist on the real disk.
        self.fs = wal_fs if wal_fs is not None else RealFs()
        # One host per WAL root: a second process with the same root (whatever its broker
        # id) would recover, retire or append to the same WALs. Held until close(); the
        # kernel drops it if the process dies, so a restart after a crash is never refused.
        self.fs.makedirs(self.wal_root)
        try:
            self._root_lock = self.fs.lock(os.path.join(self.wal_root, LOCK_NAME))
        except LockHeld as e:
            raise WalLocked(self.wal_root, "another broker host uses this WAL root") from e
        try:
            self._claim_root()
        except BaseException:
            self._root_lock.release()
            raise
        #: Stale WALs retired by this host (deleted or quarantined), oldest first.
        self.retired: list[RetiredWal] = []
        self._topics: dict[TopicName, HostedTopic] = {}
        self._lock = threading.Lock()
        self._topic_locks: dict[TopicName, threading.Lock] = {}
        self._listeners: list[tuple[Any, Any, asyncio.AbstractEventLoop | None]] = []
        try:
            self._closed = threading.Event()
            self.session: BrokerSession | None = None
            if self.config.register_session:
                self.session = BrokerSession(metadata, broker_id, self.config.session_ttl_s,
                                             self.config.advertised_address).start()
            # Set by every hosted WAL's durable listener: the progress thread publishes soon
            # after data becomes durable instead of on a fixed tick (see _progress_loop).
            self._progress_wake = threading.Event()
            if retire_stale_wals:
                self.retire_stale_wals()
            self._progress_thread = threading.Thread(target=self._progress_loop, daemon=True,
                                                     name=f"dnb-progress-{broker_id}")
            self._progress_thread.start()
        except BaseException:
            # A host that failed to start holds nothing: the next attempt must not find
            # its own WAL root locked.
            if self.session is not None:
                self.session.stop(revoke=True)
            self._root_lock.release()
            raise

    def _claim_root(self) -> None:
        """Write ``<root>/.broker`` (this broker id) on first use; refuse another id."""
        path = os.path.join(self.wal_root, ROOT_IDENTITY)
        if self.fs.exists(path):
            found = _decode_marker(self.fs.read_all(path))
            found_id = found.get("broker_id") if found is not None else None
            if found_id == self.broker_id:
                return
            raise WalRootOwnedByAnotherBroker(self.wal_root, str(found_id if found_id else "<unreadable>"),
                                              self.broker_id)
        # No identity yet (a new root, or one from before identities): its WALs' own
        # .owner markers say whose they are. Claiming another broker's WALs would retire
        # them as stale.
        for other in self._marker_broker_ids():
            if other != self.broker_id:
                raise WalRootOwnedByAnotherBroker(self.wal_root, other, self.broker_id)
        self._write_marker(path, {"broker_id": self.broker_id})

    def _marker_broker_ids(self) -> set[str]:
        """Broker ids named by the (valid) .owner markers of the WALs under the root."""
        found: set[str] = set()
        for namespace in self.fs.listdir(self.wal_root):
            if namespace.startswith("."):
                continue
            try:
                names = self.fs.listdir(os.path.join(self.wal_root, namespace))
            except (NotADirectoryError, FileNotFoundError):
                continue
            for name in names:
                marker = os.path.join(self.wal_root, namespace, name, OWNER_MARKER)
                try:
                    body = _decode_marker(self.fs.read_all(marker)) if self.fs.exists(marker) else None
                except OSError:
                    body = None
                if body is not None and isinstance(body.get("broker_id"), str):
                    found.add(body["broker_id"])
        return found

    def _write_marker(self, path: str, body: dict) -> None:
        """Durably write a small checksummed JSON marker (temp, fsync, rename, fsync dir)."""
        temp = path + ".tmp"
        handle = self.fs.open_append(temp)
        try:
            handle.write([_encode_marker(body)])
            handle.sync()
        finally:
            handle.close()
        self.fs.rename(temp, path)
        self.fs.fsync_dir(os.path.dirname(path))

    # -- lookup ------------------------------------------------------------------
    def topic(self, name: TopicName | str) -> HostedTopic:
        topic = TopicName.parse(name)
        with self._lock:
            hosted = self._topics.get(topic)
        if hosted is None:
            raise TopicNotHosted(topic)
        return hosted

    def topics(self) -> list[HostedTopic]:
        with self._lock:
            return list(self._topics.values())

    def _topic_lock(self, topic: TopicName) -> threading.Lock:
        with self._lock:
            return self._topic_locks.setdefault(topic, threading.Lock())

    # -- load --------------------------------------------------------------------
    def load(self, name: TopicName | str, *, force: bool = False,
             discard_local_wal: bool = False) -> HostedTopic:
        """Take ownership and restore ``name``; idempotent for a topic already hosted.

        Raises TopicOwnedElsewhere / OwnershipConflict when another broker holds or
        just took it, RestoreMismatch when metadata disagrees, LocalWalUnreadable when
        this broker's WAL of the topic does not open, LoadError otherwise. A failed load
        leaves the topic as recoverable as before (see :meth:`_after_failed_load`).

        ``discard_local_wal`` is the operator's way past LocalWalUnreadable: the WAL is
        quarantined and the range it may have held is recorded as lost, then numbering
        continues after the archive.
        """
        topic = TopicName.parse(name)
        self._check_open()
        with self._topic_lock(topic):
            with self._lock:
                existing = self._topics.get(topic)
            if existing is not None and existing.state is TopicState.OPEN:
                return existing
            if existing is not None:
                raise LoadError(topic, "load", f"topic is {existing.state.value} here; finish unload first")
            hosted = self._load(topic, force, discard_local_wal)
            with self._lock:
                self._topics[topic] = hosted
        self._notify(0, hosted)
        return hosted

    async def load_async(self, name: TopicName | str, *, force: bool = False,
                         discard_local_wal: bool = False) -> HostedTopic:
        return await asyncio.to_thread(self.load, name, force=force, discard_local_wal=discard_local_wal)

    def _load(self, topic: TopicName, force: bool, discard_local_wal: bool) -> HostedTopic:
        started = time.monotonic()
        generation = self.session.generation if self.session is not None else 0
        token = acquire(self.metadata, topic, self.broker_id, force=force)
        opened: list[Callable[[], None]] = []
        retired: list[RetiredWal] = []
        plan: RestorePlan | None = None
        wal: Any = None
        try:
            plan = plan_restore(self.metadata, token)
            wal, recovered = _step(topic, "open WAL", LoadError,
                                   lambda: self._open_wal(token, plan, retired, discard_local_wal))
            opened.append(lambda: wal.close())
            _step(topic, "open WAL", LoadError, lambda: self._write_owner_marker(token))
            retired_here = retired[0] if retired else None
            unarchived = _step(topic, "mark topic open", LoadError,
                               lambda: self._mark_open(token, plan, recovered, retired_here))
            # Offsets continue at wal.next_offset. Unsealed, a cursor may have acknowledged
            # offsets past it that nobody archived (a dead owner's tail, or bytes a power
            # loss took); sealed, a cursor past the seal can only be a damaged record. Either
            # way those offsets are about to name new messages the cursor would skip.
            clamped = _step(topic, "clamp subscription cursors", LoadError,
                            lambda: clamp_cursors(self.metadata, topic, wal.next_offset, token.fencing,
                                                          self.read_metrics))
            uploader = _step(topic, "start uploader", LoadError, lambda: self._start_uploader(token, wal, plan))
            opened.append(lambda: uploader.stop(self.config.close_timeout_s))
            subs = _step(topic, "open subscriptions", LoadError, lambda: self._open_subscriptions(token, wal))
        except BaseException:
            _undo(opened)
            self._after_failed_load(token, plan, wal)
            raise
        report = RestoreReport(wal.next_offset if recovered else plan.start_offset, recovered,
                               plan.previous_owner, unarchived,
                               time.monotonic() - started, clamped, retired_here)
        self._report_restore(topic, report, token)
        self.metrics.load_seconds.observe(report.load_s)
        hosted = HostedTopic(self, token, wal, uploader, subs, report, generation)
        uploader.on_fatal = lambda error: _fence_if_ownership(hosted, error, "uploader commit refused")
        subs.on_fenced = lambda: hosted.fence("cursor write refused")
        wal.add_durable_listener(self._on_durable)
        return hosted

    def _after_failed_load(self, token: OwnerToken, plan: RestorePlan | None, wal: Any) -> None:
        """Leave the topic at least as recoverable as before the failed attempt.

        Releasing is a loss path: a released topic's next load (by any broker, this one
        included) no longer recovers this broker's local WAL, so its unarchived offsets
        would be retired and their numbers reused. Precondition for releasing, all of:

        * the plan was read (so we know what the topic was), and
        * the topic had no unsealed history: it was sealed, or never owned before; and
        * nothing of value is local: no WAL was opened, or the one opened holds no
          offset past the archive (``next_offset == plan.start_offset``).

        A sealed topic is sealed again in the same fenced transaction that releases it,
        so it is exactly as before the attempt. In every other case this broker keeps
        ownership, as after a crash: its own next load recovers the WAL, and if it dies
        another broker fails over with the loss recorded."""
        if wal is not None:
            nothing_local = plan is not None and wal.next_offset == plan.start_offset
        else:  # a WAL that did not open may hold anything
            nothing_local = not _true_if_unsure(lambda: self._local_wal_exists(token.topic))
        fresh = plan is not None and (_is_sealed(plan) or (token.previous is None and plan.sealed is None
                                                          and plan.descriptor_end is None))
        if plan is None or not fresh or not nothing_local:
            log.warning("topic %s: load failed; broker %s keeps ownership (epoch %d) so its local WAL "
                        "stays recoverable by its next load", token.topic, self.broker_id, token.epoch)
            return
        ops: list[Any] = list(release_ops(token))
        if plan.sealed is not None and plan.sealed.sealed:
            ops.append(Put(keys.state_key(token.topic), plan.sealed.to_json()))
        try:
            if not self.metadata.txn(token.fencing, ops).succeeded:
                log.warning("topic %s: load failed and ownership was already lost", token.topic)
        except Exception as e:  # noqa: BLE001 - the original load error matters more
            log.warning("topic %s: releasing ownership after a failed load failed (kept): %s", token.topic, e)

    def _on_durable(self, _durable_offset: int) -> None:
        # Runs on a WAL writer thread after each fsync: only flag the progress thread,
        # never write metadata here (that would be one etcd write per fsync).
        self._progress_wake.set()

    def _open_wal(self, token: OwnerToken, plan: RestorePlan, retired: list[RetiredWal],
                  discard_local_wal: bool = False) -> tuple[Any, bool]:
        from wal import WriteAheadLog

        topic = token.topic
        if self._local_wal_exists(topic):
            ours, wal_epoch = self._local_wal_is_current(token)
            try:
                if ours and plan.may_recover_local:
                    wal = self._recover_local(topic, plan)
                    if wal is not None:
                        return wal, True
                if ours:
                    # Our own unsealed WAL that does not join the archive: numbering restarts
                    # at the planned offset, so whatever it holds from there on is lost here
                    # and now (recorded exactly before the WAL moves). It is the previous
                    # epoch's history, so its record is the takeover's record too.
                    retired.append(replace(self._retire_local(topic, plan.start_offset, wal_epoch),
                                           current=True))
                else:
                    log.warning("topic %s: retiring a stale local WAL (the topic moved on since)", topic)
                    retired.append(self._retire_local(topic))
            except LocalWalUnreadable:
                if not discard_local_wal:
                    raise
                retired.append(replace(self._discard_unreadable(topic, plan, wal_epoch if ours else None),
                                       current=ours))
        wal = WriteAheadLog.open(self.wal_root, str(topic), config=self.config.wal_config,
                                 initial_offset=plan.start_offset, fs=self.wal_fs)
        if wal.next_offset != plan.start_offset:
            wal.close()
            raise LoadError(topic, "open WAL", f"new WAL starts at {wal.next_offset}, planned {plan.start_offset}")
        return wal, False

    # The epoch that last opened a local WAL is kept beside it (``.owner``): the owner
    # record alone cannot tell, because a load that fails keeps ownership and bumps the
    # epoch without touching the WAL, and a takeover from us may have happened in between.

    def _local_wal_is_current(self, token: OwnerToken) -> tuple[bool, int]:
        """(is the local WAL this broker's current history, the epoch that wrote it)."""
        previous = token.previous
        if previous is None or previous.holder != self.broker_id:
            marker = self._read_owner_marker(token.topic)
            return False, marker if marker is not None else -1
        marker = self._read_owner_marker(token.topic)
        if marker is None or marker == previous.epoch:
            return True, previous.epoch
        taken = [r for r in keys.read_lost_ranges(self.metadata, token.topic)
                 if r.broker_id == self.broker_id and r.epoch >= marker]
        # Epochs moved on since the WAL was opened: by our own failed loads only (still
        # current), or by a takeover from us and back (stale: its loss is recorded).
        return (not taken), marker

    def _owner_marker_path(self, topic: TopicName) -> str:
        return os.path.join(self._local_wal_path(topic), OWNER_MARKER)

    def _read_owner_marker(self, topic: TopicName) -> int | None:
        path = self._owner_marker_path(topic)
        try:
            if not self.fs.exists(path):
                return None
            body = _decode_marker(self.fs.read_all(path))
        except OSError:
            return None
        if body is None:
            return None  # damaged (checksum): unknown, the owner record decides, as before markers
        epoch = body.get("epoch") if body.get("broker_id") == self.broker_id else None
        return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None

    def _write_owner_marker(self, token: OwnerToken) -> None:
        """Durably record that ``token``'s epoch has this WAL open (temp, fsync, rename)."""
        self._write_marker(self._owner_marker_path(token.topic),
                           {"broker_id": self.broker_id, "epoch": token.epoch})

    def _open_local(self, topic: TopicName) -> Any:
        """Open this broker's existing WAL of ``topic``; LocalWalUnreadable if it does not."""
        from wal import WriteAheadLog
        from wal.errors import WalLocked as Locked

        try:
            return WriteAheadLog.open(self.wal_root, str(topic), config=self.config.wal_config, fs=self.wal_fs)
        except Locked:
            raise  # someone else has it open: not unreadable, and nothing to decide here
        except OSError as e:
            if e.errno in _ENVIRONMENT_ERRNOS:
                # Disk full, quota, read-only or permissions: nothing says the WAL is damaged,
                # so no "discard it" advice; the operator frees space (or fixes) and retries.
                raise LoadError(topic, "open WAL", f"local WAL {self._local_wal_path(topic)} cannot be opened "
                                f"now ({e.strerror}); it is kept as it is: fix that and retry") from e
            raise LocalWalUnreadable(topic, self._local_wal_path(topic), e) from e
        except Exception as e:  # noqa: BLE001 - whatever the reason, the WAL is kept as it is
            raise LocalWalUnreadable(topic, self._local_wal_path(topic), e) from e

    def _recover_local(self, topic: TopicName, plan: RestorePlan) -> Any | None:
        """Our own unsealed WAL, if it still joins the archive without a gap."""
        wal = self._open_local(topic)
        first, tip_next = wal.first_offset, wal.next_offset
        if first <= plan.start_offset <= tip_next:
            log.info("topic %s: recovered local WAL %d..%d (archive continues at %d)",
                     topic, first, tip_next - 1, plan.start_offset)
            return wal
        log.warning("topic %s: local WAL %d..%d does not join the archive at %d; retiring it",
                    topic, first, tip_next - 1, plan.start_offset)
        wal.close()
        return None

    def _discard_unreadable(self, topic: TopicName, plan: RestorePlan, epoch: int | None) -> RetiredWal:
        """The operator chose to give up a WAL that does not open: record, then quarantine.

        The range it held is unknown; what is known is where numbering restarts
        (``plan.start_offset``), so the record says "from there, end unknown" (``exact:
        false``), written before the files move so a crash in between cannot make the
        loss silent."""
        start, end = plan.start_offset, None
        if epoch is None:
            # A stale WAL of an earlier epoch: its loss began where the topic's numbering
            # restarted after it (the taker-over's record), not where it continues now.
            record = self._own_lost_record(topic, self._read_owner_marker(topic))
            if record is not None:
                start, end, epoch = record.start_offset, record.end_offset, record.epoch
            else:
                start, epoch = self._first_unarchived_by_us(topic, 0)
        leaf = f"unreadable-{epoch:0{keys.OFFSET_DIGITS}d}"
        qpath = os.path.join(self.wal_root, QUARANTINE_DIR, topic.namespace, topic.name, leaf)
        key = keys.lost_key(topic, start, epoch)
        lost = keys.LostRange(start, end, self.broker_id, epoch, False, qpath, self.broker_id, time.time())
        kv = self.metadata.get(key)
        from tiered.metadata.base import absent, value_is

        compare = absent(key) if kv is None else value_is(key, kv.value)
        if not self.metadata.txn([compare], [Put(key, lost.to_json())]).succeeded:
            raise StorageError(f"{key} changed while recording a discarded WAL; kept for a retry")
        self._quarantine(topic, self._local_wal_path(topic), leaf)
        self.metrics.quarantines.labels(str(topic)).inc()
        log.error("topic %s: discarded the unreadable local WAL on the operator's request: quarantined at %s, "
                  "offsets from %d on that it held are lost (range unknown, recorded at %s)",
                  topic, qpath, start, key)
        retired = RetiredWal(topic, -1, None, start, end, epoch, qpath)
        self.retired.append(retired)
        return retired

    def _local_wal_path(self, topic: TopicName) -> str:
        return os.path.join(self.wal_root, topic.namespace, topic.name)

    def _local_wal_exists(self, topic: TopicName) -> bool:
        path = self._local_wal_path(topic)
        # Dot files (.lock, .owner) are the host's and the WAL's bookkeeping, not data.
        return self.fs.exists(path) and any(not n.startswith(".") for n in self.fs.listdir(path))

    # -- stale local WALs --------------------------------------------------------
    def retire_stale_wals(self) -> list[RetiredWal]:
        """Retire the local WAL of every topic under the WAL root that this broker does
        not hold: what a broker coming back after losing its topics finds on its disk.

        A WAL whose every offset is archived is deleted; one holding offsets past where
        the topic continued elsewhere is quarantined and its exact lost range recorded
        (:meth:`_retire_local`). A WAL of a topic this broker still holds is left for
        ``load`` to recover. A failure is logged with its cause and leaves the WAL in
        place (never deleted), so the next start, or a load of the topic, tries again."""
        from tiered.lifecycle.ownership import read_owner
        from wal.errors import InvalidTopicName

        done: list[RetiredWal] = []
        if not self.fs.exists(self.wal_root):
            return done
        for namespace in self.fs.listdir(self.wal_root):
            if namespace.startswith("."):
                continue  # the quarantine, the root's lock file: never a namespace
            try:
                names = self.fs.listdir(os.path.join(self.wal_root, namespace))
            except (NotADirectoryError, FileNotFoundError):
                continue  # a file at the namespace level, not a WAL directory
            for name in names:
                try:
                    topic = TopicName.parse(f"/{namespace}/{name}")
                except InvalidTopicName:
                    continue  # not a directory the lifecycle could have made
                with self._topic_lock(topic):
                    if topic in self._topics or not self._local_wal_exists(topic):
                        continue
                    try:
                        owner, _kv = read_owner(self.metadata, topic)
                        if owner is not None and owner.holder == self.broker_id:
                            continue  # still ours (this broker crashed): load recovers it
                        done.append(self._retire_local(topic))
                    except Exception as e:  # noqa: BLE001 - one bad topic must not stop the broker
                        log.error("topic %s: retiring the stale local WAL failed, kept in place: %s: %s",
                                  topic, type(e).__name__, e, exc_info=e)
        return done

    def _retire_local(self, topic: TopicName, start: int | None = None, epoch: int | None = None) -> RetiredWal:
        """Delete or quarantine this broker's stale WAL of ``topic``; never lose silently.

        ``start``/``epoch``: where the topic's numbering restarted after this broker's
        epoch ``epoch``. When a broker comes back they are unknown (None): the LostRange
        the taker-over wrote naming this broker says them; without one (a stale WAL left
        by a crash between seal and delete), the first offset of this WAL that no
        descriptor of this broker archived.
        """
        path = self._local_wal_path(topic)
        # A WAL that does not open is never moved or deleted here: its range is unknown,
        # so nothing could record what it held (LocalWalUnreadable; the operator decides).
        wal = self._open_local(topic)
        try:
            first, tip = wal.first_offset, _durable_tip(wal)
        finally:
            wal.close()
        record = None
        if start is None or epoch is None:
            wal_epoch = self._read_owner_marker(topic)
            record = self._own_lost_record(topic, wal_epoch)
            if record is not None and wal_epoch is not None and record.epoch != wal_epoch:
                # A LATER epoch's record (failed loads of ours in between, or a history of
                # this broker id on another data dir): it says where numbering restarted,
                # but this WAL can neither confirm nor complete another epoch's account (it
                # would erase a real loss); this WAL's own account gets its own record.
                start, epoch, record = record.start_offset, wal_epoch, None
            elif record is not None:
                start, epoch = record.start_offset, record.epoch
            else:
                start, epoch = self._first_unarchived_by_us(topic, first)
        lost_start = max(start, first)
        if tip is None or tip < lost_start:
            # Everything this WAL held is archived: nothing to keep, nothing lost.
            if record is not None and not record.exact:
                self._write_lost(topic, start, epoch, None, None)  # confirm: nothing was lost
            self._delete_local(topic)
            log.info("topic %s: deleted stale local WAL %d..%s: every offset it held is archived",
                     topic, first, tip)
            retired = RetiredWal(topic, first, tip, None, None, epoch, None)
        else:
            leaf = f"{epoch:0{keys.OFFSET_DIGITS}d}"
            qpath = os.path.join(self.wal_root, QUARANTINE_DIR, topic.namespace, topic.name, leaf)
            # Record first: if the move then fails, a retry finds the same range and path;
            # a move without a record would be a silent loss if this broker died next.
            self._write_lost(topic, start, epoch, tip, qpath)
            self._quarantine(topic, path, leaf)
            self.metrics.quarantines.labels(str(topic)).inc()
            self.metrics.quarantined_offsets.labels(str(topic)).inc(tip - lost_start + 1)
            log.warning("topic %s: quarantined stale local WAL of epoch %d at %s: offsets %d-%d were durable "
                        "here but never archived, and the topic's numbering restarted at %d, so they are lost "
                        "(recorded at %s)", topic, epoch, qpath, lost_start, tip, start,
                        keys.lost_key(topic, start, epoch))
            retired = RetiredWal(topic, first, tip, lost_start, tip, epoch, qpath)
        self.retired.append(retired)
        return retired

    def _own_lost_record(self, topic: TopicName, wal_epoch: int | None = None) -> keys.LostRange | None:
        """The failover away from this broker that ended the history of the WAL opened at
        ``wal_epoch`` (its ``.owner`` marker): the first takeover record naming this broker
        at or after that epoch (failed loads of our own bump the epoch without a new WAL,
        so the taker-over's record may name a later one). A record of an earlier epoch
        belongs to an older WAL of this broker and says nothing about this one. Without a
        marker (a WAL from before markers existed): the newest record."""
        mine = [r for r in keys.read_lost_ranges(self.metadata, topic) if r.broker_id == self.broker_id]
        if wal_epoch is None:
            return max(mine, key=lambda r: r.epoch, default=None)
        return min((r for r in mine if r.epoch >= wal_epoch), key=lambda r: r.epoch, default=None)

    def _first_unarchived_by_us(self, topic: TopicName, first: int) -> tuple[int, int]:
        """Without a LostRange: the first offset from ``first`` on that no descriptor of
        this broker covers, and the newest epoch this broker archived under (0: none)."""
        from tiered.archive import list_descriptors

        covered, epoch = first - 1, 0
        for d in list_descriptors(self.metadata, topic):
            if d.broker_id != self.broker_id:
                continue
            epoch = max(epoch, d.epoch)
            if d.start_offset <= covered + 1 <= d.end_offset:
                covered = d.end_offset
        return covered + 1, epoch

    def _write_lost(self, topic: TopicName, start: int, epoch: int, end: int | None, qpath: str | None) -> None:
        """Write this broker's exact LostRange: compare-and-swap against the current record
        (this broker does not own the topic, so ownership cannot fence this write)."""
        from tiered.metadata.base import absent, value_is

        key = keys.lost_key(topic, start, epoch)
        kv = self.metadata.get(key)
        if kv is not None:
            earlier = keys.LostRange.from_json(kv.key, kv.value)
            if earlier.exact and earlier.quarantine_path:
                # A retry after a quarantine that moved part of the WAL: what is left here
                # is a prefix, so its tip says less than the first attempt knew. The exact
                # record only grows, and keeps the directory the first part went to.
                if end is None or (earlier.end_offset is not None and earlier.end_offset > end):
                    end = earlier.end_offset
                qpath = earlier.quarantine_path
        record = keys.LostRange(start, end, self.broker_id, epoch, True, qpath, self.broker_id, time.time())
        compare = absent(key) if kv is None else value_is(key, kv.value)
        if not self.metadata.txn([compare], [Put(key, record.to_json())]).succeeded:
            raise StorageError(f"{key} changed while broker {self.broker_id} was recording its lost range; "
                               "the stale WAL is kept for a retry")

    def _quarantine(self, topic: TopicName, path: str, leaf: str) -> str:
        """Move the WAL's files to ``<root>/.quarantine/<ns>/<topic>/<leaf>/`` through the
        WAL's file layer, durably: every new directory's parent and both ends are fsynced."""
        fs = self.fs
        qroot = os.path.join(self.wal_root, QUARANTINE_DIR)
        qpath = os.path.join(qroot, topic.namespace, topic.name, leaf)
        fs.makedirs(qpath)
        for directory in (self.wal_root, qroot, os.path.dirname(os.path.dirname(qpath)), os.path.dirname(qpath)):
            fs.fsync_dir(directory)
        # A crash in between leaves here a suffix of the WAL without a checkpoint, which
        # opens with the same tip and is moved on by the retry; never a prefix that would
        # look like a shorter history (wal.fs.crash_safe_order).
        names = crash_safe_order(fs.listdir(path))
        # A quarantined WAL may be the only copy of lost messages: never overwrite one. (A
        # retry after a partial move finds only the files not moved yet still here.)
        if "wal.ckpt" in names and fs.exists(os.path.join(qpath, "wal.ckpt")):
            # A retry: the checkpoint moved first describes the whole WAL; the one here was
            # rewritten when the retry opened the rest (derived data, dropped).
            names.remove("wal.ckpt")
            fs.remove(os.path.join(path, "wal.ckpt"))
        clashes = [n for n in names if fs.exists(os.path.join(qpath, n))]
        if clashes:
            raise StorageError(f"quarantine {qpath} already holds {', '.join(sorted(clashes))} from another "
                               f"WAL; {path} is kept in place")
        for name in names:
            fs.rename(os.path.join(path, name), os.path.join(qpath, name))
        if fs.exists(os.path.join(path, LOCK_NAME)):
            fs.remove(os.path.join(path, LOCK_NAME))
        fs.fsync_dir(qpath)
        fs.fsync_dir(path)
        fs.rmdir(path)
        fs.fsync_dir(os.path.dirname(path))
        return qpath

    def _delete_local(self, topic: TopicName) -> None:
        """Remove a closed stale WAL whose every offset is archived (durably: dir fsynced)."""
        path = self._local_wal_path(topic)
        # The .owner marker goes last: a crash part-way leaves a WAL that opens and still
        # says which epoch wrote it, so the retry decides the same way (wal.fs.crash_safe_order).
        for name in [*crash_safe_order(self.fs.listdir(path)), LOCK_NAME]:
            if name == LOCK_NAME and not self.fs.exists(os.path.join(path, name)):
                continue
            self.fs.remove(os.path.join(path, name))
        self.fs.rmdir(path)
        self.fs.fsync_dir(os.path.dirname(path))

    def _mark_open(self, token: OwnerToken, plan: RestorePlan, recovered: bool,
                   retired: RetiredWal | None) -> int:
        """Write the open state and the LostRange of every history this load continues
        after without its WAL; returns how many offsets those records know were lost."""
        ops: list[Any] = [Put(keys.state_key(token.topic), opened_state(token, plan).to_json())]
        unarchived = 0
        for broker_id, epoch in self._unrecorded_histories(token, plan, recovered, retired):
            # The takeover's own account, in the same fenced txn as the open marker: where
            # numbering restarts and how much that owner is known to have lost (its last
            # published tip). Its WAL, if it comes back, makes the record exact.
            start = plan.start_offset
            at_least = unarchived_by(plan.progress, broker_id, epoch, start)
            unarchived += at_least
            record = keys.LostRange(start, start + at_least - 1 if at_least > 0 else None,
                                    broker_id, epoch, False, None, token.broker_id, time.time())
            ops.append(Put(keys.lost_key(token.topic, start, epoch), record.to_json()))
        result = self.metadata.txn(token.fencing, ops)
        if not result.succeeded:
            raise OwnershipLostError(token.topic, "mark topic open")
        return unarchived

    def _unrecorded_histories(self, token: OwnerToken, plan: RestorePlan, recovered: bool,
                              retired: RetiredWal | None) -> list[tuple[str, int]]:
        """The unsealed histories this load continues after without having their WAL,
        that no LostRange accounts for yet.

        * Every history the owner record says we inherited (taken from another holder by
          this acquire, or by an earlier attempt of ours that failed before recording it:
          :func:`tiered.lifecycle.ownership.inherited_histories`).
        * Our own previous epoch, when this load neither recovered its WAL nor retired it
          here as that epoch's history: it ran elsewhere (another data dir of this broker
          id) or left nothing on this disk. A stale WAL of ours retired here is an OLDER
          history, already recorded by whoever took it over."""
        previous = token.previous
        held = OwnerRecord.decode(token.key, token.held_bytes)
        wanted = list(held.inherits)
        if (not recovered and not _is_sealed(plan) and previous is not None
                and previous.holder == token.broker_id
                and not (retired is not None and (retired.epoch == previous.epoch or retired.current))):
            wanted.append((previous.broker_id, previous.epoch))
        if not wanted:
            return []
        recorded = {(r.broker_id, r.epoch) for r in keys.read_lost_ranges(self.metadata, token.topic)}
        if retired is not None and retired.current and previous is not None:
            recorded.add((token.broker_id, previous.epoch))  # its retire wrote the exact record
        return [pair for pair in dict.fromkeys(wanted) if pair not in recorded]

    def _start_uploader(self, token: OwnerToken, wal: Any, plan: RestorePlan) -> Any:
        from uploader import Uploader
        from uploader.metrics import UploaderMetrics

        uploader = Uploader(token.topic, wal, self.metadata, self.objects, broker_id=self.broker_id,
                            fencing=token.fencing, config=self.config.uploader,
                            committed_through=plan.committed_through,
                            metrics=UploaderMetrics.create(self.metrics_registry))
        uploader.start()
        return uploader

    def _open_subscriptions(self, token: OwnerToken, wal: Any) -> Any:
        from tiered.read.subscriptions import SubscriptionManager

        return SubscriptionManager(token.topic, self.metadata, fencing=token.fencing, wal=wal,
                                   flush_every_acks=self.config.cursor_flush_every_acks,
                                   flush_interval_s=self.config.cursor_flush_interval_s,
                                   metrics=self.read_metrics)

    def _report_restore(self, topic: TopicName, report: RestoreReport, token: OwnerToken) -> None:
        if report.unarchived_at_least > 0:
            self.metrics.failovers.inc()
            self.metrics.unarchived_on_failover.labels(str(topic)).set(report.unarchived_at_least)
            log.warning("topic %s: failover from %s (died unsealed): at least %d offsets of its WAL were "
                        "never archived and are lost; continuing at %d (epoch %d)", topic,
                        report.previous_owner, report.unarchived_at_least, report.start_offset, token.epoch)
        if report.clamped_cursors:
            log.warning("topic %s: %d subscription cursor(s) moved back to %d at load: %s", topic,
                        len(report.clamped_cursors), report.start_offset - 1,
                        ", ".join(f"{n} was {c}" for n, c in sorted(report.clamped_cursors.items())))
        log.info("topic %s: loaded at epoch %d, next offset %d%s (%.3fs)", topic, token.epoch,
                 report.start_offset, " (recovered local WAL)" if report.recovered_local_wal else "", report.load_s)

    # -- unload ------------------------------------------------------------------
    def unload(self, name: TopicName | str) -> int | None:
        """Seal ``name`` and let go of it; returns its last committed offset (None if
        the topic never had a message). See the module docstring for the steps."""
        topic = TopicName.parse(name)
        with self._topic_lock(topic):
            hosted = self.topic(topic)
            started = time.monotonic()
            last = self._seal(hosted)
            self._cleanup(hosted)
            with self._lock:
                self._topics.pop(topic, None)
        self.metrics.unload_seconds.observe(time.monotonic() - started)
        log.info("topic %s: unloaded, sealed at %s (%.3fs)", topic, last, time.monotonic() - started)
        self._notify(1, topic, "sealed")
        return last

    async def unload_async(self, name: TopicName | str) -> int | None:
        return await asyncio.to_thread(self.unload, name)

    def _seal(self, hosted: HostedTopic) -> int | None:
        if hosted.state is TopicState.SEALED:
            return hosted.last_committed_offset
        if hosted.state is TopicState.CLOSED:
            raise UnloadError(hosted.topic, "unload", "topic is closed on this broker")
        topic, cfg = hosted.topic, self.config
        with hosted._append_lock:
            hosted.state = TopicState.UNLOADING
        hosted._move_readers_away()
        _step(topic, "flush WAL", UnloadError, lambda: _flush_wal(hosted.wal, cfg.flush_timeout_s))
        _step(topic, "flush subscription cursors", UnloadError, hosted.subscriptions.flush_all)
        # The drain can take long; if this broker dies in it, the next owner reports
        # the unarchived tail from this record, so publish the now-flushed tip first.
        _quietly(hosted.publish_progress)
        last = _step(topic, "drain uploader", UnloadError, lambda: self._drain(hosted))
        # Consumers keep acking during the drain; refuse further acks and write what
        # moved, or those acks would be dropped and the next owner re-serve them. (A
        # retried unload writes any cursor this left unwritten at the flush above.)
        _step(topic, "flush subscription cursors", UnloadError,
              lambda: hosted.subscriptions.close(flush=True))
        _step(topic, "write sealed state", UnloadError, lambda: self._write_seal(hosted, last))
        hosted.last_committed_offset = last
        hosted.state = TopicState.SEALED
        return last

    def _drain(self, hosted: HostedTopic) -> int | None:
        last = hosted.uploader.drain(self.config.uploader.drain_timeout_s)
        tip = hosted.wal.next_offset - 1
        expected = None if tip < 0 else tip
        # Seal must name exactly the last archived offset, which after a drain is the
        # WAL tip; anything else would let the next owner reuse or skip offsets.
        if last != expected:
            raise RuntimeError(f"uploader drained through {last} but the WAL tip is {expected}")
        return last

    def _write_seal(self, hosted: HostedTopic, last: int | None) -> None:
        token = hosted.token
        ops = [Put(keys.state_key(token.topic), sealed_state(token, last).to_json()),
               *release_ops(token), Delete(progress_key(token.topic))]
        try:
            result = self.metadata.txn(token.fencing, ops)
        except StorageError:
            # The outcome of a timed-out txn is unknown: it may have landed.
            if self._seal_landed(token, last):
                return
            raise
        if not result.succeeded and not self._seal_landed(token, last):
            raise OwnershipLostError(token.topic, "write sealed state")

    def _seal_landed(self, token: OwnerToken, last: int | None) -> bool:
        """A retried seal whose earlier attempt did land is a success, not a fencing error."""
        kv = self.metadata.get(token.key)
        state_kv = self.metadata.get(keys.state_key(token.topic))
        if kv is None or state_kv is None:
            return False
        owner = OwnerRecord.decode(kv.key, kv.value)
        state = keys.SealedState.from_json(state_kv.key, state_kv.value)
        return (owner.broker_id == token.broker_id and owner.epoch == token.epoch and owner.holder is None
                and state.sealed and state.broker_id == token.broker_id and state.last_committed_offset == last)

    def _cleanup(self, hosted: HostedTopic) -> None:
        topic = hosted.topic
        _step(topic, "stop uploader", UnloadError, lambda: hosted.uploader.stop(self.config.close_timeout_s))
        _step(topic, "close subscriptions", UnloadError, lambda: hosted.subscriptions.close(flush=False))
        _step(topic, "delete local WAL", UnloadError, lambda: _close_and_delete(hosted.wal))
        hosted.state = TopicState.CLOSED

    # -- crash / shutdown --------------------------------------------------------
    def abandon(self, name: TopicName | str) -> None:
        """Drop a topic WITHOUT sealing: stop its threads and close its WAL, keeping the
        files and the ownership record. What a crash leaves behind; also the way out
        for a topic fenced by a newer owner."""
        topic = TopicName.parse(name)
        with self._topic_lock(topic):
            hosted = self.topic(topic)
            with hosted._append_lock:
                hosted.state = TopicState.UNLOADING  # no more appends
            # The durable tip as of now, so a takeover's record says how much this WAL
            # holds (a short-lived process would otherwise leave "at least 0"). Fenced:
            # refused, and harmless, when a newer owner exists.
            _quietly(hosted.publish_progress)
            hosted.state = TopicState.CLOSED
            hosted._move_readers_away()
            _quietly(lambda: hosted.uploader.stop(self.config.close_timeout_s))
            _quietly(lambda: hosted.subscriptions.close(flush=False))
            _quietly(hosted.wal.close)
            with self._lock:
                self._topics.pop(topic, None)
        self._notify(1, topic, "abandoned")

    def close(self, *, unload: bool = True, timeout_s: float | None = None) -> None:
        """Stop hosting. Graceful by default: seal every hosted topic (its next owner
        continues exactly after it), deregister, release the WAL root.

        A topic whose seal fails, or that is still hosted when ``timeout_s`` (None: no
        overall bound; every seal step has its own) has passed, is abandoned instead:
        left owned and unsealed with its WAL on disk, so this broker's restart recovers
        it or, once the lease lapses, another broker fails it over (the unarchived tail
        recorded as lost). ``unload=False`` abandons every topic: what a crash does."""
        if self._closed.is_set():
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for hosted in self.topics():
            if unload and (deadline is None or time.monotonic() < deadline):
                try:
                    self.unload(hosted.topic)
                    continue
                except Exception as e:  # noqa: BLE001 - one topic must not keep the others from closing
                    log.error("topic %s: seal at close failed, abandoning it (recoverable): %s: %s",
                              hosted.topic, type(e).__name__, e)
            elif unload:
                log.error("topic %s: close timed out before its seal, abandoning it (recoverable)", hosted.topic)
            _quietly(lambda: self.abandon(hosted.topic))
        self._closed.set()
        self._progress_wake.set()
        self._progress_thread.join(self.config.close_timeout_s)
        if self.session is not None:
            self.session.stop(revoke=True)
        self._root_lock.release()

    async def close_async(self, *, unload: bool = True, timeout_s: float | None = None) -> None:
        await asyncio.to_thread(self.close, unload=unload, timeout_s=timeout_s)

    def __enter__(self) -> "BrokerHost":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "BrokerHost":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()

    # -- lookup and listeners ----------------------------------------------------
    def lookup(self, name: TopicName | str) -> "TopicOwner | None":
        """Which broker owns ``name`` now, and its advertised address (see
        :func:`tiered.lifecycle.ownership.lookup`)."""
        from tiered.lifecycle.ownership import lookup

        return lookup(self.metadata, name)

    async def lookup_async(self, name: TopicName | str) -> "TopicOwner | None":
        return await asyncio.to_thread(self.lookup, name)

    def add_listener(self, *, on_loaded: Callable[[HostedTopic], Any] | None = None,
                     on_unloaded: Callable[[TopicName, str], Any] | None = None,
                     loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Call ``on_loaded(hosted)`` after each load and ``on_unloaded(topic, how)`` after
        each unload (``how``: "sealed" or "abandoned"). Plain functions run on the thread
        that loaded or unloaded (keep them quick); coroutine functions are scheduled on
        ``loop`` (default: the loop running when this is called). A failing listener is
        logged, never fails the load or unload."""
        if loop is None and any(inspect.iscoroutinefunction(cb) for cb in (on_loaded, on_unloaded) if cb):
            loop = asyncio.get_running_loop()
        with self._lock:
            self._listeners.append((on_loaded, on_unloaded, loop))

    def _notify(self, which: int, *args: Any) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for entry in listeners:
            callback, loop = entry[which], entry[2]
            if callback is None:
                continue
            try:
                if inspect.iscoroutinefunction(callback):
                    assert loop is not None
                    asyncio.run_coroutine_threadsafe(callback(*args), loop)
                else:
                    callback(*args)
            except Exception:  # noqa: BLE001 - see add_listener
                log.exception("topic %s: listener failed", args[0])

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RuntimeError(f"broker host {self.broker_id} is closed")

    def _progress_loop(self) -> None:
        """Publish durable tips soon after they move, at most once per interval.

        A durable advance (WAL listener) wakes the loop at once, so after a quiet spell
        the first new tip is published within milliseconds rather than a whole interval
        later; a failover right after a burst then reports it. The pause after each round
        is the rate limit: advances during it coalesce into one write per topic. The
        timeout on the wake retries a write that failed."""
        gap_s = self.config.progress_interval_s
        while not self._closed.is_set():
            self._progress_wake.wait(gap_s)
            self._progress_wake.clear()
            if self._closed.is_set():
                return
            for hosted in self.topics():
                try:
                    hosted.publish_progress()
                except Exception as e:  # noqa: BLE001 - progress is advisory; the next round retries
                    log.warning("topic %s: publishing progress failed: %s", hosted.topic, e)
            if self._closed.wait(gap_s):
                return


# -- helpers -----------------------------------------------------------------------


_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def _encode_marker(body: dict) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({**body, "crc32c": crc32c(text.encode())}, sort_keys=True).encode()


def _decode_marker(raw: bytes) -> dict | None:
    """The marker's fields, or None when it does not parse or its checksum is wrong (a
    flipped digit in an epoch must not decide which history a WAL is)."""
    try:
        body = json.loads(raw)
        crc = body.pop("crc32c")
    except (ValueError, KeyError, AttributeError, TypeError):
        return None
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return body if crc == crc32c(text.encode()) else None


def _fence_if_ownership(hosted: HostedTopic, error: BaseException, step: str) -> None:
    from uploader.errors import OwnershipLost

    if isinstance(error, (OwnershipLost, OwnershipLostError)):
        hosted.fence(step)


def _is_sealed(plan: RestorePlan) -> bool:
    return plan.sealed is not None and plan.sealed.sealed


def _step(topic: TopicName, step: str, error: type[LifecycleError], fn: Callable[[], T]) -> T:
    """Run one named step; failures become ``error`` naming the step, cause kept."""
    try:
        return fn()
    except LifecycleError:
        raise
    except Exception as e:
        raise error(topic, step, f"{type(e).__name__}: {e}") from e


def _flush_wal(wal: Any, timeout_s: float) -> None:
    if wal.flush(timeout_s) is False:
        raise TimeoutError(f"WAL not fsynced within {timeout_s}s")


def _close_and_delete(wal: Any) -> None:
    wal.close()
    wal.delete()


def _undo(actions: list[Callable[[], None]]) -> None:
    for action in reversed(actions):
        _quietly(action)


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - cleanup after a failure must not mask it
        log.warning("cleanup step failed: %s", e)


def _true_if_unsure(fn: Callable[[], bool]) -> bool:
    """``fn()``, or True when it fails: callers ask "is there anything?" and an error
    must count as "maybe" (the answer that never releases or deletes)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - see docstring
        return True
