"""A bounded pool that runs the uploaders of thousands of topics on a few threads.

One scheduler thread checks every ``tick_s`` which registered uploaders are due
(:meth:`Uploader.is_due` is cheap: no I/O) and queues each at most once; ``workers``
threads run their passes. The queue therefore never holds more entries than there are
topics, and a slow topic occupies one worker, never the scheduler.

Fairness: the queue is first in, first out, and an uploader is queued again only after
its pass ended (a pass commits at most ``OBJECTS_PER_PASS_MAX`` objects), so a topic
that is always due goes to the back of the line behind every topic that became due
meanwhile: one busy topic holds at most one worker and cannot starve the others.

Leaving: :meth:`unregister` takes the uploader out of the queue as well as the
registry and waits (bounded) for a pass of it in flight to end, so once it returns no
pass of that uploader runs or starts in the pool. Seals, unloads and abandons rely on
this before they close the topic's WAL; fencing, not this, keeps a late commit out of
a topic that moved (every descriptor transaction carries the owner compares).
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
        #: id(uploader) -> the worker thread running its pass now.
        self._running: dict[int, threading.Thread] = {}
        self._closed = False
        self._stopped = threading.Event()  # the scheduler sleeps on it, not on _cond
        self.workers = workers
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

    def unregister(self, uploader: Pooled, timeout_s: float = 30.0) -> bool:
        """Stop driving ``uploader``: no pass of it starts from now on, and a pass in
        flight is waited for (up to ``timeout_s``; not when called from that pass).
        True when no pass of it is running any more."""
        key = id(uploader)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._registered.pop(key, None)
            if key in self._queued and key not in self._running:
                self._queued.discard(key)
                self._queue = collections.deque(u for u in self._queue if id(u) != key)
            while key in self._running and self._running[key] is not threading.current_thread():
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    return False
                self._cond.wait(remaining_s)
            return key not in self._running or self._running[key] is threading.current_thread()

    def notify(self, uploader: Pooled) -> None:
        """Queue ``uploader`` now (a request or a waiter), not at the next tick."""
        with self._cond:
            self._enqueue(uploader)

    def _enqueue(self, uploader: Pooled) -> None:
        key = id(uploader)
        if key in self._registered and key not in self._queued:
            self._queued.add(key)
            self._queue.append(uploader)
            self._cond.notify_all()  # workers and unregister() share the condition

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
            if self._stopped.wait(self.tick_s):
                return

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait(self.tick_s)
                if self._closed:
                    return
                uploader = self._queue.popleft()
                key = id(uploader)
                if key not in self._registered:  # unregistered while queued
                    self._queued.discard(key)
                    continue
                self._running[key] = threading.current_thread()
            try:
                uploader.run_background_pass()
            except Exception:  # noqa: BLE001 - one broken topic must not kill a worker
                log.exception("background pass failed for %r", uploader)
            finally:
                with self._cond:
                    self._running.pop(key, None)
                    self._queued.discard(key)
                    self._cond.notify_all()  # unregister() may be waiting for this pass

    def close(self, timeout_s: float = 30.0) -> bool:
        """Stop the threads (passes in flight finish); True if all ended in time."""
        with self._cond:
            self._closed = True
            self._stopped.set()
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def running(self, uploader: Pooled) -> bool:
        """A pass of ``uploader`` is in flight in this pool now."""
        with self._cond:
            return id(uploader) in self._running

    def __len__(self) -> int:
        with self._cond:
            return len(self._registered)


def _safe_is_due(uploader: Pooled) -> bool:
    try:
        return bool(uploader.is_due())
    except Exception:  # noqa: BLE001 - one broken topic must not stop the scheduler
        log.exception("is_due failed for %r", uploader)
        return False
