"""Local WAL retention, applied by the uploader after each commit.

Only sealed segments whose last offset is at or below the committed end are candidates:
nothing that is not in a committed object is ever deleted. Oldest first, a candidate is
deleted while it is older than ``age_max_s`` (by creation time) or the WAL is larger than
``bytes_max``; the first candidate that meets neither stops the sweep, so the WAL always
stays a contiguous suffix of the log.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from uploader.config import RetentionConfig
from wal.api import WalFrameSource
from wal.segment import SegmentInfo

log = logging.getLogger(__name__)


def retention_cut(segments: Sequence[SegmentInfo], committed_through: int, policy: RetentionConfig,
                  now_ms: int) -> int | None:
    """The offset to ``truncate_before`` (None: delete nothing)."""
    ordered = sorted(segments, key=lambda s: s.base_offset)
    total_bytes = sum(s.size_bytes for s in ordered)
    cut = None
    for seg in ordered:
        if not seg.sealed or seg.last_offset < seg.base_offset or seg.last_offset > committed_through:
            break
        too_old = policy.age_max_s is not None and now_ms - seg.created_ms >= policy.age_max_s * 1000
        too_big = policy.bytes_max is not None and total_bytes > policy.bytes_max
        if not (too_old or too_big):
            break
        cut = seg.last_offset + 1
        total_bytes -= seg.size_bytes
    return cut


def apply_retention(wal: WalFrameSource, committed_through: int, policy: RetentionConfig, topic: str) -> int | None:
    """Delete committed segments per ``policy``; returns the cut offset, if any."""
    cut = retention_cut(list(wal.segments()), committed_through, policy, time.time_ns() // 1_000_000)
    if cut is None:
        return None
    # Pair assertion: the cut can never pass the committed end.
    assert cut <= committed_through + 1, (cut, committed_through)
    wal.truncate_before(cut)
    log.debug("topic %s: WAL retention deleted segments below %d", topic, cut)
    return cut
