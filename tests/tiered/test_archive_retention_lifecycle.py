"""Archive retention through the broker host: restore after a cut continues at exactly
last + 1 on another broker, readers and subscription cursors below the archive start get
OffsetBelowRetention (even where the owner's WAL still holds the offsets), and an
interrupted cut is finished by the next owner. Embedded stores and real servers."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tiered.archive import list_descriptors
from tiered.archive.start import OffsetBelowArchiveStart, archive_start
from tiered.lifecycle import BrokerHost
from tiered.lifecycle.restore import read_sealed_state
from tiered.tools.verify import verify_topic
from uploader.config import ArchiveRetentionConfig
from wal.errors import OffsetBelowRetention
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    FAST_BROKER,
    FAST_UPLOADER,
    TOPIC,
    Cluster,
    any_cluster,
    local_cluster,
    payload_for,
    produce_range,
)

#: Keep at most nothing but the tip; checked only when asked (the first pass, then hourly).
CUT_ALL = replace(FAST_BROKER, uploader=replace(
    FAST_UPLOADER, archive_retention=ArchiveRetentionConfig(bytes_max=0, check_interval_s=3600.0)))


class Crash(Exception):
    pass


def archive_in_three_objects(hosted) -> None:
    for first in (0, 10, 20):
        produce_range(hosted, first, first + 9)
        assert hosted.uploader.upload_once() == first + 9


def test_restore_after_a_cut_to_one_descriptor_continues_at_last_plus_one(any_cluster: Cluster) -> None:
    topic = TopicName.parse(TOPIC)
    a, b = any_cluster.broker("A", uploader=CUT_ALL.uploader), any_cluster.broker("B")
    on_a = a.load(TOPIC)
    archive_in_three_objects(on_a)
    sub = on_a.subscribe("s", initial="earliest")
    sub.ack(3)
    sub.flush()
    run = on_a.uploader.archive_retention.run(on_a.uploader.committed_through)
    assert (run.start_after, run.descriptors_deleted) == (20, 2)
    assert [(d.start_offset, d.end_offset) for d in list_descriptors(any_cluster.metadata, TOPIC)] == [(20, 29)]
    # A's WAL still holds 0-29, but below the archive start is gone for every tier.
    with pytest.raises(OffsetBelowRetention) as caught:
        on_a.create_reader(5, live=False)
    assert caught.value.first_offset == 20
    assert a.unload(TOPIC) == 29
    state = read_sealed_state(any_cluster.metadata, topic)
    assert state is not None and state.sealed and state.last_committed_offset == 29

    on_b = b.load(TOPIC)
    assert on_b.next_offset == 30 and on_b.uploader.committed_through == 29
    produce_range(on_b, 30, 34)
    with on_b.create_reader("earliest", live=False) as reader:
        got = [(m.offset, m.payload) for m in reader]
    assert got == [(o, payload_for(o)) for o in range(20, 35)]
    # The subscription's cursor (3) is below the start: its consumer is told where to go.
    sub_b = on_b.subscribe("s")
    assert sub_b.cursor == 3
    with pytest.raises(OffsetBelowArchiveStart) as below:
        on_b.create_reader(sub_b.cursor + 1, live=False)
    assert (below.value.offset, below.value.first_offset) == (4, 20)
    assert on_b.uploader.upload_once() == 34
    report = verify_topic(TOPIC, any_cluster.metadata, any_cluster.objects)
    assert report.ok and report.archive_first_offset == 20
    assert [p["kind"] for p in report.problems] == ["cursor_below_retention"]


def test_an_interrupted_cut_is_finished_by_the_next_owner(any_cluster: Cluster) -> None:
    def crash(step: str) -> None:
        if step == "after_start_raised":
            raise Crash(step)

    a, b = any_cluster.broker("A"), any_cluster.broker("B")
    on_a = a.load(TOPIC)
    archive_in_three_objects(on_a)
    cutter = on_a.uploader.archive_retention
    cutter.policy, cutter.fault_hook = ArchiveRetentionConfig(bytes_max=0), crash
    with pytest.raises(Crash):
        cutter.run(on_a.uploader.committed_through)
    assert archive_start(any_cluster.metadata, TOPIC) == 20
    assert len(list_descriptors(any_cluster.metadata, TOPIC)) == 3  # the cut's leftovers
    assert a.unload(TOPIC) == 29

    on_b = b.load(TOPIC)  # restore judges the chain from the start: not broken
    assert on_b.next_offset == 30
    on_b.uploader.upload_once()  # its first pass finishes the cut (retention itself is off here)
    assert [d.start_offset for d in list_descriptors(any_cluster.metadata, TOPIC)] == [20]
    with on_b.create_reader("earliest", live=False) as reader:
        assert [m.offset for m in reader] == list(range(20, 30))
    report = verify_topic(TOPIC, any_cluster.metadata, any_cluster.objects)
    assert report.ok and report.problems == [], report.problems


#: Retention that keeps only the last object, and tips published only when asked: a
#: broker's acknowledged tail stays unpublished unless a test publishes it.
CUT_ALL_UNPUBLISHED = replace(CUT_ALL, progress_interval_s=3600.0)


def _die(host: BrokerHost) -> None:
    """The broker process dies: no seal, its WALs kept on its disk, its lease gone."""
    for hosted in host.topics():
        host.abandon(hosted.topic)
    host.close(unload=False)


def _sealed_leaving_its_wal(cluster: Cluster, host: BrokerHost) -> str:
    """``host`` (broker A) archives 0-29 in three objects and unloads: the seal lands, but
    the WAL's delete never does (killed in between). Returns the WAL's directory."""
    import os
    import shutil

    on_a = host.load(TOPIC)
    archive_in_three_objects(on_a)
    wal_dir = os.path.join(cluster.wal_root("A"), "default", "reliable_topic")
    on_a.wal.flush()
    copy = os.path.join(cluster.root, "copy")
    shutil.copytree(wal_dir, copy, ignore=shutil.ignore_patterns(".lock"))  # (no .lock in a journaled group)
    assert host.unload(TOPIC) == 29
    host.close()
    shutil.copytree(copy, wal_dir)
    return wal_dir


def test_a_stale_wal_whose_own_descriptors_retention_removed_is_kept_in_quarantine_not_deleted(
        local_cluster: Cluster) -> None:
    """A crash between the seal and the WAL delete leaves a WAL of offsets all archived;
    when it comes back after another owner's retention removed those descriptors, nothing
    this broker still reads proves that THIS WAL's bytes were archived (offsets below the
    archive start were archived by some owner; a failover could have given them to other
    messages). Without that proof the WAL is never deleted: it is quarantined (bytes kept)
    and the unproven range recorded, from the first offset no descriptor of ours covers to
    the archive start: 20-29 are still A's own descriptor, archived and served, and a record
    over them sent their readers back for messages that never changed (atk51 F01)."""
    import os

    from tiered.metadata import keys

    wal_dir = _sealed_leaving_its_wal(local_cluster, local_cluster.broker("A"))

    b = local_cluster.broker("B", uploader=CUT_ALL.uploader)
    on_b = b.load(TOPIC)
    on_b.uploader.archive_retention.run(on_b.uploader.committed_through)
    assert archive_start(local_cluster.metadata, TOPIC) == 20
    b.unload(TOPIC)

    again = local_cluster.broker("A")
    [retired] = again.retired
    assert (retired.first_offset, retired.last_offset, retired.lost_start, retired.lost_end) == (0, 29, 0, 19)
    assert retired.quarantine_path is not None and os.listdir(retired.quarantine_path)
    assert [(r.start_offset, r.end_offset, r.exact, r.quarantine_path)
            for r in keys.read_lost_ranges(local_cluster.metadata, TOPIC)] == [(0, 19, True, retired.quarantine_path)]
    assert not os.path.exists(wal_dir)
    with again.load(TOPIC).create_reader(20, live=False) as reader:  # served, and no record over them
        assert [m.offset for m in reader] == list(range(20, 30))


@pytest.mark.parametrize("cut", [True, False], ids=["cut", "no_cut"])
def test_a_returning_owners_unarchived_wal_is_quarantined_whether_or_not_retention_cut_the_takeover(
        local_cluster: Cluster, monkeypatch, cut: bool) -> None:
    """A archives 0-29 and holds 30-99 durable only, then dies; B takes over at 30 and
    archives to 179. With a cut, retention removes every descriptor that overlapped A's
    WAL (the evidence of the takeover). A's ``.owner`` marker is lost and its first load
    fails after the acquire (it keeps ownership, so the owner record names A again).

    A's WAL must end the same way with or without the cut: 30-99 were acknowledged and
    never archived, so the WAL is quarantined and the exact LostRange 30-99 written. Its
    offsets lying below the archive start is no proof that THIS WAL's bytes were archived
    (another owner archived other messages under those numbers)."""
    import os

    from tiered.lifecycle import BrokerHost
    import tiered.lifecycle.host as host_module
    from tiered.metadata import keys

    a = local_cluster.broker("A")
    on_a = a.load(TOPIC)
    archive_in_three_objects(on_a)
    produce_range(on_a, 30, 99)  # durable on A only (epoch 1)
    on_a.wal.flush()
    _die(a)

    b = local_cluster.broker("B", uploader=CUT_ALL.uploader)
    on_b = b.load(TOPIC)
    assert on_b.next_offset == 30
    for first in range(30, 180, 10):
        produce_range(on_b, first, first + 9)
        assert on_b.uploader.upload_once() == first + 9
    if cut:
        run = on_b.uploader.archive_retention.run(on_b.uploader.committed_through)
        assert run.start_after == 170
        assert [d.start_offset for d in list_descriptors(local_cluster.metadata, TOPIC)] == [170]
    for hosted in b.topics():
        b.abandon(hosted.topic)
    b.close(unload=False)

    root_a = local_cluster.wal_root("A")
    wal_dir = os.path.join(root_a, "default", "reliable_topic")
    os.remove(os.path.join(wal_dir, ".owner"))  # the marker is lost
    again = BrokerHost("A", root_a, local_cluster.metadata, local_cluster.objects, local_cluster.config,
                       retire_stale_wals=False)
    local_cluster.hosts.append(again)
    real_plan = host_module.plan_restore
    calls = {"n": 0}

    def plan_failing_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise TimeoutError("injected: metadata read timed out")
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(host_module, "plan_restore", plan_failing_once)
    with pytest.raises(TimeoutError):
        again.load(TOPIC)  # fails after the acquire: A keeps ownership at epoch 3
    hosted = again.load(TOPIC)
    assert hosted.next_offset == 180
    assert not hosted.report.recovered_local_wal
    [retired] = again.retired
    assert (retired.first_offset, retired.last_offset, retired.lost_start, retired.lost_end, retired.epoch) == (
        0, 99, 30, 99, 1)
    assert retired.quarantine_path is not None
    assert any(name.endswith(".seg") for name in os.listdir(retired.quarantine_path)), "the only copy is gone"
    exact = [r for r in keys.read_lost_ranges(local_cluster.metadata, TOPIC) if r.exact]
    assert [(r.start_offset, r.end_offset, r.broker_id, r.epoch, r.quarantine_path) for r in exact] == [
        (30, 99, "A", 1, retired.quarantine_path)]


def test_retention_and_verify_start_a_recreated_topic_at_its_incarnations_first_offset(
        local_cluster: Cluster) -> None:
    """A deleted and re-created topic continues its numbering past the deleted
    incarnation (here at 30): the archive starts there. Retention checks the retained
    chain from there (it used to see a "gap at 0" and refuse every cut, letting the
    archive grow without bound), and verify reports no gap 0-29 and no cursor below it."""
    a = local_cluster.broker("A", uploader=CUT_ALL.uploader)
    archive_in_three_objects(a.load(TOPIC))
    a.delete(TOPIC)
    hosted, fresh = a.create(TOPIC)
    assert fresh and hosted.next_offset == 30
    assert archive_start(local_cluster.metadata, TOPIC) == 30
    report = verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects)
    assert report.ok and report.problems == [], report.problems  # nothing archived yet: no gap either
    sub = hosted.subscribe("s", initial="earliest")
    for first in (30, 40, 50):
        produce_range(hosted, first, first + 9)
        assert hosted.uploader.upload_once() == first + 9
    sub.ack(39)
    sub.flush()
    report = verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects)
    assert report.ok and report.problems == [], report.problems
    assert report.archive_start == 30

    run = hosted.uploader.archive_retention.run(hosted.uploader.committed_through)
    assert run.refused is None, run.refused
    assert (run.start_before, run.start_after, run.descriptors_deleted) == (30, 50, 2)
    assert [d.start_offset for d in list_descriptors(local_cluster.metadata, TOPIC)] == [50]
    report = verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects)
    assert report.archive_start == 50 and report.archive_first_offset == 50
    assert [p["kind"] for p in report.problems] == ["cursor_below_retention"]


def test_an_archived_produce_completes_while_a_cuts_object_deletes_are_blocked(local_cluster: Cluster) -> None:
    """A cut's object deletes (step 3) run outside the uploader's pass lock and off its
    pass: with every object delete blocked, archived produces still complete (their
    descriptors are committed), and the blocked objects are deleted once released."""
    import threading

    from tiered.lifecycle import BrokerHost
    from tiered.objects.local import LocalObjectStore

    entered, release = threading.Event(), threading.Event()

    class BlockedDeletes(LocalObjectStore):
        def _blocked(self) -> None:
            entered.set()
            assert release.wait(120), "never released"

        def delete(self, key: str) -> None:
            self._blocked()
            super().delete(key)

        def delete_many(self, keys) -> None:
            self._blocked()
            super().delete_many(keys)

    objects = BlockedDeletes(f"{local_cluster.root}/objects")
    every_pass = replace(FAST_BROKER, produce_timeout_s=30.0, uploader=replace(
        FAST_UPLOADER, archive_retention=ArchiveRetentionConfig(bytes_max=0, check_interval_s=1e-6)))
    host = BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, objects, every_pass)
    local_cluster.hosts.append(host)
    hosted = host.load(TOPIC)
    try:
        offset = 0
        while not entered.is_set():  # each archived produce commits an object; the next pass cuts the older
            assert hosted.produce(payload_for(offset), ack="archived") == offset
            offset += 1
            assert offset < 50, "no cut deleted an object"
        # A cut's deletes are blocked now: archived produces still go through.
        for _ in range(3):
            assert hosted.produce(payload_for(offset), ack="archived") == offset
            offset += 1
        assert hosted.uploader.committed_through == offset - 1
    finally:
        release.set()
    assert hosted.uploader.wait_object_deletes(120)
    start = archive_start(local_cluster.metadata, TOPIC)
    assert start > 0
    hosted.uploader.upload_once()  # nothing is left below the start once its deletes ran
    from tiered.archive.orphans import find_orphans
    assert [o.key for o in find_orphans(local_cluster.metadata, objects, TOPIC) if o.below_start] == []


def test_a_retry_of_an_interrupted_quarantine_keeps_the_record_below_the_archive_start(
        local_cluster: Cluster) -> None:
    """The case above, with the quarantine move failing part-way (the first segments moved,
    the record written): the retry moved the rest under the same record but took the
    record to the WAL's tip, over 20-29 that this broker archived and that are served (a
    randomized checker's seed). The retry ends the account where the first part did."""
    import os

    from tiered.metadata import keys
    from wal.config import WalConfig
    from wal.fs import RealFs

    class FailsOneMove(RealFs):
        armed = True

        def rename(self, src: str, dst: str) -> None:
            if self.armed and ".quarantine" in dst and src.endswith(".seg") and os.path.basename(src) != first_seg:
                self.armed = False
                raise OSError(5, "injected: the move of a segment into quarantine failed")
            super().rename(src, dst)

    small = replace(local_cluster.config, wal_config=WalConfig(segment_bytes_max=300))
    a = BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, local_cluster.objects, small)
    local_cluster.hosts.append(a)
    wal_dir = _sealed_leaving_its_wal(local_cluster, a)
    segments = sorted(n for n in os.listdir(wal_dir) if n.endswith(".seg"))
    assert len(segments) > 2
    first_seg = segments[0]

    b = local_cluster.broker("B", uploader=CUT_ALL.uploader)
    on_b = b.load(TOPIC)
    on_b.uploader.archive_retention.run(on_b.uploader.committed_through)
    assert archive_start(local_cluster.metadata, TOPIC) == 20
    b.unload(TOPIC)

    interrupted = BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, local_cluster.objects,
                             small, wal_fs=FailsOneMove())
    local_cluster.hosts.append(interrupted)
    assert interrupted.retired == [] and os.path.exists(wal_dir)  # the move failed part-way
    [record] = keys.read_lost_ranges(local_cluster.metadata, TOPIC)
    assert (record.start_offset, record.end_offset) == (0, 19)
    interrupted.close()
    again = BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, local_cluster.objects, small)
    local_cluster.hosts.append(again)
    [retired] = again.retired
    assert not os.path.exists(wal_dir)
    assert [(r.start_offset, r.end_offset, r.quarantine_path)
            for r in keys.read_lost_ranges(local_cluster.metadata, TOPIC)] == [(0, 19, retired.quarantine_path)]


def test_a_stale_wal_with_an_unreadable_marker_below_a_cut_is_recorded_only_below_the_start(
        local_cluster: Cluster) -> None:
    """A archives 0-29 and dies with its WAL; B's takeover records "A@1 lost nothing from
    30" and its retention cuts the archive to 20; the WAL's ``.owner`` marker rots. Without
    a marker, a record starting right past the WAL's tip is no proof that it is all
    archived, and A's own descriptors below 20 are gone: the WAL is quarantined, and its
    record ends below the archive start, not over 20-29, which A archived and which are
    served (a randomized checker's seed, 275 FOCUS=1)."""
    import os

    from tiered.metadata import keys

    a = local_cluster.broker("A")
    archive_in_three_objects(a.load(TOPIC))
    _die(a)
    b = local_cluster.broker("B", uploader=CUT_ALL.uploader)
    on_b = b.load(TOPIC)
    assert on_b.next_offset == 30
    on_b.uploader.archive_retention.run(on_b.uploader.committed_through)
    assert archive_start(local_cluster.metadata, TOPIC) == 20
    b.unload(TOPIC)
    wal_dir = os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic")
    with open(os.path.join(wal_dir, ".owner"), "r+b") as f:
        f.seek(3)
        f.write(b"\xff")

    again = local_cluster.broker("A")
    [retired] = again.retired
    assert retired.quarantine_path is not None and not os.path.exists(wal_dir)
    mine = [(r.start_offset, r.end_offset) for r in keys.read_lost_ranges(local_cluster.metadata, TOPIC)
            if r.quarantine_path is not None]
    assert mine == [(0, 19)]


def test_a_record_is_never_ended_at_the_archive_start_by_a_later_historys_descriptors(
        local_cluster: Cluster) -> None:
    """atk54 F01: A@1 (disk-0) acknowledges 5-20 durable only, its tip published at 10,
    and a backup of disk-0 is taken at 10. B takes over at 5 and archives 5-6; A@3
    (disk-1) takes over at 7, archives up to 26 and its retention cuts the archive to
    12. The backup is retired first (A@1's record, exact 5-10), then the real WAL (tip
    20). Its record was ended at 11 because A@3's descriptors "covered" 12-20: other
    messages under renumbered offsets. A@1's acknowledged 12-20, in the quarantine, were
    recorded nowhere. Only descriptors of the WAL's own history and earlier ones count."""
    import os
    import shutil

    from tiered.lifecycle import BrokerHost
    from tiered.metadata import keys

    def on(broker_id: str, disk: str) -> BrokerHost:
        return local_cluster.on_disk(broker_id, disk, CUT_ALL_UNPUBLISHED)

    a = on("A", "disk-0")
    first = a.load(TOPIC)
    produce_range(first, 0, 4, ack="archived")
    produce_range(first, 5, 10)
    first.publish_progress()
    first.wal.flush()
    shutil.copytree(os.path.join(local_cluster.root, "disk-0"), os.path.join(local_cluster.root, "disk-2"),
                    ignore=shutil.ignore_patterns(".lock"))
    produce_range(first, 11, 20)  # acknowledged; the broker dies before its tip is published
    first.publish_progress = lambda *args, **kwargs: False  # type: ignore[method-assign]
    _die(a)
    b = on("B", "disk-b")
    produce_range(b.load(TOPIC), 5, 6, ack="archived")
    _die(b)
    a = on("A", "disk-1")
    later = a.load(TOPIC)
    assert later.next_offset == 7
    produce_range(later, 7, 11, ack="archived")
    produce_range(later, 12, 25)
    produce_range(later, 26, 26, ack="archived")
    later.uploader.archive_retention.run(later.uploader.committed_through)
    assert archive_start(local_cluster.metadata, TOPIC) == 12
    _die(a)
    b = on("B", "disk-b")
    b.load(TOPIC)
    _die(b)
    _die(on("A", "disk-2"))  # the backup: A@1's record, 5-10
    _die(on("A", "disk-0"))  # the real WAL, tip 20
    [record] = [r for r in keys.read_lost_ranges(local_cluster.metadata, TOPIC) if (r.broker_id, r.epoch) == ("A", 1)]
    assert record.start_offset == 5 and record.end_offset == 20, record


def test_a_later_epoch_that_recovered_the_wal_on_its_disk_archived_its_own_messages(
        local_cluster: Cluster) -> None:
    """atk55 F01: A@1 archives 0-14 and holds 15-20 durable only; a backup of its disk is
    taken; A restarts on the same disk (epoch 2), recovers the WAL, archives 15-20 (A@1's
    own messages, no takeover in between) and more; retention cuts the archive to 15; A
    unloads. The backup comes back: only A@1's own descriptors counted, so its record ran
    to 20, over offsets archived and served unchanged. A later epoch counts below where a
    takeover renumbered the history, and here none did: the record ends at 14."""
    import os
    import shutil

    from tiered.metadata import keys

    def on(disk: str) -> BrokerHost:
        return local_cluster.on_disk("A", disk, CUT_ALL_UNPUBLISHED)

    a = on("disk-0")
    first = a.load(TOPIC)
    produce_range(first, 0, 14, ack="archived")
    produce_range(first, 15, 20)
    first.wal.flush()
    shutil.copytree(os.path.join(local_cluster.root, "disk-0"), os.path.join(local_cluster.root, "disk-2"),
                    ignore=shutil.ignore_patterns(".lock"))
    _die(a)
    a = on("disk-0")
    recovered = a.load(TOPIC)
    assert recovered.token.epoch == 2 and recovered.next_offset == 21
    produce_range(recovered, 21, 24)
    produce_range(recovered, 25, 25, ack="archived")  # one object, 15-25, under epoch 2
    recovered.uploader.archive_retention.run(recovered.uploader.committed_through)
    assert archive_start(local_cluster.metadata, TOPIC) == 15
    a.close()  # unload: sealed

    [retired] = on("disk-2").retired
    assert retired.quarantine_path is not None
    assert [(r.start_offset, r.end_offset) for r in keys.read_lost_ranges(local_cluster.metadata, TOPIC)] == [(0, 14)]
