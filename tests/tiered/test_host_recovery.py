"""A broker host recovers what it can on its own, and closes what it started.

* A topic whose WAL failed on its own (a segment write on a full disk) is what a crash of
  that one topic leaves: the host reopens it from its files (nothing acknowledged is
  lost) when it is loaded or unloaded, and by itself, instead of hosting a copy that
  refuses every produce and every seal for the rest of the process.
* ``close()`` racing a load: the load either finishes first (and is closed with the rest)
  or is refused; nothing outlives the host (no commit group left running on its root).
* Producers waiting for ``archived`` on a topic that is abandoned are told at once.
* The host keeps no lock per topic name it ever saw.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import pytest

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    FAST_BROKER,
    TOPIC,
    Cluster,
    close_while_loading,
    local_cluster,
    local_stores,
    produce_range,
    read_all,
)
from tests.tiered.helpers_read import cursor_write_fails_once
from tiered.lifecycle import BrokerHost, LoadError, TopicUnloading
from tiered.metadata import keys
from tiered.lifecycle.hosted import TopicState
from wal.testing import FaultFs


def _host_on(cluster: Cluster, fs: FaultFs, **overrides: object) -> BrokerHost:
    config = replace(FAST_BROKER, **overrides) if overrides else FAST_BROKER
    host = BrokerHost("A", cluster.wal_root("A"), cluster.metadata, cluster.objects, config, wal_fs=fs)
    cluster.hosts.append(host)
    return host


def _fail_wal_with_a_full_disk(fs: FaultFs, hosted) -> None:  # type: ignore[no-untyped-def]
    fs.disk_full = True
    with pytest.raises(Exception):  # noqa: B017 - WalFailed, or the ack's timeout: not acknowledged
        hosted.produce(b"never acknowledged", timeout_s=5)
    fs.disk_full = False
    assert hosted.wal.failed


def _reopened(host: BrokerHost, hosted):  # type: ignore[no-untyped-def]
    """The copy the host's reopen put in place of ``hosted``. The reopen abandons the
    failed copy before it loads the new one, so the topic is briefly not hosted at all."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = [h for h in host.topics() if str(h.topic) == TOPIC and h is not hosted]
        if now and now[0].state is TopicState.OPEN:
            return now[0]
        time.sleep(0.02)
    raise AssertionError(f"{TOPIC} was not reopened within 60 s")


def _producing(hosted, payload: bytes, ack: str, appended_by: int):  # type: ignore[no-untyped-def]
    """A producer thread sending ``payload`` (``ack``), once its append took the WAL's
    next offset to ``appended_by``: (the thread, {"offset": ...} or {"error": ...})."""
    result: dict[str, object] = {}

    def produce() -> None:
        try:
            result["offset"] = hosted.produce(payload, ack=ack, timeout_s=60)
        except Exception as e:  # noqa: BLE001 - the outcome is what the tests check
            result["error"] = e

    producer = threading.Thread(target=produce)
    producer.start()
    deadline = time.monotonic() + 60
    while hosted.wal.next_offset < appended_by and time.monotonic() < deadline:
        time.sleep(0.01)
    return producer, result


def _payloads(hosted) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [bytes(r.payload) for r in hosted.wal.reader(hosted.wal.first_offset, live=False)]


@pytest.mark.parametrize("how", ["load", "unload"])
def test_a_topic_whose_wal_failed_alone_is_reopened_from_its_files(local_cluster: Cluster, how: str) -> None:
    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=3600.0)  # only load/unload reopen here
    hosted = host.load(TOPIC)
    other = host.load("/default/other")
    acked = [hosted.produce(b"m%d" % i) for i in range(3)]
    _fail_wal_with_a_full_disk(fs, hosted)
    assert other.produce(b"unaffected") == 0, "one topic's failed WAL fails that topic only"
    if how == "load":
        again = host.load(TOPIC)
        assert again is not hosted and again.state is TopicState.OPEN
        offset = again.produce(b"after")
        assert offset > acked[-1] and _payloads(again)[:3] == [b"m0", b"m1", b"m2"]
    else:
        last = host.unload(TOPIC)  # a seal needs a WAL that flushes: reopened first
        assert last is not None and last >= acked[-1]
        reloaded = host.load(TOPIC)
        assert reloaded.next_offset == last + 1, "the next load continues right after the seal"


def test_the_host_reopens_a_failed_wal_by_itself(local_cluster: Cluster) -> None:
    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=0.05)
    hosted = host.load(TOPIC)
    hosted.produce(b"m0")
    _fail_wal_with_a_full_disk(fs, hosted)
    reopened = _reopened(host, hosted)
    assert reopened is not hosted and reopened.state is TopicState.OPEN
    assert reopened.produce(b"m1") >= 1 and _payloads(reopened)[0] == b"m0"


@pytest.mark.parametrize("held_until", ["the WAL opened", "the uploader started"])
def test_close_waits_for_a_load_in_flight_and_closes_it_too(local_cluster: Cluster, monkeypatch,
                                                             held_until: str) -> None:
    import tiered.lifecycle.host as host_module

    host = local_cluster.broker("A")
    gate, reached = threading.Event(), threading.Event()

    def held(real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            reached.set()
            gate.wait(60)
            return real(*args, **kwargs)
        return call

    if held_until == "the WAL opened":
        monkeypatch.setattr(host.root, "write_owner_marker", held(host.root.write_owner_marker))
    else:
        monkeypatch.setattr(host_module, "check_not_deleted", held(host_module.check_not_deleted))
    result: dict[str, object] = {}

    def load() -> None:
        try:
            result["hosted"] = host.load(TOPIC)
        except Exception as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    loader = threading.Thread(target=load)
    loader.start()
    assert reached.wait(60)
    # Let the load go once close() has begun (close waits for it, whatever the timing).
    threading.Thread(target=lambda: (host._closing.wait(60), gate.set())).start()
    host.close()
    loader.join(60)
    assert host.topics() == [], "nothing stays hosted on a closed host"
    root = local_cluster.wal_root("A")
    assert not [t for t in threading.enumerate() if t.name.startswith("wal-") and root in t.name], \
        "no commit group left running"
    again = local_cluster.broker("A")  # the root is free again
    assert again.load(TOPIC).state is TopicState.OPEN


@pytest.mark.parametrize("before", ["sealed", "abandoned"])
def test_close_stops_a_load_in_flight_at_its_next_step_and_loses_nothing(local_cluster: Cluster, monkeypatch,
                                                                         before: str) -> None:
    """close() does not wait for a whole load: the load stops before its next step and is
    undone as a failed load, keeping what the topic held (sealed: released and sealed
    again; unsealed history: still owned, so its WAL is recovered by the next load)."""
    first = local_cluster.broker("A")
    hosted = first.load(TOPIC)
    acked = [hosted.produce(b"m%d" % i) for i in range(3)]
    first.close(unload=before == "sealed")
    host = local_cluster.broker("A")
    result = close_while_loading(host, monkeypatch)
    assert isinstance(result.get("error"), LoadError) and "closing" in str(result["error"]), result
    assert host.topics() == []
    again = local_cluster.broker("A").load(TOPIC)
    served = [bytes(m.payload) for m in read_all(again, 0, acked[-1])]
    assert served == [b"m0", b"m1", b"m2"] and again.next_offset == acked[-1] + 1
    assert again.produce(b"next") == acked[-1] + 1, "offsets continue right after the acknowledged ones"


def test_a_graceful_close_seals_a_topic_whose_wal_failed_alone(local_cluster: Cluster) -> None:
    """close() reopens such a topic itself to seal it (the periodic reopen may not have
    run yet): abandoning it would leave its unarchived tail to a failover, which loses it."""
    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=3600.0,
                    uploader=replace(FAST_BROKER.uploader, interval_s=3600.0, poll_interval_s=3600.0))
    hosted = host.load(TOPIC)
    acked = [hosted.produce(b"m%d" % i) for i in range(5)]
    _fail_wal_with_a_full_disk(fs, hosted)
    host.close()
    other = local_cluster.broker("B")
    moved = other.load(TOPIC)
    assert moved.next_offset == acked[-1] + 1, "sealed: the next owner continues right after"
    assert [bytes(m.payload) for m in read_all(moved, 0, acked[-1])] == [b"m%d" % i for i in range(5)]


@pytest.mark.parametrize("old_copys_flush", ["works", "fails once"])
def test_reopening_a_failed_wal_keeps_the_subscriptions_acks(local_cluster: Cluster, monkeypatch,
                                                             old_copys_flush: str) -> None:
    """The reopen is no crash: acks not yet flushed are written before the old copy goes,
    so the new copy's subscription does not deliver them again; if that write fails (a
    metadata timeout), the new copy writes them (atk30 F1b)."""
    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=0.05, cursor_flush_interval_s=3600.0)
    hosted = host.load(TOPIC)
    sub = hosted.subscribe("billing", "earliest")
    offsets = [hosted.produce(b"m%d" % i) for i in range(6)]
    for offset in offsets[:4]:
        sub.ack(offset)
    if old_copys_flush == "fails once":
        cursor_write_fails_once(monkeypatch)
    _fail_wal_with_a_full_disk(fs, hosted)
    reopened = _reopened(host, hosted)
    assert reopened is not hosted
    assert reopened.subscribe("billing", "earliest").cursor == offsets[3], "acknowledged offsets come again"
    key = keys.cursor_key(TOPIC, "billing")
    kv = local_cluster.metadata.get(key)
    assert kv is not None and keys.Cursor.from_json(key, kv.value).last_acked_offset == offsets[3], "written"


def test_an_abandon_publishes_the_tip_after_its_last_acknowledgement(local_cluster: Cluster, monkeypatch) -> None:
    """An append taken before the abandon becomes durable (and is acknowledged) as the
    WAL closes; the durable tip a takeover reads is published after that, so it covers it."""
    from tiered.lifecycle.restore import read_progress
    from wal.topics import TopicName

    fs = FaultFs()
    host = _host_on(local_cluster, fs)
    hosted = host.load(TOPIC)
    for i in range(3):
        hosted.produce(b"m%d" % i)
    fs.hold_syncs()
    producer, result = _producing(hosted, b"late", "durable", appended_by=4)
    closing_wal = threading.Event()
    real_close = hosted.wal.close

    def close_wal(*args, **kwargs):  # type: ignore[no-untyped-def]
        closing_wal.set()
        return real_close(*args, **kwargs)

    monkeypatch.setattr(hosted.wal, "close", close_wal)
    abandoning = threading.Thread(target=host.abandon, args=(TOPIC,))
    abandoning.start()
    assert closing_wal.wait(60)
    fs.release_syncs()
    abandoning.join(60)
    producer.join(60)
    progress = read_progress(local_cluster.metadata, TopicName.parse(TOPIC))
    if "offset" in result:
        assert progress is not None and progress.durable_offset is not None
        assert progress.durable_offset >= result["offset"], (progress, result)  # type: ignore[operator]


def test_a_copy_fenced_by_its_own_brokers_reload_keeps_its_readers_resume_point(local_cluster: Cluster,
                                                                                monkeypatch) -> None:
    """A reopen whose load failed after taking the topic at a newer epoch puts the failed
    copy back, fenced by this broker itself. Nothing replaced its history (the next reopen
    recovers the same WAL), so its readers resume where they were, not at the archive's
    end (which would serve the same messages twice)."""
    import tiered.lifecycle.host as host_module
    from tiered.read.errors import HistoryDiverged, TopicMoved

    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=3600.0)
    hosted = host.load(TOPIC)
    for i in range(5):
        hosted.produce(b"a%d" % i, ack="archived")
    for i in range(5, 10):
        hosted.produce(b"a%d" % i)
    it = iter(hosted.create_reader(0, live=True))
    assert [next(it).offset for _ in range(10)] == list(range(10))
    _fail_wal_with_a_full_disk(fs, hosted)

    def unavailable(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise OSError("metadata store unavailable")

    with monkeypatch.context() as patch:
        patch.setattr(host_module, "plan_restore", unavailable)
        host._revive_failed_wals()  # its load fails: the failed copy is put back
    assert host.topic(TOPIC) is hosted
    hosted.check_ownership()  # the owner record now names this broker at a newer epoch
    with pytest.raises(TopicMoved) as moved:
        next(it)
    assert not isinstance(moved.value, HistoryDiverged) and moved.value.next_offset == 10


def test_producers_waiting_for_archived_are_told_when_the_topic_is_abandoned(local_cluster: Cluster) -> None:
    config = replace(FAST_BROKER, uploader=replace(FAST_BROKER.uploader, poll_interval_s=3600.0))
    host = local_cluster.broker("A", uploader=config.uploader)
    hosted = host.load(TOPIC)
    real_upload = hosted.uploader.request_upload
    hosted.uploader.request_upload = lambda: None  # type: ignore[method-assign]  # never archives now
    outcome: dict[str, object] = {}

    def produce() -> None:
        started = time.monotonic()
        try:
            hosted.produce(b"x", ack="archived", timeout_s=300)
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome["error"], outcome["took"] = exc, time.monotonic() - started

    producer = threading.Thread(target=produce)
    producer.start()
    deadline = time.monotonic() + 60
    while hosted.wal.durable_offset is None and time.monotonic() < deadline:
        time.sleep(0.01)
    host.abandon(TOPIC)
    producer.join(60)
    assert not producer.is_alive(), "the waiter was told, not left to its 300 s timeout"
    assert isinstance(outcome.get("error"), TopicUnloading)
    hosted.uploader.request_upload = real_upload  # type: ignore[method-assign]


def test_the_host_keeps_no_lock_per_topic_name_it_ever_saw(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A")
    for i in range(20):
        host.load(f"/default/t{i}")
        host.unload(f"/default/t{i}")
    assert host.topics() == [] and host._topic_locks == {}


def _failed_on_a_full_disk(cluster: Cluster, fs: FaultFs) -> tuple[BrokerHost, object]:
    """A host on ``fs`` (no periodic reopen) with a topic holding m0 whose WAL failed on a
    disk that is still full."""
    host = _host_on(cluster, fs, failed_wal_check_interval_s=3600.0)
    hosted = host.load(TOPIC)
    hosted.produce(b"m0")
    fs.disk_full = True
    with pytest.raises(Exception):  # noqa: B017 - not acknowledged
        hosted.produce(b"never acknowledged", timeout_s=5)
    return host, hosted


def test_a_reopen_that_fails_keeps_the_failed_copy_hosted_until_it_succeeds(local_cluster: Cluster) -> None:
    """While the disk stays full the WAL cannot be opened again: the failed copy stays
    hosted (the topic is still owned here and must stay somebody's), and the reopen is
    tried again by the next load, unload or periodic check."""
    fs = FaultFs()
    host, hosted = _failed_on_a_full_disk(local_cluster, fs)
    assert hosted.wal.failed
    with pytest.raises(Exception):  # noqa: B017 - the reopen cannot open the WAL yet
        host.load(TOPIC)
    assert host.topic(TOPIC) is hosted, "still hosted: nothing released, nobody else may serve it"
    host._revive_failed_wals()  # the periodic check, still on a full disk: changes nothing
    assert host.topic(TOPIC) is hosted
    with pytest.raises(Exception):  # noqa: B017 - an unload cannot seal it yet either
        host.unload(TOPIC)
    assert host.topic(TOPIC) is hosted and hosted.state is TopicState.UNLOADING, "the watcher retries the unload"
    fs.disk_full = False
    last = host.unload(TOPIC)
    assert last is not None and last >= 0
    assert host.load(TOPIC).next_offset == last + 1


def test_listeners_are_told_when_a_copy_is_replaced(local_cluster: Cluster) -> None:
    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=3600.0)
    events: list[tuple[str, object]] = []
    host.add_listener(on_loaded=lambda h: events.append(("loaded", h)),
                      on_unloaded=lambda topic, why: events.append((why, topic)))
    hosted = host.load(TOPIC)
    _fail_wal_with_a_full_disk(fs, hosted)
    host._revive_failed_wals()
    reopened = host.topic(TOPIC)
    assert reopened is not hosted
    assert events[-2:] == [("abandoned", hosted.topic), ("loaded", reopened)]


def test_an_archived_ack_waits_on_the_reopened_copy(local_cluster: Cluster) -> None:
    """A producer waiting for ``archived`` when its topic's WAL failed and was reopened
    from the same files is answered by the new copy (same offsets): it is not told the
    topic left, which would make a retry write the message twice."""
    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=3600.0,
                    uploader=replace(FAST_BROKER.uploader, poll_interval_s=3600.0))
    hosted = host.load(TOPIC)
    hosted.uploader.request_upload = lambda: None  # type: ignore[method-assign]  # never archives on its own
    outcome: dict[str, object] = {}

    def produce() -> None:
        try:
            outcome["offset"] = hosted.produce(b"archive me", ack="archived", timeout_s=120)
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    producer = threading.Thread(target=produce)
    producer.start()
    deadline = time.monotonic() + 60
    while hosted.wal.durable_offset is None and time.monotonic() < deadline:
        time.sleep(0.01)
    _fail_wal_with_a_full_disk(fs, hosted)
    host.load(TOPIC)  # reopens it; the new copy archives what the WAL holds
    producer.join(120)
    assert outcome == {"offset": 0}



def test_a_reopen_whose_load_failed_midway_is_tried_again(local_cluster: Cluster, monkeypatch) -> None:
    """The WAL opened again, but the load then failed after it had taken the topic at a
    newer epoch: the failed copy, put back with its older token, is fenced by this very
    broker. It is still this broker's to reopen, by the periodic check and by an unload."""
    import errno

    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=3600.0)
    hosted = host.load(TOPIC)
    acked = [hosted.produce(b"m%d" % i) for i in range(3)]
    _fail_wal_with_a_full_disk(fs, hosted)
    real_marker, calls = host.root.write_owner_marker, []

    def marker_fails_once(token, *rest):  # type: ignore[no-untyped-def]
        calls.append(token)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real_marker(token, *rest)

    monkeypatch.setattr(host.root, "write_owner_marker", marker_fails_once)
    host._revive_failed_wals()  # the probe opens, the load fails after taking a newer epoch
    assert host.topic(TOPIC) is hosted, "the failed copy stays hosted"
    hosted.check_ownership()  # its old token is refused: fenced, by this broker itself
    assert hosted.fenced and not host.fenced_by_another(hosted)
    host._revive_failed_wals()
    reopened = host.topic(TOPIC)
    assert reopened is not hosted and reopened.state is TopicState.OPEN
    assert _payloads(reopened)[:3] == [b"m0", b"m1", b"m2"] and reopened.produce(b"m3") > acked[-1]


def test_a_load_leaves_a_copy_being_unloaded_to_its_unload(local_cluster: Cluster) -> None:
    """A move's unload that cannot seal yet (the disk still full) keeps the copy as
    unloading; a load meanwhile must not turn it back into an open topic (the watcher
    would stop retrying the unload, and the move would never finish)."""
    fs = FaultFs()
    host, hosted = _failed_on_a_full_disk(local_cluster, fs)
    with pytest.raises(Exception):  # noqa: B017 - cannot reopen, so cannot seal
        host.unload(TOPIC)
    assert hosted.state is TopicState.UNLOADING
    with pytest.raises(Exception):  # noqa: B017 - "finish unload first"
        host.load(TOPIC)
    assert host.topic(TOPIC).state is TopicState.UNLOADING
    fs.disk_full = False
    assert host.unload(TOPIC) is not None


def test_a_close_whose_final_cursor_flush_fails_still_writes_the_acks(local_cluster: Cluster, monkeypatch) -> None:
    """A graceful close: acks arrive while the unload drains, then the seal's final cursor
    write fails once (a metadata timeout), so the topic is abandoned. The abandon must
    write those acks (they were given), so the restart does not deliver 5-14 again
    (atk30 F1: the abandon's flush returned at once, the manager being stopped already)."""
    from tiered.lifecycle import seal as sealing

    host = local_cluster.broker("A")
    hosted = host.load(TOPIC)
    sub = hosted.subscribe("s", "earliest")
    for i in range(20):
        hosted.produce(b"m%d" % i)
    sub.ack(4)
    sub.flush()
    real_drain = sealing.drain

    def drain_then_ack(topic, config):  # type: ignore[no-untyped-def]
        last = real_drain(topic, config)
        assert topic.subscriptions.get("s").ack(14)  # still taken: the subscriptions close after the drain
        return last

    monkeypatch.setattr(sealing, "drain", drain_then_ack)
    calls = cursor_write_fails_once(monkeypatch)
    host.close()
    monkeypatch.undo()
    assert calls[:1] == [14]
    again = local_cluster.broker("A").load(TOPIC)
    assert again.subscribe("s").cursor == 14, "acknowledged 5-14 would be delivered again"


def test_an_archived_wait_never_follows_a_copy_of_a_later_history(local_cluster: Cluster, monkeypatch) -> None:
    """A producer waits for ``archived`` on A's copy; A's uploads fail. B takes the topic
    by force (numbering its own messages from the same offset), A abandons its copy, B
    unloads, A loads the topic again. The waiting producer must not be answered by that
    new copy: it holds B's messages at those offsets, not the producer's (atk32 F1: it was
    told ``archived`` for a message in no object). Only a reopen of the same WAL files is
    followed."""
    from tiered.lifecycle.hosted import HostedTopic
    from tiered.objects.testing.faults import FaultyObjectStore

    a, b = local_cluster.broker("A"), local_cluster.broker("B")
    faulty = FaultyObjectStore(a.objects)
    a.objects = faulty  # A's uploads go through it (set before the load)
    on_a = a.load(TOPIC)
    for i in range(8):
        on_a.produce(b"a%d" % i, ack="archived", timeout_s=30)
    faulty.faults.fail("put")  # every upload of A's fails from now on
    resume, entered = threading.Event(), threading.Event()
    real = HostedTopic._reopened_copy

    def held(self, offset, stopped):  # type: ignore[no-untyped-def]
        entered.set()
        assert resume.wait(60)  # the producer's thread is not scheduled for a while
        return real(self, offset, stopped)

    monkeypatch.setattr(HostedTopic, "_reopened_copy", held)
    producer, result = _producing(on_a, b"MUST-BE-ARCHIVED", "archived", appended_by=9)
    on_b = b.load(TOPIC, force=True)
    assert on_b.next_offset == 8
    for i in range(5):
        on_b.produce(b"b%d" % i, ack="archived", timeout_s=30)
    on_a.check_ownership()
    a.abandon(TOPIC)
    assert entered.wait(60)
    b.unload(TOPIC)
    faulty.faults.clear()
    again = a.load(TOPIC)
    assert again.produce(b"a-new") == 13  # its durable tip passes the waiting producer's offset
    resume.set()
    producer.join(60)
    assert "offset" not in result, f"told archived at {result.get('offset')}, which holds B's message"
    assert isinstance(result["error"], TopicUnloading), result
    assert again.next_offset == 14


def test_a_broker_started_against_a_store_that_does_not_know_a_topic_leaves_its_wal_alone(
        local_cluster: Cluster, tmp_path) -> None:
    """A's WAL holds 0-4 durable only. Started by mistake against another (empty) metadata
    store, the broker must not take that WAL for stale: no record there says so, and
    quarantining it would record its messages lost and take them out of service (atk33).
    Back on the right store, the load recovers all of it."""
    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4)
    a.close(unload=False)
    other_metadata, other_objects = local_stores(str(tmp_path / "other"))
    wrong = BrokerHost("A", local_cluster.wal_root("A"), other_metadata, other_objects, local_cluster.config)
    try:
        assert wrong.retired == []
    finally:
        wrong.close()
        other_metadata.close()
    again = local_cluster.broker("A").load(TOPIC)
    assert again.report.recovered_local_wal and again.next_offset == 5


def test_an_archived_wait_follows_every_reopen_of_the_same_wal_files(local_cluster: Cluster, monkeypatch) -> None:
    """A producer waits for ``archived`` while the topic's WAL fails on its own twice and the
    host reopens it each time from the same files: its message keeps its offset and is
    archived, so it is acknowledged, not failed with UploaderStopped after the second
    reopen (atk34 F03: a retry then duplicated it)."""
    from tiered.lifecycle.hosted import HostedTopic

    fs = FaultFs()
    host = _host_on(local_cluster, fs, failed_wal_check_interval_s=1e6)
    gate, uploading = threading.Event(), threading.Event()
    real_put = host.objects.put

    def held_put(key, data, if_absent=False):  # type: ignore[no-untyped-def]
        uploading.set()
        assert gate.wait(60)
        return real_put(key, data, if_absent)

    monkeypatch.setattr(host.objects, "put", held_put)
    moved = threading.Event()
    real_reopened = HostedTopic._reopened_copy

    def reopened(self, offset, stopped):  # type: ignore[no-untyped-def]
        copy = real_reopened(self, offset, stopped)
        moved.set()
        return copy

    monkeypatch.setattr(HostedTopic, "_reopened_copy", reopened)
    first = host.load(TOPIC)
    producer, result = _producing(first, b"archived-one", "archived", appended_by=1)
    assert uploading.wait(60)  # durable; its upload is held
    copies = [first]
    for _reopen in range(2):
        _fail_wal_with_a_full_disk(fs, copies[-1])
        host._revive_failed_wals()
        copies.append(host.topic(TOPIC))
        assert copies[-1] is not copies[-2] and copies[-2].reopened_as is copies[-1]
        if _reopen == 0:
            assert moved.wait(60)
    gate.set()
    producer.join(60)
    assert result == {"offset": 0}, result


def test_a_file_named_like_a_topic_in_the_wal_root_does_not_stop_the_broker(local_cluster: Cluster) -> None:
    """atk50 F04: the start-up scan for stale WALs took every name in a namespace directory
    for a topic's WAL directory, outside its per-topic guard: a plain file there (an
    operator's backup) made the broker fail to start with a raw NotADirectoryError. It is
    left alone, and the topic beside it loads."""
    host = local_cluster.broker("A")
    produce_range(host.load(TOPIC), 0, 2, ack="archived")
    host.close()
    stray = os.path.join(local_cluster.wal_root("A"), "default", "reliable_topic.tar")
    with open(stray, "wb") as f:
        f.write(b"a backup")
    again = local_cluster.broker("A")
    assert again.load(TOPIC).next_offset == 3
    with open(stray, "rb") as f:
        assert f.read() == b"a backup"


def test_deleting_a_topic_named_like_a_file_in_the_wal_root_completes(local_cluster: Cluster) -> None:
    """atk51 F02: after the topic's metadata was deleted, the host looked for its local WAL
    and met a plain file of that name: a raw NotADirectoryError on every attempt, although
    the delete was complete. A file is not a WAL."""
    other = local_cluster.broker("B")
    produce_range(other.load("/default/orders.tar"), 0, 0, ack="archived")
    other.unload("/default/orders.tar")
    os.makedirs(os.path.join(local_cluster.wal_root("A"), "default"), exist_ok=True)
    stray = os.path.join(local_cluster.wal_root("A"), "default", "orders.tar")
    with open(stray, "wb") as f:
        f.write(b"a backup")
    host = local_cluster.broker("A")
    assert host.delete("/default/orders.tar").outcome == "deleted"
    with open(stray, "rb") as f:
        assert f.read() == b"a backup"
