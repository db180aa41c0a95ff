"""The offset-continuity harness: seeded schedules of moves, crashes and faults, checked.

``run_scenario(seed)`` runs one schedule (see :mod:`tiered.tools.harness.schedule`) on N
in-process brokers sharing a metadata and an object store, and checks the invariants
listed in :mod:`tiered.tools.harness.runner`. ``run_many`` runs a range of seeds and stops
at the first failure, printing its seed, its schedule and the first violated
invariant; ``dnb harness --seed S`` replays it exactly.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tiered.tools.harness.model import Violation
from tiered.tools.harness.runner import ScenarioResult, run_scenario
from tiered.tools.harness.schedule import Step, make_schedule

__all__ = ["ScenarioResult", "Step", "Violation", "make_schedule", "render_summary", "run_many", "run_scenario"]


def run_many(first_seed: int = 0, scenarios: int = 20, brokers: int = 3, steps: int = 12,
             metadata_url: str | None = None, objects_url: str | None = None,
             subprocess_crashes: bool = False, time_limit_s: float | None = None,
             progress: Callable[[Iterable[int], int | None, str], Iterable[int]] | None = None) -> dict[str, Any]:
    """Run seeds ``first_seed ..``; stop at the first failure or after ``time_limit_s``."""
    started = time.monotonic()
    seeds = range(first_seed, first_seed + scenarios)
    passed, failure = 0, None
    for seed in (progress(seeds, scenarios, "harness") if progress else seeds):
        if time_limit_s is not None and time.monotonic() - started >= time_limit_s:
            break
        result = run_scenario(seed, brokers, steps, metadata_url, objects_url, subprocess_crashes)
        if not result.ok:
            failure = result
            break
        passed += 1
    return {
        "first_seed": first_seed, "scenarios": passed + (failure is not None), "passed": passed,
        "failed": int(failure is not None), "elapsed_s": round(time.monotonic() - started, 2),
        "failure": None if failure is None else failure.to_json(),
        "replay": None if failure is None else f"dnb harness --seed {failure.seed} --brokers {brokers} --steps {steps}"
        + (" --subprocess-crashes" if subprocess_crashes else ""),
    }


def render_summary(summary: dict[str, Any]) -> str:
    lines = [f"harness: {summary['passed']} of {summary['scenarios']} scenario(s) passed from seed "
             f"{summary['first_seed']} in {summary['elapsed_s']} s"]
    failure = summary["failure"]
    if failure is not None:
        lines += [f"FAILED seed {failure['seed']} at step {failure['failed_step']}",
                  f"first violated invariant: {failure['violation']}", "schedule:"]
        lines += [f"  {i:3d}  {s}" for i, s in enumerate(failure["schedule"])]
        lines += [f"  note: {n}" for n in failure["notes"]]
        lines.append(f"replay: {summary['replay']}")
    return "\n".join(lines)
