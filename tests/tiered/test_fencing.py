"""A broker that is, or may be, fenced never acknowledges a ``durable`` write.

Two ways a broker loses a topic while it still runs: its session lease lapses (it was
paused or cut off) and another broker fails the topic over, or an operator forces a
takeover. In both, the new owner numbers from the end of the archive, so every
acknowledgement the old owner gives afterwards names an offset that now belongs to a
different message.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from tiered.lifecycle import BrokerHost
from tiered.lifecycle import ProduceTimeout
from tiered.lifecycle.ownership import OwnershipLostError, is_broker_registered
from tiered.metadata.testing.faults import FaultyMetadataStore
from tiered.read.errors import CursorFenced

from tests.tiered.helpers_lifecycle import (  # noqa: F401
    FAST_BROKER,
    TOPIC,
    Cluster,
    local_cluster,
    local_stores,
    produce_range,
)

HANG_GUARD_S = 60.0  # bounds every wait below; never an expected duration


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"hang guard: {what}"
        time.sleep(0.02)


def test_an_owner_whose_lease_lapsed_stops_acknowledging_and_learns_it_was_fenced(tmp_path) -> None:
    inner, objects = local_stores(str(tmp_path))
    flaky = FaultyMetadataStore(inner)  # only broker A's view of the store misbehaves
    config = replace(FAST_BROKER, session_ttl_s=1.0)
    a = BrokerHost("A", str(tmp_path / "wal-A"), flaky, objects, config)
    b = BrokerHost("B", str(tmp_path / "wal-B"), inner, objects, config)
    try:
        topic_a = a.load(TOPIC)
        produce_range(topic_a, 0, 4, ack="archived")
        # A is cut off from the store (as if paused): its keep-alives fail and the lease
        # lapses on the server; B sees A gone and takes the topic over.
        flaky.faults.fail("refresh_lease")
        _wait_for(lambda: not is_broker_registered(inner, "A"), "A's registration to expire")
        topic_b = b.load(TOPIC)
        assert topic_b.token.epoch == topic_a.token.epoch + 1
        produce_range(topic_b, 5, 7)
        # A's lease is not certain any more: a durable write is not acknowledged.
        # (Or, if its progress thread's write reached the store first: refused as fenced.
        # Either way not acknowledged; which one comes first is a race, not the promise.)
        with pytest.raises((ProduceTimeout, OwnershipLostError)) as info:
            topic_a.produce(b"while cut off", timeout_s=0.5)
        if isinstance(info.value, ProduceTimeout):
            assert info.value.step == "confirm ownership"
        # A reaches the store again: its keep-alive finds the lease gone and registers a
        # new one; before acknowledging under it, A re-reads the owner record: fenced.
        flaky.faults.clear()
        with pytest.raises(OwnershipLostError):
            topic_a.produce(b"after coming back", timeout_s=HANG_GUARD_S)
        assert topic_a.fenced
        with pytest.raises(OwnershipLostError):
            topic_a.produce(b"and after that")
        assert topic_b.produce(b"B keeps going") == 8
    finally:
        a.close()
        b.close()
        inner.close()


def test_a_lease_that_lapsed_without_a_takeover_resumes_acknowledging(tmp_path) -> None:
    inner, objects = local_stores(str(tmp_path))
    flaky = FaultyMetadataStore(inner)
    a = BrokerHost("A", str(tmp_path / "wal-A"), flaky, objects, replace(FAST_BROKER, session_ttl_s=1.0))
    try:
        topic_a = a.load(TOPIC)
        produce_range(topic_a, 0, 2)
        flaky.faults.fail("refresh_lease")
        _wait_for(lambda: not is_broker_registered(inner, "A"), "A's registration to expire")
        flaky.faults.clear()
        # Nobody took the topic: the owner record is still A's, so A goes on.
        assert topic_a.produce(b"m3", timeout_s=HANG_GUARD_S) == 3
        assert not topic_a.fenced
    finally:
        a.close()
        inner.close()


def test_a_lease_that_lapses_while_the_topic_loads_is_rechecked_before_the_first_ack(tmp_path) -> None:
    """The session generation the first ack compares with is the one from before the
    acquire: a lease lost and replaced during the load (while another broker took the
    topic over) must not count as already checked."""
    inner, objects = local_stores(str(tmp_path))
    flaky = FaultyMetadataStore(inner)
    config = replace(FAST_BROKER, session_ttl_s=1.0)
    a = BrokerHost("A", str(tmp_path / "wal-A"), flaky, objects, config)
    b = BrokerHost("B", str(tmp_path / "wal-B"), inner, objects, config)
    opened = a._open_subscriptions
    taken: list = []

    def pause_then_continue(token, wal):
        # A stalls mid-load: its lease lapses, B takes the topic over, A's session comes
        # back with a new lease; then the load goes on.
        generation = a.session.generation
        flaky.faults.fail("refresh_lease")
        _wait_for(lambda: not is_broker_registered(inner, "A"), "A's registration to expire")
        taken.append(b.load(TOPIC))
        flaky.faults.clear()
        _wait_for(lambda: a.session.generation > generation, "A's session to register again")
        return opened(token, wal)

    a._open_subscriptions = pause_then_continue
    try:
        topic_a = a.load(TOPIC)
        assert taken and taken[0].token.epoch == topic_a.token.epoch + 1
        with pytest.raises(OwnershipLostError):
            topic_a.produce(b"after the takeover", timeout_s=HANG_GUARD_S)
        assert taken[0].produce(b"B's") == 0
    finally:
        a.close(unload=False)
        b.close()
        inner.close()


def test_a_refused_progress_write_fences_the_topic_at_once(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4)
    b.load(TOPIC, force=True)
    try:
        topic_a.produce(b"x")  # in the forced-takeover window: A may not have been told yet
    except OwnershipLostError:
        pass  # its progress thread's write was refused first: already fenced
    assert topic_a.publish_progress() is False
    assert topic_a.fenced
    with pytest.raises(OwnershipLostError):
        topic_a.produce(b"y")


def test_a_refused_cursor_write_fences_the_topic_at_once(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4)
    sub = topic_a.subscribe("s", initial="earliest")
    b.load(TOPIC, force=True)
    sub.ack(2)
    with pytest.raises(CursorFenced):
        sub.flush()
    with pytest.raises(OwnershipLostError):
        topic_a.produce(b"y")


def test_pending_durable_waiters_fail_when_the_topic_is_fenced(local_cluster: Cluster) -> None:
    """A waiter whose offset became durable after the fencing is not acknowledged."""
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    offset = topic_a.append(b"pending")  # appended, ack not yet given
    b.load(TOPIC, force=True)
    topic_a.fence("test: told by a refused write")
    with pytest.raises(OwnershipLostError):
        topic_a._wait_ack(offset, "durable", HANG_GUARD_S)


def test_an_archived_offset_is_still_acknowledged_after_fencing(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    offset = topic_a.produce(b"kept", ack="archived")
    b.load(TOPIC, force=True)
    topic_a.fence("test")
    topic_a._wait_ack(offset, "durable", HANG_GUARD_S)  # in a committed object: true and safe


def test_async_produce_refuses_too(local_cluster: Cluster) -> None:
    import asyncio

    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    b.load(TOPIC, force=True)
    topic_a.fence("test")

    async def main() -> None:
        with pytest.raises(OwnershipLostError):
            await topic_a.produce_async(b"z")

    asyncio.run(main())


def test_a_second_live_process_with_the_same_broker_id_is_refused(tmp_path) -> None:
    """Both would pass acquire's "restart by the same broker" rule and number one topic
    twice; the registration is create-if-absent, so the second one is refused."""
    from tiered.lifecycle.ownership import BrokerIdInUse

    inner, objects = local_stores(str(tmp_path))
    config = replace(FAST_BROKER, session_ttl_s=1.0)
    first = BrokerHost("A", str(tmp_path / "disk-1"), inner, objects, config)
    try:
        with pytest.raises(BrokerIdInUse):
            BrokerHost("A", str(tmp_path / "disk-2"), inner, objects, config)
        # The refused start left its own WAL root usable (nothing locked, nothing held).
        first.session.stop(revoke=False)  # the first process "crashes": its lease lapses
        second = BrokerHost("A", str(tmp_path / "disk-2"), inner, objects, config)
        second.close()
    finally:
        first.close()
        inner.close()


def test_a_lease_replaced_between_the_fast_paths_two_reads_is_not_taken_for_the_checked_one(tmp_path) -> None:
    """The ack fast path reads the lease and the session generation without a lock. The
    keep-alive thread may replace a lapsed lease (a new generation and a long lease at
    once) between those two reads; the fast path must then not pair the old, checked
    generation with the new lease, or a broker whose topic was taken over acknowledges
    an offset the new owner already gave to another message."""
    inner, objects = local_stores(str(tmp_path))
    flaky = FaultyMetadataStore(inner)
    config = replace(FAST_BROKER, session_ttl_s=1.0)
    a = BrokerHost("A", str(tmp_path / "wal-A"), flaky, objects, config)
    b = BrokerHost("B", str(tmp_path / "wal-B"), inner, objects, config)
    try:
        topic_a = a.load(TOPIC)
        produce_range(topic_a, 0, 2)
        flaky.faults.fail("refresh_lease")  # A is cut off: its lease lapses, B takes over
        _wait_for(lambda: not is_broker_registered(inner, "A"), "A's registration to expire")
        topic_b = b.load(TOPIC)
        produce_range(topic_b, 0, 1)  # nothing was archived: B numbers from 0 again
        session = a.session
        assert session is not None and session.remaining_s() <= config.ack_margin_s
        # The keep-alive thread's re-registration, run at the one instant between the two
        # reads: inside the first of them, whichever that is.
        real_remaining, replaced = session.remaining_s, []

        def remaining_s() -> float:
            if not replaced:
                replaced.append(True)
                session._register()
            return real_remaining()

        session.remaining_s = remaining_s  # type: ignore[method-assign]
        assert not topic_a._ownership_certain()
        # And end to end: A's next durable write is refused, never acknowledged.
        with pytest.raises(OwnershipLostError):
            topic_a.produce(b"stale", timeout_s=HANG_GUARD_S)
        assert topic_a.fenced
    finally:
        flaky.faults.clear()
        a.close(unload=False)
        b.close()
        inner.close()


def test_loading_again_on_a_host_whose_copy_was_taken_over_does_not_hand_that_copy_out(
        local_cluster: Cluster) -> None:
    """A load of a topic already hosted re-reads the owner record: the copy another broker
    took over (here by force, the old owner still running and not told yet) is fenced
    and abandoned, never returned as loaded (a caller would serve reads from it)."""
    from tiered.lifecycle.ownership import TopicOwnedElsewhere

    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4, ack="archived")
    topic_b = b.load(TOPIC, force=True)
    with pytest.raises(TopicOwnedElsewhere):
        a.load(TOPIC)  # B is live: A may not take it back
    assert topic_a.fenced and TOPIC not in [str(h.topic) for h in a.topics()]
    with pytest.raises(OwnershipLostError):
        topic_a.produce(b"stale")
    assert topic_b.produce(b"B's") == 5
