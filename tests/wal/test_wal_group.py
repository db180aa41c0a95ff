"""Commit groups (wal/group.py): many topics, one writer thread, one syncfs per round.

The promises: every offset acknowledged to any topic of a group survives a power loss at
any moment (the per-topic recovery rules still hold, because each round is synced before
the next is written), every WAL opens again, a sync failure fails every topic closed, and
one topic opening, closing, rotating or being deleted leaves the others' rounds alone.
"""
from __future__ import annotations

import os
import random
import threading
import time

import pytest

from tests.wal.helpers import (Acks as _Acks, check_payload, check_recovered as _check_recovered,
                              group_topic as _topic, open_in_group as _open, payload_for, read_all, small_config,
                              wait_until as _wait_until)
from wal import WalFailed, WriteAheadLog
from wal.group import CommitGroup
from wal.testing import FaultFs

ROOT = "/wal"


def test_many_topics_in_one_group_survive_power_loss_at_random_points():
    topics = 12
    images = held = rejoined = 0
    for seed in range(25):
        rng = random.Random(seed)
        config = small_config(segment_bytes_max=rng.choice((4096, 16 * 1024, 1 << 20)), max_message_bytes=16 * 1024)
        fs = FaultFs()
        appended: list[dict[int, bytes]] = [{} for _ in range(topics)]
        acked = [-1] * topics
        for incarnation in range(3):
            group = CommitGroup(ROOT, fs)
            acks = _Acks(topics)
            wals = [_open(fs, group, i, config, acks) for i in range(topics)]
            for i, wal in enumerate(wals):
                _check_recovered(wal, acked[i], appended[i])
            crash_at = rng.randrange(5, 120)
            for step in range(crash_at):
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
            if rng.random() < 0.5:
                # Anywhere: the group may be writing, syncing or idle right now.
                acked = acks.snapshot()  # acknowledged before the image, so synced before it
                image = fs.random_crash_image(rng)
            else:
                # In the middle of a round: written to several topics' files, sync in flight.
                fs.hold_syncs()
                try:
                    for i in rng.sample(range(topics), 4):
                        first = wals[i].next_offset
                        batch = [payload_for(first + k, incarnation, 1500) for k in range(3)]
                        assert wals[i].append_batch(batch) == first
                        appended[i].update(zip(range(first, first + len(batch)), batch))
                    _wait_until(lambda: fs.syncs_waiting == 1)
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
        for i in range(topics):
            wal = _open(fs, None, i, config)
            _check_recovered(wal, acked[i], appended[i])
            wal.close()
    assert images == 75 and held >= 20 and rejoined >= 20, (images, held, rejoined)


def test_one_sync_per_round_whatever_the_number_of_topics():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs)
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
    assert fs.syncfs_calls - before_fs == 2, "100 topics' rounds need one syncfs each round"
    assert fs.sync_calls - before_all == 2, "and no per-file fsync"
    assert [w.durable_offset for w in wals] == [1] + [0] * 99
    for wal in wals:
        wal.close()
    assert group.members == 0
    group.close()


def test_a_sync_failure_fails_every_topic_of_the_group_closed():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs)
    wals = [_open(fs, group, i, small_config()) for i in range(3)]
    for wal in wals:
        wal.append(payload_for(0))
        wal.flush()
    fs.fail_sync_after = fs.sync_calls  # the next sync fails
    offset = wals[0].append(payload_for(1))
    with pytest.raises(WalFailed):
        wals[0].wait_durable(offset, 30.0)
    # syncfs cannot say whose write-back failed: the topics that were not in the round
    # fail too, and nothing of the failed round was acknowledged.
    for wal in wals:
        _wait_until(lambda: wal.failed)
        assert wal.durable_offset == 0
        with pytest.raises(WalFailed):
            wal.append(b"more")
    assert group.failed
    with pytest.raises(WalFailed):
        _open(fs, group, 9, small_config())
    for wal in wals:
        wal.close()
    group.close()
    fs.fail_sync_after = None
    image = fs.crash_image()
    for i in range(3):
        wal = _open(image, None, i, small_config())
        assert [check_payload(r.payload)[0] for r in read_all(wal)][:1] == [0]
        wal.close()


def test_a_topic_closes_rotates_and_is_deleted_while_the_others_keep_committing():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs)
    config = small_config(segment_bytes_max=2048)
    a, b = _open(fs, group, 0, config), _open(fs, group, 1, config)
    # A round of both is in flight when A starts closing: A's close drains it first.
    fs.hold_syncs()
    closer = threading.Thread(target=a.close)
    try:
        a.append_batch([payload_for(i, 0, 300) for i in range(4)])
        b.append_batch([payload_for(i, 0, 300) for i in range(4)])
        _wait_until(lambda: fs.syncs_waiting == 1)
        closer.start()
        _wait_until(lambda: a._core.refusal is not None)  # close began: appends refused
        with pytest.raises(Exception):
            a.append(b"late")
    finally:
        fs.release_syncs()
    closer.join(30)
    assert not closer.is_alive() and a.closed
    assert a.durable_offset == 3, "close returned only after A's round was synced"
    # B goes on, rotating its segment many times, while A's files are deleted.
    a.delete()
    for i in range(4, 60):
        b.append(payload_for(i, 0, 300))
        b.flush()  # a round each: segments rotate only between rounds
    assert len(b.segments()) > 5 and group.members == 1
    assert [check_payload(r.payload)[0] for r in read_all(b)] == list(range(60))
    # A joins again (created anew) while B keeps writing.
    a = _open(fs, group, 0, config)
    assert a.next_offset == 0
    a.append(payload_for(0))
    b.append(payload_for(60))
    a.flush()
    b.flush()
    image = fs.crash_image()
    a.close()
    b.close()
    group.close()
    for i, expect in ((0, 1), (1, 61)):
        wal = _open(image, None, i, config)
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(expect))
        wal.close()


def test_a_group_only_syncs_its_own_root_and_file_layer():
    fs = FaultFs()
    group = CommitGroup(ROOT, fs)
    with pytest.raises(ValueError):
        WriteAheadLog.open("/other", _topic(0), fs=fs, group=group)
    with pytest.raises(ValueError):
        WriteAheadLog.open(ROOT, _topic(0), fs=FaultFs(), group=group)
    assert group.members == 0
    group.close()


def test_a_group_on_the_real_disk_commits_and_recovers(tmp_path):
    from wal.fs import RealFs
    root = os.fspath(tmp_path)
    group = CommitGroup(root, RealFs())
    wals = [WriteAheadLog.open(root, _topic(i), group=group) for i in range(20)]
    for n in range(30):
        for wal in wals:
            wal.append(payload_for(n))
    for wal in wals:
        wal.flush()
        wal.close()
    group.close()
    for i in range(20):
        with WriteAheadLog.open(root, _topic(i)) as wal:
            assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(30))


@pytest.mark.parametrize("journaled", [False, True])
def test_a_round_takes_topics_up_to_its_byte_bound_and_the_rest_come_next(journaled):
    from wal.journal import JournalConfig

    fs = FaultFs()
    journal = JournalConfig(file_bytes=1 << 20, checkpoint_bytes=1 << 30, checkpoint_interval_s=3600.0) \
        if journaled else None
    group = CommitGroup(ROOT, fs, journal=journal, round_bytes_max=8 * 1024)
    wals = [_open(fs, group, i, small_config(segment_bytes_max=1 << 20)) for i in range(20)]
    fs.hold_syncs()
    try:
        wals[0].append(payload_for(0, 0, 100))  # round 1, its sync held: the rest piles up
        _wait_until(lambda: fs.syncs_waiting == 1)
        for wal in wals:
            wal.append_batch([payload_for(n, 0, 1000) for n in range(wal.next_offset, wal.next_offset + 3)])
        rounds_before = group.rounds
    finally:
        fs.release_syncs()
    for wal in wals:
        wal.flush()
    # 20 topics x ~3 KiB in rounds of at most 8 KiB (plus one topic's whole batch): 7+ rounds.
    assert group.rounds - rounds_before >= 7, group.rounds - rounds_before
    for wal in wals:
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(wal.next_offset))
        wal.close()
    group.close()


@pytest.mark.parametrize("journaled", [False, True])
def test_on_the_real_disk_a_topic_whose_segment_write_fails_fails_alone(tmp_path, journaled):
    """The group writes every topic's round in one call by descriptor; one descriptor
    failing (here: its segment file turned into /dev/full, every write ENOSPC as on a full
    disk) fails that topic closed with nothing of its round acknowledged, while the other
    topics' rounds in the same call commit and survive a reopen."""
    from wal.fs import RealFs
    from wal.journal import JournalConfig
    root = os.fspath(tmp_path)
    group = CommitGroup(root, RealFs(), journal=JournalConfig() if journaled else None)
    wals = [WriteAheadLog.open(root, _topic(i), group=group) for i in range(5)]
    for wal in wals:
        wal.append(payload_for(0))
        wal.flush()
    victim = wals[2]
    segment = victim._member.appender._file
    fd = getattr(segment, "_inner", segment)._fd
    read_only = os.open(victim.segments()[-1].path, os.O_RDONLY)
    os.dup2(read_only, fd)  # the same file, but every write now fails (EBADF); syncs still work
    os.close(read_only)
    for wal in wals:  # one round holds all five (the group is idle between the flushes)
        wal.append(payload_for(1))
    for i, wal in enumerate(wals):
        if i == 2:
            with pytest.raises(WalFailed):
                wal.flush()
            assert wal.durable_offset == 0, "nothing of the failed round is acknowledged"
            with pytest.raises(WalFailed):
                wal.append(payload_for(2))
        else:
            wal.flush()
            wal.append(payload_for(2))
            wal.flush()
    for wal in wals:
        if wal is not victim:
            wal.close()
    victim.close()
    group.close()
    for i in range(5):
        with WriteAheadLog.open(root, _topic(i)) as wal:
            expected = [0] if i == 2 else [0, 1, 2]
            assert [check_payload(r.payload)[0] for r in read_all(wal)] == expected
