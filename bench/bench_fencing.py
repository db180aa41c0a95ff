"""How long a broker that lost a topic can still acknowledge ``durable`` writes.

Two ways a running broker loses a topic (docs/SAFETY.md, "The fencing window"):

* **lease lapse** - the broker is cut off from the metadata store (or paused): its
  keep-alives fail, its session lease expires on the server, and another broker takes
  the topic over at once. Measured: the gap between the owner's last ``durable`` ack
  and the moment the lease expired on the server (positive = the owner stopped in
  time; the design keeps it >= the margin), and acks given after the takeover
  (must be 0).
* **forced takeover** - an operator forces the topic onto another broker while the
  owner runs and its lease is fine. The owner learns from its next refused write
  (progress, upload, cursor). Measured: acks the old owner gave after the takeover
  and the time until its first refusal, for two progress intervals.

One producer thread offers ``durable`` writes closed-loop on the owner. SQLite
metadata + a local object store (the embedded default), in one process. Run:

    .venv/bin/python bench/bench_fencing.py            # ~1 minute
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tiered.lifecycle import BrokerHost  # noqa: E402
from tiered.lifecycle.config import BrokerConfig  # noqa: E402
from tiered.lifecycle import ProduceTimeout  # noqa: E402
from tiered.lifecycle.ownership import OwnershipLostError, is_broker_registered  # noqa: E402
from tiered.metadata.testing.faults import FaultyMetadataStore  # noqa: E402
from tiered.metadata.sqlite import SqliteMetadataStore  # noqa: E402
from tiered.objects.local import LocalObjectStore  # noqa: E402
from uploader.config import UploaderConfig  # noqa: E402

TOPIC = "/bench/fenced"


class Producer(threading.Thread):
    """Produces durable writes until stopped; records (ack time, offset) and refusals."""

    def __init__(self, hosted) -> None:
        super().__init__(daemon=True)
        self.hosted = hosted
        self.acks: list[tuple[float, int]] = []
        self.first_refusal: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                offset = self.hosted.produce(b"x" * 100, timeout_s=0.5)
                self.acks.append((time.monotonic(), offset))
            except (ProduceTimeout, OwnershipLostError):
                if self.first_refusal is None:
                    self.first_refusal = time.monotonic()
                if self.hosted.fenced:
                    return
            except Exception:  # noqa: BLE001 - e.g. the WAL closed at the end
                return


def _stores(root: str):
    os.makedirs(os.path.join(root, "objects"), exist_ok=True)
    return SqliteMetadataStore(os.path.join(root, "meta.db")), LocalObjectStore(os.path.join(root, "objects"))


def lease_lapse(ttl_s: float, margin_s: float | None) -> dict:
    root = tempfile.mkdtemp(prefix="bench-fencing-")
    inner, objects = _stores(root)
    cut_off = FaultyMetadataStore(inner)
    config = BrokerConfig(uploader=UploaderConfig(interval_s=3600.0), session_ttl_s=ttl_s,
                          ack_lease_margin_s=margin_s, progress_interval_s=3600.0)
    a = BrokerHost("A", os.path.join(root, "a"), cut_off, objects, config)
    b = BrokerHost("B", os.path.join(root, "b"), inner, objects, config)
    try:
        producer = Producer(a.load(TOPIC))
        producer.start()
        time.sleep(ttl_s)  # steady state first
        cut_off.faults.fail("refresh_lease")  # from now on A's keep-alives fail
        while is_broker_registered(inner, "A"):
            time.sleep(0.005)
        expired = time.monotonic()  # the server dropped A's lease (within 5 ms)
        b.load(TOPIC)
        taken = time.monotonic()
        time.sleep(1.0)
        producer.stop.set()
        producer.join(5.0)
        last_ack = max((t for t, _ in producer.acks), default=float("nan"))
        return {"scenario": "lease lapse", "ttl_s": ttl_s, "margin_s": config.ack_margin_s,
                "acks_before": len(producer.acks),
                "last_ack_before_expiry_s": expired - last_ack,
                "acks_after_takeover": sum(1 for t, _ in producer.acks if t >= taken)}
    finally:
        a.close()
        b.close()
        inner.close()


def forced_takeover(progress_interval_s: float) -> dict:
    root = tempfile.mkdtemp(prefix="bench-fencing-")
    inner, objects = _stores(root)
    config = BrokerConfig(uploader=UploaderConfig(interval_s=3600.0), session_ttl_s=10.0,
                          progress_interval_s=progress_interval_s)
    a = BrokerHost("A", os.path.join(root, "a"), inner, objects, config)
    b = BrokerHost("B", os.path.join(root, "b"), inner, objects, config)
    try:
        producer = Producer(a.load(TOPIC))
        producer.start()
        time.sleep(1.0)
        forced = time.monotonic()  # just before: acks after it are an upper bound of the window
        b.load(TOPIC, force=True)
        producer.join(30.0)
        producer.stop.set()
        after = [t for t, _ in producer.acks if t >= forced]
        refusal = producer.first_refusal
        return {"scenario": "forced takeover", "progress_interval_s": progress_interval_s,
                "acks_before": len(producer.acks) - len(after), "acks_after_takeover": len(after),
                "window_s": (refusal - forced) if refusal is not None else float("nan")}
    finally:
        a.close()
        b.close()
        inner.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttl-s", type=float, default=2.0)
    args = parser.parse_args()
    rows = [lease_lapse(args.ttl_s, None), lease_lapse(args.ttl_s, 0.1),
            forced_takeover(1.0), forced_takeover(0.1)]
    print(f"{'scenario':<16} {'setting':<24} {'acks before':>11} {'acks after takeover':>19} {'measure':>40}")
    for r in rows:
        if r["scenario"] == "lease lapse":
            setting = f"ttl {r['ttl_s']}s margin {r['margin_s']:.2f}s"
            measure = f"last ack {r['last_ack_before_expiry_s']:.3f}s before lease expiry"
        else:
            setting = f"progress every {r['progress_interval_s']}s"
            measure = f"first refusal {r['window_s']:.3f}s after takeover"
        print(f"{r['scenario']:<16} {setting:<24} {r['acks_before']:>11} {r['acks_after_takeover']:>19} {measure:>40}")


if __name__ == "__main__":
    main()
