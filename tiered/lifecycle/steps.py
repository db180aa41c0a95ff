"""How the load and unload sequences run their steps: each step is named, a failure
becomes the sequence's error naming that step (cause kept), and cleanup after a
failure never hides the failure."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tiered.lifecycle.errors import LifecycleError
from wal.topics import TopicName

log = logging.getLogger(__name__)

T = TypeVar("T")


def run_step(topic: TopicName, step: str, error: type[LifecycleError], fn: Callable[[], T]) -> T:
    """Run one named step; failures become ``error`` naming the step, cause kept."""
    try:
        return fn()
    except LifecycleError:
        raise
    except Exception as e:
        raise error(topic, step, f"{type(e).__name__}: {e}") from e


def undo(actions: list[Callable[[], object]]) -> None:
    for action in reversed(actions):
        quietly(action)


def quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - cleanup after a failure must not mask it
        log.warning("cleanup step failed: %s", e)


def true_if_unsure(fn: Callable[[], bool]) -> bool:
    """``fn()``, or True when it fails: callers ask "is there anything?" and an error
    must count as "maybe" (the answer that never releases or deletes)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - see docstring
        return True
