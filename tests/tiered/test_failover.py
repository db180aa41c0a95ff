"""Failover without silent loss: the WAL's own file layer, prompt progress, the dead
owner's quarantined WAL with its exact lost range, and cursors clamped at a takeover.

Each test fails without the fix it names (see docs/LIFECYCLE.md, "Failover").
"""
from __future__ import annotations

import logging
import os
import time
from typing import NoReturn

import pytest
from prometheus_client import REGISTRY

from tiered.errors import MalformedRecord
from tiered.lifecycle import BrokerHost, seal
from tiered.metadata import keys
from tiered.lifecycle.restore import read_progress
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


def _a_on(cluster: Cluster, disk: str, fs: FaultFs | None = None) -> BrokerHost:
    """Broker A restarted with its WAL root on another data dir (``disk``)."""
    host = BrokerHost("A", os.path.join(cluster.root, disk), cluster.metadata, cluster.objects, FAST_BROKER,
                      wal_fs=fs)
    cluster.hosts.append(host)
    return host


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
    on_y = _a_on(local_cluster, "disk-y")
    hosted = on_y.load(TOPIC)
    produce_range(hosted, 5, 9)  # durable only
    hosted.publish_progress()
    _die(on_y)
    back = _a_on(local_cluster, "disk-x").load(TOPIC)
    assert not back.report.recovered_local_wal
    assert back.next_offset == 5 and back.report.unarchived_at_least == 5, back.report


def test_a_tail_an_operator_discarded_is_not_counted_again_by_a_later_failover(local_cluster: Cluster,
                                                                               monkeypatch) -> None:
    """A's WAL (with its unarchived tail 5-11) does not open; the operator discards it (its
    loss recorded then, under the WAL's epoch); that load and a later one fail after taking
    the topic. The failover from A's last epoch must not report 5-11 lost a second time:
    that epoch's WAL held nothing."""
    import tiered.lifecycle.host as host_module
    from tiered.lifecycle.errors import LocalWalUnreadable

    _a_dies_with_its_tip_published(local_cluster)
    again = local_cluster.broker("A")

    def unreadable(topic):  # type: ignore[no-untyped-def]
        raise LocalWalUnreadable(topic, again.root.path(topic), OSError("injected: bad segment header"))

    with monkeypatch.context() as patch:
        patch.setattr(again.root, "open_local", unreadable)
        with pytest.raises(LocalWalUnreadable):
            again.load(TOPIC)
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
    on_y = _a_on(local_cluster, "disk-y")
    hosted = on_y.load(TOPIC)
    produce_range(hosted, 5, 9)  # durable only
    hosted.publish_progress()
    _die(on_y)
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
    back_on_x = local_cluster.broker("A")

    with monkeypatch.context() as patch:
        patch.setattr(back_on_x, "_mark_open", _metadata_unavailable)
        with pytest.raises(Exception):  # noqa: B017 - the stale WAL was retired, then the step failed
            back_on_x.load(TOPIC)
    assert back_on_x.retired, "the stale WAL on disk X was retired"
    _die(back_on_x)
    taken = local_cluster.broker("B").load(TOPIC)
    assert taken.next_offset == 5
    assert taken.report.unarchived_at_least == 10, taken.report
