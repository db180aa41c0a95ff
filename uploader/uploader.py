"""The per-topic uploader: durable WAL frames → dnb1 objects → fenced descriptors.

One pass repeats, up to the durable tip seen when it starts, while an object is due
(by size or age, or at once for a waiter, a request, ``upload_once`` or a drain: see
:mod:`uploader.sizing`):

1. read whole, validated frames from the next unarchived offset, never past the WAL's
   durable watermark (the WAL guarantees it; we re-validate with ``scan_frames`` so a
   partial frame can never reach an object, nor a checkpoint that would start the next
   pass mid-frame and stall the topic's uploads);
2. build the object and ``put(if_absent=True)`` it under the key the range determines;
   if the key exists, adopt it when it holds byte-identical frames, else write the
   epoch-qualified name (an object a descriptor may name is never overwritten);
3. commit the descriptor in one fenced, contiguity-checked transaction;
4. advance ``committed_through`` (waking "archived" waiters) and apply WAL retention to
   segments wholly at or below it;
5. at most every ``archive_retention.check_interval_s``, apply archive retention
   (:mod:`uploader.archive_retention`: fenced like a commit, under the same pass lock,
   never past the chain tip). Only background passes and ``upload_once`` do; a drain
   (seal) never deletes anything.

The checkpoint is the metadata chain itself: after a crash at any step the next pass
re-reads the chain tip, re-reads the same frames and lands on the same key.
"""
from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Sequence

import native
from tiered.backoff import Backoff
from tiered.archive import fetch
from tiered.archive.chain import ChainTip
from tiered.archive.naming import object_id_for, object_key, parse_object_key, range_key_prefix
from tiered.errors import PreconditionFailed, StorageError
from tiered.logs import FailureLog
from tiered.metadata.base import Compare, MetadataStore, failed_compare
from tiered.metrics import topic_gauge
from tiered.objects.base import ObjectInfo, ObjectStore
from uploader.archive_retention import ArchiveRetention, RetentionRun
from uploader.commit import commit_descriptor, read_tip, same_content
from uploader.config import UploaderConfig
from uploader.errors import (
    ArchiveGap,
    CommitConflict,
    DrainTimeout,
    ForeignDescriptor,
    OwnershipLost,
    UploaderStopped,
    UploadError,
)
from uploader.metrics import UploaderMetrics, default_metrics
from uploader.pool import UploaderPool
from uploader.records import ObjectDescriptor, epoch_from_fencing
from uploader.retention import apply_retention
from uploader.sizing import MARK_SLICES, DurableAges
from uploader.waiters import ArchivedWaiters
from wal.api import WalFrameSource
from wal.topics import TopicName

log = logging.getLogger(__name__)

#: Objects committed per pass before yielding (keeps a pool fair across topics).
OBJECTS_PER_PASS_MAX = 64
_JOIN_SLICE_S = 0.05


class Uploader:
    """Archives one topic's durable WAL frames. See the module docstring.

    ``fencing`` are the compares proving this broker still owns the topic; they join
    every descriptor transaction. ``committed_through`` seeds the checkpoint (from the
    sealed state or the last descriptor; None = nothing archived yet); a non-empty
    descriptor chain in metadata always wins over the seed. ``epoch`` names
    epoch-qualified objects; by default it is read from the owner record in ``fencing``.
    ``clock`` (seconds, monotonic) times the interval and the object age bound; tests
    inject a fake one and drive passes with :meth:`run_background_pass`. ``wall_clock``
    (seconds since the epoch) is what archive retention measures descriptor ages against.
    """

    def __init__(self, topic: TopicName | str, wal: WalFrameSource, metadata: MetadataStore,
                 objects: ObjectStore, *, broker_id: str, fencing: Sequence[Compare],
                 config: UploaderConfig, committed_through: int | None,
                 epoch: int | None = None, metrics: UploaderMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, chain_checked: bool = False) -> None:
        """``committed_through``: the chain's end as the load's restore read and checked it
        (None: no descriptor); ``chain_checked``: that read happened, so every descriptor
        past it must be one this uploader committed (see ``_check_tip_is_ours``)."""
        self.topic = TopicName.parse(topic)
        self.wal = wal
        self.metadata = metadata
        self.objects = objects
        self.broker_id = broker_id
        self.fencing = tuple(fencing)
        self.config = config
        self.epoch = epoch if epoch is not None else epoch_from_fencing(self.topic, self.fencing)
        self.metrics = metrics or default_metrics()
        self._seed = committed_through
        self._committed_through = committed_through
        self._tip: ChainTip | None = None  # None: re-read the chain before the next commit
        #: Descriptors of commits sent since the last one known to have landed whose
        #: outcome is unknown (a lost reply, a timeout, a store that applies a write late):
        #: the only descriptors a re-read tip may be beyond what this uploader knows it
        #: committed. A later attempt does not prove an earlier one failed.
        self._in_doubt: list[ObjectDescriptor] = []
        #: Whether a tip read must be checked (``_check_tip_is_ours``): from the start when
        #: the load's restore read the chain (a seed, or ``chain_checked``: it was empty),
        #: else once the chain was read once (that first read is then the baseline).
        self._chain_read = committed_through is not None or chain_checked
        self._pass_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._requested = False
        self._fatal: BaseException | None = None
        self._deferred = False  # the last pass left a not-yet-full object for later
        self._last_error: BaseException | None = None
        #: Upload failures: the first and the recovery logged, repeats rate-limited.
        self._failure_log = FailureLog(log, f"topic {self.topic}: upload")
        self._thread: threading.Thread | None = None
        self._pool: UploaderPool | None = None
        self._clock = clock
        self._next_due_s = clock() + config.interval_s
        self._frame_bytes_avg = 256.0  # learned from every batch; seeds the lag estimate
        self._set_size_cut_at()
        self._ages = DurableAges(config.age_max_s() / MARK_SLICES, wal.durable_offset)
        self._waiters = ArchivedWaiters(str(self.topic))
        self._waiters.advance(committed_through)
        self._listening = False
        self._drain_target: int | None = None
        self._drain_progress: Callable[[int | None, int], None] | None = None
        self.archive_retention = ArchiveRetention(
            self.topic, metadata, objects, fencing=self.fencing, policy=config.archive_retention,
            broker_id=str(broker_id), epoch=self.epoch if self.epoch is not None else 0,
            metrics=self.metrics, wall_clock=wall_clock, fault_hook=config.fault_hook)
        self._archive_retention_due_s = clock()  # the first pass also finishes an interrupted cut
        #: The last archive retention run (None: none yet).
        self.last_archive_retention: RetentionRun | None = None
        #: Cuts whose objects are still to delete (step 3, outside the pass lock), and the
        #: thread deleting them (None: none running); both guarded by _deletes_lock.
        self._deletes_lock = threading.Lock()
        self._deletes_pending: list[RetentionRun] = []
        self._deleter: threading.Thread | None = None
        #: Called (once, from the failing thread) with the fatal error, e.g. OwnershipLost:
        #: the host uses it to stop acknowledging the moment a fenced commit tells it.
        self.on_fatal: Callable[[BaseException], None] | None = None

    # -- public state ---------------------------------------------------------------
    @property
    def committed_through(self) -> int | None:
        """Last offset contained in a committed object (None: nothing archived)."""
        return self._committed_through

    @property
    def failed(self) -> BaseException | None:
        """The fatal error that stopped this uploader (e.g. OwnershipLost), if any."""
        return self._fatal

    @property
    def last_error(self) -> BaseException | None:
        """The error of the last failed upload attempt (storage unavailable, a missing
        bucket, ...) while uploads keep failing; None once a pass succeeds after it.
        Unlike :attr:`failed` it does not stop the uploader: it says why archiving is
        not advancing (an ``archived`` produce that times out is chained to it)."""
        return self._last_error if self._fatal is None else self._fatal

    @property
    def running(self) -> bool:
        return (self._thread is not None or self._pool is not None) and not self._stopping.is_set()

    # -- lifecycle -------------------------------------------------------------------
    def start(self, pool: UploaderPool | None = None) -> None:
        """Start archiving in the background: on an own thread, or in ``pool``."""
        self._raise_if_fatal()
        if self.running:
            return
        self._stopping.clear()
        self._listen_durable()
        if pool is not None:
            self._pool = pool
            pool.register(self)
            return
        self._thread = threading.Thread(
            target=self._run, name=f"uploader-{self.topic.path}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop background archiving; True if the worker ended within ``timeout_s``.

        A pass in flight is not interrupted mid-step (that would only leave an orphan);
        it finishes its current object and returns. Whether on an own thread or in a
        pool, a True return means no background pass of this uploader is running or
        will start (see :meth:`UploaderPool.unregister`).
        """
        self._stopping.set()
        self._wake.set()
        ended = True
        pool, self._pool = self._pool, None
        if pool is not None:
            # Out of the queue, and a pass of ours in flight there has ended: the caller
            # (seal cleanup, abandon) may close the WAL next.
            ended = pool.unregister(self, timeout_s)
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            ended = not thread.is_alive()
        with self._deletes_lock:
            deleter = self._deleter
        if deleter is not None and deleter is not threading.current_thread():
            deleter.join(timeout_s)  # ends after its current batch (it checks _stopping)
        self.metrics.forget_topic(str(self.topic))
        return ended

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop and fail every waiter (UploaderStopped)."""
        self.stop(timeout_s)
        self._waiters.fail(UploaderStopped(f"topic {self.topic}: uploader closed"))

    # -- triggering ------------------------------------------------------------------
    def request_upload(self) -> None:
        """Run a pass soon that archives everything durable, whatever its size or age."""
        self._requested = True
        self._wake_worker()

    def _wake_worker(self) -> None:
        """Have the worker check ``is_due`` now (does not force anything)."""
        self._wake.set()
        if self._pool is not None:
            self._pool.notify(self)

    def wait_archived(self, offset: int, timeout_s: float) -> bool:
        """Block until ``offset`` is in a committed object; False after ``timeout_s``.

        Raises UploaderStopped (cause: the fatal error) if the uploader ends first.
        """
        if self._committed_through is None or self._committed_through < offset:
            self._raise_stopped_if_fatal()
            self.request_upload()
        return self._waiters.wait(offset, timeout_s)

    async def wait_archived_async(self, offset: int, timeout_s: float) -> bool:
        """``wait_archived`` for asyncio producers (no thread per waiter)."""
        if self._committed_through is None or self._committed_through < offset:
            self._raise_stopped_if_fatal()
            self.request_upload()
        return await self._waiters.wait_async(offset, timeout_s)

    # -- one pass, drain ---------------------------------------------------------------
    def upload_once(self) -> int | None:
        """Archive everything durable now, whatever its size or age (bounded retries);
        returns committed_through. An explicit call also waits (bounded) for the object
        deletes of a retention cut it made (background passes never wait for them)."""
        deadline_s = time.monotonic() + self.config.drain_timeout_s
        self._pass_with_retries(deadline_s, retention=True, force=True)
        self.wait_object_deletes(max(0.0, deadline_s - time.monotonic()))
        return self._committed_through

    def drain(self, timeout_s: float | None = None,
              progress: Callable[[int | None, int], None] | None = None) -> int | None:
        """Archive and commit everything up to the WAL tip; returns the last committed offset.

        For seal: waits (bounded) for the tip to be durable, then uploads until it is
        committed. Never deletes WAL segments, so on failure the WAL is intact. Raises
        DrainTimeout (cause: the last storage error) when storage stays down past the
        bound, OwnershipLost when fenced out.

        Progress: ``progress(committed_through, target)`` is called once at the start and
        after every committed object (so at most once per object: cheap), and every
        object is logged at INFO with how far the drain has got. An exception in the
        callback is logged and ignored: reporting never fails a seal.
        """
        timeout_s = self.config.drain_timeout_s if timeout_s is None else timeout_s
        deadline_s = time.monotonic() + timeout_s
        tip = self.wal.next_offset - 1
        if tip < self.wal.first_offset:
            return self._committed_through  # an empty WAL has nothing to archive
        self._drain_target = tip
        self._drain_progress = progress
        try:
            self._report_drain(None)
            self._wait_durable(tip, deadline_s)
            backoff = Backoff(self.config.retry_backoff_s, self.config.retry_backoff_max_s)
            while self._committed_through is None or self._committed_through < tip:
                try:
                    self._pass_with_retries(deadline_s, retention=False, force=True)
                except StorageError as e:
                    # A pass gives up after retry_attempts_max; a drain keeps trying for
                    # its whole time bound (a seal should ride out a short outage).
                    remaining_s = deadline_s - time.monotonic()
                    if not e.retryable:
                        raise
                    if remaining_s <= 0:
                        raise DrainTimeout(f"topic {self.topic}: storage unavailable: {e}") from e
                    time.sleep(backoff.next_s(remaining_s))
                    continue
                if self._committed_through is None or self._committed_through < tip:
                    if time.monotonic() >= deadline_s:
                        raise DrainTimeout(f"topic {self.topic}: archived through "
                                           f"{self._committed_through}, tip is {tip}")
        finally:
            self._drain_target = None
            self._drain_progress = None
        log.info("topic %s: drain done, archived through %s", self.topic, self._committed_through)
        return self._committed_through

    def _report_drain(self, descriptor: ObjectDescriptor | None) -> None:
        """During a drain: log the committed object and call the progress callback."""
        target = self._drain_target
        if target is None:
            return
        done = self._committed_through
        if descriptor is not None:
            base = self.wal.first_offset if self._seed is None else self._seed + 1
            log.info("topic %s: drain committed %d-%d (%s bytes); through %d of %d (%.0f%%)",
                     self.topic, descriptor.start_offset, descriptor.end_offset, descriptor.size,
                     done, target, 100.0 * _fraction(done, base, target))
        callback = self._drain_progress
        if callback is not None:
            try:
                callback(done, target)
            except Exception:  # noqa: BLE001 - progress reporting must never fail a drain
                log.warning("topic %s: drain progress callback failed", self.topic, exc_info=True)

    def _wait_durable(self, offset: int, deadline_s: float) -> None:
        durable = self.wal.durable_offset
        if durable is not None and durable >= offset:
            return
        ok = self.wal.wait_durable(offset, max(0.0, deadline_s - time.monotonic()))
        durable = self.wal.durable_offset
        if ok is False or durable is None or durable < offset:
            raise DrainTimeout(f"topic {self.topic}: offset {offset} not durable in time "
                               f"(durable: {durable})")

    def _pass_with_retries(self, deadline_s: float, retention: bool, force: bool) -> None:
        """One pass; retries retryable storage errors and conflicts with bounded backoff.

        ``force``: cut objects up to the pass bound whatever their size and age."""
        self._raise_if_fatal()
        backoff = Backoff(self.config.retry_backoff_s, self.config.retry_backoff_max_s)
        conflicts = 0
        for attempt in range(1, self.config.retry_attempts_max + 1):
            try:
                with self._pass_lock:
                    self._raise_if_fatal()
                    proved = self._pass(retention, force)
                self._start_object_deletes()
                if proved:
                    # Only a pass that reached the store says it is back: one that found
                    # the next object not full yet and left it for later proves nothing
                    # (logging "recovered" then, while the store is still down, misleads).
                    self._failure_log.succeeded()
                    self._last_error = None
                return
            except OwnershipLost as e:
                self._fail(e, "ownership")
                raise
            except ForeignDescriptor as e:
                log.error("%s", e)
                self._fail(e, "foreign_descriptor")
                raise
            except CommitConflict as e:
                self._count_failure("conflict")
                self._tip = None
                conflicts += 1
                if conflicts > self.config.conflict_retries_max:
                    raise
                log.info("topic %s: %s; re-reading the descriptor chain", self.topic, e)
                continue
            except StorageError as e:
                self._tip = None
                self._last_error = e
                self._count_failure("unavailable" if e.retryable else "other")
                if not e.retryable or attempt == self.config.retry_attempts_max:
                    raise
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0:
                    raise DrainTimeout(f"topic {self.topic}: storage unavailable: {e}") from e
                self._failure_log.failed(e, f"attempt {attempt} failed; retrying")
                time.sleep(backoff.next_s(remaining_s))

    def _pass(self, retention: bool, force: bool) -> bool:
        """One pass; False when it left durable frames for later without reaching the
        object store (the next object not full or old yet), True otherwise."""
        # Bounded to the durable tip seen when the pass starts: chasing a tip that keeps
        # moving cut one small object per WAL fsync while producers were active (3,000
        # messages became 427 objects). What arrives during the pass waits for the next
        # trigger (interval, byte threshold, an archived waiter, a drain) and fills a
        # bigger object. Unless forced, only full or old objects are cut (sizing.py).
        bound = self.wal.durable_offset
        self._ages.note(bound, self._clock())
        self._deferred = False
        uploaded = 0
        try:
            for _ in range(OBJECTS_PER_PASS_MAX):
                if bound is None or not self._upload_next(bound, force):
                    break
                uploaded += 1
        finally:
            self._update_lag()  # also when the pass fails: that is when the lag grows
        if retention:
            self._retain()
        return uploaded > 0 or not self._deferred

    # -- the steps -------------------------------------------------------------------
    def _upload_next(self, bound: int, force: bool) -> bool:
        """Archive the next object, up to ``bound`` at most; False when nothing durable
        is left below it, or (unless ``force``) what is left is neither full nor old."""
        tip = self._chain_tip()
        start = self._next_start(tip)
        durable = self.wal.durable_offset
        if durable is not None:
            durable = min(durable, bound)
        if durable is None or durable < start:
            return False
        target = self.config.target_bytes()
        old = self._age_due(start)
        if not (force or old) and (durable - start + 1) * self._frame_bytes_avg < target:
            self._deferred = True
            return False  # by the estimate, not full yet: no read at all
        started_s = time.monotonic()
        frames, last, full = self._read_batch(start, durable, target)
        if not (force or old or full):
            self._deferred = True
            return False  # the estimate was high (it has just learned): wait for more
        descriptor, how = self._store_object(frames, start, last)
        self._hook("before_commit")
        self._tip = self._commit(descriptor, tip)
        self._hook("after_commit")
        self._advance(last)
        self.metrics.upload_seconds.observe(time.monotonic() - started_s)
        self.metrics.objects.labels(how).inc()
        self.metrics.cuts.labels("forced" if force else "age" if old else "size").inc()
        self.metrics.frame_bytes.inc(len(frames))
        self._report_drain(descriptor)
        return True

    def _chain_tip(self) -> ChainTip:
        if self._tip is None:
            tip = read_tip(self.metadata, self.topic)
            # Ownership is checked AFTER the chain read: if we still own the topic now,
            # every descriptor read is ours or a predecessor's. Without this a fenced
            # owner would take the new owner's descriptors as its own progress and
            # answer its "archived" waiters for messages never archived.
            self._check_still_owner()
            if tip.descriptor is not None and self._chain_read:
                self._check_tip_is_ours(tip.descriptor)
            # Without a seed (``committed_through=None``), the first read is the baseline, as
            # a restore's read of the chain is; every later re-read is checked against it.
            self._chain_read = True
            self._tip = tip
            if tip.descriptor is not None:
                self._advance(tip.descriptor.end_offset)
        return self._tip

    def _check_tip_is_ours(self, tip: ObjectDescriptor) -> None:
        """A re-read tip past what this uploader knows committed must be one of its commits
        whose outcome it did not learn (``_in_doubt``: a lost reply, a timeout, a write the
        store applied late), right after what it knew. Everything at or below what it knew
        is its own or a predecessor's, which the load's restore checked. Anything else (a
        descriptor past a gap, another owner's or epoch's, one rewritten or forged to look
        like its own) raises ForeignDescriptor, which is fatal:
        taking it as progress would acknowledge ``archived`` for offsets in no object and
        let WAL retention delete segments never archived (atk28 F2, atk29 F1)."""
        known = self._committed_through
        if known is not None and tip.end_offset <= known:
            return
        for sent in self._in_doubt:
            if same_content(tip, sent) and (known is None or tip.start_offset == known + 1):
                self._in_doubt = []  # learned: it landed (and so no other attempt did)
                return
        what = "no commit of this uploader is in doubt" if not self._in_doubt else (
            "its commits in doubt were " + ", ".join(f"{d.start_offset}-{d.end_offset} ({d.object_id})"
                                                      for d in self._in_doubt))
        raise ForeignDescriptor(str(self.topic), f"descriptor {tip.start_offset}-{tip.end_offset} ({tip.object_id}, "
                                f"broker {tip.broker_id}, epoch {tip.epoch}) follows offset {known}, and {what}")

    def _check_still_owner(self) -> None:
        failed = failed_compare(self.metadata, self.fencing)
        if failed is not None:
            raise OwnershipLost(str(self.topic), f"upload after the chain read (fencing compare on {failed.key} failed)")

    def _next_start(self, tip: ChainTip) -> int:
        if tip.descriptor is not None:
            if self._seed is not None and self._seed > tip.descriptor.end_offset:
                log.warning("topic %s: seed %d is past the descriptor chain end %d; the chain wins",
                            self.topic, self._seed, tip.descriptor.end_offset)
                self._seed = None
            return tip.descriptor.end_offset + 1
        if self._seed is not None:
            return self._seed + 1
        return self.wal.first_offset

    def _age_due(self, start: int) -> bool:
        """The frame at ``start`` has been durable for the age bound (or longer)."""
        since_s = self._ages.since_s(start)
        return since_s is not None and self._clock() - since_s >= self.config.age_max_s()

    def _age_due_at_s(self) -> float | None:
        """Clock time at which the oldest un-archived durable frame falls due (no I/O)."""
        done = self._committed_through
        since_s = self._ages.since_s(done + 1 if done is not None else self.wal.first_offset)
        return None if since_s is None else since_s + self.config.age_max_s()

    def _read_batch(self, start: int, durable: int, limit: int) -> tuple[bytes, int, bool]:
        """Whole, validated frames from ``start`` (≤ durable), at most about ``limit``
        bytes; returns (frames, last offset, full). ``full``: the budget, not the bound,
        ended the batch."""
        first_offset = self.wal.first_offset
        if start < first_offset:
            raise ArchiveGap(str(self.topic), start, first_offset)
        self._hook("read")
        frames, last = self._read_frames(start, durable, limit)
        if last > durable:
            # The WAL hands out whole chunks up to its own durable tip; a pass bounded
            # below that tip (see _pass) cuts the batch at its bound.
            frames, last = self._trim(frames, start, durable), durable
        full = len(frames) >= limit or last < durable
        end_cut = self._adoptable_end(start, last)
        self._check_frames(frames, start, last, durable)
        if end_cut is not None and end_cut < last:
            frames, last = self._trim(frames, start, end_cut), end_cut
        self._frame_bytes_avg = len(frames) / (last - start + 1)
        self._set_size_cut_at()
        return frames, last, full

    def _read_frames(self, start: int, durable: int, limit: int) -> tuple[bytes, int]:
        """Up to ``limit`` bytes of frames; the WAL stops reads at segment ends, so
        several reads may fill one object (bounded by the byte budget)."""
        chunks: list[bytes] = []
        size, position = 0, start
        while size < limit and position <= durable:
            try:
                data, first, last = self.wal.read_frames(position, limit - size)
            except LookupError as e:  # OffsetBelowRetention: retention raced us
                self._count_failure("gap")
                raise ArchiveGap(str(self.topic), position, self.wal.first_offset) from e
            if not data or first != position or last < first:
                break
            chunks.append(bytes(data))
            size += len(data)
            position = last + 1
        return b"".join(chunks), position - 1

    def _check_frames(self, frames: bytes, start: int, last: int, durable: int) -> None:
        """Pair assertion with the WAL: only whole, valid, contiguous, durable frames."""
        scan = native.scan_frames(frames, 0, None, start, False, False, None)
        problems = []
        if not frames or scan.first_offset != start:
            problems.append(f"starts at {scan.first_offset}, wanted {start}")
        if scan.error is not None or scan.end != len(frames):
            problems.append(f"invalid frame at byte {scan.end}: {scan.error}")
        if scan.last_offset != last or last > durable:
            problems.append(f"ends at {scan.last_offset} (reported {last}, durable {durable})")
        if problems:
            self._count_failure("read")
            raise UploadError(f"topic {self.topic}: WAL returned bad frames: " + "; ".join(problems))

    @staticmethod
    def _trim(frames: bytes, start: int, end_offset: int) -> bytes:
        scan = native.scan_frames(frames, 0, None, start, False, False, end_offset - start + 1)
        return frames[:scan.end]

    def _adoptable_end(self, start: int, last: int) -> int | None:
        """End of an existing object of ours starting at ``start`` that we can re-cover.

        After a crash between PUT and commit, the durable tip has usually moved on; cutting
        the batch at the orphan's end lets us adopt it instead of leaking it.
        """
        ends = []
        epoch = self.epoch if self.epoch is not None else 0
        for info in self.objects.list(range_key_prefix(self.topic, start)):
            name = parse_object_key(self.topic, info.key)
            # Only our own epoch's objects: another owner's key is never ours to adopt.
            if name is not None and name.start_offset == start and name.end_offset <= last and name.epoch == epoch:
                ends.append(name.end_offset)
        return max(ends) if ends else None

    def _store_object(self, frames: bytes, start: int, last: int) -> tuple[ObjectDescriptor, str]:
        data = encode_object(self.topic, frames, self.config, first_offset=start)
        # Our epoch is in every key: no other owner can ever write (or overwrite) these.
        epoch = self.epoch if self.epoch is not None else 0
        candidates = [object_id_for(start, last, epoch), object_id_for(start, last, epoch, secrets.token_hex(4))]
        for how, object_id in zip(("new", "nonce"), candidates):
            key = object_key(self.topic, start, object_id)
            stored = self._put_or_adopt(key, data, frames)
            if stored is not None:
                info, stored_data = stored
                descriptor = self._descriptor(start, last, object_id, info, stored_data)
                return descriptor, "adopted" if stored_data is not data else how
            log.warning("topic %s: %s holds different frames (an earlier owner's orphan); "
                        "not overwriting it", self.topic, key)
        raise UploadError(f"topic {self.topic}: no free object name for {start}-{last}")

    def _put_or_adopt(self, key: str, data: bytes, frames: bytes) -> tuple[ObjectInfo, bytes] | None:
        """(stored object's info, its bytes), or None if the key holds something else.

        The bytes are ``data`` itself for a new object, the existing object's when adopted.
        """
        self._hook("before_put")
        stored = data
        try:
            info = self.objects.put(key, data, if_absent=True)
        except PreconditionFailed:
            existing = self._existing_with_frames(key, data, frames)
            if existing is None:
                return None
            log.info("topic %s: adopting existing object %s", self.topic, key)
            info, stored = self.objects.head(key), existing
            if info.size != len(existing):
                return None  # replaced between our GET and HEAD: not the object we checked
        except StorageError:
            self._count_failure("put")
            raise
        self._hook("after_put")
        self.metrics.object_bytes.observe(info.size)
        return info, stored

    def _existing_with_frames(self, key: str, data: bytes, frames: bytes) -> bytes | None:
        """The existing object's bytes when it is an object of this topic holding exactly
        ``frames``, else None (the caller then writes under a key of its own)."""
        existing = self.objects.get(key)
        if existing == data:
            return existing
        try:
            return existing if fetch.object_frames(existing, key, self.topic) == frames else None
        except native.CodecError:
            log.warning("topic %s: existing object %s is corrupt; leaving it", self.topic, key)
            return None

    def _descriptor(self, start: int, last: int, object_id: str, info: ObjectInfo,
                    stored: bytes) -> ObjectDescriptor:
        # Size and digest come from the bytes we wrote (or checked), not from the store's
        # answer: they are what every reader will hold the object to.
        digest = fetch.object_digest(stored, object_id)
        return ObjectDescriptor(
            start_offset=start, end_offset=last, object_id=object_id, size=len(stored),
            etag=info.etag, created_at=time.time(), broker_id=str(self.broker_id),
            epoch=self.epoch if self.epoch is not None else 0,
            footer_crc32c=digest.footer_crc32c, block_crc32c=digest.block_crc32c,
            compression=self.config.compression,
        )  # fmt: skip

    def _commit(self, descriptor: ObjectDescriptor, tip: ChainTip) -> ChainTip:
        # Until the chain is learned again, a re-read tip may be this commit, whatever this
        # call reports (``_check_tip_is_ours``): even a conflict proves only that this one
        # attempt did not land, not an earlier one a slow store applies later.
        self._in_doubt.append(descriptor)
        try:
            committed = commit_descriptor(self.metadata, self.topic, descriptor, tip, self.fencing)
        except (StorageError, CommitConflict, OwnershipLost) as e:
            if isinstance(e, StorageError) and not isinstance(e, OwnershipLost):
                self._count_failure("commit")
            raise
        # Landed: every attempt before it was at the same key (the chain's next start),
        # which its compare required absent, so none of them did.
        self._in_doubt = []
        return committed

    def _advance(self, committed_through: int) -> None:
        if self._committed_through is not None and committed_through <= self._committed_through:
            return
        self._committed_through = committed_through
        self._set_size_cut_at()
        self._ages.forget_through(committed_through)
        self._waiters.advance(committed_through)

    def _retain(self) -> None:
        if self.config.retention.enabled and self._committed_through is not None:
            apply_retention(self.wal, self._committed_through, self.config.retention, str(self.topic))
            self._hook("after_retention")
        self._retain_archive()

    def _retain_archive(self) -> None:
        """Archive retention, at most every ``check_interval_s``; fenced like a commit
        (OwnershipLost is fatal, as for a commit). Runs after the chain tip was read, so
        ``committed_through`` covers every descriptor it may cut."""
        now_s = self._clock()
        if now_s < self._archive_retention_due_s:
            return
        # Due again after a full interval even if this run fails (a failing run must not
        # repeat on every pass; the uploads themselves are already committed).
        self._archive_retention_due_s = now_s + self.config.archive_retention.check_interval_s
        self._chain_tip()  # ownership checked, committed_through at least the chain end
        run = self.archive_retention.cut(self._committed_through)
        self.last_archive_retention = run
        if run.pending_objects:
            with self._deletes_lock:
                self._deletes_pending.append(run)
        if run.capped:
            self._archive_retention_due_s = now_s  # a long cut goes on at the next pass

    def _start_object_deletes(self) -> None:
        """Step 3 of the cuts of this pass (after the pass lock is released), on a thread
        of its own that ends when nothing is pending: slow deletes never hold up uploads
        or the ``archived`` waiters they answer. The objects are orphans already."""
        with self._deletes_lock:
            if not self._deletes_pending or self._deleter is not None:
                return  # nothing to do, or the running deleter takes these too
            self._deleter = threading.Thread(target=self._delete_objects, daemon=True,
                                             name=f"archive-retention-deletes-{self.topic}")
            self._deleter.start()

    def _delete_objects(self) -> None:
        while True:
            with self._deletes_lock:
                if not self._deletes_pending or self._stopping.is_set():
                    self._deleter = None  # left over on stop: orphans below the start, GC's
                    return
                run = self._deletes_pending[0]
            try:
                self.archive_retention.delete_objects(run)
            except Exception as e:  # noqa: BLE001 - what is left is orphans below the start
                log.warning("topic %s: archive retention left %d objects to orphan GC: %s: %s", self.topic,
                            len(run.pending_objects), type(e).__name__, e)
            with self._deletes_lock:
                self._deletes_pending.remove(run)

    def wait_object_deletes(self, timeout_s: float) -> bool:
        """Wait (bounded) until no cut's objects are left to delete; False on timeout."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            with self._deletes_lock:
                deleter = self._deleter
            if deleter is None:
                return True
            deleter.join(max(0.0, deadline_s - time.monotonic()))
            if deleter.is_alive():
                return False

    # -- background ------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._sleep_s())
            self._wake.clear()
            if self._stopping.is_set():
                break
            if self.is_due():
                self.run_background_pass()

    def _sleep_s(self) -> float:
        now_s = self._clock()
        until_due_s = self._next_due_s - now_s
        age_due_at_s = self._age_due_at_s()
        if age_due_at_s is not None and age_due_at_s > now_s:
            # Only a future due time: one already past (a failing pass) is retried every
            # poll_interval_s through is_due, not in a tight loop.
            until_due_s = min(until_due_s, age_due_at_s - now_s)
        return max(0.0, min(self.config.poll_interval_s, until_due_s))

    def is_due(self) -> bool:
        """An upload was requested, waiters pend, the interval elapsed, the estimated
        un-archived bytes reach the object target, or the oldest un-archived frame is
        old. Cheap (no I/O): the pool's scheduler calls it for every topic."""
        if self._fatal is not None or self._stopping.is_set():
            return False
        if self._requested or self._waiters.pending:
            return True
        now_s = self._clock()
        if now_s >= self._next_due_s:
            return True
        self._ages.note(self.wal.durable_offset, now_s)
        age_due_at_s = self._age_due_at_s()
        if age_due_at_s is not None and now_s >= age_due_at_s:
            return True
        return self._lag_estimate()[1] >= self.config.target_bytes()

    def run_background_pass(self) -> None:
        """One pass for the background worker: logs and counts errors instead of raising.

        Forced (everything durable, whatever its size and age) when an upload was
        requested or an ``archived`` waiter pends; otherwise only full or old objects."""
        if self._stopping.is_set():
            return  # stopped after being queued: the pass would outlive stop()
        force = self._requested or self._waiters.pending
        self._requested = False
        self._next_due_s = self._clock() + self.config.interval_s
        try:
            self._pass_with_retries(time.monotonic() + self.config.drain_timeout_s, retention=True,
                                    force=force)
        except OwnershipLost as e:
            log.error("topic %s: %s; uploader stopped", self.topic, e)
            self._stopping.set()
        except (UploadError, StorageError) as e:
            self._last_error = e
            self._failure_log.failed(e, "pass failed", logging.ERROR)
        except Exception as e:  # noqa: BLE001 - the worker must survive to retry next interval
            self._last_error = e
            self._count_failure("other")
            self._failure_log.failed(e, "pass failed unexpectedly", logging.ERROR, exc_info=True)

    def _listen_durable(self) -> None:
        if self._listening:
            return
        self.wal.add_durable_listener(self._on_durable)
        self._listening = True

    def _on_durable(self, durable: int | None = None, *_args: object) -> None:
        # Runs on the WAL's writer thread, in a commit group once per topic per round (what
        # bounds a broker's latency with many topics: docs/WAL.md): must be cheap and never
        # raise. The size test is one comparison (``_set_size_cut_at``); it was a lag
        # estimate and the config's target each time, about 7,000 instructions per
        # topic-round (bench/bench_round_cost.py --hosted --instructions).
        try:
            if durable is None:
                durable = self.wal.durable_offset
                if durable is None:
                    return
            self._ages.note(durable, self._clock())
            if durable >= self._size_cut_at and self._fatal is None and not self._stopping.is_set():
                self._wake_worker()  # a size cut may be due; not a request (that forces)
        except Exception:  # noqa: BLE001
            log.debug("durable listener failed", exc_info=True)

    def _set_size_cut_at(self) -> None:
        """The durable offset from which the estimated un-archived bytes reach the object
        target: ``_lag_estimate``'s test solved for the durable offset, so the durable
        listener compares one number. Set again whenever what it depends on moves (the
        committed offset, the learned frame size; the target is the config's). Read on
        another thread a moment stale, it only wakes the worker once more than needed, or
        leaves the wake to ``is_due``, which the pool's scheduler polls."""
        done = self._committed_through
        base = (done + 1) if done is not None else self.wal.first_offset
        self._size_cut_at = base - 1 + max(1, math.ceil(self.config.target_bytes() / self._frame_bytes_avg))

    def _lag_estimate(self) -> tuple[int, float]:
        durable = self.wal.durable_offset
        if durable is None:
            return 0, 0.0
        done = self._committed_through
        base = (done + 1) if done is not None else self.wal.first_offset
        lag = max(0, durable - base + 1)
        return lag, lag * self._frame_bytes_avg

    def _update_lag(self) -> None:
        lag, lag_bytes = self._lag_estimate()
        topic_gauge(self.metrics.registry, self.metrics.lag_offsets, self.topic).set(lag)
        topic_gauge(self.metrics.registry, self.metrics.lag_bytes, self.topic).set(lag_bytes)

    # -- failure -----------------------------------------------------------------------
    def _fail(self, error: BaseException, kind: str) -> None:
        self._count_failure(kind)
        self._fatal = error
        self._stopping.set()
        self._wake.set()
        self._waiters.fail(error)
        if self.on_fatal is not None:
            try:
                self.on_fatal(error)
            except Exception:  # noqa: BLE001 - a listener must not hide the uploader's own error
                log.exception("topic %s: on_fatal listener failed", self.topic)

    def _raise_stopped_if_fatal(self) -> None:
        if self._fatal is not None:
            raise UploaderStopped(f"topic {self.topic}: uploader failed: {self._fatal}") from self._fatal

    def _raise_if_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _count_failure(self, kind: str) -> None:
        self.metrics.failures.labels(kind).inc()

    def _hook(self, step: str) -> None:
        hook: Callable[[str], None] | None = self.config.fault_hook
        if hook is not None:
            hook(step)


def _fraction(done: int | None, base: int, target: int) -> float:
    if done is None or target < base:
        return 0.0
    return min(1.0, max(0.0, (done - base + 1) / (target - base + 1)))


def encode_object(topic: TopicName, frames: bytes, config: UploaderConfig, first_offset: int | None = None) -> bytes:
    """The dnb1 object of ``frames`` with the configured block size and compression."""
    level = config.zstd_level if config.compression == "zstd" else 0
    return fetch.encode_object(topic, frames, block_bytes=config.block_bytes, zstd_level=level,
                               first_offset=first_offset)
