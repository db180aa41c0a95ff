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

import pytest

from wal import WriteAheadLog
from wal.errors import WalLocked
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
