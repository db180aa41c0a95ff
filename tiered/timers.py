"""Periodic jobs of many owners on one thread: :class:`Scheduler`.

A broker hosts thousands of topics; a thread per topic for work that runs every few
seconds (writing subscription cursors) costs a thread stack per idle topic and grows
with the topic count. A :class:`Scheduler` keeps every job's next due time in one heap
and runs the due ones, one at a time, on its single thread:

* :meth:`Scheduler.every` registers ``fn`` to run every ``interval_s`` (the first run
  one interval from now) and returns a :class:`Job`;
* :meth:`Job.wake` runs the job soon instead of at its next due time (coalesced: many
  wakes before it runs are one run);
* :meth:`Job.cancel` ends the job: it never starts again, and a run in flight is waited
  for (bounded), so the owner may close what the job uses once it returns True.

A job that raises is logged and runs again at its next due time; jobs are expected to
catch and report their own errors (:mod:`tiered.logs`). Jobs share the thread, so one
slow run delays the others: keep runs bounded (every store call has a timeout).
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Job:
    """One periodic job of a :class:`Scheduler` (see the module docstring)."""

    __slots__ = ("_scheduler", "fn", "interval_s", "name", "_due_s", "_seq", "_cancelled", "_woken")

    def __init__(self, scheduler: "Scheduler", fn: Callable[[], object], interval_s: float, name: str) -> None:
        self._scheduler = scheduler
        self.fn = fn
        self.interval_s = interval_s
        self.name = name
        self._due_s = 0.0
        self._seq = 0  # which heap entry is current; older ones are skipped
        self._cancelled = False
        self._woken = False  # woken while running: run again at once afterwards

    def wake(self) -> None:
        """Run soon, not at the next due time. Cheap; safe from any thread."""
        self._scheduler._wake(self)

    def cancel(self, timeout_s: float = 10.0) -> bool:
        """Never run again; wait up to ``timeout_s`` for a run in flight (not when called
        from the job itself). True when no run is in flight any more."""
        return self._scheduler._cancel(self, timeout_s)

    @property
    def cancelled(self) -> bool:
        return self._cancelled


class Scheduler:
    """Runs periodic jobs on one thread (a heap of due times). Thread-safe."""

    def __init__(self, name: str = "dnb-timers") -> None:
        self.name = name
        self._clock = time.monotonic
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count(1)
        self._running: Job | None = None
        self._closed = False
        self._jobs = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def every(self, interval_s: float, fn: Callable[[], object], name: str = "") -> Job:
        """Run ``fn`` every ``interval_s`` seconds from now on, until cancelled."""
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        job = Job(self, fn, interval_s, name or getattr(fn, "__qualname__", "job"))
        with self._cond:
            if self._closed:
                raise RuntimeError(f"scheduler {self.name} is closed")
            self._jobs += 1
            self._push(job, self._clock() + interval_s)
        return job

    def __len__(self) -> int:
        """Jobs registered and not cancelled."""
        with self._cond:
            return self._jobs

    def close(self, timeout_s: float = 10.0) -> bool:
        """Stop the thread (a run in flight finishes); True if it ended in time. Jobs not
        cancelled never run again."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- internals ---------------------------------------------------------------
    def _push(self, job: Job, due_s: float) -> None:
        job._seq = next(self._seq)
        job._due_s = due_s
        heapq.heappush(self._heap, (due_s, job._seq, job))
        if self._heap[0][2] is job:
            self._cond.notify_all()  # a new earliest: the thread's wait is too long now

    def _wake(self, job: Job) -> None:
        with self._cond:
            if job._cancelled or self._closed:
                return
            if self._running is job:
                job._woken = True
                return
            now_s = self._clock()
            if job._due_s > now_s:
                self._push(job, now_s)

    def _cancel(self, job: Job, timeout_s: float) -> bool:
        deadline_s = time.monotonic() + timeout_s
        with self._cond:
            if not job._cancelled:
                job._cancelled = True
                self._jobs -= 1
                # Its heap entry stays until its due time (skipped then): it must not keep
                # the owner alive meanwhile (an unloaded topic's whole WAL, for a cursor
                # flush job). A run in flight has its own reference.
                job.fn = _nothing
            while self._running is job and threading.current_thread() is not self._thread:
                remaining_s = deadline_s - time.monotonic()
                if remaining_s <= 0:
                    return False
                self._cond.wait(remaining_s)
            return True

    def _next(self) -> Job | None:
        """The next due job (marked running), or None once closed."""
        with self._cond:
            while not self._closed:
                while self._heap and (self._heap[0][2]._cancelled or self._heap[0][1] != self._heap[0][2]._seq):
                    heapq.heappop(self._heap)  # cancelled, or superseded by a later push
                if not self._heap:
                    self._cond.wait()
                    continue
                due_s, _, job = self._heap[0]
                wait_s = due_s - self._clock()
                if wait_s > 0:
                    self._cond.wait(wait_s)
                    continue
                heapq.heappop(self._heap)
                self._running = job
                return job
            return None

    def _run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                job.fn()
            except Exception:  # noqa: BLE001 - one failing job must not stop the others
                log.exception("%s: job %s failed; it runs again at its next due time", self.name, job.name)
            finally:
                with self._cond:
                    self._running = None
                    if not job._cancelled and not self._closed:
                        woken, job._woken = job._woken, False
                        self._push(job, self._clock() + (0.0 if woken else job.interval_s))
                    self._cond.notify_all()  # a cancel() may be waiting for this run


def _nothing() -> None:
    """What a cancelled job holds instead of its function."""


__all__ = ["Job", "Scheduler"]
