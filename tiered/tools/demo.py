"""The seed scenario (docs: shared seed 002) as a library function: a topic moves A → B.

Broker A produces 0–21 and uploads; a consumer acks through 13; A seals at 21; broker
B restores at 22 and produces 22–27 and uploads; the consumer resumes at 14, reading
14–21 from the cloud and 22–27 from B's WAL, and acks to 27. Then ``verify`` runs.

:func:`run_demo` returns the timeline rows (the seed's "Complete Timeline Example"
table, filled with what actually happened, including the tier of every read), the
verify result, and ``ok``: every step matched the seed and verify found no problem.
Both brokers are real :class:`~tiered.lifecycle.BrokerHost` objects in this process,
with separate WAL directories and shared metadata and object stores.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from typing import Any

from tiered.lifecycle import BrokerHost
from tiered.lifecycle.config import BrokerConfig
from tiered.metadata import keys, open_metadata
from tiered.objects import open_objects
from tiered.read.reader import read_messages
from tiered.tools.cli.output import render_table
from tiered.tools.verify import verify_topic
from tiered.archive import list_descriptors
from uploader.config import UploaderConfig

TOPIC = "/default/reliable_topic"
SUBSCRIPTION = "subs_reliable"
FIRST_BATCH, SECOND_BATCH, ACK_BEFORE_MOVE = 22, 6, 13
COLUMNS = ("time", "event", "broker_a", "broker_b", "cloud", "consumer")
HEADERS = ("Time", "Event", "Broker A", "Broker B", "Cloud", "Consumer")


def run_demo(metadata_url: str | None = None, objects_url: str | None = None, keep: bool = False,
             workdir: str | None = None) -> dict[str, Any]:
    """Run the scenario; embedded stores in a fresh temporary directory unless URLs are given."""
    root = workdir or tempfile.mkdtemp(prefix="dnb-demo-")
    # Real servers keep state between runs; a fresh topic name keeps each run independent.
    topic = TOPIC if metadata_url is None else f"{TOPIC}-{uuid.uuid4().hex[:8]}"
    metadata_url = metadata_url or f"sqlite:///{os.path.join(root, 'metadata.db').lstrip('/')}"
    objects_url = objects_url or f"file://{os.path.join(root, 'objects')}"
    try:
        result = _run(root, topic, metadata_url, objects_url)
    finally:
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    if keep:
        result["workdir"] = root
    return result


def _run(root: str, topic: str, metadata_url: str, objects_url: str) -> dict[str, Any]:
    if objects_url.startswith("file://"):
        os.makedirs(objects_url[len("file://"):], exist_ok=True)
    metadata = open_metadata(metadata_url)
    objects = open_objects(objects_url)
    try:
        scenario = _Scenario(root, topic, metadata, objects)
        try:
            scenario.play()
        finally:
            scenario.close()
        report = verify_topic(topic, metadata, objects, wal_dir=scenario.wal_dir("b"))
    finally:
        objects.close()
        metadata.close()
    failed = scenario.failed_checks
    return {"topic": topic, "metadata": metadata_url, "objects": objects_url, "timeline": scenario.rows,
            "checks_failed": failed, "verify": report.to_json(), "ok": report.ok and not failed}


class _Scenario:
    """The steps of the seed, each recording one timeline row and checking the seed's numbers."""

    def __init__(self, root: str, topic: str, metadata: Any, objects: Any) -> None:
        self.root, self.topic, self.metadata, self.objects = root, topic, metadata, objects
        # No background upload timer: the seed's uploads happen at T2 and T7, not in between.
        self.config = BrokerConfig(uploader=UploaderConfig(interval_s=3600.0), session_ttl_s=5.0)
        self.rows: list[dict[str, Any]] = []
        self.failed_checks: list[str] = []
        self.hosts: dict[str, Any] = {}

    def wal_dir(self, broker: str) -> str:
        return os.path.join(self.root, f"broker-{broker}", "wal")

    def host(self, broker: str) -> Any:
        if broker not in self.hosts:
            self.hosts[broker] = BrokerHost(f"demo-{broker}", self.wal_dir(broker), self.metadata,
                                            self.objects, self.config)
        return self.hosts[broker]

    def close(self) -> None:
        for host in self.hosts.values():
            host.close(unload=False)

    def row(self, time: str, event: str, a: str = "-", b: str = "-", cloud: str = "-", consumer: str = "-",
            reads: list[dict[str, Any]] | None = None) -> None:
        self.rows.append({"time": time, "event": event, "broker_a": a, "broker_b": b, "cloud": cloud,
                          "consumer": consumer, "reads": reads or []})

    def expect(self, what: str, actual: Any, expected: Any) -> None:
        if actual != expected:
            self.failed_checks.append(f"{what}: expected {expected!r}, got {actual!r}")

    # -- the seed, step by step ---------------------------------------------------------
    def play(self) -> None:
        a = self.host("a").load(self.topic)
        first, last = _produce(a, FIRST_BATCH, 0)
        self.expect("T1 offsets", (first, last), (0, FIRST_BATCH - 1))
        self.row("T1", "Produce msgs", a=f"Offsets {first}-{last}")

        through = a.uploader.upload_once()
        self.expect("T2 committed_through", through, FIRST_BATCH - 1)
        self.row("T2", "Upload", cloud=f"{_stored(self.metadata, self.topic, 0)} stored")

        sub = a.subscribe(SUBSCRIPTION, "earliest")
        read = read_messages(a.create_reader(sub.start_offset, live=False), ACK_BEFORE_MOVE + 1)
        sub.ack(read[-1].offset)
        sub.flush()
        self.expect("T3 reads", [m.offset for m in read], list(range(ACK_BEFORE_MOVE + 1)))
        self.row("T3", "Consumer reads", consumer=f"{_describe_reads(read)}, cursor={_cursor(self)}",
                 reads=_read_spans(read))

        sealed = self.host("a").unload(self.topic)
        self.expect("T4 sealed last_committed_offset", sealed, FIRST_BATCH - 1)
        self.row("T4", "UNLOAD", a=f"Seal state ({sealed})", cloud="State saved")

        b = self.host("b").load(self.topic)
        self.expect("T5 next offset on B", b.next_offset, FIRST_BATCH)
        self.row("T5", "Assign to B", b=f"Load, WAL={b.next_offset}")

        first, last = _produce(b, SECOND_BATCH, FIRST_BATCH)
        self.expect("T6 offsets", (first, last), (FIRST_BATCH, FIRST_BATCH + SECOND_BATCH - 1))
        self.row("T6", "Produce msgs", b=f"Offsets {first}-{last}")

        b.uploader.upload_once()
        self.row("T7", "Upload", cloud=f"{_stored(self.metadata, self.topic, FIRST_BATCH)} stored")
        self._resume_consumer(b)

    def _resume_consumer(self, b: Any) -> None:
        sub = b.subscribe(SUBSCRIPTION)
        self.expect("T8 resume offset", sub.start_offset, ACK_BEFORE_MOVE + 1)
        read = read_messages(b.create_reader(sub.start_offset, live=False), None)
        by_tier = {tier: list(group) for tier, group in itertools.groupby(read, key=lambda m: m.tier)}
        cloud, wal = by_tier.get("cloud", []), by_tier.get("wal", [])
        self.expect("T8 cloud reads", [m.offset for m in cloud], list(range(ACK_BEFORE_MOVE + 1, FIRST_BATCH)))
        self.expect("T9 WAL reads", [m.offset for m in wal],
                    list(range(FIRST_BATCH, FIRST_BATCH + SECOND_BATCH)))
        self.expect("T8-T9 every read", [m.offset for m in read],
                    list(range(ACK_BEFORE_MOVE + 1, FIRST_BATCH + SECOND_BATCH)))
        self.row("T8", "Consumer reconnect", consumer=_describe_reads(cloud), reads=_read_spans(cloud))
        self.row("T9", "Continue read", consumer=_describe_reads(wal), reads=_read_spans(wal))
        sub.ack(read[-1].offset)
        sub.flush()
        cursor = _cursor(self)
        self.expect("T10 cursor", cursor, FIRST_BATCH + SECOND_BATCH - 1)
        self.row("T10", "ACK all", consumer=f"Cursor={cursor}")


def _produce(hosted: Any, count: int, label_from: int) -> tuple[int, int]:
    offsets = [hosted.produce(f"msg-{label_from + i}".encode()) for i in range(count)]
    return offsets[0], offsets[-1]


def _read_spans(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Consecutive runs of one tier as {first_offset, last_offset, tier, count}."""
    spans = []
    for tier, group in itertools.groupby(messages, key=lambda m: m.tier):
        run = list(group)
        spans.append({"first_offset": run[0].offset, "last_offset": run[-1].offset, "tier": tier,
                      "count": len(run)})
    return spans


def _describe_reads(messages: list[Any]) -> str:
    if not messages:
        return "Reads nothing"
    return "Reads " + ", ".join(f"{s['first_offset']}-{s['last_offset']} ({s['tier'].upper() if s['tier'] == 'wal' else s['tier']})"
                                for s in _read_spans(messages))


def _stored(metadata: Any, topic: str, start: int) -> str:
    """The committed object range starting at ``start`` (as descriptors say)."""
    for d in list_descriptors(metadata, topic):
        if d.start_offset == start:
            return f"{d.start_offset}-{d.end_offset}"
    return "nothing"


def _cursor(scenario: _Scenario) -> int | None:
    kv = scenario.metadata.get(keys.cursor_key(scenario.topic, SUBSCRIPTION))
    return None if kv is None else keys.Cursor.from_json(kv.key, kv.value).last_acked_offset


def render_demo(result: dict[str, Any]) -> str:
    """The timeline table, then the verify verdict (what `dnb demo` prints)."""
    table = render_table(HEADERS, [[row[c] for c in COLUMNS] for row in result["timeline"]])
    lines = [f"Topic {result['topic']} moves from broker A to broker B "
             f"(metadata {result['metadata']}, objects {result['objects']})", "", table, ""]
    verify = result["verify"]
    if verify["ok"]:
        lines.append("verify: OK (descriptors contiguous, every object intact, no orphans)")
    else:
        lines.append(f"verify: {len(verify['problems'])} problem(s)")
        lines += [f"  [{p['kind']}] {p['message']}" for p in verify["problems"]]
    lines += [f"  check failed: {c}" for c in result["checks_failed"]]
    if "workdir" in result:
        lines.append(f"kept: {result['workdir']}")
    lines.append("RESULT: " + ("ok - offsets continuous across the move" if result["ok"] else "FAILED"))
    return "\n".join(lines)
