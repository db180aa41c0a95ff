"""The assignment watcher never leaves a seal half done (finding F4): an unload that
fails past ``retry_attempts_max`` (the object store down during the upload drain) is
retried until it lands, and a topic assigned back while its seal keeps failing is
sealed, then loaded again; every acknowledged message kept exactly once, offsets
contiguous. Waits are on state with generous bounds, never sleeps."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from tiered.lifecycle.watcher import AssignmentWatcher, WatcherConfig, assign, request_unload, wait_sealed
from tiered.objects.testing.faults import FaultyObjectStore
from tiered.tools.verify import verify_topic

from tests.tiered.helpers_lifecycle import (
    FAST_BROKER, FAST_UPLOADER, TOPIC, Cluster, payload_for, produce_range, read_all, stores_of)

WAIT_S = 30.0
WATCHER = WatcherConfig(retry_attempts_max=2, retry_backoff_s=0.01, retry_backoff_max_s=0.05,
                        unload_retry_max_s=0.2)


def _wait_until(predicate, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.02)
    return value


def _hosted(host, topic: str = TOPIC):
    return next((t for t in host.topics() if str(t.topic) == topic), None)


@pytest.fixture(params=["local", "etcd+s3"])
def faulty(request, tmp_path):
    metadata, objects = stores_of(request, request.param, str(tmp_path))
    objects = FaultyObjectStore(objects)
    cluster = Cluster(str(tmp_path), metadata, objects,
                      replace(FAST_BROKER, uploader=replace(FAST_UPLOADER, drain_timeout_s=0.3)))
    yield cluster
    objects.faults.clear()
    cluster.close()
    metadata.close()


def _unload_with_the_store_down(md, faults, a):
    """A hosts the topic with ten durable (not archived) messages; then its unload is
    requested while the object store refuses every put. Returns A's hosted topic."""
    assign(md, TOPIC, "A")
    _wait_until(lambda: _hosted(a), "A hosts the topic")
    faults.fail("put")
    hosted = a.topic(TOPIC)
    produce_range(hosted, 0, 9)  # durable acks, not archived
    request_unload(md, TOPIC, "A")
    return hosted


def test_an_unload_failing_past_its_attempts_is_retried_until_the_seal_lands(faulty: Cluster) -> None:
    md, faults = faulty.metadata, faulty.objects.faults
    a, b = faulty.broker("A"), faulty.broker("B")
    watch_a = AssignmentWatcher(a, WATCHER).start()
    try:
        _unload_with_the_store_down(md, faults, a)
        _wait_until(lambda: watch_a.errors, "the unload to fail past its bounded attempts")
        assert [(str(t), action) for t, action, _ in watch_a.errors] == [(TOPIC, "unload")]
        assert [str(t) for t in watch_a.unload_retrying()] == [TOPIC]
        faults.clear()
        assert wait_sealed(md, TOPIC, timeout_s=WAIT_S) == 9
        _wait_until(lambda: not _hosted(a) and not watch_a.unload_retrying(), "A to let go of the topic")
        hosted = b.load(TOPIC)
        assert hosted.next_offset == 10
        messages = read_all(hosted, 0, 9)
        assert [(m.offset, m.payload) for m in messages] == [(i, payload_for(i)) for i in range(10)]
    finally:
        watch_a.stop()


def test_a_topic_assigned_back_while_its_seal_keeps_failing_is_sealed_then_loaded_again(faulty: Cluster) -> None:
    md, faults = faulty.metadata, faulty.objects.faults
    a = faulty.broker("A")
    watch_a = AssignmentWatcher(a, WATCHER).start()
    try:
        first = _unload_with_the_store_down(md, faults, a)
        _wait_until(lambda: watch_a.errors, "the unload to fail past its bounded attempts")
        assign(md, TOPIC, "A")  # an operator gives it back while the store is still down
        # Its load cannot finish the seal either (the store is down) and gives up...
        _wait_until(lambda: any(action == "load" for _, action, _ in watch_a.errors), "the load to give up")
        faults.clear()
        # ... but the seal is still retried; once it lands the topic is loaded again here.
        hosted = _wait_until(lambda: (h := _hosted(a)) is not None and h is not first and h, "A to reload it")
        assert hosted.next_offset == 10
        assert produce_range(hosted, 10, 12) == [10, 11, 12]
        messages = read_all(hosted, 0, 12)
        assert [(m.offset, m.payload) for m in messages] == [(i, payload_for(i)) for i in range(13)]
        assert verify_topic(TOPIC, md, faulty.objects, check_objects=True).ok
        _wait_until(lambda: not watch_a.unload_retrying(), "the retries to end")
    finally:
        watch_a.stop()


def test_a_topic_fenced_while_its_unload_is_retried_is_abandoned_and_can_be_loaded_here_again(
        faulty: Cluster) -> None:
    """A's seal keeps failing; meanwhile B takes the topic over (a failover: forced, A's
    unarchived tail recorded as lost). A's retry meets the fence: A must drop its copy
    (no seal can land), not keep a half-sealed topic that refuses every later load here.
    Once B seals, A loads the topic again and serves B's messages once each."""
    md, faults = faulty.metadata, faulty.objects.faults
    a, b = faulty.broker("A"), faulty.broker("B")
    watch_a = AssignmentWatcher(a, WATCHER).start()
    try:
        _unload_with_the_store_down(md, faults, a)
        _wait_until(lambda: watch_a.unload_retrying(), "A to retry its failing unload")
        faults.clear()
        hosted_b = b.load(TOPIC, force=True)  # the takeover fences A's copy
        _wait_until(lambda: not _hosted(a) and not watch_a.unload_retrying(), "A to drop its fenced copy")
        first_b = hosted_b.next_offset
        b_offsets = [hosted_b.produce(f"from B {i}".encode(), ack="durable") for i in range(5)]
        assert b_offsets == list(range(first_b, first_b + 5))
        b.unload(TOPIC)
        hosted_a = a.load(TOPIC)
        assert not hosted_a.fenced and hosted_a.next_offset == first_b + 5
        messages = read_all(hosted_a, first_b, first_b + 4)  # B's messages, never A's stale copy
        assert [(m.offset, m.payload) for m in messages] == [(first_b + i, f"from B {i}".encode()) for i in range(5)]
        assert verify_topic(TOPIC, md, faulty.objects, check_objects=True).ok
    finally:
        watch_a.stop()


def test_loading_over_a_copy_fenced_by_a_newer_owner_drops_that_copy_first(faulty: Cluster) -> None:
    """``load`` never hands back a fenced copy as if it were loaded."""
    a, b = faulty.broker("A"), faulty.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4)
    hosted_b = b.load(TOPIC, force=True)
    assert topic_a.publish_progress() is False and topic_a.fenced
    produce_range(hosted_b, hosted_b.next_offset, hosted_b.next_offset + 2)
    end = hosted_b.next_offset
    b.unload(TOPIC)
    again = a.load(TOPIC)
    assert again is not topic_a and not again.fenced and again.next_offset == end
