"""A metadata write that times out now and is applied later never moves a record back.

What a paused etcd member does: the client's request times out, the owner writes a
newer value through another member, and the paused member then applies the old
request. The fencing compare still holds (same owner), so only a compare on the
record's own revision keeps the old value from landing last.
"""
from __future__ import annotations

import time

import pytest

from tiered.errors import OperationTimeout
from tiered.lifecycle.ownership import acquire
from tiered.lifecycle.restore import read_progress
from tiered.metadata import keys
from tiered.metadata.testing.faults import FaultyMetadataStore
from tiered.metadata.sqlite import SqliteMetadataStore
from tiered.read.errors import CursorWriteFailed
from tiered.read.subscriptions import SubscriptionManager
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import TOPIC, local_stores

T = TopicName.parse(TOPIC)


@pytest.fixture
def store(tmp_path):
    inner = SqliteMetadataStore(str(tmp_path / "meta.db"))
    yield FaultyMetadataStore(inner)
    inner.close()


def _manager(store) -> SubscriptionManager:
    token = acquire(store, T, "A")
    return SubscriptionManager(T, store, fencing=token.fencing, flush_interval_s=3600,
                               earliest_offset=lambda: 0, next_offset=lambda: 10_000)


def _stored_cursor(store, name: str) -> int:
    kv = store.inner.get(keys.cursor_key(T, name))
    return keys.Cursor.from_json(kv.key, kv.value).last_acked_offset


def test_a_delayed_cursor_write_applied_after_a_newer_one_changes_nothing(store) -> None:
    manager = _manager(store)
    sub = manager.subscribe("billing", "earliest")
    sub.ack(8510)
    store.faults.delay_write("txn")
    with pytest.raises(CursorWriteFailed):
        sub.flush()
    sub.ack(8630)
    assert sub.flush()
    assert _stored_cursor(store, "billing") == 8630
    store.faults.apply_delayed()  # the paused member wakes up and applies 8510
    assert _stored_cursor(store, "billing") == 8630, "an acknowledged cursor moved backward"
    assert not sub.dirty
    manager.close()


def test_a_delayed_cursor_write_that_landed_first_is_re_read_not_assumed(store) -> None:
    manager = _manager(store)
    sub = manager.subscribe("billing", "earliest")
    sub.ack(10)
    store.faults.delay_write("txn")
    with pytest.raises(CursorWriteFailed):
        sub.flush()
    store.faults.apply_delayed()  # it landed after all, before the next write
    sub.ack(20)
    assert sub.flush()
    assert _stored_cursor(store, "billing") == 20
    manager.close()


def test_a_write_that_timed_out_is_written_again_at_close(store) -> None:
    manager = _manager(store)
    sub = manager.subscribe("billing", "earliest")
    sub.ack(42)
    store.faults.fail("txn", error=OperationTimeout, nth=1)
    with pytest.raises(CursorWriteFailed):
        sub.flush()
    assert sub.dirty  # not considered flushed: the final flush must write it
    manager.close(flush=True)
    assert _stored_cursor(store, "billing") == 42


def test_a_delayed_progress_write_never_lands_after_a_newer_one(tmp_path) -> None:
    from tiered.lifecycle import BrokerHost
    from tests.tiered.helpers_lifecycle import FAST_BROKER

    inner, objects = local_stores(str(tmp_path))
    store = FaultyMetadataStore(inner)
    host = BrokerHost("A", str(tmp_path / "wal"), store, objects, FAST_BROKER)
    try:
        hosted = host.load(TOPIC)
        hosted.produce(b"a")
        hosted.publish_progress()
        store.faults.delay_write("txn")
        hosted.produce(b"b")
        # The next progress write is held, whoever makes it: this call, or the host's own
        # progress thread (woken by the durable advance) if it gets there first.
        try:
            hosted.publish_progress()
        except OperationTimeout:
            pass
        deadline = time.monotonic() + 30.0
        while not store.faults.delayed:
            assert time.monotonic() < deadline, "no progress write was held"
            time.sleep(0.01)
        hosted.produce(b"c")
        assert hosted.publish_progress()
        assert read_progress(inner, T).durable_offset == 2
        store.faults.apply_delayed()
        assert read_progress(inner, T).durable_offset == 2
    finally:
        host.close()
        inner.close()
