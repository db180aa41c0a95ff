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
class UploaderConfig:
    """How often and how much the uploader archives.

    A pass runs every ``interval_s``, sooner when the un-uploaded durable bytes pass
    ``upload_bytes_threshold`` or a producer waits for "archived". One object holds at
    most ``object_bytes_max`` bytes of frames (a single larger frame still gets its own
    object). ``fault_hook`` is for crash tests only: it is called with a step name at
    every crash-relevant point.
    """

    interval_s: float = 30.0
    upload_bytes_threshold: int = 64 * MIB
    object_bytes_max: int = 64 * MIB
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
    fault_hook: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        for name in ("interval_s", "drain_timeout_s", "poll_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("upload_bytes_threshold", "object_bytes_max", "block_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if not 1 <= self.zstd_level <= 22:
            raise ValueError("zstd_level must be in 1..22")
        if self.retry_attempts_max < 1 or self.conflict_retries_max < 0:
            raise ValueError("retry_attempts_max must be >= 1 and conflict_retries_max >= 0")
