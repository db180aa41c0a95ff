"""One archive object: the one seam between the project and the dnb1 format.

Everything that writes or reads an archived object's bytes goes through here, and every
call into ``native.object_format`` (whose docstring is the format spec) is made here:

* the uploader (writing): :func:`encode_object`, and :func:`object_frames` /
  :func:`object_digest` to adopt an object already under its key and to pin what it
  commits;
* the cloud reader and Spark (ranged reads): :func:`read_footer` — one suffix GET, a
  second only when the footer outgrew the guess — then :func:`check_footer` and, per
  fetched block, :func:`block_records` or :func:`block_frames`;
* verify (whole objects): :func:`read_whole_object`.

A read of an object a descriptor names is ALWAYS held to that descriptor, through its
:class:`ObjectPin`: the object's real size (returned with the footer bytes) must be the
descriptor's ``size``; the footer's CRC32C its ``footer_crc32c``; each block's CRC32C its
entry in ``block_crc32c`` (checked before a byte of the block is decoded; the codec then
checks that CRC against the bytes). The footer binds every block's position, length and
offsets and each block's CRC binds its bytes, so an object replaced after its commit, by
whatever writer, fails here even when only a few blocks are fetched. Only Spark's read
by location (no metadata, so no descriptor) reads unpinned.

Every failure is a :class:`native.errors.CorruptObject` naming the object and a byte
position; :class:`ObjectMismatch` (a subclass) when its size or footer CRC32C are not the
pinned ones (a block's CRC32C that differs is the codec's own ``CorruptObject``). Missing
objects raise the store's ``ObjectNotFound``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from native import Block, Footer, Record, object_format
from native.errors import CorruptObject
from tiered.metadata.keys import ObjectDescriptor
from tiered.objects.base import ByteRequest, RangeByteRequest
from wal.topics import TopicName

FOOTER_GUESS_BYTES: int = object_format.FOOTER_GUESS_BYTES
ObjectDigest = object_format.ObjectDigest

__all__ = [
    "FOOTER_GUESS_BYTES", "Block", "Footer", "ObjectDigest", "ObjectMismatch", "ObjectPin", "block_frames",
    "block_records", "check_footer", "check_header", "encode_object", "object_digest", "object_frames", "read_footer",
    "read_whole_object",
]  # fmt: skip


class ObjectMismatch(CorruptObject):
    """A readable object that is not the one its descriptor pins: ``what`` is ``"size"``
    or ``"digest"`` (footer or block CRC32C)."""

    def __init__(self, object_name: str, position: int, what: str, reason: str) -> None:
        super().__init__(object_name, position, reason)
        self.what = what


@dataclass(frozen=True, slots=True)
class ObjectPin:
    """What a descriptor records to pin one exact object (picklable, sent to Spark tasks)."""

    size: int
    footer_crc32c: int
    #: 8 lowercase hex digits per block, in block order.
    block_crc32c: str

    @classmethod
    def of(cls, descriptor: ObjectDescriptor) -> "ObjectPin":
        return cls(descriptor.size, descriptor.footer_crc32c, descriptor.block_crc32c)

    def block_crc(self, index: int) -> int | None:
        """Block ``index``'s recorded CRC32C (None when the digest has no entry for it)."""
        entry = self.block_crc32c[8 * index:8 * index + 8]
        return int(entry, 16) if len(entry) == 8 else None


# -- writing (the uploader) ---------------------------------------------------------------

def encode_object(topic: TopicName | str, frames: bytes, *, block_bytes: int, zstd_level: int,
                  first_offset: int | None = None) -> bytes:
    """dnb1 object bytes holding ``frames`` (whole, validated WAL frames) verbatim;
    ``zstd_level`` 0 stores blocks as they are."""
    return object_format.write_object(frames, topic=str(topic), block_bytes=block_bytes, zstd_level=zstd_level,
                                      first_offset=first_offset)


def object_frames(data: bytes, object_name: str, topic: TopicName | str) -> bytes:
    """The raw frames a whole object of ``topic`` holds, concatenated; CorruptObject if it
    is bad or names another topic. The topic is checked as the ranged readers check it
    (``check_footer``): an object the readers refuse must not pass here either, or the
    uploader would adopt, and verify would rate sound, an object no reader serves."""
    frames = object_format.read_all_frames(data, object_name=object_name)  # header and footer agree
    expected = str(TopicName.parse(topic))
    header = object_format.parse_header(data, object_name)
    if header.topic != expected:
        raise CorruptObject(object_name, 0, f"object names topic {header.topic!r}, expected {expected!r}")
    return frames


def object_digest(data: bytes, object_name: str) -> ObjectDigest:
    """``ObjectDigest(footer_crc32c, block_crc32c)`` of a whole, valid object: what a
    descriptor records."""
    return object_format.object_digest(data, object_name)


# -- reading with ranged GETs (cloud reader, Spark) ----------------------------------------

class RangedReads(Protocol):
    """The reads :func:`read_footer` makes: an ``ObjectStore``, or a wrapper that counts them."""

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]: ...

    def get_range(self, key: str, byte_range: ByteRequest) -> bytes: ...


def read_footer(store: RangedReads, key: str, size: int, pin: ObjectPin | None, *,
                guess_bytes: int = FOOTER_GUESS_BYTES) -> Footer:
    """The validated footer of ``key``: one suffix GET, a second only for a footer longer
    than ``guess_bytes``.

    With a ``pin`` the first GET also returns the object's real size, which must be the
    pinned one, and the footer's CRC32C must be the pinned one (so must its block count).
    Without one (an object listed by location), ``size`` is the listed size.
    """
    if pin is None:
        return _parse_footer(store, key, size, None, guess_bytes)
    tail, actual_size = store.get_tail(key, guess_bytes)
    if actual_size != pin.size:
        raise ObjectMismatch(key, 0, "size", f"object is {actual_size} bytes, its descriptor says {pin.size} "
                                             "(not the object that was committed)")
    footer = _parse_footer(store, key, pin.size, tail, guess_bytes)
    try:
        object_format.check_footer_digest(tail, footer, key, pin.footer_crc32c, pin.block_crc32c)
    except CorruptObject as e:
        raise ObjectMismatch(key, e.position, "digest", e.reason) from None
    return footer


def _parse_footer(store: RangedReads, key: str, size: int, tail: bytes | None, guess_bytes: int) -> Footer:
    def get_range(start: int, end: int) -> bytes:  # the first call asks for exactly the tail we hold
        if tail is not None and end == size and size - start == len(tail):
            return tail
        return store.get_range(key, RangeByteRequest(start, end))

    try:
        return object_format.read_footer(get_range, size, key, guess_bytes=guess_bytes)
    except CorruptObject:
        raise
    except ValueError as e:  # bytes the codec could not even frame
        raise CorruptObject(key, 0, f"not a valid dnb1 object: {e}") from e


def check_footer(key: str, footer: Footer, topic: TopicName | str | None = None,
                 first_offset: int | None = None, last_offset: int | None = None) -> None:
    """The footer must name ``topic`` and hold exactly ``first_offset..last_offset`` (the
    descriptor's range), in contiguous blocks; each check is skipped when its value is None."""
    if topic is not None and footer.topic != str(TopicName.parse(topic)):
        raise CorruptObject(key, footer.footer_position, f"footer names topic {footer.topic!r}, expected "
                                                         f"{str(TopicName.parse(topic))!r}")
    blocks = footer.blocks
    if not blocks:
        raise CorruptObject(key, footer.footer_position, "footer lists no blocks")
    held = (blocks[0].first_offset, blocks[-1].last_offset)
    if first_offset is not None and last_offset is not None and held != (first_offset, last_offset):
        raise CorruptObject(key, footer.footer_position, f"footer says offsets {held[0]}..{held[1]} but the "
                                                         f"descriptor says {first_offset}..{last_offset}")
    for before, after in zip(blocks, blocks[1:]):
        if after.first_offset != before.last_offset + 1 or after.position < before.end:
            raise CorruptObject(key, after.position, f"block index not contiguous after offset {before.last_offset}")


def check_header(key: str, data: bytes | memoryview, footer: Footer) -> None:
    """The object's header (the first ``footer.header_bytes`` of ``data``, its first bytes)
    must be valid (magic, version, flags, CRC) and agree with the footer: the same topic
    and length. A ranged reader checks it whenever it fetches the object's first block
    (the header comes with it in the same GET); the bytes it serves are pinned by the
    footer and block CRCs either way."""
    header = object_format.parse_header(memoryview(data)[:footer.header_bytes], key)
    if header.header_bytes != footer.header_bytes or header.topic != footer.topic:
        raise CorruptObject(key, 0, f"header ({header.topic!r}, {header.header_bytes} bytes) disagrees with the "
                                    f"footer ({footer.topic!r}, {footer.header_bytes} bytes)")


def block_records(key: str, raw: bytes | memoryview, block: Block, pin: ObjectPin | None) -> list[Record]:
    """Every record of one block (``raw`` = exactly its stored bytes), validated in full
    (CRC, decompression, every frame) and checked to be exactly the offsets its index
    entry names; with a ``pin``, its CRC32C must be the recorded one first."""
    _check_block_pin(key, raw, block, pin)
    records = object_format.decode_block(raw, block, key)
    count = block.last_offset - block.first_offset + 1
    if len(records) != count or records[0][0] != block.first_offset or records[-1][0] != block.last_offset:
        first = records[0][0] if records else None
        raise CorruptObject(key, block.position, f"block decodes to {len(records)} records from {first}, "
                                                 f"index says {block.first_offset}..{block.last_offset}")
    return records


def block_frames(key: str, raw: bytes | memoryview, block: Block, crc32c: int | None) -> bytes:
    """The raw WAL frames of one block, validated as :func:`block_records` validates them;
    ``crc32c`` is the block's recorded CRC32C (None only for an object read by location)."""
    if crc32c is not None:
        object_format.check_block_crc32c(raw, block, key, crc32c)
    return object_format.block_frames(raw, block, key)


def _check_block_pin(key: str, raw: bytes | memoryview, block: Block, pin: ObjectPin | None) -> None:
    if pin is not None:
        # A missing entry is a mismatch too (the footer check makes it impossible).
        object_format.check_block_digest(raw, block, key, pin.block_crc32c)


# -- reading a whole object (verify) -------------------------------------------------------

def read_whole_object(key: str, data: bytes, pin: ObjectPin, topic: TopicName | str) -> bytes:
    """The frames of a whole object of ``topic`` held in memory, after every check: its
    size, then every block and frame and the topic it names, then its digest against ``pin``."""
    if len(data) != pin.size:
        raise ObjectMismatch(key, 0, "size", f"object is {len(data)} bytes, its descriptor says {pin.size}: "
                                             "not the object that was committed")
    frames = object_frames(data, key, topic)
    digest = object_digest(data, key)
    if (digest.footer_crc32c, digest.block_crc32c) != (pin.footer_crc32c, pin.block_crc32c):
        raise ObjectMismatch(key, 0, "digest", "a valid object but not the one its descriptor pins "
                                               "(footer/block CRC32C differ): it was replaced after its commit")
    return frames
