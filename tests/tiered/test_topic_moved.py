"""Readers end with TopicMoved (carrying where to resume) as soon as the topic leaves.

Once unload refuses appends, or the topic is abandoned or fenced, whatever a reader here
would still serve could not be acknowledged here (and after a fencing it may not even be
the topic's history). A consumer that resumes at ``TopicMoved.next_offset`` on the new
owner sees every offset once, in order.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tiered.read.errors import HistoryDiverged, TopicMoved
from wal.config import WalConfig

from tests.tiered.helpers_lifecycle import TOPIC, Cluster, local_cluster, produce_range  # noqa: F401

HANG_GUARD_S = 30.0


def test_a_live_reader_blocked_on_new_messages_ends_with_topic_moved_and_resumes_on_the_new_owner(
        local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 9)
    reader = hosted.create_reader(0, live=True)
    seen, ended = [], []

    def consume() -> None:
        try:
            for message in reader:
                seen.append(message.offset)
        except TopicMoved as e:
            ended.append(e)

    thread = threading.Thread(target=consume)
    thread.start()
    assert a.unload(TOPIC) == 9
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "the reader kept waiting after the topic left"
    [moved] = ended
    assert moved.next_offset == len(seen) and seen == list(range(len(seen)))
    topic_b = b.load(TOPIC)
    produce_range(topic_b, 10, 12)
    with topic_b.create_reader(moved.next_offset, live=False) as rest:
        assert seen + [m.offset for m in rest] == list(range(13))


def test_a_reader_created_while_unloading_or_after_abandon_says_moved(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 2)
    reader = hosted.create_reader(1, live=True)
    a.abandon(TOPIC)
    with pytest.raises(TopicMoved) as info:
        next(iter(reader))
    assert info.value.next_offset == 1


def test_a_fenced_topic_stops_serving_its_readers(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4)
    reader = hosted.create_reader(0, live=True)
    it = iter(reader)
    assert next(it).offset == 0
    b.load(TOPIC, force=True)  # nothing was archived: B numbers its own messages from 0
    hosted.check_ownership()
    with pytest.raises(TopicMoved) as info:
        next(it)
    # What A served from 0 on is not the topic's history any more: resume where B continues.
    assert isinstance(info.value, HistoryDiverged)
    assert (info.value.next_offset, info.value.served_until) == (0, 1)


def test_async_readers_end_the_same_way(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 2)

    async def main() -> TopicMoved:
        reader = hosted.create_reader(0, live=True)
        got = []

        async def consume() -> TopicMoved:
            try:
                async for message in reader:
                    got.append(message.offset)
            except TopicMoved as e:
                return e
            raise AssertionError("iteration ended without TopicMoved")

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.01)
        await a.unload_async(TOPIC)
        return await asyncio.wait_for(task, HANG_GUARD_S)

    moved = asyncio.run(main())
    assert moved.next_offset == 3


def test_a_fenced_owners_reader_resumes_where_the_new_owner_continues(local_cluster: Cluster) -> None:
    """A served its unarchived tail 5..9 to a live reader; B took over at 5 and numbers its
    own messages from there. Resuming at the reader's position (10) would skip B's 5..9:
    the reader says HistoryDiverged(next_offset=5), and from there it reads B's messages."""
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    produce_range(hosted, 5, 9)  # durable only: lost when B takes over
    reader = hosted.create_reader(0, live=True)
    it = iter(reader)
    assert [next(it).offset for _ in range(10)] == list(range(10))
    topic_b = b.load(TOPIC, force=True)
    assert topic_b.next_offset == 5
    new_messages = [topic_b.produce(b"from B %d" % i) for i in range(5)]
    hosted.check_ownership()
    with pytest.raises(HistoryDiverged) as info:
        next(it)
    assert (info.value.next_offset, info.value.served_until) == (5, 10)
    with topic_b.create_reader(info.value.next_offset, live=False) as rest:
        assert [(m.offset, bytes(m.payload)) for m in rest] == [(o, b"from B %d" % i)
                                                               for i, o in enumerate(new_messages)]


@pytest.mark.parametrize("prefetch_objects", [0, 1])
def test_a_reader_fetching_from_the_archive_when_the_topic_leaves_says_moved(
        local_cluster: Cluster, monkeypatch, prefetch_objects: int) -> None:
    """The unload closes the reader's archive fetch under it: the consumer is told where to
    resume (TopicMoved), not just that a reader was closed, and at once: while the
    object store still has not answered the reader's GET (a stalled S3), not when it does."""
    a = local_cluster.broker("A", wal_config=WalConfig(segment_bytes_max=300))
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 14, ack="archived")
    hosted.wal.truncate_before(15)  # most of 0..14 only in the archive now (WAL retention)
    assert hosted.wal.first_offset > 0
    inside, release = threading.Event(), threading.Event()
    real = local_cluster.objects.get_tail

    def held_get_tail(*args, **kwargs):  # type: ignore[no-untyped-def]
        # The reader's GETs (on its consumer thread, or on the threads it fetches with).
        if threading.current_thread().name.startswith(("consumer", "dnb-prefetch", "dnb-fetch")):
            inside.set()
            release.wait(2 * HANG_GUARD_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(local_cluster.objects, "get_tail", held_get_tail)
    reader = hosted.create_reader(0, live=True, prefetch_objects=prefetch_objects)
    ended: list[BaseException] = []

    def consume() -> None:
        try:
            for _message in reader:
                pass
        except BaseException as e:  # noqa: BLE001 - checked below
            ended.append(e)

    consumer = threading.Thread(target=consume, name="consumer", daemon=True)
    consumer.start()
    unloading = threading.Thread(target=a.unload, args=(TOPIC,), daemon=True)
    try:
        assert inside.wait(HANG_GUARD_S)
        unloading.start()
        consumer.join(HANG_GUARD_S)
        assert not consumer.is_alive(), "the consumer waited for the stalled GET after the topic left"
        assert not release.is_set()
        [error] = ended
        assert isinstance(error, TopicMoved) and error.next_offset == reader.position, repr(error)
    finally:
        release.set()
        unloading.join(HANG_GUARD_S)


@pytest.mark.parametrize("how", ["abandoned", "unloaded", "reader created once fenced"])
def test_a_takeover_the_old_owner_had_not_noticed_still_diverges_its_readers(local_cluster: Cluster,
                                                                           how: str) -> None:
    """B took over (A's lease lapsed, or a forced load) while A had nothing left to write,
    so A did not notice. A reader of A's copy must not be told to resume past B's first
    message: an abandon checks the owner record first, and a reader created once the copy
    knows it is fenced serves nothing of the replaced tail."""
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    produce_range(hosted, 5, 9)  # durable only: lost when B takes over
    hosted.publish_progress()  # so A has nothing left to write when it leaves
    it = iter(hosted.create_reader(0, live=True))
    assert [next(it).offset for _ in range(10)] == list(range(10))
    topic_b = b.load(TOPIC, force=True)
    assert topic_b.next_offset == 5
    if how in ("abandoned", "unloaded"):
        if how == "abandoned":
            a.abandon(TOPIC)
        else:
            with pytest.raises(Exception):  # noqa: B017 - the seal is refused: fenced
                a.unload(TOPIC)
        with pytest.raises(HistoryDiverged) as diverged:
            next(it)
        assert diverged.value.next_offset == 5
    else:
        hosted.check_ownership()
        reader = hosted.create_reader(0, live=True)
        served = []
        with pytest.raises(TopicMoved) as moved:
            for message in reader:
                served.append(message.offset)
        assert all(o < 5 for o in served) and moved.value.next_offset <= 5


def test_a_reader_created_while_the_fence_is_being_worked_out_waits_for_it(local_cluster: Cluster) -> None:
    """Between learning of the takeover and knowing where the new owner continues (a few
    metadata reads), a new reader must not leave with a plain TopicMoved at its start
    (past the new owner's first message): it waits for the divergence point."""
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    produce_range(hosted, 5, 9)
    # Published now: A's progress thread has no new tip to write after the takeover, so
    # the only fence is the one this test makes (a refused progress write racing it
    # fenced A first once, on a loaded machine, before the slow divergence was in place).
    hosted.publish_progress()
    b.load(TOPIC, force=True)  # B continues at 5
    inside, release = threading.Event(), threading.Event()
    real = hosted._diverged_from

    def slow_diverged_from():  # type: ignore[no-untyped-def]
        inside.set()
        release.wait(HANG_GUARD_S)
        return real()

    hosted._diverged_from = slow_diverged_from  # type: ignore[method-assign]
    fencing = threading.Thread(target=hosted.fence, args=("uploader commit refused",))
    fencing.start()
    assert inside.wait(HANG_GUARD_S)
    ended: list[BaseException] = []

    def consume() -> None:  # a consumer (re)connecting at its cursor + 1 = 10
        try:
            next(iter(hosted.create_reader(10, live=True)))
        except BaseException as e:  # noqa: BLE001 - checked below
            ended.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    # Give the consumer time to get through the window if it could (a loaded machine only
    # makes this check weaker, never makes correct code fail).
    consumer.join(0.5)
    release.set()
    consumer.join(HANG_GUARD_S)
    fencing.join(HANG_GUARD_S)
    [error] = ended
    assert isinstance(error, HistoryDiverged) and error.next_offset == 5, repr(error)
