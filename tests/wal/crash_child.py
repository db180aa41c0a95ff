"""A fork server for SIGKILL tests: imports the WAL once, forks one writer per round.

Protocol (one line each; stdin commands, stdout reports; the pipe is the report channel):
  <- READY
  -> RUN <root> <round_id> <seed>
  <- PID <pid>                  the forked writer; the driver SIGKILLs it when it likes
  <- OPEN <first> <next>        (from the writer) after recovery
  <- D <offset>                 (from the writer) after each fsync: offset is durable
  <- EXIT <pid> <status>        after the writer died; every report of it precedes this
Forking a pre-imported process keeps each kill round at a few milliseconds.
"""
from __future__ import annotations

import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.wal.helpers import payload_for  # noqa: E402
from wal import RealFs, WalConfig, WriteAheadLog  # noqa: E402
from wal.group import CommitGroup  # noqa: E402
from wal.journal import JournalConfig  # noqa: E402

TOPIC = "/crash/topic"
CONFIG = WalConfig(segment_bytes_max=64 * 1024, cache_messages_max=256)
_JOURNAL = JournalConfig(file_bytes=128 * 1024, checkpoint_bytes=32 * 1024, checkpoint_interval_s=0.05)
_RUN_LIMIT_S = 10.0  # a writer nobody kills exits on its own


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def _writer(root: str, round_id: int, seed: int) -> None:
    rng = random.Random(seed)
    # Rounds take turns: a commit group with the shared journal (one journal fdatasync per
    # round, segments synced at checkpoints, replayed on the next open: small files and
    # frequent checkpoints, so kills land in switches, recycles and checkpoints too), a
    # commit group with one syncfs per round, and the per-topic writer. Each round opens
    # what the one before left, whichever kind that was.
    kind = round_id % 3
    group = (CommitGroup(root, RealFs(), journal=_JOURNAL) if kind == 0
             else CommitGroup(root, RealFs()) if kind == 1 else None)
    log = WriteAheadLog.open(root, TOPIC, CONFIG, group=group)
    _say(f"OPEN {log.first_offset} {log.next_offset}")
    log.add_durable_listener(lambda offset: _say(f"D {offset}"))
    deadline = time.monotonic() + _RUN_LIMIT_S
    while time.monotonic() < deadline:
        base = log.next_offset  # one appender, so the offsets it gets are predictable
        if rng.random() < 0.3:
            count = rng.randrange(1, 20)
            got = log.append_batch([payload_for(base + i, round_id) for i in range(count)])
        else:
            got = log.append(payload_for(base, round_id))
        assert got == base, (got, base)
        if rng.random() < 0.2:
            time.sleep(rng.random() * 0.001)
    log.close()
    if group is not None:
        group.close()


def main() -> None:
    _say("READY")
    for line in sys.stdin:
        command, root, round_id, seed = line.split()
        assert command == "RUN"
        pid = os.fork()
        if pid == 0:
            try:
                _writer(root, int(round_id), int(seed))
            finally:
                os._exit(0)
        _say(f"PID {pid}")
        _, status = os.waitpid(pid, 0)
        _say(f"EXIT {pid} {status}")


if __name__ == "__main__":
    main()
