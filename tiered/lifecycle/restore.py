"""Where a topic's offsets continue when a broker loads it (restore).

After this broker has taken ownership (so nobody else can change the state, the
descriptors or the progress key any more), :func:`plan_restore` reads them and decides:

* ``sealed: true`` (a clean unload): start at ``last_committed_offset + 1`` (0 when it
  is null: an empty topic must not start at 1). The last descriptor must end exactly
  at the sealed offset; a disagreement raises :class:`RestoreMismatch`.
* not sealed (the previous owner crashed, or it is the first load): start after the
  last committed descriptor, never on an offset any descriptor covers. The dead
  owner's published durable tip (:class:`Progress`, only when it is that owner's and
  epoch's) tells how many offsets it never archived ("at least N": the tip is published
  at most once per interval). The exact range comes later, from the dead owner itself
  when it returns and quarantines its WAL (:class:`tiered.metadata.keys.LostRange`).
* the previous owner was this very broker and the topic was not sealed since: its
  local WAL is recovered instead, provided it still reaches the archive (no gap).

The planner is pure given what it read; :class:`BrokerHost` acts on the plan.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from collections.abc import Iterable

from native.format import MAX_OFFSET
from tiered.archive.chain import DescriptorChain
from tiered.archive.start import archive_cut, archive_start, incarnation_first_offset
from tiered.errors import MalformedRecord, MetadataError
from tiered.metadata import keys
from tiered.metadata.base import MetadataStore
from tiered.metadata.keys import progress_key
from tiered.lifecycle.ownership import OwnerRecord, OwnerToken
from wal.topics import TopicName


class RestoreMismatch(MetadataError):
    """The sealed state and the descriptor chain disagree about where the topic ends."""

    def __init__(self, topic: TopicName, sealed_offset: int | None, descriptor_end: int | None) -> None:
        super().__init__(
            f"topic {topic}: sealed at last_committed_offset={sealed_offset} but the last "
            f"committed descriptor ends at {descriptor_end}; refusing to guess where offsets continue"
        )
        self.topic = topic
        self.sealed_offset = sealed_offset
        self.descriptor_end = descriptor_end


class BrokenChain(MetadataError):
    """The descriptor chain has a gap or an overlap: offsets would be served twice or
    never, and where the topic continues is not known. Restore refuses to continue on
    it (``dnb verify`` names the descriptors); repairing it is an operator's decision."""

    def __init__(self, topic: TopicName, detail: str) -> None:
        super().__init__(f"topic {topic}: descriptor chain is broken ({detail}); refusing to restore on it")
        self.topic = topic


def checked_chain_end(metadata: MetadataStore, topic: TopicName) -> int | None:
    """End offset of the descriptor chain after checking that it runs from the topic's first
    offset (:func:`tiered.archive.start.archive_start`: 0, where a re-created topic's
    incarnation starts, or where archive retention cut) with no gap or overlap.

    Descriptors wholly below the start are an interrupted retention cut's leftovers
    (pending deletion) and are not judged; the first one at or above the start must begin
    exactly at it. Retention never removes the last descriptor, so a start that retention
    raised always has one at or above it (none is a broken chain: where the topic ends is
    unknown). A re-created topic that has not archived anything yet has none either: its
    start is its incarnation's first offset, not a cut."""
    cut, first = archive_cut(metadata, topic), incarnation_first_offset(metadata, topic)
    start = max(cut, first)  # what archive_start() says, each record read once
    expected = start
    seen = False
    for d in DescriptorChain(metadata, topic).all():  # every record decoded before any is judged
        if d.end_offset < start:
            continue
        seen = True
        if d.start_offset != expected:
            kind = "gap" if d.start_offset > expected else "overlap"
            before = (f"one ending at {expected - 1}" if expected != start
                      else f"the archive start {start}")
            raise BrokenChain(topic, f"{kind}: descriptor {d.start_offset}-{d.end_offset} follows {before}")
        expected = d.end_offset + 1
    if not seen:
        if cut > first:
            raise BrokenChain(topic, f"the archive starts at {start} but no descriptor reaches it")
        return None
    return expected - 1


@dataclass(frozen=True, slots=True)
class Progress:
    """``durable_offset`` = highest offset the owner had fsynced (None: nothing yet)."""

    broker_id: str
    epoch: int
    durable_offset: int | None
    timestamp: float

    def encode(self) -> bytes:
        body = {"broker_id": self.broker_id, "epoch": self.epoch,
                "durable_offset": self.durable_offset, "timestamp": self.timestamp}
        return keys.encode_json(body)

    @classmethod
    def decode(cls, key: str, raw: bytes) -> "Progress":
        try:
            body = json.loads(raw)
            durable = body["durable_offset"]
            record = cls(str(body["broker_id"]), int(body["epoch"]),
                         None if durable is None else int(durable), float(body["timestamp"]))
            if record.durable_offset is not None and not -1 <= record.durable_offset <= MAX_OFFSET:
                raise ValueError(f"durable_offset {record.durable_offset} is outside [-1, {MAX_OFFSET}]")
            return record
        except (ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: nested too deep
            raise MalformedRecord(key, f"progress record: {e!r}") from e


@dataclass(frozen=True, slots=True)
class RestorePlan:
    start_offset: int
    #: End of the last committed descriptor (None: nothing archived).
    descriptor_end: int | None
    sealed: keys.SealedState | None
    #: The previous owner was this broker and the topic was not sealed since.
    may_recover_local: bool
    #: Unsealed only: offsets the previous owner made durable but never archived (a lower
    #: bound). Lost unless this broker recovers its own local WAL.
    unarchived_at_least: int
    previous_owner: str | None
    #: The last durable tip an owner published (None: none), read with the plan.
    progress: Progress | None = None

    @property
    def is_sealed(self) -> bool:
        """The topic was sealed (cleanly unloaded) when the plan was read."""
        return _is_sealed(self.sealed)

    @property
    def committed_through(self) -> int | None:
        """The uploader's checkpoint: everything below ``start_offset`` is archived."""
        return None if self.start_offset == 0 else self.start_offset - 1


def read_sealed_state(metadata: MetadataStore, topic: TopicName) -> keys.SealedState | None:
    kv = metadata.get(keys.state_key(topic))
    return None if kv is None else keys.SealedState.from_json(kv.key, kv.value)


def read_progress(metadata: MetadataStore, topic: TopicName) -> Progress | None:
    kv = metadata.get(progress_key(topic))
    return None if kv is None else Progress.decode(kv.key, kv.value)


def plan_restore(metadata: MetadataStore, token: OwnerToken) -> RestorePlan:
    topic = token.topic
    sealed = read_sealed_state(metadata, topic)
    descriptor_end = checked_chain_end(metadata, topic)
    archive_next = archive_start(metadata, topic) if descriptor_end is None else descriptor_end + 1
    previous = token.previous
    previous_owner = previous.broker_id if previous is not None else None
    if _is_sealed(sealed):
        assert sealed is not None
        if sealed.next_offset != archive_next:
            raise RestoreMismatch(topic, sealed.last_committed_offset, descriptor_end)
        mine = previous_owner == token.broker_id and sealed.broker_id == token.broker_id
        return RestorePlan(archive_next, descriptor_end, sealed, mine, 0, previous_owner)
    opened_at = 0 if sealed is None else sealed.next_offset
    start = max(opened_at, archive_next)
    mine = previous is not None and previous.holder == token.broker_id
    progress = read_progress(metadata, topic)
    unarchived = 0 if previous is None else unarchived_by(progress, previous.broker_id, previous.epoch, start)
    return RestorePlan(start, descriptor_end, sealed, mine, unarchived, previous_owner, progress)


def _is_sealed(state: keys.SealedState | None) -> bool:
    return state is not None and state.sealed


def unarchived_by(progress: Progress | None, broker_id: str, epoch: int, start: int,
                  recorded: Iterable[tuple[str, int]] | None = None) -> int:
    """Offsets from ``start`` on that owner ``(broker_id, epoch)`` published as durable
    (a lower bound of what its WAL held past the archive; 0 when it published nothing).

    The record may be of an EARLIER epoch of the same broker: its own re-acquires (a
    restart's reload) bump the epoch, and one that crashed or failed before its first
    publish left the older record. It still counts when no LostRange (``recorded``:
    ``(broker_id, epoch)`` pairs) names this broker at an epoch from the record's up to
    ``epoch``: every takeover by another broker records the history it takes over, so then
    every epoch in between was this broker's own, continuing the history the record
    describes. Otherwise (or without ``recorded``) only the exact epoch counts: a takeover
    does not delete the progress key, so it may be an earlier dead owner's, and counting
    it would blame the wrong WAL for offsets it never held, or count them twice."""
    if progress is None or progress.durable_offset is None:
        return 0
    if progress.broker_id != broker_id or progress.epoch > epoch:
        return 0
    if progress.epoch < epoch:
        if recorded is None or any(b == broker_id and progress.epoch <= e < epoch for b, e in recorded):
            return 0
    return max(0, progress.durable_offset + 1 - start)


def opened_state(token: OwnerToken, plan: RestorePlan, wal_id: bytes | None = None) -> keys.SealedState:
    """The state a new owner writes at load: not sealed, continuing after the archive,
    naming the WAL (``wal_id``) this epoch writes.

    Without it a later crash of this owner would leave the previous owner's
    ``sealed: true`` in place while descriptors run past it (a false mismatch)."""
    return keys.SealedState(False, plan.committed_through, token.broker_id, time.time(), token.epoch,
                            None if wal_id is None else wal_id.hex())


def sealed_state(token: OwnerToken, last_committed_offset: int | None) -> keys.SealedState:
    return keys.SealedState(True, last_committed_offset, token.broker_id, time.time(), token.epoch)
