"""A topic that fails alone in a journaled commit group leaves its root recoverable.

A round whose segment write fails part-way (a full disk) is never acknowledged, and the
topic fails alone. A host may then reopen that topic in the same group (it abandons and
reloads it) before the journal's next checkpoint. What the failed write left in the segment
must not become part of the WAL: the journal never saw it, so the WAL's later entries would
skip its offsets, and after a crash the whole root's replay would refuse to start (every
topic of the broker with it). The journal's checkpointer, for its part, must not fail the
group over a spare file it could not prepare: nothing depends on the spare yet.
"""
from __future__ import annotations

import errno
import logging
import threading

import pytest

from wal import WriteAheadLog
from wal.errors import WalError
from wal.group import CommitGroup
from wal.journal import Journal, JournalConfig
from wal.testing import FaultFs

ROOT = "/r"
# No checkpoint while a test runs: the journal is the only copy of its rounds.
HELD_CHECKPOINTS = JournalConfig(checkpoint_interval_s=3600, checkpoint_bytes=1 << 30)


def _short_write_once(fs: FaultFs, path: str, keep: int | None) -> None:
    """The next write to ``path`` lands only in part (all but its last 5 bytes, or its
    first ``keep`` bytes), then fails with ENOSPC, as a write on a disk filling up does."""
    target = fs._inode(path)
    real_write = fs._write

    def short_write(inode, chunks, closed):  # type: ignore[no-untyped-def]
        if inode is not target:
            return real_write(inode, chunks, closed)
        del fs._write  # once
        data = b"".join(bytes(c) for c in chunks)
        with fs._lock:
            inode.data += data[:keep] if keep is not None else data[:-5]
        raise OSError(errno.ENOSPC, "No space left on device (injected short write)")

    fs._write = short_write  # type: ignore[method-assign]


def _fill(wal: WriteAheadLog, name: str, first: int, count: int, acked: dict[int, bytes]) -> None:
    for i in range(first, first + count):
        payload = f"{name}-{i}".encode()
        acked[wal.append(payload)] = payload
    wal.flush()


def _check_acknowledged(fs: FaultFs, acked: dict[str, dict[int, bytes]]) -> None:
    group = CommitGroup(ROOT, fs, journal=HELD_CHECKPOINTS)  # replays the journal: must not refuse
    try:
        for topic, messages in acked.items():
            wal = WriteAheadLog.open(ROOT, f"ns/{topic}", group=group)
            try:
                got = {r.offset: bytes(r.payload) for r in wal.reader(0, live=False)}
                assert list(got) == list(range(len(got))), f"{topic}: offsets not contiguous: {sorted(got)}"
                for offset, payload in messages.items():
                    assert got.get(offset) == payload, f"{topic}: acknowledged offset {offset} lost or changed"
                assert wal.next_offset > max(messages), f"{topic}: an acknowledged offset would be handed out again"
            finally:
                wal.close()
    finally:
        group.close()


@pytest.mark.parametrize("landed", ["frames", "marker"])
@pytest.mark.parametrize("crash", ["power loss", "sigkill"])
def test_a_topic_reopened_after_a_failed_write_leaves_a_root_that_restarts(landed: str, crash: str) -> None:
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=HELD_CHECKPOINTS)
    a = WriteAheadLog.open(ROOT, "ns/a", group=group)
    b = WriteAheadLog.open(ROOT, "ns/b", group=group)  # a bystander on the same journal
    acked: dict[str, dict[int, bytes]] = {"a": {}, "b": {}}
    _fill(a, "a", 0, 5, acked["a"])
    _fill(b, "b", 0, 5, acked["b"])

    # frames: the round marker and every frame but the last land whole; marker: only the
    # 16-byte round marker and a few bytes of the first frame do.
    _short_write_once(fs, f"{ROOT}/ns/a/00000000000000000000.seg", keep=None if landed == "frames" else 21)
    a.append_batch([b"never-acked-1", b"never-acked-2", b"never-acked-3"])
    with pytest.raises(WalError):
        a.flush(5)
    assert a.failed and not group.failed, "a write error fails its own topic only"
    a.close()

    a = WriteAheadLog.open(ROOT, "ns/a", group=group)  # the host reloads it in the same group
    _fill(a, "a", a.next_offset, 3, acked["a"])
    _fill(b, "b", 5, 1, acked["b"])

    # No checkpoint happened: the journal is the only durable copy of every round.
    image = fs.crash_image() if crash == "power loss" else fs.crash_image_pages(lambda _p, pages: pages, keep_size=True)
    a.close()
    b.close()
    group.close()
    _check_acknowledged(image, acked)


def test_a_failed_round_that_cannot_be_cut_back_fails_the_whole_group() -> None:
    """If even the truncation fails, the file may keep the failed round: only a restart's
    replay can vouch for the root again, so the group stops acknowledging anything."""
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=HELD_CHECKPOINTS)
    a = WriteAheadLog.open(ROOT, "ns/a", group=group)
    b = WriteAheadLog.open(ROOT, "ns/b", group=group)
    acked: dict[str, dict[int, bytes]] = {"a": {}, "b": {}}
    _fill(a, "a", 0, 3, acked["a"])
    _fill(b, "b", 0, 3, acked["b"])

    def truncate_fails(path: str, size: int) -> None:
        raise OSError(errno.EIO, "Input/output error (injected)")

    fs.truncate = truncate_fails  # type: ignore[method-assign]
    _short_write_once(fs, f"{ROOT}/ns/a/00000000000000000000.seg", keep=None)
    a.append(b"never-acked")
    with pytest.raises(WalError):
        a.flush(5)
    assert group.failed
    # Nothing is acknowledged any more, in any topic of the group: an append to another
    # topic is refused, or (if the group's failure has not reached that topic yet) never
    # becomes durable.
    with pytest.raises(WalError):
        b.append(b"after the group failed")
        b.flush(5)
    assert b.durable_offset == max(acked["b"])
    del fs.truncate
    image = fs.crash_image()
    for wal in (a, b):
        try:
            wal.close()
        except WalError:
            pass  # closing a WAL of a failed group says so
    group.close()
    _check_acknowledged(image, acked)


def test_a_spare_journal_file_the_checkpointer_cannot_prepare_does_not_fail_the_group(caplog) -> None:
    fs = FaultFs()
    tried = threading.Event()
    real_prepare = Journal._prepare

    def prepare(journal: Journal, sequence: int):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.startswith("wal-journal-checkpoint"):
            tried.set()
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real_prepare(journal, sequence)

    caplog.set_level(logging.WARNING, logger="wal.journal")
    Journal._prepare = prepare  # type: ignore[method-assign]
    try:
        config = JournalConfig(file_bytes=4096, checkpoint_interval_s=3600, checkpoint_bytes=1 << 30)
        group = CommitGroup(ROOT, fs, journal=config)
        assert tried.wait(30), "the checkpointer prepares a spare file when it starts"
        wal = WriteAheadLog.open(ROOT, "ns/a", group=group)
        acked: dict[int, bytes] = {}
        for i in range(40):  # several journal files: each switch prepares its file itself
            _fill(wal, "a", i * 10, 10, acked)
        assert not group.failed and not wal.failed
        assert group.journal is not None and group.journal._writer.sequence > 1, "the journal moved on"
        assert "preparing the next journal file failed" in caplog.text
        wal.close()
        group.close()
    finally:
        Journal._prepare = real_prepare  # type: ignore[method-assign]


def test_a_checkpoint_record_that_cannot_be_written_does_not_fail_the_group() -> None:
    """On a full disk the checkpoint's record (a new file) cannot be written; the segment
    files it synced stay synced and the older checkpoint stands, so nothing is at risk:
    the group goes on, and a later checkpoint records it."""
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=HELD_CHECKPOINTS)
    wal = WriteAheadLog.open(ROOT, "ns/a", group=group)
    acked: dict[int, bytes] = {}
    _fill(wal, "a", 0, 5, acked)
    assert group.journal is not None
    fs.disk_full = True
    assert group.journal.checkpoint() is False
    fs.disk_full = False
    assert not group.failed and not wal.failed
    _fill(wal, "a", 5, 5, acked)
    assert group.journal.checkpoint() is True
    image = fs.crash_image()
    wal.close()
    group.close()
    _check_acknowledged(image, {"a": acked})


def test_a_long_run_of_checkpoint_record_failures_holds_producers_back_and_loses_nothing(monkeypatch) -> None:
    """While no checkpoint record can be written (a disk that stays full), the journal
    cannot move past the last one: it stays within ``files_max`` files, the group waits
    for room before each round, and producers feel it as backpressure (appends time out
    once ``pending_bytes_max`` is pending; nothing is acknowledged that was not journaled).
    Once records are written again, every appended message becomes durable."""
    import wal.journal as wal_journal
    from wal.config import WalConfig
    from wal.errors import WalTimeout

    fs = FaultFs()
    config = JournalConfig(file_bytes=64 * 1024, checkpoint_bytes=16 * 1024, checkpoint_interval_s=0.05, files_max=2)
    real_write_checkpoint = wal_journal.write_checkpoint
    records_fail = threading.Event()  # set once the group runs (its start writes a record)

    def write_checkpoint(fs_, directory, state, name=None):  # type: ignore[no-untyped-def]
        if name == "wal.ckpt" and directory.endswith(".journal") and records_fail.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_checkpoint(fs_, directory, state, **({"name": name} if name else {}))

    monkeypatch.setattr(wal_journal, "write_checkpoint", write_checkpoint)
    group = CommitGroup(ROOT, fs, journal=config)
    assert group.journal is not None
    wal = WriteAheadLog.open(ROOT, "ns/a", group=group,
                             config=WalConfig(max_message_bytes=4096, pending_bytes_max=32 * 1024,
                                               append_timeout_s=0.05))
    records_fail.set()
    appended: dict[int, bytes] = {}
    timeouts = 0
    payload = b"p" * 1000
    # Append until the producer is held back: the journal fills its files_max files, the
    # group waits for a checkpoint that cannot be recorded, pending bytes reach the bound.
    for i in range(100_000):
        try:
            appended[wal.append(payload + b"%d" % i)] = payload + b"%d" % i
        except WalTimeout:
            timeouts += 1
            if timeouts >= 3:
                break
    assert timeouts >= 3, "the producer was never held back"
    durable_while_held = wal.durable_offset
    assert durable_while_held is not None and durable_while_held < max(appended), \
        "appends past the journal's room were acknowledged"
    journal_files = [n for n in fs.listdir(f"{ROOT}/.journal") if n.endswith(".jnl")]
    assert len(journal_files) <= config.files_max + 1, journal_files  # + the spare prepared ahead
    assert not group.failed and not wal.failed, "a checkpoint record that cannot be written fails nothing"
    records_fail.clear()
    wal.flush(60)  # room again: everything appended becomes durable
    assert wal.durable_offset == max(appended)
    image = fs.crash_image()
    wal.close()
    group.close()
    _check_acknowledged(image, {"a": appended})
