"""Topic lifecycle on a broker: load (restore) and unload (seal) with ownership epochs.

One :class:`BrokerHost` per broker process hosts topics; each loaded topic is a
:class:`HostedTopic` holding its WAL, uploader and subscriptions. docs/LIFECYCLE.md
walks through the move; the rules in short:

* **load**: take ownership (epoch + 1, one txn) → plan where offsets continue
  (:mod:`tiered.restore`) → recover our own local WAL or discard a stale one and open
  an empty WAL at the planned offset → mark the topic open (fenced) → start the
  uploader seeded with the archived tip → subscriptions. A failover (previous owner
  died unsealed) is reported as a metric and a log line.
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
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from tiered.config import BrokerConfig
from tiered.errors import StorageError
from tiered.metadata import keys
from tiered.metadata.base import Delete, MetadataStore, Put
from tiered.objects.base import ObjectStore
from tiered.ownership import (
    BrokerSession,
    OwnershipLostError,
    OwnerRecord,
    OwnerToken,
    acquire,
    release,
    release_ops,
)
from tiered.restore import Progress, RestorePlan, opened_state, plan_restore, progress_key, sealed_state
from wal.topics import TopicName

log = logging.getLogger(__name__)

Ack = Literal["durable", "archived"]
T = TypeVar("T")

UNARCHIVED_ON_FAILOVER = Gauge(
    "dnb_failover_unarchived_offsets",
    "At least this many offsets of a dead owner's WAL were never archived (last failover)",
    ["topic"],
)
FAILOVERS = Counter("dnb_failovers_total", "Loads of a topic whose previous owner died without sealing")
LOAD_SECONDS = Histogram("dnb_topic_load_seconds", "Time to load (restore) a topic")
UNLOAD_SECONDS = Histogram("dnb_topic_unload_seconds", "Time to unload (seal) a topic")


# -- errors ------------------------------------------------------------------------


class LifecycleError(Exception):
    """Base class of load/unload/produce errors; ``step`` names what failed."""

    def __init__(self, topic: TopicName, step: str, detail: str) -> None:
        super().__init__(f"topic {topic}: {step} failed: {detail}")
        self.topic = topic
        self.step = step


class LoadError(LifecycleError):
    """Loading failed at ``step``; ownership was released again when that was safe."""


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
class RestoreReport:
    start_offset: int
    recovered_local_wal: bool
    previous_owner: str | None
    #: >0 only on failover: offsets of the dead owner's WAL never archived (lower bound).
    unarchived_at_least: int
    load_s: float


class HostedTopic:
    """A topic this broker owns. Thread-safe."""

    def __init__(self, host: "BrokerHost", token: OwnerToken, wal: Any, uploader: Any,
                 subscriptions: Any, report: RestoreReport) -> None:
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
        self._progress_published: int | None = -1

    # -- producing ---------------------------------------------------------------
    def produce(self, payload: bytes, key: bytes | None = None, attributes: dict | None = None,
                publish_time: int | None = None, *, ack: Ack = "durable",
                timeout_s: float | None = None) -> int:
        """Append one message and wait for ``ack``; returns its offset."""
        _check_ack(ack)
        offset = self._append(payload, key, attributes, publish_time)
        self._wait_ack(offset, ack, self._timeout(timeout_s))
        return offset

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
            if self.state is not TopicState.OPEN:
                raise TopicUnloading(self.topic, "append", f"topic is {self.state.value}")
            return self.wal.append(payload, key=key, attributes=attributes, publish_time=publish_time)

    def _wait_ack(self, offset: int, ack: Ack, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        if self.wal.wait_durable(offset, timeout_s) is False:
            raise ProduceTimeout(self.topic, "wait durable", f"offset {offset} not fsynced within {timeout_s}s")
        if ack == "archived":
            # Ask for an upload now: an archived waiter should not sit out a whole interval.
            self.uploader.request_upload()
            remaining_s = max(0.0, deadline - time.monotonic())
            if self.uploader.wait_archived(offset, remaining_s) is False:
                raise ProduceTimeout(self.topic, "wait archived", f"offset {offset} not archived within {timeout_s}s")

    def _timeout(self, timeout_s: float | None) -> float:
        return self.host.config.produce_timeout_s if timeout_s is None else timeout_s

    # -- reading -----------------------------------------------------------------
    def create_reader(self, start: int | Literal["earliest", "latest"], live: bool = True, **options: Any) -> Any:
        """A tiered reader (cloud → WAL → live) starting at ``start``; ``options`` go to
        :func:`tiered.reader.create_reader` (prefetch_objects, memory_bytes_max)."""
        from tiered.reader import create_reader

        return create_reader(self.topic, self.wal, self.host.metadata, self.host.objects, start,
                             live=live, **options)

    def subscribe(self, name: str, initial: Literal["latest", "earliest"] = "latest") -> Any:
        return self.subscriptions.subscribe(name, initial)

    @property
    def next_offset(self) -> int:
        return self.wal.next_offset

    # -- progress ----------------------------------------------------------------
    def publish_progress(self) -> bool:
        """Publish the durable tip (fenced) if it moved; True when written."""
        durable = _durable_tip(self.wal)
        if self.state is not TopicState.OPEN or durable == self._progress_published:
            return False
        record = Progress(self.token.broker_id, self.token.epoch, durable, time.time())
        result = self.host.metadata.txn(self.token.fencing, [Put(progress_key(self.topic), record.encode())])
        if not result.succeeded:
            log.error("topic %s: progress write refused, ownership lost to a newer epoch", self.topic)
            return False
        self._progress_published = durable
        return True

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
                 objects: ObjectStore, config: BrokerConfig | None = None, *, wal_fs: Any = None) -> None:
        keys.broker_assignments_prefix(broker_id)  # validates the id as a key segment
        self.broker_id = broker_id
        self.wal_root = os.fspath(wal_root)
        self.metadata = metadata
        self.objects = objects
        self.config = config or BrokerConfig()
        self.wal_fs = wal_fs
        self._topics: dict[TopicName, HostedTopic] = {}
        self._lock = threading.Lock()
        self._topic_locks: dict[TopicName, threading.Lock] = {}
        self._closed = threading.Event()
        self.session: BrokerSession | None = None
        if self.config.register_session:
            self.session = BrokerSession(metadata, broker_id, self.config.session_ttl_s).start()
        self._progress_thread = threading.Thread(target=self._progress_loop, daemon=True,
                                                 name=f"dnb-progress-{broker_id}")
        self._progress_thread.start()

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
    def load(self, name: TopicName | str, *, force: bool = False) -> HostedTopic:
        """Take ownership and restore ``name``; idempotent for a topic already hosted.

        Raises TopicOwnedElsewhere / OwnershipConflict when another broker holds or
        just took it, RestoreMismatch when metadata disagrees, LoadError otherwise.
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
            hosted = self._load(topic, force)
            with self._lock:
                self._topics[topic] = hosted
            return hosted

    async def load_async(self, name: TopicName | str, *, force: bool = False) -> HostedTopic:
        return await asyncio.to_thread(self.load, name, force=force)

    def _load(self, topic: TopicName, force: bool) -> HostedTopic:
        started = time.monotonic()
        token = acquire(self.metadata, topic, self.broker_id, force=force)
        opened: list[Callable[[], None]] = []
        try:
            plan = plan_restore(self.metadata, token)
            wal, recovered = _step(topic, "open WAL", LoadError, lambda: self._open_wal(topic, plan))
            opened.append(lambda: wal.close())
            _step(topic, "mark topic open", LoadError, lambda: self._mark_open(token, plan))
            uploader = _step(topic, "start uploader", LoadError, lambda: self._start_uploader(token, wal, plan))
            opened.append(lambda: uploader.stop(self.config.close_timeout_s))
            subs = _step(topic, "open subscriptions", LoadError, lambda: self._open_subscriptions(token, wal))
        except BaseException:
            _undo(opened)
            _release_quietly(self.metadata, token)
            raise
        report = RestoreReport(wal.next_offset if recovered else plan.start_offset, recovered,
                               plan.previous_owner, 0 if recovered else plan.unarchived_at_least,
                               time.monotonic() - started)
        self._report_restore(topic, report, token)
        LOAD_SECONDS.observe(report.load_s)
        return HostedTopic(self, token, wal, uploader, subs, report)

    def _open_wal(self, topic: TopicName, plan: RestorePlan) -> tuple[Any, bool]:
        from wal import WriteAheadLog

        if self._local_wal_exists(topic):
            if plan.may_recover_local:
                wal = self._recover_local(topic, plan)
                if wal is not None:
                    return wal, True
            else:
                log.warning("topic %s: discarding a stale local WAL (the topic moved on since)", topic)
            self._discard_local(topic)
        wal = WriteAheadLog.open(self.wal_root, str(topic), config=self.config.wal_config,
                                 initial_offset=plan.start_offset, fs=self.wal_fs)
        if wal.next_offset != plan.start_offset:
            wal.close()
            raise LoadError(topic, "open WAL", f"new WAL starts at {wal.next_offset}, planned {plan.start_offset}")
        return wal, False

    def _recover_local(self, topic: TopicName, plan: RestorePlan) -> Any | None:
        """Our own unsealed WAL, if it still joins the archive without a gap."""
        from wal import WriteAheadLog

        wal = WriteAheadLog.open(self.wal_root, str(topic), config=self.config.wal_config, fs=self.wal_fs)
        first, tip_next = wal.first_offset, wal.next_offset
        if first <= plan.start_offset <= tip_next:
            log.info("topic %s: recovered local WAL %d..%d (archive continues at %d)",
                     topic, first, tip_next - 1, plan.start_offset)
            return wal
        log.warning("topic %s: local WAL %d..%d does not join the archive at %d; discarding it",
                    topic, first, tip_next - 1, plan.start_offset)
        wal.close()
        return None

    def _local_wal_path(self, topic: TopicName) -> str:
        return os.path.join(self.wal_root, topic.namespace, topic.name)

    def _local_wal_exists(self, topic: TopicName) -> bool:
        path = self._local_wal_path(topic)
        return os.path.isdir(path) and any(os.scandir(path))

    def _discard_local(self, topic: TopicName) -> None:
        from wal import WriteAheadLog

        try:
            WriteAheadLog.open(self.wal_root, str(topic), config=self.config.wal_config, fs=self.wal_fs).delete()
        except Exception as e:  # noqa: BLE001 - a WAL too broken to open is still ours to remove
            log.warning("topic %s: stale WAL would not open (%s); removing its directory", topic, e)
            shutil.rmtree(self._local_wal_path(topic))

    def _mark_open(self, token: OwnerToken, plan: RestorePlan) -> None:
        state = opened_state(token, plan)
        result = self.metadata.txn(token.fencing, [Put(keys.state_key(token.topic), state.to_json())])
        if not result.succeeded:
            raise OwnershipLostError(token.topic, "mark topic open")

    def _start_uploader(self, token: OwnerToken, wal: Any, plan: RestorePlan) -> Any:
        from uploader import Uploader

        uploader = Uploader(token.topic, wal, self.metadata, self.objects, broker_id=self.broker_id,
                            fencing=token.fencing, config=self.config.uploader,
                            committed_through=plan.committed_through)
        uploader.start()
        return uploader

    def _open_subscriptions(self, token: OwnerToken, wal: Any) -> Any:
        from tiered.subscriptions import SubscriptionManager

        return SubscriptionManager(token.topic, self.metadata, fencing=token.fencing, wal=wal,
                                   flush_every_acks=self.config.cursor_flush_every_acks,
                                   flush_interval_s=self.config.cursor_flush_interval_s)

    def _report_restore(self, topic: TopicName, report: RestoreReport, token: OwnerToken) -> None:
        if report.unarchived_at_least > 0:
            FAILOVERS.inc()
            UNARCHIVED_ON_FAILOVER.labels(str(topic)).set(report.unarchived_at_least)
            log.warning("topic %s: failover from %s (died unsealed): at least %d offsets of its WAL were "
                        "never archived and are lost; continuing at %d (epoch %d)", topic,
                        report.previous_owner, report.unarchived_at_least, report.start_offset, token.epoch)
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
        UNLOAD_SECONDS.observe(time.monotonic() - started)
        log.info("topic %s: unloaded, sealed at %s (%.3fs)", topic, last, time.monotonic() - started)
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
        _step(topic, "flush WAL", UnloadError, lambda: _flush_wal(hosted.wal, cfg.flush_timeout_s))
        _step(topic, "flush subscription cursors", UnloadError, hosted.subscriptions.flush_all)
        last = _step(topic, "drain uploader", UnloadError, lambda: self._drain(hosted))
        _step(topic, "write sealed state", UnloadError, lambda: self._write_seal(hosted, last))
        hosted.last_committed_offset = last
        hosted.state = TopicState.SEALED
        return last

    def _drain(self, hosted: HostedTopic) -> int | None:
        last = hosted.uploader.drain(self.config.drain_timeout_s)
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
                hosted.state = TopicState.CLOSED
            _quietly(lambda: hosted.uploader.stop(self.config.close_timeout_s))
            _quietly(lambda: hosted.subscriptions.close(flush=False))
            _quietly(hosted.wal.close)
            with self._lock:
                self._topics.pop(topic, None)

    def close(self, *, unload: bool = False) -> None:
        """Stop hosting: ``unload=True`` seals every topic first (graceful shutdown),
        else topics are abandoned (their owners' leases lapse, others take over)."""
        if self._closed.is_set():
            return
        for hosted in self.topics():
            if unload:
                self.unload(hosted.topic)
            else:
                self.abandon(hosted.topic)
        self._closed.set()
        self._progress_thread.join(self.config.close_timeout_s)
        if self.session is not None:
            self.session.stop(revoke=True)

    async def close_async(self, *, unload: bool = False) -> None:
        await asyncio.to_thread(self.close, unload=unload)

    def __enter__(self) -> "BrokerHost":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RuntimeError(f"broker host {self.broker_id} is closed")

    def _progress_loop(self) -> None:
        while not self._closed.wait(self.config.progress_interval_s):
            for hosted in self.topics():
                try:
                    hosted.publish_progress()
                except Exception as e:  # noqa: BLE001 - progress is advisory; the next tick retries
                    log.warning("topic %s: publishing progress failed: %s", hosted.topic, e)


# -- helpers -----------------------------------------------------------------------


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


def _release_quietly(metadata: MetadataStore, token: OwnerToken) -> None:
    try:
        release(metadata, token)
    except Exception as e:  # noqa: BLE001 - the original load error matters more
        log.warning("topic %s: releasing ownership after a failed load failed: %s", token.topic, e)
