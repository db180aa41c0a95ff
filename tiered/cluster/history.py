"""Questions the rules ask of the persisted move history.

Everything that limits moves (the hourly limit, per-topic cooldown, the ping-pong
window, the settle delay and the pause after a failover) is computed from
``/cluster/rebalancing_history/`` records passed in the view, never from a leader's
memory: a new leader, or an operator's move made through another broker, is counted.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from tiered.cluster.view import MoveKind, MoveRecord

HOUR_S = 3600.0
#: How far ahead of this leader's clock a history entry may be dated and still count
#: (another leader's clock ran ahead). Such an entry counts as made "now" until our
#: clock reaches its date, so the hourly limit, cooldowns and the settle delay hold
#: across a leader change. An entry dated further ahead is a wrong clock or a hostile
#: writer: no rule counts it (an alarm names it), else it would block moves until then.
FUTURE_SKEW_S = HOUR_S
#: Moves that count toward (and, when automatic, are held by) the hourly limit. Drains
#: and failovers are exempt: an operator or a crash asked for them, and holding them
#: back would keep topics on a broker that is leaving or gone.
LIMITED_KINDS = frozenset({MoveKind.AUTO, MoveKind.MANUAL})


class HistoryIndex:
    def __init__(self, history: Sequence[MoveRecord], now: float | None = None) -> None:
        #: Entries dated more than FUTURE_SKEW_S ahead of ``now``: counted by no rule.
        self.ignored: list[MoveRecord] = []
        if now is not None:
            history, self.ignored = _as_of(history, now)
        self.records = sorted(history, key=lambda r: (r.started_at, r.move_id))
        self.by_topic: dict[str, list[MoveRecord]] = {}
        for record in self.records:
            self.by_topic.setdefault(record.topic, []).append(record)

    def moves_in_last_hour(self, now: float, kinds: Iterable[MoveKind] = LIMITED_KINDS) -> int:
        wanted = set(kinds)
        # A move dated after ``now`` (within FUTURE_SKEW_S: an earlier leader's clock ran
        # ahead) counts: leaving it out would let the new leader exceed the limit.
        return sum(1 for r in self.records if r.kind in wanted and now - HOUR_S < r.started_at)

    def last_moved_at(self, topic: str) -> float | None:
        records = self.by_topic.get(topic)
        return max(r.last_at for r in records) if records else None

    def left_since(self, topic: str, broker: str, since: float) -> bool:
        """Whether ``topic`` moved away from ``broker`` at or after ``since``."""
        return any(r.from_broker == broker and r.last_at >= since for r in self.by_topic.get(topic, ()))

    def last_completed(self, kinds: Iterable[MoveKind]) -> MoveRecord | None:
        wanted = set(kinds)
        done = [r for r in self.records if r.kind in wanted and r.completed_at is not None]
        return max(done, key=lambda r: (r.completed_at, r.move_id)) if done else None

    def last_failover_at(self) -> float | None:
        times = [r.last_at for r in self.records if r.kind is MoveKind.FAILOVER]
        return max(times) if times else None


def _as_of(history: Sequence[MoveRecord], now: float) -> tuple[list[MoveRecord], list[MoveRecord]]:
    """(entries the rules count, with dates ahead of ``now`` read as ``now``; entries
    dated more than FUTURE_SKEW_S ahead)."""
    kept, ignored = [], []
    for r in history:
        if r.last_at > now + FUTURE_SKEW_S:
            ignored.append(r)
        elif r.last_at > now:
            kept.append(replace(r, started_at=min(r.started_at, now),
                                completed_at=None if r.completed_at is None else min(r.completed_at, now)))
        else:
            kept.append(r)
    return kept, ignored
