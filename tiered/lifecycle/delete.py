"""Topic delete: a loss path by definition, so a tombstone first, then everything else.

Precondition (checked, in one compare-and-swap): the topic has **no live owner** other
than the caller. Its owner record is absent, released (sealed), held by the broker
``broker_id`` that asks (which no longer runs the topic: :meth:`BrokerHost.delete` seals
or abandons it first), or held by a broker that is no longer registered (dead; its
unarchived tail goes with the topic). A topic held by another live broker is refused
with :class:`~tiered.lifecycle.ownership.TopicOwnedElsewhere` and nothing is written.

Steps, each safe to crash after (:data:`STEPS`):

1. ``tombstone``: one transaction, guarded by the owner record's revision, the
   holder staying unregistered and the tombstone being as read, that writes the
   :class:`~tiered.metadata.keys.TopicTombstone` (phase ``deleting``, the last epoch
   and the next offset) and rewrites the owner record as *released* at the same epoch.
   From then on every stale writer (a zombie owner, an in-flight cursor write, a load
   manager move planned earlier) fails its fencing compare, and loads, produces, reads,
   subscriptions and cursor writes refuse with :class:`~tiered.errors.TopicDeleted`.
2. ``cursors``: everything under ``/topics/<ns>/<topic>/`` (cursors, delivery).
3. ``cluster records``: the load manager's placement, unassigned and assignment records
   of the topic (the load manager never deletes data itself; a record it writes again
   from a stale view only makes a broker try a load, which the tombstone refuses).
4. ``descriptors``: every descriptor, page by page.
5. ``objects``: every object under the topic's object prefix, listed (so orphans that no
   descriptor named, and objects whose descriptor step 4 already removed, go too).
6. ``progress``, 7. ``lost ranges``, 8. ``archive start`` (archive retention's record), 9. ``state``.
10. ``deleted``: the tombstone moves to phase ``deleted`` (compare-and-swap).

Every step after the tombstone deletes only while that tombstone is still the one this
run works under (phase ``deleting``, the same record): each metadata delete is a
transaction that compares it, and each batch of objects is deleted only after it was
checked, which comes after the batch was listed (a topic created again under the name
writes objects only once the tombstone moved on). A run that finds the tombstone changed
(another run finished the delete, and maybe the name was created again) stops at once
with outcome ``already_deleted``: a slow or stalled run never deletes what came after.

The tombstone and the released owner record stay: they carry the epoch and the next
offset a topic created again under this name continues from (see
:func:`recreate_compares` and docs/LIFECYCLE.md, "Delete"). A crash at any step leaves
phase ``deleting``: every access is still refused, and running the delete again finishes
it (the steps are idempotent). Deleting a deleted topic, or one that never existed, is a
no-op that says which.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from native.errors import DnbError
from native.format import MAX_OFFSET
from tiered.archive.chain import DescriptorChain
from tiered.archive.naming import topic_objects_prefix
from tiered.archive.start import incarnation_first_offset
from tiered.errors import MalformedRecord, TopicDeleted
from tiered.lifecycle.ownership import (
    OwnerRecord,
    OwnershipConflict,
    TopicOwnedElsewhere,
    is_broker_registered,
    read_owner,
)
from tiered.lifecycle.restore import read_progress, read_sealed_state
from tiered.metadata import keys
from tiered.metadata.base import Compare, Delete, MetadataStore, Put, absent, mod_revision_is, value_is
from tiered.objects.base import DELETE_MANY_MAX, ObjectStore
from wal.topics import TopicName

log = logging.getLogger(__name__)

#: The delete's steps in order (a crash-injection hook and the progress callback name them).
STEPS = ("tombstone", "cursors", "cluster records", "descriptors", "objects", "progress", "lost ranges",
         "archive start", "state", "deleted")
#: Keys (or objects) handled per round trip when the delete walks a prefix.
DELETE_PAGE = 500
#: Keys deleted per transaction (each compares the tombstone): below etcd's default limit
#: of 128 operations in one transaction (``--max-txn-ops``).
TXN_DELETES = 100
#: How often the tombstone transaction is retried when a record changed under it.
TOMBSTONE_ATTEMPTS = 5

#: What a delete found: ``deleted`` (this call deleted it), ``resumed`` (it finished a
#: delete a crash interrupted), ``already_deleted``, ``not_found`` (no trace of the topic).
OUTCOMES = ("deleted", "resumed", "already_deleted", "not_found")


@dataclass
class DeleteReport:
    topic: TopicName
    outcome: str
    epoch: int = 0
    next_offset: int = 0
    removed: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"topic": str(self.topic), "outcome": self.outcome, "epoch": self.epoch,
                "next_offset": self.next_offset, "removed": dict(self.removed)}


def check_not_deleted(metadata: MetadataStore, topic: TopicName) -> keys.TopicTombstone | None:
    """Raise :class:`TopicDeleted` if ``topic`` has a tombstone that blocks it; returns
    the tombstone otherwise (None, or one of phase ``recreated``)."""
    tomb, _raw = keys.read_tombstone(metadata, topic)
    if tomb is not None and tomb.blocks:
        raise TopicDeleted(topic, tomb.phase, tomb.next_offset)
    return tomb


def tombstone_compare(metadata: MetadataStore, topic: TopicName) -> list[Compare]:
    """A compare that holds while the tombstone stays as it is now (absent or recreated),
    raising :class:`TopicDeleted` at once when it already blocks the topic. Writers that
    may create or change a topic's records (a load, a cursor write on an unowned topic)
    add it to their transaction, so they cannot land after a delete's tombstone."""
    tomb, raw = keys.read_tombstone(metadata, topic)
    if tomb is not None and tomb.blocks:
        raise TopicDeleted(topic, tomb.phase, tomb.next_offset)
    return [absent(keys.tombstone_key(topic))] if raw is None else [value_is(keys.tombstone_key(topic), raw)]


def recreate_compares(metadata: MetadataStore, topic: TopicName) -> tuple[list[Compare], list[Put], int]:
    """(compares, ops, first offset) for taking ownership of a topic whose name was deleted.

    Only an explicit create calls this: the tombstone must be in phase ``deleted`` (a
    delete still ``deleting`` is refused with :class:`TopicDeleted`; run the delete
    again). The ops move it to ``recreated`` in the same transaction that takes
    ownership at the released owner record's epoch + 1 (never below the deleted
    incarnation's), and the new incarnation numbers from the tombstone's ``next_offset``."""
    tomb, raw = keys.read_tombstone(metadata, topic)
    if tomb is None or raw is None:
        return [absent(keys.tombstone_key(topic))], [], 0
    if tomb.phase == "recreated":
        return [value_is(keys.tombstone_key(topic), raw)], [], tomb.next_offset
    if tomb.phase != "deleted":
        raise TopicDeleted(topic, tomb.phase, tomb.next_offset)
    recreated = keys.TopicTombstone("recreated", tomb.epoch, tomb.next_offset, tomb.deleted_by, tomb.deleted_at,
                                    time.time())
    return ([value_is(keys.tombstone_key(topic), raw)], [Put(keys.tombstone_key(topic), recreated.to_json())],
            tomb.next_offset)


def topic_exists(metadata: MetadataStore, topic: TopicName) -> bool:
    """True when the topic was created (an owner record) and is not deleted."""
    tomb, _raw = keys.read_tombstone(metadata, topic)
    if tomb is not None and tomb.blocks:
        return False
    return metadata.get(keys.owner_key(topic)) is not None


def delete_topic(metadata: MetadataStore, objects: ObjectStore, topic: TopicName | str, *, broker_id: str,
                 on_step: Callable[[str, int], None] | None = None,
                 fault_hook: Callable[[str], None] | None = None) -> DeleteReport:
    """Delete ``topic`` (see the module docstring for the precondition and the steps).

    ``broker_id`` is who asks: a topic still held by that broker is deleted only because
    the caller no longer runs it (a :class:`BrokerHost` seals or abandons it first).
    ``on_step(step, count)`` is told when each step is done, with how many keys or
    objects it removed; ``fault_hook(step)`` runs after each step (tests inject crashes
    there). Idempotent and resumable: returns a :class:`DeleteReport` whose ``outcome``
    says what this call found."""
    topic = TopicName.parse(topic)
    keys.broker_assignments_prefix(broker_id)  # validates the id
    tomb, raw = keys.read_tombstone(metadata, topic)
    if tomb is not None and tomb.phase == "deleted":
        return DeleteReport(topic, "already_deleted", tomb.epoch, tomb.next_offset)
    report = DeleteReport(topic, "resumed")
    if tomb is None or raw is None or tomb.phase == "recreated":
        if tomb is None and not _any_trace(metadata, objects, topic):
            return DeleteReport(topic, "not_found")
        tomb, raw = _write_tombstone(metadata, topic, broker_id)
        report.outcome = "deleted"
    report.epoch, report.next_offset = tomb.epoch, tomb.next_offset
    run = _Run(metadata, objects, topic, tomb, raw)

    def done(step: str, count: int) -> None:
        report.removed[step] = count
        if on_step is not None:
            on_step(step, count)
        if fault_hook is not None:
            fault_hook(step)

    try:
        done("tombstone", 1 if report.outcome == "deleted" else 0)
        done("cursors", run.delete_paged(keys.topic_prefix(topic)))
        done("cluster records", run.delete_keys(_cluster_record_keys(metadata, topic)))
        done("descriptors", run.delete_paged(keys.objects_prefix(topic)))
        done("objects", run.delete_objects())
        done("progress", run.delete_keys([keys.progress_key(topic)]))
        done("lost ranges", run.delete_paged(keys.lost_prefix(topic)))
        # After the descriptors: while any is left, the start still tells readers (and the
        # retention of an owner, were there one) where the retained chain begins.
        done("archive start", run.delete_keys([keys.archive_start_key(topic)]))
        done("state", run.delete_keys([keys.state_key(topic)]))
        run.mark_deleted()
    except _Superseded as e:
        log.warning("topic %s: delete by broker %s stopped: its tombstone changed under it (%s); "
                    "another run finished the delete", topic, broker_id, e)
        report.outcome = "already_deleted"
        return report
    done("deleted", 1)
    log.warning("topic %s: deleted by broker %s (epoch %d, next offset %d; %s)", topic, broker_id, report.epoch,
                report.next_offset, ", ".join(f"{k}: {v}" for k, v in report.removed.items()))
    return report


def _any_trace(metadata: MetadataStore, objects: ObjectStore, topic: TopicName) -> bool:
    for prefix in (keys.storage_prefix(topic), keys.topic_prefix(topic)):
        if metadata.range(prefix, limit=1):
            return True
    if metadata.get(keys.placement_key(topic)) or metadata.get(keys.unassigned_key(topic)):
        return True
    return next(iter(objects.list(topic_objects_prefix(topic))), None) is not None


def _next_offset(metadata: MetadataStore, topic: TopicName, epoch_first: int) -> int:
    """The first offset the deleted incarnation never used as far as metadata knows: past
    the seal, the last descriptor, the last published durable tip and every lost range.
    A dead (or zombie) owner's ``durable`` acks past its last published tip are not known
    here, so a re-created topic may number them again: the same bound a failover has
    (docs/SAFETY.md). The tombstone txn compares the records read here
    (:func:`_tip_compares`), so a write landing in between makes it read again."""
    candidates = [epoch_first, DescriptorChain(metadata, topic).next_offset()]
    sealed = read_sealed_state(metadata, topic)
    if sealed is not None:
        candidates.append(sealed.next_offset)
    progress = read_progress(metadata, topic)
    if progress is not None and progress.durable_offset is not None:
        candidates.append(progress.durable_offset + 1)
    for lost in keys.read_lost_ranges(metadata, topic):
        candidates.append(lost.start_offset if lost.end_offset is None else lost.end_offset + 1)
    return max(candidates)


def _tip_compares(metadata: MetadataStore, topic: TopicName, first: int) -> list[Compare]:
    """Compares that hold while the records :func:`_next_offset` reads stay as they are:
    the progress and state records unchanged, and no descriptor at the offsets where the
    next one would begin (the chain's end, or with an empty chain the state's and the
    incarnation's first offset)."""
    out: list[Compare] = []
    for key in (keys.progress_key(topic), keys.state_key(topic)):
        kv = metadata.get(key)
        out.append(absent(key) if kv is None else value_is(key, kv.value))
    last = DescriptorChain(metadata, topic).last()
    if last is not None:
        starts = {last.end_offset + 1}
    else:
        sealed = read_sealed_state(metadata, topic)
        starts = {first, 0} | ({sealed.next_offset} if sealed is not None else set())
    # No descriptor can begin past MAX_OFFSET (a full topic's next offset): nothing to compare.
    out.extend(absent(keys.descriptor_key(topic, start)) for start in sorted(starts) if start <= MAX_OFFSET)
    return out


def _write_tombstone(metadata: MetadataStore, topic: TopicName, broker_id: str
                     ) -> tuple[keys.TopicTombstone, bytes]:
    """Write the tombstone (or find the one a concurrent delete wrote): it and its bytes."""
    for _attempt in range(TOMBSTONE_ATTEMPTS):
        tomb, raw = keys.read_tombstone(metadata, topic)
        if tomb is not None and raw is not None and tomb.blocks:
            return tomb, raw  # a concurrent delete wrote it first: finish that one
        owner, kv = read_owner(metadata, topic)
        compares: list[Compare] = [absent(keys.owner_key(topic)) if kv is None
                                   else mod_revision_is(kv.key, kv.mod_revision)]
        compares.append(absent(keys.tombstone_key(topic)) if raw is None
                        else value_is(keys.tombstone_key(topic), raw))
        ops: list[Put] = []
        holder = owner.holder if owner is not None else None
        if holder is not None and holder != broker_id:
            if is_broker_registered(metadata, holder):
                raise TopicOwnedElsewhere(topic, holder, owner.epoch)  # type: ignore[union-attr]
            compares.append(absent(keys.registered_key(holder)))  # dead: only while it stays dead
        epoch = owner.epoch if owner is not None else 0
        if owner is not None:
            released = OwnerRecord(owner.broker_id, owner.epoch, owner.acquired_at, time.time(),
                                   owner.previous_broker_id)
            ops.append(Put(keys.owner_key(topic), released.encode()))
        first = incarnation_first_offset(metadata, topic)
        # The next offset is read from the chain, the state and the progress record: a
        # zombie holder committing a descriptor or publishing progress between those reads
        # and this txn makes it fail (and the next attempt reads again), so the tombstone
        # never lands below something metadata knew when it was written.
        compares.extend(_tip_compares(metadata, topic, first))
        new = keys.TopicTombstone("deleting", epoch, _next_offset(metadata, topic, first), broker_id, time.time())
        written = new.to_json()
        ops.append(Put(keys.tombstone_key(topic), written))
        if metadata.txn(compares, ops).succeeded:
            log.warning("topic %s: delete begun by broker %s: tombstone written (epoch %d, next offset %d)",
                        topic, broker_id, new.epoch, new.next_offset)
            return new, written
    raise OwnershipConflict(topic, f"its owner record kept changing during {TOMBSTONE_ATTEMPTS} delete attempts")


def _cluster_record_keys(metadata: MetadataStore, topic: TopicName) -> list[str]:
    return [keys.placement_key(topic), keys.unassigned_key(topic),
            *(keys.assignment_key(broker, topic) for broker in keys.topic_assignments(metadata, topic))]


class _Superseded(DnbError):
    """The tombstone a delete run works under is not there any more (see the module
    docstring). Internal: ``delete_topic`` turns it into the outcome ``already_deleted``."""


class _Run:
    """One delete run's steps, each done only while its tombstone stays as it found it."""

    def __init__(self, metadata: MetadataStore, objects: ObjectStore, topic: TopicName,
                 tomb: keys.TopicTombstone, raw: bytes) -> None:
        self.metadata, self.objects, self.topic = metadata, objects, topic
        self.tomb, self.raw = tomb, raw
        self._unchanged = value_is(keys.tombstone_key(topic), raw)

    def check(self) -> None:
        """_Superseded unless the tombstone is still the one this run works under."""
        kv = self.metadata.get(keys.tombstone_key(self.topic))
        if kv is None or kv.value != self.raw:
            raise _Superseded("now " + ("absent" if kv is None else kv.value.decode(errors="replace")))

    def delete_keys(self, names: list[str]) -> int:
        """Delete ``names`` in transactions that each compare the tombstone; how many existed."""
        removed = 0
        for at in range(0, len(names), TXN_DELETES):
            result = self.metadata.txn([self._unchanged], [Delete(k) for k in names[at:at + TXN_DELETES]])
            if not result.succeeded:
                self.check()  # raises: the compare failed because the tombstone changed
                raise _Superseded("a delete transaction's compare failed")
            removed += sum(1 for deleted in result.responses if deleted is True)
        return removed

    def delete_paged(self, prefix: str) -> int:
        removed = 0
        while page := self.metadata.range(prefix, limit=DELETE_PAGE):
            removed += self.delete_keys([kv.key for kv in page])
        return removed

    def delete_objects(self) -> int:
        """Every object under the topic's prefix, in batches, each deleted only after the
        tombstone was checked unchanged. That check comes after the batch's keys were
        listed, so none of them can be a later incarnation's: it starts only when the
        tombstone moves on (``recreated``), and writes objects only after that. Passes
        over the listing until one finds nothing (objects a stale writer put meanwhile go
        too)."""
        removed = 0
        page = min(DELETE_PAGE, DELETE_MANY_MAX)
        while True:
            batch: list[str] = []
            this_pass = 0
            for info in self.objects.list(topic_objects_prefix(self.topic)):
                batch.append(info.key)
                if len(batch) >= page:
                    this_pass += self._delete_batch(batch)
                    batch = []
            if batch:
                this_pass += self._delete_batch(batch)
            removed += this_pass
            if not this_pass:
                return removed

    def _delete_batch(self, batch: list[str]) -> int:
        self.check()  # after listing them: see delete_objects
        self.objects.delete_many(batch)
        return len(batch)

    def mark_deleted(self) -> None:
        """The tombstone moves to phase ``deleted`` (only from the record this run works under)."""
        tomb = self.tomb
        done = keys.TopicTombstone("deleted", tomb.epoch, tomb.next_offset, tomb.deleted_by, tomb.deleted_at)
        if not self.metadata.txn([self._unchanged], [Put(keys.tombstone_key(self.topic), done.to_json())]).succeeded:
            self.check()
            raise _Superseded("the move to phase deleted failed its compare")


# -- listing -----------------------------------------------------------------------

#: Keys read per page when listing topics.
LIST_PAGE = 500


@dataclass
class TopicSummary:
    """One row of :func:`list_topics`. ``status``: ``owned`` (``owner`` holds it; ``live``
    says whether that broker is registered), ``sealed``, ``open`` (unsealed, nobody holds
    it: a failover is due), ``deleting``, ``deleted``, ``new`` (owned once, no state) or
    ``malformed`` (one of its owner, state or tombstone records does not parse: ``error``
    says which; listed, never hidden, even without ``include_deleted``)."""

    topic: str
    status: str
    owner: str | None = None
    live: bool | None = None
    epoch: int | None = None
    first_offset: int | None = None
    last_offset: int | None = None
    archived_objects: int = 0
    archived_bytes: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "topic": self.topic, "status": self.status, "owner": self.owner, "live": self.live,
            "epoch": self.epoch, "first_offset": self.first_offset, "last_offset": self.last_offset,
            "archived_objects": self.archived_objects, "archived_bytes": self.archived_bytes}
        if self.error is not None:
            out["error"] = self.error
        return out


def list_topics(metadata: MetadataStore, *, include_deleted: bool = False,
                page_keys: int = LIST_PAGE) -> list[TopicSummary]:
    """Every topic under ``/storage/topics/``, read ``page_keys`` keys at a time (never one
    range of the whole prefix), with its state, owner, archived offset range and bytes.
    Deleted topics (tombstone phase ``deleted``) only with ``include_deleted``."""
    rows: dict[str, TopicSummary] = {}
    raw: dict[str, dict[str, bytes]] = {}
    after: str | None = None
    while True:
        page = metadata.range(keys.STORAGE_TOPICS_PREFIX, limit=page_keys, start_after=after)
        if not page:
            break
        for kv in page:
            rest = kv.key[len(keys.STORAGE_TOPICS_PREFIX):]
            parts = rest.split("/", 3)
            if len(parts) < 3:
                continue
            name = f"/{parts[0]}/{parts[1]}"
            row = rows.setdefault(name, TopicSummary(name, "new"))
            if parts[2] == "objects" and len(parts) == 4:
                try:
                    d = keys.ObjectDescriptor.from_json(kv.key, kv.value)
                except MalformedRecord as e:
                    row.error = row.error or str(e)
                    continue
                row.archived_objects += 1
                row.archived_bytes += d.size
                row.first_offset = d.start_offset if row.first_offset is None else row.first_offset
                row.last_offset = d.end_offset
            elif parts[2] in ("owner", "state", "tombstone") and len(parts) == 3:
                raw.setdefault(name, {})[parts[2]] = kv.value
        after = page[-1].key
        if len(page) < page_keys:
            break
    out = []
    for name, row in rows.items():
        records = raw.get(name, {})
        try:
            _describe(metadata, row, records)
        except (MalformedRecord, ValueError) as e:
            row.error = str(e)
        if row.error is not None:
            # One damaged record must not hide every other topic: this row says so, and
            # the topic itself stays refused (loads, deletes, creates fail closed on it).
            row.status, row.owner, row.live = "malformed", None, None
            out.append(row)
            continue
        if row.status != "deleted" or include_deleted:
            out.append(row)
    return out


def _describe(metadata: MetadataStore, row: TopicSummary, records: dict[str, bytes]) -> None:
    topic = TopicName.parse(row.topic)
    if "owner" in records:
        owner = OwnerRecord.decode(keys.owner_key(topic), records["owner"])
        row.epoch = owner.epoch
        if owner.holder is not None:
            row.status, row.owner = "owned", owner.holder
            row.live = is_broker_registered(metadata, owner.holder)
    if "state" in records and row.status != "owned":
        state = keys.SealedState.from_json(keys.state_key(topic), records["state"])
        row.status = "sealed" if state.sealed else "open"
        if row.last_offset is None and state.last_committed_offset is not None:
            row.last_offset = state.last_committed_offset
    if "tombstone" in records:
        tomb = keys.TopicTombstone.from_json(keys.tombstone_key(topic), records["tombstone"])
        if tomb.blocks:
            row.status, row.owner, row.live = tomb.phase, None, None
