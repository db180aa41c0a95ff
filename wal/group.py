"""One commit group per WAL root: one writer thread and one sync per round for every topic
whose WAL is open under that root (design and failure semantics: docs/WAL.md, "Commit
groups" and "The shared journal").

Each round the group's writer takes the pending frames of every topic that has any (the
append core's ``take()``, as the per-topic writer does), writes each topic's round (its
round marker, then its frames) to that topic's own active segment, makes all of them
durable with ONE sync, and only then publishes each topic's durable watermark (waiters,
async futures, cache, durable listeners). The sync is one of two kinds:

* **journal** (``journal=JournalConfig(...)``): the round is also appended to the root's
  shared journal (``wal.journal``) and ONE fdatasync of the journal file makes it durable;
  segment files are synced lazily by the journal's checkpoints and replayed from the
  journal after a crash, before any WAL of the root opens.
* **syncfs** (no journal): ONE ``syncfs(2)`` of the root's file system. Every round is
  synced before the next one is written, so in each topic's segments only the last round
  can be unsynced: the per-topic format and recovery rules (native/format.py) hold as they
  are, and a topic's files are exactly what a per-topic writer would have left.

A topic joins when its WAL opens (``WriteAheadLog.open(..., group=...)``) and leaves when
it closes: ``leave`` waits until the group has written and synced everything the topic had
appended, then the group lets go of its files. Rotation, retention, close and delete of one
topic touch only that topic's files. Idle topics cost no work per round: a topic is looked
at only after it woke the group (an append to a parked core calls ``wake``).

Failure: a write error belongs to one file, so it fails that topic only (its partial
round is its unsynced last round, never journaled). A ``syncfs`` error cannot say which
file's write-back failed, and a journal write or sync error (or a segment sync failing at
a checkpoint or a close) leaves the journal as the only copy of acknowledged rounds, so
each fails EVERY topic of the group closed (``WalFailed``; nothing of the failed round is
acknowledged) and the group takes no new members: the host must restart.
"""
from __future__ import annotations

import logging
import os
import threading
from prometheus_client import CollectorRegistry
import time
from collections.abc import Callable
from typing import NamedTuple

from native import write_rounds
from native.format import ROUND_MARKER_BYTES
from native.journal_format import ENTRY_BYTES_MAX
from wal.budget import MemoryBudgets, mark_writer_thread
from wal.config import CACHE_GROUP_BYTES_MAX, PENDING_GROUP_BYTES_MAX
from wal.errors import CorruptLog, SyncNotCovered, WalFailed, WalLocked, WalTimeout
from wal.fs import LOCK_NAME, FileSystem, Lock, LockHeld, SyncHandle, directory_key
from wal.journal import Journal, JournalConfig, journal_exists, replay_standalone
from wal.metrics import GroupMetrics
from wal.writer import Batch, CommitHooks, SegmentAppender, Written

_log = logging.getLogger(__name__)

class MemberHooks(NamedTuple):
    """A topic's side of the group's loop; every call is made on the group's thread."""

    #: on_durable, on_rotate (through the appender) and fail, as for the per-topic writer.
    commit: CommitHooks
    #: Everything pending as one batch, at once, or None when nothing is (or the WAL failed).
    take_ready: Callable[[], Batch | None]
    #: Park the topic's append core: True if nothing is pending (its next append calls
    #: ``wake``), False if frames are pending (the group looks again next round).
    park: Callable[[], bool]


class GroupMember:
    """One topic's membership; what the WAL holds instead of its own writer thread."""

    def __init__(self, group: "CommitGroup", hooks: MemberHooks, appender: SegmentAppender, name: str,
                 wal_id: bytes | None, wal_path: bytes) -> None:
        self._group = group
        self.hooks = hooks
        # The three calls every round makes, looked up once (the round's per-topic cost
        # is what bounds latency with many topics: docs/WAL.md).
        self.take_ready = hooks.take_ready
        self.on_durable = hooks.commit.on_durable
        self.park = hooks.park
        self.appender = appender
        self.name = name
        self.wal_id = wal_id  # journaled groups: the WAL's .walid, named by its journal entries
        self.wal_path = wal_path  # ... and its directory relative to the root
        self.leaving = False
        self.failed = False
        self.left = threading.Event()
        #: Set when the close-time sync of this WAL's segment files failed (journaled): its
        #: files are then not durable on their own, whatever else failed before.
        self.close_error: BaseException | None = None
        # Who closes a leaving member's files (journaled), decided under the group's lock:
        # the group set ``released`` when it let the member go; the closer set ``gave_up``
        # when its wait timed out before that, and then the group closes them itself.
        self.released = False
        self.gave_up = False
        #: The WAL's hold on its directory (journaled: the group's claim; syncfs: its flock),
        #: set by the WAL once open. The WAL releases it when it closed in time; when its
        #: closer gave up, the group does, once it closed the files (``_settle``).
        self.dir_lock: "_Claim | Lock | None" = None

    @property
    def group(self) -> "CommitGroup":
        return self._group

    def wake(self) -> None:
        """The append core's callback (via the WAL): frames are pending for this topic."""
        self._group._ready(self)

    def start(self) -> None:
        """Nothing to start (the group's thread runs); for the per-topic writer's interface."""

    def join(self, timeout_s: float) -> bool:
        """Leave the group once everything appended is synced; False if not done in time.
        Journaled, the WAL's segment file is then synced and closed here, on the closing
        thread: a closed WAL never depends on the journal."""
        self._group._leave(self)
        if not self.left.wait(timeout_s):
            if self._group._give_up(self):
                return False  # the group closes this topic's files once it lets it go
            self.left.wait()  # let go just now: ``left`` is being set
        if self._group.journal is not None:
            # Also after this topic alone failed (a write error), and also when the group
            # failed after letting this topic go: its acknowledged rounds must not depend
            # on the journal once it is closed. (Files the group's failure abandoned, while
            # it still was a member, close as a no-op: the journal is their copy of record
            # until a restart, and the WAL was failed with them, so its close raises.)
            self._close_files()
        return True

    def _close_files(self) -> None:
        """Journaled: sync and close this WAL's segment files; a failure fails the WAL and
        the group (the journal is then the only copy of what the files lack)."""
        try:
            self.appender.close()
        except BaseException as exc:  # noqa: BLE001 - the journal is the only copy now
            self.close_error = exc  # close() raises: the files need the journal
            if not self.failed:
                self.failed = True
                self.hooks.commit.fail(exc)
            if not self._group.failed:
                self._group.fail(exc)


class _Claim:
    """A journaled group's claim on one WAL directory (see ``CommitGroup.claim``)."""

    def __init__(self, group: "CommitGroup", key: str) -> None:
        self._group: CommitGroup | None = group
        self._key = key

    def release(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            group._unclaim(self._key)


class CommitGroup:
    """The commit group of one WAL root (see the module docstring). Thread-safe."""

    def __init__(self, root: str, fs: FileSystem, journal: JournalConfig | None = None,
                 metrics_registry: CollectorRegistry | None = None, round_bytes_max: int = 16 * 1024 * 1024,
                 cache_bytes_max: int | None = CACHE_GROUP_BYTES_MAX,
                 pending_bytes_max: int | None = PENDING_GROUP_BYTES_MAX) -> None:
        """``journal``: make rounds durable through the root's shared journal (replayed
        here first, before any WAL of the root opens); None: one ``syncfs`` per round.
        ``metrics_registry``: where the group's metrics go (a private one when None).
        ``round_bytes_max``: a round takes topics until it holds this much (each topic's
        pending frames whole, so one topic's round may exceed it alone).
        ``cache_bytes_max``: the bytes every member's cache of recent frames may keep alive
        together (``wal.cache.CacheBudget``; by default WalConfig's ``cache_group_bytes_max``);
        None: each cache is bounded only on its own. ``pending_bytes_max``: the bytes all members
        together may hold appended but not yet taken by a round (``native.PendingBudget``;
        WalConfig's ``pending_group_bytes_max``): an append past it waits for room, as for its
        WAL's own ``pending_bytes_max`` (by default WalConfig's ``pending_group_bytes_max``);
        None: each WAL is bounded only on its own."""
        if round_bytes_max <= 0:
            raise ValueError("round_bytes_max must be positive")
        self.round_bytes_max = round_bytes_max
        self.metrics = GroupMetrics(metrics_registry)
        #: Both budgets of the root (wal/budget.py); adds to caches come from this group's
        #: thread alone, so the cache budget counts them without a lock.
        self.budgets = MemoryBudgets(root, cache_bytes_max, pending_bytes_max, self.metrics,
                                     failure=lambda: self._failure, single_adder=True)
        #: The budget every member's cache counts against (None: none).
        self.cache_budget = self.budgets.cache
        #: The pending bytes every member's append core counts into (None: none); appends
        #: that find it full wait in ``wait_for_room`` until a round takes some.
        self.pending_budget = self.budgets.pending
        self.root = root
        self.fs = fs
        fs.makedirs(root)
        self.journal: Journal | None = None
        self._sync: SyncHandle | None = None
        # The state first: the journal's checkpointer may fail the group (``fail``) as soon
        # as the journal is open.
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._waiting = False  # the writer thread waits on _work (set and read under _lock)
        self._members: set[GroupMember] = set()
        self._wal_ids: set[bytes] = set()  # the members' WAL ids: a join looks one up, not every member
        self._ready_members: dict[GroupMember, None] = {}  # an ordered set: woken since the last round
        self._failure: BaseException | None = None
        self._stopping = False
        self._claimed: set[str] = set()  # WAL directories open in this (journaled) group
        if journal is not None:
            self.journal = Journal.open(root, fs, journal, on_failure=self.fail, metrics=self.metrics)
        else:
            if not fs.syncfs_covers(root, [root]):
                raise SyncNotCovered(root, root)
            if journal_exists(fs, root):
                # A journal an earlier run left (in journal mode): replay it before any WAL opens.
                replay_standalone(fs, root)
            # Opened before any member writes: syncfs reports only write-back errors that
            # happened after the descriptor was opened (wal.fs.RealFs.open_syncfs).
            self._sync = fs.open_syncfs(root)
        self.rounds = 0  # rounds synced so far (one sync each)
        self._thread = threading.Thread(target=self._run, name=f"wal-commit-group:{root}", daemon=True)
        self._thread.start()

    # -- membership -----------------------------------------------------------
    def join(self, hooks: MemberHooks, appender: SegmentAppender, name: str,
             wal_id: bytes | None = None, wal_path: str = "") -> GroupMember:
        """Add a topic (its WAL recovered, nothing appended yet). Raises WalFailed once the
        group failed: its syncs cannot vouch for anything any more. A journaled group needs
        the WAL's id (``wal.identity``) and its directory relative to the root, which its
        journal entries name; a second WAL with the same id (a copied directory) is refused
        with CorruptLog, as replay could not tell their rounds apart."""
        if self.journal is not None:
            if wal_id is None or not wal_path:
                raise ValueError("a journaled commit group needs the WAL's id and path")
        member = GroupMember(self, hooks, appender, name, wal_id, wal_path.encode())
        if self.journal is not None:
            assert wal_id is not None
            with self._lock:
                self._check_join_locked(wal_id, wal_path)  # a copy is refused before anything else
            # A reopen: the rounds an earlier instance of this WAL journaled become history
            # first (Journal.wait_replay_past), so no replay can lay them over the directory.
            self.journal.wait_replay_past(wal_id)
        with self._lock:
            self._check_join_locked(wal_id, wal_path)
            if self.journal is not None:
                appender.journaled(self.journal.retire)
            self._members.add(member)
            if wal_id is not None:
                self._wal_ids.add(wal_id)
            # Looked at in the next round, which parks its core: appends made before that
            # are taken then, later ones wake the group.
            self._ready_members[member] = None
            self._work.notify()
        return member

    def _check_join_locked(self, wal_id: bytes | None, wal_path: str) -> None:
        self._check_locked()
        if wal_id is not None and wal_id in self._wal_ids:
            raise CorruptLog(wal_path, 0, f"WAL id {wal_id.hex()} is already the id of another WAL of "
                             "this group (a copied directory?): give one of them a new .walid")

    def claim(self, directory: str) -> "_Claim":
        """One opener per WAL directory in a journaled group (instead of a ``flock`` on its
        ``.lock``: no descriptor per topic). Other processes are kept out of the whole root
        by the journal's lock; this keeps a second open in this group out. WalLocked if the
        directory is claimed; ``release()`` the claim once the WAL let go of its files."""
        # One key per directory however it is spelled (symlinks, "..", relative paths).
        key = directory_key(self.fs, directory)
        # The directory must really lie in this root: an opener outside the group finds a
        # running group by the journal of the root the directory really lies in (its real
        # path, however it was reached). Through a namespace symlinked to another root, a
        # standalone opener would check that other root's journal and become a second
        # writer, or after a crash skip this journal's rounds.
        real_root = os.path.dirname(os.path.dirname(key))
        if real_root != directory_key(self.fs, self.root):
            raise WalLocked(directory, f"it really lies in {real_root}, not in the journaled commit group's root "
                            f"{self.root} (a symlinked namespace?): other openers could not see this group")
        with self._lock:
            if key in self._claimed:
                raise WalLocked(directory)
            self._claimed.add(key)
        try:
            # An opener from before this group (a standalone WAL, a syncfs group; it took
            # no journal lock while it runs) still holds the directory's own lock: refuse.
            # Later ones are kept out by the journal's lock, which this group holds.
            lock_path = os.path.join(directory, LOCK_NAME)
            if self.fs.exists(lock_path):
                try:
                    self.fs.lock(lock_path).release()
                except LockHeld as e:
                    raise WalLocked(directory) from e
        except BaseException:
            self._unclaim(key)
            raise
        return _Claim(self, key)

    def _unclaim(self, key: str) -> None:
        with self._lock:
            self._claimed.discard(key)

    def check(self) -> None:
        """Raises WalFailed if the group failed or was closed (it takes no new members)."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        if self._failure is not None:
            raise WalFailed(f"commit group of {self.root} failed: {self._failure!r}") from self._failure
        if self._stopping:
            raise WalFailed(f"commit group of {self.root} is closed")

    def wait_for_room(self, deadline: float, refused: Callable[[], bool], timeout_s: float) -> None:
        """``MemoryBudgets.wait_for_room`` of this group's budgets."""
        self.budgets.wait_for_room(deadline, refused, timeout_s)

    def on_own_thread(self) -> bool:
        """Whether the caller runs on the group's thread (a durable listener)."""
        return threading.get_ident() == self._thread.ident

    @property
    def room_waiters(self) -> int:
        """Appends waiting now for the group's pending budget (``wait_for_room``)."""
        return self.budgets.room_waiters

    def wake_room(self, everyone: bool = False) -> None:
        """``MemoryBudgets.wake_room`` of this group's budgets."""
        self.budgets.wake_room(everyone)

    def _ready(self, member: GroupMember) -> None:
        with self._lock:
            self._ready_members[member] = None
            if self._waiting:
                # Only a waiting writer needs waking, and only once: a busy (or already
                # woken) one takes every member queued here, under this lock, before it
                # waits again. Every append to a parked topic comes here, on the
                # producer's thread: at 1,000 topics, nearly every append.
                self._waiting = False
                self._work.notify()

    def _leave(self, member: GroupMember) -> None:
        with self._lock:
            member.leaving = True
            if member not in self._members or self._failure is not None:
                self._remove_locked(member)
                member.left.set()
                return
            self._ready_members[member] = None
            self._work.notify()

    def _remove_locked(self, member: GroupMember) -> None:
        if member in self._members:
            self._members.discard(member)
            if member.wal_id is not None:
                self._wal_ids.discard(member.wal_id)

    @property
    def members(self) -> int:
        with self._lock:
            return len(self._members)

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def failure(self) -> BaseException | None:
        """What failed the group (None while it works): no topic of the root can be
        acknowledged or opened again in this process; a restart replays the journal."""
        return self._failure

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the group's thread. Its members must have left (closed their WALs) first:
        the thread drains them before it stops, and WalTimeout says it did not in time."""
        with self._lock:
            self._stopping = True
            self._work.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise WalTimeout(f"commit group of {self.root} did not stop within {timeout_s} s")
        self.budgets.close()
        if self.journal is not None:
            self.journal.close()  # a last checkpoint: a clean stop leaves nothing to replay
        if self._sync is not None:
            self._sync.close()

    # -- the writer thread ----------------------------------------------------
    def _run(self) -> None:
        mark_writer_thread()  # never waits for the budgets: the rounds that free them are its own
        try:
            while (members := self._next_round()) is not None:
                self._round(members)
        except BaseException as exc:  # noqa: BLE001 - whatever it was, nothing more is synced
            self._fail_all(exc)

    def _next_round(self) -> list[GroupMember] | None:
        """The members woken since the last round (blocks while none are), or None to stop."""
        with self._lock:
            while not self._ready_members:
                if self._failure is not None or (self._stopping and not self._members):
                    return None
                self._waiting = True
                try:
                    self._work.wait(0.5 if self._stopping else None)
                finally:
                    self._waiting = False
            members = list(self._ready_members)
            self._ready_members.clear()
            return members

    def _round(self, members: list[GroupMember]) -> None:
        journal = self.journal
        if journal is None:
            written = self._write(members)
            if not written:
                return
            started = time.perf_counter()
            assert self._sync is not None
            self._sync.sync()  # raises: _run fails every member (nothing of this round is acknowledged)
        else:
            journal.wait_for_room(lambda: self._failure is not None)  # a bounded journal
            with journal.round_lock:  # a checkpoint's snapshot falls between rounds
                written = self._write(members)
                if not written:
                    return
                journal_bytes = journal.write()
            started = time.perf_counter()
            journal.sync()  # raises: as syncfs above
        seconds = time.perf_counter() - started
        if self._failure is not None:
            # The group failed on another thread (its journal's checkpointer) while this
            # round was in flight: every topic was told WalFailed and its files were
            # abandoned, so nothing of this round is published as acknowledged.
            return
        self.rounds += 1
        self.metrics.on_round(len(written), seconds, journal_bytes if journal is not None else 0)
        for member, (batch, segment, position, size_bytes, _parts, _file) in written:
            member.on_durable(batch, segment, position, size_bytes, seconds)
        for member, _done in written:
            self._settle(member)

    def _write(self, members: list[GroupMember]) -> list[tuple[GroupMember, Written]]:
        """Each member's pending frames, written to its segment (and journaled), until the
        round holds ``round_bytes_max``: the members left go first in the next round (a
        round's size, so the journal's files and a replay, stay bounded whatever the
        number of topics times their pending bytes).

        Every topic's round is laid out first, then all of them are written with ONE call
        (``native.write_rounds``: one release of the GIL, not one per topic, which at
        1,000 topics cost a GIL hand-over and back per topic while producers ran). A file
        layer without descriptors (the tests' FaultFs) is written topic by topic instead.
        A write error still fails its own topic only."""
        journal = self.journal
        laid_out: list[tuple[GroupMember, Batch, list[bytes], bool]] = []  # (.., .., parts, by descriptor)
        fds: list[int] = []
        rounds: list[list[bytes]] = []
        round_bytes = 0
        errors: list[int] = []
        round_bytes_max = self.round_bytes_max
        now_ms = time.time_ns() // 1_000_000  # the segment-age check's clock, once per round
        try:
            for index, member in enumerate(members):
                if round_bytes >= round_bytes_max:
                    self._requeue(members[index:])
                    break
                batch = None if member.failed else member.take_ready()
                if batch is None:
                    self._settle(member)
                    continue
                nbytes = batch.nbytes
                try:
                    if journal is not None and ROUND_MARKER_BYTES + nbytes > ENTRY_BYTES_MAX:
                        raise WalFailed(f"a round of {nbytes} bytes exceeds a journal entry's limit "
                                        f"({ENTRY_BYTES_MAX})")
                    parts, fd = member.appender.lay_out(batch, now_ms)
                except BaseException as exc:  # noqa: BLE001 - one file's error fails its topic only
                    self._fail_member(member, exc)
                    continue
                if fd < 0:
                    try:
                        member.appender.write_parts(parts)
                    except BaseException as exc:  # noqa: BLE001 - one file's error fails its topic only
                        self._fail_write(member, exc)
                        continue
                round_bytes += nbytes
                laid_out.append((member, batch, parts, fd >= 0))
                if fd >= 0:
                    fds.append(fd)
                    rounds.append(parts)
            if self.budgets.room_waiters:
                self.wake_room()  # this round took pending frames: the first append in line goes on
            if fds:
                errors = write_rounds(fds, rounds)
        finally:
            for member, _batch, _parts, held in laid_out:
                if held:
                    member.appender.let_go()
        written: list[tuple[GroupMember, Written]] = []
        by_descriptor = iter(errors)
        for member, batch, parts, held in laid_out:
            error = next(by_descriptor) if held else 0
            if error:
                self._fail_write(member, OSError(error, f"writing a commit round: {os.strerror(error)}"))
                continue
            done = member.appender.end_round(batch, parts)
            written.append((member, done))
            if journal is not None:
                assert member.wal_id is not None
                journal.add(member.wal_id, member.wal_path, done.segment.base_offset, done.position - ROUND_MARKER_BYTES,
                            batch.first_offset, batch.last_offset - batch.first_offset + 1, done.parts,
                            ROUND_MARKER_BYTES + batch.nbytes, done.file)
        return written

    def _fail_member(self, member: GroupMember, exc: BaseException) -> None:
        """One topic's file failed: that topic fails closed (nothing of its round is
        acknowledged or journaled); the group and the other topics go on."""
        member.failed = True
        member.hooks.commit.fail(exc)
        self._settle(member)

    def _fail_write(self, member: GroupMember, exc: BaseException) -> None:
        """A topic's round failed part-way through its write: that topic fails alone, and
        what of the round reached its segment is cut back off it first
        (``SegmentAppender.cut_back``: else a reopen of the topic in this group would build
        on frames the journal never saw). If even that fails, the group fails: the file
        may keep them, and only a restart's replay can vouch for it again. Like any round
        that failed (never acknowledged), its whole frames may then survive the restart
        (the replay keeps whole rounds continuing a WAL, ``wal.journal.continuing_rounds``):
        its outcome is unknown (docs/SAFETY.md)."""
        try:
            member.appender.cut_back()
        except BaseException as cut_exc:  # noqa: BLE001 - the file may keep the failed round
            _log.error("commit group of %s: a round of %s failed to write (%r) and could not be cut back off "
                       "its segment: %r", self.root, member.name, exc, cut_exc)
            self.fail(cut_exc)  # this topic with every other: before anyone is told
            return
        self._fail_member(member, exc)

    def _requeue(self, members: list[GroupMember]) -> None:
        """Members a full round left out: first in line for the next one."""
        with self._lock:
            waiting = self._ready_members
            self._ready_members = dict.fromkeys(members)
            self._ready_members.update(waiting)

    def fail(self, exc: BaseException) -> None:
        """Fail every topic of the group closed (a journal or checkpoint failure)."""
        self._fail_all(exc)

    def _settle(self, member: GroupMember) -> None:
        """After a member's turn: look again next round if frames are pending, else park
        it (its next append wakes the group), or let it go if it is leaving and drained."""
        if not member.failed and not member.park():
            self._ready(member)
            return
        if not member.leaving:
            # Read without the group's lock (this runs for every topic of every round):
            # ``_leave`` sets it under the lock and then queues the member again, so a
            # leave this read misses is seen at the member's next turn.
            return
        with self._lock:
            self._remove_locked(member)
            member.released = True
            closer_gave_up = member.gave_up
        if self.journal is None:
            member.appender.close()
        elif closer_gave_up:
            member._close_files()  # its closer timed out and left them to the group
        # Otherwise (journaled) the leaving WAL's own thread syncs and closes its files
        # (GroupMember.join).
        if closer_gave_up and member.close_error is None and member.dir_lock is not None:
            member.dir_lock.release()  # the WAL's close left it to the group: its files are closed now
        member.left.set()

    def _give_up(self, member: GroupMember) -> bool:
        """A leaving member's closer timed out: True if the group had not let it go yet
        (the group then closes its files when it does), False if it just had."""
        with self._lock:
            if member.released:
                return False
            member.gave_up = True
            return True

    def _fail_all(self, exc: BaseException) -> None:
        _log.error("commit group of %s failed: every topic in it fails closed: %r", self.root, exc)
        with self._lock:
            if self._failure is None:
                self._failure = exc
            members = list(self._members)
            self._members.clear()
            self._wal_ids.clear()
            self._ready_members.clear()
        if self.journal is not None:
            self.journal.mark_failed(exc)
        with self._lock:
            self._work.notify()  # the writer thread stops
        try:
            for member in members:
                member.failed = True
                try:
                    member.hooks.commit.fail(exc)
                finally:
                    member.appender.abandon()
                    member.left.set()
        finally:
            self.wake_room(everyone=True)  # appends waiting for room: WalFailed (atk83 F2)
