"""Deleting a sealed WAL is crash-safe: a crash after any file's removal leaves a log
that still opens (a suffix, as after retention), never a checkpoint that names missing
segments. Before, a broker killed during the delete
after a seal could never load the topic again (CorruptLog, then LocalWalUnreadable)."""
from __future__ import annotations

import os

from wal import WriteAheadLog
from wal.config import WalConfig
from wal.fs import RealFs


class _Crash(BaseException):
    pass


def test_a_crash_after_any_removal_of_a_delete_leaves_a_wal_that_opens(tmp_path) -> None:
    config = WalConfig(segment_bytes_max=300)
    k = 0
    while True:
        root = str(tmp_path / f"k{k}")
        wal = WriteAheadLog.open(root, "/default/t", config=config)
        for i in range(40):
            wal.append(b"m%02d" % i)
            wal.flush()  # one write batch each: segments are cut between batches
        wal.close()
        directory = os.path.join(root, "default", "t")
        files = len(os.listdir(directory))
        assert files > 4  # several segments, the checkpoint, the lock

        class CrashFs(RealFs):
            removed = 0

            def remove(self, path: str) -> None:
                if CrashFs.removed == k:
                    raise _Crash(path)
                CrashFs.removed += 1
                super().remove(path)

        doomed = WriteAheadLog.open(root, "/default/t", config=config, fs=CrashFs())
        doomed.close()
        try:
            doomed.delete()
            crashed = False
        except _Crash:
            crashed = True
        if not crashed:
            assert not os.path.exists(directory)
            return
        survivor = WriteAheadLog.open(root, "/default/t", config=config)  # must not raise CorruptLog
        assert survivor.next_offset in (0, 40)
        survivor.close()
        k += 1
