"""The per-topic group-commit writer thread, and the segment appender it shares with the
commit group (``wal.group``): the only code that writes segment data.

The writer knows nothing of ``WriteAheadLog``: the log hands it a :class:`CommitHooks`
(the four calls the loop makes back into the log's state) when it creates it, the same
way it hands the append core its callbacks.

Loop: take everything appended since the last round, at once (parking only when nothing
is pending; appends made while a round's fsync is in flight form the next round), rotate
the segment if it is full or old, write the round (its round marker, then the batch's
frames) with one writev, fdatasync, then publish the new durable watermark. Any I/O error
fails the WAL for good: after a failed fsync the kernel may have dropped the dirty pages,
so retrying could report data durable that is gone.
"""
from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple

from native import encode_round_marker
from native.format import ROUND_MARKER_BYTES, SEGMENT_VERSION
from wal.config import WalConfig
from wal.errors import WalFailed
from wal.fs import AppendFile, FileSystem
from wal.budget import mark_writer_thread
from wal.journal import SegmentFile
from wal.segment import Segment, create_segment

_log = logging.getLogger(__name__)

#: A segment is cut by age up to this fraction of ``segment_age_max_s`` early, by an amount
#: fixed per segment (from its path). Topics opened together (a broker's start, a bulk
#: load) would otherwise all reach the age limit in the same commit round, and that round
#: would cut every one of their segments (three syncs each: the new file, its directory,
#: the WAL's checkpoint): at 1,000 topics, commit rounds of 200-350 ms, once per age
#: limit. Spread over a tenth of it, a cut costs one topic's round a millisecond or so.
#: Kafka's ``segment.jitter.ms`` does the same.
AGE_JITTER = 0.1
#: ... and by size up to this fraction of ``segment_bytes_max`` early, the same way: topics
#: fed alike (the partitions of one stream, round-robin) fill their segments in the same
#: rounds, and a pass that cut 200 of them took 110-160 ms against 2 ms (p50) on the
#: project's machine.
SIZE_JITTER = 0.1


class Batch(NamedTuple):
    chunks: list[bytes]  # whole encoded frames, in offset order, as the append core's take() gave them
    first_offset: int
    last_offset: int
    nbytes: int
    tail_position: int  # from this byte of the joined chunks on: the newest frames that fit the cache
    tail_count: int  # how many frames that is (0: not even the last one fits)


class CommitHooks(NamedTuple):
    """The log's side of the writer loop; every call is made on the writer thread."""

    #: The next batch to commit (blocks while nothing is pending), or None to stop.
    take_batch: Callable[[], Batch | None]
    #: After the batch's write + fsync: ``(batch, active segment, byte position of the
    #: batch's first frame, segment size now, fsync seconds)``; publishes the durable
    #: watermark. Only after this call may anyone see the batch's offsets as durable.
    on_durable: Callable[[Batch, Segment, int, int, float], None]
    #: After a new segment file was created: ``(old, new)``; the old one is sealed.
    on_rotate: Callable[[Segment, Segment], None]
    #: Any exception of the loop: the log fails closed for good.
    fail: Callable[[BaseException], None]


class Written(NamedTuple):
    """One topic's round, written (not yet synced): what ``on_durable`` publishes after the sync."""

    batch: Batch
    segment: Segment  # the segment the round went to
    position: int  # byte position of the round's first frame in it
    size_bytes: int  # the segment's size after the round
    parts: list[bytes]  # what was written, in order: the round marker, then the batch's chunks
    file: AppendFile  # the file it was written to (journaled: the SegmentFile a checkpoint syncs)


class SegmentAppender:
    """Writes one topic's commit rounds to its active segment, cutting a new segment between
    rounds when the active one is full or old. It never syncs a round: its caller does
    (``GroupCommitWriter`` with one fdatasync of this file, ``wal.group.CommitGroup`` with
    one syncfs for the rounds of every topic), and only one caller thread uses it at a time.
    """

    def __init__(self, hooks: CommitHooks, fs: FileSystem, directory: str, config: WalConfig,
                 active: Segment) -> None:
        self._hooks = hooks
        self._fs = fs
        self._directory = directory
        self._config = config
        self._age_max_ms = config.segment_age_max_s * 1000
        self._bytes_max = config.segment_bytes_max
        self._set_active(active)
        # Recovery truncated any torn tail, so the file ends exactly at the last valid frame.
        actual = fs.file_size(active.path)
        assert actual == active.size_bytes, f"{active.path}: {actual} bytes on disk, {active.size_bytes} known"
        self._file: AppendFile
        self._set_file(fs.open_append(active.path))
        self._file_bytes = active.size_bytes
        # Journaled (set by ``journaled``): files are SegmentFiles, synced lazily by the
        # journal's checkpoints; a rotated-away file goes to ``_retire`` instead of closing.
        self._retire: Callable[[SegmentFile], None] | None = None
        self._retired: list[SegmentFile] = []  # journaled: files rotation left, synced at close
        # Guards _file and _retired against an abandon from another thread (a group
        # failing on its journal checkpointer's thread) while a rotation swaps them.
        self._lock = threading.Lock()
        self._abandoned = False  # set by abandon(): a rotation must not open a file after it

    def journaled(self, retire: Callable[[SegmentFile], None]) -> None:
        """Switch to the journaled mode of a ``wal.group.CommitGroup`` with a journal (before
        the first round): rounds are made durable by the journal, this file by the journal's
        checkpoints (``retire`` takes the files rotation leaves behind) and by ``close``."""
        with self._lock:
            if not isinstance(self._file, SegmentFile):
                self._set_file(SegmentFile(self._file, self._active.path))
            self._retire = retire

    def write_round(self, batch: Batch) -> Written:
        """Writes ``batch`` as one round (its marker, then its frames) with one writev."""
        parts = self.begin_round(batch)
        self.write_parts(parts)
        return self.end_round(batch, parts)

    def begin_round(self, batch: Batch, now_ms: int | None = None) -> list[bytes]:
        """What ``write_round`` writes, laid out but not written: a new segment is cut
        first if the active one is full or old (``now_ms``: the wall clock in ms, read once
        per round by a commit group; read here when None). Write the parts to the active
        file (by the descriptor ``lay_out`` holds, or ``write_parts``), then ``end_round``; nothing else in
        between."""
        active = self._active
        # Rotate when the active segment is full, or old (against the wall clock, as its
        # created_ms, its name's time, is), or of an older format (from before an upgrade:
        # no commit rounds, or round markers without a key); never leave an empty sealed
        # segment behind.
        # Inline, with what it needs of the segment kept by _set_active: this runs for
        # every topic of every commit round.
        if active.last_offset >= active.base_offset and (
                not self._takes_rounds or self._file_bytes >= self._rotate_at_bytes
                or (time.time_ns() // 1_000_000 if now_ms is None else now_ms) >= self._rotate_at_ms):
            self._rotate(batch.first_offset)
            active = self._active
        assert batch.first_offset == active.last_offset + 1, "batch must continue the segment"
        assert self._takes_rounds, "the writer appends only to segments of the current format"
        # Every round starts with its marker: recovery takes a later round's marker as proof
        # that this round was synced (native/format.py, "Commit rounds").
        return [encode_round_marker(batch.first_offset, self._marker_key), *batch.chunks]

    def lay_out(self, batch: Batch, now_ms: int) -> tuple[list[bytes], int]:
        """A commit group's ``begin_round`` and the active file's descriptor in one call:
        (the parts, the descriptor held open until ``let_go``, or -1 if the file layer has
        none: then ``write_parts``, and no ``let_go``). See ``_set_file``."""
        parts = self.begin_round(batch, now_ms)
        return parts, self._hold()

    def end_round(self, batch: Batch, parts: list[bytes]) -> Written:
        """After ``begin_round``'s parts were written whole to the active file."""
        position = self._file_bytes + ROUND_MARKER_BYTES  # where the round's first frame landed
        self._file_bytes += ROUND_MARKER_BYTES + batch.nbytes
        return tuple.__new__(Written, (batch, self._active, position, self._file_bytes, parts, self._file))

    def write_parts(self, parts: list[bytes]) -> None:
        """Write ``begin_round``'s parts through the active file (no descriptor to hold)."""
        self._file.write(parts)

    def cut_back(self) -> None:
        """After a round's write failed part-way: truncate the active segment back to where
        that round began (and sync that), so none of it survives this WAL.

        Precondition, so this deletes nothing acknowledged: ``_file_bytes`` is moved only by
        ``end_round``, after a whole write, and a round is acknowledged only after that
        (and, journaled, after it was journaled); the bytes past it are the failed round's
        alone (whole frames, or just its marker). Why: in a journaled group the WAL may be
        reopened in the same group before the journal's next checkpoint (a host abandoning
        and reloading a topic). Recovery would keep those frames, the WAL would go on after
        them, and its journal entries would skip their offsets: after a crash the whole
        root's replay would refuse (CorruptLog), every topic with it. Raises if the
        truncation fails; the caller then fails the group (nothing else can vouch)."""
        self._fs.truncate(self._active.path, self._file_bytes)

    def _set_file(self, file: AppendFile) -> None:
        """The active file, and its ``hold`` and ``let_go`` looked up once (a commit group
        calls them for every topic of every round). ``hold``: the file's descriptor, held
        open (a close waits) until ``let_go``, for a group writing many topics' rounds in
        one call (``native.write_rounds``); -1 if its file layer has no descriptors (then
        ``write_parts``, and no ``let_go``)."""
        self._file = file
        hold = getattr(file, "hold", None)
        self._hold: Callable[[], int] = _no_descriptor if hold is None else hold
        #: After ``hold`` gave a descriptor (never called otherwise): the file's own
        #: ``let_go``, looked up once, as ``hold``.
        self.let_go: Callable[[], None] = getattr(file, "let_go", _nothing_held)

    def sync(self) -> None:
        """fdatasync of the active segment (the per-topic writer's sync)."""
        self._file.sync()

    def close(self) -> None:
        """Close the active file. Journaled, every file this appender wrote that a
        checkpoint may not have synced yet (those rotation left behind, then the active
        one) is synced first (SegmentFile.close), so a closed WAL never needs the journal."""
        for retired in self._retired:
            retired.close()
        self._retired = []
        self._file.close()

    def abandon(self) -> None:
        """Close without syncing: the WAL failed, nothing more will be acknowledged. May
        run on another thread than the rounds' (a group failing on its journal
        checkpointer's thread): a rotation in flight then closes the file it opened
        instead of installing it (``_rotate``), so no descriptor outlives the WAL."""
        with self._lock:
            self._abandoned = True
            retired, file = self._retired, self._file
        for each in retired:
            each.abandon()
        if isinstance(file, SegmentFile):
            file.abandon()
        else:
            file.close()

    def _set_active(self, active: Segment) -> None:
        """The active segment, and what ``begin_round``'s rotation check needs of it."""
        self._active = active
        # Only the current format is appended to (keyed round markers): an older one is cut.
        self._takes_rounds = active.version >= SEGMENT_VERSION
        self._marker_key = active.marker_key
        self._rotate_at_ms = active.created_ms + self._age_max_ms - _age_jitter_ms(active.path, self._age_max_ms)
        self._rotate_at_bytes = self._bytes_max - int(_jitter(active.path) * SIZE_JITTER * self._bytes_max)

    def _rotate(self, base_offset: int) -> None:
        """Cut a new segment. Every byte of the old one was synced by the previous round
        (or, journaled, is in the journal; the old file is synced by the next checkpoint)."""
        assert base_offset == self._active.last_offset + 1
        new = create_segment(self._fs, self._directory, base_offset)
        opened = self._fs.open_append(new.path)
        with self._lock:
            if self._abandoned:
                opened.close()  # the WAL failed meanwhile: nothing more is written
                raise WalFailed(f"{self._directory}: abandoned while cutting segment {new.path}")
            old_file = self._file
            self._set_file(SegmentFile(opened, new.path) if self._retire is not None else opened)
            if self._retire is not None:
                assert isinstance(old_file, SegmentFile)
                # Recorded with the swap, so an abandon sees the old file in one place or
                # the other. Files a checkpoint already synced and closed are dropped: a
                # long-lived WAL does not keep one object per rotation it ever made.
                self._retired = [f for f in self._retired if not f.closed]
                self._retired.append(old_file)
        if self._retire is not None:
            assert isinstance(old_file, SegmentFile)
            self._retire(old_file)
        else:
            old_file.close()
        self._file_bytes = new.size_bytes
        old = self._active
        self._set_active(new)
        self._hooks.on_rotate(old, new)
        _log.debug("rotated %s -> %s", old.path, new.path)


def _age_jitter_ms(path: str, age_max_ms: float) -> float:
    """How much earlier than ``age_max_ms`` the segment at ``path`` is cut (``AGE_JITTER``)."""
    return _jitter(path) * AGE_JITTER * age_max_ms


def _jitter(path: str) -> float:
    """A number in [0, 1) fixed by the segment's path: the same for a segment whichever
    process opens it, different from one topic to the next."""
    return zlib.crc32(path.encode("utf-8", "surrogateescape")) / 2**32


def _no_descriptor() -> int:
    """``hold`` of a file layer without descriptors (the tests' FaultFs)."""
    return -1


def _nothing_held() -> None:
    """``let_go`` of a file layer without descriptors (never called: ``hold`` gave none)."""


class GroupCommitWriter:
    """The per-topic writer thread: one fdatasync stream per topic (a WAL opened without a
    ``wal.group.CommitGroup``)."""

    def __init__(self, hooks: CommitHooks, appender: SegmentAppender, directory: str) -> None:
        self._hooks = hooks
        self._appender = appender
        self._thread = threading.Thread(target=self._run, name=f"wal-writer:{directory}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def on_own_thread(self) -> bool:
        """Whether the caller is this writer's thread (a durable listener)."""
        return threading.get_ident() == self._thread.ident

    def _run(self) -> None:
        mark_writer_thread()  # its durable listeners never wait for a root's budgets (wal/budget.py)
        try:
            take_batch = self._hooks.take_batch
            while (batch := take_batch()) is not None:
                self._commit(batch)
        except BaseException as exc:  # noqa: BLE001 - any failure must fail the WAL closed
            self._hooks.fail(exc)
        finally:
            self._appender.close()

    def _commit(self, batch: Batch) -> None:
        written = self._appender.write_round(batch)
        started = time.perf_counter()
        self._appender.sync()
        seconds = time.perf_counter() - started
        self._hooks.on_durable(batch, written.segment, written.position, written.size_bytes, seconds)
        assert written.segment.last_offset == batch.last_offset
