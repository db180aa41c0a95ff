"""Benchmark the metadata and object stores on this machine (not a test).

    .venv/bin/python bench/bench_stores.py [--ops 500] [--json bench/results/stores.json]

Starts its own etcd and moto servers on loopback ports, prints a table and writes
the numbers as JSON. Metadata: single-thread get/put/txn rate and p50/p99 latency
for SQLite (synchronous=FULL: every write is fsynced) and etcd. Objects: put / get /
ranged-get (1 MiB from the middle) throughput at 64 KiB, 8 MiB and 64 MiB for the
local directory (put fsyncs) and moto over HTTP.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tests.fixtures.servers import EtcdServer, MotoServer, set_fake_aws_credentials  # noqa: E402
from tiered.metadata import MetadataStore, Put, absent, open_metadata  # noqa: E402
from tiered.objects import ObjectStore, RangeByteRequest, open_objects  # noqa: E402

SIZES = [("64KiB", 64 << 10), ("8MiB", 8 << 20), ("64MiB", 64 << 20)]
RANGE_BYTES = 1 << 20


def timed(fn: Callable[[int], object], n: int) -> dict:
    lat = []
    start = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    lat.sort()
    return {
        "ops_per_s": n / total,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
    }


def bench_metadata(store: MetadataStore, ops: int) -> dict:
    value = b"x" * 200  # about a descriptor's size
    return {
        "put": timed(lambda i: store.put(f"/bench/k{i}", value), ops),
        "get": timed(lambda i: store.get(f"/bench/k{i}"), ops),
        "txn": timed(lambda i: store.txn([absent(f"/bench/t{i}")], [Put(f"/bench/t{i}", value)]), ops),
    }


def bench_objects(store: ObjectStore) -> dict:
    out = {}
    for label, size in SIZES:
        data = os.urandom(size)
        reps = 20 if size <= 1 << 20 else (5 if size <= 8 << 20 else 2)
        mib = size / (1 << 20)
        put = timed(lambda i: store.put(f"bench/{label}/{i}", data), reps)
        get = timed(lambda i: store.get(f"bench/{label}/{i}"), reps)
        rng = min(RANGE_BYTES, size)
        mid = (size - rng) // 2
        ranged = timed(lambda i: store.get_range(f"bench/{label}/{i}", RangeByteRequest(mid, mid + rng)), reps)
        out[label] = {
            "put_MiB_s": put["ops_per_s"] * mib,
            "get_MiB_s": get["ops_per_s"] * mib,
            "range_MiB_s": ranged["ops_per_s"] * rng / (1 << 20),
            "range_p50_ms": ranged["p50_ms"],
        }
        for i in range(reps):
            store.delete(f"bench/{label}/{i}")
    return out


def print_tables(results: dict) -> None:
    print(f"\n{'metadata':<8} {'op':<4} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for backend, ops in results["metadata"].items():
        for op, r in ops.items():
            print(f"{backend:<8} {op:<4} {r['ops_per_s']:>9.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}")
    print(f"\n{'objects':<8} {'size':<6} {'put MiB/s':>10} {'get MiB/s':>10} {'range MiB/s':>12} {'range p50 ms':>13}")
    for backend, sizes in results["objects"].items():
        for label, r in sizes.items():
            print(
                f"{backend:<8} {label:<6} {r['put_MiB_s']:>10.1f} {r['get_MiB_s']:>10.1f}"
                f" {r['range_MiB_s']:>12.1f} {r['range_p50_ms']:>13.2f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=500, help="metadata operations per measurement")
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "stores.json"))
    args = parser.parse_args()
    set_fake_aws_credentials()
    etcd = EtcdServer().start()
    moto = MotoServer().start()
    work = tempfile.mkdtemp(prefix="dnb-bench-")
    try:
        results: dict = {"metadata": {}, "objects": {}}
        with open_metadata(f"sqlite://{work}/metadata.db") as store:
            results["metadata"]["sqlite"] = bench_metadata(store, args.ops)
        with open_metadata(f"{etcd.url}/bench") as store:
            results["metadata"]["etcd"] = bench_metadata(store, args.ops)
        results["objects"]["local"] = bench_objects(open_objects(f"file://{work}/objects"))
        import boto3

        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=moto.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
        with open_objects(f"s3://{bucket}/p?endpoint={moto.endpoint_url}") as store:
            results["objects"]["moto"] = bench_objects(store)
    finally:
        moto.stop()
        etcd.cleanup()
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    print_tables(results)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
