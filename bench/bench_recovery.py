"""Recovery time of a broker's WAL root: T topics and about 1 GiB of journal + segments.

A child process opens T topics in one journaled commit group (``wal.group_sync =
journal``, the broker default), appends 4 KiB messages round-robin until the segments hold
``--gib`` GiB, makes them durable, and is SIGKILLed without closing anything: the journal
holds the rounds since its last checkpoint, the segments everything. Then, in a fresh
process, recovery is timed as a broker host does it: the group's construction (journal
replay into the segments) and the open of every WAL (each validates every frame of its
segments: CRC, offsets, round markers), ``--openers`` at a time (4 by default, as a
broker's assignment watcher loads topics; 1 opens them one after the other). Reported:
seconds, MB/s over the bytes on disk, and the split between replay and the WAL opens. With ``--drop-caches`` (root, and a kernel
that allows it) the page cache is dropped before recovery, so the files are read from the
device; otherwise they are mostly in memory (warm), which is what a process restart sees.

Never a pass/fail test. Run (about a minute per GiB on a quiet machine):

    .venv/bin/python bench/bench_recovery.py [--topics 1000] [--gib 1] [--dir DIR] [--openers 4] [--drop-caches]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from wal import WalConfig, WriteAheadLog  # noqa: E402
from wal.fs import RealFs  # noqa: E402
from wal.group import CommitGroup  # noqa: E402
from wal.journal import JournalConfig  # noqa: E402

_PAYLOAD = 4096


def _journal_config() -> JournalConfig:
    config = WalConfig()
    return JournalConfig(file_bytes=config.journal_file_bytes, checkpoint_bytes=config.journal_checkpoint_bytes,
                         checkpoint_interval_s=config.journal_checkpoint_interval_s, files_max=config.journal_files_max)


def _topic(index: int) -> str:
    return f"/bench/t{index}"


def write(root: str, topics: int, total_bytes: int) -> None:
    """The child: fill the root, report, then wait to be killed."""
    group = CommitGroup(root, RealFs(), journal=_journal_config())
    wals = [WriteAheadLog.open(root, _topic(i), group=group) for i in range(topics)]
    payload = os.urandom(_PAYLOAD)
    per_topic = max(1, total_bytes // (topics * _PAYLOAD))
    batch = [payload] * 16
    for done in range(0, per_topic, len(batch)):
        for wal in wals:
            wal.append_batch(batch[:min(len(batch), per_topic - done)])
    for wal in wals:
        wal.flush(600.0)
    print("READY", flush=True)
    time.sleep(3600)


def _bytes_on_disk(root: str) -> tuple[int, int]:
    journal = segments = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            size = os.path.getsize(os.path.join(directory, name))
            if name.endswith(".jnl"):
                journal += size
            elif name.endswith(".seg"):
                segments += size
    return journal, segments


def _drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def recover(root: str, topics: int, openers: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    group = CommitGroup(root, RealFs(), journal=_journal_config())
    replayed = time.perf_counter()
    assert group.journal is not None
    with ThreadPoolExecutor(openers) as pool:
        wals = list(pool.map(lambda i: WriteAheadLog.open(root, _topic(i), group=group), range(topics)))
    opened = time.perf_counter()
    rounds = group.journal.replayed.rounds
    for wal in wals:
        wal.close()
    group.close()
    return replayed - started, opened - replayed, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--openers", type=int, default=4,
                        help="WALs opened at once (default 4: a broker's watcher.workers_max)")
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before recovering")
    parser.add_argument("--child", nargs=3, metavar=("ROOT", "TOPICS", "BYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        write(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    base = args.dir or tempfile.gettempdir()
    root = tempfile.mkdtemp(prefix="bench-recovery-", dir=base)
    try:
        total = int(args.gib * (1 << 30))
        started = time.perf_counter()
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", root, str(args.topics),
                                  str(total)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        line = child.stdout.readline()
        if line.strip() != "READY":
            raise SystemExit(f"the writer did not get ready: {line!r}")
        written_s = time.perf_counter() - started
        child.send_signal(signal.SIGKILL)
        child.wait()
        journal, segments = _bytes_on_disk(root)
        cold = _drop_caches() if args.drop_caches else False
        replay_s, open_s, rounds = recover(root, args.topics, args.openers)
        seconds = replay_s + open_s
        on_disk = journal + segments
        print(f"{args.topics:,} topics, {segments / 2**20:,.0f} MiB of segments + {journal / 2**20:,.0f} MiB of "
              f"journal files (written in {written_s:.1f} s, then SIGKILL)")
        print(f"page cache: {'dropped (cold read)' if cold else 'warm (a process restart)'}"
              + ("; dropping it was not allowed here" if args.drop_caches and not cold else ""))
        print(f"{'phase':<34} {'seconds':>8} {'MB/s':>8}")
        print(f"{'journal replay (' + format(rounds, ',') + ' rounds)':<34} {replay_s:>8.2f}")
        print(f"{'open + validate every WAL':<34} {open_s:>8.2f} {segments / open_s / 1e6:>8.0f}")
        print(f"{'recovery, in all':<34} {seconds:>8.2f} {on_disk / seconds / 1e6:>8.0f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
