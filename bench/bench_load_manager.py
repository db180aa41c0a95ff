"""Load-manager simulator (a benchmark, not a test). One command prints every table:

    .venv/bin/python bench/bench_load_manager.py [--seed 1] [--workloads all] [--algorithms all] [--json PATH]

Runs our decision core (``tiered.cluster.decide``, unchanged) and the baselines
(Danube as documented, Danube as coded, Pulsar ThresholdShedder + LeastLongTermMessageRate,
Pulsar TransferShedder + LeastResourceUsageWithWeight) on the same seeded workloads
(``bench/lmsim/workloads.py``), and reports for each: CV of the true broker utilisation
(p50 / p95 / last hour), time to converge, rebalancing moves per hour, ping-pong and
futile moves, max/mean load against the LPT greedy placement and a lower bound,
topic-unavailable seconds, and the skew of a creation burst (``bench/lmsim/summary.py``
defines each). Deterministic: the same seed prints the same numbers.

The move duration comes from ``bench/bench_moves.py`` (etcd + moto, unload + load):
``bench/results/moves.json`` when that benchmark was run, else the p50s measured on the
development machine (9.9 ms without backlog, 1.18 s with 64 MiB to drain).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.lmsim.baselines import BASELINES  # noqa: E402
from bench.lmsim.bound import bounds  # noqa: E402
from bench.lmsim.ours import Ours  # noqa: E402
from bench.lmsim.summary import HEADER, format_bound, format_row, summarise  # noqa: E402
from bench.lmsim.workloads import WORKLOADS  # noqa: E402
from bench.lmsim.world import STEP_S, MoveModel, World  # noqa: E402

#: Our core per strategy with the default (balanced) preset, whose CV threshold is the
#: seed's 0.30: a cluster that starts below it is left alone. The aggressive preset
#: (threshold 0.20) is shown too, as the operator's choice closest to ThresholdShedder's
#: default (shed from a broker 10 % above the mean).
OURS = {"ours/balanced": ("balanced", {}), "ours/weighted_load": ("weighted_load", {}),
        "ours/weighted_load@aggressive": ("weighted_load", {"aggressiveness": "aggressive"}),
        "ours/fair": ("fair", {})}
ALGORITHMS = [*OURS, *BASELINES]
BOUND_EVERY_S = 2 * 3600.0


def move_model(path: str) -> tuple[MoveModel, str]:
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)["results"]["etcd+moto"]
        base = results["move_no_backlog"]["p50_ms"] / 1e3
        key = next(k for k in results if k.startswith("move_backlog_"))
        mib = float(key[len("move_backlog_"):-3])
        backlog = results[key]["p50_ms"] / 1e3
        return MoveModel(base_s=base, drain_bps=mib * 2**20 / max(backlog - base, 1e-3)), path
    return MoveModel(), "built-in p50s of bench/bench_moves.py (etcd+moto)"


def make(algorithm: str, world: World):
    if algorithm in OURS:
        strategy, rebalancing = OURS[algorithm]
        return Ours(world, strategy, **rebalancing)
    return BASELINES[algorithm](world)


def run(workload: str, algorithm: str, seed: int, model: MoveModel) -> tuple[World, float, int | None]:
    world = World(WORKLOADS[workload], seed, model)
    algo = make(algorithm, world)
    started = time.perf_counter()
    for step in range(int(world.spec.duration_s / STEP_S)):
        world.begin_step(step)
        algo.step()
        world.end_step()
    return world, time.perf_counter() - started, getattr(algo, "decisions", None)


def reference(workload: str, seed: int, model: MoveModel) -> tuple[tuple[float, float, float], float, float]:
    """Bounds (median over samples every 2 h and after the last event), the convergence
    target and the time it is measured from; computed on the world as the events leave it
    (topic placement does not matter to the bound)."""
    world = World(WORKLOADS[workload], seed, model)
    spec = world.spec
    last_event = max((e.at_s for e in spec.events), default=0.0)
    samples, target = [], None
    for step in range(int(spec.duration_s / STEP_S)):
        world.begin_step(step)
        for i in list(world.pending):  # any placement will do for the bound
            world.assign(i, world.balanced_brokers()[i % len(world.balanced_brokers())])
        for b, s in world.brokers.items():
            if (not s.alive or s.mode != "active") and world.on[b]:
                live = world.balanced_brokers()
                for k, i in enumerate(sorted(world.on[b])):
                    world.move(i, live[k % len(live)], "failover" if not s.alive else "drain")
                if s.mode == "draining":
                    world.mark_drained(b)
        due = world.now % BOUND_EVERY_S == 0 or (target is None and world.now >= last_event)
        if due:
            sample = bounds(world)
            samples.append(sample)
            if target is None and world.now >= last_event:
                target = max(0.24, 1.2 * sample[2])
    median = tuple(sorted(s[k] for s in samples)[len(samples) // 2] for k in range(3))
    return median, target, last_event


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workloads", default="all", help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--algorithms", default="all", help=f"comma-separated: {', '.join(ALGORITHMS)}")
    parser.add_argument("--moves-json", default=os.path.join(os.path.dirname(__file__), "results", "moves.json"))
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "load_manager.json"))
    args = parser.parse_args(argv)
    workloads = list(WORKLOADS) if args.workloads == "all" else args.workloads.split(",")
    algorithms = ALGORITHMS if args.algorithms == "all" else args.algorithms.split(",")
    model, source = move_model(args.moves_json)
    print(f"seed {args.seed}; move time: {model.base_s * 1e3:.1f} ms + un-archived bytes at "
          f"{model.drain_bps / 2**20:.0f} MiB/s (from {source})")
    results = []
    for workload in workloads:
        spec = WORKLOADS[workload]
        (lower, lpt_max_mean, lpt_cv), target, since = reference(workload, args.seed, model)
        print(f"\n== {workload}: {spec.description}")
        print(f"   (converge = CV <= {target:.3f} held 10 min, from t = {since / 60:.0f} min)")
        print(HEADER)
        for algorithm in algorithms:
            print(f"   running {algorithm} ...", end="\r", file=sys.stderr, flush=True)
            world, wall_s, decisions = run(workload, algorithm, args.seed, model)
            row = summarise(world, algorithm, target, since, wall_s, decisions)
            results.append(row.as_dict())
            print(format_row(row))
        print(format_bound(lower, lpt_max_mean, lpt_cv))
        results.append({"workload": workload, "algorithm": "bound", "lower_max_mean": lower,
                        "lpt_max_mean": lpt_max_mean, "lpt_cv": lpt_cv, "converge_target_cv": target})
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"seed": args.seed, "move_model": source, "rows": results}, f, indent=1)
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
