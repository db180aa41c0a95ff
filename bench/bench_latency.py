"""Open-loop append -> durable latency with many topics in one process, against peers.

The OpenMessaging-Benchmark way: one producer thread offers messages of one size at a FIXED
rate, round-robin over T topics, whether or not earlier ones are durable yet (open loop: a
closed loop would slow down and hide the queueing). Every run is a fresh child process
(so threads and RSS are its own) on a fresh directory of the disk under test.

Systems (``--modes``), each fed the same stream:

* ``wal``: per-topic WALs, each with its own writer thread and fdatasync per round
  (``wal.commit_group = false``).
* ``group``: every topic in one ``wal.group.CommitGroup`` without a journal
  (``wal.group_sync = syncfs``: one writer thread; a round writes every topic's segment,
  then ONE ``syncfs``).
* ``journal``: every topic in one ``CommitGroup`` with the root's shared journal
  (``wal.group_sync = journal``, the default of a broker host): a round writes every topic's
  segment and appends it to the journal, then ONE fdatasync of the journal; segments are
  synced by the journal's checkpoints (``wal/journal.py``).
* ``journal-pattern``: the shared journal's I/O pattern through the same group code: every
  segment write also goes to one journal file (zero-filled in advance, reused circularly, as
  BookKeeper preallocates its journal) and a round is made durable by ONE fdatasync of the
  journal; segments are never synced. Its I/O only: no replay, no checkpoints.
* peers (bench/peers.py), one database holding every topic, through ``PeerGroup``, the same
  group-commit policy: a writer thread takes whatever the producer queued since its last
  round (every topic) as one batch made durable with ONE sync, then calls each topic's
  listener; appends block at the same ``pending_bytes_max`` as a WAL's:
  ``rocksdict`` (a WriteBatch per round + ``flush_wal(sync=True)``), ``sqlite`` (WAL mode,
  ``synchronous=FULL``, one transaction per round), ``lmdb`` (one write transaction per round,
  synced on commit).

Our WALs run with the default ``WalConfig`` and one aggregated metrics registry, as a
broker host with ``metrics_per_topic = false`` has, and every mode runs under a broker
host's garbage-collector policy (``broker.gc_freeze``, ``wal.heap``): once its topics are
open, what is alive is frozen out of the cyclic collector's walks. ``--gc stock`` (or
``both``) also runs each case with the interpreter's stock collector, shown as
``MODE:stock-gc``: at 1,000 topics its full collections walk every WAL's objects with the
GIL held, which sets the p99 (docs/WAL.md). A new mode is one entry in ``MODES``.

What is measured, per message (every message appended after the warm-up, none sampled):
latency = the moment the producer found the message due -> the durable listener of its
topic passing its offset (a WAL's ``add_durable_listener`` callback, or the peer group's
call after its sync), on one clock. The probe is cheap so it does not cap what it
measures: the producer takes one timestamp per *tick* (a burst of at most 16 appends,
begun when the next message is due), not per message, and each listener call records one
(topic, offset, time) tuple; after the run, message i of the stream (topic i mod T, offset
i div T) is matched with its tick and with the first listener call that covered its
offset. Nothing is locked or looked up per message. A message's start time is thus its
tick's start: never before its scheduled time (``began + i / rate``), never after its
append call; the gap to the append call is what the appends before it in the tick took,
GIL waits included. The JSON has each run's p99 tick length (``tick_p99_us``: tens of µs
normally; up to hundreds of ms with 1,000 per-topic writer threads taking the GIL from the
producer, which then counts in the latency, as it would for a broker's clients) and the
run prints the runs whose ticks were long.

Columns: achieved = messages that became durable inside the measurement window / window
(the window is the run after ``--warmup``; a backlog carried over from the warm-up can
lift it a little above offered in short runs); ``*`` marks achieved < 95 % of offered
(saturated); p50/p99/p99.9 append->durable of the messages appended inside the window,
including those that only became durable in the drain after it; threads = the process's OS
threads (RocksDB's own included) and RSS at the end of the window; syncs/s = syncs in the
window (group rounds, per-topic fdatasyncs, peer commits). Floors in the same run: 4 KiB
write + fdatasync in a loop, and fio 4 KiB sequential writes with an fdatasync each (if
``fio`` is installed).

Cases: topics x offered rates (default 1, 100, 1,000, 10,000 topics x 1,000 to 200,000
msg/s) x sizes (100 B, 4 KiB); once a mode misses a rate at a size and topic count, its
higher rates there are reported as skipped (already saturated) instead of run.

``--find-saturation T[,T...]``: per mode, size and topic count, doubles the offered rate
from ``--start-rate`` until achieved < 95 % of offered, bisects twice between the last rate
kept up with and the first one missed, calls the highest rate kept up with the saturation
rate, and runs once more at half of it (the issue's target is phrased as "at half the
saturation rate, p99 <= 5 ms"). With ``--at-p99 MS`` the search instead finds the highest rate each mode
keeps up with at p99 <= MS, and prints our journal's rate against the best peer's (the issue's
"aggregate throughput at the same p99").

Never a pass/fail test. Run (from the repository root):

    .venv/bin/python bench/bench_latency.py --quick            # ~2 minutes: a subset
    .venv/bin/python bench/bench_latency.py                    # every default case (~30 min)
    .venv/bin/python bench/bench_latency.py --find-saturation 1000 --modes group,rocksdict --sizes 100
    .venv/bin/python bench/bench_latency.py --find-saturation 1000 --at-p99 5 --start-rate 25000 \
        --modes journal,rocksdict,lmdb --sizes 100
    options: [--seconds S] [--warmup S] [--dir DIR] [--cases T:RATE,...] [--sizes 100,4096]
             [--modes ...] [--repeat N] [--start-rate R] [--max-rate R]

Results also go to bench/results/latency.json.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple, Protocol

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.peers import PEERS, PeerGroup, fdatasync_floor, fio_available, fio_write_sync, open_peer  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from wal import WalConfig, WriteAheadLog  # noqa: E402
from wal.fs import AppendFile, Chunk, RealFs, SyncHandle  # noqa: E402
from wal.group import CommitGroup  # noqa: E402
from wal.heap import HeapFreezer  # noqa: E402
from wal.journal import JournalConfig  # noqa: E402
from wal.metrics import set_per_topic  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "latency.json")
_JOURNAL_BYTES = 256 * 1024 * 1024
TICK_MESSAGES_MAX = 16  # appends per producer timestamp: bounds how stale a message's append time is
SATURATED = 0.95  # achieved below this share of offered = the system did not keep up
DRAIN_TIMEOUT_S = 120.0

SIZES = (100, 4096)
TOPICS = (1, 100, 1_000, 10_000)
RATES = (1_000, 10_000, 50_000, 200_000)
CASES = tuple((topics, rate) for topics in TOPICS for rate in RATES)
#: --quick: (size, cases) pairs, about two minutes on two cores.
QUICK = ((100, ((1, 1_000), (100, 20_000), (1_000, 10_000), (10_000, 20_000))),
         (4096, ((1, 1_000), (1_000, 5_000))))


# --------------------------------------------------------------------------- systems under test

@dataclass(frozen=True)
class Setup:
    """What a mode is opened with."""

    directory: str  # fresh and empty, on the disk under test
    topics: int
    payload_bytes: int
    expected_bytes: int  # at most this many payload bytes will be appended (LMDB sizes its map)
    #: topic i's listener: call it with topic i's last durable offset after each sync that
    #: made some of it durable (offsets of every topic start at 0).
    listeners: Sequence[Callable[[int], None]]


class Target(Protocol):
    """An opened system."""

    @property
    def appenders(self) -> Sequence[Callable[[bytes], int]]:
        """Topic i's append is ``appenders[i](payload) -> offset`` (0, 1, ... per topic)."""

    def syncs(self) -> int:
        """Syncs made so far (each one a durability point for some topics)."""

    def drain(self, timeout_s: float) -> None:
        """Returns once everything appended is durable (and its listeners were called)."""

    def close(self) -> None: ...


class Mode(NamedTuple):
    open: Callable[[Setup], Target]
    #: file descriptors each topic keeps open: a run of T topics needs about T times this
    #: (plus a few hundred) under RLIMIT_NOFILE, or it is skipped with the reason.
    files_per_topic: int


class _Journal:
    """One preallocated journal file written circularly with pwritev; sync = fdatasync."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        block = b"\0" * (1 << 20)
        for _ in range(_JOURNAL_BYTES >> 20):
            os.write(self.fd, block)
        os.fsync(self.fd)
        self.position = 0
        self.lock = threading.Lock()

    def append(self, chunks: list[Chunk]) -> None:
        size = sum(map(len, chunks))
        with self.lock:
            if self.position + size > _JOURNAL_BYTES:
                self.position = 0
            written = os.pwritev(self.fd, chunks, self.position)
            assert written == size
            self.position += size

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def close(self) -> None:  # called by the group (its sync handle) and by the run
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _TeeFile:
    def __init__(self, inner: AppendFile, journal: _Journal) -> None:
        self._inner, self._journal = inner, journal

    def write(self, chunks: Sequence[Chunk]) -> None:
        self._inner.write(chunks)
        self._journal.append(list(chunks))

    def sync(self) -> None:
        self._inner.sync()

    def close(self) -> None:
        self._inner.close()


class JournalFs(RealFs):
    """RealFs whose segment writes also go to one journal, and whose 'syncfs' is one
    fdatasync of that journal (the shared journal's I/O pattern)."""

    def __init__(self, journal: _Journal) -> None:
        self.journal = journal

    def open_append(self, path: str) -> AppendFile:
        inner = super().open_append(path)
        return _TeeFile(inner, self.journal) if path.endswith(".seg") else inner

    def open_syncfs(self, path: str) -> SyncHandle:
        return self.journal


#: Opens the commit group of a WAL root: (root, metrics registry) -> group.
GroupFactory = Callable[[str, CollectorRegistry], CommitGroup]


class WalTarget:
    """T WALs of this project under one root: per-topic writers (``make_group`` None), or all
    of them in the commit group ``make_group`` opens. ``on_close`` runs after the group closed."""

    def __init__(self, setup: Setup, make_group: GroupFactory | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        self._registry = CollectorRegistry()
        set_per_topic(self._registry, False)  # one aggregated series, as a broker host has
        root = os.path.join(setup.directory, "wal")
        self._on_close = on_close
        self._group = make_group(root, self._registry) if make_group is not None else None
        self._wals: list[WriteAheadLog] = []
        try:
            for i in range(setup.topics):
                wal = WriteAheadLog.open(root, f"/bench/t{i}", group=self._group,
                                         metrics_registry=self._registry)
                self._wals.append(wal)
                wal.add_durable_listener(setup.listeners[i])
        except BaseException:
            self.close()
            raise
        self.appenders: list[Callable[[bytes], int]] = [wal.append for wal in self._wals]

    def syncs(self) -> int:
        if self._group is not None:
            return self._group.rounds
        return int(self._registry.get_sample_value("dnb_wal_fsyncs_total", {"topic": "_all"}) or 0)

    def drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for wal in self._wals:
            wal.flush(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        try:
            for wal in self._wals:
                wal.close()
            if self._group is not None:
                self._group.close()
        finally:
            if self._on_close is not None:
                self._on_close()


def open_wal(setup: Setup) -> Target:
    return WalTarget(setup)


def open_group(setup: Setup) -> Target:
    """The commit group with one syncfs per round (``wal.group_sync = syncfs``)."""
    return WalTarget(setup, lambda root, registry: CommitGroup(root, RealFs(), metrics_registry=registry))


def open_journal_pattern(setup: Setup) -> Target:
    journal = _Journal(os.path.join(setup.directory, "journal.bin"))
    try:
        return WalTarget(setup, lambda root, registry: CommitGroup(root, JournalFs(journal), metrics_registry=registry),
                         on_close=journal.close)
    except BaseException:
        journal.close()
        raise


class PeerTarget:
    """One peer database holding every topic, fed through a ``PeerGroup``."""

    def __init__(self, name: str, setup: Setup) -> None:
        store = open_peer(name, os.path.join(setup.directory, name), map_bytes=2 * setup.expected_bytes)
        self._group = PeerGroup(store, setup.listeners, WalConfig().pending_bytes_max)
        self.appenders: list[Callable[[bytes], int]] = [self._group.append(i) for i in range(setup.topics)]

    def syncs(self) -> int:
        return self._group.syncs

    def drain(self, timeout_s: float) -> None:
        self._group.drain(timeout_s)

    def close(self) -> None:
        self._group.close()


def open_peer_target(name: str, setup: Setup) -> Target:
    return PeerTarget(name, setup)


_DEFAULT_JOURNAL = JournalConfig(file_bytes=WalConfig().journal_file_bytes,
                                 checkpoint_bytes=WalConfig().journal_checkpoint_bytes,
                                 checkpoint_interval_s=WalConfig().journal_checkpoint_interval_s,
                                 files_max=WalConfig().journal_files_max,
                                 syncfs_min_files=WalConfig().journal_checkpoint_syncfs_min_files)

MODES: dict[str, Mode] = {
    "wal": Mode(open_wal, files_per_topic=2),  # segment + directory lock
    "group": Mode(open_group, files_per_topic=2),
    "journal-pattern": Mode(open_journal_pattern, files_per_topic=2),
    # The project's shared journal (wal/journal.py), with WalConfig's journal and cache
    # budget defaults: what a broker host runs.
    "journal": Mode(lambda setup: WalTarget(setup, lambda root, registry: CommitGroup(
        root, RealFs(), journal=_DEFAULT_JOURNAL, metrics_registry=registry,
        cache_bytes_max=WalConfig().cache_group_bytes_max, pending_bytes_max=WalConfig().pending_group_bytes_max)),
        files_per_topic=1),  # the segment; the journal's lock keeps other openers out of the root
    **{name: Mode(functools.partial(open_peer_target, name), files_per_topic=0) for name in PEERS},
}


# --------------------------------------------------------------------------- the probe

class Offered(NamedTuple):
    """What the producer did: message i (0-based) of the stream went to topic i mod T."""

    began: float
    messages: int
    tick_first: "array[int]"  # 'q': index of the first message of each tick
    tick_start: "array[float]"  # 'd': clock before the tick's first append (every message's append time)
    tick_end: "array[float]"  # 'd': clock after its last append


def offer(appenders: Sequence[Callable[[bytes], int]], payload: bytes, rate: float, seconds: float,
          warmup_s: float, at_warmup_end: Callable[[], None]) -> Offered:
    """The producer: message i is due at began + i / rate; whenever the next one is due,
    append every message due by now (at most TICK_MESSAGES_MAX per timestamp), else sleep
    until it is. Stops offering after ``seconds`` (a producer that fell behind does not
    catch up afterwards)."""
    clock, sleep = time.perf_counter, time.sleep
    topics = itertools.cycle(appenders)
    tick_first, tick_start, tick_end = array("q"), array("d"), array("d")
    offered = 0
    began = clock()
    stop_at, warm_at, warming = began + seconds, began + warmup_s, True
    while (now := clock()) < stop_at:
        if warming and now >= warm_at:
            at_warmup_end()
            warming = False
        due = int((now - began) * rate) + 1
        if due <= offered:
            sleep(began + offered / rate - now)
            continue
        burst = min(due - offered, TICK_MESSAGES_MAX)
        tick_first.append(offered)
        tick_start.append(now)
        for append in itertools.islice(topics, burst):
            append(payload)
        tick_end.append(clock())
        offered += burst
    return Offered(began, offered, tick_first, tick_start, tick_end)


class DurableLog:
    """Each listener call as (topic, last durable offset, clock): one tuple per topic per sync."""

    def __init__(self, topics: int) -> None:
        self.events: list[tuple[int, int, float]] = []
        add, clock = self.events.append, time.perf_counter
        # One closure per topic (list.append is atomic, so per-topic writer threads may share it).
        self.listeners = [(lambda durable, k=k: add((k, durable, clock()))) for k in range(topics)]


def append_times(offered: Offered) -> "array[float]":
    """Every message's append time (its tick's start), indexed by stream position."""
    times = array("d", bytes(8 * offered.messages))
    firsts = offered.tick_first
    for j, (first, start) in enumerate(zip(firsts, offered.tick_start)):
        end = firsts[j + 1] if j + 1 < len(firsts) else offered.messages
        times[first:end] = array("d", (start,)) * (end - first)
    return times


def measure(offered: Offered, events: list[tuple[int, int, float]], topics: int, window: tuple[float, float]
            ) -> tuple[list[float], int]:
    """(latency in seconds of every message appended inside ``window``, how many messages
    became durable inside it). Checks every offered message was made durable once, in order."""
    times = append_times(offered)
    window_from, window_to = window
    first_in_window = next((first for first, start in zip(offered.tick_first, offered.tick_start)
                            if start >= window_from), offered.messages)
    durable_next = [0] * topics
    per_topic: dict[int, "array[float]"] = {}
    samples: list[float] = []
    durable_in_window = 0
    for topic, durable, at in events:
        low = durable_next[topic]
        assert durable >= low, f"topic {topic}: durable offset went back from {low - 1} to {durable}"
        topic_times = per_topic.get(topic)
        if topic_times is None:
            topic_times = per_topic[topic] = times[topic::topics]
        # offset n of topic k is stream message n * T + k; count only those in the window
        start = max(low, -(-(first_in_window - topic) // topics))
        samples.extend([at - appended for appended in topic_times[start:durable + 1]])
        if window_from <= at <= window_to:
            durable_in_window += durable + 1 - low
        durable_next[topic] = durable + 1
    expected = [(offered.messages - k + topics - 1) // topics for k in range(topics)]
    assert durable_next == expected, "every offered message must be durable exactly once after the drain"
    return samples, durable_in_window


def _pct(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _files_allow(needed: int) -> str | None:
    """Raise the soft open-file limit to ``needed`` if the hard one allows; else the reason."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return None
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return None
    return f"needs ~{needed:,} open files, this machine allows {hard:,} (ulimit -Hn)"


# --------------------------------------------------------------------------- one run (a child process)

@dataclass(frozen=True)
class RunSpec:
    mode: str
    topics: int
    rate: int
    payload_bytes: int
    seconds: float
    warmup_s: float
    directory: str
    gc: str = "freeze"  # "freeze": the broker host's policy (wal.heap); "stock": the interpreter's


def run_one(spec: RunSpec) -> dict:
    """One mode, one case, in this process: the row of the table (see the module docstring)."""
    row: dict = {**asdict(spec), "offered": spec.rate}
    del row["directory"], row["rate"]
    mode = MODES[spec.mode]
    refusal = _files_allow(spec.topics * mode.files_per_topic + 256)
    if refusal is not None:
        return {**row, "skipped": refusal}
    directory = tempfile.mkdtemp(dir=spec.directory)
    log = DurableLog(spec.topics)
    setup = Setup(directory, spec.topics, spec.payload_bytes,
                  expected_bytes=int(spec.rate * spec.seconds + 1) * (spec.payload_bytes + 64), listeners=log.listeners)
    try:
        target = mode.open(setup)
        heap = HeapFreezer() if spec.gc == "freeze" else None
        if heap is not None:
            heap.freeze()  # as a broker host does after loading its topics
        try:
            syncs_at_warmup: list[int] = []
            offered = offer(target.appenders, b"x" * spec.payload_bytes, spec.rate, spec.seconds, spec.warmup_s,
                            lambda: syncs_at_warmup.append(target.syncs()))
            syncs = target.syncs() - (syncs_at_warmup or [0])[0]
            threads, rss_kib = _proc_status("Threads"), _proc_status("VmRSS")
            target.drain(DRAIN_TIMEOUT_S)
        finally:
            target.close()
            if heap is not None:
                heap.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    window = (offered.began + spec.warmup_s, offered.began + spec.seconds)
    samples, durable_in_window = measure(offered, log.events, spec.topics, window)
    samples.sort()
    ticks = sorted(end - start for start, end in zip(offered.tick_start, offered.tick_end))
    window_s = window[1] - window[0]
    return {**row, "achieved": durable_in_window / window_s, "messages": len(samples),
            "p50_ms": _pct(samples, 0.50) * 1e3, "p99_ms": _pct(samples, 0.99) * 1e3,
            "p999_ms": _pct(samples, 0.999) * 1e3, "threads": threads, "rss_mib": rss_kib / 1024,
            "syncs_per_s": syncs / window_s, "tick_p99_us": _pct(ticks, 0.99) * 1e6}


def run_child(spec: RunSpec) -> dict:
    """``run_one`` in a fresh process (its threads and RSS are the run's own)."""
    command = [sys.executable, os.path.abspath(__file__), "--one", json.dumps(asdict(spec))]
    failed = {"mode": spec.mode, "topics": spec.topics, "offered": spec.rate, "payload_bytes": spec.payload_bytes}
    timeout_s = spec.seconds + 600  # opening 10,000 topics and a 120 s drain fit in it
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {**failed, "failed": f"no result within {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {**failed, "failed": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the table

HEADER = (f"{'mode':<18} {'size':>5} {'topics':>6} {'offered/s':>10} {'achieved/s':>11}  "
          f"{'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'threads':>7} {'RSS MiB':>8} {'syncs/s':>8}")


def _size(payload_bytes: int) -> str:
    return f"{payload_bytes // 1024}K" if payload_bytes % 1024 == 0 else f"{payload_bytes}B"


def format_row(r: dict) -> str:
    label = r["mode"] + (":stock-gc" if r.get("gc") == "stock" else "")
    head = f"{label:<18} {_size(r['payload_bytes']):>5} {r['topics']:>6,} {r['offered']:>10,}"
    if "skipped" in r or "failed" in r:
        return f"{head}  {'skipped: ' + r['skipped'] if 'skipped' in r else 'FAILED: ' + r['failed']}"
    saturated = "*" if r["achieved"] < SATURATED * r["offered"] else " "
    return (f"{head} {r['achieved']:>11,.0f}{saturated} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
            f"{r['p999_ms']:>9.2f} {r['threads']:>7} {r['rss_mib']:>8.0f} {r['syncs_per_s']:>8.0f}")


def floors(directory: str) -> dict:
    """The device's own limits, measured now on the same disk."""
    samples = sorted(fdatasync_floor(directory))
    out: dict = {"fdatasync_4KiB": {"p50_ms": _pct(samples, 0.5) * 1e3, "p99_ms": _pct(samples, 0.99) * 1e3}}
    print(f"floor: 4 KiB write + fdatasync (Python loop): p50 {out['fdatasync_4KiB']['p50_ms']:.2f} ms, "
          f"p99 {out['fdatasync_4KiB']['p99_ms']:.2f} ms ({os.cpu_count()} cores)", flush=True)
    if fio_available():
        fio = out["fio_4KiB_fdatasync"] = fio_write_sync(directory, "4k", 16)
        print(f"floor: fio 4 KiB sequential write + fdatasync each: fdatasync p50 {fio['sync_p50_ms']:.2f} ms, "
              f"p99 {fio['sync_p99_ms']:.2f} ms, {fio['iops']:,.0f} writes/s", flush=True)
    else:
        print("floor: fio is not installed (apt-get install fio): no fio line", flush=True)
    return out


def run_case(spec: RunSpec, saturated_at: dict[tuple[int, int, str], int]) -> dict:
    """A case of the table; once a mode missed a rate (achieved < 95 % of offered) at a size
    and topic count, higher rates there are skipped: they would only add backlog (a
    per-topic WAL bounds its own, so 1,000 of them can queue minutes of drain)."""
    key = (spec.payload_bytes, spec.topics, spec.mode + ":" + spec.gc)
    if key in saturated_at and spec.rate > saturated_at[key]:
        return {"mode": spec.mode, "topics": spec.topics, "offered": spec.rate, "payload_bytes": spec.payload_bytes,
                "skipped": f"already saturated at {saturated_at[key]:,} msg/s"}
    row = run_child(spec)
    if "achieved" in row and row["achieved"] < SATURATED * spec.rate:
        saturated_at[key] = min(spec.rate, saturated_at.get(key, spec.rate))
    return row


# --------------------------------------------------------------------------- saturation search

def find_saturation(spec: RunSpec, max_rate: int, report: Callable[[dict], None],
                    p99_ms: float | None = None) -> dict:
    """Doubling then two bisection steps (see the module docstring); every run is reported.
    With ``p99_ms``, a rate counts as kept up with only if its p99 is also at most that
    (``--at-p99``), and there is no run at half of it."""
    def run(rate: int) -> dict:
        row = run_child(RunSpec(**{**asdict(spec), "rate": rate}))
        report(row)
        return row

    def kept_up(row: dict) -> bool:
        return ("achieved" in row and row["achieved"] >= SATURATED * row["offered"]
                and (p99_ms is None or row["p99_ms"] <= p99_ms))

    kept, missed = 0, 0
    rate = spec.rate
    while rate <= max_rate:
        row = run(rate)
        if "skipped" in row or "failed" in row:
            return {"mode": spec.mode, "topics": spec.topics, "payload_bytes": spec.payload_bytes,
                    "error": row.get("skipped") or row.get("failed")}
        if not kept_up(row):
            missed = rate
            break
        kept, rate = rate, rate * 2
    if kept and missed:
        for _ in range(2):
            middle = (kept + missed) // 2
            if kept_up(run(middle)):
                kept = middle
            else:
                missed = middle
    result = {"mode": spec.mode, "topics": spec.topics, "payload_bytes": spec.payload_bytes,
              "saturation": kept, "first_missed": missed or None, "p99_ms_max": p99_ms}
    if kept and p99_ms is None:
        result["at_half"] = run(max(1, kept // 2))
    return result


def format_ratios(searches: list[dict]) -> list[str]:
    """Per size and topic count: our journal's rate against the best peer's (``--at-p99``:
    the issue's "throughput at the same p99")."""
    lines = []
    groups: dict[tuple[int, int], dict[str, int]] = {}
    capped: set[tuple[int, int, str]] = set()  # kept up to --max-rate: a lower bound only
    for s in searches:
        if "error" not in s:
            groups.setdefault((s["payload_bytes"], s["topics"]), {})[s["mode"]] = s["saturation"]
            if not s["first_missed"]:
                capped.add((s["payload_bytes"], s["topics"], s["mode"]))

    def rate(size: int, topics: int, mode: str, value: int) -> str:
        return f"{'>= ' if (size, topics, mode) in capped else ''}{value:,} msg/s"

    for (size, topics), rates in groups.items():
        peers = {m: r for m, r in rates.items() if m in PEERS}
        if "journal" not in rates or not peers:
            continue
        best = max(peers, key=lambda m: peers[m])
        ratio = f"{rates['journal'] / peers[best]:.2f}x" if peers[best] else "n/a (the peer kept up with no rate)"
        lines.append(f"{_size(size):>5} {topics:>6,} topics: journal {rate(size, topics, 'journal', rates['journal'])}, "
                     f"best peer {best} {rate(size, topics, best, peers[best])}: {ratio}")
    return lines


def format_saturation(s: dict) -> str:
    head = f"{s['mode']:<16} {_size(s['payload_bytes']):>5} {s['topics']:>6,} topics:"
    if "error" in s:
        return f"{head} {s['error']}"
    if not s["saturation"]:
        return f"{head} did not keep up even at {s['first_missed']:,} msg/s (--start-rate)"
    missed = f"first missed {s['first_missed']:,}" if s["first_missed"] else "kept up to --max-rate"
    if s.get("p99_ms_max") is not None:
        return f"{head} {s['saturation']:,} msg/s with p99 <= {s['p99_ms_max']:g} ms ({missed})"
    half = s["at_half"]
    if "achieved" not in half:
        return f"{head} saturation {s['saturation']:,} msg/s ({missed}); run at half: {format_row(half)}"
    return (f"{head} saturation {s['saturation']:,} msg/s ({missed}); at half ({half['offered']:,} msg/s): "
            f"p50 {half['p50_ms']:.2f} ms, p99 {half['p99_ms']:.2f} ms, p99.9 {half['p999_ms']:.2f} ms")


# --------------------------------------------------------------------------- main

def _report_ticks(runs: list[dict], long_us: float = 1000.0) -> None:
    """Say how long producer ticks were, naming the runs where they were long (their
    latencies include the producer's wait inside a tick)."""
    ticks = [r for r in runs if "tick_p99_us" in r]
    if not ticks:
        return
    slow = [r for r in ticks if r["tick_p99_us"] > long_us]
    print(f"\nprobe: latency starts at the producer's tick; p99 tick length <= {long_us:,.0f} us in "
          f"{len(ticks) - len(slow)} of {len(ticks)} runs")
    for r in slow:
        print(f"  long ticks: {r['mode']} {_size(r['payload_bytes'])} {r['topics']:,} topics "
              f"{r['offered']:,}/s: p99 {r['tick_p99_us'] / 1e3:,.1f} ms")


def _parse_cases(text: str) -> tuple[tuple[int, int], ...]:
    return tuple((int(t), int(r)) for t, r in (pair.split(":") for pair in text.split(",") if pair))


def _parse_modes(text: str) -> list[str]:
    modes = [m for m in text.split(",") if m]
    for m in modes:
        if m not in MODES:
            hint = ""
            raise SystemExit(f"unknown mode {m!r}{hint}; modes: {', '.join(MODES)}")
    return modes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~2 minute subset (2 s runs, fewer cases)")
    parser.add_argument("--seconds", type=float, default=None, help="length of each run (default 5, --quick 2)")
    parser.add_argument("--warmup", type=float, default=0.5, help="first seconds of each run left out of the stats")
    parser.add_argument("--dir", default=None, help="directory on the disk to measure (default: a temp dir)")
    parser.add_argument("--cases", default=None, help="comma-separated TOPICS:RATE pairs, e.g. 1:1000,100:20000 "
                        "(default: topics 1,100,1000,10000 x rates 1000,10000,50000,200000)")
    parser.add_argument("--sizes", default=None, help="comma-separated message sizes in bytes "
                        "(default 100,4096; with --find-saturation 100)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--repeat", type=int, default=1, help="run each case this many times")
    parser.add_argument("--find-saturation", default=None, metavar="TOPICS",
                        help="comma-separated topic counts: search each one's saturation rate instead of the cases")
    parser.add_argument("--at-p99", type=float, default=None, metavar="MS",
                        help="with --find-saturation: the highest rate each mode keeps up with at p99 <= MS "
                        "(instead of the saturation rate), and our journal's rate against the best peer's")
    parser.add_argument("--start-rate", type=int, default=1_000, help="--find-saturation's first offered rate")
    parser.add_argument("--max-rate", type=int, default=2_048_000, help="--find-saturation's highest offered rate")
    parser.add_argument("--gc", choices=("freeze", "stock", "both"), default="freeze",
                        help="collector policy: the broker host's (freeze, default), the interpreter's "
                        "stock one, or each case under both")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one run, as JSON
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(RunSpec(**json.loads(args.one)))))
        return
    modes = _parse_modes(args.modes)
    policies = ("freeze", "stock") if args.gc == "both" else (args.gc,)
    seconds = args.seconds if args.seconds is not None else (2.0 if args.quick else 5.0)
    if args.at_p99 is not None and not args.find_saturation:
        raise SystemExit("--at-p99 goes with --find-saturation TOPICS")
    if seconds <= args.warmup:
        raise SystemExit("--seconds must be longer than --warmup")
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
    if args.cases is not None:
        plan = tuple((size, _parse_cases(args.cases)) for size in (sizes or SIZES))
    elif args.quick:
        plan = tuple((size, cases) for size, cases in QUICK if sizes is None or size in sizes)
    else:
        plan = tuple((size, CASES) for size in (sizes or SIZES))
    owned = args.dir is None
    directory = args.dir or tempfile.mkdtemp(prefix="bench-latency-")
    results: dict = {"seconds": seconds, "warmup_s": args.warmup, "cores": os.cpu_count(), "runs": []}
    try:
        results["floors"] = floors(directory)
        print("  (* = achieved < 95 % of offered; latency = append -> durable listener, every message)")
        print(HEADER, flush=True)

        def report(row: dict) -> None:
            results["runs"].append(row)
            print(format_row(row), flush=True)

        if args.find_saturation:
            results["saturation"] = []
            for size in (sizes or SIZES[:1]):
                for topics in (int(t) for t in args.find_saturation.split(",")):
                    for mode in modes:
                        spec = RunSpec(mode, topics, args.start_rate, size, seconds, args.warmup, directory,
                                       policies[0])
                        results["saturation"].append(find_saturation(spec, args.max_rate, report, args.at_p99))
            if args.at_p99 is None:
                print("\nsaturation = highest offered rate with achieved >= 95 % of it; then one run at half of it:")
            else:
                print(f"\nhighest offered rate with achieved >= 95 % of it and p99 <= {args.at_p99:g} ms:")
            for s in results["saturation"]:
                print(format_saturation(s))
            for line in format_ratios(results["saturation"]) if args.at_p99 is not None else ():
                print(line)
        else:
            saturated_at: dict[tuple[int, int, str], int] = {}  # (size, topics, mode) -> offered rate
            for size, cases in plan:
                for topics, rate in (case for case in cases for _ in range(args.repeat)):
                    for mode, policy in ((m, p) for m in modes for p in policies):
                        spec = RunSpec(mode, topics, rate, size, seconds, args.warmup, directory, policy)
                        report(run_case(spec, saturated_at))
    finally:
        if owned:
            shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=2)
    _report_ticks(results["runs"])
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
