"""A commit group's pending budget bounds the bytes all its topics hold appended but not
yet taken by a round (WalConfig.pending_group_bytes_max; native.PendingBudget): behind a
stalled disk, appends to every topic wait instead of growing memory without bound, go on
once rounds take frames again, time out with nothing appended, and are refused when the
group fails. Nothing acknowledged is lost on the way."""
from __future__ import annotations

import threading
import time

import pytest

from tests.wal.helpers import check_payload, open_in_group, payload_for, read_all, small_config, wait_until
from tests.wal.helpers import BUDGET_MESSAGE, GROUP_ROOT, append_in_thread, budget_config, fill_behind_a_held_sync
from wal import WalFailed, WalTimeout
from wal.group import CommitGroup
from wal.testing import FaultFs

BUDGET = 32 * 1024
MESSAGE = BUDGET_MESSAGE


def _group(journaled: bool, fs: FaultFs) -> CommitGroup:
    from wal.journal import JournalConfig

    journal = JournalConfig(file_bytes=1 << 20, checkpoint_bytes=1 << 30, checkpoint_interval_s=3600.0) \
        if journaled else None
    return CommitGroup(GROUP_ROOT, fs, journal=journal, pending_bytes_max=BUDGET)


@pytest.mark.parametrize("journaled", [False, True])
def test_behind_a_stalled_disk_appends_to_every_topic_wait_and_then_go_on(journaled):
    fs = FaultFs()
    group = _group(journaled, fs)
    budget = group.pending_budget
    assert budget is not None
    # Each topic may hold 1 MiB on its own: only the group's budget can stop them.
    wals = [open_in_group(fs, group, i, budget_config()) for i in range(8)]
    fs.hold_syncs()
    wals[0].append(payload_for(0, size=MESSAGE))  # a round in flight, its sync held
    wait_until(lambda: fs.syncs_waiting >= 1)  # (and maybe the journal's spare file's)
    per_topic = 40  # 8 x 40 x ~1 KB: ten times the budget, more than any one topic gets in
    errors: list[BaseException] = []

    def produce(index: int) -> None:
        try:
            wal = wals[index]
            for _ in range(per_topic if index else per_topic - 1):
                wal.append(payload_for(wal.next_offset, size=MESSAGE))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    producers = [threading.Thread(target=produce, args=(i,)) for i in range(len(wals))]
    for thread in producers:
        thread.start()
    try:
        # Every producer ends up waiting for room: the budget holds them all.
        wait_until(lambda: group.room_waiters == len(wals))
        held = sum(wal.next_offset for wal in wals)
        assert held < len(wals) * per_topic, "some appends must still be waiting"
        # Each producer passed the check at most once with the budget nearly full.
        assert budget.used <= BUDGET + len(wals) * (MESSAGE + 100), budget.used
    finally:
        fs.release_syncs()
    for thread in producers:
        thread.join(120)
        assert not thread.is_alive()
    assert not errors, errors
    for wal in wals:
        wal.flush()
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(per_topic))
    assert budget.used == 0
    for wal in wals:
        wal.close()
    group.close()


def test_an_append_that_waits_too_long_times_out_and_appends_nothing():
    fs = FaultFs()
    group = _group(False, fs)
    config = budget_config(append_timeout_s=0.2)
    wal, other = open_in_group(fs, group, 0, config), open_in_group(fs, group, 1, config)
    try:
        fill_behind_a_held_sync(fs, group.pending_budget, wal)
        before = other.next_offset
        with pytest.raises(WalTimeout, match="pending_group_bytes_max"):
            other.append(payload_for(0, size=MESSAGE))
        assert other.next_offset == before, "a timed-out append used no offset"
    finally:
        fs.release_syncs()
    wal.flush()
    other.append(payload_for(0, size=MESSAGE))  # room again once the rounds went on
    other.flush()
    assert [check_payload(r.payload)[0] for r in read_all(other)] == [0]
    for each in (wal, other):
        each.close()
    group.close()


def test_appends_waiting_for_room_are_refused_when_the_group_fails():
    fs = FaultFs()
    group = _group(False, fs)
    config = budget_config()
    wal, other = open_in_group(fs, group, 0, config), open_in_group(fs, group, 1, config)
    fill_behind_a_held_sync(fs, group.pending_budget, wal)
    outcome: list[BaseException] = []

    thread = append_in_thread(other, outcome)
    wait_until(lambda: group.room_waiters == 1)
    fs.fail_sync_after = fs.sync_calls  # the held sync fails: the group fails every topic
    fs.release_syncs()
    thread.join(120)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], WalFailed), outcome
    assert group.failed and wal.durable_offset is None and other.durable_offset is None
    # The waiter is refused as soon as the group failed; the group then fails its topics,
    # each giving its pending bytes back.
    wait_until(lambda: wal.failed and other.failed)
    wait_until(lambda: group.pending_budget.used == 0)  # type: ignore[union-attr]
    for each in (wal, other):
        each.close()
    group.close()


def test_a_closed_topic_gives_its_share_back():
    fs = FaultFs()
    group = _group(True, fs)
    config = small_config(segment_bytes_max=1 << 20)
    wals = [open_in_group(fs, group, i, config) for i in range(3)]
    for wal in wals:
        wal.append(payload_for(0, size=MESSAGE))
    wals[1].close()
    for wal in (wals[0], wals[2]):
        wal.flush()
    assert group.pending_budget.used == 0  # type: ignore[union-attr]
    for wal in (wals[0], wals[2]):
        wal.close()
    group.close()


@pytest.mark.parametrize("full", ["group budget", "topic bound"])
def test_a_durable_listener_appending_on_the_groups_thread_never_waits_for_itself(full):
    """A listener runs on the group's thread; were it to wait for room, the group's or its
    target topic's own (atk84 F1), it would wait for the round only its own thread can run."""
    fs = FaultFs()
    group = _group(True, fs) if full == "group budget" else CommitGroup(GROUP_ROOT, fs)
    config = small_config(segment_bytes_max=1 << 20, max_message_bytes=4096,
                          pending_bytes_max=(1 << 20) if full == "group budget" else 8192,
                          append_timeout_s=600.0)
    source, mirror = open_in_group(fs, group, 0, config), open_in_group(fs, group, 1, config)
    mirrored: list[int] = []

    def copy(offset: int) -> None:
        while len(mirrored) <= offset:
            mirror.append(payload_for(len(mirrored), size=4000))  # several times the budget in all
            mirrored.append(len(mirrored))

    source.add_durable_listener(copy)
    for n in range(40):
        source.append(payload_for(n, size=10))
    source.flush()
    wait_until(lambda: len(mirrored) == 40)
    mirror.flush()
    assert [check_payload(r.payload)[0] for r in read_all(mirror)] == list(range(40))
    for wal in (source, mirror):
        wal.close()
    group.close()


def test_bad_group_bounds_are_refused():
    from wal import WalConfig

    for bad in (0, -1, 1.5, True, "1", None):
        for name in ("pending_group_bytes_max", "cache_group_bytes_max"):
            with pytest.raises(ValueError):
                WalConfig(**{name: bad})
    for bad in (0, -1, 1.5, True, "1"):
        for name in ("pending_bytes_max", "cache_bytes_max"):
            with pytest.raises(ValueError):
                CommitGroup(GROUP_ROOT, FaultFs(), **{name: bad})


def test_many_topics_on_a_small_budget_all_get_in_and_lose_nothing():
    """50 producers, one per topic, on a budget of a few messages, the disk healthy: every
    append gets in (first come, first served, no timeouts with a long timeout) and every
    message is there once, in order."""
    fs = FaultFs()
    group = CommitGroup(GROUP_ROOT, fs, pending_bytes_max=8 * 1024)
    wals = [open_in_group(fs, group, i, budget_config()) for i in range(50)]
    errors: list[BaseException] = []

    def produce(wal) -> None:
        try:
            for n in range(20):
                wal.append(payload_for(n, size=MESSAGE))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(wal,)) for wal in wals]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
        assert not thread.is_alive()
    assert not errors, errors[:3]
    for wal in wals:
        wal.flush()
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(20))
        wal.close()
    assert group.pending_budget.used == 0 and group.room_waiters == 0  # type: ignore[union-attr]
    group.close()


def test_an_exception_while_waiting_leaves_no_one_in_line():
    """A waiter that leaves by an exception (here from its refusal check, as a
    KeyboardInterrupt could) is out of the line, and ``waiting`` says so (atk84 F2, F3)."""

    class Interrupted(BaseException):
        pass

    fs = FaultFs()
    group = _group(False, fs)
    wal = open_in_group(fs, group, 0, budget_config())
    try:
        fill_behind_a_held_sync(fs, group.pending_budget, wal)

        def interrupted() -> bool:
            raise Interrupted()

        with pytest.raises(Interrupted):
            group.wait_for_room(time.monotonic() + 600, interrupted, 600)
        assert group.room_waiters == 0 and group.pending_budget.waiting == 0  # type: ignore[union-attr]
    finally:
        fs.release_syncs()
    wal.flush()
    wal.close()
    group.close()


def test_a_waiter_stranded_first_in_line_is_dropped_once_its_wait_is_long_over():
    """Were a waiter ever left in line (an exception no finally could handle), the ones
    behind it would wait for it forever: it is dropped once its own deadline is past."""
    from wal.budget import _RoomWaiter

    fs = FaultFs()
    group = _group(False, fs)
    wal, other = open_in_group(fs, group, 0, budget_config()), open_in_group(fs, group, 1, budget_config())
    errors: list[BaseException] = []
    try:
        fill_behind_a_held_sync(fs, group.pending_budget, wal)
        with group.budgets._room_lock:
            group.budgets._room_queue.append(_RoomWaiter(time.monotonic() - 60))  # its wait ended a minute ago
            group.pending_budget.waiting = 1  # type: ignore[union-attr]

        thread = append_in_thread(other, errors)  # queues behind it
        wait_until(lambda: other.next_offset == 1 or group.room_waiters == 2 or errors)
    finally:
        fs.release_syncs()
    thread.join(120)
    assert not thread.is_alive() and not errors, errors
    other.flush()
    assert [check_payload(r.payload)[0] for r in read_all(other)] == [0]
    assert group.room_waiters == 0 and group.pending_budget.waiting == 0  # type: ignore[union-attr]
    for each in (wal, other):
        each.close()
    group.close()


def test_a_waiter_dropped_from_line_while_alive_times_out_cleanly():
    """A waiter the ones behind it dropped as stranded (it was not scheduled for a second
    past its deadline) ends with WalTimeout, not an error of the line's own."""
    fs = FaultFs()
    group = _group(False, fs)
    wal, other = open_in_group(fs, group, 0, budget_config()), open_in_group(fs, group, 1, budget_config())
    outcome: list[BaseException] = []
    try:
        fill_behind_a_held_sync(fs, group.pending_budget, wal)

        thread = append_in_thread(other, outcome)
        wait_until(lambda: group.room_waiters == 1)
        with group.budgets._room_lock:
            waiter = group.budgets._room_queue.popleft()  # as _drop_stale_waiters_locked does
        waiter.event.set()
        thread.join(120)
        assert not thread.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], WalTimeout), outcome
        assert other.next_offset == 0 and group.pending_budget.waiting == 0  # type: ignore[union-attr]
    finally:
        fs.release_syncs()
    for each in (wal, other):
        each.close()
    group.close()


def test_refuse_appends_ends_the_waiting_appends_and_keeps_what_was_appended():
    """``refuse_appends`` (a topic leaving its broker): appends waiting for room end now
    with WalClosed and use no offset; what was appended before is written as usual."""
    from wal import WalClosed

    fs = FaultFs()
    group = _group(True, fs)
    wal, other = open_in_group(fs, group, 0, budget_config()), open_in_group(fs, group, 1, budget_config())
    outcome: list[BaseException] = []
    try:
        fill_behind_a_held_sync(fs, group.pending_budget, wal)
        thread = append_in_thread(other, outcome)
        wait_until(lambda: group.room_waiters == 1)
        other.refuse_appends()
        thread.join(120)
        assert not thread.is_alive() and len(outcome) == 1 and isinstance(outcome[0], WalClosed), outcome
        assert other.next_offset == 0
        wal.refuse_appends()
        with pytest.raises(WalClosed):
            wal.append(payload_for(0, size=MESSAGE))
    finally:
        fs.release_syncs()
    appended = wal.next_offset
    wal.flush()
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(appended))
    assert group.pending_budget.used == 0  # type: ignore[union-attr]
    for each in (wal, other):
        each.close()
    group.close()


def test_the_budget_gauges_follow_the_budgets_between_rounds():
    """The gauges are read when scraped, not set by rounds (atk87 F2): behind a stalled
    disk, when the pending budget fills and no round ends, they show it filling, and once
    the last topic closed they read 0."""
    from prometheus_client import CollectorRegistry
    from wal.journal import JournalConfig

    fs, registry = FaultFs(), CollectorRegistry()
    group = CommitGroup(GROUP_ROOT, fs, journal=JournalConfig(file_bytes=1 << 20, checkpoint_bytes=1 << 30,
                                                             checkpoint_interval_s=3600.0),
                        pending_bytes_max=BUDGET, cache_bytes_max=1 << 20, metrics_registry=registry)
    wal = open_in_group(fs, group, 0, budget_config())
    try:
        fill_behind_a_held_sync(fs, group.pending_budget, wal)
        assert registry.get_sample_value("dnb_wal_group_pending_bytes") == group.pending_budget.used >= BUDGET  # type: ignore[union-attr]
    finally:
        fs.release_syncs()
    wal.flush()
    assert registry.get_sample_value("dnb_wal_group_cache_bytes") == group.cache_budget.bytes > 0  # type: ignore[union-attr]
    wal.close()
    assert registry.get_sample_value("dnb_wal_group_pending_bytes") == 0
    assert registry.get_sample_value("dnb_wal_group_cache_bytes") == 0
    group.close()
