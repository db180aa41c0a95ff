"""Shared helpers for WAL tests: deterministic payloads and whole-log reads."""
from __future__ import annotations

import hashlib
import struct

from wal import WalConfig, WriteAheadLog

_TAG = struct.Struct("<QI")


def payload_for(offset: int, round_id: int = 0, size: int | None = None) -> bytes:
    """A payload that names its offset and writer round, padded with a checkable digest."""
    head = _TAG.pack(offset, round_id)
    size = (offset * 37 + round_id) % 200 if size is None else size
    pad = hashlib.blake2b(head, digest_size=32).digest()
    return head + (pad * (size // 32 + 1))[:size]


def check_payload(payload: bytes) -> tuple[int, int]:
    """(offset, round_id) a payload claims; asserts its padding is intact."""
    offset, round_id = _TAG.unpack_from(payload, 0)
    assert payload == payload_for(offset, round_id, len(payload) - _TAG.size), f"payload of {offset} damaged"
    return offset, round_id


def read_all(wal: WriteAheadLog, from_offset: int | None = None) -> list:
    start = wal.first_offset if from_offset is None else from_offset
    with wal.reader(start, live=False) as reader:
        return list(reader)


def small_config(**overrides) -> WalConfig:
    base = dict(segment_bytes_max=4096, cache_messages_max=64,
                cache_bytes_max=16 * 1024, read_chunk_bytes=2048, index_interval_bytes=256)
    base.update(overrides)
    return WalConfig(**base)
