"""A client that read a history a failover replaced is told so, instead of skipping.

Issue-10 attack pass (atk2 F5, atk3 F8): a consumer read 0-39 from A (durable, not
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
from tests.tiered.helpers_lifecycle import TOPIC, Cluster, local_cluster, produce_range  # noqa: F401


def test_a_read_or_ack_across_a_failover_that_replaced_it_is_refused_with_where_to_resume(
        local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 39)  # durable on A only

    async def scenario():
        server_a = TestServer(BrokerServer(a).app())
        await server_a.start_server()
        client = BrokerClient([str(server_a.make_url(""))], timeout_s=30)
        try:
            batch = await client.read(TOPIC, 0, max_messages=100, wait_s=0)
            assert [m["offset"] for m in batch.messages] == list(range(40))
            await server_a.close()
            for hosted in a.topics():  # A dies before the consumer's ack
                a.abandon(hosted.topic)
            a.close(unload=False)
            b = local_cluster.broker("B")
            produce_range(b.load(TOPIC), 0, 59)  # B renumbers from 0
            server_b = TestServer(BrokerServer(b).app())
            await server_b.start_server()
            client.brokers = [str(server_b.make_url("")).rstrip("/")]
            client._owner.clear()
            with pytest.raises(HistoryDiverged) as acked:
                await client.ack(TOPIC, "s", 39)
            assert acked.value.resume_from == 0
            with pytest.raises(HistoryDiverged) as read:
                await client.read(TOPIC, 40, wait_s=0)
            assert read.value.resume_from == 0
            again = await client.read(TOPIC, 0, max_messages=100, wait_s=0)  # continue where told
            assert [m["payload"] for m in again.messages] == [f"m{i}".encode() for i in range(60)]
            assert await client.ack(TOPIC, "s", 59) == 59
            await server_b.close()
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))
