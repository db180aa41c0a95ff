"""Topic-move benchmark (not a test). One command, ~1-2 minutes on 2 cores:

    cd /work/main && .venv/bin/python bench/bench_moves.py [--moves 20] [--backlog-mib 64] [--reps 3]

Starts its own etcd and moto servers on loopback ports. For "etcd+moto" (real servers
over the network stack) and "sqlite+local" (embedded reference) it measures:

* move latency = ``unload`` on broker A + ``load`` on broker B, p50/p99, with no
  backlog (everything already archived) and with ``--backlog-mib`` of durable but
  un-uploaded messages (so the seal must drain them to the object store first);
* cold catch-up read throughput: a fresh broker reads the whole backlog from the
  archive (tiered reader, cloud tier) — local directory vs moto;
* time from ``load`` to the first message served to a resuming subscription.

Prints a table and writes bench/results/moves.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tests.fixtures.servers import EtcdServer, MotoServer, set_fake_aws_credentials  # noqa: E402
from tiered.lifecycle.config import BrokerConfig  # noqa: E402
from tiered.lifecycle import BrokerHost  # noqa: E402
from tiered.metadata import open_metadata  # noqa: E402
from tiered.objects import open_objects  # noqa: E402
from uploader.config import UploaderConfig  # noqa: E402

MESSAGE_BYTES = 16 << 10
# Background uploads off: the benchmark controls when data is archived.
CONFIG = BrokerConfig(uploader=UploaderConfig(interval_s=3600.0, upload_bytes_threshold=1 << 40,
                                              drain_timeout_s=300.0),
                      register_session=False)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summary_ms(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": statistics.median(values) * 1e3, "p99_ms": pct(values, 0.99) * 1e3}


class Setup:
    def __init__(self, name: str, metadata_url: str, objects_url: str, root: str) -> None:
        self.name = name
        self.metadata = open_metadata(metadata_url)
        self.objects = open_objects(objects_url)
        self.root = root
        self.hosts = {b: BrokerHost(b, os.path.join(root, b), self.metadata, self.objects, CONFIG)
                      for b in ("A", "B", "C")}

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()
        self.metadata.close()


def move(setup: Setup, topic: str, src: str, dst: str) -> float:
    started = time.perf_counter()
    setup.hosts[src].unload(topic)
    setup.hosts[dst].load(topic)
    return time.perf_counter() - started


def bench_no_backlog(setup: Setup, moves: int) -> dict:
    topic = f"/bench/nobacklog-{uuid.uuid4().hex[:8]}"
    hosted = setup.hosts["A"].load(topic)
    times, src, dst = [], "A", "B"
    for _ in range(moves):
        for _ in range(10):
            hosted.produce(b"x" * 100)
        hosted.uploader.upload_once()
        times.append(move(setup, topic, src, dst))
        src, dst = dst, src
        hosted = setup.hosts[src].topic(topic)
    setup.hosts[src].unload(topic)
    return summary_ms(times)


def fill(hosted, backlog_bytes: int) -> int:
    block = os.urandom(1 << 20)  # incompressible: the seal moves every byte
    count = backlog_bytes // MESSAGE_BYTES
    last = 0
    for i in range(count):
        start = (i * MESSAGE_BYTES) % ((1 << 20) - MESSAGE_BYTES)
        last = hosted.wal.append(block[start:start + MESSAGE_BYTES])
    hosted.wal.flush(60.0)
    return last


def bench_backlog(setup: Setup, backlog_bytes: int, reps: int) -> tuple[dict, dict, dict]:
    moves, reads, first = [], [], []
    for _ in range(reps):
        topic = f"/bench/backlog-{uuid.uuid4().hex[:8]}"
        hosted = setup.hosts["A"].load(topic)
        last = fill(hosted, backlog_bytes)
        moves.append(move(setup, topic, "A", "B"))
        setup.hosts["B"].unload(topic)
        first.append(time_to_first_message(setup, topic))
        reads.append(cold_read(setup, topic, last))
        setup.hosts["C"].unload(topic)
    mib = backlog_bytes / (1 << 20)
    read_mib_s = [mib / s for s in reads]
    return (summary_ms(moves),
            {"n": len(reads), "mib_per_s_median": statistics.median(read_mib_s), "mib": mib},
            summary_ms(first))


def time_to_first_message(setup: Setup, topic: str) -> float:
    started = time.perf_counter()
    hosted = setup.hosts["C"].load(topic)
    sub = hosted.subscribe("bench", initial="earliest")  # a consumer resuming at the start
    with hosted.create_reader(sub.cursor + 1, live=False) as reader:
        next(iter(reader))
    return time.perf_counter() - started


def cold_read(setup: Setup, topic: str, last: int) -> float:
    hosted = setup.hosts["C"].topic(topic)
    started = time.perf_counter()
    count = 0
    with hosted.create_reader(0, live=False) as reader:
        for message in reader:
            count += 1
            if message.offset == last:
                break
    assert count == last + 1, (count, last)
    return time.perf_counter() - started


def run(setup: Setup, args: argparse.Namespace) -> dict:
    result = {"move_no_backlog": bench_no_backlog(setup, args.moves)}
    moved, read, first = bench_backlog(setup, args.backlog_mib << 20, args.reps)
    result.update({f"move_backlog_{args.backlog_mib}MiB": moved, "cold_read": read, "load_to_first_message": first})
    return result


def print_table(results: dict, backlog_mib: int) -> None:
    rows = [("unload+load, no backlog", "move_no_backlog"),
            (f"unload+load, {backlog_mib} MiB un-uploaded", f"move_backlog_{backlog_mib}MiB"),
            ("load -> first message served", "load_to_first_message")]
    print(f"{'measure':<40} {'backend':<14} {'p50':>10} {'p99':>10} {'n':>4}")
    for label, key in rows:
        for backend, r in results.items():
            m = r[key]
            print(f"{label:<40} {backend:<14} {m['p50_ms']:>8.1f}ms {m['p99_ms']:>8.1f}ms {m['n']:>4}")
    for backend, r in results.items():
        c = r["cold_read"]
        print(f"{'cold catch-up read (cloud tier)':<40} {backend:<14} {c['mib_per_s_median']:>7.1f}MiB/s {'':>10} {c['n']:>4}")


def main() -> None:
    parser = argparse.ArgumentParser(description="topic move benchmark")
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--backlog-mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "moves.json"))
    args = parser.parse_args()
    set_fake_aws_credentials()
    import boto3

    etcd, moto = EtcdServer().start(), MotoServer().start()
    root = tempfile.mkdtemp(prefix="dnb-bench-moves-")
    results = {}
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=moto.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
        os.makedirs(f"{root}/local/objects")
        setups = [
            ("sqlite+local", f"sqlite:///{root}/local/metadata.db", f"file://{root}/local/objects", f"{root}/local"),
            ("etcd+moto", f"{etcd.url}/bench", f"s3://{bucket}/dnb?endpoint={moto.endpoint_url}&region=us-east-1",
             f"{root}/remote"),
        ]
        for name, md_url, obj_url, wal_root in setups:
            setup = Setup(name, md_url, obj_url, wal_root)
            try:
                results[name] = run(setup, args)
            finally:
                setup.close()
    finally:
        etcd.cleanup()
        moto.stop()
        shutil.rmtree(root, ignore_errors=True)
    print_table(results, args.backlog_mib)
    import native

    out = {"codec": native.IMPLEMENTATION, "message_bytes": MESSAGE_BYTES, "args": vars(args), "results": results}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
