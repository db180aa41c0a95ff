"""WriteAheadLog: the per-topic durable log (design: docs/WAL.md, format: native/format.py).

Threads: any number of appenders, one group-commit writer (wal/writer.py), any number of
readers (wal/reader.py). Appends go through the append core (``native.AppendBuffer``):
offset allocation, encoding and buffering are one atomic step there, without this
module's lock. One lock guards the rest of the in-memory state; three conditions on it
wake the writer (work), blocked appenders (room) and durability waiters/readers (durable).

The writer and the readers reach that state only through the hooks this module hands
them (``CommitHooks``, ``ReadHooks``: bound methods, as the append core gets its
callbacks), so neither imports this module and no other module calls its private methods.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import os
import struct
import time
import weakref
from collections.abc import Callable, Sequence
from threading import Condition, Lock

from prometheus_client import CollectorRegistry

from native import AppendBuffer, scan_frames
from native.errors import OffsetOverflow
from native._protocols import AppendCore
from native.format import FRAME_HEADER_BYTES, MAX_OFFSET, ROUND_MARKER_BYTES, STOP_TORN, Record, ScanResult
from wal.api import DurableListener
from wal.budget import MemoryBudgets, on_writer_thread
from wal.cache import CacheEntry, FrameCache
from wal.checkpoint import CheckpointState, SlotHint, read_checkpoint_and_hint, write_checkpoint
from wal.config import WalConfig
from wal.errors import (CorruptLog, MessageTooLarge, OffsetBelowRetention, SyncNotCovered, WalClosed, WalError,
                        WalFailed, WalLocked, WalTimeout)
from wal.fs import LOCK_NAME, FileSystem, LockHeld, ReadFile, RealFs, crash_safe_order
from wal.fs import Lock as DirLock
from wal.message import as_tuple
from wal.metrics import WalMetrics
from wal.reader import ReadHooks, WalReader
from wal.recovery import checkpoint_next, recover
from wal.segment import Segment, SegmentInfo
from wal.topics import TopicName
from wal.group import CommitGroup, GroupMember, MemberHooks
from wal.identity import ensure_wal_id
from wal.journal import journal_exists, replay_standalone, standalone_turn
from wal.writer import Batch, CommitHooks, GroupCommitWriter, SegmentAppender

_log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5  # bound on the writer's idle wait; it re-checks for close each time
_FOREVER = 1 << 64
_U32 = struct.Struct("<I")

#: An ``await wait_durable_async(offset)`` in progress: (offset, its loop, the future to resolve).
_AsyncWaiter = tuple[int, asyncio.AbstractEventLoop, "asyncio.Future[bool]"]


class WriteAheadLog:
    """The per-topic log; satisfies ``wal.api.Wal`` (what consumers type against)."""

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, root_dir: str, topic: "str | TopicName", config: WalConfig | None = None,
             initial_offset: int | None = None, fs: FileSystem | None = None,
             metrics_registry: CollectorRegistry | None = None,
             group: CommitGroup | None = None, budgets: MemoryBudgets | None = None) -> "WriteAheadLog":
        """Opens (recovering) or creates the WAL of ``topic`` under ``root_dir/<ns>/<topic>``.

        Without ``group`` the WAL has its own writer thread and fdatasyncs its own segment
        each round. With one (a ``wal.group.CommitGroup`` of ``root_dir``, on the same file
        layer) it joins that group: the group's one thread writes its rounds and makes them
        durable with one syncfs shared by every topic of the root (docs/WAL.md).

        ``budgets``: without a group, the memory bounds this WAL shares with the other WALs
        of its root (``wal.budget.MemoryBudgets``, single_adder False; None: only its own
        bounds). With a group, the group's are used: passing others is an error.
        """
        name = TopicName.parse(topic)
        if initial_offset is not None and not (
                isinstance(initial_offset, int) and 0 <= initial_offset <= MAX_OFFSET + 1):
            raise OffsetOverflow(f"initial_offset {initial_offset!r} is not in [0, MAX_OFFSET + 1 = {MAX_OFFSET + 1}]")
        config = config or WalConfig()
        if group is not None:
            if budgets is not None and budgets is not group.budgets:
                raise ValueError("a WAL in a commit group counts against the group's budgets")
            budgets = group.budgets
        elif budgets is not None and budgets.single_adder:
            raise ValueError("WALs with their own writer threads need budgets made with single_adder=False")
        if group is not None:
            if fs is not None and fs is not group.fs:
                raise ValueError("a WAL in a commit group must use the group's file layer")
            if os.path.normpath(root_dir) != os.path.normpath(group.root):
                raise ValueError(f"commit group of {group.root} cannot sync a WAL under {root_dir}")
            group.check()  # a failed group's syncs vouch for nothing: touch no file for it
            fs = group.fs
        fs = fs or RealFs()
        directory = os.path.join(root_dir, name.namespace, name.name)
        journaled = group is not None and group.journal is not None
        if not _holds_wal(fs, directory):
            fs.makedirs(directory)
            # Both names makedirs may have created must survive a power loss: the topic's
            # (in the namespace directory) and the namespace's (in the root). Else
            # acknowledged messages vanish with the directory and offsets restart from
            # scratch. (A directory that holds a WAL was made durable before its first
            # segment was: an open that made it but failed before that is redone here.)
            fs.fsync_dir(os.path.dirname(directory))
            fs.fsync_dir(root_dir)
        # One writer per directory, for the WAL's whole life: a second opener (another
        # process, or this one twice) would recover, truncate and append to the same
        # segments and hand out the same offsets for different messages.
        # (In a journaled group the group claims the directory instead, holding no descriptor:
        # the journal's lock, held for the group's life, keeps every other opener out of the
        # whole root, so a topic costs one open file, its segment, not two.)
        if group is not None and not journaled and not fs.syncfs_covers(root_dir, [directory]):
            # The group's syncfs would not reach this directory's files (another volume
            # mounted under the root): its rounds would be acknowledged undurable.
            raise SyncNotCovered(directory, root_dir)
        lock = group.claim(directory) if group is not None and journaled else _lock_and_replay(fs, directory, root_dir)
        wal = None
        try:
            # A journaled group names this WAL instance in its journal entries: the id must
            # be durable before the first round is (wal/identity.py). Every WAL has one, so
            # its embedder can tell this instance from another at the same path.
            identity = ensure_wal_id(fs, directory)
            wal_id = identity if journaled else None
            checkpoint, hint = read_checkpoint_and_hint(fs, directory)
            recovered = recover(fs, directory, checkpoint, initial_offset, config.index_interval_bytes)
            wal = cls(name, directory, config, fs, recovered.segments, recovered.next_offset, metrics_registry,
                      group, wal_id, budgets)
            wal._dir_lock = lock
            if wal._member is not None:
                wal._member.dir_lock = lock  # the group releases it if close() gives up waiting
            # In a journaled group whose start made this directory durable (one syncfs,
            # wal.journal._settle_segments), the tail needs no sync of its own, and the
            # checkpoint recording it may stay unsynced: the slot it keeps is durable, and
            # a power loss that drops the new one leaves that older one, which vouches for
            # less (wal/checkpoint.py, "Unsynced writes"). Not a write that raises
            # first_offset: an older slot would then ask for segments no longer there.
            settled = group.journal.take_settled(directory) if group is not None and group.journal else None
            wal._sync_recovered_tail(checkpoint, settled)
            wal._checkpoint_durable = settled is not None
            wal._checkpoint_hint = hint
            same_first = checkpoint is not None and checkpoint.get("first_offset") == wal.first_offset
            wal._write_checkpoint(unless_equal=checkpoint, sync=not (settled is not None and same_first))
            wal._writer.start()
        except BaseException:
            if wal is not None:
                wal._abandon_open()
            lock.release()
            raise
        _log.info("opened WAL %s at %s: offsets [%d, %d), %d torn bytes repaired", name, directory,
                  wal.first_offset, wal.next_offset, recovered.repaired_bytes)
        return wal

    def __init__(self, topic: TopicName, directory: str, config: WalConfig, fs: FileSystem,
                 segments: list[Segment], next_offset: int, metrics_registry: CollectorRegistry | None,
                 group: CommitGroup | None = None, wal_id: bytes | None = None,
                 budgets: MemoryBudgets | None = None) -> None:
        assert segments and segments[-1].last_offset + 1 == next_offset
        assert group is None or budgets is group.budgets
        self.topic = topic
        self.directory = directory
        self.config = config
        self._index_interval_bytes = config.index_interval_bytes  # read by every commit round
        self._fs = fs
        self._lock = Lock()
        self._work = Condition(self._lock)
        self._room = Condition(self._lock)
        self._durable = Condition(self._lock)
        self._segments = segments
        self._segment_bases = [s.base_offset for s in segments]
        self._origin_offset = segments[0].base_offset
        self._durable_next = next_offset
        self._room_waiters = 0
        self._durable_waiters = 0  # threads in _durable.wait (under the lock)
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        self._listeners: list[DurableListener] = []
        self._async_waiters: list[_AsyncWaiter] = []
        self._readers: "weakref.WeakSet[WalReader]" = weakref.WeakSet()
        # Every topic's cache counts against its root's one budget (wal/budget.py; a commit
        # group's, or one its WalRoot made): thousands of busy topics cannot keep gigabytes alive.
        self._budgets = budgets
        self._cache_budget = budgets.cache if budgets is not None else None
        self._cache = FrameCache(config.cache_messages_max, config.cache_bytes_max, self._cache_budget, self._lock)
        self._retention_lock = Lock()  # one truncate_before at a time
        self._unlink_pending: list[str] = []  # retention's files whose unlink failed: retried
        self._checkpoint_lock = Lock()
        #: Whether the newest slot of ``wal.ckpt`` is known durable (``_write_checkpoint``).
        self._checkpoint_durable = False
        #: Its newest slot as this instance last read or wrote it (``write_checkpoint``'s
        #: hint; only this instance writes the file while it holds the directory).
        self._checkpoint_hint: SlotHint | None = None
        self._pending_bytes_max = config.pending_bytes_max
        self._member: GroupMember | None = None  # set below when the WAL is in a commit group
        # The append core owns next_offset and the frames not yet taken by the writer. It
        # calls back only on rare paths: backpressure, waking a parked writer (or one a full
        # batch is waiting for), a refused append, an oversized record, a rare batch form.
        self._core: AppendCore = AppendBuffer(
            next_offset, max_message_bytes=config.max_message_bytes,
            pending_bytes_max=config.pending_bytes_max, batch_bytes=config.fsync_batch_bytes,
            tail_messages_max=config.cache_messages_max, tail_bytes_max=config.cache_bytes_max,
            wake=self._wake_writer, wait_for_room=self._wait_for_room, too_large=MessageTooLarge,
            normalize=as_tuple, shared=budgets.pending if budgets is not None else None)
        # wal.append / wal.append_batch resolve straight to the core's bound methods (C in the
        # compiled twin): a Python wrapper would cost more than the append itself. The class
        # methods below document the signatures and delegate for calls through the class.
        self.append = self._core.append  # type: ignore[method-assign]  # same signature, see above
        self.append_batch = self._core.append_batch  # type: ignore[method-assign]
        self.metrics = WalMetrics(str(topic), metrics_registry)
        self.metrics.set_durable(next_offset - 1)
        self.metrics.track_reader_lag(_lag_function(weakref.ref(self)))
        hooks = CommitHooks(take_batch=self._take_batch, on_durable=self._on_durable,
                            on_rotate=self._on_rotate, fail=self._fail)
        appender = SegmentAppender(hooks, fs, directory, config, segments[-1])
        self._writer: GroupCommitWriter | GroupMember
        if group is None:
            self._writer = GroupCommitWriter(hooks, appender, directory)
        else:
            try:
                self._member = self._writer = group.join(
                    MemberHooks(commit=hooks, take_ready=self._take_ready, park=self._core.park),
                    appender, str(topic), wal_id, topic.path)
            except BaseException:
                appender.close()
                self.metrics.close()
                raise
        self._read_hooks = ReadHooks(
            read_records=self._read_records, cache_covers=self._cache_covers,
            wait_durable=self._wait_durable_unlocked, wait_durable_async=self._wait_durable_async,
            wake_waiters=self._wake_durable_waiters)
        self._dir_lock: DirLock | None = None  # set by open(); released by close() once the writer stopped

    def _abandon_open(self) -> None:
        """An open that failed after the constructor: let go of the group (nothing was
        appended, so leaving is immediate) and of the metrics."""
        if self._member is not None:
            self._member.join(self.config.close_timeout_s)
        self.metrics.close()

    def close(self) -> None:
        """Drains and fsyncs everything appended, stops the writer (or leaves the commit
        group); idempotent."""
        with self._lock:
            already = self._closing
            failed_before = self._failure is not None
            # Refuse first: an append either completed before this (its frames are pending
            # and the writer drains them because _closing is set) or raises WalClosed.
            if self._core.refusal is None:
                self._core.refusal = self._refusal_error
            self._closing = True
            self._work.notify_all()
            self._room.notify_all()
        if self._budgets is not None:
            self._budgets.wake_room(everyone=True)  # its appends waiting there are refused now
        drained = self._writer.join(self.config.close_timeout_s)
        if not drained:
            self._fail(WalTimeout(f"writer did not drain within {self.config.close_timeout_s} s"))
        with self._lock:
            self._closed = True
            self._durable.notify_all()
            # Its share of the group's budgets goes back, drained or not (atk82 F2): readers
            # of a closed WAL read its files, and a writer that did not stop in time adds
            # to a detached cache, which counts nothing (it is bounded on its own and goes
            # with this WAL). Pending bytes: none after a drain; else never taken now.
            self._cache.detach()
            self._core.leave_shared()
            waiters, self._async_waiters = self._async_waiters, []
        _resolve_all(waiters, WalClosed(f"WAL {self.topic} closed"))
        # A retention in progress (it checked _closed before this) ends before the
        # directory is let go: else a new instance could open in between, recover the
        # segments it is unlinking, record them in its checkpoint, and then refuse its next
        # open (CorruptLog) once they are gone (atk74 F2). Later ones raise WalClosed.
        with self._retention_lock:
            try:
                if not already and self._failure is None:
                    self._write_checkpoint()
            finally:
                # A writer that did not stop may still write: keep the directory locked
                # rather than let a new opener in. In a commit group, the group releases it
                # once it has let this WAL go and closed its files; the per-topic writer's
                # lock goes with the process (the kernel drops it).
                if drained and self._dir_lock is not None:
                    self._dir_lock.release()
                self.metrics.close()
        if not drained and not already:
            # Its last rounds may not be synced on their own (journaled: the group syncs
            # and closes its files once it lets it go): no caller may move or delete the
            # files as if they were.
            cause = self._failure
            raise WalFailed(f"WAL {self.topic} did not close in time: {cause!r}") from cause
        close_error = self._member.close_error if self._member is not None else None
        if drained and not already and (close_error is not None or (not failed_before and self._failure is not None)):
            # Draining failed (the last round, or a commit group's last sync of this WAL's
            # segments, which a WAL that had failed before still needs): what was appended
            # is not known to be durable in these files on their own, so no caller may move
            # or delete them as if it were.
            cause = close_error or self._failure
            raise WalFailed(f"WAL {self.topic} failed while closing: {cause!r}") from cause

    def delete(self) -> None:
        """Removes the topic's files (after a seal). The WAL must be closed first."""
        if not self._closed:
            raise WalError(f"WAL {self.topic} must be closed before delete()")
        # The checkpoint first, then segments oldest first, bookkeeping last: a crash in
        # between leaves a suffix of the log without a checkpoint, which opens (as after
        # retention) and is deleted again by the retry; never a checkpoint naming missing
        # segments, which would refuse to open (CorruptLog) although everything was sealed.
        for name in [*crash_safe_order(self._fs.listdir(self.directory)), LOCK_NAME]:
            if name == LOCK_NAME and not self._fs.exists(os.path.join(self.directory, name)):
                continue
            self._fs.remove(os.path.join(self.directory, name))
        self._fs.rmdir(self.directory)
        self._fs.fsync_dir(os.path.dirname(self.directory))
        _log.info("deleted WAL %s at %s", self.topic, self.directory)

    def __enter__(self) -> "WriteAheadLog":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ properties
    @property
    def first_offset(self) -> int:
        return self._segment_bases[0]

    @property
    def next_offset(self) -> int:
        return self._core.next_offset

    @property
    def durable_offset(self) -> int | None:
        last = self._durable_next - 1
        return last if last >= self._origin_offset else None

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ append
    def append(self, payload: bytes, key: bytes | None = None, attributes: dict[str, str] | None = None,
               publish_time: int | None = None) -> int:
        """Appends one message; returns its offset. Durable later: see wait_durable().

        Raises MessageTooLarge (record over max_message_bytes; no offset is used),
        WalClosed/WalFailed once the WAL refuses appends, WalTimeout when backpressure
        blocked it for append_timeout_s. Instances call the core directly (see __init__).
        """
        return self._core.append(payload, key, attributes, publish_time)

    def append_batch(self, messages: Sequence[object], publish_time: int | None = None) -> int:
        """Appends messages (see wal/message.py for accepted forms); returns the first offset.

        All or nothing: one bad or oversized message appends none. ``publish_time`` is the
        default for messages that carry none (else the time of the call).
        """
        return self._core.append_batch(messages, publish_time)

    def _wake_writer(self) -> None:
        """Core callback: the writer parked itself idle, or a full batch is waiting."""
        if self._member is not None:
            self._member.wake()
            return
        with self._lock:
            self._work.notify()

    def _wait_for_room(self) -> None:
        """Core callback, before an append while pending bytes are at the bound (this WAL's,
        or its commit group's for all its topics): backpressure, for at most
        append_timeout_s. Returns once there is room or appends are refused."""
        if on_writer_thread():
            # A durable listener on a writer thread (the commit group's, or a topic's own)
            # appending here: the round it would wait for (this topic's or the root's room)
            # may be its own, or that of a writer waiting in turn for it. It goes on, past
            # the bound (atk84 F1: it held every topic of the group for append_timeout_s;
            # atk88 F2: two topics' own writers whose listeners appended to each other).
            # If this topic's writer is another thread, only up to twice the bound: a
            # listener appending on every round to a topic whose disk stalled grew it to
            # 1,200 times its bound (atk89 F1). Past that it cannot wait either, so the
            # append fails at once, using no offset. (On this topic's own writer thread
            # what a listener appends is taken by that thread's next round.)
            shared = self._core.shared_budget
            if not self._on_own_writer_thread() and (
                    self._core.pending_bytes >= 2 * self._pending_bytes_max
                    or (shared is not None and shared.used >= 2 * shared.bytes_max)):
                raise WalTimeout(f"append to {self.topic} from a WAL writer thread (a durable listener): the "
                                 "pending bytes are at twice their bound, and a writer thread cannot wait")
            return
        deadline = time.monotonic() + self.config.append_timeout_s
        with self._lock:
            self._room_waiters += 1
            try:
                while (self._core.pending_bytes >= self._pending_bytes_max
                       and self._core.refusal is None):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise WalTimeout(f"append blocked {self.config.append_timeout_s} s on a full "
                                         "write buffer")
                    self._room.wait(remaining)
            finally:
                self._room_waiters -= 1
        shared = self._core.shared_budget
        if shared is not None and shared.must_wait and self._budgets is not None:
            # Without this WAL's lock: the round that makes room takes it.
            core = self._core
            self._budgets.wait_for_room(deadline, lambda: core.refusal is not None, self.config.append_timeout_s)

    def _on_own_writer_thread(self) -> bool:
        """Whether the caller is the thread that writes this WAL's rounds."""
        if self._member is not None:
            return self._member.group.on_own_thread()
        assert isinstance(self._writer, GroupCommitWriter)
        return self._writer.on_own_thread()

    def refuse_appends(self) -> None:
        """Refuse every append from now on, also those waiting for room (they raise what
        ``close`` makes them raise, WalClosed), without closing: what was appended stays
        pending and is written as usual (``flush``, ``close``). For a topic that is
        leaving: its appends waiting on backpressure end now, not after append_timeout_s.
        Idempotent."""
        with self._lock:
            if self._core.refusal is None:
                self._core.refusal = self._refusal_error
            self._room.notify_all()
        if self._budgets is not None:
            self._budgets.wake_room(everyone=True)

    def _refusal_error(self) -> WalError:
        if self._failure is not None:
            error = WalFailed(f"WAL {self.topic} failed: {self._failure!r}")
            error.__cause__ = self._failure
            return error
        return WalClosed(f"WAL {self.topic} is closed")

    # ------------------------------------------------------------------ durability
    def wait_durable(self, offset: int, timeout_s: float) -> bool:
        """Blocks until ``offset`` is durable (True) or ``timeout_s`` passes (False)."""
        with self._lock:
            next_offset = self._core.next_offset
            if offset >= next_offset:
                raise ValueError(f"offset {offset} was never appended (next is {next_offset})")
            return self._wait_durable_locked(offset, timeout_s)

    def _wait_durable_locked(self, offset: int, timeout_s: float,
                             give_up: Callable[[], bool] | None = None) -> bool:
        """``give_up`` (checked on every wake-up, e.g. a reader closed from another
        thread, which notifies ``_durable``) ends the wait early with False."""
        deadline = time.monotonic() + timeout_s
        while self._durable_next <= offset:
            if self._failure is not None or self._closed:
                raise self._refusal_error()
            if give_up is not None and give_up():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._durable_waiters += 1  # the writer notifies only while someone waits
            try:
                self._durable.wait(remaining)
            finally:
                self._durable_waiters -= 1
        return True

    async def wait_durable_async(self, offset: int, timeout_s: float | None = None) -> bool:
        """Awaits durability of ``offset`` without blocking the event loop."""
        next_offset = self._core.next_offset
        if offset >= next_offset:
            raise ValueError(f"offset {offset} was never appended (next is {next_offset})")
        return await self._wait_durable_async(offset, timeout_s)

    def _wait_durable_unlocked(self, offset: int, timeout_s: float, give_up: Callable[[], bool]) -> bool:
        """``_wait_durable_locked`` for a caller not holding the lock (a reader)."""
        with self._lock:
            return self._wait_durable_locked(offset, timeout_s, give_up)

    def _wake_durable_waiters(self) -> None:
        """Wakes every durability waiter so it re-checks its ``give_up`` (a reader closed)."""
        with self._lock:
            self._durable.notify_all()

    async def _wait_durable_async(self, offset: int, timeout_s: float | None) -> bool:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._durable_next > offset:
                return True
            if self._failure is not None or self._closed:
                raise self._refusal_error()
            self._async_waiters.append((offset, loop, future))
        try:
            await asyncio.wait_for(future, timeout_s)
            return True
        except TimeoutError:
            with self._lock:
                self._async_waiters = [w for w in self._async_waiters if w[2] is not future]
            return False

    def flush(self, timeout_s: float = 30.0) -> None:
        """Returns once everything appended before the call is fsynced."""
        with self._lock:
            target = self._core.next_offset - 1
            if target < self._durable_next:
                if self._failure is not None:
                    raise self._refusal_error()
                return
            if not self._wait_durable_locked(target, timeout_s):
                raise WalTimeout(f"flush of offset {target} did not finish in {timeout_s} s")

    def add_durable_listener(self, callback: DurableListener) -> None:
        """``callback(durable_offset)`` runs on the writer thread after each fsync; keep it quick."""
        with self._lock:
            self._listeners = [*self._listeners, callback]

    def remove_durable_listener(self, callback: DurableListener) -> None:
        with self._lock:
            self._listeners = [c for c in self._listeners if c is not callback]

    # ------------------------------------------------------------------ writer hooks (CommitHooks)
    def _take_batch(self) -> Batch | None:
        """Writer thread: the next batch to commit, or None when closing and drained.

        Whatever is pending is taken at once, never held back for a timer: a lone append to
        an idle writer is written and fsynced immediately, so at low load latency is the
        disk's. Batching happens by itself under load: appends that arrive while a round's
        write + fsync is in flight pile up in the core and become the next round (group
        commit as Postgres and BookKeeper's journal do it); backpressure at
        ``pending_bytes_max`` bounds how big a round can get.
        """
        core = self._core
        with self._lock:
            while True:
                if self._failure is not None:
                    return None
                if core.pending_count:
                    batch = self._detach_pending()
                    if self._budgets is not None and self._budgets.room_waiters:
                        self._budgets.wake_room()  # room in the root's pending budget: the first in line looks
                    return batch
                if self._closing:
                    return None
                if core.park():
                    # Parked atomically with appends: the next append sees the idle flag and
                    # wakes us; it takes this lock to notify, so it cannot slip between the
                    # park and the wait (the wait releases the lock atomically).
                    self._work.wait(_IDLE_WAIT_S)
                    core.unpark()

    def _take_ready(self) -> Batch | None:
        """Commit group's thread: everything pending as one batch, or None (nothing pending,
        or failed). Never blocks: the group waits for ``wake`` instead."""
        with self._lock:
            if self._failure is not None:
                if self._core.pending_count:
                    self._core.take()  # never written, never acknowledged: let the core park
                return None
            if not self._core.pending_count:
                return None
            return self._detach_pending()

    def _detach_pending(self) -> Batch:
        # take() gives a Batch's fields in its order; built without Batch's Python-level
        # __new__ (this runs for every topic of every commit round: docs/WAL.md).
        batch = tuple.__new__(Batch, self._core.take())
        assert batch.last_offset >= batch.first_offset and batch.nbytes > 0, "take() found nothing"
        assert batch.first_offset == self._durable_next, "pending frames must continue the durable offsets"
        if self._room_waiters:
            self._room.notify_all()
        return batch

    def _on_durable(self, batch: Batch, segment: Segment, position: int, size_bytes: int,
                    fsync_s: float) -> None:
        """Writer thread, after a successful fsync: publish the new durable watermark."""
        # Kept lean (unpacked once, no list made when no async waiter waits, and the cache
        # tail's common case, a tail inside the round's first chunk, without a call to
        # _cache_tail): this runs for every topic of every commit round (docs/WAL.md).
        chunks, first, last, nbytes, tail_position, tail_count = batch
        if tail_count and tail_position < len(chunks[0]):
            tail: tuple[int, int, list[bytes], int, int] | None = (
                last - tail_count + 1, last, chunks, tail_position, nbytes)
        else:
            tail = _cache_tail(batch)
        with self._lock:
            if self._failure is not None:
                return  # failed closed meanwhile: its waiters were told WalFailed; publish nothing
            assert first == self._durable_next, "durable offsets must stay contiguous"
            segment.last_offset = last
            segment.size_bytes = size_bytes
            segment.add_index(first, position, self._index_interval_bytes)
            self._durable_next = last + 1
            over_budget = False
            if tail is None:
                self._cache.clear()
            else:
                over_budget = self._cache.add(*tail)
            if self._durable_waiters:
                self._durable.notify_all()
            ready = None
            if self._async_waiters:
                ready, self._async_waiters = _split_ready(self._async_waiters, last + 1)
            listeners = self._listeners
        self.metrics.on_fsync(last - first + 1, nbytes, fsync_s, last)
        if over_budget:
            assert self._cache_budget is not None
            self._cache_budget.enforce()  # with no WAL's lock held: it takes other caches' locks
        if ready:
            _resolve_all(ready, None)
        for callback in listeners:
            try:
                callback(last)
            except Exception:  # a listener must not take the writer down
                _log.exception("durable listener %r failed", callback)

    def _on_rotate(self, old: Segment, new: Segment) -> None:
        with self._lock:
            old.sealed = True
            self._segments.append(new)
            self._segment_bases.append(new.base_offset)
        self.metrics.on_segment()
        self._write_checkpoint()

    def _fail(self, exc: BaseException) -> None:
        _log.error("WAL %s failed closed: %r", self.topic, exc)
        with self._lock:
            if self._failure is None:
                self._failure = exc
            self._core.refusal = self._refusal_error
            self._work.notify_all()
            self._room.notify_all()
            self._durable.notify_all()
            waiters, self._async_waiters = self._async_waiters, []
            error = self._refusal_error()
        # What is pending will never be written: its share of the group's pending budget
        # goes back (else the other topics' appends would wait for it forever), and its
        # appends waiting for room there are refused now.
        self._core.leave_shared()
        if self._budgets is not None:
            self._budgets.wake_room(everyone=True)
        self.metrics.on_failed()
        _resolve_all(waiters, error)

    def _sync_recovered_tail(self, checkpoint: CheckpointState | None, settled: dict[str, int] | None) -> None:
        """At open, before the checkpoint records the recovered tip: sync the segments
        holding offsets past what ``checkpoint`` (the one read) already vouched for.

        Recovery keeps every valid round it finds, and after a process crash the last one
        may still sit unsynced in the page cache (its fsync never returned, so it was never
        acknowledged). The checkpoint then written says those offsets are durable; had a
        power loss dropped them after it, the next open would find the log ending below
        the checkpoint and refuse (CorruptLog) because of a write never acknowledged. Synced
        first, the checkpoint says only what is true. Nothing to do after a clean close,
        nor for a file ``settled`` says its group's journal made durable at this size
        (``Journal.take_settled``): one syncfs there instead of a device flush per topic
        when a broker restarts after a crash."""
        reached = checkpoint_next(checkpoint) or 0
        with self._lock:
            if self._durable_next <= reached:
                return
            paths = [s.path for s in self._segments if s.last_offset >= max(reached, s.base_offset)]
        for path in paths:
            if settled is not None and settled.get(os.path.normpath(path)) == self._fs.file_size(path):
                continue
            handle = self._fs.open_append(path)
            try:
                handle.sync()
            finally:
                handle.close()

    def _write_checkpoint(self, unless_equal: dict[str, object] | None = None, both_slots: bool = False,
                          sync: bool = True) -> None:
        """Rewrite ``wal.ckpt`` (in place: wal/checkpoint.py); not when it already says
        exactly this (``unless_equal``: what was read at open; a broker reopening 1,000
        unchanged WALs then writes none). ``both_slots``: no older state is left in it
        (a write that raises ``first_offset``). ``sync=False``: only where its newest slot
        is durable (``open``). Unless this instance knows that slot durable
        (``_checkpoint_durable``: its own last write was synced, or its group made it
        durable), the file is synced first: another instance may have left it unsynced."""
        with self._checkpoint_lock:
            with self._lock:
                state = {"topic": str(self.topic), "first_offset": self._segment_bases[0],
                         "sealed_next_offset": self._segment_bases[-1], "next_offset": self._durable_next}
            if unless_equal is not None and {k: unless_equal.get(k) for k in state} == state:
                return
            assert sync or self._checkpoint_durable, "an unsynced write must keep a durable slot"
            # If the write raises, the file's state is unknown (a slot may be half written,
            # or written and unsynced): the next write reads the file and syncs it first.
            hint, self._checkpoint_hint = self._checkpoint_hint, None
            durable, self._checkpoint_durable = self._checkpoint_durable, False
            self._checkpoint_hint = write_checkpoint(
                self._fs, self.directory, state, in_place=True, both_slots=both_slots,
                presync=not durable, sync=sync, hint=hint)
            self._checkpoint_durable = sync

    # ------------------------------------------------------------------ retention
    def truncate_before(self, offset: int) -> int:
        """Deletes whole sealed segments whose offsets are all < ``offset``; returns how many.

        A loss path; its precondition is the caller's (the uploader archived everything below
        ``offset``). It removes them from the WAL, then records the new first offset in
        ``wal.ckpt``, then unlinks their files. If the checkpoint cannot be written (an I/O
        error; or a full disk while ``wal.ckpt`` still has the whole-file layout of an older
        release: the two-slot one is rewritten in place) they are put back, untouched, and the error raised; a
        file that fails to unlink is retried by the next call. Either way a later call can
        still free the space."""
        with self._retention_lock:
            with self._lock:
                if self._closed:
                    # Its files may belong to a newer instance of the WAL by now: unlinking
                    # them from here would take segments that one still serves.
                    raise WalClosed(f"WAL {self.topic} is closed: retention runs on an open WAL only")
                doomed: list[Segment] = []
                while len(self._segments) - len(doomed) > 1 and self._segments[len(doomed)].last_offset < offset:
                    doomed.append(self._segments[len(doomed)])
                unlinked_before = self._unlink_pending
                if not doomed and not unlinked_before:
                    return 0
                del self._segments[:len(doomed)]
                del self._segment_bases[:len(doomed)]
                assert not doomed or self._segment_bases[0] == doomed[-1].last_offset + 1
            if doomed:
                try:
                    # Before unlinking, in both of its slots: no slot then names a missing
                    # first segment, even the one a rotted newest slot would fall back to.
                    self._write_checkpoint(both_slots=True)
                except BaseException:
                    with self._lock:  # only this call removes segments (the retention lock)
                        self._segments[:0] = doomed
                        self._segment_bases[:0] = [s.base_offset for s in doomed]
                    raise
            paths = unlinked_before + [s.path for s in doomed]
            self._unlink_pending = []
            for index, path in enumerate(paths):
                try:
                    self._fs.remove(path)
                except FileNotFoundError:
                    pass  # a retry of an unlink that did happen
                except BaseException:
                    self._unlink_pending = paths[index:]
                    raise
            self._fs.fsync_dir(self.directory)
        _log.info("WAL %s: retention removed %d segments, first offset now %d", self.topic,
                  len(doomed), self.first_offset)
        return len(doomed)

    def segments(self) -> list[SegmentInfo]:
        with self._lock:
            return [SegmentInfo(s.base_offset, s.last_offset, s.path, s.size_bytes, s.created_ms, s.sealed)
                    for s in self._segments]

    # ------------------------------------------------------------------ reading (and ReadHooks)
    def reader(self, from_offset: int, live: bool = True) -> WalReader:
        """A pull-based reader of durable records from ``from_offset`` (see wal/reader.py)."""
        with self._lock:
            if from_offset < self._segment_bases[0]:
                raise OffsetBelowRetention(from_offset, self._segment_bases[0])
            stop = None if live else self._durable_next - 1
        reader = WalReader(self._read_hooks, from_offset, stop, self.config.read_chunk_bytes)
        with self._lock:
            self._readers.add(reader)
        return reader

    def read_frames(self, from_offset: int, max_bytes: int) -> tuple[bytes, int, int]:
        """Raw, validated, whole durable frames from ``from_offset``: (frames, first, last).

        Returns at least one frame when any is durable (even if it alone exceeds
        ``max_bytes``) and stops at a segment end; ``(b"", from_offset, from_offset - 1)``
        when nothing at or after ``from_offset`` is durable yet.
        """
        found = self._read_segment(from_offset, _FOREVER, max_bytes, decode=False)
        if found is None:
            return b"", from_offset, from_offset - 1
        data, result, limit = found
        first_index = from_offset - result.first_offset
        last = min(result.last_offset, limit)
        last_index = last - result.first_offset
        end = result.positions[last_index + 1] if last_index + 1 < result.count else result.end
        frames = _without_markers(data, result.positions[first_index], end, result.markers)
        return frames, from_offset, last

    def _read_records(self, position: int, limit: int, max_bytes: int) -> list[Record]:
        """Decoded durable records [position, min(limit, durable)], from cache else files."""
        with self._lock:
            if position < self._segment_bases[0]:
                raise OffsetBelowRetention(position, self._segment_bases[0])
            limit = min(limit, self._durable_next - 1)
            if position > limit:
                return []
            chunks = self._cache.find(position)
        if chunks:
            return _decode_chunks(chunks, position, limit, max_bytes)
        found = self._read_segment(position, limit, max_bytes, decode=True)
        if found is None:
            return []
        _data, result, limit = found
        return [r for r in result.records if position <= r.offset <= limit]

    def _cache_covers(self, position: int) -> bool:
        with self._lock:
            return self._cache.covers(position)

    def _read_segment(self, position: int, limit: int, max_bytes: int,
                      decode: bool) -> tuple[bytes, ScanResult, int] | None:
        """Reads the segment holding ``position``: (data, scan result, limit) or None."""
        with self._lock:
            if position < self._segment_bases[0]:
                raise OffsetBelowRetention(position, self._segment_bases[0])
            limit = min(limit, self._durable_next - 1)
            if position > limit:
                return None
            segment = self._segments[bisect.bisect_right(self._segment_bases, position) - 1]
            path, end_pos, rounds, key = segment.path, segment.size_bytes, segment.has_rounds, segment.marker_key
            offset, pos = segment.seek(position)
        try:
            handle = self._fs.open_read(path)
        except FileNotFoundError:
            if position < self.first_offset:  # retention removed it while we looked
                raise OffsetBelowRetention(position, self.first_offset) from None
            raise
        try:
            data, result, start = _scan_until(handle, path, position, offset, pos, end_pos, max_bytes, decode, rounds,
                                              key)
        finally:
            handle.close()
        if start + result.positions[-1] - pos >= self._index_interval_bytes:
            # The scan went far past the index point it started from (inside a big commit
            # round): index the last frame it found, next to where a reader's next read
            # begins (Segment.learn_index; without it a catch-up through the round is
            # quadratic). Also when that frame is the only one found: frames larger than
            # half a read (atk79).
            with self._lock:
                segment.learn_index(result.last_offset, start + result.positions[-1], self._index_interval_bytes)
        return data, result, limit

    def _reader_lag(self) -> int:
        with self._lock:
            durable_next = self._durable_next
            readers = list(self._readers)
        return max((max(0, durable_next - r.consumed_offset) for r in readers if not r.closed), default=0)

    def __repr__(self) -> str:
        return (f"WriteAheadLog({self.topic}, first={self.first_offset}, next={self.next_offset}, "
                f"durable={self.durable_offset})")


def _scan_until(handle: ReadFile, path: str, position: int, offset: int, pos: int, end_pos: int,
                max_bytes: int, decode: bool, rounds: bool, marker_key: int | None) -> tuple[bytes, ScanResult, int]:
    """Scans forward from an index point until a chunk holds ``position``; (data, result,
    the file position ``data`` was read from). ``marker_key``: the segment's (native/format.py)."""
    want_bytes = max_bytes
    while pos < end_pos:
        want = min(end_pos - pos, max(want_bytes, FRAME_HEADER_BYTES))
        data = handle.pread(pos, want)
        if len(data) < want:
            raise CorruptLog(path, pos + len(data), "segment shorter than its durable size")
        result = scan_frames(data, expected_offset=offset, decode=decode, positions=True, rounds=rounds,
                             marker_key=marker_key)
        if result.error is not None and not (result.error.reason == STOP_TORN and pos + want < end_pos):
            raise CorruptLog(path, pos + result.error.position, f"{result.error.reason}: {result.error.detail}")
        if result.count == 0 and result.end > 0:  # only round markers fit: step past them
            pos += result.end
            continue
        if result.count == 0:  # one frame larger than the read: read exactly that frame
            want_bytes = FRAME_HEADER_BYTES + _U32.unpack_from(data, 4)[0]
            continue
        if result.last_offset >= position:
            assert result.first_offset == offset and result.first_offset <= position
            return data, result, pos
        offset, pos, want_bytes = result.last_offset + 1, pos + result.end, max_bytes
    raise CorruptLog(path, end_pos, f"offset {position} not found before the durable end of the segment")


def _without_markers(data: bytes, start: int, end: int, markers: list[int]) -> bytes:
    """The frames in ``data[start:end]`` with the commit-round markers among them left out:
    callers get frames only, as archives hold them."""
    view = memoryview(data)
    inside = [m for m in markers if start <= m < end]
    if not inside:
        return bytes(view[start:end])
    parts = []
    for marker in inside:
        parts.append(view[start:marker])
        start = marker + ROUND_MARKER_BYTES
    parts.append(view[start:end])
    return b"".join(parts)


def _decode_chunks(chunks: list[CacheEntry], position: int, limit: int, max_bytes: int) -> list[Record]:
    records: list[Record] = []
    budget = max_bytes
    for expected, last, parts, start, _nbytes in chunks:
        for part in parts:  # each part holds whole frames, continuing the previous one
            # The budget stops only a read that has records: the first parts may all lie
            # before ``position`` (an empty answer would look like nothing durable there).
            if expected > limit or (budget <= 0 and records):
                return records
            # The entry's frames start at byte ``start`` of its first part (wal/cache.py).
            result = scan_frames(part, pos=start, expected_offset=expected, decode=True)
            assert result.error is None and result.count > 0, "cache chunk corrupt"
            records.extend(r for r in result.records if position <= r.offset <= limit)
            budget -= len(part) - start
            expected = result.last_offset + 1
            start = 0
        assert expected == last + 1, "cache chunk corrupt"
    return records


def _cache_tail(batch: Batch) -> tuple[int, int, list[bytes], int, int] | None:
    """The newest frames of a batch that fit the cache bounds (found by the core's take()),
    as ``FrameCache.add`` takes them: (first offset, last offset, the chunks from the one
    they start in, where in it, the bytes of those chunks); None if not even the last one
    fits. Copies nothing: the cache keeps the chunks the writer has just written (see
    wal/cache.py)."""
    chunks, _first, last, nbytes, tail_position, tail_count = batch
    if tail_count == 0:
        return None
    assert 0 <= tail_position < nbytes
    first = last - tail_count + 1
    start = 0  # byte position of chunks[index] in the batch
    for index, chunk in enumerate(chunks):
        if tail_position < start + len(chunk):
            break
        start += len(chunk)
    return first, last, chunks[index:], tail_position - start, nbytes - start


def _split_ready(waiters: list[_AsyncWaiter], durable_next: int) -> tuple[list[_AsyncWaiter], list[_AsyncWaiter]]:
    ready = [w for w in waiters if w[0] < durable_next]
    if not ready:
        return [], waiters
    return ready, [w for w in waiters if w[0] >= durable_next]


def _resolve_all(waiters: list[_AsyncWaiter], error: BaseException | None) -> None:
    for _offset, loop, future in waiters:
        try:
            loop.call_soon_threadsafe(_resolve, future, error)
        except RuntimeError:  # the loop was closed; nobody is waiting any more
            pass


def _resolve(future: "asyncio.Future[bool]", error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(True)
    else:
        future.set_exception(error)


def _lag_function(wal_ref: "weakref.ref[WriteAheadLog]") -> Callable[[], float]:
    def lag() -> float:
        wal = wal_ref()
        return float(wal._reader_lag()) if wal is not None else 0.0
    return lag


def _real_root(fs: FileSystem, directory: str, root_dir: str) -> str:
    """The WAL root ``directory`` really lies in (two levels up from its resolved path, on
    the real disk; ``root_dir`` on any other file layer, which has no links)."""
    if not isinstance(fs, RealFs):
        return root_dir
    return os.path.dirname(os.path.dirname(os.path.realpath(directory)))


def _holds_wal(fs: FileSystem, directory: str) -> bool:
    """Whether ``directory`` holds a WAL already (a segment or a checkpoint)."""
    try:
        return any(n.endswith(".seg") or n == "wal.ckpt" for n in fs.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return False


def _lock_and_replay(fs: FileSystem, directory: str, root_dir: str) -> DirLock:
    """Lock the directory for an opener that is not in a journaled group (standalone, or
    in a syncfs group), then replay the root's journal if it has one.

    The root's shared journal may hold rounds of this WAL that only it has, until it is
    replayed (under the journal's lock: WalLocked while a journaled group uses it). Also in
    a syncfs group, which checked the journal only when it was created: a journaled group
    may have started on the root since. Checked with the directory's lock already held: a
    journaled group starting later is kept out by that lock (CommitGroup.claim), one running
    now by its journal's lock, so the two kinds of opener never both have this directory.
    The root is the one the directory really lies in, whatever path reached it (a
    symlinked namespace would otherwise slip past a running group's journal)."""
    journal_root = _real_root(fs, directory, root_dir)
    with standalone_turn(fs, journal_root):  # before the directory's lock: see standalone_turn
        lock = _take_lock(fs, directory)
        try:
            if journal_exists(fs, journal_root):
                replay_standalone(fs, journal_root, held=directory)
        except BaseException:
            lock.release()
            raise
    return lock


def _take_lock(fs: FileSystem, directory: str) -> DirLock:
    path = os.path.join(directory, LOCK_NAME)
    try:
        return fs.lock(path)
    except LockHeld as e:
        raise WalLocked(directory) from e
