"""Spark over the dnb1 archive vs Spark over Parquet of the same rows, in one run.

    .venv/bin/python bench/bench_spark.py                 # 10 M messages of 100 B
    .venv/bin/python bench/bench_spark.py --messages 500000   # quick run

Builds the archive directly with the native dnb1 writer (objects of ``--object-messages``,
1 MiB zstd blocks, descriptors in SQLite), writes the same rows to Parquet with Spark,
then times four queries on each, with filter pushdown on (opted in: fresh DataFrame, one scan):

* ``count``   — ``SELECT count(*)`` (Parquet answers from its metadata; dnb1 must decode)
* ``scan``    — ``sum(length(payload))``: every row and payload read
* ``offset``  — ``count(*) WHERE offset BETWEEN m/2 AND m/2 + 9999`` (dnb1 prunes objects/blocks)
* ``payload`` — ``count(*) WHERE payload contains a needle``: a full scan with a filter

``count`` and ``scan`` also run on a third source, ``bench/spark_floor_source.py``: a Python
data source with the same schema that yields ready-made Arrow batches (no storage, no
decoding), i.e. the floor of Spark's Python data source path on this machine.

Both sides first run one untimed full scan (JVM JIT and Python workers warm for both). Each
query then runs ``--repeat`` times on a freshly loaded DataFrame per run, on both sides:
Spark 4.3 caches a Python data source's planned partitions in the relation and reuses them
for a later query on the same DataFrame whose filters it cannot push, so a reused DataFrame
would answer ``count(*)`` after an offset query with the offset query's rows (see
docs/SPARK.md). The table shows the best time. Results go to
``bench/results/spark.json``. Timings are wall-clock on this machine, shared cores included.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TOPIC = "/bench/spark"
BASE_TIME_MS = 1_700_000_000_000


def build_archive(root: str, messages: int, object_messages: int, payload_bytes: int, block_bytes: int) -> dict:
    import native
    from native import object_format
    from tiered.archive.naming import object_key
    from tiered.metadata import keys, open_metadata
    from tiered.objects import open_objects

    objects_url, metadata_url = f"file://{root}/objects", f"sqlite:///{root}/metadata.db"
    started = time.perf_counter()
    total_bytes = 0
    filler = (b"the quick brown fox jumps over the lazy dog " * 4)
    with open_objects(objects_url) as objects, open_metadata(metadata_url) as meta:
        for start in range(0, messages, object_messages):
            end = min(messages, start + object_messages) - 1
            batch = []
            for i in range(start, end + 1):
                head = b"msg-%012d-" % i
                batch.append((BASE_TIME_MS + i, None, None, (head + filler)[:payload_bytes]))
            frames = native.encode_batch(start, batch)
            data = object_format.write_object(frames, topic=TOPIC, block_bytes=block_bytes, zstd_level=3,
                                              first_offset=start)
            object_id = f"data-{start}-{end}"
            info = objects.put(object_key(TOPIC, start, object_id), data)
            meta.put(keys.descriptor_key(TOPIC, start), keys.ObjectDescriptor(
                start, end, object_id, len(data), info.etag, time.time(), "bench", 1, *object_format.object_digest(data),
                compression="zstd").to_json())
            total_bytes += len(data)
    return {"objects_url": objects_url, "metadata_url": metadata_url, "archive_bytes": total_bytes,
            "build_s": time.perf_counter() - started}


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000_000)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--object-messages", type=int, default=1_000_000)
    ap.add_argument("--block-bytes", type=int, default=1 << 20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--workdir", default=None, help="kept if given; else a temp dir that is removed")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "spark.json"))
    args = ap.parse_args()

    root = args.workdir or tempfile.mkdtemp(prefix="dnb-bench-spark-")
    os.makedirs(root, exist_ok=True)
    try:
        run(args, root)
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, root: str) -> None:
    import native
    from tiered.spark.session import local_session

    archive = build_archive(root, args.messages, args.object_messages, args.payload_bytes, args.block_bytes)
    print(f"archive: {args.messages:,} messages, {archive['archive_bytes'] / 1e6:.1f} MB in dnb1 "
          f"(codec {native.IMPLEMENTATION}), built in {archive['build_s']:.1f} s", flush=True)
    # Spark's Python workers import the floor source from bench/ (see spark_floor_source.py).
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (bench_dir, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, bench_dir)
    from spark_floor_source import FloorSource

    spark = local_session(master=args.master, app_name="dnb-bench-spark",
                          conf={"spark.driver.memory": "2g"}, filter_pushdown=True)
    spark.dataSource.register(FloorSource)
    try:
        dnb1 = (spark.read.format("dnb1").option("topic", TOPIC).option("metadata", archive["metadata_url"])
                .option("objects", archive["objects_url"]).load())
        parquet_path = os.path.join(root, "parquet")
        t = time.perf_counter()
        dnb1.write.mode("overwrite").parquet(parquet_path)
        parquet_write_s = time.perf_counter() - t
        parquet_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(parquet_path) for f in fs
                            if f.endswith(".parquet"))
        print(f"parquet: {parquet_bytes / 1e6:.1f} MB written by Spark in {parquet_write_s:.1f} s", flush=True)
        loaders = {
            # Pushdown is opt-in (tiered/spark/datasource.py): safe here because every
            # timed query loads a fresh DataFrame and scans it once.
            "dnb1": lambda: (spark.read.format("dnb1").option("topic", TOPIC)
                             .option("metadata", archive["metadata_url"])
                             .option("objects", archive["objects_url"]).option("pushdown", "auto").load()),
            "pq": lambda: spark.read.parquet(parquet_path),
            # Same rows' shape, no storage and no decoding: Spark's own cost for a Python source.
            "floor": lambda: (spark.read.format("dnbfloor").option("rows", str(args.messages))
                              .option("payloadBytes", str(args.payload_bytes)).load()),
        }

        def timed(table: str, sql: str) -> tuple[float, object]:
            def once() -> object:
                loaders[table]().createOrReplaceTempView(table)
                return spark.sql(sql.format(t=table)).collect()[0][0]
            return best_of(args.repeat, once)

        for table, load in loaders.items():  # warm-up, untimed
            load().createOrReplaceTempView(table)
            spark.sql(f"SELECT sum(length(payload)) FROM {table}").collect()
        lo = args.messages // 2
        needle = "msg-%012d-" % (args.messages - 7)
        queries = {
            "count": "SELECT count(*) FROM {t}",
            "scan": "SELECT sum(length(payload)) FROM {t}",
            "offset": f"SELECT count(*) FROM {{t}} WHERE offset BETWEEN {lo} AND {lo + 9999}",
            "payload": f"SELECT count(*) FROM {{t}} WHERE instr(cast(payload AS string), '{needle}') > 0",
        }
        results = []
        for name, sql in queries.items():
            row = {"query": name}
            for table in ("dnb1", "pq", "floor"):
                if table == "floor" and name not in ("count", "scan"):
                    continue  # the floor's rows are synthetic; only whole-table queries compare
                seconds, value = timed(table, sql)
                row[f"{table}_s"] = round(seconds, 3)
                row[f"{table}_value"] = value
            assert row["dnb1_value"] == row["pq_value"], f"{name}: dnb1 {row['dnb1_value']} != parquet {row['pq_value']}"
            row["ratio"] = round(row["dnb1_s"] / row["pq_s"], 2)
            results.append(row)
            floor = f"   python-source floor {row['floor_s']:6.2f} s" if "floor_s" in row else ""
            print(f"  {name:8s} dnb1 {row['dnb1_s']:7.2f} s   parquet {row['pq_s']:7.2f} s   "
                  f"dnb1/parquet {row['ratio']:5.2f}x{floor}   (result {row['dnb1_value']})", flush=True)
    finally:
        spark.stop()
    print()
    print("| query | dnb1 (s) | Parquet (s) | dnb1 / Parquet | Python-source floor (s) | dnb1 / floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        floor = (f"{r['floor_s']:.2f} | {r['dnb1_s'] / r['floor_s']:.2f}x" if "floor_s" in r else "- | -")
        print(f"| {r['query']} | {r['dnb1_s']:.2f} | {r['pq_s']:.2f} | {r['ratio']:.2f}x | {floor} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"messages": args.messages, "payload_bytes": args.payload_bytes,
                   "object_messages": args.object_messages, "block_bytes": args.block_bytes,
                   "master": args.master, "codec": native.IMPLEMENTATION, "cpus": os.cpu_count(),
                   "archive_bytes": archive["archive_bytes"], "parquet_bytes": parquet_bytes,
                   "parquet_write_s": round(parquet_write_s, 2), "results": results}, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
