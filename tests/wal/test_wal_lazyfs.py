"""Power loss on LazyFS (Jepsen's FUSE file system that keeps writes in its own page cache
until fsync): a writer process appends commit rounds and prints what was acknowledged; then
either LazyFS tears the next write of the active segment (``torn-op``: the write is split in
parts and only some persist, e.g. only the LAST part, which is the state that made the old
recovery refuse to open) and crashes itself, or the writer is SIGKILLed and LazyFS drops
every unsynced byte (``clear-cache``). What LazyFS persisted (its backing directory) must
open as a WAL with every acknowledged offset intact and every offset holding its own message.

``torn-seq`` tears a sequence of writes made without an fsync between them: the kernel hands
one commit round's writev to FUSE as several page-sized writes, so ``persist=2`` keeps the
round's second page and loses its first, the other way to reach the same state.

Skipped unless LazyFS is built (``DNB_LAZYFS=/path/to/lazyfs`` or ``lazyfs`` on PATH; LazyFS is
Jepsen's FUSE file system that keeps writes in its own page cache until fsync, built from
dsrhaslab/lazyfs), ``/dev/fuse`` exists and ``fusermount3`` is installed.
"""
from __future__ import annotations

import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests.wal.helpers import check_payload, read_all
from wal import WalConfig, WriteAheadLog

LAZYFS = os.environ.get("DNB_LAZYFS") or shutil.which("lazyfs")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    not (LAZYFS and os.path.exists("/dev/fuse") and shutil.which("fusermount3")),
    reason="LazyFS is not available here: set DNB_LAZYFS to a built lazyfs binary (needs /dev/fuse "
           "and fusermount3, i.e. FUSE 3)")

# One fault per power-loss round. torn-op: which of 3 equal parts of the next write to the
# active segment persist ("3", "2,3", "2" keep a later part and lose an earlier one);
# torn-seq: which writes of the next fsync-less sequence persist; clear-cache: SIGKILL the
# writer, then drop everything unsynced.
FAULTS = ("torn-op 3", "torn-op 2,3", "torn-seq 2", "clear-cache", "torn-op 1,3", "torn-op 2",
          "torn-seq 2", "torn-op 3", "clear-cache", "torn-op 2,3", "torn-seq 2", "torn-op 1",
          "clear-cache", "torn-op 3")


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class _LazyFs:
    def __init__(self, base: str) -> None:
        self.root, self.mount = os.path.join(base, "r"), os.path.join(base, "m")
        self.fifo, self.done = os.path.join(base, "f"), os.path.join(base, "d")
        self.config = os.path.join(base, "c.toml")
        for path in (self.root, self.mount):
            os.makedirs(path, exist_ok=True)
        with open(self.config, "w") as f:
            f.write(f'[faults]\nfifo_path="{self.fifo}"\nfifo_path_completed="{self.done}"\n'
                    '[cache]\napply_eviction=false\n[cache.simple]\ncustom_size="1gb"\nblocks_per_page=1\n'
                    '[filesystem]\nlog_all_operations=false\nlogfile=""\n')
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(base, "log")

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - LazyFS's output, for failures
        self.proc = subprocess.Popen(
            [LAZYFS, self.mount, "--config-path", self.config, "-o", "allow_other", "-o", "modules=subdir",
             "-o", f"subdir={self.root}", "-f"], stdout=self._log, stderr=subprocess.STDOUT)
        # LazyFS's fault worker opens the completion FIFO for writing, which blocks until a
        # reader has it open: hold one for the mount's life, or no command is ever read.
        _wait(lambda: os.path.exists(self.done) or self.proc.poll() is not None, 20, "the LazyFS FIFOs")
        self._done_fd = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK)
        _wait(lambda: os.path.ismount(self.mount) or self.proc.poll() is not None, 20, "the LazyFS mount")
        assert self.proc.poll() is None, "lazyfs exited at start"

    def command(self, text: str) -> None:
        assert len(text) < 100, "LazyFS reads its FIFO 100 bytes at a time"
        with open(self.fifo, "w") as f:
            f.write(text + "\n")

    def clear_cache(self) -> None:
        self.command("lazyfs::clear-cache")
        got = b""
        deadline = time.monotonic() + 30
        while b"finished::clear-cache" not in got:
            assert time.monotonic() < deadline, "LazyFS did not confirm clear-cache"
            ready, _, _ = select.select([self._done_fd], [], [], 0.5)
            if ready:
                got += os.read(self._done_fd, 100)

    def stop(self) -> None:
        subprocess.run(["fusermount3", "-uz", self.mount], capture_output=True, timeout=30)
        if self.proc is not None:
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # our own child, by its pid
                self.proc.wait(10)
        self.proc = None
        if getattr(self, "_done_fd", None) is not None:
            os.close(self._done_fd)
            self._done_fd = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None


class _Writer:
    """The writer process on the mount; ``acked`` is the last offset it reported durable."""

    def __init__(self, mount: str, seed: int) -> None:
        self.acked = -1
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.wal.lazyfs_child", mount, str(seed)],
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("acked "):
                self.acked = int(line.split()[1])

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(10)
        return self.acked


def _check_opens(root: str, acked: int) -> int:
    wal = WriteAheadLog.open(root, "/ns/t", WalConfig(close_timeout_s=5.0))
    try:
        records = read_all(wal)
        assert [r.offset for r in records] == list(range(wal.next_offset))
        assert wal.next_offset > acked, f"acknowledged offset {acked} lost (log ends at {wal.next_offset - 1})"
        for record in records:
            assert check_payload(record.payload)[0] == record.offset, "an offset holds another message"
        return wal.next_offset
    finally:
        wal.close()


def test_lazyfs_torn_writes_and_power_cuts_never_make_the_wal_refuse_to_open():
    base = tempfile.mkdtemp(prefix="lz", dir="/tmp")  # short: FIFO commands carry the path
    fs = _LazyFs(base)
    rng = random.Random(12)
    outcomes = []
    try:
        for round_index, fault in enumerate(FAULTS):
            fs.start()
            try:
                writer = _Writer(fs.mount, round_index)
                target = writer.acked + rng.randrange(3, 30)
                _wait(lambda: writer.acked >= target or writer.proc.poll() is not None, 60, "acknowledged rounds")
                assert writer.proc.poll() is None, "the writer died before the fault"
                segment = sorted(n for n in os.listdir(os.path.join(fs.root, "ns", "t")) if n.endswith(".seg"))[-1]
                path = os.path.join(fs.root, "ns", "t", segment)
                kind, _, persist = fault.partition(" ")
                if kind == "clear-cache":
                    acked = writer.kill()
                    fs.clear_cache()
                else:
                    if kind == "torn-op":
                        fs.command(f"lazyfs::torn-op::file={path}::parts=3::persist={persist}")
                    else:
                        fs.command(f"lazyfs::torn-seq::op=write::file={path}::persist={persist}")
                    # LazyFS tears the writer's next write(s) of the segment and crashes itself.
                    _wait(lambda: fs.proc.poll() is not None, 60, f"LazyFS to inject {fault}")
                    acked = writer.kill()
                outcomes.append((fault, acked))
            finally:
                fs.stop()
            _check_opens(fs.root, acked)
    finally:
        fs.stop()
        shutil.rmtree(base, ignore_errors=True)
    assert len(outcomes) == len(FAULTS)
