"""Pure-Python twin of ``native/_objects.pyx``: the dnb1 object codec (the reference).

The format is specified in ``native/object_format.py``, whose functions (``write_object``,
``parse_footer``, ``decode_block``, ...) are the API; they call the primitives here. The
Cython twin implements the same functions and must produce identical bytes, results and
errors. Frames inside blocks are validated with ``native/_frames_py.py``.
"""
from __future__ import annotations

import operator
import struct

import zstandard
from typing import TYPE_CHECKING

from native._frames_py import crc32c, scan_frames
from native.errors import CodecError, CorruptObject
from native.object_format import (
    BLOCK_CODEC_NONE,
    BLOCK_CODEC_ZSTD,
    BLOCK_HEADER,
    BLOCK_HEADER_BYTES,
    BLOCK_RAW_BYTES_MIN,
    FOOTER_BYTES_MIN,
    FOOTER_CRC_BYTES,
    FOOTER_ENTRY,
    FOOTER_ENTRY_BYTES,
    FOOTER_FIXED,
    FOOTER_FIXED_BYTES,
    FOOTER_MAGIC,
    FOOTER_VERSION,
    HEADER_CRC_BYTES,
    HEADER_FIXED,
    HEADER_FIXED_BYTES,
    MAX_BLOCK_BYTES,
    OBJECT_MAGIC,
    OBJECT_VERSION,
    TRAILER,
    TRAILER_BYTES,
    ZSTD_LEVEL_MAX,
    Block,
    Footer,
    ObjectHeader,
    zstd_compressor,
)
from native.format import Record

if TYPE_CHECKING:
    from native.format import Buffer

IMPLEMENTATION = "python"

__all__ = [
    "object_encode", "object_footer_bytes_needed", "object_parse_footer", "object_parse_header",
    "object_decode_block",
]

_U32 = struct.Struct("<I")
_U16_MAX = 0xFFFF


def _check_object_args(topic: object, block_bytes: object, zstd_level: object) -> bytes:
    """Validates writer arguments; returns the topic's UTF-8."""
    if not isinstance(topic, str):
        raise CodecError(f"topic must be str, not {type(topic).__name__}")
    try:
        topic_b = topic.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CodecError("topic is not encodable as UTF-8") from exc
    if not 1 <= len(topic_b) <= _U16_MAX:
        raise CodecError(f"topic of {len(topic_b)} bytes (1..{_U16_MAX})")
    for value, what, low, high in ((block_bytes, "block_bytes", 1, MAX_BLOCK_BYTES),
                                   (zstd_level, "zstd_level", 0, ZSTD_LEVEL_MAX)):
        try:
            number = operator.index(value)  # type: ignore[arg-type]  # TypeError is the check
        except TypeError as exc:
            raise CodecError(f"{what} must be an int, not {type(value).__name__}") from exc
        if not low <= number <= high:
            raise CodecError(f"{what} {number} outside {low}..{high}")
    return topic_b


def _encode_header(topic_b: bytes) -> bytes:
    head = HEADER_FIXED.pack(OBJECT_MAGIC, OBJECT_VERSION, 0, len(topic_b)) + topic_b
    return head + _U32.pack(crc32c(head))


def object_encode(frames: Buffer, topic: str, block_bytes: int, zstd_level: int,
                  first_offset: int | None) -> bytes:
    topic_b = _check_object_args(topic, block_bytes, zstd_level)
    view = memoryview(frames).cast("B")
    if len(view) == 0:
        raise CodecError("no frames to archive")
    scan = scan_frames(view, 0, None, first_offset, True, True, None)
    if scan.error is not None:
        raise CodecError(f"frames invalid at byte {scan.error.position}: {scan.error.reason}: "
                         f"{scan.error.detail}")
    # Pair with the scan: everything consumed, offsets contiguous from the first.
    assert scan.end == len(view) and scan.last_offset - scan.first_offset + 1 == scan.count
    compressor = zstd_compressor(zstd_level) if zstd_level else None
    header = _encode_header(topic_b)
    parts = [header]
    entries = []
    position = len(header)
    starts = scan.positions + [len(view)]
    block_start = 0  # index of the block's first frame
    for i in range(scan.count):
        raw_bytes = starts[i + 1] - starts[block_start]
        is_last = i + 1 == scan.count
        if not is_last and raw_bytes + (starts[i + 2] - starts[i + 1]) <= block_bytes:
            continue
        records = scan.records[block_start:i + 1]
        raw = view[starts[block_start]:starts[i + 1]]
        block = _encode_block(raw, compressor)
        parts.append(block)
        times = [r.publish_time for r in records]
        entries.append((position, records[0].offset, records[-1].offset, len(block), len(raw),
                        min(times), max(times)))
        position += len(block)
        block_start = i + 1
    times_min = min(e[5] for e in entries)
    times_max = max(e[6] for e in entries)
    footer = FOOTER_FIXED.pack(FOOTER_MAGIC, FOOTER_VERSION, 0, scan.first_offset, scan.last_offset,
                               scan.count, times_min, times_max, len(header), len(entries),
                               len(topic_b)) + topic_b
    footer += b"".join(FOOTER_ENTRY.pack(*e) for e in entries)
    footer += _U32.pack(crc32c(footer))
    parts.append(footer)
    parts.append(_encode_trailer(len(footer)))
    return b"".join(parts)


def _encode_block(raw: memoryview, compressor: zstandard.ZstdCompressor | None) -> bytes:
    codec = BLOCK_CODEC_NONE
    body: bytes | memoryview = raw
    if compressor is not None:
        packed = compressor.compress(raw)
        if len(packed) < len(raw):
            codec, body = BLOCK_CODEC_ZSTD, packed
    fields = BLOCK_HEADER.pack(0, codec, 0, 0, len(body), len(raw))[4:]
    crc = crc32c(body, crc32c(fields))
    return _U32.pack(crc) + fields + bytes(body)


def _encode_trailer(footer_bytes: int) -> bytes:
    head = TRAILER.pack(footer_bytes, OBJECT_VERSION, 0, 0, OBJECT_MAGIC)[:8]
    return head + _U32.pack(crc32c(head)) + OBJECT_MAGIC


# ---------------------------------------------------------------------------------------------
# Reading

def _base(tail_len: int, object_size: int | None) -> int:
    """Absolute position of tail[0] when the object size is known (else positions are tail-relative)."""
    return 0 if object_size is None else object_size - tail_len


def object_footer_bytes_needed(tail: Buffer, object_name: str, object_size: int | None) -> int:
    view = memoryview(tail).cast("B")
    base = _base(len(view), object_size)
    if len(view) < TRAILER_BYTES:
        raise CorruptObject(object_name, base, f"object too short for its trailer: {len(view)} bytes")
    at = len(view) - TRAILER_BYTES
    footer_bytes, version, reserved, crc, magic = TRAILER.unpack_from(view, at)
    if magic != OBJECT_MAGIC:
        raise CorruptObject(object_name, base + at + 12, f"bad trailer magic {bytes(magic)!r}")
    if crc32c(view[at:at + 8]) != crc:
        raise CorruptObject(object_name, base + at, "trailer CRC mismatch")
    if version != OBJECT_VERSION:
        raise CorruptObject(object_name, base + at + 4, f"unsupported object format version {version}")
    if reserved != 0:
        raise CorruptObject(object_name, base + at + 6, f"trailer reserved field {reserved:#x}")
    if footer_bytes < FOOTER_BYTES_MIN:
        raise CorruptObject(object_name, base + at, f"footer length {footer_bytes} is impossible")
    needed: int = footer_bytes + TRAILER_BYTES
    return needed


def object_parse_footer(tail: Buffer, object_name: str, object_size: int) -> Footer:
    view = memoryview(tail).cast("B")
    need = object_footer_bytes_needed(view, object_name, object_size)
    if need > object_size:
        raise CorruptObject(object_name, object_size - TRAILER_BYTES,
                            f"trailer names a footer of {need - TRAILER_BYTES} bytes in an object "
                            f"of {object_size}")
    if len(view) < need or len(view) > object_size:
        raise ValueError(f"parse_footer needs the last {need} bytes of the object, got {len(view)}"
                         f" of an object of {object_size}")
    footer_position = object_size - need
    f = view[len(view) - need:len(view) - TRAILER_BYTES]
    at = footer_position
    crc_at = len(f) - FOOTER_CRC_BYTES
    if crc32c(f[:crc_at]) != int.from_bytes(f[crc_at:], "little"):
        raise CorruptObject(object_name, at, "footer CRC mismatch")
    (magic, version, flags, first, last, count, tmin, tmax, header_bytes, block_count,
     topic_len) = FOOTER_FIXED.unpack_from(f, 0)
    if magic != FOOTER_MAGIC:
        raise CorruptObject(object_name, at, f"bad footer magic {bytes(magic)!r}")
    if version != FOOTER_VERSION:
        raise CorruptObject(object_name, at + 4, f"unsupported footer version {version}")
    if flags != 0:
        raise CorruptObject(object_name, at + 6, f"unknown footer flags {flags:#x}")
    expect = FOOTER_FIXED_BYTES + topic_len + FOOTER_ENTRY_BYTES * block_count + FOOTER_CRC_BYTES
    if block_count == 0 or topic_len == 0 or expect != len(f):
        raise CorruptObject(object_name, at + 56, f"footer of {len(f)} bytes cannot hold a topic of "
                                                  f"{topic_len} bytes and {block_count} blocks")
    if last < first or count != last - first + 1:
        raise CorruptObject(object_name, at + 8, f"footer says offsets {first}..{last} but "
                                                 f"{count} messages")
    try:
        topic = bytes(f[FOOTER_FIXED_BYTES:FOOTER_FIXED_BYTES + topic_len]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptObject(object_name, at + FOOTER_FIXED_BYTES, "footer topic is not UTF-8") from exc
    blocks = []
    expect_position, expect_offset = header_bytes, first
    union_min, union_max = None, None
    entry_at = FOOTER_FIXED_BYTES + topic_len
    for index in range(block_count):
        position, b_first, b_last, stored, raw, b_min, b_max = FOOTER_ENTRY.unpack_from(f, entry_at)
        if (position != expect_position or b_first != expect_offset or b_last < b_first
                or stored <= BLOCK_HEADER_BYTES or raw < BLOCK_RAW_BYTES_MIN or b_min > b_max):
            raise CorruptObject(object_name, at + entry_at,
                                f"block index entry {index} is inconsistent (position {position}, "
                                f"offsets {b_first}..{b_last}, stored {stored}, raw {raw})")
        blocks.append(Block(index, position, stored, raw, b_first, b_last, b_min, b_max))
        union_min = b_min if union_min is None else min(union_min, b_min)
        union_max = b_max if union_max is None else max(union_max, b_max)
        expect_position = position + stored
        expect_offset = b_last + 1
        entry_at += FOOTER_ENTRY_BYTES
    if expect_position != footer_position or expect_offset != last + 1:
        raise CorruptObject(object_name, at, f"blocks end at byte {expect_position} and offset "
                                             f"{expect_offset - 1}, footer is at {footer_position} "
                                             f"and says last offset {last}")
    if (union_min, union_max) != (tmin, tmax):
        raise CorruptObject(object_name, at + 32, f"footer publish times {tmin}..{tmax} differ from "
                                                  f"its blocks' {union_min}..{union_max}")
    return Footer(topic, first, last, count, tmin, tmax, header_bytes, footer_position, object_size,
                  tuple(blocks))


def object_parse_header(data: Buffer, object_name: str) -> ObjectHeader:
    view = memoryview(data).cast("B")
    if len(view) < HEADER_FIXED_BYTES:
        raise CorruptObject(object_name, 0, f"header truncated: {len(view)} bytes")
    magic, version, flags, topic_len = HEADER_FIXED.unpack_from(view, 0)
    if magic != OBJECT_MAGIC:
        raise CorruptObject(object_name, 0, f"bad header magic {bytes(magic)!r}")
    end = HEADER_FIXED_BYTES + topic_len
    if topic_len == 0 or len(view) < end + HEADER_CRC_BYTES:
        raise CorruptObject(object_name, 8, f"header with a topic of {topic_len} bytes does not fit "
                                            f"in {len(view)} bytes")
    if crc32c(view[:end]) != int.from_bytes(view[end:end + HEADER_CRC_BYTES], "little"):
        raise CorruptObject(object_name, 0, "header CRC mismatch")
    if version != OBJECT_VERSION:
        raise CorruptObject(object_name, 4, f"unsupported object format version {version}")
    if flags != 0:
        raise CorruptObject(object_name, 6, f"unknown object flags {flags:#x}")
    try:
        topic = bytes(view[HEADER_FIXED_BYTES:end]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptObject(object_name, HEADER_FIXED_BYTES, "header topic is not UTF-8") from exc
    return ObjectHeader(topic, end + HEADER_CRC_BYTES)


def object_decode_block(data: Buffer, block: Block, object_name: str, first_offset: int | None,
                        last_offset: int | None, min_publish_time: int | None,
                        max_publish_time: int | None, want_records: bool) -> list[Record] | bytes:
    raw, stored_as_is = _block_raw(data, block, object_name)
    scan = scan_frames(raw, 0, None, block.first_offset, True, False, None)
    if scan.error is not None:
        raise CorruptObject(object_name, _frame_position(block, stored_as_is, scan.error.position),
                            f"frame at byte {scan.error.position} of block {block.index}: "
                            f"{scan.error.reason}: {scan.error.detail}")
    times = [r.publish_time for r in scan.records]
    _check_block_scan(object_name, block, scan.count, scan.last_offset,
                     min(times, default=0), max(times, default=0))
    if not want_records:
        return bytes(raw)
    lo = 0 if first_offset is None else first_offset
    hi = block.last_offset if last_offset is None else last_offset
    tmin = 0 if min_publish_time is None else min_publish_time
    tmax = block.max_publish_time if max_publish_time is None else max_publish_time
    return [r for r in scan.records
            if lo <= r.offset <= hi and tmin <= r.publish_time <= tmax]


def _frame_position(block: Block, stored_as_is: bool, position_in_raw: int) -> int:
    """Absolute position of a frame error: exact in a stored block, the block start otherwise."""
    if stored_as_is:
        return block.position + BLOCK_HEADER_BYTES + position_in_raw
    return block.position


def _check_block_scan(object_name: str, block: Block, count: int, last_offset: int, time_min: int,
                      time_max: int) -> None:
    """Pairs the decoded frames with the index entry that promised them."""
    if count != block.last_offset - block.first_offset + 1 or last_offset != block.last_offset:
        raise CorruptObject(object_name, block.position,
                            f"block {block.index} holds {count} frames ending at offset "
                            f"{last_offset}, index says {block.first_offset}..{block.last_offset}")
    if time_min < block.min_publish_time or time_max > block.max_publish_time:
        raise CorruptObject(object_name, block.position,
                            f"block {block.index} publish times {time_min}..{time_max} outside "
                            f"its index range {block.min_publish_time}..{block.max_publish_time}")


def _block_raw(data: Buffer, block: Block, object_name: str) -> tuple[memoryview, bool]:
    """The validated, decompressed frame bytes of one block and whether it was stored as is."""
    view = memoryview(data).cast("B")
    at = block.position
    if len(view) != block.stored_bytes:
        raise CorruptObject(object_name, at, f"block {block.index} is {len(view)} bytes, index says "
                                             f"{block.stored_bytes}")
    crc, codec, reserved8, reserved16, stored, raw_bytes = BLOCK_HEADER.unpack_from(view, 0)
    if crc32c(view[4:]) != crc:
        raise CorruptObject(object_name, at, f"block {block.index} CRC mismatch")
    if reserved8 or reserved16 or codec not in (BLOCK_CODEC_NONE, BLOCK_CODEC_ZSTD):
        raise CorruptObject(object_name, at + 4, f"block {block.index} codec {codec} / reserved "
                                                 f"{reserved8:#x} {reserved16:#x} unknown")
    if stored != block.stored_bytes - BLOCK_HEADER_BYTES or raw_bytes != block.raw_bytes or (
            codec == BLOCK_CODEC_NONE and stored != raw_bytes):
        raise CorruptObject(object_name, at + 8, f"block {block.index} sizes {stored}/{raw_bytes} "
                                                 f"disagree with its index entry")
    body = view[BLOCK_HEADER_BYTES:]
    if codec == BLOCK_CODEC_NONE:
        return body, True
    try:
        raw = zstandard.ZstdDecompressor().decompress(body, max_output_size=raw_bytes)
    except zstandard.ZstdError as exc:
        raise CorruptObject(object_name, at + BLOCK_HEADER_BYTES,
                            f"block {block.index} does not decompress: {exc}") from exc
    if len(raw) != raw_bytes:
        raise CorruptObject(object_name, at + BLOCK_HEADER_BYTES,
                            f"block {block.index} decompresses to {len(raw)} bytes, not {raw_bytes}")
    return memoryview(raw), False

