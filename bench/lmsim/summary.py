"""What a run measured, reduced to one table row.

* CV p50 / p95 / last hour: of the true utilisation (work / capacity) of the brokers that
  should share the load (alive, active), sampled every 30 s over the whole run.
* converge: minutes from the workload's last disturbance (start, step, burst, crash)
  until the CV stays at or below max(0.24, 1.2 × the LPT placement's CV) for 10 minutes
  (0.24 = 0.8 × the balanced preset's 30 %); "never" if it does not.
* moves/h: rebalancing moves per hour (automatic, operator-less); drains and failovers
  are counted separately ("other").
* ping-pong: rebalancing moves of a topic back to a broker it left within the hour.
* futile: rebalancing moves that did not lower the true CV at the moment they were made.
* max/mean: the hottest broker's utilisation over the ideal (total work / total
  capacity), median over the run, next to the lower bound and the LPT greedy placement.
* unavail s: topic-seconds without an owner: each move's measured duration (unload +
  load, including draining the un-archived bytes), and for a failover the time from the
  crash to the new owner.
* burst skew: of the topics created in the burst, the most any broker received over the
  mean per active broker (1.0 = even).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.lmsim.world import STEP_S, World

REBALANCING_KINDS = ("auto", "manual", "shed")
HOLD_STEPS = int(600 / STEP_S)


@dataclass
class Row:
    workload: str
    algorithm: str
    cv_p50: float
    cv_p95: float
    cv_last_hour: float
    converge_min: float | None
    moves_per_hour: float
    other_moves: int
    pingpong: int
    futile: int
    max_mean_p50: float
    unavailable_s: float
    burst_skew: float | None
    wall_s: float
    decisions: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def converge_minutes(world: World, since_s: float, target: float) -> float | None:
    m = world.metrics
    run = 0
    for t, cv in zip(m.times, m.cv):
        if t < since_s:
            continue
        run = run + 1 if cv <= target else 0
        if run >= HOLD_STEPS:
            return (t - (HOLD_STEPS - 1) * STEP_S - since_s) / 60.0
    return None


def summarise(world: World, algorithm: str, target_cv: float, since_s: float, wall_s: float,
              decisions: int | None = None) -> Row:
    m = world.metrics
    hours = world.spec.duration_s / 3600.0
    rebalancing = [e for e in m.moves if e.kind in REBALANCING_KINDS]
    last = [cv for t, cv in zip(m.times, m.cv) if t >= world.spec.duration_s - 3600.0]
    skew = None
    if world.burst_topics:
        live = [b for b, s in world.brokers.items() if s.alive and s.mode == "active"]
        counts = [m.burst.get(b, 0) for b in live]
        mean = sum(counts) / len(counts)
        skew = max(counts) / mean if mean else None
    return Row(
        workload=world.spec.name, algorithm=algorithm,
        cv_p50=percentile(m.cv, 0.5), cv_p95=percentile(m.cv, 0.95), cv_last_hour=sum(last) / len(last),
        converge_min=converge_minutes(world, since_s, target_cv),
        moves_per_hour=len(rebalancing) / hours,
        other_moves=sum(1 for e in m.moves if e.kind not in REBALANCING_KINDS),
        pingpong=sum(1 for e in rebalancing if e.pingpong), futile=sum(1 for e in rebalancing if e.futile),
        max_mean_p50=percentile(m.max_over_mean, 0.5), unavailable_s=m.unavailable_s, burst_skew=skew,
        wall_s=wall_s, decisions=decisions)


HEADER = (f"{'algorithm':<29} {'CV p50':>7} {'CV p95':>7} {'CV end':>7} {'converge':>9} {'moves/h':>8} "
          f"{'other':>6} {'pingpong':>8} {'futile':>7} {'max/mean':>9} {'unavail s':>10} {'burst':>6}")


def format_row(row: Row) -> str:
    converge = "never" if row.converge_min is None else f"{row.converge_min:.0f} min"
    burst = "-" if row.burst_skew is None else f"{row.burst_skew:.2f}"
    return (f"{row.algorithm:<29} {row.cv_p50:>7.3f} {row.cv_p95:>7.3f} {row.cv_last_hour:>7.3f} {converge:>9} "
            f"{row.moves_per_hour:>8.1f} {row.other_moves:>6} {row.pingpong:>8} {row.futile:>7} "
            f"{row.max_mean_p50:>9.2f} {row.unavailable_s:>10.1f} {burst:>6}")


def format_bound(lower: float, lpt_max_mean: float, lpt_cv: float) -> str:
    return (f"{'bound (LPT greedy)':<29} {lpt_cv:>7.3f} {'':>7} {'':>7} {'':>9} {'':>8} {'':>6} {'':>8} {'':>7} "
            f"{lpt_max_mean:>9.2f} {'':>10} {'':>6}   lower bound of max/mean: {lower:.2f}")
