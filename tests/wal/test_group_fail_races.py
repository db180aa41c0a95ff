"""A commit group failing on another thread (its journal's checkpointer, on a segment sync
error) while the group's thread is in the middle of a round: the failure wins. Nothing of
the round in flight is published as durable to a WAL already told WalFailed, and a
segment the round was cutting is closed, not left open past the WAL and the group."""
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
