"""Uploader behaviour against local dir + SQLite and against moto + real etcd."""
from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from tiered.archive import last_committed_offset, list_descriptors
from tiered.archive.naming import object_id_for, object_key
from tiered.archive.orphans import find_orphans
from tiered.errors import OperationTimeout, StorageUnavailable
from tiered.metadata import keys
from tiered.metadata.base import value_is
from tiered.objects.base import ObjectStore
from uploader import (
    DrainTimeout,
    Uploader,
    OwnershipLost,
    UploadError,
    UploaderStopped,
)
from uploader.config import UploaderConfig
from uploader.uploader import encode_object

from .invariants import assert_archive
from .memwal import MemWal, frame_for


def test_messages_become_contiguous_descriptors_holding_exactly_their_frames(env):
    wal = MemWal()
    wal.append_n(300)
    up = env.uploader(wal, object_bytes_max=8_000, compression="zstd", zstd_level=1)
    assert up.upload_once() == 299
    descriptors = assert_archive(env, wal.frames, 0, 299)
    assert len(descriptors) > 3  # cut at object_bytes_max
    assert last_committed_offset(env.metadata, env.topic) == 299
    assert descriptors[0].object_id == object_id_for(0, descriptors[0].end_offset, env.owner.epoch)


def test_never_reads_past_the_durable_watermark(local_env):
    wal = MemWal()
    wal.append_n(100, durable=False)
    wal.make_durable(upto=59)
    up = local_env.uploader(wal)
    assert up.upload_once() == 59
    assert list_descriptors(local_env.metadata, local_env.topic)[-1].end_offset == 59
    wal.make_durable()
    assert up.upload_once() == 99
    assert_archive(local_env, wal.frames, 0, 99)


def test_partial_frame_is_never_uploaded_and_does_not_stall(local_env):
    """A read ending inside a frame must not become an object or a checkpoint."""
    wal = MemWal()
    wal.append_n(20)
    wal.read_hook = lambda data: data + frame_for(20)[:7]  # a torn frame after the valid ones
    up = local_env.uploader(wal, retry_attempts_max=1)
    with pytest.raises(UploadError, match="bad frames"):
        up.upload_once()
    assert list_descriptors(local_env.metadata, local_env.topic) == []
    assert list(local_env.raw_objects.list("")) == []
    wal.read_hook = None  # the WAL heals: the next pass starts at a frame boundary, not mid-frame
    assert up.upload_once() == 19
    assert_archive(local_env, wal.frames, 0, 19)


def test_seeded_checkpoint_continues_after_the_sealed_offset(env):
    wal = MemWal(first_offset=22)
    wal.append_n(10)
    up = env.uploader(wal, committed_through=21)
    assert up.upload_once() == 31
    assert_archive(env, wal.frames, 22, 31)


def test_an_existing_identical_object_is_adopted_not_duplicated(env):
    """Crash between PUT and descriptor: the restart lands on the same key and adopts it."""
    wal = MemWal()
    wal.append_n(30)
    key = object_key(env.topic, 0, object_id_for(0, 19, env.owner.epoch))
    env.raw_objects.put(key, encode_object(env.topic, wal.frames(0, 19), UploaderConfig(compression="none")))
    up = env.uploader(wal)
    assert up.upload_once() == 29
    descriptors = assert_archive(env, wal.frames, 0, 29)
    assert descriptors[0].object_id == object_id_for(0, 19, env.owner.epoch)  # cut at the orphan's end, adopted


def test_another_epochs_object_is_neither_adopted_nor_touched(env):
    """Keys carry the writer's epoch: a previous owner's object is never ours to adopt."""
    wal = MemWal()
    wal.append_n(30)
    theirs = object_key(env.topic, 0, object_id_for(0, 19, env.owner.epoch - 1))
    data = encode_object(env.topic, wal.frames(0, 19), UploaderConfig(compression="none"))
    env.raw_objects.put(theirs, data)
    up = env.uploader(wal)
    assert up.upload_once() == 29
    (d,) = assert_archive(env, wal.frames, 0, 29, gc=False)
    assert d.object_id == object_id_for(0, 29, env.owner.epoch)
    assert env.raw_objects.get(theirs) == data


@pytest.mark.parametrize("foreign", ["other frames", "another topic"])
def test_a_different_object_under_our_key_is_never_overwritten_nor_adopted(env, foreign):
    """Our own key holding another object: keep it, write ours under a nonce-qualified
    name. Either other frames of our topic, or exactly our frames in an object that names
    another topic (copied or restored from another topic's prefix): every reader refuses
    that one, so adopting it would acknowledge offsets as archived that no tier can serve
    once WAL retention removes them (atk58 F01)."""
    wal = MemWal()
    wal.append_n(10)
    key = object_key(env.topic, 0, object_id_for(0, 9, env.owner.epoch))
    if foreign == "other frames":
        data = encode_object(env.topic, b"".join(frame_for(o, salt=5) for o in range(10)),
                             UploaderConfig(compression="none"))
    else:
        data = encode_object("/elsewhere/other", wal.frames(0, 9), UploaderConfig(compression="none"))
    env.raw_objects.put(key, data)
    up = env.uploader(wal)
    assert up.upload_once() == 9
    assert env.raw_objects.get(key) == data
    (d,) = assert_archive(env, wal.frames, 0, 9)
    assert d.object_id.startswith(object_id_for(0, 9, env.owner.epoch) + "-")


class _IgnoresConditionalPut(ObjectStore):
    """A store whose server ignores If-None-Match: every put overwrites."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner

    def put(self, key, data, if_absent=False):
        return self.inner.put(key, data, if_absent=False)

    def get(self, key):
        return self.inner.get(key)

    def get_range(self, key, byte_range):
        return self.inner.get_range(key, byte_range)

    def head(self, key):
        return self.inner.head(key)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def delete(self, key):
        return self.inner.delete(key)


def test_a_stale_owner_never_replaces_the_new_owners_object_even_without_conditional_puts(env):
    """A's lease lapsed, B took over and archived 5-9; A's next pass must not touch B's
    object even when the server ignores If-None-Match (epochs make the keys disjoint)."""
    lying = _IgnoresConditionalPut(env.raw_objects)
    wal_a = MemWal()
    wal_a.append_n(10, durable=False)
    wal_a.make_durable(upto=4)
    stale = Uploader(env.topic, wal_a, env.metadata, lying, broker_id=1, fencing=env.fencing,
                     config=UploaderConfig(compression="none", retry_backoff_s=0.001),
                     committed_through=None, metrics=env.metrics)
    assert stale.upload_once() == 4
    env.take_over("2")
    successor = keys.Ownership.from_json(keys.owner_key(env.topic),
                                         env.raw_metadata.get(keys.owner_key(env.topic)).value)
    wal_b = MemWal(first_offset=5)
    wal_b.append_n(5, salt=1000)  # B's own, different messages at 5-9
    fresh = Uploader(env.topic, wal_b, env.metadata, lying, broker_id=2,
                     fencing=[value_is(keys.owner_key(env.topic), successor.to_json())],
                     config=UploaderConfig(compression="none", retry_backoff_s=0.001),
                     committed_through=4, metrics=env.metrics)
    assert fresh.upload_once() == 9
    wal_a.make_durable()  # A resumes with its own 5-9 and uploads before it notices
    with pytest.raises(OwnershipLost):
        stale.upload_once()
    b_frames = {o: frame_for(o, salt=1000) for o in range(5, 10)}
    assert_archive(env, lambda a, b: b"".join(wal_a.frames(o, o) if o < 5 else b_frames[o]
                                               for o in range(a, b + 1)), 0, 9, gc=False)


@pytest.mark.parametrize("when", ["before", "after"])
def test_put_failure_is_retried_and_recovers(env, when):
    wal = MemWal()
    wal.append_n(50)
    env.faulty_objects.faults.fail("put", when=when, times=2)
    up = env.uploader(wal)
    assert up.upload_once() == 49
    assert_archive(env, wal.frames, 0, 49)


@pytest.mark.parametrize("error", [StorageUnavailable, OperationTimeout])
def test_put_succeeds_but_descriptor_commit_fails(env, error):
    """The txn lands but the caller sees an error (after), or it never lands (before)."""
    wal = MemWal()
    wal.append_n(40)
    env.faulty_metadata.faults.fail("txn", error=error, when="after", times=1)
    env.faulty_metadata.faults.fail("txn", error=error, when="before", nth=2)
    up = env.uploader(wal, object_bytes_max=2_000)
    assert up.upload_once() == 39
    assert_archive(env, wal.frames, 0, 39)


def test_metadata_unavailable_fails_the_pass_then_recovers(env):
    wal = MemWal()
    wal.append_n(40)
    fault = env.faulty_metadata.faults.fail("txn", times=None)
    up = env.uploader(wal, retry_attempts_max=3)
    with pytest.raises(StorageUnavailable):
        up.upload_once()
    assert list_descriptors(env.raw_metadata, env.topic) == []
    orphans = find_orphans(env.raw_metadata, env.raw_objects, env.topic)
    assert [o.collectable for o in orphans] == [False]  # beyond the tip: adoptable, kept
    fault.times = 0
    assert up.upload_once() == 39
    assert_archive(env, wal.frames, 0, 39)


def test_second_owner_fences_the_stale_uploader(env):
    wal = MemWal()
    wal.append_n(20)
    up = env.uploader(wal)
    assert up.upload_once() == 19
    env.take_over()
    wal.append_n(5)
    with pytest.raises(OwnershipLost):
        up.upload_once()
    assert up.failed is not None
    assert last_committed_offset(env.metadata, env.topic) == 19
    with pytest.raises(UploaderStopped):
        up.wait_archived(24, timeout_s=0.1)


def test_two_uploaders_racing_keep_the_chain_contiguous(env):
    """Contiguity compare: two writers extending the same tip never both win. (One owner
    runs one uploader; a second one of the same owner is a bug, so the loser of a race,
    which then finds a descriptor it did not commit past its own, stops with
    ForeignDescriptor rather than counting it as its progress.)"""
    from uploader import ForeignDescriptor

    wal = MemWal()
    wal.append_n(200)
    ups = [env.uploader(wal, object_bytes_max=1_500) for _ in range(2)]

    def upload(up: Uploader) -> None:
        with contextlib.suppress(ForeignDescriptor):
            up.upload_once()

    threads = [threading.Thread(target=upload, args=(u,)) for u in ups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(u.failed is None or isinstance(u.failed, ForeignDescriptor) for u in ups)
    survivor = next((u for u in ups if u.failed is None), None) or env.uploader(wal, object_bytes_max=1_500)
    assert survivor.upload_once() == 199
    assert_archive(env, wal.frames, 0, 199)


def test_drain_archives_to_the_tip_for_seal(env):
    wal = MemWal()
    wal.append_n(70, durable=False)
    wal.make_durable(upto=30)
    up = env.uploader(wal)
    flusher = threading.Timer(0.05, wal.make_durable)
    flusher.start()
    assert up.drain(timeout_s=10) == 69
    assert_archive(env, wal.frames, 0, 69)


def test_drain_with_storage_down_fails_in_bounded_time_and_keeps_the_wal(local_env):
    wal = MemWal(segment_frames=10)
    wal.append_n(45)
    local_env.faulty_objects.faults.fail("put", times=None)
    up = local_env.uploader(wal, retry_attempts_max=1000, retention=__import__("uploader").RetentionConfig(age_max_s=0))
    with pytest.raises(DrainTimeout) as info:
        up.drain(timeout_s=0.3)
    assert isinstance(info.value.__cause__, StorageUnavailable)
    assert wal.truncations == [] and wal.first_offset == 0


def test_drain_of_an_empty_wal_returns_the_seed(local_env):
    assert local_env.uploader(MemWal(first_offset=5), committed_through=4).drain(1) == 4
    assert local_env.uploader(MemWal()).drain(1) is None


def test_retention_deletes_only_committed_segments(local_env):
    from uploader import RetentionConfig

    wal = MemWal(segment_frames=10)
    wal.append_n(55, durable=False)
    wal.make_durable(upto=34)
    up = local_env.uploader(wal, retention=RetentionConfig(age_max_s=0))
    assert up.upload_once() == 34
    assert wal.truncations and max(wal.truncations) <= 35
    assert wal.first_offset == 30  # segment 30-39 holds uncommitted offsets: kept whole
    assert all(s.base_offset >= 30 for s in wal.segments())


def test_retention_by_size_keeps_the_newest_committed_segments(local_env):
    from uploader import RetentionConfig

    wal = MemWal(segment_frames=10)
    wal.append_n(60)
    seg_bytes = wal.segments()[0].size_bytes
    up = local_env.uploader(wal, retention=RetentionConfig(bytes_max=3 * seg_bytes))
    up.upload_once()
    assert wal.first_offset == 30


def test_wait_archived_triggers_an_early_upload(local_env):
    wal = MemWal()
    wal.append_n(10)
    up = local_env.uploader(wal, interval_s=3600, poll_interval_s=0.02)
    up.start()
    try:
        assert up.wait_archived(9, timeout_s=10)
        wal.append_n(5)
        assert asyncio.run(up.wait_archived_async(14, timeout_s=10))
        assert not up.wait_archived(99, timeout_s=0.05)
    finally:
        assert up.stop(5)


def test_byte_threshold_triggers_an_upload_before_the_interval(local_env):
    wal = MemWal()
    up = local_env.uploader(wal, interval_s=3600, poll_interval_s=0.02, upload_bytes_threshold=5_000)
    up.start()
    try:
        wal.append_n(5)
        threading.Event().wait(0.2)
        assert up.committed_through is None  # below the threshold: waits for the interval
        wal.append_n(100)
        assert up.wait_archived(104, timeout_s=10) or up.committed_through is not None
    finally:
        up.stop(5)


def test_gc_deletes_orphans_in_offset_order_so_a_run_cut_short_leaves_no_hole(local_env, monkeypatch):
    """Keys sort as text (data-1, data-10, data-11, data-2): deleting in that order and
    stopping part-way (a crash, a store error) left holes among retention's leftovers, which
    a read by location then skipped without a word (atk60 f02). Offset order leaves the
    rest contiguous."""
    from uploader import collect_garbage

    wal = MemWal()
    wal.append_n(30)
    local_env.uploader(wal, object_bytes_max=1_500).upload_once()
    orphans = [object_key(local_env.topic, start, f"data-{start}-{start}") for start in (1, 2, 10, 11)]
    for key in orphans:
        local_env.raw_objects.put(key, b"x")
    real_delete, deleted = local_env.objects.delete, []

    def delete_twice_then_fail(key: str) -> None:
        if len(deleted) == 2:
            raise StorageUnavailable("the store went away")
        deleted.append(key)
        real_delete(key)
    monkeypatch.setattr(local_env.objects, "delete", delete_twice_then_fail)
    with pytest.raises(StorageUnavailable):
        collect_garbage(local_env.metadata, local_env.objects, local_env.topic, grace_s=0)
    assert deleted == orphans[:2]


def test_gc_removes_only_unreferenced_objects_below_the_tip_after_grace(local_env):
    from uploader import collect_garbage

    wal = MemWal()
    wal.append_n(30)
    up = local_env.uploader(wal, object_bytes_max=1_500)
    up.upload_once()
    stale = object_key(local_env.topic, 0, "data-0-3")  # an old, superseded cut
    ahead = object_key(local_env.topic, 30, object_id_for(30, 40, local_env.owner.epoch))  # may be adopted
    for key in (stale, ahead):
        local_env.raw_objects.put(key, b"x")
    assert collect_garbage(local_env.metadata, local_env.objects, local_env.topic, grace_s=3600) == []
    assert collect_garbage(local_env.metadata, local_env.objects, local_env.topic, grace_s=0) == [stale]
    assert [o.key for o in find_orphans(local_env.metadata, local_env.objects, local_env.topic)] == [ahead]
    assert_archive(local_env, wal.frames, 0, 29, gc=False)


def test_real_wal_round_trip_and_retention_keeps_uncommitted_segments(local_env, tmp_path):
    from uploader import RetentionConfig
    from wal import WriteAheadLog
    from wal.config import WalConfig

    wal = WriteAheadLog.open(str(tmp_path / "wal"), local_env.topic, WalConfig(segment_bytes_max=2_000))
    try:
        for i in range(120):
            wal.append(b"p%03d" % i * 10, publish_time=1_700_000_000_000)
            if i % 10 == 9:
                wal.flush(10)  # segments are cut between write batches
        expected = {}
        frames, _, _ = wal.read_frames(0, 1 << 30)
        while True:  # the WAL stops reads at segment ends: collect every frame once
            import native

            scan = native.scan_frames(frames, 0, None, None, False, True, None)
            for idx, pos in enumerate(scan.positions):
                end = scan.positions[idx + 1] if idx + 1 < scan.count else scan.end
                expected[scan.first_offset + idx] = frames[pos:end]
            if scan.last_offset >= 119:
                break
            frames, _, _ = wal.read_frames(scan.last_offset + 1, 1 << 30)
        up = local_env.uploader(wal, object_bytes_max=3_000, retention=RetentionConfig(age_max_s=0))
        wal_tip_uncommitted = 119
        assert up.upload_once() == wal_tip_uncommitted
        assert_archive(local_env, lambda a, b: b"".join(expected[o] for o in range(a, b + 1)), 0, 119)
        assert wal.first_offset > 0  # committed sealed segments went
        assert wal.segments()[-1].last_offset == 119  # the active segment is never deleted
        for i in range(10):
            wal.append(b"late", publish_time=1_700_000_000_000)
        wal.flush(10)
        first_before = wal.first_offset
        assert up.upload_once() == 129
        assert wal.first_offset >= first_before
        assert all(s.last_offset <= 129 for s in wal.segments())
    finally:
        wal.close()


def test_stale_uploader_never_adopts_the_new_owners_chain_as_its_own(env):
    """A fenced owner whose cached chain tip was dropped (any transient metadata error
    does that) re-read the chain, found the NEW owner's descriptors for the offsets it
    had itself assigned to other messages, advanced committed_through over them and
    answered its "archived" waiters with success — for messages never archived — and,
    finding nothing past that end to upload, never noticed it was fenced (retention
    would then also delete its unarchived segments, the very evidence of the loss)."""
    from tiered.metadata import keys
    from tiered.metadata.base import value_is
    from uploader import Uploader

    wal_a = MemWal()
    wal_a.append_n(20)
    up_a = env.uploader(wal_a)
    assert up_a.upload_once() == 19
    env.take_over()  # B takes over at 20
    b_fencing = [value_is(keys.owner_key(env.topic), env.raw_metadata.get(keys.owner_key(env.topic)).value)]
    wal_b = MemWal(first_offset=20)
    wal_b.append_n(10, salt=1)  # B's messages 20..29
    up_b = Uploader(env.topic, wal_b, env.raw_metadata, env.raw_objects, broker_id=2, fencing=b_fencing,
                    config=UploaderConfig(compression="none"), committed_through=19, metrics=env.metrics)
    assert up_b.upload_once() == 29
    wal_a.append_n(5)  # the stale owner still hands out 20..24 for its own messages
    env.faulty_metadata.faults.fail("txn", times=1)  # one transient commit error: tip dropped
    with pytest.raises(OwnershipLost):
        up_a.upload_once()
    assert up_a.committed_through == 19
    with pytest.raises(UploaderStopped):
        up_a.wait_archived(22, timeout_s=0.1)


def test_a_pass_stops_at_the_durable_tip_it_started_with(local_env):
    """A pass that chased a tip moving under it cut one small object per fsync while
    producers were active; what becomes durable during a pass waits for the next one."""
    wal = MemWal()
    wal.append_n(10)
    grown = []

    def producer_keeps_going(data: bytes) -> bytes:
        if len(grown) < 5:  # each read of the pass sees 10 more durable messages
            grown.append(1)
            wal.append_n(10)
        return data

    wal.read_hook = producer_keeps_going
    up = local_env.uploader(wal)
    assert up.upload_once() == 9
    assert [(d.start_offset, d.end_offset) for d in list_descriptors(local_env.metadata, local_env.topic)] == [(0, 9)]
    wal.read_hook = None
    assert up.upload_once() == wal.next_offset - 1  # the next pass takes the rest in one object
    assert len(list_descriptors(local_env.metadata, local_env.topic)) == 2
    assert_archive(local_env, wal.frames, 0, wal.next_offset - 1)


def test_a_drain_still_reaches_the_tip_across_passes(local_env):
    wal = MemWal()
    wal.append_n(10)
    calls = []

    def producer_keeps_going(data: bytes) -> bytes:
        if len(calls) < 3:
            calls.append(1)
            wal.append_n(5)
        return data

    wal.read_hook = producer_keeps_going
    up = local_env.uploader(wal)
    tip = wal.next_offset - 1
    assert up.drain(timeout_s=10) >= tip


def test_a_bounded_pass_cuts_a_read_that_returns_more_than_its_bound(local_env):
    """The WAL returns whole chunks up to its own durable tip, which may have moved past
    the pass's bound while the pass ran: the object must end exactly at the bound."""
    wal = MemWal()
    wal.append_n(10)
    up = local_env.uploader(wal)
    real_read = wal.read_frames

    def read_after_more_became_durable(position, size):
        if wal.next_offset == 10:
            wal.append_n(5)  # durable now, but after the pass took its bound
        return real_read(position, size)

    wal.read_frames = read_after_more_became_durable
    assert up.upload_once() == 9
    assert up.upload_once() == 14
    assert_archive(local_env, wal.frames, 0, 14)


@pytest.mark.parametrize("planted", ["a gap", "past the durable tip", "another epoch", "the tip rewritten longer",
                                     "a forgery of its own next descriptor"])
def test_a_chain_tip_this_uploader_did_not_commit_stops_it_and_keeps_the_wal(local_env, planted):
    """While an uploader owns the topic only it extends the chain, so a tip it re-reads
    (after any storage error) past what it committed must be its own. A damaged or
    hostile descriptor there must stop it with a typed error, not count as progress: that
    acknowledged "archived" for offsets in no object and let WAL retention delete durable
    segments never archived (atk28 F2; atk29 F1: one forged to look like its own next
    commit, which no commit of its own in doubt could be)."""
    from dataclasses import replace

    from tiered.archive.naming import object_id_for
    from uploader import ForeignDescriptor, RetentionConfig
    from uploader.records import encode_descriptor

    wal = MemWal(segment_frames=10)
    wal.append_n(20)
    up = local_env.uploader(wal, retention=RetentionConfig(age_max_s=0))
    assert up.upload_once() == 19
    wal.append_n(40)  # 20-59: durable, not archived
    last = list_descriptors(local_env.raw_metadata, local_env.topic)[-1]
    epoch = last.epoch
    start, end, epoch = {"a gap": (30, 45, epoch), "past the durable tip": (20, 500, epoch),
                         "another epoch": (20, 45, epoch + 1),
                         "the tip rewritten longer": (last.start_offset, 45, epoch),
                         "a forgery of its own next descriptor": (20, 45, epoch)}[planted]
    bad = replace(last, start_offset=start, end_offset=end, epoch=epoch, object_id=object_id_for(start, end, epoch))
    local_env.raw_metadata.put(keys.descriptor_key(local_env.topic, start), encode_descriptor(bad))
    local_env.faulty_objects.faults.fail("put", nth=1)  # the next pass re-reads the tip
    with pytest.raises(ForeignDescriptor):
        up.upload_once()
    assert isinstance(up.failed, ForeignDescriptor)
    with pytest.raises(UploaderStopped):
        up.wait_archived(25, timeout_s=5)
    assert wal.first_offset <= 20, "WAL retention must not pass what this uploader archived itself"
    assert up.committed_through == 19


@pytest.mark.parametrize("retry", ["fails before it is applied", "times out and is applied late too"])
def test_a_commit_applied_late_is_recognised_after_a_failed_retry(env, monkeypatch, retry):
    """A descriptor commit times out and the store applies it later (a paused member);
    the retry's commit fails too. The tip re-read then is the first attempt: this
    uploader's own, and must count as its progress, not stop it as a foreign descriptor
    (atk31 F1: archiving and every unload stopped until a restart)."""
    from tiered.errors import OperationTimeout, StorageUnavailable
    from tiered.metadata.base import Put

    wal = MemWal()
    wal.append_n(20)
    up = env.uploader(wal)
    assert up.upload_once() == 19
    wal.append_n(10)
    real, calls, held = env.faulty_metadata.txn, [], []

    def paused_member(compare, success, failure=()):  # type: ignore[no-untyped-def]
        if not any(isinstance(op, Put) and "/objects/" in op.key for op in success) or len(calls) >= 2:
            return real(compare, success, failure)
        calls.append(success)
        if len(calls) == 1:
            held.append(lambda: real(compare, success, failure))
            raise OperationTimeout("injected: the commit timed out; the member applies it later")
        held.pop()()  # the first attempt lands now, late
        if retry == "fails before it is applied":
            raise StorageUnavailable("injected: the retry never reached the store")
        real(compare, success, failure)  # applied late as well: its compare fails (the key exists)
        raise OperationTimeout("injected: the retry timed out too")

    monkeypatch.setattr(env.faulty_metadata, "txn", paused_member)
    assert up.upload_once() == 29
    assert up.failed is None and len(calls) == 2
    assert_archive(env, wal.frames, 0, 29)
