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


def test_retention_overtaking_a_reader_mid_stream_sends_it_to_the_archive(backends: Backends) -> None:
    """WAL retention removes only archived segments, so a reader it overtakes after
    serving from the WAL (slower than the uploader) reads on from the archive: no
    OffsetBelowRetention, no skip."""
    wal = history(backends)
    reader = create_reader(TOPIC, wal, backends.metadata, backends.objects, 25, live=False)
    assert [next(reader).offset for _ in range(2)] == [25, 26]  # from the WAL
    archive(backends, 28, 31, broker_id="broker-b", epoch=2)
    wal.trim(32)  # 27..31 archived meanwhile, and retention dropped them from the WAL
    rest = list(reader)
    assert [m.offset for m in rest] == list(range(27, 34))
    assert [m.tier for m in rest] == ["cloud"] * 5 + ["wal"] * 2


def test_a_reader_that_keeps_losing_the_race_to_retention_still_reads_everything(backends: Backends) -> None:
    """Each time the reader is back at the WAL, retention has moved past it again: it falls
    back to the archive as often as that happens (every fallback serves something), and
    never reports a DataGap for data the archive holds."""
    wal = history(backends)  # archived 0..27, WAL 25..33
    archived_end = 27
    reader = create_reader(TOPIC, wal, backends.metadata, backends.objects, 20, live=False)
    got = []
    for _round in range(20):  # more rounds than any fixed limit on fallbacks
        while True:  # up to the first message the WAL serves
            message = next(reader)
            got.append(message.offset)
            if message.tier != "cloud":
                break
        wal.append(4)
        tip = wal.next_offset - 1
        archive(backends, archived_end + 1, tip - 1, broker_id="broker-b", epoch=2)
        archived_end = tip - 1
        wal.trim(tip)  # everything archived is dropped from the WAL
    got.extend(m.offset for m in reader)
    assert got == list(range(20, wal.next_offset))


def test_earliest_racing_the_first_upload_and_retention_starts_at_the_archive(backends: Backends) -> None:
    """'earliest' reads the (empty) archive, and meanwhile the first upload lands and WAL
    retention drops what it archived: the start must still be 0, not the WAL's new first
    offset (which would skip the archived prefix for good, e.g. as a new subscription's
    cursor)."""
    from tiered.read.reader import earliest_offset
    from wal.topics import TopicName

    wal = MemoryWal(first_offset=0)
    wal.append(30)

    class UploadLandsDuringTheRead:
        """The metadata store, where the first archive read returns what it saw just
        before the upload and the WAL retention behind it landed."""

        def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
            self._inner, self._landed = inner, False

        def range(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            page = self._inner.range(*args, **kwargs)
            if not self._landed and "/objects/" in str(args[0]):
                self._landed = True
                archive(backends, 0, 19)
                wal.trim(15)
            return page

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self._inner, name)

    racing = UploadLandsDuringTheRead(backends.metadata)
    assert earliest_offset(TopicName.parse(TOPIC), wal, racing) == 0  # type: ignore[arg-type]
    assert earliest_offset(TopicName.parse(TOPIC), wal, backends.metadata) == 0


def test_overlapping_descriptors_are_refused_not_served(backends: Backends) -> None:
    """Two objects claiming the same offsets (damaged or hostile metadata): which one is
    the topic's history cannot be told, so the reader refuses instead of picking one."""
    from tiered.read.errors import CorruptArchive

    archive(backends, 0, 9)
    archive(backends, 5, 14, broker_id="broker-b", epoch=2)
    got = []
    with pytest.raises(CorruptArchive, match="overlapping"):
        for message in create_reader(TOPIC, None, backends.metadata, backends.objects, 0, live=False):
            got.append(message.offset)
    assert got == list(range(10))


def test_an_async_poll_cancelled_during_an_archive_read_keeps_its_error(backends: Backends) -> None:
    """An archive read that fails (a transient store error) while the await that started it
    was cancelled: the next await gets that error, typed, not a DataGap for data the archive
    holds."""
    from tiered.errors import StorageUnavailable

    archive(backends, 0, 9)
    wal = MemoryWal(first_offset=10)
    wal.append(5)
    gate, inside = threading.Event(), threading.Event()

    class FailingOnce:
        def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
            self._inner, self._failed = inner, False

        def get_tail(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if not self._failed:
                self._failed = True
                inside.set()
                gate.wait(60)
                raise StorageUnavailable("injected transient failure")
            return self._inner.get_tail(*args, **kwargs)

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self._inner, name)

    reader = create_reader(TOPIC, wal, backends.metadata, FailingOnce(backends.objects), 0,  # type: ignore[arg-type]
                           live=False, prefetch_objects=0)

    async def consume() -> BaseException | None:
        it = reader.__aiter__()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(it.__anext__(), 0.05)
        assert inside.is_set() or await asyncio.to_thread(inside.wait, 60)
        gate.set()
        try:
            await it.__anext__()
        except BaseException as e:  # noqa: BLE001 - checked below
            return e
        return None

    error = asyncio.run(consume())
    assert isinstance(error, StorageUnavailable), repr(error)
