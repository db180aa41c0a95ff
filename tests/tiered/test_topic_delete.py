"""Topic delete, re-creation and auto_create, on SQLite + local dir and on etcd + moto.

Delete is a loss path by definition: these tests hold it to its preconditions (no other
live owner), to its order (tombstone first: every access refused from then on), to
resumability (a crash after any step, then a re-run, finishes it) and to what a
re-created name inherits (epochs and offsets continue; the old incarnation's WAL and
owner stay out)."""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tiered.archive.naming import topic_objects_prefix
from tiered.errors import MalformedRecord, OwnershipLost, TopicDeleted, TopicNotFound
from tiered.lifecycle.delete import STEPS, delete_topic, list_topics
from tiered.lifecycle.ownership import TopicOwnedElsewhere, read_owner
from tiered.metadata import keys
from tiered.read.reader import create_reader
from tiered.read.subscriptions import SubscriptionManager
from tiered.lifecycle.ownership import unowned_fencing
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    TOPIC,
    Cluster,
    any_cluster,
    local_cluster,
    produce_range,
    read_all,
)

T = TopicName.parse(TOPIC)


class Crash(Exception):
    """Injected after a delete step."""


def _everything(cluster: Cluster) -> tuple[list[str], list[str], list[str]]:
    """(metadata keys under the topic's storage prefix, under its /topics/ prefix, objects)."""
    storage = [kv.key for kv in cluster.metadata.range(keys.storage_prefix(T))]
    topic = [kv.key for kv in cluster.metadata.range(keys.topic_prefix(T))]
    objects = [o.key for o in cluster.objects.list(topic_objects_prefix(T))]
    return storage, topic, objects


def _sealed_topic_with_data(cluster: Cluster, last: int = 9) -> None:
    a = cluster.broker("a")
    hosted = a.load(T)
    produce_range(hosted, 0, last, ack="archived")
    sub = hosted.subscribe("s1", "earliest")
    sub.ack(3)
    sub.flush()
    keys_placement = keys.placement_key(T)
    cluster.metadata.put(keys_placement, b"{}")  # a load manager placement record
    cluster.metadata.put(keys.assignment_key("a", T), keys.Assignment(1.0).to_json())
    a.unload(T)


def _assert_deleted(cluster: Cluster, epoch: int, next_offset: int) -> None:
    storage, topic, objects = _everything(cluster)
    # Only the owner record (released: the epoch) and the tombstone stay.
    assert sorted(storage) == sorted([keys.owner_key(T), keys.tombstone_key(T)])
    assert topic == [] and objects == []
    assert cluster.metadata.get(keys.placement_key(T)) is None
    assert keys.topic_assignments(cluster.metadata, T) == []
    tomb, _raw = keys.read_tombstone(cluster.metadata, T)
    assert tomb is not None and (tomb.phase, tomb.epoch, tomb.next_offset) == ("deleted", epoch, next_offset)
    owner, _kv = read_owner(cluster.metadata, T)
    assert owner is not None and owner.holder is None and owner.epoch == epoch


def test_delete_sealed_topic_removes_records_cursors_descriptors_and_objects(any_cluster: Cluster) -> None:
    _sealed_topic_with_data(any_cluster)
    storage, topic, objects = _everything(any_cluster)
    assert objects and topic and any("/objects/" in k for k in storage)
    # An orphan (an object no descriptor names) goes too: the object prefix is listed.
    any_cluster.objects.put(topic_objects_prefix(T) + "data-99-99-e7.dnb1", b"orphan")
    report = delete_topic(any_cluster.metadata, any_cluster.objects, T, broker_id="ops")
    assert report.outcome == "deleted" and report.next_offset == 10 and report.epoch == 1
    assert report.removed["objects"] == len(objects) + 1
    _assert_deleted(any_cluster, 1, 10)
    # Idempotent: again is a no-op that says so; a name that never existed writes nothing.
    again = delete_topic(any_cluster.metadata, any_cluster.objects, T, broker_id="ops")
    assert again.outcome == "already_deleted"
    never = TopicName.parse("/default/never_was")
    assert delete_topic(any_cluster.metadata, any_cluster.objects, never, broker_id="ops").outcome == "not_found"
    assert any_cluster.metadata.range(keys.storage_prefix(never)) == []


def test_deleted_topic_refuses_load_read_subscribe_and_cursor_writes(local_cluster: Cluster) -> None:
    _sealed_topic_with_data(local_cluster)
    delete_topic(local_cluster.metadata, local_cluster.objects, T, broker_id="ops")
    b = local_cluster.broker("b")
    with pytest.raises(TopicDeleted):
        b.load(T)
    with pytest.raises(TopicDeleted):
        b.load(T, create=True)  # implicit creation never brings a deleted name back
    with pytest.raises(TopicDeleted):
        create_reader(T, None, local_cluster.metadata, local_cluster.objects, "earliest")
    with pytest.raises(TopicDeleted):
        unowned_fencing(local_cluster.metadata, T)  # the CLI's cursor writes on unowned topics
    assert local_cluster.metadata.range(keys.topic_prefix(T)) == []


def test_cursor_write_fenced_before_the_delete_fails_after_its_tombstone(local_cluster: Cluster) -> None:
    _sealed_topic_with_data(local_cluster)
    subs = SubscriptionManager(T, local_cluster.metadata, fencing=unowned_fencing(local_cluster.metadata, T))
    sub = subs.subscribe("late", "earliest")
    sub.ack(5)  # acknowledged in memory; the cursor write comes after the tombstone
    delete_topic(local_cluster.metadata, local_cluster.objects, T, broker_id="ops")
    with pytest.raises(Exception):
        sub.flush()
    subs.close(flush=False)
    assert local_cluster.metadata.range(keys.topic_prefix(T)) == []


def test_delete_owned_topic_via_its_host_seals_first_and_removes_the_local_wal(any_cluster: Cluster) -> None:
    a = any_cluster.broker("a")
    hosted = a.load(T)
    produce_range(hosted, 0, 4, ack="archived")
    produce_range(hosted, 5, 7)  # durable only: the seal archives it first
    wal_dir = os.path.join(any_cluster.wal_root("a"), "default", "reliable_topic")
    assert os.path.isdir(wal_dir)
    report = a.delete(T)
    assert report.outcome == "deleted" and report.next_offset == 8
    assert not os.path.exists(wal_dir)
    assert a.topics() == []
    _assert_deleted(any_cluster, 1, 8)


def test_delete_of_topic_owned_by_another_live_broker_is_refused_and_changes_nothing(any_cluster: Cluster) -> None:
    a = any_cluster.broker("a")
    hosted = a.load(T)
    produce_range(hosted, 0, 2, ack="archived")
    before = _everything(any_cluster)
    b = any_cluster.broker("b")
    with pytest.raises(TopicOwnedElsewhere):
        b.delete(T)
    with pytest.raises(TopicOwnedElsewhere):
        delete_topic(any_cluster.metadata, any_cluster.objects, T, broker_id="b")
    assert _everything(any_cluster) == before
    assert keys.read_tombstone(any_cluster.metadata, T) == (None, None)
    produce_range(hosted, 3, 3, ack="archived")  # the owner carries on


@pytest.mark.parametrize("step", STEPS[:-1])
def test_crash_after_each_step_then_rerun_finishes(local_cluster: Cluster, step: str) -> None:
    _sealed_topic_with_data(local_cluster)

    def crash(done: str) -> None:
        if done == step:
            raise Crash(done)

    with pytest.raises(Crash):
        delete_topic(local_cluster.metadata, local_cluster.objects, T, broker_id="ops", fault_hook=crash)
    tomb, _raw = keys.read_tombstone(local_cluster.metadata, T)
    assert tomb is not None and tomb.phase == "deleting"
    # Half-deleted: nothing serves what is left, nothing loads or re-creates it.
    b = local_cluster.broker("b")
    with pytest.raises(TopicDeleted):
        b.load(T)
    with pytest.raises(TopicDeleted):
        b.create(T)
    with pytest.raises(TopicDeleted):
        create_reader(T, None, local_cluster.metadata, local_cluster.objects, 0)
    report = delete_topic(local_cluster.metadata, local_cluster.objects, T, broker_id="ops")
    assert report.outcome == "resumed"
    _assert_deleted(local_cluster, 1, 10)


def _stalled_delete_outlived_by_a_recreate(cluster: Cluster, stalled_after: str) -> dict[str, Any]:
    """A delete stalls after ``stalled_after`` while another run finishes the delete and
    broker b creates the name again, acknowledging 10-14 as archived, with a subscription
    and a placement record; then the stalled run goes on. What b's incarnation had."""
    _sealed_topic_with_data(cluster)
    later: dict[str, Any] = {}

    def stall(done: str) -> None:
        if done != stalled_after or later:
            return
        assert delete_topic(cluster.metadata, cluster.objects, T, broker_id="ops2").outcome == "resumed"
        created, _fresh = cluster.broker("b").create(T)
        produce_range(created, 10, 14, ack="archived")
        sub = created.subscribe("s2", "earliest")
        sub.ack(11)
        sub.flush()
        cluster.metadata.put(keys.placement_key(T), b'{"broker": "b"}')
        later.update(hosted=created, everything=_everything(cluster))

    report = delete_topic(cluster.metadata, cluster.objects, T, broker_id="ops", fault_hook=stall)
    assert report.outcome == "already_deleted", "a run whose tombstone moved on must say it did not delete"
    return later


@pytest.mark.parametrize("stalled_after", STEPS[:-1])
def test_a_stalled_delete_never_deletes_what_a_later_incarnation_wrote(local_cluster: Cluster,
                                                                      stalled_after: str) -> None:
    """Two runs of one delete (two operators, a retry while the first hangs on a slow
    listing): the first may go on after the second finished and the name was created
    again. It must then stop, deleting nothing of the new incarnation (atk28 F1: it deleted
    the new descriptors, objects, cursors, progress and state, so archived acks were lost)."""
    later = _stalled_delete_outlived_by_a_recreate(local_cluster, stalled_after)
    assert _everything(local_cluster) == later["everything"]
    tomb, _raw = keys.read_tombstone(local_cluster.metadata, T)
    assert tomb is not None and tomb.phase == "recreated"
    hosted = later["hosted"]
    assert [m.offset for m in read_all(hosted, 10, 14)] == [10, 11, 12, 13, 14]
    assert hosted.subscribe("s2", "earliest").cursor == 11


def test_a_stalled_delete_never_deletes_what_a_later_incarnation_wrote_on_etcd_and_s3(any_cluster: Cluster) -> None:
    later = _stalled_delete_outlived_by_a_recreate(any_cluster, "cursors")
    assert _everything(any_cluster) == later["everything"]
    assert [m.offset for m in read_all(later["hosted"], 10, 14)] == [10, 11, 12, 13, 14]


def test_crash_after_each_step_then_rerun_finishes_on_etcd_and_s3(any_cluster: Cluster) -> None:
    _sealed_topic_with_data(any_cluster)
    for step in STEPS[1:-1]:  # crash again and again; every re-run gets one step further
        def crash(done: str, at: str = step) -> None:
            if done == at:
                raise Crash(done)
        with pytest.raises(Crash):
            delete_topic(any_cluster.metadata, any_cluster.objects, T, broker_id="ops", fault_hook=crash)
    assert delete_topic(any_cluster.metadata, any_cluster.objects, T, broker_id="ops").outcome == "resumed"
    _assert_deleted(any_cluster, 1, 10)


def test_recreate_continues_epochs_and_offsets_fences_the_zombie_and_retires_its_wal(any_cluster: Cluster) -> None:
    # Broker a holds the topic without a registration (it looks dead) and keeps running:
    # the zombie of the old incarnation, with offsets 5..9 durable but never archived.
    zombie = any_cluster.broker("a", register_session=False)
    hosted = zombie.load(T)
    produce_range(hosted, 0, 4, ack="archived")
    produce_range(hosted, 5, 9)
    ops = any_cluster.broker("ops")
    report = ops.delete(T)  # a dead holder: allowed, its tail goes with the topic
    assert report.outcome == "deleted" and report.epoch == 1
    first = report.next_offset
    assert first >= 5
    # The zombie's archive write after the tombstone is fenced: nothing is committed.
    with pytest.raises(OwnershipLost):
        hosted.uploader.upload_once()
    assert any_cluster.metadata.range(keys.objects_prefix(T)) == []

    b = any_cluster.broker("b")
    created, fresh = b.create(T)
    assert fresh
    assert created.token.epoch == 2  # above the deleted incarnation's, never 1 again
    assert produce_range(created, first, first + 2, ack="archived") == [first, first + 1, first + 2]
    with pytest.raises(OwnershipLost):
        hosted.uploader.upload_once()  # still fenced under the new incarnation
    assert [m.offset for m in read_all(created, first, first + 2)] == [first, first + 1, first + 2]
    b.unload(T)
    zombie.close(unload=False)

    # Broker a comes back: its WAL of the deleted incarnation (epoch 1) is deleted at
    # start, never resumed into the new topic and never recorded as its loss.
    again = any_cluster.broker("a")
    assert [(r.epoch, r.lost_start) for r in again.retired] == [(1, None)]
    assert keys.read_lost_ranges(any_cluster.metadata, T) == []
    reloaded = again.load(T)
    assert reloaded.wal.next_offset == first + 3
    assert [m.offset for m in read_all(reloaded, first, first + 2)] == [first, first + 1, first + 2]
    assert [m.offset for m in create_reader(T, None, any_cluster.metadata, any_cluster.objects, "earliest",
                                            live=False)] == [first, first + 1, first + 2]


def test_create_on_the_host_still_running_the_deleted_incarnation_creates_a_new_topic(local_cluster: Cluster) -> None:
    """Broker a hosts the topic unregistered (paused: it looks dead) and keeps running
    while another broker deletes it. A create on a must not hand out that copy of the
    deleted incarnation (refused while the delete is unfinished; after it, a new topic at
    a new epoch from the tombstone's next offset). Found by the harness's delete step
    (seed 49645): the create returned the old copy, whose durable acks were then lost."""
    a = local_cluster.broker("a", register_session=False)
    zombie = a.load(T)
    produce_range(zombie, 0, 4, ack="archived")
    produce_range(zombie, 5, 6)
    ops = local_cluster.broker("ops")

    def crash(step: str) -> None:
        if step == "tombstone":
            raise Crash(step)

    with pytest.raises(Crash):
        ops.delete(T, fault_hook=crash)
    with pytest.raises(TopicDeleted):
        a.create(T)  # the delete is unfinished: refused, not the old copy
    assert zombie.fenced
    report = ops.delete(T)
    assert report.outcome == "resumed"
    created, fresh = a.create(T)
    assert fresh and created is not zombie
    assert created.token.epoch > report.epoch
    first = report.next_offset
    assert created.next_offset == first
    assert produce_range(created, first, first + 1) == [first, first + 1]
    assert [m.offset for m in read_all(created, first, first + 1)] == [first, first + 1]
    with pytest.raises(OwnershipLost):
        zombie.produce(b"late", ack="durable")


def test_stale_wal_of_deleted_incarnation_found_at_load_is_retired_not_resumed(local_cluster: Cluster) -> None:
    a = local_cluster.broker("a")
    hosted = a.load(T)
    produce_range(hosted, 0, 5)  # durable, never archived
    a.abandon(T)  # a crash: WAL and ownership stay
    a.session.stop(revoke=True)  # and the broker is gone
    report = delete_topic(local_cluster.metadata, local_cluster.objects, T, broker_id="ops")
    b = local_cluster.broker("b")
    b.create(T)
    b.unload(T)
    # The same (still running) host loads the re-created topic: its old WAL is not resumed.
    reloaded = a.load(T, create=False)
    assert reloaded.report.recovered_local_wal is False
    assert reloaded.wal.next_offset == report.next_offset


def test_auto_create_off_refuses_unknown_topics_and_writes_nothing(any_cluster: Cluster) -> None:
    a = any_cluster.broker("a", auto_create=False)
    with pytest.raises(TopicNotFound):
        a.load(T)
    assert _everything(any_cluster) == ([], [], [])
    hosted, fresh = a.create(T)
    assert fresh
    produce_range(hosted, 0, 1)
    a.unload(T)
    assert a.load(T).wal.next_offset == 2  # an existing topic loads
    _again, fresh = a.create(T)
    assert not fresh


def test_delete_racing_a_load_on_the_same_host_seals_the_loaded_topic_first(local_cluster: Cluster,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete that starts while a load of the same topic on the same host is past its
    acquire (owner record names this broker, the topic not hosted yet) must not delete
    under the load: it waits for the load and seals what it loaded, or the load is refused.
    Never a topic that acknowledges offsets after the tombstone."""
    from tiered.lifecycle import host as hostmod

    a = local_cluster.broker("a")
    hosted = a.load(T)
    produce_range(hosted, 0, 4, ack="archived")
    a.unload(T)

    acquired, resume, delete_waits = threading.Event(), threading.Event(), threading.Event()
    real_plan = hostmod.plan_restore

    def paused_plan(*args: Any, **kwargs: Any) -> Any:
        acquired.set()  # ownership is taken; the load holds the topic lock
        assert resume.wait(30)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(hostmod, "plan_restore", paused_plan)
    real_lock = a._topic_lock

    def watched_lock(topic: TopicName) -> threading.Lock:
        if threading.current_thread().name == "deleter":
            delete_waits.set()  # the delete reached the topic lock the load holds
        return real_lock(topic)

    monkeypatch.setattr(a, "_topic_lock", watched_lock)
    results: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], Any]) -> None:
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            results[name] = e

    loader = threading.Thread(target=run, args=("load", lambda: a.load(T)), name="loader")
    loader.start()
    assert acquired.wait(30)
    deleter = threading.Thread(target=run, args=("delete", lambda: a.delete(T)), name="deleter")
    deleter.start()
    assert delete_waits.wait(30)
    resume.set()
    loader.join(60)
    deleter.join(60)
    assert not loader.is_alive() and not deleter.is_alive()

    report = results["delete"]
    assert not isinstance(report, Exception), report
    assert report.outcome == "deleted" and report.next_offset == 5
    assert a.topics() == []
    loaded = results["load"]
    if not isinstance(loaded, Exception):
        # The load finished first; the delete sealed it before the tombstone.
        assert loaded.state is not hostmod.TopicState.OPEN
        with pytest.raises(Exception):
            loaded.produce(b"after the tombstone", timeout_s=5)
    _assert_deleted(local_cluster, report.epoch, 5)
    b = local_cluster.broker("b")
    created, _fresh = b.create(T)
    assert created.wal.next_offset == 5


def test_load_whose_topic_is_deleted_after_its_acquire_fails_with_topic_deleted(
        local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tombstone rewrites the owner record a load just took (a holder that looks dead:
    no registration): the load fails with TopicDeleted and hosts nothing."""
    from tiered.lifecycle import host as hostmod

    a = local_cluster.broker("a", register_session=False)
    real_plan = hostmod.plan_restore

    def delete_meanwhile(*args: Any, **kwargs: Any) -> Any:
        delete_topic(local_cluster.metadata, local_cluster.objects, T, broker_id="ops")
        return real_plan(*args, **kwargs)

    hosted = a.load(T)
    produce_range(hosted, 0, 2, ack="archived")
    a.unload(T)
    monkeypatch.setattr(hostmod, "plan_restore", delete_meanwhile)
    with pytest.raises(TopicDeleted):
        a.load(T)
    assert a.topics() == []
    tomb, _raw = keys.read_tombstone(local_cluster.metadata, T)
    assert tomb is not None and tomb.phase == "deleted" and tomb.next_offset == 3


def test_one_malformed_tombstone_is_a_malformed_row_and_the_list_goes_on(local_cluster: Cluster) -> None:
    a = local_cluster.broker("a")
    for name in ("/default/ok1", TOPIC, "/default/ok2"):
        a.load(name)
        a.unload(name)
    local_cluster.metadata.put(keys.tombstone_key(T), b'{"phase": "recreated", "epoch": -1}')
    rows = {r.topic: r for r in list_topics(local_cluster.metadata)}
    assert rows["/default/ok1"].status == rows["/default/ok2"].status == "sealed"
    bad = rows[TOPIC]
    assert bad.status == "malformed" and bad.error and keys.tombstone_key(T) in bad.error
    assert bad.to_json()["error"] == bad.error
    # The topic itself stays refused (fail closed): nothing is loaded or deleted on a guess.
    with pytest.raises(MalformedRecord):
        a.load(T)


def test_verify_accepts_a_recreated_topic_sealed_empty_and_with_data(local_cluster: Cluster) -> None:
    from tiered.tools.verify import verify_topic

    _sealed_topic_with_data(local_cluster, last=4)
    local_cluster.broker("ops").delete(T)
    b = local_cluster.broker("b")
    b.create(T)
    assert b.unload(T) == 4  # sealed while empty: its "last offset" is just below its start
    report = verify_topic(T, local_cluster.metadata, local_cluster.objects)
    assert report.ok, report.problems
    assert report.archive_start == 5
    produce_range(b.load(T), 5, 7, ack="archived")
    b.unload(T)
    report = verify_topic(T, local_cluster.metadata, local_cluster.objects)
    assert report.ok and report.problems == [], report.problems


def test_old_incarnation_wal_with_a_damaged_owner_marker_is_quarantined_without_a_false_loss(
        local_cluster: Cluster) -> None:
    """A dead owner's WAL (0..4 archived, 5..9 acknowledged but never archived nor
    published) outlives a delete and a re-creation, and its ``.owner`` marker is damaged.
    Its restart must not record a loss in the new incarnation (whose own 5.. are intact):
    the WAL is quarantined, its bytes kept."""
    from tiered.tools.verify import verify_topic

    a = local_cluster.broker("a", register_session=False)
    hosted = a.load(T)
    publish = hosted.publish_progress
    hosted.publish_progress = lambda: None  # type: ignore[method-assign]  # only the call below publishes
    produce_range(hosted, 0, 4, ack="archived")
    publish()
    produce_range(hosted, 5, 9)
    wal_dir = os.path.join(local_cluster.wal_root("a"), *TOPIC.strip("/").split("/"))
    a.close(unload=False)  # a crash
    with open(os.path.join(wal_dir, ".owner"), "r+b") as f:
        raw = bytearray(f.read())
        raw[len(raw) // 2] ^= 0x5A  # one flipped byte: the marker no longer checks out
        f.seek(0)
        f.write(raw)
    report = local_cluster.broker("ops").delete(T)
    first = report.next_offset
    assert first == 5  # the dead owner's unpublished 5..9 are beyond what metadata knows
    b = local_cluster.broker("b")
    created, _fresh = b.create(T)
    produce_range(created, first, first + 5, ack="archived")
    b.unload(T)

    again = local_cluster.broker("a")
    assert [(r.lost_start, r.quarantine_path is not None) for r in again.retired] == [(None, True)]
    assert os.listdir(again.retired[0].quarantine_path)  # the bytes are kept
    assert not os.path.exists(wal_dir)
    assert keys.read_lost_ranges(local_cluster.metadata, T) == []
    verified = verify_topic(T, local_cluster.metadata, local_cluster.objects)
    assert verified.ok and verified.problems == [], verified.problems


def test_a_zombie_publishing_between_the_next_offset_read_and_the_tombstone_fails_the_tombstone_txn(
        local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tombstone's next offset is read, then written in one txn: a zombie holder (no
    registration) that publishes its durable tip in between must make that txn fail and
    the delete read again, never a tombstone below what metadata knew when it landed."""
    from tiered.lifecycle import delete as deletemod

    a = local_cluster.broker("a", register_session=False)
    hosted = a.load(T)
    publish = hosted.publish_progress
    hosted.publish_progress = lambda: None  # type: ignore[method-assign]  # only the hook publishes
    produce_range(hosted, 0, 4, ack="archived")
    hosted.uploader.stop(5.0)
    produce_range(hosted, 5, 9)  # durable, not archived, not published
    real_next = deletemod._next_offset
    calls: list[int] = []

    def zombie_publishes_meanwhile(*args: Any, **kwargs: Any) -> int:
        value = real_next(*args, **kwargs)
        if not calls:
            publish()  # the zombie's fenced write still passes: the tombstone is not written yet
        calls.append(value)
        return value

    monkeypatch.setattr(deletemod, "_next_offset", zombie_publishes_meanwhile)
    report = delete_topic(local_cluster.metadata, local_cluster.objects, T, broker_id="ops")
    assert calls[0] == 5 and report.next_offset == 10


def _full_topic(cluster: Cluster, host_id: str, name: TopicName) -> Any:
    """A topic whose last offset is MAX_OFFSET (2**63 - 1), everything archived. Its earlier
    incarnation is planted as deleted at MAX_OFFSET - 1: the only way to reach the top of
    the offset space in a test; everything after goes through the API."""
    import time

    from native.format import MAX_OFFSET
    from wal.errors import OffsetOverflow

    cluster.metadata.put(keys.tombstone_key(name),
                         keys.TopicTombstone("deleted", 3, MAX_OFFSET - 1, "ops", time.time()).to_json())
    hosted, _fresh = cluster.broker(host_id).create(str(name))
    assert hosted.next_offset == MAX_OFFSET - 1
    assert [hosted.produce(p, ack="archived") for p in (b"x", b"last")] == [MAX_OFFSET - 1, MAX_OFFSET]
    with pytest.raises(OffsetOverflow):
        hosted.produce(b"one too many")
    return hosted


def test_a_full_topic_can_still_be_deleted_and_taken_over(local_cluster: Cluster) -> None:
    """Numbering goes on at 2**63 after a full topic: a delete's tombstone and a takeover's
    lost range name that next offset, so neither wedges the name (atk34 F02)."""
    from native.format import MAX_OFFSET

    _full_topic(local_cluster, "a", T)
    report = local_cluster.hosts[-1].delete(T)
    assert report.outcome == "deleted" and report.next_offset == MAX_OFFSET + 1
    _assert_deleted(local_cluster, report.epoch, MAX_OFFSET + 1)

    other = TopicName.parse("/ns/full")
    owner = _full_topic(local_cluster, "b", other)
    local_cluster.hosts[-1].close(unload=False)  # a crash, with nothing unarchived
    assert owner.next_offset == MAX_OFFSET + 1
    taken = local_cluster.broker("c").load(other, force=True)
    assert taken.wal.next_offset == MAX_OFFSET + 1
    assert [m.offset for m in create_reader(other, None, local_cluster.metadata, local_cluster.objects,
                                            "earliest", live=False)] == [MAX_OFFSET - 1, MAX_OFFSET]


def test_a_latest_subscription_on_a_recreated_unhosted_topic_starts_at_its_first_offset(
        local_cluster: Cluster) -> None:
    # The new incarnation starts at 5 and archived nothing yet; nobody hosts it. A
    # "latest" subscription made through the unowned path (the CLI's) must start at 5 and
    # pin cursor 4: a cursor below the incarnation sends its reader below the first
    # retained offset once the topic is hosted again, and refuses its acks.
    _sealed_topic_with_data(local_cluster, last=4)
    ops = local_cluster.broker("ops")
    ops.delete(T)
    ops.create(T)
    ops.unload(T)
    metadata = local_cluster.metadata
    with SubscriptionManager(T, metadata, fencing=unowned_fencing(metadata, T)) as subs:
        sub = subs.subscribe("late", "latest")
        assert sub.start_offset == 5
        sub.ack(4)  # nothing to acknowledge yet, and no error for the cursor it holds
        sub.flush()
    hosted = local_cluster.broker("b").load(T)
    assert produce_range(hosted, 5, 7, ack="archived") == [5, 6, 7]
    again = hosted.subscribe("late", "latest")
    assert again.start_offset == 5
    assert [m.offset for m in read_all(hosted, again.start_offset, 7)] == [5, 6, 7]
    again.ack(7)
