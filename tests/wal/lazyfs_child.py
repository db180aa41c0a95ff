"""Child process of the LazyFS test: appends commit rounds to a WAL on a LazyFS mount and
prints each offset once it is durable (acknowledged), until it is killed or the file
system goes away under it.

    python -m tests.wal.lazyfs_child ROOT SEED
"""
from __future__ import annotations

import random
import sys

from tests.wal.helpers import payload_for
from wal import WalConfig, WriteAheadLog


def main() -> None:
    root, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    config = WalConfig(segment_bytes_max=1 << 30, close_timeout_s=5.0)
    wal = WriteAheadLog.open(root, "/ns/t", config)
    round_id = wal.next_offset  # tells this incarnation's payloads apart from earlier ones
    print(f"opened {wal.next_offset}", flush=True)
    while True:
        first = wal.next_offset
        # 4.4-22 KiB per round: every round crosses a page boundary, so the kernel hands it
        # to FUSE as several writes and a torn write can keep a later part of it.
        sizes = [rng.choice((2200, 3000, 4500)) for _ in range(rng.randrange(2, 6))]
        batch = [payload_for(first + i, round_id, size) for i, size in enumerate(sizes)]
        assert wal.append_batch(batch) == first
        last = first + len(batch) - 1
        if not wal.wait_durable(last, 30.0):
            return
        print(f"acked {last}", flush=True)


if __name__ == "__main__":
    main()
