"""When to cut an archive object: by size, by age, or at once when someone waits.

A background pass cuts an object only when it is *full* (``UploaderConfig.target_bytes``
of frames, or more durable frames lie beyond what the budget held) or when the oldest
un-archived durable frame is ``UploaderConfig.age_max_s`` old. Everything else waits for a
later pass and fills a bigger object. Producers waiting for ``archived``, an explicit
request, ``upload_once`` and a drain (seal) bypass both bounds: their latency must not be
the age bound's.

The age is measured from when the uploader saw an offset become durable (the WAL's
durable listener, or a pass noticing the watermark moved), on the uploader's clock, so
tests drive it with a fake clock instead of sleeping.
"""
from __future__ import annotations

import bisect
import math
import threading

#: Marks kept per topic. Past this, newer offsets join the last mark and so count as
#: older than they are: the age bound then fires early, never late.
MARKS_MAX = 1024
#: Marks closer together than age_max / MARK_SLICES are merged the same (early) way.
MARK_SLICES = 64

#: Cut reasons counted in ``dnb_uploader_cuts_total``.
CUT_REASONS = ("size", "age", "forced")


class DurableAges:
    """When each not-yet-archived durable offset became durable.

    Marks ``(through, seen_s)`` ascend in both fields; offsets in ``(previous through,
    through]`` were durable at ``seen_s`` at the latest. Frames already durable when the
    uploader started have no known time and count as infinitely old (archived at the first
    pass: they may have waited through a crash already).
    """

    def __init__(self, granularity_s: float, durable_at_start: int | None) -> None:
        self._granularity_s = granularity_s
        self._lock = threading.Lock()
        self._throughs: list[int] = []
        self._seen_s: list[float] = []
        if durable_at_start is not None:
            self._throughs.append(durable_at_start)
            self._seen_s.append(-math.inf)

    def note(self, durable: int | None, now_s: float) -> None:
        """The durable watermark is ``durable`` at ``now_s`` (cheap: called per fsync)."""
        if durable is None:
            return
        with self._lock:
            if self._throughs and self._throughs[-1] >= durable:
                return
            if self._throughs and (len(self._throughs) >= MARKS_MAX
                                   or now_s - self._seen_s[-1] < self._granularity_s):
                self._throughs[-1] = durable  # merge: these offsets count as older (early cut)
                return
            self._throughs.append(durable)
            self._seen_s.append(now_s)

    def since_s(self, offset: int) -> float | None:
        """When ``offset`` was durable at the latest; None if not seen durable yet."""
        with self._lock:
            i = bisect.bisect_left(self._throughs, offset)
            return self._seen_s[i] if i < len(self._throughs) else None

    def forget_through(self, committed: int) -> None:
        """Drop marks wholly at or below ``committed`` (archived)."""
        with self._lock:
            i = bisect.bisect_right(self._throughs, committed)
            del self._throughs[:i], self._seen_s[:i]

    def __len__(self) -> int:
        with self._lock:
            return len(self._throughs)
