"""How big archive objects are at a steady produce rate, and what that costs Spark.

Part 1 — objects per GiB archived. A steady producer appends 100-byte messages to a real
WAL (``append_batch`` + ``flush`` every ``--step-s`` of *simulated* time) and the uploader
runs its passes against a fake clock injected into it, so an hour of traffic takes seconds
and every policy sees exactly the same workload. Same run, same process, three policies:

* ``main@2s``  — the old behaviour: every pass uploads everything durable
  up to its bound; a pass every ``interval_s=2`` (forced here with ``request_upload``).
* ``main@30s`` — the same at main's default ``interval_s=30``.
* ``sized``    — this branch's defaults: passes whenever ``is_due()`` says so (checked every
  step, like the pool's scheduler), objects cut at ``object_target_bytes`` (32 MiB) or when
  the oldest un-archived frame is ``object_age_max_s`` (60 s) old.

Objects per GiB = committed objects x 2^30 / their bytes (``compression="none"``, so object
bytes ~ frame bytes: 126 B per 100 B message). The final tail is not counted (a seal would
upload it). Embedded stores: SQLite + local directory.

Part 2 (``--spark``) — the same query on the 1,000 msg/s ``main@2s`` and ``sized`` archives,
with main's planner (one task per object: ``openCostBytes = partitionBytesMax = 32 MiB``)
and with this branch's (runs packed up to 128 MiB). Best of ``--repeat``, fresh DataFrame
each time, local[2].

    .venv/bin/python bench/bench_object_sizing.py                      # part 1 only, ~2 min
    .venv/bin/python bench/bench_object_sizing.py --spark              # + Spark, ~4 min

Never a pass/fail test; timings are wall clock on this machine (shared cores included).
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

from prometheus_client import CollectorRegistry  # noqa: E402

from tiered.metadata import keys  # noqa: E402
from tiered.metadata.base import value_is  # noqa: E402
from tiered.metadata.sqlite import SqliteMetadataStore  # noqa: E402
from tiered.objects.local import LocalObjectStore  # noqa: E402
from tiered.archive import list_descriptors  # noqa: E402
from uploader import Uploader, UploaderMetrics  # noqa: E402
from uploader.config import RetentionConfig, UploaderConfig  # noqa: E402
from wal.config import WalConfig  # noqa: E402
from wal.log import WriteAheadLog  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
TOPIC = "/bench/sizing"
PAYLOAD = b"x" * 100
POLICIES = {
    "main@2s": {"interval_s": 2.0},
    "main@30s": {"interval_s": 30.0},
    "sized": {},
}


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def simulate(root: str, policy: str, rate: int, seconds: float, step_s: float) -> dict:
    """Run ``seconds`` of simulated time at ``rate`` msg/s under ``policy``; keep the archive."""
    os.makedirs(os.path.join(root, "objects"))
    metadata = SqliteMetadataStore(os.path.join(root, "meta.db"))
    objects = LocalObjectStore(os.path.join(root, "objects"))
    owner = keys.Ownership("1", 1, time.time())
    metadata.put(keys.owner_key(TOPIC), owner.to_json())
    # Small WAL segments + retention keep the disk footprint bounded (a 1 GiB limit never
    # tightens the 32 MiB target: that would take a limit under 64 MiB).
    wal = WriteAheadLog.open(os.path.join(root, "wal"), TOPIC, WalConfig(segment_bytes_max=16 * MIB))
    clock = FakeClock()
    config = UploaderConfig(compression="none", retention=RetentionConfig(bytes_max=GIB), **POLICIES[policy])
    up = Uploader(TOPIC, wal, metadata, objects, broker_id=1,
                  fencing=[value_is(keys.owner_key(TOPIC), owner.to_json())], config=config,
                  committed_through=None, clock=clock, metrics=UploaderMetrics(CollectorRegistry()))
    up._listen_durable()  # noqa: SLF001 - what start() does, without the real-time thread
    sent, passes, next_main_pass_s = 0, 0, config.interval_s
    started = time.perf_counter()
    try:
        for step in range(1, int(seconds / step_s) + 1):
            clock.now_s = step * step_s
            due = int(clock.now_s * rate)
            if due > sent:
                wal.append_batch([PAYLOAD] * (due - sent))
                sent = due
            wal.flush(30.0)
            if policy.startswith("main"):
                # main: a pass every interval, or when the lag passes upload_bytes_threshold;
                # every pass uploaded everything durable up to its bound.
                if clock.now_s >= next_main_pass_s or up._lag_estimate()[1] >= config.upload_bytes_threshold:  # noqa: SLF001
                    up.request_upload()
                    up.run_background_pass()
                    passes += 1
                    next_main_pass_s = clock.now_s + config.interval_s
            elif up.is_due():
                up.run_background_pass()
                passes += 1
        elapsed_s = time.perf_counter() - started
        descriptors = list_descriptors(metadata, TOPIC)
        archived_bytes = sum(d.size for d in descriptors)
        up.upload_once()  # the tail (a seal would do this), so Spark reads every message
        return {"policy": policy, "rate": rate, "sim_seconds": seconds, "messages": sent, "passes": passes,
                "objects": len(descriptors), "archived_bytes": archived_bytes,
                "mean_object_bytes": archived_bytes / max(1, len(descriptors)),
                "objects_per_gib": len(descriptors) * GIB / max(1, archived_bytes),
                "wall_s": round(elapsed_s, 1), "root": root}
    finally:
        up.close()
        wal.close()
        metadata.close()


def spark_times(runs: list[dict], repeat: int) -> list[dict]:
    from tiered.spark.session import local_session

    spark = local_session(master="local[2]", app_name="dnb-bench-sizing", filter_pushdown=False)
    planners = {  # main's planner: one task per object (the 32 MiB open cost fills a task)
        "per-object": {"partitionBytesMax": str(32 * MIB), "openCostBytes": str(32 * MIB)},
        "packed": {},
    }
    out = []
    try:
        for run in runs:
            root = run["root"]
            for planner, opts in planners.items():
                def load():
                    reader = (spark.read.format("dnb1").option("topic", TOPIC)
                              .option("metadata", f"sqlite:///{root}/meta.db")
                              .option("objects", f"file://{root}/objects"))
                    for k, v in opts.items():
                        reader = reader.option(k, v)
                    return reader.load()
                load().selectExpr("count(*)").collect()  # warm-up
                best, result, tasks = float("inf"), None, None
                for _ in range(repeat):
                    df = load()
                    t = time.perf_counter()
                    result = df.selectExpr("count(*)", "sum(length(payload))").collect()[0]
                    best = min(best, time.perf_counter() - t)
                    tasks = df.rdd.getNumPartitions()
                out.append({"archive": run["policy"], "objects": run["objects"], "planner": planner,
                            "tasks": tasks, "rows": result[0], "best_s": round(best, 2)})
                print(f"  spark {run['policy']:9s} {planner:10s} tasks {tasks:5d}  rows {result[0]:,}  "
                      f"{best:6.2f} s", flush=True)
    finally:
        spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,100000")
    parser.add_argument("--seconds", default="1800,60", help="simulated seconds per rate")
    parser.add_argument("--step-s", type=float, default=0.25, help="simulated time between appends")
    parser.add_argument("--spark", action="store_true", help="also time Spark on the 1,000 msg/s archives")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "object_sizing.json"))
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bench-sizing-")
    rows = []
    try:
        for rate, seconds in zip(map(int, args.rates.split(",")), map(float, args.seconds.split(","))):
            for policy in POLICIES:
                root = os.path.join(base, f"{policy}-{rate}")
                rows.append(simulate(root, policy, rate, seconds, args.step_s))
                r = rows[-1]
                print(f"  {policy:9s} {rate:>7,} msg/s  {r['objects']:5d} objects  {r['passes']:5d} passes  "
                      f"{r['objects_per_gib']:8,.0f} /GiB  ({r['wall_s']} s)", flush=True)
        spark = spark_times([r for r in rows if r["rate"] == 1000 and r["policy"] in ("main@2s", "sized")],
                            args.repeat) if args.spark else []
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print()
    print(f"100 B messages, compression none, {args.step_s} s simulated steps")
    print("| policy | msg/s | simulated s | messages | passes | objects | mean object MiB | objects per GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['policy']} | {r['rate']:,} | {r['sim_seconds']:.0f} | {r['messages']:,} | {r['passes']:,} | "
              f"{r['objects']:,} | {r['mean_object_bytes'] / MIB:.2f} | {r['objects_per_gib']:,.0f} |")
    if spark:
        print()
        print("| archive (1,000 msg/s) | objects | planner | tasks | rows | best s |")
        print("|---|---:|---|---:|---:|---:|")
        for s in spark:
            print(f"| {s['archive']} | {s['objects']:,} | {s['planner']} | {s['tasks']:,} | {s['rows']:,} | "
                  f"{s['best_s']:.2f} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"step_s": args.step_s, "sizing": [{k: v for k, v in r.items() if k != "root"} for r in rows],
                   "spark": spark}, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
