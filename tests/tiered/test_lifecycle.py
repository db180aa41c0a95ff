"""BrokerHost / HostedTopic / ownership on a single broker: acks, async use, epochs."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tiered.lifecycle import LoadError, TopicNotHosted, TopicState, TopicUnloading
from tiered.metadata import keys
from tiered.lifecycle.ownership import (
    BrokerSession,
    OwnerRecord,
    OwnershipLostError,
    TopicOwnedElsewhere,
    acquire,
    read_owner,
    release,
)
from tiered.lifecycle.restore import read_progress, read_sealed_state
from tiered.metadata.keys import progress_key
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import TOPIC, Cluster, local_cluster, produce_range  # noqa: F401

T = TopicName.parse(TOPIC)


# -- ownership ---------------------------------------------------------------------


def test_epochs_grow_across_release_and_a_released_record_fences_the_old_holder(local_cluster: Cluster) -> None:
    md = local_cluster.metadata
    first = acquire(md, T, "A")
    release(md, first)
    record, _ = read_owner(md, T)
    assert record.holder is None and record.epoch == 1  # released, epoch kept
    second = acquire(md, T, "B")
    assert second.epoch == 2 and second.previous.broker_id == "A"
    with pytest.raises(OwnershipLostError):
        release(md, first)  # the stale token changes nothing
    assert read_owner(md, T)[0].holder == "B"
    # The record stays readable as keys.Ownership for other tools.
    assert keys.Ownership.from_json("k", second.held_bytes).epoch == 2


def test_live_holder_is_not_taken_over_but_a_dead_one_is(local_cluster: Cluster) -> None:
    md = local_cluster.metadata
    session = BrokerSession(md, "A", ttl_s=5.0).start()
    acquire(md, T, "A")
    with pytest.raises(TopicOwnedElsewhere) as error:
        acquire(md, T, "B")
    assert error.value.holder == "A"
    session.stop(revoke=True)  # A's lease ends: it is dead to the cluster
    assert acquire(md, T, "B").epoch == 2


def test_owner_record_round_trip() -> None:
    record = OwnerRecord("A", 3, 1.5, None, "B")
    assert OwnerRecord.decode("k", record.encode()) == record


# -- acks and appends --------------------------------------------------------------


def test_archived_ack_waits_for_a_committed_object_and_triggers_an_early_upload(local_cluster: Cluster) -> None:
    hosted = local_cluster.broker("A").load(TOPIC)  # uploader interval: one hour
    started = time.monotonic()
    offset = hosted.produce(b"x", ack="archived", timeout_s=10.0)
    assert time.monotonic() - started < 5.0, "archived ack waited for the upload interval"
    assert hosted.uploader.committed_through >= offset
    durable = hosted.produce(b"y")  # default ack: durable, not archived
    assert hosted.wal.durable_offset >= durable
    assert hosted.uploader.committed_through < durable


def test_bad_ack_level_is_rejected(local_cluster: Cluster) -> None:
    hosted = local_cluster.broker("A").load(TOPIC)
    with pytest.raises(ValueError):
        hosted.produce(b"x", ack="none")  # type: ignore[arg-type]


def test_unload_refuses_appends_and_unknown_topics(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A")
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 2)
    assert host.unload(TOPIC) == 2
    assert hosted.state is TopicState.CLOSED
    with pytest.raises(TopicUnloading):
        hosted.produce(b"late")
    with pytest.raises(TopicNotHosted):
        host.topic(TOPIC)
    with pytest.raises(TopicNotHosted):
        host.unload(TOPIC)


def test_load_is_idempotent_and_concurrent_produces_get_unique_contiguous_offsets(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A")
    hosted = host.load(TOPIC)
    assert host.load(TOPIC) is hosted
    offsets: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(50):
            offset = hosted.produce(b"p")
            with lock:
                offsets.append(offset)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30.0)
    assert sorted(offsets) == list(range(200))
    assert host.unload(TOPIC) == 199


def test_asyncio_broker_never_blocks_its_loop(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A")

    async def main() -> tuple[list[int], float]:
        ticks: list[float] = []
        stop = asyncio.Event()

        async def heartbeat() -> None:
            while not stop.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.005)

        beat = asyncio.create_task(heartbeat())
        hosted = await host.load_async(TOPIC)
        offsets = await asyncio.gather(*(hosted.produce_async(b"m%d" % i) for i in range(20)))
        offsets.append(await hosted.produce_async(b"last", ack="archived", timeout_s=10.0))
        await host.unload_async(TOPIC)
        stop.set()
        await beat
        gaps = [b - a for a, b in zip(ticks, ticks[1:])]
        return sorted(offsets), max(gaps)

    offsets, worst_gap_s = asyncio.run(main())
    assert offsets == list(range(21))
    assert worst_gap_s < 0.25, f"event loop stalled for {worst_gap_s:.3f}s"


# -- progress, load failures -------------------------------------------------------


def test_durable_tip_is_published_fenced_and_cleared_by_the_seal(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A")
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 4)
    deadline = time.monotonic() + 5.0
    while (read_progress(local_cluster.metadata, T) or None) is None or read_progress(local_cluster.metadata, T).durable_offset != 4:
        assert time.monotonic() < deadline, "progress never published"
        time.sleep(0.02)
    assert read_progress(local_cluster.metadata, T).epoch == hosted.token.epoch
    host.unload(TOPIC)
    assert local_cluster.metadata.get(progress_key(T)) is None


def test_failed_load_releases_ownership_so_another_broker_can_load(local_cluster: Cluster, monkeypatch) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(a, "_start_uploader", broken)
    with pytest.raises(LoadError) as error:
        a.load(TOPIC)
    assert error.value.step == "start uploader" and isinstance(error.value.__cause__, OSError)
    assert a.topics() == []
    assert b.load(TOPIC).next_offset == 0
    assert not read_sealed_state(local_cluster.metadata, T).sealed  # B marked it open


def test_acks_made_while_the_seal_drains_reach_the_stored_cursor(local_cluster: Cluster) -> None:
    """Cursors were flushed before the drain, and the subscriptions closed without a
    flush after the seal: an ack made during the drain (the long step) was silently
    dropped, so the next owner re-served messages the consumer had acknowledged."""
    from dataclasses import replace

    from tests.tiered.helpers_lifecycle import FAST_UPLOADER

    holder: dict = {}

    def hook(step: str) -> None:
        sub = holder.pop("sub", None)
        if step == "before_commit" and sub is not None:
            sub.ack(9)  # the consumer keeps acking while the broker seals
        elif sub is not None:
            holder["sub"] = sub

    a = local_cluster.broker("A", uploader=replace(FAST_UPLOADER, fault_hook=hook))
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 9)
    sub = hosted.subscribe("s", initial="earliest")
    sub.ack(4)
    holder["sub"] = sub
    assert a.unload(TOPIC) == 9
    assert "sub" not in holder, "the hook never ran"
    cursor_kv = local_cluster.metadata.get(keys.cursor_key(T, "s"))
    assert keys.Cursor.from_json(cursor_kv.key, cursor_kv.value).last_acked_offset == 9
    b = local_cluster.broker("B")
    assert b.load(TOPIC).subscribe("s").start_offset == 10


def test_a_descriptor_planted_before_a_new_topics_first_upload_is_never_taken_as_archived(
        local_cluster: Cluster) -> None:
    """The load's restore found no descriptor (a new topic: nothing to seed the uploader
    with). A descriptor that appears before its first upload, made to look like this
    owner's (its broker and epoch, no object), was not committed by it: archiving stops
    with a typed error instead of acknowledging ``archived`` for offsets in no object
    (atk31 F2: the unseeded uploader took its first read of the chain on trust)."""
    import time as _time

    from uploader import ForeignDescriptor, UploaderStopped
    from uploader.records import ObjectDescriptor, encode_descriptor

    hosted = local_cluster.broker("A").load(TOPIC)
    assert hosted.uploader.committed_through is None
    produce_range(hosted, 0, 9)  # durable only
    epoch = hosted.token.epoch
    forged = ObjectDescriptor(0, 9, f"data-0-9-e{epoch}", 100, "x", _time.time(), "A", epoch, 0, "00000000")
    local_cluster.metadata.put(keys.descriptor_key(TOPIC, 0), encode_descriptor(forged))
    with pytest.raises(UploaderStopped) as info:
        hosted.produce(b"m10", ack="archived", timeout_s=30)
    assert isinstance(info.value.__cause__, ForeignDescriptor)
    assert hosted.wal.first_offset == 0 and hosted.wal.durable_offset == 10, "the WAL keeps every durable message"
