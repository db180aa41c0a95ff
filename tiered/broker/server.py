"""The HTTP face of one broker: produce, read, ack, and where to go instead.

Built on aiohttp (an asyncio HTTP server and client in one well-kept library: the
broker's loop already runs the lifecycle's async API, and the client side reuses it).
Every route that names a topic answers for the topic's *owner* only:

* hosted and open here -> served;
* hosted here but leaving (unload began, fenced) -> ``503`` with ``Retry-After``;
* not hosted here, and :meth:`BrokerHost.lookup` names a live owner that advertised an
  address -> ``307`` to the same path there;
* otherwise (moving, nobody owns it, owner dead) -> ``503`` with ``Retry-After``.

Never a silent empty answer. Payloads travel base64-encoded in JSON (``payload_b64``);
``payload`` (UTF-8 text) is accepted on produce as a convenience.

Routes:

* ``POST /topics/{ns}/{topic}/messages?ack=durable|archived`` body
  ``{"messages": [{"payload_b64": ...}, ...], "key_b64": optional}`` ->
  ``{"offsets": [first, ..., last]}`` once acknowledged.
* ``GET /topics/{ns}/{topic}/messages?from=N|subscription=NAME&max=M&wait_s=S`` ->
  ``{"messages": [...], "next": N, "moved": bool}``; long-polls up to ``wait_s`` for the
  first message. ``moved: true`` means the topic left this broker: look it up again and
  continue at ``next``.
* ``POST /topics/{ns}/{topic}/subscriptions/{name}/ack`` body ``{"offset": N}`` ->
  ``{"cursor": N}`` once the cursor is written.
* ``GET /topics``, ``GET /healthz``, ``GET /metrics`` (Prometheus text).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from tiered.lifecycle.host import BrokerHost, HostedTopic, LifecycleError, ProduceTimeout, TopicNotHosted, TopicState
from tiered.lifecycle.ownership import OwnershipLostError
from tiered.read.errors import InvalidAck, ReadError, TopicMoved, UnknownOffset
from wal.errors import InvalidTopicName, MessageTooLarge, OffsetOverflow
from wal.topics import TopicName

log = logging.getLogger(__name__)

#: Bounds of one read request (a long poll must not hold a connection for ever).
READ_MAX_MESSAGES = 10_000
READ_WAIT_MAX_S = 30.0
#: After the first message of a read, wait this long for more before answering.
READ_LINGER_S = 0.02
RETRY_AFTER_S = 1
#: Reads (long polls) block a thread each, so they get their own bounded pool: idle
#: pollers must never take the threads produce, ack, lookups and the seal at shutdown
#: need. A read beyond this many at once gets 503 + Retry-After instead of a queue.
READ_THREADS_MAX = 64


class BrokerServer:
    """The aiohttp application around one :class:`BrokerHost`."""

    def __init__(self, host: BrokerHost, registry: CollectorRegistry | None = None,
                 read_threads_max: int = READ_THREADS_MAX) -> None:
        self.host = host
        self.registry = registry if registry is not None else REGISTRY
        self._reads = ThreadPoolExecutor(read_threads_max, thread_name_prefix="dnb-read")
        self._read_slots = threading.BoundedSemaphore(read_threads_max)

    def close(self) -> None:
        """Stop the read pool (reads in flight end at their deadline or when their topic
        leaves); the aiohttp runner's cleanup calls this through ``on_cleanup``."""
        self._reads.shutdown(wait=False, cancel_futures=True)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes([
            web.post("/topics/{ns}/{name}/messages", self.produce),
            web.get("/topics/{ns}/{name}/messages", self.read),
            web.post("/topics/{ns}/{name}/subscriptions/{sub}/ack", self.ack),
            web.get("/topics", self.topics),
            web.get("/healthz", self.healthz),
            web.get("/metrics", self.metrics),
        ])

        async def cleanup(_app: web.Application) -> None:
            self.close()

        app.on_cleanup.append(cleanup)
        return app

    # -- routing to the owner ------------------------------------------------------
    async def _hosted(self, request: web.Request) -> HostedTopic:
        try:
            topic = TopicName.parse(f"/{request.match_info['ns']}/{request.match_info['name']}")
        except InvalidTopicName as e:
            raise _error(web.HTTPBadRequest, "InvalidTopicName", str(e)) from e
        try:
            hosted = self.host.topic(topic)
        except TopicNotHosted:
            hosted = None
        if hosted is not None:
            if hosted.state is TopicState.OPEN and not hosted.fenced:
                return hosted
            raise _unavailable(f"topic {topic} is leaving this broker ({hosted.state.value})")
        owner = await self.host.lookup_async(topic)
        if owner is not None and owner.live and owner.address and owner.broker_id != self.host.broker_id:
            raise web.HTTPTemporaryRedirect(owner.address.rstrip("/") + request.path_qs)
        why = "nobody owns it now (moving or not assigned)" if owner is None else \
            f"its owner {owner.broker_id} is {'not reachable by address' if owner.live else 'not alive'}"
        raise _unavailable(f"topic {topic} is not served here: {why}")

    # -- routes --------------------------------------------------------------------
    async def produce(self, request: web.Request) -> web.Response:
        hosted = await self._hosted(request)
        ack = request.query.get("ack", "durable")
        if ack not in ("durable", "archived"):
            raise _error(web.HTTPBadRequest, "InvalidAck", "ack must be durable or archived")
        body = await _json(request)
        payloads = [_payload(m) for m in _list(body, "messages")]
        key = _b64(body["key_b64"], "key_b64") if body.get("key_b64") is not None else None
        if not payloads:
            raise _error(web.HTTPBadRequest, "EmptyBatch", "messages is empty")
        try:
            first, last = await asyncio.to_thread(hosted.produce_many, payloads, key, ack=ack)
        except (OwnershipLostError, LifecycleError) as e:
            if isinstance(e, ProduceTimeout):
                raise _error(web.HTTPGatewayTimeout, type(e).__name__, str(e)) from e
            raise _unavailable(str(e)) from e
        except MessageTooLarge as e:
            raise _error(web.HTTPRequestEntityTooLarge, "MessageTooLarge", str(e)) from e
        except OffsetOverflow as e:
            raise _error(web.HTTPConflict, "OffsetOverflow", str(e)) from e
        assert first is not None and last is not None
        return web.json_response({"offsets": list(range(first, last + 1))})

    async def read(self, request: web.Request) -> web.Response:
        hosted = await self._hosted(request)
        limit = min(_int(request.query.get("max", "100"), "max", 1), READ_MAX_MESSAGES)
        wait_s = _seconds(request.query.get("wait_s", "0"), "wait_s", READ_WAIT_MAX_S)
        if "subscription" in request.query:
            sub = await _subscribe(hosted, request.query["subscription"])
            start = sub.cursor + 1
        else:
            start = _int(request.query.get("from", "0"), "from", 0)
        try:
            reader = hosted.create_reader(start, live=True)
        except UnknownOffset as e:
            raise _error(web.HTTPNotFound, "UnknownOffset", str(e)) from e
        except ReadError as e:
            raise _error(web.HTTPUnprocessableEntity, type(e).__name__, str(e)) from e
        if not self._read_slots.acquire(blocking=False):
            reader.close()
            raise _unavailable(f"this broker is serving {READ_THREADS_MAX} reads already; retry")
        try:
            messages, moved = await asyncio.get_running_loop().run_in_executor(
                self._reads, _read_batch, reader, limit, wait_s)
        finally:
            self._read_slots.release()
        return web.json_response({"messages": [_message_json(m) for m in messages],
                                  "next": start + len(messages), "moved": moved})

    async def ack(self, request: web.Request) -> web.Response:
        hosted = await self._hosted(request)
        body = await _json(request)
        offset = body.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise _error(web.HTTPBadRequest, "InvalidAck", "offset must be an integer")
        try:
            sub = await _subscribe(hosted, request.match_info["sub"])
            await asyncio.to_thread(sub.ack, offset)
            await asyncio.to_thread(sub.flush)
        except InvalidAck as e:
            raise _error(web.HTTPBadRequest, "InvalidAck", str(e)) from e
        except ReadError as e:  # fenced or closed: the topic is leaving
            raise _unavailable(str(e)) from e
        return web.json_response({"cursor": sub.cursor})

    async def topics(self, request: web.Request) -> web.Response:
        return web.json_response({"broker_id": self.host.broker_id, "topics": [
            {"topic": str(h.topic), "epoch": h.token.epoch, "next_offset": h.next_offset, "state": h.state.value}
            for h in self.host.topics()]})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "broker_id": self.host.broker_id, "topics": len(self.host.topics())})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry) + generate_latest(_WalMetrics(self.host))
        return web.Response(body=body, content_type="text/plain", charset="utf-8")


class _WalMetrics:
    """Every hosted WAL's metrics in one scrape. Each WAL keeps its own registry (its
    families carry a ``topic`` label), so the families are merged by name here: the text
    format allows one family per name."""

    def __init__(self, host: BrokerHost) -> None:
        self.host = host

    def collect(self):  # the prometheus_client collector protocol (used by generate_latest)
        from prometheus_client.core import Metric

        merged: dict[str, Metric] = {}
        for hosted in self.host.topics():
            registry = getattr(getattr(hosted.wal, "metrics", None), "registry", None)
            if registry is None:
                continue
            for family in registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(family.samples)
        return list(merged.values())


def _read_batch(reader: Any, limit: int, wait_s: float) -> tuple[list, bool]:
    """Up to ``limit`` messages: wait up to ``wait_s`` for the first, then take what
    arrives within a short linger. A watchdog closes the reader at the deadline (a live
    read blocks); a message is returned only if it was fully fetched before that."""
    messages: list = []
    moved = False
    first_deadline = time.monotonic() + wait_s
    stop = threading.Event()

    def watchdog() -> None:
        while not stop.wait(0.005):
            deadline = first_deadline if not messages else max(first_deadline, last_seen[0] + READ_LINGER_S)
            if time.monotonic() >= deadline:
                reader.close()
                return

    last_seen = [time.monotonic()]
    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    try:
        for message in reader:
            messages.append(message)
            last_seen[0] = time.monotonic()
            if len(messages) >= limit:
                break
    except TopicMoved:
        moved = True
    except ReadError:
        pass  # closed by the watchdog: what was read is the answer
    finally:
        stop.set()
        reader.close()
    return messages, moved


def _message_json(m: Any) -> dict[str, Any]:
    return {"offset": m.offset, "publish_time": m.publish_time, "attributes": m.attributes,
            "key_b64": None if m.key is None else base64.b64encode(m.key).decode(),
            "payload_b64": base64.b64encode(m.payload).decode()}


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as e:
        raise _error(web.HTTPBadRequest, "InvalidJson", f"body is not JSON: {e}") from e
    if not isinstance(body, dict):
        raise _error(web.HTTPBadRequest, "InvalidJson", "body must be a JSON object")
    return body


def _list(body: dict[str, Any], name: str) -> list:
    value = body.get(name)
    if not isinstance(value, list):
        raise _error(web.HTTPBadRequest, "InvalidJson", f"{name} must be a list")
    return value


def _payload(message: Any) -> bytes:
    if isinstance(message, dict) and isinstance(message.get("payload_b64"), str):
        return _b64(message["payload_b64"], "payload_b64")
    if isinstance(message, dict) and isinstance(message.get("payload"), str):
        return message["payload"].encode()
    raise _error(web.HTTPBadRequest, "InvalidJson", "each message needs payload_b64 (or payload as text)")


def _b64(value: Any, name: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError) as e:
        raise _error(web.HTTPBadRequest, "InvalidJson", f"{name} is not base64") from e


async def _subscribe(hosted: HostedTopic, name: str) -> Any:
    try:
        return await hosted.subscribe_async(name, "earliest")
    except ValueError as e:  # the name is not a valid key segment
        raise _error(web.HTTPBadRequest, "InvalidSubscription", str(e)) from e


def _seconds(raw: str, name: str, maximum: float) -> float:
    """A finite, non-negative duration capped at ``maximum`` (``nan`` would never expire)."""
    try:
        value = float(raw)
    except ValueError:
        raise _error(web.HTTPBadRequest, "InvalidParameter", f"{name} must be a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise _error(web.HTTPBadRequest, "InvalidParameter", f"{name} must be finite and >= 0")
    return min(value, maximum)


def _int(raw: str, name: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise _error(web.HTTPBadRequest, "InvalidParameter", f"{name} must be an integer") from None
    if value < minimum:
        raise _error(web.HTTPBadRequest, "InvalidParameter", f"{name} must be >= {minimum}")
    return value


def _error(kind: type[web.HTTPException], error: str, message: str) -> web.HTTPException:
    return kind(text=_error_json(error, message), content_type="application/json")


def _unavailable(message: str) -> web.HTTPException:
    return web.HTTPServiceUnavailable(text=_error_json("Unavailable", message), content_type="application/json",
                                      headers={"Retry-After": str(RETRY_AFTER_S)})


def _error_json(error: str, message: str) -> str:
    import json

    return json.dumps({"error": {"type": error, "message": message}})
