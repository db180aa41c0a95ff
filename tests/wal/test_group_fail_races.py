"""Races around a journaled commit group's rounds, failures and closes.

A group failing on another thread (its journal's checkpointer, on a segment sync error)
while the group's thread is in the middle of a round: the failure wins. Nothing of the
round in flight is published as durable to a WAL already told WalFailed, and a segment
the round was cutting is closed, not left open past the WAL and the group.

A close that times out raises (its files are not known to be synced on their own), and
the group closes the files once it lets the topic go; a group failing just after it let a
closing topic go still leaves that topic's files synced before ``close()`` returns, so a
cleanly closed WAL never needs the journal."""
from __future__ import annotations

import errno
import os
import threading

import pytest

import wal.writer as writer_module
from wal import WalConfig, WalFailed, WriteAheadLog
from wal.fs import RealFs
from wal.group import CommitGroup
from wal.journal import Journal, JournalConfig
from wal.testing import FaultFs

WAIT_S = 30.0


def _open_files_under(root: str) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root + os.sep) and target.endswith(".seg"):
            found.append(target)
    return found


def _fail_while(monkeypatch, target, name: str, group_holder: list) -> tuple[threading.Event, threading.Event]:
    """Make the group thread's next call of ``target.name`` stop until the test failed the
    group (``inside`` is set when it stopped; set ``failed`` to let it go on)."""
    inside, failed = threading.Event(), threading.Event()
    original = getattr(target, name)

    def stopping(*args, **kwargs):
        result = original(*args, **kwargs)
        if threading.current_thread().name.startswith("wal-commit-group") and not inside.is_set() \
                and group_holder:
            inside.set()
            assert failed.wait(WAIT_S)
        return result
    monkeypatch.setattr(target, name, stopping)
    return inside, failed


def _scenario(tmp_path, monkeypatch, target, name: str, config: WalConfig) -> tuple[list[int], str, WriteAheadLog]:
    root = os.fspath(tmp_path)
    holder: list = []
    inside, failed = _fail_while(monkeypatch, target, name, holder)
    group = CommitGroup(root, RealFs(), journal=JournalConfig())
    wal = WriteAheadLog.open(root, "/ns/t", config=config, group=group)
    published: list[int] = []
    wal.add_durable_listener(published.append)
    wal.append(b"first")
    wal.flush()
    holder.append(group)  # from now on the group thread stops in target.name
    offset = wal.append(b"second")
    assert inside.wait(WAIT_S)
    group.fail(OSError(errno.EIO, "a checkpoint's segment sync failed"))
    failed.set()
    with pytest.raises(WalFailed):
        wal.wait_durable(offset, WAIT_S)
    wal.close()
    group.close()
    return published, root, wal


def test_a_failure_during_a_rotation_closes_the_segment_the_rotation_opened(tmp_path, monkeypatch):
    published, root, wal = _scenario(tmp_path, monkeypatch, writer_module, "create_segment",
                                     WalConfig(segment_bytes_max=1))  # every round rotates
    assert published == [0], "nothing of the round in flight may be published after the failure"
    assert wal.durable_offset == 0
    assert _open_files_under(root) == [], "a segment descriptor outlived the WAL and its group"


def test_a_failure_during_the_journal_sync_publishes_nothing_of_the_round(tmp_path, monkeypatch):
    published, root, wal = _scenario(tmp_path, monkeypatch, Journal, "sync", WalConfig())
    assert published == [0], "nothing of the round in flight may be published after the failure"
    assert wal.durable_offset == 0
    assert _open_files_under(root) == []


def test_a_close_that_times_out_raises_and_the_group_closes_the_files_later(tmp_path, monkeypatch):
    root = os.fspath(tmp_path)
    holder: list = []
    inside, released = _fail_while(monkeypatch, Journal, "sync", holder)
    group = CommitGroup(root, RealFs(), journal=JournalConfig())
    wal = WriteAheadLog.open(root, "/ns/t", config=WalConfig(close_timeout_s=0.2), group=group)
    wal.append(b"first")
    wal.flush()
    holder.append(group)
    wal.append(b"second")  # its round stops in the journal's sync
    assert inside.wait(WAIT_S)
    member = wal._member
    with pytest.raises(WalFailed):
        wal.close()  # timed out: its files are not known to be synced on their own
    released.set()  # the round finishes; the group lets the topic go and closes its files
    assert member.left.wait(WAIT_S)
    group.close()
    assert _open_files_under(root) == [], "a segment descriptor outlived the WAL and its group"


def test_a_group_failing_just_after_letting_a_closing_topic_go_still_syncs_its_files():
    fs, root = FaultFs(), "/r"
    group = CommitGroup(root, fs, journal=JournalConfig(checkpoint_interval_s=3600.0))
    wal = WriteAheadLog.open(root, "/ns/t", config=WalConfig(segment_bytes_max=64), group=group)
    acknowledged = []
    for i in range(5):
        acknowledged.append(wal.append(b"m%d" % i * 20))
        wal.flush()
    member = wal._member

    class FailFirst(threading.Event):
        """The group fails after letting the topic go, before its closer wakes."""

        def set(self) -> None:
            if member.released:
                group.fail(OSError(errno.EIO, "another topic's checkpoint sync failed"))
            super().set()
    member.left = FailFirst()
    wal.close()  # returned normally: its files must not need the journal any more
    assert group.failed
    group.close()
    image = fs.crash_image()
    for name in image.listdir(os.path.join(root, ".journal")):  # as if moved out of the root
        if not image.exists(os.path.join(root, ".journal", name)):
            continue
        try:
            image.remove(os.path.join(root, ".journal", name))
        except OSError:
            pass
    recovered = WriteAheadLog.open(root, "/ns/t", fs=image)
    assert [r.offset for r in recovered.reader(0, live=False)] == acknowledged
    recovered.close()


def test_a_long_lived_journaled_wal_keeps_only_the_rotated_files_no_checkpoint_closed_yet():
    fs = FaultFs()
    group = CommitGroup("/r", fs, journal=JournalConfig(checkpoint_interval_s=3600.0))
    wal = WriteAheadLog.open("/r", "/ns/t", config=WalConfig(segment_bytes_max=64), group=group)
    for i in range(200):  # every round cuts a new segment
        wal.append(b"m%03d" % i * 10)
        wal.flush()
        if i % 10 == 9:
            assert group.journal is not None
            group.journal.checkpoint()  # syncs and closes the rotated-away files
    assert len(wal._member.appender._retired) <= 11
    wal.close()
    group.close()
