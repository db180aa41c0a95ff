"""Open-loop append -> durable latency with many topics in one process.

The OpenMessaging-Benchmark way: one producer thread offers 100 B messages at a FIXED
rate, round-robin over T topics (``WriteAheadLog.append``, default ``WalConfig``), whether
or not earlier ones are durable yet; latency is append -> the durable listener passing
that offset, so queueing delay counts (a closed loop would hide it by slowing down).
Peers in the same run, on the same disk:

* ``fdatasync`` - one 4 KiB write + fdatasync in a loop: the device's floor per sync.
* ``wal`` at 1, 100 and 1,000 topics: the per-topic WAL (one writer thread and one
  fsync stream per topic) as it is today.

Never a pass/fail test. Run (about 1 minute):

    .venv/bin/python bench/bench_latency.py [--seconds 5] [--dir DIR] [--cases 1:1000,100:20000] [--repeat N]
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

from wal import WriteAheadLog  # noqa: E402

CASES = ((1, 1_000), (1, 100_000), (100, 20_000), (100, 100_000), (1_000, 20_000))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def fdatasync_floor(directory: str, count: int = 300) -> list[float]:
    path = os.path.join(directory, "floor.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = b"\0" * 4096
    samples = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.remove(path)
    return samples


class Probe:
    """Durable latency per message: appended-at times per topic, resolved by the listener."""

    def __init__(self, topics: int) -> None:
        self.pending: list[dict[int, float]] = [{} for _ in range(topics)]
        self.locks = [threading.Lock() for _ in range(topics)]
        self.samples: list[float] = []
        self.done = 0
        self._lock = threading.Lock()

    def listener(self, index: int):
        def on_durable(durable: int) -> None:
            now = time.perf_counter()
            with self.locks[index]:
                pending = self.pending[index]
                ready = [o for o in pending if o <= durable]
                got = [now - pending.pop(o) for o in ready]
            with self._lock:
                self.samples.extend(got)
                self.done += len(got)
        return on_durable


def run_wal(directory: str, topics: int, rate: int, seconds: float) -> dict:
    root = tempfile.mkdtemp(dir=directory)
    wals = [WriteAheadLog.open(root, f"/bench/t{i}") for i in range(topics)]
    probe = Probe(topics)
    for i, wal in enumerate(wals):
        wal.add_durable_listener(probe.listener(i))
    payload = b"x" * 100
    offered = 0
    started = time.perf_counter()
    try:
        while (now := time.perf_counter()) - started < seconds:
            due = int((now - started) * rate)
            while offered < due:
                index = offered % topics
                with probe.locks[index]:
                    offset = wals[index].append(payload)
                    probe.pending[index][offset] = time.perf_counter()
                offered += 1
            time.sleep(0.0002)
        elapsed = time.perf_counter() - started
        durable_in_window = probe.done  # what the disk kept up with while offered
        for wal in wals:
            wal.flush(60.0)
    finally:
        for wal in wals:
            wal.close()
        shutil.rmtree(root, ignore_errors=True)
    return {"topics": topics, "offered": rate, "achieved": durable_in_window / elapsed,
            "p50_ms": _pct(probe.samples, 0.50) * 1e3, "p99_ms": _pct(probe.samples, 0.99) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--cases", default=None,
                        help="comma-separated TOPICS:RATE pairs, e.g. 1:1000,100:20000 (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="run each case this many times")
    args = parser.parse_args()
    cases = CASES if args.cases is None else tuple(
        (int(t), int(r)) for t, r in (pair.split(":") for pair in args.cases.split(",")))
    directory = args.dir or tempfile.mkdtemp(prefix="bench-latency-")
    floor = fdatasync_floor(directory)
    print(f"fdatasync 4 KiB: p50 {_pct(floor, 0.5) * 1e3:.2f} ms, p99 {_pct(floor, 0.99) * 1e3:.2f} ms "
          f"({os.cpu_count()} cores)")
    print(f"{'peer':<6} {'topics':>6} {'offered msg/s':>13} {'achieved msg/s':>14} {'p50 ms':>8} {'p99 ms':>8}")
    for topics, rate in (case for case in cases for _ in range(args.repeat)):
        r = run_wal(directory, topics, rate, args.seconds)
        print(f"{'wal':<6} {r['topics']:>6,} {r['offered']:>13,} {r['achieved']:>14,.0f} "
              f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}")


if __name__ == "__main__":
    main()
