"""Offsets never wrap: one maximum offset (2**63 - 1), checked at every entry point.

A WAL opened near 2**64 once acknowledged appends at offsets 0 and 1 that it never wrote
(the compiled core's u64 wrapped), and a metadata record claiming such an offset made
produce exit 0 with ``last_offset: 0``. Both twins must refuse the same way, with a
typed error, before anything is acknowledged.
"""
from __future__ import annotations

import pytest

import wal.log
from native.errors import OffsetOverflow
from native.format import MAX_OFFSET
from tiered.errors import MalformedRecord
from tiered.metadata import keys
from wal import WriteAheadLog

from tests.native.test_append_buffer import make


@pytest.fixture
def twin_wal(codec, monkeypatch):
    """The WAL running on the given codec twin's append core."""
    monkeypatch.setattr(wal.log, "AppendBuffer", codec.AppendBuffer)
    return codec


def test_the_core_assigns_the_maximum_offset_and_then_refuses(codec) -> None:
    core, _ = make(codec, next_offset=MAX_OFFSET - 1)
    assert core.append(b"a", publish_time=1) == MAX_OFFSET - 1
    assert core.append(b"b", publish_time=1) == MAX_OFFSET
    with pytest.raises(OffsetOverflow):
        core.append(b"c", publish_time=1)
    with pytest.raises(OffsetOverflow):
        core.append_batch([b"c", b"d"], publish_time=1)
    assert core.next_offset == MAX_OFFSET + 1


def test_a_batch_that_would_cross_the_limit_appends_nothing(codec) -> None:
    core, _ = make(codec, next_offset=MAX_OFFSET - 1)
    with pytest.raises(OffsetOverflow):
        core.append_batch([b"a", b"b", b"c"], publish_time=1)
    assert core.next_offset == MAX_OFFSET - 1


@pytest.mark.parametrize("start", [MAX_OFFSET + 2, 2**64 - 2, 2**64 - 1])
def test_the_core_refuses_to_start_past_the_limit(codec, start: int) -> None:
    with pytest.raises(OffsetOverflow):
        make(codec, next_offset=start)


@pytest.mark.parametrize("initial", [MAX_OFFSET + 2, 2**64 - 2, -1])
def test_wal_open_refuses_an_initial_offset_past_the_limit_and_writes_nothing(tmp_path, twin_wal,
                                                                                initial: int) -> None:
    with pytest.raises(OffsetOverflow):
        WriteAheadLog.open(str(tmp_path), "/ns/full", initial_offset=initial)
    assert not (tmp_path / "ns" / "full").exists() or not any(
        p.suffix == ".seg" for p in (tmp_path / "ns" / "full").iterdir())


def test_a_full_wal_refuses_appends_and_reopens_the_same(tmp_path, twin_wal) -> None:
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", initial_offset=MAX_OFFSET - 1)
    try:
        assert log.append(b"a") == MAX_OFFSET - 1
        assert log.append(b"b") == MAX_OFFSET
        with pytest.raises(OffsetOverflow):
            log.append(b"c")
        log.flush(10.0)
        assert log.durable_offset == MAX_OFFSET
    finally:
        log.close()
    again = WriteAheadLog.open(str(tmp_path), "/ns/t")
    try:
        assert again.next_offset == MAX_OFFSET + 1
        with pytest.raises(OffsetOverflow):
            again.append(b"c")
    finally:
        again.close()


@pytest.mark.parametrize("record, raw", [
    ("state", b'{"sealed": false, "last_committed_offset": 18446744073709551612, "broker_id": "A", "timestamp": 1}'),
    ("cursor", b'{"last_acked_offset": 9223372036854775808}'),
    ("descriptor", b'{"start_offset": 0, "end_offset": 18446744073709551615, "object_id": "x", "size": 1,'
                   b' "etag": "e", "created_at": 1, "broker_id": "A", "epoch": 1}'),
])
def test_metadata_records_past_the_limit_are_malformed(record: str, raw: bytes) -> None:
    cls = {"state": keys.SealedState, "cursor": keys.Cursor, "descriptor": keys.ObjectDescriptor}[record]
    with pytest.raises(MalformedRecord):
        cls.from_json("/k", raw)
