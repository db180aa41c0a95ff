"""Tail readers: pull-based, each with its own position, fed only durable records.

A reader asks the WAL for records at its position: from the cache when it still holds
them, else from segment files. When it has caught up it waits (bounded, re-checking) for
the durable watermark to pass its position. Nothing is pushed to readers, so a slow
reader never overflows a channel: it simply reads older data from files later.

``for record in reader`` and ``async for record in reader`` both work; records are
``native.Record`` tuples (offset, publish_time, key, attributes, payload). A reader with
``live=False`` stops at the durable tip as it was when the reader was created.

A reader knows nothing of ``WriteAheadLog``: the log gives each reader the same
:class:`ReadHooks`, the calls a reader makes into the log's state.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from native.format import Record

_WAIT_SLICE_S = 0.25  # bound on one wait; the reader re-checks close() in between
_FOREVER = 1 << 64


class ReadHooks(NamedTuple):
    """The log's side of a reader; safe to call from any thread (the async one from a loop)."""

    #: ``(position, limit, max_bytes)``: decoded durable records from ``position`` up to
    #: ``limit`` (inclusive, clamped to the durable tip), about ``max_bytes`` of them, from
    #: the cache else the segment files; ``[]`` when none is durable yet. Raises
    #: ``OffsetBelowRetention`` for a position retention removed.
    read_records: Callable[[int, int, int], list[Record]]
    #: ``(position)``: the in-memory cache holds it (so reading it does no disk I/O).
    cache_covers: Callable[[int], bool]
    #: ``(offset, timeout_s, give_up)``: blocks until ``offset`` is durable (True), the
    #: timeout passes or ``give_up()`` is true on a wake-up (False); raises once the log
    #: is closed or failed.
    wait_durable: Callable[[int, float, Callable[[], bool]], bool]
    #: ``(offset, timeout_s)``: the same without blocking the event loop (no give_up).
    wait_durable_async: Callable[[int, float], Awaitable[bool]]
    #: Wakes every blocked ``wait_durable`` so it re-checks its ``give_up``.
    wake_waiters: Callable[[], None]


class WalReader:
    def __init__(self, hooks: ReadHooks, from_offset: int, stop_offset: int | None, batch_bytes: int) -> None:
        self._hooks = hooks
        self._position = from_offset  # next offset to fetch from the WAL
        self._stop_offset = _FOREVER if stop_offset is None else stop_offset
        self._buffer: deque[Record] = deque()
        self._batch_bytes = batch_bytes
        self.closed = False
        # The file read in flight for ``async for`` (a worker thread). An await cancelled
        # while it runs (``asyncio.wait_for`` polling) does not cancel the read: the next
        # ``__anext__`` waits for that same read instead of starting a second one at the
        # same position (which would queue its records twice).
        self._fill_task: asyncio.Future[bool] | None = None

    @property
    def consumed_offset(self) -> int:
        """The next offset this reader will hand out."""
        return self._position - len(self._buffer)

    def close(self) -> None:
        """Safe from any thread: a ``next()`` blocked waiting for new records returns at
        once (StopIteration), not at the end of its wait slice."""
        self.closed = True
        self._buffer.clear()
        self._hooks.wake_waiters()

    def __enter__(self) -> "WalReader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- sync
    def __iter__(self) -> "WalReader":
        return self

    def __next__(self) -> Record:
        if self._buffer:
            return self._buffer.popleft()
        while True:
            if self.closed or self._position > self._stop_offset:
                raise StopIteration
            if self._fill():
                return self._buffer.popleft()
            self._hooks.wait_durable(self._position, _WAIT_SLICE_S, lambda: self.closed)

    # ---------------------------------------------------------------- async
    def __aiter__(self) -> "WalReader":
        return self

    async def __anext__(self) -> Record:
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self.closed or self._position > self._stop_offset:
                raise StopAsyncIteration
            task = self._fill_task
            if task is not None and task.done():
                # A read whose await was cancelled, finished since: its records are in the
                # buffer (handed out above), or its error is raised now.
                self._fill_task = None
                task.result()
                continue
            # Cache hits decode in memory; file reads go to a thread so the loop never blocks on disk.
            if task is None and self._hooks.cache_covers(self._position):
                filled = self._fill()
            else:
                if task is None:
                    task = self._fill_task = asyncio.ensure_future(asyncio.to_thread(self._fill))
                try:
                    filled = await asyncio.shield(task)
                finally:
                    if task.done():
                        self._fill_task = None
            if filled:
                continue  # handed out from the buffer above
            await self._hooks.wait_durable_async(self._position, _WAIT_SLICE_S)

    # ---------------------------------------------------------------- shared
    def _fill(self) -> bool:
        records = self._hooks.read_records(self._position, self._stop_offset, self._batch_bytes)
        if not records:
            return False
        # Offsets reach a reader exactly once and in order: check it at the handoff.
        assert records[0].offset == self._position, (records[0].offset, self._position)
        assert records[-1].offset == self._position + len(records) - 1, "gap in records"
        self._buffer.extend(records)
        self._position = records[-1].offset + 1
        return True
