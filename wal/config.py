"""Tuning knobs of one write-ahead log. Every buffer, queue and wait has a bound here."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from native.format import MAX_RECORD_BYTES


class GroupSync(str, Enum):
    """How a commit group makes a round durable (docs/WAL.md compares them)."""

    #: One fdatasync of the root's shared journal per round; segment files are synced
    #: lazily at journal checkpoints and replayed from the journal after a crash.
    JOURNAL = "journal"
    #: One syncfs(2) of the root's file system per round; no second copy of any byte.
    SYNCFS = "syncfs"


#: Bounds far past any real setting, shared by every configuration layer: a size goes to
#: native code as a Py_ssize_t and into sums of byte counts (8 PiB), a duration to thread
#: waits and clocks (threading.TIMEOUT_MAX, time_t), which a larger one would fail in the
#: thread that waits on it (about 31 years).
SIZE_MAX = 1 << 53
SECONDS_MAX = 1e9


#: Defaults of a commit group's budgets (WalConfig below; wal.group.CommitGroup's own).
CACHE_GROUP_BYTES_MAX = 1024 * 1024 * 1024
PENDING_GROUP_BYTES_MAX = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WalConfig:
    # Group commit without a timer: the writer takes whatever is pending as soon as the
    # previous round's fsync returned (a lone append is synced at once; under load the
    # appends made during one fsync form the next round), so there is no fsync interval
    # to configure (fsync_interval_ms, which held rounds back for a timer, is gone).
    # fsync_batch_bytes: pending bytes at which an append notifies a writer that is not
    # parked; a round's size is bounded by pending_bytes_max (backpressure).
    fsync_batch_bytes: int = 4 * 1024 * 1024
    # Segments are cut when they pass either limit (checked before each write, so a
    # segment may exceed segment_bytes_max by up to one write batch).
    segment_bytes_max: int = 128 * 1024 * 1024
    segment_age_max_s: float = 3600.0
    # Cache of recent durable frames that tail readers are served from before files.
    cache_messages_max: int = 1024
    cache_bytes_max: int = 8 * 1024 * 1024
    # All WALs of one commit group (a broker host's WAL root) cache at most this many bytes
    # together; past it the largest caches give up their oldest frames first (wal/cache.py).
    # A root setting: the broker host's WalRoot passes it (and pending_group_bytes_max) to
    # the CommitGroup it makes, or, with per-topic writers (commit_group = False, or
    # WalRoot's fallback), to the wal.budget.MemoryBudgets it shares among them.
    cache_group_bytes_max: int = CACHE_GROUP_BYTES_MAX
    # Largest encoded record (key + attributes + payload + record header) accepted.
    max_message_bytes: int = 4 * 1024 * 1024
    # Backpressure: appended-but-unwritten bytes above this block appenders, for at most
    # append_timeout_s, so a stalled disk cannot eat all memory.
    pending_bytes_max: int = 64 * 1024 * 1024
    # The same bound for all WALs of one commit group together (a broker host's WAL root):
    # without it, 1,000 topics could hold 64 GB appended but unwritten behind a stalled disk.
    pending_group_bytes_max: int = PENDING_GROUP_BYTES_MAX
    append_timeout_s: float = 30.0
    # Readers pull this much from a segment file per read.
    read_chunk_bytes: int = 1024 * 1024
    # One sparse index entry (offset -> file position) per this many bytes of segment.
    index_interval_bytes: int = 64 * 1024
    # Bound on how long close() waits for the writer to drain.
    close_timeout_s: float = 30.0
    # A broker host opens every WAL of its root in one commit group (wal/group.py): one
    # writer thread and one syncfs(2) per round for all its topics. False: one writer
    # thread and one fdatasync per topic per round. WriteAheadLog.open without a group
    # (a standalone WAL) always uses its own writer, whatever this says.
    commit_group: bool = True
    # How the commit group makes a round durable: "journal" (one fdatasync of the root's
    # shared journal, wal/journal.py) or "syncfs" (one syncfs of the root's file system).
    group_sync: GroupSync = GroupSync.JOURNAL
    # The shared journal: the writer moves to a new (or recycled) file past journal_file_bytes;
    # a checkpoint (sync the segment files written since the last one, then let the journal
    # go behind them) starts after journal_checkpoint_bytes of journal or
    # journal_checkpoint_interval_s, whichever comes first. Both bound the replay after a crash.
    journal_file_bytes: int = 64 * 1024 * 1024
    journal_checkpoint_bytes: int = 32 * 1024 * 1024
    journal_checkpoint_interval_s: float = 10.0
    # A checkpoint with at least this many segment files to sync does it with one syncfs of
    # the root's file system (where that reaches them all) instead of one fdatasync each.
    journal_checkpoint_syncfs_min_files: int = 32
    # At most this many journal files past the checkpoint (a round waits for a checkpoint
    # first): the journal's disk use and the replay after a crash stay near
    # journal_files_max * journal_file_bytes.
    journal_files_max: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.max_message_bytes <= MAX_RECORD_BYTES:
            raise ValueError(f"max_message_bytes must be in [1, {MAX_RECORD_BYTES}]")
        if self.pending_bytes_max < self.max_message_bytes:
            raise ValueError("pending_bytes_max must hold at least one maximal message")
        # Sizes go to native code as Py_ssize_t and into sums of byte counts, time limits to
        # thread waits and clocks (threading.TIMEOUT_MAX, time_t): far past any real
        # setting, a larger one would fail a thread that waits on it, not this check.
        for name in ("fsync_batch_bytes", "segment_bytes_max", "cache_messages_max", "cache_bytes_max",
                     "cache_group_bytes_max", "pending_group_bytes_max", "read_chunk_bytes",
                     "index_interval_bytes", "journal_checkpoint_bytes", "journal_file_bytes",
                     "journal_checkpoint_syncfs_min_files"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= SIZE_MAX:
                raise ValueError(f"{name} must be a positive integer, at most 2**53, not {value!r}")
        if self.pending_group_bytes_max < self.max_message_bytes:
            raise ValueError("pending_group_bytes_max must hold at least one maximal message")
        for name in ("segment_age_max_s", "append_timeout_s", "close_timeout_s", "journal_checkpoint_interval_s"):
            if not 0 < getattr(self, name) <= SECONDS_MAX:
                raise ValueError(f"{name} must be positive and at most {SECONDS_MAX:.0e} s")
        if self.read_chunk_bytes > 1 << 30:
            raise ValueError("read_chunk_bytes must be at most 1 GiB (one read's buffer)")
        if self.journal_file_bytes < 64 * 1024:
            raise ValueError("journal_file_bytes must be at least 64 KiB")
        if self.journal_files_max < 2:
            raise ValueError("journal_files_max must be at least 2 (the checkpoint's file and the next)")
        if self.group_sync not in list(GroupSync):
            raise ValueError(f"group_sync must be one of {', '.join(m.value for m in GroupSync)}")
        # A topic's round is at most pending_bytes_max; a journal entry's length is a u32.
        if self.pending_bytes_max >= 1 << 32:
            raise ValueError("pending_bytes_max must stay below 4 GiB (a journal entry's bound)")
