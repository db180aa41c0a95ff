"""Typed errors of the write-ahead log.

All inherit :class:`WalError`; where a built-in fits they inherit it too so callers
that catch ``ValueError`` for bad input keep working.
"""
from __future__ import annotations

from native.errors import DnbError
from native.errors import OffsetOverflow  # noqa: F401 - re-exported: the WAL raises it on a full topic


class WalError(DnbError):
    """Base class of every error raised by the ``wal`` package."""


class InvalidTopicName(WalError, ValueError):
    """A topic name that is not ``/namespace/topic`` or would escape a directory/key prefix."""


class MessageTooLarge(WalError, ValueError):
    """A message whose encoded record exceeds ``max_message_bytes``."""


class WalClosed(WalError):
    """Append or read on a WAL that was closed (or sealed)."""


class WalFailed(WalError):
    """The WAL hit an I/O error (e.g. a failed fsync) and fails closed from then on.

    A failed fsync is never retried: after it the kernel may have dropped the dirty
    pages, so a retry could report success for data that is gone.
    """


class CorruptLog(WalError):
    """A segment is corrupt somewhere other than its tail; recovery refuses to guess."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt at byte {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class OffsetBelowRetention(WalError, LookupError):
    """A read asked for an offset older than the WAL keeps; chain to the archive."""

    def __init__(self, offset: int, first_offset: int) -> None:
        super().__init__(f"offset {offset} is below the WAL's first offset {first_offset}")
        self.offset = offset
        self.first_offset = first_offset


class InitialOffsetMismatch(WalError, ValueError):
    """A non-empty WAL was opened with an initial offset other than where it continues."""

    def __init__(self, initial_offset: int, next_offset: int) -> None:
        super().__init__(f"initial_offset {initial_offset} disagrees with the WAL, which continues "
                         f"at {next_offset}")
        self.initial_offset = initial_offset
        self.next_offset = next_offset


class WalLocked(WalError):
    """Another opener (this process or another) holds the directory's lock file.

    Two writers on one WAL directory would hand out the same offsets for different
    messages; the second opener is refused at once instead."""

    def __init__(self, path: str, detail: str = "held by another opener") -> None:
        super().__init__(f"{path}: locked ({detail}); one writer per WAL directory")
        self.path = path


class SyncNotCovered(WalError, ValueError):
    """A commit group that makes rounds durable with ``syncfs`` (``wal.group_sync =
    syncfs``) was given a root, or a WAL directory, that such a ``syncfs`` does not make
    durable (``FileSystem.syncfs_covers``: another volume mounted under the root, FUSE, a
    kernel before 5.17): it would acknowledge rounds that a power loss may drop."""

    def __init__(self, path: str, root: str) -> None:
        super().__init__(f"{path}: a syncfs of {root} does not make it durable (another volume, "
                         "or a file system whose syncfs is no flush); use the journal or per-topic writers")
        self.path = path
        self.root = root


class WalTimeout(WalError, TimeoutError):
    """A bounded wait (flush, backpressured append) ran out of time."""
