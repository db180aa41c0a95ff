"""What each ``dnb`` command does, as plain functions over :class:`Settings`.

Each CLI invocation is its own short-lived broker process: it opens the stores, builds
a :class:`tiered.lifecycle.BrokerHost` for ``--broker-id``, does one thing and exits
WITHOUT sealing (``close(unload=False)``), so the topic stays owned by this broker with
its WAL on disk. The next invocation with the same broker id reloads it through the
lifecycle's "this broker was the last owner" path, which recovers the local WAL.

Because CLI brokers are not long-lived, their session lease cannot say whether a
holder is alive. The CLI therefore refuses to touch a topic whose owner record names
another broker (not released), unless the operator says ``restore --takeover`` (the
failover path, used when that broker is known to be dead).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, TextIO

from tiered.cluster.runtime import RuntimeConfig, load_manager_settings
from tiered.config import DnbConfig
from tiered.lifecycle import BrokerHost
from tiered.errors import TopicHeld, TopicNotFound
from tiered.lifecycle.delete import check_not_deleted, delete_topic, list_topics, topic_exists
from tiered.lifecycle.ownership import read_owner, unowned_fencing
from tiered.lifecycle.watcher import assign, request_unload, wait_sealed
from tiered.metadata import keys
from tiered.read.errors import CursorFenced, ReaderClosed
from tiered.read.messages import Message
from tiered.read.reader import create_reader
from tiered.read.subscriptions import SubscriptionManager
from tiered.tools.cli.output import CliError, EXIT_DATA, EXIT_INTERNAL, EXIT_REFUSED, EXIT_USAGE
from tiered.tools.cli.settings import Settings, open_stores
from tiered.tools.verify import local_wal_range, lost_range_json, verify_topic
from tiered.archive import list_descriptors
from tiered.archive.start import archive_start
from uploader import collect_garbage
from wal.errors import OffsetBelowRetention
from wal.topics import TopicName

log = logging.getLogger(__name__)

#: How long a CLI broker's session lease lives after the process exits abnormally.
CLI_SESSION_TTL_S = 5.0
#: A produce or seal from the CLI waits at most this long for any single step.
CLI_STEP_TIMEOUT_S = 60.0
#: No background upload pass during a one-shot command (upload/seal/archived acks upload).
CLI_UPLOAD_INTERVAL_S = 3600.0


def broker_config(config: Any = None) -> Any:
    """The BrokerConfig of one short CLI process: the configured one (``config``, a
    DnbConfig; defaults if None) without a background upload timer to race and with a
    short session lease (the process is gone in seconds)."""
    base = (config or DnbConfig()).broker_config()
    ttl_s = min(base.session_ttl_s, CLI_SESSION_TTL_S)
    margin_s = base.ack_lease_margin_s
    if margin_s is not None and margin_s >= ttl_s:
        margin_s = None  # a margin sized for a long lease: fall back to a third of this one
    return replace(base, uploader=replace(base.uploader, interval_s=CLI_UPLOAD_INTERVAL_S),
                   session_ttl_s=ttl_s, ack_lease_margin_s=margin_s)


@contextlib.contextmanager
def hosting(settings: Settings) -> Iterator[Any]:
    """A BrokerHost for this invocation; on exit topics are left owned, WAL on disk."""
    with open_stores(settings) as (metadata, objects):
        host = BrokerHost(settings.broker_id, settings.wal_dir, metadata, objects, broker_config(settings.config))
        try:
            yield host
        finally:
            host.close(unload=False)


# -- ownership guard --------------------------------------------------------------------

def owner_of(metadata: Any, topic: TopicName) -> tuple[str | None, int | None]:
    """(holder, epoch): holder None when nobody holds the topic (never owned or released)."""
    record, _kv = read_owner(metadata, topic)
    if record is None:
        return None, None
    return record.holder, record.epoch


def refuse_if_held_elsewhere(host: Any, topic: TopicName, action: str) -> None:
    holder, epoch = owner_of(host.metadata, topic)
    if holder is not None and holder != host.broker_id:
        raise CliError(
            f"{action} {topic}: the topic is owned by broker {holder} (epoch {epoch}), not broker "
            f"{host.broker_id}. Seal it there first (dnb --broker-id {holder} seal {topic}), or if "
            f"broker {holder} is dead: dnb --broker-id {host.broker_id} restore --takeover {topic}",
            EXIT_REFUSED)


def load_here(host: Any, topic: TopicName, action: str, takeover: bool = False,
              discard_local_wal: bool = False) -> Any:
    """Load ``topic`` on this CLI broker. The host refuses (OwnHistoryElsewhere, exit 3,
    nothing written) a data dir that lacks this broker id's own open history of it: a
    typo in ``--data-dir`` must not record that history lost and reuse its offsets.
    ``takeover`` (``restore --takeover``) accepts both that and a dead holder's loss."""
    if not takeover:
        refuse_if_held_elsewhere(host, topic, action)
    return host.load(topic, discard_local_wal=discard_local_wal, accept_lost_own_history=takeover)


# -- produce / upload -------------------------------------------------------------------

def generated_payloads(count: int, size: int | None) -> Iterator[bytes]:
    for i in range(count):
        text = f"message-{i}".encode()
        yield text if size is None else (text * (size // len(text) + 1))[:size]


def stdin_payloads(stream: TextIO) -> Iterator[bytes]:
    for line in stream:
        yield line.rstrip("\n").encode()


def produce(settings: Settings, topic: str, payloads: Iterable[bytes], key: bytes | None = None,
            ack: str = "durable") -> tuple[int | None, int | None]:
    """Append every payload; returns (first_offset, last_offset), (None, None) for none."""
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        hosted = load_here(host, name, "produce to")
        # One wait for the last offset: the WAL group-commits, so one fsync covers the
        # batch (per-message produce() would wait for an fsync per line). The hosted
        # topic's own path, so a fenced or lease-uncertain owner acknowledges nothing.
        return hosted.produce_many(payloads, key, ack=ack, timeout_s=CLI_STEP_TIMEOUT_S)


def upload(settings: Settings, topic: str) -> int | None:
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        hosted = load_here(host, name, "upload")
        return hosted.uploader.upload_once()


# -- consume ----------------------------------------------------------------------------

def consume(settings: Settings, topic: str, subscription: str, start: str | int | None = None,
            max_messages: int | None = None, ack: bool = False, follow: bool = False,
            idle_timeout_s: float | None = None) -> list[Any]:
    """Read through the tiered reader; with ``ack`` acknowledge and flush what was read.

    On the owning broker the topic is loaded (its WAL is the newest tier). On a topic
    nobody holds (sealed, or never loaded) everything is archived: read from the cloud
    without taking ownership, and fence the cursor write on the topic staying unowned.
    """
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        if not host.config.auto_create and not topic_exists(host.metadata, name):
            check_not_deleted(host.metadata, name)
            raise TopicNotFound(name, "auto_create is off; create it first (dnb topic create)")
        fencing = _fencing_while_unowned(host, name)
        if fencing is not None:
            return _consume_unowned(host, name, fencing, subscription, start, max_messages, ack)
        hosted = load_here(host, name, "consume from")
        sub = hosted.subscribe(subscription, "earliest")
        reader = hosted.create_reader(sub.start_offset if start is None else start, live=follow)
        messages = _read(reader, max_messages, idle_timeout_s if follow else None)
        if ack and messages:
            position = _retained_position(sub.start_offset, lambda at: hosted.create_reader(at, live=False))
            _check_ack_reads_from(subscription, position, messages[0].offset)
            sub.ack(messages[-1].offset)
            sub.flush()
        return messages


def unsubscribe(settings: Settings, topic: str, subscription: str) -> bool:
    """Delete a subscription's cursor (a loss path by design: the name, used again, starts
    afresh). On the owning broker the topic is loaded and its manager deletes it; on a
    topic nobody holds, the delete is fenced on the topic staying unowned."""
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        fencing = _fencing_while_unowned(host, name)
        if fencing is not None:
            try:
                with SubscriptionManager(name, host.metadata, fencing=fencing) as subs:
                    return subs.unsubscribe(subscription)
            except CursorFenced as e:
                raise CliError(f"delete subscription {subscription!r} of {name}: a broker took the topic while "
                               "the delete ran, and nothing was deleted; run it again (it then goes through that "
                               "owner)", EXIT_REFUSED) from e
        return load_here(host, name, "delete a subscription of").unsubscribe(subscription)


def _fencing_while_unowned(host: Any, topic: TopicName) -> list[Any] | None:
    """Compares that hold while nobody holds ``topic``, built from the one read that found
    it unowned; None when a broker holds it (then only through that owner)."""
    try:
        return unowned_fencing(host.metadata, topic)
    except TopicHeld:
        return None


def unsubscribe_remote(broker_url: str, topic: str, subscription: str) -> bool:
    """``dnb unsubscribe --broker URL``: the delete through the topic's owner."""
    from tiered.broker.client import SyncBrokerClient  # deferred: aiohttp

    with SyncBrokerClient([broker_url], timeout_s=CLI_STEP_TIMEOUT_S) as client:
        return client.unsubscribe(str(TopicName.parse(topic)), subscription)


def _consume_unowned(host: Any, topic: TopicName, fencing: list[Any], subscription: str, start: str | int | None,
                     max_messages: int | None, ack: bool) -> list[Any]:
    with SubscriptionManager(topic, host.metadata, fencing=fencing) as subs:
        sub = subs.subscribe(subscription, "earliest")
        reader = create_reader(topic, None, host.metadata, host.objects,
                               sub.start_offset if start is None else start, live=False)
        messages = _read(reader, max_messages, None)
        if ack and messages:
            position = _retained_position(sub.start_offset, lambda at: create_reader(
                topic, None, host.metadata, host.objects, at, live=False))
            _check_ack_reads_from(subscription, position, messages[0].offset)
            sub.ack(messages[-1].offset)
            sub.flush()
        return messages


def _retained_position(position: int, open_reader: Callable[[int], Any]) -> int:
    """The subscription's position, or the first retained offset when retention removed
    the offsets from it on (``open_reader(offset)`` raises OffsetBelowRetention then)."""
    try:
        open_reader(position).close()
    except OffsetBelowRetention as e:
        return max(position, e.first_offset)
    return position


def _check_ack_reads_from(subscription: str, position: int, first_read: int) -> None:
    """``--ack`` acknowledges cumulatively, through the last message read: a read that began
    past the subscription's position (``--from`` an offset after it, or ``latest``) would
    acknowledge the offsets in between, which were never read. Refused, nothing acked.
    ``position``: the subscription's cursor + 1, or the first retained offset when
    retention removed the offsets from there on (nothing below it can be read)."""
    if first_read > position:
        raise CliError(f"--ack would acknowledge offsets {position}..{first_read - 1} of subscription "
                       f"{subscription!r}, which were not read (the read began at {first_read}, the subscription "
                       f"is at {position}); nothing was acknowledged: leave out --from to read from the "
                       "subscription's position", EXIT_REFUSED)


def _read(reader: Any, max_messages: int | None, idle_timeout_s: float | None) -> list[Any]:
    """Collect messages until the reader ends, ``max_messages``, idle timeout or Ctrl-C."""
    messages: list[Any] = []
    if max_messages == 0:
        reader.close()
        return messages
    last_seen = [time.monotonic()]
    stop = threading.Event()
    if idle_timeout_s is not None:
        threading.Thread(target=_idle_watchdog, args=(reader, last_seen, idle_timeout_s, stop),
                         daemon=True).start()
    try:
        for message in reader:
            messages.append(message)
            last_seen[0] = time.monotonic()
            if max_messages is not None and len(messages) >= max_messages:
                break
    except (ReaderClosed, KeyboardInterrupt):
        pass  # an idle timeout or Ctrl-C ends a --follow read; what was read still counts
    finally:
        stop.set()
        reader.close()
    return messages


def _idle_watchdog(reader: Any, last_seen: list[float], idle_timeout_s: float, stop: threading.Event) -> None:
    while not stop.wait(min(0.1, idle_timeout_s)):
        if time.monotonic() - last_seen[0] >= idle_timeout_s:
            reader.close()
            return


# -- seal / restore ---------------------------------------------------------------------

#: A progress display for work counted as "done so far": ``tracker(label, total)`` is a
#: context manager yielding ``advance(done)`` (the CLI draws a bar with it).
Tracker = Callable[[str, "int | None"], "contextlib.AbstractContextManager[Callable[[int], None]]"]
#: How often the seal's progress display reads the uploader's committed offset.
SEAL_PROGRESS_POLL_S = 0.1


def seal(settings: Settings, topic: str, tracker: Tracker | None = None) -> int | None:
    """Unload on this broker; refuses (changing nothing) unless this broker owns the topic.
    ``tracker`` shows the archiving of the unarchived tail, offset by offset."""
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        holder, epoch = owner_of(host.metadata, name)
        if holder != host.broker_id:
            who = "nobody (it is sealed or was never loaded)" if holder is None else \
                f"broker {holder} (epoch {epoch})"
            raise CliError(f"seal {name}: broker {host.broker_id} does not own the topic; it is held by "
                           f"{who}. Nothing was changed.", EXIT_REFUSED)
        hosted = host.load(name)
        if tracker is None:
            return host.unload(name)
        first = _archived_next(hosted)
        with tracker(f"sealing {name}", max(0, hosted.next_offset - first)) as advance:
            stop = threading.Event()

            def watch() -> None:  # reads one int the uploader publishes; never touches the stores
                while not stop.wait(SEAL_PROGRESS_POLL_S):
                    advance(_archived_next(hosted) - first)

            watcher = threading.Thread(target=watch, name="dnb-seal-progress", daemon=True)
            watcher.start()
            try:
                last = host.unload(name)
            finally:
                stop.set()
                watcher.join()
            advance(0 if last is None else last + 1 - first)
            return last


def _archived_next(hosted: Any) -> int:
    """The first offset the topic's uploader has not committed yet."""
    committed = hosted.uploader.committed_through
    return 0 if committed is None else committed + 1


def restore(settings: Settings, topic: str, takeover: bool = False, discard_local_wal: bool = False) -> int:
    """Load on this broker (from the sealed state, or recover our own WAL); next offset."""
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        hosted = load_here(host, name, "restore", takeover=takeover, discard_local_wal=discard_local_wal)
        report = hosted.report
        if report.unarchived_at_least:
            print(f"dnb: warning: failover: at least {report.unarchived_at_least} offset(s) of broker "
                  f"{report.previous_owner}'s WAL were never archived and are lost", file=sys.stderr)
        return hosted.next_offset


# -- inspect / verify -------------------------------------------------------------------

def inspect(settings: Settings, topic: str) -> dict[str, Any]:
    name = TopicName.parse(topic)
    with open_stores(settings, check_objects=False, create=False) as (metadata, _objects):
        check_not_deleted(metadata, name)
        record, _kv = read_owner(metadata, name)
        if record is None and not metadata.range(keys.storage_prefix(name), limit=1):
            raise TopicNotFound(name)  # inspect never creates, whatever auto_create says
        state_kv = metadata.get(keys.state_key(name))
        state = keys.SealedState.from_json(state_kv.key, state_kv.value) if state_kv else None
        descriptors = list_descriptors(metadata, name)
        cursors = _cursors(metadata, name)
        lost = [lost_range_json(r) for r in keys.read_lost_ranges(metadata, name)]
        first_retained = archive_start(metadata, name)  # archive retention (0: nothing cut)
    first, last = local_wal_range(settings.wal_dir, name)
    return {
        "topic": str(name),
        "owner": None if record is None else record.holder,
        "epoch": None if record is None else record.epoch,
        "sealed_state": None if state is None else {
            "sealed": state.sealed, "last_committed_offset": state.last_committed_offset,
            "broker_id": state.broker_id, "timestamp": state.timestamp},
        "descriptors": [_descriptor_json(d) for d in descriptors],
        "cursors": cursors,
        "local_wal": None if first is None else {"first_offset": first, "last_offset": last},
        "lost_ranges": lost,
        "archive_start": first_retained,
    }


def _cursors(metadata: Any, topic: TopicName) -> dict[str, int]:
    prefix = keys.subscriptions_prefix(topic)
    out = {}
    for kv in metadata.range(prefix):
        if kv.key.endswith("/cursor"):
            out[kv.key[len(prefix):-len("/cursor")]] = keys.Cursor.from_json(kv.key, kv.value).last_acked_offset
    return out


def _descriptor_json(d: Any) -> dict[str, Any]:
    return {"start_offset": d.start_offset, "end_offset": d.end_offset, "object_id": d.object_id,
            "size": d.size, "broker_id": d.broker_id, "epoch": d.epoch}


def verify(settings: Settings, topic: str, progress: Any = None, check_objects: bool = True) -> Any:
    name = TopicName.parse(topic)
    with open_stores(settings, create=False) as (metadata, objects):
        if metadata.get(keys.owner_key(name)) is None and not metadata.range(keys.storage_prefix(name), limit=1):
            raise TopicNotFound(name)  # as inspect: "whole" would say nothing about the topic meant
        return verify_topic(name, metadata, objects, wal_dir=settings.wal_dir, progress=progress,
                            check_objects=check_objects)


def gc(settings: Settings, topic: str, grace_s: float) -> dict[str, Any]:
    """Delete the topic's collectable orphans older than ``grace_s`` (see uploader.gc)."""
    name = TopicName.parse(topic)
    with open_stores(settings) as (metadata, objects):
        return {"topic": str(name), "deleted": collect_garbage(metadata, objects, name, grace_s)}


# -- query ------------------------------------------------------------------------------

def query(settings: Settings, topic: str, sql: str) -> dict[str, Any]:
    name = TopicName.parse(topic)
    try:
        from tiered.spark.query import run_query  # deferred: pyspark is an optional extra
    except ImportError as e:
        raise CliError(f"query needs the Spark extra: pip install 'dnb-storage[spark]' ({e})") from e
    try:
        result = run_query(str(name), sql, settings.metadata_url, settings.objects_url)
    except Exception as e:  # noqa: BLE001 - narrowed below: only Spark's wrappers are rewritten
        if not type(e).__module__.startswith(("pyspark", "py4j")):
            raise
        raise _spark_failure(e) from e
    return _query_json(result)


#: Names of the data errors a Spark task may raise (they arrive as text inside Spark's
#: exception, with the Python worker's whole traceback around them).
_SPARK_DATA_ERRORS = ("CorruptObject", "CorruptArchive", "ArchiveInconsistent", "DataGap", "CodecError",
                      "MalformedRecord")


def _spark_failure(error: BaseException) -> CliError:
    """One line for the operator instead of a JVM/worker traceback (``--debug`` shows it):
    the innermost ``module.Error: message`` line, and exit 5 when it is a data error."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = next((line for line in reversed(lines)
                  if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Corrupt\w*|Inconsistent|Gap|Record)\b: ", line)),
                 lines[0] if lines else type(error).__name__)
    is_data = any(name in text for name in _SPARK_DATA_ERRORS)
    if is_data:
        return CliError(f"query failed: {cause[:500]}", EXIT_DATA)
    if _is_sql_error(error):  # a typo, an unknown column or table: the operator's input
        return CliError(f"query failed: {cause[:500]}", EXIT_USAGE)
    return CliError(f"query failed: {cause[:500]}", EXIT_INTERNAL)


#: pyspark's errors for SQL that does not parse or does not resolve (ParseException is an
#: AnalysisException); matched by name so pyspark stays an optional import.
_SPARK_SQL_ERRORS = ("AnalysisException", "ParseException")


def _is_sql_error(error: BaseException) -> bool:
    return any(klass.__name__ in _SPARK_SQL_ERRORS for klass in type(error).__mro__)


def _query_json(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{columns, rows}``: rows as lists in column order, values made JSON-safe."""
    columns = list(rows[0].keys()) if rows else []
    return {"columns": columns, "rows": [[_json_safe(row.get(c)) for c in columns] for row in rows]}


def _json_safe(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# -- broker process and moves -----------------------------------------------------------

def run_broker(settings: Settings, load_manager: bool = False, load_manager_config: str | None = None,
               load_report_interval_s: float | None = None) -> int:
    """``dnb broker run``: serve until SIGTERM, configured by ``settings.config`` (the load
    manager by ``--load-manager-config FILE`` when given, else the [load_manager] section);
    the process's exit code."""
    from tiered.broker.process import serve  # deferred: aiohttp loads only for the HTTP commands

    logging.getLogger("tiered").setLevel(logging.INFO)  # a long-lived process logs its transitions
    config = settings.config
    if load_manager_config is not None:
        lm_config, lm_runtime = load_manager_settings(load_manager_config)
    else:
        lm_config, lm_runtime = config.load_manager, RuntimeConfig()
    with open_stores(settings, role="broker") as (metadata, objects):
        return asyncio.run(serve(settings.broker_id, settings.wal_dir, metadata, objects, config.broker_config(),
                                 config.server, watcher=config.watcher,
                                 load_report_interval_s=load_report_interval_s or lm_config.load_report_interval_s,
                                 load_manager=lm_config if load_manager else None,
                                 load_manager_runtime=lm_runtime))


def move(settings: Settings, topic: str, to_broker: str, timeout_s: float) -> dict[str, Any]:
    """Request the unload where the topic is assigned, wait for the seal, assign it to
    ``to_broker``: the seed's move, driven through metadata (running brokers act on it)."""
    name = TopicName.parse(topic)
    with open_stores(settings, check_objects=False) as (metadata, _objects):
        current = keys.topic_assignments(metadata, name)
        if current == [to_broker]:
            return {"topic": str(name), "from": to_broker, "to": to_broker, "last_committed_offset": None,
                    "moved": False}
        last = None
        for broker in current:
            request_unload(metadata, name, broker, reason="move", to_broker=to_broker)
        if current:
            last = wait_sealed(metadata, name, timeout_s)
        assign(metadata, name, to_broker, reason="move")
        return {"topic": str(name), "from": current[0] if current else None, "to": to_broker,
                "last_committed_offset": last, "moved": True}


# -- through a running broker -------------------------------------------------------------

#: Messages per HTTP request when producing through a broker.
REMOTE_BATCH = 1000


def produce_remote(broker_url: str, topic: str, payloads: Iterable[bytes], key: bytes | None = None,
                   ack: str = "durable") -> tuple[int | None, int | None]:
    """``dnb produce --broker URL``: append through a running broker (redirects and moves
    handled by the client); returns (first_offset, last_offset)."""
    from tiered.broker.client import SyncBrokerClient  # deferred: aiohttp loads only for the HTTP commands

    first = last = None
    batch: list[bytes] = []
    with SyncBrokerClient([broker_url], timeout_s=CLI_STEP_TIMEOUT_S) as client:
        def send() -> None:
            nonlocal first, last
            offsets = client.produce(str(TopicName.parse(topic)), batch, ack=ack, key=key)
            first = offsets[0] if first is None else first
            last = offsets[-1]
            batch.clear()

        for payload in payloads:
            batch.append(payload)
            if len(batch) >= REMOTE_BATCH:
                send()
        if batch:
            send()
    return first, last


def consume_remote(broker_url: str, topic: str, subscription: str, start: int | str | None,
                   max_messages: int | None, ack: bool) -> list[Any]:
    """``dnb consume --broker URL``: read from ``start`` (None: from the subscription's
    position, its cursor + 1; "earliest": from the first offset retention kept) until
    caught up (or ``max``), following the topic across
    moves; ``ack`` acknowledges the last one read, refused when the read began past the
    subscription's position (it would acknowledge offsets never read)."""
    from tiered.broker.client import BrokerRequestError, HistoryDiverged, SyncBrokerClient  # deferred: aiohttp

    name = str(TopicName.parse(topic))
    messages: list[Any] = []
    with SyncBrokerClient([broker_url], timeout_s=CLI_STEP_TIMEOUT_S) as client:
        subscribed_at: int | None = None  # the subscription's position, read from the broker
        # The owner epoch that position was read under. The first read sends it back, so a
        # failover between the two (which clamps the cursor back to where the new owner
        # renumbered) is HistoryDiverged, not a read from the old position whose ack
        # would then acknowledge the new owner's messages before it unread.
        vouch: int | None = None
        if start is None or ack:
            try:
                first = client.read(name, subscription=subscription, max_messages=1, wait_s=0.0)
                subscribed_at = first.next_offset - len(first.messages)
                vouch = first.epoch
            except BrokerRequestError as e:
                retained = e.error.get("first_retained_offset")
                if start is None or e.error.get("type") != "OffsetBelowRetention" or not isinstance(retained, int):
                    raise
                subscribed_at = retained  # retention removed the offsets from the cursor on
        earliest = start == "earliest"
        position = subscribed_at if start is None else 0 if earliest else start
        assert isinstance(position, int)
        while max_messages is None or len(messages) < max_messages:
            want = 1000 if max_messages is None else min(1000, max_messages - len(messages))
            try:
                # (The client vouches with the epoch of what it read itself first.)
                batch = client.read(name, position, max_messages=want, wait_s=0.0, epoch=vouch)
            except HistoryDiverged as e:  # (before BrokerRequestError, its base class)
                vouch = None  # from resume_from on, the client vouches with what it reads
                # A failover replaced what was read from resume_from on: those messages are
                # not the topic's history; read the offsets again.
                log.warning("topic %s: offsets from %d were replaced by a failover while reading; re-reading "
                            "from there", name, e.resume_from)
                messages = [m for m in messages if m.offset < e.resume_from]
                position = e.resume_from
                continue
            except BrokerRequestError as e:
                retained = e.error.get("first_retained_offset")
                if (not earliest or messages or e.type != "OffsetBelowRetention" or not isinstance(retained, int)
                        or retained <= position):
                    raise
                position = retained  # "earliest": retention removed the offsets before it
                continue
            if not batch.messages:
                # Nothing past ``position`` exists: caught up. (Existing offsets the archive
                # did not deliver in time are a 503 the client retries, never an empty batch.)
                break
            messages += [Message(m["offset"], m["publish_time"], m["key"], m["attributes"], m["payload"], "remote")
                         for m in batch.messages]
            position = batch.next_offset
        if ack and messages:
            assert subscribed_at is not None
            _check_ack_reads_from(subscription, subscribed_at, messages[0].offset)
            client.ack(name, subscription, messages[-1].offset)
    return messages


# -- topic create / delete / list -------------------------------------------------------

def topic_create(settings: Settings, topic: str) -> dict[str, Any]:
    """Create the topic explicitly on this broker (also a deleted name: numbering continues
    at its tombstone's next offset, epochs above the deleted ones)."""
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        refuse_if_held_elsewhere(host, name, "create")
        hosted, created = host.create(name)
        return {"topic": str(name), "created": created, "epoch": hosted.token.epoch,
                "next_offset": hosted.wal.next_offset}


def topic_delete(settings: Settings, topic: str, tracker: Any = None) -> dict[str, Any]:
    """Delete the topic (tiered.lifecycle.delete): refused while another broker holds it;
    hosted by this broker id, sealed first and its local WAL removed. Re-running finishes
    an interrupted delete; deleting a deleted or unknown topic is a no-op that says so."""
    name = TopicName.parse(topic)
    with hosting(settings) as host:
        # Held by this broker id: this process does not run it (CLI brokers exit without
        # sealing, and a second live process of one id cannot register), so it is deleted
        # as it stands, its local WAL with it.
        refuse_if_held_elsewhere(host, name, "delete")
        context = tracker("deleting " + str(name), len(delete_steps())) if tracker else contextlib.nullcontext(None)
        with context as advance:
            steps = delete_steps()

            def on_step(step: str, _count: int) -> None:
                if advance is not None:
                    advance(steps.index(step) + 1)

            return host.delete(name, on_step=on_step).to_json()


def delete_steps() -> tuple[str, ...]:
    from tiered.lifecycle.delete import STEPS  # the delete's steps, for the progress bar

    return STEPS


def topic_list(settings: Settings, include_deleted: bool = False) -> list[dict[str, Any]]:
    with open_stores(settings) as (metadata, _objects):
        return [row.to_json() for row in list_topics(metadata, include_deleted=include_deleted)]
