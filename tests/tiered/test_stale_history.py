"""A broker id whose history ran on more than one disk, and cursors past a seal.

Each test fails on the code before its fix:

* a stale WAL of ours is matched to the takeover record of ITS epoch (its ``.owner``
  marker), not to the newest record naming this broker: otherwise a WAL whose every offset
  is archived (a crash between the seal and the delete) was quarantined and an older exact
  loss record rewritten as a bigger, false one;
* when the previous epoch of this broker ran on another data dir, retiring an older WAL of
  ours here does not stand in for that epoch's takeover record: its tail is recorded;
* a cursor past a sealed end is a damaged record: verify reports it from any host, and the
  next load moves it back (it would skip the messages that get those offsets).
"""
from __future__ import annotations

import os
from dataclasses import replace
import shutil

from tiered.lifecycle import BrokerHost
from tiered.metadata import keys
from tiered.tools.verify import verify_topic
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    TOPIC,
    Cluster,
    local_cluster,
    produce_range,
    read_all,
    payload_for,
)

T = TopicName.parse(TOPIC)


def _die(host: BrokerHost) -> None:
    """The broker process dies: no seal, WAL kept on its disk, its lease gone."""
    for hosted in host.topics():
        host.abandon(hosted.topic)
    host.close(unload=False)


def _host(cluster: Cluster, broker_id: str, root: str, takes_over_its_own: bool = False) -> BrokerHost:
    """``takes_over_its_own``: a broker whose disk was replaced on purpose, which takes its
    own open history over from another data dir as a failover would (the default refuses)."""
    config = replace(cluster.config, own_history_elsewhere="take_over") if takes_over_its_own else cluster.config
    host = BrokerHost(broker_id, root, cluster.metadata, cluster.objects, config)
    cluster.hosts.append(host)
    return host


def _lost(cluster: Cluster) -> list[tuple]:
    return sorted((r.start_offset, r.end_offset, r.broker_id, r.epoch, r.exact)
                  for r in keys.read_lost_ranges(cluster.metadata, T))


def test_a_sealed_wal_left_by_a_crash_before_its_delete_is_deleted_not_blamed_on_an_old_takeover(
        local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4, ack="archived")
    produce_range(a.topic(TOPIC), 5, 7)  # durable on A only
    _die(a)
    b = local_cluster.broker("B")
    produce_range(b.load(TOPIC), 5, 6)  # takeover: A's 5-7 lost (recorded), 5-6 reused
    b.unload(TOPIC)
    a = local_cluster.broker("A")  # comes back: its stale WAL is quarantined, 5-7 exact
    before = _lost(local_cluster)
    assert before == [(5, 7, "A", 1, True)]
    produce_range(a.load(TOPIC), 7, 9)
    wal_dir = os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic")
    a.topic(TOPIC).wal.flush()
    copy = os.path.join(local_cluster.root, "copy")
    shutil.copytree(wal_dir, copy)
    a.unload(TOPIC)  # archives 7-9, seals at 9, deletes the WAL
    a.close()
    if os.path.exists(os.path.join(copy, ".lock")):  # (none in a journaled group)
        os.remove(os.path.join(copy, ".lock"))
    shutil.copytree(copy, wal_dir)  # == killed after the seal landed, before the delete

    again = local_cluster.broker("A")
    assert [(r.first_offset, r.last_offset, r.lost_start) for r in again.retired] == [(7, 9, None)]
    assert _lost(local_cluster) == before, "the old exact record must not be rewritten"
    assert not os.path.exists(wal_dir)
    hosted = again.load(TOPIC)
    assert [m.payload for m in read_all(hosted, 7, 9)] == [payload_for(i) for i in range(7, 10)]


def test_the_tail_of_our_epoch_on_another_disk_is_recorded_when_an_older_wal_of_ours_is_retired(
        local_cluster: Cluster) -> None:
    disk_a = os.path.join(local_cluster.root, "disk-a")
    disk_c = os.path.join(local_cluster.root, "disk-c")
    a = _host(local_cluster, "A", disk_a)
    produce_range(a.load(TOPIC), 0, 4, ack="archived")
    produce_range(a.topic(TOPIC), 5, 7)
    _die(a)
    c = _host(local_cluster, "A", disk_c, takes_over_its_own=True)  # same id, another (empty) disk: 5-7 recorded lost
    hosted_c = c.load(TOPIC)
    epoch_c = hosted_c.token.epoch
    produce_range(hosted_c, 5, 6)  # acknowledged, durable on disk C only
    hosted_c.publish_progress()
    _die(c)
    back = _host(local_cluster, "A", disk_a, takes_over_its_own=True)  # back on disk A: its WAL (epoch 1) is stale
    hosted = back.load(TOPIC)
    assert hosted.next_offset == 5
    records = {(r.epoch, r.start_offset): r for r in keys.read_lost_ranges(local_cluster.metadata, T)}
    assert records[(1, 5)].exact and records[(1, 5)].end_offset == 7
    mine = records.get((epoch_c, 5))
    assert mine is not None, "disk C's acknowledged 5-6 were renumbered without a record"
    assert mine.broker_id == "A" and not mine.exact and mine.end_offset == 6
    report = verify_topic(T, local_cluster.metadata, local_cluster.objects)
    assert any(p["kind"] == "lost_range" and f"(epoch {epoch_c})" in p["message"] for p in report.problems)


def test_a_cursor_past_a_sealed_end_is_reported_and_moved_back_at_the_next_load(
        local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 4, ack="archived")
    a.unload(TOPIC)
    key = keys.cursor_key(T, "s")
    local_cluster.metadata.put(key, keys.Cursor(50).to_json())  # damaged: 5-50 never existed

    report = verify_topic(T, local_cluster.metadata, local_cluster.objects)  # no local WAL here
    assert not report.ok
    assert [p["kind"] for p in report.problems if p["severity"] == "error"] == ["cursor_ahead"]

    b = local_cluster.broker("B")
    hosted = b.load(TOPIC)
    assert hosted.report.clamped_cursors == {"s": 50}
    assert hosted.subscribe("s").start_offset == 5, "the subscription must not skip the next offsets"


# -- a takeover's obligation to record the history it continues after ----------------

def _b_dies_with_acked_tail(cluster: Cluster) -> int:
    """B archives 0-29, makes 30-49 durable only (published), and dies for good."""
    b = cluster.broker("B")
    hosted = b.load(TOPIC)
    produce_range(hosted, 0, 29, ack="archived")
    produce_range(hosted, 30, 49)
    assert hosted.publish_progress() or True
    epoch = hosted.token.epoch
    _die(b)
    return epoch


def _faulty_host(cluster: Cluster, broker_id: str):
    from tiered.metadata.testing.faults import FaultyMetadataStore

    faulty = FaultyMetadataStore(cluster.metadata)
    host = BrokerHost(broker_id, cluster.wal_root(broker_id), faulty, cluster.objects, cluster.config)
    cluster.hosts.append(host)
    return host, faulty


def _assert_b_recorded(cluster: Cluster, b_epoch: int) -> None:
    [record] = [r for r in keys.read_lost_ranges(cluster.metadata, T) if r.broker_id == "B"]
    assert (record.start_offset, record.epoch, record.end_offset) == (30, b_epoch, 49)
    report = verify_topic(T, cluster.metadata, cluster.objects)
    assert any(p["kind"] == "lost_range" and "broker B" in p["message"] for p in report.problems)


def test_a_takeover_whose_open_marker_write_fails_once_still_records_the_dead_owners_loss(
        local_cluster: Cluster) -> None:
    b_epoch = _b_dies_with_acked_tail(local_cluster)
    a, faulty = _faulty_host(local_cluster, "A")
    faulty.faults.fail("txn", nth=2)  # 1: acquire, 2: mark topic open (+ the takeover's record)
    try:
        a.load(TOPIC)
    except Exception:  # noqa: BLE001 - the injected failure
        pass
    else:
        raise AssertionError("the injected failure did not fail the load")
    hosted = a.load(TOPIC)  # the retry (watcher or operator)
    assert hosted.next_offset == 30
    assert hosted.report.unarchived_at_least == 20
    _assert_b_recorded(local_cluster, b_epoch)


def test_a_takeover_whose_acquire_landed_but_its_reply_was_lost_still_records_the_dead_owners_loss(
        local_cluster: Cluster) -> None:
    b_epoch = _b_dies_with_acked_tail(local_cluster)
    a, faulty = _faulty_host(local_cluster, "A")
    faulty.faults.fail("txn", nth=1, when="after")  # applied, but the caller sees an error
    try:
        a.load(TOPIC)
    except Exception:  # noqa: BLE001 - the injected failure
        pass
    else:
        raise AssertionError("the injected failure did not fail the load")
    assert a.load(TOPIC).next_offset == 30
    _assert_b_recorded(local_cluster, b_epoch)


def test_an_inherited_obligation_is_recorded_once_not_at_every_restart(local_cluster: Cluster) -> None:
    b_epoch = _b_dies_with_acked_tail(local_cluster)
    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 30, 31)
    _die(a)
    again = local_cluster.broker("A")
    assert again.load(TOPIC).report.recovered_local_wal
    _assert_b_recorded(local_cluster, b_epoch)
    assert len(keys.read_lost_ranges(local_cluster.metadata, T)) == 1


def test_a_quarantine_never_overwrites_what_an_earlier_quarantine_holds(local_cluster: Cluster) -> None:
    from tiered.errors import StorageError

    import pytest

    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 2)
    a.topic(TOPIC).wal.flush()
    wal_dir = os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic")
    a.abandon(TOPIC)
    qpath = os.path.join(local_cluster.wal_root("A"), ".quarantine", "default", "reliable_topic", "leaf")
    os.makedirs(qpath)
    segment = next(n for n in os.listdir(wal_dir) if n.endswith(".seg"))
    with open(os.path.join(qpath, segment), "wb") as f:
        f.write(b"an earlier WAL's segment")
    before = sorted(os.listdir(wal_dir))
    with pytest.raises(StorageError, match="already holds"):
        a.stale.quarantine(T, wal_dir, qpath)
    assert sorted(os.listdir(wal_dir)) == before
    with open(os.path.join(qpath, segment), "rb") as f:
        assert f.read() == b"an earlier WAL's segment"


class _Crash(BaseException):
    """A process killed at a chosen file operation (not an Exception: nothing catches it)."""


def _fresh_stores(root):
    """Embedded stores in ``root`` and a broker config with small segments (several files)."""
    from tiered.lifecycle.config import BrokerConfig
    from tiered.metadata import open_metadata
    from tiered.objects import open_objects
    from wal.config import WalConfig

    os.makedirs(root / "objects")
    md, objs = open_metadata(f"sqlite:///{root}/md.db"), open_objects(f"file://{root}/objects")
    return md, objs, BrokerConfig(session_ttl_s=1.0, wal_config=WalConfig(segment_bytes_max=300))


def _crashing_fs(operation: str, k: int, counts=lambda path: True):
    """A real file layer that raises _Crash at the k-th ``operation`` whose path ``counts``."""
    from wal.fs import RealFs

    class CrashFs(RealFs):
        done = 0

    def crash_or_do(self, path: str, *rest):
        if counts(rest[0] if rest else path):
            if CrashFs.done == k:
                raise _Crash(f"killed before {operation} {k}")
            CrashFs.done += 1
        return getattr(RealFs, operation)(self, path, *rest)

    setattr(CrashFs, operation, crash_or_do)
    return CrashFs()


def test_a_crash_at_any_point_of_a_quarantine_never_shrinks_the_exact_lost_range(tmp_path) -> None:
    """Killed after each file move of the quarantine, then restarted: the record still
    says exactly 5-39, and the quarantine ends up holding the whole WAL."""
    k = 0
    while True:
        root = tmp_path / f"k{k}"
        md, objs, cfg = _fresh_stores(root)
        a = BrokerHost("A", str(root / "a"), md, objs, cfg)
        hosted = a.load(TOPIC)
        produce_range(hosted, 0, 4, ack="archived")
        produce_range(hosted, 5, 39)
        _die(a)
        b = BrokerHost("B", str(root / "b"), md, objs, cfg)
        produce_range(b.load(TOPIC), 5, 6, ack="archived")
        b.close()

        crashing = _crashing_fs("rename", k, counts=lambda dst: ".quarantine" in dst)
        crashed = True
        try:
            BrokerHost("A", str(root / "a"), md, objs, cfg, wal_fs=crashing).close(unload=False)
            crashed = False  # k is past the last move: the quarantine completed
        except _Crash:
            pass
        back = BrokerHost("A", str(root / "a"), md, objs, cfg)
        back.close(unload=False)
        [record] = [r for r in keys.read_lost_ranges(md, T) if r.broker_id == "A"]
        assert (record.start_offset, record.end_offset, record.exact) == (5, 39, True), f"crash before move {k}"
        left = root / "a" / "default" / "reliable_topic"
        # Everything but bookkeeping moved (a crash before the .owner marker's move leaves
        # only that marker, which the next load of the topic here overwrites).
        assert not os.path.exists(left) or all(n.startswith(".") for n in os.listdir(left))
        seg_files = [n for n in os.listdir(record.quarantine_path) if n.endswith(".seg")]
        assert len(seg_files) >= 2, seg_files
        md.close()
        if not crashed:
            break
        k += 1


def test_a_host_started_with_another_broker_id_on_a_wal_root_is_refused(local_cluster: Cluster) -> None:
    import pytest

    from tiered.lifecycle import WalRootOwnedByAnotherBroker

    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4)  # durable on A only
    _die(a)
    wal_dir = os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic")
    before = sorted(os.listdir(wal_dir))
    with pytest.raises(WalRootOwnedByAnotherBroker):
        _host(local_cluster, "B", local_cluster.wal_root("A"))  # the wrong --broker-id
    assert sorted(os.listdir(wal_dir)) == before, "nothing of A's may be retired under another id"
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []
    again = local_cluster.broker("A")
    assert again.load(TOPIC).next_offset == 5


def test_a_damaged_owner_marker_does_not_make_a_broker_retire_its_own_wal(local_cluster: Cluster) -> None:
    import json

    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4, ack="archived")
    produce_range(a.topic(TOPIC), 5, 6)
    _die(a)
    b = local_cluster.broker("B")
    produce_range(b.load(TOPIC), 5, 9, ack="archived")  # takeover: A's epoch-1 tail recorded lost
    b.unload(TOPIC)
    a = local_cluster.broker("A")  # retires its epoch-1 WAL
    produce_range(a.load(TOPIC), 10, 14)  # durable on A only, a new WAL
    _die(a)
    marker = os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic", ".owner")
    with open(marker) as f:
        body = json.load(f)
    body["epoch"] = 1  # one digit changed at rest: now it names the epoch that was taken over
    with open(marker, "w") as f:
        json.dump(body, f)
    before = _lost(local_cluster)
    hosted = local_cluster.broker("A").load(TOPIC)
    assert hosted.report.recovered_local_wal and hosted.next_offset == 15
    assert _lost(local_cluster) == before
    assert [m.payload for m in read_all(hosted, 10, 14)] == [payload_for(i) for i in range(10, 15)]


def test_a_root_without_an_identity_file_is_not_claimed_by_another_broker(local_cluster: Cluster) -> None:
    """A root from before identity files (or whose .broker was lost): the WALs' own .owner
    markers say whose it is."""
    import pytest

    from tiered.lifecycle import WalRootOwnedByAnotherBroker

    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4)
    _die(a)
    os.remove(os.path.join(local_cluster.wal_root("A"), ".broker"))
    with pytest.raises(WalRootOwnedByAnotherBroker):
        _host(local_cluster, "B", local_cluster.wal_root("A"))
    assert local_cluster.broker("A").load(TOPIC).next_offset == 5


def test_a_crash_at_any_point_of_deleting_a_stale_archived_wal_leaves_it_deletable(tmp_path) -> None:
    """The stale-WAL delete used to remove files in listing order (the checkpoint
    last, .owner first): a crash left a WAL that never opened again, or one without its
    marker that was matched to an old loss record."""
    k = 0
    while True:
        root = tmp_path / f"k{k}"
        md, objs, cfg = _fresh_stores(root)
        a = BrokerHost("A", str(root / "a"), md, objs, cfg)
        hosted = a.load(TOPIC)
        for i in range(30):
            hosted.produce(payload_for(i), ack="archived")
        _die(a)
        b = BrokerHost("B", str(root / "b"), md, objs, cfg)
        b.load(TOPIC)  # takeover: every offset of A's WAL is archived, nothing is lost
        b.unload(TOPIC)
        b.close()

        crashed = True
        try:
            BrokerHost("A", str(root / "a"), md, objs, cfg, wal_fs=_crashing_fs("remove", k)).close(unload=False)
            crashed = False
        except _Crash:
            pass
        back = BrokerHost("A", str(root / "a"), md, objs, cfg)  # must retire the rest
        back.close(unload=False)
        left = root / "a" / "default" / "reliable_topic"
        assert not os.path.exists(left) or not [n for n in os.listdir(left) if not n.startswith(".")], k
        claimed = [r for r in keys.read_lost_ranges(md, T) if r.end_offset is not None]
        assert not claimed, f"crash before removal {k}: nothing was lost, yet {claimed}"
        md.close()
        if not crashed:
            break
        k += 1


def test_an_older_wal_never_confirms_away_a_later_epochs_recorded_loss(local_cluster: Cluster) -> None:
    """A stale, fully archived WAL of epoch 1 was matched to the takeover
    record of a later epoch of this broker (that ran on another disk and lost 5-7) and
    'confirmed nothing was lost', erasing the record."""
    disk_a = os.path.join(local_cluster.root, "disk-a")
    a = _host(local_cluster, "A", disk_a)
    produce_range(a.load(TOPIC), 0, 4)
    wal_dir = os.path.join(disk_a, "default", "reliable_topic")
    a.topic(TOPIC).wal.flush()
    copy = os.path.join(local_cluster.root, "copy")
    shutil.copytree(wal_dir, copy)
    a.unload(TOPIC)  # sealed at 4, WAL deleted
    a.close()
    if os.path.exists(os.path.join(copy, ".lock")):  # (none in a journaled group)
        os.remove(os.path.join(copy, ".lock"))
    shutil.copytree(copy, wal_dir)  # == killed after the seal landed, before the delete
    c = _host(local_cluster, "A", os.path.join(local_cluster.root, "disk-c"))
    hosted_c = c.load(TOPIC)
    epoch_c = hosted_c.token.epoch
    produce_range(hosted_c, 5, 7)  # acknowledged, durable on disk C only
    hosted_c.publish_progress()
    _die(c)
    local_cluster.broker("B").load(TOPIC)  # takeover: A's 5-7 recorded lost
    [before] = [r for r in keys.read_lost_ranges(local_cluster.metadata, T) if r.epoch == epoch_c]
    assert (before.start_offset, before.end_offset, before.exact) == (5, 7, False)
    _host(local_cluster, "A", disk_a)  # A back on disk A: retires the stale sealed WAL
    [after] = [r for r in keys.read_lost_ranges(local_cluster.metadata, T) if r.epoch == epoch_c]
    assert (after.start_offset, after.end_offset, after.exact) == (5, 7, False), "a recorded loss was erased"
    report = verify_topic(T, local_cluster.metadata, local_cluster.objects)
    assert any(p["kind"] == "lost_range" for p in report.problems)


def test_a_stale_wal_whose_marker_is_damaged_after_a_failed_takeover_is_not_recovered(
        local_cluster: Cluster) -> None:
    """Two faults: a takeover load that fails after its acquire (it keeps ownership, so
    the owner record names this broker again), then a damaged ``.owner`` beside the stale
    WAL. The owner record alone then says "ours", but the archive says otherwise: another
    broker archived offsets inside this WAL's range. Recovering it would serve this WAL's
    payloads for offsets another broker acknowledged as archived, and bring back messages
    recorded as lost. It must be retired against its own takeover record instead."""
    import json

    import pytest

    from tiered.lifecycle import LoadError

    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4, ack="archived")
    produce_range(a.topic(TOPIC), 5, 9)  # durable on A only (epoch 1)
    _die(a)
    b = local_cluster.broker("B")
    hosted_b = b.load(TOPIC)  # takeover: A's 5-9 recorded lost, numbering restarts at 5
    assert hosted_b.next_offset == 5
    for i in (5, 6):
        assert hosted_b.produce(f"b{i}".encode(), ack="archived") == i
    _die(b)
    assert [r[:4] for r in _lost(local_cluster)] == [(5, 9, "A", 1)]

    root_a = local_cluster.wal_root("A")
    blocker = os.path.join(root_a, ".quarantine")
    with open(blocker, "w"):
        pass  # fault 1: the quarantine directory cannot be created, so the takeover's load fails
    a = _host(local_cluster, "A", root_a)
    with pytest.raises(LoadError):
        a.load(TOPIC, force=True)
    os.remove(blocker)
    lost = _lost(local_cluster)
    # Its quarantine directory could not be claimed, which comes before the exact record:
    # the takeover's "at least" record stands.
    assert (5, 9, "A", 1, False) in lost
    marker = os.path.join(root_a, "default", "reliable_topic", ".owner")
    with open(marker) as f:
        body = json.load(f)
    body["epoch"] = 99  # fault 2: damaged at rest, its checksum no longer matches
    with open(marker, "w") as f:
        json.dump(body, f)

    hosted = a.load(TOPIC)
    assert not hosted.report.recovered_local_wal
    assert hosted.next_offset == 7
    assert [m.payload for m in read_all(hosted, 5, 6)] == [b"b5", b"b6"]
    assert hosted.produce(b"a-new", ack="archived") == 7
    # The stale WAL is quarantined now, which makes the takeover's record of A's 5-9 exact.
    # What is added are the "at least from 7" accounts of the two owners that never sealed
    # (B at epoch 2, A's failed load at epoch 3): the loads that followed them cannot know
    # their tails.
    after = set(_lost(local_cluster))
    assert (5, 9, "A", 1, True) in after
    assert {r for r in lost if r[:4] != (5, 9, "A", 1)} <= after
    assert all(r[0] == 7 and r[1] is None and not r[4] for r in after - set(lost) - {(5, 9, "A", 1, True)})
