"""``read()`` for one :class:`~tiered.spark.planning.Dnb1Partition`: bytes → Arrow.

Runs in a Spark Python worker, possibly on another machine: it gets everything it needs
from the partition (store URL and options, object key, block positions, windows), makes
exactly one ranged GET for the partition's blocks, decodes each block with the native
codec, checks it holds exactly the offsets the footer promised, and yields one
``pyarrow.RecordBatch`` per block. Nothing is yielded for a block that fails a check.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from native.errors import CorruptObject
from tiered.spark import _dnb1io, metrics

if TYPE_CHECKING:
    import pyarrow as pa

    from tiered.spark.options import Bounds
    from tiered.spark.planning import Dnb1Partition

log = logging.getLogger(__name__)


def read_partition(p: "Dnb1Partition") -> Iterator["pa.RecordBatch"]:
    store = _dnb1io.store_for(p.objects_url, p.store_options)
    start, end = p.byte_range
    data = _dnb1io.get_range(store, p.key, start, end)
    if len(data) != end - start + 1:
        raise CorruptObject(p.key, start + len(data), f"object is shorter than its footer says (wanted bytes {start}..{end})")
    view = memoryview(data)
    blocks_read = rows = 0
    for block in p.blocks:
        raw = view[block.position - start: block.position - start + block.length]
        try:
            records = _dnb1io.decode_block(p.key, raw, block)
            _check_offsets(p.key, block, records)
        except CorruptObject as e:
            if p.on_corrupt != "skip":
                raise
            log.warning("skipping corrupt block of %s: %s", p.key, e)
            metrics.write(p.metrics_dir, "skipped", {
                "key": p.key, "position": e.position, "reason": e.reason, "where": "block",
                "first_offset": block.first_offset, "last_offset": block.last_offset,
            })  # fmt: skip
            continue
        blocks_read += 1
        batch = to_batch(p.topic, p.key, records, block.first_offset, p.bounds)
        if batch is not None:
            rows += batch.num_rows
            yield batch
    metrics.write(p.metrics_dir, "read", {"key": p.key, "blocks_read": blocks_read,
                                          "bytes_read": len(data), "rows": rows})


def _check_offsets(key: str, block: Any, records: Sequence[Any]) -> None:
    """The block must hold exactly ``first..last`` in order: never serve a wrong row."""
    want = block.last_offset - block.first_offset + 1
    if len(records) != want or records[0].offset != block.first_offset or records[-1].offset != block.last_offset:
        got = f"{records[0].offset}..{records[-1].offset} ({len(records)} records)" if records else "no records"
        raise CorruptObject(key, block.position, f"block {block.index} holds {got}, footer says "
                            f"{block.first_offset}..{block.last_offset}")


def to_batch(topic: str, key: str, records: Sequence[Any], first_offset: int, bounds: "Bounds") -> "pa.RecordBatch | None":
    """Records (contiguous from ``first_offset``) inside ``bounds`` as one Arrow batch."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # Offsets are contiguous, so the offset window is a slice, not a scan.
    lo = max(bounds.offset_lo - first_offset, 0)
    hi = len(records) if bounds.offset_hi is None else min(bounds.offset_hi - first_offset + 1, len(records))
    if hi <= lo:
        return None
    if lo or hi != len(records):
        records = records[lo:hi]
    offsets, times, msg_keys, attributes, payloads = zip(*records)
    offset_arr = pa.array(offsets, pa.int64())
    if len(offsets) > 1:
        # Pairs with the check against the footer: every step is exactly +1.
        steps = pc.min_max(pc.pairwise_diff(offset_arr))
        if steps["min"].as_py() != 1 or steps["max"].as_py() != 1:
            raise CorruptObject(key, 0, f"offsets {offsets[0]}..{offsets[-1]} are not contiguous")
    time_ms = pa.array(times, pa.int64())
    batch = pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(topic, pa.string()), len(offsets)),
            offset_arr,
            pc.multiply(time_ms, 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(msg_keys, pa.binary()),
            _attributes_array(attributes),
            pa.array(payloads, pa.binary()),
        ],
        names=["topic", "offset", "publish_time", "key", "attributes", "payload"],
    )
    mask = None
    if bounds.offsets_in is not None:
        mask = pc.is_in(offset_arr, value_set=pa.array(sorted(bounds.offsets_in), pa.int64()))
    if bounds.time_lo_ms is not None:
        mask = _and(mask, pc.greater_equal(time_ms, bounds.time_lo_ms))
    if bounds.time_hi_ms is not None:
        mask = _and(mask, pc.less_equal(time_ms, bounds.time_hi_ms))
    if mask is not None:
        batch = batch.filter(mask)
    return batch if batch.num_rows else None


def _and(a: Any, b: Any) -> Any:
    import pyarrow.compute as pc

    return b if a is None else pc.and_(a, b)


def _attributes_array(attributes: Sequence[dict[str, str]]) -> "pa.Array":
    import pyarrow as pa

    map_type = pa.map_(pa.string(), pa.string())
    if not any(attributes):
        # The common case (no attributes): an all-empty map array without per-row work.
        zeros = pa.repeat(pa.scalar(0, pa.int32()), len(attributes) + 1)
        return pa.MapArray.from_arrays(zeros, pa.array([], pa.string()), pa.array([], pa.string()), type=map_type)
    return pa.array([list(a.items()) for a in attributes], map_type)
