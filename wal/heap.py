"""Keep the long-lived state of open WALs out of the cyclic garbage collector's walks:
:class:`HeapFreezer`.

Why (measured, docs/WAL.md "Commit groups"): CPython's cyclic collector walks every
GC-tracked object of the process in a full collection, holding the GIL. An open WAL is
about 100 such objects (locks, conditions, deques, bound methods of its hooks), so 1,000
open WALs are ~110,000, and a full collection takes 10-40 ms. Under load, messages in
flight survive young collections often enough to start a full one every few seconds, and
every append and every commit round waits for it: at 1,000 topics and 10,000 msg/s the
append->durable p99 was 15-24 ms with the default collector and 0.8 ms with the WALs'
objects frozen.

What freezing does: ``gc.freeze()`` moves every object tracked now into the collector's
permanent generation, which collections never walk. Reference counting still frees a
frozen object the moment its last reference goes, so memory is unaffected for everything
that is not part of a reference cycle. A cycle that becomes garbage while frozen is not
reclaimed (nor are its finalizers run) until it is unfrozen; nothing of a WAL's
durability depends on finalizers (files are closed by ``close()``, not by garbage
collection).

The policy, for a process that hosts topics (``tiered.lifecycle.BrokerHost``):

* :meth:`HeapFreezer.freeze` after a topic loads: its new objects stop being walked.
  Costs no walk (the generations' lists are spliced).
* :meth:`HeapFreezer.changed` after a topic unloads: its cycles, if any, are frozen
  garbage now.
* :meth:`HeapFreezer.maintain`, periodically: when anything loaded or unloaded since the
  last time, and at most once per ``refreeze_interval_s``, unfreeze, collect everything
  and freeze again. That is ONE full collection (the 10-40 ms pause above) per interval
  while topics come and go, instead of one every few seconds; it bounds what frozen
  garbage can hold to what the process made unreachable in one interval.

The collector is one per interpreter, so freezing is process-wide: several freezers (one
per host; tests open many hosts in one process) share a count, and the last one to
:meth:`close` unfreezes everything, so a process that stops hosting collects as usual.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from wal.metrics import families_for

_log = logging.getLogger(__name__)

#: Open freezers in this process (guarded by _lock): the last close unfreezes.
_open = 0
#: The young generation's collection threshold while a freezer is open (CPython's default
#: is 700 allocations). A commit round allocates a few dozen short-lived objects per topic
#: (docs/WAL.md, "What still bounds latency under load"), so at 700 a young collection ran
#: every few dozen topic-rounds: 5 % of the round's instructions (callgrind, 200 topics:
#: 61,076 per topic-round at 700, 57,929 at 5,000). A young collection walks only young
#: objects still alive, so it stays short (well under a millisecond); garbage cycles wait
#: for at most 5,000 allocations instead of 700.
YOUNG_THRESHOLD = 5000
#: The thresholds the first freezer found, and those it left (guarded by _lock): the last
#: close puts the first back only if the second are still in force (a process that set its
#: own meanwhile keeps them).
_thresholds_before: tuple[int, int, int] | None = None
_thresholds_set: tuple[int, int, int] | None = None
_lock = threading.Lock()


class HeapMetrics:
    """The freezer's families (process-wide facts, so one series each)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.frozen_objects = Gauge("dnb_gc_frozen_objects",
                                    "Objects in the collector's permanent generation (counted when scraped)",
                                    registry=registry)
        # Counted at scrape time: counting walks the whole permanent generation, too slow
        # to do after each of thousands of loads.
        self.frozen_objects.set_function(gc.get_freeze_count)
        self.refreezes = Counter("dnb_gc_refreezes_total",
                                 "Unfreeze + full collection + freeze passes (wal.heap)", registry=registry)
        self.refreeze_seconds = Histogram("dnb_gc_refreeze_seconds",
                                          "Duration of one refreeze pass (a full collection: the GIL is held)",
                                          registry=registry)

    @classmethod
    def create(cls, registry: CollectorRegistry | None) -> "HeapMetrics":
        return families_for(registry if registry is not None else CollectorRegistry(), cls)


class HeapFreezer:
    """The freeze policy of one host (see the module docstring). Thread-safe."""

    def __init__(self, refreeze_interval_s: float = 300.0, *, metrics_registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if refreeze_interval_s <= 0:
            raise ValueError("refreeze_interval_s must be > 0")
        global _open
        self.refreeze_interval_s = refreeze_interval_s
        self.metrics = HeapMetrics.create(metrics_registry)
        self._clock = clock
        self._changed = False
        self._last_refreeze = clock()
        self._closed = False
        with _lock:
            if _open == 0:
                _raise_young_threshold()
            _open += 1

    def freeze(self) -> None:
        """Freeze every object tracked now (call after a topic loaded). Also counts as a
        change: garbage cycles made while loading were frozen with it."""
        with _lock:
            if self._closed:
                return
            self._changed = True
            gc.freeze()

    def changed(self) -> None:
        """Something unloaded (or failed to load): the next :meth:`maintain` after the
        interval reclaims what it left in frozen cycles."""
        self._changed = True

    def maintain(self) -> bool:
        """Unfreeze, collect and freeze again if anything changed since the last time
        and the interval has passed; True if it did. For a periodic job."""
        now = self._clock()
        if not self._changed or now - self._last_refreeze < self.refreeze_interval_s:
            return False
        with _lock:
            if self._closed:
                return False
            self._changed = False
            self._last_refreeze = now
            started = time.perf_counter()
            gc.unfreeze()
        # Not under the lock: a finalizer the collection runs must be free to load or
        # unload (and so to call freeze) without deadlocking on it. A freeze by another
        # host meanwhile only leaves this pass's garbage for the next one.
        found = gc.collect()
        with _lock:
            if _open > 0:  # unless the last freezer closed meanwhile (it unfroze for good)
                gc.freeze()
            seconds = time.perf_counter() - started
        self.metrics.refreezes.inc()
        self.metrics.refreeze_seconds.observe(seconds)
        _log.info("refroze the heap: %d unreachable objects collected (%.1f ms with the GIL held)",
                  found, seconds * 1e3)
        return True

    def close(self) -> None:
        """This host stops freezing; the process's last open freezer unfreezes
        everything (the next collections reclaim any frozen garbage). Idempotent."""
        global _open
        with _lock:
            if self._closed:
                return
            self._closed = True
            _open -= 1
            if _open == 0:
                gc.unfreeze()
                _restore_thresholds()


def _raise_young_threshold() -> None:
    """The first freezer opens (under _lock): young collections every YOUNG_THRESHOLD
    allocations, unless the process set a higher threshold, or 0 (no automatic
    collection), itself."""
    global _thresholds_before, _thresholds_set
    _thresholds_before = before = gc.get_threshold()
    if 0 < before[0] < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, before[1], before[2])
    _thresholds_set = gc.get_threshold()


def _restore_thresholds() -> None:
    """The last freezer closed (under _lock): the thresholds the first one found, unless the
    process changed them since (its own setting stands)."""
    global _thresholds_before, _thresholds_set
    if _thresholds_before is not None and gc.get_threshold() == _thresholds_set:
        gc.set_threshold(*_thresholds_before)
    _thresholds_before = _thresholds_set = None
