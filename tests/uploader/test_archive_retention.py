"""Archive retention (uploader/archive_retention.py): every precondition of a cut, on
SQLite + local dir and on real etcd + moto (the ``env`` fixture runs each test on both).

A cut raises the persisted archive start (fenced), deletes the descriptors below it
(fenced, batched), then their objects. These tests hold it to: never the tip, only at a
descriptor boundary, never for a fenced owner, never past a hole, every crash point
leaves readers an explanation (OffsetBelowRetention with the first retained offset) and
leaves the rest for the next run or orphan GC.
"""
from __future__ import annotations

import time
import types

import pytest

from tiered.archive import list_descriptors
from tiered.archive.naming import descriptor_object_key, topic_objects_prefix
from tiered.archive.orphans import find_orphans
from tiered.archive.start import OffsetBelowArchiveStart, archive_start, read_archive_start
from tiered.errors import ObjectNotFound
from tiered.lifecycle.restore import BrokenChain, checked_chain_end
from tiered.metadata import keys
from tiered.read.cloud import CloudReader
from tiered.read.errors import DataGap
from tiered.read.reader import create_reader, read_messages
from tiered.read.subscriptions import TopicBounds
from tiered.tools.verify import verify_topic
from uploader import OwnershipLost, Uploader, collect_garbage
from uploader import archive_retention as retention_mod
from uploader import uploader as uploader_mod
from uploader.archive_retention import ArchiveRetention, plan_cut
from uploader.config import ArchiveRetentionConfig, UploaderConfig
from wal.errors import OffsetBelowRetention

from .memwal import MemWal, payload_for

#: Objects of 10 messages each: offsets 0-9, 10-19, ... (upload_once per batch).
PER_OBJECT = 10


class Crash(Exception):
    """A simulated crash at a named step (raised by the fault hook)."""


def build_archive(env, objects: int, wal: MemWal | None = None):
    """An uploader that archived ``objects`` objects of PER_OBJECT messages each."""
    wal = wal or MemWal()
    uploader = env.uploader(wal)
    for _ in range(objects):
        wal.append_n(PER_OBJECT)
        uploader.upload_once()
    descriptors = list_descriptors(env.raw_metadata, env.topic)
    assert [(d.start_offset, d.end_offset) for d in descriptors] == [
        (i * PER_OBJECT, i * PER_OBJECT + PER_OBJECT - 1) for i in range(objects)]
    return uploader, wal, descriptors


def retention(env, clock=time.time, hook=None, fencing=None, **policy) -> ArchiveRetention:
    return ArchiveRetention(env.topic, env.metadata, env.objects, fencing=fencing or env.fencing,
                            policy=ArchiveRetentionConfig(**policy), broker_id="1", epoch=env.owner.epoch,
                            metrics=env.metrics, wall_clock=clock, fault_hook=hook)


def object_keys(env) -> set[str]:
    return {info.key for info in env.raw_objects.list(topic_objects_prefix(env.topic))}


def crash_at(step: str):
    def hook(name: str) -> None:
        if name == step:
            raise Crash(step)
    return hook


def counter(env, name: str, **labels: str) -> float:
    value = env.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# -- the plan (pure) ---------------------------------------------------------------------

def _d(start: int, size: int, created_at: float) -> keys.ObjectDescriptor:
    return keys.ObjectDescriptor(start, start + 9, f"data-{start}-{start + 9}-e1", size, "etag", created_at, "1", 1,
                                 0, "00000000")


def test_plan_by_bytes_removes_oldest_until_the_rest_fits_and_never_the_tip() -> None:
    chain = [_d(0, 100, 0), _d(10, 100, 0), _d(20, 100, 0), _d(30, 100, 0)]
    cut = plan_cut(chain, None, 250, now_s=0)
    assert cut is not None and cut.new_start == 20 and cut.reason == "bytes"
    assert [d.start_offset for d in cut.removed] == [0, 10]
    # A limit of 0 still keeps the last descriptor (the tip restore continues after).
    cut = plan_cut(chain, None, 0, now_s=0)
    assert cut is not None and cut.new_start == 30
    assert plan_cut(chain, None, 400, now_s=0) is None
    assert plan_cut(chain[:1], None, 0, now_s=0) is None


def test_plan_by_age_stops_at_the_first_young_descriptor() -> None:
    chain = [_d(0, 1, 100), _d(10, 1, 200), _d(20, 1, 100), _d(30, 1, 100)]
    cut = plan_cut(chain, 50, None, now_s=160)  # only 0-9 is 50 s old; 10-19 is young and stops it
    assert cut is not None and cut.new_start == 10 and cut.reason == "age"
    cut = plan_cut(chain, 50, None, now_s=10_000)
    assert cut is not None and cut.new_start == 30  # all old: everything but the tip


# -- cuts ----------------------------------------------------------------------------------

def test_cut_by_bytes_raises_the_start_then_deletes_descriptors_and_objects(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 5)
    keys_before = object_keys(env)
    limit = descriptors[3].size + descriptors[4].size  # exactly the two newest objects fit
    run = retention(env, bytes_max=limit).run(uploader.committed_through)
    assert (run.start_before, run.start_after, run.reason) == (0, 30, "bytes")
    assert archive_start(env.raw_metadata, env.topic) == 30
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [30, 40]
    gone = {descriptor_object_key(env.topic, d) for d in descriptors[:3]}
    assert object_keys(env) == keys_before - gone
    assert run.descriptors_deleted == 3 and run.objects_deleted == 3 and run.bytes_deleted == sum(
        d.size for d in descriptors[:3])
    assert counter(env, "dnb_archive_retention_cuts_total", reason="bytes") == 1
    assert counter(env, "dnb_archive_retention_objects_deleted_total") == 3
    record, _ = read_archive_start(env.raw_metadata, env.topic)
    assert record is not None and (record.broker_id, record.epoch) == ("1", env.owner.epoch)
    # Readers: below the start is OffsetBelowRetention naming the first retained offset.
    with pytest.raises(OffsetBelowRetention) as caught:
        create_reader(env.topic, None, env.raw_metadata, env.raw_objects, 5, live=False)
    assert isinstance(caught.value, OffsetBelowArchiveStart)
    assert (caught.value.offset, caught.value.first_offset) == (5, 30)
    got = read_messages(create_reader(env.topic, None, env.raw_metadata, env.raw_objects, "earliest", live=False))
    assert [m.offset for m in got] == list(range(30, 50))
    assert all(m.payload == payload_for(m.offset) for m in got)
    assert TopicBounds(env.topic, env.raw_metadata).earliest_offset() == 30
    report = verify_topic(env.topic, env.raw_metadata, env.raw_objects)
    assert report.ok and report.problems == [] and report.archive_first_offset == 30


def test_cut_by_age_uses_the_injected_clock(env, monkeypatch) -> None:
    # Descriptors are stamped with the uploader's wall clock: give each object its own minute.
    now = [1_000_000.0]
    monkeypatch.setattr(uploader_mod, "time", types.SimpleNamespace(
        time=lambda: now[0], monotonic=time.monotonic, sleep=time.sleep))
    wal = MemWal()
    uploader = env.uploader(wal)
    for _ in range(4):
        wal.append_n(PER_OBJECT)
        uploader.upload_once()
        now[0] += 60
    created = [d.created_at for d in list_descriptors(env.raw_metadata, env.topic)]
    assert created == [1_000_000.0, 1_000_060.0, 1_000_120.0, 1_000_180.0]
    # At t0+170 with a 100 s limit, objects stamped t0 and t0+60 are old enough; t0+120 is not.
    assert retention(env, clock=lambda: 1_000_170.0, age_max_s=100).run(uploader.committed_through).start_after == 20
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [20, 30]
    # Long after: everything old, the tip still stays.
    assert retention(env, clock=lambda: 2_000_000.0, age_max_s=100).run(uploader.committed_through).start_after == 30
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [30]


def test_no_limits_keep_everything(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 3)
    run = retention(env).run(uploader.committed_through)
    assert run.start_after == 0 and env.raw_metadata.get(keys.archive_start_key(env.topic)) is None
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors


def test_descriptor_deletes_are_batched(env, monkeypatch) -> None:
    monkeypatch.setattr(retention_mod, "DELETE_BATCH_MAX", 2)
    uploader, _wal, _ = build_archive(env, 6)
    txns = []
    real_txn = env.metadata.txn

    def counting_txn(compare, success, failure=()):
        txns.append(len(success))
        return real_txn(compare, success, failure)

    monkeypatch.setattr(env.metadata, "txn", counting_txn)
    run = retention(env, bytes_max=0).run(uploader.committed_through)
    assert run.start_after == 50 and run.descriptors_deleted == 5
    assert txns == [1, 2, 2, 1]  # the start, then deletes of at most two each
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [50]


def clocked_uploader(env, wal: MemWal, ticks: list[float], **policy) -> Uploader:
    """An uploader whose monotonic clock is ``ticks[0]`` (archive retention's interval)."""
    return Uploader(env.topic, wal, env.metadata, env.objects, broker_id="1", fencing=env.fencing,
                    config=UploaderConfig(compression="none", retry_backoff_s=0.001,
                                          archive_retention=ArchiveRetentionConfig(**policy)),
                    committed_through=None, metrics=env.metrics, clock=lambda: ticks[0])


def test_the_uploader_applies_archive_retention_at_its_check_interval(env) -> None:
    ticks = [0.0]
    wal = MemWal()
    uploader = clocked_uploader(env, wal, ticks, bytes_max=1, check_interval_s=100)
    for tick in (0.0, 10.0, 20.0):  # the check at 0 found one descriptor; the next is due at 100
        ticks[0] = tick
        wal.append_n(PER_OBJECT)
        uploader.upload_once()
    assert archive_start(env.raw_metadata, env.topic) == 0
    ticks[0] = 150.0
    wal.append_n(PER_OBJECT)
    uploader.upload_once()
    assert archive_start(env.raw_metadata, env.topic) == 30
    assert uploader.last_archive_retention is not None and uploader.last_archive_retention.reason == "bytes"
    ticks[0] = 160.0
    wal.append_n(PER_OBJECT)
    uploader.upload_once()  # 40-49 committed; the next check is due at 250
    assert archive_start(env.raw_metadata, env.topic) == 30
    # A drain (the seal's) never deletes anything, whatever is due.
    ticks[0] = 500.0
    wal.append_n(PER_OBJECT)
    uploader.drain()
    assert archive_start(env.raw_metadata, env.topic) == 30
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [30, 40, 50]


# -- fencing -------------------------------------------------------------------------------

def test_a_fenced_owner_can_neither_raise_the_start_nor_delete_anything(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 4)
    keys_before = object_keys(env)
    stale = retention(env, bytes_max=0)
    env.take_over("2")
    with pytest.raises(OwnershipLost):
        stale.run(uploader.committed_through)
    assert env.raw_metadata.get(keys.archive_start_key(env.topic)) is None
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors
    assert object_keys(env) == keys_before
    assert counter(env, "dnb_archive_retention_refused_total", kind="fenced") == 1


def test_a_fenced_owner_cannot_finish_an_interrupted_cut(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 4)
    with pytest.raises(Crash):
        retention(env, bytes_max=0, hook=crash_at("after_start_raised")).run(uploader.committed_through)
    keys_before = object_keys(env)
    env.take_over("2")
    with pytest.raises(OwnershipLost):
        retention(env).run(uploader.committed_through)  # retention off: it only finishes the cut
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors
    assert object_keys(env) == keys_before


@pytest.mark.parametrize("start", [1_000_000, 40, 15], ids=["far past the tip", "past the tip's end", "inside a descriptor"])
@pytest.mark.parametrize("limits", [{}, {"bytes_max": 10**12}], ids=["retention off", "retention on"])
def test_a_start_record_that_names_no_retained_descriptor_deletes_nothing(env, start: int, limits) -> None:
    """A cut's start is always the start of a descriptor it keeps. A start record that is
    not (a flipped digit, a record copied from another topic) must not be "finished" as
    an interrupted cut: that deleted every descriptor and object, the tip included, even
    with retention off (atk28 F3)."""
    uploader, _wal, descriptors = build_archive(env, 4)
    keys_before = object_keys(env)
    env.raw_metadata.put(keys.archive_start_key(env.topic), keys.ArchiveStart(start, "1", 7, time.time()).to_json())
    run = retention(env, **limits).run(uploader.committed_through)
    assert run.refused and run.descriptors_deleted == 0
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors
    assert object_keys(env) == keys_before


@pytest.mark.parametrize("limits", [{}, {"bytes_max": 0}], ids=["retention off", "retention on"])
def test_a_start_record_of_an_epoch_above_the_owners_deletes_nothing(env, limits) -> None:
    """Epochs only grow, and the owner's is the newest: a start record naming a later
    epoch is damaged (or another topic's), even at a descriptor boundary, and must not be
    finished as a cut (atk29 F2: it deleted all but the last descriptor, retention off)."""
    uploader, _wal, descriptors = build_archive(env, 4)
    keys_before = object_keys(env)
    tip_start = descriptors[-1].start_offset
    env.raw_metadata.put(keys.archive_start_key(env.topic),
                         keys.ArchiveStart(tip_start, "nobody", env.owner.epoch + 1, time.time()).to_json())
    run = retention(env, **limits).run(uploader.committed_through)
    assert run.refused and run.descriptors_deleted == 0
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors
    assert object_keys(env) == keys_before


def test_a_fenced_uploader_stops_on_a_retention_refusal(env) -> None:
    ticks = [0.0]
    wal = MemWal()
    uploader = clocked_uploader(env, wal, ticks, bytes_max=0, check_interval_s=100)
    for tick in (0.0, 10.0, 20.0):
        ticks[0] = tick
        wal.append_n(PER_OBJECT)
        uploader.upload_once()
    descriptors = list_descriptors(env.raw_metadata, env.topic)
    env.take_over("2")
    ticks[0] = 200.0  # retention due; nothing new to upload, so only retention writes
    with pytest.raises(OwnershipLost):
        uploader.upload_once()
    assert isinstance(uploader.failed, OwnershipLost)
    assert env.raw_metadata.get(keys.archive_start_key(env.topic)) is None
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors


# -- crash points --------------------------------------------------------------------------

def test_crash_after_the_start_is_raised_is_explained_and_finished_by_the_next_run(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 4)
    keys_before = object_keys(env)
    with pytest.raises(Crash):
        retention(env, bytes_max=0, hook=crash_at("after_start_raised")).run(uploader.committed_through)
    # The start is in place; the descriptors and objects below it are not gone yet.
    assert archive_start(env.raw_metadata, env.topic) == 30
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors
    assert object_keys(env) == keys_before
    # Readers explain it: below the start is OffsetBelowRetention, earliest is the start.
    with pytest.raises(OffsetBelowArchiveStart) as caught:
        create_reader(env.topic, None, env.raw_metadata, env.raw_objects, 0, live=False)
    assert caught.value.first_offset == 30
    got = read_messages(create_reader(env.topic, None, env.raw_metadata, env.raw_objects, "earliest", live=False))
    assert [m.offset for m in got] == list(range(30, 40))
    # Restore still continues at exactly last + 1; verify is ok (a pending warning).
    assert checked_chain_end(env.raw_metadata, env.topic) == 39
    report = verify_topic(env.topic, env.raw_metadata, env.raw_objects)
    assert report.ok, report.problems
    assert [p["kind"] for p in report.problems] == ["retention_pending"]
    # The owner's next run (even with retention switched off) finishes the cut.
    run = retention(env).run(uploader.committed_through)
    assert run.descriptors_deleted == 3 and run.objects_deleted == 3
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [30]
    assert object_keys(env) == {descriptor_object_key(env.topic, descriptors[-1])}
    assert verify_topic(env.topic, env.raw_metadata, env.raw_objects).problems == []


def test_crash_after_descriptors_are_deleted_leaves_orphans_that_gc_collects(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 4)
    with pytest.raises(Crash):
        retention(env, bytes_max=0, hook=crash_at("after_descriptors_deleted")).run(uploader.committed_through)
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [30]
    left = {descriptor_object_key(env.topic, d) for d in descriptors[:3]}
    orphans = find_orphans(env.raw_metadata, env.raw_objects, env.topic)
    assert {o.key for o in orphans} == left
    assert all(o.collectable and o.below_start for o in orphans)
    report = verify_topic(env.topic, env.raw_metadata, env.raw_objects)
    assert report.ok and {p["kind"] for p in report.problems} == {"orphan"}
    assert sorted(collect_garbage(env.raw_metadata, env.raw_objects, env.topic, grace_s=0)) == sorted(left)
    # GC never touched the retained object.
    assert object_keys(env) == {descriptor_object_key(env.topic, descriptors[-1])}
    assert verify_topic(env.topic, env.raw_metadata, env.raw_objects).problems == []


def test_crash_midway_through_the_objects_is_finished_by_gc(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 4)
    one_at_a_time = retention(env, bytes_max=0, hook=crash_at("after_object_deleted"))
    one_at_a_time.object_batch_max = 1
    with pytest.raises(Crash):
        one_at_a_time.run(uploader.committed_through)
    assert len(object_keys(env)) == 3  # one of the three deleted
    assert len(collect_garbage(env.raw_metadata, env.raw_objects, env.topic, grace_s=0)) == 2
    assert object_keys(env) == {descriptor_object_key(env.topic, descriptors[-1])}


def test_gc_never_deletes_a_referenced_object_below_the_start(env) -> None:
    uploader, _wal, _ = build_archive(env, 3)
    with pytest.raises(Crash):
        retention(env, bytes_max=0, hook=crash_at("after_start_raised")).run(uploader.committed_through)
    before = object_keys(env)
    assert collect_garbage(env.raw_metadata, env.raw_objects, env.topic, grace_s=0) == []
    assert object_keys(env) == before


# -- refusals ------------------------------------------------------------------------------

def test_a_hole_above_the_start_is_never_cut_past(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 4)
    env.raw_metadata.delete(keys.descriptor_key(env.topic, 10))  # damage: 10-19 lost
    run = retention(env, bytes_max=0).run(uploader.committed_through)
    assert run.start_after == 0 and run.refused is not None and "gap" in run.refused
    assert env.raw_metadata.get(keys.archive_start_key(env.topic)) is None
    report = verify_topic(env.topic, env.raw_metadata, env.raw_objects)
    assert not report.ok and [p["first_offset"] for p in report.problems if p["kind"] == "gap"] == [10]


def test_nothing_past_the_committed_end_is_cut(env) -> None:
    _uploader, _wal, _ = build_archive(env, 3)
    run = retention(env, bytes_max=0).run(15)  # an uploader that believes only 0-15 committed
    assert run.start_after == 0 and run.refused is not None
    assert run.refused.startswith("new start 20 is past the committed end 15")
    assert retention(env, bytes_max=0).run(None).start_after == 0


# -- readers racing retention --------------------------------------------------------------

def test_a_reader_overtaken_by_retention_gets_offset_below_retention_not_a_gap(env) -> None:
    uploader, _wal, _ = build_archive(env, 4)
    reader = CloudReader(env.topic, env.raw_metadata, env.raw_objects, 0, 39, prefetch_objects=0)
    served = [next(reader).offset for _ in range(5)]  # inside the first object
    retention(env, bytes_max=0).run(uploader.committed_through)  # start -> 30, objects gone
    with pytest.raises(OffsetBelowArchiveStart) as caught:
        for message in reader:
            served.append(message.offset)
    # Whatever was still readable was served in order, nothing skipped, and the error
    # names where the reader stopped and where the topic now starts.
    assert served == list(range(len(served)))
    assert caught.value.offset == len(served) and caught.value.first_offset == 30


def test_a_missing_object_above_the_start_is_still_a_data_gap(env) -> None:
    uploader, _wal, descriptors = build_archive(env, 4)
    limit = sum(d.size for d in descriptors[1:])
    retention(env, bytes_max=limit).run(uploader.committed_through)  # start -> 10
    assert archive_start(env.raw_metadata, env.topic) == 10
    env.raw_objects.delete(descriptor_object_key(env.topic, descriptors[2]))  # damage at 20-29
    reader = create_reader(env.topic, None, env.raw_metadata, env.raw_objects, 10, live=False)
    with pytest.raises(DataGap) as caught:
        read_messages(reader)
    assert not isinstance(caught.value, OffsetBelowRetention)
    assert caught.value.start == 20


def test_a_tiered_reader_created_before_the_cut_ends_with_offset_below_retention(env) -> None:
    """The tiered reader (prefetching in a thread) listed descriptors whose objects the cut
    deleted: it serves what it still holds, in order, then OffsetBelowRetention."""
    # Well past one read batch (64 messages) and its read-ahead: the reader must need an
    # object after the cut deleted it.
    uploader, _wal, _ = build_archive(env, 20)
    reader = create_reader(env.topic, None, env.raw_metadata, env.raw_objects, 0, live=False, prefetch_objects=1)
    served = [next(reader).offset]
    retention(env, bytes_max=0).run(uploader.committed_through)  # start -> 190
    with pytest.raises(OffsetBelowRetention) as caught:
        for message in reader:
            served.append(message.offset)
    assert served == list(range(len(served))) and len(served) < 190
    assert (caught.value.offset, caught.value.first_offset) == (len(served), 190)
    reader.close()
    # A new reader from the offset it names fails the same way; from the start it works.
    with pytest.raises(OffsetBelowRetention):
        create_reader(env.topic, None, env.raw_metadata, env.raw_objects, len(served), live=False)
    again = read_messages(create_reader(env.topic, None, env.raw_metadata, env.raw_objects,
                                        caught.value.first_offset, live=False))
    assert [m.offset for m in again] == list(range(190, 200))


def test_restore_refuses_a_chain_that_does_not_reach_the_start(env) -> None:
    uploader, _wal, _ = build_archive(env, 3)
    retention(env, bytes_max=0).run(uploader.committed_through)
    env.raw_metadata.delete(keys.descriptor_key(env.topic, 20))  # damage: the retained tip gone
    with pytest.raises(BrokenChain):
        checked_chain_end(env.raw_metadata, env.topic)


def test_verify_flags_a_hole_right_at_the_archive_start(env) -> None:
    uploader, _wal, _ = build_archive(env, 4)
    limit = sum(d.size for d in list_descriptors(env.raw_metadata, env.topic)[2:])
    retention(env, bytes_max=limit).run(uploader.committed_through)  # start -> 20
    env.raw_metadata.delete(keys.descriptor_key(env.topic, 20))  # damage: the first retained object
    report = verify_topic(env.topic, env.raw_metadata, env.raw_objects)
    gaps = [(p["first_offset"], p["last_offset"]) for p in report.problems if p["kind"] == "gap"]
    assert not report.ok and gaps == [(20, 29)]
    with pytest.raises(BrokenChain):
        checked_chain_end(env.raw_metadata, env.topic)


def test_descriptors_are_deleted_only_while_the_start_that_covers_them_is_in_place(env) -> None:
    """If the start record is not the one just written (removed or rewritten by anyone
    between the steps), no descriptor is deleted: a chain never loses its head without a
    start that explains it."""
    uploader, _wal, descriptors = build_archive(env, 4)

    def remove_start(step: str) -> None:
        if step == "after_start_raised":
            env.raw_metadata.delete(keys.archive_start_key(env.topic))

    run = retention(env, bytes_max=0, hook=remove_start).run(uploader.committed_through)
    assert run.descriptors_deleted == 0 and run.objects_deleted == 0
    assert list_descriptors(env.raw_metadata, env.topic) == descriptors
    assert verify_topic(env.topic, env.raw_metadata, env.raw_objects).problems == []


def test_a_long_cut_is_spread_over_runs_and_the_uploader_goes_on_at_its_next_pass(env, monkeypatch) -> None:
    monkeypatch.setattr(retention_mod, "CUT_DESCRIPTORS_MAX", 2)
    ticks = [0.0]
    wal = MemWal()
    uploader = clocked_uploader(env, wal, ticks, bytes_max=0, check_interval_s=100)
    for tick in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0):  # six objects; only the first pass was due
        ticks[0] = tick
        wal.append_n(PER_OBJECT)
        uploader.upload_once()
    ticks[0] = 200.0
    uploader.upload_once()
    assert archive_start(env.raw_metadata, env.topic) == 20  # two removed, capped
    assert uploader.last_archive_retention is not None and uploader.last_archive_retention.capped
    ticks[0] = 201.0  # not an interval later: a capped cut goes on at the very next pass
    uploader.upload_once()
    uploader.upload_once()
    assert archive_start(env.raw_metadata, env.topic) == 50
    assert [d.start_offset for d in list_descriptors(env.raw_metadata, env.topic)] == [50]
    assert not uploader.last_archive_retention.capped
