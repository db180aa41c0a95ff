"""The dnb1 source by topic reads only from the archive start (archive retention): a
``startingOffset`` below it is OffsetBelowRetention naming the first retained offset, a
cut's leftover descriptors are never planned, and an object retention deleted after
planning is OffsetBelowRetention in the task, not a gap. A cut that overtakes the plan
itself is planned again from the new start, never reported as damage. Without a Spark
session."""
from __future__ import annotations

import time

import pytest

import tiered.archive.chain as chain_mod
import tiered.archive.start as start_mod
from tests.spark.archive_util import BASE_TIME_MS, Produced, write_archive
from tiered.archive.start import OffsetBelowArchiveStart
from tiered.errors import ObjectNotFound
from tiered.metadata import keys, open_metadata
from tiered.objects import open_objects
from tiered.spark import reading
from tiered.spark.options import parse_options
from tiered.spark.planning import PLAN_ATTEMPTS_MAX, ArchiveInconsistent, plan

TOPIC = "/default/retained"
PER_OBJECT = 10
OBJECTS = 4


@pytest.fixture
def archive(tmp_path):
    return _write(tmp_path, OBJECTS)


@pytest.fixture
def long_archive(tmp_path):
    """Like ``archive`` with 8 objects (0-79), so retention can cut several times."""
    return _write(tmp_path, 8)


def _write(tmp_path, objects_count):
    produced = [Produced(i, BASE_TIME_MS + i, None, {}, f"p-{i}".encode()) for i in range(objects_count * PER_OBJECT)]
    splits = [(i * PER_OBJECT, (i + 1) * PER_OBJECT - 1, "b", 1) for i in range(objects_count)]
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


def _cut(archive, start: int) -> None:
    """What archive retention does, in its order: raise the start, then delete the
    descriptors wholly below it, then their objects."""
    with open_objects(archive["objects"]) as objects, open_metadata(archive["metadata"]) as metadata:
        metadata.put(keys.archive_start_key(TOPIC), keys.ArchiveStart(start, "b", 1, time.time()).to_json())
        for first in range(0, start, PER_OBJECT):
            metadata.delete(keys.descriptor_key(TOPIC, first))
        for key in archive["keys"][: start // PER_OBJECT]:
            if objects.exists(key):
                objects.delete(key)


def _after_start_read(monkeypatch, action) -> None:
    """Run ``action`` once, right after planning first reads the archive start (before it
    lists the descriptors): the race made deterministic."""
    read = start_mod.archive_start
    done = []

    def hooked(meta, topic):
        start = read(meta, topic)
        if not done:
            done.append(action())
        return start

    monkeypatch.setattr(start_mod, "archive_start", hooked)


def _after_listing(monkeypatch, action) -> list[None]:
    """Run ``action`` after every listing of the descriptors (before the footers are
    read); returns the list that counts the listings."""
    entries = chain_mod.DescriptorChain.entries
    listings: list[None] = []

    def hooked(self, *args, **kwargs):
        listed = list(entries(self, *args, **kwargs))
        listings.append(action())
        return iter(listed)

    monkeypatch.setattr(chain_mod.DescriptorChain, "entries", hooked)
    return listings


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


# -- retention overtaking the plan itself --------------------------------------------
def test_a_cut_between_the_start_and_the_listing_plans_from_the_new_start(archive, monkeypatch):
    """The plan read start 20, then the chain begins at 30: the archive is contiguous
    from its new start, not damaged (was: ArchiveInconsistent "not contiguous")."""
    _after_start_read(monkeypatch, lambda: _cut(archive, 30))
    assert _rows(_plan(archive)) == list(range(30, 40))


def test_a_cut_between_the_start_and_the_listing_past_a_starting_offset_is_offset_below_retention(
        archive, monkeypatch):
    _after_start_read(monkeypatch, lambda: _cut(archive, 30))
    with pytest.raises(OffsetBelowArchiveStart) as caught:
        _plan(archive, startingOffset="22")
    assert (caught.value.offset, caught.value.first_offset) == (22, 30)


def test_a_cut_between_two_pages_of_the_listing_plans_from_the_new_start(long_archive, monkeypatch):
    """The chain is listed one descriptor a page; after the page holding 20-29 retention
    cuts to 40, so the next page starts at 40: a cut, not a hole."""
    pages = chain_mod.DescriptorChain._pages
    done = []

    def paged(self, start_after):
        self.page_keys = 1
        for page in pages(self, start_after):
            yield page
            if not done and any(keys.descriptor_start_offset(kv.key) == 20 for kv in page):
                done.append(_cut(long_archive, 40))

    monkeypatch.setattr(chain_mod.DescriptorChain, "_pages", paged)
    assert _rows(_plan(long_archive)) == list(range(40, 80))
    assert done


def test_a_hole_in_the_chain_is_still_inconsistent_when_the_start_did_not_move(archive):
    with open_metadata(archive["metadata"]) as metadata:
        metadata.delete(keys.descriptor_key(TOPIC, 20))  # 20-29 lost, the start still 20
    with pytest.raises(ArchiveInconsistent, match="not contiguous"):
        _plan(archive)


def test_a_cut_between_the_listing_and_the_footers_plans_from_the_new_start(archive, monkeypatch):
    """The descriptor 20-29 was listed, then retention cut it and its object: planned
    again from 30 (was: a bare ObjectNotFound from the footer read)."""
    listings = _after_listing(monkeypatch, lambda: None if len(listings) else _cut(archive, 30))
    assert _rows(_plan(archive)) == list(range(30, 40))
    assert len(listings) == 2


def test_a_cut_between_the_listing_and_the_footers_past_a_starting_offset_is_offset_below_retention(
        archive, monkeypatch):
    listings = _after_listing(monkeypatch, lambda: None if len(listings) else _cut(archive, 30))
    with pytest.raises(OffsetBelowArchiveStart) as caught:
        _plan(archive, startingOffset="22")
    assert (caught.value.offset, caught.value.first_offset) == (22, 30)


def test_an_object_lost_above_the_start_while_planning_is_still_the_stores_error(archive, monkeypatch):
    """Gone between the listing and its footer read, the start not past it: damage."""
    def lose():
        with open_objects(archive["objects"]) as objects:
            objects.delete(archive["keys"][3])  # 30-39

    _after_listing(monkeypatch, lose)
    with pytest.raises(ObjectNotFound):
        _plan(archive)


def test_a_topic_cut_on_every_attempt_fails_with_the_start_after_a_bounded_number_of_plans(
        long_archive, monkeypatch):
    """Retention cuts one more object after every listing: the plan gives up after
    PLAN_ATTEMPTS_MAX listings with OffsetBelowRetention naming the latest start."""
    starts = iter(range(30, 80, PER_OBJECT))
    listings = _after_listing(monkeypatch, lambda: _cut(long_archive, next(starts)))
    with pytest.raises(OffsetBelowArchiveStart) as caught:
        _plan(long_archive)
    assert len(listings) == PLAN_ATTEMPTS_MAX
    assert caught.value.first_offset == 20 + PLAN_ATTEMPTS_MAX * PER_OBJECT
