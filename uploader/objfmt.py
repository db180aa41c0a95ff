"""The one seam between the uploader and the dnb1 object format.

The uploader needs exactly three things from the format: turn a run of raw WAL frames into
object bytes, and get the raw frames back out of an existing object (to decide whether an
object found under our key holds byte-identical frames and may be adopted). Both come from
``native.object_format`` (the spec lives there); nothing here defines bytes of its own.
"""
from __future__ import annotations

import logging

from uploader.config import UploaderConfig
from wal.topics import TopicName

log = logging.getLogger(__name__)


def encode_object(topic: TopicName, frames: bytes, config: UploaderConfig,
                  first_offset: int | None = None) -> bytes:
    """dnb1 object bytes holding ``frames`` (whole, validated WAL frames) verbatim."""
    from native import object_format

    level = config.zstd_level if config.compression == "zstd" else 0
    return object_format.write_object(
        frames, topic=str(topic), block_bytes=config.block_bytes, zstd_level=level,
        first_offset=first_offset,
    )


def object_frames(data: bytes, object_name: str) -> bytes:
    """The raw frames an object holds, concatenated; raises CorruptObject if it is bad."""
    from native import object_format

    return object_format.read_all_frames(data, object_name=object_name)


def object_digest(data: bytes, object_name: str):
    """``ObjectDigest(footer_crc32c, block_crc32c)`` of a whole, valid object."""
    from native import object_format

    return object_format.object_digest(data, object_name)
