"""Exponential back-off between retries: the one place its arithmetic lives.

Used by the uploader's pass and drain loops, the assignment watcher and the broker
HTTP client. Each caller
keeps its own loop (what is retried, what counts as an attempt, when to give up differ:
a storage error's ``retryable`` flag, a conflict budget, a drain deadline, a stop event),
so a retry library's decorator would hide those rules rather than share them; what they
share is the delay sequence, which is kept here. The etcd client's endpoint failover is
not a back-off (it moves to the next endpoint at once) and does not use this.
"""
from __future__ import annotations


class Backoff:
    """Delays ``first_s``, ``2 * first_s``, ``4 * first_s`` ... capped at ``max_s``."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self.max_s = max_s
        self._next_s = first_s

    def next_s(self, remaining_s: float | None = None) -> float:
        """The delay to wait now (at most ``remaining_s`` when given); doubles the next."""
        delay_s = self._next_s if remaining_s is None else min(self._next_s, remaining_s)
        self._next_s = min(self._next_s * 2, self.max_s)
        return delay_s
