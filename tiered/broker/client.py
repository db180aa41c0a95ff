"""A client of ``dnb broker`` processes: asyncio (:class:`BrokerClient`) and blocking
(:class:`SyncBrokerClient`).

It finds a topic's owner by asking any broker (a broker that does not own the topic
answers ``307`` to the owner's address), remembers the owner per topic, and rides out
moves: ``503`` (the topic is sealing or unassigned, or a read's archive did not answer in
time: ``ReadTimeout``) is retried with back-off across the known brokers until
``timeout_s`` (then :class:`BrokerUnavailable`); a read that ends with ``moved`` continues at its own
``next`` offset on the new owner. Every call is bounded; nothing waits for ever.

Delivery: a produce whose answer was lost (connection dropped, timeout) is not retried
by the client, because it may have been appended; the caller decides. Acknowledged
offsets are unique and contiguous whatever happens to the brokers, and a reader that
resumes at ``next`` sees every offset once, in order.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import json
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from native.errors import DnbError
from tiered.backoff import Backoff
from wal.topics import TopicName

T = TypeVar("T")


#: Read batches remembered per topic for history checks (acks drop the ones they cover).
BATCHES_REMEMBERED = 4096


class BrokerClientError(DnbError):
    """Base class of the errors this client raises."""


class BrokerUnavailable(BrokerClientError):
    """No broker served the topic within the call's time bound."""


class BrokerRequestError(BrokerClientError):
    """A broker refused the request (bad input, message too large, unknown offset...)."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {error.get('type')}: {error.get('message')}")
        self.status = status
        self.type = error.get("type")
        self.error = error  # the broker's whole error object (e.g. first_retained_offset)


class HistoryDiverged(BrokerRequestError):
    """A failover replaced the history this client was reading: offsets from
    ``resume_from`` on were lost (what the client read there is not the topic's history
    any more) and now hold other messages. Continue reading at ``resume_from``."""

    def __init__(self, status: int, error: dict[str, Any]) -> None:
        super().__init__(status, error)
        self.resume_from = int(error["resume_from"])


@dataclass(frozen=True, slots=True)
class ReadBatch:
    messages: list[dict[str, Any]]  # offset, publish_time, attributes, key (bytes|None), payload (bytes)
    next_offset: int
    #: The owner epoch the batch was served under. An application that stores its position
    #: elsewhere stores this beside it and passes it back (``read(..., epoch=)``), so a
    #: failover that replaced what it read is reported (HistoryDiverged), not skipped.
    epoch: int | None = None


class BrokerClient:
    def __init__(self, brokers: Sequence[str], *, timeout_s: float = 60.0, backoff_s: float = 0.05,
                 backoff_max_s: float = 1.0) -> None:
        if not brokers:
            raise ValueError("at least one broker URL is needed")
        self.brokers = [b.rstrip("/") for b in brokers]
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._owner: dict[str, str] = {}
        #: Per topic: (first, last, epoch) of recent read batches, oldest first. A read or
        #: ack sends back the epoch of the OLDEST batch that delivered the offset it
        #: continues after, so a broker can tell a failover replaced that history (a later
        #: prefetch under the new owner must not vouch for messages read before it).
        self._batches: dict[str, collections.deque[tuple[int, int, int]]] = {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "BrokerClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- API -----------------------------------------------------------------------
    async def produce(self, topic: str, payloads: Sequence[bytes], *, ack: str = "durable",
                      key: bytes | None = None) -> list[int]:
        body: dict[str, Any] = {"messages": [{"payload_b64": base64.b64encode(p).decode()} for p in payloads]}
        if key is not None:
            body["key_b64"] = base64.b64encode(key).decode()
        answer = await self._call("POST", topic, "messages", params={"ack": ack}, body=body, retry_unsent_only=True)
        return list(answer["offsets"])

    async def read(self, topic: str, start: int | None = None, *, subscription: str | None = None,
                   max_messages: int = 100, wait_s: float = 1.0, epoch: int | None = None) -> ReadBatch:
        """Messages from ``start``, or from after ``subscription``'s acknowledged cursor
        (exactly one of the two); follows the topic across moves (``next_offset`` is where
        to continue). A subscription read serves from the cursor every time: what was
        read but not acknowledged is served again."""
        if (start is None) == (subscription is None):
            raise ValueError("give exactly one of start and subscription")
        where = {"from": str(start)} if subscription is None else {"subscription": subscription}
        name = str(TopicName.parse(topic))
        deadline = time.monotonic() + self.timeout_s
        while True:
            params = {**where, "max": str(max_messages), "wait_s": str(wait_s)}
            vouch = self._epoch_of(name, start - 1) if start is not None else None
            vouch = epoch if vouch is None else vouch
            if vouch is not None:
                params["epoch"] = str(vouch)
            answer = await self._call("GET", topic, "messages", params=params)
            messages = [_decode(m) for m in answer["messages"]]
            if messages and isinstance(answer.get("epoch"), int):
                batches = self._batches.setdefault(name, collections.deque(maxlen=BATCHES_REMEMBERED))
                batches.append((messages[0]["offset"], messages[-1]["offset"], answer["epoch"]))
            if messages or not answer["moved"]:
                served = answer.get("epoch")
                return ReadBatch(messages, answer["next"], served if isinstance(served, int) else None)
            self._owner.pop(str(TopicName.parse(topic)), None)  # moved with nothing read: ask again
            if time.monotonic() >= deadline:
                raise BrokerUnavailable(f"topic {topic} kept moving for {self.timeout_s}s")

    async def ack(self, topic: str, subscription: str, offset: int) -> int:
        """Acknowledge through ``offset``. Raises :class:`HistoryDiverged` when the
        messages were read from a history a failover replaced (the ack would skip the
        new messages at those offsets)."""
        name = str(TopicName.parse(topic))
        body: dict[str, Any] = {"offset": offset}
        epoch = self._epoch_of(name, offset)
        if epoch is not None:
            body["epoch"] = epoch
        answer = await self._call("POST", topic, f"subscriptions/{subscription}/ack", body=body)
        batches = self._batches.get(name)
        if batches:  # acknowledged: those reads need no vouching any more
            kept = [b for b in batches if b[1] > offset]
            batches.clear()
            batches.extend(kept)
        return int(answer["cursor"])

    async def unsubscribe(self, topic: str, subscription: str) -> bool:
        """Delete the subscription (its cursor is gone; a read or ack naming it later
        creates it again, from the earliest offset). True if it existed; retried on 503
        (an unknown outcome included: a repeated delete answers false)."""
        answer = await self._call("DELETE", topic, f"subscriptions/{subscription}")
        return bool(answer["deleted"])

    def _epoch_of(self, name: str, offset: int) -> int | None:
        """The epoch of the oldest remembered batch that delivered ``offset``."""
        for first, last, epoch in self._batches.get(name, ()):
            if first <= offset <= last:
                return epoch
        return None

    def _forget_replaced(self, name: str, resume_from: int) -> None:
        """After HistoryDiverged: what was read from ``resume_from`` on under older epochs
        is void (batches trimmed), so later reads and acks vouch with what replaced it."""
        batches = self._batches.get(name)
        if not batches:
            return
        kept = [(first, min(last, resume_from - 1), epoch) for first, last, epoch in batches
                if first < resume_from]
        batches.clear()
        batches.extend(kept)

    # -- plumbing ------------------------------------------------------------------
    async def _call(self, method: str, topic: str, tail: str, *, params: dict[str, str] | None = None,
                    body: dict[str, Any] | None = None, retry_unsent_only: bool = False) -> dict[str, Any]:
        name = TopicName.parse(topic)
        path = f"/topics/{name.namespace}/{name.name}/{tail}"
        deadline = time.monotonic() + self.timeout_s
        backoff = Backoff(self.backoff_s, self.backoff_max_s)
        attempt = 0
        session = self._session_or_new()
        while True:
            base = self._owner.get(str(name)) or self.brokers[attempt % len(self.brokers)]
            url = base + path
            for _ in range(4):  # a few redirects at most: owner -> owner is a loop
                remaining = max(0.1, deadline - time.monotonic())
                try:
                    async with session.request(method, url, params=params, json=body, allow_redirects=False,
                                               timeout=aiohttp.ClientTimeout(total=remaining)) as response:
                        if response.status == 307:
                            url = response.headers["Location"]
                            self._owner[str(name)] = url[: url.index("/topics/")]
                            continue
                        payload = await _json_or_error(response)
                        if response.status == 200:
                            self._owner[str(name)] = url[: url.index("/topics/")]
                            return payload
                        if response.status == 409 and payload.get("error", {}).get("type") == "HistoryDiverged":
                            diverged = HistoryDiverged(response.status, payload["error"])
                            self._forget_replaced(str(name), diverged.resume_from)
                            raise diverged
                        if response.status != 503:
                            raise BrokerRequestError(response.status, payload.get("error", {}))
                        self._owner.pop(str(name), None)
                        break
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                    # ClientPayloadError: the answer was cut short (a broker killed while
                    # sending it), which aiohttp does not count as a connection error.
                    self._owner.pop(str(name), None)
                    if retry_unsent_only and not isinstance(e, aiohttp.ClientConnectorError):
                        raise  # the request may have reached the broker: not ours to repeat
                    break
            attempt += 1
            delay_s = backoff.next_s()
            if time.monotonic() + delay_s >= deadline:
                raise BrokerUnavailable(f"no broker served {name} within {self.timeout_s}s")
            await asyncio.sleep(delay_s)

    def _session_or_new(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session


class SyncBrokerClient:
    """The blocking twin: the same client on a private event loop thread."""

    def __init__(self, brokers: Sequence[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dnb-client", daemon=True)
        self._thread.start()
        self._client = BrokerClient(brokers, **options)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(self._client.timeout_s + 10)

    def produce(self, topic: str, payloads: Sequence[bytes], **options: Any) -> list[int]:
        return self._run(self._client.produce(topic, payloads, **options))

    def read(self, topic: str, start: int | None = None, **options: Any) -> ReadBatch:
        return self._run(self._client.read(topic, start, **options))

    def ack(self, topic: str, subscription: str, offset: int) -> int:
        return self._run(self._client.ack(topic, subscription, offset))

    def unsubscribe(self, topic: str, subscription: str) -> bool:
        return self._run(self._client.unsubscribe(topic, subscription))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "SyncBrokerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _json_or_error(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON answer; an answer that is not JSON (a proxy's or a crashed handler's
    error page) is a :class:`BrokerRequestError`, never a decoding error."""
    text = await response.text()
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        payload = None
    if not isinstance(payload, dict):
        raise BrokerRequestError(response.status, {"type": "NotJson", "message": text[:200]})
    return payload


def _decode(m: dict[str, Any]) -> dict[str, Any]:
    return {"offset": m["offset"], "publish_time": m["publish_time"], "attributes": m["attributes"],
            "key": None if m["key_b64"] is None else base64.b64decode(m["key_b64"]),
            "payload": base64.b64decode(m["payload_b64"])}
