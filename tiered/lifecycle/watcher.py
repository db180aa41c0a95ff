"""Assignment watcher: the cluster tells a broker which topics to host through metadata.

``/cluster/brokers/<broker_id>/<ns>/<topic>`` present = host it. The watcher loads a
topic on PUT and unloads (seals) it on DELETE, and keeps the broker registered under
a lease (:class:`~tiered.lifecycle.ownership.BrokerSession`) so other brokers know it is alive.

Operator helpers follow the move in the seed document: :func:`request_unload` writes
the ``/cluster/unassigned/<ns>/<topic>`` marker and deletes the assignment in one txn;
:func:`wait_sealed` waits for the old owner's seal; :func:`assign` gives the topic to
the next broker and clears the marker.

Events of one topic are handled in order; different topics proceed in parallel on a
small bounded pool. A load that finds the previous owner still sealing
(:class:`TopicOwnedElsewhere`) is retried with bounded backoff.

A seal this watcher began is never left half done: after ``retry_attempts_max``
failed unload attempts (an object store down during the upload drain) it is reported
once and then retried, one attempt per round with back-off up to
``unload_retry_max_s`` (the worker is free between rounds), for as long as the topic
is still hosted here half-sealed and not fenced (see
:meth:`AssignmentWatcher._unload_unwanted`). Otherwise the topic would stay hosted
with appends refused while the load manager waits for a release nobody retries. A
topic assigned here again meanwhile is loaded again once its seal landed (by the
retry, or by the load itself, which finishes the seal first: ``_finish_unload``).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from native.errors import DnbError
from tiered.backoff import Backoff
from tiered.errors import CompactedRevision, StorageError, WatchOverflow
from tiered.lifecycle.errors import LifecycleError, TopicNotHosted
from tiered.lifecycle.host import BrokerHost
from tiered.lifecycle.hosted import TopicState
from tiered.logs import FailureLog
from tiered.metadata import keys
from tiered.metadata.base import Compare, Delete, DeleteEvent, MetadataStore, Put, PutEvent, Watch
from tiered.errors import OwnershipError
from tiered.lifecycle.ownership import OwnerRecord, owner_key
from tiered.lifecycle.restore import RestoreMismatch, read_sealed_state
from wal.topics import TopicName

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    # Bounded retries of one load/unload; the window must outlast a peer's seal.
    retry_attempts_max: int = 20
    retry_backoff_s: float = 0.05
    retry_backoff_max_s: float = 2.0
    workers_max: int = 4
    stop_timeout_s: float = 30.0
    # An unload that failed retry_attempts_max times is retried while still wanted (see
    # the module docstring), one attempt per round, rounds backing off up to this.
    unload_retry_max_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("retry_attempts_max", "workers_max"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("retry_backoff_s", "retry_backoff_max_s", "stop_timeout_s", "unload_retry_max_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


class AssignmentWatcher:
    """Loads/unloads topics on ``host`` as ``/cluster/brokers/<id>/`` changes."""

    def __init__(self, host: BrokerHost, config: WatcherConfig | None = None,
                 on_error: Callable[[TopicName, str, BaseException], None] | None = None) -> None:
        self.host = host
        self.metadata = host.metadata
        self.config = config or WatcherConfig()
        self.prefix = keys.broker_assignments_prefix(host.broker_id)
        self.on_error = on_error
        self.errors: list[tuple[TopicName, str, BaseException]] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(self.config.workers_max, f"dnb-assign-{host.broker_id}")
        self._tails: dict[TopicName, concurrent.futures.Future[None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: Watch failures: the first and the recovery logged, repeats rate-limited.
        self._watch_failures = FailureLog(log, f"broker {host.broker_id}: assignment watch")
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        #: Unloads that outlasted their bounded attempts and are still wanted, by topic.
        self._unload_retries: dict[TopicName, _UnloadRetry] = {}
        self._retry_cond = threading.Condition()
        self._retry_thread: threading.Thread | None = None

    def start(self) -> "AssignmentWatcher":
        if self.host.session is None:
            raise RuntimeError("the broker host has no session lease; enable BrokerConfig.register_session")
        self._retry_thread = threading.Thread(target=self._retry_loop, daemon=True,
                                              name=f"dnb-unload-retry-{self.host.broker_id}")
        self._retry_thread.start()
        revision = self._resync()
        self._thread = threading.Thread(target=self._run, args=(revision + 1,), daemon=True,
                                        name=f"dnb-watch-{self.host.broker_id}")
        self._thread.start()
        return self

    async def start_async(self) -> "AssignmentWatcher":
        """``start`` for asyncio: the initial resync loads topics (disk and network)."""
        return await asyncio.to_thread(self.start)

    async def stop_async(self) -> None:
        await asyncio.to_thread(self.stop)

    def stop(self) -> None:
        self._stop.set()
        with self._retry_cond:
            self._retry_cond.notify_all()
        if self._watch is not None:
            self._watch.cancel()
        if self._thread is not None:
            self._thread.join(self.config.stop_timeout_s)
        if self._retry_thread is not None:
            self._retry_thread.join(self.config.stop_timeout_s)
        self._pool.shutdown(wait=True, cancel_futures=False)

    def unload_retrying(self) -> list[TopicName]:
        """Topics whose unload outlasted its bounded attempts and is being retried."""
        with self._retry_cond:
            return sorted(self._unload_retries, key=str)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every queued load/unload finished; False after ``timeout_s``."""
        with self._lock:
            pending = list(self._tails.values())
        done, not_done = concurrent.futures.wait(pending, timeout=timeout_s)
        return not not_done

    # -- internals ----------------------------------------------------------------
    def _resync(self) -> int:
        """Load every assigned topic, unload hosted ones no longer assigned; returns the
        revision the state was read at (watch from the next one)."""
        revision = self.metadata.current_revision()
        assigned = {keys.topic_from_key(kv.key, self.prefix) for kv in self.metadata.range(self.prefix)}
        for topic in assigned:
            self._submit(topic, "load")
        for hosted in self.host.topics():
            if hosted.topic not in assigned:
                self._submit(hosted.topic, "unload")
        return revision

    def _run(self, start_revision: int) -> None:
        while not self._stop.is_set():
            try:
                self._watch = self.metadata.watch_prefix(self.prefix, start_revision)
                self._watch_failures.succeeded()
                for event in self._watch:
                    self._dispatch(event)
                    start_revision = event.revision + 1
            except (CompactedRevision, WatchOverflow) as e:
                log.warning("broker %s: assignment watch lost history (%s); resyncing", self.host.broker_id, e)
                start_revision = self._resync() + 1
            except StorageError as e:
                self._watch_failures.failed(e, "failed; rewatching")
                self._stop.wait(self.config.retry_backoff_max_s)

    def _dispatch(self, event: PutEvent | DeleteEvent) -> None:
        try:
            topic = keys.topic_from_key(event.key, self.prefix)
        except ValueError as e:
            log.error("broker %s: ignoring assignment key %r: %s", self.host.broker_id, event.key, e)
            return
        self._submit(topic, "load" if isinstance(event, PutEvent) else "unload")

    def _submit(self, topic: TopicName, action: str) -> None:
        with self._lock:
            previous = self._tails.get(topic)
            self._tails[topic] = self._pool.submit(self._handle, topic, action, previous)

    def _handle(self, topic: TopicName, action: str, previous: concurrent.futures.Future[None] | None) -> None:
        if previous is not None:
            concurrent.futures.wait([previous])  # keep one topic's events in order
        if action == "unload-retry":
            self._retry_unload(topic)
            return
        backoff = Backoff(self.config.retry_backoff_s, self.config.retry_backoff_max_s)
        for attempt in range(1, self.config.retry_attempts_max + 1):
            if self._stop.is_set():
                return
            try:
                self._apply(topic, action)
                # A seal retried past its attempts has landed now (a load finishes one first).
                self._unload_done(topic, "unloaded")
                return
            except RestoreMismatch as e:  # metadata disagrees with itself: retrying cannot help
                self._report(topic, action, e)
                return
            except (StorageError, LifecycleError, OwnershipError) as e:
                if attempt == self.config.retry_attempts_max:
                    if action == "unload" and self._keep_unloading(topic):
                        self._report(topic, action, e, retrying=True)
                        self._schedule_unload_retry(topic, e)
                    else:
                        self._report(topic, action, e)
                        if action == "unload":
                            self._abandon_if_fenced(topic)
                    return
                delay_s = backoff.next_s()
                log.info("topic %s: %s attempt %d failed (%s); retrying in %.2fs", topic, action, attempt, e, delay_s)
                self._stop.wait(delay_s)
            except Exception as e:  # noqa: BLE001 - e.g. RestoreMismatch: retrying will not help
                self._report(topic, action, e)
                return

    # -- unloads retried past the bounded attempts ---------------------------------------
    # Precondition of every retry round (checked before each attempt, and before each
    # round is scheduled): the watcher runs, and the topic is still hosted here with a
    # seal begun and unfinished (state unloading or sealed: appends already refused),
    # not fenced (a newer owner: no seal can land, "only abandon remains"). A round is
    # the same resumable seal as the first attempt (BrokerHost.unload): its only
    # release is the one fenced seal txn (sealed at exactly the drained WAL tip + owner
    # released), so a move's target is still assigned only after that txn landed
    # (CompleteTransfer compares the released owner record). A round never reopens the
    # topic, never releases by itself, never deletes the WAL before the seal landed.
    # Once the seal landed, a topic assigned here again is loaded again (at
    # last_committed_offset + 1, like any load after a seal).
    def _keep_unloading(self, topic: TopicName) -> bool:
        """Whether an unload of ``topic`` that keeps failing is still wanted here."""
        return self._unload_unwanted(topic) is None

    def _unload_unwanted(self, topic: TopicName) -> str | None:
        """Why retrying the unload of ``topic`` is no longer wanted here; None while it is."""
        if self._stop.is_set() or self.host.closed:
            return "the watcher stopped"
        try:
            hosted = self.host.topic(topic)
        except TopicNotHosted:
            return "the topic is no longer hosted here"  # unloaded (or abandoned)
        if self.host.fenced_by_another(hosted):
            return "a newer owner holds the topic (fenced): no seal can land"
        if hosted.state not in (TopicState.UNLOADING, TopicState.SEALED):
            return f"the topic is {hosted.state.value} here"
        return None

    def _schedule_unload_retry(self, topic: TopicName, error: BaseException) -> None:
        with self._retry_cond:
            retry = self._unload_retries.get(topic)
            if retry is None:
                retry = self._unload_retries[topic] = _UnloadRetry(
                    Backoff(self.config.retry_backoff_max_s,
                            max(self.config.retry_backoff_max_s, self.config.unload_retry_max_s)),
                    FailureLog(log, f"broker {self.host.broker_id}: topic {topic}: unload"))
            delay_s = retry.backoff.next_s()
            retry.due = time.monotonic() + delay_s
            self._retry_cond.notify_all()
        # The first failure (the transition) at ERROR, repeats at most every 30 s.
        retry.failures.failed(error, f"failing (retrying every <= {retry.backoff.max_s:.0f}s until the seal "
                                     f"lands)", level=logging.ERROR)

    def _retry_loop(self) -> None:
        """Submits each due unload retry to the topic's event chain (in order with its
        loads and unloads); the pool's workers are free between rounds."""
        with self._retry_cond:
            while not self._stop.is_set():
                now = time.monotonic()
                due = sorted((t for t, r in self._unload_retries.items() if r.due is not None and r.due <= now),
                             key=str)
                for topic in due:
                    self._unload_retries[topic].due = None
                    self._submit(topic, "unload-retry")
                pending = [r.due for r in self._unload_retries.values() if r.due is not None]
                self._retry_cond.wait(None if not pending else max(0.0, min(pending) - now))

    def _retry_unload(self, topic: TopicName) -> None:
        """One retry round: one unload attempt, then the next round or the end."""
        with self._retry_cond:
            if topic not in self._unload_retries:
                return  # done meanwhile (a later unload event sealed it)
        unwanted = self._unload_unwanted(topic)
        if unwanted is not None:
            self._unload_done(topic, unwanted)
            self._abandon_if_fenced(topic)
            return
        try:
            self._apply(topic, "unload")
        except Exception as e:  # noqa: BLE001 - retried (or ended) below; logged by the failure log
            if not isinstance(e, RestoreMismatch) and self._keep_unloading(topic):
                self._schedule_unload_retry(topic, e)
            else:
                self._report(topic, "unload", e)
                self._unload_done(topic, "given up")
                self._abandon_if_fenced(topic)
            return
        self._unload_done(topic, "unloaded")
        self._load_if_assigned(topic)

    def _abandon_if_fenced(self, topic: TopicName) -> None:
        """An unload that ended because a newer owner fenced the topic leaves a copy no
        seal can finish (appends refused; it would stay hosted, in this broker's load
        reports, until a restart). Precondition of dropping it: fenced, so a newer owner
        holds the topic; abandon keeps the WAL files and touches no owner record, as a
        crash would (a later load here starts from them as after a restart)."""
        try:
            hosted = self.host.topic(topic)
        except TopicNotHosted:
            return
        if not self.host.fenced_by_another(hosted):
            return
        log.warning("topic %s: fenced by a newer owner while unloading: abandoning this copy (WAL kept)", topic)
        try:
            self.host.abandon(topic)
        except TopicNotHosted:
            pass

    def _load_if_assigned(self, topic: TopicName) -> None:
        """After a retried seal landed: assigned here again meanwhile (its load event may
        have failed on the unfinished seal), so load it again."""
        try:
            assigned = self.metadata.get(keys.assignment_key(self.host.broker_id, topic)) is not None
        except StorageError as e:
            log.warning("topic %s: sealed; could not read whether it is assigned here again (%s)", topic, e)
            return
        if assigned and not self._stop.is_set():
            log.info("topic %s: sealed, and assigned here again meanwhile: loading it", topic)
            self._submit(topic, "load")

    def _unload_done(self, topic: TopicName, why: str) -> None:
        with self._retry_cond:
            retry = self._unload_retries.pop(topic, None)
        if retry is None:
            return
        if why == "unloaded":
            retry.failures.succeeded()  # logs the recovery once
        else:
            log.warning("topic %s: stopped retrying its unload: %s", topic, why)

    def _apply(self, topic: TopicName, action: str) -> None:
        if action == "load":
            self._finish_unload(topic)
            self.host.load(topic)
            return
        try:
            self.host.unload(topic)
        except TopicNotHosted:
            pass  # already gone (e.g. a replayed DELETE)

    def _finish_unload(self, topic: TopicName) -> None:
        """Assigned here again while a seal this broker began is unfinished (appends
        refused, the seal failing): ``load`` would refuse ("finish unload first"), so
        seal it first. Nothing acknowledged is lost (the seal archives through the WAL
        tip) and the load continues at ``last_committed_offset + 1``. A fenced topic is
        left alone (no seal can land; the load fails as before)."""
        try:
            hosted = self.host.topic(topic)
        except TopicNotHosted:
            return
        if self.host.fenced_by_another(hosted) or hosted.state not in (TopicState.UNLOADING, TopicState.SEALED):
            return
        log.warning("topic %s: assigned here again while its unload is unfinished; sealing it first", topic)
        try:
            self.host.unload(topic)
        except TopicNotHosted:
            pass

    def _report(self, topic: TopicName, action: str, error: BaseException, retrying: bool = False) -> None:
        if not retrying:  # a retried unload is logged by its failure log
            log.error("topic %s: %s gave up: %s", topic, action, error)
        self.errors.append((topic, action, error))
        if self.on_error is not None:
            self.on_error(topic, action, error)


@dataclass(slots=True)
class _UnloadRetry:
    """One topic's unload retried past the bounded attempts."""
    backoff: Backoff
    failures: FailureLog
    due: float | None = None  # monotonic; None while a round is queued or running


# -- operator helpers ------------------------------------------------------------------


class NotAssigned(DnbError, LookupError):
    def __init__(self, topic: TopicName, broker_id: str) -> None:
        super().__init__(f"topic {topic} is not assigned to broker {broker_id}")


def assign(metadata: MetadataStore, topic: TopicName | str, broker_id: str, reason: str | None = None) -> None:
    """Assign ``topic`` to ``broker_id`` (its watcher loads it) and clear the unassigned marker."""
    topic = TopicName.parse(topic)
    record = keys.Assignment(time.time(), reason)
    metadata.txn([], [Put(keys.assignment_key(broker_id, topic), record.to_json()),
                      Delete(keys.unassigned_key(topic))])


def request_unload(metadata: MetadataStore, topic: TopicName | str, from_broker: str,
                   reason: str = "unload", to_broker: str | None = None) -> None:
    """Write the unassigned marker and delete the assignment in one txn; the owner's
    watcher then seals the topic. Refuses when the topic is not assigned there."""
    topic = TopicName.parse(topic)
    assignment = keys.assignment_key(from_broker, topic)
    marker = keys.Unassigned(reason, from_broker, to_broker)
    assigned = Compare(assignment, "version", ">", 0)
    result = metadata.txn([assigned], [Put(keys.unassigned_key(topic), marker.to_json()), Delete(assignment)])
    if not result.succeeded:
        raise NotAssigned(topic, from_broker)


async def assign_async(metadata: MetadataStore, topic: TopicName | str, broker_id: str,
                       reason: str | None = None) -> None:
    await asyncio.to_thread(assign, metadata, topic, broker_id, reason)


async def request_unload_async(metadata: MetadataStore, topic: TopicName | str, from_broker: str,
                               reason: str = "unload", to_broker: str | None = None) -> None:
    await asyncio.to_thread(request_unload, metadata, topic, from_broker, reason, to_broker)


async def wait_sealed_async(metadata: MetadataStore, topic: TopicName | str, timeout_s: float,
                            poll_interval_s: float = 0.02) -> int | None:
    """``wait_sealed`` for asyncio: the loop sleeps between polls, never a thread."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = await asyncio.to_thread(_sealed_now, metadata, TopicName.parse(topic))
        if done is not None:
            return done[0]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topic {topic} not sealed within {timeout_s}s")
        await asyncio.sleep(poll_interval_s)


def _sealed_now(metadata: MetadataStore, topic: TopicName) -> tuple[int | None] | None:
    """(last_committed_offset,) once sealed and released, else None."""
    state = read_sealed_state(metadata, topic)
    kv = metadata.get(owner_key(topic))
    released = kv is not None and OwnerRecord.decode(kv.key, kv.value).holder is None
    return (state.last_committed_offset,) if state is not None and state.sealed and released else None


def wait_sealed(metadata: MetadataStore, topic: TopicName | str, timeout_s: float,
                poll_interval_s: float = 0.02) -> int | None:
    """Wait until the topic is sealed and its owner released it; returns the sealed
    last_committed_offset. TimeoutError after ``timeout_s``."""
    topic = TopicName.parse(topic)
    deadline = time.monotonic() + timeout_s
    while True:
        done = _sealed_now(metadata, topic)
        if done is not None:
            return done[0]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topic {topic} not sealed within {timeout_s}s (state: "
                               f"{read_sealed_state(metadata, topic)})")
        time.sleep(poll_interval_s)
