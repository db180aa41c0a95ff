"""A failed load leaves the topic at least as recoverable as before the attempt.

The data at risk is a broker's own unarchived WAL: messages acknowledged ``durable``
that exist only on its disk. Any failure in a later load attempt (a step raising, a
malformed record, a full or corrupt disk) must neither release the broker's claim on
that WAL nor move it aside and renumber, unless the loss is recorded first by an
explicit operator decision.
"""
from __future__ import annotations

import errno
import os

import pytest

from tiered.archive.chain import DescriptorChain
from tiered.lifecycle import LoadError
from tiered.lifecycle import LocalWalUnreadable
from tiered.lifecycle.ownership import TopicOwnedElsewhere, read_owner
from tiered.lifecycle.retire import QUARANTINE_ID
from tiered.metadata import keys
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import (  # noqa: F401
    TOPIC,
    Cluster,
    local_cluster,
    payload_for,
    produce_range,
    read_all,
    wal_files,
)

T = TopicName.parse(TOPIC)


def _five_durable_then_crash(cluster: Cluster):
    """Broker A acknowledges 0-4 ``durable`` (none archived), then its process ends
    without sealing (what one-shot ``dnb produce`` runs and a crash leave behind)."""
    a = cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4)
    a.abandon(TOPIC)
    return a


def _assert_recovers_all_five(a) -> None:
    hosted = a.load(TOPIC)
    assert hosted.report.recovered_local_wal
    assert hosted.next_offset == 5, "offsets 0-4 were acknowledged; numbering must continue after them"
    assert [m.payload for m in read_all(hosted, 0, 4)] == [payload_for(i) for i in range(5)]
    assert a.retired == []  # nothing quarantined
    assert hosted.produce(b"next") == 5


def _fail_once(monkeypatch, target, name: str, error: BaseException) -> None:
    original = getattr(target, name)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)


@pytest.mark.parametrize("step", ["open WAL", "mark topic open", "start uploader", "open subscriptions"])
def test_a_load_failing_at_any_step_keeps_the_brokers_claim_on_its_own_wal(local_cluster: Cluster, monkeypatch,
                                                                          step: str) -> None:
    a = _five_durable_then_crash(local_cluster)
    target = {"open WAL": "_recover_local", "mark topic open": "_mark_open",
              "start uploader": "_start_uploader", "open subscriptions": "_open_subscriptions"}[step]
    _fail_once(monkeypatch, a, target, OSError(errno.EIO, "injected"))
    with pytest.raises(LoadError) as info:
        a.load(TOPIC)
    assert info.value.step == step
    owner, _ = read_owner(local_cluster.metadata, T)
    assert owner.holder == "A", "a failed load must not release the topic while A's WAL holds unarchived data"
    assert wal_files(local_cluster, "A")
    _assert_recovers_all_five(a)


def test_a_malformed_cursor_fails_the_load_without_losing_the_wal(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 9, ack="archived")
    produce_range(hosted, 10, 14)  # durable only
    a.abandon(TOPIC)
    cursor = keys.cursor_key(T, "billing")
    local_cluster.metadata.put(cursor, b'{"last_acked_offset": -7}')
    with pytest.raises(LoadError) as info:
        a.load(TOPIC)
    assert info.value.step == "clamp subscription cursors"
    assert read_owner(local_cluster.metadata, T)[0].holder == "A"
    local_cluster.metadata.put(cursor, keys.Cursor(3).to_json())  # the operator fixes the record
    hosted = a.load(TOPIC)
    assert hosted.next_offset == 15
    assert [m.payload for m in read_all(hosted, 10, 14)] == [payload_for(i) for i in range(10, 15)]


def test_disk_full_at_load_never_renumbers(local_cluster: Cluster, monkeypatch) -> None:
    import wal.log

    a = _five_durable_then_crash(local_cluster)
    original = wal.log.WriteAheadLog.open.__func__
    full = {"on": True}

    def open_on_full_disk(cls, *args, **kwargs):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(wal.log.WriteAheadLog, "open", classmethod(open_on_full_disk))
    for _ in range(2):  # an operator retrying while the disk is still full
        with pytest.raises(LoadError) as info:
            a.load(TOPIC)
        # Not "unreadable": nothing says the WAL is damaged, so no advice to discard it.
        assert not isinstance(info.value, LocalWalUnreadable)
        assert "No space left" in str(info.value) and "discard" not in str(info.value)
        assert os.path.join("default", "reliable_topic") in str(info.value)
    assert read_owner(local_cluster.metadata, T)[0].holder == "A"
    full["on"] = False  # space freed
    _assert_recovers_all_five(a)
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []


@pytest.mark.parametrize("error", [OverflowError("Python int too large to convert to C ssize_t"),
                                   RecursionError("maximum recursion depth exceeded"),
                                   OSError(errno.EMFILE, "Too many open files"),
                                   OSError(errno.ESTALE, "Stale file handle")])
def test_a_wal_that_fails_to_open_for_a_reason_other_than_damage_is_not_called_unreadable(
        local_cluster: Cluster, monkeypatch, error: BaseException) -> None:
    """LocalWalUnreadable advises discarding the WAL, which records its acknowledged
    messages as lost: only for damaged files, never for a setting native code cannot take,
    a resource or a bug (atk63 f01, f04)."""
    import wal.log

    a = _five_durable_then_crash(local_cluster)
    original = wal.log.WriteAheadLog.open.__func__
    failing = {"on": True}

    def open_failing(cls, *args, **kwargs):
        if failing["on"]:
            raise error
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(wal.log.WriteAheadLog, "open", classmethod(open_failing))
    before = wal_files(local_cluster, "A")
    with pytest.raises(LoadError) as info:
        a.load(TOPIC)
    assert not isinstance(info.value, LocalWalUnreadable) and "discard" not in str(info.value).replace(
        "discarding it is not the remedy", "")
    assert wal_files(local_cluster, "A") == before
    failing["on"] = False
    _assert_recovers_all_five(a)
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []


def test_a_wal_directory_that_cannot_be_read_before_the_load_gives_a_typed_error(
        local_cluster: Cluster, monkeypatch) -> None:
    """Out of descriptors while the load checks for its own history elsewhere: a LoadError
    naming the directory, nothing changed (atk63 f04)."""
    import tiered.lifecycle.host

    a = _five_durable_then_crash(local_cluster)

    def out_of_descriptors(*_args: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(tiered.lifecycle.host, "own_open_history_elsewhere", out_of_descriptors)
    with pytest.raises(LoadError, match="Too many open files"):
        a.load(TOPIC)
    monkeypatch.undo()
    _assert_recovers_all_five(a)


def _flip_a_byte_in_the_first_segment(cluster: Cluster) -> None:
    directory = os.path.join(cluster.wal_root("A"), "default", "reliable_topic")
    segment = next(n for n in sorted(os.listdir(directory)) if n.endswith(".seg"))
    path = os.path.join(directory, segment)
    with open(path, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_corrupt_wal_is_kept_and_the_topic_refuses_to_load_until_the_operator_decides(local_cluster: Cluster) -> None:
    a = _five_durable_then_crash(local_cluster)
    tail = a.load(TOPIC)
    produce_range(tail, 5, 9)  # more than one frame, so the flip is not a torn tail
    tail.publish_progress()  # durable to 9, as far as anyone was told
    a.abandon(TOPIC)
    _flip_a_byte_in_the_first_segment(local_cluster)
    before = wal_files(local_cluster, "A")
    for _ in range(2):
        with pytest.raises(LocalWalUnreadable):
            a.load(TOPIC)
    assert wal_files(local_cluster, "A") == before, "an unreadable WAL must stay where it is, untouched"
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []
    assert read_owner(local_cluster.metadata, T)[0].holder == "A"
    # Another live broker cannot take it either (A still owns it): no second history.
    with pytest.raises(TopicOwnedElsewhere):
        local_cluster.broker("B").load(TOPIC)
    # The operator gives the WAL up explicitly: the loss is recorded before numbering
    # restarts after the archive, at least to the tip the epoch published (the WAL's own
    # range is unknown). (The recovered frames 0-4 count as old, so a background pass may
    # have archived some of them before the abandon: read where the archive ends.)
    archived_next = DescriptorChain(local_cluster.metadata, T).next_offset()
    hosted = a.load(TOPIC, discard_local_wal=True)
    assert hosted.next_offset == archived_next
    [lost] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (lost.start_offset, lost.end_offset, lost.broker_id, lost.exact) == (archived_next, 9, "A", False)
    assert lost.quarantine_path and os.path.isdir(lost.quarantine_path)
    # Every file moved (the lock is no data), beside the quarantine's own identity file.
    assert sorted(os.listdir(lost.quarantine_path)) == sorted([n for n in before if n != ".lock"] + [QUARANTINE_ID])


def test_a_failed_first_load_of_a_new_topic_releases_it(local_cluster: Cluster, monkeypatch) -> None:
    """Nothing of value is local (no history, empty WAL): releasing is safe, and lets
    another broker load the topic."""
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    _fail_once(monkeypatch, a, "_start_uploader", OSError("disk on fire"))
    with pytest.raises(LoadError):
        a.load(TOPIC)
    assert read_owner(local_cluster.metadata, T)[0].holder is None
    assert b.load(TOPIC).next_offset == 0


def test_a_failed_load_of_a_sealed_topic_leaves_it_sealed(local_cluster: Cluster, monkeypatch) -> None:
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    produce_range(a.load(TOPIC), 0, 4)
    assert a.unload(TOPIC) == 4
    state_before = local_cluster.metadata.get(keys.state_key(T)).value
    _fail_once(monkeypatch, b, "_open_subscriptions", OSError("disk on fire"))
    with pytest.raises(LoadError):
        b.load(TOPIC)
    assert local_cluster.metadata.get(keys.state_key(T)).value == state_before
    assert read_owner(local_cluster.metadata, T)[0].holder is None
    assert local_cluster.broker("C").load(TOPIC).next_offset == 5


@pytest.mark.parametrize("kind", ["overlap", "gap"])
def test_restore_refuses_a_broken_descriptor_chain(local_cluster: Cluster, kind: str) -> None:
    from tiered.archive.naming import object_id_for
    from tiered.lifecycle.restore import BrokenChain

    a = local_cluster.broker("A")
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 9, ack="archived")
    assert a.unload(TOPIC) == 9
    [d] = [keys.ObjectDescriptor.from_json(kv.key, kv.value)
           for kv in local_cluster.metadata.range(keys.objects_prefix(T))][-1:]
    start = d.end_offset - 2 if kind == "overlap" else d.end_offset + 5
    bogus = keys.ObjectDescriptor(start, start + 4, object_id_for(start, start + 4, d.epoch), d.size, d.etag,
                                  d.created_at, d.broker_id, d.epoch, d.footer_crc32c, d.block_crc32c)
    local_cluster.metadata.put(keys.descriptor_key(T, start), bogus.to_json())
    with pytest.raises(BrokenChain) as info:
        local_cluster.broker("B").load(TOPIC)
    assert kind in str(info.value)


def test_discarding_an_unreadable_stale_wal_completes_the_takeovers_record(local_cluster: Cluster) -> None:
    """A's WAL of an epoch another broker took over from: its loss started where the
    takeover restarted numbering, whatever offset the topic has reached since."""
    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    produce_range(a.load(TOPIC), 0, 4)  # durable only
    a.close(unload=False)  # A dies
    topic_b = b.load(TOPIC)  # failover: restarts at 0, records A's loss from 0
    produce_range(topic_b, 0, 9)
    assert b.unload(TOPIC) == 9
    [takeover] = keys.read_lost_ranges(local_cluster.metadata, T)
    _flip_a_byte_in_the_first_segment(local_cluster)

    a2 = local_cluster.broker("A")  # its start keeps the unreadable stale WAL in place
    with pytest.raises(LocalWalUnreadable):
        a2.load(TOPIC)
    hosted = a2.load(TOPIC, discard_local_wal=True)
    assert hosted.next_offset == 10
    [record] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (record.start_offset, record.epoch) == (takeover.start_offset, takeover.epoch)
    assert record.quarantine_path and not record.exact


def test_a_failed_commit_group_is_not_reported_as_an_unreadable_wal(tmp_path) -> None:
    """After the root's commit group failed, no topic of the root opens until a restart; the
    WAL itself is healthy (its segments may lack rounds only the journal holds), so the load
    must not call it unreadable or advise discarding it. After a restart it opens."""
    from wal.config import WalConfig
    from tiered.lifecycle.wal_root import WalRoot

    root = WalRoot("b1", str(tmp_path), None, WalConfig())
    topic = TopicName.parse("/ns/t")
    wal = root.open_wal(topic)
    for i in range(3):
        wal.append(b"m%d" % i)
    wal.flush()
    wal.close()
    assert root.group is not None
    root.group.fail(OSError(errno.EIO, "a segment sync failed at a checkpoint (injected)"))
    with pytest.raises(LoadError) as info:
        root.open_local(topic)
    assert not isinstance(info.value, LocalWalUnreadable)
    assert "restart the broker" in str(info.value) and "discard" not in str(info.value)
    root.release()
    restarted = WalRoot("b1", str(tmp_path), None, WalConfig())
    wal = restarted.open_local(topic)
    try:
        assert wal.next_offset == 3
    finally:
        wal.close()
        restarted.release()
