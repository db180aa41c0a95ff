"""``read()`` for one :class:`~tiered.spark.planning.Dnb1Partition`: bytes → Arrow.

Runs in a Spark Python worker, possibly on another machine: it gets everything it needs
from the partition (store URL and options, object keys, block positions, windows), makes
exactly one ranged GET per run (a run: adjacent blocks of one object; a partition packs runs
of consecutive objects) and validates each block with the native codec (block CRC, decompression, every frame's CRC and record, offsets and publish times
against the footer's index entry). Valid blocks with contiguous offsets, across objects,
are then decoded *together* by
``native.columns`` straight into Arrow buffers (no Python object per row) until they hold
about :data:`BATCH_ROWS_TARGET` messages, and yielded as one ``pyarrow.RecordBatch``: a
1 MiB block of 100-byte messages is only ~8 k rows, and every batch costs a fixed amount on
both sides of Spark's worker pipe. Nothing is yielded from a group that fails a check.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from native.errors import CorruptObject
from tiered.spark import index as object_index
from tiered.spark import metrics

if TYPE_CHECKING:
    import pyarrow as pa

    from tiered.spark.index import BlockRef
    from tiered.spark.planning import Dnb1Partition

log = logging.getLogger(__name__)

#: Blocks are decoded together until they hold at least this many messages (one batch).
BATCH_ROWS_TARGET = 64 * 1024
#: A group whose kept rows would overflow Arrow's int32 offsets (only possible with blocks
#: near the 2 GiB format limit) is decoded in halves of its offset window; each halving
#: at least halves the rows, so this bound is never reached by real data.
SPLIT_WINDOWS_MAX = 4096
COLUMN_NAMES = ["topic", "offset", "publish_time", "key", "attributes", "payload"]


@dataclass
class _Tally:
    blocks_read: int = 0
    rows: int = 0
    bytes_read: int = 0


#: A validated block in a decode group: (its object's key, the block, its frames).
_Entry = tuple[str, "BlockRef", bytes]


def read_partition(p: "Dnb1Partition") -> Iterator["pa.RecordBatch"]:
    store = object_index.store_for(p.objects_url, p.store_options)
    tally = _Tally()
    group: list[_Entry] = []
    group_rows = 0
    for run in p.runs:
        byte_range = run.byte_range
        start = byte_range.start
        data = _get_run(p, store, run.key, byte_range, run.blocks[0].first_offset)
        if len(data) != byte_range.length:
            raise CorruptObject(run.key, start + len(data),
                                f"object is shorter than its footer says (wanted bytes {start}..{byte_range.end - 1})")
        tally.bytes_read += len(data)
        view = memoryview(data)
        for block in run.blocks:
            raw = view[block.position - start: block.position - start + block.length]
            frames = _validated_frames(p, run.key, block, raw)
            # One decode call needs contiguous offsets: a skipped block, or a gap between
            # runs (pruned blocks, objects read by location), ends the group.
            if frames is None or (group and group[-1][1].last_offset + 1 != block.first_offset):
                yield from _emit(p, group, tally)
                group, group_rows = [], 0
            if frames is None:
                continue
            group.append((run.key, block, frames))
            group_rows += block.last_offset - block.first_offset + 1
            if group_rows >= BATCH_ROWS_TARGET:
                yield from _emit(p, group, tally)
                group, group_rows = [], 0
    yield from _emit(p, group, tally)
    metrics.write(p.metrics_dir, "read", {"keys": [run.key for run in p.runs], "blocks_read": tally.blocks_read,
                                          "bytes_read": tally.bytes_read, "rows": tally.rows})


def _get_run(p: "Dnb1Partition", store: Any, key: str, byte_range: Any, first_offset: int) -> bytes:
    """One run's bytes. An object gone since planning is OffsetBelowArchiveStart when
    retention raised the archive start past it (by topic), else the store's error."""
    from tiered.errors import ObjectNotFound

    try:
        data: bytes = store.get_range(key, byte_range)
        return data
    except ObjectNotFound as e:
        if p.metadata_url is None:
            raise
        from tiered.archive.start import OffsetBelowArchiveStart, archive_start
        from tiered.metadata import open_metadata

        with open_metadata(p.metadata_url) as meta:
            start = archive_start(meta, p.topic)
        if start > first_offset:
            raise OffsetBelowArchiveStart(p.topic, first_offset, start) from e
        raise


def _validated_frames(p: "Dnb1Partition", key: str, block: "BlockRef", raw: memoryview) -> bytes | None:
    """The block's frames, or None when it is corrupt and ``onCorrupt=skip``."""
    try:
        return object_index.block_frames(key, raw, block)
    except CorruptObject as e:
        _skip_or_raise(p, key, [block], e)
        return None


def _skip_or_raise(p: "Dnb1Partition", key: str, blocks: list["BlockRef"], e: CorruptObject) -> None:
    if p.on_corrupt != "skip":
        raise e
    log.warning("skipping corrupt block(s) of %s: %s", key, e)
    metrics.write(p.metrics_dir, "skipped", {
        "key": key, "position": e.position, "reason": e.reason, "where": "block",
        "first_offset": blocks[0].first_offset, "last_offset": blocks[-1].last_offset,
    })  # fmt: skip


def _emit(p: "Dnb1Partition", group: list[_Entry], tally: _Tally) -> Iterator["pa.RecordBatch"]:
    """Batches of a group of adjacent valid blocks. Decoding finishes before anything is
    yielded, so a group that fails yields nothing; with ``onCorrupt=skip`` its blocks are
    then retried one by one so only the bad block is left out."""
    if not group:
        return
    try:
        batches = _decode_group(p, group)
    except CorruptObject as e:
        if p.on_corrupt != "skip" or len(group) == 1:
            _skip_or_raise(p, e.object_name, [b for _, b, _ in group], e)
            return
        for one in group:
            yield from _emit(p, [one], tally)
        return
    tally.blocks_read += len(group)
    for batch in batches:
        tally.rows += batch.num_rows
        yield batch


def _decode_group(p: "Dnb1Partition", group: list[_Entry]) -> list["pa.RecordBatch"]:
    from native.columns import ColumnsError, ColumnsTooLarge

    first, last = group[0][1].first_offset, group[-1][1].last_offset
    frames = group[0][2] if len(group) == 1 else b"".join(f for _, _, f in group)
    b = p.bounds
    lo, hi = max(b.offset_lo, first), last if b.offset_hi is None else min(b.offset_hi, last)
    if b.offsets_in is not None and b.offsets_in:
        # IN is applied exactly by a mask below; its extremes narrow the window first.
        lo, hi = max(lo, min(b.offsets_in)), min(hi, max(b.offsets_in))
    batches: list["pa.RecordBatch"] = []
    windows = [(lo, hi)]  # a stack, popped in ascending offset order
    for _ in range(SPLIT_WINDOWS_MAX):
        if not windows:
            return batches
        w_lo, w_hi = windows.pop()
        try:
            cols = decode_columns(frames, w_lo, w_hi, b.time_lo_ms, b.time_hi_ms)
        except ColumnsTooLarge:
            if w_hi <= w_lo:
                raise
            mid = (w_lo + w_hi) // 2
            windows += [(mid + 1, w_hi), (w_lo, mid)]
            continue
        except ColumnsError as e:
            key, block, at = _block_at(group, e.position)
            raise CorruptObject(key, block.position, f"frame at byte {at} of block {block.index}: "
                                                     f"{e.reason}") from e
        # Pairs with block_frames' check against the index: the group holds exactly first..last.
        if (cols.frame_count, cols.first_frame_offset, cols.last_frame_offset) != (last - first + 1, first, last):
            raise CorruptObject(group[0][0], group[0][1].position,
                                f"blocks {group[0][1].index}..{group[-1][1].index} of {group[0][0]}.."
                                f"{group[-1][0]} hold {cols.frame_count} "
                                f"frames {cols.first_frame_offset}..{cols.last_frame_offset}, the index says "
                                f"{first}..{last}")
        batch = to_batch(p.topic, cols, b.offsets_in)
        if batch is not None:
            batches.append(batch)
    raise AssertionError(f"offset window {lo}..{hi} still too large after {SPLIT_WINDOWS_MAX} splits")


def decode_columns(frames: bytes | memoryview, first_offset: int | None, last_offset: int | None,
                   min_time_ms: int | None, max_time_ms: int | None) -> Any:
    """Validated frames → ``native.columns.Columns`` for the rows inside the windows."""
    from native import columns

    return columns.decode_columns(frames, first_offset, last_offset, min_time_ms, max_time_ms)


def _block_at(group: list[_Entry], position: int) -> tuple[str, "BlockRef", int]:
    """The object key and block holding byte ``position`` of the group's joined frames,
    and the position in that block."""
    for key, block, frames in group:
        if position < len(frames):
            return key, block, position
        position -= len(frames)
    key, block, frames = group[-1]
    return key, block, position + len(frames)


def to_batch(topic: str, cols: Any, offsets_in: frozenset[int] | None = None) -> "pa.RecordBatch | None":
    """``native.columns.Columns`` as one Arrow batch of the source's schema, built from the
    buffers without copying them; ``offsets_in`` (a pushed ``offset IN``) filters rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = cols.count
    if n == 0:
        return None
    buf = pa.py_buffer
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, buf(cols.offsets)])
    times_ms = pa.Array.from_buffers(pa.int64(), n, [None, buf(cols.publish_times_ms)])
    # Checked: a publish time beyond ~292,000 years in µs fails instead of wrapping.
    publish = pc.multiply_checked(times_ms, 1000).cast(pa.timestamp("us", tz="UTC"))
    key_validity = buf(cols.key_validity) if cols.key_null_count else None
    keys = pa.Array.from_buffers(pa.binary(), n, [key_validity, buf(cols.key_offsets), buf(cols.key_data)],
                                 null_count=cols.key_null_count)
    payloads = pa.Array.from_buffers(pa.binary(), n, [None, buf(cols.payload_offsets), buf(cols.payload_data)])
    entries = cols.attribute_count
    names = pa.Array.from_buffers(pa.string(), entries, [None, buf(cols.attribute_names_offsets),
                                                          buf(cols.attribute_names_data)])
    values = pa.Array.from_buffers(pa.string(), entries, [None, buf(cols.attribute_values_offsets),
                                                           buf(cols.attribute_values_data)])
    map_offsets = pa.Array.from_buffers(pa.int32(), n + 1, [None, buf(cols.attribute_offsets)])
    attributes = pa.MapArray.from_arrays(map_offsets, names, values, type=pa.map_(pa.string(), pa.string()))
    batch = pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(topic, pa.string()), n), offsets, publish, keys, attributes, payloads],
        names=COLUMN_NAMES,
    )
    if offsets_in is not None:
        batch = batch.filter(pc.is_in(offsets, value_set=pa.array(sorted(offsets_in), pa.int64())))
    return batch if batch.num_rows else None
