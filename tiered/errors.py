"""The storage error hierarchy shared by every metadata and object backend.

Backends map their own exceptions (gRPC, botocore, sqlite3, OSError) onto these and
keep the original as ``__cause__`` (``raise ... from e``). Where a built-in fits the
error inherits it too, so callers catching ``FileNotFoundError`` or ``ValueError``
keep working. Messages name keys, buckets and endpoints, never credentials.
"""
from __future__ import annotations

from native.errors import DnbError


class StorageError(DnbError):
    """Base class of every error raised by ``tiered`` stores."""

    #: True when the same call may succeed if simply retried later.
    retryable: bool = False


class ObjectNotFound(StorageError, FileNotFoundError):
    """The object (or metadata key, where a backend needs one) does not exist."""


class PreconditionFailed(StorageError):
    """A conditional write lost: the object already exists / the ETag moved on."""


class StorageUnavailable(StorageError):
    """The server is down, timed out, throttled or answered 5xx. Retry later."""

    retryable = True


class OperationTimeout(StorageUnavailable, TimeoutError):
    """A call hit its deadline; the outcome of a write is unknown."""


class BucketNotFound(StorageError, LookupError):
    """The object store's bucket does not exist at its endpoint (a configuration error:
    retrying does not help). The message names the bucket and the endpoint."""


class PermissionDenied(StorageError, PermissionError):
    """Credentials were rejected or lack a permission."""


class InvalidKey(StorageError, ValueError):
    """An object or metadata key that is empty, absolute, or would escape its prefix."""


class InvalidRange(StorageError, ValueError):
    """A ranged read whose start lies at or beyond the end of the object."""


class MetadataError(StorageError):
    """Base class of metadata-store specific errors."""


class MalformedRecord(MetadataError, ValueError):
    """A stored value that does not parse as the record its key promises."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"malformed record at {key!r}: {problem}")
        self.key = key
        self.problem = problem


class CompactedRevision(MetadataError):
    """A watch asked for history older than the store keeps.

    Recover by reading the current state (``range``) and watching from
    ``current_revision + 1``.
    """

    def __init__(self, requested_revision: int, compact_revision: int) -> None:
        super().__init__(
            f"revision {requested_revision} is compacted (oldest kept: {compact_revision})"
        )
        self.requested_revision = requested_revision
        self.compact_revision = compact_revision


class WatchOverflow(MetadataError):
    """A watch consumer fell too far behind; the watch ended instead of dropping events.

    Resume with a new watch from ``next_revision``.
    """

    def __init__(self, next_revision: int) -> None:
        super().__init__(f"watch queue overflowed; resume from revision {next_revision}")
        self.next_revision = next_revision


class LeaseNotFound(MetadataError):
    """A lease that expired or was revoked."""


class OwnershipError(MetadataError):
    """Base class of ownership failures (a topic's owner record and its fencing)."""


class OwnershipLost(OwnershipError):
    """A fenced write failed: this broker's token is stale, a newer owner holds the topic.

    Raised by every layer that writes under a fencing compare: the uploader's descriptor
    commit (it then stops for good) and the lifecycle's owner-record writes (seal, mark
    open, release, appends after a fence). ``step`` names the refused write."""

    def __init__(self, topic: object, step: str) -> None:
        super().__init__(f"topic {topic}: {step} refused, this broker no longer owns the topic")
        self.topic = topic
        self.step = step

    @property
    def detail(self) -> str:
        """The refused write; the name the uploader's callers read."""
        return self.step


class TopicHeld(OwnershipError):
    """A write fenced on a topic staying unowned found it held: a broker took it between
    the caller's look and the fence (go through that owner instead)."""

    def __init__(self, topic: object, holder: str, epoch: int) -> None:
        super().__init__(f"topic {topic} is held by broker {holder} (epoch {epoch})")
        self.topic = topic
        self.holder = holder
        self.epoch = epoch


class UnknownScheme(StorageError, ValueError):
    """A store URL whose scheme no backend handles."""


class MissingDependency(StorageError, ImportError):
    """A backend whose optional Python package is not installed."""


class TopicNotFound(StorageError, LookupError):
    """The topic does not exist (never created, or deleted) and the call may not create it
    (``broker.auto_create`` off, or a read-only call such as ``dnb inspect``). Nothing was
    written."""

    def __init__(self, topic: object, detail: str = "") -> None:
        super().__init__(f"topic {topic} does not exist{': ' + detail if detail else ''}")
        self.topic = topic


class TopicDeleted(TopicNotFound):
    """The topic is deleted, or its delete has begun (its tombstone is written): loads,
    produces, reads, subscriptions and cursor writes are refused. ``phase`` is the
    tombstone's (``deleting``: re-run the delete to finish it; ``deleted``: the name may be
    created again explicitly, continuing at ``next_offset``)."""

    def __init__(self, topic: object, phase: str, next_offset: int) -> None:
        StorageError.__init__(self, f"topic {topic} is deleted (tombstone phase {phase!r}; a new topic of this "
                                    f"name would continue at offset {next_offset})")
        self.topic = topic
        self.phase = phase
        self.next_offset = next_offset
