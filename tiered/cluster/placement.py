"""Placement: round-robin among the brokers within 10 % of the minimum score.

The seed's rule, with a float score and the model updated after every pick (the new
topic counts at the cluster's mean topic load until it reports), so a burst of new
topics spreads instead of piling onto whichever broker looked emptiest at the last
report. The rotation remembers the last broker picked (``CoreState.rr_last``) and goes
on with the next broker id inside the band.
"""
from __future__ import annotations

from collections.abc import Sequence

from tiered.cluster.scoring import ScoreModel


def band(model: ScoreModel, candidates: Sequence[str], ratio: float, absolute: float) -> list[str]:
    """The candidates whose score is at most ``min·(1 + ratio) + absolute``, by id."""
    if not candidates:
        return []
    scores = {b: model.score(b) for b in candidates}
    low = min(scores.values())
    limit = low + abs(low) * ratio + absolute
    return sorted(b for b, s in scores.items() if s <= limit)


def round_robin(members: Sequence[str], last: str | None) -> str | None:
    """The first member after ``last`` in id order, wrapping around."""
    if not members:
        return None
    if last is not None:
        for b in members:
            if b > last:
                return b
    return members[0]
