"""SIGKILL soak of the WAL: >= 1,000 kill rounds, then a full verification; prints a summary.

    cd /work/main && PYTHONPATH=. .venv/bin/python bench/soak_wal.py [--kills 1000] [--workers 2]

Each worker drives a pre-imported fork server (tests/wal/crash_child.py) that forks a
writer per round; the driver SIGKILLs it at a random moment, checks that recovery kept
every offset reported durable, and at the end reads the whole log back: every message
intact, offsets contiguous, none written twice.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.wal.crash_driver import CrashRun, Zygote, verify  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--dir", default="/tmp")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="dnb-soak-wal-", dir=args.dir)
    runs = [CrashRun(os.path.join(root, f"w{i}")) for i in range(args.workers)]
    errors: list = []
    per_worker = -(-args.kills // args.workers)
    started = time.monotonic()

    def work(run: CrashRun, seed: int) -> None:
        zygote = Zygote()
        rng = random.Random(seed)
        try:
            for _ in range(per_worker):
                zygote.run_round(run, rng)
        except BaseException as exc:  # noqa: BLE001 - summarised below
            errors.append(exc)
        finally:
            zygote.close()

    threads = [threading.Thread(target=work, args=(run, args.seed + i)) for i, run in enumerate(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    verified = 0 if errors else sum(verify(run) for run in runs)
    elapsed = time.monotonic() - started
    kills = sum(run.kills for run in runs)
    durable = sum(run.durable_max() + 1 for run in runs)
    print(f"seed {args.seed}: {kills} SIGKILLs in {elapsed:.1f} s across {args.workers} workers; "
          f"{durable} offsets reported durable, {verified} records verified after recovery; "
          f"{'FAILED: ' + repr(errors[0]) if errors else 'no loss, no gap, no reuse'}")
    if not errors:
        shutil.rmtree(root)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
