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
