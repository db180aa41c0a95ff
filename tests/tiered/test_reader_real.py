"""The seed's history with the real WAL and the real uploader: broker A writes and archives
0..21 from its WAL directory, broker B's WAL continues at 22; readers read it all."""
from __future__ import annotations

import threading

import pytest

from tests.tiered.helpers_read import TOPIC, Backends, backends, record  # noqa: F401 (fixture)
from tiered.read.messages import Message
from tiered.metadata import keys
from tiered.metadata.base import value_is
from tiered.read.reader import create_reader
from uploader.config import UploaderConfig
from uploader.uploader import Uploader
from wal.log import WriteAheadLog

FLUSH_S = 10.0


def append(wal: WriteAheadLog, start: int, end: int) -> None:
    for offset in range(start, end + 1):
        r = record(offset)
        assert wal.append(r.payload, key=r.key, attributes=r.attributes or None, publish_time=r.publish_time) == offset
    wal.flush(FLUSH_S)


def archive_with_uploader(b: Backends, wal: WriteAheadLog, broker_id: int, epoch: int) -> None:
    owner = keys.owner_key(TOPIC)
    held = f"owner {broker_id} epoch {epoch}".encode()
    b.metadata.put(owner, held)
    # Small objects and blocks so 22 messages make several objects of several blocks.
    config = UploaderConfig(interval_s=3600, object_bytes_max=600, block_bytes=200, compression="zstd")
    uploader = Uploader(TOPIC, wal, b.metadata, b.objects, broker_id=broker_id, fencing=[value_is(owner, held)],
                        config=config, committed_through=None, epoch=epoch)
    try:
        uploader.drain(FLUSH_S)
    finally:
        uploader.close(FLUSH_S)


@pytest.fixture
def two_brokers(backends: Backends, tmp_path):
    wal_a = WriteAheadLog.open(str(tmp_path / "broker-a"), TOPIC)
    append(wal_a, 0, 21)
    archive_with_uploader(backends, wal_a, broker_id=1, epoch=1)
    wal_a.close()
    wal_b = WriteAheadLog.open(str(tmp_path / "broker-b"), TOPIC, initial_offset=22)
    append(wal_b, 22, 27)
    yield backends, wal_b
    wal_b.close()


def test_seed_history_from_every_offset(two_brokers) -> None:
    b, wal = two_brokers
    descriptors = b.metadata.range(keys.objects_prefix(TOPIC))
    assert len(descriptors) >= 3  # several objects, so object->object handoffs are exercised
    for start in range(28):
        with create_reader(TOPIC, wal, b.metadata, b.objects, start, live=False) as reader:
            want = [Message.from_record(record(o), "cloud" if o < 22 else "wal") for o in range(start, 28)]
            assert list(reader) == want, f"start={start}"


def test_consumer_resumes_at_14_while_broker_b_keeps_producing(two_brokers) -> None:
    b, wal = two_brokers
    stop = threading.Event()

    def produce() -> None:
        offset = 28
        while not stop.is_set() and offset < 600:
            append(wal, offset, offset + 9)
            offset += 10

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        with create_reader(TOPIC, wal, b.metadata, b.objects, 14) as reader:
            got = [next(reader) for _ in range(400)]
    finally:
        stop.set()
        producer.join(FLUSH_S)
    assert [m.offset for m in got] == list(range(14, 414))
    assert all(m[:5] == tuple(record(m.offset)) for m in got)
    assert [m.tier for m in got[:8]] == ["cloud"] * 8
    assert got[8].tier in ("wal", "live")


def test_async_for_with_the_real_wal(two_brokers) -> None:
    import asyncio

    b, wal = two_brokers

    async def main() -> list[tuple[int, str]]:
        got: list[tuple[int, str]] = []
        async with create_reader(TOPIC, wal, b.metadata, b.objects, 19) as reader:
            async for message in reader:
                got.append((message.offset, message.tier))
                if message.offset == 27:  # caught up: what is appended now arrives live
                    threading.Thread(target=append, args=(wal, 28, 30)).start()
                if message.offset == 30:
                    break
        return got

    got = asyncio.run(asyncio.wait_for(main(), 20))
    assert got == ([(o, "cloud") for o in range(19, 22)] + [(o, "wal") for o in range(22, 28)]
                   + [(o, "live") for o in range(28, 31)])


def test_a_lagging_live_reader_never_drops_messages(backends: Backends, tmp_path) -> None:
    """A tail reader that lags past its channel or the cache must not drop messages. Here a live reader that stalls while 3,000 messages pass a 16-message cache
    still gets every one of them, in order."""
    from wal.config import WalConfig

    wal = WriteAheadLog.open(str(tmp_path / "w"), TOPIC, WalConfig(cache_messages_max=16, cache_bytes_max=4096))
    try:
        reader = create_reader(TOPIC, wal, backends.metadata, backends.objects, "latest")
        append(wal, 0, 2_999)  # the reader is not reading at all meanwhile
        got = [next(reader) for _ in range(3_000)]
        reader.close()
    finally:
        wal.close()
    assert [m.offset for m in got] == list(range(3_000))
    assert all(m[:5] == tuple(record(m.offset)) for m in got[::97])
