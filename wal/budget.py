"""The memory bounds that all the WALs of one root share (docs/WAL.md, "Memory bounds").

Each WAL has its own bounds (``pending_bytes_max``, ``cache_bytes_max``), but a broker
hosts thousands of topics, so those alone bound nothing useful. A :class:`MemoryBudgets`
holds the two bounds of a whole WAL root:

* **pending bytes** (``native.PendingBudget``): frames appended but not yet taken by a
  writer. Every append core of the root counts into it in the same atomic step as into
  its own count; an append that finds it full waits in :meth:`MemoryBudgets.wait_for_room`,
  in line, until a writer takes frames.
* **cached bytes** (``wal.cache.CacheBudget``): what the caches of recent frames keep
  alive; trimmed on the budget's own thread.

A ``wal.group.CommitGroup`` makes one for its members. A root whose WALs have their own
writer threads (``wal.commit_group = false``, or ``tiered.lifecycle.wal_root.WalRoot``'s
fallback) makes one itself and passes it to every ``WriteAheadLog.open`` of the root.

A writer thread never waits here (:func:`mark_writer_thread`): a durable listener runs on
it and may append to another topic, and waiting there could wait for the very take that
only this thread, or every writer thread at once, would make.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from collections.abc import Callable

from native import PendingBudget
from native._protocols import SharedPending
from prometheus_client import Gauge
from wal.cache import CacheBudget
from wal.config import SIZE_MAX
from wal.errors import WalFailed, WalTimeout
from wal.metrics import GroupMetrics

_log = logging.getLogger(__name__)

#: How often an append waiting for the pending budget looks again unasked: a guard only
#: (takes, closes and failures wake the waiters that must look).
ROOM_RECHECK_S = 1.0

_writer_threads = threading.local()


def mark_writer_thread() -> None:
    """Called by a WAL writer thread (a commit group's, or a topic's own) as it starts: it
    never waits for a shared budget (see the module docstring)."""
    _writer_threads.marked = True


def on_writer_thread() -> bool:
    """Whether the caller is a WAL writer thread (:func:`mark_writer_thread`)."""
    return getattr(_writer_threads, "marked", False)


class _RoomWaiter:
    """An append waiting in ``MemoryBudgets.wait_for_room``'s line."""

    __slots__ = ("event", "deadline")

    def __init__(self, deadline: float) -> None:
        self.event = threading.Event()
        self.deadline = deadline


class MemoryBudgets:
    """The pending-bytes and cache budgets of one WAL root. Thread-safe."""

    def __init__(self, name: str, cache_bytes_max: int | None, pending_bytes_max: int | None,
                 metrics: GroupMetrics, failure: Callable[[], BaseException | None] = lambda: None,
                 single_adder: bool = False) -> None:
        """``name``: the root, for logs and thread names. ``cache_bytes_max`` and
        ``pending_bytes_max``: the bounds (None: that one is off). ``metrics``: where the
        budgets' gauges and the trimmed bytes go. ``failure``: the exception of the
        writer they serve when it failed for every topic (a commit group), which waiting
        appends then raise as WalFailed. ``single_adder``: only one thread adds to caches
        (a commit group's), so it counts without a lock (``CacheBudget``)."""
        for what, value in (("cache_bytes_max", cache_bytes_max), ("pending_bytes_max", pending_bytes_max)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not 0 < value <= SIZE_MAX):
                raise ValueError(f"{what} must be None or a positive number of bytes (at most 2**53), "
                                 f"not {value!r}")
        self.name = name
        self.metrics = metrics
        self.single_adder = single_adder
        #: The budget every cache of the root counts against (None: none).
        self.cache: CacheBudget | None = CacheBudget(
            cache_bytes_max, metrics.cache_trimmed_bytes.inc, name, single_adder=single_adder) \
            if cache_bytes_max is not None else None
        #: The pending bytes every append core of the root counts into (None: none).
        self.pending: SharedPending | None = PendingBudget(pending_bytes_max) \
            if pending_bytes_max is not None else None
        # The gauges read the budgets when scraped (atk87 F2: set after each round, they
        # stood still behind a stalled disk, when the budgets fill, and after the last
        # topic left).
        # Every live MemoryBudgets of a registry counts (atk88 F3: a function per gauge
        # showed only the last one made, e.g. the second BrokerHost of a process).
        _track(metrics.cache_bytes, self, _cache_bytes)
        _track(metrics.pending_bytes, self, _pending_bytes)
        self._failure = failure
        self._room_lock = threading.Lock()
        #: Appends waiting for room, first come first served: each waits on its own event,
        #: set when it is first in line and a writer took frames (or to look again).
        self._room_queue: collections.deque[_RoomWaiter] = collections.deque()

    @property
    def room_waiters(self) -> int:
        """Appends waiting now for the pending budget (``wait_for_room``)."""
        return len(self._room_queue)


    def wait_for_room(self, deadline: float, refused: Callable[[], bool], timeout_s: float) -> None:
        """An append found the pending budget full, or other appends waiting (its core
        called back): wait in line until it is first and a writer took enough, the append
        is refused (``refused()``: its WAL closed or failed) or the writer failed for every
        topic (WalFailed), for at most until ``deadline`` (monotonic), then WalTimeout.
        Called without any WAL's lock: the take this waits for needs them. Returns at once
        on a writer thread (``mark_writer_thread``).

        First come, first served: while anyone waits (``PendingBudget.waiting``), every
        append to every topic queues here too, so appends that never waited cannot take the
        room a writer made from those that did (atk83 F3: with all appends woken by every
        round, 500 topics on a 256 KiB budget timed out 2,556 times in 30 s on a healthy
        disk, and some topics got nothing in for 15 s). Only the first in line is woken."""
        budget = self.pending
        assert budget is not None
        if on_writer_thread():
            return  # a durable listener appending to another topic: it goes on, past the budget
        me = _RoomWaiter(deadline)
        queue = self._room_queue
        try:
            # Inside the try: an exception raised as the lock is released (a KeyboardInterrupt)
            # must not leave this waiter in line (atk84 F2).
            with self._room_lock:
                queue.append(me)
                budget.waiting = len(queue)
            while True:
                with self._room_lock:
                    self._drop_stale_waiters_locked(me)
                    failure = self._failure()
                    if failure is not None or refused():
                        break
                    # Dropped by a waiter behind it as stranded: so late that its wait is over.
                    dropped = me not in queue
                    if not dropped and queue[0] is me and not budget.full:
                        break
                    me.event.clear()  # woken when first in line and a writer took frames
                remaining = deadline - time.monotonic()
                if remaining <= 0 or dropped:
                    raise WalTimeout(f"append blocked {timeout_s} s: the WALs of {self.name} hold "
                                     f"{budget.used} bytes appended but not written (pending_group_bytes_max "
                                     f"{budget.bytes_max})")
                # Set when this one may go or must look again; the timeout guards against
                # a wake-up that never comes (a waiter that left the line abnormally).
                me.event.wait(min(remaining, ROOM_RECHECK_S))
            if failure is not None:
                raise WalFailed(f"commit group of {self.name} failed: {failure!r}") from failure
            # Refused: the append raises its WAL's refusal. Or first in line with room: it
            # appends (the core does not check again).
        finally:
            with self._room_lock:
                first = bool(queue) and queue[0] is me
                if me in queue:
                    queue.remove(me)
                # From the line itself, not counted up and down: an exception between two
                # steps here cannot leave ``waiting`` wrong for good (atk84 F3).
                budget.waiting = len(queue)
                if first and queue:
                    queue[0].event.set()  # the next in line looks (the room may hold it too)

    def _drop_stale_waiters_locked(self, me: _RoomWaiter) -> None:
        """Drop waiters first in line whose wait ended long ago: left in line by an
        exception no ``finally`` could handle, they would hold everyone behind them."""
        queue = self._room_queue
        now = time.monotonic()
        dropped = False
        while queue and queue[0] is not me and queue[0].deadline + ROOM_RECHECK_S < now:
            _log.warning("WALs of %s: dropped a waiter for room whose wait ended %.1f s ago",
                         self.name, now - queue[0].deadline)
            queue.popleft()
            dropped = True
        if dropped and queue and queue[0] is not me:
            queue[0].event.set()  # the new first in line looks now (atk85 F3)
        self.pending.waiting = len(queue)  # type: ignore[union-attr]  # only called with one

    def wake_room(self, everyone: bool = False) -> None:
        """The first append waiting for room looks again (a writer took frames); with
        ``everyone``, all of them (a WAL closed or failed: its waiting appends are refused)."""
        with self._room_lock:
            if everyone:
                for waiter in self._room_queue:
                    waiter.event.set()
            elif self._room_queue:
                self._room_queue[0].event.set()

    def close(self) -> None:
        """Stop the cache budget's trimming thread (the WALs sharing it are closed)."""
        if self.cache is not None:
            self.cache.close()


def _cache_bytes(budgets: MemoryBudgets) -> int:
    return budgets.cache.bytes if budgets.cache is not None else 0


def _pending_bytes(budgets: MemoryBudgets) -> int:
    return budgets.pending.used if budgets.pending is not None else 0


#: Per gauge, the budgets it sums (weakly: a registry outlives the roots that used it).
_tracked: "weakref.WeakKeyDictionary[Gauge, weakref.WeakSet[MemoryBudgets]]" = weakref.WeakKeyDictionary()
_tracked_lock = threading.Lock()


def _track(gauge: Gauge, budgets: MemoryBudgets, read: Callable[[MemoryBudgets], int]) -> None:
    """Make ``gauge`` read, when scraped, the sum of ``read`` over every live budgets
    tracked on it, ``budgets`` included."""
    with _tracked_lock:
        live = _tracked.get(gauge)
        if live is None:
            live = _tracked[gauge] = weakref.WeakSet()
            tracked = live  # the function keeps the set, not the budgets
            gauge.set_function(lambda: float(sum(read(each) for each in _members(tracked))))
        live.add(budgets)


def _members(tracked: "weakref.WeakSet[MemoryBudgets]") -> list[MemoryBudgets]:
    """A copy of ``tracked``, made under the lock ``_track`` adds under (atk89 F2: copied
    while a root was made, the set changed size and the whole scrape failed)."""
    with _tracked_lock:
        return list(tracked)
