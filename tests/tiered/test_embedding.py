"""The embedding API a broker process builds on: lookup, listeners, graceful close,
async twins."""
from __future__ import annotations

import asyncio
from dataclasses import replace

from tiered.lifecycle import BrokerHost
from tiered.lifecycle.restore import read_sealed_state
from tiered.lifecycle.watcher import assign_async, request_unload_async, wait_sealed_async
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import FAST_BROKER, TOPIC, Cluster, local_cluster, produce_range  # noqa: F401

T = TopicName.parse(TOPIC)


def test_lookup_names_the_owner_and_its_advertised_address(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A", advertised_address="http://10.0.0.7:8080")
    b = local_cluster.broker("B")
    assert b.lookup(TOPIC) is None  # never loaded
    a.load(TOPIC)
    owner = b.lookup(TOPIC)
    assert (owner.broker_id, owner.epoch, owner.live, owner.address) == ("A", 1, True, "http://10.0.0.7:8080")
    a.unload(TOPIC)
    assert b.lookup(TOPIC) is None  # sealed: nobody serves it until it is loaded again
    b.load(TOPIC)
    assert (b.lookup(TOPIC).broker_id, b.lookup(TOPIC).address) == ("B", None)


def test_lookup_reports_a_dead_owner_as_not_live(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    a.load(TOPIC)
    a.close(unload=False)  # dies: the topic stays owned, the registration is gone
    owner = b.lookup(TOPIC)
    assert owner.broker_id == "A" and not owner.live


def test_listeners_hear_loads_and_unloads(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    events: list[tuple] = []
    a.add_listener(on_loaded=lambda hosted: events.append(("loaded", str(hosted.topic))),
                   on_unloaded=lambda topic, how: events.append((how, str(topic))))
    a.load(TOPIC)
    a.unload(TOPIC)
    a.load(TOPIC)
    a.abandon(TOPIC)
    assert events == [("loaded", TOPIC), ("sealed", TOPIC), ("loaded", TOPIC), ("abandoned", TOPIC)]


def test_async_listeners_run_on_their_loop(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")

    async def main() -> list:
        seen: list = []
        done = asyncio.Event()

        async def on_loaded(hosted) -> None:
            seen.append(("loaded", asyncio.get_running_loop() is loop))

        async def on_unloaded(topic, how) -> None:
            seen.append((how, asyncio.get_running_loop() is loop))
            done.set()

        loop = asyncio.get_running_loop()
        a.add_listener(on_loaded=on_loaded, on_unloaded=on_unloaded)
        await a.load_async(TOPIC)
        await a.unload_async(TOPIC)
        await asyncio.wait_for(done.wait(), 30)
        return seen

    assert asyncio.run(main()) == [("loaded", True), ("sealed", True)]


def test_close_seals_every_topic_so_the_next_owner_continues_without_a_failover(local_cluster: Cluster) -> None:
    with local_cluster.broker("A") as a:
        produce_range(a.load(TOPIC), 0, 4)
        produce_range(a.load("/default/other"), 0, 1)
    assert read_sealed_state(local_cluster.metadata, T).sealed
    hosted = local_cluster.broker("B").load(TOPIC)
    assert hosted.next_offset == 5 and hosted.report.unarchived_at_least == 0


def test_async_with_seals_too(local_cluster: Cluster) -> None:
    async def main() -> None:
        async with BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, local_cluster.objects,
                              FAST_BROKER) as a:
            hosted = await a.load_async(TOPIC)
            await hosted.produce_async(b"m0")

    asyncio.run(main())
    assert read_sealed_state(local_cluster.metadata, T).last_committed_offset == 0


def test_a_failing_seal_at_close_abandons_that_topic_and_closes_the_rest(local_cluster: Cluster) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    produce_range(a.load(TOPIC), 0, 2)
    a.load("/default/other")
    b.load(TOPIC, force=True)  # A's seal of TOPIC will be refused (fenced)
    a.close()
    assert a.topics() == []
    assert read_sealed_state(local_cluster.metadata, TopicName.parse("/default/other")).sealed
    assert not read_sealed_state(local_cluster.metadata, T).sealed  # B owns it, unsealed


def test_the_operator_helpers_have_async_twins(local_cluster: Cluster) -> None:
    from tiered.lifecycle.watcher import AssignmentWatcher

    a = local_cluster.broker("A")
    b = local_cluster.broker("B")

    async def main() -> int | None:
        wa = await AssignmentWatcher(a).start_async()
        wb = await AssignmentWatcher(b).start_async()
        try:
            await assign_async(local_cluster.metadata, TOPIC, "A")
            while not a.topics():
                await asyncio.sleep(0.01)
            await a.topics()[0].produce_async(b"x")
            await request_unload_async(local_cluster.metadata, TOPIC, "A")
            last = await wait_sealed_async(local_cluster.metadata, TOPIC, 30)
            await assign_async(local_cluster.metadata, TOPIC, "B")
            while not b.topics():
                await asyncio.sleep(0.01)
            return last
        finally:
            await wa.stop_async()
            await wb.stop_async()

    assert asyncio.run(main()) == 0
    assert b.topic(TOPIC).next_offset == 1


def test_advertised_address_is_part_of_the_config() -> None:
    assert replace(FAST_BROKER, advertised_address="http://h:1").advertised_address == "http://h:1"
