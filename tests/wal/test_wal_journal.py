"""The shared journal (wal/journal.py, format: native/journal_format.py).

The promises: every offset acknowledged to any topic of a journaled group survives a power
loss at any moment (the journal's unsynced tail and the segments' unsynced rounds torn in
any page order), every WAL opens again; a topic deleted (or deleted and created again) is
never resurrected by a replay; damage to a journal round that had been synced is refused
with nothing touched; a checkpoint or journal sync failure fails every topic closed and
loses nothing acknowledged; checkpoints keep the journal bounded whatever the idle topics;
a closed WAL never needs the journal; one journal per root, one opener at a time.
"""
from __future__ import annotations

import contextlib
import errno
import dataclasses
import os
import random
import threading
import time

import pytest

from native.journal_format import JOURNAL_DIR, parse_journal_file_name
from tests.wal.helpers import (Acks as _Acks, check_payload, check_recovered as _check_recovered,
                              group_topic as _topic, open_in_group as _open, payload_for, read_all, small_config,
                              wait_until as _wait_until)
from wal import WalFailed, WriteAheadLog
from wal.errors import CorruptLog, WalLocked, WalTimeout
from wal.group import CommitGroup
from wal.identity import WAL_ID_NAME
from wal.journal import Journal, JournalConfig
from wal.testing import FaultFs

ROOT = "/wal"
JOURNAL = os.path.join(ROOT, JOURNAL_DIR)
# Small files and frequent checkpoints: the runs below cross many file switches, recycles
# and checkpoints.
SMALL_JOURNAL = JournalConfig(file_bytes=16 * 1024, checkpoint_bytes=8 * 1024, checkpoint_interval_s=0.02)
# No checkpoint unless asked: the journal holds every round written.
NO_CHECKPOINTS = JournalConfig(file_bytes=1 << 20, checkpoint_bytes=1 << 30, checkpoint_interval_s=3600.0)


def _journal_files(fs: FaultFs) -> list[int]:
    return sorted(s for s in map(parse_journal_file_name, fs.listdir(JOURNAL)) if s is not None)


def test_many_topics_sharing_a_journal_survive_power_loss_at_random_points():
    topics = 10
    images = held = rejoined = 0
    for seed in range(30):
        rng = random.Random(seed)
        config = small_config(segment_bytes_max=rng.choice((4096, 16 * 1024, 1 << 20)), max_message_bytes=16 * 1024)
        journal = rng.choice((SMALL_JOURNAL, NO_CHECKPOINTS,
                              JournalConfig(file_bytes=4096 * 16, checkpoint_bytes=2048, checkpoint_interval_s=0.001)))
        fs = FaultFs()
        # How checkpoints sync the segment files: one syncfs of the root's file system, or
        # each file's fdatasync where that syncfs would not reach them all (a file system
        # whose syncfs does not flush; a topic on another volume mounted under the root).
        checkpoints_by = rng.choice(("syncfs", "fdatasync", "a topic elsewhere"))
        fs.syncfs_flushes = checkpoints_by != "fdatasync"
        if checkpoints_by == "a topic elsewhere":
            fs.other_volumes.add(os.path.join(ROOT, "ns", "t0"))
        journal = dataclasses.replace(journal, syncfs_min_files=1)  # 10 topics: below the default
        appended: list[dict[int, bytes]] = [{} for _ in range(topics)]
        acked = [-1] * topics
        for incarnation in range(3):
            group = CommitGroup(ROOT, fs, journal=journal)
            acks = _Acks(topics)
            wals = [_open(fs, group, i, config, acks) for i in range(topics)]
            for i, wal in enumerate(wals):
                _check_recovered(wal, acked[i], appended[i])
            for step in range(rng.randrange(5, 150)):
                i = rng.randrange(topics)
                if rng.random() < 0.04:  # a topic leaves mid-run and joins again
                    wals[i].close()
                    wals[i] = _open(fs, group, i, config, acks)
                    _check_recovered(wals[i], acks.snapshot()[i], appended[i])
                    rejoined += 1
                    continue
                first = wals[i].next_offset
                batch = [payload_for(first + k, incarnation, rng.choice((5, 80, 700, 3000)))
                         for k in range(rng.randrange(1, 5))]
                assert wals[i].append_batch(batch) == first
                appended[i].update(zip(range(first, first + len(batch)), batch))
                if rng.random() < 0.1:
                    wals[i].flush()
                if rng.random() < 0.02:
                    group.journal.checkpoint()  # a checkpoint racing the rounds
            if rng.random() < 0.5:
                acked = acks.snapshot()  # acknowledged before the image, so synced before it
                image = fs.random_crash_image(rng) if rng.random() < 0.7 else fs.crash_image(
                    rng.randrange(0, 3000), bytes(rng.randrange(0, 64)))
            else:
                # In the middle of a round: written to several topics' segments and to the
                # journal, its fdatasync in flight.
                fs.hold_syncs()
                try:
                    for i in rng.sample(range(topics), 4):
                        first = wals[i].next_offset
                        batch = [payload_for(first + k, incarnation, 1500) for k in range(3)]
                        assert wals[i].append_batch(batch) == first
                        appended[i].update(zip(range(first, first + len(batch)), batch))
                    _wait_until(lambda: fs.syncs_waiting >= 1)
                    acked = acks.snapshot()
                    image = fs.random_crash_image(rng)
                    held += 1
                finally:
                    fs.release_syncs()
            for wal in wals:
                wal.close()
            group.close()
            images += 1
            fs = image
        # Replayed by a standalone opener as well as by a group (the loop above).
        for i in range(topics):
            wal = _open(fs, None, i, config)
            _check_recovered(wal, acked[i], appended[i])
            wal.close()
    assert images == 90 and held >= 25 and rejoined >= 20, (images, held, rejoined)


def test_one_journal_fdatasync_per_round_whatever_the_number_of_topics():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [_open(fs, group, i, small_config(segment_bytes_max=1 << 20)) for i in range(100)]
    before_all, before_fs = fs.sync_calls, fs.syncfs_calls
    fs.hold_syncs()
    try:
        wals[0].append(b"first")  # round 1: its sync is held
        _wait_until(lambda: fs.syncs_waiting == 1)
        for wal in wals:
            wal.append(b"x" * 100)  # all of these form round 2
    finally:
        fs.release_syncs()
    for wal in wals:
        wal.flush()
    assert fs.sync_calls - before_all == 2, "100 topics' rounds need one journal fdatasync each round"
    assert fs.syncfs_calls == before_fs, "and no syncfs"
    assert [w.durable_offset for w in wals] == [1] + [0] * 99
    for wal in wals:
        wal.close()
    group.close()


def test_a_deleted_topic_is_never_resurrected_by_a_replay():
    fs = FaultFs()
    config = small_config()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    old = _open(fs, group, 0, config)
    keeper = _open(fs, group, 1, config)
    for n in range(20):
        old.append(payload_for(n, 1))
        keeper.append(payload_for(n, 1))
    old.flush()
    keeper.flush()
    old.close()
    old.delete()  # sealed and moved away: its rounds are still in the journal
    image_deleted = fs.crash_image()
    # Created again at the same path while the old instance's rounds are in the journal.
    new = _open(fs, group, 0, config)
    assert new.next_offset == 0
    for n in range(3):
        new.append(payload_for(n, 2))
    new.flush()
    keeper.flush()
    image_recreated = fs.random_crash_image(random.Random(7))
    new.close()
    keeper.close()
    group.close()

    group = CommitGroup(ROOT, image_deleted, journal=NO_CHECKPOINTS)
    assert group.journal.replayed.skipped_entries > 0, "the deleted WAL's entries were seen and skipped"
    assert not image_deleted.exists(os.path.join(ROOT, "ns", "t0")), "the deleted WAL came back"
    kept = _open(image_deleted, group, 1, config)
    assert [check_payload(r.payload) for r in read_all(kept)] == [(n, 1) for n in range(20)]
    kept.close()
    group.close()

    group = CommitGroup(ROOT, image_recreated, journal=NO_CHECKPOINTS)
    wal = _open(image_recreated, group, 0, config)
    assert [check_payload(r.payload) for r in read_all(wal)] == [(n, 2) for n in range(3)], \
        "the re-created WAL holds only its own messages"
    wal.close()
    group.close()


def test_damage_to_a_synced_journal_round_is_refused_and_nothing_is_touched():
    fs = FaultFs()
    config = small_config(segment_bytes_max=1 << 20)
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [_open(fs, group, i, config) for i in range(3)]
    for n in range(6):  # six rounds, each synced before the next
        for wal in wals:
            wal.append(payload_for(n, 0, 500))
        for wal in wals:
            wal.flush()
    # The power goes while a seventh round's journal sync is held.
    fs.hold_syncs()
    try:
        for wal in wals:
            wal.append(payload_for(6, 0, 500))
        _wait_until(lambda: fs.syncs_waiting == 1)
        image = fs.random_crash_image(random.Random(3))
    finally:
        fs.release_syncs()
    for wal in wals:
        wal.close()
    group.close()
    # Flip one byte inside the third round's frames: that round was synced (later rounds
    # follow it), so this is corruption, not a torn tail.
    needle = payload_for(2, 0, 500)[8:40]
    path = next(p for p in (os.path.join(JOURNAL, f"{s:020d}.jnl") for s in _journal_files(image))
                if needle in image.read_all(p))
    data = bytearray(image.read_all(path))
    target = data.index(needle)
    data[target] ^= 0x40
    _overwrite(image, path, bytes(data))
    segments = _segment_bytes(image)
    with pytest.raises(CorruptLog, match="had been synced"):
        CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
    with pytest.raises(CorruptLog):
        _open(image, None, 0, config)  # a standalone opener replays, so it refuses too
    assert _segment_bytes(image) == segments, "a refused replay wrote nothing"


def test_a_torn_last_journal_round_is_ignored_whatever_its_bytes():
    for seed in range(40):
        rng = random.Random(seed)
        fs = FaultFs()
        config = small_config(segment_bytes_max=1 << 20)
        group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
        wals = [_open(fs, group, i, config) for i in range(4)]
        for n in range(5):
            for wal in wals:
                wal.append(payload_for(n, 0, rng.choice((10, 900, 5000))))
            for wal in wals:
                wal.flush()
        fs.hold_syncs()
        try:
            for wal in wals:
                wal.append_batch([payload_for(5 + k, 0, 3000) for k in range(3)])
            _wait_until(lambda: fs.syncs_waiting == 1)
            image = fs.random_crash_image(rng)
        finally:
            fs.release_syncs()
        for wal in wals:
            wal.close()
        group.close()
        group = CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
        for i in range(4):
            wal = _open(image, group, i, config)
            got = [check_payload(r.payload)[0] for r in read_all(wal)]
            assert got[:5] == list(range(5)) and got == list(range(len(got))), (seed, i, got)
            wal.close()
        group.close()


def test_checkpoints_keep_the_journal_bounded_and_idle_topics_pin_nothing():
    fs = FaultFs()
    config = small_config(segment_bytes_max=64 * 1024)
    journal = JournalConfig(file_bytes=32 * 1024, checkpoint_bytes=16 * 1024, checkpoint_interval_s=3600.0)
    group = CommitGroup(ROOT, fs, journal=journal)
    idle = [_open(fs, group, i, config) for i in range(1, 51)]
    for wal in idle:
        wal.append(payload_for(0))  # written once, then never again
        wal.flush()
    busy = _open(fs, group, 0, config)
    most = 0
    for n in range(600):
        busy.append(payload_for(n, 0, 1000))
        if n % 5 == 0:
            busy.flush()
            most = max(most, len(_journal_files(fs)))
    busy.flush()
    # About 650 KiB went through 32 KiB journal files, at most 4 of them kept: at least 16
    # files were recycled, and one checkpoint frees at most 3, so at least 6 checkpoints
    # ran. (More are asked for, one per 16 KiB, but requests made while one runs are
    # answered by the next: how many depends on the machine's speed.)
    assert group.journal.checkpoints >= 6, group.journal.checkpoints
    assert most <= 4, f"the journal kept {most} files: something pins it"
    image = fs.random_crash_image(random.Random(1))
    for wal in [busy, *idle]:
        wal.close()
    group.close()
    group = CommitGroup(ROOT, image, journal=journal)
    assert group.journal.replayed.bytes < 64 * 1024, "replay is bounded by the checkpoint, not the history"
    wal = _open(image, group, 0, config)
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(600))
    wal.close()
    for i in range(1, 51):
        wal = _open(image, group, i, config)
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == [0]
        wal.close()
    group.close()


@pytest.mark.parametrize("by_syncfs", [False, True], ids=["fdatasync-each", "one-syncfs"])
def test_a_checkpoint_sync_failure_fails_every_topic_closed_and_loses_nothing(by_syncfs: bool):
    """A checkpoint syncs its segment files one by one, or, where one syncfs of the root's
    file system reaches them all, with that syncfs (``Journal._sync_by_syncfs``). Either
    failing fails the group; a topic whose file may have lost pages must not close as if
    its files were durable without the journal: the one whose fdatasync failed, or every
    one the failed syncfs covered (it cannot say which)."""
    fs = FaultFs()
    fs.syncfs_flushes = by_syncfs
    config = small_config(segment_bytes_max=1 << 20)
    group = CommitGroup(ROOT, fs, journal=dataclasses.replace(NO_CHECKPOINTS, syncfs_min_files=1))
    wals = [_open(fs, group, i, config) for i in range(3)]
    for n in range(10):
        for wal in wals:
            wal.append(payload_for(n))
        for wal in wals:
            wal.flush()
    fs.fail_sync_after = fs.sync_calls  # the checkpoint's first segment sync (or its syncfs) fails
    with pytest.raises(OSError):
        group.journal.checkpoint()
    group.journal._fail(OSError("injected"))  # what the checkpointer thread does with it
    for wal in wals:
        _wait_until(lambda: wal.failed)
        with pytest.raises(WalFailed):
            wal.append(b"more")
    assert group.failed
    refused = []
    for wal in wals:
        try:
            wal.close()
        except WalFailed:
            refused.append(wal)  # its segment file failed to sync: it still needs the journal
    assert len(refused) == (3 if by_syncfs else 1), "the topics whose files may have lost pages close unclean"
    group.close()
    fs.fail_sync_after = None
    image = fs.random_crash_image(random.Random(5))
    group = CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
    for i in range(3):
        wal = _open(image, group, i, config)
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(10))
        wal.close()
    group.close()


class _CountingSyncfs:
    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def sync(self) -> None:
        self.calls += 1
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


def _checkpoint_with_spy(group: CommitGroup) -> int:
    """Run a checkpoint; how many syncfs calls it made."""
    spy = group.journal._syncfs = _CountingSyncfs(group.journal._syncfs)
    assert group.journal.checkpoint()
    return spy.calls


@pytest.mark.parametrize("topics,min_files,expected", [(5, 1, 1), (5, 5, 1), (5, 6, 0)])
def test_a_checkpoint_uses_one_syncfs_from_its_file_threshold_on(topics: int, min_files: int, expected: int):
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=dataclasses.replace(NO_CHECKPOINTS, syncfs_min_files=min_files))
    wals = [_open(fs, group, i, small_config()) for i in range(topics)]
    for wal in wals:
        wal.append(payload_for(0))
        wal.flush()
    assert _checkpoint_with_spy(group) == expected
    for wal in wals:
        wal.close()
    group.close()


def test_a_topic_deleted_since_the_last_checkpoint_leaves_the_others_on_one_syncfs():
    """A closed topic's file is synced already, and its path may be gone: it must not send
    every other topic's file back to its own fdatasync (atk80 F3). Nor may a file whose
    path retention removed since its first round."""
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=dataclasses.replace(NO_CHECKPOINTS, syncfs_min_files=1))
    wals = [_open(fs, group, i, small_config()) for i in range(4)]
    for wal in wals:
        wal.append(payload_for(0))
        wal.flush()
    wals[0].close()
    wals[0].delete()
    assert _checkpoint_with_spy(group) == 1
    for wal in wals[1:]:
        wal.append(payload_for(1))
        wal.flush()
    [segment] = wals[1].segments()
    fs.rename(segment.path, segment.path + ".moved")  # as if removed: where its pages go is unchanged
    assert _checkpoint_with_spy(group) == 1
    fs.rename(segment.path + ".moved", segment.path)
    for wal in wals[1:]:
        wal.close()
    group.close()


@pytest.mark.parametrize("release,reports", [("5.4.0-150-generic", False), ("5.8.0", False), ("5.16.20", False),
                                             ("5.17.0", True), ("6.1.0-28-amd64", True), ("6.18.2", True)])
def test_syncfs_is_trusted_only_on_kernels_that_report_every_error(monkeypatch, release: str, reports: bool):
    """From Linux 5.8 syncfs reports write-back errors, but until 5.17 it dropped the file
    system's own sync errors (a failed cache flush) that an fdatasync reports (atk80 F2):
    no commit group or checkpoint may stand on it there."""
    import platform

    from wal.fs import syncfs_reports_errors
    monkeypatch.setattr(platform, "release", lambda: release)
    assert syncfs_reports_errors() is reports


def test_a_journal_sync_failure_fails_every_topic_closed():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [_open(fs, group, i, small_config()) for i in range(3)]
    for wal in wals:
        wal.append(payload_for(0))
        wal.flush()
    fs.fail_sync_after = fs.sync_calls
    offset = wals[0].append(payload_for(1))
    with pytest.raises(WalFailed):
        wals[0].wait_durable(offset, 30.0)
    for wal in wals:
        _wait_until(lambda: wal.failed)
        assert wal.durable_offset == 0
    with pytest.raises(WalFailed):
        _open(fs, group, 9, small_config())
    for wal in wals:
        wal.close()
    group.close()


def test_a_closed_wal_never_needs_the_journal():
    fs = FaultFs()
    config = small_config(segment_bytes_max=2048)  # rotations: files a checkpoint has not synced yet
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, config)
    for n in range(60):
        wal.append(payload_for(n, 0, 300))
        wal.flush()
    assert len(wal.segments()) > 4
    wal.close()
    other = _open(fs, group, 1, config)
    other.append(payload_for(0))
    other.flush()
    image = fs.crash_image()  # every unsynced byte lost
    other.close()
    group.close()
    # Even with the whole journal gone, the closed WAL is whole (as after a quarantine,
    # which moves a closed WAL out of the root, where no replay looks).
    for name in image.listdir(JOURNAL):
        image.remove(os.path.join(JOURNAL, name))
    image.rmdir(JOURNAL)
    wal = _open(image, None, 0, config)
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(60))
    wal.close()


def test_a_topic_that_failed_alone_is_still_synced_when_it_closes():
    fs = FaultFs()
    config = small_config(segment_bytes_max=1 << 20)
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    broken, fine = _open(fs, group, 0, config), _open(fs, group, 1, config)
    for n in range(10):
        broken.append(payload_for(n))
        fine.append(payload_for(n))
    broken.flush()
    fine.flush()
    fs.disk_full = True  # the next segment write fails: that topic alone fails
    offset = broken.append(payload_for(10))
    with pytest.raises(WalFailed):
        broken.wait_durable(offset, 30.0)
    fs.disk_full = False
    assert not group.failed
    broken.close()
    fine.close()
    image = fs.crash_image()
    group.close()
    for name in image.listdir(JOURNAL):
        image.remove(os.path.join(JOURNAL, name))
    image.rmdir(JOURNAL)
    wal = _open(image, None, 0, config)
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(10))
    wal.close()


def test_one_journal_opener_at_a_time():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    with pytest.raises(WalLocked):
        CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    with pytest.raises(WalLocked):
        WriteAheadLog.open(ROOT, _topic(0), fs=fs)  # a standalone opener would replay under it
    with pytest.raises(WalLocked):
        CommitGroup(ROOT, fs)  # nor may a syncfs group of the same root
    wal = _open(fs, group, 0, small_config())
    with pytest.raises(WalLocked):
        _open(fs, group, 0, small_config())  # one opener per WAL within the group, too
    wal.close()
    _open(fs, group, 0, small_config()).close()  # closing let it go
    group.close()
    CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS).close()


def _journaled_image(topics: int = 3, messages: int = 30, seed: int = 11):
    """A power-loss image of a root whose WALs' acknowledged rounds live partly only in
    the journal (no checkpoint ran), and what each WAL acknowledged."""
    fs = FaultFs()
    config = small_config(segment_bytes_max=8192)
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [_open(fs, group, i, config) for i in range(topics)]
    for n in range(messages):
        for wal in wals:
            wal.append(payload_for(n, 0, 400))
        if n % 3 == 0:
            for wal in wals:
                wal.flush()
    for wal in wals:
        wal.flush()
    image = fs.crash_image_pages(lambda path, pages: pages if path.endswith(".jnl") else [], keep_size=True)
    for wal in wals:
        wal.close()
    group.close()
    return image, config


def _refused_and_untouched(image: FaultFs, match: str) -> None:
    before = _segment_bytes(image)
    with pytest.raises(CorruptLog, match=match):
        CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
    with pytest.raises(CorruptLog, match=match):
        _open(image, None, 0, small_config())  # a standalone opener replays too
    assert _segment_bytes(image) == before, "a refused replay wrote nothing"


def test_an_unreadable_journal_checkpoint_is_refused_with_nothing_touched():
    # Replaying from a guess could cut data written outside the journal since (a run with
    # the group off), or chain rounds of two runs across a torn one.
    image, _config = _journaled_image()
    _overwrite(image, os.path.join(JOURNAL, "wal.ckpt"), b"{not json")
    _refused_and_untouched(image, "checkpoint is unreadable")


def test_a_damaged_or_missing_journal_file_is_refused_with_nothing_touched():
    image, _config = _journaled_image()
    current = _journal_files(image)[-2]  # the last is the spare prepared ahead
    path = os.path.join(JOURNAL, f"{current:020d}.jnl")
    data = bytearray(image.read_all(path))
    data[12] ^= 0x01  # one bit of the file header (synced long before the rounds)
    damaged = image.crash_image()
    _overwrite(damaged, path, bytes(data))
    _refused_and_untouched(damaged, "header is invalid")
    gone = image.crash_image()
    for sequence in _journal_files(gone):
        gone.remove(os.path.join(JOURNAL, f"{sequence:020d}.jnl"))
    _refused_and_untouched(gone, "missing")


@pytest.mark.parametrize("damage", ["removed", "flipped"])
def test_a_wal_whose_id_file_is_gone_or_damaged_is_refused_while_the_journal_holds_its_rounds(damage):
    image, config = _journaled_image()
    id_path = os.path.join(ROOT, "ns", "t0", WAL_ID_NAME)
    if damage == "removed":
        image.remove(id_path)
    else:
        raw = bytearray(image.read_all(id_path))
        raw[14] ^= 0x01
        _overwrite(image, id_path, bytes(raw))
    _refused_and_untouched(image, "t0")
    # The other WALs are not the question: once the id is back, everything replays.


def test_an_interrupted_delete_never_hands_its_id_to_the_wal_created_in_its_place():
    fs = FaultFs()
    config = small_config()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, config)
    wal.append(payload_for(0))
    wal.close()
    old_id = fs.read_all(os.path.join(ROOT, "ns", "t0", WAL_ID_NAME))
    directory = os.path.join(ROOT, "ns", "t0")
    for name in fs.listdir(directory):  # a delete that stopped before its bookkeeping files
        if not name.startswith("."):
            fs.remove(os.path.join(directory, name))
    wal = _open(fs, group, 0, config)
    assert wal.next_offset == 0
    assert fs.read_all(os.path.join(directory, WAL_ID_NAME)) != old_id
    wal.close()
    group.close()


def test_a_copied_wal_directory_is_refused_by_the_group_and_by_replay_only_if_named():
    fs = FaultFs()
    config = small_config()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    original = _open(fs, group, 0, config)
    original.append(payload_for(0))
    original.flush()
    copy_dir = os.path.join(ROOT, "ns", "t9")
    fs.makedirs(copy_dir)
    for name in fs.listdir(os.path.join(ROOT, "ns", "t0")):
        if name != ".lock":
            _overwrite(fs, os.path.join(copy_dir, name), fs.read_all(os.path.join(ROOT, "ns", "t0", name)))
    with pytest.raises(CorruptLog, match="already the id"):
        _open(fs, group, 9, config)
    image = fs.crash_image()
    original.close()
    group.close()
    # The journal holds rounds of that id: replay cannot choose between the two.
    with pytest.raises(CorruptLog, match="both"):
        CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
    # A clean stop left nothing to replay: the copy bothers nobody else.
    CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS).close()


def test_a_crash_during_replay_replays_again():
    fs = FaultFs()
    config = small_config(segment_bytes_max=4096)
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wals = [_open(fs, group, i, config) for i in range(5)]
    for n in range(40):
        for wal in wals:
            wal.append(payload_for(n, 0, 200))
        for wal in wals:
            wal.flush()
    image = fs.random_crash_image(random.Random(4))
    for wal in wals:
        wal.close()
    group.close()
    # How many syncs a whole replay makes (the group's constructor: replay, then its new
    # file and checkpoint); then a crash after each of them.
    probe = image.crash_image()
    before = probe.sync_calls
    with _no_checkpointer():
        CommitGroup(ROOT, probe, journal=NO_CHECKPOINTS).close()
    syncs = probe.sync_calls - before
    assert syncs >= 5
    for fail_after in range(syncs):
        attempt = image.crash_image()
        attempt.fail_sync_after = attempt.sync_calls + fail_after
        with _no_checkpointer(), pytest.raises(OSError):
            CommitGroup(ROOT, attempt, journal=NO_CHECKPOINTS)
        attempt.fail_sync_after = None
        after = attempt.random_crash_image(random.Random(fail_after))
        group = CommitGroup(ROOT, after, journal=NO_CHECKPOINTS)
        for i in range(5):
            wal = _open(after, group, i, config)
            assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(40))
            wal.close()
        group.close()


def test_entries_of_segments_retention_removed_are_skipped():
    fs = FaultFs()
    config = small_config(segment_bytes_max=2048)
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, config)
    for n in range(60):
        wal.append(payload_for(n, 0, 300))
        wal.flush()
    removed = wal.truncate_before(40)
    assert removed > 0
    first = wal.first_offset
    image = fs.random_crash_image(random.Random(9))
    wal.close()
    group.close()
    group = CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
    assert group.journal.replayed.skipped_entries > 0
    wal = _open(image, group, 0, config)
    assert wal.first_offset == first
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(first, 60))
    wal.close()
    group.close()


def test_a_wal_whose_id_file_is_gone_after_a_clean_stop_gets_a_new_one():
    fs = FaultFs()
    config = small_config()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, config)
    assert fs.exists(os.path.join(ROOT, "ns", "t0", WAL_ID_NAME))
    wal.append(payload_for(0))
    wal.flush()
    wal.close()
    group.close()
    # A directory (say, restored from elsewhere) without the id: nothing is written into it.
    fs.remove(os.path.join(ROOT, "ns", "t0", WAL_ID_NAME))
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    assert group.journal.replayed.wals == 0
    group.close()


@contextlib.contextmanager
def _no_checkpointer():
    """Journals opened inside do not start their checkpointer thread (its first spare file
    would make syncs of its own, racing the ones a test counts)."""
    original = Journal._checkpointer
    Journal._checkpointer = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Journal._checkpointer = original  # type: ignore[method-assign]


def _overwrite(fs: FaultFs, path: str, data: bytes) -> None:
    if fs.exists(path):
        fs.remove(path)
    handle = fs.open_append(path)
    handle.write([data])
    handle.sync()
    handle.close()
    fs.fsync_dir(os.path.dirname(path))


def _segment_bytes(fs: FaultFs) -> dict[str, bytes]:
    found = {}
    for i in range(3):
        directory = os.path.join(ROOT, "ns", f"t{i}")
        for name in fs.listdir(directory):
            if name.endswith(".seg"):
                found[os.path.join(directory, name)] = fs.read_all(os.path.join(directory, name))
    return found


def test_a_read_only_checker_sees_what_replay_would_write(tmp_path):
    """``dnb verify`` never opens a WAL (that would repair it); on a journaled root whose
    journal was not replayed yet it lays the journal's rounds over the segments, as replay
    would, so a power loss's torn segment rounds are neither reported corrupt nor missed."""
    from tiered.tools.verify import VerifyReport, _scan_wal

    rng = random.Random(12)
    fs = FaultFs()
    config = small_config(segment_bytes_max=4096)
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, config)
    for n in range(80):
        wal.append(payload_for(n, 0, rng.choice((30, 300, 900))))
        if n % 4 == 0:
            wal.flush()
    wal.flush()
    # Every segment page lost, the journal kept: only replay (or its overlay) has the data.
    image = fs.crash_image_pages(lambda path, pages: pages if path.endswith(".jnl") else [], keep_size=True)
    wal.close()
    group.close()
    real_root = os.path.join(tmp_path, "wal")
    _materialize(image, ROOT, real_root)
    report = VerifyReport("/ns/t0")
    first, last = _scan_wal(os.path.join(real_root, "ns", "t0"), report)
    assert (first, last) == (0, 79) and not report.problems, report.problems


def _materialize(fs: FaultFs, root: str, target: str) -> None:
    """Write ``fs``'s tree under ``root`` to the real directory ``target``."""
    os.makedirs(target, exist_ok=True)
    for name in fs.listdir(root):
        source, destination = os.path.join(root, name), os.path.join(target, name)
        try:
            fs.listdir(source)
        except FileNotFoundError:  # a file
            with open(destination, "wb") as f:
                f.write(fs.read_all(source))
        else:
            _materialize(fs, source, destination)


def test_file_preparation_and_recycling_never_race_the_commit_path(tmp_path):
    """Tiny journal files on the real disk: the writer switches files every few rounds
    while the checkpointer prepares spares and recycles, often both at once. Nothing may
    fail (a race between them once removed the writer's file under it)."""
    from wal.fs import RealFs

    root = os.fspath(tmp_path)
    journal = JournalConfig(file_bytes=2048, checkpoint_bytes=1024, checkpoint_interval_s=0.001)
    group = CommitGroup(root, RealFs(), journal=journal)
    wals = [WriteAheadLog.open(root, _topic(i), small_config(segment_bytes_max=1 << 20), group=group)
            for i in range(4)]
    for n in range(1500):
        wal = wals[n % 4]
        wal.append(payload_for(n // 4, 0, 200))
        if n % 3 == 0:
            wal.flush()
    for wal in wals:
        wal.flush()
        wal.close()
    assert not group.failed
    assert group.journal.checkpoints > 20
    group.close()


def test_a_journaled_topic_holds_one_open_file(tmp_path):
    """Its active segment; no lock file per topic (the journal's lock keeps other openers
    out of the whole root), so a broker's open files follow its topics one to one."""
    from wal.fs import RealFs

    root = os.fspath(tmp_path)

    journal_dir = os.path.join(root, JOURNAL_DIR) + os.sep

    def open_files() -> int:
        """Files this process holds open in the WAL root's topic directories (the rest
        of the process, other tests' threads and the journal itself included, opens and
        closes files meanwhile: one of the journal's files, open for a moment when
        ``before`` was counted, once made this 53 - 4 on a loaded machine)."""
        held = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue  # closed since the listing
            # The journal's directory too (its fsync_dir holds it open for a moment).
            held += target.startswith(root + os.sep) and not (target + os.sep).startswith(journal_dir)
        return held

    group = CommitGroup(root, RealFs(), journal=NO_CHECKPOINTS)
    _wait_until(lambda: group.journal._spare is not None)  # its file prepared and closed again
    before = open_files()
    wals = [WriteAheadLog.open(root, _topic(i), small_config(), group=group) for i in range(50)]
    assert open_files() - before == 50
    for wal in wals:
        wal.close()
    group.close()


def test_a_burst_faster_than_checkpoints_waits_instead_of_growing_the_journal():
    """Checkpoints that never come by size or time: only the journal's file bound keeps
    it (and the replay after a crash) small; rounds wait for a checkpoint at the bound."""
    fs = FaultFs()
    journal = JournalConfig(file_bytes=16 * 1024, checkpoint_bytes=1 << 40, checkpoint_interval_s=3600.0,
                            files_max=3)
    group = CommitGroup(ROOT, fs, journal=journal)
    wals = [_open(fs, group, i, small_config(segment_bytes_max=1 << 20)) for i in range(4)]
    most = 0
    for n in range(200):
        for wal in wals:
            wal.append(payload_for(n, 0, 1000))
        if n % 2:
            for wal in wals:
                wal.flush()
            most = max(most, len(_journal_files(fs)))
    assert group.journal.checkpoints >= 10, "only the bound made checkpoints"
    assert len(_journal_files(fs)) <= journal.files_max + 2
    # files_max from the checkpoint's to the current, the spare and one kept to recycle
    assert most <= journal.files_max + 2, most
    image = fs.crash_image()
    for wal in wals:
        wal.close()
    group.close()
    group = CommitGroup(ROOT, image, journal=journal)
    assert group.journal.replayed.bytes <= journal.files_max * journal.file_bytes
    for i in range(4):
        wal = _open(image, group, i, small_config(segment_bytes_max=1 << 20))
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(200))
        wal.close()
    group.close()


def test_a_journaled_group_refuses_a_wal_an_earlier_opener_still_holds():
    """A standalone WAL (or a syncfs group) opened before the journaled group holds its
    directory's lock and took no journal lock: the group must not open it too."""
    fs = FaultFs()
    standalone = WriteAheadLog.open(ROOT, _topic(0), small_config(), fs=fs)
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    with pytest.raises(WalLocked):
        _open(fs, group, 0, small_config())
    standalone.close()
    _open(fs, group, 0, small_config()).close()  # once it let go
    group.close()


def test_a_symlinked_namespace_does_not_slip_past_a_running_group(tmp_path):
    from wal.fs import RealFs

    root, other = os.path.join(tmp_path, "root"), os.path.join(tmp_path, "other")
    os.makedirs(root)
    os.makedirs(other)
    group = CommitGroup(root, RealFs(), journal=NO_CHECKPOINTS)
    wal = WriteAheadLog.open(root, "/ns/a", small_config(), group=group)
    os.symlink(os.path.join(root, "ns"), os.path.join(other, "ns"))
    with pytest.raises(WalLocked):
        WriteAheadLog.open(other, "/ns/a", small_config())  # the same directory, another root's name
    wal.close()
    group.close()


def test_a_retried_open_makes_the_directory_durable_that_a_failed_open_made():
    """An open that made the WAL's directory and died before syncing its parent leaves a
    directory that exists but may vanish in a power loss; the next open must sync it."""
    fs = FaultFs(strict_dirs=True)
    fs.makedirs(ROOT)
    fs.settle_dirs()
    fs.makedirs(os.path.join(ROOT, "ns", "t0"))  # what the failed open left: made, not durable
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, small_config())
    for n in range(10):
        wal.append(payload_for(n))
    wal.flush()
    image = fs.crash_image()
    wal.close()
    group.close()
    group = CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
    wal = _open(image, group, 0, small_config())
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(10))
    wal.close()
    group.close()


@pytest.mark.parametrize("journaled", [True, False])
def test_a_wal_whose_close_timed_out_leaves_the_group_without_spinning_it(journaled):
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS if journaled else None)
    wal = _open(fs, group, 0, small_config(close_timeout_s=0.5))
    other = _open(fs, group, 1, small_config())
    wal.append(payload_for(0))
    wal.flush()
    fs.hold_syncs()
    try:
        wal.append(payload_for(1))  # a round now waits in its sync
        _wait_until(lambda: fs.syncs_waiting >= 1)
        wal.append(payload_for(2))  # pending behind it
        with pytest.raises(WalFailed):
            wal.close()  # times out: the WAL fails with frames pending (its directory stays claimed)
        assert wal.failed
    finally:
        fs.release_syncs()
    _wait_until(lambda: group.members == 1)  # it left (its never-acknowledged frames dropped)
    other.close()
    group.close(timeout_s=30)


def test_closing_a_wal_that_had_failed_still_says_when_its_files_are_not_durable():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, small_config(segment_bytes_max=1 << 20))
    for n in range(5):
        wal.append(payload_for(n))
    wal.flush()  # acknowledged: in the journal, the segment not synced yet
    fs.disk_full = True
    wal.append(payload_for(5))  # its segment write fails: the topic fails alone
    _wait_until(lambda: wal.failed)
    fs.disk_full = False
    fs.fail_sync_after = fs.sync_calls  # ... and so does the close's sync of its segment
    with pytest.raises(WalFailed):
        wal.close()  # so no caller may move or delete its files as if they were durable
    fs.fail_sync_after = None
    group.close()


def test_a_failed_checkpoint_write_at_close_lets_go_of_the_directory():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, small_config())
    wal.append(payload_for(0))
    wal.flush()
    real_open_rw = fs.open_rw

    def open_rw_fails(path: str):
        raise OSError(5, "Input/output error (injected)", path)

    fs.open_rw = open_rw_fails  # type: ignore[method-assign]
    with pytest.raises(OSError):
        wal.close()  # its checkpoint file cannot be written
    fs.open_rw = real_open_rw  # type: ignore[method-assign]
    wal = _open(fs, group, 0, small_config())  # not stranded as "open"
    assert wal.next_offset == 1
    wal.close()
    group.close()


def test_a_journaled_group_refuses_a_namespace_symlinked_out_of_its_root(tmp_path):
    """Openers outside the group find it by the journal of the root a WAL directory really
    lies in. A directory reached through a namespace symlinked to another root lies outside
    the group's view: a standalone opener there would check the other root's journal and
    become a second writer. The group refuses such a directory instead."""
    from wal.fs import RealFs

    root, other = os.path.join(tmp_path, "root"), os.path.join(tmp_path, "other")
    os.makedirs(root)
    os.makedirs(os.path.join(other, "ns"))
    os.symlink(os.path.join(other, "ns"), os.path.join(root, "ns"))
    group = CommitGroup(root, RealFs(), journal=NO_CHECKPOINTS)
    try:
        with pytest.raises(WalLocked):
            WriteAheadLog.open(root, "/ns/a", small_config(), group=group)
        wal = WriteAheadLog.open(root, "/ns/a", small_config())  # nothing of it is the group's
        wal.close()
    finally:
        group.close()


def test_a_wal_whose_close_timed_out_can_be_opened_again_once_the_group_let_it_go(tmp_path):
    """A close that timed out leaves the WAL's files to the group (it syncs and closes them
    when it lets the WAL go); it must leave the directory's claim to it too, or the topic
    could never be opened again in this process."""
    from wal.fs import RealFs

    group = CommitGroup(str(tmp_path), RealFs(), journal=NO_CHECKPOINTS)
    wal = WriteAheadLog.open(str(tmp_path), "/ns/a", small_config(close_timeout_s=0.2), group=group)
    wal.append(b"m0")
    wal.flush()
    assert group.journal is not None
    gate, inside = threading.Event(), threading.Event()
    real_sync = group.journal.sync

    def held_sync() -> None:
        inside.set()
        gate.wait(60)
        real_sync()

    group.journal.sync = held_sync  # type: ignore[method-assign]
    wal.append(b"m1")
    assert inside.wait(30)
    with pytest.raises(WalFailed):
        wal.close()  # times out: the round is held in its sync
    with pytest.raises(WalLocked):
        WriteAheadLog.open(str(tmp_path), "/ns/a", small_config(), group=group)  # still being written
    gate.set()
    group.journal.sync = real_sync  # type: ignore[method-assign]
    assert wal._member is not None and wal._member.left.wait(30)
    again = WriteAheadLog.open(str(tmp_path), "/ns/a", small_config(), group=group)
    try:
        assert again.next_offset >= 1  # m1's outcome is unknown (its append got no ack)
        assert [bytes(r.payload) for r in again.reader(0, live=False)][:1] == [b"m0"]
    finally:
        again.close()
        group.close()


def _probe_in_child(root: str, *prefix: str) -> str:
    import subprocess
    import sys

    code = f"import sys; sys.path.insert(0, {os.getcwd()!r}); from wal.journal import journal_running; " \
           f"print(journal_running({root!r}))"
    done = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_running_group_is_seen_from_another_process_and_not_once_it_failed(tmp_path) -> None:
    """``journal_running`` (what ``dnb verify`` asks before comparing segments with the
    journal) probes ``running.lock`` with a shared flock: another process sees the group
    that holds it, and nothing once the group closed or failed (a failed group's segments
    may lack rounds the journal holds)."""
    from wal.fs import RealFs
    from wal.journal import journal_running

    root = str(tmp_path)
    group = CommitGroup(root, RealFs(), journal=JournalConfig())
    assert journal_running(root) and _probe_in_child(root) == "True"
    group.close()
    assert not journal_running(root) and _probe_in_child(root) == "False"
    failed = CommitGroup(root, RealFs(), journal=JournalConfig())
    assert journal_running(root)
    failed.fail(OSError(5, "injected"))
    assert not journal_running(root)
    with pytest.raises(WalFailed):
        failed.check()
    failed.close()


def test_a_running_group_is_seen_from_another_pid_namespace(tmp_path) -> None:
    """atk50 F03: ``/proc/locks`` shows no lock of another pid namespace, so a verify in
    another container took a running broker for stopped and compared nothing. The flock
    probe does not depend on it."""
    import shutil
    import subprocess

    from wal.fs import RealFs

    unshare = shutil.which("unshare")
    trial = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                           timeout=60) if unshare else None
    if trial is None or trial.returncode != 0:
        pytest.skip("cannot make a pid namespace here (unshare --pid needs root or user namespaces)")
    root = str(tmp_path)
    group = CommitGroup(root, RealFs(), journal=JournalConfig())
    try:
        assert _probe_in_child(root, unshare, "--pid", "--fork", "--mount-proc") == "True"
    finally:
        group.close()


# -- what lies past the journal's last round of a WAL (atk56 F01, F02) ---------------------

def _process_crash(fs: FaultFs) -> FaultFs:
    """The files after a crash of the process alone: everything written reached the page
    cache, so every dirty page survives (no power loss)."""
    return fs.crash_image_pages(lambda _path, pages: pages)


def _appended(wal: WriteAheadLog, first: int, count: int) -> None:
    for offset in range(first, first + count):
        assert wal.append(payload_for(offset)) == offset
    wal.flush()


def _move_directory(fs: FaultFs, src: str, dst: str) -> None:
    """``mv src dst`` of a WAL directory, file by file (FaultFs renames files only)."""
    fs.makedirs(dst)
    for name in fs.listdir(src):
        if name != ".lock":
            _overwrite(fs, os.path.join(dst, name), fs.read_all(os.path.join(src, name)))
        fs.remove(os.path.join(src, name))
    fs.rmdir(src)
    fs.fsync_dir(os.path.dirname(src))


def _recovered_payloads(fs: FaultFs) -> list[bytes]:
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    try:
        wal = _open(fs, group, 0, small_config())
        try:
            return [record.payload for record in read_all(wal, 0)]
        finally:
            wal.close()
    finally:
        group.close()


def test_replay_keeps_a_segments_intact_round_that_the_journal_holds_damaged():
    # Every round is acknowledged, then the process dies and the journal's LAST round is
    # damaged at rest. Nothing proves that round was synced, so replay takes it for the
    # crash's torn tail; but the segment holds an intact copy, and cutting it there would
    # lose acknowledged messages and hand their offsets out again.
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, small_config())
    for first in range(0, 20, 5):
        _appended(wal, first, 5)
    assert group.journal is not None
    writer = group.journal._writer  # noqa: SLF001 - the file and byte where the last round ends
    path, end = group.journal._path(writer.sequence), writer.position  # noqa: SLF001
    image = _process_crash(fs)
    flipped = bytes([image.read_all(path)[end - 3] ^ 0x01])  # inside the last frame of the last round
    handle = image.open_rw(path)
    handle.pwrite([flipped], end - 3)
    handle.sync()
    handle.close()
    wal.close()
    group.close()
    assert _recovered_payloads(image) == [payload_for(o) for o in range(20)]


def test_replay_keeps_what_a_closed_wal_acknowledged_outside_the_journal():
    # A closed WAL depends on no journal: its directory may leave the root, be appended by
    # a standalone opener and come back. The journal still holds the rounds of its first
    # open until its next checkpoint; a replay lays them over it again, and must keep the
    # rounds acknowledged outside after them. With the WAL reopened in the group meanwhile,
    # the replay must not find its offsets skipping (and refuse the whole root) either.
    for reopen in (False, True):
        fs = FaultFs()
        group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
        other = _open(fs, group, 1, small_config())  # the root's other topics go on
        wal = _open(fs, group, 0, small_config())
        _appended(wal, 0, 10)
        wal.close()
        inside = os.path.join(ROOT, "ns", "t0")
        _move_directory(fs, inside, "/elsewhere/ns/t0")
        outside = WriteAheadLog.open("/elsewhere", "/ns/t0", small_config(), fs=fs)
        _appended(outside, 10, 10)
        outside.close()
        _move_directory(fs, "/elsewhere/ns/t0", inside)
        last = 19
        if reopen:
            wal = _open(fs, group, 0, small_config())
            assert wal.next_offset == 20
            _appended(wal, 20, 5)
            last = 24
        _appended(other, 0, 3)
        image = _process_crash(fs)
        if reopen:
            wal.close()
        other.close()
        group.close()
        assert _recovered_payloads(image) == [payload_for(o) for o in range(last + 1)], reopen


def test_a_reopen_that_needs_a_checkpoint_fails_at_once_on_a_full_disk_and_works_after():
    # A WAL reopened while the journal still holds its earlier instance's rounds waits for a
    # checkpoint past them. On a full disk the checkpoint cannot write its record: the open
    # is refused at once (WalTimeout, nothing written, the directory free again), not held
    # for minutes, and works once space is back.
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    wal = _open(fs, group, 0, small_config())
    _appended(wal, 0, 3)
    wal.close()
    fs.disk_full = True
    # The failed checkpoint ends the wait (its message), not the 60 s bound (another one).
    with pytest.raises(WalTimeout, match="could not write its record"):
        _open(fs, group, 0, small_config())
    fs.disk_full = False
    wal = _open(fs, group, 0, small_config())
    assert [r.payload for r in read_all(wal, 0)] == [payload_for(o) for o in range(3)]
    _appended(wal, 3, 2)
    wal.close()
    group.close()


def _bad_first_sector(fs: FaultFs, path: str) -> None:
    """Reads of ``path`` that touch its first 512 bytes fail with EIO (a media error on the
    sector holding a segment's header); every other read and every write works."""
    open_read, read_all = fs.open_read, fs.read_all

    def failing_open_read(p: str):
        handle = open_read(p)
        if p == path:
            pread = handle.pread

            def failing_pread(position: int, size: int) -> bytes:
                if position < 512:
                    raise OSError(errno.EIO, "injected bad sector", p)
                return pread(position, size)
            handle.pread = failing_pread
        return handle

    def failing_read_all(p: str) -> bytes:
        if p == path:
            raise OSError(errno.EIO, "injected bad sector", p)
        return read_all(p)
    fs.open_read, fs.read_all = failing_open_read, failing_read_all  # type: ignore[method-assign]


def test_a_segment_header_replay_cannot_read_fails_only_its_own_topic():
    """Replay reads the header of each segment the journal names (its round markers' key).
    atk92 F1: a read error there failed the replay, so the whole root refused to open, every
    healthy topic with it. It is that one topic's problem, which its own open reports."""
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=NO_CHECKPOINTS)
    config = small_config()
    wals = [_open(fs, group, i, config) for i in range(4)]
    for n in range(5):
        for wal in wals:
            wal.append(payload_for(n, 1))
    for wal in wals:
        wal.flush()
    bad = wals[2].segments()[-1].path
    image = fs.process_crash_image()  # acknowledged: journaled; the segments' pages are in the cache
    for wal in wals:
        wal.close()
    group.close()
    _bad_first_sector(image, bad)
    group = CommitGroup(ROOT, image, journal=NO_CHECKPOINTS)
    try:
        for i in (0, 1, 3):
            wal = _open(image, group, i, config)
            assert [check_payload(r.payload) for r in read_all(wal)] == [(n, 1) for n in range(5)]
            wal.close()
        with pytest.raises(OSError):
            _open(image, group, 2, config)
    finally:
        group.close()


def test_rounds_continuing_the_journal_are_kept_when_the_segment_key_is_unknown():
    # Past the journal's last round of a WAL, replay keeps the whole rounds that continue
    # it (a WAL appended outside the journal after its close). Where the segment's header
    # cannot be read, its markers' CRC cannot be checked: their tag and offset are, and the
    # frames whole, as before.
    from native import encode_batch, encode_round_marker
    from wal.journal import KEY_UNKNOWN, continuing_rounds

    frames = [encode_batch(10, [(1, None, None, b"a"), (1, None, None, b"b")]),
              encode_batch(12, [(1, None, None, b"c")])]
    rounds = encode_round_marker(10, 77) + frames[0] + encode_round_marker(12, 77) + frames[1]
    whole = len(rounds)
    assert continuing_rounds(rounds, 10, 77) == whole
    assert continuing_rounds(rounds, 10, KEY_UNKNOWN) == whole
    assert continuing_rounds(rounds, 11, KEY_UNKNOWN) == 0  # not this WAL's next offset
    torn = rounds[:-3]
    assert continuing_rounds(torn, 10, 77) == continuing_rounds(torn, 10, KEY_UNKNOWN) == whole - len(frames[1]) - 16
    dangling = encode_round_marker(10, 77) + frames[0] + encode_round_marker(12, 77)
    assert continuing_rounds(dangling, 10, KEY_UNKNOWN) == 16 + len(frames[0])
    assert continuing_rounds(b"x" * 40, 10, KEY_UNKNOWN) == 0
