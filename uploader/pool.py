"""A bounded pool that runs the uploaders of thousands of topics on a few threads.

One scheduler thread checks every ``tick_s`` which registered uploaders are due
(:meth:`Uploader.is_due` is cheap: no I/O) and queues each at most once; ``workers``
threads run their passes. The queue therefore never holds more entries than there are
topics, and a slow topic occupies one worker, never the scheduler.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Protocol

log = logging.getLogger(__name__)


class Pooled(Protocol):
    """What the pool drives (``uploader.Uploader``)."""

    def is_due(self) -> bool: ...

    def run_background_pass(self) -> None: ...


class UploaderPool:
    def __init__(self, workers: int = 4, tick_s: float = 0.5) -> None:
        if workers < 1 or tick_s <= 0:
            raise ValueError("workers must be >= 1 and tick_s > 0")
        self.tick_s = tick_s
        self._cond = threading.Condition()
        self._registered: dict[int, Pooled] = {}
        self._queued: set[int] = set()
        self._queue: collections.deque[Pooled] = collections.deque()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"uploader-pool-{i}", daemon=True)
                         for i in range(workers)]
        self._threads.append(threading.Thread(target=self._schedule, name="uploader-pool-sched", daemon=True))
        for thread in self._threads:
            thread.start()

    def register(self, uploader: Pooled) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("uploader pool is closed")
            self._registered[id(uploader)] = uploader

    def unregister(self, uploader: Pooled) -> None:
        with self._cond:
            self._registered.pop(id(uploader), None)

    def notify(self, uploader: Pooled) -> None:
        """Queue ``uploader`` now (a request or a waiter), not at the next tick."""
        with self._cond:
            self._enqueue(uploader)

    def _enqueue(self, uploader: Pooled) -> None:
        key = id(uploader)
        if key in self._registered and key not in self._queued:
            self._queued.add(key)
            self._queue.append(uploader)
            self._cond.notify()

    def _schedule(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                candidates = list(self._registered.values())
            due = [u for u in candidates if _safe_is_due(u)]
            with self._cond:
                for uploader in due:
                    self._enqueue(uploader)
                self._cond.wait(self.tick_s)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait(self.tick_s)
                if self._closed:
                    return
                uploader = self._queue.popleft()
            try:
                uploader.run_background_pass()
            finally:
                with self._cond:
                    self._queued.discard(id(uploader))

    def close(self, timeout_s: float = 30.0) -> bool:
        """Stop the threads (passes in flight finish); True if all ended in time."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def __len__(self) -> int:
        with self._cond:
            return len(self._registered)


def _safe_is_due(uploader: Pooled) -> bool:
    try:
        return bool(uploader.is_due())
    except Exception:  # noqa: BLE001 - one broken topic must not stop the scheduler
        log.exception("is_due failed for %r", uploader)
        return False
