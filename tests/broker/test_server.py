"""The broker's HTTP routes in one process: redirects, 503s, errors, metrics."""
from __future__ import annotations

import asyncio
import base64
import threading
import time

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tiered.broker import server as server_module
from tiered.broker.server import BrokerServer
from tests.tiered.helpers_lifecycle import TOPIC, Cluster, local_cluster  # noqa: F401
from tests.tiered.helpers_read import STALL_HANG_GUARD_S, StallingObjects

PATH = "/topics/default/reliable_topic/messages"


def _run(host, scenario):
    async def main():
        async with TestClient(TestServer(BrokerServer(host).app())) as client:
            return await scenario(client)
    return asyncio.run(main())


def test_a_broker_that_does_not_own_the_topic_redirects_to_the_owner(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A", advertised_address="http://owner.example:8080")
    b = local_cluster.broker("B")
    a.load(TOPIC)

    async def scenario(client):
        response = await client.get(PATH, params={"from": "0"}, allow_redirects=False)
        return response.status, response.headers.get("Location")

    assert _run(b, scenario) == (307, f"http://owner.example:8080{PATH}?from=0")


def test_nobody_owning_the_topic_is_a_503_with_retry_after(local_cluster: Cluster) -> None:
    b = local_cluster.broker("B")

    async def scenario(client):
        response = await client.post(PATH, json={"messages": [{"payload": "x"}]})
        return response.status, response.headers.get("Retry-After"), (await response.json())["error"]["type"]

    assert _run(b, scenario) == (503, "1", "Unavailable")


def test_produce_read_ack_and_bad_input_on_the_owner(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    a.load(TOPIC)

    async def scenario(client):
        produced = await (await client.post(PATH, json={"messages": [
            {"payload_b64": base64.b64encode(b"hello").decode()}, {"payload": "world"}]})).json()
        read = await (await client.get(PATH, params={"from": "0", "max": "10", "wait_s": "0.2"})).json()
        acked = await (await client.post("/topics/default/reliable_topic/subscriptions/s/ack",
                                         json={"offset": 1})).json()
        bad = await client.post(PATH, data=b"not json")
        bad_offset = await client.get(PATH, params={"from": "-1"})
        metrics = await (await client.get("/metrics")).text()
        return produced, read, acked, bad.status, bad_offset.status, "dnb_wal_" in metrics and "dnb_topic" in metrics

    produced, read, acked, bad, bad_offset, has_metrics = _run(a, scenario)
    assert produced == {"offsets": [0, 1]}
    assert [base64.b64decode(m["payload_b64"]) for m in read["messages"]] == [b"hello", b"world"]
    assert read["next"] == 2 and read["moved"] is False
    assert acked == {"cursor": 1}
    assert (bad, bad_offset, has_metrics) == (400, 400, True)


def test_a_topic_that_is_leaving_answers_503(local_cluster: Cluster) -> None:
    from tiered.lifecycle import TopicState

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    hosted.state = TopicState.UNLOADING  # what unload sets first (refuse appends)

    async def scenario(client):
        response = await client.post(PATH, json={"messages": [{"payload": "x"}]})
        return response.status

    assert _run(a, scenario) == 503
    hosted.state = TopicState.OPEN


def test_metrics_of_several_wals_are_one_valid_scrape(local_cluster: Cluster) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    a = local_cluster.broker("A")
    a.load(TOPIC).produce(b"x")
    a.load("/default/other").produce(b"y")

    async def scenario(client):
        return await (await client.get("/metrics")).text()

    families = list(text_string_to_metric_families(_run(a, scenario)))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a family appears twice: not a valid scrape"
    wal_topics = {s.labels.get("topic") for f in families if f.name.startswith("dnb_wal_") for s in f.samples}
    assert {TOPIC, "/default/other"} <= wal_topics


class _SlowObjects:
    """An object store whose reads take a while (a remote S3 under load)."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get(self, *args, **kwargs):
        time.sleep(self.delay_s)
        return self.inner.get(*args, **kwargs)

    def get_range(self, *args, **kwargs):
        time.sleep(self.delay_s)
        return self.inner.get_range(*args, **kwargs)


def _stalled_archive(local_cluster: Cluster, monkeypatch):
    """B owns a topic whose offsets 0-2 are only in the archive, on an object store whose
    GETs stall until released; the fetch bound of a read is 0.5 s (30 s in production)."""
    monkeypatch.setattr(server_module, "READ_FETCH_MAX_S", 0.5)
    a = local_cluster.broker("A")
    a.load(TOPIC).produce_many([b"m0", b"m1", b"m2"])
    a.unload(TOPIC)  # sealed: 0-2 live in the archive only
    store = local_cluster.objects = StallingObjects(local_cluster.objects)
    b = local_cluster.broker("B")
    b.load(TOPIC)
    store.armed = True
    return b, store


def test_a_read_whose_archive_does_not_answer_in_time_is_a_503_not_an_empty_200(local_cluster: Cluster,
                                                                               monkeypatch) -> None:
    """Offsets that exist but could not be fetched within the read's bound (a stalled
    object store) must not be answered ``200 {"messages": []}``: that says "nothing
    there" and a consumer stops early. The answer is 503 + Retry-After (ReadTimeout), at
    the bound, while the GET is still stalled; the read slot is given back (with one
    slot, the second read gets the same answer, not "serving 1 reads already"). A read
    from the tip, where nothing exists yet, is still an empty 200."""
    b, store = _stalled_archive(local_cluster, monkeypatch)
    guard = aiohttp.ClientTimeout(total=STALL_HANG_GUARD_S)

    async def scenario(client):
        answers = []
        for _ in range(2):
            response = await client.get(PATH, params={"from": "0", "wait_s": "0"}, timeout=guard)
            body = await response.json()
            answers.append((response.status, response.headers.get("Retry-After"), body["error"]["type"],
                            store.release.is_set()))
        at_tip = await (await client.get(PATH, params={"from": "3", "wait_s": "0"}, timeout=guard)).json()
        return answers, at_tip

    async def main():
        async with TestClient(TestServer(BrokerServer(b, read_threads_max=1).app())) as client:
            return await scenario(client)

    try:
        answers, at_tip = asyncio.run(main())
    finally:
        store.release.set()
    assert answers == [(503, "1", "ReadTimeout", False)] * 2
    assert at_tip["messages"] == [] and at_tip["next"] == 3


def test_dnb_consume_through_a_broker_retries_a_stalled_archive_instead_of_stopping_early(
        local_cluster: Cluster, monkeypatch) -> None:
    """``dnb consume --broker`` (and the client under it) takes the 503 of a read whose
    archive did not answer in time as "retry", within its time bound: once the store
    answers, it gets every message, where an empty 200 made it stop with none."""
    from tiered.tools.cli.ops import consume_remote

    b, store = _stalled_archive(local_cluster, monkeypatch)
    stalls: list[bool] = []

    def release_after_two_stalled_reads() -> None:
        # Two reads stalled: the first was answered (503) and the client read again.
        stalls.extend([store.wait_stalled(), store.wait_stalled()])
        store.release.set()

    async def main():
        server = TestServer(BrokerServer(b).app())
        await server.start_server()
        try:
            return await asyncio.to_thread(consume_remote, str(server.make_url("")).rstrip("/"), TOPIC, "s", 0,
                                           None, False)
        finally:
            await server.close()

    releaser = threading.Thread(target=release_after_two_stalled_reads, daemon=True)
    releaser.start()
    try:
        messages = asyncio.run(main())
    finally:
        store.release.set()
        releaser.join(STALL_HANG_GUARD_S)
    assert stalls == [True, True], "the first read never answered while the archive stalled"
    assert [(m.offset, bytes(m.payload)) for m in messages] == [(0, b"m0"), (1, b"m1"), (2, b"m2")]


def test_messages_that_exist_are_served_even_with_wait_s_0(local_cluster: Cluster) -> None:
    """wait_s bounds the wait for messages not written yet. Offsets that exist (here in
    an archived object that takes a while to fetch) are served: an empty answer would
    tell the consumer it is caught up (dnb consume --broker then stops with nothing)."""
    a = local_cluster.broker("A")
    a.load(TOPIC).produce_many([b"m0", b"m1", b"m2"])
    a.unload(TOPIC)  # sealed: 0-2 live in the archive only
    local_cluster.objects = _SlowObjects(local_cluster.objects, delay_s=0.2)
    b = local_cluster.broker("B")
    b.load(TOPIC)

    async def scenario(client):
        return await (await client.get(PATH, params={"from": "0", "wait_s": "0"})).json()

    answer = _run(b, scenario)
    assert [m["offset"] for m in answer["messages"]] == [0, 1, 2] and answer["next"] == 3


def test_a_long_poll_answers_soon_after_a_message_arrives_not_at_wait_s(local_cluster: Cluster) -> None:
    """A read waiting for new messages answers once one arrived (plus a short linger),
    not when its wait_s runs out: consumers would otherwise see every message up to
    wait_s late. Bounds are loose on purpose (a loaded machine stays far inside them)."""
    import threading

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    wait_s = 20.0

    async def scenario(client):
        threading.Timer(0.2, lambda: hosted.produce(b"late")).start()
        begun = time.monotonic()
        answer = await (await client.get(PATH, params={"from": "0", "wait_s": str(wait_s)})).json()
        return answer, time.monotonic() - begun

    answer, elapsed_s = _run(a, scenario)
    assert [m["offset"] for m in answer["messages"]] == [0]
    assert elapsed_s < wait_s / 2, f"answered after {elapsed_s:.1f}s: held until wait_s"


def test_long_polls_do_not_starve_produces(local_cluster: Cluster) -> None:
    """Each long poll holds a thread for up to wait_s. With more of them than asyncio's
    default executor has threads (at most 32), a produce sharing that executor waited
    for a long poll to end: every producer stalled once enough consumers were idle."""
    polls, wait_s = 40, 6.0
    a = local_cluster.broker("A")
    for k in range(polls):
        a.load(f"/default/idle{k}")
    a.load(TOPIC)

    async def scenario(client):
        idle = [asyncio.create_task(client.get(f"/topics/default/idle{k}/messages",
                                               params={"from": "0", "wait_s": str(wait_s)}))
                for k in range(polls)]
        await asyncio.sleep(0.5)  # let the polls take their threads (longer is only stricter)
        begun = time.monotonic()
        produced = await (await client.post(PATH, json={"messages": [{"payload": "x"}]})).json()
        elapsed_s = time.monotonic() - begun
        for response in await asyncio.gather(*idle):
            response.release()
        return produced, elapsed_s

    produced, elapsed_s = _run(a, scenario)
    assert produced == {"offsets": [0]}
    assert elapsed_s < wait_s / 2, f"a produce waited {elapsed_s:.1f}s behind idle long polls"


def test_a_read_below_the_archive_start_is_a_404_naming_the_first_retained_offset(local_cluster: Cluster) -> None:
    from tiered.archive.start import archive_start
    from uploader.config import ArchiveRetentionConfig

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    for first in (0, 3, 6):
        for offset in range(first, first + 3):
            assert hosted.produce(f"m{offset}".encode()) == offset
        hosted.uploader.upload_once()
    hosted.uploader.archive_retention.policy = ArchiveRetentionConfig(bytes_max=0)
    hosted.uploader.archive_retention.run(hosted.uploader.committed_through)
    assert archive_start(local_cluster.metadata, TOPIC) == 6

    async def scenario(client):
        below = await client.get(PATH, params={"from": "1", "max": "10"})
        retained = await (await client.get(PATH, params={"from": "6", "max": "10", "wait_s": "0.1"})).json()
        return below.status, await below.json(), [m["offset"] for m in retained["messages"]]

    status, body, offsets = _run(a, scenario)
    assert status == 404
    assert (body["error"]["type"], body["error"]["offset"], body["error"]["first_retained_offset"]) == (
        "OffsetBelowRetention", 1, 6)
    assert offsets == [6, 7, 8]


def test_a_deleted_topic_is_a_410_and_an_unknown_one_without_auto_create_a_404(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    a.load(TOPIC)
    a.delete(TOPIC)
    strict = local_cluster.broker("B", auto_create=False)

    async def scenario(client):
        out = []
        for path in (PATH, "/topics/default/never_created/messages"):
            response = await client.post(path, json={"messages": [{"payload": "x"}]})
            out.append((response.status, (await response.json())["error"]["type"]))
            response = await client.get(path, params={"from": "0"})
            out.append((response.status, (await response.json())["error"]["type"]))
        return out

    assert _run(strict, scenario) == [(410, "TopicDeleted"), (410, "TopicDeleted"),
                                      (404, "TopicNotFound"), (404, "TopicNotFound")]
    # With auto_create on, a topic nobody owns yet may be created by its next load: retry (503).
    assert _run(a, scenario)[2:] == [(503, "Unavailable"), (503, "Unavailable")]


def test_a_data_gap_met_mid_read_reaches_the_http_client_as_a_typed_error(local_cluster: Cluster) -> None:
    """A reader error other than the read's own deadline (here a DataGap: an archived
    object above the start is gone) is never answered as an empty or silently short
    200: what was read before it is served, and the read that starts at the gap gets
    the error with its type."""
    from tiered.archive import list_descriptors
    from tiered.archive.naming import descriptor_object_key

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    for first in (0, 3, 6):
        for offset in range(first, first + 3):
            assert hosted.produce(f"m{offset}".encode()) == offset
        hosted.uploader.upload_once()
    assert a.unload(TOPIC) == 8
    b = local_cluster.broker("B")
    b.load(TOPIC)  # B's WAL holds nothing: every read below 9 comes from the archive
    [hole] = [d for d in list_descriptors(local_cluster.metadata, TOPIC) if d.start_offset == 3]
    local_cluster.objects.delete(descriptor_object_key(TOPIC, hole))

    async def scenario(client):
        before = await (await client.get(PATH, params={"from": "0", "max": "10", "wait_s": "0.2"})).json()
        at_gap = await client.get(PATH, params={"from": "3", "max": "10", "wait_s": "0.2"})
        return [m["offset"] for m in before["messages"]], before["next"], at_gap.status, await at_gap.json()

    served, next_offset, status, body = _run(b, scenario)
    assert served == [0, 1, 2] and next_offset == 3
    assert status == 422, body
    assert body["error"]["type"] == "DataGap"


def test_healthz_turns_503_once_the_wal_roots_commit_group_failed(local_cluster: Cluster) -> None:
    """After the commit group failed nothing can be acknowledged or loaded until a restart
    replays the journal: the health check says so, so a supervisor restarts the broker."""
    import errno

    a = local_cluster.broker("A")
    a.load(TOPIC)

    async def scenario(client):
        response = await client.get("/healthz")
        return response.status, await response.json()

    status, body = _run(a, scenario)
    assert status == 200 and body["ok"] is True
    assert a.root.group is not None, "the broker host runs a journaled commit group by default"
    a.root.group.fail(OSError(errno.EIO, "a segment sync failed at a checkpoint (injected)"))
    status, body = _run(a, scenario)
    assert status == 503 and body["ok"] is False and "restart the broker" in body["error"]


def test_damaged_records_behind_a_request_are_typed_server_errors_not_bare_500s(local_cluster: Cluster) -> None:
    """A malformed loss record met by a read or ack carrying ``epoch`` (every client sends
    it) and a malformed cursor: the answer is a JSON error naming MalformedRecord with a
    5xx (the server's data is damaged), never a plain-text 500 or a 400 that blames the
    client's subscription name (atk33 F04)."""
    from tiered.metadata import keys

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    hosted.produce(b"m0")
    hosted.produce(b"m1")
    local_cluster.metadata.put(keys.lost_key(TOPIC, 1, 0), b"not json")
    local_cluster.metadata.put(keys.cursor_key(TOPIC, "s"), b'{"last_acked_offset": "1"}')

    async def scenario(client):
        answers = []
        for response in (await client.get(PATH, params={"from": "1", "epoch": "0"}),
                         await client.post("/topics/default/reliable_topic/subscriptions/s/ack",
                                           json={"offset": 1, "epoch": 0}),
                         await client.post("/topics/default/reliable_topic/subscriptions/s/ack",
                                           json={"offset": 1})):  # the cursor's own record
            answers.append((response.status, response.content_type, (await response.json())["error"]["type"]))
        return answers

    for status, content_type, kind in _run(a, scenario):
        assert status == 500 and content_type == "application/json" and kind == "MalformedRecord"


def test_an_archived_wait_whose_copy_stopped_archiving_is_a_503_to_retry(local_cluster: Cluster, monkeypatch) -> None:
    """A paused owner replaced meanwhile: its ``archived`` wait ends with UploaderStopped.
    The topic left this broker, so the client is told to retry (503 + Retry-After), as for
    every other such case, not a final 500 (atk36 F-L2)."""
    from uploader.errors import UploaderStopped

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)

    async def stopped(*_args, **_kwargs):
        raise UploaderStopped("the uploader of this copy stopped: fenced by a newer owner")

    monkeypatch.setattr(hosted, "produce_many_async", stopped)

    async def scenario(client):
        response = await client.post(PATH, params={"ack": "archived"}, json={"messages": [{"payload": "x"}]})
        return response.status, response.headers.get("Retry-After"), (await response.json())["error"]["type"]

    status, retry_after, kind = _run(a, scenario)
    assert status == 503 and retry_after is not None and kind == "Unavailable"


def test_dnb_consume_through_a_broker_from_earliest_starts_at_the_first_retained_offset(
        local_cluster: Cluster) -> None:
    """``--from earliest`` is the way past a cursor or offset below the archive start
    (docs/CLI.md): through a broker too it reads from the first offset retention kept,
    where an explicit ``--from 0`` stays the error naming it (atk65 f03)."""
    import pytest

    from tiered.broker.client import BrokerRequestError
    from tiered.metadata import keys
    from tiered.tools.cli.ops import consume_remote

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    for payloads in ([b"m0", b"m1"], [b"m2", b"m3"]):  # archived acks: one object each (0-1, 2-3)
        hosted.produce_many(payloads, ack="archived")
    # What a cut leaves (start raised, then the descriptor below it deleted).
    local_cluster.metadata.put(keys.archive_start_key(TOPIC),
                               keys.ArchiveStart(2, "A", hosted.token.epoch, time.time()).to_json())
    local_cluster.metadata.delete(keys.descriptor_key(TOPIC, 0))

    async def main():
        server = TestServer(BrokerServer(a).app())
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        try:
            got = await asyncio.to_thread(consume_remote, url, TOPIC, "s", "earliest", None, False)
            with pytest.raises(BrokerRequestError) as below:
                await asyncio.to_thread(consume_remote, url, TOPIC, "s", 0, None, False)
            return got, below.value
        finally:
            await server.close()

    messages, below = asyncio.run(main())
    assert [(m.offset, bytes(m.payload)) for m in messages] == [(2, b"m2"), (3, b"m3")]
    assert below.type == "OffsetBelowRetention" and below.error["first_retained_offset"] == 2


class _StallingPuts:
    """An object store whose uploads (``put``) block until ``release`` is set."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.release = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def put(self, *args, **kwargs):
        self.release.wait(2 * STALL_HANG_GUARD_S)
        return self.inner.put(*args, **kwargs)


def test_archived_produces_waiting_on_a_stalled_store_do_not_hold_up_acks_elsewhere(local_cluster: Cluster,
                                                                                     monkeypatch) -> None:
    """atk69 F3: each ``archived`` produce held a thread of the loop's default executor (6
    on a 2-core machine) for its whole wait; with the object store stalled, a few of them
    made every ack and subscription read on every topic wait until they timed out. The
    wait is awaited without a thread now: the ack on another topic is answered while all
    of them still wait."""
    from tiered.lifecycle import BrokerHost

    produces = 12
    monkeypatch.setattr(server_module, "PRODUCES_IN_FLIGHT_PER_TOPIC", produces)  # all on one topic
    store = _StallingPuts(local_cluster.objects)
    a = BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, store, local_cluster.config)
    local_cluster.hosts.append(a)
    busy = a.load(TOPIC)
    a.load("/default/other").produce(b"o0", ack="durable")

    async def scenario(client):
        waiting = [asyncio.create_task(client.post(PATH, params={"ack": "archived"},
                                                   json={"messages": [{"payload": f"m{i}"}]}))
                   for i in range(produces)]
        for _ in range(int(20 / 0.01)):  # every produce appended (and waits for the archive)
            if busy.next_offset == produces:
                break
            await asyncio.sleep(0.01)
        assert busy.next_offset == produces, "the produces did not all get appended"
        acked = await client.post("/topics/default/other/subscriptions/s/ack", json={"offset": 0})
        read = await client.get("/topics/default/other/messages", params={"subscription": "s", "wait_s": "0"})
        still_waiting = sum(not task.done() for task in waiting)
        store.release.set()
        answers = [await (await task).json() for task in waiting]
        return acked.status, read.status, still_waiting, answers

    try:
        acked, read, still_waiting, answers = _run(a, scenario)
    finally:
        store.release.set()
    assert (acked, read) == (200, 200)
    assert still_waiting == produces, "the ack waited for archived produces on another topic"
    assert sorted(answer["offsets"][0] for answer in answers) == list(range(produces))


def test_a_read_answer_stops_at_max_bytes_but_always_holds_one_message(local_cluster: Cluster) -> None:
    """atk69 F2: a read was bounded in messages only (10,000 of up to 4 MiB each, built in
    memory): a budget of payload bytes ends it, past the first message."""
    a = local_cluster.broker("A")
    a.load(TOPIC).produce_many([bytes([i]) * 1000 for i in range(5)] + [b"x" * 5000], ack="durable")

    async def scenario(client):
        answers = []
        for params in ({"from": "0", "max_bytes": "2500"}, {"from": "3", "max_bytes": "2500"},
                       {"from": "5", "max_bytes": "100"}, {"from": "0", "max_bytes": "0"}):
            response = await client.get(PATH, params=params)
            body = await response.json()
            answers.append((response.status, [m["offset"] for m in body.get("messages", [])], body.get("next")))
        return answers

    assert _run(a, scenario) == [(200, [0, 1, 2], 3), (200, [3, 4, 5], 6), (200, [5], 6), (400, [], None)]


def test_a_produce_of_too_many_messages_is_refused_whole(local_cluster: Cluster, monkeypatch) -> None:
    """atk69 F4: a 57 MiB body of tiny messages was decoded, appended and answered (4
    million offsets) on the event loop; a batch now has at most PRODUCE_MAX_MESSAGES, and
    is decoded on a thread."""
    monkeypatch.setattr(server_module, "PRODUCE_MAX_MESSAGES", 3)
    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)

    async def scenario(client):
        refused = await client.post(PATH, json={"messages": [{"payload": "x"}] * 4})
        taken = await client.post(PATH, json={"messages": [{"payload": "x"}] * 3})
        return refused.status, (await refused.json())["error"]["type"], await taken.json()

    assert _run(a, scenario) == (400, "BatchTooLarge", {"offsets": [0, 1, 2]})
    assert hosted.next_offset == 3


def test_deleting_a_subscription_on_the_owner(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    a.load(TOPIC)
    subscription = "/topics/default/reliable_topic/subscriptions/s"

    async def scenario(client):
        await client.post(PATH, json={"messages": [{"payload": "a"}, {"payload": "b"}, {"payload": "c"}]})
        await client.post(subscription + "/ack", json={"offset": 1})
        before = await (await client.get(PATH, params={"subscription": "s"})).json()
        deleted = await (await client.delete(subscription)).json()
        again = await (await client.delete(subscription)).json()
        after = await (await client.get(PATH, params={"subscription": "s"})).json()
        bad = await client.delete("/topics/default/reliable_topic/subscriptions/a%20b")
        return before, deleted, again, after, (bad.status, (await bad.json())["error"]["type"])

    before, deleted, again, after, bad = _run(a, scenario)
    assert [m["offset"] for m in before["messages"]] == [2]
    assert (deleted, again) == ({"deleted": True}, {"deleted": False})
    # Read again under the name: a new subscription, from the earliest offset.
    assert [m["offset"] for m in after["messages"]] == [0, 1, 2]
    assert bad == (400, "InvalidSubscription")


async def _until(condition) -> None:
    """Returns once ``condition()`` holds (checked every 10 ms); fails the test if it does
    not within STALL_HANG_GUARD_S (a guard against a hang, never a timing assumption)."""
    deadline = time.monotonic() + STALL_HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def _appends_wait_for_room(busy, monkeypatch) -> tuple[threading.Event, list[int], list[int]]:
    """``busy``'s appends wait (as for room under its ``pending_bytes_max``) until the event
    returned is set; also how many are waiting now and the most that waited at once."""
    room = threading.Event()
    inside, most = [0], [0]
    lock = threading.Lock()
    append_many = busy._append_many  # noqa: SLF001

    def waiting_for_room(payloads, key):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            assert room.wait(STALL_HANG_GUARD_S), "the test never let the appends go on"
            return append_many(payloads, key)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(busy, "_append_many", waiting_for_room)
    return room, inside, most


def test_appends_waiting_for_room_on_one_topic_leave_append_threads_to_the_others(local_cluster: Cluster,
                                                                                  monkeypatch) -> None:
    """One pool of append threads serves every topic. Produces to a flooded topic wait in
    their append for room (its own ``pending_bytes_max``); before, 16 of them held every
    thread and a produce to any other topic waited behind them (atk87's note, atk90 measured
    p50 0.57 s). A topic now holds at most APPEND_THREADS_PER_TOPIC threads; its other
    produces wait for one of its own, holding no thread."""
    a = local_cluster.broker("A")
    busy = a.load(TOPIC)
    a.load("/default/other")
    room, inside, most = _appends_wait_for_room(busy, monkeypatch)
    # More than the pool's threads: before, the topic held all of them.
    monkeypatch.setattr(server_module, "PRODUCES_IN_FLIGHT_PER_TOPIC", server_module.APPEND_THREADS_MAX + 4)
    produces = server_module.APPEND_THREADS_MAX + 4

    async def scenario(client):
        flooding = [asyncio.create_task(client.post(PATH, json={"messages": [{"payload": f"m{i}"}]}))
                    for i in range(produces)]
        await _until(lambda: inside[0] == server_module.APPEND_THREADS_PER_TOPIC)
        other = await asyncio.wait_for(client.post("/topics/default/other/messages",
                                                   json={"messages": [{"payload": "o"}]}), STALL_HANG_GUARD_S)
        other_answer = (other.status, await other.json())
        room.set()
        answers = [await (await task).json() for task in flooding]
        return other_answer, answers

    try:
        other_answer, answers = _run(a, scenario)
    finally:
        room.set()
    assert other_answer == (200, {"offsets": [0]})
    assert most[0] == server_module.APPEND_THREADS_PER_TOPIC
    assert sorted(answer["offsets"][0] for answer in answers) == list(range(produces))


def test_one_topic_takes_at_most_its_share_of_the_produce_slots(local_cluster: Cluster, monkeypatch) -> None:
    """atk94 F2: produces waiting for a flooded topic's append threads still counted among
    the broker's 32 produce slots, so 32 of them turned every other topic's produce into a
    503, and the last in line waited minutes. A topic holds at most
    PRODUCES_IN_FLIGHT_PER_TOPIC; past it, a 503 to retry for that topic alone."""
    a = local_cluster.broker("A")
    busy = a.load(TOPIC)
    a.load("/default/other")
    room, _inside, _most = _appends_wait_for_room(busy, monkeypatch)
    share = server_module.PRODUCES_IN_FLIGHT_PER_TOPIC
    server = BrokerServer(a)
    slots = server._append_slots  # noqa: SLF001 - the server's table of per-topic slots

    async def scenario(client):
        held = [asyncio.create_task(client.post(PATH, json={"messages": [{"payload": f"m{i}"}]}))
                for i in range(share)]
        await _until(lambda: busy.topic in slots and slots[busy.topic].requests == share)
        refused = await client.post(PATH, json={"messages": [{"payload": "late"}]})
        refused_answer = (refused.status, refused.headers.get("Retry-After"))
        other = await asyncio.wait_for(client.post("/topics/default/other/messages",
                                                   json={"messages": [{"payload": "o"}]}), STALL_HANG_GUARD_S)
        room.set()
        answers = [await (await task).json() for task in held]
        return refused_answer, other.status, answers, dict(slots)

    async def main():
        async with TestClient(TestServer(server.app())) as client:
            return await scenario(client)

    try:
        refused_answer, other_status, answers, left = asyncio.run(main())
    finally:
        room.set()
    assert refused_answer == (503, str(server_module.RETRY_AFTER_S))
    assert other_status == 200
    assert sorted(answer["offsets"][0] for answer in answers) == list(range(share))
    assert left == {}, "a topic no longer produced to keeps its entry"


def test_a_cancelled_produce_keeps_its_append_slot_until_the_append_is_done(local_cluster: Cluster,
                                                                            monkeypatch) -> None:
    """atk94 F1: the slot was given back when the waiting call was cancelled (a client gone,
    a timeout), while its thread still ran the append: a topic could then hold every thread."""
    from concurrent.futures import ThreadPoolExecutor

    a = local_cluster.broker("A")
    busy = a.load(TOPIC)
    room, _inside, _most = _appends_wait_for_room(busy, monkeypatch)

    class Slot:
        def __init__(self) -> None:
            self.held = 0

        async def acquire(self) -> None:
            self.held += 1

        def release(self) -> None:
            self.held -= 1

    slot = Slot()

    async def main():
        with ThreadPoolExecutor(2) as pool:
            try:
                await asyncio.wait_for(busy.produce_many_async([b"m"], executor=pool, append_slot=slot), 0.05)
            except asyncio.TimeoutError:
                pass
            held_after_cancel = slot.held
            room.set()
            await _until(lambda: not slot.held)
            return held_after_cancel, slot.held

    try:
        held_after_cancel, held_at_end = asyncio.run(main())
    finally:
        room.set()
    assert (held_after_cancel, held_at_end) == (1, 0)


def test_a_small_produce_is_not_decoded_behind_large_bodies(local_cluster: Cluster, monkeypatch) -> None:
    """Bodies are decoded one at a time (json's parser holds the GIL); a one-message
    produce waited behind every large body queued before it. Small bodies have their own
    turn now."""
    a = local_cluster.broker("A")
    a.load(TOPIC)
    a.load("/default/other")
    decoded = threading.Event()
    started = threading.Event()
    produce_body = server_module._produce_body

    def slow_for_large(raw):
        if len(raw) > server_module.SMALL_BODY_DECODE_BYTES:
            started.set()
            assert decoded.wait(STALL_HANG_GUARD_S), "the test never let the decode go on"
        return produce_body(raw)

    monkeypatch.setattr(server_module, "_produce_body", slow_for_large)
    large = {"messages": [{"payload": "x" * 1000} for _ in range(100)]}

    async def scenario(client):
        big = asyncio.create_task(client.post(PATH, json=large))
        await _until(started.is_set)
        small = await asyncio.wait_for(client.post("/topics/default/other/messages",
                                                   json={"messages": [{"payload": "o"}]}), STALL_HANG_GUARD_S)
        small_answer = (small.status, big.done())
        decoded.set()
        return small_answer, await (await big).json()

    try:
        small_answer, big_answer = _run(a, scenario)
    finally:
        decoded.set()
    assert small_answer == (200, False), "the small produce was answered only after the large one"
    assert big_answer == {"offsets": list(range(100))}


def test_an_append_slot_is_given_back_even_after_its_event_loop_closed(local_cluster: Cluster, monkeypatch) -> None:
    """atk95 F1: a slot whose append finished after the event loop had closed was never
    given back, and a server served again on a new loop could not produce to that topic."""
    from concurrent.futures import ThreadPoolExecutor

    a = local_cluster.broker("A")
    busy = a.load(TOPIC)
    room, _inside, _most = _appends_wait_for_room(busy, monkeypatch)

    class Slot:
        held = 0

        async def acquire(self) -> None:
            Slot.held += 1

        def release(self) -> None:
            Slot.held -= 1

    async def give_up():
        try:
            await asyncio.wait_for(busy.produce_many_async([b"m"], executor=pool, append_slot=Slot()), 0.05)
        except asyncio.TimeoutError:
            pass

    with ThreadPoolExecutor(1) as pool:
        try:
            asyncio.run(give_up())  # the loop closes with the append still waiting for room
            assert Slot.held == 1
        finally:
            room.set()
    assert Slot.held == 0  # the pool's exit waited for the append


def test_a_produce_after_the_append_threads_shut_down_is_a_retryable_error(local_cluster: Cluster) -> None:
    """atk95 F2: an append handed to the threads after the server closed them was a bare
    500 (RuntimeError); it is TopicUnloading, which the server answers 503."""
    from concurrent.futures import ThreadPoolExecutor

    from tiered.lifecycle.errors import TopicUnloading

    a = local_cluster.broker("A")
    busy = a.load(TOPIC)
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    slot = asyncio.Semaphore(1)

    async def produce():
        await busy.produce_many_async([b"m"], executor=pool, append_slot=slot)

    with pytest.raises(TopicUnloading, match="shutting down"):
        asyncio.run(produce())
    assert not slot.locked(), "the slot was given back"
    assert busy.next_offset == 0
