"""The dnb1 archive object format. This docstring is the specification (mirrored in
``docs/FORMAT.md``); both codec twins implement it and produce identical bytes.

A dnb1 object holds a contiguous run of one topic's messages as the *same WAL frames* the WAL
wrote (``native/format.py``), copied verbatim, so archiving never re-encodes a record and every
frame keeps its own CRC32C. All integers are little-endian; CRC32C is the one of format.py.

Layout
======
::

    header | block 0 | block 1 | ... | block B-1 | footer | trailer (16 bytes)

A reader fetches the footer with ONE suffix-range GET (the trailer says how long the footer
is; a second GET is needed only when the footer is longer than the guessed suffix), picks the
blocks that overlap the offsets (or publish times) it wants from the footer's block index, and
range-GETs only those blocks: block *i* is bytes ``[position, position + stored size)``.

Header (14 + T bytes, at byte 0)
--------------------------------
::

    0     4  magic            b"DNB1"
    4     2  format version   1 (readers reject other versions)
    6     2  flags            0 (readers reject unknown flags)
    8     2  T                topic length, 1 <= T <= 65535
    10    T  topic            UTF-8
    10+T  4  header CRC32C    over bytes [0, 10 + T)

Block (16 + C bytes)
--------------------
::

    0   4  CRC32C          over bytes [4, 16 + C): the block header fields and the stored body
    4   1  codec           0 = stored as is, 1 = zstd
    5   3  reserved        0
    8   4  C               stored body length
    12  4  R               raw length: the bytes of WAL frames the body holds, R >= 17
    16  C  body            codec 0: the frames themselves (C == R);
                           codec 1: one zstd frame whose content size is R

Frames in a block are whole and their offsets contiguous; blocks follow each other with no
gap, and together hold offsets ``first_offset .. last_offset`` of the footer, each once, in
order. The writer fills a block with whole frames until the next frame would take its raw
size past the target block size (a single frame larger than the target gets a block of its
own). With compression on, a block whose zstd body would not be smaller than R is stored as
is (codec 0), so incompressible data costs nothing. zstd is written with content size, without
its own checksum (the block CRC and the frame CRCs already cover it) and without dictionary.

Footer (66 + T + 48 B bytes, right after the last block)
--------------------------------------------------------
::

    0     4  magic             b"DNBF"
    4     2  footer version    1
    6     2  flags             0
    8     8  first_offset      u64, offset of the first frame of block 0
    16    8  last_offset       u64, offset of the last frame of block B-1
    24    8  message count     == last_offset - first_offset + 1
    32    8  min publish_time  u64 ms, over every record of the object
    40    8  max publish_time  u64 ms
    48    8  H                 header length == position of block 0
    56    4  B                 block count, B >= 1
    60    2  T                 topic length (the same topic as the header, so a reader that
                               fetched only the footer can check it opened the right object)
    62    T  topic             UTF-8
    62+T  48 x B               block index (the sparse offset -> position index), per block:
              0   8  position          byte position of the block in the object
              8   8  first_offset      offset of its first frame
              16  8  last_offset       offset of its last frame
              24  4  stored size       16 + C
              28  4  raw size          R
              32  8  min publish_time  over its records
              40  8  max publish_time
    end   4  footer CRC32C     over every footer byte before it

Trailer (16 bytes, the last bytes of the object)
------------------------------------------------
::

    0   4  F                footer length in bytes, CRC included
    4   2  format version   1
    6   2  reserved         0
    8   4  CRC32C           over trailer bytes [0, 8)
    12  4  magic            b"DNB1"

Validation
==========
A reader checks, and raises ``native.errors.CorruptObject(object_name, position, reason)``
naming the byte position of what is wrong on any failure (it never returns a wrong record):
trailer magic/CRC/version; footer CRC/magic/version/flags, that F matches T and B, that the
message count matches the offsets, that index entries tile ``[H, footer position)`` without gap
and hold contiguous offsets ``first_offset .. last_offset``, and that the footer's publish-time
range is the union of the blocks'; header magic/version/flags/CRC and that it matches the
footer; per block, its length against the index, its CRC, codec, C and R against the index,
that it decompresses to exactly R bytes, and that its frames are valid, contiguous, exactly
``first_offset .. last_offset`` of its index entry, with publish times inside the entry's range.
Positions inside a compressed block name the block's start (the reason names the frame's
position inside the decompressed block).

API
===
Small on purpose; everything takes the object name only to put it in errors.

* :func:`write_object` — WAL frame bytes → object bytes (frames validated, offsets contiguous).
* :func:`footer_bytes_needed` / :func:`parse_footer` — the reader's first GET; :func:`read_footer`
  does the GETs through a ``get_range(start, end)`` callable.
* :func:`select_blocks` — the blocks overlapping an offset and/or publish-time range.
* :func:`decode_block` → records (filtered to a range); :func:`block_frames` → validated raw frames.
* :func:`read_records` / :func:`iter_records` / :func:`read_all_frames` — a whole object in memory.
* :func:`object_digest` — what a descriptor records to pin one exact object: the footer's
  CRC32C and every block's CRC32C (the first 4 bytes of each block). A reader that holds the
  footer checks it with :func:`check_footer_digest`, and each block it fetched with
  :func:`check_block_digest`, before decoding anything; the footer binds every block's
  position, length and offsets, each block's CRC binds its bytes, so together they pin every
  byte of the object while still letting a reader fetch only the blocks it needs.

Every function takes ``codec=`` (one of ``native.available_codecs()``) for tests; it defaults to
the implementation selected in ``native/__init__.py``.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast, runtime_checkable

if TYPE_CHECKING:
    import zstandard

    from native.errors import CorruptObject
    from native.format import Buffer, Record

OBJECT_MAGIC = b"DNB1"
OBJECT_VERSION = 1

HEADER_FIXED = struct.Struct("<4sHHH")  # magic, version, flags, topic length
HEADER_FIXED_BYTES = HEADER_FIXED.size  # 10
HEADER_CRC_BYTES = 4

BLOCK_HEADER = struct.Struct("<IBBHII")  # crc, codec, reserved u8, reserved u16, C, R
BLOCK_HEADER_BYTES = BLOCK_HEADER.size  # 16
BLOCK_CODEC_NONE = 0
BLOCK_CODEC_ZSTD = 1
# One frame of the smallest possible record: a block never holds less.
BLOCK_RAW_BYTES_MIN = 17

FOOTER_MAGIC = b"DNBF"
FOOTER_VERSION = 1
FOOTER_FIXED = struct.Struct("<4sHHQQQQQQIH")
FOOTER_FIXED_BYTES = FOOTER_FIXED.size  # 62
FOOTER_ENTRY = struct.Struct("<QQQIIQQ")
FOOTER_ENTRY_BYTES = FOOTER_ENTRY.size  # 48
FOOTER_CRC_BYTES = 4

TRAILER = struct.Struct("<IHHI4s")  # footer length, version, reserved, crc, magic
TRAILER_BYTES = TRAILER.size  # 16

# Smallest footer: a one-byte topic and one block.
FOOTER_BYTES_MIN = FOOTER_FIXED_BYTES + 1 + FOOTER_ENTRY_BYTES + FOOTER_CRC_BYTES

DEFAULT_BLOCK_BYTES = 1 << 20
# Raw size of a block is a u32; keeping the target at or below 2 GiB leaves room for one
# oversize frame (at most MAX_RECORD_BYTES + 16) past it.
MAX_BLOCK_BYTES = 1 << 31
# Level 3 is zstd's own default, chosen explicitly: ~250 MB/s on this kind of machine, so
# compression never limits an uploader. 0 means "store blocks as is".
DEFAULT_ZSTD_LEVEL = 3
ZSTD_LEVEL_MAX = 22
# One suffix GET of this size holds the footer of an object with ~1,300 blocks.
FOOTER_GUESS_BYTES = 64 * 1024


class Block(NamedTuple):
    """One entry of the footer's block index."""

    # A field named like the tuple method ``index``; the field is what callers read.
    index: int  # type: ignore[assignment]
    position: int
    stored_bytes: int
    raw_bytes: int
    first_offset: int
    last_offset: int
    min_publish_time: int
    max_publish_time: int

    @property
    def end(self) -> int:
        """Byte position just past the block: fetch ``[position, end)``."""
        return self.position + self.stored_bytes


class Footer(NamedTuple):
    """What the footer says about the object, with the byte layout the reader needs."""

    topic: str
    first_offset: int
    last_offset: int
    message_count: int
    min_publish_time: int
    max_publish_time: int
    header_bytes: int
    footer_position: int
    object_size: int
    blocks: tuple[Block, ...]


class ObjectHeader(NamedTuple):
    topic: str
    header_bytes: int


@runtime_checkable
class ObjectsTwin(Protocol):
    """dnb1 objects: the primitives behind native.object_format (use that module's API)."""


    def object_encode(self, frames: Buffer, topic: str, block_bytes: int, zstd_level: int,
                      first_offset: int | None) -> bytes: ...
    def object_footer_bytes_needed(self, tail: Buffer, object_name: str,
                                   object_size: int | None) -> int: ...
    def object_parse_footer(self, tail: Buffer, object_name: str, object_size: int) -> Footer: ...
    def object_parse_header(self, data: Buffer, object_name: str) -> ObjectHeader: ...
    def object_decode_block(self, data: Buffer, block: Block, object_name: str,
                            first_offset: int | None, last_offset: int | None,
                            min_publish_time: int | None, max_publish_time: int | None,
                            want_records: bool) -> list[Record] | bytes: ...


def zstd_compressor(level: int) -> zstandard.ZstdCompressor:
    """The zstd compressor of block bodies, every knob explicit (content size on, checksum and
    dictionary id off, no worker threads), so both codec twins, and later versions of the
    zstandard package, write the bytes this specification describes."""
    import zstandard  # late: only writers need it

    return zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=True,
                                    write_dict_id=False, threads=0)


def _codec(codec: ObjectsTwin | None) -> ObjectsTwin:
    if codec is not None:
        return codec
    from native import codec as selected  # late: native/__init__ imports this module
    return selected


def write_object(frames: Buffer, *, topic: str, block_bytes: int = DEFAULT_BLOCK_BYTES,
                 zstd_level: int = DEFAULT_ZSTD_LEVEL, first_offset: int | None = None,
                 codec: ObjectsTwin | None = None) -> bytes:
    """The dnb1 object holding ``frames`` (whole WAL frames, bytes-like) verbatim.

    Frames are validated (CRC, length, record) and their offsets must be contiguous, starting
    at ``first_offset`` when given. ``zstd_level`` 0 stores blocks uncompressed, 1..22 is the
    zstd level. Raises ``CodecError`` for bad input (there is no object yet to be corrupt).
    """
    return _codec(codec).object_encode(frames, topic, block_bytes, zstd_level, first_offset)


def footer_bytes_needed(tail: Buffer, object_name: str, object_size: int | None = None, *,
                        codec: ObjectsTwin | None = None) -> int:
    """How many bytes from the end of the object hold footer + trailer, from a suffix of at
    least ``TRAILER_BYTES``. Positions in errors are absolute when ``object_size`` is given."""
    return _codec(codec).object_footer_bytes_needed(tail, object_name, object_size)


def parse_footer(tail: Buffer, object_name: str, object_size: int, *,
                 codec: ObjectsTwin | None = None) -> Footer:
    """The validated footer from a suffix of the object (``tail``) that holds at least
    ``footer_bytes_needed`` bytes; ``object_size`` is the object's total size."""
    return _codec(codec).object_parse_footer(tail, object_name, object_size)


def read_footer(get_range: Callable[[int, int], bytes], object_size: int, object_name: str, *,
                guess_bytes: int = FOOTER_GUESS_BYTES, codec: ObjectsTwin | None = None) -> Footer:
    """Fetches and validates the footer through ``get_range(start, end)`` (bytes ``[start,
    end)``): one call, or two when the footer is longer than ``guess_bytes``."""
    twin = _codec(codec)
    start = max(0, object_size - guess_bytes)
    tail = get_range(start, object_size)
    need = twin.object_footer_bytes_needed(tail, object_name, object_size)
    if need > len(tail):
        if need > object_size:
            raise _corrupt(object_name, object_size - len(tail),
                           f"trailer names a footer of {need - TRAILER_BYTES} bytes in an object of "
                           f"{object_size}")
        tail = get_range(object_size - need, object_size - len(tail)) + bytes(tail)
    return twin.object_parse_footer(tail, object_name, object_size)


def select_blocks(footer: Footer, first_offset: int | None = None, last_offset: int | None = None,
                  min_publish_time: int | None = None,
                  max_publish_time: int | None = None) -> list[Block]:
    """Blocks that may hold records in the (inclusive) offset and publish-time ranges."""
    lo = footer.first_offset if first_offset is None else first_offset
    hi = footer.last_offset if last_offset is None else last_offset
    tmin = 0 if min_publish_time is None else min_publish_time
    tmax = footer.max_publish_time if max_publish_time is None else max_publish_time
    return [b for b in footer.blocks
            if b.last_offset >= lo and b.first_offset <= hi
            and b.max_publish_time >= tmin and b.min_publish_time <= tmax]


def decode_block(data: Buffer, block: Block, object_name: str, *, first_offset: int | None = None,
                 last_offset: int | None = None, min_publish_time: int | None = None,
                 max_publish_time: int | None = None, codec: ObjectsTwin | None = None) -> list[Record]:
    """Records of one block (``data`` = exactly its stored bytes), validated in full, then
    filtered to the inclusive offset and publish-time ranges given."""
    return _block_records(_codec(codec), data, block, object_name, first_offset, last_offset,
                          min_publish_time, max_publish_time)


def block_frames(data: Buffer, block: Block, object_name: str, *,
                 codec: ObjectsTwin | None = None) -> bytes:
    """The raw WAL frames of one block, validated exactly as :func:`decode_block` does."""
    return _block_frames(_codec(codec), data, block, object_name)


def _block_records(twin: ObjectsTwin, data: Buffer, block: Block, object_name: str,
                   first_offset: int | None, last_offset: int | None, min_publish_time: int | None,
                   max_publish_time: int | None) -> list[Record]:
    # want_records=True: the twin returns the records (False: the frames' bytes).
    return cast("list[Record]", twin.object_decode_block(data, block, object_name, first_offset, last_offset,
                                                         min_publish_time, max_publish_time, True))


def _block_frames(twin: ObjectsTwin, data: Buffer, block: Block, object_name: str) -> bytes:
    return cast(bytes, twin.object_decode_block(data, block, object_name, None, None, None, None, False))


def parse_header(data: Buffer, object_name: str, *, codec: ObjectsTwin | None = None) -> ObjectHeader:
    """The validated header from the object's first bytes."""
    return _codec(codec).object_parse_header(data, object_name)


def iter_records(data: Buffer, object_name: str = "<memory>", *, first_offset: int | None = None,
                 last_offset: int | None = None, min_publish_time: int | None = None,
                 max_publish_time: int | None = None, codec: ObjectsTwin | None = None) -> Iterator[Record]:
    """Every record of a whole object held in memory, block by block (all checks applied)."""
    twin = _codec(codec)
    footer = _whole_footer(twin, data, object_name)
    view = memoryview(data)
    blocks = select_blocks(footer, first_offset, last_offset, min_publish_time, max_publish_time)
    for block in blocks:
        yield from _block_records(twin, view[block.position:block.end], block, object_name,
                                  first_offset, last_offset, min_publish_time, max_publish_time)


def read_records(data: Buffer, object_name: str = "<memory>", *, first_offset: int | None = None,
                 last_offset: int | None = None, min_publish_time: int | None = None,
                 max_publish_time: int | None = None, codec: ObjectsTwin | None = None) -> list[Record]:
    """:func:`iter_records` as a list."""
    return list(iter_records(data, object_name, first_offset=first_offset, last_offset=last_offset,
                             min_publish_time=min_publish_time, max_publish_time=max_publish_time,
                             codec=codec))


def read_all_frames(data: Buffer, object_name: str = "<memory>", *,
                    codec: ObjectsTwin | None = None) -> bytes:
    """The object's frames, concatenated (what the writer was given), all checks applied."""
    twin = _codec(codec)
    footer = _whole_footer(twin, data, object_name)
    view = memoryview(data)
    return b"".join(_block_frames(twin, view[b.position:b.end], b, object_name) for b in footer.blocks)


def _whole_footer(twin: ObjectsTwin, data: Buffer, object_name: str) -> Footer:
    size = len(data)
    footer = twin.object_parse_footer(data, object_name, size)
    header = twin.object_parse_header(data, object_name)
    # Pair the footer with the header: same topic, same idea of where block 0 starts.
    if header.header_bytes != footer.header_bytes:
        raise _corrupt(object_name, 0, f"header is {header.header_bytes} bytes, footer says "
                                       f"{footer.header_bytes}")
    if header.topic != footer.topic:
        raise _corrupt(object_name, 0, f"header topic {header.topic!r} differs from footer topic "
                                       f"{footer.topic!r}")
    return footer


def _corrupt(object_name: str, position: int, reason: str) -> CorruptObject:
    from native.errors import CorruptObject
    return CorruptObject(object_name, position, reason)


class ObjectDigest(NamedTuple):
    """The content checksum an archive descriptor records (see :func:`object_digest`)."""

    footer_crc32c: int
    #: 8 lowercase hex digits per block, in block order: each block's stored CRC32C.
    block_crc32c: str


def object_digest(data: Buffer, object_name: str = "<memory>", *,
                  codec: ObjectsTwin | None = None) -> ObjectDigest:
    """The digest of a whole, valid object held in memory (the uploader's view at commit)."""
    twin = _codec(codec)
    footer = _whole_footer(twin, data, object_name)
    view = memoryview(data)
    return ObjectDigest(_stored_footer_crc(view, object_name),
                        "".join(f"{_stored_block_crc(view[b.position:b.end], b, object_name):08x}"
                                for b in footer.blocks))


def check_footer_digest(tail: Buffer, footer: Footer, object_name: str, footer_crc32c: int,
                        block_crc32c: str) -> None:
    """Raise CorruptObject unless the footer (``tail`` ends with footer + trailer, already
    validated by :func:`parse_footer`) is the one the digest names."""
    stored = _stored_footer_crc(memoryview(tail), object_name)
    if stored != footer_crc32c:
        raise _corrupt(object_name, footer.footer_position,
                       f"footer CRC32C {stored:08x} differs from the recorded {footer_crc32c:08x} "
                       "(not the object that was committed)")
    if len(block_crc32c) != 8 * len(footer.blocks):
        raise _corrupt(object_name, footer.footer_position,
                       f"footer lists {len(footer.blocks)} blocks, the recorded digest "
                       f"{len(block_crc32c) // 8}")


def check_block_digest(data: Buffer, block: Block, object_name: str, block_crc32c: str) -> None:
    """Raise CorruptObject unless ``data`` (the block's stored bytes) carries the CRC32C the
    digest records for it; the codec then checks that CRC against the bytes."""
    expected = block_crc32c[8 * block.index:8 * block.index + 8]
    check_block_crc32c(data, block, object_name, int(expected, 16) if len(expected) == 8 else None)


def check_block_crc32c(data: Buffer, block: Block, object_name: str, expected: int | None) -> None:
    """:func:`check_block_digest` for one block's recorded CRC32C (None: none recorded)."""
    stored = _stored_block_crc(memoryview(data), block, object_name)
    if expected is None or stored != expected:
        recorded = "nothing" if expected is None else f"{expected:08x}"
        raise _corrupt(object_name, block.position,
                       f"block {block.index} CRC32C {stored:08x} differs from the recorded "
                       f"{recorded} (not the object that was committed)")


def _stored_footer_crc(tail: memoryview, object_name: str) -> int:
    at = len(tail) - TRAILER_BYTES - FOOTER_CRC_BYTES
    if at < 0:
        raise _corrupt(object_name, 0, f"{len(tail)} bytes cannot hold a footer")
    crc: int = struct.unpack_from("<I", tail, at)[0]
    return crc


def _stored_block_crc(data: memoryview, block: Block, object_name: str) -> int:
    if len(data) < BLOCK_HEADER_BYTES:
        raise _corrupt(object_name, block.position, f"block {block.index} is {len(data)} bytes")
    crc: int = struct.unpack_from("<I", data, 0)[0]
    return crc

