"""The shared journal of a WAL root: one fdatasync per commit round for every topic.

Format and replay rules: ``native/journal_format.py``. Design, failure semantics and the
measured choice: docs/WAL.md, "The shared journal".

A :class:`Journal` is owned by the root's :class:`wal.group.CommitGroup`. Each round, the
group writes every woken topic's round to that topic's own segment (no sync) and adds it
here as an entry (:meth:`Journal.add`); :meth:`Journal.write` appends the whole round to the
current journal file with one positioned write, and :meth:`Journal.sync` makes it durable
with one fdatasync. Only then does the group publish the topics' durable watermarks.

Segments are synced lazily by the journal's checkpointer thread: it snapshots the journal's
end and the segment files written since the last checkpoint (between rounds), fdatasyncs
those files, then records the snapshot in ``.journal/wal.ckpt``. Journal files entirely
before the checkpoint are recycled. A closed WAL never depends on the journal: closing it
syncs its segment (:class:`SegmentFile`). An idle topic pins nothing: a checkpoint covers
every topic at once.

Opening a journal replays it first (:func:`replay`): rounds after the checkpoint are written
into the segments of the WAL instances that wrote them (by ``.walid``), before any WAL of the
root opens. A topic deleted, or deleted and created again, is never written to: its id is
gone or different.

Failure: a journal write or sync error, and any segment sync error (at a checkpoint or a
close), fails the whole group closed (the host must restart; replay then restores every
acknowledged round from the journal). The journal is never truncated past a segment whose
sync failed.
"""
from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from native import crc32c, decode_segment_header, scan_frames
from native.errors import CorruptSegmentHeader
from native.format import (
    ROUND_MARKER,
    ROUND_MARKER_BYTES,
    ROUND_MARKER_TAG,
    SEGMENT_HEADER_BYTES,
    segment_file_name,
    segment_marker_key,
)
from native.journal_format import (
    ENTRY_BYTES_MAX,
    ENTRY_HEADER_BYTES,
    FILE_HEADER_BYTES,
    JOURNAL_DIR,
    ROUND_HEADER_BYTES,
    EntryHeader,
    decode_entry_header,
    decode_file_header,
    decode_round_header,
    encode_entry_header,
    encode_file_header,
    encode_round_header,
    ENTRY_PATH_BYTES_MAX,
    find_round_headers,
    journal_file_name,
    new_nonce,
    parse_journal_file_name,
)
from wal.checkpoint import CHECKPOINT_NAME, read_checkpoint, write_checkpoint
from wal.errors import CorruptLog, WalFailed, WalLocked, WalTimeout
from wal.fs import (LOCK_NAME, AppendFile, Chunk, FileSystem, LockHeld, RandomWriteFile, RealFs, SyncHandle,
                    directory_key)
from wal.fs import Lock as DirLock
from wal.identity import WAL_ID_NAME, read_wal_id
from wal.metrics import GroupMetrics
from wal.segment import parse_segment_name

_log = logging.getLogger(__name__)

_TEMP_SUFFIX = ".tmp"


@dataclass(frozen=True, slots=True)
class JournalConfig:
    #: The size at which the writer moves to the next journal file (files are recycled, so
    #: after the first few they keep this size and rounds overwrite them without a size
    #: change to sync). A round larger than a whole file gets a file of its own that grows
    #: past this size.
    file_bytes: int = 64 * 1024 * 1024
    #: A checkpoint starts once this many journal bytes were written since the last one.
    checkpoint_bytes: int = 32 * 1024 * 1024
    #: ... or once this long passed with anything written since the last one.
    checkpoint_interval_s: float = 10.0
    #: At most this many journal files from the checkpoint's to the current one: beyond,
    #: a round waits for a checkpoint first (backpressure), so the journal's size on disk
    #: and the replay after a crash stay bounded (about ``files_max * file_bytes``).
    files_max: int = 4
    #: A checkpoint with at least this many segment files to sync makes them durable with
    #: one ``syncfs`` of the root's file system, where that reaches them all, instead of
    #: one ``fdatasync`` (one device flush) each (``Journal._sync_by_syncfs``). A ``syncfs``
    #: also writes back every other dirty file of that file system: on one shared with a
    #: heavy writer, raise this.
    syncfs_min_files: int = 32

    def __post_init__(self) -> None:
        if self.file_bytes < FILE_HEADER_BYTES + ROUND_HEADER_BYTES + ENTRY_HEADER_BYTES or self.checkpoint_bytes <= 0:
            raise ValueError("journal file_bytes must hold a round; checkpoint_bytes must be positive")
        if self.checkpoint_interval_s <= 0:
            raise ValueError("journal checkpoint_interval_s must be positive")
        if self.files_max < 2:
            raise ValueError("journal files_max must be at least 2 (the checkpoint's file and the next)")
        if self.syncfs_min_files < 1:
            raise ValueError("journal syncfs_min_files must be at least 1")


@dataclass
class ReplayReport:
    """What a replay found and wrote."""

    rounds: int = 0
    entries: int = 0
    bytes: int = 0  # entry bytes written into segments
    wals: int = 0  # WAL instances written to
    skipped_entries: int = 0  # of WALs deleted since, or of segments retention removed
    seconds: float = 0.0
    start_file: int = 0  # the file the checkpoint named (where replay started)
    end_file: int = 0  # where the valid rounds end (the next round's file, position, sequence)
    end_position: int = 0
    next_round: int = 0


class SegmentFile:
    """A topic's segment file in a journaled group: written by the group's thread without
    syncing, synced by the checkpointer, and synced before it is closed (a closed WAL never
    depends on the journal). ``sync`` and ``close`` are serialised, so a checkpoint never
    syncs a descriptor that was closed (and maybe reused) under it; ``write`` and the
    closing calls are serialised too (a separate lock, so a write never waits for a sync)."""

    def __init__(self, inner: AppendFile, path: str | None = None) -> None:
        self._inner = inner
        #: Where the file is, or None.
        self.path = path
        #: Whether one ``syncfs`` of the journal's root reaches this file: judged once, when
        #: the journal first takes a round of it (``Journal.add``), while the file is sure
        #: to be where it was opened; None until then.
        self.syncfs_covered: bool | None = None
        inner_hold: Callable[[], int] | None = getattr(inner, "hold", None)
        # The descriptor does not change while the file is open (and ``hold`` checks that
        # it is): read once, not for every round.
        self._fd = -1 if inner_hold is None else inner_hold()
        self._lock = threading.Lock()  # sync, close, abandon
        self._io_lock = threading.Lock()  # write against close/abandon
        #: After ``hold`` returned a descriptor: the file may be closed again. The lock's
        #: own release, not a method calling it: a commit round calls it for every topic.
        self.let_go: Callable[[], None] = self._io_lock.release
        self._state = "open"  # open | closed (synced first) | failed | abandoned

    def write(self, chunks: Sequence[Chunk]) -> None:
        with self._io_lock:
            if self._state != "open":
                raise WalFailed(f"write to a segment file that is {self._state}")
            self._inner.write(chunks)

    @property
    def closed(self) -> bool:
        """Closed (synced first) or abandoned: nothing more to sync or close."""
        return self._state in ("closed", "abandoned")

    @property
    def closed_synced(self) -> bool:
        """Closed after a sync: durable on its own, nothing for a checkpoint to do."""
        return self._state == "closed"

    def hold(self) -> int:
        """The descriptor, held open (a close or abandon waits) until ``let_go``, for a
        write by descriptor (``native.write_rounds``); -1 if the file has none (a test file
        layer: write through ``write``). WalFailed if the file is no longer open."""
        if self._fd < 0:
            return -1
        self._io_lock.acquire()
        if self._state != "open":
            self._io_lock.release()
            raise WalFailed(f"write to a segment file that is {self._state}")
        return self._fd

    def sync(self) -> None:
        """fdatasync; nothing to do once closed (a close syncs first)."""
        with self._lock:
            if self._state == "open":
                self._sync_locked()
            elif self._state in ("failed", "abandoned"):
                raise WalFailed(f"segment file {self._state}: its unsynced bytes live only in the journal")

    def check(self) -> None:
        """What ``sync`` raises, without syncing: for a checkpoint that makes the file
        durable by other means (one ``syncfs`` of its file system)."""
        with self._lock:
            if self._state in ("failed", "abandoned"):
                raise WalFailed(f"segment file {self._state}: its unsynced bytes live only in the journal")

    def close(self, synced: bool = False) -> None:
        """Sync (unless ``synced``: a ``syncfs`` that began after its last write returned),
        then close: what it holds is durable without the journal from now on. Nothing to
        do if it was closed or abandoned already."""
        with self._lock:
            if self._state == "open":
                if not synced:
                    self._sync_locked()
                with self._io_lock:
                    self._inner.close()
                    self._state = "closed"
            elif self._state == "failed":
                raise WalFailed("segment file failed to sync; its unsynced bytes live only in the journal")

    def abandon(self) -> None:
        """Close without syncing (the group failed: nothing more is acknowledged anyway)."""
        with self._io_lock:
            if self._state == "open":
                self._inner.close()
                self._state = "abandoned"

    def mark_failed(self) -> None:
        """A sync that covered this file failed (a checkpoint's ``syncfs``, which cannot say
        which file failed): as if its own had. Its unsynced bytes live only in the journal."""
        with self._lock, self._io_lock:
            if self._state == "open":
                self._state = "failed"

    def _sync_locked(self) -> None:
        try:
            self._inner.sync()
        except BaseException:
            with self._io_lock:
                self._state = "failed"
                self._inner.close()
            raise


class _Writer:
    """The current journal file (group thread only, under the round lock)."""

    def __init__(self, sequence: int, nonce: int, handle: RandomWriteFile, position: int) -> None:
        self.sequence = sequence
        self.nonce = nonce
        self.handle = handle
        self.position = position


@dataclass
class _Prepared:
    sequence: int
    nonce: int
    path: str


@dataclass
class _Snapshot:
    file: int
    position: int
    round: int
    files: list[SegmentFile] = field(default_factory=list)


class Journal:
    """The shared journal of one WAL root (module docstring). Use :meth:`open`."""

    @classmethod
    def open(cls, root: str, fs: FileSystem, config: JournalConfig | None = None,
             on_failure: Callable[[BaseException], None] | None = None,
             metrics: GroupMetrics | None = None) -> "Journal":
        """Take the journal's lock, replay what the last run left (into the WALs of
        ``root``, before any of them opens), and start a fresh file for new rounds.
        Raises WalLocked when another process (or group) has this root's journal open,
        CorruptLog when replay finds synced rounds damaged (nothing written then)."""
        config = config or JournalConfig()
        directory = os.path.join(root, JOURNAL_DIR)
        lock = _lock_journal(fs, root, directory)
        try:
            report = replay(fs, root)
            settled = _settle_segments(fs, root)
            journal = cls(root, fs, config, lock, report, on_failure, metrics or GroupMetrics())
            journal._settled = settled
        except BaseException:
            lock.release()
            raise
        return journal

    def __init__(self, root: str, fs: FileSystem, config: JournalConfig, lock: DirLock, report: ReplayReport,
                 on_failure: Callable[[BaseException], None] | None, metrics: GroupMetrics) -> None:
        self.root = root
        self.metrics = metrics
        metrics.on_replay(report.rounds, report.seconds)
        self.fs = fs
        self.config = config
        self.directory = os.path.join(root, JOURNAL_DIR)
        self.replayed = report
        self._settled: dict[str, dict[str, int]] = {}  # see take_settled
        self._lock_file = lock
        self._on_failure = on_failure
        # The round lock: held by the group's thread from a round's first segment write to
        # its journal write, and by the checkpointer while it snapshots. So a snapshot
        # always falls between rounds: every segment byte of every round before the
        # snapshot's journal position was written to a file the snapshot lists.
        self.round_lock = threading.Lock()
        self._entries: list[Chunk] = []  # the round being built: entry headers and bytes
        self._entry_headers: list[bytes] = []
        self._round_bytes = 0
        self._dirty: dict[int, SegmentFile] = {}  # segment files written since the snapshot
        #: The last round holding an entry of each WAL id, while a replay would still apply
        #: it (pruned at checkpoints): see ``wait_replay_past``.
        self._last_round_of: dict[bytes, int] = {}
        self._retired: list[SegmentFile] = []
        self._next_round = report.next_round
        self._failure: BaseException | None = None
        self._running: DirLock | None = None  # RUNNING_NAME, once taken (last in __init__)
        self._running_lock = threading.Lock()  # close and a failure may let go of it at once
        self._prepare_lock = threading.Lock()
        self._checkpointed_cond = threading.Condition(threading.Lock())  # a checkpoint landed
        self._spare: _Prepared | None = None
        # Until the new checkpoint below is durable, the replayed files stay as they are: a
        # crash in between replays them again. Only files below the old checkpoint recycle.
        self._checkpointed = _Snapshot(report.start_file, 0, 0)
        self._remove_temp_files()
        # A fresh file for this run: whatever followed the replayed rounds (a torn round,
        # stale bytes) is never written over, so it can never be mistaken for our rounds.
        first = self._prepare(max(report.end_file, self._highest_file()) + 1)
        self._writer = self._open_writer(first)
        self._checkpointed = _Snapshot(first.sequence, FILE_HEADER_BYTES, self._next_round)
        write_checkpoint(fs, self.directory, _checkpoint_state(self._checkpointed), name=_CHECKPOINT)
        self._recycle_below(first.sequence)
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self._wake = threading.Condition(threading.Lock())
        self._checkpoint_wanted = False
        self._stopping = False
        self.checkpoints = 0
        self.rounds = 0
        self._checkpoint_record_failing = False  # logged once per run of failures
        self._checkpoint_attempts = 0  # checkpoints that ended, written or not (wait_replay_past)
        # Before any round is written: it reports every write-back error after this point.
        self._syncfs: SyncHandle | None = _open_syncfs(fs, root)
        self._thread = threading.Thread(target=self._checkpointer, name=f"wal-journal-checkpoint:{root}", daemon=True)
        self._thread.start()
        # Last: from here on every round the journal holds is this process's own.
        running = _take_running_lock(fs, self.directory)
        with self._running_lock:
            self._running = running
        if self.failed:
            self._let_go_of_running()  # failed meanwhile (its checkpointer)

    # ------------------------------------------------------------------ the group's side
    def add(self, wal_id: bytes, wal_path: bytes, segment_base: int, position: int, first_offset: int,
            count: int, parts: Sequence[Chunk], nbytes: int, file: AppendFile) -> None:
        """One topic's round, already written to its segment ``file`` at ``position``
        (round marker first): journal it. The next checkpoint syncs ``file``; only the file
        is kept, not what wrote it, so a WAL that closes meanwhile is not kept alive.
        ``wal_path``: the WAL's directory relative to the root (``entry_path``). The caller
        checked ``nbytes <= ENTRY_BYTES_MAX``. Called with ``round_lock`` held."""
        header = encode_entry_header(wal_id, segment_base, position, first_offset, count, nbytes, wal_path)
        self._entry_headers.append(header)
        self._entries.append(header)
        self._entries.extend(parts)
        self._round_bytes += len(header) + nbytes
        self._last_round_of[wal_id] = self._next_round  # the number write() gives this round
        if isinstance(file, SegmentFile):
            if file.syncfs_covered is None:  # its first round: once per segment file
                file.syncfs_covered = (self._syncfs is not None and file.path is not None
                                       and self.fs.syncfs_covers(self.root, [file.path]))
            self._dirty[id(file)] = file

    def write(self) -> int:
        """Append the round built by ``add`` to the journal (one positioned write, no sync);
        its size in bytes (0 when nothing was added). Called with ``round_lock`` held."""
        if not self._entry_headers:
            return 0
        length = ROUND_HEADER_BYTES + self._round_bytes
        writer = self._writer
        if writer.position + length > self.config.file_bytes and writer.position > FILE_HEADER_BYTES:
            writer = self._switch()
        header = encode_round_header(writer.nonce, self._next_round, length, len(self._entry_headers),
                                     b"".join(self._entry_headers))
        parts, self._entries, self._entry_headers, self._round_bytes = self._entries, [], [], 0
        parts.insert(0, header)
        writer.handle.pwrite(parts, writer.position)
        writer.position += length
        self._next_round += 1
        self.rounds += 1
        self._since_checkpoint += length
        if self._since_checkpoint >= self.config.checkpoint_bytes and not self._checkpoint_wanted:
            self._request_checkpoint()
        return length

    def discard(self) -> None:
        """Forget a round that was being built (its write failed; nothing was acknowledged)."""
        self._entries, self._entry_headers, self._round_bytes = [], [], 0

    def sync(self) -> None:
        """fdatasync of the current journal file: the round just written is durable."""
        self._writer.handle.sync()

    def retire(self, file: SegmentFile) -> None:
        """A segment file the group stopped writing (rotation): synced and closed by the
        next checkpoint, before the journal is truncated past its rounds. Called with
        ``round_lock`` held (rotation happens inside a round)."""
        self._retired.append(file)

    @property
    def failed(self) -> bool:
        return self._failure is not None

    def close(self) -> None:
        """Stop the checkpointer after a final checkpoint (every WAL of the group must have
        left): a clean stop leaves nothing to replay."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()
        self._writer.handle.close()
        if self._syncfs is not None:
            self._syncfs.close()
        self._let_go_of_running()
        self._lock_file.release()

    def _let_go_of_running(self) -> None:
        with self._running_lock:
            running, self._running = self._running, None
        if running is not None:
            running.release()

    # ------------------------------------------------------------------ files
    def _highest_file(self) -> int:
        found = [s for s in map(parse_journal_file_name, self.fs.listdir(self.directory)) if s is not None]
        return max(found, default=0)

    def _path(self, sequence: int) -> str:
        return os.path.join(self.directory, journal_file_name(sequence))

    def _prepare(self, sequence: int) -> _Prepared:
        """A durable, empty journal file named ``sequence`` with a new nonce: a recycled one
        (below the checkpoint) if there is one, else a new one holding only its header."""
        nonce = new_nonce()
        path = self._path(sequence)
        header = encode_file_header(sequence, nonce)
        recyclable = self._recyclable(sequence)
        if recyclable:
            old = self._path(recyclable[0])
            handle = self.fs.open_rw(old)
            try:
                # The new header (with its new nonce) first, then the name: a crash in between
                # leaves an old name whose stale rounds carry the old nonce, below the checkpoint.
                handle.pwrite([header], 0)
                handle.sync()
            finally:
                handle.close()
            self.fs.rename(old, path)
        else:
            # A new file holds only its header and grows as rounds are appended (its first
            # use pays the size updates a recycled file no longer needs).
            temp = path + _TEMP_SUFFIX
            if self.fs.exists(temp):
                self.fs.remove(temp)
            created = self.fs.open_append(temp)
            try:
                created.write([header])
                created.sync()
            finally:
                created.close()
            self.fs.rename(temp, path)
        self.fs.fsync_dir(self.directory)
        return _Prepared(sequence, nonce, path)

    def _recyclable(self, below: int) -> list[int]:
        """Journal files every checkpoint is past (below ``below`` and the durable
        checkpoint), oldest first."""
        limit = min(below, self._checkpointed.file)
        return sorted(s for s in map(parse_journal_file_name, self.fs.listdir(self.directory))
                      if s is not None and s < limit)

    def _recycle_below(self, sequence: int) -> None:
        """Keep one recyclable file (the next spare), delete the others. Called with
        ``_prepare_lock`` held (or before the checkpointer starts): ``_prepare`` recycles
        and renames files of this same set."""
        for old in self._recyclable(sequence)[1:]:
            try:
                self.fs.remove(self._path(old))
            except FileNotFoundError:
                pass

    def _remove_temp_files(self) -> None:
        """Leftovers of a run that crashed while preparing a file: never renamed in, so
        nothing refers to them. Only before any thread of this journal runs."""
        for name in self.fs.listdir(self.directory):
            if name.endswith(_TEMP_SUFFIX):
                self.fs.remove(os.path.join(self.directory, name))

    def _open_writer(self, prepared: _Prepared) -> _Writer:
        return _Writer(prepared.sequence, prepared.nonce, self.fs.open_rw(prepared.path), FILE_HEADER_BYTES)

    def _switch(self) -> _Writer:
        """Move to the next journal file (group thread, round lock held): the spare the
        checkpointer prepared, or one prepared here if it is not ready. The current file's
        rounds were all synced by now (rounds are written one after the other)."""
        sequence = self._writer.sequence + 1
        with self._prepare_lock:
            spare, self._spare = self._spare, None
            if spare is None or spare.sequence != sequence:
                _log.warning("journal %s: no spare file ready; preparing file %d on the commit path",
                             self.directory, sequence)
                spare = self._prepare(sequence)
        self._writer.handle.close()
        self._writer = self._open_writer(spare)
        with self._wake:
            self._wake.notify()  # the checkpointer prepares the next spare
        return self._writer

    def wait_for_room(self, stopping: Callable[[], bool]) -> None:
        """Group thread, before a round (without the round lock): while the journal holds
        ``files_max`` files past the checkpoint, ask for a checkpoint and wait for it. The
        checkpoint then falls between rounds and covers the whole journal. Producers feel
        it as backpressure (their appends pile up to ``pending_bytes_max``)."""
        waited = False
        with self._checkpointed_cond:
            while (self._writer.sequence - self._checkpointed.file + 1 >= self.config.files_max
                   and self._failure is None and not stopping()):
                if not waited:
                    waited = True
                    _log.info("journal %s: %d files past the checkpoint; the next round waits for a "
                              "checkpoint", self.directory, self._writer.sequence - self._checkpointed.file + 1)
                self._request_checkpoint()
                self._checkpointed_cond.wait(0.1)

    def take_settled(self, directory: str) -> dict[str, int] | None:
        """What the journal's open made durable in the WAL directory ``directory``
        (``_settle_segments``), once: a later call gets None, as does a directory it did
        not settle. A dict of segment path (normalised) to the size made durable; the
        directory's ``wal.ckpt`` was made durable too."""
        return self._settled.pop(os.path.normpath(directory), None)

    def wait_replay_past(self, wal_id: bytes, timeout_s: float = 60.0) -> None:
        """Before a WAL joins the group again (reopened): wait until no replay would apply
        the rounds its earlier instance journaled, asking for a checkpoint if needed.

        Why: that instance's close synced its files, and from then on the directory was
        free to be written outside this journal (moved out of the root, appended by a
        standalone opener, moved back). Its journal entries stay live until the next
        checkpoint; a replay would lay them over the directory again, and with the new
        instance's entries behind them it would find the WAL's offsets skipping (written
        elsewhere in between) and refuse the whole root. A checkpoint first makes the old
        entries history. Costs one checkpoint, only when a WAL is reopened within a
        checkpoint interval of its close. Returns at once if the journal failed (the
        group then refuses the join). WalTimeout, and the WAL is not opened, when a
        checkpoint made after this call could not write its record (a full disk: the open
        fails at once, and works again once a checkpoint lands), or none landed within
        ``timeout_s``."""
        with self.round_lock:
            last = self._last_round_of.get(wal_id)
        if last is None:
            return
        deadline = time.monotonic() + timeout_s
        with self._checkpointed_cond:
            attempts = self._checkpoint_attempts
            while self._checkpointed.round <= last and self._failure is None:
                if self._checkpoint_attempts > attempts + 1 and self._checkpoint_record_failing:
                    # One whole attempt began and ended after this call, and it failed.
                    raise WalTimeout(f"journal {self.directory}: a checkpoint could not write its record (a full "
                                     "disk?), so a WAL closed since the last checkpoint cannot be opened again yet")
                if time.monotonic() >= deadline:
                    raise WalTimeout(f"journal {self.directory}: no checkpoint within {timeout_s} s, so a WAL "
                                     "closed since the last one cannot be opened again yet")
                self._request_checkpoint()
                self._checkpointed_cond.wait(0.1)

    # ------------------------------------------------------------------ checkpoints
    def _request_checkpoint(self) -> None:
        with self._wake:
            self._checkpoint_wanted = True
            self._wake.notify()

    def _checkpointer(self) -> None:
        try:
            self._try_prepare_spare()  # the writer's first switch must not prepare its file itself
            while True:
                with self._wake:
                    if not (self._stopping or self._checkpoint_wanted):
                        self._wake.wait(self.config.checkpoint_interval_s)
                    stopping, wanted, self._checkpoint_wanted = self._stopping, self._checkpoint_wanted, False
                if self._failure is not None:
                    if stopping:
                        return
                    continue
                due = (wanted or self._since_checkpoint >= self.config.checkpoint_bytes
                       or time.monotonic() - self._last_checkpoint >= self.config.checkpoint_interval_s
                       or stopping)
                if due:
                    self.checkpoint()
                if stopping:
                    return
                self._try_prepare_spare()
        except BaseException as exc:  # noqa: BLE001 - whatever it was, the journal cannot be truncated
            self._fail(exc)

    def checkpoint(self) -> bool:
        """Sync every segment file written before the journal's current end, then record
        that end as the checkpoint and recycle the files before it. False when nothing
        was written since the last checkpoint."""
        with self.round_lock:
            snapshot = _Snapshot(self._writer.sequence, self._writer.position, self._next_round)
            files = list(self._dirty.values())
            retired, self._retired = self._retired, []
            self._dirty = {}
            durable = self._checkpointed.round  # rounds before it are no longer replayed
            self._last_round_of = {k: r for k, r in self._last_round_of.items() if r >= durable}
            self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        if (snapshot.file, snapshot.position) == (self._checkpointed.file, self._checkpointed.position) \
                and not files and not retired:
            return False
        started = time.perf_counter()
        by_syncfs = self._sync_by_syncfs(files, retired)
        if not by_syncfs:
            for file in files:
                file.sync()  # raises: the checkpointer fails the group (the journal is the only copy)
        for file in retired:
            file.close(synced=by_syncfs)
        try:
            write_checkpoint(self.fs, self.directory, _checkpoint_state(snapshot), name=_CHECKPOINT)
        except OSError as exc:
            # Only the record could not be written (a full disk: it needs a new file). The
            # files are synced and the older checkpoint still stands, so nothing is at risk:
            # replay would just start earlier. The next checkpoint tries again; meanwhile
            # the journal cannot move past it, which bounds it (``wait_for_room``).
            if not self._checkpoint_record_failing:
                _log.warning("journal %s: could not write a checkpoint (tried again at the next one): %r",
                             self.directory, exc)
            self._checkpoint_record_failing = True
            with self._checkpointed_cond:
                self._checkpoint_attempts += 1
                self._checkpointed_cond.notify_all()  # a reopen waiting for it fails at once
            return False
        if self._checkpoint_record_failing:
            _log.warning("journal %s: checkpoints are written again", self.directory)
            self._checkpoint_record_failing = False
        with self._checkpointed_cond:
            self._checkpointed = snapshot
            self._checkpoint_attempts += 1
            self._checkpointed_cond.notify_all()
        self.checkpoints += 1
        self.metrics.on_checkpoint(time.perf_counter() - started, len(files) + len(retired))
        _log.debug("journal %s: checkpoint at file %d byte %d (round %d): %d segment files synced in %.3f s",
                   self.directory, snapshot.file, snapshot.position, snapshot.round, len(files) + len(retired),
                   time.perf_counter() - started)
        return True

    def _sync_by_syncfs(self, files: list[SegmentFile], retired: list[SegmentFile]) -> bool:
        """A checkpoint's segment files made durable with ONE ``syncfs`` of the root's file
        system, where it reaches every one of them (``FileSystem.syncfs_covers``) and they
        are at least ``syncfs_min_files``; False (nothing done) otherwise: the caller syncs
        each file.

        Why: the checkpoint synced every file a round wrote since the last one, one
        ``fdatasync`` (one device flush) each. At 1,000 topics that took about 1.9 s of
        every 10, during which the journal's own sync, which every acknowledgement waits
        for, was twice as slow (p50 0.82 against 0.47 ms, p99 6.1 against 2.7 ms). Why
        not always: a ``syncfs`` also writes back every other dirty file of the file
        system, which with a few files costs more than their flushes (atk80 F1).

        Why it is as safe: every byte the checkpoint vouches for was written (its
        ``pwritev`` returned) before the snapshot, so before this ``syncfs`` began, and
        ``syncfs`` returns only once every dirty page of the file system is on stable
        storage. A write-back error of any of those pages fails it: the handle was opened
        before this journal's first round (``_open_syncfs``), and the kernel reports to a
        ``syncfs`` every error since its descriptor was opened (``syncfs_covers`` checks
        the kernel does). It cannot say which file failed, so the group fails (as a
        failed ``fdatasync`` of one file fails it), also for an error of a file that is
        not a WAL's: on a shared file system another program's write-back error costs the
        group its availability, never an acknowledged message. A file already failed or
        abandoned raises as its ``sync`` would."""
        handle = self._syncfs
        # Files closed since are synced already (a WAL's close syncs them): their paths
        # may be gone (a deleted topic), and they must not send every other file back to
        # its own fdatasync (atk80 F3).
        pending = [file for file in (*files, *retired) if not file.closed_synced]
        if handle is None or len(pending) < self.config.syncfs_min_files:
            return False
        # Whether the syncfs reaches a file was judged at its first round (``add``): a
        # file retention deleted since, or a topic deleted, does not change where its
        # pages go.
        if not all(file.syncfs_covered for file in pending):
            return False
        for file in pending:
            file.check()
        try:
            handle.sync()
        except BaseException:
            # The checkpointer fails the group (the journal is the only copy). Which file
            # lost pages is unknown: none of them may close as durable on its own.
            for file in pending:
                file.mark_failed()
            raise
        return True

    def _try_prepare_spare(self) -> None:
        """``_prepare_spare``, where an I/O error (a full disk) only waits for the next try:
        nothing depends on the spare yet. The group's thread prepares the file itself if
        it needs one first (``_switch``), and only a failure there fails the group."""
        try:
            self._prepare_spare()
        except OSError as exc:
            _log.warning("journal %s: preparing the next journal file failed (tried again at the next "
                         "checkpoint or switch): %r", self.directory, exc)

    def _prepare_spare(self) -> None:
        with self.round_lock:
            sequence = self._writer.sequence + 1
        with self._prepare_lock:
            ready = (self._spare is not None and self._spare.sequence == sequence) \
                or self.fs.exists(self._path(sequence))  # (or prepared by the group's thread meanwhile)
            if not ready:
                self._spare = self._prepare(sequence)
            # Whether or not a spare was needed: the files a checkpoint has passed go now
            # (one is kept to recycle into the next spare).
            self._recycle_below(self._checkpointed.file)

    def mark_failed(self, exc: BaseException) -> None:
        """The group failed: no more checkpoints (the journal stays the copy of record)."""
        if self._failure is None:
            self._failure = exc
        self._let_go_of_running()  # its segments may now lack rounds the journal holds

    def _fail(self, exc: BaseException) -> None:
        _log.error("journal %s failed: no more checkpoints; every topic of its group fails closed: %r",
                   self.directory, exc)
        if self._failure is None:
            self._failure = exc
        self._let_go_of_running()
        if self._on_failure is not None:
            self._on_failure(exc)


_CHECKPOINT = "wal.ckpt"


def _open_syncfs(fs: FileSystem, root: str) -> SyncHandle | None:
    """A ``syncfs`` handle for the checkpoints (``Journal._sync_by_syncfs``), or None where
    one ``syncfs`` of the root cannot stand for an ``fdatasync`` of each file
    (``syncfs_covers``) or cannot be opened: then checkpoints sync file by file."""
    if not fs.syncfs_covers(root, [root]):
        return None
    try:
        return fs.open_syncfs(root)
    except OSError as exc:
        _log.warning("journal of %s: no syncfs handle (checkpoints sync each segment file): %r", root, exc)
        return None

#: Held locked (``flock``, exclusive) by a journal whose group runs healthy: taken once the
#: last run's rounds were replayed and this run's first checkpoint is durable, let go when
#: the journal closes or fails. While it is held, every round the journal holds was written
#: by that process to its segment before it was journaled, so a segment must equal the
#: journal's copy of it: ``dnb verify`` compares them then (bit rot a checkpoint would make
#: permanent). Not held: a replay may still be rewriting segments a power loss cut short.
#: A checker probes it with a shared lock, which works across pid namespaces (containers)
#: where ``/proc/locks`` does not show other namespaces' locks.
RUNNING_NAME = "running.lock"
#: A checker's probe holds the lock for microseconds: the journal tries this many times,
#: ``RUNNING_LOCK_PAUSE_S`` apart, then runs without it (verify then does not compare).
RUNNING_LOCK_ATTEMPTS = 200
RUNNING_LOCK_PAUSE_S = 0.005


def _take_running_lock(fs: FileSystem, directory: str) -> DirLock | None:
    path = os.path.join(directory, RUNNING_NAME)
    for _attempt in range(RUNNING_LOCK_ATTEMPTS):
        try:
            return fs.lock(path)
        except LockHeld:
            time.sleep(RUNNING_LOCK_PAUSE_S)  # a checker's probe
        except OSError as e:  # a full disk creating the file: only verify's compare is lost
            _log.warning("journal %s: could not take %s (%s): dnb verify will not compare segments with it",
                         directory, RUNNING_NAME, e)
            return None
    _log.warning("journal %s: %s stayed locked by someone else: dnb verify will not compare segments with it",
                 directory, RUNNING_NAME)
    return None


def journal_running(root: str) -> bool:
    """Whether a healthy commit group runs on ``root``'s shared journal (see
    :data:`RUNNING_NAME`), probed with a shared ``flock`` that is let go at once, so a
    group starting meanwhile only waits (it retries). False when it cannot be told."""
    try:
        fd = os.open(os.path.join(root, JOURNAL_DIR, RUNNING_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # drops the shared lock if it was taken
    return False


#: Segment files per WAL whose size ``_settle_segments`` records: the last ones, which are
#: the ones a WAL's checkpoint may lag behind (a rotation writes a checkpoint).
_SETTLED_PER_WAL = 2


def _settle_segments(fs: FileSystem, root: str) -> dict[str, dict[str, int]]:
    """After the replay, under the journal's lock: make the file system holding the root
    durable with one ``syncfs``. Returns, by WAL directory (normalised), the size its last
    segment files had before it (by normalised path): every byte below those sizes was
    written before the syncfs began, so it is durable once it returns. So is the
    directory's ``wal.ckpt``. Only directories whose files that syncfs reaches are
    recorded (``FileSystem.syncfs_covers``: the root's own device, a file system whose
    syncfs flushes; not a volume mounted under the root, not FUSE).

    Why: after a crash a WAL's open must sync the segments past its own checkpoint before
    recording the recovered tip (``WriteAheadLog._sync_recovered_tail``): they may hold the
    crashing round, written but never synced. Each fdatasync is a device cache flush even
    on a clean file, so a broker reopening 1,000 topics paid 1,000 flushes for it, and
    1,000 more for the checkpoint recording the tip. One syncfs (one flush, plus whatever
    the file system has dirty, once per start) replaces the first ones, and lets the
    checkpoint at open go unsynced (``WriteAheadLog.open``).

    A file still that size at its WAL's open was not written since: from here on the
    journal's lock keeps every other opener of the root out, and a WAL running from
    before (holding its directory's lock, refused by the group's ``claim``) only appends,
    which changes the size. A WAL's record is taken once (``Journal.take_settled``): a
    reopen in this group syncs as usual. If the syncfs fails, or cannot stand for an
    fdatasync of each file there (``syncfs_covers``), nothing is recorded: every WAL syncs
    its own files at its open, as without a journal, and meets any error itself."""
    if not fs.syncfs_covers(root, [root]):
        return {}  # not a file system whose syncfs can stand for an fdatasync of each file
    settled: dict[str, dict[str, int]] = {}
    directories = _wal_directories(fs, root)
    for paths in directories.by_id.values():
        if len(paths) != 1:
            # One WAL id under two names: a copy, or one directory reached twice (a
            # symlinked namespace). A record taken through one name would outlive the
            # open under the other, and a reopen there would trust a slot the first open
            # left unsynced (atk74 F1): neither is recorded; each syncs its own.
            continue
        for directory in paths:
            try:
                listing = directories.listings[directory]
                names = sorted(n for n in listing if parse_segment_name(n) is not None)[-_SETTLED_PER_WAL:]
                files = [os.path.join(directory, name) for name in names]
                sizes = {os.path.normpath(path): fs.file_size(path) for path in files}
            except FileNotFoundError:
                continue
            if CHECKPOINT_NAME in listing:
                files.append(os.path.join(directory, CHECKPOINT_NAME))
            # Each file on the root's own file system (a volume mounted under the root, or
            # a symlinked file, is out of reach of its syncfs): its WAL then syncs its own.
            if fs.syncfs_covers(root, [directory, *files]):
                settled[os.path.normpath(directory)] = sizes
    if not settled:
        return settled
    try:
        handle = fs.open_syncfs(root)
        try:
            handle.sync()
        finally:
            handle.close()
    except OSError as exc:
        _log.warning("journal of %s: syncfs after replay failed, each WAL syncs its own segments at its "
                     "open: %r", root, exc)
        return {}
    return settled


def _checkpoint_state(snapshot: _Snapshot) -> dict[str, int]:
    return {"file": snapshot.file, "position": snapshot.position, "round": snapshot.round}


def _lock_journal(fs: FileSystem, root: str, directory: str) -> DirLock:
    fs.makedirs(directory)
    fs.fsync_dir(root)
    try:
        return fs.lock(os.path.join(directory, LOCK_NAME))
    except LockHeld as e:
        raise WalLocked(directory, "the root's shared journal is open in a running commit group") from e


def journal_exists(fs: FileSystem, root: str) -> bool:
    return fs.exists(os.path.join(root, JOURNAL_DIR))


#: One standalone replay at a time per root in this process. Without it, two threads opening
#: different topics of one root at once (a host's load workers) would each try the journal's
#: lock, and the second would take the first's replay for a running group (WalLocked).
_standalone_replays: dict[str, threading.RLock] = {}
_standalone_replays_lock = threading.Lock()


#: Per file layer and root: the journal checkpoint's bytes as this process's last standalone
#: replay left them (nothing after it to replay). See ``_replay_standalone_locked``.
_replayed_at: dict[tuple[object, str], tuple["weakref.ref[FileSystem] | None", bytes]] = {}


def standalone_turn(fs: FileSystem, root: str) -> "threading.RLock":
    """The lock that serialises this process's standalone replays of ``root``'s journal
    (reentrant): an opener holds it from before it locks its WAL directory until its
    replay is done, so a replay never finds the directory of an opener waiting its turn
    locked. One lock per root however it is spelled (symlinks, relative paths)."""
    with _standalone_replays_lock:
        return _standalone_replays.setdefault(directory_key(fs, root), threading.RLock())


def replay_standalone(fs: FileSystem, root: str, held: str | None = None) -> ReplayReport:
    """Replay a root's journal for a WAL opened without its group (a standalone
    ``WriteAheadLog.open`` under a journaled root): under the journal's lock, so never
    while a group uses it (WalLocked). Other replays of this process wait for each other.
    ``held``: a WAL directory whose lock the caller holds (the WAL being opened): replay
    writes into it without taking that lock, as it does for every other WAL."""
    directory = os.path.join(root, JOURNAL_DIR)
    with standalone_turn(fs, root):
        return _replay_standalone_locked(fs, root, directory, held)


def _replay_standalone_locked(fs: FileSystem, root: str, directory: str, held: str | None) -> ReplayReport:
    """Under the journal's lock: replay, unless this process's last replay of this root
    left the journal's checkpoint exactly as it is now. Then nothing follows it: rounds
    are added only by a journaled group, and a group's start first writes a checkpoint
    naming a file past every existing one, so the checkpoint's bytes change before any
    round is written. This spares every open after the first (a syncfs group's members, a
    broker without a commit group) reading the journal's files again."""
    lock = _lock_journal(fs, root, directory)
    try:
        key = ("real" if isinstance(fs, RealFs) else id(fs), directory_key(fs, root))
        alive = None if isinstance(fs, RealFs) else weakref.ref(fs)
        seen = _replayed_at.get(key)
        now = _checkpoint_bytes(fs, directory)
        if seen is not None and now is not None and seen[1] == now and (seen[0] is None or seen[0]() is fs):
            return ReplayReport()
        report = replay(fs, root, held)
        if report.rounds:
            # Nothing before the end needs the journal any more.
            write_checkpoint(fs, directory, {"file": report.end_file, "position": report.end_position,
                                             "round": report.next_round}, name=_CHECKPOINT)
            now = _checkpoint_bytes(fs, directory)
        if now is not None:
            _replayed_at[key] = (alive, now)
        return report
    finally:
        lock.release()


def _checkpoint_bytes(fs: FileSystem, directory: str) -> bytes | None:
    path = os.path.join(directory, _CHECKPOINT)
    return fs.read_all(path) if fs.exists(path) else None


def pending_segment_bytes(fs: FileSystem, root: str, directory: str) -> dict[str, tuple[int, bytes, int | None]]:
    """Read-only: what a replay of ``root``'s journal would write into the WAL at
    ``directory`` (``{segment path: (truncate to, bytes appended there, the offset after
    them or None)}``; empty without a journal or without rounds of that WAL). What follows
    those bytes in the file is cut but for ``kept_past_journal`` of that offset (None: all
    of it; the segment's marker key is in its header). For checkers that must not open a
    WAL (``dnb verify``): a journaled WAL's segments hold the truth only once this is laid
    over them. Raises CorruptLog where
    replay would."""
    journal_dir = os.path.join(root, JOURNAL_DIR)
    if not fs.exists(journal_dir):
        return {}
    wal_id = read_wal_id(fs, directory)
    if wal_id is None:
        return {}
    files = sorted(s for s in map(parse_journal_file_name, fs.listdir(journal_dir)) if s is not None)
    keys = _MarkerKeys(fs, root)
    rounds, _end, _start = _scan(fs, journal_dir, files, keys)
    entries = [entry for round_ in rounds for entry in round_.entries if entry[0].wal_id == wal_id]
    if not entries:
        return {}
    _check_chain(directory, entries)
    plans, _skipped = _plan_segments(fs, directory, entries, keys)
    return {plan.path: (plan.truncate_to, b"".join(plan.parts), plan.next_offset) for plan in plans}


# ---------------------------------------------------------------------- replay
@dataclass
class _Round:
    file: int
    position: int
    sequence: int
    entries: list[tuple[EntryHeader, bytes, memoryview]]


def replay(fs: FileSystem, root: str, held: str | None = None) -> ReplayReport:
    """Write every valid round after the checkpoint into its WAL's segments (format spec:
    ``native/journal_format.py``, "Checkpoint and replay"). Reads everything and checks
    every WAL's entries before writing anything: CorruptLog leaves all files as they were.
    Each WAL is written under its directory's lock (WalLocked if it is open), except
    ``held``, a directory whose lock the caller holds."""
    started = time.perf_counter()
    directory = os.path.join(root, JOURNAL_DIR)
    report = ReplayReport()
    if not fs.exists(directory):
        return report
    files = sorted(s for s in map(parse_journal_file_name, fs.listdir(directory)) if s is not None)
    keys = _MarkerKeys(fs, root)
    rounds, end, report.start_file = _scan(fs, directory, files, keys)
    report.end_file, report.end_position, report.next_round = end
    report.rounds = len(rounds)
    if rounds:
        _apply(fs, root, rounds, report, None if held is None else directory_key(fs, held), keys)
    report.seconds = time.perf_counter() - started
    if rounds:
        _log.info("journal %s: replayed %d rounds (%d entries, %d bytes) into %d WALs in %.3f s; "
                  "%d entries of deleted WALs or retired segments skipped", directory, report.rounds,
                  report.entries, report.bytes, report.wals, report.seconds, report.skipped_entries)
    return report


def _scan(fs: FileSystem, directory: str, files: list[int],
          keys: "_MarkerKeys") -> tuple[list[_Round], tuple[int, int, int], int]:
    """The valid rounds after the checkpoint, where they end (file, position, next round),
    and the file replay started from. CorruptLog where the format's rules say the journal
    is damaged (native/journal_format.py, "Checkpoint and replay"). ``keys``: the marker
    keys of the root's segments (their headers are read once per replay)."""
    checkpoint_path = os.path.join(directory, _CHECKPOINT)
    checkpoint = read_checkpoint(fs, directory, name=_CHECKPOINT)
    datas: dict[int, bytes] = {}
    nonces: dict[int, int | None] = {}

    def load(sequence: int) -> None:
        data = fs.read_all(os.path.join(directory, journal_file_name(sequence)))
        datas[sequence] = data
        header = decode_file_header(data)
        nonces[sequence] = header.nonce if header is not None and header.sequence == sequence else None

    if checkpoint is None:
        if fs.exists(checkpoint_path):
            raise CorruptLog(checkpoint_path, 0, "the journal checkpoint is unreadable, so replay cannot know where "
                             "the journal's rounds start (nothing was written). Restore it, or move the .journal "
                             "directory aside to open the WALs as their segments are (rounds only the journal "
                             "holds are then lost)")
        # The journal was being created when the process stopped: fine while no file holds
        # a round of its own (the checkpoint is written before the first round).
        for sequence in files:
            load(sequence)
            nonce = nonces[sequence]
            if nonce is not None and next(find_round_headers(datas[sequence], FILE_HEADER_BYTES, nonce), None) \
                    is not None:
                raise CorruptLog(checkpoint_path, 0, "the journal checkpoint is missing, but journal file "
                                 f"{sequence} holds rounds: replay cannot know where they start")
        last = files[-1] if files else 0
        return [], (last, FILE_HEADER_BYTES, 0), last
    try:
        start_file = int(checkpoint["file"])
        start_position = int(checkpoint["position"])
        expected = int(checkpoint["round"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptLog(checkpoint_path, 0, f"the journal checkpoint does not hold a position: {exc}") from exc
    later = [s for s in files if s >= start_file]
    if start_file not in files:
        raise CorruptLog(os.path.join(directory, journal_file_name(start_file)), 0,
                         "the journal checkpoint names this file, which is missing (a checkpoint only ever names "
                         "a file already durable)")
    for sequence in later:
        load(sequence)
        if nonces[sequence] is None:
            raise CorruptLog(os.path.join(directory, journal_file_name(sequence)), 0,
                             "the journal file's header is invalid or names another file, at or after the "
                             "checkpoint (files are named only once their header is durable)")
    if start_position < FILE_HEADER_BYTES:
        raise CorruptLog(checkpoint_path, 0, f"the journal checkpoint's position {start_position} is inside a header")
    rounds: list[_Round] = []
    at_file, at = start_file, start_position
    index = 0
    while True:
        nonce = nonces[at_file]
        assert nonce is not None
        parsed = _parse_round(datas[at_file], at, nonce, expected, keys)
        if parsed is not None:
            rounds.append(_Round(at_file, at, parsed[0], parsed[1]))
            expected = parsed[0] + 1
            at += parsed[2]
            continue
        # No valid round here: the next file continues the sequence, or the log ends here.
        if index + 1 < len(later) and later[index + 1] == at_file + 1:
            following = later[index + 1]
            nonce_next = nonces[following]
            assert nonce_next is not None
            if _parse_round(datas[following], FILE_HEADER_BYTES, nonce_next, expected, keys) is not None:
                at_file, at, index = following, FILE_HEADER_BYTES, index + 1
                continue
        break
    _check_nothing_later(directory, later, index, at, datas, nonces, expected)
    return rounds, (at_file, at, expected), start_file


def _check_nothing_later(directory: str, files: list[int], index: int, position: int, datas: dict[int, bytes],
                         nonces: dict[int, int | None], expected: int) -> None:
    """Where the log ends, no header of a round AFTER the expected one may follow: round
    k + 1 is written only once round k was synced, so one would prove that what stopped the
    scan had been synced (corruption, not a torn tail). The expected round's own header may
    well be intact while its body is torn, at the stop or at the start of the next file
    (the writer switched files for it)."""
    for i in range(index, len(files)):
        sequence = files[i]
        nonce = nonces[sequence]
        assert nonce is not None
        data = datas[sequence]
        start = position if i == index else FILE_HEADER_BYTES
        for candidate in find_round_headers(data, start, nonce):
            found = decode_round_header(data, candidate)
            if found is not None and found.nonce == nonce and found.round > expected:
                raise CorruptLog(os.path.join(directory, journal_file_name(sequence)), candidate,
                                 f"journal round {found.round} follows where the valid rounds end (round "
                                 f"{expected} expected at byte {position} of file {files[index]}), so the "
                                 f"damaged data before it had been synced")


def _parse_round(data: bytes, position: int, nonce: int, expected: int,
                 keys: "_MarkerKeys") -> tuple[int, list[tuple[EntryHeader, bytes, memoryview]], int] | None:
    """(sequence, entries as (header, path, bytes), length) of the valid round at
    ``position``, else None. ``keys``: the marker key of each entry's segment."""
    header = decode_round_header(data, position)
    if header is None or header.nonce != nonce or header.round != expected:
        return None
    if header.entry_count < 1 or header.length < ROUND_HEADER_BYTES or position + header.length > len(data):
        return None
    view = memoryview(data)
    at = position + ROUND_HEADER_BYTES
    end = position + header.length
    entries = []
    headers = []
    for _ in range(header.entry_count):
        if at + ENTRY_HEADER_BYTES > end:
            return None
        entry = decode_entry_header(view, at)
        if not 1 <= entry.path_length <= ENTRY_PATH_BYTES_MAX or entry.reserved != bytes(6):
            return None
        path_end = at + ENTRY_HEADER_BYTES + entry.path_length
        if entry.length < ROUND_MARKER_BYTES or path_end + entry.length > end or entry.record_count < 1:
            return None
        headers.append(view[at:path_end])
        entries.append((entry, bytes(view[at + ENTRY_HEADER_BYTES:path_end]), view[path_end:path_end + entry.length]))
        at = path_end + entry.length
    if at != end:
        return None
    if crc32c(b"".join(headers)) != header.entries_crc:
        return None
    for entry, _path, payload in entries:
        key = keys.of(entry.wal_id, entry.segment_base)
        if key is KEY_UNKNOWN:
            # The segment is gone, or is no longer this WAL's (deleted, retention): replay
            # skips this entry, and only the segment's header held what the marker's CRC
            # covers. Its tag and offset are checked, then its frames.
            _crc, tag, first = ROUND_MARKER.unpack_from(payload, 0)
            if tag != ROUND_MARKER_TAG or first != entry.first_offset:
                return None
            scan = scan_frames(payload, ROUND_MARKER_BYTES, None, entry.first_offset, False)
        else:
            assert key is None or isinstance(key, int)
            scan = scan_frames(payload, expected_offset=entry.first_offset, decode=False, rounds=True, marker_key=key)
        if (scan.error is not None or scan.count != entry.record_count or scan.end != entry.length
                or scan.first_offset != entry.first_offset):
            return None
    return header.round, entries, header.length


#: ``_MarkerKeys.of`` (and ``replay_marker_key``) when no segment of that WAL can say what
#: its round markers are keyed with: their CRC then goes unchecked (their tag and offset
#: are checked, and every frame whole).
KEY_UNKNOWN = object()


class _MarkerKeys:
    """The marker key of each segment the journal's entries name, read from the segment's
    header once (native/format.py, "Commit rounds"): the journal's copy of a round holds its
    marker as the segment does, keyed with the segment's key (None: a version 2 segment,
    whose markers have none). ``KEY_UNKNOWN`` where the WAL or the segment is gone or its
    header unreadable: replay skips such entries (``_owner``, ``_plan_segments``) or the
    WAL's own open refuses its header."""

    def __init__(self, fs: FileSystem, root: str) -> None:
        self._fs = fs
        self._root = root
        self._directories: _Directories | None = None
        self._keys: dict[str, object] = {}  # by segment path

    @property
    def directories(self) -> "_Directories":
        """The root's WAL directories, listed once per replay."""
        if self._directories is None:
            self._directories = _wal_directories(self._fs, self._root)
        return self._directories

    def of(self, wal_id: bytes, segment_base: int) -> object:
        """The key of segment ``segment_base`` of the WAL whose id is ``wal_id``."""
        paths = self.directories.by_id.get(wal_id, [])
        if len(paths) != 1:
            return KEY_UNKNOWN
        return self.at(os.path.join(paths[0], segment_file_name(segment_base)), segment_base)

    def at(self, path: str, segment_base: int) -> object:
        """The key of the segment at ``path``."""
        key = self._keys.get(path, self)
        if key is self:
            key = self._keys[path] = _read_marker_key(self._fs, path, segment_base)
        return key


def _read_marker_key(fs: FileSystem, path: str, base_offset: int) -> object:
    """The marker key in the header of the segment at ``path`` (None: version 2), or
    ``KEY_UNKNOWN`` when it is missing, its header invalid, or it cannot be read (any
    ``OSError``: a bad sector is that one WAL's problem, which its own open reports; it
    must not fail the replay of every other WAL of the root, atk92 F1)."""
    try:
        handle = fs.open_read(path)
        try:
            header = handle.pread(0, SEGMENT_HEADER_BYTES)
        finally:
            handle.close()
    except OSError:
        return KEY_UNKNOWN
    return replay_marker_key(header, base_offset)


def replay_marker_key(header: bytes, base_offset: int | None = None) -> object:
    """What replay takes as the marker key of a segment whose first bytes are ``header``
    (``kept_past_journal``'s ``marker_key``): its key, None for format 2, or an unknown
    key (its markers' CRC then unchecked) when the header is invalid or names another
    base offset. ``dnb verify`` judges a segment as replay would with it."""
    try:
        base, _created_ms = decode_segment_header(header)
    except CorruptSegmentHeader:
        return KEY_UNKNOWN
    if base_offset is not None and base != base_offset:
        return KEY_UNKNOWN
    return segment_marker_key(header)


@dataclass
class _Directories:
    """The WAL directories of a root, by id."""

    by_id: dict[bytes, list[str]] = field(default_factory=dict)  # id -> directories (two: a copy)
    #: Directories (relative to the root) holding segments but no readable ``.walid``.
    unidentified: dict[str, str] = field(default_factory=dict)
    #: What each directory of ``by_id`` held when it was listed.
    listings: dict[str, list[str]] = field(default_factory=dict)


def _wal_directories(fs: FileSystem, root: str) -> _Directories:
    found = _Directories()
    for namespace in fs.listdir(root):
        if namespace.startswith("."):
            continue
        ns_path = os.path.join(root, namespace)
        try:
            names = fs.listdir(ns_path)
        except (NotADirectoryError, FileNotFoundError):
            continue
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(ns_path, name)
            try:
                listing = fs.listdir(path)
            except (NotADirectoryError, FileNotFoundError):
                continue
            wal_id = read_wal_id(fs, path) if WAL_ID_NAME in listing else None
            if wal_id is not None:
                found.by_id.setdefault(wal_id, []).append(path)
                found.listings[path] = listing
            elif any(parse_segment_name(n) is not None for n in listing):
                why = "damaged" if WAL_ID_NAME in listing else "missing"
                found.unidentified[f"{namespace}/{name}"] = why
    return found


@dataclass
class _SegmentPlan:
    path: str
    truncate_to: int
    parts: list[Chunk]
    #: The offset after the journal's last round in this segment; None for a segment the
    #: WAL's journaled rounds continue past (a rotation): nothing may follow them there.
    next_offset: int | None = None
    #: The segment's marker key (None: version 2; ``KEY_UNKNOWN``: its header could not be
    #: read or is invalid, which the WAL's own open reports; rounds continuing the journal's
    #: are then judged without their markers' CRC, ``continuing_rounds``).
    marker_key: object = None


def continuing_rounds(tail: bytes | memoryview, next_offset: int, marker_key: object) -> int:
    """How many bytes of ``tail`` (a segment's bytes just past the journal's last round of
    its WAL) to keep: the commit rounds that continue the WAL at ``next_offset``, up to the
    end of their last valid frame (0 when the tail does not start with such a round).

    A running group writes a WAL's round k+1 to its segment only after round k's journal
    fdatasync returned, so past the journal's valid rounds a segment holds either rounds the
    journal should also hold (its copy was damaged at rest, or the WAL was appended outside
    this journal after its close synced it) or the one round of the crash, never
    acknowledged, whole or torn. Whole valid frames are kept either way (as a WAL's own
    recovery keeps a whole unacknowledged round); cutting them would destroy acknowledged
    messages whose only intact copy is the segment's. The first invalid byte ends what is
    kept, so a torn round (a power loss keeps any part of an unsynced write) is cut from
    there, whatever follows it, and a marker with no frame after it is cut too.
    ``marker_key``: the segment's (native/format.py, "Commit rounds"; None: version 2;
    ``KEY_UNKNOWN``: its header could not be read, so its markers' tag and offset are
    checked and not their CRC; every frame is checked whole either way)."""
    if len(tail) < ROUND_MARKER_BYTES:
        return 0
    if marker_key is KEY_UNKNOWN:
        return _continuing_rounds_without_key(tail, next_offset)
    assert marker_key is None or isinstance(marker_key, int)
    scan = scan_frames(tail, 0, None, next_offset, False, True, None, True, marker_key)
    if not scan.markers or scan.markers[0] != 0 or not scan.count:
        return 0  # every round starts with its marker; a tail that does not is no round of this WAL
    last_frame = scan.positions[-1]
    if scan.markers[-1] > last_frame:
        return scan.markers[-1]  # a dangling marker: keep the frames before it
    return scan.end


def _continuing_rounds_without_key(tail: bytes | memoryview, next_offset: int) -> int:
    """``continuing_rounds`` where the segment's marker key is unknown: each round must
    start with a marker of the right tag and first offset (its CRC is not checked) and hold
    at least one frame; whole valid frames are kept up to the first invalid byte."""
    view = memoryview(tail)
    position, expected, kept = 0, next_offset, 0
    while len(view) - position >= ROUND_MARKER_BYTES:
        _crc, tag, first = ROUND_MARKER.unpack_from(view, position)
        if tag != ROUND_MARKER_TAG or first != expected:
            break
        scan = scan_frames(view, position + ROUND_MARKER_BYTES, None, expected, False)
        if not scan.count:
            break  # a dangling marker: keep the frames before it
        kept, expected, position = scan.end, scan.last_offset + 1, scan.end
        if scan.error is None:
            break
    return kept


_Entry = tuple[EntryHeader, bytes, memoryview]  # header, the WAL's path, its bytes


def _owner(root: str, directories: _Directories, wal_id: bytes, entries: list[_Entry]) -> str | None:
    """The directory the entries of ``wal_id`` belong to, or None when that WAL is no longer
    in the root (deleted, moved out after its close, or deleted and created again)."""
    paths = directories.by_id.get(wal_id, [])
    if len(paths) > 1:
        raise CorruptLog(paths[1], 0, f"the journal holds rounds of WAL id {wal_id.hex()}, which both "
                         f"{paths[0]} and {paths[1]} have (a copied directory?): replay cannot choose")
    if paths:
        return paths[0]
    recorded = entries[0][1].decode("utf-8", "replace")
    why = directories.unidentified.get(recorded)
    if why is not None:
        raise CorruptLog(os.path.join(root, recorded, WAL_ID_NAME), 0,
                         f"the journal holds acknowledged rounds of the WAL that was at {recorded}, whose "
                         f".walid is now {why}: nothing can tell whether they are this directory's (nothing "
                         f"was written)")
    return None


def _apply(fs: FileSystem, root: str, rounds: list[_Round], report: ReplayReport, held: str | None,
           keys: "_MarkerKeys") -> None:
    ordered: dict[bytes, list[_Entry]] = {}
    for round_ in rounds:
        for entry in round_.entries:
            ordered.setdefault(entry[0].wal_id, []).append(entry)
    directories = keys.directories
    plans: dict[str, list[_SegmentPlan]] = {}
    for wal_id, entries in ordered.items():
        report.entries += len(entries)
        path = _owner(root, directories, wal_id, entries)
        if path is None:
            report.skipped_entries += len(entries)
            continue
        _check_chain(path, entries)
        segment_plans, skipped = _plan_segments(fs, path, entries, keys)
        report.skipped_entries += skipped
        if segment_plans:
            plans[path] = segment_plans
    # Everything checked: now write. A crash from here on replays the same rounds again.
    for path, segment_plans in plans.items():
        lock = _NOT_LOCKED if held is not None and directory_key(fs, path) == held else _lock_wal(fs, path)
        try:
            for plan in segment_plans:
                # The journal's bytes over what is there, then cut whatever followed them but
                # the rounds that continue them (``continuing_rounds``): truncate fsyncs the
                # file, one sync for both (a crash in between replays again).
                size = sum(map(len, plan.parts))
                end = plan.truncate_to + size
                kept = _continuing_bytes(fs, plan, end)
                handle = fs.open_rw(plan.path)
                try:
                    handle.pwrite(plan.parts, plan.truncate_to)
                finally:
                    handle.close()
                if kept:
                    _log.warning("journal of %s: kept %d bytes of %s past the journal's last round of that WAL: "
                                 "whole rounds continuing it (the journal's copy was damaged, or the WAL was "
                                 "appended outside this journal after its close)", root, kept, plan.path)
                fs.truncate(plan.path, end + kept)
                report.bytes += size
        finally:
            lock.release()
        report.wals += 1


def _continuing_bytes(fs: FileSystem, plan: _SegmentPlan, end: int) -> int:
    """How much of the segment past byte ``end`` (the journal's last round of its WAL) the
    replay keeps: ``kept_past_journal`` of its bytes from the plan's first entry on."""
    if plan.next_offset is None:
        return 0
    size = fs.file_size(plan.path)
    if size <= end:
        return 0
    handle = fs.open_read(plan.path)
    try:
        own = handle.pread(plan.truncate_to, size - plan.truncate_to)
    finally:
        handle.close()
    return kept_past_journal(own, b"".join(plan.parts), plan.next_offset, plan.marker_key)


def kept_past_journal(own: bytes, journaled: bytes, next_offset: int, marker_key: object) -> int:
    """The bytes a replay keeps past the journal's rounds in a WAL's last journaled segment:
    ``own`` is the segment from the journal's first round of it on, ``journaled`` the
    journal's copy of those rounds. Only where the segment already holds exactly that copy
    (a process crash, or a WAL appended elsewhere after its close synced it) are the rounds
    continuing it its own (``continuing_rounds``); where it differs (a power loss dropped
    unsynced pages, or a copy of the directory went another way), what follows is of no
    known history and is cut, as any unsynced tail."""
    view = memoryview(own)  # compared and scanned in place: no copy of a segment's tail
    if view[:len(journaled)] != journaled:
        return 0
    return continuing_rounds(view[len(journaled):], next_offset, marker_key)


def _check_chain(path: str, entries: list[_Entry]) -> None:
    for (previous, _pp, _p), (entry, _ep, _e) in zip(entries, entries[1:]):
        last = previous.first_offset + previous.record_count - 1
        if entry.first_offset != last + 1:
            raise CorruptLog(path, 0, f"journal entries of this WAL skip from offset {last} to {entry.first_offset}")
        if entry.segment_base == previous.segment_base:
            if entry.position != previous.position + previous.length:
                raise CorruptLog(path, 0, f"journal entries of segment {entry.segment_base} are not contiguous "
                                 f"(byte {previous.position + previous.length} then {entry.position})")
        elif entry.segment_base != last + 1 or entry.position != SEGMENT_HEADER_BYTES:
            raise CorruptLog(path, 0, f"journal entry starts segment {entry.segment_base} at byte {entry.position} "
                             f"after offset {last}")


def _plan_segments(fs: FileSystem, path: str, entries: list[_Entry],
                   keys: "_MarkerKeys") -> tuple[list[_SegmentPlan], int]:
    """What to write where for one WAL; the number of entries skipped (segments that
    retention or a delete removed, all below the WAL's first segment)."""
    bases = sorted(b for b in (parse_segment_name(n) for n in fs.listdir(path)) if b is not None)
    plans: list[_SegmentPlan] = []
    skipped = 0
    for entry, _wal_path, payload in entries:
        segment = os.path.join(path, segment_file_name(entry.segment_base))
        if plans and plans[-1].path == segment:
            plans[-1].parts.append(payload)
            continue
        if entry.segment_base not in bases:
            if not bases or entry.segment_base < bases[0]:
                skipped += 1
                continue
            raise CorruptLog(segment, 0, "the journal holds rounds of this segment, but the file is missing")
        size = fs.file_size(segment)
        if size < entry.position:
            raise CorruptLog(segment, size, f"the segment ends before byte {entry.position}, where its first round "
                             f"after the journal checkpoint starts: synced bytes are missing")
        plans.append(_SegmentPlan(segment, entry.position, [payload], marker_key=keys.at(segment, entry.segment_base)))
    if plans:
        last = entries[-1][0]
        plans[-1].next_offset = last.first_offset + last.record_count
    return plans, skipped


class _NotLocked:
    """The lock of a WAL directory the replay's caller holds already."""

    def release(self) -> None:
        pass


_NOT_LOCKED = _NotLocked()


def _lock_wal(fs: FileSystem, path: str) -> DirLock:
    try:
        return fs.lock(os.path.join(path, LOCK_NAME))
    except LockHeld as e:
        raise WalLocked(path, "open while the root's journal is replayed") from e
