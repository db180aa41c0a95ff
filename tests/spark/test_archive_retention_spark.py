"""The dnb1 source by topic reads only from the archive start (archive retention): a
``startingOffset`` below it is OffsetBelowRetention naming the first retained offset, a
cut's leftover descriptors are never planned, and an object retention deleted after
planning is OffsetBelowRetention in the task, not a gap. Without a Spark session."""
from __future__ import annotations

import time

import pytest

from tests.spark.archive_util import BASE_TIME_MS, Produced, write_archive
from tiered.archive.start import OffsetBelowArchiveStart
from tiered.errors import ObjectNotFound
from tiered.metadata import keys, open_metadata
from tiered.objects import open_objects
from tiered.spark import reading
from tiered.spark.options import parse_options
from tiered.spark.planning import plan

TOPIC = "/default/retained"
PER_OBJECT = 10
OBJECTS = 4


@pytest.fixture
def archive(tmp_path):
    produced = [Produced(i, BASE_TIME_MS + i, None, {}, f"p-{i}".encode()) for i in range(OBJECTS * PER_OBJECT)]
    splits = [(i * PER_OBJECT, (i + 1) * PER_OBJECT - 1, "b", 1) for i in range(OBJECTS)]
    objects_url, metadata_url = f"file://{tmp_path}/objects", f"sqlite:///{tmp_path}/meta.db"
    with open_objects(objects_url) as objects, open_metadata(metadata_url) as metadata:
        object_keys = write_archive(objects, metadata, TOPIC, produced, splits)
        # A cut to 20 whose descriptor deletes have not happened yet (leftovers 0-19).
        metadata.put(keys.archive_start_key(TOPIC), keys.ArchiveStart(20, "b", 1, time.time()).to_json())
    return {"objects": objects_url, "metadata": metadata_url, "keys": object_keys}


def _plan(archive, **options):
    opts = parse_options({"topic": TOPIC, "metadata": archive["metadata"], "objects": archive["objects"], **options})
    return plan(opts, opts.bounds)


def _rows(parts) -> list[int]:
    return [r["offset"] for p in parts for b in reading.read_partition(p) for r in b.to_pylist()]


def test_reads_only_from_the_archive_start(archive):
    assert _rows(_plan(archive)) == list(range(20, 40))
    assert _rows(_plan(archive, startingOffset="25")) == list(range(25, 40))


def test_a_starting_offset_below_the_start_is_offset_below_retention(archive):
    with pytest.raises(OffsetBelowArchiveStart) as caught:
        _plan(archive, startingOffset="5")
    assert (caught.value.offset, caught.value.first_offset) == (5, 20)


def test_an_object_deleted_by_retention_after_planning_fails_the_task_with_the_start(archive):
    parts = _plan(archive)
    with open_objects(archive["objects"]) as objects, open_metadata(archive["metadata"]) as metadata:
        metadata.put(keys.archive_start_key(TOPIC), keys.ArchiveStart(30, "b", 1, time.time()).to_json())
        objects.delete(archive["keys"][2])  # 20-29, cut since the plan
    with pytest.raises(OffsetBelowArchiveStart) as caught:
        _rows(parts)
    assert caught.value.first_offset == 30


def test_an_object_missing_above_the_start_is_still_the_stores_error(archive):
    parts = _plan(archive)
    with open_objects(archive["objects"]) as objects:
        objects.delete(archive["keys"][3])  # 30-39: damage, not retention
    with pytest.raises(ObjectNotFound):
        _rows(parts)


def test_a_topic_whose_delete_began_is_refused_not_planned_from_its_leftovers(archive):
    """A delete that crashed right after its tombstone (phase ``deleting``) leaves every
    descriptor in place: the source by topic refuses it like every other reader."""
    from tiered.errors import TopicDeleted

    with open_metadata(archive["metadata"]) as metadata:
        tomb = keys.TopicTombstone("deleting", 1, 40, "ops", time.time())
        metadata.put(keys.tombstone_key(TOPIC), tomb.to_json())
    with pytest.raises(TopicDeleted):
        _plan(archive)
