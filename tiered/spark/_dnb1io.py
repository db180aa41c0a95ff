"""The one seam between the Spark source and the dnb1 format and object stores.

Planning and reading see only :class:`ObjectIndex` / :class:`BlockRef`, validated frame
bytes and ``native.columns.Columns`` buffers; every call into ``native.object_format``
(whose docstring is the format spec), ``native.columns`` and ``tiered.objects`` goes
through here. Errors in the object's bytes
surface as :class:`native.errors.CorruptObject` naming the object and byte position.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from native.errors import CorruptObject
from tiered.objects import ObjectStore, open_objects

OBJECT_SUFFIX = ".dnb1"


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


def get_range(store: ObjectStore, key: str, start: int, end_inclusive: int) -> bytes:
    return store.get_range(key, start, end_inclusive)


def read_index(store: ObjectStore, key: str, size: int, topic: str | None = None,
               digest: tuple[int, str] | None = None) -> ObjectIndex:
    """The validated footer of ``key`` (one ranged GET of the tail, two for a huge footer).

    ``topic``, when given, must be the topic the object says it holds: a descriptor can
    never make us serve another topic's messages. ``digest`` (the descriptor's
    ``footer_crc32c, block_crc32c``), when given, pins the object: its real size must be
    ``size``, its footer CRC the recorded one, and every block is later checked against
    its recorded CRC before a row is decoded.
    """
    from native import object_format as fmt

    if digest is None:
        footer = fmt.read_footer(lambda start, end: store.get_range(key, start, end - 1), size, key)
    else:
        footer = _read_pinned_footer(store, key, size, digest)
    block_crcs = [None] * len(footer.blocks) if digest is None else [
        int(digest[1][8 * i:8 * i + 8], 16) for i in range(len(footer.blocks))]
    if topic is not None and footer.topic.strip("/") != topic.strip("/"):
        raise CorruptObject(key, footer.footer_position, f"object holds topic {footer.topic!r}, not {topic!r}")
    blocks = tuple(
        BlockRef(b.index, b.first_offset, b.last_offset, b.min_publish_time, b.max_publish_time,
                 b.position, b.stored_bytes, b.raw_bytes, crc)
        for b, crc in zip(footer.blocks, block_crcs)
    )
    # The format reader validated the index; these are the invariants planning relies on.
    assert blocks and blocks[0].first_offset == footer.first_offset and blocks[-1].last_offset == footer.last_offset
    return ObjectIndex(key, size, footer.first_offset, footer.last_offset, blocks)


def _read_pinned_footer(store: ObjectStore, key: str, size: int, digest: tuple[int, str]) -> Any:
    from native import object_format as fmt

    tail, actual_size = store.get_tail(key, fmt.FOOTER_GUESS_BYTES)
    if actual_size != size:
        raise CorruptObject(key, 0, f"object is {actual_size} bytes, its descriptor says {size} "
                                    "(not the object that was committed)")

    def get_range(start: int, end: int) -> bytes:  # the first call asks for exactly the tail we hold
        if end == size and size - start == len(tail):
            return tail
        return store.get_range(key, start, end - 1)

    try:
        footer = fmt.read_footer(get_range, size, key)
    except CorruptObject:
        raise
    except ValueError as e:  # bytes the codec could not even frame
        raise CorruptObject(key, 0, f"not a valid dnb1 object: {e}") from e
    fmt.check_footer_digest(tail, footer, key, digest[0], digest[1])
    return footer


def _check_pinned(key: str, raw: bytes | memoryview, block: BlockRef) -> None:
    if block.crc32c is not None:
        from native import object_format as fmt

        fmt.check_block_crc32c(raw, _native_block(block), key, block.crc32c)


def _native_block(block: BlockRef) -> Any:
    from native import object_format as fmt

    return fmt.Block(block.index, block.position, block.length, block.raw_bytes,
                     block.first_offset, block.last_offset, block.min_time_ms, block.max_time_ms)


def decode_block(key: str, raw: bytes | memoryview, block: BlockRef) -> Sequence[Any]:
    """All records of one block (``native.Record`` tuples), fully validated by the codec;
    CorruptObject names the object and byte position of anything wrong."""
    from native import object_format as fmt

    _check_pinned(key, raw, block)
    return fmt.decode_block(raw, _native_block(block), key)


def block_frames(key: str, raw: bytes | memoryview, block: BlockRef) -> bytes:
    """The raw WAL frames of one block, validated exactly as :func:`decode_block` does (block
    CRC, decompression, every frame's CRC and record, offsets and times against the index)."""
    from native import object_format as fmt

    _check_pinned(key, raw, block)
    return fmt.block_frames(raw, _native_block(block), key)


def decode_columns(frames: bytes | memoryview, first_offset: int | None, last_offset: int | None,
                   min_time_ms: int | None, max_time_ms: int | None) -> Any:
    """Validated frames → ``native.columns.Columns`` for the rows inside the windows."""
    from native import columns

    return columns.decode_columns(frames, first_offset, last_offset, min_time_ms, max_time_ms)
