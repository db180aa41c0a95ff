"""Child process of the LazyFS test in shared-journal mode: one commit group with the shared
journal (small files and frequent checkpoints, so file switches, recycles and checkpoints
happen within a second or two), TOPICS topics in it, one appender thread per topic. Each
offset is printed once it is durable (acknowledged), until the process is killed or the
file system goes away under it.

    python -m tests.wal.lazyfs_journal_child ROOT INCARNATION TOPICS

Reports (one line each, stdout):
    g <rounds> <entries> <bytes>   the group is open (what its journal replay wrote)
    o <topic> <next_offset>        the topic's WAL is open (recovered)
    a <topic> <offset>             every offset of the topic up to here is acknowledged
    r <topic> <next_offset>        the topic closed its WAL and opened it again (it leaves the
                                   group, syncing its segment, and joins again; now and then)
    bad <topic> <text>             something the writer saw itself that cannot be
Every payload is ``payload(offset, INCARNATION * 100 + topic)``, so the test can tell
exactly which message belongs under an offset (and which topic and run wrote it).
"""
from __future__ import annotations

import faulthandler
import random
import signal
import sys
import threading

from tests.wal.helpers import payload_for
from wal import RealFs, WalConfig, WriteAheadLog
from wal.group import CommitGroup
from wal.journal import JournalConfig

# Rounds of 8 topics are ~10-60 KiB here: the writer moves to another journal file every
# few rounds, a checkpoint comes every 0.2 s (or 512 KiB: under load a dozen rounds or so),
# files behind it are recycled, and a topic's segment rotates every 256 KiB (a few times per
# run). Both bounds are large enough that a segment takes several unsynced writes between
# two checkpoints, which torn-seq faults on segments need.
JOURNAL = JournalConfig(file_bytes=128 * 1024, checkpoint_bytes=512 * 1024, checkpoint_interval_s=0.2)
CONFIG = WalConfig(segment_bytes_max=256 * 1024, close_timeout_s=10.0)


def topic_name(index: int) -> str:
    return f"/j/t{index}"  # short: LazyFS FIFO commands carry segment paths


def payload(offset: int, round_id: int) -> bytes:
    """The one message a run writes under ``offset`` (size derived from both, 200-3800 B)."""
    return payload_for(offset, round_id, 200 + (offset * 7919 + round_id * 104729) % 3600)


def main() -> None:
    root, incarnation, topics = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack if we hang
    out = threading.Lock()

    def say(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    group = CommitGroup(root, RealFs(), journal=JOURNAL)
    report = group.journal.replayed
    say(f"g {report.rounds} {report.entries} {report.bytes}")
    wals = []
    for index in range(topics):
        wal = WriteAheadLog.open(root, topic_name(index), CONFIG, group=group)
        say(f"o {index} {wal.next_offset}")
        wals.append(wal)

    def append(index: int) -> None:
        wal = wals[index]
        rng = random.Random(incarnation * 1000 + index)
        round_id = incarnation * 100 + index
        try:
            while True:
                first = wal.next_offset  # this thread is the topic's only appender
                batch = [payload(first + k, round_id) for k in range(rng.randrange(1, 5))]
                assert wal.append_batch(batch) == first
                last = first + len(batch) - 1
                if not wal.wait_durable(last, 30.0):
                    return
                say(f"a {index} {last}")
                if rng.random() < 0.005:
                    # Leave the group (a closed WAL never depends on the journal: its close
                    # syncs the segment) and join it again, recovering on LazyFS.
                    wal.close()
                    wals[index] = wal = WriteAheadLog.open(root, topic_name(index), CONFIG, group=group)
                    if wal.next_offset != last + 1:
                        say(f"bad {index} reopened at {wal.next_offset} after acknowledging {last}")
                        return
                    say(f"r {index} {wal.next_offset}")
        except Exception:  # noqa: BLE001 - the file system went away (LazyFS crashed): stop
            return

    threads = [threading.Thread(target=append, args=(i,), daemon=True) for i in range(topics)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
