"""How big archive objects are while producers run: objects per GiB archived.

A producer offers 100-byte ``durable`` messages at a fixed rate (open loop) to one hosted
topic for ``--seconds``; the uploader runs on its interval. Two pass strategies run on
the same workload in the same process:

* ``bounded`` (the uploader today): a pass archives up to the durable tip seen when it
  started; what arrives meanwhile waits for the next trigger.
* ``chasing`` (the previous behaviour, as a peer): a pass keeps cutting objects while the
  tip moves, up to OBJECTS_PER_PASS_MAX per pass.

Embedded stores (SQLite + local directory). Never a pass/fail test. Run:

    .venv/bin/python bench/bench_object_sizing.py            # ~1 minute
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import uploader.uploader as uploader_module  # noqa: E402
from tiered.lifecycle import BrokerHost  # noqa: E402
from tiered.lifecycle.config import BrokerConfig  # noqa: E402
from tiered.metadata.sqlite import SqliteMetadataStore  # noqa: E402
from tiered.objects.local import LocalObjectStore  # noqa: E402
from uploader import list_descriptors  # noqa: E402
from uploader.config import UploaderConfig  # noqa: E402

GIB = 1 << 30
TOPIC = "/bench/sizing"


def _chasing_pass(self, retention: bool) -> None:
    """The previous pass: no bound, chases the moving tip."""
    try:
        for _ in range(uploader_module.OBJECTS_PER_PASS_MAX):
            if not self._upload_next(1 << 62):
                break
    finally:
        self._update_lag()
    if retention:
        self._retain()


def run(strategy: str, rate: int, seconds: float, interval_s: float) -> dict:
    root = tempfile.mkdtemp(prefix="bench-sizing-")
    os.makedirs(os.path.join(root, "objects"))
    metadata = SqliteMetadataStore(os.path.join(root, "meta.db"))
    objects = LocalObjectStore(os.path.join(root, "objects"))
    original = uploader_module.Uploader._pass
    if strategy == "chasing":
        uploader_module.Uploader._pass = _chasing_pass
    config = BrokerConfig(uploader=UploaderConfig(interval_s=interval_s, compression="none"), progress_interval_s=5.0)
    host = BrokerHost("A", os.path.join(root, "wal"), metadata, objects, config)
    try:
        hosted = host.load(TOPIC)
        payload = b"x" * 100
        started = time.monotonic()
        sent = 0
        while (now := time.monotonic()) - started < seconds:
            due = int((now - started) * rate)
            if due > sent:
                hosted.wal.append_batch([payload] * (due - sent))
                sent = due
            else:
                time.sleep(0.001)
        hosted.wal.flush(30.0)
        hosted.uploader.upload_once()
        descriptors = list_descriptors(metadata, TOPIC)
        archived_bytes = sum(d.size for d in descriptors)
        return {"strategy": strategy, "rate": rate, "messages": sent, "objects": len(descriptors),
                "mean_object_bytes": archived_bytes / max(1, len(descriptors)),
                "objects_per_gib": len(descriptors) * GIB / max(1, archived_bytes)}
    finally:
        host.close()
        metadata.close()
        uploader_module.Uploader._pass = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval-s", type=float, default=2.0)
    parser.add_argument("--rates", default="1000,100000")
    args = parser.parse_args()
    rows = [run(strategy, int(rate), args.seconds, args.interval_s)
            for rate in args.rates.split(",") for strategy in ("bounded", "chasing")]
    print(f"uploader interval {args.interval_s}s, {args.seconds}s of 100 B messages per run")
    print(f"{'strategy':<9} {'offered msg/s':>13} {'messages':>9} {'objects':>8} {'mean object KiB':>16} "
          f"{'objects per GiB':>16}")
    for r in rows:
        print(f"{r['strategy']:<9} {r['rate']:>13,} {r['messages']:>9,} {r['objects']:>8} "
              f"{r['mean_object_bytes'] / 1024:>16.1f} {r['objects_per_gib']:>16,.0f}")


if __name__ == "__main__":
    main()
