"""One writer per WAL directory and one broker host per WAL root.

Two openers of the same directory would each recover the same segments and hand out
the same offsets for different messages; both would report them durable. The second
opener must be refused at once with ``WalLocked``, in this process or another, and a
crashed holder must never leave the directory locked.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from wal import WriteAheadLog
from wal import journal as wal_journal
from wal.errors import WalLocked
from wal.group import CommitGroup
from wal.journal import JournalConfig
from wal.fs import RealFs
from wal.testing import FaultFs

TOPIC = "/ns/locked"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(params=["real", "fault"])
def fs(request):
    return RealFs() if request.param == "real" else FaultFs()


def test_second_opener_of_a_directory_is_refused_until_the_first_closes(tmp_path, fs) -> None:
    root = str(tmp_path)
    first = WriteAheadLog.open(root, TOPIC, fs=fs)
    try:
        first.append(b"a")
        with pytest.raises(WalLocked) as info:
            WriteAheadLog.open(root, TOPIC, fs=fs)
        assert os.path.join("ns", "locked") in str(info.value)
        # The refused opener changed nothing: the holder keeps appending and its
        # offsets stay its own.
        assert first.append(b"b") == 1
        first.flush(5.0)
    finally:
        first.close()
    again = WriteAheadLog.open(root, TOPIC, fs=fs)
    try:
        assert again.next_offset == 2
    finally:
        again.close()


def test_a_failed_open_does_not_leave_the_directory_locked(tmp_path) -> None:
    root = str(tmp_path)
    WriteAheadLog.open(root, TOPIC).close()
    with pytest.raises(Exception):  # the WAL continues at 0: any other initial offset is refused
        WriteAheadLog.open(root, TOPIC, initial_offset=5)
    WriteAheadLog.open(root, TOPIC).close()


def _holder(root: str) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {REPO!r})
        from wal import WriteAheadLog
        wal = WriteAheadLog.open({root!r}, {TOPIC!r})
        wal.append(b"held")
        wal.flush(30)
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_another_process_is_refused_and_a_killed_holder_releases_the_lock(tmp_path) -> None:
    root = str(tmp_path)
    proc = _holder(root)
    try:
        with pytest.raises(WalLocked):
            WriteAheadLog.open(root, TOPIC)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    # The kernel dropped the lock with the process: a restart after a crash opens.
    wal = WriteAheadLog.open(root, TOPIC)
    try:
        assert wal.next_offset == 1
    finally:
        wal.close()


def test_a_syncfs_group_cannot_open_a_wal_a_journaled_group_has_open(tmp_path) -> None:
    """A journaled group claims its WALs without a lock file per topic; its journal's lock
    keeps other openers out of the whole root. A syncfs group created before the journaled
    one (so before its journal existed) must be kept out too: two writers would hand out
    the same offsets."""
    root, fs = str(tmp_path), RealFs()
    older = CommitGroup(root, fs, journal=None)
    journaled = CommitGroup(root, fs, journal=JournalConfig())
    wal = WriteAheadLog.open(root, TOPIC, group=journaled)
    try:
        assert wal.append(b"journaled") == 0
        wal.flush(5.0)
        with pytest.raises(WalLocked):
            WriteAheadLog.open(root, TOPIC, group=older)
        with pytest.raises(WalLocked):
            WriteAheadLog.open(root, TOPIC)  # nor a standalone opener
        assert wal.append(b"still the only writer") == 1
        wal.flush(5.0)
    finally:
        wal.close()
        journaled.close()
    again = WriteAheadLog.open(root, TOPIC, group=older)  # once the journaled group is gone
    try:
        assert again.next_offset == 2
    finally:
        again.close()
        older.close()


@pytest.mark.parametrize("second_spelling", ["same", "symlink", "dotdot", "syncfs group via symlink"])
def test_standalone_opens_of_two_topics_at_once_under_a_journaled_root_both_succeed(tmp_path, monkeypatch,
                                                                                 second_spelling: str) -> None:
    """Each standalone open replays the root's journal under its lock; a second open in the
    same process waits for the first's replay instead of taking it for a running group,
    however it spells the root (their turn is the root's real path), also when it is a
    syncfs group starting up (which replays the journal it finds first)."""
    root, fs = str(tmp_path / "root"), RealFs()
    if "symlink" in second_spelling:
        os.makedirs(root)
        os.symlink(root, str(tmp_path / "link"))
        second_root = str(tmp_path / "link")
    elif second_spelling == "dotdot":
        os.makedirs(str(tmp_path / "elsewhere"))
        second_root = str(tmp_path / "elsewhere" / ".." / "root")
    else:
        second_root = root
    group = CommitGroup(root, fs, journal=JournalConfig())
    for topic in ("/ns/a", "/ns/b"):
        wal = WriteAheadLog.open(root, topic, group=group)
        wal.append(b"x")
        wal.flush(5.0)
        wal.close()
    group.close()

    inside, go = threading.Event(), threading.Event()
    real_replay = wal_journal.replay

    def slow_replay(*args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "first-opener":
            inside.set()
            go.wait(30)
        return real_replay(*args, **kwargs)

    monkeypatch.setattr(wal_journal, "replay", slow_replay)
    opened: dict[str, object] = {}

    def open_a() -> None:
        try:
            opened["a"] = WriteAheadLog.open(root, "/ns/a")
        except Exception as exc:  # noqa: BLE001 - reported below
            opened["a"] = exc

    first = threading.Thread(target=open_a, name="first-opener")
    first.start()
    assert inside.wait(30)
    groups: list[CommitGroup] = []

    def open_b() -> None:
        try:
            if second_spelling.startswith("syncfs group"):
                groups.append(CommitGroup(second_root, fs))
            opened["b"] = WriteAheadLog.open(second_root, "/ns/b", group=groups[0] if groups else None)
        except Exception as exc:  # noqa: BLE001 - reported below
            opened["b"] = exc

    second = threading.Thread(target=open_b)
    second.start()
    # Give the second opener time to reach the journal while the first replays (a loaded
    # machine only makes this check weaker, never makes correct code fail).
    second.join(0.5)
    go.set()
    first.join(30)
    second.join(30)
    for name in ("a", "b"):
        assert isinstance(opened.get(name), WriteAheadLog), f"{name}: {opened.get(name)!r}"
        assert opened[name].next_offset == 1  # type: ignore[union-attr]
        opened[name].close()  # type: ignore[union-attr]
    for each in groups:
        each.close()


def _journaled_child_killed(root: str, topic: str) -> None:
    """Another process runs a journaled group on ``root``, acknowledges 5 messages of
    ``topic`` and dies before its final checkpoint (only the journal holds them durably)."""
    child = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {REPO!r})
        from wal import WriteAheadLog
        from wal.fs import RealFs
        from wal.group import CommitGroup
        from wal.journal import JournalConfig
        group = CommitGroup({root!r}, RealFs(), journal=JournalConfig(checkpoint_interval_s=3600))
        wal = WriteAheadLog.open({root!r}, {topic!r}, group=group)
        for i in range(5):
            wal.append(b"journaled-%d" % i)
        wal.flush(30)
        os._exit(9)  # as a SIGKILL: no close, no final checkpoint
    """)
    subprocess.run([sys.executable, "-c", child], check=False, timeout=120)


def test_a_standalone_open_replays_what_a_journaled_group_left_since_the_last_open(tmp_path, monkeypatch) -> None:
    """Standalone opens skip reading the journal again while its checkpoint is the one their
    last replay left. A journaled group that ran since (in another process, killed before
    its final checkpoint) changed it, so the next open replays that group's rounds."""
    root = str(tmp_path)
    _journaled_child_killed(root, "/ns/b")
    WriteAheadLog.open(root, "/ns/a").close()  # replays b's rounds; the checkpoint is now known
    _journaled_child_killed(root, "/ns/d")
    replays: list[str] = []
    real_replay = wal_journal.replay
    monkeypatch.setattr(wal_journal, "replay", lambda *a, **k: replays.append("replay") or real_replay(*a, **k))
    WriteAheadLog.open(root, "/ns/a").close()
    assert replays, "a journaled group ran since the last replay: the journal is read again"
    for topic in ("/ns/b", "/ns/d"):
        wal = WriteAheadLog.open(root, topic)
        try:
            assert [bytes(r.payload) for r in wal.reader(0, live=False)] == [b"journaled-%d" % i for i in range(5)]
        finally:
            wal.close()
    replays.clear()
    WriteAheadLog.open(root, "/ns/c").close()
    assert not replays, "nothing changed since the last replay: the journal's files are not read again"
