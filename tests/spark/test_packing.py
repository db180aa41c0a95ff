"""Partitions planned by bytes: many small consecutive objects packed into few tasks, each
object still held to its descriptor. Without a Spark session (plan + read_partition)."""
from __future__ import annotations

import math

import pytest

from native.errors import CorruptObject
from tests.spark.archive_util import BASE_TIME_MS, Produced, write_archive
from tiered.metadata import open_metadata
from tiered.objects import open_objects
from tiered.spark import metrics, reading
from tiered.spark.options import DEFAULT_OPEN_COST_BYTES, DEFAULT_PARTITION_BYTES_MAX, parse_options
from tiered.spark.planning import ArchiveInconsistent, plan


TOPIC = "/default/packing"
OBJECTS = 42
PER_OBJECT = 25


def _uniform(count: int) -> list[Produced]:
    """Same-size frames, so every object (uncompressed) has the same size."""
    return [Produced(i, BASE_TIME_MS + i, None, {}, f"payload-{i:08d}".encode()) for i in range(count)]


@pytest.fixture
def archive(tmp_path):
    produced = _uniform(OBJECTS * PER_OBJECT)
    splits = [(i * PER_OBJECT, (i + 1) * PER_OBJECT - 1, "b", 1) for i in range(OBJECTS)]
    objects_url, metadata_url = f"file://{tmp_path}/objects", f"sqlite:///{tmp_path}/meta.db"
    with open_objects(objects_url) as objects, open_metadata(metadata_url) as metadata:
        keys = write_archive(objects, metadata, TOPIC, produced, splits, block_bytes=1 << 20, zstd_level=0)
    return {"objects": objects_url, "metadata": metadata_url, "keys": keys, "produced": produced,
            "metrics": str(tmp_path / "m")}


def _plan(archive, **options):
    opts = parse_options({"topic": TOPIC, "metadata": archive["metadata"], "objects": archive["objects"],
                          "metricsDir": archive["metrics"], **options})
    return plan(opts, opts.bounds)


def _rows(parts) -> list[int]:
    return [r["offset"] for p in parts for b in reading.read_partition(p) for r in b.to_pylist()]


def test_defaults_are_sparks():
    opts = parse_options({"path": "/tmp/x/ns/t"})
    assert (opts.partition_bytes_max, opts.open_cost_bytes) == (128 << 20, 4 << 20)
    assert (DEFAULT_PARTITION_BYTES_MAX, DEFAULT_OPEN_COST_BYTES) == (128 << 20, 4 << 20)


@pytest.mark.parametrize("per_task", [1, 4, 5, OBJECTS])
def test_small_objects_are_packed_into_ceil_bytes_over_target_tasks(archive, per_task):
    one = _plan(archive, openCostBytes="0")
    assert len(one) == 1  # 42 small objects, default 128 MiB target: one task
    sizes = {run.nbytes for run in one[0].runs}
    assert len(sizes) == 1 and len(one[0].runs) == OBJECTS
    object_bytes = sizes.pop()
    target = per_task * object_bytes
    parts = _plan(archive, openCostBytes="0", partitionBytesMax=str(target))
    assert len(parts) == math.ceil(OBJECTS * object_bytes / target)
    assert all(p.nbytes <= target for p in parts)
    # In offset order, consecutive objects per task, every object in exactly one task.
    assert [run.key for p in parts for run in p.runs] == archive["keys"]
    assert _rows(parts) == list(range(OBJECTS * PER_OBJECT))  # every row exactly once
    read = metrics.collect(archive["metrics"])
    assert (read["tasks"], read["objects_read"], read["rows"]) == (len(parts), OBJECTS, OBJECTS * PER_OBJECT)


def test_the_open_cost_bounds_objects_per_task(archive):
    object_bytes = _plan(archive, openCostBytes="0")[0].runs[0].nbytes
    parts = _plan(archive, openCostBytes=str(object_bytes), partitionBytesMax=str(6 * object_bytes))
    assert [len(p.runs) for p in parts] == [3] * (OBJECTS // 3)  # each object weighs twice its bytes
    assert _rows(parts) == list(range(OBJECTS * PER_OBJECT))


def test_a_large_object_is_still_split_and_windows_stay_exact(tmp_path):
    produced = _uniform(2000)
    objects_url = f"file://{tmp_path}/objects"
    with open_objects(objects_url) as objects:
        write_archive(objects, None, TOPIC, produced, [(0, 999, "b", 1), (1000, 1999, "b", 1)],
                      block_bytes=1024, zstd_level=0)
    opts = parse_options({"path": f"{objects_url}/default/packing", "partitionBytesMax": "8192",
                          "openCostBytes": "0", "startingOffset": "150", "endingOffset": "1850"})
    parts = plan(opts, opts.bounds)
    assert len(parts) > 2 and all(p.nbytes <= 8192 for p in parts)
    assert _rows(parts) == list(range(150, 1851))


def test_every_packed_object_is_still_held_to_its_descriptor(archive):
    victim = archive["keys"][7]
    path = archive["objects"][len("file://"):] + "/" + victim
    with open(path, "r+b") as f:  # one payload byte of object 7's only block
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    parts = _plan(archive, openCostBytes="0")
    assert len(parts) == 1  # the damaged object shares its task with 41 others
    with pytest.raises(CorruptObject) as info:
        _rows(parts)
    assert info.value.object_name == victim
    skipped = _plan(archive, onCorrupt="skip", openCostBytes="0")
    expected = [o for o in range(OBJECTS * PER_OBJECT) if not 7 * PER_OBJECT <= o < 8 * PER_OBJECT]
    assert _rows(skipped) == expected


def test_a_read_by_location_refuses_offsets_missing_between_objects(tmp_path):
    # Objects 0-24 and 50-74 with 25-49 gone (an interrupted cleanup of retention's
    # leftovers): returning both would skip 25..49 without a word (atk60 f02).
    produced = _uniform(75)
    objects_url = f"file://{tmp_path}/objects"
    with open_objects(objects_url) as objects:
        write_archive(objects, None, TOPIC, produced, [(0, 24, "b", 1), (50, 74, "b", 1)],
                      block_bytes=1 << 20, zstd_level=0)
    opts = parse_options({"path": f"{objects_url}/default/packing"})
    with pytest.raises(ArchiveInconsistent, match="25..49 are in no object"):
        plan(opts, opts.bounds)
    one_side = parse_options({"path": f"{objects_url}/default/packing", "endingOffset": "24"})
    assert _rows(plan(one_side, one_side.bounds)) == list(range(25))


def test_an_inclusive_starting_timestamp_between_two_milliseconds_rounds_up():
    # A message published at ms 1000 is before 1000.5 ms: an inclusive lower bound there
    # must not let it through (atk60 f03); the upper bound rounds down.
    opts = parse_options({"path": "/tmp/x/ns/t", "startingTimestamp": "1970-01-01T00:00:01.000500",
                          "endingTimestamp": "1970-01-01T00:00:02.000500"})
    assert (opts.bounds.time_lo_ms, opts.bounds.time_hi_ms) == (1001, 2000)
    exact = parse_options({"path": "/tmp/x/ns/t", "startingTimestamp": "1970-01-01T00:00:01"})
    assert exact.bounds.time_lo_ms == 1000
