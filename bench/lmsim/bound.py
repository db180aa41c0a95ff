"""The reference for max/mean load: a lower bound and the LPT greedy assignment.

For the brokers that should share the load (alive, active) and every topic's true work:

* lower bound of max utilisation / ideal utilisation: ``max(1, (largest topic / largest
  capacity) / ideal)`` where ideal = total work / total capacity; no placement can do
  better, and the largest topics of a Zipf load often make it > 1;
* LPT greedy (largest topic first, each to the broker whose utilisation after it is
  lowest): an achievable placement, within 4/3 of the optimum for equal capacities.
  Its CV is shown as a reference too (it ignores move budgets entirely).
"""
from __future__ import annotations

from bench.lmsim.world import World, _cv


def bounds(world: World) -> tuple[float, float, float]:
    """(lower bound of max/mean, LPT's max/mean, LPT's CV) at the world's current time."""
    live = world.balanced_brokers()
    caps = {b: world.brokers[b].capacity_bps for b in live}
    works = sorted((world.topic_work(i) for i, o in enumerate(world.owner) if o is not None), reverse=True)
    total_cap = sum(caps.values())
    ideal = sum(works) / total_cap
    lower = max(1.0, (works[0] / max(caps.values())) / ideal) if works else 1.0
    load = {b: 0.0 for b in live}
    for w in works:
        b = min(live, key=lambda x: ((load[x] + w) / caps[x], x))
        load[b] += w
    utils = [load[b] / caps[b] for b in live]
    return lower, max(utils) / ideal, _cv(utils)
