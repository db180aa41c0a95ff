"""Uploader benchmark (not a test). One command, ~1-2 minutes on 2 cores:

    cd /work/main && .venv/bin/python bench/bench_uploader.py [--mib 8] [--no-moto]

Measures, for 100 B and 4 KiB messages and zstd off / level 1 / level 3:
archive throughput (MB/s of frames and msg/s) through the whole uploader path — read
frames, validate, build the dnb1 object, put(if_absent), commit the fenced descriptor —
to a local directory and to moto over HTTP (descriptors in SQLite in both cases, so the
object store is the variable), plus the compression ratio; and the latency of reading
the footer plus one block for a random offset of a 64 MiB object. Prints a table and
writes bench/results/uploader.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import native  # noqa: E402
from native import object_format  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from tiered.metadata import keys  # noqa: E402
from tiered.metadata.base import value_is  # noqa: E402
from tiered.metadata.sqlite import SqliteMetadataStore  # noqa: E402
from tiered.objects import RangeByteRequest  # noqa: E402
from tiered.objects.local import LocalObjectStore  # noqa: E402
from uploader import Uploader, UploaderConfig, UploaderMetrics  # noqa: E402

MIB = 1 << 20
TOPIC = "/bench/t"
WORDS = [b"alpha", b"beta", b"gamma", b"delta", b"order", b"price", b"user", b"qty", b"ok", b"eu-west"]


def make_payload(rng: random.Random, size: int) -> bytes:
    """Text-like payloads (JSON-ish words and numbers), so compression ratios mean something."""
    out = bytearray()
    while len(out) < size:
        out += b'{"%s":%d,"%s":"%s"}' % (rng.choice(WORDS), rng.randrange(10**6), rng.choice(WORDS), rng.choice(WORDS))
    return bytes(out[:size])


class FrameSource:
    """Pre-encoded durable frames behind the WAL's read_frames surface (no disk in the loop)."""

    def __init__(self, msg_bytes: int, total_bytes: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        count = max(1, total_bytes // (msg_bytes + 26))
        msgs = [(1_700_000_000_000 + i, None, None, make_payload(rng, msg_bytes)) for i in range(count)]
        self.data = native.encode_batch(0, msgs)
        scan = native.scan_frames(self.data, 0, None, 0, False, True, None)
        self.positions = list(scan.positions) + [len(self.data)]
        self.first_offset, self.next_offset = 0, count
        self.durable_offset = count - 1

    def read_frames(self, from_offset: int, max_bytes: int):
        start = self.positions[from_offset]
        end_index = from_offset + 1
        while end_index < self.next_offset and self.positions[end_index + 1] - start <= max_bytes:
            end_index += 1
        return self.data[start:self.positions[end_index]], from_offset, end_index - 1

    def segments(self):
        return []

    def wait_durable(self, offset, timeout_s):
        return True


def stores(target: str, tmp: str, moto_url: str | None, tag: str):
    metadata = SqliteMetadataStore(os.path.join(tmp, f"meta-{tag}.db"))
    if target == "local":
        return metadata, LocalObjectStore(os.path.join(tmp, f"obj-{tag}"))
    import boto3

    from tiered.objects import open_objects

    bucket = f"b-{tag}".lower().replace("_", "-")
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    return metadata, open_objects(f"s3://{bucket}/archive?endpoint={moto_url}")


def archive_run(target: str, msg_bytes: int, level: int, total_bytes: int, tmp: str, moto_url: str | None) -> dict:
    source = FrameSource(msg_bytes, total_bytes)
    tag = f"{target}-{msg_bytes}-{level}"
    metadata, objects = stores(target, tmp, moto_url, tag)
    owner = keys.Ownership("1", 1, time.time())
    metadata.put(keys.owner_key(TOPIC), owner.to_json())
    config = UploaderConfig(object_bytes_max=4 * MIB, compression="zstd" if level else "none",
                            zstd_level=level or 3)
    up = Uploader(TOPIC, source, metadata, objects, broker_id=1,
                  fencing=[value_is(keys.owner_key(TOPIC), owner.to_json())], config=config,
                  committed_through=None, metrics=UploaderMetrics(CollectorRegistry()))
    started = time.perf_counter()
    assert up.upload_once() == source.durable_offset
    elapsed = time.perf_counter() - started
    stored = sum(o.size for o in objects.list(""))
    metadata.close()
    objects.close()
    return {"target": target, "msg_bytes": msg_bytes, "zstd_level": level, "messages": source.next_offset,
            "frame_mb": len(source.data) / 1e6, "seconds": elapsed,
            "mb_per_s": len(source.data) / 1e6 / elapsed, "msg_per_s": source.next_offset / elapsed,
            "compression_ratio": len(source.data) / stored}


def read_latency(target: str, tmp: str, moto_url: str | None, samples: int) -> dict:
    """Footer (one suffix GET, rarely two) + one block range GET + decode, random offset."""
    source = FrameSource(4096, 64 * MIB, seed=7)
    data = object_format.write_object(source.data, topic=TOPIC, block_bytes=MIB, zstd_level=1)
    _, objects = stores(target, tmp, moto_url, f"read-{target}")
    key = "bench/t/data-big.dnb1"
    objects.put(key, data)
    size = len(data)
    rng = random.Random(3)
    latencies_ms = []
    for _ in range(samples):
        offset = rng.randrange(source.next_offset)
        started = time.perf_counter()
        footer = object_format.read_footer(lambda s, e: objects.get_range(key, RangeByteRequest(s, e)), size, key)
        (block,) = object_format.select_blocks(footer, offset, offset)
        raw = objects.get_range(key, RangeByteRequest(block.position, block.end))
        records = object_format.decode_block(raw, block, key, first_offset=offset, last_offset=offset)
        latencies_ms.append((time.perf_counter() - started) * 1000)
        assert records[0].offset == offset
    objects.close()
    latencies_ms.sort()
    return {"target": target, "object_mb": size / 1e6, "samples": samples,
            "p50_ms": statistics.median(latencies_ms),
            "p99_ms": latencies_ms[min(len(latencies_ms) - 1, int(len(latencies_ms) * 0.99))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, default=8.0, help="frame MiB archived per configuration")
    parser.add_argument("--read-samples", type=int, default=50)
    parser.add_argument("--no-moto", action="store_true")
    args = parser.parse_args()
    targets = ["local"] if args.no_moto else ["local", "moto"]
    moto = None
    moto_url = None
    if "moto" in targets:
        from tests.fixtures.servers import MotoServer, set_fake_aws_credentials

        set_fake_aws_credentials()
        moto = MotoServer().start()
        moto_url = moto.endpoint_url
    results = {"codec": native.IMPLEMENTATION, "python": platform.python_version(),
               "cpus": os.cpu_count(), "archive": [], "read": []}
    try:
        with tempfile.TemporaryDirectory(prefix="dnb-bench-up-") as tmp:
            for target in targets:
                for msg_bytes in (100, 4096):
                    for level in (0, 1, 3):
                        row = archive_run(target, msg_bytes, level, int(args.mib * MIB), tmp, moto_url)
                        results["archive"].append(row)
                        print(f"{target:6} {msg_bytes:5} B  zstd {level or 'off':>3}  "
                              f"{row['mb_per_s']:7.1f} MB/s {row['msg_per_s']:10.0f} msg/s  "
                              f"ratio {row['compression_ratio']:5.2f}", flush=True)
                results["read"].append(read_latency(target, tmp, moto_url, args.read_samples))
                r = results["read"][-1]
                print(f"{target:6} footer+1 block read, {r['object_mb']:.0f} MB object: "
                      f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms", flush=True)
    finally:
        if moto is not None:
            moto.stop()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "uploader.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
