"""The oracle: what the topic must contain, given what producers were told.

Every append gets a unique payload, so "offset X holds payload P" is an exact fact to
check. Offsets enter the model when appended (``pending``: not yet acknowledged) and
become facts once acknowledged as durable or observed by a reader. The only way a
fact may disappear is a takeover from a crashed owner, for offsets past the archive's
end (the "unarchived tail", which the lifecycle must report exactly); such offsets may
then be reassigned to new messages, and every subscription cursor past the archive's
end moves back to it (the lifecycle's clamp).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from native.errors import DnbError


class Violation(DnbError, AssertionError):
    """The first invariant a scenario broke; ``invariant`` is its stable name."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


def check(condition: bool, invariant: str, detail: str) -> None:
    if not condition:
        raise Violation(invariant, detail)


@dataclass
class SubscriptionModel:
    next_expected: int = 0  # cursor + 1
    #: Payloads this subscription read and acknowledged: each message exactly once.
    acked_payloads: set[bytes] = field(default_factory=set)


@dataclass
class TopicModel:
    facts: dict[int, bytes] = field(default_factory=dict)
    pending: dict[int, bytes] = field(default_factory=dict)
    durable_acked: set[int] = field(default_factory=set)
    archived_acked: set[int] = field(default_factory=set)
    subscriptions: dict[str, SubscriptionModel] = field(default_factory=dict)
    #: (first, last) offsets of facts a takeover reassigned (each inside a reported range).
    lost_tails: list[tuple[int, int]] = field(default_factory=list)
    payload_counter: int = 0
    #: Where this incarnation's numbering began (a re-created topic: the tombstone's next offset).
    incarnation_first: int = 0
    #: The first offset still readable: max(archive retention's cut, incarnation_first).
    start: int = 0
    #: payload -> offset of every message of a deleted incarnation of the name.
    retired: dict[bytes, int] = field(default_factory=dict)

    def new_sub(self) -> SubscriptionModel:
        """A subscription created now with "earliest" pins at the first readable offset."""
        return SubscriptionModel(next_expected=self.start)

    def next_incarnation(self, first: int) -> "TopicModel":
        """The model of the topic re-created under the name, numbering from ``first``."""
        retired = dict(self.retired)
        retired.update({p: o for o, p in self.facts.items()})
        retired.update({p: o for o, p in self.pending.items()})
        return TopicModel(payload_counter=self.payload_counter, incarnation_first=first, start=first,
                          retired=retired)

    def cut(self, new_start: int) -> None:
        """Archive retention raised the start: offsets below it are gone by decision."""
        check(new_start >= self.start, "retention-bounded",
              f"the archive start went back from {self.start} to {new_start}")
        self.start = new_start

    def next_payload(self, seed: int) -> bytes:
        self.payload_counter += 1
        return f"seed{seed}-m{self.payload_counter}".encode()

    def appended(self, offset: int, payload: bytes) -> None:
        check(offset not in self.facts, "unique-offsets",
              f"offset {offset} was handed out again while it still names {self.facts.get(offset)!r}")
        self.pending[offset] = payload

    def acked(self, offset: int, level: str) -> None:
        payload = self.pending.pop(offset, None)
        if payload is not None:
            self.facts[offset] = payload
        check(offset in self.facts, "durable-readable", f"acked offset {offset} is unknown to the model")
        self.durable_acked.add(offset)
        if level == "archived":
            self.archived_acked.add(offset)

    def observed(self, offset: int, payload: bytes, where: str) -> None:
        """A reader served ``offset``: it must name the one message the model knows."""
        check(payload not in self.retired, "incarnation-isolation",
              f"{where}: offset {offset} serves {payload!r}, a message of a deleted incarnation "
              f"(it was at offset {self.retired.get(payload)})")
        check(offset >= self.start, "retention-bounded",
              f"{where}: offset {offset} was served, below the archive start {self.start}")
        if offset in self.facts:
            check(self.facts[offset] == payload, "unique-offsets",
                  f"{where}: offset {offset} holds {payload!r}, but it was {self.facts[offset]!r}")
            return
        expected = self.pending.pop(offset, None)
        check(expected is not None, "unique-offsets", f"{where}: offset {offset} holds unknown message {payload!r}")
        check(expected == payload, "unique-offsets",
              f"{where}: offset {offset} holds {payload!r}, but {expected!r} was appended there")
        self.facts[offset] = payload

    def top(self) -> int:
        """One past the highest offset the model knows as a fact (at least where this
        incarnation's numbering began)."""
        return max(max(self.facts, default=-1) + 1, self.incarnation_first)

    def forget_unsynced(self, next_offset: int) -> None:
        """After a power loss: unacknowledged appends at or past the WAL's new tip are gone."""
        for offset in [o for o in self.pending if o >= next_offset]:
            del self.pending[offset]

    def reassign_tail(self, first_lost: int, archive_end: int | None) -> list[int]:
        """A takeover that restarts numbering at ``first_lost`` (past the archive end, or the
        incarnation's first offset when nothing is archived): later facts are lost;
        returns them."""
        lost = sorted(o for o in self.facts if o >= first_lost)
        check(not (set(lost) & self.archived_acked), "archived-never-lost",
              f"offsets {sorted(set(lost) & self.archived_acked)} were acknowledged as archived but are "
              f"past the archive end {archive_end}")
        for offset in lost:
            del self.facts[offset]
            self.durable_acked.discard(offset)
        self.pending = {o: p for o, p in self.pending.items() if o < first_lost}
        if lost:
            self.lost_tails.append((lost[0], lost[-1]))
        for sub in self.subscriptions.values():
            # The new owner clamps every cursor past the archive back to its end.
            sub.next_expected = min(sub.next_expected, first_lost)
        return lost
