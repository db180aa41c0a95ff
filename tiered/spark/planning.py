"""Planning a ``dnb1`` read: which objects and blocks, split into input partitions.

Runs in Spark's Python planner process. The steps, each cheap before the next:

1. **Candidates.** By topic: the committed descriptors under
   ``/storage/topics/<ns>/<topic>/objects/`` (their offset ranges are known without
   touching the object store, and they must form one contiguous chain from the archive
   start: descriptors wholly below it are an interrupted retention cut's leftovers and
   are never read, and a ``startingOffset`` below it is
   :class:`~tiered.archive.start.OffsetBelowArchiveStart`). A retention cut that
   overtakes the plan (offsets or objects it expected are missing, and a re-read archive
   start has moved past them) starts the plan over from the new start, as a fresh plan
   would, at most :data:`PLAN_ATTEMPTS_MAX` times; anything missing at or above the start
   is still an error. By location: every ``*.dnb1``
   object listed under the path (no metadata, so no archive start: read by topic on an
   archive with retention).
2. **Object pruning by offset** (descriptors only) — no request for a pruned object.
3. **Footers.** One suffix GET per surviving object (bounded thread pool) gives the
   per-block offsets, publish-time range and byte positions. By location, objects are
   then ordered by first offset and any overlap is refused (without metadata there is
   no way to tell which of two overlapping objects was committed).
4. **Block pruning** by the offset and publish-time windows.
5. **Runs.** Adjacent surviving blocks of one object, at most ``partitionBytesMax``
   bytes each (one ranged GET each), so a 1 GiB object becomes several runs.
6. **Partitions by bytes.** Consecutive runs are packed, in offset order, into one task
   until the next would pass ``partitionBytesMax``, each run weighing its bytes plus
   ``openCostBytes`` (Spark's ``maxPartitionBytes`` / ``openCostInBytes`` rule for
   files), so hundreds of small objects are a few tasks, not one task each. Every run
   keeps its object's integrity checks: size and footer CRC at planning, each block's CRC
   against the descriptor in the task.
"""
from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from native.errors import CorruptObject, DnbError
from tiered.archive.fetch import ObjectPin
from tiered.archive.naming import OBJECT_SUFFIX
from tiered.errors import ObjectNotFound
from tiered.spark import index as object_index
from tiered.spark import metrics
from tiered.spark.index import BlockRef, ObjectIndex
from tiered.objects.base import RangeByteRequest
from tiered.spark.options import Bounds, ReadOptions, datetime_to_ms

log = logging.getLogger(__name__)

#: Plans by topic made in a row when archive retention keeps cutting the archive while
#: each is made; the last cut then fails the query with OffsetBelowArchiveStart.
PLAN_ATTEMPTS_MAX = 3


class ArchiveInconsistent(DnbError, RuntimeError):
    """The descriptors or objects do not form one contiguous, non-overlapping archive."""


class _ArchiveCut(DnbError):
    """A plan by topic was overtaken by archive retention: it expected ``offset`` but the
    archive start has since moved past it to ``start`` (plan again from there). Never
    leaves :func:`plan`: its last attempt turns it into OffsetBelowArchiveStart."""

    def __init__(self, offset: int, start: int) -> None:
        super().__init__(f"offset {offset} was cut while planning; the archive now starts at {start}")
        self.offset = offset
        self.start = start


@dataclass(frozen=True)
class ObjectRun:
    """Adjacent blocks of one object: what one ranged GET fetches (picklable)."""

    key: str
    object_size: int
    blocks: tuple[BlockRef, ...]

    @property
    def byte_range(self) -> RangeByteRequest:
        """The bytes covering every block of the run (end exclusive)."""
        return RangeByteRequest(self.blocks[0].position, self.blocks[-1].position + self.blocks[-1].length)

    @property
    def nbytes(self) -> int:
        return self.byte_range.length


@dataclass(frozen=True)
class Dnb1Partition(InputPartition):
    """One task: runs of consecutive objects, in offset order (picklable, self-contained)."""

    objects_url: str
    store_options: tuple[tuple[str, str], ...]
    topic: str
    runs: tuple[ObjectRun, ...]
    bounds: Bounds
    on_corrupt: str
    metrics_dir: str | None
    #: By topic: where a task re-reads the archive start when an object it was planned
    #: to read is gone (retention since planning: OffsetBelowArchiveStart, not a gap).
    metadata_url: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(run.nbytes for run in self.runs)


@dataclass(frozen=True, slots=True)
class _Candidate:
    key: str
    size: int
    first_offset: int | None  # None until the footer is read (by location)
    last_offset: int | None
    pin: ObjectPin | None = None  # what the descriptor pins (None: read by location)


# -- filter pushdown ------------------------------------------------------------------
def push_filters(bounds: Bounds, filters: Sequence[Filter]) -> tuple[Bounds, list[Filter]]:
    """Narrow ``bounds`` by the filters we understand; return the ones Spark must still apply.

    Offset filters are applied exactly by ``read()`` (offsets are integers, nothing to
    round), so they are consumed. Publish-time filters only *prune* (rounded outward to
    whole milliseconds) and are handed back, so Spark re-checks every row and a rounding
    or time-zone subtlety can never drop or add a row.
    """
    remaining: list[Filter] = []
    for f in filters:
        column = f.attribute if hasattr(f, "attribute") else None
        if column == ("offset",) and _is_int_filter(f):
            bounds = _offset_filter(bounds, f)
            continue
        if column == ("publish_time",):
            bounds = _time_filter(bounds, f)
        remaining.append(f)
    return bounds, remaining


def _is_int_filter(f: Filter) -> bool:
    if isinstance(f, In):
        return all(isinstance(v, int) and not isinstance(v, bool) for v in f.value)
    if isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)):
        return isinstance(f.value, int) and not isinstance(f.value, bool)
    return False


def _offset_filter(bounds: Bounds, f: Filter) -> Bounds:
    v = getattr(f, "value")
    if isinstance(f, EqualTo):
        return bounds.tighten(offset_lo=v, offset_hi=v)
    if isinstance(f, GreaterThan):
        return bounds.tighten(offset_lo=v + 1)
    if isinstance(f, GreaterThanOrEqual):
        return bounds.tighten(offset_lo=v)
    if isinstance(f, LessThan):
        return bounds.tighten(offset_hi=v - 1)
    if isinstance(f, LessThanOrEqual):
        return bounds.tighten(offset_hi=v)
    assert isinstance(f, In)
    return bounds.tighten(offsets_in=frozenset(v for v in f.value if v >= 0))


def _time_filter(bounds: Bounds, f: Filter) -> Bounds:
    import datetime as dt

    v = getattr(f, "value", None)
    if not isinstance(v, dt.datetime):
        return bounds
    ms = datetime_to_ms(v)
    # Strict comparisons are widened to inclusive ones: pruning may keep a block too
    # many, never one too few; Spark applies the exact filter afterwards.
    if isinstance(f, EqualTo):
        return bounds.tighten(time_lo_ms=ms, time_hi_ms=ms + 1)
    if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
        return bounds.tighten(time_lo_ms=ms)
    if isinstance(f, (LessThan, LessThanOrEqual)):
        return bounds.tighten(time_hi_ms=ms + 1)
    return bounds


# -- planning -------------------------------------------------------------------------
def plan(options: ReadOptions, bounds: Bounds) -> list[Dnb1Partition]:
    """Partitions for ``options`` narrowed by ``bounds`` (options + pushed filters)."""
    store = object_index.store_for(options.objects_url, tuple(sorted(options.store_options.items())))
    report = metrics.PlanReport(topic=options.topic)
    if bounds.empty():
        metrics.write(options.metrics_dir, "plan", report.as_dict())
        return []
    if options.by_topic:
        report, indexes = _topic_indexes(store, options, bounds)
    else:
        indexes = _wanted_indexes(store, _listed_candidates(store), options, bounds, report)
        # With onCorrupt=skip a skipped object leaves a gap the user asked for (reported).
        indexes = _check_contiguous(indexes, gaps_allowed=bool(report.skipped),
                                    wanted=lambda i: bounds.overlaps_offsets(i.first_offset, i.last_offset))
    runs: list[ObjectRun] = []
    for index in indexes:
        blocks = [b for b in index.blocks if _block_wanted(b, bounds)]
        report.blocks_total += len(index.blocks)
        report.blocks_planned += len(blocks)
        if blocks:
            report.objects_planned += 1
        runs += [ObjectRun(index.key, index.size, tuple(run)) for run in _runs(blocks, options.partition_bytes_max)]
    partitions = [
        Dnb1Partition(
            objects_url=options.objects_url,
            store_options=tuple(sorted(options.store_options.items())),
            topic=options.topic,
            runs=tuple(task),
            bounds=bounds,
            on_corrupt=options.on_corrupt,
            metrics_dir=options.metrics_dir,
            metadata_url=options.metadata_url,
        )
        for task in pack(runs, options.partition_bytes_max, options.open_cost_bytes)
    ]  # fmt: skip
    report.partitions = len(partitions)
    metrics.write(options.metrics_dir, "plan", report.as_dict())
    return partitions


def _topic_indexes(store: object, options: ReadOptions,
                   bounds: Bounds) -> tuple["metrics.PlanReport", list[ObjectIndex]]:
    """The footers of the descriptors by topic that ``bounds`` wants, and the plan's report.

    Archive retention may cut the archive while this runs (start first, then descriptors,
    then objects). When what the plan expected is missing and the archive start moved past
    it, the plan is made again from scratch, so the result is what a fresh plan at the new
    start gives: rows from the new start, or OffsetBelowArchiveStart for a
    ``startingOffset`` now below it. Never a plan that skips the cut offsets."""
    from tiered.archive.start import OffsetBelowArchiveStart

    for attempt in range(1, PLAN_ATTEMPTS_MAX + 1):
        report = metrics.PlanReport(topic=options.topic)
        try:
            return report, _wanted_indexes(store, _descriptor_candidates(options), options, bounds, report)
        except _ArchiveCut as cut:
            if attempt == PLAN_ATTEMPTS_MAX:
                raise OffsetBelowArchiveStart(options.topic, cut.offset, cut.start) from cut
            log.info("topic %s: %s; planning again (attempt %d of %d)", options.topic, cut, attempt + 1,
                     PLAN_ATTEMPTS_MAX)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _wanted_indexes(store: object, candidates: list[_Candidate], options: ReadOptions, bounds: Bounds,
                    report: "metrics.PlanReport") -> list[ObjectIndex]:
    """The footers of the candidates holding offsets ``bounds`` wants."""
    report.objects_total = len(candidates)
    candidates = [c for c in candidates if c.first_offset is None or bounds.overlaps_offsets(c.first_offset, c.last_offset)]  # type: ignore[arg-type]
    return _read_footers(store, candidates, options, report)


def _block_wanted(block: BlockRef, bounds: Bounds) -> bool:
    return bounds.overlaps_offsets(block.first_offset, block.last_offset) and bounds.overlaps_times(
        block.min_time_ms, block.max_time_ms
    )


def _runs(blocks: list[BlockRef], bytes_max: int) -> Iterable[list[BlockRef]]:
    """Adjacent blocks grouped up to ``bytes_max`` (a lone larger block is its own run)."""
    run: list[BlockRef] = []
    run_bytes = 0
    for block in blocks:
        adjacent = bool(run) and run[-1].index + 1 == block.index
        if run and (not adjacent or run_bytes + block.length > bytes_max):
            yield run
            run, run_bytes = [], 0
        run.append(block)
        run_bytes += block.length
    if run:
        yield run


def pack(runs: Sequence[ObjectRun], bytes_max: int, open_cost_bytes: int) -> Iterable[list[ObjectRun]]:
    """Consecutive runs packed into tasks: a task is closed when the next run (its bytes
    plus ``open_cost_bytes``) would take it past ``bytes_max``; a lone larger run is its
    own task. Order is kept, so a task reads a contiguous stretch of offsets."""
    task: list[ObjectRun] = []
    task_bytes = 0
    for run in runs:
        weight = run.nbytes + open_cost_bytes
        if task and task_bytes + weight > bytes_max:
            yield task
            task, task_bytes = [], 0
        task.append(run)
        task_bytes += weight
    if task:
        yield task


def _descriptor_candidates(options: ReadOptions) -> list[_Candidate]:
    from tiered.archive.chain import DescriptorChain
    from tiered.archive.naming import descriptor_object_key
    from tiered.archive.start import OffsetBelowArchiveStart, archive_start
    from tiered.errors import TopicDeleted
    from tiered.metadata import keys, open_metadata

    assert options.metadata_url is not None
    candidates: list[_Candidate] = []
    with open_metadata(options.metadata_url) as meta:
        # A deleted topic (its delete may have crashed before the descriptors went) is
        # refused like every other reader refuses it: never planned from its leftovers.
        tomb, _raw = keys.read_tombstone(meta, options.topic)
        if tomb is not None and tomb.blocks:
            raise TopicDeleted(options.topic, tomb.phase, tomb.next_offset)
        start = archive_start(meta, options.topic)
        if options.starting_offset is not None and options.starting_offset < start:
            raise OffsetBelowArchiveStart(options.topic, options.starting_offset, start)
        chain = DescriptorChain(meta, options.topic)
        for d, kv in chain.entries():
            if d.end_offset < start:
                continue  # below the archive start: a retention cut's leftover, never read
            previous_end = candidates[-1].last_offset if candidates else start - 1
            assert previous_end is not None  # descriptors give every candidate its offsets
            if d.start_offset != previous_end + 1:
                now = archive_start(meta, options.topic)
                if now > previous_end + 1:
                    # Retention cut the archive since ``start`` was read (or between two
                    # pages): the offsets missing here are gone by decision, not a hole.
                    raise _ArchiveCut(previous_end + 1, now)
                raise ArchiveInconsistent(
                    f"topic {options.topic}: descriptor {kv.key} starts at {d.start_offset} but the "
                    f"previous one (or the archive start {start}) ends at {previous_end}; the archive is "
                    "not contiguous"
                )
            candidates.append(_Candidate(descriptor_object_key(options.topic, d), d.size, d.start_offset,
                                         d.end_offset, ObjectPin.of(d)))
    return candidates


def _listed_candidates(store: object) -> list[_Candidate]:
    return [
        _Candidate(info.key, info.size, None, None)
        for info in store.list("")  # type: ignore[attr-defined]
        if info.key.endswith(OBJECT_SUFFIX)
    ]


def _read_footers(store: object, candidates: list[_Candidate], options: ReadOptions,
                  report: "metrics.PlanReport") -> list[ObjectIndex]:
    """Footers of every candidate, in candidate order; corrupt ones fail or are skipped.
    By topic, objects gone since their descriptors were listed are :func:`_missing`'s."""
    def one(c: _Candidate) -> ObjectIndex | CorruptObject | ObjectNotFound:
        try:
            index = object_index.read_index(store, c.key, c.size, options.topic if options.by_topic else None,
                                            c.pin)
        except CorruptObject as e:
            if options.on_corrupt == "skip":
                return e
            raise
        except ObjectNotFound as e:
            if options.by_topic:
                return e
            raise
        if c.first_offset is not None and (index.first_offset, index.last_offset) != (c.first_offset, c.last_offset):
            raise CorruptObject(
                c.key, 0,
                f"footer says offsets {index.first_offset}..{index.last_offset} but the descriptor says "
                f"{c.first_offset}..{c.last_offset}",
            )
        return index

    threads = max(1, min(options.footer_threads, len(candidates)))
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="dnb1-footer") as pool:
        results = list(pool.map(one, candidates))
    missing = [(c, r) for c, r in zip(candidates, results) if isinstance(r, ObjectNotFound)]
    if missing:
        _missing(options, missing)
    indexes: list[ObjectIndex] = []
    for c, result in zip(candidates, results):
        assert not isinstance(result, ObjectNotFound)
        if isinstance(result, CorruptObject):
            log.warning("skipping corrupt object %s: %s", c.key, result)
            report.skipped.append({"key": c.key, "position": result.position, "reason": result.reason})
            metrics.write(options.metrics_dir, "skipped", {"key": c.key, "position": result.position,
                                                          "reason": result.reason, "where": "footer"})
            continue
        indexes.append(result)
    return indexes


def _missing(options: ReadOptions, missing: list[tuple[_Candidate, ObjectNotFound]]) -> NoReturn:
    """Objects of listed descriptors that are gone. _ArchiveCut when the archive start,
    read again, is past every one of them (retention cut them since the listing); else
    the store's error for the first one the start does not explain: a committed object
    lost above the start is damage and is never hidden."""
    from tiered.archive.start import archive_start
    from tiered.metadata import open_metadata

    assert options.metadata_url is not None
    with open_metadata(options.metadata_url) as meta:
        start = archive_start(meta, options.topic)
    for c, error in missing:
        assert c.last_offset is not None  # descriptors give every candidate its offsets
        if c.last_offset >= start:
            raise error
    first = missing[0][0]
    assert first.first_offset is not None
    raise _ArchiveCut(first.first_offset, start) from missing[0][1]


def _check_contiguous(indexes: list[ObjectIndex], gaps_allowed: bool = False,
                      wanted: Callable[[ObjectIndex], bool] = lambda _i: True) -> list[ObjectIndex]:
    """The objects read by location, in offset order, when they hold one contiguous run of
    offsets. ArchiveInconsistent when two overlap (no metadata says which was committed) or
    when offsets are missing between two (atk60 f02: an interrupted cleanup of retention's
    leftovers; returning both sides would skip the missing offsets without a word) among
    the objects ``wanted`` (those holding offsets the read asks for), unless ``gaps_allowed``
    (objects were skipped as corrupt, on request: a gap is logged)."""
    indexes = sorted(indexes, key=lambda i: (i.first_offset, i.last_offset))
    for prev, cur in zip(indexes, indexes[1:]):
        if cur.first_offset <= prev.last_offset:
            raise ArchiveInconsistent(
                f"objects {prev.key} (offsets {prev.first_offset}..{prev.last_offset}) and {cur.key} "
                f"(offsets {cur.first_offset}..{cur.last_offset}) overlap; without metadata there is no way "
                "to tell which one was committed: read by topic (options topic, metadata, objects) instead"
            )
        if cur.first_offset == prev.last_offset + 1 or not (wanted(prev) and wanted(cur)):
            continue  # contiguous, or a gap outside the offsets asked for
        if gaps_allowed:
            log.warning("offsets %d..%d are in no object read (an object was skipped as corrupt)",
                        prev.last_offset + 1, cur.first_offset - 1)
        else:
            raise ArchiveInconsistent(
                f"offsets {prev.last_offset + 1}..{cur.first_offset - 1} are in no object between {prev.key} and "
                f"{cur.key}; reading both would skip them without a word. Read by topic (options topic, metadata, "
                "objects), or narrow startingOffset/endingOffset to one side"
            )
    return indexes
