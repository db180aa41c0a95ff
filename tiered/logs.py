"""Logging for retry loops: state transitions once, repeats rate-limited, causes kept.

A loop that retries against an unavailable store (etcd down, a bucket missing) would
log every attempt: a 12 s outage gave over a hundred WARNING lines for one topic.
:class:`FailureLog` tracks one activity (one topic's uploads, one broker's assignment
watch, ...) and logs

- the first failure (the transition "working" -> "failing"), with its cause chain;
- repeats at most once per ``interval_s``, saying how many were suppressed since the
  line before ("(N similar suppressed)");
- the recovery (the transition "failing" -> "working") once, at the level the failure
  was logged at (so whoever saw the failure sees the recovery), with how many failures
  and how long the outage lasted.

Thread-safe; the clock is injectable for tests.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

#: Default minimum seconds between two lines about the same failing activity.
REPEAT_INTERVAL_S = 30.0


def describe(error: BaseException) -> str:
    """``Type: message`` of ``error`` followed by its causes (``raise ... from``, or the
    exception being handled when it was raised), innermost last."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(parts) < 5:
        seen.add(id(current))
        text = str(current)
        parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return " <- caused by ".join(parts)


class FailureLog:
    """Logs one activity's failures and its recovery without flooding (module docstring)."""

    def __init__(self, logger: logging.Logger, what: str, interval_s: float = REPEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``what`` names the activity in every line (e.g. ``"topic /ns/t: upload"``)."""
        self.logger = logger
        self.what = what
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0  # since the activity last worked
        self._suppressed = 0  # since the last line
        self._since_s = 0.0  # when the activity started failing
        self._last_line_s = 0.0
        self._level = logging.WARNING  # of the first failure line

    @property
    def failing(self) -> bool:
        return self._failures > 0

    def failed(self, error: BaseException, doing: str = "failed", level: int = logging.WARNING,
               exc_info: bool = False) -> None:
        """One failed attempt: logged if it is the first, or ``interval_s`` has passed
        since the last line; counted as suppressed otherwise. ``exc_info`` adds the
        traceback of ``error`` to the first line (for unexpected errors)."""
        now = self._clock()
        with self._lock:
            self._failures += 1
            first = self._failures == 1
            if first:
                self._since_s, self._level = now, level
            elif now - self._last_line_s < self.interval_s:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._last_line_s = now
            failures, since_s = self._failures, self._since_s
        if first:
            self.logger.log(level, "%s %s: %s", self.what, doing, describe(error),
                            exc_info=error if exc_info else None)
        else:
            self.logger.log(level, "%s still failing (%d failures in %.1fs, %d similar suppressed): %s",
                            self.what, failures, now - since_s, suppressed, describe(error))

    def succeeded(self) -> None:
        """The activity worked: logs the recovery once if it was failing."""
        with self._lock:
            failures, self._failures, self._suppressed = self._failures, 0, 0
            since_s, level = self._since_s, self._level
        if failures:
            self.logger.log(level, "%s recovered after %d failure(s) over %.1fs", self.what, failures,
                             self._clock() - since_s)
