"""WAL durability benchmark: one command, a table, and bench/results/wal.json.

    cd /work/main && PYTHONPATH=. .venv/bin/python bench/bench_wal.py [--quick] [--dir DIR]

Measured in the same run, on the same disk: the WAL (batch and single appends, 100 B and
64 KiB payloads, with records/fsync and append->durable latency), peers given the same
number of messages per sync as the WAL achieved (bench/peers.py: rocksdict WriteBatch +
flush_wal(sync), SQLite WAL+synchronous=FULL one txn per batch, LMDB sync commit per batch;
and a naive pure-Python framed log with one write+fdatasync per batch), fio sequential 1 MiB writes with
fdatasync per block as the device limit, and the codec twins.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import native  # noqa: E402
from bench.peers import PEERS as STORE_PEERS, fio_write_sync, open_peer  # noqa: E402
from wal import WalConfig, WriteAheadLog  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "wal.json")
SMALL_B = 100
LARGE_B = 64 * 1024


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _LatencyProbe:
    """Append->durable latency for sampled offsets, measured by a durable listener."""

    def __init__(self, wal: WriteAheadLog) -> None:
        self._pending: deque = deque()
        self._lock = threading.Lock()
        self.samples_s: list[float] = []
        wal.add_durable_listener(self._on_durable)

    def mark(self, offset: int) -> None:
        with self._lock:
            self._pending.append((offset, time.perf_counter()))

    def _on_durable(self, durable: int) -> None:
        now = time.perf_counter()
        with self._lock:
            while self._pending and self._pending[0][0] <= durable:
                self.samples_s.append(now - self._pending.popleft()[1])


def bench_wal(root: str, payload_bytes: int, count: int, batch: int | None) -> dict:
    """Durable append throughput; batch=None means one append() call per message."""
    directory = tempfile.mkdtemp(dir=root)
    config = WalConfig(segment_bytes_max=256 * 1024 * 1024, fsync_batch_bytes=8 * 1024 * 1024,
                       pending_bytes_max=256 * 1024 * 1024)
    wal = WriteAheadLog.open(directory, "/bench/t", config)
    probe = _LatencyProbe(wal)
    payload = os.urandom(payload_bytes)
    started = time.perf_counter()
    if batch is None:
        sample_every = 256
        append = wal.append
        for i in range(count):
            offset = append(payload)
            if i % sample_every == 0:
                probe.mark(offset)
    else:
        messages = [payload] * batch
        for _ in range(count // batch):
            first = wal.append_batch(messages)
            probe.mark(first + batch - 1)
    wal.flush(120)
    elapsed = time.perf_counter() - started
    registry = wal.metrics.registry
    fsyncs = registry.get_sample_value("dnb_wal_fsyncs_total", {"topic": "/bench/t"})
    written = registry.get_sample_value("dnb_wal_append_bytes_total", {"topic": "/bench/t"})
    wal.close()
    shutil.rmtree(directory)
    total = (count // batch) * batch if batch else count
    return {"msgs": total, "seconds": elapsed, "msg_per_s": total / elapsed,
            "mb_per_s": total * payload_bytes / elapsed / 1e6, "disk_mb_per_s": written / elapsed / 1e6,
            "records_per_fsync": total / fsyncs, "fsyncs": fsyncs,
            "p50_ms": _pct(probe.samples_s, 0.5) * 1e3, "p99_ms": _pct(probe.samples_s, 0.99) * 1e3}


def _peer_result(count: int, payload_bytes: int, elapsed: float, per_sync: int) -> dict:
    return {"msgs": count, "seconds": elapsed, "msg_per_s": count / elapsed,
            "mb_per_s": count * payload_bytes / elapsed / 1e6, "records_per_fsync": per_sync}


def bench_peer(name: str, root: str, payload_bytes: int, count: int, per_sync: int) -> dict:
    """Peer ``name`` (bench/peers.py), one batch of ``per_sync`` messages per sync, closed loop."""
    path = tempfile.mkdtemp(dir=root)
    peer = open_peer(name, path, map_bytes=count * (payload_bytes + 64) * 3, ascending_keys=True)
    payload = os.urandom(payload_bytes)
    started = time.perf_counter()
    for start in range(0, count, per_sync):
        peer.write_batch([(0, i, payload) for i in range(start, min(count, start + per_sync))])
    elapsed = time.perf_counter() - started
    peer.close()
    shutil.rmtree(path)
    return _peer_result(count, payload_bytes, elapsed, per_sync)


def bench_naive_log(root: str, payload_bytes: int, count: int, per_sync: int) -> dict:
    """struct header + crc32c per frame, one write + fdatasync per batch, all in Python."""
    import crc32c
    header = struct.Struct("<IIQ")
    path = os.path.join(tempfile.mkdtemp(dir=root), "naive.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    payload = os.urandom(payload_bytes)
    started = time.perf_counter()
    for start in range(0, count, per_sync):
        parts = []
        for i in range(start, min(count, start + per_sync)):
            body = struct.pack("<IQ", len(payload), i) + payload
            parts.append(header.pack(crc32c.crc32c(body), len(payload), i) + payload)
        os.write(fd, b"".join(parts))
        os.fdatasync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    shutil.rmtree(os.path.dirname(path))
    return _peer_result(count, payload_bytes, elapsed, per_sync)


def bench_fio(root: str, size_mb: int, blocks_per_sync: int = 1) -> dict:
    """fio sequential 1 MiB writes with an fdatasync every ``blocks_per_sync`` blocks.

    1 block per sync is the issue's yardstick; it is bound by one sync's latency per MiB, so
    a WAL syncing megabytes at a time can beat it. A sync every 64 MiB shows the device's
    streaming limit, the honest ceiling for a group-committing writer."""
    return fio_write_sync(root, "1M", size_mb, blocks_per_sync)


def bench_codec(count: int) -> dict:
    messages = [(1, None, None, os.urandom(SMALL_B))] * count
    out = {}
    for twin in native.available_codecs():
        started = time.perf_counter()
        data = twin.encode_batch(0, messages)
        encode_s = time.perf_counter() - started
        started = time.perf_counter()
        result = twin.scan_frames(data, expected_offset=0, decode=True)
        decode_s = time.perf_counter() - started
        assert result.count == count and result.error is None
        out[twin.IMPLEMENTATION] = {"encode_us_per_record": encode_s / count * 1e6,
                                    "decode_us_per_record": decode_s / count * 1e6}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.environ.get("DNB_BENCH_DIR", "/tmp"), help="where files go (same disk for all)")
    parser.add_argument("--quick", action="store_true", help="smaller counts (~30 s)")
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    root = tempfile.mkdtemp(prefix="dnb-bench-wal-", dir=args.dir)
    small_n, large_n, peer_n = int(1_000_000 * scale), int(4000 * scale), int(400_000 * scale)
    try:
        results = run(root, small_n, large_n, peer_n, scale)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results["codec_implementation"] = native.IMPLEMENTATION
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=2)
    print_table(results)
    print(f"\nwrote {RESULTS}")


def run(root: str, small_n: int, large_n: int, peer_n: int, scale: float) -> dict:
    results: dict = {"fio_1MiB_fdatasync": bench_fio(root, max(64, int(512 * scale))),
                     "fio_1MiB_fdatasync_every_64MiB": bench_fio(root, max(128, int(1024 * scale)), 64)}
    wal = results["wal"] = {
        "batch_100B": bench_wal(root, SMALL_B, small_n, 1000),
        "single_100B": bench_wal(root, SMALL_B, small_n, None),
        "batch_64KiB": bench_wal(root, LARGE_B, large_n, 16),
        "single_64KiB": bench_wal(root, LARGE_B, large_n, None),
    }
    per_sync = max(1, round(wal["batch_100B"]["records_per_fsync"]))
    per_sync_large = max(1, round(wal["batch_64KiB"]["records_per_fsync"]))
    results["peers_100B"] = {name: fn(root, SMALL_B, peer_n, per_sync) for name, fn in PEERS.items()}
    results["peers_64KiB"] = {name: fn(root, LARGE_B, large_n, per_sync_large) for name, fn in PEERS.items()}
    results["codec_100B"] = bench_codec(int(200_000 * scale))
    results["targets"] = _targets(results)
    return results


PEERS = {**{name: functools.partial(bench_peer, name) for name in STORE_PEERS}, "naive_log": bench_naive_log}


def _targets(r: dict) -> dict:
    fio = r["fio_1MiB_fdatasync"]["mb_per_s"]
    streaming = r["fio_1MiB_fdatasync_every_64MiB"]["mb_per_s"]
    wal = r["wal"]
    best_peer = max(p["msg_per_s"] for p in r["peers_100B"].values())
    codec = r["codec_100B"]
    out = {
        "batch_100B_vs_best_peer_x": wal["batch_100B"]["msg_per_s"] / best_peer,
        "batch_100B_disk_vs_fio_pct": 100 * wal["batch_100B"]["disk_mb_per_s"] / fio,
        "single_100B_msg_per_s": wal["single_100B"]["msg_per_s"],
        "batch_64KiB_vs_fio_pct": 100 * wal["batch_64KiB"]["disk_mb_per_s"] / fio,
        "single_64KiB_vs_fio_pct": 100 * wal["single_64KiB"]["disk_mb_per_s"] / fio,
        "batch_64KiB_vs_fio_streaming_pct": 100 * wal["batch_64KiB"]["disk_mb_per_s"] / streaming,
        "batch_100B_disk_vs_fio_streaming_pct": 100 * wal["batch_100B"]["disk_mb_per_s"] / streaming,
    }
    if "cython" in codec and "python" in codec:
        out["codec_encode_speedup_x"] = codec["python"]["encode_us_per_record"] / codec["cython"]["encode_us_per_record"]
        out["codec_decode_speedup_x"] = codec["python"]["decode_us_per_record"] / codec["cython"]["decode_us_per_record"]
    return out


def print_table(r: dict) -> None:
    print(f"fio seq write 1 MiB + fdatasync each block: {r['fio_1MiB_fdatasync']['mb_per_s']:.0f} MB/s "
          f"(the issue's yardstick); fdatasync every 64 MiB: "
          f"{r['fio_1MiB_fdatasync_every_64MiB']['mb_per_s']:.0f} MB/s (streaming limit)")
    print(f"{'case':<26}{'msg/s':>12}{'MB/s payload':>14}{'MB/s disk':>11}{'rec/fsync':>11}{'p50 ms':>9}{'p99 ms':>9}")
    for name, row in r["wal"].items():
        print(f"{'wal ' + name:<26}{row['msg_per_s']:>12,.0f}{row['mb_per_s']:>14.1f}{row['disk_mb_per_s']:>11.1f}"
              f"{row['records_per_fsync']:>11.0f}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}")
    for group, wal_case in (("peers_100B", "batch_100B"), ("peers_64KiB", "batch_64KiB")):
        for name, row in r[group].items():
            label = f"{name} {group.split('_')[1]}"
            ratio = r["wal"][wal_case]["msg_per_s"] / row["msg_per_s"]
            print(f"{label:<26}{row['msg_per_s']:>12,.0f}{row['mb_per_s']:>14.1f}{'':>11}{row['records_per_fsync']:>11}"
                  f"   wal {wal_case} = {ratio:.2f}x")
    for twin, row in r["codec_100B"].items():
        print(f"codec {twin:<8} encode {row['encode_us_per_record']:.3f} us/rec, "
              f"decode+CRC {row['decode_us_per_record']:.3f} us/rec")
    print("targets:", json.dumps({k: round(v, 2) for k, v in r["targets"].items()}))


if __name__ == "__main__":
    main()
