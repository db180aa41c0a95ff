"""Open-loop append -> durable latency with many topics in one process.

The OpenMessaging-Benchmark way: one producer thread offers 100 B messages at a FIXED
rate, round-robin over T topics (``WriteAheadLog.append``, default ``WalConfig``), whether
or not earlier ones are durable yet; latency is append -> the durable listener passing
that offset, so queueing delay counts (a closed loop would hide it by slowing down).
Peers in the same run, on the same disk:

* ``fdatasync`` - one 4 KiB write + fdatasync in a loop: the device's floor per sync.
* ``wal``: per-topic WALs without a group (one writer thread and one fdatasync stream
  per topic; ``wal.commit_group = false``).
* ``group``: every topic in one ``wal.group.CommitGroup`` (one writer thread; each round
  writes every topic's segment, then ONE ``syncfs`` of the file system).
* ``journal``: the shared-journal I/O pattern, through the same group code: every
  segment write is also appended to one journal file (zero-filled in advance and reused
  circularly, as BookKeeper preallocates its journal, so a round's fdatasync has no size
  change to commit) and a round is made durable by ONE fdatasync of the journal; segments
  are never synced (the design syncs them lazily at checkpoints, which this leaves out).
  It measures the journal's I/O, not a complete journal: there is no replay.

Never a pass/fail test. Run (a few minutes):

    .venv/bin/python bench/bench_latency.py [--seconds 5] [--dir DIR] [--cases 1:1000,100:20000]
        [--modes wal,group,journal] [--repeat N]
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
from wal.fs import AppendFile, RealFs, _writev_all  # noqa: E402
from wal.group import CommitGroup  # noqa: E402

MODES = ("wal", "group", "journal")
_JOURNAL_BYTES = 256 * 1024 * 1024

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


class _Journal:
    """One preallocated journal file written circularly with pwritev; sync = fdatasync."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        block = b"\0" * (1 << 20)
        for _ in range(_JOURNAL_BYTES >> 20):
            os.write(self.fd, block)
        os.fsync(self.fd)
        self.position = 0
        self.lock = threading.Lock()

    def append(self, chunks: list[bytes]) -> None:
        size = sum(map(len, chunks))
        with self.lock:
            if self.position + size > _JOURNAL_BYTES:
                self.position = 0
            written = os.pwritev(self.fd, chunks, self.position)
            assert written == size
            self.position += size

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:  # called by the group (its sync handle) and by the run
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _TeeFile:
    def __init__(self, inner: AppendFile, journal: _Journal) -> None:
        self._inner, self._journal = inner, journal

    def write(self, chunks) -> None:
        self._inner.write(chunks)
        self._journal.append(list(chunks))

    def sync(self) -> None:
        self._inner.sync()

    def close(self) -> None:
        self._inner.close()


class JournalFs(RealFs):
    """RealFs whose segment writes also go to one journal, and whose 'syncfs' is one
    fdatasync of that journal (the shared journal's I/O pattern)."""

    def __init__(self, journal: _Journal) -> None:
        self.journal = journal

    def open_append(self, path: str) -> AppendFile:
        inner = super().open_append(path)
        return _TeeFile(inner, self.journal) if path.endswith(".seg") else inner

    def open_syncfs(self, path: str):
        return self.journal


def run_wal(directory: str, topics: int, rate: int, seconds: float, mode: str = "wal") -> dict:
    root = tempfile.mkdtemp(dir=directory)
    journal = _Journal(os.path.join(directory, "journal.bin")) if mode == "journal" else None
    group = None
    if mode == "group":
        group = CommitGroup(root, RealFs())
    elif journal is not None:
        group = CommitGroup(root, JournalFs(journal))
    wals = [WriteAheadLog.open(root, f"/bench/t{i}", group=group) for i in range(topics)]
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
        threads = threading.active_count()
        rounds = group.rounds if group is not None else None
        for wal in wals:
            wal.flush(60.0)
    finally:
        for wal in wals:
            wal.close()
        if group is not None:
            group.close()
        if journal is not None:
            journal.close()
            os.remove(os.path.join(directory, "journal.bin"))
        shutil.rmtree(root, ignore_errors=True)
    return {"mode": mode, "topics": topics, "offered": rate, "achieved": durable_in_window / elapsed,
            "p50_ms": _pct(probe.samples, 0.50) * 1e3, "p99_ms": _pct(probe.samples, 0.99) * 1e3,
            "threads": threads, "syncs_per_s": (rounds / elapsed) if rounds is not None else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--cases", default=None,
                        help="comma-separated TOPICS:RATE pairs, e.g. 1:1000,100:20000 (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="run each case this many times")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args()
    cases = CASES if args.cases is None else tuple(
        (int(t), int(r)) for t, r in (pair.split(":") for pair in args.cases.split(",")))
    directory = args.dir or tempfile.mkdtemp(prefix="bench-latency-")
    floor = fdatasync_floor(directory)
    print(f"fdatasync 4 KiB: p50 {_pct(floor, 0.5) * 1e3:.2f} ms, p99 {_pct(floor, 0.99) * 1e3:.2f} ms "
          f"({os.cpu_count()} cores)")
    modes = [m for m in args.modes.split(",") if m]
    print(f"{'peer':<8} {'topics':>6} {'offered msg/s':>13} {'achieved msg/s':>14} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'threads':>7} {'syncs/s':>8}", flush=True)
    for topics, rate in (case for case in cases for _ in range(args.repeat)):
        for mode in modes:
            r = run_wal(directory, topics, rate, args.seconds, mode)
            print(f"{mode:<8} {r['topics']:>6,} {r['offered']:>13,} {r['achieved']:>14,.0f} "
                  f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['threads']:>7} {r['syncs_per_s']:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
