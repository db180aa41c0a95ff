"""Questions the rules ask of the persisted move history.

Everything that limits moves (the hourly limit, per-topic cooldown, the ping-pong
window, the settle delay and the pause after a failover) is computed from
``/cluster/rebalancing_history/`` records passed in the view, never from a leader's
memory: a new leader, or an operator's move made through another broker, is counted.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from tiered.cluster.view import MoveKind, MoveRecord

HOUR_S = 3600.0
#: Moves that count toward (and, when automatic, are held by) the hourly limit. Drains
#: and failovers are exempt: an operator or a crash asked for them, and holding them
#: back would keep topics on a broker that is leaving or gone.
LIMITED_KINDS = frozenset({MoveKind.AUTO, MoveKind.MANUAL})


class HistoryIndex:
    def __init__(self, history: Sequence[MoveRecord]) -> None:
        self.records = sorted(history, key=lambda r: (r.started_at, r.move_id))
        self.by_topic: dict[str, list[MoveRecord]] = {}
        for record in self.records:
            self.by_topic.setdefault(record.topic, []).append(record)

    def moves_in_last_hour(self, now: float, kinds: Iterable[MoveKind] = LIMITED_KINDS) -> int:
        wanted = set(kinds)
        # A move dated after ``now`` counts: an earlier leader's clock ran ahead of ours, and
        # leaving it out would let the new leader exceed the limit within the real hour.
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
