"""The load manager's real runtime next to the simulator, on one small workload (a
benchmark, not a test):

    .venv/bin/python bench/bench_lm_runtime.py [--seed 2] [--topics 60] [--zipf 1.3] [--hours 2]
                                               [--strategy balanced] [--aggressiveness balanced]

Both runs share one seeded workload (``bench/lmsim/workloads.py``): 3 standard brokers,
``--topics`` topics with Zipf-skewed loads, steady, placed round-robin at the start (with
the defaults the true CV starts at 0.43, above the balanced preset's 0.30).

* **simulator**: ``bench/lmsim/ours.py`` (the decision core in the simulated world).
* **runtime**: the production runtime on SQLite + a local object directory: three
  in-process :class:`~tiered.lifecycle.BrokerHost` brokers with their assignment
  watchers, and :class:`~tiered.cluster.runtime.LoadManager` stepped every simulated
  30 s on the simulated clock (leader election on real leases, fenced writes, history
  and smoothing from stored state; every move is a real seal on the source and load on
  the target). In-process brokers share one process, so their load reports are written
  from the same load model the simulator uses (the raw, noisy per-broker and per-topic
  numbers; the runtime smooths them itself), for the topics each broker really hosts.

A "shadow" world follows the runtime's placements (each move the runtime completes is
applied to it at the time it started), so both runs are measured by the same ruler
(``bench/lmsim/summary.py``): the true CV over time (p50, p95, last hour, and every
``--every-min`` minutes), rebalancing moves, ping-pong and futile moves.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lmsim.ours import Ours  # noqa: E402
from bench.lmsim.summary import HEADER, format_row, summarise  # noqa: E402
from bench.lmsim.workloads import WorkloadSpec  # noqa: E402
from bench.lmsim.world import STEP_S, World  # noqa: E402
from tiered.cluster import LoadManagerConfig, admin, records  # noqa: E402
from tiered.cluster.observe import read_snapshot  # noqa: E402
from tiered.cluster.runtime import LoadManager, RuntimeConfig  # noqa: E402
from tiered.lifecycle import BrokerHost  # noqa: E402
from tiered.lifecycle.config import BrokerConfig  # noqa: E402
from tiered.lifecycle.watcher import AssignmentWatcher, WatcherConfig  # noqa: E402
from tiered.metadata import open_metadata  # noqa: E402
from tiered.metadata.base import Put  # noqa: E402
from tiered.objects import open_objects  # noqa: E402
from uploader.config import UploaderConfig  # noqa: E402

#: The runtime's wall clock is the simulated time plus this (records want times >= 0).
T0 = 100_000.0
BROKER = BrokerConfig(uploader=UploaderConfig(interval_s=3600.0), session_ttl_s=30.0, progress_interval_s=1.0)
WAIT_S = 60.0


def spec(topics: int, hours: float, zipf_s: float = 1.3) -> WorkloadSpec:
    return WorkloadSpec("runtime-small", (("b00", 1.0), ("b01", 1.0), ("b02", 1.0)), topics, hours * 3600.0,
                        zipf_s=zipf_s,
                        description=f"3 brokers, {topics} Zipf({zipf_s:g}) topics, steady load, {hours:g} h")


def run_simulator(workload: WorkloadSpec, seed: int, strategy: str, aggressiveness: str) -> tuple[World, float]:
    world = World(workload, seed)
    algo = Ours(world, strategy, aggressiveness=aggressiveness)
    started = time.perf_counter()
    for step in range(int(workload.duration_s / STEP_S)):
        world.begin_step(step)
        algo.step()
        world.end_step()
    return world, time.perf_counter() - started


class RuntimeRun:
    """Three in-process brokers and a load manager stepped on the simulated clock."""

    def __init__(self, root: str, workload: WorkloadSpec, seed: int, strategy: str, aggressiveness: str) -> None:
        self.world = World(workload, seed)  # the shadow world: truth, and the ruler
        self.metadata = open_metadata(f"sqlite:///{root}/metadata.db")
        self.objects = open_objects(f"file://{root}/objects")
        os.makedirs(f"{root}/objects", exist_ok=True)
        self.now = T0 - 3600.0
        self.hosts = {b: BrokerHost(b, f"{root}/wal-{b}", self.metadata, self.objects, BROKER)
                      for b in sorted(self.world.brokers)}
        self.watchers = {b: AssignmentWatcher(h, WatcherConfig(retry_backoff_s=0.02, retry_backoff_max_s=0.2)).start()
                         for b, h in self.hosts.items()}
        config = LoadManagerConfig(assignment_strategy=strategy).with_rebalancing(enabled=True,
                                                                                  aggressiveness=aggressiveness)
        self.lm = LoadManager(self.metadata, "lm", config, RuntimeConfig(leader_ttl_s=120.0), clock=self.clock)
        self.seq = 0
        self.moves_seen: set[str] = set()
        self.steps = 0

    def clock(self) -> float:
        return self.now

    def close(self) -> None:
        for w in self.watchers.values():
            w.stop()
        for h in self.hosts.values():
            h.close(unload=False)
        self.lm.election.resign()
        self.metadata.close()

    # -- reports from the load model ------------------------------------------------------
    def hosted(self) -> dict[str, set[str]]:
        return {b: {str(t.topic) for t in h.topics()} for b, h in self.hosts.items()}

    def report(self) -> None:
        w = self.world
        index = {name: i for i, name in enumerate(w.topics.names)}
        ops = []
        self.seq += 1
        for b, names in self.hosted().items():
            r = w._report(b)
            s = w.brokers[b]
            topics = []
            for name in sorted(names):
                bytes_in, bytes_out, producers, consumers, backlog = w.topic_report(index[name], smoothed=False)
                topics.append(asdict(records.TopicReport(name, 0, bytes_in / 1024.0, bytes_in, bytes_out, producers,
                                                         consumers, consumers, backlog)))
            # The capacities the simulator's own core is given (bench/lmsim/ours.py). A real
            # broker's report caps CPU and memory at 100 % (tiered/cluster/reports.py), and a
            # record above is malformed; the simulator's noise can go past it.
            record = records.LoadReportRecord(b, self.seq, self.now, min(r.cpu_pct, 100.0), min(r.mem_pct, 100.0),
                                              s.cores, s.mem_bytes,
                                              r.net_in_bps, r.net_out_bps, topics, disk_io_bps=r.disk_io_bps,
                                              nic_bps=s.nic_bps, disk_bps=4 * s.nic_bps)
            ops.append(Put(records.load_key(b), records.encode(record)))
        self.metadata.txn([], ops)

    # -- stepping ---------------------------------------------------------------------
    def settle(self) -> None:
        """Step the leader until no placement is in flux (the watchers seal and load for
        real meanwhile; bounded wall-clock wait)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            self.lm.election.tick()
            report = self.lm.step()
            self.steps += 1
            snap = read_snapshot(self.metadata)
            flux = [t for t, (p, _) in snap.placements.items() if p.state != "owned"] + list(snap.markers)
            if not flux and not report.applied and not report.observed:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"placements still in flux after {WAIT_S}s: {flux[:5]}")
            time.sleep(0.005 if report.applied or report.observed else 0.02)

    def place_initial(self) -> None:
        """The simulator's starting placement (round-robin in creation order)."""
        w = self.world
        self.lm.election.tick()
        for i, name in enumerate(w.topics.names):
            admin.request_topic(self.metadata, name, to_broker=w.owner[i])
        self.report()
        self.settle()

    def mirror_moves(self) -> None:
        """Apply the moves the runtime started since the last call to the shadow world."""
        w = self.world
        index = {name: i for i, name in enumerate(w.topics.names)}
        for h in sorted(admin.history(self.metadata)["history"], key=lambda h: h["started_at"]):
            if h["move_id"] in self.moves_seen or h["completed_at"] is None:
                continue
            self.moves_seen.add(h["move_id"])
            i = index[h["topic"]]
            if w.owner[i] != h["to_broker"]:
                w.move(i, h["to_broker"], h["kind"], at=h["started_at"] - T0)

    def run(self) -> tuple[World, float]:
        started = time.perf_counter()
        self.place_initial()
        w = self.world
        for step in range(int(w.spec.duration_s / STEP_S)):
            w.begin_step(step)
            self.now = T0 + w.now
            self.report()
            self.settle()
            self.mirror_moves()
            w.end_step()
        return w, time.perf_counter() - started


def cv_series(world: World, every_min: float) -> list[tuple[float, float]]:
    every = max(int(every_min * 60 / STEP_S), 1)
    m = world.metrics
    return [(t / 60.0, cv) for k, (t, cv) in enumerate(zip(m.times, m.cv)) if k % every == 0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--topics", type=int, default=60)
    parser.add_argument("--zipf", type=float, default=1.3, help="Zipf exponent of the topic loads")
    parser.add_argument("--aggressiveness", default="balanced", choices=("conservative", "balanced", "aggressive"))
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--strategy", default="balanced", choices=("fair", "balanced", "weighted_load"))
    parser.add_argument("--every-min", type=float, default=10.0, help="CV over time: one sample every N minutes")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    workload = spec(args.topics, args.hours, args.zipf)
    print(f"seed {args.seed}; {workload.description}; strategy {args.strategy}, {args.aggressiveness} preset")
    sim, sim_s = run_simulator(workload, args.seed, args.strategy, args.aggressiveness)
    root = tempfile.mkdtemp(prefix="dnb-lm-runtime-")
    try:
        runtime = RuntimeRun(root, workload, args.seed, args.strategy, args.aggressiveness)
        try:
            real, real_s = runtime.run()
        finally:
            runtime.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    target = 0.24
    print(HEADER)
    for name, world, wall in (("simulator", sim, sim_s), ("runtime (SQLite)", real, real_s)):
        print(format_row(summarise(world, name, target, 0.0, wall)))
    print(f"(runtime: {runtime.steps} leader steps, {len(runtime.moves_seen)} moves recorded in the "
          f"persisted history; wall {real_s:.1f} s vs simulator {sim_s:.2f} s)")
    print("\nCV over time (true utilisation of the 3 brokers):")
    print(f"{'minute':>7} {'simulator':>10} {'runtime':>10}")
    for (t, a), (_, b) in zip(cv_series(sim, args.every_min), cv_series(real, args.every_min)):
        print(f"{t:>7.0f} {a:>10.3f} {b:>10.3f}")
    for name, world in (("simulator", sim), ("runtime", real)):
        moves = [(round(e.at_s / 60, 1), world.topics.names[e.topic], e.source, e.target, e.kind,
                  "futile" if e.futile else "", "ping-pong" if e.pingpong else "") for e in world.metrics.moves]
        print(f"\n{name} moves (minute, topic, from, to, kind): {len(moves)}")
        for m in moves:
            print("  " + " ".join(str(x) for x in m if x != ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
