"""WALs with their own writer threads (``wal.commit_group = false``, or WalRoot's fallback
where a commit group cannot sync the root) share their root's memory budgets
(wal/budget.py) as a commit group's members do: thousands of topics cannot hold
gigabytes appended or cached on that path either."""
from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from tests.wal.helpers import BUDGET_MESSAGE, GROUP_ROOT, append_in_thread, budget_config, check_payload, fill_behind_a_held_sync, group_topic
from tests.wal.helpers import payload_for, read_all, run_as_writer_thread, wait_until
from wal import WalConfig, WalTimeout, WriteAheadLog
from wal.budget import MemoryBudgets, on_writer_thread
from wal.group import CommitGroup
from wal.metrics import GroupMetrics
from wal.testing import FaultFs

BUDGET = 32 * 1024
MESSAGE = BUDGET_MESSAGE


def _budgets(pending: int | None = BUDGET, cache: int | None = None) -> MemoryBudgets:
    return MemoryBudgets(GROUP_ROOT, cache, pending, GroupMetrics(CollectorRegistry()), single_adder=False)


def _open(fs: FaultFs, budgets: MemoryBudgets, index: int, config: WalConfig) -> WriteAheadLog:
    return WriteAheadLog.open(GROUP_ROOT, group_topic(index), config, fs=fs, budgets=budgets)


def test_behind_a_stalled_disk_appends_to_every_topic_wait_and_then_go_on():
    fs = FaultFs()
    budgets = _budgets()
    budget = budgets.pending
    assert budget is not None
    wals = [_open(fs, budgets, i, budget_config()) for i in range(8)]
    assert all(wal._core.shared_budget is budget for wal in wals)
    fs.hold_syncs()  # every writer's next fdatasync waits
    # 8 x 200 x ~1 KB: fifty times the budget. Each writer takes once before its sync
    # stalls (at most about the budget), so no producer can finish while the disk stalls.
    per_topic = 200
    errors: list[BaseException] = []

    def produce(wal: WriteAheadLog) -> None:
        try:
            for _ in range(per_topic):
                wal.append(payload_for(wal.next_offset, size=MESSAGE))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    producers = [threading.Thread(target=produce, args=(wal,)) for wal in wals]
    for thread in producers:
        thread.start()
    try:
        # Every producer ends up waiting for room: the root's budget holds them all,
        # although each topic alone may hold 1 MiB.
        wait_until(lambda: budgets.room_waiters == len(wals))
        assert sum(wal.next_offset for wal in wals) < len(wals) * per_topic
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
    assert budget.used == 0 and budgets.room_waiters == 0
    for wal in wals:
        wal.close()
    budgets.close()


def test_an_append_that_waits_too_long_times_out_and_appends_nothing():
    fs = FaultFs()
    budgets = _budgets()
    config = budget_config(append_timeout_s=0.2)
    wal, other = _open(fs, budgets, 0, config), _open(fs, budgets, 1, config)
    try:
        fill_behind_a_held_sync(fs, budgets.pending, wal)
        with pytest.raises(WalTimeout, match="pending_group_bytes_max"):
            other.append(payload_for(0, size=MESSAGE))
        assert other.next_offset == 0, "a timed-out append used no offset"
    finally:
        fs.release_syncs()
    for each in (wal, other):
        each.close()
    assert budgets.pending.used == 0  # type: ignore[union-attr]
    budgets.close()


def test_closing_a_wal_gives_back_its_pending_bytes_and_refuses_its_waiting_appends():
    """A WAL that closes while appends to it wait for room: they are refused, and what it
    held goes back to the root (nothing will take it any more once it failed to drain)."""
    fs = FaultFs()
    budgets = _budgets()
    wal, other = _open(fs, budgets, 0, budget_config(close_timeout_s=0.5)), _open(fs, budgets, 1, budget_config())
    outcome: list[BaseException] = []
    try:
        fill_behind_a_held_sync(fs, budgets.pending, wal)
        thread = append_in_thread(wal, outcome)
        wait_until(lambda: budgets.room_waiters == 1)
        with pytest.raises(Exception):
            wal.close()  # its writer is stuck in a held sync: it does not drain in time
        thread.join(120)
        assert not thread.is_alive() and len(outcome) == 1, outcome
        assert budgets.pending.used == 0  # type: ignore[union-attr]
    finally:
        fs.release_syncs()
    other.append(payload_for(0, size=MESSAGE))  # the root has room again
    other.flush()
    other.close()
    budgets.close()


def test_a_writer_thread_never_waits_for_the_budget():
    """A durable listener runs on its WAL's writer thread and may append to another topic:
    waiting there could wait for the take only writer threads make (all of them at once,
    each in such a listener). Such an append goes on, past the budget."""
    fs = FaultFs()
    budgets = _budgets()
    wal, other = _open(fs, budgets, 0, budget_config()), _open(fs, budgets, 1, budget_config(append_timeout_s=0.2))
    seen: list[bool] = []
    wal.add_durable_listener(lambda _offset: seen.append(on_writer_thread()))
    wal.append(payload_for(0, size=MESSAGE))
    wal.flush()
    wait_until(lambda: seen)
    assert seen[0], "the WAL's own writer thread is marked"
    assert not on_writer_thread()
    try:
        fill_behind_a_held_sync(fs, budgets.pending, wal)
        assert run_as_writer_thread(lambda: other.append(payload_for(0, size=MESSAGE))) == [0]
        assert other.next_offset == 1 and budgets.room_waiters == 0
    finally:
        fs.release_syncs()
    for each in (wal, other):
        each.flush()
        each.close()
    budgets.close()


def test_the_cache_budget_counts_adds_from_many_writer_threads_exactly():
    """Adds come from every WAL's own writer thread at once, so they are counted under the
    budget's lock (a commit group's, from its one thread, are counted without): the total
    is what the caches hold, and nothing once they are closed."""
    fs = FaultFs()
    budgets = _budgets(pending=None, cache=64 << 20)  # never trimmed here
    cache = budgets.cache
    assert cache is not None and not cache.single_adder
    wals = [_open(fs, budgets, i, budget_config(cache_messages_max=100_000, cache_bytes_max=8 << 20)) for i in range(6)]

    def produce(wal: WriteAheadLog) -> None:
        for _ in range(300):
            wal.append(payload_for(wal.next_offset, size=100))

    producers = [threading.Thread(target=produce, args=(wal,)) for wal in wals]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(120)
    for wal in wals:
        wal.flush()
    assert cache.bytes == sum(wal._cache._bytes for wal in wals) > 0
    for wal in wals:
        wal.close()
    assert cache.bytes == 0
    budgets.close()


def test_budgets_of_the_wrong_kind_are_refused():
    fs = FaultFs()
    group_style = MemoryBudgets(GROUP_ROOT, 1 << 20, 1 << 20, GroupMetrics(CollectorRegistry()), single_adder=True)
    with pytest.raises(ValueError, match="single_adder=False"):
        _open(fs, group_style, 0, budget_config())
    group = CommitGroup(GROUP_ROOT, fs)
    try:
        with pytest.raises(ValueError, match="group's budgets"):
            WriteAheadLog.open(GROUP_ROOT, group_topic(1), budget_config(), fs=fs, group=group, budgets=_budgets())
    finally:
        group.close()
    with pytest.raises(ValueError, match="pending_bytes_max"):
        _budgets(pending=0)


def test_a_wal_root_without_a_commit_group_shares_its_budgets(tmp_path):
    from tiered.lifecycle.wal_root import WalRoot
    from wal.topics import TopicName

    registry = CollectorRegistry()
    config = WalConfig(commit_group=False, pending_group_bytes_max=64 << 20, cache_group_bytes_max=64 << 20)
    root = WalRoot("b1", str(tmp_path / "wal"), None, config, registry)
    try:
        assert root.group is None and not root.budgets.single_adder
        wals = [root.open_wal(TopicName.parse(f"/ns/t{i}")) for i in range(3)]
        assert all(wal._core.shared_budget is root.budgets.pending for wal in wals)
        for wal in wals:
            wal.append(b"x" * 100)
            wal.flush()
        assert registry.get_sample_value("dnb_wal_group_cache_bytes") == root.budgets.cache.bytes > 0  # type: ignore[union-attr]
        for wal in wals:
            wal.close()
    finally:
        root.release()


def test_with_the_trimming_thread_starved_each_writer_trims_its_own_cache(monkeypatch):
    """With a writer thread per WAL, the budget's trimming thread competes with all of them
    for the GIL and the budget's lock, and alone it fell far behind (atk88 F1: 100 topics
    kept 40 times a 64 KiB budget). An add that leaves the budget exceeded trims its own
    cache to its share first: with the trimming thread never running at all, 20 topics of
    16 KiB caches stay at the 64 KiB budget, and readers still get every message."""
    from wal.cache import CacheBudget

    monkeypatch.setattr(CacheBudget, "enforce", lambda self: None)  # the trimming thread never runs
    fs = FaultFs()
    budgets = _budgets(pending=None, cache=64 * 1024)
    cache = budgets.cache
    assert cache is not None
    wals = [_open(fs, budgets, i, budget_config(cache_messages_max=100_000, cache_bytes_max=16 * 1024)) for i in range(20)]
    for _ in range(40):  # round robin: every topic adds in every pass
        for wal in wals:
            wal.append(payload_for(wal.next_offset, size=300))
            wal.flush()
        assert cache.bytes <= cache.bytes_max + 1024, cache.bytes  # at most one more frame
    assert cache.trimmed_bytes > 0 and cache.bytes == sum(wal._cache._bytes for wal in wals)
    for wal in wals:
        assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(40))
        wal.close()
    assert cache.bytes == 0
    budgets.close()


def test_a_writer_thread_never_waits_for_a_topics_own_bound_either():
    """atk88 F2: two topics' own writers whose durable listeners append to each other
    stalled both for append_timeout_s. Any writer thread goes past a topic's own
    ``pending_bytes_max`` too (by one message), as the commit group's thread does."""
    fs = FaultFs()
    budgets = _budgets(pending=None)
    config = budget_config(pending_bytes_max=8 * 1024, append_timeout_s=600.0)
    wal = _open(fs, budgets, 0, config)
    fs.hold_syncs()
    try:
        wal.append(payload_for(0, size=MESSAGE))
        wait_until(lambda: fs.syncs_waiting >= 1)  # its writer is stuck: nothing more is taken
        while wal._core.pending_bytes < config.pending_bytes_max:
            wal.append(payload_for(wal.next_offset, size=MESSAGE))
        before = wal.next_offset
        assert run_as_writer_thread(lambda: wal.append(payload_for(before, size=MESSAGE))) == [before]
        assert wal.next_offset == before + 1
    finally:
        fs.release_syncs()
    wal.flush()
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(wal.next_offset))
    wal.close()
    budgets.close()


def test_the_gauges_sum_every_root_of_a_registry():
    """atk88 F3: two roots (two BrokerHosts of one process) on one registry; the gauges
    showed only the root made last."""
    registry = CollectorRegistry()
    first = MemoryBudgets("/a", 1 << 20, 1 << 20, GroupMetrics(registry), single_adder=False)
    second = MemoryBudgets("/b", 1 << 20, 1 << 20, GroupMetrics(registry), single_adder=False)
    fs = FaultFs()
    wal = WriteAheadLog.open("/a", group_topic(0), budget_config(), fs=fs, budgets=first)
    wal.append(b"x" * 500)
    wal.flush()
    assert first.cache is not None and first.cache.bytes > 0
    assert registry.get_sample_value("dnb_wal_group_cache_bytes") == first.cache.bytes
    wal.close()
    assert registry.get_sample_value("dnb_wal_group_cache_bytes") == 0
    for each in (first, second):
        each.close()


@pytest.mark.parametrize("bound", ["own", "root"])
def test_a_writer_thread_goes_past_a_bound_only_up_to_twice_it(bound):
    """atk89 F1: a listener appending on every round to a topic whose disk stalled grew it
    to 1,200 times its bound. A writer thread's appends go past the topic's own bound or
    the root's budget only up to twice it; then they fail at once (WalTimeout, no offset),
    since a writer thread cannot wait either."""
    fs = FaultFs()
    budgets = _budgets(pending=16 * 1024 if bound == "root" else None)
    config = budget_config(pending_bytes_max=8 * 1024 if bound == "own" else 1 << 20, append_timeout_s=600.0)
    wal = _open(fs, budgets, 0, config)
    limit = 2 * (config.pending_bytes_max if bound == "own" else 16 * 1024)

    def append_until_refused() -> str:
        for _ in range(1000):
            wal.append(payload_for(wal.next_offset, size=MESSAGE))
        return "never refused"

    fs.hold_syncs()
    try:
        wal.append(payload_for(0, size=MESSAGE))
        wait_until(lambda: fs.syncs_waiting >= 1)  # its writer is stuck: nothing more is taken
        outcome = run_as_writer_thread(append_until_refused)
        assert len(outcome) == 1 and isinstance(outcome[0], WalTimeout), outcome
        pending = wal._core.pending_bytes
        assert limit <= pending <= limit + MESSAGE + 100, (pending, limit)
    finally:
        fs.release_syncs()
    appended = wal.next_offset
    wal.flush()
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(appended))
    wal.close()
    budgets.close()
