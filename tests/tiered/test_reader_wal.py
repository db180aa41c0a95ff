"""TieredReader over the WAL tier alone: replay → live tiers, positions, errors, async."""
from __future__ import annotations

import asyncio
import threading

import pytest

from tests.tiered.helpers_read import TOPIC, MemoryWal, record
from tiered.read.messages import Message
from tiered.metadata import open_metadata
from tiered.objects import open_objects
from tiered.read.errors import ReaderClosed, UnknownOffset
from tiered.read.reader import create_reader


@pytest.fixture
def stores(tmp_path):
    metadata = open_metadata(f"sqlite://{tmp_path}/m.db")
    objects = open_objects(f"file://{tmp_path}/o")
    yield metadata, objects
    metadata.close()


def take(reader, count: int) -> list[Message]:
    return [next(reader) for _ in range(count)]


def test_replay_then_live_with_tiers(stores) -> None:
    wal = MemoryWal(first_offset=22)
    wal.append(6)  # 22..27 already durable
    reader = iter(create_reader(TOPIC, wal, *stores, 24))
    got = take(reader, 4)
    assert [m.offset for m in got] == [24, 25, 26, 27]
    assert {m.tier for m in got} == {"wal"}
    assert got[0][:5] == tuple(record(24))
    wal.append(3)
    live = take(reader, 3)
    assert [(m.offset, m.tier) for m in live] == [(28, "live"), (29, "live"), (30, "live")]
    assert reader.position == 31
    reader.close()
    with pytest.raises(ReaderClosed):
        next(reader)


def test_latest_and_not_live(stores) -> None:
    wal = MemoryWal(first_offset=0)
    wal.append(5)
    assert create_reader(TOPIC, wal, *stores, "latest").position == 5
    assert [m.offset for m in create_reader(TOPIC, wal, *stores, 2, live=False)] == [2, 3, 4]


def test_start_beyond_the_topic_is_unknown(stores) -> None:
    wal = MemoryWal(first_offset=0)
    wal.append(5)
    with pytest.raises(UnknownOffset):
        create_reader(TOPIC, wal, *stores, 6)
    with pytest.raises(ValueError):
        create_reader(TOPIC, wal, *stores, -1)


def test_live_appends_while_reading_no_gap_no_dup(stores) -> None:
    wal = MemoryWal(first_offset=0)
    wal.append(10)
    stop = threading.Event()

    def produce() -> None:
        for _ in range(200):
            if stop.is_set():
                return
            wal.append(3)

    producer = threading.Thread(target=produce)
    producer.start()
    reader = create_reader(TOPIC, wal, *stores, 0)
    try:
        offsets = [m.offset for m in take(iter(reader), 610)]
    finally:
        stop.set()
        producer.join(5)
        reader.close()
    assert offsets == list(range(610))


def test_async_iteration_does_not_block_the_loop(stores) -> None:
    wal = MemoryWal(first_offset=0)
    wal.append(5)

    async def main() -> list[tuple[int, str]]:
        ticks = 0

        async def ticker() -> None:
            # The live data comes only after the loop ran 5 more times while the reader
            # waited for it: a reader blocking the loop would never get it (counted, not
            # timed: no assumption on how fast a loaded machine runs the loop).
            nonlocal ticks
            while True:
                if len(got) >= 5:  # the reader has every record there is, and waits
                    ticks += 1
                    if ticks == 5:
                        wal.append(2)
                await asyncio.sleep(0.005)

        got: list[tuple[int, str]] = []
        async with create_reader(TOPIC, wal, *stores, 0) as reader:
            tick_task = asyncio.create_task(ticker())
            async for message in reader:
                got.append((message.offset, message.tier))
                if len(got) == 7:
                    break
        tick_task.cancel()
        assert ticks >= 5  # the loop kept running while the reader waited for live data
        return got

    got = asyncio.run(asyncio.wait_for(main(), 10))
    assert got == [(o, "wal") for o in range(5)] + [(5, "live"), (6, "live")]
