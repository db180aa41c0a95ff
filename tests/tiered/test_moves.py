"""Topic moves between brokers: the seed's scenario and the ways a move can go wrong.

Every test here would fail on one of the known ways a move goes wrong: offsets restarting after a move, an empty topic continuing at 1, a seal
written before the uploader finished, or a stale owner still writing.
"""
from __future__ import annotations

import os
import threading
import time

import pytest

from tiered.lifecycle import TopicState
from tiered.metadata import keys
from tiered.read.messages import TIER_CLOUD, TIER_WAL
from tiered.lifecycle.ownership import OwnershipConflict, OwnershipError, OwnershipLostError, TopicOwnedElsewhere
from tiered.lifecycle.restore import read_sealed_state
from tiered.archive import list_descriptors
from uploader.config import UploaderConfig
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    FAST_BROKER,
    TOPIC,
    Cluster,
    any_cluster,
    local_cluster,
    payload_for,
    produce_range,
    read_all,
    wal_files,
)


def test_seed_scenario(any_cluster: Cluster) -> None:
    """../shared/seeds/002: 0-21 on A, cursor 13, move, 22-27 on B, resume at 14."""
    a, b = any_cluster.broker("A"), any_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 21)
    assert topic_a.uploader.upload_once() == 21
    assert [(d.start_offset, d.end_offset) for d in list_descriptors(any_cluster.metadata, TOPIC)] == [(0, 21)]

    sub = topic_a.subscribe("subs_reliable", initial="earliest")
    with topic_a.create_reader(sub.cursor + 1, live=False) as reader:
        for message in reader:
            if message.offset > 13:
                break
            sub.ack(message.offset)
    assert sub.cursor == 13

    assert a.unload(TOPIC) == 21
    state = read_sealed_state(any_cluster.metadata, TopicName.parse(TOPIC))
    assert state is not None and state.sealed and state.last_committed_offset == 21 and state.broker_id == "A"
    assert wal_files(any_cluster, "A") == []
    cursor = keys.Cursor.from_json("c", any_cluster.metadata.get(keys.cursor_key(TOPIC, "subs_reliable")).value)
    assert cursor.last_acked_offset == 13

    topic_b = b.load(TOPIC)
    assert topic_b.next_offset == 22
    assert topic_b.uploader.committed_through == 21
    produce_range(topic_b, 22, 27)

    sub_b = topic_b.subscribe("subs_reliable")
    assert sub_b.cursor == 13
    with topic_b.create_reader(sub_b.cursor + 1, live=False) as reader:
        got = [(m.offset, m.tier, m.payload) for m in reader]
    assert [o for o, _, _ in got] == list(range(14, 28))
    assert {t for o, t, _ in got if o <= 21} == {TIER_CLOUD}
    assert {t for o, t, _ in got if o >= 22} == {TIER_WAL}
    assert all(p == payload_for(o) for o, _, p in got)
    for offset, _, _ in got:
        sub_b.ack(offset)
    topic_b.subscriptions.flush_all()
    cursor = keys.Cursor.from_json("c", any_cluster.metadata.get(keys.cursor_key(TOPIC, "subs_reliable")).value)
    assert cursor.last_acked_offset == 27
    # B's upload continues the chain without re-uploading 0-21.
    assert topic_b.uploader.upload_once() == 27
    assert [(d.start_offset, d.end_offset) for d in list_descriptors(any_cluster.metadata, TOPIC)] == [(0, 21), (22, 27)]


def test_empty_topic_moves_and_next_owner_starts_at_zero(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    a.load(TOPIC)
    assert a.unload(TOPIC) is None
    state = read_sealed_state(local_cluster.metadata, TopicName.parse(TOPIC))
    assert state.sealed and state.last_committed_offset is None
    hosted = b.load(TOPIC)
    assert hosted.next_offset == 0  # an empty topic continues at 0, not 1
    assert hosted.produce(b"first") == 0


def test_topic_moved_three_times_and_readers_from_every_offset(local_cluster: Cluster) -> None:
    brokers = [local_cluster.broker(b) for b in ("A", "B", "C", "A2")]
    next_offset = 0
    for i, host in enumerate(brokers):
        hosted = host.load(TOPIC)
        assert hosted.next_offset == next_offset
        produce_range(hosted, next_offset, next_offset + 4 + i)
        next_offset += 5 + i
        if host is not brokers[-1]:
            assert host.unload(TOPIC) == next_offset - 1
    last = brokers[-1].topic(TOPIC)
    descriptors = list_descriptors(local_cluster.metadata, TOPIC)
    assert [d.broker_id for d in descriptors] == ["A", "B", "C"]
    assert all(d.start_offset == p.end_offset + 1 for p, d in zip(descriptors, descriptors[1:]))
    for start in range(next_offset):
        offsets = [m.offset for m in read_all(last, start, next_offset)]
        assert offsets == list(range(start, next_offset)), f"reader from {start}"


def test_move_while_a_consumer_is_live_tailing(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4)
    seen: list[int] = []
    ended = threading.Event()

    def tail() -> None:
        try:
            with topic_a.create_reader(0, live=True) as reader:
                for message in reader:
                    seen.append(message.offset)
        except Exception:  # noqa: BLE001 - the WAL closing under a live reader ends it
            pass
        finally:
            ended.set()

    thread = threading.Thread(target=tail, daemon=True)
    thread.start()
    produce_range(topic_a, 5, 9)
    _wait_for(lambda: len(seen) >= 10, 5.0)
    assert a.unload(TOPIC) == 9
    assert ended.wait(10.0), "live reader did not end when its topic was unloaded"
    assert seen == list(range(10))
    # The consumer reconnects to B at its position and sees the rest exactly once.
    topic_b = b.load(TOPIC)
    produce_range(topic_b, 10, 14)
    resumed = [m.offset for m in read_all(topic_b, seen[-1] + 1, 14)]
    assert seen + resumed == list(range(15))


def test_move_while_the_uploader_is_mid_object(local_cluster: Cluster) -> None:
    in_put, release = threading.Event(), threading.Event()

    def hook(step: str) -> None:
        if step == "after_put" and not release.is_set():
            in_put.set()
            release.wait(5.0)

    config = UploaderConfig(interval_s=3600.0, drain_timeout_s=10.0, fault_hook=hook)
    a = local_cluster.broker("A", uploader=config)
    b = local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 9)
    background = threading.Thread(target=topic_a.uploader.upload_once, daemon=True)
    background.start()
    assert in_put.wait(5.0), "uploader never reached the object PUT"
    produce_range(topic_a, 10, 14)  # more data arrives while the object is in flight
    unloading = threading.Thread(target=lambda: result.append(a.unload(TOPIC)), daemon=True)
    result: list = []
    unloading.start()
    time.sleep(0.2)
    assert not result, "seal must wait for the in-flight object"
    release.set()
    unloading.join(10.0)
    background.join(10.0)
    assert result == [14]
    hosted = b.load(TOPIC)
    assert hosted.next_offset == 15
    assert [m.offset for m in read_all(hosted, 0, 14)] == list(range(15))


def test_two_brokers_racing_to_load_exactly_one_wins(any_cluster: Cluster) -> None:
    hosts = [any_cluster.broker(b) for b in ("A", "B", "C")]
    for round_ in range(5):
        topic = f"/default/race{round_}"
        barrier = threading.Barrier(len(hosts))
        outcomes: dict[str, object] = {}

        def load(host) -> None:
            barrier.wait(5.0)
            try:
                outcomes[host.broker_id] = host.load(topic)
            except OwnershipError as e:
                outcomes[host.broker_id] = e

        threads = [threading.Thread(target=load, args=(h,)) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10.0)
        winners = [k for k, v in outcomes.items() if not isinstance(v, Exception)]
        assert len(winners) == 1, outcomes
        losers = [v for v in outcomes.values() if isinstance(v, Exception)]
        assert all(isinstance(e, (OwnershipConflict, TopicOwnedElsewhere)) for e in losers)
        assert outcomes[winners[0]].token.epoch == 1


def test_stale_owner_cannot_write_descriptor_cursor_or_seal(local_cluster: Cluster) -> None:
    from tiered.read.errors import CursorFenced
    from uploader.errors import OwnershipLost

    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4)
    topic_a.uploader.upload_once()
    sub = topic_a.subscribe("s", initial="earliest")
    topic_a.produce(b"unarchived")  # durable on A only
    topic_b = b.load(TOPIC, force=True)  # operator override: A is alive but fenced now
    assert topic_b.next_offset == 5
    before = _snapshot(local_cluster.metadata)

    # A learns it is fenced from its first refused write (the uploader's commit here, or
    # its progress thread's write, whichever comes first; see test_fencing.py); from then
    # on it refuses appends, so it cannot acknowledge offsets that B now assigns.
    with pytest.raises(OwnershipLost):
        topic_a.uploader.upload_once()
    with pytest.raises(OwnershipLostError):
        topic_a.produce(b"after the takeover")
    sub.ack(3)
    with pytest.raises(CursorFenced):
        sub.flush()
    assert not local_cluster.metadata.txn(
        topic_a.token.fencing, [keys_put_state(topic_a)]).succeeded
    with pytest.raises(Exception) as unload_error:
        a.unload(TOPIC)
    assert getattr(unload_error.value, "step", None) in ("flush subscription cursors", "drain uploader")
    assert wal_files(local_cluster, "A"), "a failed unload must keep the WAL"
    after = _snapshot(local_cluster.metadata)
    assert after == before, "the fenced owner changed metadata"
    a.abandon(TOPIC)


def test_stale_owner_seal_is_refused_even_with_nothing_to_upload(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4)
    topic_a.uploader.upload_once()
    b.load(TOPIC, force=True)
    with pytest.raises(Exception) as error:
        a.unload(TOPIC)
    assert error.value.step == "write sealed state"
    state = read_sealed_state(local_cluster.metadata, topic_a.topic)
    assert not state.sealed and state.broker_id == "B"


@pytest.mark.parametrize("store", ["metadata", "objects"])
def test_store_down_during_unload_keeps_wal_and_retry_succeeds(tmp_path, store: str) -> None:
    from tiered.metadata.testing.faults import FaultyMetadataStore
    from tiered.objects.testing.faults import FaultyObjectStore

    from tests.tiered.helpers_lifecycle import local_stores

    metadata, objects = local_stores(str(tmp_path))
    metadata, objects = FaultyMetadataStore(metadata), FaultyObjectStore(objects)
    cluster = Cluster(str(tmp_path), metadata, objects)
    try:
        a, b = cluster.broker("A"), cluster.broker("B")
        hosted = a.load(TOPIC)
        produce_range(hosted, 0, 9)
        faults = metadata.faults if store == "metadata" else objects.faults
        faults.fail("txn" if store == "metadata" else "put")  # down until cleared
        with pytest.raises(Exception) as error:
            a.unload(TOPIC)
        assert error.value.step == "drain uploader"
        assert hosted.state is TopicState.UNLOADING and wal_files(cluster, "A")
        faults.clear()
        state = read_sealed_state(metadata, hosted.topic)
        assert state is not None and not state.sealed
        with pytest.raises(Exception):
            hosted.produce(b"refused while unloading")
        assert a.unload(TOPIC) == 9
        assert wal_files(cluster, "A") == []
        assert b.load(TOPIC).next_offset == 10
    finally:
        cluster.close()


def test_seal_txn_that_landed_but_timed_out_is_recognised_on_retry(tmp_path) -> None:
    from tiered.errors import OperationTimeout
    from tiered.metadata.testing.faults import FaultyMetadataStore

    from tests.tiered.helpers_lifecycle import local_stores

    metadata, objects = local_stores(str(tmp_path))
    metadata = FaultyMetadataStore(metadata)
    cluster = Cluster(str(tmp_path), metadata, objects)
    try:
        a = cluster.broker("A")
        hosted = a.load(TOPIC)
        produce_range(hosted, 0, 3)
        hosted.uploader.upload_once()
        metadata.faults.fail("txn", nth=1, error=OperationTimeout, when="after")
        assert a.unload(TOPIC) == 3  # the seal landed; its lost reply is not a fencing error
        assert read_sealed_state(metadata, hosted.topic).sealed
    finally:
        cluster.close()


def test_crash_failover_keeps_archived_acks_and_reports_unarchived_tail(any_cluster: Cluster, caplog) -> None:
    from prometheus_client import REGISTRY

    a, b = any_cluster.broker("A"), any_cluster.broker("B")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 9, ack="archived")
    produce_range(topic_a, 10, 14)  # durable only
    assert topic_a.publish_progress()
    with pytest.raises(TopicOwnedElsewhere):
        b.load(TOPIC)  # A is alive: no takeover
    # A dies: no seal, its WAL stays on its disk, its lease lapses.
    a.abandon(TOPIC)
    a.session.stop(revoke=True)
    with caplog.at_level("WARNING", logger="tiered.lifecycle"):
        topic_b = b.load(TOPIC)
    assert topic_b.next_offset == 10  # never reuse an archived offset; the tail 10-14 is gone
    assert topic_b.report.unarchived_at_least == 5
    assert "at least 5 offsets" in caplog.text
    assert REGISTRY.get_sample_value("dnb_failover_unarchived_offsets", {"topic": TOPIC}) == 5
    assert [m.payload for m in read_all(topic_b, 0, 9)] == [payload_for(i) for i in range(10)]
    assert topic_b.produce(b"after failover") == 10


def test_restart_recovers_own_unsealed_wal(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4)
    hosted.uploader.upload_once()
    produce_range(hosted, 5, 7)  # durable, not archived
    a.abandon(TOPIC)
    a.close()
    restarted = local_cluster.broker("A")
    hosted = restarted.load(TOPIC)
    assert hosted.report.recovered_local_wal and hosted.report.unarchived_at_least == 0
    assert hosted.next_offset == 8
    assert hosted.token.epoch == 2
    assert restarted.unload(TOPIC) == 7


def test_stale_local_wal_is_discarded_when_the_topic_moved_on(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    a.close(unload=False)  # A "dies": topics abandoned, lease revoked, its WAL root unlocked
    topic_b = b.load(TOPIC)
    produce_range(topic_b, 5, 9)
    assert b.unload(TOPIC) == 9
    assert wal_files(local_cluster, "A"), "A's stale WAL is still on disk before it comes back"
    a2 = local_cluster.broker("A")
    # Everything A's WAL held (0-4) is archived: deleted at start, nothing quarantined.
    assert [(r.first_offset, r.last_offset, r.lost_start, r.quarantine_path) for r in a2.retired] == [
        (0, 4, None, None)]
    assert not wal_files(local_cluster, "A")
    assert not os.path.exists(os.path.join(local_cluster.wal_root("A"), ".quarantine"))
    hosted = a2.load(TOPIC)
    assert not hosted.report.recovered_local_wal
    assert hosted.next_offset == 10
    assert [m.offset for m in read_all(hosted, 0, 9)] == list(range(10))


def test_sealed_state_disagreeing_with_descriptors_is_a_typed_error(local_cluster: Cluster) -> None:
    from tiered.lifecycle.restore import RestoreMismatch

    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4)
    assert a.unload(TOPIC) == 4
    bogus = keys.SealedState(True, 2, "A", time.time())
    local_cluster.metadata.put(keys.state_key(TOPIC), bogus.to_json())
    with pytest.raises(RestoreMismatch):
        b.load(TOPIC)
    assert b.topics() == []


# -- helpers -----------------------------------------------------------------------


def keys_put_state(hosted):
    from tiered.metadata.base import Put

    return Put(keys.state_key(hosted.topic), keys.SealedState(True, 99, "A", 0.0).to_json())


def _snapshot(metadata) -> dict[str, bytes]:
    return {kv.key: kv.value for kv in metadata.range("/") if "/progress" not in kv.key}


def _wait_for(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_wal_root_layout_assumption(local_cluster: Cluster) -> None:
    """The lifecycle finds a topic's local WAL at <root>/<ns>/<topic>."""
    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 0)
    assert os.path.isdir(os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic"))
