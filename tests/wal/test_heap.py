"""wal.heap.HeapFreezer: what a load freezes stays out of the collector's walks, frozen
garbage cycles are reclaimed by the next refreeze, and the process's last freezer leaves
the collector as it found it."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from tests.tiered.helpers_lifecycle import Cluster, local_cluster  # noqa: F401
from wal import heap
from wal.heap import HeapFreezer


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Node:
    """A reference cycle (its ``me`` points back at it) that refcounting cannot free."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    """Each test starts with nothing frozen and no open freezer (a host another test left
    open would otherwise keep the heap frozen), and must close every freezer it opens."""
    gc.unfreeze()
    others, heap._open = heap._open, 0
    thresholds = heap._thresholds_before, heap._thresholds_set
    heap._thresholds_before = heap._thresholds_set = None
    yield
    leaked, heap._open = heap._open, others
    heap._thresholds_before, heap._thresholds_set = thresholds
    gc.unfreeze()
    assert leaked == 0, "a freezer of this test was never closed"


def test_freeze_takes_what_is_alive_out_of_collections() -> None:
    registry = CollectorRegistry()
    freezer = HeapFreezer(metrics_registry=registry)
    try:
        alive = [[i] for i in range(10_000)]
        freezer.freeze()
        assert gc.get_freeze_count() >= len(alive)
        assert registry.get_sample_value("dnb_gc_frozen_objects") >= len(alive)
        tracked = set(map(id, gc.get_objects()))  # what collections walk
        assert not any(id(x) in tracked for x in alive[::100])
    finally:
        freezer.close()
    assert gc.get_freeze_count() == 0


def test_a_cycle_that_dies_frozen_is_reclaimed_by_the_next_refreeze_only_after_the_interval() -> None:
    clock = _Clock()
    freezer = HeapFreezer(refreeze_interval_s=60.0, clock=clock)
    try:
        node = _Node()
        dead = weakref.ref(node)
        freezer.freeze()
        del node
        gc.collect()
        assert dead() is not None, "frozen: a collection does not walk it"
        freezer.changed()
        clock.now += 59.0
        assert not freezer.maintain(), "refroze before the interval"
        assert dead() is not None
        clock.now += 1.0
        assert freezer.maintain()
        assert dead() is None, "the refreeze collected the dead cycle"
        assert not freezer.maintain(), "nothing changed since: no second pass"
        assert freezer.metrics.refreezes._value.get() == 1
    finally:
        freezer.close()


def test_refreeze_keeps_live_objects_frozen() -> None:
    clock = _Clock()
    freezer = HeapFreezer(refreeze_interval_s=1.0, clock=clock)
    try:
        alive = [[i] for i in range(5_000)]
        freezer.freeze()
        clock.now += 2.0
        assert freezer.maintain()
        assert gc.get_freeze_count() >= len(alive)
    finally:
        freezer.close()


def test_the_last_freezer_to_close_unfreezes_and_not_before() -> None:
    first, second = HeapFreezer(), HeapFreezer()
    first.freeze()
    first.close()
    second.freeze()
    assert gc.get_freeze_count() > 0, "another freezer is still open"
    second.close()
    second.close()  # idempotent: the count must not go negative
    assert gc.get_freeze_count() == 0
    assert heap._open == 0
    first.freeze()  # closed: does nothing
    assert gc.get_freeze_count() == 0


def test_young_collections_are_rarer_while_a_freezer_is_open_and_as_before_after() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        first, second = HeapFreezer(), HeapFreezer()
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 10, 10)
        first.close()
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 10, 10), "another freezer is still open"
        second.close()
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(0, 10, 10)  # a process that turned automatic collection off
        third = HeapFreezer()
        assert gc.get_threshold() == (0, 10, 10), "a freezer must not turn collection back on"
        third.close()
        assert gc.get_threshold() == (0, 10, 10)
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("own", [(0, 10, 10), (2000, 20, 20)])
def test_thresholds_the_process_sets_while_a_freezer_is_open_stand_after_it_closes(own: tuple[int, int, int]) -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        freezer = HeapFreezer()
        gc.set_threshold(*own)  # e.g. collection turned off, or tuned, by the embedding process
        freezer.close()
        assert gc.get_threshold() == own
    finally:
        gc.set_threshold(*before)


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        HeapFreezer(refreeze_interval_s=0)


def test_a_host_freezes_after_loads_and_unfreezes_when_it_closes(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A")
    try:
        assert host.heap is not None
        host.load("/default/frozen")
        assert gc.get_freeze_count() > 0, "a load freezes the heap"
        assert host.heap._changed
        host.unload("/default/frozen")
    finally:
        host.close()
    assert gc.get_freeze_count() == 0, "the host's close unfroze the heap"


def test_a_host_with_gc_freeze_off_leaves_the_collector_alone(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A", gc_freeze=False)
    try:
        assert host.heap is None
        host.load("/default/thawed")
        assert gc.get_freeze_count() == 0
    finally:
        host.close()


def test_a_finalizer_that_loads_during_the_refreeze_collection_does_not_deadlock() -> None:
    """The refreeze's collection runs finalizers on the refreezing thread; one that ends up
    freezing again (a load from a cleanup path) must not wait for the refreeze itself."""
    import threading

    clock = _Clock()
    freezer = HeapFreezer(refreeze_interval_s=1.0, clock=clock)
    ran = threading.Event()

    class Finalized:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            freezer.freeze()
            ran.set()

    try:
        Finalized()  # a dead cycle: only a collection finalizes it
        freezer.freeze()
        clock.now += 2.0
        worker = threading.Thread(target=freezer.maintain, daemon=True)
        worker.start()
        worker.join(30.0)
        assert not worker.is_alive(), "the refreeze deadlocked on its own finalizer"
        assert ran.is_set()
    finally:
        freezer.close()
