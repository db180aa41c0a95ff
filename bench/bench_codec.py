"""Codec benchmark (not a test): Cython twin vs pure-Python twin, aiokafka as a named peer,
and dnb1 object build/read throughput.

    .venv/bin/python bench/bench_codec.py            # prints a table, writes bench/results/codec.json
    .venv/bin/python bench/bench_codec.py --quick    # fewer messages, for a smoke run

Every number is the best of ``--repeat`` runs with the garbage collector enabled (decoded
records are real objects that the collector sees in production too). ns/msg is per message;
the ratio column is pure-Python time / Cython time. aiokafka (if importable) is measured on the
same payloads: ``DefaultRecordBatchBuilder.append`` + ``build`` and ``DefaultRecordBatch``
``validate_crc`` + iterate records reading ``value``; it is a peer for orders of magnitude, not
the same format (its batch CRC covers a whole batch, ours one frame).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import native  # noqa: E402
from native import object_format as of  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "codec.json"
PUBLISH_MS = 1_700_000_000_000


def payload(i: int, size: int) -> bytes:
    """Text-like (JSON-ish) payloads, so zstd numbers resemble real event data."""
    base = (f'{{"id":{i},"user":"user-{i % 9973}","event":"page_view","path":"/products/'
            f'{i % 313}/reviews","ua":"Mozilla/5.0 (X11; Linux x86_64)","score":{(i * 37) % 1000}}}')
    reps = size // len(base) + 1
    return (base * reps)[:size].encode()


def messages(count: int, size: int) -> list:
    return [(PUBLISH_MS + i, None, None, payload(i, size)) for i in range(count)]


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_twin(codec, msgs: list, repeat: int) -> dict:
    count = len(msgs)
    frames = codec.encode_batch(0, msgs)

    def single():
        enc = codec.encode_frame
        for i, (t, k, a, p) in enumerate(msgs):
            enc(i, t, k, a, p)

    return {
        "encode_single_ns": best_of(repeat, single) / count * 1e9,
        "encode_batch_ns": best_of(repeat, lambda: codec.encode_batch(0, msgs)) / count * 1e9,
        "decode_crc_ns": best_of(repeat, lambda: codec.scan_frames(frames, 0, None, 0, True)) / count * 1e9,
        "validate_crc_ns": best_of(repeat, lambda: codec.scan_frames(frames, 0, None, 0, False)) / count * 1e9,
    }


def bench_aiokafka(msgs: list, repeat: int) -> dict | None:
    try:
        from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    except ImportError:
        return None
    count = len(msgs)

    def build():
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                            producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                            batch_size=1 << 30)
        for i, (t, k, _a, p) in enumerate(msgs):
            builder.append(i, timestamp=t, key=k, value=p, headers=[])
        return builder.build()

    buf = bytes(build())

    def read():
        batch = DefaultRecordBatch(buf)
        if not batch.validate_crc():
            raise AssertionError("aiokafka batch CRC")
        for record in batch:
            record.value  # noqa: B018 - touch the payload like a consumer would

    return {"encode_batch_ns": best_of(repeat, build) / count * 1e9,
            "decode_crc_ns": best_of(repeat, read) / count * 1e9}


def bench_objects(codec, msgs: list, repeat: int, levels=(0, 1, 3)) -> list:
    frames = native.codec.encode_batch(0, msgs)
    rows = []
    for level in levels:
        obj = of.write_object(frames, topic="bench/topic", zstd_level=level, codec=codec)
        build_s = best_of(repeat, lambda: of.write_object(frames, topic="bench/topic",
                                                          zstd_level=level, codec=codec))
        read_s = best_of(repeat, lambda: of.read_records(obj, "bench", codec=codec))
        rows.append({"implementation": codec.IMPLEMENTATION, "zstd_level": level,
                     "frames_mb": len(frames) / 1e6, "object_mb": len(obj) / 1e6,
                     "ratio": len(frames) / len(obj),
                     "build_mb_s": len(frames) / build_s / 1e6, "build_msg_s": len(msgs) / build_s,
                     "read_mb_s": len(frames) / read_s / 1e6, "read_msg_s": len(msgs) / read_s})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages (smoke run)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if native.IMPLEMENTATION != "cython":
        print(f"the Cython codec did not load ({native.NATIVE_IMPORT_ERROR}); nothing to compare",
              file=sys.stderr)
        return 2
    py, cy = native.available_codecs()
    scale = 10 if args.quick else 1
    sizes = {"100B": (100, 20_000 // scale), "4KiB": (4096, 4_000 // scale)}
    codec_rows = []
    for label, (size, count) in sizes.items():
        msgs = messages(count, size)
        c = bench_twin(cy, msgs, args.repeat)
        p = bench_twin(py, msgs[:max(1, count // 4)], max(1, args.repeat // 2))
        a = bench_aiokafka(msgs, args.repeat)
        for op in ("encode_single_ns", "encode_batch_ns", "decode_crc_ns", "validate_crc_ns"):
            codec_rows.append({"payload": label, "op": op.removesuffix("_ns"), "cython_ns": c[op],
                               "python_ns": p[op], "ratio": p[op] / c[op],
                               "aiokafka_ns": (a or {}).get(op)})
    object_rows = []
    obj_msgs = {"100B": messages(200_000 // scale, 100), "4KiB": messages(8_000 // scale, 4096)}
    for label, msgs in obj_msgs.items():
        for row in bench_objects(cy, msgs, 3):
            object_rows.append({"payload": label, **row})
        for row in bench_objects(py, msgs[:len(msgs) // 4], 1):
            object_rows.append({"payload": label, **row})

    print(f"codec: {native.IMPLEMENTATION}, CRC32C hardware: {cy.CRC32C_HARDWARE}, "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(f"{'payload':7} {'operation':14} {'cython ns/msg':>13} {'python ns/msg':>13} "
          f"{'ratio':>7} {'aiokafka ns/msg':>15}")
    for r in codec_rows:
        aio = f"{r['aiokafka_ns']:15.0f}" if r["aiokafka_ns"] is not None else f"{'-':>15}"
        print(f"{r['payload']:7} {r['op']:14} {r['cython_ns']:13.0f} {r['python_ns']:13.0f} "
              f"{r['ratio']:6.1f}x {aio}")
    print()
    print(f"{'payload':7} {'twin':7} {'zstd':>4} {'frames MB':>9} {'ratio':>6} {'build MB/s':>10} "
          f"{'build msg/s':>11} {'read MB/s':>9} {'read msg/s':>10}")
    for r in object_rows:
        print(f"{r['payload']:7} {r['implementation']:7} {r['zstd_level']:4} {r['frames_mb']:9.1f} "
              f"{r['ratio']:6.2f} {r['build_mb_s']:10.0f} {r['build_msg_s']:11.0f} "
              f"{r['read_mb_s']:9.0f} {r['read_msg_s']:10.0f}")
    try:
        import aiokafka
        peer = f"aiokafka {aiokafka.__version__}"
    except ImportError:
        peer = "aiokafka not installed: peer column skipped"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python bench/bench_codec.py" + (" --quick" if args.quick else ""),
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "crc32c_hardware": cy.CRC32C_HARDWARE, "peer": peer,
        "codec": codec_rows, "objects": object_rows}, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
