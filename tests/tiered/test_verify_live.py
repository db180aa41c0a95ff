"""`dnb verify` of a topic whose broker keeps working while verify runs: nothing it does
(WAL retention, a seal, the journal's checkpointer, a consumer's acks, archive retention,
an upload pass) may show up as an error. Each test runs the broker's own step once, at
one point inside verify, through a hook (atk43 F04, atk44 F01-F04): no timing."""
from __future__ import annotations

import os
import shutil
from dataclasses import replace

import pytest

import tiered.tools.verify as verify
import wal.checkpoint as wal_checkpoint
import wal.journal as wal_journal
import wal.recovery as wal_recovery
from tiered.lifecycle import BrokerHost
from uploader.config import ArchiveRetentionConfig
from wal.config import WalConfig

from tests.tiered.helpers_lifecycle import (  # noqa: F401 - fixtures
    TOPIC,
    Cluster,
    local_cluster,
    produce_range,
)


def _host(cluster: Cluster, **overrides: object) -> tuple[BrokerHost, str]:
    root = os.path.join(cluster.root, "disk-a")
    host = BrokerHost("A", root, cluster.metadata, cluster.objects, replace(cluster.config, **overrides))
    cluster.hosts.append(host)
    return host, root


def _once(step):
    """``step`` the first time the wrapped call is made, then never again."""
    done: list[int] = []

    def run() -> None:
        if not done:
            done.append(1)
            step()
    return run


def _verify(cluster: Cluster, root: str, objects: object = None) -> verify.VerifyReport:
    return verify.verify_topic(TOPIC, cluster.metadata, objects or cluster.objects, wal_dir=root)


@pytest.mark.parametrize("when", ["checkpoint read", "segments listed", "seal"])
def test_wal_retention_or_a_seal_during_the_scan_is_no_corruption(local_cluster: Cluster, monkeypatch,
                                                                    when: str) -> None:
    """atk44 F01: the scan read the checkpoint, then listed the segments (retention in
    between: "oldest segments missing?"), or listed them and then read one that retention
    or a seal deleted (reported as corrupt)."""
    host, root = _host(local_cluster, wal_config=WalConfig(segment_bytes_max=200))
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 29, ack="archived")
    segments = hosted.wal.segments()
    cut = segments[-2].last_offset + 1
    step = _once(lambda: host.unload(TOPIC) if when == "seal" else hosted.wal.truncate_before(cut))
    module, name = (wal_checkpoint, "read_checkpoint") if when == "checkpoint read" else (wal_recovery, "scan_segment")
    call = getattr(module, name)

    def then_the_broker(*args, **kwargs):
        found = call(*args, **kwargs)
        step()
        return found
    monkeypatch.setattr(module, name, then_the_broker)
    report = _verify(local_cluster, root)
    assert report.ok, report.problems


@pytest.mark.parametrize("when", ["after", "before"], ids=["checkpoint read first", "checkpoint moved first"])
def test_the_journal_checkpointer_during_the_scan_is_no_corruption(local_cluster: Cluster, monkeypatch,
                                                                    when: str) -> None:
    """atk44 F02: the shared journal was read while the checkpointer recycled its files: a
    false ``wal_corrupt``, or a FileNotFoundError out of verify."""
    config = WalConfig(journal_file_bytes=64 * 1024, journal_checkpoint_bytes=1 << 30,
                       journal_checkpoint_interval_s=3600.0)
    host, root = _host(local_cluster, wal_config=config)
    hosted = host.load(TOPIC)
    payload = b"x" * 4000
    for _ in range(5):
        hosted.produce(payload)
    journal = host.root.group.journal

    def traffic_and_checkpoints() -> None:
        for _ in range(3):
            for _ in range(20):
                hosted.produce(payload)
            journal.checkpoint()
            journal._prepare_spare()
    step = _once(traffic_and_checkpoints)
    read = wal_journal.read_checkpoint

    def read_checkpoint(fs, directory, *args, **kwargs):
        if directory.endswith(".journal") and when == "before":
            step()
        found = read(fs, directory, *args, **kwargs)
        if directory.endswith(".journal") and when == "after":
            step()
        return found
    monkeypatch.setattr(wal_journal, "read_checkpoint", read_checkpoint)
    report = _verify(local_cluster, root)
    assert report.ok, report.problems


def test_a_consumer_acking_during_verify_is_not_ahead(local_cluster: Cluster, monkeypatch) -> None:
    """atk44 F03: cursors were read at the end and compared with the topic's end taken at
    the start; a consumer that read and acked newer messages meanwhile was "ahead"."""
    host, root = _host(local_cluster)
    hosted = host.load(TOPIC)
    sub = hosted.subscribe("s", initial="earliest")
    produce_range(hosted, 0, 9, ack="archived")
    sub.ack(9)
    sub.flush()
    check = verify._check_objects

    def consumer_meanwhile(*args, **kwargs):
        check(*args, **kwargs)
        produce_range(hosted, 10, 14)
        sub.ack(14)
        sub.flush()
    monkeypatch.setattr(verify, "_check_objects", consumer_meanwhile)
    report = _verify(local_cluster, root)
    assert report.ok, report.problems


def test_archive_retention_during_the_object_check_is_nothing_missing(local_cluster: Cluster) -> None:
    """atk44 F04: the descriptors come from verify's snapshot; a retention cut deleted some
    of their objects before they were read: "missing_object" errors."""
    uploader = replace(local_cluster.config.uploader,
                       archive_retention=ArchiveRetentionConfig(bytes_max=0, check_interval_s=3600.0))
    host, root = _host(local_cluster, uploader=uploader)
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 5, ack="archived")  # one object per archived produce
    retention = _once(lambda: hosted.uploader.archive_retention.run(hosted.uploader.committed_through))

    class CutWhileReading:
        def __getattr__(self, name: str) -> object:
            return getattr(local_cluster.objects, name)

        def get(self, key: str, *args: object, **kwargs: object) -> bytes:
            data: bytes = local_cluster.objects.get(key, *args, **kwargs)
            retention()
            return data
    report = _verify(local_cluster, root, CutWhileReading())
    assert report.ok, report.problems
    assert report.objects_checked == 2  # the one read before the cut, and the one it keeps


def test_bit_rot_in_a_segment_the_journal_still_covers_is_reported_while_the_broker_runs(
        local_cluster: Cluster) -> None:
    """atk45 F04: verify lays the journal's pending rounds over a segment, as replay would.
    Bit rot in a sealed segment whose rounds the journal still held was hidden until the
    journal's next checkpoint dropped its copy (then the next load refused the WAL). A
    running broker writes each round to its segment before journaling it, so there the
    segment must equal the journal's copy: a byte that differs is damage."""
    config = WalConfig(segment_bytes_max=200, journal_checkpoint_bytes=1 << 30, journal_checkpoint_interval_s=3600.0)
    host, root = _host(local_cluster, wal_config=config)
    hosted = host.load(TOPIC)
    produce_range(hosted, 0, 19)  # durable only: every round still in the journal
    assert _verify(local_cluster, root).ok
    sealed = hosted.wal.segments()[1]
    assert sealed.sealed
    with open(sealed.path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    report = _verify(local_cluster, root)
    assert [(p["kind"], p["path"]) for p in report.problems if p["severity"] == "error"] == [
        ("wal_corrupt", sealed.path)], report.problems


def test_segments_a_power_loss_cut_short_are_no_corruption_while_the_replay_runs(tmp_path, monkeypatch) -> None:
    """atk50 F02: verify compared segments with the journal as soon as the journal's lock
    was held, but a group holds it while it replays the last run's rounds into segments
    that a power loss cut short: a false ``wal_corrupt`` ("the next load will refuse this
    WAL"). Verify compares only once the group's replay is done (``running.lock``); the
    bit rot test above shows that it does compare then."""
    from wal.fs import RealFs
    from wal.group import CommitGroup
    from wal.journal import JournalConfig
    from wal.log import WriteAheadLog

    journal = JournalConfig(checkpoint_bytes=1 << 30, checkpoint_interval_s=3600.0)
    live_root, root = str(tmp_path / "live"), str(tmp_path / "copy")
    group = CommitGroup(live_root, RealFs(), journal=journal)
    wal = WriteAheadLog.open(live_root, "/ns/t", group=group)
    for i in range(20):
        wal.append(b"m%d" % i)
    wal.flush(10)
    # The power loss: every round is in the (synced) journal, and the segments keep only
    # what the last checkpoint synced (the image is a copy: the group above still runs).
    shutil.copytree(live_root, root)
    directory = os.path.join(root, "ns", "t")
    pending = wal_journal.pending_segment_bytes(RealFs(), root, directory)
    assert pending
    for path, (cut, _data, _next) in pending.items():
        os.truncate(path, cut)
    during: list[verify.VerifyReport] = []
    replay = wal_journal.replay

    def verify_then_replay(fs, at, *args, **kwargs):
        if at == root:
            report = verify.VerifyReport("/ns/t")
            verify._scan_wal(directory, report)
            during.append(report)
        return replay(fs, at, *args, **kwargs)
    monkeypatch.setattr(wal_journal, "replay", verify_then_replay)
    restarted = CommitGroup(root, RealFs(), journal=journal)
    try:
        assert during and during[0].problems == []
        assert wal_journal.journal_running(root)
        report = verify.VerifyReport("/ns/t")
        verify._scan_wal(directory, report)  # replayed: the segments equal the journal now
        assert report.problems == []
    finally:
        restarted.close()
        wal.close()
        group.close()
    assert not wal_journal.journal_running(root)
