"""CloudReader: footer + only-needed-block fetches, gaps, corruption, prefetch, both backends."""
from __future__ import annotations

import threading

import pytest

from native import object_format
from tests.tiered.helpers_read import (  # noqa: F401 (fixture)
    STALL_HANG_GUARD_S, TOPIC, Backends, StallingObjects, archive, backends, record)
from tests.wal.helpers import wait_until
from tiered.read.cloud import CloudReader
from tiered.read.messages import Message
from tiered.read.errors import CorruptArchive, DataGap, ReaderClosed, ReadTimeout


def offsets(messages) -> list[int]:
    return [m.offset for m in messages]


def reader(b: Backends, start: int, end: int, **kw) -> CloudReader:
    return CloudReader(TOPIC, b.metadata, b.objects, start, end, **kw)


def test_reads_exact_records_across_objects(backends: Backends) -> None:
    archive(backends, 0, 9)
    archive(backends, 10, 21, broker_id="broker-b", epoch=2)
    with reader(backends, 3, 17) as r:
        got = list(r)
    assert got == [Message.from_record(record(o), "cloud") for o in range(3, 18)]
    assert r.objects_opened == 2 and r.footer_gets == 2


def test_middle_read_fetches_footer_once_and_only_needed_blocks(backends: Backends) -> None:
    key, data = archive(backends, 0, 399, block_bytes=256)
    footer = object_format.parse_footer(data, key, len(data))
    assert len(footer.blocks) > 40  # enough blocks for "only some" to mean something
    needed = object_format.select_blocks(footer, 200, 204)
    footer_bytes = object_format.footer_bytes_needed(data, key, len(data))
    # A guess that holds the footer but is far smaller than the object (the default,
    # 64 KiB, would take this whole small test object in its one footer GET).
    guess = footer_bytes + 64
    with reader(backends, 200, 204, footer_guess_bytes=guess) as r:
        assert offsets(r) == list(range(200, 205))
    assert r.footer_gets == 1
    assert r.blocks_fetched == len(needed)
    assert r.block_gets == 1  # adjacent blocks come in one ranged GET
    assert r.bytes_fetched == guess + sum(b.stored_bytes for b in needed)
    assert r.bytes_fetched < len(data) // 2  # never the whole object for a middle read


def test_footer_larger_than_the_guess_takes_one_more_get(backends: Backends) -> None:
    key, data = archive(backends, 0, 99, block_bytes=128)
    with reader(backends, 50, 50, footer_guess_bytes=64) as r:
        assert offsets(r) == [50]
    assert r.footer_gets == 2 and r.blocks_fetched == 1


def test_runs_are_bounded_by_the_memory_budget(backends: Backends) -> None:
    archive(backends, 0, 199, block_bytes=256)
    with reader(backends, 0, 199, memory_bytes_max=2048, prefetch_objects=1) as r:
        assert offsets(r) == list(range(200))
    assert r.block_gets > 3  # the object came in several bounded runs, not one GET


def test_missing_descriptor_range_is_a_data_gap(backends: Backends) -> None:
    archive(backends, 0, 9)
    archive(backends, 20, 29)
    got: list[int] = []
    with pytest.raises(DataGap) as info, reader(backends, 5, 29) as r:
        for message in r:
            got.append(message.offset)
    assert (info.value.start, info.value.end) == (10, 19)
    assert got == list(range(5, 10))  # everything before the gap, nothing after it


def test_range_past_the_archive_is_a_data_gap(backends: Backends) -> None:
    archive(backends, 0, 9)
    with pytest.raises(DataGap) as info:
        list(reader(backends, 0, 14))
    assert (info.value.start, info.value.end) == (10, 14)


def test_missing_object_is_a_data_gap(backends: Backends) -> None:
    key, _ = archive(backends, 0, 9)
    backends.objects.delete(key)
    with pytest.raises(DataGap) as info:
        list(reader(backends, 0, 9))
    assert (info.value.start, info.value.end) == (0, 9)


def flip_byte_in_block(index: int):
    def mangle(data: bytes) -> bytes:
        footer = object_format.parse_footer(data, "x", len(data))
        block = footer.blocks[index]
        at = block.position + block.stored_bytes // 2
        return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
    return mangle


@pytest.mark.parametrize("prefetch", [0, 1])
def test_corrupt_block_is_typed_and_serves_no_wrong_message(backends: Backends, prefetch: int) -> None:
    archive(backends, 0, 99, block_bytes=256, mangle=flip_byte_in_block(3))
    got: list[Message] = []
    with pytest.raises(CorruptArchive) as info, reader(backends, 0, 99, prefetch_objects=prefetch) as r:
        for message in r:
            got.append(message)
    assert info.value.__cause__ is not None  # the codec's CorruptObject is kept
    assert got == [Message.from_record(record(o), "cloud") for o in range(len(got))]
    assert len(got) < 100


def test_corrupt_trailer_is_typed(backends: Backends) -> None:
    archive(backends, 0, 9, mangle=lambda d: d[:-1] + b"X")
    with pytest.raises(CorruptArchive):
        list(reader(backends, 0, 9))


@pytest.mark.parametrize("damage", ["magic", "topic"])
def test_a_damaged_header_is_refused_when_the_first_block_is_read(backends: Backends, damage: str) -> None:
    """The descriptor's pins cover the footer and the blocks, not the header: a reader that
    fetches an object's first block gets the header with it and checks it (atk33 F11)."""
    def mangle(data: bytes) -> bytes:
        at = 0 if damage == "magic" else 16  # the magic, or a byte of the topic name
        return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]

    archive(backends, 0, 99, block_bytes=256, mangle=mangle)
    with pytest.raises(CorruptArchive, match="header|magic|CRC"), reader(backends, 0, 99) as r:
        list(r)
    # Read from the middle, nothing served comes from the header, and every byte is pinned.
    with reader(backends, 50, 99) as r:
        assert offsets(r) == list(range(50, 100))


def test_descriptor_that_disagrees_with_the_object_is_corrupt(backends: Backends) -> None:
    archive(backends, 0, 9, descriptor_end=12)
    with pytest.raises(CorruptArchive):
        list(reader(backends, 0, 12))


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_prefetch_depth_does_not_change_the_stream(backends: Backends, prefetch: int) -> None:
    for start in range(0, 60, 10):
        archive(backends, start, start + 9, block_bytes=300)
    with reader(backends, 7, 55, prefetch_objects=prefetch) as r:
        assert offsets(r) == list(range(7, 56))
    assert r.objects_opened == 6


def test_close_mid_stream_stops_the_prefetcher(backends: Backends) -> None:
    for start in range(0, 40, 10):
        archive(backends, start, start + 9)
    r = reader(backends, 0, 39, prefetch_objects=2)
    assert next(r).offset == 0
    r.close()
    assert r.objects_opened <= 3  # current + 2 prefetched, never the whole range


def test_close_from_another_thread_while_next_runs_is_reader_closed(backends: Backends) -> None:
    """close() may come from any thread (a long poll's watchdog does this) while the
    consumer thread is inside next(): here, while it lists descriptors, just before it
    hands the next object to the prefetch pool that close() shut down. The consumer must
    see ReaderClosed (a ReadError), not the pool's RuntimeError."""
    for start in range(0, 40, 10):
        archive(backends, start, start + 9)
    r = reader(backends, 0, 39, prefetch_objects=1)
    real_range = backends.metadata.range

    class ClosingMetadata:
        def __getattr__(self, name):
            return getattr(backends.metadata, name)

        def range(self, *args, **kwargs):
            page = real_range(*args, **kwargs)
            r.close()  # what the other thread does at this instant
            return page

    r.metadata = ClosingMetadata()
    with pytest.raises(ReaderClosed):
        next(r)


def _consume_in_thread(r: CloudReader) -> tuple[threading.Thread, list]:
    """Iterate ``r`` on a thread of its own; ``outcome`` gets the offsets, then the error."""
    outcome: list = []

    def consume() -> None:
        try:
            for message in r:
                outcome.append(message.offset)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            outcome.append(e)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("prefetch", [0, 1])
def test_close_frees_a_consumer_waiting_on_a_stalled_object_store(backends: Backends, prefetch: int) -> None:
    """An object store that stalls (an S3 endpoint that never answers) must not pin the
    consumer past close(): a long poll's deadline and a topic moving away both end a read
    by closing its reader from another thread, and they need the consumer back at once
    (ReaderClosed), not when the GET gives up (fetch_timeout_s, 120 s by default)."""
    archive(backends, 0, 9)
    store = StallingObjects(backends.objects)
    store.armed = True
    r = CloudReader(TOPIC, backends.metadata, store, 0, 9, prefetch_objects=prefetch)
    try:
        thread, outcome = _consume_in_thread(r)
        assert store.wait_stalled(), "the reader never asked the store for the object"
        r.close()
        thread.join(STALL_HANG_GUARD_S)
        assert not thread.is_alive(), "the consumer stayed in the stalled GET after close()"
        assert not store.release.is_set()  # the GET is still stalled: close() alone freed the consumer
        [error] = outcome
        assert isinstance(error, ReaderClosed)
    finally:
        store.release.set()


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_get_abandoned_on_a_stalled_store_never_holds_up_the_process_exit(backends: Backends,
                                                                            prefetch: int) -> None:
    """concurrent.futures joins its workers at interpreter exit: a GET that a closed reader
    abandoned on an executor's thread would keep the process (a broker shutting down, a
    CLI consumer) from exiting until the store answered (atk65 f02). Consumed here from
    a non-daemon thread, as a broker's read threads are (threads inherit it)."""
    archive(backends, 0, 9)
    store = StallingObjects(backends.objects)
    store.armed = True
    r = CloudReader(TOPIC, backends.metadata, store, 0, 9, prefetch_objects=prefetch)
    closer = threading.Thread(target=lambda: store.wait_stalled() and r.close(), daemon=True)
    closer.start()
    try:
        with pytest.raises(ReaderClosed):
            next(iter(r))
        stalled = [t for t in threading.enumerate() if t.name.startswith(("dnb-fetch", "dnb-prefetch"))]
        assert stalled and all(t.daemon for t in stalled), [(t.name, t.daemon) for t in stalled]
    finally:
        store.release.set()
        closer.join(STALL_HANG_GUARD_S)


def test_close_frees_a_consumer_waiting_on_a_later_run_of_blocks(backends: Backends) -> None:
    """The object's later runs of blocks (fetched while the object is consumed, not
    prepared ahead) stall the same way: close() frees the consumer there too."""
    archive(backends, 0, 199, block_bytes=256)
    store = StallingObjects(backends.objects)
    r = CloudReader(TOPIC, backends.metadata, store, 0, 199, memory_bytes_max=2048, prefetch_objects=1)
    try:
        assert next(r).offset == 0  # footer and first run fetched; the object is one of several runs
        store.armed = True
        thread, outcome = _consume_in_thread(r)
        assert store.wait_stalled(), "the reader never asked for the next run"
        r.close()
        thread.join(STALL_HANG_GUARD_S)
        assert not thread.is_alive(), "the consumer stayed in the stalled GET after close()"
        assert not store.release.is_set()
        *served, error = outcome
        assert isinstance(error, ReaderClosed)
        assert served == list(range(1, 1 + len(served))) and len(served) < 199
    finally:
        store.release.set()


def test_gets_abandoned_on_a_stalled_store_are_bounded_across_retried_reads(backends: Backends,
                                                                           monkeypatch) -> None:
    """Each read retried while the store stalls abandons its GETs on their threads, which
    live until the store answers (atk65 f01): without a bound a client retrying its read
    piles up threads without limit. At most GETS_IN_FLIGHT_MAX run per store; a read that
    finds them all taken starts none and times out (ReadTimeout) or is closed; once the
    store answers, reads work again."""
    from tiered.read import cloud

    monkeypatch.setattr(cloud, "GETS_IN_FLIGHT_MAX", 3)
    archive(backends, 0, 9)
    store = StallingObjects(backends.objects)
    store.armed = True

    def running() -> int:
        return len([t for t in threading.enumerate() if t.name.startswith(("dnb-fetch", "dnb-prefetch"))])

    before = running()
    try:
        for _attempt in range(3):  # each retry stalls and is closed (a long poll's deadline)
            r = CloudReader(TOPIC, backends.metadata, store, 0, 9, prefetch_objects=0)
            thread, outcome = _consume_in_thread(r)
            assert store.wait_stalled()
            r.close()
            thread.join(STALL_HANG_GUARD_S)
            assert isinstance(outcome[0], ReaderClosed)
        assert running() - before == 3
        # Every slot is taken by a stalled GET: the next read starts no thread and gives up.
        r = CloudReader(TOPIC, backends.metadata, store, 0, 9, prefetch_objects=0, fetch_timeout_s=0.2)
        with pytest.raises(ReadTimeout):
            next(iter(r))
        assert running() - before == 3
        # ... and one waiting for a slot is freed by close().
        r = CloudReader(TOPIC, backends.metadata, store, 0, 9, prefetch_objects=0)
        thread, outcome = _consume_in_thread(r)
        r.close()
        thread.join(STALL_HANG_GUARD_S)
        assert not thread.is_alive() and isinstance(outcome[0], ReaderClosed)
    finally:
        store.release.set()
    store.armed = False
    wait_until(lambda: running() == before)
    with CloudReader(TOPIC, backends.metadata, store, 0, 9, prefetch_objects=0) as r:
        assert [m.offset for m in r] == list(range(10))
