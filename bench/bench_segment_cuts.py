"""How long the commit rounds get when topics fed alike fill their segments together.

A segment cut runs on the commit round's thread and costs three syncs (the new file, its
directory, the WAL's checkpoint). Topics fed alike (the partitions of one stream written
round-robin) fill their segments at the same pace, so without spreading they are all cut in
the same round, which then takes topics x one cut. ``wal.writer.SIZE_JITTER`` cuts each
segment up to a tenth early by an amount that differs per segment, as ``AGE_JITTER`` does
for age.

One journaled commit group on the disk under test, T topics; each pass appends one message
to every topic and waits until all are durable. Prints the pass times with the jitter off
(0.0) and on (the default), in the same run. Not a test and never pass/fail:

    .venv/bin/python bench/bench_segment_cuts.py [--topics 200] [--segment-bytes 131072]
        [--passes 400] [--message-bytes 1000] [--dir DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prometheus_client import CollectorRegistry  # noqa: E402

from wal import WalConfig, WriteAheadLog  # noqa: E402
from wal import writer  # noqa: E402
from wal.fs import RealFs  # noqa: E402
from wal.group import CommitGroup  # noqa: E402
from wal.journal import JournalConfig  # noqa: E402


def run(topics: int, segment_bytes: int, passes: int, message_bytes: int, directory: str) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="segment-cuts-", dir=directory)
    registry = CollectorRegistry()
    group = CommitGroup(os.path.join(root, "wal"), RealFs(), journal=JournalConfig(), metrics_registry=registry)
    config = WalConfig(segment_bytes_max=segment_bytes)
    durable = threading.Semaphore(0)
    wals: list[WriteAheadLog] = []
    try:
        for i in range(topics):
            wal = WriteAheadLog.open(os.path.join(root, "wal"), f"/bench/t{i}", config=config, group=group,
                                     metrics_registry=registry)
            wal.add_durable_listener(lambda _offset: durable.release())
            wals.append(wal)
        payload = b"x" * message_bytes
        times = []
        for _ in range(passes):
            started = time.perf_counter()
            for wal in wals:
                wal.append(payload)
            for _ in range(topics):
                durable.acquire()
            times.append(time.perf_counter() - started)
        segments = sum(len(wal.segments()) for wal in wals)
    finally:
        for wal in wals:
            wal.close()
        group.close()
        shutil.rmtree(root, ignore_errors=True)
    times.sort()
    return {"segments": segments, "p50_ms": times[len(times) // 2] * 1e3,
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3, "max_ms": times[-1] * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--segment-bytes", type=int, default=128 * 1024)
    parser.add_argument("--passes", type=int, default=400)
    parser.add_argument("--message-bytes", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    directory = args.dir or tempfile.gettempdir()
    default = writer.SIZE_JITTER
    print(f"{args.topics} topics fed alike, {args.segment_bytes:,} B segments, {args.passes} passes of one "
          f"{args.message_bytes:,} B message per topic")
    print(f"{'SIZE_JITTER':>11} {'segments':>9} {'pass p50 ms':>12} {'p99 ms':>8} {'max ms':>8}")
    for jitter in (0.0, default):
        writer.SIZE_JITTER = jitter
        try:
            r = run(args.topics, args.segment_bytes, args.passes, args.message_bytes, directory)
        finally:
            writer.SIZE_JITTER = default
        print(f"{jitter:>11.2f} {r['segments']:>9,} {r['p50_ms']:>12.1f} {r['p99_ms']:>8.1f} {r['max_ms']:>8.1f}")


if __name__ == "__main__":
    main()
