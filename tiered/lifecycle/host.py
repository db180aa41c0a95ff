"""Topic lifecycle on a broker: load (restore) and unload (seal) with ownership epochs.

One :class:`BrokerHost` per broker process hosts topics; each loaded topic is a
:class:`~tiered.lifecycle.hosted.HostedTopic` holding its WAL, uploader and
subscriptions. The host is the composition root: it builds each topic's parts and
runs the sequences that move a topic; the rules themselves live beside it
(docs/LIFECYCLE.md walks through a move):

* **load**: take ownership (epoch + 1, one txn) → plan where offsets continue
  (:mod:`tiered.lifecycle.restore`) → recover our own local WAL or retire a stale one
  (:mod:`tiered.lifecycle.retire`: quarantined when it holds offsets past the archive)
  and open an empty WAL at the planned offset → mark the topic open (fenced; a
  failover also records a :class:`~tiered.metadata.keys.LostRange`,
  :mod:`tiered.lifecycle.losses`) → clamp cursors past the new next offset → start the
  uploader seeded with the archived tip → subscriptions. A failover (previous owner
  died unsealed) is reported as a metric and a log line.
* **a broker coming back** retires (``retire_stale_wals``) the local WALs of topics it no
  longer holds: never deleted while they hold offsets that were not archived; those are
  quarantined under ``<wal root>/.quarantine/`` and reported exactly.
* **unload** (:mod:`tiered.lifecycle.seal`), in order: refuse appends → flush + fsync
  the WAL → flush cursors → drain the uploader → write ``sealed: true`` and release
  ownership in one fenced txn → only then delete the local WAL. A failed step raises
  :class:`UnloadError` naming it, leaves the WAL and the topic unsealed, and
  ``unload`` again resumes.

Every blocking call has a bound; ``*_async`` variants run blocking work in threads so
an asyncio broker's loop never waits on disk or network.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, NamedTuple, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

from tiered.archive.chain import DescriptorChain
from tiered.lifecycle import seal as sealing
from tiered.errors import StorageError, TopicDeleted, TopicNotFound
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.delete import (
    DeleteReport,
    check_not_deleted,
    delete_topic,
    recreate_compares,
    tombstone_compare,
    topic_exists,
)
from tiered.lifecycle.errors import LoadError, LocalWalUnreadable, TopicNotHosted
from tiered.lifecycle.hosted import HostedTopic, RestoreReport, TopicState
from tiered.lifecycle.metrics import LifecycleMetrics
from tiered.lifecycle.losses import LossRecords, RetiredWal
from tiered.lifecycle.ownership import (
    BrokerSession,
    OwnershipConflict,
    OwnershipLostError,
    OwnerToken,
    TopicOwnedElsewhere,
    TopicOwner,
    acquire,
    lookup,
    read_owner,
    release_ops,
)
from tiered.lifecycle.restore import RestorePlan, opened_state, plan_restore
from tiered.lifecycle.retire import StaleWals, loss_accounted_for, own_open_history_elsewhere
from tiered.lifecycle.steps import quietly, run_step, true_if_unsure, undo
from tiered.lifecycle.wal_root import WalRoot
from tiered.logs import FailureLog
from tiered.metadata import keys
from tiered.metadata.base import MetadataStore, Op, Put, absent, failed_compare
from tiered.metrics import topic_gauge
from tiered.objects.base import ObjectStore
from tiered.read.metrics import ReadMetrics
from tiered.read.subscriptions import SubscriptionManager, clamp_cursors
from tiered.timers import Scheduler
from uploader import Uploader, UploaderPool
from uploader.errors import OwnershipLost
from uploader.metrics import UploaderMetrics
from wal.api import Wal
from wal.errors import CorruptLog, InvalidTopicName
from wal.fs import FileSystem
from wal.heap import HeapFreezer
from wal.metrics import set_per_topic
from wal.topics import TopicName

_T = TypeVar("_T")
log = logging.getLogger(__name__)

#: How often marking a topic open is tried when a loss record appeared meanwhile.
MARK_OPEN_ATTEMPTS = 3


class _Listener(NamedTuple):
    """One ``add_listener`` registration."""

    on_loaded: Callable[[HostedTopic], Any] | None
    on_unloaded: Callable[[TopicName, str], Any] | None
    loop: asyncio.AbstractEventLoop | None


class BrokerHost:
    """Hosts topics for one broker process. Thread-safe; see the module docstring."""

    def __init__(self, broker_id: str, wal_root: str | os.PathLike[str], metadata: MetadataStore,
                 objects: ObjectStore, config: BrokerConfig | None = None, *, wal_fs: FileSystem | None = None,
                 retire_stale_wals: bool = True, metrics_registry: CollectorRegistry | None = None,
                 metrics_per_topic: bool | None = None) -> None:
        """``wal_fs`` is the file layer every WAL of this host runs on (``wal.fs``; the
        real disk by default). ``retire_stale_wals`` scans the WAL root at start for
        WALs of topics this broker no longer holds (see :meth:`retire_stale_wals`).
        ``metrics_registry`` receives the host's, its WALs', its readers' and its
        uploaders' metrics; the host is a composition root, so it defaults to
        prometheus_client's process-wide ``REGISTRY``. ``metrics_per_topic`` chooses the
        registry's cardinality (``wal.metrics.set_per_topic``; None keeps the registry's
        choice, per topic unless set; None here falls back to ``config.metrics_per_topic``,
        the ``broker.metrics_per_topic`` key): turn it off for hosts of many topics (see
        docs/METRICS.md)."""
        keys.broker_assignments_prefix(broker_id)  # validates the id as a key segment
        self.broker_id = broker_id
        self.wal_root = os.fspath(wal_root)
        self.metadata = metadata
        self.objects = objects
        self.config = config or BrokerConfig()
        self.wal_fs = wal_fs
        self.metrics_registry = metrics_registry if metrics_registry is not None else REGISTRY
        if metrics_per_topic is None:
            metrics_per_topic = self.config.metrics_per_topic
        if metrics_per_topic is not None:
            set_per_topic(self.metrics_registry, metrics_per_topic)
        self.metrics = LifecycleMetrics.create(self.metrics_registry)
        self.read_metrics = ReadMetrics.create(self.metrics_registry)
        #: The WAL root, locked and claimed for this broker id until close().
        self.root = WalRoot(broker_id, self.wal_root, wal_fs, self.config.wal_config, self.metrics_registry)
        #: Every lookup of the WAL root goes through the WAL's own file layer.
        self.fs = self.root.fs
        self.losses = LossRecords(metadata, broker_id)
        #: This broker's stale local WALs: current or not, delete or quarantine.
        self.stale = StaleWals(self.root, metadata, self.losses, self.metrics)
        #: Stale WALs retired by this host (deleted or quarantined), oldest first.
        self.retired: list[RetiredWal] = self.stale.retired
        self._topics: dict[TopicName, HostedTopic] = {}
        self._lock = threading.Lock()
        self._topic_locks: dict[TopicName, _TopicLockEntry] = {}
        # The newest epoch this host instance acquired of each topic it loaded: a copy fenced
        # by one of them was superseded by this host's own reload of the same WAL.
        self._acquired: dict[TopicName, int] = {}
        self._listeners: list[_Listener] = []
        try:
            self._closed = threading.Event()
            #: Set when close() begins: loads and creates are refused from then on.
            self._closing = threading.Event()
            self.session: BrokerSession | None = None
            if self.config.register_session:
                self.session = BrokerSession(metadata, broker_id, self.config.session_ttl_s,
                                             self.config.advertised_address).start()
            # Set by every hosted WAL's durable listener: the progress thread publishes soon
            # after data becomes durable instead of on a fixed tick (see _progress_loop).
            self._progress_wake = threading.Event()
            #: Background uploads of every hosted topic: a fixed number of threads,
            #: whatever the topic count (``upload_workers_max``).
            self.uploader_pool = UploaderPool(self.config.upload_workers_max,
                                              tick_s=self.config.uploader.poll_interval_s)
            #: Background cursor flushes of every hosted topic, on one thread.
            self.cursor_scheduler = Scheduler(f"dnb-cursors-{broker_id}")
            #: Loaded topics' objects frozen out of the cyclic GC's walks (``wal.heap``);
            #: the refreeze job runs on the cursor scheduler's thread.
            self.heap: HeapFreezer | None = None
            if self.config.gc_freeze:
                self.heap = HeapFreezer(self.config.gc_refreeze_interval_s, metrics_registry=self.metrics_registry)
                self.cursor_scheduler.every(self.config.gc_refreeze_interval_s / 4, self.heap.maintain,
                                            "gc-refreeze")
            #: Reopens of topics whose WAL failed on its own, on a thread of their own: a slow
            #: reopen (a restore from the archive, a long recovery) must not hold up cursor flushes.
            self.reopen_scheduler = Scheduler(f"dnb-reopen-{broker_id}")
            self.reopen_scheduler.every(self.config.failed_wal_check_interval_s, self._revive_failed_wals,
                                        "revive-failed-wals")
            if retire_stale_wals:
                self.retire_stale_wals()
            self._progress_thread = threading.Thread(target=self._progress_loop, daemon=True,
                                                     name=f"dnb-progress-{broker_id}")
            self._progress_thread.start()
        except BaseException:
            # A host that failed to start holds nothing: the next attempt must not find
            # its own WAL root locked.
            self._stop_shared_threads()
            if self.session is not None:
                self.session.stop(revoke=True)
            self.root.release()
            raise

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

    @contextlib.contextmanager
    def _topic_lock(self, topic: TopicName, blocking: bool = True) -> Iterator[bool]:
        """Hold ``topic``'s lock (loads, unloads, abandons and deletes of one topic run one
        at a time); yields False, holding nothing, if ``blocking`` is off and it is taken.
        An entry lives only while a thread holds or waits for it, so a host that saw many
        topic names keeps no lock per name it ever saw."""
        with self._lock:
            entry = self._topic_locks.setdefault(topic, _TopicLockEntry())
            entry.users += 1
        try:
            got = entry.lock.acquire(blocking)
            try:
                yield got
            finally:
                if got:
                    entry.lock.release()
        finally:
            with self._lock:
                entry.users -= 1
                if entry.users == 0:
                    del self._topic_locks[topic]

    # -- load --------------------------------------------------------------------
    def load(self, name: TopicName | str, *, force: bool = False,
             discard_local_wal: bool = False, create: bool | None = None,
             accept_lost_own_history: bool = False) -> HostedTopic:
        """Take ownership and restore ``name``; idempotent for a topic already hosted.

        Raises TopicOwnedElsewhere / OwnershipConflict when another broker holds or
        just took it, RestoreMismatch when metadata disagrees, LocalWalUnreadable when
        this broker's WAL of the topic does not open, LoadError otherwise. A failed load
        leaves the topic as recoverable as before (see :meth:`_after_failed_load`).

        ``discard_local_wal`` is the operator's way past LocalWalUnreadable: the WAL is
        quarantined and the range it may have held is recorded as lost, then numbering
        continues after the archive.

        ``accept_lost_own_history`` takes over this broker id's own open history although
        its WAL is not in this WAL root (OwnHistoryElsewhere otherwise, unless
        ``config.own_history_elsewhere`` is "take_over"): its unarchived messages are
        recorded lost, as in a failover. ``force`` implies it.

        A topic already hosted is returned while its owner record is still ours (read
        now): a copy a newer owner took over, or a delete removed, while this host was
        paused is fenced and abandoned, and the load goes on as after a restart.

        ``create`` (None: ``config.auto_create``) lets the load create a topic that does not
        exist; without it such a load raises TopicNotFound and writes nothing. A deleted
        topic (its tombstone written) raises TopicDeleted: only :meth:`create` makes the
        name live again.
        """
        topic = TopicName.parse(name)
        self._check_open()
        abandoned = False
        revived: HostedTopic | None = None
        try:
            with self._topic_lock(topic):
                self._check_open()  # close() began while this waited: it will not see this topic
                with self._lock:
                    existing = self._topics.get(topic)
                if existing is not None and existing.state is TopicState.OPEN and self._wal_failed_alone(existing):
                    # Reopened from its files, as after a restart (raises, keeping the
                    # failed copy, while that cannot be done yet). A copy being unloaded
                    # is left to its unload, which reopens it itself.
                    existing = revived = self._revive_locked(topic, TopicState.OPEN)
                if existing is not None and existing.state is TopicState.OPEN and not existing.fenced:
                    # Still ours? (A paused host's copy of a topic another broker took over
                    # or deleted meanwhile is fenced here instead of handed out as loaded.)
                    # Unreadable now: the copy is returned as before; its acks check
                    # ownership themselves (the lease, and the owner record after a lapse).
                    try:
                        existing.check_ownership()
                    except StorageError as e:
                        log.warning("topic %s: already loaded here; could not re-read its owner record (%s)",
                                    topic, e)
                if existing is not None and existing.fenced:
                    # A newer owner took it over: this copy is what a crash leaves behind
                    # (appends and acks refused, no seal can land). Drop it keeping its WAL
                    # and the owner record, then load as after a restart (the takeover's
                    # recorded range rules what the stale WAL may still serve).
                    log.warning("topic %s: loading again over a copy fenced by a newer owner: abandoning "
                                "that copy", topic)
                    self._abandon_locked(topic)
                    existing, abandoned = None, True
                if existing is not None and existing.state is TopicState.OPEN:
                    return existing
                if existing is not None:
                    raise LoadError(topic, "load", f"topic is {existing.state.value} here; finish unload first")
                if not (force or accept_lost_own_history):
                    self._refuse_own_history_elsewhere(topic)
                hosted = self._load(topic, force, discard_local_wal,
                                    self.config.auto_create if create is None else create, False)
                with self._lock:
                    self._topics[topic] = hosted
        finally:
            # Listeners are told outside the topic lock, as abandon() does.
            if revived is not None:
                self._notify_reopened(topic, revived)
            elif abandoned:
                self._notify(1, topic, "abandoned")
        self._notify(0, hosted)
        return hosted

    def create(self, name: TopicName | str) -> tuple[HostedTopic, bool]:
        """Create ``name`` explicitly and host it: (the hosted topic, whether it was created).

        The one way a deleted topic's name becomes live again: its tombstone (phase
        ``deleted``; a delete still in progress raises TopicDeleted) moves to
        ``recreated`` in the transaction that takes ownership, so the new incarnation's
        epoch continues above the deleted one's (a zombie of it stays fenced) and its
        offsets start at the tombstone's ``next_offset``. A stale local WAL of the deleted
        incarnation is retired, never resumed; it may hold offsets at or above that start
        (a dead owner's ``durable`` acks past its last published tip, the failover bound),
        which are never recorded as the new incarnation's loss. An existing topic is just
        loaded.

        A copy this host still runs is returned only while its owner record is still
        ours (read now): a copy of an incarnation deleted meanwhile through another broker
        (this one paused, unregistered) is fenced and abandoned, as a load abandons a
        fenced copy, and the name is created anew; never handed out as the new topic."""
        topic = TopicName.parse(name)
        self._check_open()
        existed = topic_exists(self.metadata, topic)
        abandoned = False
        try:
            with self._topic_lock(topic):
                self._check_open()  # close() began while this waited: it will not see this topic
                with self._lock:
                    existing = self._topics.get(topic)
                if existing is not None and existing.state is TopicState.OPEN:
                    if existing.check_ownership():
                        return existing, False
                    log.warning("topic %s: create over a copy whose owner record is no longer ours (deleted or "
                                "taken over): abandoning that copy", topic)
                    self._abandon_locked(topic)
                    existing, abandoned = None, True
                if existing is not None:
                    raise LoadError(topic, "load", f"topic is {existing.state.value} here; finish unload first")
                self._refuse_own_history_elsewhere(topic)
                hosted = self._load(topic, False, False, True, True)
                with self._lock:
                    self._topics[topic] = hosted
        finally:
            if abandoned:
                self._notify(1, topic, "abandoned")
        self._notify(0, hosted)
        return hosted, not existed

    def _refuse_own_history_elsewhere(self, topic: TopicName) -> None:
        """OwnHistoryElsewhere (nothing written) when a load here would take over this
        broker id's own open history from another data dir, unless the configuration
        accepts that (``own_history_elsewhere``; see
        :func:`tiered.lifecycle.retire.own_open_history_elsewhere`)."""
        if self.config.own_history_elsewhere == "take_over":
            return
        try:
            elsewhere = own_open_history_elsewhere(self.metadata, self.root, topic)
        except OSError as e:  # out of descriptors, an I/O error: nothing was changed yet
            raise LoadError(topic, "check own history elsewhere", f"the local WAL directory "
                            f"{self.root.path(topic)} could not be read ({e.strerror or e!r}); nothing was "
                            "changed: fix that and retry") from e
        if elsewhere is not None:
            raise elsewhere

    def delete(self, name: TopicName | str, *, on_step: Callable[[str, int], None] | None = None,
               fault_hook: Callable[[str], None] | None = None) -> DeleteReport:
        """Delete ``name`` (:func:`tiered.lifecycle.delete.delete_topic`): every record,
        cursor, descriptor and object, and this broker's local WAL of it.

        Precondition: no other live broker holds the topic (TopicOwnedElsewhere, nothing
        changed). Hosted here, it is sealed first (unload), so nothing is appended, uploaded
        or acknowledged during the delete; a seal that fails abandons it instead (threads
        stopped, WAL closed: its data is being deleted anyway) and the topic is deleted
        while still held by this broker. The local WAL directory goes after the tombstone
        is written, so a crash leaves either a WAL of a tombstoned topic (the next start or
        a re-run deletes it) or nothing. Idempotent and resumable."""
        topic = TopicName.parse(name)
        self._check_open()
        holder = lookup(self.metadata, topic)
        if holder is not None and holder.broker_id != self.broker_id and holder.live:
            raise TopicOwnedElsewhere(topic, holder.broker_id, holder.epoch)
        how = None
        # One hold of the topic lock from "is it hosted here?" to the end of the delete: a
        # load of the topic on this host (which holds the same lock from its acquire to
        # publishing the hosted topic) either finishes first, and is sealed here, or starts
        # after the tombstone and is refused by it. Never a topic this host runs while
        # delete_topic treats "held by this broker" as "no longer running".
        with self._topic_lock(topic):
            with self._lock:
                hosted_here = topic in self._topics
            if hosted_here:
                try:
                    self._unload_locked(topic)
                    how = "sealed"
                except Exception as e:  # noqa: BLE001 - the topic is going away; its data need not be sealed
                    log.warning("topic %s: seal before delete failed (%s: %s); abandoning it and deleting anyway",
                                topic, type(e).__name__, e)
                    quietly(lambda: self._abandon_locked(topic))
                    how = "abandoned"
            with self._lock:
                if topic in self._topics:  # not unloaded nor abandoned: never delete under a running topic
                    raise LoadError(topic, "delete", "the topic is still hosted here and could not be stopped")
            try:
                report = delete_topic(self.metadata, self.objects, topic, broker_id=self.broker_id,
                                      on_step=on_step, fault_hook=fault_hook)
                if self.root.exists(topic):
                    self.stale.delete(topic)
            finally:
                if how is not None:
                    self._notify(1, topic, how)
        return report

    async def load_async(self, name: TopicName | str, *, force: bool = False,
                         discard_local_wal: bool = False, accept_lost_own_history: bool = False) -> HostedTopic:
        return await asyncio.to_thread(self.load, name, force=force, discard_local_wal=discard_local_wal,
                                       accept_lost_own_history=accept_lost_own_history)

    def _load(self, topic: TopicName, force: bool, discard_local_wal: bool, create: bool,
              recreate: bool, stop_when_closing: bool = True) -> HostedTopic:
        started = time.monotonic()
        generation = self.session.generation if self.session is not None else 0
        if recreate:
            compares, tomb_ops, _first = recreate_compares(self.metadata, topic)
        else:
            compares, tomb_ops = tombstone_compare(self.metadata, topic), []
            if not create and self.metadata.get(keys.owner_key(topic)) is None:
                raise TopicNotFound(topic, "auto_create is off; create it first (dnb topic create)")
        token = acquire(self.metadata, topic, self.broker_id, force=force, extra_compares=compares,
                        extra_ops=tomb_ops)
        with self._lock:
            self._acquired[topic] = max(self._acquired.get(topic, 0), token.epoch)
        opened: list[Callable[[], object]] = []
        retired: list[RetiredWal] = []
        plan: RestorePlan | None = None
        wal: Wal | None = None

        def closing(name: str) -> None:
            # A close() that began meanwhile stops the load before its next step, so
            # close() waits for one step at most; undone below as any failed load is.
            # (Not close()'s own reopen of a failed WAL, which it then seals.)
            if stop_when_closing and self._closing.is_set():
                raise LoadError(topic, name, f"broker host {self.broker_id} is closing")

        def step(name: str, fn: Callable[[], _T]) -> _T:
            closing(name)
            return run_step(topic, name, LoadError, fn)

        try:
            plan = plan_restore(self.metadata, token)  # read first: a failed load then knows what to keep
            wal, recovered = step("open WAL", lambda: self._open_wal(token, plan, retired, discard_local_wal))
            opened.append(lambda: wal.close())
            missing = step("open WAL", lambda: self._missing_history(token, recovered, retired))
            step("open WAL", lambda: self.root.write_owner_marker(token, missing))
            retired_here = retired[0] if retired else None
            unarchived = step("mark topic open",
                              lambda: self._mark_open(token, plan, recovered, retired_here, missing if recovered else None))
            # Offsets continue at wal.next_offset. Unsealed, a cursor may have acknowledged
            # offsets past it that nobody archived (a dead owner's tail, or bytes a power
            # loss took); sealed, a cursor past the seal can only be a damaged record. Either
            # way those offsets are about to name new messages the cursor would skip.
            clamped = step("clamp subscription cursors",
                           lambda: clamp_cursors(self.metadata, topic, wal.next_offset, token.fencing,
                                                 self.read_metrics))
            uploader = step("start uploader", lambda: self._start_uploader(token, wal, plan))
            opened.append(lambda: uploader.stop(self.config.close_timeout_s))
            subs = step("open subscriptions", lambda: self._open_subscriptions(token, wal))
            opened.append(lambda: subs.close(flush=False))
            closing("publish")
            # A delete whose tombstone landed after our acquire (it rewrote the owner record,
            # so every fenced write of ours from then on fails) must not leave a topic served
            # here: checked once more before the topic is published as hosted.
            check_not_deleted(self.metadata, topic)
        except BaseException as e:
            undo(opened)
            self._after_failed_load(token, plan, wal)
            deleted = _deleted_meanwhile(self.metadata, topic) if isinstance(e, Exception) else None
            if deleted is not None and not isinstance(e, TopicDeleted):
                raise deleted from e  # the typed cause: the topic was deleted under the load
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

    def _after_failed_load(self, token: OwnerToken, plan: RestorePlan | None, wal: Wal | None) -> None:
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
            nothing_local = not true_if_unsure(lambda: self.root.exists(token.topic))
        fresh = plan is not None and (plan.is_sealed or (token.previous is None and plan.sealed is None
                                                          and plan.descriptor_end is None))
        if plan is None or not fresh or not nothing_local:
            log.warning("topic %s: load failed; broker %s keeps ownership (epoch %d) so its local WAL "
                        "stays recoverable by its next load", token.topic, self.broker_id, token.epoch)
            return
        ops: list[Op] = list(release_ops(token))
        if plan.sealed is not None and plan.sealed.sealed:
            ops.append(Put(keys.state_key(token.topic), plan.sealed.to_json()))
        try:
            if not self.metadata.txn(token.fencing, ops).succeeded:
                log.warning("topic %s: load failed and ownership was already lost", token.topic)
        except Exception as e:  # noqa: BLE001 - the original load error matters more
            log.warning("topic %s: releasing ownership after a failed load failed (kept): %s", token.topic, e)

    def _on_durable(self, _durable_offset: int) -> None:
        # Runs on a WAL writer thread after each fsync: only flag the progress thread,
        # never write metadata here (that would be one etcd write per fsync). Once per
        # round per topic: set() takes a lock, is_set() does not.
        if not self._progress_wake.is_set():
            self._progress_wake.set()

    def _open_wal(self, token: OwnerToken, plan: RestorePlan, retired: list[RetiredWal],
                  discard_local_wal: bool = False) -> tuple[Wal, bool]:
        topic = token.topic
        if self.root.exists(topic):
            ours, wal_epoch = self.stale.is_current(token, plan.start_offset)
            try:
                if ours and plan.may_recover_local:
                    wal, foreign = self._recover_local(topic, plan)
                    if wal is not None:
                        return wal, True
                    # Another broker archived offsets inside this WAL's range: the topic
                    # was taken over since it was written, whatever the owner record and
                    # a damaged marker say. Retired as stale, against its takeover record.
                    ours = not foreign
                if ours:
                    # Our own unsealed WAL that does not join the archive: it begins past
                    # the archive's end (a hole; a WAL the archive went past is foreign
                    # above). Numbering restarts at the planned offset, below the WAL's
                    # first, so all it holds is lost here and now (recorded exactly before
                    # the WAL moves; never deleted as archived). It is the previous
                    # epoch's history, so its record is the takeover's record too.
                    retired.append(replace(self.stale.retire(topic, plan.start_offset, wal_epoch),
                                           current=True))
                else:
                    log.warning("topic %s: retiring a stale local WAL (the topic moved on since)", topic)
                    retired.append(self.stale.retire(topic))
            except LocalWalUnreadable:
                if not discard_local_wal:
                    raise
                retired.append(replace(self.stale.discard_unreadable(topic, plan, wal_epoch if ours else None),
                                       current=ours))
        wal = self.root.open_wal(topic, initial_offset=plan.start_offset)
        if wal.next_offset != plan.start_offset:
            wal.close()
            raise LoadError(topic, "open WAL", f"new WAL starts at {wal.next_offset}, planned {plan.start_offset}")
        return wal, False

    def _recover_local(self, topic: TopicName, plan: RestorePlan) -> tuple[Wal | None, bool]:
        """(our own unsealed WAL if it still joins the archive without a gap, whether
        another broker archived offsets inside its range).

        A WAL that is this broker's current history has every offset it holds archived, if
        at all, by this broker: it was opened where the topic continued under our epoch and
        nobody else wrote since. A descriptor of another broker overlapping it means a
        takeover happened after it was written (the owner record can name us again after a
        failed load of ours, and a damaged ``.owner`` cannot tell the epochs apart).

        Archive retention may have removed those descriptors (the takeover's evidence):
        the archive continuing PAST this WAL's tip is then the evidence left, because our
        own uploader never commits past our WAL's tip. Such a WAL is reported ``foreign``
        too and retired against its takeover record (quarantined with its exact lost
        range when it holds unarchived offsets), never deleted as "all archived": offsets
        below the archive start were archived by SOME owner, not necessarily from these
        bytes (docs/SAFETY.md, "retire a stale WAL")."""
        wal = self.root.open_local(topic)
        first, tip_next = wal.first_offset, wal.next_offset
        if tip_next > first:
            foreign = next((d for d in DescriptorChain(self.metadata, topic).covering(first, tip_next - 1)
                            if d.broker_id != self.broker_id), None)
            if foreign is not None:
                log.warning("topic %s: local WAL %d..%d overlaps %s's archived %d..%d (epoch %d): "
                            "the topic was taken over since it was written; retiring it as stale",
                            topic, first, tip_next - 1, foreign.broker_id, foreign.start_offset,
                            foreign.end_offset, foreign.epoch)
                wal.close()
                return None, True
        if first <= plan.start_offset <= tip_next:
            behind = self._published_past(topic, plan, tip_next)
            if behind is not None:
                wal.close()
                raise LocalWalUnreadable(topic, self.root.path(topic), behind)
            log.info("topic %s: recovered local WAL %d..%d (archive continues at %d)",
                     topic, first, tip_next - 1, plan.start_offset)
            return wal, False
        if plan.start_offset > tip_next:
            if not any(d.broker_id != self.broker_id
                       for d in DescriptorChain(self.metadata, topic).covering(tip_next, plan.start_offset - 1)):
                # Only this broker archived past the WAL's tip: it is not another owner's
                # numbering that went on, but an older copy of our own history (a data dir
                # restored from a backup) whose newer copy archived further. Whatever that
                # history acknowledged past the archive is missing from this one.
                behind = self._published_past(topic, plan, tip_next, needed_next=plan.start_offset)
                if behind is not None:
                    wal.close()
                    raise LocalWalUnreadable(topic, self.root.path(topic), behind)
            log.warning("topic %s: local WAL %d..%d ends below where the archive continues (%d): offsets past "
                        "its tip were archived by another owner since it was written; retiring it as stale",
                        topic, first, tip_next - 1, plan.start_offset)
            wal.close()
            return None, True
        log.warning("topic %s: local WAL %d..%d does not join the archive at %d; retiring it",
                    topic, first, tip_next - 1, plan.start_offset)
        wal.close()
        return None, False

    def _published_past(self, topic: TopicName, plan: RestorePlan, tip_next: int,
                        needed_next: int | None = None) -> CorruptLog | None:
        """Why this WAL, about to be recovered as our current history, lacks acknowledged
        messages (None when nothing says so): the epoch that wrote it (its ``.owner``
        marker, or the open state naming its ``.walid``) published a durable tip at or past
        ``needed_next`` (default ``tip_next``, the WAL's own next offset; for a WAL that
        ends below our own archive, where the archive continues). A published tip was fsynced, so recovery finds it unless synced data
        went missing: a data dir restored from an older copy, a volume rolled back, a disk
        that lost synced writes. Recovering it would reuse those offsets for new messages
        with nothing recorded; refused instead (``LocalWalUnreadable``: the way out,
        ``discard_local_wal``, quarantines it and records the loss first)."""
        progress = plan.progress
        if progress is None or progress.broker_id != self.broker_id or progress.durable_offset is None:
            return None
        if progress.durable_offset < (tip_next if needed_next is None else needed_next):
            return None
        written_by = self.root.read_owner_marker(topic)
        if written_by is None:
            state = plan.sealed
            local_id = self.root.read_wal_id(topic)
            if (state is not None and not state.sealed and state.wal_id is not None and local_id is not None
                    and local_id.hex() == state.wal_id):
                written_by = state.epoch
        # A WAL nothing attributes to an epoch (no marker, no id that reads) is held to the
        # tip this broker published last: recovered as our current history, it must reach
        # it (a copy without its dot files may be an older one).
        if written_by is not None and written_by != progress.epoch:
            return None  # another epoch's tip: not this WAL's to hold
        # A history whose loss is already accounted for (a takeover recorded it, or the
        # holder inherited it) is not this WAL's to hold either: e.g. an empty WAL a load
        # created after a failover back to us, before its marker was written.
        owner, _kv = read_owner(self.metadata, topic)
        if loss_accounted_for(self.metadata, topic, self.broker_id, progress.epoch, owner):
            return None
        wrote = "which wrote it" if written_by is not None else "whose history it is recovered as"
        return CorruptLog(self.root.path(topic), 0, f"it ends at offset {tip_next - 1}, but epoch {progress.epoch} of "
                          f"broker {self.broker_id}, {wrote}, published offset {progress.durable_offset} as "
                          "durable: acknowledged messages are missing from it (a data dir restored from an older "
                          "copy?)")

    # -- stale local WALs --------------------------------------------------------
    def retire_stale_wals(self) -> list[RetiredWal]:
        """Retire the local WAL of every topic under the WAL root that this broker does
        not hold: what a broker coming back after losing its topics finds on its disk.

        A WAL whose every offset is archived is deleted; one holding offsets past where
        the topic continued elsewhere is quarantined and its exact lost range recorded
        (:meth:`StaleWals.retire`). A WAL of a topic this broker still holds is left for
        ``load`` to recover. A failure is logged with its cause and leaves the WAL in
        place (never deleted), so the next start, or a load of the topic, tries again."""
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
                    if topic in self._topics or not self.root.exists(topic):
                        continue  # (a file named like a topic is no WAL: WalRoot.exists)
                    try:
                        owner, _kv = read_owner(self.metadata, topic)
                        if owner is not None and owner.holder == self.broker_id:
                            continue  # still ours (this broker crashed): load recovers it
                        if owner is None and keys.read_tombstone(self.metadata, topic)[0] is None:
                            # This metadata store never knew the topic (no owner record, no
                            # tombstone): nothing says the WAL is stale. Most likely the broker
                            # was started against the wrong store; quarantining would record
                            # its messages lost there and take them out of service here.
                            log.warning("topic %s: local WAL %s left in place: the metadata store has no "
                                        "record of this topic (is it the right store?)", topic,
                                        self.root.path(topic))
                            continue
                        done.append(self.stale.retire(topic))
                    except Exception as e:  # noqa: BLE001 - one bad topic must not stop the broker
                        # The traceback only at DEBUG: the cause is in the message.
                        log.error("topic %s: retiring the stale local WAL failed, kept in place: %s: %s",
                                  topic, type(e).__name__, e, exc_info=e if log.isEnabledFor(logging.DEBUG) else None)
        return done

    def _missing_history(self, token: OwnerToken, recovered: bool,
                         retired: list[RetiredWal]) -> tuple[str, int] | None:
        """An own earlier history the WAL this load opened does not hold, for its marker:
        recovered, the one its marker already names (a created-empty WAL's, still owed if
        the load that created it never marked the topic open); created empty now, our own
        previous epoch's (recorded at mark open). None after retiring or discarding our
        current WAL here: its retire recorded that history's loss itself."""
        if recovered:
            return self.root.read_owner_marker_missing(token.topic)
        previous = token.previous
        if previous is None or previous.holder != self.broker_id or any(r.current for r in retired):
            return None
        return previous.broker_id, previous.epoch

    def _mark_open(self, token: OwnerToken, plan: RestorePlan, recovered: bool,
                   retired: RetiredWal | None, missing: tuple[str, int] | None = None) -> int:
        """Write the open state and the LostRange of every history this load continues
        after without its WAL (``missing``: one the recovered WAL's marker says it lacks);
        returns how many offsets those records know were lost."""
        for _attempt in range(MARK_OPEN_ATTEMPTS):
            records, unarchived = self.losses.takeover_records(token, plan, recovered, retired, missing)
            ops: list[Op] = [Put(keys.state_key(token.topic),
                                 opened_state(token, plan, self.root.read_wal_id(token.topic)).to_json()), *records]
            # Each record only where none is yet: a returning owner's exact record (with
            # its quarantine path) written since they were computed must not be replaced
            # by this "at least" account; the records are computed again instead.
            compares = [*token.fencing, *(absent(op.key) for op in records)]
            if self.metadata.txn(compares, ops).succeeded:
                return unarchived
            if failed_compare(self.metadata, token.fencing) is not None:
                raise OwnershipLostError(token.topic, "mark topic open")
        raise OwnershipConflict(token.topic, f"its loss records kept changing during {MARK_OPEN_ATTEMPTS} attempts "
                                "to mark it open")

    def _start_uploader(self, token: OwnerToken, wal: Wal, plan: RestorePlan) -> Uploader:
        uploader = Uploader(token.topic, wal, self.metadata, self.objects, broker_id=self.broker_id,
                            fencing=token.fencing, config=self.config.uploader,
                            committed_through=plan.committed_through, chain_checked=True,
                            metrics=UploaderMetrics.create(self.metrics_registry))
        uploader.start(self.uploader_pool)
        return uploader

    def _open_subscriptions(self, token: OwnerToken, wal: Wal) -> SubscriptionManager:
        return SubscriptionManager(token.topic, self.metadata, fencing=token.fencing, wal=wal,
                                   flush_every_acks=self.config.cursor_flush_every_acks,
                                   flush_interval_s=self.config.cursor_flush_interval_s,
                                   metrics=self.read_metrics, scheduler=self.cursor_scheduler,
                                   subscriptions_max=self.config.subscriptions_max)

    def _report_restore(self, topic: TopicName, report: RestoreReport, token: OwnerToken) -> None:
        if report.unarchived_at_least > 0:
            self.metrics.failovers.inc()
            unarchived = topic_gauge(self.metrics_registry, self.metrics.unarchived_on_failover, topic)
            unarchived.set(report.unarchived_at_least)
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
        return self._unload(TopicName.parse(name), by_close=False)

    def _unload(self, topic: TopicName, by_close: bool) -> int | None:
        """:meth:`unload`; ``by_close``: close()'s own, which may still reopen a failed WAL
        (to seal it) once the host is closing."""
        revived: list[HostedTopic] = []
        try:
            with self._topic_lock(topic):
                last = self._unload_locked(topic, revived, by_close)
        finally:
            for copy in revived:  # listeners are told outside the topic lock
                self._notify_reopened(topic, copy)
        self._notify(1, topic, "sealed")
        return last

    def _unload_locked(self, topic: TopicName, revived: list[HostedTopic] | None = None,
                       by_close: bool = False) -> int | None:
        """:meth:`unload` for a caller holding the topic lock (listeners not told; a copy
        reopened first is appended to ``revived``; ``by_close``: see :meth:`_unload`)."""
        hosted = self.topic(topic)
        if self._wal_failed_alone(hosted):
            # Its WAL cannot flush, so no seal could ever land: reopen it from its files
            # first (everything acknowledged is in them), then seal that. If it cannot be
            # reopened yet, the failed copy stays hosted as unloading (appends refused), so
            # the watcher keeps retrying the unload.
            hosted = self._revive_locked(topic, TopicState.UNLOADING, by_close)
            if revived is not None:
                revived.append(hosted)
        started = time.monotonic()
        last = sealing.seal(hosted, self.metadata, self.config)
        sealing.cleanup(hosted, self.config)
        with self._lock:
            self._topics.pop(topic, None)
            self._acquired.pop(topic, None)
        self.metrics.unload_seconds.observe(time.monotonic() - started)
        log.info("topic %s: unloaded, sealed at %s (%.3fs)", topic, last, time.monotonic() - started)
        return last

    async def unload_async(self, name: TopicName | str) -> int | None:
        return await asyncio.to_thread(self.unload, name)

    # -- crash / shutdown --------------------------------------------------------
    def abandon(self, name: TopicName | str) -> None:
        """Drop a topic WITHOUT sealing: stop its threads and close its WAL, keeping the
        files and the ownership record. What a crash leaves behind; also the way out
        for a topic fenced by a newer owner."""
        topic = TopicName.parse(name)
        with self._topic_lock(topic):
            self._abandon_locked(topic)
        self._notify(1, topic, "abandoned")

    def _wal_failed_alone(self, hosted: HostedTopic) -> bool:
        """Whether ``hosted``'s WAL failed on its own (a segment write error), the commit
        group still working, the copy not sealed and not fenced by another broker: what a
        reopen fixes."""
        group = self.root.group
        if not (hosted.wal.failed and hosted.state in (TopicState.OPEN, TopicState.UNLOADING)
                and (group is None or not group.failed)):
            return False
        return not hosted.fenced or self._fenced_by_itself(hosted)

    def fenced_by_another(self, hosted: HostedTopic) -> bool:
        """Whether ``hosted`` is fenced by a newer owner other than this broker (no seal of
        it can land: only abandon remains). A copy fenced by this broker's own later epoch
        (a reopen whose load failed midway) is not: its unload reopens and seals it."""
        return hosted.fenced and not (hosted.wal.failed and self._fenced_by_itself(hosted))

    def _fenced_by_itself(self, hosted: HostedTopic) -> bool:
        """A fenced copy whose newer owner is this broker: a reopen whose load failed after
        it had taken the topic at a newer epoch put the old copy back (``_revive_locked``),
        and its old token was then refused. It is still this broker's to reopen: the owner
        record names this broker, held (not released), at a newer epoch. (Only such a
        put-back copy, whose WAL failed, can be superseded by this broker's own load: a
        load returns the hosted copy instead of loading while one is hosted.)"""
        try:
            record, _kv = read_owner(self.metadata, hosted.topic)
        except Exception:  # noqa: BLE001 - unknown: not revivable now, the next check asks again
            return False
        return (record is not None and record.broker_id == self.broker_id and record.released_at is None
                and record.epoch > hosted.token.epoch)

    def _revive_locked(self, topic: TopicName, keep_as: TopicState, by_close: bool = False) -> HostedTopic:
        """Reopen a topic whose WAL failed on its own (caller holds the topic lock); the
        new copy, published. Listeners are the caller's to tell (outside the topic lock).

        Precondition (``_wal_failed_alone``): no seal landed and no other broker fenced the
        copy (so the topic is still ours to reload: its owner record names this broker). Then it
        is what a crash of this one topic leaves: its WAL holds every acknowledged message
        (the failed round was never acknowledged, and was cut back off its segment).

        First the failed WAL is closed and opened again on its own, as a probe: if that
        fails (the disk is still full), nothing else is touched and the failed copy stays
        hosted, in state ``keep_as`` (its appends refused by its WAL), so its load, its
        unload and the periodic check try again; the topic is never left owned here and
        served by nobody. Only then is the copy abandoned (files and owner record kept,
        nothing released) and the topic loaded again. Should that load still fail, the
        failed copy is put back the same way. Refused once the host is closing, except for
        close()'s own unload (``by_close``): a graceful close seals such a topic too, rather
        than leaving it unsealed to a failover that would lose its unarchived tail."""
        if not by_close:
            self._check_open()
        old = self.topic(topic)
        log.warning("topic %s: its WAL failed on its own; reopening it from its files", topic)
        quietly(old.wal.close)  # a failed WAL: closes at once, letting go of its directory
        try:
            probe = self.root.open_local(topic)  # raises while the disk is still full ...
            probe.close()
        except BaseException:
            old.state = keep_as  # ... and nothing else changed
            raise
        self._abandon_locked(topic, fail_archived_waiters=False)
        try:
            hosted = self._load(topic, False, False, False, False, stop_when_closing=not by_close)
        except BaseException:
            old.state = keep_as
            with self._lock:
                self._topics[topic] = old
            raise
        # Acks the old copy took but could not write (its abandon's flush failed) belong
        # to the same history: the new copy writes them, so they are not delivered again
        # (atk30 F1b). Should this fail too, they stay in its memory and its flusher retries.
        for name, cursor in old.subscriptions.unwritten_cursors().items():
            quietly(functools.partial(_carry_ack, hosted, name, cursor))
        if hosted.report.recovered_local_wal:
            old.reopened_as = hosted  # the same WAL files, so the same offsets
        with self._lock:
            self._topics[topic] = hosted
        # Now: its producers waiting for ``archived`` find the new copy and wait on it
        # (HostedTopic._reopened_copy) instead of being told the topic left.
        quietly(lambda: old.uploader.close(self.config.close_timeout_s))
        self.metrics.revived_topics.inc()
        return hosted

    def _revive_failed_wals(self) -> None:
        """Scheduler job: reopen every open topic whose WAL failed on its own."""
        for hosted in self.topics():
            if self._closing.is_set():
                return
            if hosted.state is not TopicState.OPEN or not self._wal_failed_alone(hosted):
                continue
            revived = None
            with self._topic_lock(hosted.topic, blocking=False) as got:
                if not got:
                    continue  # a load or unload of it is running: it reopens the topic itself
                with self._lock:
                    current = self._topics.get(hosted.topic)
                if current is not hosted or not self._wal_failed_alone(hosted) or self._closing.is_set():
                    continue
                try:
                    revived = self._revive_locked(hosted.topic, TopicState.OPEN)
                except Exception as e:  # noqa: BLE001 - the failed copy stays hosted: tried again later
                    log.error("topic %s: reopening its failed WAL failed (tried again in %.0f s): %r",
                              hosted.topic, self.config.failed_wal_check_interval_s, e)
            if revived is not None:  # listeners are told outside the topic lock
                self._notify_reopened(hosted.topic, revived)

    def _notify_reopened(self, topic: TopicName, copy: HostedTopic) -> None:
        """Tell listeners that ``topic``'s failed copy was replaced by ``copy``."""
        self._notify(1, topic, "abandoned")
        self._notify(0, copy)

    def _abandon_locked(self, topic: TopicName, fail_archived_waiters: bool = True) -> None:
        """:meth:`abandon` for a caller holding the topic lock (listeners not told).
        ``fail_archived_waiters`` off: the uploader is stopped, not closed (a reopen
        closes it once the new copy is published)."""
        hosted = self.topic(topic)
        hosted.refuse_appends()  # no more appends
        # A takeover this copy has not noticed yet (nothing left to write here) replaced its
        # unarchived tail: learn it now, so its readers are told where the new owner
        # continues (HistoryDiverged) instead of resuming past its first messages.
        quietly(hosted.check_ownership)
        hosted.state = TopicState.CLOSED
        hosted.move_readers_away()
        # Closed, not just stopped, unless a reopen follows: producers waiting for
        # ``archived`` are told at once (TopicUnloading) instead of waiting out their timeout.
        if fail_archived_waiters:
            quietly(lambda: hosted.uploader.close(self.config.close_timeout_s))
        else:
            quietly(lambda: hosted.uploader.stop(self.config.close_timeout_s))
        # Acks already given are written (fenced: refused, and harmless, once a newer
        # owner exists), so neither a reopen nor a restart delivers them again.
        quietly(lambda: hosted.subscriptions.close(flush=True))
        # Appends already taken become durable (and acknowledged) as the WAL closes ...
        quietly(hosted.wal.close)
        # ... so only now is the durable tip final: published so a takeover's record says
        # how much this WAL holds (a short-lived process would otherwise leave "at least
        # 0"), never less than was acknowledged. Fenced as above.
        quietly(lambda: hosted.publish_progress(final=True))
        with self._lock:
            self._topics.pop(topic, None)
            self._acquired.pop(topic, None)

    def close(self, *, unload: bool = True, timeout_s: float | None = None) -> None:
        """Stop hosting. Graceful by default: seal every hosted topic (its next owner
        continues exactly after it), deregister, release the WAL root.

        A topic whose seal fails, or that is still hosted when ``timeout_s`` (None: no
        overall bound; every seal step has its own) has passed, is abandoned instead:
        left owned and unsealed with its WAL on disk, so this broker's restart recovers
        it or, once the lease lapses, another broker fails it over (the unarchived tail
        recorded as lost). ``unload=False`` abandons every topic: what a crash does.

        A load in flight when close() begins stops before its next step (LoadError, undone
        as any failed load: :meth:`_after_failed_load`), so close() waits for at most one
        of its steps, each bounded on its own; an unload or delete in flight finishes first."""
        if self._closed.is_set():
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            self._closing.set()  # no load or create starts from now on (checked under the topic lock)
            busy = list(self._topic_locks)
        for topic in busy:
            # A load (or a reopen) in flight stops before its next step; an unload or a
            # delete finishes. Either way, once its lock is free, the topic is hosted or
            # not for good (a load that had not taken the lock yet is refused), and every
            # hosted one is closed below.
            with self._topic_lock(topic):
                pass
        for hosted in self.topics():
            if unload and (deadline is None or time.monotonic() < deadline):
                try:
                    self._unload(hosted.topic, by_close=True)
                    continue
                except Exception as e:  # noqa: BLE001 - one topic must not keep the others from closing
                    log.error("topic %s: seal at close failed, abandoning it (recoverable): %s: %s",
                              hosted.topic, type(e).__name__, e)
            elif unload:
                log.error("topic %s: close timed out before its seal, abandoning it (recoverable)", hosted.topic)
            quietly(lambda: self.abandon(hosted.topic))
        self._closed.set()
        self._progress_wake.set()
        self._progress_thread.join(self.config.close_timeout_s)
        self._stop_shared_threads()
        if self.session is not None:
            self.session.stop(revoke=True)
        self.root.release()

    def _stop_shared_threads(self) -> None:
        """Stop the upload pool and the schedulers (after every topic left: each topic's
        own stop already waited for its pass or flush in flight)."""
        pool = getattr(self, "uploader_pool", None)
        if pool is not None:
            quietly(lambda: pool.close(self.config.close_timeout_s))
        for name in ("reopen_scheduler", "cursor_scheduler"):
            scheduler = getattr(self, name, None)
            if scheduler is not None:
                quietly(lambda: scheduler.close(self.config.close_timeout_s))
        heap = getattr(self, "heap", None)
        if heap is not None:
            heap.close()

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
            self._listeners.append(_Listener(on_loaded, on_unloaded, loop))

    def _notify(self, which: int, *args: Any) -> None:
        heap = self.heap
        if heap is not None and which == 0:
            heap.freeze()  # the loaded topic's objects leave the collector's walks
        elif heap is not None:
            heap.changed()  # the unloaded topic's cycles wait for the next refreeze
        with self._lock:
            listeners = list(self._listeners)
        for entry in listeners:
            callback, loop = (entry.on_loaded, entry.on_unloaded)[which], entry.loop
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

    def acquired_here(self, topic: TopicName, epoch: int) -> bool:
        """Whether this host instance took ``topic`` at ``epoch`` (a load of it here)."""
        with self._lock:
            return self._acquired.get(topic) == epoch

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run (nothing can be loaded any more)."""
        return self._closed.is_set()

    @property
    def wal_failure(self) -> BaseException | None:
        """Why the WAL root's commit group failed, or None. Once it has, no topic of this
        host can be acknowledged or loaded until the process restarts (and replays the
        journal): the broker's ``/healthz`` reports it so a supervisor restarts it."""
        group = self.root.group
        return None if group is None else group.failure

    def _check_open(self) -> None:
        if self._closing.is_set():  # set first by close(), so also once closed
            raise RuntimeError(f"broker host {self.broker_id} is {'closed' if self._closed.is_set() else 'closing'}")

    def _progress_loop(self) -> None:
        """Publish durable tips soon after they move, at most once per interval.

        A durable advance (WAL listener) wakes the loop at once, so after a quiet spell
        the first new tip is published within milliseconds rather than a whole interval
        later; a failover right after a burst then reports it. The pause after each round
        is the rate limit: advances during it coalesce into one write per topic. The
        timeout on the wake retries a write that failed."""
        gap_s = self.config.progress_interval_s
        failures: dict[TopicName, FailureLog] = {}  # per topic: first failure, recovery, rate-limited repeats
        while not self._closed.is_set():
            self._progress_wake.wait(gap_s)
            self._progress_wake.clear()
            if self._closed.is_set():
                return
            hosted_now = self.topics()
            for hosted in hosted_now:
                failure_log = failures.get(hosted.topic)
                if failure_log is None:
                    failure_log = failures[hosted.topic] = FailureLog(log, f"topic {hosted.topic}: publishing progress")
                try:
                    hosted.publish_progress()
                except Exception as e:  # noqa: BLE001 - progress is advisory; the next round retries
                    failure_log.failed(e)
                else:
                    failure_log.succeeded()
            for topic in set(failures) - {h.topic for h in hosted_now}:
                del failures[topic]
            if self._closed.wait(gap_s):
                return



def _deleted_meanwhile(metadata: MetadataStore, topic: TopicName) -> TopicDeleted | None:
    """The TopicDeleted a load should raise when a delete's tombstone now blocks the topic
    (None: no blocking tombstone, or it could not be read: the load's own error stands)."""
    try:
        check_not_deleted(metadata, topic)
    except TopicDeleted as e:
        return e
    except Exception:  # noqa: BLE001 - see docstring
        return None
    return None


def _carry_ack(hosted: HostedTopic, name: str, cursor: int) -> None:
    """Acknowledge ``cursor`` on ``hosted``'s subscription ``name`` and write it now. An
    ack past what the new copy holds (an offset the failed round took but never made
    durable: no reader served it) is carried up to the copy's last offset."""
    sub = hosted.subscriptions.subscribe(name)
    if sub.ack(min(cursor, hosted.next_offset - 1)):
        sub.flush()


def _fence_if_ownership(hosted: HostedTopic, error: BaseException, step: str) -> None:
    if isinstance(error, (OwnershipLost, OwnershipLostError)):
        hosted.fence(step)


class _TopicLockEntry:
    """A topic's lock and how many threads hold or wait for it (``BrokerHost._topic_lock``)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
