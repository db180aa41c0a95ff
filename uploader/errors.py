"""Typed errors of the uploader.

Every error keeps the storage error that caused it as ``__cause__``.
"""
from __future__ import annotations

from native.errors import DnbError
# A descriptor commit that fails the fencing compares raises the one ownership-lost
# error of the storage layer (the lifecycle raises the same class); the uploader then
# stops for good and the lifecycle code must drop the topic. Re-exported here because
# the uploader's callers import it from this module.
from tiered.errors import OwnershipLost as OwnershipLost


class UploadError(DnbError):
    """Base class of every error raised by the ``uploader`` package."""


class ArchiveGap(UploadError):
    """The WAL no longer holds the offsets that must be archived next.

    Raised instead of committing a descriptor that would leave a hole in the archive.
    """

    def __init__(self, topic: str, next_offset: int, wal_first_offset: int) -> None:
        super().__init__(
            f"topic {topic}: next offset to archive is {next_offset} but the WAL starts "
            f"at {wal_first_offset}; refusing to leave a gap"
        )
        self.topic = topic
        self.next_offset = next_offset
        self.wal_first_offset = wal_first_offset


class ForeignDescriptor(UploadError):
    """The descriptor chain runs past what this uploader committed with a descriptor it did
    not commit: one past a gap, of another owner or epoch, or rewritten or forged to look
    like one of its own.

    While an uploader owns the topic nobody else may extend its chain, so such a record is
    damaged or hostile metadata. Trusting it would answer ``archived`` waiters for offsets
    in no object and let WAL retention delete segments never archived; the uploader stops
    for good instead (and WAL retention with it), keeping every WAL segment."""

    def __init__(self, topic: str, problem: str) -> None:
        super().__init__(f"topic {topic}: the descriptor chain's tip is not this uploader's: {problem}; "
                         "archiving stopped, the WAL is kept")
        self.topic = topic


class CommitConflict(UploadError):
    """The contiguity compare failed: the descriptor chain moved under us (retried)."""


class DrainTimeout(UploadError, TimeoutError):
    """``drain`` could not archive up to the WAL tip within its time bound."""


class UploaderStopped(UploadError):
    """The uploader was stopped (or failed) while a caller was waiting on it."""
