"""Readers end with TopicMoved (carrying where to resume) as soon as the topic leaves.

Once unload refuses appends, or the topic is abandoned or fenced, whatever a reader here
would still serve could not be acknowledged here (and after a fencing it may not even be
the topic's history). A consumer that resumes at ``TopicMoved.next_offset`` on the new
owner sees every offset once, in order.
"""
from __future__ import annotations

import asyncio
import threading

import pytest

from tiered.read.errors import TopicMoved

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
    b.load(TOPIC, force=True)
    hosted.check_ownership()
    with pytest.raises(TopicMoved) as info:
        next(it)
    assert info.value.next_offset == 1


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
