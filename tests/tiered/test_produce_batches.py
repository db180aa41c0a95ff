"""A produced batch is one contiguous, all-or-nothing run of offsets.

Before, produce_many appended message by
message, so while one batch waited on backpressure another batch's messages landed
between its offsets, and the HTTP answer ``range(first, last + 1)`` acknowledged offsets
holding other producers' messages (the same offset to two producers); and a batch that
failed half-way (an oversized message) left its first messages appended, so a retry
duplicated them.
"""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from wal.config import WalConfig
from wal.errors import MessageTooLarge

from tests.tiered.helpers_lifecycle import TOPIC, Cluster, local_cluster, read_all  # noqa: F401


def test_concurrent_batches_under_backpressure_never_interleave(local_cluster: Cluster) -> None:
    # A tiny write buffer makes every batch wait for room while the others append.
    wal = WalConfig(pending_bytes_max=4096, max_message_bytes=1024)
    a = local_cluster.broker("A", wal_config=wal)
    hosted = a.load(TOPIC)
    producers, batches, size = 4, 10, 50
    results: dict[tuple[int, int], tuple[int, int]] = {}
    errors: list[BaseException] = []

    def produce(p: int) -> None:
        try:
            for b in range(batches):
                payloads = [f"p{p}-b{b}-m{m}".encode() for m in range(size)]
                results[(p, b)] = hosted.produce_many(payloads)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    messages = {m.offset: m.payload for m in read_all(hosted, 0, producers * batches * size - 1)}
    claimed: set[int] = set()
    for (p, b), (first, last) in results.items():
        assert last - first + 1 == size
        offsets = set(range(first, last + 1))
        assert not offsets & claimed, "an offset was acknowledged to two batches"
        claimed |= offsets
        assert [messages[o] for o in range(first, last + 1)] == [f"p{p}-b{b}-m{m}".encode() for m in range(size)]


def test_a_batch_with_one_oversized_message_appends_nothing(local_cluster: Cluster) -> None:
    a = local_cluster.broker("A", wal_config=replace(WalConfig(), max_message_bytes=1024))
    hosted = a.load(TOPIC)
    with pytest.raises(MessageTooLarge):
        hosted.produce_many([b"small", b"x" * 4096])
    assert hosted.next_offset == 0
    assert hosted.produce_many([b"small"]) == (0, 0)


def test_appends_waiting_for_room_hold_up_neither_each_other_nor_an_unload(local_cluster: Cluster) -> None:
    """Appends to one topic that wait for room (the WAL root's pending budget is full behind
    a stalled disk) wait side by side, each for at most append_timeout_s, and an unload's
    first step refuses them at once: they end with TopicUnloading and use no offset.
    atk87 F1: a lock held across the append made them queue one append_timeout_s after
    another (16 appends: the last after 16 x), and the unload behind them."""
    from tests.wal.helpers import wait_until
    from tiered.lifecycle import BrokerHost
    from tiered.lifecycle.errors import TopicUnloading
    from wal.testing import FaultFs

    fs = FaultFs()
    wal = WalConfig(append_timeout_s=600.0, pending_group_bytes_max=64 * 1024, max_message_bytes=64 * 1024)
    host = BrokerHost("A", local_cluster.wal_root("A"), local_cluster.metadata, local_cluster.objects,
                      replace(local_cluster.config, wal_config=wal), wal_fs=fs)
    local_cluster.hosts.append(host)
    hosted, other = host.load(TOPIC), host.load(TOPIC + "_other")
    group = host.root.group
    assert group is not None and group.pending_budget is not None
    fs.hold_syncs()
    outcomes: list[BaseException] = []
    try:
        other.wal.append(b"x" * 100)  # a round stuck in its sync
        wait_until(lambda: fs.syncs_waiting == 1)
        while not group.pending_budget.full:  # never taken while the sync is stuck
            other.wal.append(b"x" * 60_000)

        def produce() -> None:
            try:
                hosted.produce_many([b"m" * 1000])
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                outcomes.append(exc)

        producers = [threading.Thread(target=produce) for _ in range(4)]
        for thread in producers:
            thread.start()
        wait_until(lambda: group.room_waiters == len(producers))  # side by side, not behind a lock
        refusing = threading.Thread(target=hosted.refuse_appends)
        refusing.start()
        refusing.join(60)
        assert not refusing.is_alive(), "the unload's first step waited for the stalled disk"
        for thread in producers:
            thread.join(60)
            assert not thread.is_alive()
        assert len(outcomes) == len(producers) and all(isinstance(e, TopicUnloading) for e in outcomes), outcomes
        assert hosted.wal.next_offset == 0, "a refused append used no offset"
    finally:
        fs.release_syncs()
