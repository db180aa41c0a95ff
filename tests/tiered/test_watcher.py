"""Assignment watcher: load on PUT, seal on DELETE, lease registration, operator move."""
from __future__ import annotations

import time

import pytest

from tiered.metadata import keys
from tiered.metadata.keys import registered_key
from tiered.lifecycle.watcher import AssignmentWatcher, NotAssigned, assign, request_unload, wait_sealed

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    TOPIC,
    Cluster,
    any_cluster,
    local_cluster,
    produce_range,
    read_all,
)


def _wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _hosted(host, topic: str = TOPIC) -> bool:
    return any(str(t.topic) == topic for t in host.topics())


def test_operator_move_through_watchers(any_cluster: Cluster) -> None:
    """The seed's Step 1/2 path: unload marker + assignment delete → A seals → assign B."""
    md = any_cluster.metadata
    a, b = any_cluster.broker("A"), any_cluster.broker("B")
    watch_a, watch_b = AssignmentWatcher(a).start(), AssignmentWatcher(b).start()
    try:
        assert md.get(registered_key("A")).lease_id != 0  # registered under a lease
        assign(md, TOPIC, "A")
        _wait_until(lambda: _hosted(a))
        produce_range(a.topic(TOPIC), 0, 21)

        request_unload(md, TOPIC, "A", reason="unload")
        marker = keys.Unassigned.from_json("m", md.get(keys.unassigned_key(TOPIC)).value)
        assert (marker.reason, marker.from_broker) == ("unload", "A")
        assert wait_sealed(md, TOPIC, timeout_s=10.0) == 21
        _wait_until(lambda: not _hosted(a))

        assign(md, TOPIC, "B")
        _wait_until(lambda: _hosted(b))
        assert md.get(keys.unassigned_key(TOPIC)) is None
        hosted = b.topic(TOPIC)
        assert hosted.next_offset == 22
        assert [m.offset for m in read_all(hosted, 0, 21)] == list(range(22))
        assert watch_a.errors == [] and watch_b.errors == []
    finally:
        watch_a.stop()
        watch_b.stop()


def test_assignment_before_the_old_owner_sealed_waits_for_the_seal(local_cluster: Cluster) -> None:
    """Assigning B right after deleting A's assignment must not race A's seal: B retries
    while A (alive) still holds the topic, and continues exactly after A's seal."""
    md = local_cluster.metadata
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    watch_a, watch_b = AssignmentWatcher(a).start(), AssignmentWatcher(b).start()
    try:
        assign(md, TOPIC, "A")
        _wait_until(lambda: _hosted(a))
        produce_range(a.topic(TOPIC), 0, 9)
        request_unload(md, TOPIC, "A")
        assign(md, TOPIC, "B")  # no wait_sealed on purpose
        _wait_until(lambda: _hosted(b))
        assert b.topic(TOPIC).next_offset == 10
    finally:
        watch_a.stop()
        watch_b.stop()


def test_existing_assignments_load_at_start_and_stop_deregisters(local_cluster: Cluster) -> None:
    md = local_cluster.metadata
    assign(md, "/default/t1", "A")
    assign(md, "/default/t2", "A")
    a = local_cluster.broker("A")
    watcher = AssignmentWatcher(a).start()
    try:
        _wait_until(lambda: _hosted(a, "/default/t1") and _hosted(a, "/default/t2"))
    finally:
        watcher.stop()
    a.close()
    assert md.get(registered_key("A")) is None


def test_request_unload_refuses_a_topic_not_assigned_there(local_cluster: Cluster) -> None:
    with pytest.raises(NotAssigned):
        request_unload(local_cluster.metadata, TOPIC, "A")
    assert local_cluster.metadata.get(keys.unassigned_key(TOPIC)) is None
