"""Hostile requests an outside attacker sent the broker: every one gets a
typed 4xx, and idle long polls never take the threads produce and shutdown need."""
from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from tiered.broker.server import BrokerServer
from tests.tiered.helpers_lifecycle import TOPIC, Cluster, local_cluster  # noqa: F401

PATH = "/topics/default/reliable_topic/messages"
ACK = "/topics/default/reliable_topic/subscriptions/{}/ack"
HANG_GUARD_S = 60.0


def _run(server, scenario):
    async def main():
        async with TestClient(TestServer(server.app())) as client:
            return await asyncio.wait_for(scenario(client), HANG_GUARD_S)
    return asyncio.run(main())


def test_bad_wait_s_and_subscription_names_are_typed_400s(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    a.load(TOPIC)

    async def scenario(client):
        answers = []
        for params in ({"from": "0", "wait_s": "nan"}, {"from": "0", "wait_s": "inf"},
                       {"from": "0", "wait_s": "-1"}, {"from": "0", "wait_s": "abc"},
                       {"subscription": ".."}, {"subscription": "a/b"}, {"subscription": ""}):
            response = await client.get(PATH, params=params)
            answers.append((response.status, (await response.json())["error"]["type"]))
        response = await client.post(ACK.format("a%20b"), json={"offset": 0})
        answers.append((response.status, (await response.json())["error"]["type"]))
        return answers

    answers = _run(BrokerServer(a), scenario)
    assert [status for status, _ in answers] == [400] * 8, answers
    assert {kind for _, kind in answers} == {"InvalidParameter", "InvalidSubscription"}


def test_idle_long_polls_do_not_starve_produce(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    a.load(TOPIC)
    polls = 12  # twice the default executor's threads on a 2-core machine

    async def scenario(client):
        waiting = [asyncio.create_task(client.get(PATH, params={"from": "0", "wait_s": "30"}))
                   for _ in range(polls)]
        await asyncio.sleep(0)  # the polls are in flight (ordering only, not a timing bound)
        produced = await (await client.post(PATH, json={"messages": [{"payload": "x"}]})).json()
        answers = [await r.json() for r in await asyncio.gather(*waiting)]
        return produced, [len(answer["messages"]) for answer in answers]

    produced, received = _run(BrokerServer(a), scenario)
    assert produced == {"offsets": [0]}
    # Had the polls held the threads the produce needs, it would have been appended only
    # after they timed out empty: every poll got the message instead.
    assert received == [1] * polls


def test_reads_beyond_the_pool_are_refused_not_queued(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    a.load(TOPIC)

    async def scenario(client):
        first = asyncio.create_task(client.get(PATH, params={"from": "0", "wait_s": "30"}))
        for _ in range(int(HANG_GUARD_S / 0.01)):  # until the first poll holds the only slot
            if server._read_slots._value == 0:
                break
            await asyncio.sleep(0.01)
        second = await client.get(PATH, params={"from": "0", "wait_s": "30"})
        await client.post(PATH, json={"messages": [{"payload": "x"}]})
        return second.status, second.headers.get("Retry-After"), (await first).status

    server = BrokerServer(a, read_threads_max=1)
    assert _run(server, scenario) == (503, "1", 200)


def test_an_oversized_message_is_a_413_with_a_json_error_and_appends_nothing(local_cluster: Cluster) -> None:
    from wal.config import WalConfig

    a = local_cluster.broker("A", wal_config=WalConfig(max_message_bytes=1024))
    hosted = a.load(TOPIC)

    async def scenario(client):
        response = await client.post(PATH, json={"messages": [{"payload": "small"}, {"payload": "x" * 4096}]})
        return response.status, (await response.json())["error"]["type"]

    assert _run(BrokerServer(a), scenario) == (413, "MessageTooLarge")
    assert hosted.next_offset == 0


def test_a_fenced_topic_redirects_to_its_new_owner(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    b = local_cluster.broker("B", advertised_address="http://new-owner.example:8080")
    hosted = a.load(TOPIC)
    b.load(TOPIC, force=True)
    hosted.fence("test: a newer owner exists")

    async def scenario(client):
        response = await client.get(PATH, params={"from": "0"}, allow_redirects=False)
        return response.status, response.headers.get("Location")

    assert _run(BrokerServer(a), scenario) == (307, f"http://new-owner.example:8080{PATH}?from=0")


def test_undecodable_bodies_are_typed_400s_and_an_oversized_body_a_json_413(local_cluster: Cluster,
                                                                           monkeypatch) -> None:
    """atk69 F6: an unknown charset and a body its Content-Encoding does not decode were
    untyped 500s, and a body past the size limit got aiohttp's plain-text 413; an integer
    parameter with underscores ("1_0") was taken as 10."""
    a = local_cluster.broker("A")
    a.load(TOPIC)

    async def scenario(client):
        answers = []
        for headers, data in (({"Content-Type": "application/json; charset=foo"}, b'{"messages": []}'),
                              # aiohttp drops the connection after answering this one.
                              ({"Content-Type": "application/json", "Content-Encoding": "gzip",
                                "Connection": "close"}, b"not gzip"),
                              ({"Content-Type": "application/json"}, b'{"messages": [' + b'{"payload": "x"},' * 500
                               + b'{"payload": "x"}]}')):
            response = await client.post(PATH, data=data, headers=headers)
            answers.append((response.status, response.content_type, (await response.json())["error"]["type"]))
        response = await client.get(PATH, params={"from": "1_0"})
        answers.append((response.status, response.content_type, (await response.json())["error"]["type"]))
        response = await client.post(ACK.format("s"), json={"offset": 0, "epoch": "1_0"})
        answers.append((response.status, response.content_type, (await response.json())["error"]["type"]))
        return answers

    answers = _run(BrokerServer(a, body_bytes_max=4096), scenario)
    assert answers == [(400, "application/json", "InvalidJson"), (400, "application/json", "InvalidJson"),
                       (413, "application/json", "MessageTooLarge"),
                       (400, "application/json", "InvalidParameter"),
                       (400, "application/json", "InvalidParameter")], answers
    assert a.topic(TOPIC).next_offset == 0  # nothing was appended


def test_new_subscriptions_past_the_bound_are_refused_and_existing_ones_still_work(local_cluster: Cluster) -> None:
    """atk69 F5: any client could name new subscriptions without end, each a cursor record
    kept for good. Past ``broker.subscriptions_max`` a new name is a 409, counted from the
    stored cursors (so also across moves); the existing ones still read and ack."""
    a = local_cluster.broker("A", subscriptions_max=2)
    a.load(TOPIC).produce(b"m0")

    async def scenario(client):
        answers = []
        for name in ("s1", "s2", "s3", "s1"):
            response = await client.get(PATH, params={"subscription": name})
            body = await response.json()
            answers.append((response.status, body["error"]["type"] if "error" in body else len(body["messages"])))
        response = await client.post(ACK.format("s4"), json={"offset": 0})
        answers.append((response.status, (await response.json())["error"]["type"]))
        response = await client.post(ACK.format("s2"), json={"offset": 0})
        answers.append((response.status, (await response.json())["cursor"]))
        return answers

    assert _run(BrokerServer(a), scenario) == [(200, 1), (200, 1), (409, "TooManySubscriptions"), (200, 1),
                                               (409, "TooManySubscriptions"), (200, 0)]
    a.close()
    b = local_cluster.broker("B", subscriptions_max=2)  # the stored cursors count on a new owner too
    b.load(TOPIC)
    assert _run(BrokerServer(b), lambda client: _status(client, "s5")) == 409


async def _status(client, name: str) -> int:
    return (await client.get(PATH, params={"subscription": name})).status


def test_slow_codecs_value_floods_and_made_up_epochs_are_refused_up_front(local_cluster: Cluster,
                                                                          monkeypatch) -> None:
    """atk70: a body declaring ``charset=punycode`` was decoded (quadratic) on the event loop
    (F1); a produce body padded with millions of empty objects held the GIL for seconds
    in json's parser, long enough for the broker's own session lease to lapse (F2); and
    an ``epoch`` above the owner's passed the history check unchecked (F4)."""
    from tiered.broker import server as server_module

    monkeypatch.setattr(server_module, "PRODUCE_MAX_MESSAGES", 3)
    a = local_cluster.broker("A")
    a.load(TOPIC).produce(b"m0")

    async def scenario(client):
        answers = []
        response = await client.post(ACK.format("s"), data="{\"offset\": 0}".encode(),
                                     headers={"Content-Type": "application/json; charset=punycode"})
        answers.append((response.status, (await response.json())["error"]["type"]))
        padded = b'{"messages": [{"payload": "x"}], "pad": [' + b",".join([b"{}"] * 40) + b"]}"
        response = await client.post(PATH, data=padded, headers={"Content-Type": "application/json"})
        answers.append((response.status, (await response.json())["error"]["type"]))
        numbers = b'{"messages": [{"payload": "x"}], "pad": [' + b",".join([b"1"] * 40) + b"]}"
        response = await client.post(PATH, data=numbers, headers={"Content-Type": "application/json"})
        answers.append((response.status, (await response.json())["error"]["type"]))
        for params in ({"from": "1", "epoch": "999"},):
            response = await client.get(PATH, params=params)
            answers.append((response.status, (await response.json())["error"]["type"]))
        response = await client.post(ACK.format("s"), json={"offset": 0, "epoch": 999})
        answers.append((response.status, (await response.json())["error"]["type"]))
        return answers

    assert _run(BrokerServer(a), scenario) == [(400, "InvalidJson"), (400, "BatchTooLarge"), (400, "BatchTooLarge"),
                                               (503, "Unavailable"), (503, "Unavailable")]
    assert a.topic(TOPIC).next_offset == 1  # nothing was appended
    cursor = local_cluster.metadata.get(f"/topics{TOPIC}/subscriptions/s/cursor")
    assert cursor is None or b'"last_acked_offset": 0' not in cursor.value


def test_produce_requests_past_the_bound_in_flight_are_refused_before_their_body_is_read(
        local_cluster: Cluster, monkeypatch) -> None:
    """Each produce holds its body in memory until it is decoded (one at a time): past
    PRODUCES_IN_FLIGHT_MAX the next is a 503 + Retry-After at once (atk70 F2)."""
    from tiered.broker import server as server_module

    monkeypatch.setattr(server_module, "PRODUCES_IN_FLIGHT_MAX", 1)
    a = local_cluster.broker("A")
    a.load(TOPIC)

    async def scenario(client):
        go_on = asyncio.Event()

        async def slow_body():
            yield b'{"messages": [{"payload": '
            await go_on.wait()
            yield b'"x"}]}'

        first = asyncio.create_task(client.post(PATH, data=slow_body(), headers={"Content-Type": "application/json"}))
        for _ in range(int(HANG_GUARD_S / 0.01)):  # until the first one is in flight
            if server._produces_in_flight == 1:
                break
            await asyncio.sleep(0.01)
        second = await client.post(PATH, json={"messages": [{"payload": "y"}]})
        refused = (second.status, second.headers.get("Retry-After"), (await second.json())["error"]["type"])
        go_on.set()
        taken = await (await first).json()
        third = await (await client.post(PATH, json={"messages": [{"payload": "z"}]})).json()
        return refused, taken, third

    server = BrokerServer(a)
    assert _run(server, scenario) == ((503, "1", "Unavailable"), {"offsets": [0]}, {"offsets": [1]})
