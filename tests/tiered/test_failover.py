"""Failover without silent loss: the WAL's own file layer, prompt progress, the dead
owner's quarantined WAL with its exact lost range, and cursors clamped at a takeover.

Each test fails without the fix it names (see docs/LIFECYCLE.md, "Failover").
"""
from __future__ import annotations

import logging
from dataclasses import replace
import os
import threading
import time
from typing import NoReturn

import pytest
from prometheus_client import REGISTRY

from tiered.errors import MalformedRecord
from tiered.lifecycle import BrokerHost, seal
from tiered.lifecycle.errors import LocalWalUnreadable
from tiered.lifecycle.hosted import Ack, HostedTopic
from tiered.metadata import keys
from tiered.lifecycle.restore import read_progress
from tiered.read.errors import HistoryDiverged, TopicMoved
from tiered.tools.verify import VerifyReport, _scan_wal, verify_topic
from wal.testing import FaultFs
from wal.topics import TopicName

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    FAST_BROKER,
    TOPIC,
    Cluster,
    any_cluster,
    close_while_loading,
    local_cluster,
    payload_for,
    produce_range,
    read_all,
    wal_files,
)

T = TopicName.parse(TOPIC)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def _die(host: BrokerHost) -> None:
    """The broker process dies: no seal, WAL kept on its disk, its lease gone."""
    for hosted in host.topics():
        host.abandon(hosted.topic)
    host.close()


def _a_dies_with_unarchived_tail(cluster: Cluster, **b_config) -> tuple[BrokerHost, int]:
    """A archives 0-4, then makes 5-11 durable only, and dies. Returns (B loaded, A's epoch)."""
    a = cluster.broker("A")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4, ack="archived")
    produce_range(topic_a, 5, 11)
    topic_a.publish_progress()  # whatever the rate limit did, A's last published tip is 11
    epoch = topic_a.token.epoch
    _die(a)
    b = cluster.broker("B", **b_config)
    assert b.load(TOPIC).next_offset == 5
    return b, epoch


def _a_dies_with_its_tip_published(cluster: Cluster) -> None:
    """A archives 0-4, makes 5-11 durable only, publishes that tip (epoch 1) and dies."""
    a = cluster.broker("A")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4, ack="archived")
    produce_range(topic_a, 5, 11)
    topic_a.publish_progress()
    _die(a)


def _metadata_unavailable(*_args: object, **_kwargs: object) -> NoReturn:
    """Stands in for a load step whose metadata store is down."""
    raise OSError("metadata store unavailable")


#: A broker whose disk was replaced on purpose: it takes its own open history over from
#: the old disk as a failover would (the default refuses: OwnHistoryElsewhere).
TAKES_OVER_ITS_OWN = replace(FAST_BROKER, own_history_elsewhere="take_over")


def _a_on(cluster: Cluster, disk: str, fs: FaultFs | None = None) -> BrokerHost:
    """Broker A restarted with its WAL root on another data dir (``disk``), set to take
    over its own history from the disk it left (what these tests account for)."""
    host = BrokerHost("A", os.path.join(cluster.root, disk), cluster.metadata, cluster.objects, TAKES_OVER_ITS_OWN,
                      wal_fs=fs)
    cluster.hosts.append(host)
    return host


def _a_acks_a_tail_on_disk_y(cluster: Cluster, start: int, end: int) -> HostedTopic:
    """A loads the topic on disk Y, acknowledges ``start``-``end`` durable only, publishes
    that tip and dies (its copy returned, for what the load reported)."""
    on_y = _a_on(cluster, "disk-y")
    hosted = on_y.load(TOPIC)
    produce_range(hosted, start, end)  # durable only
    hosted.publish_progress()
    _die(on_y)
    return hosted


def _lease_lapses(host: BrokerHost) -> None:
    """The broker process is paused past its session lease: its keep-alive stops (it revokes
    nothing itself) and the server drops the lease, so the broker id is free to start again."""
    session = host.session
    assert session is not None
    lease = session.lease_id
    session.stop(revoke=False)
    host.metadata.revoke_lease(lease)


def _produce_tagged(hosted: HostedTopic, tag: str, start: int, end_inclusive: int, ack: Ack = "durable") -> None:
    """Produce payloads ``<tag><offset>`` (tells apart histories that number the same offsets)."""
    for offset in range(start, end_inclusive + 1):
        assert hosted.produce(f"{tag}{offset}".encode(), ack=ack) == offset


HANG_GUARD_S = 60.0  # bounds every wait below; never an expected duration


# -- 1. the WAL's file layer -------------------------------------------------------


def test_restart_recovers_a_wal_that_lives_on_the_fault_injecting_file_layer(local_cluster: Cluster) -> None:
    fs = FaultFs()
    root = local_cluster.wal_root("A")
    config = FAST_BROKER
    first = BrokerHost("A", root, local_cluster.metadata, local_cluster.objects, config, wal_fs=fs)
    produce_range(first.load(TOPIC), 0, 4)
    _die(first)
    assert not os.path.exists(root), "the WAL lives on the fault layer, not on the real disk"
    again = BrokerHost("A", root, local_cluster.metadata, local_cluster.objects, config, wal_fs=fs)
    local_cluster.hosts.append(again)
    hosted = again.load(TOPIC)
    assert hosted.report.recovered_local_wal
    assert hosted.next_offset == 5
    assert [m.payload for m in read_all(hosted, 0, 4)] == [payload_for(i) for i in range(5)]


def test_stale_wal_on_the_fault_layer_is_quarantined_there(local_cluster: Cluster) -> None:
    fs = FaultFs()
    root = local_cluster.wal_root("A")
    a = BrokerHost("A", root, local_cluster.metadata, local_cluster.objects, FAST_BROKER, wal_fs=fs)
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 2, ack="archived")
    produce_range(topic_a, 3, 5)
    _die(a)
    local_cluster.broker("B").load(TOPIC)
    back = BrokerHost("A", root, local_cluster.metadata, local_cluster.objects, FAST_BROKER, wal_fs=fs)
    local_cluster.hosts.append(back)
    [retired] = back.retired
    assert (retired.lost_start, retired.lost_end) == (3, 5)
    assert not fs.exists(os.path.join(root, "default", "reliable_topic"))
    assert fs.listdir(retired.quarantine_path), "the segments moved into the quarantine on the fault layer"
    assert not os.path.exists(root)


# -- 2a. progress is published promptly, rate-limited ---------------------------------


def test_durable_tip_is_published_within_milliseconds_not_a_whole_interval(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A", progress_interval_s=30.0)
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 0)
    deadline = time.monotonic() + 3.0
    while (read_progress(local_cluster.metadata, T) or None) is None:
        assert time.monotonic() < deadline, "progress still unpublished: it waits for the 30 s tick"
        time.sleep(0.01)
    assert read_progress(local_cluster.metadata, T).durable_offset == 0
    # Rate limit: further fsyncs within the interval do not write progress again.
    produce_range(hosted, 1, 9)
    time.sleep(0.3)
    assert read_progress(local_cluster.metadata, T).durable_offset == 0


def test_seal_publishes_the_flushed_tip_before_its_long_drain(local_cluster: Cluster, monkeypatch) -> None:
    a = local_cluster.broker("A", progress_interval_s=30.0)
    hosted = a.load(TOPIC)
    produce_range(hosted, 0, 0)
    deadline = time.monotonic() + 3.0
    while read_progress(local_cluster.metadata, T) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    produce_range(hosted, 1, 6)  # inside the rate limit: not published by the loop
    seen = []

    def drain_dies(_hosted, _config):
        seen.append(read_progress(local_cluster.metadata, T).durable_offset)
        raise OSError("broker dies in the drain")

    monkeypatch.setattr(seal, "drain", drain_dies)
    with pytest.raises(Exception):
        a.unload(TOPIC)
    assert seen == [6]


# -- 2b. the dead owner comes back: quarantine + exact lost range --------------------


def test_returning_owner_quarantines_its_wal_and_records_the_exact_lost_range(
        any_cluster: Cluster, caplog) -> None:
    b, epoch = _a_dies_with_unarchived_tail(any_cluster)
    takeover = keys.read_lost_ranges(any_cluster.metadata, T)
    assert [(r.start_offset, r.broker_id, r.epoch, r.exact, r.reported_by) for r in takeover] == [
        (5, "A", epoch, False, "B")]
    assert takeover[0].end_offset == 11  # A's last published tip
    produce_range(b.topic(TOPIC), 5, 7)  # the new owner reuses 5-7 for new messages
    quarantined = _sample("dnb_wal_quarantined_offsets_total", topic=TOPIC)

    with caplog.at_level(logging.WARNING, logger="tiered.lifecycle"):
        back = any_cluster.broker("A")  # A comes back with its disk
    qpath = os.path.join(any_cluster.wal_root("A"), ".quarantine", "default", "reliable_topic", f"{epoch:020d}")
    [retired] = back.retired
    assert (retired.first_offset, retired.last_offset, retired.lost_start, retired.lost_end) == (0, 11, 5, 11)
    assert retired.quarantine_path == qpath
    [record] = keys.read_lost_ranges(any_cluster.metadata, T)
    assert (record.start_offset, record.end_offset, record.broker_id, record.epoch, record.exact,
            record.quarantine_path, record.reported_by) == (5, 11, "A", epoch, True, qpath, "A")
    assert record.count == 7
    assert _sample("dnb_wal_quarantined_offsets_total", topic=TOPIC) == quarantined + 7
    assert "offsets 5-11 were durable here but never archived" in caplog.text and qpath in caplog.text
    # Moved, not deleted: the quarantined WAL still holds every offset A had.
    assert wal_files(any_cluster, "A") == []
    assert _scan_wal(qpath, VerifyReport(TOPIC)) == (0, 11)
    # verify shows the loss as a warning; the archive itself is fine.
    report = verify_topic(T, any_cluster.metadata, any_cluster.objects)
    assert report.ok
    [lost] = [p for p in report.problems if p["kind"] == "lost_range"]
    assert lost["severity"] == "warning" and "offsets 5-11 (7)" in lost["message"] and qpath in lost["message"]


def test_returning_owner_that_lost_nothing_confirms_it_and_deletes_its_wal(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    produce_range(a.load(TOPIC), 0, 4, ack="archived")
    _die(a)
    b = local_cluster.broker("B")
    b.load(TOPIC)
    back = local_cluster.broker("A")
    assert [(r.lost_start, r.quarantine_path) for r in back.retired] == [(None, None)]
    assert wal_files(local_cluster, "A") == []
    [record] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert record.exact and record.end_offset is None and record.count == 0
    assert not [p for p in verify_topic(T, local_cluster.metadata, local_cluster.objects).problems
                if p["kind"] == "lost_range"]


def test_stale_wal_found_at_load_is_quarantined_too(local_cluster: Cluster) -> None:
    b, epoch = _a_dies_with_unarchived_tail(local_cluster)
    produce_range(b.topic(TOPIC), 5, 6)
    assert b.unload(TOPIC) == 6
    # A comes back without the start-up scan; loading the topic must not delete its WAL either.
    back = BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, local_cluster.objects,
                      FAST_BROKER, retire_stale_wals=False)
    local_cluster.hosts.append(back)
    hosted = back.load(TOPIC)
    assert hosted.next_offset == 7 and not hosted.report.recovered_local_wal
    retired = hosted.report.retired_local_wal
    assert retired is not None and (retired.lost_start, retired.lost_end) == (5, 11)
    [record] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (record.start_offset, record.end_offset, record.exact, record.epoch) == (5, 11, True, epoch)
    assert os.listdir(retired.quarantine_path)


def test_lost_range_record_is_validated() -> None:
    key = keys.lost_key(T, 5, 1)
    assert key.endswith("/lost/00000000000000000005-00000000000000000001")
    good = keys.LostRange(5, 9, "A", 1, True, "/q", "A", 1.0)
    assert keys.LostRange.from_json(key, good.to_json()).check_key(key) == good
    with pytest.raises(ValueError):
        keys.LostRange(5, 4, "A", 1, True, None, "A", 1.0).to_json()  # end before start
    # A discarded unreadable WAL: the range is unknown (not exact) but its files are kept.
    unknown = keys.LostRange(5, None, "A", 1, False, "/q", "A", 1.0)
    assert keys.LostRange.from_json(key, unknown.to_json()) == unknown
    with pytest.raises(MalformedRecord):
        keys.LostRange.from_json(key, b'{"start_offset": "5"}')
    with pytest.raises(MalformedRecord):
        good.check_key(keys.lost_key(T, 6, 1))


# -- 3. cursors after a takeover ------------------------------------------------------


def test_takeover_clamps_cursors_past_the_restart_point(local_cluster: Cluster, caplog) -> None:
    a = local_cluster.broker("A")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4, ack="archived")
    produce_range(topic_a, 5, 9)
    ahead, behind = topic_a.subscribe("ahead", "earliest"), topic_a.subscribe("behind", "earliest")
    ahead.ack(8)
    behind.ack(2)
    topic_a.subscriptions.flush_all()
    _die(a)
    clamps = _sample("dnb_cursor_clamps_total")
    with caplog.at_level(logging.WARNING):
        topic_b = local_cluster.broker("B").load(TOPIC)
    assert topic_b.report.clamped_cursors == {"ahead": 8}
    assert _sample("dnb_cursor_clamps_total") == clamps + 1
    assert "subscription ahead cursor clamped from 8 to 4" in caplog.text
    produce_range(topic_b, 5, 7)  # new messages at the reassigned offsets
    sub = topic_b.subscribe("ahead")
    assert sub.cursor == 4  # without the clamp it would resume at 9 and skip the new 5-7
    assert [m.offset for m in read_all(topic_b, sub.cursor + 1, 7)] == [5, 6, 7]
    assert topic_b.subscribe("behind").cursor == 2  # a cursor below the restart point stays


def test_takeover_with_nothing_archived_clamps_cursors_to_minus_one(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 3)
    sub = topic_a.subscribe("s", "earliest")
    sub.ack(3)
    sub.flush()
    _die(a)
    topic_b = local_cluster.broker("B").load(TOPIC)
    assert topic_b.next_offset == 0 and topic_b.report.clamped_cursors == {"s": 3}
    kv = local_cluster.metadata.get(keys.cursor_key(T, "s"))
    assert keys.Cursor.from_json(kv.key, kv.value).last_acked_offset == -1  # kept, not deleted
    produce_range(topic_b, 0, 1)
    # "latest" would skip 0-1 if the clamp had deleted the cursor; -1 resumes at 0.
    assert topic_b.subscribe("s", "latest").start_offset == 0


def test_clean_move_never_touches_cursors(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A")
    topic_a = a.load(TOPIC)
    produce_range(topic_a, 0, 4)
    sub = topic_a.subscribe("s", "earliest")
    sub.ack(4)
    assert a.unload(TOPIC) == 4
    topic_b = local_cluster.broker("B").load(TOPIC)
    assert topic_b.report.clamped_cursors == {}
    assert topic_b.subscribe("s").cursor == 4


def test_an_older_dead_owners_progress_is_not_blamed_on_the_next_one(local_cluster: Cluster) -> None:
    # B's progress loop would only run after 30 s: A's record (up to 11) stays behind.
    b, _epoch = _a_dies_with_unarchived_tail(local_cluster, progress_interval_s=30.0)
    progress = read_progress(local_cluster.metadata, T)
    assert progress is not None and (progress.broker_id, progress.durable_offset) == ("A", 11)
    _die(b)  # B dies before it made anything durable
    topic_c = local_cluster.broker("C").load(TOPIC)
    assert topic_c.next_offset == 5
    assert topic_c.report.unarchived_at_least == 0  # B lost nothing; A's 5-11 is A's record


@pytest.mark.parametrize("failed_steps", [("mark topic open",), ("closing",), ("plan restore",),
                                          ("plan restore", "clamp subscription cursors")])
def test_a_failed_own_reload_keeps_the_published_tip_for_the_next_failover(local_cluster: Cluster, monkeypatch,
                                                                           failed_steps: tuple[str, ...]) -> None:
    """A dies with 5-11 durable only and its tip published; its restarts' loads fail after
    taking the topic again (epoch + 1 each; ownership kept, as its WAL holds the tail),
    at any step, once or more. The failover that follows still reports the published
    tail as lost, at least 7 offsets, not "at least 0": the tip epoch 1 published still
    describes the history of A's later epochs (no LostRange names A in between)."""
    import tiered.lifecycle.host as host_module

    _a_dies_with_its_tip_published(local_cluster)
    again = local_cluster.broker("A")
    for step in failed_steps:
        if step == "closing":  # stopped before its next step by close()
            assert "error" in close_while_loading(again, monkeypatch)
            break

        with monkeypatch.context() as patch:
            if step == "mark topic open":
                patch.setattr(again, "_mark_open", _metadata_unavailable)
            else:
                patch.setattr(host_module, {"plan restore": "plan_restore",
                                            "clamp subscription cursors": "clamp_cursors"}[step], _metadata_unavailable)
            with pytest.raises(Exception):  # noqa: B017 - the step's error, the topic kept owned
                again.load(TOPIC)
    else:
        _die(again)
    b = local_cluster.broker("B")
    hosted = b.load(TOPIC)
    assert hosted.next_offset == 5
    assert hosted.report.unarchived_at_least == 7, hosted.report
    ranges = keys.read_lost_ranges(local_cluster.metadata, T)
    assert [(r.start_offset, r.end_offset) for r in ranges] == [(5, 11)], ranges


def test_a_restart_that_dies_right_after_taking_its_topic_again_keeps_the_published_tip(
        local_cluster: Cluster) -> None:
    """A dies with 5-11 durable only and its tip published (epoch 1); its restart takes the
    topic again (epoch 2) and dies before publishing anything. The failover from epoch 2
    still counts the tip epoch 1 published: every epoch between was A's own (no LostRange
    names A in between), so that record still describes the history it takes over."""
    from tiered.lifecycle.ownership import acquire

    _a_dies_with_its_tip_published(local_cluster)
    assert acquire(local_cluster.metadata, T, "A").epoch == 2  # the restart's load got this far
    b = local_cluster.broker("B")
    hosted = b.load(TOPIC)
    assert hosted.next_offset == 5
    assert hosted.report.unarchived_at_least == 7, hosted.report
    # ... and counted once, even where an older epoch of A is still to be recorded too.
    assert [(r.start_offset, r.end_offset) for r in keys.read_lost_ranges(local_cluster.metadata, T)] == [(5, 11)]


@pytest.mark.parametrize("first_load", ["fails at mark open", "is stopped by close"])
def test_a_restart_on_another_disk_whose_first_load_fails_still_records_the_loss(local_cluster: Cluster,
                                                                                monkeypatch, first_load: str) -> None:
    """A dies with 5-11 durable only on its disk; it restarts on another data dir, where its
    load creates an empty WAL and fails before recording A's earlier history as lost. The
    next load there recovers that empty WAL: it must still record the loss (the WAL's
    marker says which history it lacks), not take the WAL as that history's."""
    _a_dies_with_its_tip_published(local_cluster)
    again = _a_on(local_cluster, "wal-A-second-disk")
    if first_load == "fails at mark open":
        with monkeypatch.context() as patch:
            patch.setattr(again, "_mark_open", _metadata_unavailable)
            with pytest.raises(Exception):  # noqa: B017 - the step's error, the topic kept owned
                again.load(TOPIC)
        _die(again)
    else:
        assert "error" in close_while_loading(again, monkeypatch)
    hosted = _a_on(local_cluster, "wal-A-second-disk").load(TOPIC)
    assert hosted.next_offset == 5
    assert hosted.report.unarchived_at_least == 7, hosted.report
    assert [(r.start_offset, r.end_offset) for r in keys.read_lost_ranges(local_cluster.metadata, T)] == [(5, 11)]


@pytest.mark.parametrize("failing", ["_mark_open", "write_owner_marker"])
def test_a_wal_left_by_a_released_failed_load_is_not_taken_for_a_later_history(local_cluster: Cluster,
                                                                              monkeypatch, failing: str) -> None:
    """A's load on disk X fails (marking the topic open, or before that writing the WAL's
    marker) and releases the (sealed) topic, leaving an empty WAL there. A then runs the
    topic on disk Y, acknowledges a tail (its tip published) and dies. Back on disk X, the
    empty WAL must not be recovered as the topic's history (the open state names a newer
    epoch of A than its marker, or it has no marker and holds nothing), and the tail is
    recorded lost."""
    first = _a_on(local_cluster, "disk-y")
    produce_range(first.load(TOPIC), 0, 4, ack="archived")
    assert first.unload(TOPIC) == 4  # sealed at 4
    first.close()
    on_x = _a_on(local_cluster, "disk-x")

    with monkeypatch.context() as patch:
        patch.setattr(on_x if failing == "_mark_open" else on_x.root, failing, _metadata_unavailable)
        with pytest.raises(Exception):  # noqa: B017 - released: sealed, nothing local
            on_x.load(TOPIC)
    on_x.close()
    _a_acks_a_tail_on_disk_y(local_cluster, 5, 9)
    back = _a_on(local_cluster, "disk-x").load(TOPIC)
    assert not back.report.recovered_local_wal
    assert back.next_offset == 5 and back.report.unarchived_at_least == 5, back.report


def _a_returns_to_a_wal_that_does_not_open(cluster: Cluster, patch: pytest.MonkeyPatch) -> BrokerHost:
    """A dies with 5-11 durable only (tip published at epoch 1) and restarts; its local WAL
    is unreadable while ``patch`` lasts (as a damaged segment header makes it), so its
    plain load (epoch 2) fails. Returns the restarted A."""
    _a_dies_with_its_tip_published(cluster)
    again = cluster.broker("A")

    def unreadable(topic):  # type: ignore[no-untyped-def]
        raise LocalWalUnreadable(topic, again.root.path(topic), OSError("injected: bad segment header"))

    patch.setattr(again.root, "open_local", unreadable)
    with pytest.raises(LocalWalUnreadable):
        again.load(TOPIC)
    return again


def test_a_tail_an_operator_discarded_is_not_counted_again_by_a_later_failover(local_cluster: Cluster,
                                                                               monkeypatch) -> None:
    """A's WAL (with its unarchived tail 5-11) does not open; the operator discards it (its
    loss recorded then, under the WAL's epoch); that load and a later one fail after taking
    the topic. The failover from A's last epoch must not report 5-11 lost a second time:
    that epoch's WAL held nothing."""
    import tiered.lifecycle.host as host_module

    with monkeypatch.context() as patch:
        again = _a_returns_to_a_wal_that_does_not_open(local_cluster, patch)
        patch.setattr(host_module, "clamp_cursors", _metadata_unavailable)
        with pytest.raises(Exception):  # noqa: B017 - after the discard, the clamp fails
            again.load(TOPIC, discard_local_wal=True)
    with monkeypatch.context() as patch:
        patch.setattr(host_module, "clamp_cursors", _metadata_unavailable)
        with pytest.raises(Exception):  # noqa: B017 - the clamp fails again
            again.load(TOPIC)
    _die(again)
    discarded = [(r.start_offset, r.broker_id, r.epoch) for r in keys.read_lost_ranges(local_cluster.metadata, T)]
    assert (5, "A", 1) in discarded, discarded
    hosted = local_cluster.broker("B").load(TOPIC)
    assert hosted.next_offset == 5
    assert hosted.report.unarchived_at_least == 0, (hosted.report, keys.read_lost_ranges(local_cluster.metadata, T))


def test_a_load_killed_before_its_wal_marker_leaves_no_history_on_that_disk(local_cluster: Cluster,
                                                                           monkeypatch) -> None:
    """Power is lost on disk X between the load's WAL creation and its ``.owner`` marker.
    The broker then runs the topic on disk Y, acknowledges a tail and dies. Back on X, the
    marker-less empty WAL must not be recovered over Y's history: Y's tail is recorded lost."""
    first = _a_on(local_cluster, "disk-y")
    produce_range(first.load(TOPIC), 0, 4, ack="archived")
    first.close()  # sealed at 4
    disk_x = FaultFs()
    on_x = _a_on(local_cluster, "disk-x", disk_x)
    images: list[FaultFs] = []

    class PowerLost(BaseException):
        pass

    def power_loss(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        images.append(disk_x.crash_image())
        raise PowerLost()

    monkeypatch.setattr(on_x.root, "write_owner_marker", power_loss)
    monkeypatch.setattr(on_x, "_after_failed_load", lambda *_args: None)  # a dead process does nothing more
    with pytest.raises(PowerLost):
        on_x.load(TOPIC)
    on_x.close(unload=False)
    _a_acks_a_tail_on_disk_y(local_cluster, 5, 9)
    back = _a_on(local_cluster, "disk-x", images[0]).load(TOPIC)
    assert not back.report.recovered_local_wal
    assert back.next_offset == 5 and back.report.unarchived_at_least == 5, back.report


def test_a_failed_reload_that_retired_an_older_wal_still_leaves_the_newer_tail_counted(local_cluster: Cluster,
                                                                                      monkeypatch) -> None:
    """A ran on disk X (5-11 lost there, recorded by its next load) and then on disk Y, where
    it acknowledged 5-14 and published that tip before dying. Back on disk X, its load retires
    the stale WAL there (the older history) and then fails before recording Y's history. The
    failover that follows must still count Y's tail: at least 10 offsets, not 0."""
    _a_dies_with_its_tip_published(local_cluster)  # on A's usual WAL root: "disk X"
    on_y = _a_on(local_cluster, "disk-y")
    hosted = on_y.load(TOPIC)
    assert hosted.next_offset == 5 and hosted.report.unarchived_at_least == 7
    produce_range(hosted, 5, 14)
    hosted.publish_progress()
    _die(on_y)
    back_on_x = local_cluster.broker("A", own_history_elsewhere="take_over")  # Y is the one it takes over

    with monkeypatch.context() as patch:
        patch.setattr(back_on_x, "_mark_open", _metadata_unavailable)
        with pytest.raises(Exception):  # noqa: B017 - the stale WAL was retired, then the step failed
            back_on_x.load(TOPIC)
    assert back_on_x.retired, "the stale WAL on disk X was retired"
    _die(back_on_x)
    taken = local_cluster.broker("B").load(TOPIC)
    assert taken.next_offset == 5
    assert taken.report.unarchived_at_least == 10, taken.report


@pytest.mark.parametrize("replaced_by", ["its restart still opening", "its restart after a failed load",
                                         "another broker after that restart"])
def test_a_copy_replaced_by_its_own_broker_id_elsewhere_tells_its_readers_where_the_new_owner_continues(
        local_cluster: Cluster, monkeypatch, replaced_by: str) -> None:
    """Broker A (epoch 1, disk 1) archived 0-4 and acknowledged 5-9 durable only; a live reader
    of that copy is at 10. The process is paused past its lease and the same broker id
    restarts on another data dir, where the topic continues at 5. The paused copy learns it
    is fenced while that restart's load is still opening (no LostRange yet, the owner record
    names A), or after the restart's first load failed (the LostRange names epoch 2, not 1),
    or after that restart died too and B took over; the new owner archives 5-14. The
    reader must end with HistoryDiverged at 5, where the new owner continues, not a plain
    TopicMoved at 10 that skips the new owner's 5-9: the copy's history was replaced, not
    continued by this host's own reload of the same WAL."""
    paused = _a_on(local_cluster, "disk-1")
    copy = paused.load(TOPIC)
    produce_range(copy, 0, 4, ack="archived")
    produce_range(copy, 5, 9)
    copy.publish_progress()
    served = iter(copy.create_reader(0, live=True))
    assert [next(served).offset for _ in range(10)] == list(range(10))
    _lease_lapses(paused)
    restarted = _a_on(local_cluster, "disk-2")
    if replaced_by == "its restart still opening":
        inside, release = threading.Event(), threading.Event()
        mark_open = restarted._mark_open

        def held(*args, **kwargs):  # type: ignore[no-untyped-def]
            inside.set()
            release.wait(HANG_GUARD_S)
            return mark_open(*args, **kwargs)

        monkeypatch.setattr(restarted, "_mark_open", held)
        loaded: dict[str, HostedTopic] = {}
        loader = threading.Thread(target=lambda: loaded.setdefault("hosted", restarted.load(TOPIC)))
        loader.start()
        assert inside.wait(HANG_GUARD_S), "the restart's load never reached mark open"
        assert not copy.check_ownership()  # learned between the restart's acquire and its LostRange
        release.set()
        loader.join(HANG_GUARD_S)
        assert not loader.is_alive(), "hang guard: the restart's load"
        new_owner = loaded["hosted"]
    else:
        def disk_not_ready(*_args, **_kwargs):  # type: ignore[no-untyped-def]
            raise OSError("injected: data dir not ready")

        with monkeypatch.context() as patch:
            patch.setattr(restarted, "_open_wal", disk_not_ready)
            with pytest.raises(Exception):  # noqa: B017 - the step's error, the topic kept owned (epoch 2)
                restarted.load(TOPIC)
        new_owner = restarted.load(TOPIC)  # epoch 3: records epoch 2's history as lost
        if replaced_by == "another broker after that restart":
            _die(restarted)
            new_owner = local_cluster.broker("B").load(TOPIC)
    assert new_owner.next_offset == 5
    _produce_tagged(new_owner, "new", 5, 14, ack="archived")  # the archive now ends past the reader
    assert not copy.check_ownership()
    with pytest.raises(TopicMoved) as moved:
        next(served)
    assert isinstance(moved.value, HistoryDiverged), repr(moved.value)
    assert (moved.value.next_offset, moved.value.served_until) == (5, 10)
    with new_owner.create_reader(moved.value.next_offset, live=False) as rest:
        assert [(m.offset, bytes(m.payload)) for m in rest] == [(o, b"new%d" % o) for o in range(5, 15)]


def test_an_empty_wal_naming_an_older_missing_history_is_not_taken_for_the_newer_one(local_cluster: Cluster,
                                                                                   monkeypatch) -> None:
    """Broker A alternates between two data dirs. On disk 1 it archives x0-x9 and dies. On
    disk 2 its load fails at marking the topic open (ownership kept), leaving an empty WAL
    whose marker names epoch 1's history as missing. Back on disk 1 it rightly recovers
    x0-x9, acknowledges x10-x14 durable only (tip published) and dies. Back on disk 2, the
    empty WAL must not be recovered: x10-x14 are recorded lost under the epoch that
    acknowledged them (at least 5), not as epoch 1's history (0 lost). A then archives
    z10-z14, acknowledges z15-z17 durable only and dies; back on disk 1 the x WAL must not
    be recovered over the archive's z10-z14, and z15-z17 are recorded lost."""
    first = _a_on(local_cluster, "disk-1")
    _produce_tagged(first.load(TOPIC), "x", 0, 9, ack="archived")
    _die(first)
    failing = _a_on(local_cluster, "disk-2")
    with monkeypatch.context() as patch:
        patch.setattr(failing, "_mark_open", _metadata_unavailable)
        with pytest.raises(Exception):  # noqa: B017 - the step's error, the topic kept owned
            failing.load(TOPIC)
    _die(failing)

    on_1 = _a_on(local_cluster, "disk-1")
    hosted = on_1.load(TOPIC)
    assert hosted.report.recovered_local_wal and hosted.next_offset == 10  # nothing happened on disk 2
    _produce_tagged(hosted, "x", 10, 14)  # durable only
    hosted.publish_progress()
    x_epoch = hosted.token.epoch
    _die(on_1)

    on_2 = _a_on(local_cluster, "disk-2")
    hosted = on_2.load(TOPIC)
    ranges = keys.read_lost_ranges(local_cluster.metadata, T)
    assert not hosted.report.recovered_local_wal, ranges
    assert hosted.next_offset == 10 and hosted.report.unarchived_at_least == 5, (hosted.report, ranges)
    assert [(r.start_offset, r.end_offset, r.broker_id, r.epoch) for r in ranges] == [(10, 14, "A", x_epoch)]
    _produce_tagged(hosted, "z", 10, 14, ack="archived")
    _produce_tagged(hosted, "z", 15, 17)  # durable only
    hosted.publish_progress()
    z_epoch = hosted.token.epoch
    _die(on_2)

    hosted = _a_on(local_cluster, "disk-1").load(TOPIC)
    ranges = keys.read_lost_ranges(local_cluster.metadata, T)
    assert not hosted.report.recovered_local_wal, ranges
    assert hosted.next_offset == 15 and hosted.report.unarchived_at_least == 3, (hosted.report, ranges)
    assert sorted((r.start_offset, r.end_offset, r.epoch) for r in ranges) == [(10, 14, x_epoch), (15, 17, z_epoch)]
    with hosted.create_reader(0, live=False) as everything:
        assert [bytes(m.payload) for m in everything] == [b"x%d" % o for o in range(10)] + [
            b"z%d" % o for o in range(10, 15)]


def test_a_wal_a_discard_created_leaves_no_loss_for_a_later_reload_to_record(local_cluster: Cluster,
                                                                            monkeypatch) -> None:
    """A's WAL (5-11 durable only, tip published at epoch 1) does not open: a plain load
    fails (epoch 2), then the operator's discard (epoch 3) records that loss under the WAL's
    epoch 1 and starts a new WAL at 5. A acknowledges y5-y11 there (archived) and dies. The
    reload that recovers the new WAL must record no loss: nothing was lost, and the epoch
    before the discard is not a history that WAL lacks."""
    with monkeypatch.context() as patch:
        again = _a_returns_to_a_wal_that_does_not_open(local_cluster, patch)
        hosted = again.load(TOPIC, discard_local_wal=True)
    assert hosted.next_offset == 5
    discarded = keys.read_lost_ranges(local_cluster.metadata, T)
    assert [(r.start_offset, r.broker_id, r.epoch) for r in discarded] == [(5, "A", 1)]
    _produce_tagged(hosted, "y", 5, 11, ack="archived")
    _die(again)

    hosted = local_cluster.broker("A").load(TOPIC)
    assert hosted.report.recovered_local_wal and hosted.next_offset == 12
    assert keys.read_lost_ranges(local_cluster.metadata, T) == discarded
    assert hosted.report.unarchived_at_least == 0, hosted.report
    _produce_tagged(hosted, "y", 12, 14, ack="archived")
    with hosted.create_reader(5, live=False) as rest:
        assert [bytes(m.payload) for m in rest] == [b"y%d" % o for o in range(5, 15)]


def _a_leaves_an_empty_wal_on_disk_x_then_loses_a_tail_elsewhere(cluster: Cluster, monkeypatch, left_on_x: str,
                                                                  killed: bool) -> None:
    """A acknowledges 0-2 durable only on disk Y (its tip published) and dies with disk Y.
    Disk X keeps an empty WAL of A's that does not hold that tail:

    - "no marker": A's first load, on X, failed writing the WAL's ``.owner`` marker (and
      released the new topic, or with ``killed`` died right there, keeping it);
    - "a marker naming the missing history": a reload on X after Y died, which created its
      WAL empty (its marker's ``missing`` names Y's epoch) and failed to mark the topic open."""
    if left_on_x == "no marker":
        on_x = _a_on(cluster, "disk-x")
        with monkeypatch.context() as patch:
            patch.setattr(on_x.root, "write_owner_marker", _metadata_unavailable)
            if killed:
                patch.setattr(on_x, "_after_failed_load", lambda *_args: None)  # a dead process does nothing
            with pytest.raises(Exception):  # noqa: B017 - the injected failure
                on_x.load(TOPIC)
        on_x.close(unload=False)
    _a_acks_a_tail_on_disk_y(cluster, 0, 2)
    if left_on_x != "no marker":
        on_x = _a_on(cluster, "disk-x")
        with monkeypatch.context() as patch:
            patch.setattr(on_x, "_mark_open", _metadata_unavailable)
            with pytest.raises(Exception):  # noqa: B017 - kept: the topic has unsealed history
                on_x.load(TOPIC)
        assert on_x.root.read_owner_marker_missing(T) is not None
        on_x.close(unload=False)


@pytest.mark.parametrize("taken_over_by", ["B", "A on a third disk"])
@pytest.mark.parametrize("left_on_x", ["no marker", "a marker naming the missing history"])
def test_an_empty_wal_of_another_history_never_turns_a_recorded_loss_into_nothing_lost(
        local_cluster: Cluster, monkeypatch, left_on_x: str, taken_over_by: str) -> None:
    """The takeover records 0-2 lost ("at least", under an epoch of A's). Retiring disk X's
    empty WAL later (at A's restart there, or at its load there) must leave that record
    standing: an empty WAL proves only that its own history lost nothing, and this one is not
    the history that acknowledged 0-2 (atk27 F1, F2: the retire rewrote the record as
    "exactly nothing lost", so the loss became silent)."""
    _a_leaves_an_empty_wal_on_disk_x_then_loses_a_tail_elsewhere(local_cluster, monkeypatch, left_on_x,
                                                                  killed=taken_over_by != "B")
    taker = local_cluster.broker("B") if taken_over_by == "B" else _a_on(local_cluster, "disk-z")
    taken = taker.load(TOPIC)
    assert taken.next_offset == 0 and taken.report.unarchived_at_least == 3, taken.report
    recorded = keys.read_lost_ranges(local_cluster.metadata, T)
    if taken_over_by == "B":
        back = _a_on(local_cluster, "disk-x")  # its start retires the stale WAL there
        assert [r.first_offset for r in back.retired] == [0]
    else:
        taker.close(unload=False)
        assert not _a_on(local_cluster, "disk-x").load(TOPIC).report.recovered_local_wal
    counted = {(r.start_offset, r.broker_id, r.epoch) for r in recorded if r.end_offset == 2}
    assert counted, recorded  # the takeover counted A's published tail
    after = {(r.start_offset, r.broker_id, r.epoch): r for r in keys.read_lost_ranges(local_cluster.metadata, T)}
    for key in counted:
        assert key in after and not (after[key].exact and after[key].end_offset is None), (
            f"0-2 were acknowledged and are gone, but the record that counted them now says nothing was lost: "
            f"{recorded} -> {list(after.values())}")


def test_a_takeover_never_replaces_the_exact_record_a_returning_owner_wrote_meanwhile(local_cluster: Cluster,
                                                                                      monkeypatch) -> None:
    """A dies with 5-11 unarchived. B's load computes its loss record for A's history; just
    then A comes back, quarantines its WAL and writes the exact record (with where the WAL
    went). B's mark-open must not overwrite it with its "at least" account (atk29: the
    quarantine path was lost from the record); it computes its records again."""
    _a_dies_with_its_tip_published(local_cluster)
    b = local_cluster.broker("B")
    real, returned = b.losses.takeover_records, []

    def a_returns_meanwhile(*args, **kwargs):  # type: ignore[no-untyped-def]
        computed = real(*args, **kwargs)
        if not returned:
            returned.append(local_cluster.broker("A"))  # its start retires its stale WAL
        return computed

    monkeypatch.setattr(b.losses, "takeover_records", a_returns_meanwhile)
    hosted = b.load(TOPIC)
    assert hosted.next_offset == 5
    [record] = keys.read_lost_ranges(local_cluster.metadata, T)
    assert (record.start_offset, record.end_offset, record.broker_id, record.exact) == (5, 11, "A", True)
    assert record.quarantine_path is not None and os.path.isdir(record.quarantine_path)


def test_an_empty_stale_wal_retired_at_load_never_stands_for_the_newer_history(local_cluster: Cluster,
                                                                               monkeypatch) -> None:
    """A's load on disk X died after creating its (empty) WAL and marker. A then ran the
    topic on disk Y again: it archived 2-3, acknowledged 4-6 durable (tip published) and
    died. Back on disk X, the empty WAL there is stale and retired; the load must still
    record Y's tail 4-6 as lost. (Fuzzing found the retire reported the epoch that last
    archived, Y's, as the retired WAL's, so the load took Y's history as accounted for:
    "at least 0", no record.)"""

    class PowerLost(BaseException):
        pass

    def power_loss(*_args: object, **_kwargs: object) -> NoReturn:
        raise PowerLost()

    on_y = _a_on(local_cluster, "disk-y")
    produce_range(on_y.load(TOPIC), 0, 1, ack="archived")
    _die(on_y)
    on_x = _a_on(local_cluster, "disk-x")
    with monkeypatch.context() as patch:
        patch.setattr(on_x, "_mark_open", power_loss)
        patch.setattr(on_x, "_after_failed_load", lambda *_args: None)  # a dead process does nothing more
        with pytest.raises(PowerLost):
            on_x.load(TOPIC)
    on_x.close(unload=False)
    on_y = _a_on(local_cluster, "disk-y")
    hosted = on_y.load(TOPIC)
    assert hosted.next_offset == 2
    produce_range(hosted, 2, 3, ack="archived")
    produce_range(hosted, 4, 6)  # durable only
    hosted.publish_progress()
    y_epoch = hosted.token.epoch
    _die(on_y)
    back = _a_on(local_cluster, "disk-x").load(TOPIC)
    assert not back.report.recovered_local_wal
    assert back.next_offset == 4 and back.report.unarchived_at_least == 3, back.report
    assert [(r.start_offset, r.end_offset, r.epoch) for r in keys.read_lost_ranges(local_cluster.metadata, T)
            if r.epoch == y_epoch] == [(4, 6, y_epoch)]


def test_a_takeover_that_would_forget_a_history_is_refused_and_the_holder_still_records_it(
        any_cluster: Cluster) -> None:
    """A dies with 5-11 durable only and its tip published (epoch 1). Then 64 takeovers by
    other brokers each die before opening the topic: the owner record carries A's history
    and those of the 63 takeovers before the last, 64 in all (INHERITS_MAX). One more
    takeover would have to forget one of them, and if that were A's, its offsets 5-11
    would be renumbered with no loss record; so it is refused with a typed error,
    changing nothing. The current holder's own reload still opens the
    topic, and records A's loss in the same transaction as every other history (which
    also shows that the largest mark-open fits in an etcd transaction)."""
    from tiered.lifecycle.ownership import INHERITS_MAX, TooManyUnopenedTakeovers, acquire, read_owner

    _a_dies_with_its_tip_published(any_cluster)
    holder = "A"
    for i in range(INHERITS_MAX):  # takeovers that die before their mark-open
        holder = f"X{i}"
        acquire(any_cluster.metadata, T, holder)
    before, _kv = read_owner(any_cluster.metadata, T)
    assert before is not None and len(before.inherits) == INHERITS_MAX and before.inherits[0] == ("A", 1)

    with pytest.raises(TooManyUnopenedTakeovers):
        any_cluster.broker("B").load(TOPIC)
    assert read_owner(any_cluster.metadata, T)[0] == before

    hosted = any_cluster.broker(holder).load(TOPIC)
    assert hosted.next_offset == 5
    ranges = keys.read_lost_ranges(any_cluster.metadata, T)
    assert [(r.start_offset, r.end_offset, r.broker_id, r.epoch) for r in ranges if r.broker_id == "A"] == [
        (5, 11, "A", 1)], ranges
    assert len(ranges) == INHERITS_MAX + 1, ranges  # and the holder's own previous epoch


def test_successful_failovers_carry_no_recorded_history_and_are_never_refused(local_cluster: Cluster,
                                                                              monkeypatch) -> None:
    """atk50 F01: each takeover added the holder it took over to the owner record's
    inherited histories, also when that holder had opened the topic (so its mark-open had
    recorded everything it inherited). The list grew with every crash-failover, and past
    INHERITS_MAX every further failover was refused. A holder that opened the topic now
    passes on only its own history. (The cap is lowered here so that a few failovers cross it.)"""
    from tiered.lifecycle import ownership

    monkeypatch.setattr(ownership, "INHERITS_MAX", 3)
    for i in range(8):
        host = local_cluster.broker("AB"[i % 2])
        hosted = host.load(TOPIC)
        assert hosted.next_offset == i
        produce_range(hosted, i, i, ack="archived")
        _die(host)
        owner = ownership.read_owner(local_cluster.metadata, T)[0]
        assert owner is not None and len(owner.inherits) <= 1, owner
    lost = keys.read_lost_ranges(local_cluster.metadata, T)
    assert all(r.end_offset is None for r in lost), lost  # each one's offsets were archived: none lost
    assert [m.offset for m in read_all(local_cluster.broker("C").load(TOPIC), 0, 7)] == list(range(8))
