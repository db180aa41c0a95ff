"""What Spark sends to its tasks about an object: its block index, and the store to read it.

Planning turns each object's footer into an :class:`ObjectIndex` of :class:`BlockRef`
(plain, picklable values a task on another machine receives); reading hands each fetched
block back to :mod:`tiered.archive.fetch`, the one seam to the dnb1 format, which holds it
to the CRC32C its descriptor recorded. Errors in an object's bytes surface as
:class:`native.errors.CorruptObject` naming the object and byte position.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from tiered.archive import fetch
from tiered.archive.fetch import Block, ObjectPin
from tiered.objects import ObjectStore, open_objects


@dataclass(frozen=True, slots=True)
class BlockRef:
    """One block of an object, as its footer describes it (picklable, sent to tasks)."""

    index: int
    first_offset: int
    last_offset: int
    min_time_ms: int
    max_time_ms: int
    position: int  # byte position of the block in the object
    length: int  # stored bytes (block header + possibly compressed body)
    raw_bytes: int
    #: The block's CRC32C as the descriptor records it (None when read by location: there
    #: is no descriptor to hold the object to).
    crc32c: int | None = None


@dataclass(frozen=True, slots=True)
class ObjectIndex:
    key: str
    size: int
    first_offset: int
    last_offset: int
    blocks: tuple[BlockRef, ...]


@functools.lru_cache(maxsize=8)
def store_for(url: str, options: tuple[tuple[str, str], ...] = ()) -> ObjectStore:
    """One store per (URL, options) per process: a boto3 client costs ~50 ms to build and
    Spark reuses Python workers across tasks."""
    kwargs: dict[str, Any] = {}
    if url.startswith("s3://"):
        names = {"endpoint": "endpoint_url", "region": "region"}
        kwargs = {names[k]: v for k, v in options if k in names}
    return open_objects(url, **kwargs)


def read_index(store: ObjectStore, key: str, size: int, topic: str | None = None,
               pin: ObjectPin | None = None) -> ObjectIndex:
    """The validated footer of ``key`` (one ranged GET of the tail, two for a huge footer).

    ``topic``, when given, must be the topic the object says it holds: a descriptor can
    never make us serve another topic's messages. ``pin`` (from the descriptor), when
    given, holds the object to its descriptor: its real size, its footer CRC, and later
    every block's CRC before a row is decoded.
    """
    footer = fetch.read_footer(store, key, size, pin)
    if topic is not None:
        fetch.check_footer(key, footer, topic)
    blocks = tuple(
        BlockRef(b.index, b.first_offset, b.last_offset, b.min_publish_time, b.max_publish_time,
                 b.position, b.stored_bytes, b.raw_bytes, None if pin is None else pin.block_crc(b.index))
        for b in footer.blocks
    )
    # The format reader validated the index; these are the invariants planning relies on.
    assert blocks and blocks[0].first_offset == footer.first_offset and blocks[-1].last_offset == footer.last_offset
    return ObjectIndex(key, size, footer.first_offset, footer.last_offset, blocks)


def block_frames(key: str, raw: bytes | memoryview, block: BlockRef) -> bytes:
    """The raw WAL frames of one block, validated in full (its recorded CRC32C when it has
    one, the block CRC, decompression, every frame's CRC and record, offsets and times
    against the index)."""
    native_block = Block(block.index, block.position, block.length, block.raw_bytes,
                         block.first_offset, block.last_offset, block.min_time_ms, block.max_time_ms)
    return fetch.block_frames(key, raw, native_block, block.crc32c)
