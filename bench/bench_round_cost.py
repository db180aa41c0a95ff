"""CPU cost of one topic's turn in a journaled commit round: what bounds latency with many topics.

With T topics in one ``wal.group.CommitGroup`` (the shared journal, as a broker host runs it),
every round does some work per topic that has anything pending: take its frames, write them
to its segment, journal them, then publish its durable watermark. That per-topic cost ``c``
sets the knee of ``bench/bench_latency.py``: at R msg/s spread over many topics a round
holds about R x (round time) topics, so rounds stay short only while ``c x R`` is well below
1 (docs/WAL.md, "Measured (and the choice)").

This measures ``c`` directly, in a closed loop that a loaded or noisy machine disturbs far
less than a latency percentile: R times, append one message to each of T topics, then wait
until every one is durable (a durable listener per topic, as the latency benchmark has). The
commit group's thread's CPU time (user and system, from ``/proc``) divided by T x R is the
cost per topic-round; system time is mostly the one ``pwritev`` per topic. The producer's side
is shown too: wall time per append (while the group's thread runs, so it includes waits for the
GIL) and minor page faults per append (a fresh chunk per topic per round once cost one each,
native/_append.pyx ``_seal_chunk``). ``--freeze`` applies
the broker host's garbage-collector policy (``wal.heap``) after the topics open, as
``bench_latency.py`` does by default; without it the cyclic collector's full collections show.

Each run also prints the **floor** of the same turn: the same files written with what a round
writes to each: a round marker and one message's frame) by ``native.write_rounds``
alone, the one call the group makes for every topic's segment write, with no bookkeeping. Its
system time is what one ``pwritev`` per topic costs the kernel, whatever code drives it: a
compiled round cannot go below it on the group's thread.

**Instructions** (``--instructions``): CPU time per topic-round moves by 10-20 % between
runs on a shared machine, so a change of a few per cent does not show in it. This mode runs
the same loop twice under valgrind's callgrind (R and 2R passes; each thread counted
separately) and prints the difference per topic-round: the instructions the group's thread
executes for one topic's turn, and those the producer's thread executes for one append
(the wake of a parked topic included). The group's count is deterministic to within
about 1 %, so it shows small changes; the producer's includes its waits for durability,
so it moves with scheduling (by up to 20 % between runs). It counts instructions, not time
(cache misses with many topics are not in it). Needs ``valgrind``; about a minute at the
defaults below.

Not a test and never pass/fail. Commands:

    .venv/bin/python bench/bench_round_cost.py --topics 1000 --rounds 100 --repeat 3 --freeze
    .venv/bin/python bench/bench_round_cost.py --instructions --topics 200 --rounds 20
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prometheus_client import CollectorRegistry  # noqa: E402

from native import encode_frame, encode_round_marker, write_rounds  # noqa: E402
from wal import WriteAheadLog  # noqa: E402
from wal.fs import RealFs  # noqa: E402
from wal.group import CommitGroup  # noqa: E402
from wal.heap import HeapFreezer  # noqa: E402
from wal.journal import JournalConfig  # noqa: E402
from wal.metrics import set_per_topic  # noqa: E402

_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _thread_cpu_ns(tid: int) -> tuple[int, int]:
    """(user, system) CPU time of one thread of this process, in ns (clock-tick resolution)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) * _TICK_NS, int(fields[12]) * _TICK_NS


def _thread_minor_faults(tid: int) -> int:
    """Minor page faults of one thread of this process so far."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


class _Wals:
    """T WALs in one journaled commit group: bare (``WriteAheadLog.open``), or hosted by a
    broker host (``hosted``: ``BrokerHost.load`` on an embedded SQLite metadata store and a
    local object store, so each round also runs the listeners a broker registers, the
    uploader's and the host's, and appends go through ``HostedTopic.append``)."""

    def __init__(self, root: str, topics: int, hosted: bool) -> None:
        # Checkpoints far apart: their segment syncs run on another thread and would only add noise.
        journal = JournalConfig(file_bytes=1 << 30, checkpoint_bytes=1 << 30, checkpoint_interval_s=3600.0)
        self.host = None
        self.wals: list[WriteAheadLog] = []
        if not hosted:
            registry = CollectorRegistry()
            set_per_topic(registry, False)  # one aggregated series, as a broker host has
            self.group = CommitGroup(os.path.join(root, "wal"), RealFs(), journal=journal, metrics_registry=registry)
            for i in range(topics):
                self.wals.append(WriteAheadLog.open(os.path.join(root, "wal"), f"/bench/t{i}", group=self.group,
                                                    metrics_registry=registry))
            self.appenders: list = [wal.append for wal in self.wals]
            return
        from tiered.lifecycle import BrokerConfig
        from tiered.metadata import open_metadata
        from tiered.objects import open_objects
        from tiered.lifecycle.host import BrokerHost
        from wal import WalConfig
        os.makedirs(os.path.join(root, "objects"))
        self.metadata = open_metadata(f"sqlite:///{root}/metadata.db")
        self.objects = open_objects(f"file://{root}/objects")
        config = BrokerConfig(wal_config=WalConfig(journal_checkpoint_interval_s=3600.0,
                                                   journal_checkpoint_bytes=1 << 30, journal_file_bytes=1 << 30))
        self.host = BrokerHost("bench-round-cost", os.path.join(root, "wal"), self.metadata, self.objects, config)
        group = self.host.root.group
        assert group is not None, "a broker host's WAL root runs one commit group"
        self.group = group
        hosted_topics = [self.host.load(f"/bench/t{i}") for i in range(topics)]
        self.wals = [topic.wal for topic in hosted_topics]  # type: ignore[misc]
        self.appenders = [topic.append for topic in hosted_topics]

    def close(self) -> None:
        if self.host is None:
            for wal in self.wals:
                wal.close()
            self.group.close()
            return
        self.host.close(unload=False)
        self.objects.close()
        self.metadata.close()


def measure(topics: int, rounds: int, payload_bytes: int, freeze: bool, directory: str,
            hosted: bool = False) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="round-cost-", dir=directory)
    heap = HeapFreezer() if freeze else None
    opened = None
    try:
        opened = _Wals(root, topics, hosted)
        group = opened.group
        durable = [0]
        done = threading.Condition()

        def listener(_offset: int) -> None:
            with done:
                durable[0] += 1
                done.notify()

        for wal in opened.wals:
            wal.add_durable_listener(listener)
        if heap is not None:
            heap.freeze()  # as a broker host does after loading its topics
        payload = b"x" * payload_bytes

        appending = [0.0]
        appenders = opened.appenders

        def one_round(target: int) -> None:
            started = time.perf_counter()
            for append in appenders:
                append(payload)
            appending[0] += time.perf_counter() - started
            with done:
                while durable[0] < target:
                    done.wait(1.0)

        for warm in range(3):
            one_round((warm + 1) * topics)
        tid = group._thread.native_id  # noqa: SLF001 - the group's one writer thread
        assert tid is not None
        rounds_before, (user_before, system_before) = group.rounds, _thread_cpu_ns(tid)
        collections_before = sum(s["collections"] for s in gc.get_stats())
        producer = threading.get_native_id()
        faults_before, appending[0] = _thread_minor_faults(producer), 0.0
        started = time.perf_counter()
        for r in range(rounds):
            one_round((r + 4) * topics)
        wall = time.perf_counter() - started
        user, system = _thread_cpu_ns(tid)
        turns = topics * rounds
        return {"user_us": (user - user_before) / 1e3 / turns, "system_us": (system - system_before) / 1e3 / turns,
                "wall_ms_per_pass": wall * 1e3 / rounds, "commit_rounds": group.rounds - rounds_before,
                "append_us": appending[0] * 1e6 / turns,
                "append_faults": (_thread_minor_faults(producer) - faults_before) / turns,
                "gc_collections": sum(s["collections"] for s in gc.get_stats()) - collections_before}
    finally:
        if opened is not None:
            opened.close()
        if heap is not None:
            heap.close()
        shutil.rmtree(root, ignore_errors=True)


def measure_floor(topics: int, rounds: int, payload_bytes: int, directory: str) -> dict[str, float]:
    """CPU per topic-round of ``native.write_rounds`` alone over ``topics`` appended files (no
    bookkeeping): a round marker's and one frame's worth of bytes each, as a round writes."""
    root = tempfile.mkdtemp(prefix="round-floor-", dir=directory)
    fds = [os.open(os.path.join(root, f"segment-{i}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
           for i in range(topics)]
    try:
        frame = encode_frame(0, time.time_ns() // 1_000_000, None, None, b"x" * payload_bytes)
        parts = [[encode_round_marker(0), frame]] * topics
        for _ in range(3):
            write_rounds(fds, parts)
        tid = threading.get_native_id()
        user_before, system_before = _thread_cpu_ns(tid)
        for _ in range(rounds):
            errors = write_rounds(fds, parts)
            assert not any(errors), errors
        user, system = _thread_cpu_ns(tid)
        turns = topics * rounds
        return {"user_us": (user - user_before) / 1e3 / turns, "system_us": (system - system_before) / 1e3 / turns}
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(root, ignore_errors=True)


def count_instructions(topics: int, rounds: int, payload_bytes: int, directory: str,
                       hosted: bool = False) -> dict[str, float]:
    """Instructions per topic-round on the group's thread and per append on the producer's
    (the main) thread: callgrind's totals for R and 2R passes, differenced, so opening the
    WALs and starting up cancel out. The group's thread is the one whose count grew most."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt install valgrind)")
    totals: dict[int, dict[str, int]] = {}
    for passes in (rounds, 2 * rounds):
        out = tempfile.mkdtemp(prefix="round-cost-callgrind-", dir=directory)
        try:
            subprocess.run([valgrind, "--tool=callgrind", "--separate-threads=yes",
                            f"--callgrind-out-file={out}/cg", sys.executable, os.path.abspath(__file__),
                            "--measure-once", "--freeze", "--topics", str(topics), "--rounds", str(passes),
                            "--payload-bytes", str(payload_bytes), "--dir", directory,
                            *(["--hosted"] if hosted else [])],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            totals[passes] = {name.rsplit("-", 1)[1]: _callgrind_total(os.path.join(out, name))
                              for name in os.listdir(out) if name.startswith("cg-")}
        finally:
            shutil.rmtree(out, ignore_errors=True)
    grown = {thread: totals[2 * rounds].get(thread, 0) - count for thread, count in totals[rounds].items()}
    main_thread = "01"
    group_thread = max((t for t in grown if t != main_thread), key=lambda t: grown[t])
    turns = topics * rounds
    return {"group_per_topic_round": grown[group_thread] / turns, "producer_per_append": grown[main_thread] / turns}


def _callgrind_total(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise ValueError(f"{path}: no summary line")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=100, help="passes over every topic per measurement")
    parser.add_argument("--repeat", type=int, default=3, help="measurements (the spread shows the noise)")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--freeze", action="store_true", help="the broker host's gc.freeze policy (wal.heap)")
    parser.add_argument("--dir", default=None, help="where the WAL root goes (default: a temp dir)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind instead of timing (see the module docstring)")
    parser.add_argument("--hosted", action="store_true",
                        help="topics loaded on a broker host (embedded SQLite + local objects): its listeners "
                        "(the uploader's, the host's) and HostedTopic.append count too")
    parser.add_argument("--measure-once", action="store_true", help=argparse.SUPPRESS)  # --instructions' child
    args = parser.parse_args()
    directory = args.dir or tempfile.gettempdir()
    if args.measure_once:
        measure(args.topics, args.rounds, args.payload_bytes, args.freeze, directory, args.hosted)
        return
    if args.instructions:
        print(f"instructions (callgrind): {args.topics} topics, {args.rounds} and {2 * args.rounds} passes of one "
              f"{args.payload_bytes} B message each, gc frozen")
        counts = count_instructions(args.topics, args.rounds, args.payload_bytes, directory, args.hosted)
        print(f"  group's thread, per topic-round: {counts['group_per_topic_round']:>9,.0f}")
        print(f"  producer's thread, per append:   {counts['producer_per_append']:>9,.0f}")
        return
    print(f"commit group's thread CPU per topic-round: {args.topics} topics, {args.rounds} passes of one "
          f"{args.payload_bytes} B message each, gc {'frozen' if args.freeze else 'stock'}")
    print(f"{'run':>3} {'user us':>8} {'system us':>10} {'total us':>9} {'ms/pass':>8} {'rounds':>7} {'gc runs':>8}"
          f" {'append us':>10} {'faults/append':>14}")
    for run in range(args.repeat):
        r = measure(args.topics, args.rounds, args.payload_bytes, args.freeze, directory, args.hosted)
        print(f"{run + 1:>3} {r['user_us']:>8.1f} {r['system_us']:>10.1f} {r['user_us'] + r['system_us']:>9.1f} "
              f"{r['wall_ms_per_pass']:>8.1f} {r['commit_rounds']:>7} {r['gc_collections']:>8}"
              f" {r['append_us']:>10.2f} {r['append_faults']:>14.3f}")
        f = measure_floor(args.topics, args.rounds, args.payload_bytes, directory)
        print(f"{'':>3} {f['user_us']:>8.1f} {f['system_us']:>10.1f} {f['user_us'] + f['system_us']:>9.1f}   "
              "floor: the same segment writes by native.write_rounds alone")


if __name__ == "__main__":
    main()
