"""A journaled group's start makes the root durable with one syncfs (wal.journal._settle_segments).

The promises: after a restart, every offset a WAL's open recovered (acknowledged or not:
readers may be served it from then on) survives a later power loss, although the open
synced none of the WAL's files itself; the checkpoint that open writes unsynced never
leaves ``wal.ckpt`` without a durable valid slot, whatever opens it next (another group,
a standalone WAL); and a settle that cannot vouch for a file (it failed, or the file
changed since) leaves each WAL to sync its own files.
"""
from __future__ import annotations

import os
import random

import pytest

from tests.wal.helpers import GROUP_ROOT, group_topic, payload_for, read_all, small_config, wait_until
from wal import WriteAheadLog
from wal.checkpoint import CHECKPOINT_NAME, read_checkpoint
from wal.group import CommitGroup
from wal.journal import JournalConfig
from wal.testing import FaultFs
from wal.testing import faultfs as faultfs_module

NO_CHECKPOINTS = JournalConfig(file_bytes=1 << 20, checkpoint_bytes=1 << 30, checkpoint_interval_s=3600.0)
TOPICS = 4


def _directory(index: int) -> str:
    return os.path.join(GROUP_ROOT, group_topic(index).lstrip("/"))


def _inode(fs: FaultFs, path: str) -> "faultfs_module._Inode":
    return fs._dirs[os.path.dirname(path)][os.path.basename(path)]


def _unsynced(fs: FaultFs, path: str) -> bool:
    inode = _inode(fs, path)
    return bytes(inode.data) != inode.durable


@pytest.fixture()
def checkpoint_writes(monkeypatch):
    """Every positioned write of a ``wal.ckpt`` on any FaultFs (crash images too): how many,
    and those made while the file still held unsynced bytes (an earlier unsynced slot)."""
    seen = {"writes": 0, "over_unsynced": []}
    original = FaultFs._pwrite

    def pwrite(self, inode, chunks, position, closed):
        for path, entries in self._dirs.items():
            for name, entry in entries.items():
                if entry is inode and name == CHECKPOINT_NAME:
                    seen["writes"] += 1
                    if bytes(inode.data) != inode.durable:
                        seen["over_unsynced"].append(os.path.join(path, name))
        return original(self, inode, chunks, position, closed)

    monkeypatch.setattr(FaultFs, "_pwrite", pwrite)
    return seen


def _crashed_with_unsynced_tails(config, seed: int) -> tuple[FaultFs, list[int]]:
    """A root whose journaled group ran and closed, then whose topics were each appended by
    a standalone WAL whose last round's sync never returned, then SIGKILLed: every topic's
    segment ends with a round that is in no journal and was never synced (a crash image
    that keeps the page cache). Returns it and what each topic had acknowledged."""
    rng = random.Random(seed)
    fs = FaultFs()
    group = CommitGroup(GROUP_ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [WriteAheadLog.open(GROUP_ROOT, group_topic(i), config, fs=fs, group=group) for i in range(TOPICS)]
    for wal in wals:
        for _ in range(rng.randrange(1, 20)):
            wal.append(payload_for(wal.next_offset))
        wal.flush(30.0)
        wal.close()
    group.close()
    standalone = [WriteAheadLog.open(GROUP_ROOT, group_topic(i), config, fs=fs) for i in range(TOPICS)]
    acked = []
    for wal in standalone:
        for _ in range(rng.randrange(0, 10)):
            wal.append(payload_for(wal.next_offset))
        wal.flush(30.0)
        acked.append(wal.next_offset - 1)
    fs.hold_syncs()
    try:
        for wal in standalone:
            wal.append_batch([payload_for(wal.next_offset + k) for k in range(rng.randrange(1, 4))])
        wait_until(lambda: fs.syncs_waiting >= TOPICS)
        image = fs.process_crash_image()
    finally:
        fs.release_syncs()
        for wal in standalone:
            wal.close()
    for index in range(TOPICS):
        segments = sorted(n for n in image.listdir(_directory(index)) if n.endswith(".seg"))
        assert _unsynced(image, os.path.join(_directory(index), segments[-1])), "the setup left no unsynced round"
    return image, acked


def _check_after_power_loss(image: FaultFs, config, recovered: list) -> None:
    """Every WAL opens again on ``image`` (a power loss) holding what the restart recovered."""
    after = CommitGroup(GROUP_ROOT, image, journal=NO_CHECKPOINTS)
    try:
        for index in range(TOPICS):
            wal = WriteAheadLog.open(GROUP_ROOT, group_topic(index), config, fs=image, group=after)
            assert [(r.offset, r.payload) for r in read_all(wal)] == recovered[index], (
                "an offset the restart recovered (and could have served) was lost or changed")
            wal.close()
    finally:
        after.close()


@pytest.mark.parametrize("seed", range(8))
def test_offsets_recovered_at_a_restart_survive_a_later_power_loss(seed, checkpoint_writes):
    config = small_config(segment_bytes_max=random.Random(seed).choice((4096, 1 << 20)))
    fs, acked = _crashed_with_unsynced_tails(config, seed)
    group = CommitGroup(GROUP_ROOT, fs, journal=NO_CHECKPOINTS)
    assert fs.syncfs_calls == 1, "the group's start made the root durable with one syncfs"
    syncs_before = fs.sync_calls
    wals = [WriteAheadLog.open(GROUP_ROOT, group_topic(i), config, fs=fs, group=group) for i in range(TOPICS)]
    recovered = [[(r.offset, r.payload) for r in read_all(wal)] for wal in wals]
    for index, wal in enumerate(wals):
        assert wal.next_offset > acked[index] + 1, "the open kept the unacknowledged round it found"
        # Written in place and left unsynced: the settle made the slot it keeps durable.
        assert _unsynced(fs, os.path.join(_directory(index), CHECKPOINT_NAME))
    assert fs.sync_calls == syncs_before, "the opens synced no file of their own"
    # A power loss now, before anything else is synced: every unsynced byte dropped, or
    # dirty pages persisted in any order.
    images = [fs.crash_image(), fs.random_crash_image(random.Random(seed), page_bytes=512)]
    for wal in wals:
        wal.close()
    group.close()
    for image in images:
        _check_after_power_loss(image, config, recovered)
    assert not checkpoint_writes["over_unsynced"], "a checkpoint slot was written while the other was unsynced"


def test_the_write_after_an_unsynced_open_checkpoint_syncs_it_first(checkpoint_writes):
    """Whoever writes ``wal.ckpt`` next (the same WAL's close or rotation, or after a
    SIGKILL a standalone WAL) first makes the unsynced slot durable, so a power loss
    tearing the new write still finds a valid slot."""
    config = small_config(segment_bytes_max=4096)
    fs, _acked = _crashed_with_unsynced_tails(config, seed=1)
    group = CommitGroup(GROUP_ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [WriteAheadLog.open(GROUP_ROOT, group_topic(i), config, fs=fs, group=group) for i in range(TOPICS)]
    ckpts = [os.path.join(_directory(i), CHECKPOINT_NAME) for i in range(TOPICS)]
    assert all(_unsynced(fs, path) for path in ckpts)
    killed = fs.process_crash_image()  # SIGKILL with the open checkpoints unsynced
    # Topic 0 rotates (a checkpoint write) and closes in this process.
    while wals[0].segments()[-1].base_offset == wals[0].segments()[0].base_offset:
        wals[0].append(payload_for(wals[0].next_offset, size=1024))
    wals[0].flush(30.0)
    for wal in wals:
        wal.close()
    group.close()
    assert not any(_unsynced(fs, path) for path in ckpts), "a close leaves its checkpoint synced"
    # After the SIGKILL: a standalone open of each topic (the root's journal is replayed
    # first; nothing in it), which records its recovered tip.
    for index in range(TOPICS):
        wal = WriteAheadLog.open(GROUP_ROOT, group_topic(index), config, fs=killed)
        for _ in range(3):
            wal.append(payload_for(wal.next_offset))
        wal.flush(30.0)
        wal.close()
        image = killed.random_crash_image(random.Random(index), page_bytes=512)
        assert read_checkpoint(image, _directory(index)) is not None
    assert checkpoint_writes["writes"] > 2 * TOPICS
    assert not checkpoint_writes["over_unsynced"], "a checkpoint slot was written while the other was unsynced"


def test_a_file_written_after_the_settle_is_synced_by_its_open():
    """The settle vouches for a file at the size it had: one that grew since (a WAL that
    ran from before the group and appended after it started) is synced at the open."""
    config = small_config()
    fs, _acked = _crashed_with_unsynced_tails(config, seed=2)
    directory = _directory(0)
    path = os.path.join(directory, sorted(n for n in fs.listdir(directory) if n.endswith(".seg"))[-1])
    inode = _inode(fs, path)
    unsynced_round = bytes(inode.data[inode.dirty_from:])
    fs.truncate(path, inode.dirty_from)  # the round is not there when the group starts...
    group = CommitGroup(GROUP_ROOT, fs, journal=NO_CHECKPOINTS)
    try:
        handle = fs.open_append(path)  # ...and is appended after the settle, unsynced
        handle.write([unsynced_round])
        handle.close()
        assert _unsynced(fs, path)
        wal = WriteAheadLog.open(GROUP_ROOT, group_topic(0), config, fs=fs, group=group)
        assert wal.segments()[-1].size_bytes == len(inode.data), "recovery kept the round"
        assert not _unsynced(fs, path), "the open synced the file the settle did not vouch for"
        wal.close()
        # A directory's record is taken by its first open: a reopen syncs as usual.
        assert group.journal is not None and group.journal.take_settled(directory) is None
    finally:
        group.close()


def test_a_failed_settle_leaves_every_open_to_sync_its_own_files(monkeypatch):
    """A settle whose syncfs fails vouches for nothing: each open syncs its own tail and
    writes its checkpoint synced, and what it recovered survives a power loss."""
    config = small_config()
    fs, _acked = _crashed_with_unsynced_tails(config, seed=3)

    def failing(_self):
        raise OSError(5, "injected syncfs failure")
    monkeypatch.setattr(faultfs_module._FaultSyncHandle, "sync", failing)
    group = CommitGroup(GROUP_ROOT, fs, journal=NO_CHECKPOINTS)
    monkeypatch.undo()
    before = fs.sync_calls
    wals = [WriteAheadLog.open(GROUP_ROOT, group_topic(i), config, fs=fs, group=group) for i in range(TOPICS)]
    assert fs.sync_calls - before >= 2 * TOPICS, "each open synced its tail and its checkpoint"
    assert not any(_unsynced(fs, os.path.join(_directory(i), CHECKPOINT_NAME)) for i in range(TOPICS))
    recovered = [[(r.offset, r.payload) for r in read_all(wal)] for wal in wals]
    image = fs.crash_image()
    for wal in wals:
        wal.close()
    group.close()
    after = CommitGroup(GROUP_ROOT, image, journal=NO_CHECKPOINTS)
    try:
        for index in range(TOPICS):
            wal = WriteAheadLog.open(GROUP_ROOT, group_topic(index), config, fs=image, group=after)
            assert [(r.offset, r.payload) for r in read_all(wal)] == recovered[index]
            wal.close()
    finally:
        after.close()


def test_a_checkpoint_write_that_failed_leaves_the_next_one_to_sync_first(checkpoint_writes):
    """A slot written whose sync failed may still be what the file's readers see: the next
    write (retention tried again) must not write over the other slot until it is synced."""
    fs = FaultFs()
    wal = WriteAheadLog.open(GROUP_ROOT, group_topic(0), small_config(segment_bytes_max=4096), fs=fs)
    try:
        while len(wal.segments()) < 4:
            wal.append(payload_for(wal.next_offset, size=1024))
        wal.flush(30.0)
        cut = wal.segments()[2].base_offset
        fs.fail_sync_after = fs.sync_calls  # the checkpoint's sync, after its first slot's write
        with pytest.raises(OSError):
            wal.truncate_before(cut)
        fs.fail_sync_after = None
        assert wal.truncate_before(cut) == 2
    finally:
        wal.close()
    assert checkpoint_writes["writes"] >= 3
    assert not checkpoint_writes["over_unsynced"], "a checkpoint slot was written while the other was unsynced"


@pytest.mark.parametrize("case", ["topic on another volume", "namespace on another volume",
                                  "syncfs is no flush"])
def test_what_the_settle_syncfs_cannot_reach_is_synced_by_each_open(case):
    """atk73 F1: a syncfs of the root does not reach a WAL directory on another volume
    mounted under the root, and on FUSE it flushes nothing: those WALs sync their own
    recovered tail and checkpoint at their open, and keep what they recovered."""
    config = small_config()
    fs, _acked = _crashed_with_unsynced_tails(config, seed=4)
    if case == "syncfs is no flush":
        fs.syncfs_flushes = False
        elsewhere = list(range(TOPICS))
    elif case == "topic on another volume":
        fs.other_volumes.add(_directory(1))
        elsewhere = [1]
    else:
        fs.other_volumes.add(os.path.dirname(_directory(0)))  # every topic shares the namespace
        elsewhere = list(range(TOPICS))
    group = CommitGroup(GROUP_ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [WriteAheadLog.open(GROUP_ROOT, group_topic(i), config, fs=fs, group=group) for i in range(TOPICS)]
    recovered = [[(r.offset, r.payload) for r in read_all(wal)] for wal in wals]
    for index in range(TOPICS):
        ckpt = os.path.join(_directory(index), CHECKPOINT_NAME)
        assert _unsynced(fs, ckpt) == (index not in elsewhere), "only a settled directory's checkpoint is left unsynced"
    fs.other_volumes.clear()  # the power loss below drops every unsynced byte, on any volume
    _check_after_power_loss(fs.crash_image(), config, recovered)
    for wal in wals:
        wal.close()
    group.close()


def test_a_syncfs_group_refuses_what_its_syncfs_cannot_reach():
    from wal.errors import SyncNotCovered
    fs = FaultFs()
    fs.makedirs(os.path.join(GROUP_ROOT, "other"))
    fs.other_volumes.add(os.path.join(GROUP_ROOT, "other"))
    group = CommitGroup(GROUP_ROOT, fs)
    try:
        with pytest.raises(SyncNotCovered):
            WriteAheadLog.open(GROUP_ROOT, "/other/t", small_config(), fs=fs, group=group)
        WriteAheadLog.open(GROUP_ROOT, "/ns/t", small_config(), fs=fs, group=group).close()
    finally:
        group.close()
    fs.syncfs_flushes = False
    with pytest.raises(SyncNotCovered):
        CommitGroup(GROUP_ROOT, fs)


def test_a_wal_id_found_under_two_names_is_not_settled():
    """atk74 F1: one directory reached under two names (a symlinked namespace; on FaultFs,
    a copy) got a record per name; a reopen through the second name trusted a checkpoint
    slot the first open left unsynced. Neither name is recorded now."""
    config = small_config()
    fs, _acked = _crashed_with_unsynced_tails(config, seed=5)
    source = _directory(0)
    alias = os.path.join(GROUP_ROOT, "alias", os.path.basename(source))
    fs.makedirs(alias)
    for name in fs.listdir(source):
        handle = fs.open_append(os.path.join(alias, name))
        handle.write([fs.read_all(os.path.join(source, name))])
        handle.close()
    group = CommitGroup(GROUP_ROOT, fs, journal=NO_CHECKPOINTS)
    try:
        assert group.journal is not None
        assert group.journal.take_settled(source) is None and group.journal.take_settled(alias) is None
        assert group.journal.take_settled(_directory(1)) is not None  # the others are
    finally:
        group.close()
