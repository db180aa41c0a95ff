"""Archive retention through the broker host: restore after a cut continues at exactly
last + 1 on another broker, readers and subscription cursors below the archive start get
OffsetBelowRetention (even where the owner's WAL still holds the offsets), and an
interrupted cut is finished by the next owner. Embedded stores and real servers."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tiered.archive import list_descriptors
from tiered.archive.start import OffsetBelowArchiveStart, archive_start
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


def test_a_stale_sealed_wal_whose_descriptors_retention_removed_is_deleted_not_recorded_lost(
        local_cluster: Cluster) -> None:
    """A crash between the seal and the WAL delete leaves a WAL of offsets all archived;
    when it comes back after another owner's retention removed those descriptors, it is
    still nothing lost (no quarantine, no LostRange)."""
    import os
    import shutil

    from tiered.metadata import keys

    a = local_cluster.broker("A")
    on_a = a.load(TOPIC)
    archive_in_three_objects(on_a)
    wal_dir = os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic")
    on_a.wal.flush()
    copy = os.path.join(local_cluster.root, "copy")
    shutil.copytree(wal_dir, copy)
    assert a.unload(TOPIC) == 29
    a.close()
    os.remove(os.path.join(copy, ".lock"))
    shutil.copytree(copy, wal_dir)  # == killed after the seal landed, before the delete

    b = local_cluster.broker("B", uploader=CUT_ALL.uploader)
    on_b = b.load(TOPIC)
    on_b.uploader.archive_retention.run(on_b.uploader.committed_through)
    assert archive_start(local_cluster.metadata, TOPIC) == 20
    b.unload(TOPIC)

    again = local_cluster.broker("A")
    assert [(r.first_offset, r.last_offset, r.lost_start) for r in again.retired] == [(0, 29, None)]
    assert keys.read_lost_ranges(local_cluster.metadata, TOPIC) == []
    assert not os.path.exists(wal_dir)
