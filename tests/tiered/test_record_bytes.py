"""The stored bytes of metadata records, pinned: records written by earlier versions must
compare equal (value compares) and parse, so the shared JSON helper may not change them."""
from __future__ import annotations

import pytest

from tiered.cluster import records
from tiered.errors import MalformedRecord
from tiered.lifecycle.ownership import OwnerRecord
from tiered.lifecycle.restore import Progress
from tiered.metadata import keys


def test_bytes_are_sorted_compact_json() -> None:
    assert keys.Cursor(7).to_json() == b'{"last_acked_offset":7}'
    assert records.encode(records.LeaderRecord("b1", 1.5, "n")) == b'{"broker_id":"b1","elected_at":1.5,"nonce":"n"}'
    assert OwnerRecord("b1", 2, 3.0, None, "b0", (("b0", 1),)).encode() == (
        b'{"acquired_at":3.0,"broker_id":"b1","epoch":2,"inherits":[["b0",1]],'
        b'"previous_broker_id":"b0","released_at":null}')
    assert Progress("b1", 2, None, 4.0).encode() == b'{"broker_id":"b1","durable_offset":null,"epoch":2,"timestamp":4.0}'


DEEP = b"[" * 100_000 + b"]" * 100_000  # json.loads raises RecursionError, not ValueError


@pytest.mark.parametrize("raw", [b"not json", b"[1]", b"\xff", DEEP])
def test_every_decoder_names_the_key_of_a_value_that_is_not_a_json_object(raw: bytes) -> None:
    for decode in (lambda: keys.Cursor.from_json("/k", raw),
                   lambda: records.decode(records.LeaderRecord, "/k", raw),
                   lambda: OwnerRecord.decode("/k", raw),
                   lambda: Progress.decode("/k", raw)):
        with pytest.raises(MalformedRecord) as info:
            decode()
        assert info.value.key == "/k"


def test_local_json_files_nested_too_deep_read_as_damaged_not_as_a_crash(tmp_path) -> None:
    """.walid, wal.ckpt and .owner nested too deep read as unreadable (None), as garbled
    ones do: never an internal error (atk63 f03)."""
    from tiered.lifecycle.wal_root import decode_marker
    from wal.checkpoint import CHECKPOINT_NAME, read_checkpoint
    from wal.fs import RealFs
    from wal.identity import WAL_ID_NAME, read_wal_id

    for name in (WAL_ID_NAME, CHECKPOINT_NAME):
        (tmp_path / name).write_bytes(DEEP)
    assert read_wal_id(RealFs(), str(tmp_path)) is None
    assert read_checkpoint(RealFs(), str(tmp_path)) is None
    assert decode_marker(DEEP) is None
