"""The HTTP face of one broker: produce, read, ack, and where to go instead.

Built on aiohttp (an asyncio HTTP server and client in one well-kept library: the
broker's loop already runs the lifecycle's async API, and the client side reuses it).
Every route that names a topic answers for the topic's *owner* only:

* hosted and open here -> served;
* hosted here but leaving (unload began, fenced) -> ``503`` with ``Retry-After``;
* not hosted here, and :meth:`BrokerHost.lookup` names a live owner that advertised an
  address -> ``307`` to the same path there;
* nobody owns it and a delete's tombstone blocks it -> ``410 TopicDeleted``; never created
  and ``broker.auto_create`` off -> ``404 TopicNotFound``;
* otherwise (moving, nobody owns it, owner dead) -> ``503`` with ``Retry-After``.

Never a silent empty answer. Payloads travel base64-encoded in JSON (``payload_b64``);
``payload`` (UTF-8 text) is accepted on produce as a convenience.

Routes:

* ``POST /topics/{ns}/{topic}/messages?ack=durable|archived`` body
  ``{"messages": [{"payload_b64": ...}, ...], "key_b64": optional}`` (at most
  ``PRODUCE_MAX_MESSAGES``) -> ``{"offsets": [first, ..., last]}`` once acknowledged.
* ``GET /topics/{ns}/{topic}/messages?from=N|subscription=NAME&max=M&max_bytes=B&wait_s=S``
  -> ``{"messages": [...], "next": N, "moved": bool, "epoch": E}``; long-polls up to
  ``wait_s`` for the first message; at most ``max`` messages (``READ_MAX_MESSAGES``) and,
  past the first, payload and key bytes up to ``max_bytes`` (``READ_BYTES_DEFAULT``, at
  most ``READ_BYTES_MAX``). ``moved: true`` means the topic left this broker: look it up again and
  continue at ``next``.
* ``POST /topics/{ns}/{topic}/subscriptions/{name}/ack`` body ``{"offset": N}`` ->
  ``{"cursor": N}`` once the cursor is written.
* ``DELETE /topics/{ns}/{topic}/subscriptions/{name}`` -> ``{"deleted": bool}`` once the
  subscription's cursor is gone (false: there was none).
* ``GET /topics``, ``GET /healthz``, ``GET /metrics`` (Prometheus text). ``/healthz`` is a
  503 once the WAL root's commit group failed (a restart replays its journal).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CollectorRegistry, generate_latest

from tiered.lifecycle import BrokerHost, HostedTopic, LifecycleError, ProduceTimeout, TopicNotHosted, TopicState
from tiered.lifecycle.ownership import OwnershipLostError
from uploader.errors import UploaderStopped
from tiered.errors import MalformedRecord, StorageUnavailable, TopicDeleted, TopicNotFound
from tiered.lifecycle.delete import check_not_deleted, topic_exists
from tiered.metadata import keys
from tiered.read.errors import (CorruptArchive, InvalidAck, ReadError, ReadTimeout, TooManySubscriptions, TopicMoved,
                                UnknownOffset)
from wal.errors import OffsetBelowRetention
from wal.errors import InvalidTopicName, MessageTooLarge, OffsetOverflow
from wal.topics import TopicName

log = logging.getLogger(__name__)

#: Bounds of one read request (a long poll must not hold a connection for ever).
READ_MAX_MESSAGES = 10_000
#: Bytes of payloads and keys in one read answer unless ``max_bytes`` says otherwise, and
#: the most ``max_bytes`` may ask for (base64 and JSON make the answer about 1.4 times
#: this, built in memory; up to READ_THREADS_MAX reads run at once). A message larger
#: than the budget is still served, alone.
READ_BYTES_DEFAULT = 1024 * 1024
READ_BYTES_MAX = 4 * 1024 * 1024
#: Bytes of read answers built and not yet taken by their clients, all reads together: a
#: read that finds more is a 503 + Retry-After before it reads anything (atk72 F5).
ANSWERS_BYTES_MAX = 256 * 1024 * 1024
#: Answers built at once: building one (base64, JSON) holds the GIL, and many at once
#: starved the event loop for seconds (atk72 F5).
_ANSWER_BUILDS = threading.BoundedSemaphore(2)
#: Messages in one produce request (it is decoded, appended and answered whole).
PRODUCE_MAX_MESSAGES = 10_000
#: Threads that append produced batches (an append may block on WAL backpressure): their
#: own pool, so appends never hold the threads acks, subscription reads, lookups and the
#: seal need (the loop's default executor). Bodies are decoded on a thread of their own;
#: acks are awaited without a thread.
APPEND_THREADS_MAX = 16
#: Of those, what one topic's produces may hold at once: appends that wait for room on a
#: flooded topic (its own ``pending_bytes_max``) leave the other threads to other topics.
#: Its further produces wait for one of its own, holding no thread.
APPEND_THREADS_PER_TOPIC = 4
#: Produce requests of one topic between their body's arrival and their answer: past it,
#: 503 + Retry-After for that topic alone. So one flooded topic holds at most this many of
#: the PRODUCES_IN_FLIGHT_MAX slots, and a request of it waits for about one other round of
#: its append threads (two when requests whose appends still run were cancelled: they no
#: longer count here, their threads do) (atk94 F2: 32 requests of one topic held every
#: slot, the other topics got 503s, and the last in line waited minutes).
PRODUCES_IN_FLIGHT_PER_TOPIC = 2 * APPEND_THREADS_PER_TOPIC
#: Produce bodies up to this size are decoded on a thread of their own, so a small produce
#: never waits behind large bodies queued for decoding (with 4 clients sending 5 MB bodies
#: to one topic, a one-message produce to another took 96 ms at p50, 12 clients 239 ms).
SMALL_BODY_DECODE_BYTES = 64 * 1024
READ_WAIT_MAX_S = 30.0
#: Once a read has messages and has caught up with what existed when it came, it takes
#: what else arrives within this window, then answers.
READ_LINGER_S = 0.02
#: Messages that exist when a read arrives are fetched (from an archived object, say)
#: whatever its ``wait_s``, within this bound: ``wait_s`` is how long to wait for
#: messages that do not exist yet, and an empty answer must mean "nothing there".
READ_FETCH_MAX_S = 30.0
RETRY_AFTER_S = 1
#: A produce body (JSON, once decoded from its Content-Encoding) is refused past this, or
#: past what one message of the topics' largest size takes in base64 if that is more.
BODY_BYTES_MAX = 16 * 1024 * 1024
#: Any other request body (an ack's) is refused past this.
SMALL_BODY_BYTES_MAX = 64 * 1024
#: Produce requests whose body arrived, between then and their answer: past it, 503 +
#: Retry-After (their bodies wait to be decoded, one at a time).
PRODUCES_IN_FLIGHT_MAX = 32
#: Bytes of produce bodies held at once (being read, or waiting to be decoded): a body
#: that would go past it waits (within BODY_READ_TIMEOUT_S) for others to be done.
BODIES_BYTES_MAX = 256 * 1024 * 1024
#: A request body must have arrived within this (a slow body holds a produce slot).
BODY_READ_TIMEOUT_S = 30.0
#: A read's answer must have been taken by the client within this; it is then cut off.
ANSWER_SEND_TIMEOUT_S = 30.0
#: Brackets, braces, commas and colons a produce body may hold: what json's parser builds
#: from them (lists above all) holds the GIL, about 0.1 s per 200,000 empty lists with the
#: garbage collector walking them; text payloads' own count too (use ``payload_b64``).
PRODUCE_STRUCTURE_MAX = 200_000
#: ... and an ack's (it needs about four).
SMALL_STRUCTURE_MAX = 64
#: Charsets a JSON body may declare (JSON is UTF-8: RFC 8259). Others are refused, never
#: decoded: some of Python's codecs take quadratic time (punycode).
_UTF8_CHARSETS = frozenset({None, "utf-8", "utf8", "us-ascii", "ascii"})
_INTEGER = re.compile(r"-?[0-9]{1,40}")
#: Reads (long polls) block a thread each, so they get their own bounded pool: idle
#: pollers must never take the threads produce, ack, lookups and the seal at shutdown
#: need. A read beyond this many at once gets 503 + Retry-After instead of a queue.
#: 256, not 64: with 64, a hundred consumers long-polling one broker starved each other
#: (refused ones back off while answered ones re-poll at once and take the slots):
#: bench_broker.py saw reads fail after 30 s of 503s and acked messages undelivered.
#: Threads that wait are cheap (the read and its watchdog sleep until woken).
READ_THREADS_MAX = 256


class BrokerServer:
    """The aiohttp application around one :class:`BrokerHost`."""

    def __init__(self, host: BrokerHost, registry: CollectorRegistry | None = None,
                 read_threads_max: int = READ_THREADS_MAX, body_bytes_max: int | None = None) -> None:
        self.host = host
        largest = host.config.wal_config.max_message_bytes
        #: The largest produce body taken (decoded): BODY_BYTES_MAX, or one message of the
        #: largest size in base64 with room to spare.
        self.body_bytes_max = body_bytes_max if body_bytes_max is not None else \
            max(BODY_BYTES_MAX, 4 * ((largest + 2) // 3) + SMALL_BODY_BYTES_MAX)
        self._produces_in_flight = 0
        self._answer_bytes = 0  # read answers built and not yet taken (ANSWERS_BYTES_MAX)
        #: Bytes of produce bodies being read or waiting to be decoded, all requests together.
        self._body_bytes = _ByteBudget(max(BODIES_BYTES_MAX, self.body_bytes_max))
        self.registry = registry if registry is not None else host.metrics_registry
        self._reads = ThreadPoolExecutor(read_threads_max, thread_name_prefix="dnb-read")
        self._appends = ThreadPoolExecutor(APPEND_THREADS_MAX, thread_name_prefix="dnb-append")
        # Decoding holds the GIL (json's parser never lets go of it), so more threads would
        # not decode faster: bodies wait their turn here, bounded by PRODUCES_IN_FLIGHT_MAX.
        # Small ones have their own turn (SMALL_BODY_DECODE_BYTES), each short.
        self._decodes = ThreadPoolExecutor(1, thread_name_prefix="dnb-decode")
        self._small_decodes = ThreadPoolExecutor(1, thread_name_prefix="dnb-decode-small")
        #: Per topic: its produces holding an append thread (APPEND_THREADS_PER_TOPIC) and
        #: those waiting for one of its slots. The event loop's thread only.
        self._append_slots: dict[TopicName, _AppendSlots] = {}
        self._read_slots = threading.BoundedSemaphore(read_threads_max)

    def close(self) -> None:
        """Stop the read pool (reads in flight end at their deadline or when their topic
        leaves); the aiohttp runner's cleanup calls this through ``on_cleanup``."""
        self._reads.shutdown(wait=False, cancel_futures=True)
        self._appends.shutdown(wait=False, cancel_futures=True)
        self._decodes.shutdown(wait=False, cancel_futures=True)
        self._small_decodes.shutdown(wait=False, cancel_futures=True)

    def app(self) -> web.Application:
        # aiohttp's own bound is a backstop: each route reads its body with its own (_body).
        app = web.Application(client_max_size=self.body_bytes_max + 1, middlewares=[_typed_errors])
        app.add_routes([
            web.post("/topics/{ns}/{name}/messages", self.produce),
            web.get("/topics/{ns}/{name}/messages", self.read),
            web.post("/topics/{ns}/{name}/subscriptions/{sub}/ack", self.ack),
            web.delete("/topics/{ns}/{name}/subscriptions/{sub}", self.unsubscribe),
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
            if not hosted.fenced:
                raise _unavailable(f"topic {topic} is leaving this broker ({hosted.state.value})")
            # Fenced: another broker owns it now; send the client there (below), never a
            # 503 for as long as this stale copy lingers here.
        owner = await self.host.lookup_async(topic)
        if owner is not None and owner.live and owner.address and owner.broker_id != self.host.broker_id:
            raise web.HTTPTemporaryRedirect(owner.address.rstrip("/") + request.path_qs)
        if owner is None:
            gone = await asyncio.to_thread(self._gone, topic)
            if gone is not None:
                raise gone
        why = "nobody owns it now (moving or not assigned)" if owner is None else \
            f"its owner {owner.broker_id} is {'not reachable by address' if owner.live else 'not alive'}"
        raise _unavailable(f"topic {topic} is not served here: {why}")

    def _gone(self, topic: TopicName) -> web.HTTPException | None:
        """For a topic nobody owns: ``410 TopicDeleted`` when a delete's tombstone blocks it,
        ``404 TopicNotFound`` when it was never created and this broker does not create
        topics (``broker.auto_create`` off); None (the 503 that says "retry") otherwise."""
        try:
            check_not_deleted(self.host.metadata, topic)
        except TopicDeleted as e:
            return _error(web.HTTPGone, "TopicDeleted", str(e))
        if not self.host.config.auto_create and not topic_exists(self.host.metadata, topic):
            return _error(web.HTTPNotFound, "TopicNotFound",
                          str(TopicNotFound(topic, "auto_create is off; create it first (dnb topic create)")))
        return None

    # -- routes --------------------------------------------------------------------
    async def produce(self, request: web.Request) -> web.Response:
        hosted = await self._hosted(request)
        ack = request.query.get("ack", "durable")
        if ack not in ("durable", "archived"):
            raise _error(web.HTTPBadRequest, "InvalidAck", "ack must be durable or archived")
        if request.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
            # Decompressed, 16 KB on the wire held 16 MiB of the bodies' byte budget: 16
            # such connections held all of it, and every producer waited (atk72 F6).
            raise _error(web.HTTPUnsupportedMediaType, "UnsupportedEncoding",
                         "a produce body is sent without Content-Encoding")
        # The body's bytes count against what all bodies being read or decoded may hold
        # (a slow body holds only what it sent: it never blocks the others), and only a
        # body that arrived takes one of the produce slots (atk71 F2).
        raw = await _body(request, self.body_bytes_max, self._body_bytes)
        try:
            if self._produces_in_flight >= PRODUCES_IN_FLIGHT_MAX:
                raise _unavailable(f"this broker is decoding {PRODUCES_IN_FLIGHT_MAX} produce requests already; retry")
            slots = self._append_slots.get(hosted.topic)
            if slots is not None and slots.requests >= PRODUCES_IN_FLIGHT_PER_TOPIC:
                raise _unavailable(f"topic {hosted.topic} has {PRODUCES_IN_FLIGHT_PER_TOPIC} produce requests in "
                                   "flight already; retry")
            if slots is None:
                slots = self._append_slots[hosted.topic] = _AppendSlots(hosted.topic, self._append_slots)
            self._produces_in_flight += 1  # the event loop's thread only: no lock
            slots.requests += 1
            try:
                return await self._produce(request, hosted, ack, raw, slots)
            finally:
                self._produces_in_flight -= 1
                slots.request_done()
        finally:
            await self._body_bytes.give(len(raw))

    async def _produce(self, request: web.Request, hosted: HostedTopic, ack: str, raw: bytes,
                       slots: "_AppendSlots") -> web.Response:
        # Decoded off the event loop, one body at a time, with a bound on the JSON values
        # it may hold (_parse_json): a body of millions of tiny values takes the GIL for
        # seconds, and every route, and the session's keep-alive, would wait.
        decodes = self._small_decodes if len(raw) <= SMALL_BODY_DECODE_BYTES else self._decodes
        payloads, key = await asyncio.get_running_loop().run_in_executor(decodes, _produce_body, raw)
        hosted.activity.produced_by(_connection(request))
        try:
            # The append on the appends' own threads (it may block on backpressure), at most
            # APPEND_THREADS_PER_TOPIC of them per topic; the ack awaited without a thread:
            # waits for the archive (a stalled object store) must not take the threads acks,
            # subscription reads and lookups need.
            first, last = await hosted.produce_many_async(payloads, key, ack=ack, executor=self._appends,
                                                          append_slot=slots)
        except (OwnershipLostError, LifecycleError) as e:
            if isinstance(e, ProduceTimeout):
                raise _error(web.HTTPGatewayTimeout, type(e).__name__, str(e)) from e
            raise _unavailable(str(e)) from e
        except UploaderStopped as e:
            # An ``archived`` wait whose copy stopped archiving (fenced by a newer owner, or
            # an archive it refuses to write on): retry, as for a topic leaving this broker.
            raise _unavailable(f"{type(e).__name__}: {e}") from e
        except MessageTooLarge as e:
            limit = hosted.max_message_bytes
            raise web.HTTPRequestEntityTooLarge(limit, request.content_length or 0,
                                                text=_error_json("MessageTooLarge", str(e)),
                                                content_type="application/json") from e
        except OffsetOverflow as e:
            raise _error(web.HTTPConflict, "OffsetOverflow", str(e)) from e
        assert first is not None and last is not None
        return web.json_response({"offsets": list(range(first, last + 1))})

    async def read(self, request: web.Request) -> web.Response:
        hosted = await self._hosted(request)
        limit = min(_int(request.query.get("max", "100"), "max", 1), READ_MAX_MESSAGES)
        wait_s = _seconds(request.query.get("wait_s", "0"), "wait_s", READ_WAIT_MAX_S)
        max_bytes = min(_int(request.query.get("max_bytes", str(READ_BYTES_DEFAULT)), "max_bytes", 1), READ_BYTES_MAX)
        if "subscription" in request.query:
            sub = await _subscribe(hosted, request.query["subscription"])
            start = sub.cursor + 1
        else:
            start = _int(request.query.get("from", "0"), "from", 0)
            await self._check_history(hosted, request.query.get("epoch"), start, "read past it")
        try:
            reader = hosted.create_reader(start, live=True)
        except UnknownOffset as e:
            raise _error(web.HTTPNotFound, "UnknownOffset", str(e)) from e
        except OffsetBelowRetention as e:
            raise _below_retention(e) from e
        except ReadError as e:
            raise _error(web.HTTPUnprocessableEntity, type(e).__name__, str(e)) from e
        hosted.activity.read_by(_connection(request))
        tip = hosted.next_offset  # what exists now (or is being fsynced): served whatever wait_s says
        if self._answer_bytes >= ANSWERS_BYTES_MAX:
            reader.close()
            raise _unavailable(f"{self._answer_bytes} bytes of answers wait for their clients to take them; retry")
        if not self._read_slots.acquire(blocking=False):
            reader.close()
            raise _unavailable(f"this broker is serving {READ_THREADS_MAX} reads already; retry")
        epoch = hosted.token.epoch
        try:
            try:
                # The answer is built on the read's thread too: base64 and JSON of megabytes
                # would hold the event loop.
                body = await asyncio.get_running_loop().run_in_executor(
                    self._reads, _read_answer, reader, start, tip, limit, max_bytes, wait_s, epoch)
            except OffsetBelowRetention as e:  # archive retention overtook the read
                raise _below_retention(e) from e
            except ReadTimeout as e:  # existing offsets not fetched in time: retry, never an empty 200
                raise _unavailable(str(e), "ReadTimeout") from e
            except ReadError as e:  # a data error met mid-read (DataGap, CorruptArchive, ...): typed, as above
                raise _error(web.HTTPUnprocessableEntity, type(e).__name__, str(e)) from e
            # Sent while the read still holds its slot, within a deadline: an answer the
            # client does not read would otherwise stay buffered in this process, one per
            # request, without bound (atk71 F3).
            self._answer_bytes += len(body)  # the event loop's thread only: no lock
            try:
                return await _send_within(request, body, ANSWER_SEND_TIMEOUT_S)
            finally:
                self._answer_bytes -= len(body)
        finally:
            self._read_slots.release()

    async def ack(self, request: web.Request) -> web.Response:
        hosted = await self._hosted(request)
        body = await _json(request)
        offset = body.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool):
            raise _error(web.HTTPBadRequest, "InvalidAck", "offset must be an integer")
        raw_epoch = body.get("epoch")
        await self._check_history(hosted, raw_epoch, offset + 1, "acknowledge it")
        try:
            sub = await _subscribe(hosted, request.match_info["sub"])
            if raw_epoch is None:
                await self._check_unvouched_ack(hosted, sub.cursor, offset)
            await asyncio.to_thread(sub.ack, offset)
            await asyncio.to_thread(sub.flush)
        except InvalidAck as e:
            raise _error(web.HTTPBadRequest, "InvalidAck", str(e)) from e
        except ReadError as e:  # fenced or closed: the topic is leaving
            raise _unavailable(str(e)) from e
        return web.json_response({"cursor": sub.cursor})

    async def unsubscribe(self, request: web.Request) -> web.Response:
        """Delete a subscription on the topic's owner (a loss path: its cursor is gone; a
        consumer still using the name creates it again, from the earliest offset)."""
        hosted = await self._hosted(request)
        try:
            deleted = await asyncio.to_thread(hosted.unsubscribe, request.match_info["sub"])
        except ValueError as e:  # the name is not a valid key segment
            raise _error(web.HTTPBadRequest, "InvalidSubscription", str(e)) from e
        except ReadError as e:  # fenced, closed, or the delete's outcome unknown: retry
            raise _unavailable(str(e)) from e
        return web.json_response({"deleted": deleted})

    async def _check_history(self, hosted: HostedTopic, raw_epoch: Any, end: int, what: str) -> None:
        """Refuse a read or ack that continues a history a failover replaced.

        ``raw_epoch`` is the owner epoch of the read answer the client's messages came
        from (every read answer carries it). If a failover since then took over that
        history from offset S (a LostRange of that epoch or a later one) and the client is
        past S, the offsets from S on now hold other messages: continuing at ``end`` would
        skip them (an ack would even acknowledge them unread). 409 ``HistoryDiverged``
        with ``resume_from`` = S: what the client read from S on was lost, and it
        continues there. This is Kafka's fetch-epoch check, with our lost ranges as the
        epochs' end offsets."""
        if raw_epoch is None:
            return
        if not isinstance(raw_epoch, (int, str)) or isinstance(raw_epoch, bool):
            raise _error(web.HTTPBadRequest, "InvalidParameter", "epoch must be an integer")
        epoch = _int(str(raw_epoch), "epoch", 0)
        if epoch > hosted.token.epoch:
            # No answer of this copy carried it: a newer owner's did (this copy has not
            # learned of the takeover yet), or the client made it up. Checked against
            # nothing, it would pass every lost range (atk70 F4): retry, on the owner.
            raise _unavailable(f"epoch {epoch} is newer than this broker's ({hosted.token.epoch}) for "
                               f"{hosted.topic}: a newer owner served it; ask again")
        if epoch == hosted.token.epoch:
            return
        lost = await asyncio.to_thread(keys.read_lost_ranges, self.host.metadata, hosted.topic)
        starts = [r.start_offset for r in lost if r.epoch >= epoch and r.start_offset < end]
        if starts:
            resume = min(starts)
            raise _history_diverged(resume, f"offsets from {resume} of the history read under epoch {epoch} were "
                                    f"lost in a failover and now hold other messages: cannot {what}; continue at "
                                    f"{resume}")

    async def _check_unvouched_ack(self, hosted: HostedTopic, cursor: int, offset: int) -> None:
        """An ack without ``epoch`` cannot say which history its messages were read from.
        Where a failover replaced any offset past the cursor up to the ack (a LostRange
        overlapping ``cursor + 1 .. offset``), they may have been read under the old
        owner, and acknowledging them would skip the new owner's messages there unread:
        409 ``HistoryDiverged`` (``resume_from`` = the first such offset), until the
        client sends the epoch of the read answer its messages came from. A range whose
        end is not known yet (the dead owner has not reported its tip, ``exact`` false)
        counts as open-ended: the cursor having passed its start (an ack of the new
        owner's first message, say) proves nothing of the offsets after it (atk69 F1).
        Elsewhere no history was replaced, so an ack without ``epoch`` is as good as one
        with it."""
        if offset <= cursor:
            return  # moves nothing
        lost = await asyncio.to_thread(keys.read_lost_ranges, self.host.metadata, hosted.topic)
        overlaps = [low for r in lost
                    if (low := max(r.start_offset, cursor + 1)) <= min(offset, _replaced_through(r))]
        if overlaps:
            resume = min(overlaps)
            raise _history_diverged(resume, f"offset {resume} was replaced by a failover, and this ack through "
                                    f"{offset} says nothing of which history its messages were read from: send the "
                                    f"epoch of the read answer they came from (every read answer carries it), or "
                                    f"read again from {resume}")

    async def topics(self, request: web.Request) -> web.Response:
        return web.json_response({"broker_id": self.host.broker_id, "topics": [
            {"topic": str(h.topic), "epoch": h.token.epoch, "next_offset": h.next_offset, "state": h.state.value}
            for h in self.host.topics()]})

    async def healthz(self, request: web.Request) -> web.Response:
        failure = self.host.wal_failure
        if failure is not None:
            # Nothing can be acknowledged or loaded until a restart replays the journal.
            return web.json_response({"ok": False, "broker_id": self.host.broker_id,
                                      "error": f"WAL commit group failed: {failure!r}; restart the broker"},
                                     status=503)
        return web.json_response({"ok": True, "broker_id": self.host.broker_id, "topics": len(self.host.topics())})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")


def _replaced_through(lost: keys.LostRange) -> float:
    """The last offset of the old history that ``lost`` replaced: its reported tip once
    exact (nothing past its start when the dead owner held nothing there), unbounded while
    only a lower bound is known."""
    if not lost.exact:
        return math.inf
    return lost.start_offset if lost.end_offset is None else lost.end_offset


def _read_answer(reader: Any, start: int, tip: int, limit: int, max_bytes: int, wait_s: float,
                 epoch: int) -> bytes:
    """A read route's JSON answer, built (and encoded) on the read's thread."""
    messages, moved = _read_batch(reader, start, tip, limit, wait_s, max_bytes)
    with _ANSWER_BUILDS:
        answer = {"messages": [_message_json(m) for m in messages], "next": start + len(messages), "moved": moved,
                  "epoch": epoch}
        return json.dumps(answer).encode()


class _AppendSlots:
    """One topic's produce requests in flight (``PRODUCES_IN_FLIGHT_PER_TOPIC``) and its
    share of the append threads (``APPEND_THREADS_PER_TOPIC``, an ``AppendSlot``: taken
    before an append goes to a thread, given back once that thread is done with it). The
    entry leaves the server's table once no request and no append of the topic is left, so
    a topic not produced to keeps nothing, and a new entry never starts with fresh slots
    while appends of the old one still run (atk94 F1). The event loop's thread only."""

    def __init__(self, topic: TopicName, table: "dict[TopicName, _AppendSlots]") -> None:
        self._topic = topic
        self._table = table
        self._semaphore = asyncio.Semaphore(APPEND_THREADS_PER_TOPIC)
        self.requests = 0
        self.held = 0

    async def acquire(self) -> None:
        await self._semaphore.acquire()
        self.held += 1

    def release(self) -> None:
        self.held -= 1
        self._semaphore.release()
        self._leave_if_idle()

    def request_done(self) -> None:
        self.requests -= 1
        self._leave_if_idle()

    def _leave_if_idle(self) -> None:
        if not self.requests and not self.held and self._table.get(self._topic) is self:
            del self._table[self._topic]


async def _send_within(request: web.Request, body: bytes, timeout_s: float) -> web.StreamResponse:
    """Send a JSON ``body`` and wait until the connection took it (aiohttp's writes wait
    for the socket to drain); a client that does not take it within ``timeout_s`` is cut
    off, and the buffered answer freed."""
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    response.content_length = len(body)
    await response.prepare(request)
    try:
        async with asyncio.timeout(timeout_s):
            await response.write(body)
            await response.write_eof()
    except TimeoutError:
        log.warning("%s %s: the client did not take a %d-byte answer within %g s; closing its connection",
                    request.method, request.path, len(body), timeout_s)
        if request.transport is not None:
            request.transport.abort()
    except ConnectionError:
        log.debug("%s %s: the client went away during its answer", request.method, request.path)
    return response


def _read_batch(reader: Any, start: int, tip: int, limit: int, wait_s: float,
                max_bytes: int = 0) -> tuple[list, bool]:
    """Up to ``limit`` messages from ``start``, and (``max_bytes`` > 0) no more once their
    payloads and keys reach ``max_bytes``: always at least one, so a message larger than
    the budget is still served, alone. Those below ``tip`` (they existed when the
    request came) are fetched within READ_FETCH_MAX_S; past them, wait up to ``wait_s``
    for a first message; once there are messages and the read caught up with ``tip``,
    take what arrives within READ_LINGER_S and answer. A watchdog closes the reader at
    the deadline (a live read blocks); a message is returned only if it was fully fetched
    before that.

    The watchdog's own close ends a read quietly, with what was read; but when that is
    nothing although offsets below ``tip`` exist (the archive did not answer in time),
    the read raises :class:`ReadTimeout` (the route's 503): an empty answer means only
    "nothing past ``start`` within ``wait_s``". Any other reader error (a
    ``DataGap``, ``CorruptArchive``, ``OffsetOutOfOrder``, ``OffsetBelowRetention``) is
    raised when nothing was read yet; after messages it ends the batch there (what was
    served is contiguous and real) and the next read, which starts at it, gets the error."""
    messages: list = []
    moved = False
    nbytes = 0
    begun = time.monotonic()
    wait_deadline, fetch_deadline = begun + wait_s, begun + READ_FETCH_MAX_S
    caught_up_at: list[float] = []  # when the read reached the tip with messages in hand
    stop = threading.Event()
    wake = threading.Event()  # the deadline may have moved (or stop was set)
    timed_out = threading.Event()  # the watchdog closed the reader at the deadline

    def deadline() -> float:
        if caught_up_at:
            return caught_up_at[0] + READ_LINGER_S
        return fetch_deadline if (messages[-1].offset + 1 if messages else start) < tip else wait_deadline

    def watchdog() -> None:
        # Sleeps until the deadline and wakes when it moves: a poll every few ms per open
        # read would burn the CPU with a hundred idle consumers.
        while not stop.is_set():
            remaining_s = deadline() - time.monotonic()
            if remaining_s <= 0:
                timed_out.set()
                reader.close()
                return
            wake.wait(remaining_s)
            wake.clear()

    guard = threading.Thread(target=watchdog, daemon=True)
    guard.start()
    try:
        for message in reader:
            messages.append(message)
            if not caught_up_at and message.offset + 1 >= tip:
                caught_up_at.append(time.monotonic())
                wake.set()
            if len(messages) >= limit:
                break
            if max_bytes:
                nbytes += len(message.payload) + len(message.key or b"")
                if nbytes >= max_bytes:
                    break
    except TopicMoved:
        moved = True
    except ReadError:
        if not timed_out.is_set() and not messages:
            raise  # a data error, not the deadline: the answer is the error
        # Closed by the watchdog (what was read is the answer), or an error after
        # messages: the next read starts at it and gets it.
    except OffsetBelowRetention:
        if not messages:
            raise  # the answer is the error (404 naming the first retained offset)
        # What was served is contiguous and real; the next read starts below the start
        # and gets the error then.
    finally:
        stop.set()
        wake.set()
        reader.close()
    if timed_out.is_set() and not messages and not moved and start < tip:
        # Offsets that exist were not fetched in time (an object store that stalls): an
        # empty answer would say "nothing there" and a consumer would stop early. The
        # route answers 503 + Retry-After; the reader's stalled GET was left behind.
        raise ReadTimeout(f"offsets {start}..{tip - 1} exist but none was fetched within {READ_FETCH_MAX_S:g}s "
                          f"(the archive did not answer in time); retry")
    return messages, moved


def _connection(request: web.Request) -> Any:
    """The client connection a request came on (peer address and port; one HTTP
    keep-alive connection), for the topic's connection count in load reports."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return tuple(peer) if isinstance(peer, (tuple, list)) else (request.remote, id(transport))


def _message_json(m: Any) -> dict[str, Any]:
    return {"offset": m.offset, "publish_time": m.publish_time, "attributes": m.attributes,
            "key_b64": None if m.key is None else base64.b64encode(m.key).decode(),
            "payload_b64": base64.b64encode(m.payload).decode()}


async def _json(request: web.Request) -> dict[str, Any]:
    """A small JSON body (an ack's), parsed on the event loop."""
    return _parse_json(await _body(request, SMALL_BODY_BYTES_MAX), SMALL_STRUCTURE_MAX, SMALL_STRUCTURE_MAX)


class _ByteBudget:
    """Bytes that requests may hold at once (event loop only): ``take`` waits for room."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._room = asyncio.Condition()

    async def take(self, n: int) -> None:
        async with self._room:
            await self._room.wait_for(lambda: self.held == 0 or self.held + n <= self.limit)
            self.held += n

    async def give(self, n: int) -> None:
        if n:
            async with self._room:
                self.held -= n
                self._room.notify_all()


async def _body(request: web.Request, limit: int, budget: _ByteBudget | None = None) -> bytes:
    """The request body, decoded from its Content-Encoding, refused (JSON 413) past
    ``limit`` bytes as soon as it gets there, (400) when it declares a charset other than
    UTF-8's, and (408) when it has not arrived within BODY_READ_TIMEOUT_S. With a
    ``budget``, each chunk is taken from it first; the caller gives back the body's
    length once done with it (all of it given back here if the read fails)."""
    charset = request.charset.lower() if request.charset else None
    if charset not in _UTF8_CHARSETS:
        raise _error(web.HTTPBadRequest, "InvalidJson", f"charset {request.charset!r}: a JSON body is UTF-8")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            async for chunk in request.content.iter_any():
                if budget is not None:
                    await budget.take(len(chunk))
                size += len(chunk)
                if size > limit:
                    raise web.HTTPRequestEntityTooLarge(
                        limit, request.content_length or size, content_type="application/json",
                        text=_error_json("MessageTooLarge", f"the request body exceeds {limit} bytes"))
                chunks.append(chunk)
    except BaseException as e:
        if budget is not None:
            await budget.give(size)
        # RequestPayloadError: a body its Content-Encoding does not decode.
        if isinstance(e, RequestPayloadError):
            raise _error(web.HTTPBadRequest, "InvalidJson", f"body is not JSON: {type(e).__name__}") from e
        if not isinstance(e, TimeoutError):
            raise
        raise _error(web.HTTPRequestTimeout, "RequestTimeout",
                     f"the request body did not arrive within {BODY_READ_TIMEOUT_S:g} s") from e
    return b"".join(chunks)


def _parse_json(raw: bytes, values_max: int, structure_max: int) -> dict[str, Any]:
    """``raw`` as a JSON object, with at most ``structure_max`` brackets, braces, commas and
    colons (counted in the raw bytes before anything is parsed: inside strings too, which
    only over-counts) and at most ``values_max`` objects and numbers: the parser calls back
    for each (which also lets other threads run between them), and the parse stops at the
    first one past the bound. json's parser holds the GIL throughout: what it may build
    has to be bounded before it starts."""
    structure = raw.count(b"[") + raw.count(b"{") + raw.count(b",") + raw.count(b":")
    if structure > structure_max:
        raise _error(web.HTTPBadRequest, "BatchTooLarge", f"body has {structure} brackets, braces, commas and colons; "
                     f"at most {structure_max} (text payloads count theirs: send payload_b64, or smaller batches)")
    count = 0

    def counted(value: Any) -> Any:
        nonlocal count
        count += 1
        if count > values_max:  # out through json.loads, as any exception of a hook
            raise _error(web.HTTPBadRequest, "BatchTooLarge", f"body has more than {values_max} JSON objects and "
                         "numbers")
        return value

    try:
        body = json.loads(raw.decode("utf-8"), object_pairs_hook=lambda pairs: counted(dict(pairs)),
                          parse_int=lambda text: counted(int(text)), parse_float=lambda text: counted(float(text)))
    except (ValueError, RecursionError) as e:  # RecursionError: thousands of nested brackets
        raise _error(web.HTTPBadRequest, "InvalidJson", f"body is not JSON: {type(e).__name__}") from e
    if not isinstance(body, dict):
        raise _error(web.HTTPBadRequest, "InvalidJson", "body must be a JSON object")
    return body


def _produce_body(raw: bytes) -> tuple[list[bytes], bytes | None]:
    """A produce body's payloads and key; a typed 400 for anything else, or for more than
    PRODUCE_MAX_MESSAGES messages (a batch is appended, and answered, whole)."""
    body = _parse_json(raw, 2 * PRODUCE_MAX_MESSAGES + 16, PRODUCE_STRUCTURE_MAX)  # a message is an object, or two
    messages = _list(body, "messages")
    if not messages:
        raise _error(web.HTTPBadRequest, "EmptyBatch", "messages is empty")
    if len(messages) > PRODUCE_MAX_MESSAGES:
        raise _error(web.HTTPBadRequest, "BatchTooLarge", f"{len(messages)} messages in one request; at most "
                     f"{PRODUCE_MAX_MESSAGES} (send several requests)")
    payloads = [_payload(m) for m in messages]
    key = _b64(body["key_b64"], "key_b64") if body.get("key_b64") is not None else None
    return payloads, key


def _list(body: dict[str, Any], name: str) -> list:
    value = body.get(name)
    if not isinstance(value, list):
        raise _error(web.HTTPBadRequest, "InvalidJson", f"{name} must be a list")
    return value


def _payload(message: Any) -> bytes:
    if isinstance(message, dict) and isinstance(message.get("payload_b64"), str):
        return _b64(message["payload_b64"], "payload_b64")
    if isinstance(message, dict) and isinstance(message.get("payload"), str):
        try:
            return message["payload"].encode()
        except UnicodeEncodeError:  # a lone surrogate is valid JSON but not text
            raise _error(web.HTTPBadRequest, "InvalidJson", "payload is not valid text (use payload_b64)") from None
    raise _error(web.HTTPBadRequest, "InvalidJson", "each message needs payload_b64 (or payload as text)")


def _b64(value: Any, name: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError) as e:
        raise _error(web.HTTPBadRequest, "InvalidJson", f"{name} is not base64") from e


@web.middleware
async def _typed_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Whatever a route did not answer itself still gets a JSON error body naming its type:
    damaged stored data (a malformed record, a corrupt archive) is the server's 500, a
    store that is down a 503; anything else a 500 whose trace goes to the log only."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (MalformedRecord, CorruptArchive) as e:
        log.error("%s %s: damaged stored data: %s", request.method, request.path, e)
        raise _error(web.HTTPInternalServerError, type(e).__name__, str(e)) from e
    except StorageUnavailable as e:
        raise _unavailable(str(e)) from e
    except Exception as e:  # noqa: BLE001 - typed for the client, traced in the log
        log.exception("%s %s failed", request.method, request.path)
        raise _error(web.HTTPInternalServerError, type(e).__name__, str(e) or type(e).__name__) from e


async def _subscribe(hosted: HostedTopic, name: str) -> Any:
    try:
        return await hosted.subscribe_async(name, "earliest")
    except MalformedRecord:
        raise  # the stored cursor is damaged: the server's fault, not the name (_typed_errors)
    except ValueError as e:  # the name is not a valid key segment
        raise _error(web.HTTPBadRequest, "InvalidSubscription", str(e)) from e
    except TooManySubscriptions as e:
        raise _error(web.HTTPConflict, "TooManySubscriptions", str(e)) from e
    except ReadError as e:  # fenced or closed since the owner check: the topic is leaving
        raise _unavailable(str(e)) from e


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
    # Decimal digits only: int() also takes "1_0" (10), spaces and other scripts' digits.
    if not _INTEGER.fullmatch(raw):
        raise _error(web.HTTPBadRequest, "InvalidParameter", f"{name} must be an integer")
    try:
        value = int(raw)
    except ValueError:
        raise _error(web.HTTPBadRequest, "InvalidParameter", f"{name} must be an integer") from None
    if value < minimum:
        raise _error(web.HTTPBadRequest, "InvalidParameter", f"{name} must be >= {minimum}")
    return value


def _error(kind: type[web.HTTPException], error: str, message: str) -> web.HTTPException:
    return kind(text=_error_json(error, message), content_type="application/json")


def _history_diverged(resume_from: int, message: str) -> web.HTTPException:
    """409 ``HistoryDiverged``: the client continues at ``resume_from``."""
    body = {"error": {"type": "HistoryDiverged", "resume_from": resume_from, "message": message}}
    return web.HTTPConflict(text=json.dumps(body), content_type="application/json")


def _below_retention(error: OffsetBelowRetention) -> web.HTTPException:
    """404 ``OffsetBelowRetention`` with the offset asked for and the first retained one."""
    body = {"error": {"type": "OffsetBelowRetention", "message": str(error), "offset": error.offset,
                      "first_retained_offset": error.first_offset}}
    return web.HTTPNotFound(text=json.dumps(body), content_type="application/json")


def _unavailable(message: str, error: str = "Unavailable") -> web.HTTPException:
    return web.HTTPServiceUnavailable(text=_error_json(error, message), content_type="application/json",
                                      headers={"Retry-After": str(RETRY_AFTER_S)})


def _error_json(error: str, message: str) -> str:
    return json.dumps({"error": {"type": error, "message": message}})
