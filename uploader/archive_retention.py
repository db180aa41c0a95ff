"""Archive retention: the topic's owner removes the oldest archived objects.

A *cut* removes a prefix of the descriptor chain in three steps, each safe to stop after:

1. **raise the start** (:func:`tiered.archive.start.read_archive_start`): one metadata
   transaction writes ``keys.ArchiveStart(first_offset=new_start)``, conditioned on the
   owner record (the same fencing compares as a descriptor commit), on the start record
   being the one read (``mod_revision``, or absent), and on the descriptor that starts at
   ``new_start`` still being there (so the start is always a descriptor boundary);
2. **delete the descriptors** wholly below the start, in fenced transactions of at most
   :data:`DELETE_BATCH_MAX` deletes (etcd limits the operations of one transaction), each
   also conditioned on the start record being the one just written or read (a descriptor
   is never deleted unless a start at or above its end is in place);
3. **delete their objects** (only the objects of descriptors this run deleted; a missing
   object is fine: the step is idempotent), in batch requests of at most
   :data:`OBJECT_DELETE_BATCH_MAX` keys (``ObjectStore.delete_many``: one S3
   ``DeleteObjects`` each). :meth:`ArchiveRetention.cut` does steps 1-2 and returns the
   objects pending; :meth:`ArchiveRetention.delete_objects` does step 3. The uploader
   runs step 3 OUTSIDE its pass lock, on a thread of its own: once their descriptors are
   gone (under fencing) the objects are orphans nothing references, so deleting them
   needs no lock, and an ``ack="archived"`` producer never waits on it.

A crash or a lost reply between steps leaves a state every reader explains: after (1)
readers already answer ``OffsetBelowRetention`` below the start and ignore the leftover
descriptors; the next run of the owner (this one or the next) finds descriptors wholly
below the start and resumes at (2); after (2) the objects are orphans below the chain
end, which orphan GC (``uploader/gc.py``) deletes.

Preconditions of a cut (each refused, never bent; tests in
``tests/uploader/test_archive_retention.py``):

* only the current owner cuts: every write is fenced by the owner record, so a fenced
  (stale) owner can neither raise the start nor delete a descriptor, and deletes objects
  only of descriptors its own fenced transaction deleted;
* the retained chain is whole: it starts exactly at the current start (``archive_start``:
  the last cut, or a re-created topic's first offset) and has no gap or overlap; otherwise nothing is cut (a cut past a hole would hide it from ``dnb verify``);
* the new start is a descriptor boundary, and never past the start of the chain's last
  descriptor: the tip (what restore needs to continue at ``last_committed_offset + 1``)
  is never removed;
* nothing un-archived is cut: every removed offset lies in a committed descriptor below
  the tip, so at or below the uploader's ``committed_through`` (checked again before the
  start is raised);
* only the limits decide: ``age_max_s`` against the descriptor's ``created_at`` (the
  commit time, never earlier than its newest message), ``bytes_max`` against the total
  size of the retained objects; oldest first, stopping at the first descriptor that
  meets neither, so the archive stays a contiguous suffix.

Each cut is logged once (one INFO line: old start → new start, why, how many
descriptors/objects/bytes), never per object, and counted in the
``dnb_archive_retention_*`` metrics (docs/METRICS.md).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tiered.archive.chain import DescriptorChain
from tiered.archive.naming import descriptor_object_key, key_start_offset
from tiered.archive.start import incarnation_first_offset, read_archive_start
from tiered.metadata import keys
from tiered.metadata.base import (Compare, Delete, Get, KeyValue, MetadataStore, Put, TxnResult, absent, failed_compare,
                                  mod_revision_is)
from tiered.metadata.keys import ArchiveStart, ObjectDescriptor
from tiered.objects.base import DELETE_MANY_MAX, ObjectStore
from uploader.config import ArchiveRetentionConfig
from uploader.errors import OwnershipLost
from uploader.metrics import UploaderMetrics
from wal.topics import TopicName

log = logging.getLogger(__name__)

#: Descriptor deletes per metadata transaction (etcd's default ``--max-txn-ops`` is 128).
DELETE_BATCH_MAX = 64
#: Descriptors one run removes at most (its metadata steps hold the uploader's pass lock:
#: at most CUT_DESCRIPTORS_MAX / DELETE_BATCH_MAX transactions): a longer cut goes on at
#: the uploader's next pass.
CUT_DESCRIPTORS_MAX = 1024
#: Object keys per ``delete_many`` request of step 3.
OBJECT_DELETE_BATCH_MAX = DELETE_MANY_MAX


@dataclass(frozen=True, slots=True)
class Cut:
    """A planned cut: the new start and why; ``removed`` are the descriptors below it."""

    new_start: int
    reason: str  # "age" or "bytes": what removed the first descriptor
    removed: tuple[ObjectDescriptor, ...]


@dataclass
class RetentionRun:
    """What one :meth:`ArchiveRetention.run` did."""

    start_before: int
    start_after: int
    reason: str | None = None
    refused: str | None = None  # why nothing was cut although limits are set
    capped: bool = False  # the limits asked for more than CUT_DESCRIPTORS_MAX: run again soon
    descriptors_deleted: int = 0
    objects_deleted: int = 0
    bytes_deleted: int = 0
    deleted_keys: list[str] = field(default_factory=list)
    #: (key, size) of objects whose descriptors this run deleted, not deleted yet (step 3).
    pending_objects: list[tuple[str, int]] = field(default_factory=list)


def plan_cut(retained: Sequence[ObjectDescriptor], age_max_s: float | None, bytes_max: int | None,
             now_s: float, count_max: int | None = None) -> Cut | None:
    """The cut the limits ask for on ``retained`` (the chain from the current start, in
    order, already checked contiguous); None: keep everything. Pure.

    Oldest first, a descriptor is removed while it is older than ``age_max_s`` or the
    retained objects total more than ``bytes_max``; the first that meets neither stops
    the cut. The last descriptor is never a candidate; at most ``count_max`` are removed
    (None: no bound)."""
    total = sum(d.size for d in retained)
    count = 0
    reason: str | None = None
    for d in retained[:-1]:
        if count_max is not None and count >= count_max:
            break
        too_old = age_max_s is not None and now_s - d.created_at >= age_max_s
        too_big = bytes_max is not None and total > bytes_max
        if not (too_old or too_big):
            break
        reason = reason or ("age" if too_old else "bytes")
        total -= d.size
        count += 1
    if count == 0 or reason is None:
        return None
    return Cut(retained[count].start_offset, reason, tuple(retained[:count]))


def chain_problem(retained: Sequence[ObjectDescriptor], start: int) -> str | None:
    """Why ``retained`` is not a whole chain from ``start`` (None: it is)."""
    expected = start
    for d in retained:
        if d.start_offset != expected:
            kind = "gap" if d.start_offset > expected else "overlap"
            return f"{kind} at {expected}: next descriptor is {d.start_offset}-{d.end_offset}"
        expected = d.end_offset + 1
    return None


class ArchiveRetention:
    """Applies :class:`ArchiveRetentionConfig` to one topic for its owner (see the module
    docstring). ``fencing`` are the owner's compares (the uploader's); ``wall_clock``
    (seconds since the epoch) is what descriptor ages are measured against (tests inject
    it). ``fault_hook(step)`` is called between the steps (crash tests only)."""

    def __init__(self, topic: TopicName | str, metadata: MetadataStore, objects: ObjectStore, *,
                 fencing: Sequence[Compare], policy: ArchiveRetentionConfig, broker_id: str, epoch: int,
                 metrics: UploaderMetrics, wall_clock: Callable[[], float] = time.time,
                 fault_hook: Callable[[str], None] | None = None,
                 object_batch_max: int = OBJECT_DELETE_BATCH_MAX) -> None:
        self.topic = TopicName.parse(topic)
        self.metadata = metadata
        self.objects = objects
        self.fencing = tuple(fencing)
        self.policy = policy
        self.broker_id = str(broker_id)
        self.epoch = epoch
        self.metrics = metrics
        self.wall_clock = wall_clock
        self.fault_hook = fault_hook
        self.object_batch_max = max(1, min(object_batch_max, DELETE_MANY_MAX))

    def run(self, committed_through: int | None) -> RetentionRun:
        """:meth:`cut`, then :meth:`delete_objects`: all three steps, in this thread."""
        return self.delete_objects(self.cut(committed_through))

    def cut(self, committed_through: int | None) -> RetentionRun:
        """Steps 1 and 2: finish any interrupted cut, then cut what the limits ask for;
        the objects to delete are left in ``pending_objects`` (:meth:`delete_objects`).

        ``committed_through``: the uploader's last committed offset (nothing at or past
        ``committed_through + 1`` is ever cut). Raises OwnershipLost when fenced, storage
        errors as they come (the next run resumes)."""
        record, start_kv = read_archive_start(self.metadata, self.topic)
        # The start is :func:`tiered.archive.start.archive_start` (computed from the record
        # read here, whose entry the raise compares on): past the last cut AND at or past
        # the incarnation's first offset, so a re-created topic's retained chain is checked
        # from where its numbering began, not from 0 (a "gap" there would refuse every cut).
        start = max(0 if record is None else record.first_offset,
                    incarnation_first_offset(self.metadata, self.topic))
        chain = DescriptorChain(self.metadata, self.topic)
        if not self.policy.enabled:
            # Retention off: only finish a cut an earlier run left behind (cheap check:
            # the start record, then the first descriptor only).
            first = chain.first() if record is not None else None
            if first is None or first.end_offset >= start:
                return RetentionRun(start, start)
        entries = list(chain.entries())
        below = [d for d, _ in entries if d.end_offset < start]
        kept = [(d, kv) for d, kv in entries if d.end_offset >= start]
        result = RetentionRun(start, start)
        if record is not None and 0 < self.epoch < record.epoch:
            # Written by an owner epoch that never was (epochs only grow, and this owner's
            # is the newest): a damaged or misplaced record is not a cut to finish or build
            # on (atk29 F2). Nothing deleted; readers still honour it until it is repaired.
            # Unless this owner is the stale one: a newer owner wrote it (OwnershipLost).
            failed = failed_compare(self.metadata, self.fencing)
            if failed is not None:
                self.metrics.retention_refused.labels("fenced").inc()
                raise OwnershipLost(str(self.topic), f"archive start record of epoch {record.epoch} "
                                    f"(fencing compare on {failed.key} failed)")
            return self._refuse(result, "broken_chain", f"the archive start record names epoch {record.epoch} of "
                                f"{record.broker_id}, above this owner's epoch {self.epoch}: it is damaged; "
                                "nothing deleted")
        if below and start_kv is not None:
            # An interrupted cut: its start is in place, its descriptors are not all gone.
            # A cut's start is always the start of a descriptor it keeps (never past the
            # tip's start), so a start record that names no kept descriptor's start is
            # damaged or hostile: finishing that "cut" would delete the whole archive,
            # the tip included (atk28 F3). Refused, whatever the policy.
            if not kept or kept[0][0].start_offset != start:
                return self._refuse(result, "broken_chain", f"the archive start {start} is not the start of a "
                                    "retained descriptor (" + (f"the chain ends at {entries[-1][0].end_offset}"
                                                               if not kept else f"the first retained one is "
                                                               f"{kept[0][0].start_offset}-{kept[0][0].end_offset}")
                                    + "): the start record is damaged; nothing deleted")
            self._delete(below, start_kv, result)
        if not self.policy.enabled or len(kept) < 2:
            return result
        retained = [d for d, _ in kept]
        problem = chain_problem(retained, start)
        if problem is not None:
            return self._refuse(result, "broken_chain", f"the retained chain is not whole ({problem})")
        cut = plan_cut(retained, self.policy.age_max_s, self.policy.bytes_max, self.wall_clock(),
                       CUT_DESCRIPTORS_MAX)
        if cut is None:
            return result
        result.capped = len(cut.removed) >= CUT_DESCRIPTORS_MAX
        if committed_through is None or cut.new_start > committed_through:
            # Pair check: the new start is the start of a committed descriptor below the
            # tip, so at or below committed_through; anything else is a bug, cut nothing.
            return self._refuse(result, "past_committed",
                                f"new start {cut.new_start} is past the committed end {committed_through}")
        boundary = next(kv for d, kv in kept if d.start_offset == cut.new_start)
        new_kv = self._raise_start(cut.new_start, start_kv, boundary)
        if new_kv is None:
            return self._refuse(result, "conflict",
                                "the start record or the boundary descriptor changed; retrying next run")
        result.start_after, result.reason = cut.new_start, cut.reason
        self.metrics.retention_cuts.labels(cut.reason).inc()
        self._hook("after_start_raised")
        self._delete(list(cut.removed), new_kv, result)
        log.info("topic %s: archive retention (%s) moved the start %d -> %d: %d descriptors deleted, %d objects "
                 "(%d bytes) to delete", self.topic, cut.reason, start, cut.new_start, result.descriptors_deleted,
                 len(result.pending_objects), sum(size for _key, size in result.pending_objects))
        return result

    # -- the steps ---------------------------------------------------------------------
    def _raise_start(self, new_start: int, start_kv: KeyValue | None, boundary: KeyValue) -> KeyValue | None:
        """Step 1: the fenced write of the new start; its entry, or None when a
        non-fencing compare failed (someone moved the start or the boundary)."""
        key = keys.archive_start_key(self.topic)
        record = ArchiveStart(new_start, self.broker_id, self.epoch, time.time())
        value = record.to_json()
        compares = [*self.fencing, mod_revision_is(boundary.key, boundary.mod_revision),
                    absent(key) if start_kv is None else mod_revision_is(key, start_kv.mod_revision)]
        result = self.metadata.txn(compares, [Put(key, value)], self._fencing_reads())
        self._check_fenced(result, "raise the archive start")
        if not result.succeeded:
            return None
        # The txn's revision is the new record's mod_revision (as for a descriptor commit).
        return KeyValue(key, value, result.revision, result.revision, 0)

    def _delete(self, descriptors: list[ObjectDescriptor], start_kv: KeyValue, result: RetentionRun) -> None:
        """Steps 2 and 3: the descriptors (fenced, in batches, each batch only while the
        start record is ``start_kv``), then the objects of those deleted."""
        start = ArchiveStart.from_json(start_kv.key, start_kv.value).first_offset
        for i in range(0, len(descriptors), DELETE_BATCH_MAX):
            batch = descriptors[i:i + DELETE_BATCH_MAX]
            if any(d.end_offset >= start for d in batch):  # never happens: callers pass only those below
                raise ValueError(f"topic {self.topic}: refusing to delete a descriptor at or above the start {start}")
            compares = [*self.fencing, mod_revision_is(start_kv.key, start_kv.mod_revision)]
            ops = [Delete(keys.descriptor_key(self.topic, d.start_offset)) for d in batch]
            txn = self.metadata.txn(compares, ops, self._fencing_reads())
            self._check_fenced(txn, "delete descriptors below the archive start")
            if not txn.succeeded:
                log.info("topic %s: the archive start changed while deleting descriptors; next run resumes",
                         self.topic)
                return
            result.descriptors_deleted += len(batch)
            self.metrics.retention_descriptors.inc(len(batch))
            self._hook("after_descriptors_deleted")
            self._delete_objects(batch, start, result)

    def _delete_objects(self, batch: list[ObjectDescriptor], start: int, result: RetentionRun) -> None:
        """Note the objects of ``batch`` (descriptors just deleted) for step 3."""
        for d in batch:
            key = descriptor_object_key(self.topic, d)
            named = key_start_offset(self.topic, key)
            if named is None or named >= start or d.end_offset >= start:
                continue  # not an object of a range below the start: never ours to delete here
            result.pending_objects.append((key, d.size))

    def delete_objects(self, result: RetentionRun) -> RetentionRun:
        """Step 3: delete ``result.pending_objects``, ``object_batch_max`` keys per
        request, counting each batch done. Needs no lock and no fencing: their
        descriptors are gone, so nothing references them (an error leaves the rest as
        orphans below the start, which orphan GC or a retry deletes)."""
        while result.pending_objects:
            batch = result.pending_objects[:self.object_batch_max]
            self.objects.delete_many([key for key, _size in batch])
            del result.pending_objects[:len(batch)]
            size = sum(s for _key, s in batch)
            result.objects_deleted += len(batch)
            result.bytes_deleted += size
            result.deleted_keys.extend(key for key, _size in batch)
            self.metrics.retention_objects.inc(len(batch))
            self.metrics.retention_bytes.inc(size)
            self._hook("after_object_deleted")
        return result

    # -- helpers -----------------------------------------------------------------------
    def _fencing_reads(self) -> list[Get]:
        return [Get(k) for k in dict.fromkeys(c.key for c in self.fencing)]

    def _check_fenced(self, result: TxnResult, step: str) -> None:
        """OwnershipLost when the failed txn's reads show a fencing compare failed."""
        if result.succeeded:
            return
        current = dict(zip(dict.fromkeys(c.key for c in self.fencing), result.responses))
        for compare in self.fencing:
            kv = current.get(compare.key)
            if not compare.holds(kv if isinstance(kv, KeyValue) else None):
                self.metrics.retention_refused.labels("fenced").inc()
                raise OwnershipLost(str(self.topic), f"{step} (fencing compare on {compare.key} failed)")

    def _refuse(self, result: RetentionRun, kind: str, why: str) -> RetentionRun:
        result.refused = why
        self.metrics.retention_refused.labels(kind).inc()
        log.warning("topic %s: archive retention cut nothing: %s", self.topic, why)
        return result

    def _hook(self, step: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(step)


__all__ = ["ArchiveRetention", "CUT_DESCRIPTORS_MAX", "Cut", "DELETE_BATCH_MAX", "OBJECT_DELETE_BATCH_MAX", "RetentionRun", "chain_problem", "plan_cut"]
