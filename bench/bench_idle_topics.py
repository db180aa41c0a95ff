"""What an idle hosted topic costs: threads, memory, file descriptors, load time.

One ``BrokerHost`` (SQLite metadata + local-directory objects, default config, no
session lease) loads T empty topics and keeps them idle; each T runs in a fresh
process so the numbers are not polluted by the previous one. Printed per T: threads
in total and besides the WAL's writer threads, RSS in total and per topic, open file
descriptors per topic, load time in total and per topic.

Never a pass/fail test. Run (about 1 minute for 1,000 + 10,000 on two cores):

    .venv/bin/python bench/bench_idle_topics.py [--topics 1000,10000] [--dir DIR] [--json]
"""
from __future__ import annotations

import argparse
import resource
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def measure(topics: int, directory: str) -> dict[str, float]:
    """Host ``topics`` idle topics in this process; returns the measurements."""
    from prometheus_client import CollectorRegistry

    from tiered.lifecycle import BrokerHost
    from tiered.lifecycle.config import BrokerConfig
    from tiered.metadata import open_metadata
    from tiered.objects import open_objects

    # Each hosted topic keeps one descriptor open (its active segment; in the journaled
    # commit group no lock file per topic), so a host of N topics needs a file limit above
    # N (Kafka's docs advise 100,000 or more).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = topics + 256
    if soft < needed <= hard or (soft < needed and hard == resource.RLIM_INFINITY):
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    elif soft < needed:
        raise SystemExit(f"{topics} topics need about {needed} open files; this machine allows {hard} "
                         f"(raise `ulimit -n` or measure fewer topics)")
    os.makedirs(os.path.join(directory, "objects"), exist_ok=True)
    metadata = open_metadata(f"sqlite:///{directory}/metadata.db")
    objects = open_objects(f"file://{directory}/objects")
    host = BrokerHost("bench", os.path.join(directory, "wal"), metadata, objects,
                      BrokerConfig(register_session=False), metrics_registry=CollectorRegistry(),
                      metrics_per_topic=False)
    gc.collect()
    rss0, fds0 = _rss_bytes(), _fds()
    started = time.monotonic()
    for i in range(topics):
        host.load(f"/bench/t{i:06d}")
    load_s = time.monotonic() - started
    gc.collect()
    rss1, fds1 = _rss_bytes(), _fds()
    threads = threading.enumerate()
    writers = sum(1 for t in threads if t.name.startswith("wal-writer"))
    result = {
        "topics": topics, "threads": len(threads), "threads_besides_wal_writers": len(threads) - writers,
        "rss_mib": rss1 / 2**20, "rss_per_topic_kib": (rss1 - rss0) / topics / 1024,
        "fds_per_topic": (fds1 - fds0) / topics, "load_s": load_s, "load_per_topic_ms": 1000 * load_s / topics,
    }
    host.close(unload=False)
    metadata.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", default="1000,10000", help="comma-separated topic counts")
    parser.add_argument("--dir", default=None, help="where WALs and stores go (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one count
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.dir)))
        return
    rows = []
    for count in (int(t) for t in args.topics.split(",")):
        directory = tempfile.mkdtemp(prefix="dnb-idle-", dir=args.dir)
        try:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", str(count), "--dir", directory],
                                 check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'topics':>7} {'threads':>8} {'non-WAL':>8} {'RSS MiB':>8} {'KiB/topic':>10} {'fds/topic':>10} "
          f"{'load s':>7} {'ms/topic':>9}")
    for r in rows:
        print(f"{r['topics']:>7,} {r['threads']:>8} {r['threads_besides_wal_writers']:>8} {r['rss_mib']:>8.1f} "
              f"{r['rss_per_topic_kib']:>10.1f} {r['fds_per_topic']:>10.2f} {r['load_s']:>7.1f} "
              f"{r['load_per_topic_ms']:>9.2f}")


if __name__ == "__main__":
    main()
