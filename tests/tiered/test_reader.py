"""TieredReader across tiers: a multi-broker history read from every offset, handoffs
under concurrent appends, retention racing the reader, gaps, cloud-only, async."""
from __future__ import annotations

import asyncio
import threading

import pytest

from tests.tiered.helpers_read import TOPIC, Backends, MemoryWal, archive, backends, record  # noqa: F401
from tiered.read.messages import Message
from tiered.read.errors import DataGap
from tiered.read.reader import create_reader


def history(b: Backends) -> MemoryWal:
    """Broker A archived 0..9 and 10..21; broker B archived 22..27 and its WAL holds 25..33."""
    archive(b, 0, 9, broker_id="broker-a", epoch=1)
    archive(b, 10, 21, broker_id="broker-a", epoch=1, block_bytes=200)
    archive(b, 22, 27, broker_id="broker-b", epoch=2)
    wal = MemoryWal(first_offset=25)
    wal.append(9)  # 25..33
    return wal


def expected(start: int, end: int, wal_first: int) -> list[Message]:
    return [Message.from_record(record(o), "cloud" if o < wal_first else "wal") for o in range(start, end + 1)]


def test_every_start_offset_yields_exactly_the_history(backends: Backends) -> None:
    wal = history(backends)
    for start in range(0, 35):
        with create_reader(TOPIC, wal, backends.metadata, backends.objects, start, live=False) as reader:
            assert list(reader) == expected(start, 33, 25), f"start={start}"
            assert reader.position == 34


def test_earliest_and_cloud_only(backends: Backends) -> None:
    wal = history(backends)
    reader = create_reader(TOPIC, wal, backends.metadata, backends.objects, "earliest", live=False)
    assert reader.position == 0
    assert [m.offset for m in reader] == list(range(34))
    # The topic is not hosted here: the archive alone, up to its last committed offset.
    cloud_only = create_reader(TOPIC, None, backends.metadata, backends.objects, 14)
    assert list(cloud_only) == expected(14, 27, 100)


def test_handoff_cloud_wal_live_while_appends_continue(backends: Backends) -> None:
    wal = history(backends)
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set() and wal.next_offset < 2_000:
            wal.append(7)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        with create_reader(TOPIC, wal, backends.metadata, backends.objects, 3) as reader:
            got = [next(reader) for _ in range(1_500)]
    finally:
        stop.set()
        producer.join(5)
    assert [m.offset for m in got] == list(range(3, 1_503))  # no gap, no duplicate
    assert all(m[:5] == tuple(record(m.offset)) for m in got)
    tiers = [m.tier for m in got]
    assert tiers[:22] == ["cloud"] * 22  # 3..24 from the archive
    # Tiers only move forward: cloud, then WAL replay, then live.
    order = {"cloud": 0, "wal": 1, "live": 2}
    assert [order[t] for t in tiers] == sorted(order[t] for t in tiers)


def test_retention_moving_during_the_cloud_read_rereads_the_archive(backends: Backends) -> None:
    wal = history(backends)
    reader = create_reader(TOPIC, wal, backends.metadata, backends.objects, 20, live=False)
    assert next(reader).offset == 20  # the plan was cloud 20..24, then the WAL at 25
    wal.trim(28)  # retention dropped 25..27 meanwhile (they are archived)
    rest = list(reader)
    assert [m.offset for m in rest] == list(range(21, 34))
    assert [m.tier for m in rest] == ["cloud"] * 7 + ["wal"] * 6


def test_gap_between_archive_and_wal_is_named(backends: Backends) -> None:
    archive(backends, 0, 9)
    wal = MemoryWal(first_offset=15)
    wal.append(3)
    got = []
    with pytest.raises(DataGap) as info:
        for message in create_reader(TOPIC, wal, backends.metadata, backends.objects, 0, live=False):
            got.append(message.offset)
    assert (info.value.start, info.value.end) == (10, 14)
    assert got == list(range(10))


def test_async_for_across_all_tiers(backends: Backends) -> None:
    wal = history(backends)

    async def main() -> list[tuple[int, str]]:
        got: list[tuple[int, str]] = []
        reader = create_reader(TOPIC, wal, backends.metadata, backends.objects, 18)
        async with reader:
            async for message in reader:
                got.append((message.offset, message.tier))
                if message.offset == 33:  # caught up: what is appended now arrives live
                    asyncio.get_running_loop().call_later(0.02, wal.append, 3)
                if message.offset == 36:
                    break
        return got

    got = asyncio.run(asyncio.wait_for(main(), 20))
    assert got == ([(o, "cloud") for o in range(18, 25)] + [(o, "wal") for o in range(25, 34)]
                   + [(o, "live") for o in range(34, 37)])


def test_cancelled_async_reads_lose_and_repeat_nothing(backends: Backends) -> None:
    wal = history(backends)

    async def main() -> list[int]:
        got: list[int] = []
        reader = create_reader(TOPIC, wal, backends.metadata, backends.objects, 0, live=False,
                               prefetch_objects=0)
        it = reader.__aiter__()
        for _ in range(2_000):  # bounded: each round either times out or makes progress
            try:
                message = await asyncio.wait_for(it.__anext__(), timeout=0.0005)
            except TimeoutError:
                continue  # the await was cancelled mid-fetch; the next one must pick up cleanly
            except StopAsyncIteration:
                break
            got.append(message.offset)
        await reader.aclose()
        return got

    assert asyncio.run(main()) == list(range(34))
