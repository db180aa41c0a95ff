"""Uploader configuration. Units are last in every name."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MIB = 1024 * 1024

COMPRESSIONS = ("zstd", "none")


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """Local WAL retention applied after each commit.

    Only segments lying entirely at or below the committed end are ever candidates.
    A candidate is deleted when it is older than ``age_max_s`` or while the WAL is
    bigger than ``bytes_max``; ``None`` disables that limit. With both ``None`` the
    WAL is never truncated by the uploader.
    """

    age_max_s: float | None = None
    bytes_max: int | None = None

    def __post_init__(self) -> None:
        if self.age_max_s is not None and self.age_max_s < 0:
            raise ValueError("age_max_s must be >= 0")
        if self.bytes_max is not None and self.bytes_max < 0:
            raise ValueError("bytes_max must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.age_max_s is not None or self.bytes_max is not None


@dataclass(frozen=True, slots=True)
class ArchiveRetentionConfig:
    """Archive retention: how much of each topic's archive its owner keeps.

    Each limit applies to each topic on its own. ``age_max_s``: objects whose descriptor
    was committed longer ago than this are removed. ``bytes_max``: the oldest objects are
    removed while the topic's retained objects total more than this. ``None`` disables a
    limit; both ``None`` (the default) keeps the archive forever. Whatever the limits,
    the last descriptor (the chain tip) is never removed, a cut is always at an object
    boundary, and only committed objects are ever candidates (``uploader/archive_retention.py``).
    ``check_interval_s``: how often the owner's uploader looks (one paged read of the
    topic's descriptors per look).
    """

    age_max_s: float | None = None
    bytes_max: int | None = None
    check_interval_s: float = 300.0

    def __post_init__(self) -> None:
        if self.age_max_s is not None and self.age_max_s < 0:
            raise ValueError("age_max_s must be >= 0")
        if self.bytes_max is not None and self.bytes_max < 0:
            raise ValueError("bytes_max must be >= 0")
        if not self.check_interval_s > 0:
            raise ValueError("check_interval_s must be > 0")

    @property
    def enabled(self) -> bool:
        return self.age_max_s is not None or self.bytes_max is not None


@dataclass(frozen=True, slots=True)
class UploaderConfig:
    """How often and how much the uploader archives.

    Objects are cut by size and age, not by pass: a background pass uploads only
    objects of ``object_target_bytes`` of frames, plus the rest once the oldest
    un-archived durable frame is ``object_age_max_s`` old. It uploads everything durable
    at once (whatever the size) for an ``archived`` waiter, ``request_upload()``,
    ``upload_once()`` and a drain (seal). WAL retention limits tighten both bounds, so
    un-archived frames never pin the WAL past them (see :meth:`target_bytes`).

    A background pass is *due* every ``interval_s``, when the estimated un-archived
    bytes reach the target, when the age bound falls due,
    or at once for a waiter or request. One object holds at most ``object_bytes_max``
    bytes of frames (a single larger frame still gets its own object). ``fault_hook`` is
    for crash tests only: it is called with a step name at every crash-relevant point.
    """

    interval_s: float = 30.0
    upload_bytes_threshold: int = 64 * MIB
    object_bytes_max: int = 64 * MIB
    # 32 MiB: ~32 objects (descriptors, PUTs) per GiB; four objects per 128 MiB Spark
    # task; and bounded memory, since an object is built whole in memory (frames plus
    # encoded bytes, ~2x the target per busy pool worker).
    object_target_bytes: int = 32 * MIB
    # 60 s: the longest a durable-only message waits for the archive at a low rate,
    # i.e. the window a failover can lose (recorded) on a dead broker. At 100 KB/s
    # (1,000 msg/s of 100 B) it gives ~6 MB objects; raise it for fewer objects.
    object_age_max_s: float = 60.0
    block_bytes: int = 1 * MIB
    compression: str = "zstd"
    zstd_level: int = 3
    drain_timeout_s: float = 60.0
    # Retries of one pass on retryable storage errors (bounded, exponential).
    retry_attempts_max: int = 5
    retry_backoff_s: float = 0.05
    retry_backoff_max_s: float = 2.0
    # Contiguity conflicts re-read the descriptor chain at most this many times per pass.
    conflict_retries_max: int = 3
    # How often the background thread re-checks the byte threshold between intervals.
    poll_interval_s: float = 1.0
    retention: RetentionConfig = RetentionConfig()
    archive_retention: ArchiveRetentionConfig = ArchiveRetentionConfig()
    fault_hook: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        for name in ("interval_s", "drain_timeout_s", "poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.object_age_max_s < 0:
            raise ValueError("object_age_max_s must be >= 0")
        for name in ("upload_bytes_threshold", "object_bytes_max", "object_target_bytes", "block_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if not 1 <= self.zstd_level <= 22:
            raise ValueError("zstd_level must be in 1..22")
        if self.retry_attempts_max < 1 or self.conflict_retries_max < 0:
            raise ValueError("retry_attempts_max must be >= 1 and conflict_retries_max >= 0")

    def target_bytes(self) -> int:
        """Frame bytes a size-cut object holds: the target, capped by ``object_bytes_max``,
        by ``upload_bytes_threshold`` (the older knob: un-archived bytes that start an
        upload) and by half of the WAL retention's ``bytes_max`` (pressure: un-archived
        frames are never deleted, so a larger target would pin the WAL past that limit)."""
        target = min(self.object_target_bytes, self.object_bytes_max, self.upload_bytes_threshold)
        if self.retention.bytes_max is not None:
            target = min(target, max(1, self.retention.bytes_max // 2))
        return target

    def age_max_s(self) -> float:
        """The age bound, capped by the WAL retention's ``age_max_s`` (same reason)."""
        if self.retention.age_max_s is not None:
            return min(self.object_age_max_s, self.retention.age_max_s)
        return self.object_age_max_s
