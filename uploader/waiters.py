"""Producers waiting for an offset to be archived (the "archived" ack level).

Sync waiters block on a condition; async waiters hold a future resolved on their own
event loop. Both are woken whenever the committed offset advances, and fail with the
uploader's fatal error (or UploaderStopped) when it ends.
"""
from __future__ import annotations

import asyncio
import threading
import time

from uploader.errors import UploaderStopped


class ArchivedWaiters:
    def __init__(self, topic: str) -> None:
        self._topic = topic
        self._cond = threading.Condition()
        self._committed: int | None = None
        self._sync_waiting = 0
        self._futures: list[tuple[int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]] = []
        self._error: BaseException | None = None

    @property
    def pending(self) -> bool:
        with self._cond:
            return self._sync_waiting > 0 or bool(self._futures)

    def _archived(self, offset: int) -> bool:
        return self._committed is not None and self._committed >= offset

    def advance(self, committed_through: int | None) -> None:
        with self._cond:
            self._committed = committed_through
            self._cond.notify_all()
            ready = [w for w in self._futures if self._archived(w[0])]
            self._futures = [w for w in self._futures if not self._archived(w[0])]
        for _, loop, future in ready:
            loop.call_soon_threadsafe(_resolve, future, None)

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()
            waiting, self._futures = self._futures, []
        for _, loop, future in waiting:
            loop.call_soon_threadsafe(_resolve, future, error)

    def wait(self, offset: int, timeout_s: float) -> bool:
        """True once ``offset`` is archived; False after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._sync_waiting += 1
            try:
                while not self._archived(offset):
                    self._raise_if_failed()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
            finally:
                self._sync_waiting -= 1

    async def wait_async(self, offset: int, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._archived(offset):
                return True
            self._raise_if_failed()
            future: asyncio.Future[None] = loop.create_future()
            entry = (offset, loop, future)
            self._futures.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            with self._cond:
                if entry in self._futures:
                    self._futures.remove(entry)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            if isinstance(self._error, UploaderStopped):
                raise UploaderStopped(str(self._error))
            raise UploaderStopped(f"topic {self._topic}: uploader failed") from self._error


def _resolve(future: "asyncio.Future[None]", error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    elif isinstance(error, UploaderStopped):
        future.set_exception(UploaderStopped(str(error)))
    else:
        stopped = UploaderStopped("uploader failed")
        stopped.__cause__ = error
        future.set_exception(stopped)
