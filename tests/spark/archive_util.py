"""Test archives written straight with the dnb1 writer plus descriptor puts.

This mirrors what the uploader commits (object under ``naming.object_key``, descriptor under
``keys.descriptor_key``) without running brokers, so Spark tests stay fast and exact.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import native
from native import object_format
from tiered.archive import naming
from tiered.metadata import keys
from tiered.metadata.base import MetadataStore
from tiered.objects.base import ObjectStore

BASE_TIME_MS = 1_700_000_000_000


@dataclass(frozen=True)
class Produced:
    offset: int
    publish_time: int
    key: bytes | None
    attributes: dict[str, str]
    payload: bytes


def messages(count: int, first_offset: int = 0, time_step_ms: int = 10) -> list[Produced]:
    out = []
    for i in range(first_offset, first_offset + count):
        key = f"k{i % 7}".encode() if i % 3 == 0 else None
        attrs = {"source": "test", "n": str(i)} if i % 5 == 0 else {}
        out.append(Produced(i, BASE_TIME_MS + i * time_step_ms, key, attrs, f"payload-{i:08d}".encode()))
    return out


def object_bytes(topic: str, msgs: list[Produced], block_bytes: int = 2048, zstd_level: int = 3) -> bytes:
    frames = b"".join(native.encode_frame(m.offset, m.publish_time, m.key, m.attributes or None, m.payload) for m in msgs)
    return object_format.write_object(frames, topic=topic, block_bytes=block_bytes, zstd_level=zstd_level,
                                      first_offset=msgs[0].offset)


def write_archive(objects: ObjectStore, metadata: MetadataStore | None, topic: str, msgs: list[Produced],
                  splits: list[tuple[int, int, str, int]], block_bytes: int = 2048,
                  zstd_level: int = 3) -> list[str]:
    """One object per ``(start, end, broker_id, epoch)`` split; returns the object keys."""
    by_offset = {m.offset: m for m in msgs}
    written = []
    for start, end, broker, epoch in splits:
        part = [by_offset[o] for o in range(start, end + 1)]
        data = object_bytes(topic, part, block_bytes, zstd_level)
        object_id = f"data-{start}-{end}"
        key = naming.object_key(topic, start, object_id)
        info = objects.put(key, data)
        if metadata is not None:
            d = keys.ObjectDescriptor(start, end, object_id, len(data), info.etag, time.time(), broker, epoch,
                                      *object_format.object_digest(data), compression="zstd")
            metadata.put(keys.descriptor_key(topic, start), d.to_json())
        written.append(key)
    return written
