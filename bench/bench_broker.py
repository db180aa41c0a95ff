"""Broker benchmark (not a test): end-to-end latency through the HTTP API, and what a
client sees of a move. One command, a few minutes on 2 cores:

    .venv/bin/python bench/bench_broker.py [--seconds 10] [--rates 100,400] [--topics 1,100] [--moves 20]

For "sqlite+local" (one SQLite file, one local directory) and "etcd+moto" (a real etcd
and moto's S3 over HTTP, both started here as their own processes), it starts two
``dnb broker run`` processes and measures:

* **produce -> consume latency**, open loop (as the OpenMessaging Benchmark does): the
  send times are a fixed schedule at the offered rate, spread round-robin over 1 or 100
  topics; each message is produced (``ack=durable``) through :class:`BrokerClient` at its
  scheduled time whether or not earlier ones were answered, and its latency runs from
  the *scheduled* send time (so a stall is charged to every message it delays, no
  coordinated omission) to the moment a consumer (one long-poll reader per topic, a
  second client) received it. The produce ack latency (scheduled time -> acked) is
  printed beside it. The first second is warm-up and not counted.
* **unavailability during a move**: one topic, a producer at a fixed schedule
  (``--move-rate``), ``--moves`` moves between the two brokers (request unload, wait
  sealed, assign: what ``dnb move`` does). Per move: the time from the last successful
  produce on the old owner (the ack of the sealed last offset) to the first on the new
  owner (the first ack of a later offset), with the client's default back-off.

Prints a table (and, with ``--json``, writes the raw numbers).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tests.broker.test_broker_process import Broker  # noqa: E402
from tests.fixtures.servers import EtcdServer, free_port, set_fake_aws_credentials  # noqa: E402
from tiered.broker.client import BrokerClient  # noqa: E402
from tiered.lifecycle.watcher import assign, request_unload, wait_sealed  # noqa: E402
from tiered.metadata import open_metadata  # noqa: E402

MESSAGE_BYTES = 256
WARMUP_S = 1.0
#: After the last scheduled send, how long consumers may take to receive the rest.
DRAIN_S = 30.0
CLIENT_TIMEOUT_S = 30.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def ms(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": pct(values, 0.5) * 1e3, "p99_ms": pct(values, 0.99) * 1e3,
            "max_ms": max(values) * 1e3 if values else float("nan")}


class MotoProcess:
    """moto's S3 as its own process (not a thread of this one: the load generator's
    event loop must not share a GIL with the object store it measures)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                                      "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto_server did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class Backend:
    """Two broker processes on one pair of stores."""

    def __init__(self, name: str, root: pathlib.Path, metadata_url: str, objects_url: str) -> None:
        self.name = name
        self.metadata_url = metadata_url
        self.metadata = open_metadata(metadata_url)
        self.brokers = {b: Broker(root, b, stores=(metadata_url, objects_url), wait=False) for b in ("1", "2")}
        for b, broker in self.brokers.items():
            for attempt in range(3):  # a freshly started etcd on a loaded machine may refuse the first lease
                try:
                    broker.wait_ready()
                    break
                except AssertionError as e:
                    print(f"  {name}: broker {b} did not start ({str(e).strip()[-120:]}); again", file=sys.stderr)
                    time.sleep(1.0)
                    broker = self.brokers[b] = Broker(root, b, stores=(metadata_url, objects_url), wait=False)
            else:
                raise RuntimeError(f"{name}: broker {b} did not start")
        self.urls = [b.url for b in self.brokers.values()]

    def host(self, topics: list[str], broker_id: str = "1", timeout_s: float = 120.0) -> None:
        """Assign the topics and wait until the broker serves them all."""
        for topic in topics:
            assign(self.metadata, topic, broker_id, reason="bench")
        deadline = time.monotonic() + timeout_s
        while not set(topics) <= set(self.brokers[broker_id].topics()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: broker {broker_id} did not load {len(topics)} topics")
            time.sleep(0.05)

    def move(self, topic: str, src: str, dst: str) -> int | None:
        request_unload(self.metadata, topic, src, reason="bench", to_broker=dst)
        last = wait_sealed(self.metadata, topic, timeout_s=120.0)
        assign(self.metadata, topic, dst, reason="bench")
        return last

    def close(self) -> None:
        for broker in self.brokers.values():
            broker.terminate()
        self.metadata.close()


def _payload(i: int) -> bytes:
    head = b"%d|" % i
    return head + b"x" * (MESSAGE_BYTES - len(head))


async def latency_run(backend: Backend, topics: list[str], rate: float, seconds: float) -> dict:
    """Open loop: message i is produced at t0 + i/rate to topics[i % len(topics)]."""
    count = int(rate * seconds)
    producer = BrokerClient(backend.urls, timeout_s=CLIENT_TIMEOUT_S)
    consumer = BrokerClient(backend.urls, timeout_s=CLIENT_TIMEOUT_S)
    t0 = time.monotonic() + 0.5
    scheduled = [t0 + i / rate for i in range(count)]
    e2e: dict[int, float] = {}
    acked: dict[int, float] = {}
    errors: list[str] = []
    done = asyncio.Event()

    async def consume(topic: str) -> None:
        position = 0
        while not done.is_set():
            try:
                batch = await consumer.read(topic, position, max_messages=1000, wait_s=1.0)
            except Exception as e:  # noqa: BLE001 - counted, then read on
                errors.append(f"read {topic}: {type(e).__name__}")
                continue
            now = time.monotonic()
            for m in batch.messages:
                i = int(m["payload"].split(b"|", 1)[0])
                e2e.setdefault(i, now - scheduled[i])
            position = batch.next_offset
            if len(e2e) >= count:
                done.set()

    async def produce(i: int) -> None:
        try:
            await producer.produce(topics[i % len(topics)], [_payload(i)], ack="durable")
            acked[i] = time.monotonic() - scheduled[i]
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(f"produce {i}: {type(e).__name__}")

    readers = [asyncio.create_task(consume(t)) for t in topics]
    sends = []
    for i, at in enumerate(scheduled):
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sends.append(asyncio.create_task(produce(i)))
    await asyncio.gather(*sends)
    try:
        await asyncio.wait_for(done.wait(), DRAIN_S)
    except asyncio.TimeoutError:
        errors.append(f"{count - len(e2e)} acked messages not consumed within {DRAIN_S}s")
    done.set()
    for r in readers:
        r.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    await producer.close()
    await consumer.close()
    counted = [i for i in range(count) if scheduled[i] >= t0 + WARMUP_S]
    return {"topics": len(topics), "rate": rate, "sent": count,
            "e2e": ms([e2e[i] for i in counted if i in e2e]), "ack": ms([acked[i] for i in counted if i in acked]),
            "errors": len(errors), "error_sample": errors[:3]}


async def move_run(backend: Backend, topic: str, moves: int, rate: float) -> dict:
    """A producer on a fixed schedule while the topic moves between the two brokers."""
    client = BrokerClient(backend.urls, timeout_s=CLIENT_TIMEOUT_S)
    acks: dict[int, float] = {}  # offset -> when its ack arrived
    errors: list[str] = []
    stop = asyncio.Event()
    inflight: set[asyncio.Task] = set()

    async def produce(i: int) -> None:
        try:
            [offset] = await client.produce(topic, [_payload(i)], ack="durable")
            acks[offset] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - counted
            errors.append(type(e).__name__)

    async def schedule() -> None:
        t0, i = time.monotonic(), 0
        while not stop.is_set():
            task = asyncio.create_task(produce(i))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))

    sender = asyncio.create_task(schedule())
    sealed: list[int] = []
    move_s: list[float] = []
    owner = "1"
    await asyncio.sleep(1.0)
    for _ in range(moves):
        target = "2" if owner == "1" else "1"
        begun = time.monotonic()
        last = await asyncio.to_thread(backend.move, topic, owner, target)
        move_s.append(time.monotonic() - begun)
        owner = target
        if last is not None:
            sealed.append(last)
        # The next move only once the new owner acknowledged something (bounded), so each
        # move's unavailability is measured on its own, then a little steady traffic.
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while not any(o > (last if last is not None else -1) for o in list(acks)[-50:]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{backend.name}: no ack on broker {owner} within {CLIENT_TIMEOUT_S}s")
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
    stop.set()
    await sender
    await asyncio.gather(*inflight, return_exceptions=True)
    await client.close()
    gaps = []
    for last in sealed:
        before = [t for o, t in acks.items() if o <= last]
        after = [t for o, t in acks.items() if o > last]
        if before and after:
            gaps.append(min(after) - max(before))
    print(f"  {backend.name}: {len(acks)} acked, sealed at {sealed}, {len(errors)} errors", file=sys.stderr)
    return {"moves": moves, "rate": rate, "unavailable": ms(gaps), "move_command": ms(move_s),
            "acked": len(acks), "errors": len(errors), "error_sample": errors[:3]}


def run_backend(backend: Backend, args: argparse.Namespace) -> dict:
    results: dict = {"latency": [], "move": None}
    run_id = uuid.uuid4().hex[:6]
    for topic_count in args.topics:
        for rate in args.rates:
            topics = [f"/bench/t{run_id}-{topic_count}-{int(rate)}-{k}" for k in range(topic_count)]
            backend.host(topics)
            result = asyncio.run(latency_run(backend, topics, rate, args.seconds))
            results["latency"].append(result)
            print(f"  {backend.name}: {topic_count} topic(s) at {rate:g} msg/s: e2e p50 "
                  f"{result['e2e']['p50_ms']:.1f} ms, p99 {result['e2e']['p99_ms']:.1f} ms", file=sys.stderr)
    topic = f"/bench/move-{run_id}"
    backend.host([topic])
    results["move"] = asyncio.run(move_run(backend, topic, args.moves, args.move_rate))
    return results


def print_table(results: dict) -> None:
    print(f"\n{'backend':<13} {'measure':<34} {'topics':>6} {'msg/s':>6} {'n':>6} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>6}")
    for name, r in results.items():
        for x in r["latency"]:
            for label, key in (("produce->consume (e2e)", "e2e"), ("produce ack (durable)", "ack")):
                s = x[key]
                print(f"{name:<13} {label:<34} {x['topics']:>6} {x['rate']:>6g} {s['n']:>6} "
                      f"{s['p50_ms']:>8.1f} {s['p99_ms']:>8.1f} {s['max_ms']:>8.1f} {x['errors']:>6}")
        m = r["move"]
        for label, key in (("unavailable during a move", "unavailable"), ("move command (unload..assign)", "move_command")):
            s = m[key]
            print(f"{name:<13} {label:<34} {1:>6} {m['rate']:>6g} {s['n']:>6} "
                  f"{s['p50_ms']:>8.1f} {s['p99_ms']:>8.1f} {s['max_ms']:>8.1f} {m['errors']:>6}")


def main() -> None:
    parser = argparse.ArgumentParser(description="dnb broker benchmark (latency through HTTP, move unavailability)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per latency run")
    parser.add_argument("--rates", default="100,400", help="offered msg/s, comma-separated")
    parser.add_argument("--topics", default="1,100", help="topic counts, comma-separated")
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--move-rate", type=float, default=200.0, help="msg/s offered while moving")
    parser.add_argument("--backends", default="sqlite+local,etcd+moto")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    args.topics = [int(t) for t in args.topics.split(",")]
    set_fake_aws_credentials()
    root = pathlib.Path(tempfile.mkdtemp(prefix="dnb-bench-broker-"))
    results: dict = {}
    try:
        for name in args.backends.split(","):
            servers: list = []
            if name == "sqlite+local":
                os.makedirs(root / "local" / "objects")
                urls = (f"sqlite:///{root}/local/metadata.db", f"file://{root}/local/objects")
                where = root / "local"
            elif name == "etcd+moto":
                import boto3

                etcd, moto = EtcdServer().start(), MotoProcess()
                servers = [etcd.cleanup, moto.stop]
                bucket = f"bench-{uuid.uuid4().hex[:8]}"
                boto3.client("s3", endpoint_url=moto.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
                urls = (f"{etcd.url}/bench", f"s3://{bucket}/dnb?endpoint={moto.endpoint_url}&region=us-east-1")
                where = root / "remote"
                os.makedirs(where)
            else:
                raise SystemExit(f"unknown backend {name!r}")
            backend = Backend(name, where, *urls)
            try:
                results[name] = run_backend(backend, args)
            finally:
                backend.close()
                for stop in servers:
                    stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(results)
    print(f"\n{MESSAGE_BYTES}-byte messages, ack=durable, one HTTP request per message; "
          f"open loop (latency from the scheduled send time); {WARMUP_S:g} s warm-up excluded; "
          f"{os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
