"""A client that read a history a failover replaced is told so, instead of skipping.

The failure this prevents: a consumer read 0-39 from A (durable, not
archived), A died, B took over at 0 and acknowledged new messages at 0-59. The consumer's
late ack of 39 landed on B and moved the subscription past B's 0-39, and a position
consumer continued at 40: both skipped acknowledged messages silently. Read answers now
carry the owner's epoch; a read or ack sent with an epoch whose history a failover took
over from S, past S, gets 409 HistoryDiverged(resume_from=S).
"""
from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestServer

from tiered.broker.client import BrokerClient, HistoryDiverged
from tiered.broker.server import BrokerServer
from tiered.lifecycle.losses import LossRecords
from tiered.metadata import keys
from tests.tiered.helpers_lifecycle import TOPIC, Cluster, local_cluster, produce_range  # noqa: F401


def test_a_read_or_ack_across_a_failover_that_replaced_it_is_refused_with_where_to_resume(
        local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 39)  # durable on A only

    async def scenario():
        server_a = TestServer(BrokerServer(a).app())
        await server_a.start_server()
        url_a = str(server_a.make_url("")).rstrip("/")
        by_position = BrokerClient([url_a], timeout_s=30)
        by_subscription = BrokerClient([url_a], timeout_s=30)
        try:
            for client, where in ((by_position, {}), (by_subscription, {"subscription": "s"})):
                batch = await client.read(TOPIC, None if where else 0, max_messages=100, wait_s=0, **where)
                assert [m["offset"] for m in batch.messages] == list(range(40))
                batch_epoch = batch.epoch
            await server_a.close()
            for hosted in a.topics():  # A dies before either consumer goes on
                a.abandon(hosted.topic)
            a.close(unload=False)
            b = local_cluster.broker("B")
            produce_range(b.load(TOPIC), 0, 59)  # B renumbers from 0
            server_b = TestServer(BrokerServer(b).app())
            await server_b.start_server()
            for client in (by_position, by_subscription):
                client.brokers = [str(server_b.make_url("")).rstrip("/")]
                client._owner.clear()

            # A position consumer continuing at its own next offset.
            with pytest.raises(HistoryDiverged) as read:
                await by_position.read(TOPIC, 40, wait_s=0)
            assert read.value.resume_from == 0
            again = await by_position.read(TOPIC, 0, max_messages=100, wait_s=0)
            assert [m["payload"] for m in again.messages] == [f"m{i}".encode() for i in range(60)]
            # An application that stored (position, epoch) itself and resumes with a new client.
            fresh = BrokerClient(by_position.brokers, timeout_s=30)
            try:
                with pytest.raises(HistoryDiverged) as stored:
                    await fresh.read(TOPIC, 40, wait_s=0, epoch=batch_epoch)
                assert stored.value.resume_from == 0
            finally:
                await fresh.close()

            # A subscription consumer that prefetched under B before acking what it read
            # from A (its ack must not be vouched for by the prefetch).
            prefetch = await by_subscription.read(TOPIC, subscription="s", max_messages=100, wait_s=0)
            assert prefetch.messages[0]["offset"] == 0
            with pytest.raises(HistoryDiverged) as acked:
                await by_subscription.ack(TOPIC, "s", 39)
            assert acked.value.resume_from == 0
            redo = await by_subscription.read(TOPIC, subscription="s", max_messages=100, wait_s=0)
            assert [m["offset"] for m in redo.messages] == list(range(60))
            assert await by_subscription.ack(TOPIC, "s", 59) == 59
            await server_b.close()
        finally:
            await by_position.close()
            await by_subscription.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_an_ack_without_epoch_is_refused_where_a_failover_replaced_offsets_past_the_cursor(
        local_cluster: Cluster) -> None:
    """A raw HTTP client need not send ``epoch``. Its ack of 39, read from A before A died,
    would otherwise move the subscription past B's new 0..39 unread."""
    import aiohttp

    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 9)  # durable on A only
    for hosted in a.topics():
        a.abandon(hosted.topic)
    a.close(unload=False)
    b = local_cluster.broker("B")
    produce_range(b.load(TOPIC), 0, 11)  # B renumbers from 0: 0..9 now hold other messages

    async def scenario():
        server = TestServer(BrokerServer(b).app())
        await server.start_server()
        ack_url = server.make_url(f"/topics{TOPIC}/subscriptions/s/ack")
        try:
            async with aiohttp.ClientSession() as http:
                async with http.post(ack_url, json={"offset": 9}) as answer:
                    body = await answer.json()
                    assert answer.status == 409, body
                    assert body["error"]["type"] == "HistoryDiverged" and body["error"]["resume_from"] == 0
                async with http.get(server.make_url(f"/topics{TOPIC}/messages"),
                                    params={"subscription": "s", "max": "100"}) as answer:
                    read = await answer.json()
                assert [m["offset"] for m in read["messages"]] == list(range(12))  # nothing was skipped
                # With the epoch of the answer it read from (B's), an ack is taken. One that
                # puts the cursor AT the lost range's start proves nothing of the offsets
                # after it: an ack without epoch past it is refused (atk69 F1: a consumer
                # that read 0..9 from A acked 9 after another acked B's 0, and B's 1..9 were
                # skipped).
                async with http.post(ack_url, json={"offset": 0, "epoch": read["epoch"]}) as answer:
                    assert (answer.status, (await answer.json())["cursor"]) == (200, 0)
                async with http.post(ack_url, json={"offset": 9}) as answer:
                    body = await answer.json()
                    assert answer.status == 409 and body["error"]["resume_from"] == 1, body
                async with http.post(ack_url, json={"offset": 9, "epoch": read["epoch"]}) as answer:
                    assert (answer.status, (await answer.json())["cursor"]) == (200, 9)
                # A's tip is not known (it never came back to report it): the replaced
                # range is open-ended, and so is the refusal.
                async with http.post(ack_url, json={"offset": 11}) as answer:
                    body = await answer.json()
                    assert answer.status == 409 and body["error"]["resume_from"] == 10, body
                # Once A reports that its history ended at 9, past it an ack without epoch
                # is as good as one with it.
                [lost] = keys.read_lost_ranges(b.metadata, TOPIC)
                assert not lost.exact
                LossRecords(b.metadata, "A").write_lost(TOPIC, lost.start_offset, lost.epoch, 9, "/quarantined/A")
                assert keys.read_lost_ranges(b.metadata, TOPIC)[0].exact
                async with http.post(ack_url, json={"offset": 11}) as answer:
                    assert (answer.status, (await answer.json())["cursor"]) == (200, 11)
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_dnb_consume_ack_through_a_broker_is_not_fooled_by_a_failover_after_its_position_check(
        local_cluster: Cluster, monkeypatch) -> None:
    """``dnb consume --broker --ack`` reads the subscription's position (10, after acks
    through 9 on A), then A dies and B renumbers from 0. Its read from 10 must not pass
    unchecked, or its ack through B's 14 acknowledges B's 0..9 unread (atk64 f01)."""
    from tiered.broker import client as broker_client
    from tiered.tools.cli.ops import consume_remote

    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 9)  # durable on A only
    sub = hosted.subscribe("s", "earliest")
    sub.ack(9)
    sub.flush()

    async def scenario():
        server_a, server_b = TestServer(BrokerServer(a).app()), TestServer(BrokerServer(b).app())
        await server_a.start_server()
        await server_b.start_server()
        original, reads = broker_client.SyncBrokerClient.read, []

        def read(self, topic, start=None, **options):
            answer = original(self, topic, start, **options)
            reads.append((start, options.get("subscription"), [m["offset"] for m in answer.messages]))
            if len(reads) == 1:  # right after the position check: A dies, B takes over
                for each in a.topics():
                    a.abandon(each.topic)
                a.close(unload=False)
                produce_range(b.load(TOPIC), 0, 14)  # B renumbers from 0: 0..9 now hold other messages
                self._client.brokers = [str(server_b.make_url("")).rstrip("/")]
                self._client._owner.clear()
            return answer

        monkeypatch.setattr(broker_client.SyncBrokerClient, "read", read)
        try:
            url_a = str(server_a.make_url("")).rstrip("/")
            return await asyncio.to_thread(consume_remote, url_a, TOPIC, "s", None, None, True), reads
        finally:
            await server_a.close()
            await server_b.close()

    messages, reads = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert reads[0] == (None, "s", [])  # the position check: 10, nothing past it on A
    # Told the history diverged from 0, it read B's 0..14, and acknowledged those.
    assert [m.offset for m in messages] == list(range(15))
    assert b.topic(TOPIC).subscribe("s", "earliest").cursor == 14
