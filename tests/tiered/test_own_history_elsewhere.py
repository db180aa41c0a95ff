"""A broker id whose open history lives on another data dir (a mistyped ``--data-dir``, a
broker started on the wrong disk): a load there must refuse with OwnHistoryElsewhere and
write nothing, instead of recording that history's acknowledged messages lost and
numbering new ones at their offsets (atk33 F01, atk35 F01-F03). Accepting that loss is
explicit: ``accept_lost_own_history`` (``dnb restore --takeover``) or
``own_history_elsewhere = "take_over"``.

The broker process (``dnb broker run``) loads through the same ``BrokerHost.load`` (its
assignment watcher), so these hold for it as for the CLI."""
from __future__ import annotations

import os

import pytest

from tiered.archive.chain import DescriptorChain
from tiered.lifecycle import BrokerHost
from tiered.lifecycle.hosted import HostedTopic
from tiered.lifecycle.errors import LocalWalUnreadable, OwnHistoryElsewhere
from tiered.metadata import keys
from tiered.tools.verify import verify_topic
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    TOPIC,
    Cluster,
    local_cluster,
    produce_range,
    read_all,
)

T = TopicName.parse(TOPIC)


def _on(cluster: Cluster, disk: str, broker_id: str = "A") -> BrokerHost:
    """Broker A (or ``broker_id``) with its WAL root on ``disk`` (the default config: refuse)."""
    return cluster.on_disk(broker_id, disk)


def _die(host: BrokerHost) -> None:
    """The process dies: no seal, the WAL kept on its disk, the lease gone."""
    for hosted in host.topics():
        host.abandon(hosted.topic)
    host.close(unload=False)


def _records(cluster: Cluster) -> list[tuple[str, bytes]]:
    return sorted((kv.key, kv.value) for kv in cluster.metadata.range(keys.storage_prefix(T)))


def _nothing_lost(cluster: Cluster) -> bool:
    """No LostRange counts a lost offset (a takeover of a history with nothing past the
    archive records one with no end: "none known lost")."""
    return all(r.end_offset is None for r in keys.read_lost_ranges(cluster.metadata, T))


def _acks_a_tail(cluster: Cluster, disk: str, archived_to: int, durable_to: int) -> None:
    """A on ``disk`` acknowledges up to ``archived_to`` archived and up to ``durable_to``
    durable only, publishes that tip and dies."""
    host = _on(cluster, disk)
    hosted = host.load(TOPIC)
    _first_pass_done(hosted)
    first = hosted.next_offset
    if archived_to >= first:
        produce_range(hosted, first, archived_to, ack="archived")
    produce_range(hosted, max(first, archived_to + 1), durable_to)
    hosted.publish_progress()
    _die(host)


def _first_pass_done(hosted: HostedTopic) -> None:
    """Wait for the uploader's first pass over a WAL this load recovered. Frames durable
    before an uploader starts count as infinitely old, so that pass comes at the pool's
    next tick and archives everything durable when it starts. Left to the scheduler, it
    may come after the acks that follow (a loaded machine), archive them too, and leave
    no unarchived history for a test to be refused over."""
    tip = hosted.wal.durable_offset
    if tip is not None:
        assert hosted.uploader.wait_archived(tip, 10.0), "the first pass did not archive the recovered WAL"


def _refused_writing_nothing(cluster: Cluster, disk: str) -> None:
    before = _records(cluster)
    wrong = _on(cluster, disk)
    for attempt in (lambda: wrong.load(TOPIC), lambda: wrong.create(TOPIC)):
        with pytest.raises(OwnHistoryElsewhere, match="not in this data dir"):
            attempt()
    assert _records(cluster) == before
    assert not wrong.topics()
    _die(wrong)


def test_a_load_on_a_disk_without_the_open_history_refuses_and_writes_nothing(local_cluster: Cluster) -> None:
    _acks_a_tail(local_cluster, "disk-1", archived_to=4, durable_to=7)
    _refused_writing_nothing(local_cluster, "disk-typo")
    back = _on(local_cluster, "disk-1").load(TOPIC)  # the right disk: everything is there
    assert back.next_offset == 8
    assert [m.offset for m in read_all(back, 0, 7)] == list(range(8))
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []


def test_an_older_wal_of_ours_on_the_wrong_disk_does_not_pass_for_the_open_history(local_cluster: Cluster) -> None:
    """atk35 F01: disk 1 holds a WAL of epoch 1 (everything archived, so disk 2 could take
    over); disk 2's epoch acknowledged 5-9. Back on disk 1 its old WAL is not that history."""
    _acks_a_tail(local_cluster, "disk-1", archived_to=4, durable_to=4)
    _acks_a_tail(local_cluster, "disk-2", archived_to=4, durable_to=9)  # nothing lost: allowed
    assert _nothing_lost(local_cluster)
    _refused_writing_nothing(local_cluster, "disk-1")
    back = _on(local_cluster, "disk-2").load(TOPIC)
    assert back.next_offset == 10
    assert [m.offset for m in read_all(back, 0, 9)] == list(range(10))


def test_a_history_whose_tip_was_never_published_is_refused(local_cluster: Cluster) -> None:
    """atk35 F02: progress is best effort; without a published tip of the open epoch
    nobody can tell it acknowledged nothing past the archive, so the load fails closed."""
    _acks_a_tail(local_cluster, "disk-1", archived_to=4, durable_to=7)
    local_cluster.metadata.delete(keys.progress_key(T))  # its publishes all failed
    _refused_writing_nothing(local_cluster, "disk-typo")


def test_accepting_the_loss_takes_the_history_over_and_records_it(local_cluster: Cluster) -> None:
    _acks_a_tail(local_cluster, "disk-1", archived_to=4, durable_to=7)
    taken = _on(local_cluster, "disk-new").load(TOPIC, accept_lost_own_history=True)
    assert taken.next_offset == 5 and taken.report.unarchived_at_least == 3
    [lost] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (lost.start_offset, lost.end_offset, lost.broker_id, lost.exact) == (5, 7, "A", False)


def test_a_history_of_ours_that_is_sealed_or_archived_loads_anywhere(local_cluster: Cluster) -> None:
    _acks_a_tail(local_cluster, "disk-1", archived_to=4, durable_to=4)  # everything archived
    moved = _on(local_cluster, "disk-2")
    assert moved.load(TOPIC).next_offset == 5
    produce_range(moved.topic(TOPIC), 5, 6)
    moved.unload(TOPIC)  # sealed at 6
    moved.close()
    again = _on(local_cluster, "disk-3")
    assert again.load(TOPIC).next_offset == 7
    assert _nothing_lost(local_cluster)


def test_an_empty_wal_a_failed_first_load_left_does_not_pass_for_the_open_history(local_cluster: Cluster,
                                                                                   monkeypatch) -> None:
    """atk37 F03: A's first load on disk 2 fails writing the WAL's marker (a full disk),
    leaving an empty marker-less WAL there; A then acknowledges 0-9 on disk 1 and dies.
    Back on disk 2 that WAL is not the open history's (the state names the WAL by id)."""
    from tiered.lifecycle.wal_root import WalRoot

    wrong = _on(local_cluster, "disk-2")
    with monkeypatch.context() as patch:
        def full_disk(*_args: object, **_kwargs: object) -> None:
            raise OSError(28, "No space left on device")
        patch.setattr(WalRoot, "write_owner_marker", full_disk)
        with pytest.raises(Exception):  # noqa: B017 - the step's error; nothing acknowledged
            wrong.load(TOPIC)
    _die(wrong)
    _acks_a_tail(local_cluster, "disk-1", archived_to=-1, durable_to=9)
    _refused_writing_nothing(local_cluster, "disk-2")
    assert _on(local_cluster, "disk-1").load(TOPIC).next_offset == 10


@pytest.mark.parametrize("older_wal_holds", ["nothing past the archive", "offsets recorded lost"])
def test_an_older_wal_of_ours_with_a_damaged_marker_does_not_pass_for_the_open_history(
        local_cluster: Cluster, older_wal_holds: str) -> None:
    """atk37 F01: disk 2 holds epoch 1's WAL, whose marker is damaged; epoch 2 acknowledged
    5-12 on disk 1. On disk 2 a load must neither take epoch 2's history over nor recover
    epoch 1's WAL as the topic's (its 5-9 were recorded lost and renumbered by epoch 2)."""
    _acks_a_tail(local_cluster, "disk-2", archived_to=4, durable_to=4 if older_wal_holds.startswith("nothing") else 9)
    if older_wal_holds.startswith("nothing"):
        _acks_a_tail(local_cluster, "disk-1", archived_to=4, durable_to=12)
    else:  # epoch 2 took epoch 1's unarchived 5-9 over (recorded lost) on a replaced disk
        host = _on(local_cluster, "disk-1")
        hosted = host.load(TOPIC, accept_lost_own_history=True)
        produce_range(hosted, 5, 12)
        hosted.publish_progress()
        _die(host)
    marker = os.path.join(local_cluster.root, "disk-2", "default", "reliable_topic", ".owner")
    with open(marker, "r+b") as f:
        raw = bytearray(f.read())
        raw[raw.index(b'"epoch"') + 9] ^= 0x01  # one digit off: its checksum fails
        f.seek(0)
        f.write(bytes(raw))
    _refused_writing_nothing(local_cluster, "disk-2")
    back = _on(local_cluster, "disk-1").load(TOPIC)
    assert back.next_offset == 13


def test_a_data_dir_restored_from_an_older_copy_is_refused_not_renumbered(local_cluster: Cluster) -> None:
    """atk36 F08: A's data dir is copied while it runs (a backup, a snapshot); A then
    acknowledges 5-9 durable, publishes that tip and dies; the data dir comes back as the
    copy. Its WAL is A's history but lacks 5-9: recovering it would give new messages those
    offsets with nothing recorded. The load refuses (LocalWalUnreadable); the way out,
    discard_local_wal, records the loss first."""
    import shutil

    host = _on(local_cluster, "disk-1")
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    root = os.path.join(local_cluster.root, "disk-1")
    copy = os.path.join(local_cluster.root, "disk-1-copy")
    shutil.copytree(root, copy)  # the process is alive: a copy of what it had written so far
    produce_range(hosted, 5, 9)
    hosted.publish_progress()
    _die(host)
    shutil.rmtree(root)
    shutil.copytree(copy, root)
    before = _records(local_cluster)
    again = _on(local_cluster, "disk-1")
    with pytest.raises(LocalWalUnreadable, match="published offset 9 as durable"):
        again.load(TOPIC)
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []
    # atk42 F04: verify says so too, before any load.
    report = verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects, wal_dir=root)
    assert [(p["kind"], p["first_offset"], p["last_offset"]) for p in report.problems] == \
        [("wal_behind_published_tip", 5, 9)]
    discarded = again.load(TOPIC, discard_local_wal=True)
    assert discarded.next_offset == 5
    [lost] = keys.read_lost_ranges(local_cluster.metadata, T)
    # atk42 F06: the discarded copy opened, and its epoch published 9: the record says so.
    assert (lost.start_offset, lost.end_offset, lost.exact) == (5, 9, False)
    assert lost.quarantine_path is not None
    assert before != _records(local_cluster)


def test_a_wrong_disk_whose_wal_id_is_damaged_is_still_refused(local_cluster: Cluster) -> None:
    """atk38 F05: without a readable id, the WAL's marker decides; an older one on the
    wrong disk is refused, so discard_local_wal (a way past an unreadable WAL) never gets
    to take the open history over."""
    _acks_a_tail(local_cluster, "disk-2", archived_to=4, durable_to=4)
    _acks_a_tail(local_cluster, "disk-1", archived_to=4, durable_to=12)
    walid = os.path.join(local_cluster.root, "disk-2", "default", "reliable_topic", ".walid")
    with open(walid, "wb") as f:
        f.write(b"{not json")
    _refused_writing_nothing(local_cluster, "disk-2")
    with pytest.raises(OwnHistoryElsewhere):
        _on(local_cluster, "disk-2").load(TOPIC, discard_local_wal=True)


def test_the_open_historys_wal_without_its_dot_files_is_recovered_by_the_override(local_cluster: Cluster) -> None:
    """atk38 F06: the WAL holding 0-9 was copied to a new disk without its dot files (a
    glob skips them): nothing tells it is the open history's, so the plain load refuses;
    the override then recovers it (it holds offsets past the archive), losing nothing."""
    import shutil

    _acks_a_tail(local_cluster, "disk-1", archived_to=-1, durable_to=9)
    source = os.path.join(local_cluster.root, "disk-1", "default", "reliable_topic")
    target = os.path.join(local_cluster.root, "disk-2", "default", "reliable_topic")
    os.makedirs(target)
    for name in os.listdir(source):
        if not name.startswith("."):
            shutil.copy2(os.path.join(source, name), os.path.join(target, name))
    shutil.copy2(os.path.join(local_cluster.root, "disk-1", ".broker"), os.path.join(local_cluster.root, "disk-2"))
    _refused_writing_nothing(local_cluster, "disk-2")
    hosted = _on(local_cluster, "disk-2").load(TOPIC, accept_lost_own_history=True)
    assert hosted.report.recovered_local_wal and hosted.next_offset == 10
    assert _nothing_lost(local_cluster)


def _copy_of(local_cluster: Cluster, source_disk: str, target_disk: str, dot_files: bool) -> None:
    import shutil

    source = os.path.join(local_cluster.root, source_disk)
    target = os.path.join(local_cluster.root, target_disk)
    if dot_files:
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(".lock"))
        return
    wal_dir = os.path.join("default", "reliable_topic")
    os.makedirs(os.path.join(target, wal_dir))
    for name in os.listdir(os.path.join(source, wal_dir)):
        if not name.startswith("."):
            shutil.copy2(os.path.join(source, wal_dir, name), os.path.join(target, wal_dir, name))
    shutil.copy2(os.path.join(source, ".broker"), target)


def _acks_0_to_9_copied_at_4(local_cluster: Cluster, disk: str, copy: str, dot_files: bool) -> None:
    """A acknowledges 0-4 durable on ``disk``, which is copied to ``copy`` then (a backup
    of the running broker), acknowledges 5-9, publishes that tip and dies."""
    host = _on(local_cluster, disk)
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 4)
    hosted.wal.flush()
    _copy_of(local_cluster, disk, copy, dot_files=dot_files)
    produce_range(hosted, 5, 9)
    hosted.publish_progress()
    _die(host)


def test_an_older_copy_taken_before_a_restart_is_refused(local_cluster: Cluster) -> None:
    """atk39 F01: disk 1 is copied after epoch 1 acknowledged 0-4 (its marker says 1);
    epoch 2 reloads the same WAL on disk 1 and acknowledges 5-9. The copy has the open
    state's WAL id, but a marker older than the open epoch: an older copy of that WAL,
    refused, not retired with its acknowledged offsets renumbered."""
    _acks_a_tail(local_cluster, "disk-1", archived_to=-1, durable_to=4)
    _copy_of(local_cluster, "disk-1", "disk-copy", dot_files=True)
    _acks_a_tail(local_cluster, "disk-1", archived_to=-1, durable_to=9)
    # The reload's first upload pass took 0-4 (see _first_pass_done); 5-9 are durable only.
    assert DescriptorChain(local_cluster.metadata, T).next_offset() == 5
    _refused_writing_nothing(local_cluster, "disk-copy")
    assert _on(local_cluster, "disk-1").load(TOPIC).next_offset == 10


def test_an_older_copy_of_a_history_archived_since_is_deleted_losing_nothing(local_cluster: Cluster) -> None:
    """The same copy once epoch 2 archived all it acknowledged (0-9; here an explicit
    pass, as the reload's first background pass does when it runs after the acks): no
    acknowledged message is only on disk 1 any more, so the copy is not refused but
    deleted as all archived, and the load continues at 10 with nothing recorded lost."""
    _acks_a_tail(local_cluster, "disk-1", archived_to=-1, durable_to=4)
    _copy_of(local_cluster, "disk-1", "disk-copy", dot_files=True)
    host = _on(local_cluster, "disk-1")
    hosted = host.load(TOPIC)
    produce_range(hosted, 5, 9)
    assert hosted.uploader.upload_once() == 9
    hosted.publish_progress()
    _die(host)
    copy = _on(local_cluster, "disk-copy")
    loaded = copy.load(TOPIC)
    assert loaded.next_offset == 10 and not loaded.report.recovered_local_wal
    [retired] = copy.retired
    assert (retired.first_offset, retired.last_offset, retired.quarantine_path) == (0, 4, None)
    assert _nothing_lost(local_cluster)
    assert [m.offset for m in read_all(loaded, 0, 9)] == list(range(10))


def test_an_older_copy_without_its_dot_files_is_not_recovered_by_the_override(local_cluster: Cluster) -> None:
    """atk39 F02: a copy of 0-4 without .owner and .walid, while 0-9 were acknowledged and
    that tip published. Nothing ties the WAL to an epoch, so it is held to the last tip
    this broker published: the override gets LocalWalUnreadable, not a silent renumber."""
    _acks_0_to_9_copied_at_4(local_cluster, "disk-1", "disk-copy", dot_files=False)
    _refused_writing_nothing(local_cluster, "disk-copy")
    with pytest.raises(LocalWalUnreadable, match="published offset 9"):
        _on(local_cluster, "disk-copy").load(TOPIC, accept_lost_own_history=True)
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []  # nothing recorded, nothing renumbered


def test_a_failover_back_whose_load_failed_before_its_marker_loads_on_retry(local_cluster: Cluster,
                                                                           monkeypatch) -> None:
    """atk40: A acknowledged 0-9 (published) and died; B took over (0-9 recorded lost) and
    died after marking the topic open. A's load creates an empty WAL and fails writing its
    marker once. The retry must load: A's published tip belongs to a history whose loss is
    recorded, not to that empty WAL (it was refused as "acknowledged messages missing")."""
    from tiered.lifecycle.host import BrokerHost as Host
    from tiered.lifecycle.wal_root import WalRoot

    _acks_a_tail(local_cluster, "disk-a", archived_to=-1, durable_to=9)
    b = _on(local_cluster, "disk-b", "B")
    with monkeypatch.context() as patch:
        def no_uploader(*_args: object, **_kwargs: object) -> None:
            raise OSError(24, "Too many open files")
        patch.setattr(Host, "_start_uploader", no_uploader)
        with pytest.raises(Exception):  # noqa: B017 - after marking the topic open
            b.load(TOPIC)
    _die(b)
    assert [(r.start_offset, r.end_offset, r.broker_id) for r in keys.read_lost_ranges(local_cluster.metadata, T)] \
        == [(0, 9, "A")]
    a = _on(local_cluster, "disk-a")
    with monkeypatch.context() as patch:
        def full_disk(*_args: object, **_kwargs: object) -> None:
            raise OSError(28, "No space left on device")
        patch.setattr(WalRoot, "write_owner_marker", full_disk)
        with pytest.raises(Exception):  # noqa: B017 - the step's error
            a.load(TOPIC)
    assert a.load(TOPIC).next_offset == 0


def test_an_older_copy_returning_after_a_failover_never_shrinks_the_loss_record(local_cluster: Cluster) -> None:
    """atk41 F01: A acknowledged 0-9 (tip published) and its data dir was copied at 0-4;
    B took A's history over (0-9 recorded, at least) and reused 0-9. A comes back on the
    copy: retiring its stale WAL must not rewrite the record as "exactly 0-4" (5-9 were
    acknowledged by A and now hold B's messages)."""
    _acks_0_to_9_copied_at_4(local_cluster, "disk-a", "disk-a-copy", dot_files=True)
    assert _on(local_cluster, "disk-b", "B").load(TOPIC).next_offset == 0
    back = _on(local_cluster, "disk-a-copy")  # its start retires the stale WAL of epoch 1
    assert [(r.epoch, r.first_offset, r.last_offset) for r in back.retired] == [(1, 0, 4)]
    [lost] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (lost.broker_id, lost.start_offset, lost.end_offset, lost.exact) == ("A", 0, 9, False)
    assert lost.quarantine_path is not None


# -- atk42: older copies against records that already hold a quarantined WAL ------------

def _discarded_then_renumbered(local_cluster: Cluster, copy_at: int) -> None:
    """A acknowledges 0-9 durable; its data dir is copied once ``copy_at`` is acknowledged
    (-1: right after the load, an empty WAL). A dies without a published tip (its publishes
    failed), and its WAL id file is damaged: the load refuses, and the operator discards
    the WAL ("from 0, end unknown"). Epoch 3 numbers new messages 0-9 and seals."""
    host = _on(local_cluster, "disk-a")
    hosted = host.load(TOPIC)
    if copy_at < 0:
        _copy_of(local_cluster, "disk-a", "disk-a-copy", dot_files=True)
    else:
        produce_range(hosted, 0, copy_at)
        hosted.wal.flush()
        _copy_of(local_cluster, "disk-a", "disk-a-copy", dot_files=True)
    produce_range(hosted, copy_at + 1, 9)
    hosted.wal.flush()
    _die(host)
    local_cluster.metadata.delete(keys.progress_key(T))
    with open(os.path.join(local_cluster.root, "disk-a", "default", "reliable_topic", ".walid"), "wb") as f:
        f.write(b"garbage!")
    again = _on(local_cluster, "disk-a")
    with pytest.raises(LocalWalUnreadable):
        again.load(TOPIC)
    renumbered = again.load(TOPIC, discard_local_wal=True)
    assert renumbered.next_offset == 0
    produce_range(renumbered, 0, 9)
    again.unload(TOPIC)
    again.close()


def _rot_first_segment(wal_dir: str) -> None:
    """Flip a byte near the end of the WAL's first segment: its last frame no longer checks."""
    segment = sorted(n for n in os.listdir(wal_dir) if n.endswith(".seg"))[0]
    with open(os.path.join(wal_dir, segment), "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))


def _account(r: keys.LostRange) -> tuple[object, ...]:
    """What a record says (not when or by whom it was last written)."""
    return r.start_offset, r.end_offset, r.broker_id, r.epoch, r.exact, r.quarantine_path


def _copy_comes_back(local_cluster: Cluster) -> BrokerHost:
    import shutil

    topic_dir = os.path.join("default", "reliable_topic")
    shutil.copytree(os.path.join(local_cluster.root, "disk-a-copy", topic_dir),
                    os.path.join(local_cluster.root, "disk-a", topic_dir))
    return _on(local_cluster, "disk-a")  # its start retires the stale copy


@pytest.mark.parametrize("copy_at", [4, -1], ids=["copy of 0-4", "empty copy"])
def test_an_older_copy_never_shortens_or_confirms_a_discard_record(local_cluster: Cluster, copy_at: int) -> None:
    """atk42 F01/F03: the discard's record says "from 0, end unknown" and names the
    quarantined unreadable WAL. An older copy of that WAL coming back is another copy of
    the same history: it must not make the record "exactly 0-4" (5-9 were acknowledged and
    now name epoch 3's messages) nor "exactly nothing" (the empty copy), nor drop the path."""
    _discarded_then_renumbered(local_cluster, copy_at)
    [discard] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (discard.start_offset, discard.end_offset, discard.exact) == (0, None, False)
    back = _copy_comes_back(local_cluster)
    assert [r.epoch for r in back.retired] == [1]
    assert [_account(r) for r in keys.read_lost_ranges(local_cluster.metadata, T)] == [_account(discard)]
    report = verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects)
    assert [p["kind"] for p in report.problems] == ["lost_range"]
    if copy_at >= 0:  # the copy is kept beside the discarded WAL, not on top of it
        quarantined = os.path.dirname(discard.quarantine_path or "")
        names = sorted(os.listdir(quarantined))
        assert names == sorted([os.path.basename(discard.quarantine_path or ""), "00000000000000000001"])


def test_an_older_copy_below_our_own_archive_is_refused_not_deleted(local_cluster: Cluster) -> None:
    """atk42 F05: A's data dir is copied at 0-4; A then archives 5-7 itself, acknowledges
    8-9 durable (tip 9 published) and dies. The copy ends below the archive, but the archive
    past it is A's own: it is an older copy of A's history, not a WAL another owner went
    past. Deleting it as "all archived" numbered new messages 8, 9 with nothing recorded;
    the load refuses, and the discard records 8-9."""
    host = _on(local_cluster, "disk-a")
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 4)
    hosted.wal.flush()
    _copy_of(local_cluster, "disk-a", "disk-a-copy", dot_files=True)
    produce_range(hosted, 5, 7, ack="archived")
    produce_range(hosted, 8, 9)
    hosted.publish_progress()
    _die(host)
    back = _on(local_cluster, "disk-a-copy")
    with pytest.raises(LocalWalUnreadable, match="published offset 9 as durable"):
        back.load(TOPIC)
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []
    assert back.load(TOPIC, discard_local_wal=True).next_offset == 8
    [lost] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (lost.broker_id, lost.epoch, lost.start_offset, lost.end_offset, lost.exact) == ("A", 1, 8, 9, False)


def test_the_real_wal_returning_after_its_older_copy_gets_a_quarantine_of_its_own(local_cluster: Cluster) -> None:
    """atk42 F02: A acknowledged 0-9 (copied at 0-4) and died; B took over and reused 0-9.
    The copy came back and was quarantined ("at least 0-9"); then the real WAL comes back.
    It shares the copy's WAL id and epoch: its quarantine went into the copy's directory,
    clashed after deleting the real WAL's checkpoint, and wedged every later load of A. It
    now gets a directory of its own, whole, and the record keeps naming the first one."""
    import shutil

    _acks_0_to_9_copied_at_4(local_cluster, "disk-a", "disk-a-copy", dot_files=True)
    topic_dir = os.path.join("default", "reliable_topic")
    real = os.path.join(local_cluster.root, "real-wal")
    shutil.copytree(os.path.join(local_cluster.root, "disk-a", topic_dir), real,
                    ignore=shutil.ignore_patterns(".lock"))
    b = _on(local_cluster, "disk-b", "B")
    produce_range(b.load(TOPIC), 0, 9, ack="archived")
    _on(local_cluster, "disk-a-copy").close()  # retires the copy
    [after_copy] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (after_copy.start_offset, after_copy.end_offset, after_copy.exact) == (0, 9, False)
    shutil.copytree(real, os.path.join(local_cluster.root, "disk-a-copy", topic_dir))
    again = _on(local_cluster, "disk-a-copy")
    assert [(r.first_offset, r.last_offset) for r in again.retired] == [(0, 9)]
    assert [_account(r) for r in keys.read_lost_ranges(local_cluster.metadata, T)] == [_account(after_copy)]
    [second] = [r.quarantine_path for r in again.retired]
    assert second == after_copy.quarantine_path + ".1"
    assert "wal.ckpt" in os.listdir(second)
    _die(b)
    assert again.load(TOPIC).next_offset == 10


# -- atk43: a second copy of one WAL, retention, and verify on a live broker -------------

def test_a_second_full_copy_of_a_quarantined_wal_gets_a_directory_of_its_own(local_cluster: Cluster) -> None:
    """atk43 F01: A's data dir is snapshotted after A died (same WAL, same tip); A's WAL is
    quarantined when A comes back after B's takeover; then the data dir is rolled back to
    the snapshot. The snapshot has the quarantined WAL's identity but is not a retry of its
    move (every file clashes): taking it for one failed the move on every start and wedged
    A's loads. It gets a directory of its own; the record stays at least 0-9."""
    import shutil

    _acks_a_tail(local_cluster, "disk-a", archived_to=-1, durable_to=9)
    topic_dir = os.path.join("default", "reliable_topic")
    snapshot = os.path.join(local_cluster.root, "snapshot")
    shutil.copytree(os.path.join(local_cluster.root, "disk-a", topic_dir), snapshot)
    b = _on(local_cluster, "disk-b", "B")
    produce_range(b.load(TOPIC), 0, 9, ack="archived")
    first = _on(local_cluster, "disk-a")
    [retired] = first.retired
    first.close()
    shutil.copytree(snapshot, os.path.join(local_cluster.root, "disk-a", topic_dir))
    again = _on(local_cluster, "disk-a")
    assert [r.quarantine_path for r in again.retired] == [f"{retired.quarantine_path}.1"]
    [lost] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (lost.start_offset, lost.end_offset, lost.quarantine_path) == (0, 9, retired.quarantine_path)
    _die(b)
    assert again.load(TOPIC).next_offset == 10


def test_discarding_a_second_copy_of_a_discarded_wal_is_not_wedged(local_cluster: Cluster) -> None:
    """atk43 F02: the operator backs up a WAL that does not open, discards it, and later
    puts the backup back. Discarding it again is the documented way out; it claimed the
    first discard's directory (same identity: no tip) and failed on every attempt."""
    import shutil

    _acks_a_tail(local_cluster, "disk-a", archived_to=-1, durable_to=9)
    topic_dir = os.path.join(local_cluster.root, "disk-a", "default", "reliable_topic")
    with open(os.path.join(topic_dir, ".walid"), "wb") as f:
        f.write(b"garbage!")
    backup = os.path.join(local_cluster.root, "backup")
    shutil.copytree(topic_dir, backup, ignore=shutil.ignore_patterns(".lock"))
    a = _on(local_cluster, "disk-a")
    hosted = a.load(TOPIC, discard_local_wal=True)
    produce_range(hosted, 0, 2, ack="archived")
    hosted.publish_progress()
    _die(a)
    [discard] = keys.read_lost_ranges(local_cluster.metadata, T)
    shutil.rmtree(topic_dir)  # the data dir is rolled back to the backup
    shutil.copytree(backup, topic_dir)
    again = _on(local_cluster, "disk-a")
    with pytest.raises(LocalWalUnreadable):
        again.load(TOPIC)
    assert again.load(TOPIC, discard_local_wal=True).next_offset == 3
    # The first discard's record stands as it was (beside it: the discarding epoch's own
    # history, all archived, whose WAL the rollback replaced: "none known lost").
    assert [_account(r) for r in keys.read_lost_ranges(local_cluster.metadata, T)
            if r.epoch == discard.epoch] == [_account(discard)]
    assert [r.quarantine_path for r in again.retired] == [f"{discard.quarantine_path}.1"]


def test_an_older_copy_whose_tail_retention_cut_records_no_archived_offset(local_cluster: Cluster) -> None:
    """atk43 F03: every offset 0-9 was archived by A, and retention cut the archive to its
    last object; then A's data dir comes back as a copy of 0-4. The copy is retired (0-4,
    below the archive start: unproven, kept), but the record must not reach the offsets
    the archive still serves: the published tip 9 is archived, nothing past it was lost."""
    from tiered.archive.start import archive_start
    from uploader.config import ArchiveRetentionConfig

    host = _on(local_cluster, "disk-a")
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    hosted.wal.flush()
    _copy_of(local_cluster, "disk-a", "disk-a-copy", dot_files=True)
    produce_range(hosted, 5, 9, ack="archived")
    hosted.publish_progress()
    cutter = hosted.uploader.archive_retention
    cutter.policy = ArchiveRetentionConfig(bytes_max=0)
    cutter.run(hosted.uploader.committed_through)
    start = archive_start(local_cluster.metadata, TOPIC)
    assert 0 < start <= 9
    _die(host)
    back = _on(local_cluster, "disk-a-copy")
    assert back.load(TOPIC).next_offset == 10
    assert all(r.end_offset is None or r.end_offset < start for r in keys.read_lost_ranges(local_cluster.metadata, T))


def test_verify_reports_an_older_copy_without_its_dot_files(local_cluster: Cluster) -> None:
    """atk43 F05: a copy of 0-4 without ``.owner`` and ``.walid`` while A published 9. A
    load holds such a WAL to the tip its broker published last; verify does too."""
    _acks_0_to_9_copied_at_4(local_cluster, "disk-1", "disk-copy", dot_files=False)
    report = verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects,
                          wal_dir=os.path.join(local_cluster.root, "disk-copy"))
    assert [(p["kind"], p["first_offset"], p["last_offset"]) for p in report.problems] == \
        [("wal_behind_published_tip", 5, 9)]
    healthy = verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects,
                           wal_dir=os.path.join(local_cluster.root, "disk-1"))
    assert healthy.ok, healthy.problems


def test_verify_never_sees_a_gap_on_a_broker_archiving_while_it_runs(local_cluster: Cluster, monkeypatch) -> None:
    """atk43 F04: verify read the archive's end, checked every object, and only then
    scanned the WAL; a broker that archived and dropped its archived segments meanwhile
    showed a false ``wal_gap`` error. Here one upload pass (commit + WAL retention) runs
    inside verify's object check."""
    from dataclasses import replace as with_

    import tiered.tools.verify as verify
    from uploader.config import RetentionConfig
    from wal.config import WalConfig

    config = with_(local_cluster.config, uploader=with_(local_cluster.config.uploader,
                                                        retention=RetentionConfig(bytes_max=0)),
                   wal_config=WalConfig(segment_bytes_max=300))
    host = BrokerHost("A", os.path.join(local_cluster.root, "disk-a"), local_cluster.metadata,
                      local_cluster.objects, config)
    local_cluster.hosts.append(host)
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 19, ack="archived")
    produce_range(hosted, 20, 39)
    checking = verify._check_objects

    def an_upload_pass_meanwhile(*args: object, **kwargs: object) -> None:
        checking(*args, **kwargs)
        hosted.uploader.upload_once()

    monkeypatch.setattr(verify, "_check_objects", an_upload_pass_meanwhile)
    report = verify.verify_topic(TOPIC, local_cluster.metadata, local_cluster.objects,
                                 wal_dir=os.path.join(local_cluster.root, "disk-a"))
    assert report.ok, report.problems
    assert hosted.uploader.committed_through == 39


@pytest.mark.parametrize("owner_marker,then", [
    ("intact", "restart"), ("damaged", "restart"), ("damaged", "identity file lost"), ("damaged", "takeover")])
def test_a_discard_interrupted_mid_move_goes_on_into_the_same_directory(local_cluster: Cluster,
                                                                        owner_marker: str, then: str) -> None:
    """atk44 F05: a discard moved the damaged first segment, then failed (EIO, or a crash).
    What was left now opens, so the retry retires it instead of discarding: it claimed a
    directory under the retire's name, splitting the WAL, and the record named only the
    damaged head. The retry now goes on into the directory the record names. atk45 F01/F02:
    with the ``.owner`` marker damaged too, the open state's WAL id made the rest pass for
    the current history: recovered and served under a record saying it was reassigned (a
    reader was sent back to read it again), or retired into a second directory. atk46: the
    same when the quarantine's identity file no longer reads (the record names the WAL's
    id itself now), or when a takeover wrote a newer record naming this broker meanwhile."""
    from dataclasses import replace as with_

    from wal.config import WalConfig
    from wal.fs import RealFs

    class FailsOneMove(RealFs):
        fail: str | None = None

        def rename(self, src: str, dst: str) -> None:
            if self.fail is not None and os.path.basename(src) == self.fail and ".quarantine" in dst:
                self.fail = None
                raise OSError(5, "Input/output error")
            super().rename(src, dst)

    config = with_(local_cluster.config, wal_config=WalConfig(segment_bytes_max=60))
    root = os.path.join(local_cluster.root, "disk-a")
    first = BrokerHost("A", root, local_cluster.metadata, local_cluster.objects, config)
    local_cluster.hosts.append(first)
    hosted = first.load(TOPIC)
    produce_range(hosted, 0, 9)
    hosted.publish_progress()
    _die(first)
    wal_dir = os.path.join(root, "default", "reliable_topic")
    segments = sorted(n for n in os.listdir(wal_dir) if n.endswith(".seg"))
    _rot_first_segment(wal_dir)  # bit rot in the first, sealed segment
    if owner_marker == "damaged":
        with open(os.path.join(wal_dir, ".owner"), "wb") as f:
            f.write(b"{}")
    fs = FailsOneMove()
    a = BrokerHost("A", root, local_cluster.metadata, local_cluster.objects, config, wal_fs=fs)
    local_cluster.hosts.append(a)
    with pytest.raises(LocalWalUnreadable):
        a.load(TOPIC)
    fs.fail = segments[1]
    with pytest.raises(Exception):  # noqa: B017 - the move's I/O error, as the load's
        a.load(TOPIC, discard_local_wal=True)
    _die(a)
    [discard] = [r for r in keys.read_lost_ranges(local_cluster.metadata, T) if r.quarantine_path]
    if then == "identity file lost":
        os.remove(os.path.join(discard.quarantine_path or "", ".quarantined"))
    elif then == "takeover":
        b = _on(local_cluster, "disk-b", "B")
        produce_range(b.load(TOPIC), 0, 1, ack="archived")
        b.unload(TOPIC)
        _die(b)
    again = _on(local_cluster, "disk-a")
    retried = again.load(TOPIC)  # a plain load after the restart: the rest is not recovered
    assert not retried.report.recovered_local_wal
    assert retried.next_offset == (2 if then == "takeover" else 0)
    [record] = [r for r in keys.read_lost_ranges(local_cluster.metadata, T) if r.quarantine_path]
    assert record.start_offset == 0 and record.end_offset in (9, None)
    assert record.quarantine_path == discard.quarantine_path
    quarantined = os.path.dirname(record.quarantine_path or "")
    holding = [d for d in os.listdir(quarantined)
               if any(n.endswith(".seg") for n in os.listdir(os.path.join(quarantined, d)))]
    assert holding == [os.path.basename(record.quarantine_path or "")]
    assert sorted(n for n in os.listdir(record.quarantine_path or "") if n.endswith(".seg")) == segments


# -- atk47: stale WALs of histories that lost nothing ------------------------------------

def _sealed_then_killed_before_the_wal_delete(host: BrokerHost, monkeypatch) -> None:
    from tiered.lifecycle import seal as sealing

    with monkeypatch.context() as patch:
        def killed(*_args: object) -> None:
            raise RuntimeError("killed after the seal, before the WAL delete")
        patch.setattr(sealing, "cleanup", killed)
        with pytest.raises(Exception):  # noqa: B017 - the unload's
            host.unload(TOPIC)
    _die(host)


def test_a_wal_left_after_its_own_seal_is_deleted_with_no_loss_after_a_retention_cut(
        local_cluster: Cluster, monkeypatch) -> None:
    """atk47 F01: A archived 0-9, a retention cut kept only the last object, A sealed and
    died before deleting its WAL. The seal is written only after everything was archived,
    so the WAL lost nothing; it was recorded as an exact loss of 0-9 (readers of 9, still
    archived and served, were sent back to 0)."""
    from uploader.config import ArchiveRetentionConfig

    host = _on(local_cluster, "disk-a")
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 9, ack="archived")
    cutter = hosted.uploader.archive_retention
    cutter.policy = ArchiveRetentionConfig(bytes_max=0)
    cutter.run(hosted.uploader.committed_through)
    _sealed_then_killed_before_the_wal_delete(host, monkeypatch)
    assert os.path.isdir(os.path.join(local_cluster.root, "disk-a", "default", "reliable_topic"))
    back = _on(local_cluster, "disk-a")
    assert [(r.last_offset, r.lost_start, r.quarantine_path) for r in back.retired] == [(9, None, None)]
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []


def test_discarding_an_unreadable_wal_of_a_sealed_history_records_nothing_it_archived(
        local_cluster: Cluster, monkeypatch) -> None:
    """atk47 F03: B archived 0-4; A archived 5-9, sealed and died before deleting its WAL; B
    went on. That WAL then rots. Discarding it (what the start-up error tells the operator
    to do) recorded "lost from 0, end unknown" for A, over B's offsets and A's own archived
    ones. Nothing proves now that A's history ended with its seal (a later epoch having
    opened the topic does not: atk48 F01), so a record stays, but only past what A's epoch
    archived."""
    b = _on(local_cluster, "disk-b", "B")
    produce_range(b.load(TOPIC), 0, 4, ack="archived")
    b.unload(TOPIC)
    a = _on(local_cluster, "disk-a")
    produce_range(a.load(TOPIC), 5, 9, ack="archived")
    _sealed_then_killed_before_the_wal_delete(a, monkeypatch)
    produce_range(b.load(TOPIC), 10, 14, ack="archived")
    b.unload(TOPIC)
    wal_dir = os.path.join(local_cluster.root, "disk-a", "default", "reliable_topic")
    _rot_first_segment(wal_dir)
    again = _on(local_cluster, "disk-a")
    assert not again.retired  # unreadable: kept for the operator
    assert again.load(TOPIC, discard_local_wal=True).next_offset == 15
    assert all(r.start_offset >= 10 for r in keys.read_lost_ranges(local_cluster.metadata, T))
    [kept] = again.retired
    assert kept.quarantine_path is not None and os.listdir(kept.quarantine_path)


def test_discarding_an_unreadable_wal_of_a_deleted_incarnation_records_nothing_against_the_new_one(
        local_cluster: Cluster) -> None:
    """atk47 F02: A's WAL of a deleted incarnation stays on disk a; A created the topic
    again on disk b and archived 3-5 at its new epoch. The old WAL then rots; discarding it
    recorded "lost from 0" at the new incarnation's epoch (its readers sent to offset 0)."""
    a = _on(local_cluster, "disk-a")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 2)
    hosted.publish_progress()
    _die(a)
    b = _on(local_cluster, "disk-b", "B")
    b.delete(TOPIC)
    _die(b)
    again = _on(local_cluster, "disk-c")
    created, _ = again.create(TOPIC)
    first = created.next_offset
    produce_range(created, first, first + 2, ack="archived")
    created.publish_progress()
    _die(again)
    wal_dir = os.path.join(local_cluster.root, "disk-a", "default", "reliable_topic")
    _rot_first_segment(wal_dir)
    old = _on(local_cluster, "disk-a")
    assert old.load(TOPIC, discard_local_wal=True).next_offset == first + 3
    assert [r for r in keys.read_lost_ranges(local_cluster.metadata, T) if r.start_offset < first] == []


def test_a_later_epoch_opening_the_topic_does_not_prove_an_unreadable_wals_history_sealed(
        local_cluster: Cluster, monkeypatch) -> None:
    """atk48 F01: B's epoch 2 on disk 1 acknowledged 0-14 (its progress publishes failed)
    and died; epoch 3 recovered an older WAL on disk 2 that nothing tied to an epoch, which
    writes no record for epoch 2. Disk 1's WAL then rots and is discarded: taking "a later
    epoch opened the topic" for "epoch 2 ended with a seal" quarantined it with no record,
    and epoch 2's acknowledged offsets were recorded nowhere."""
    from tiered.lifecycle.hosted import HostedTopic

    first = _on(local_cluster, "disk-2", "B")
    produce_range(first.load(TOPIC), 0, 9)
    first.topic(TOPIC).publish_progress()
    _die(first)
    with monkeypatch.context() as patch:
        def failing(*_args: object, **_kwargs: object) -> None:
            raise RuntimeError("metadata unavailable for the progress key")
        patch.setattr(HostedTopic, "publish_progress", failing)
        second = _on(local_cluster, "disk-1", "B")
        hosted = second.load(TOPIC, accept_lost_own_history=True)
        lost_epoch = hosted.token.epoch
        for i in range(15):
            hosted.produce(f"e2-{i}".encode())
        _die(second)
    disk2 = os.path.join(local_cluster.root, "disk-2", "default", "reliable_topic")
    with open(os.path.join(disk2, ".owner"), "r+b") as f:
        f.seek(5)
        byte = f.read(1)
        f.seek(5)
        f.write(bytes([byte[0] ^ 0x01]))
    os.remove(os.path.join(disk2, ".walid"))
    third = _on(local_cluster, "disk-2", "B")
    third.load(TOPIC, accept_lost_own_history=True)
    _die(third)
    _rot_first_segment(os.path.join(local_cluster.root, "disk-1", "default", "reliable_topic"))
    fourth = _on(local_cluster, "disk-1", "B")
    fourth.load(TOPIC, accept_lost_own_history=True, discard_local_wal=True)
    assert any(r.broker_id == "B" and r.epoch == lost_epoch for r in keys.read_lost_ranges(local_cluster.metadata, T))


# -- atk52: a stale WAL whose marker does not read, after a later history of this broker --

def _marker_rots(cluster: Cluster, disk: str) -> None:
    """The ``.owner`` marker of the topic's WAL on ``disk`` no longer reads (bit rot)."""
    with open(os.path.join(cluster.root, disk, "default", "reliable_topic", ".owner"), "r+b") as f:
        f.seek(3)
        f.write(b"\xff")


def _b_takes_over(cluster: Cluster) -> None:
    """Broker B loads the topic (a takeover from a dead A) and dies."""
    b = _on(cluster, "disk-b", "B")
    b.load(TOPIC)
    _die(b)

def _a_later_history_of_a_taken_over_too(cluster: Cluster, b_archives_to: int, publish: bool,
                                         monkeypatch) -> dict[int, bytes]:
    """A on disk-0 acknowledges 0-1 archived and 2-5 durable only and dies; B takes over
    at 2 and archives 2-``b_archives_to``; A on disk-1 takes it back (epoch 3),
    acknowledges six more durable only (its tip published or not) and dies; B takes over
    again. disk-0's ``.owner`` marker then rots. Returns what A@3 acknowledged."""
    import tiered.lifecycle.hosted as hosted_module

    _acks_a_tail(cluster, "disk-0", 1, 5)
    b = _on(cluster, "disk-b", "B")
    produce_range(b.load(TOPIC), 2, b_archives_to, ack="archived")
    _die(b)
    a = _on(cluster, "disk-1")
    later = a.load(TOPIC)
    assert later.token.epoch == 3 and later.next_offset == b_archives_to + 1
    if not publish:
        monkeypatch.setattr(hosted_module.HostedTopic, "publish_progress", lambda self, final=False: False)
    acked = {later.produce(b"a3-%d" % i, ack="durable"): b"a3-%d" % i for i in range(6)}
    _die(a)
    monkeypatch.undo()
    _b_takes_over(cluster)
    _marker_rots(cluster, "disk-0")
    return acked


@pytest.mark.parametrize("b_archives_to, publish", [(6, True), (3, False)],
                         ids=["later_history_starts_past_its_tip", "later_history_starts_inside_unpublished"])
def test_a_stale_wal_with_an_unreadable_marker_is_measured_against_its_own_history(
        local_cluster: Cluster, monkeypatch, b_archives_to: int, publish: bool) -> None:
    """atk52 F01, F02: without a readable marker, the stale WAL on disk-0 (A@1's: 0-5, of
    which 2-5 were never archived) was measured against A's NEWEST loss record, A@3's.
    Starting past the WAL's tip (F01), it made the WAL look "all archived": deleted, the
    only copy of acknowledged offsets gone. Starting inside it with an unknown end (F02:
    A@3's tip was never published), A@3's "at least" record was made exact up to this
    WAL's tip, shorter than what A@3 acknowledged. Now the WAL is measured against the
    record that starts inside it (A@1's), kept in quarantine, and a record it is not known
    to belong to is never made exact or shorter."""
    acked_later = _a_later_history_of_a_taken_over_too(local_cluster, b_archives_to, publish, monkeypatch)
    host = _on(local_cluster, "disk-0")
    [retired] = host.retired
    assert retired.quarantine_path is not None
    assert any(n.endswith(".seg") for n in os.listdir(retired.quarantine_path)), "the only copy of 2-5 is gone"
    records = {(r.broker_id, r.epoch): r for r in keys.read_lost_ranges(local_cluster.metadata, T)}
    first = records[("A", 1)]
    assert (first.start_offset, first.end_offset, first.quarantine_path) == (2, 5, retired.quarantine_path)
    later = records[("A", 3)]
    assert later.quarantine_path is None and later.start_offset == b_archives_to + 1
    assert later.end_offset is None or later.end_offset >= max(acked_later), later  # never shorter


def test_a_stale_wal_with_an_unreadable_marker_never_makes_an_at_least_record_exact(local_cluster: Cluster,
                                                                                   monkeypatch) -> None:
    """atk52 F02, the record's side: a WAL whose marker does not read may be an older copy
    of its history. A@1 acknowledged 2-9 durable only, none of it published; disk-0 came
    back as a copy taken at 5, its marker rotted. B's takeover recorded "A@1 lost from 2,
    end unknown"; the copy made that "exactly 2-5", hiding 6-9. It stays "at least"."""
    import shutil

    import tiered.lifecycle.hosted as hosted_module

    a = _on(local_cluster, "disk-0")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 1, ack="archived")
    monkeypatch.setattr(hosted_module.HostedTopic, "publish_progress", lambda self, final=False: False)
    produce_range(hosted, 2, 5)
    wal_dir = os.path.join(local_cluster.root, "disk-0", "default", "reliable_topic")
    copy = os.path.join(local_cluster.root, "copy")
    shutil.copytree(wal_dir, copy)
    produce_range(hosted, 6, 9)
    _die(a)
    monkeypatch.undo()
    shutil.rmtree(wal_dir)
    shutil.copytree(copy, wal_dir)
    with open(os.path.join(wal_dir, ".owner"), "r+b") as f:
        f.seek(3)
        f.write(b"\xff")
    b = _on(local_cluster, "disk-b", "B")
    assert b.load(TOPIC).next_offset == 2
    _die(b)
    [retired] = _on(local_cluster, "disk-0").retired
    [record] = [r for r in keys.read_lost_ranges(local_cluster.metadata, T) if r.broker_id == "A"]
    assert (record.start_offset, record.exact, record.quarantine_path) == (2, False, retired.quarantine_path), record


def test_a_readable_copy_of_a_discarded_wal_is_kept_not_deleted(local_cluster: Cluster) -> None:
    """atk53 F03: A@1 (disk-0) acknowledged 2-4 durable only; B took over at 2 and archived
    2-5; A@3 (disk-1) took over at 6 and was taken over in turn. disk-0 is backed up to
    disk-2, then disk-0's WAL rots (a segment and its marker) and the operator discards it:
    the discard's record, whose range is unknown, named that WAL's id under A's newest
    record (A@3's, from 6). The readable backup on disk-2, the same WAL id, was then taken
    for the rest of that WAL, measured against 6, past its tip, and deleted as "all
    archived": the only readable copy of A@1's acknowledged 2-4. It is kept now."""
    import shutil
    from dataclasses import replace

    from wal.config import WalConfig

    small = replace(local_cluster.config, wal_config=WalConfig(segment_bytes_max=80))

    def on(disk: str, broker_id: str = "A") -> BrokerHost:
        return local_cluster.on_disk(broker_id, disk, small)

    a = on("disk-0")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 1, ack="archived")
    produce_range(hosted, 2, 4)
    hosted.publish_progress()
    _die(a)
    b = on("disk-b", "B")
    produce_range(b.load(TOPIC), 2, 5, ack="archived")
    _die(b)
    a = on("disk-1")
    produce_range(a.load(TOPIC), 6, 7)
    a.topic(TOPIC).publish_progress()
    _die(a)
    b = on("disk-b", "B")
    b.load(TOPIC)
    _die(b)
    shutil.copytree(os.path.join(local_cluster.root, "disk-0"), os.path.join(local_cluster.root, "disk-2"),
                    ignore=shutil.ignore_patterns(".lock"))
    wal_dir = os.path.join(local_cluster.root, "disk-0", "default", "reliable_topic")
    first_segment = os.path.join(wal_dir, sorted(n for n in os.listdir(wal_dir) if n.endswith(".seg"))[0])
    with open(first_segment, "r+b") as f:
        f.seek(os.path.getsize(first_segment) // 2)
        f.write(b"\xff\xff")
    with open(os.path.join(wal_dir, ".owner"), "r+b") as f:
        f.seek(3)
        f.write(b"\xff")
    a = on("disk-0")
    a.load(TOPIC, discard_local_wal=True)
    _die(a)
    b = on("disk-b", "B")
    b.load(TOPIC)
    _die(b)

    backup = on("disk-2")
    [retired] = backup.retired
    assert retired.quarantine_path is not None, retired
    assert any(n.endswith(".seg") for n in os.listdir(retired.quarantine_path)), "the only readable copy is gone"


def test_a_wal_with_an_unreadable_marker_is_not_taken_for_a_history_that_lost_nothing(
        local_cluster: Cluster) -> None:
    """atk53 F02: A@1 archived 0-4 and died; B took over at 5, and A's returning WAL
    confirmed "A@1 lost nothing from 5". A@3 took over at 5, acknowledged 5-9 durable only
    and died; B took over at 5 again. A@3's WAL marker rots. Both records start where the
    WAL begins; the older one (A@1's) was taken, and its confirmation turned into "A@1
    lost exactly 5-9". A history whose own WAL held nothing from 5 on cannot be this
    WAL's: A@3's record gets the account."""
    a = _on(local_cluster, "disk-0")
    produce_range(a.load(TOPIC), 0, 4, ack="archived")
    _die(a)
    b = _on(local_cluster, "disk-b", "B")
    b.load(TOPIC)
    _die(_on(local_cluster, "disk-0"))  # its start-up scan confirms: A@1 lost nothing
    _die(b)
    a = _on(local_cluster, "disk-0")
    later = a.load(TOPIC)
    produce_range(later, 5, 9)
    later.publish_progress()
    _die(a)
    _b_takes_over(local_cluster)
    _marker_rots(local_cluster, "disk-0")
    [retired] = _on(local_cluster, "disk-0").retired
    records = {r.epoch: r for r in keys.read_lost_ranges(local_cluster.metadata, T) if r.broker_id == "A"}
    assert (records[1].end_offset, records[1].quarantine_path) == (None, None), records[1]
    assert (records[later.token.epoch].start_offset, records[later.token.epoch].end_offset,
            records[later.token.epoch].quarantine_path) == (5, 9, retired.quarantine_path)


def test_an_unmarked_wal_that_two_records_could_account_for_makes_neither_exact(local_cluster: Cluster) -> None:
    """atk54 F02: A@1 (disk-1) acknowledged 5-7 durable only and died; B took over at 5
    ("A@1 lost 5-7, at least"). A@3 (disk-0) took over at 5, archived 5-9, acknowledged
    10-12 durable only and died; B took over at 10. A@3's WAL marker rots. Both A@1's
    record (from 5, its first offset) and A@3's (from 10) could be its account; the older
    was taken and made EXACT 5-12, although A@1 never held 8-12. A pick among several is
    no proof: the record stays "at least"."""
    a = _on(local_cluster, "disk-1")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    produce_range(hosted, 5, 7)
    hosted.publish_progress()
    _die(a)
    _b_takes_over(local_cluster)
    a = _on(local_cluster, "disk-0")
    later = a.load(TOPIC)
    assert later.next_offset == 5
    produce_range(later, 5, 9, ack="archived")
    produce_range(later, 10, 12)
    later.publish_progress()
    _die(a)
    _b_takes_over(local_cluster)
    _marker_rots(local_cluster, "disk-0")
    [retired] = _on(local_cluster, "disk-0").retired
    assert retired.quarantine_path is not None
    for record in keys.read_lost_ranges(local_cluster.metadata, T):
        if record.broker_id == "A" and record.quarantine_path is not None:
            assert not record.exact, record
