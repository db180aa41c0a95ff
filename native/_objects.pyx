# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``native/_objects_py.py``: the dnb1 object codec.

The format is specified in ``native/object_format.py``, whose functions (``write_object``,
``parse_footer``, ``decode_block``, ...) are the API; they call the primitives here. Same
bytes, results and errors as the pure-Python twin. Everything that grows with the number of
frames or blocks (frame validation, the block split, CRCs, footer assembly and parsing,
record decoding) is a C loop; frames are validated and decoded with the C-level API of
``native/_frames.pyx`` (``native/_frames.pxd``), the same code ``native.scan_frames`` runs.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.list cimport PyList_Append
from cpython.object cimport PyTypeObject
from libc.stdint cimport UINT64_MAX, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

from native._frames cimport (
    F_OK,
    FRAME_HDR,
    R_OK,
    U16_MAX,
    RecordParse,
    View,
    as_u64,
    build_record,
    check_frame,
    crc32c_update,
    frame_stop,
    parse_record,
    record_error,
)
from native.dnb_fast cimport (
    dnb_ld16,
    dnb_ld32,
    dnb_ld64,
    dnb_st16,
    dnb_st32,
    dnb_st64,
    dnb_tuple8,
    dnb_utf8_valid,
)

cdef extern from "Python.h":
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)

import operator

import zstandard

from native.errors import CodecError, CorruptObject
from native.format import STOP_RECORD, ScanStop
from native.object_format import (
    BLOCK_CODEC_NONE as _PY_BLOCK_CODEC_NONE,
    BLOCK_CODEC_ZSTD as _PY_BLOCK_CODEC_ZSTD,
    BLOCK_HEADER_BYTES as _PY_BLOCK_HEADER_BYTES,
    BLOCK_RAW_BYTES_MIN as _PY_BLOCK_RAW_BYTES_MIN,
    FOOTER_BYTES_MIN as _PY_FOOTER_BYTES_MIN,
    FOOTER_ENTRY_BYTES as _PY_FOOTER_ENTRY_BYTES,
    FOOTER_FIXED_BYTES as _PY_FOOTER_FIXED_BYTES,
    FOOTER_MAGIC,
    FOOTER_VERSION as _PY_FOOTER_VERSION,
    HEADER_CRC_BYTES as _PY_HEADER_CRC_BYTES,
    HEADER_FIXED_BYTES as _PY_HEADER_FIXED_BYTES,
    MAX_BLOCK_BYTES,
    OBJECT_MAGIC,
    OBJECT_VERSION as _PY_OBJECT_VERSION,
    TRAILER_BYTES as _PY_TRAILER_BYTES,
    ZSTD_LEVEL_MAX,
    Block,
    Footer,
    ObjectHeader,
    zstd_compressor,
)

IMPLEMENTATION = "cython"

__all__ = [
    "object_encode", "object_footer_bytes_needed", "object_parse_footer", "object_parse_header",
    "object_decode_block",
]

# The numbers of native/object_format.py as C constants, paired with the spec at import.
cdef enum:
    OBJECT_VERSION = 1
    FOOTER_VERSION = 1
    HEADER_FIXED_B = 10
    HEADER_CRC_B = 4
    BLOCK_HDR = 16
    ENTRY_BYTES = 48
    FOOTER_FIXED_B = 62
    FOOTER_MIN_B = 62 + 1 + 48 + 4
    TRAILER_B = 16
    CODEC_NONE = 0
    CODEC_ZSTD = 1
    BLOCK_RAW_MIN = 17
assert _PY_OBJECT_VERSION == OBJECT_VERSION and _PY_FOOTER_VERSION == FOOTER_VERSION
assert _PY_HEADER_FIXED_BYTES == HEADER_FIXED_B and _PY_HEADER_CRC_BYTES == HEADER_CRC_B
assert _PY_BLOCK_HEADER_BYTES == BLOCK_HDR and _PY_FOOTER_ENTRY_BYTES == ENTRY_BYTES
assert _PY_FOOTER_FIXED_BYTES == FOOTER_FIXED_B and _PY_FOOTER_BYTES_MIN == FOOTER_MIN_B
assert _PY_TRAILER_BYTES == TRAILER_B and _PY_BLOCK_RAW_BYTES_MIN == BLOCK_RAW_MIN
assert _PY_BLOCK_CODEC_NONE == CODEC_NONE and _PY_BLOCK_CODEC_ZSTD == CODEC_ZSTD
cdef const char *_OBJECT_MAGIC = b"DNB1"
cdef const char *_FOOTER_MAGIC = b"DNBF"
assert OBJECT_MAGIC == b"DNB1" and FOOTER_MAGIC == b"DNBF"

# dnb_tuple8 fills tuple slots directly; that is only sound for a plain tuple layout.
assert Block.__basicsize__ == tuple.__basicsize__ and len(Block._fields) == 8
cdef PyTypeObject *_BLOCK_TYPE = <PyTypeObject *>Block
cdef object _U64_LIMIT = 1 << 64


# ---------------------------------------------------------------------------------------------
# Writing

cdef bytes _check_object_args(topic, block_bytes, zstd_level):
    """Validates writer arguments; returns the topic's UTF-8."""
    if not isinstance(topic, str):
        raise CodecError(f"topic must be str, not {type(topic).__name__}")
    try:
        topic_b = topic.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CodecError("topic is not encodable as UTF-8") from exc
    if not 1 <= len(topic_b) <= U16_MAX:
        raise CodecError(f"topic of {len(topic_b)} bytes (1..{U16_MAX})")
    for value, what, low, high in ((block_bytes, "block_bytes", 1, MAX_BLOCK_BYTES),
                                   (zstd_level, "zstd_level", 0, ZSTD_LEVEL_MAX)):
        try:
            value = operator.index(value)
        except TypeError as exc:
            raise CodecError(f"{what} must be an int, not {type(value).__name__}") from exc
        if not low <= value <= high:
            raise CodecError(f"{what} {value} outside {low}..{high}")
    return topic_b


cdef Py_ssize_t _write_header(uint8_t *out, bytes topic_b) except -1:
    """Writes the object header at ``out``; returns its length."""
    cdef Py_ssize_t topic_len = len(topic_b)
    memcpy(out, _OBJECT_MAGIC, 4)
    dnb_st16(out + 4, OBJECT_VERSION)
    dnb_st16(out + 6, 0)
    dnb_st16(out + 8, <uint16_t>topic_len)
    memcpy(out + HEADER_FIXED_B, PyBytes_AS_STRING(topic_b), topic_len)
    dnb_st32(out + HEADER_FIXED_B + topic_len,
             crc32c_update(0, out, <size_t>(HEADER_FIXED_B + topic_len)))
    return HEADER_FIXED_B + topic_len + HEADER_CRC_B


cdef void _write_trailer(uint8_t *out, Py_ssize_t footer_len) noexcept:
    """Writes the 16-byte trailer at ``out`` for a footer of ``footer_len`` bytes."""
    dnb_st32(out, <uint32_t>footer_len)
    dnb_st16(out + 4, OBJECT_VERSION)
    dnb_st16(out + 6, 0)
    dnb_st32(out + 8, crc32c_update(0, out, 8))
    memcpy(out + 12, _OBJECT_MAGIC, 4)


cdef struct BlockOut:
    Py_ssize_t start          # byte range of its frames in the input
    Py_ssize_t end
    uint64_t first
    uint64_t last
    uint64_t tmin
    uint64_t tmax
    const uint8_t *body       # what is stored (the frames, or the zstd body)
    Py_ssize_t body_len
    uint8_t codec


def object_encode(frames, topic, block_bytes, zstd_level, first_offset):
    cdef bytes topic_b = _check_object_args(topic, block_bytes, zstd_level)
    cdef View v = View(frames)
    cdef const uint8_t *b = v.ptr
    cdef Py_ssize_t target = block_bytes, pos = 0, nblocks = 0, cap = 16, i, limit, total
    cdef bint have_expected = first_offset is not None, expected_overflow = False
    cdef uint64_t expected = 0, offset = 0, count = 0, first = 0
    cdef uint32_t length = 0
    cdef int code
    cdef RecordParse rp
    cdef BlockOut *blocks
    cdef BlockOut *cur
    cdef uint8_t *out
    cdef uint8_t *p
    cdef Py_ssize_t frame_len, footer_len
    cdef uint64_t tmin, tmax
    cdef uint8_t *entry
    cdef uint8_t *footer
    if v.size == 0:
        raise CodecError("no frames to archive")
    if have_expected:
        expected = as_u64(first_offset, "expected_offset")
    blocks = <BlockOut *>malloc(cap * sizeof(BlockOut))
    if blocks == NULL:
        raise MemoryError()
    try:
        # Pass 1, C only: validate every frame and its record, cut blocks at the target size.
        limit = v.size // (FRAME_HDR + 1) + 1
        cur = NULL
        while pos < v.size and <Py_ssize_t>count < limit:
            code = check_frame(b, pos, v.size, have_expected, expected_overflow, expected,
                                &length, &offset)
            if code != F_OK:
                stop = frame_stop(code, pos, v.size, length, offset,
                                   _U64_LIMIT if expected_overflow else expected)
                raise CodecError(f"frames invalid at byte {pos}: {stop.reason}: {stop.detail}")
            if parse_record(b + pos + FRAME_HDR, length, &rp) != R_OK:
                raise CodecError(f"frames invalid at byte {pos}: {STOP_RECORD}: {record_error(&rp)}")
            frame_len = FRAME_HDR + length
            if cur == NULL or (cur.end - cur.start) + frame_len > target:
                if nblocks == cap:
                    cap *= 2
                    cur = <BlockOut *>realloc(blocks, cap * sizeof(BlockOut))
                    if cur == NULL:
                        raise MemoryError()
                    blocks = cur
                cur = &blocks[nblocks]
                nblocks += 1
                cur.start = pos
                cur.end = pos
                cur.first = offset
                cur.tmin = rp.publish_time
                cur.tmax = rp.publish_time
                cur.codec = CODEC_NONE
            cur.end = pos + frame_len
            cur.last = offset
            if rp.publish_time < cur.tmin:
                cur.tmin = rp.publish_time
            if rp.publish_time > cur.tmax:
                cur.tmax = rp.publish_time
            if count == 0:
                first = offset
            count += 1
            have_expected = True
            expected_overflow = offset == UINT64_MAX
            expected = offset + 1
            pos += frame_len
        if pos != v.size or nblocks == 0:
            raise AssertionError("frame scan did not consume the input")
        # Pass 2: compress (one library call per block, the GIL released inside zstandard).
        keep = []
        compressor = zstd_compressor(zstd_level) if zstd_level else None
        header_len = HEADER_FIXED_B + len(topic_b) + HEADER_CRC_B
        total = header_len
        for i in range(nblocks):
            cur = &blocks[i]
            cur.body = b + cur.start
            cur.body_len = cur.end - cur.start
            if compressor is not None:
                packed = compressor.compress(PyBytes_FromStringAndSize(<const char *>cur.body,
                                                                       cur.body_len))
                if len(packed) < cur.body_len:
                    keep.append(packed)
                    cur.body = <const uint8_t *>PyBytes_AS_STRING(packed)
                    cur.body_len = len(packed)
                    cur.codec = CODEC_ZSTD
            total += BLOCK_HDR + cur.body_len
        footer_len = FOOTER_FIXED_B + len(topic_b) + ENTRY_BYTES * nblocks + 4
        total += footer_len + TRAILER_B
        # Pass 3, C only: lay out header, blocks, footer and trailer in one allocation.
        result = PyBytes_FromStringAndSize(NULL, total)
        out = <uint8_t *>PyBytes_AS_STRING(result)
        p = out + _write_header(out, topic_b)
        if p - out != header_len:
            raise AssertionError("header length changed between measuring and writing")
        tmin = blocks[0].tmin
        tmax = blocks[0].tmax
        footer = out + total - TRAILER_B - footer_len
        entry = footer + FOOTER_FIXED_B + len(topic_b)
        for i in range(nblocks):
            cur = &blocks[i]
            p[4] = cur.codec
            p[5] = 0
            dnb_st16(p + 6, 0)
            dnb_st32(p + 8, <uint32_t>cur.body_len)
            dnb_st32(p + 12, <uint32_t>(cur.end - cur.start))
            memcpy(p + BLOCK_HDR, cur.body, cur.body_len)
            dnb_st32(p, crc32c_update(0, p + 4, <size_t>(12 + cur.body_len)))
            dnb_st64(entry, <uint64_t>(p - out))
            dnb_st64(entry + 8, cur.first)
            dnb_st64(entry + 16, cur.last)
            dnb_st32(entry + 24, <uint32_t>(BLOCK_HDR + cur.body_len))
            dnb_st32(entry + 28, <uint32_t>(cur.end - cur.start))
            dnb_st64(entry + 32, cur.tmin)
            dnb_st64(entry + 40, cur.tmax)
            if cur.tmin < tmin:
                tmin = cur.tmin
            if cur.tmax > tmax:
                tmax = cur.tmax
            entry += ENTRY_BYTES
            p += BLOCK_HDR + cur.body_len
        if p != footer:
            raise AssertionError("blocks do not end where the footer starts")
        memcpy(footer, _FOOTER_MAGIC, 4)
        dnb_st16(footer + 4, FOOTER_VERSION)
        dnb_st16(footer + 6, 0)
        dnb_st64(footer + 8, first)
        dnb_st64(footer + 16, blocks[nblocks - 1].last)
        dnb_st64(footer + 24, count)
        dnb_st64(footer + 32, tmin)
        dnb_st64(footer + 40, tmax)
        dnb_st64(footer + 48, <uint64_t>header_len)
        dnb_st32(footer + 56, <uint32_t>nblocks)
        dnb_st16(footer + 60, <uint16_t>len(topic_b))
        memcpy(footer + FOOTER_FIXED_B, PyBytes_AS_STRING(topic_b), len(topic_b))
        dnb_st32(entry, crc32c_update(0, footer, <size_t>(entry - footer)))
        _write_trailer(entry + 4, footer_len)
        if entry + 4 + TRAILER_B != out + total:
            raise AssertionError("object length changed between measuring and writing")
        return result
    finally:
        free(blocks)


# ---------------------------------------------------------------------------------------------
# Reading

def object_footer_bytes_needed(tail, object_name, object_size):
    cdef View v = View(tail)
    cdef const uint8_t *t
    cdef uint32_t footer_bytes
    cdef Py_ssize_t at
    # Absolute position of tail[0] when the object size is known (else positions are
    # tail-relative).
    base = 0 if object_size is None else object_size - v.size
    if v.size < TRAILER_B:
        raise CorruptObject(object_name, base, f"object too short for its trailer: {v.size} bytes")
    at = v.size - TRAILER_B
    t = v.ptr + at
    if memcmp(t + 12, _OBJECT_MAGIC, 4) != 0:
        magic = PyBytes_FromStringAndSize(<const char *>t + 12, 4)
        raise CorruptObject(object_name, base + at + 12, f"bad trailer magic {magic!r}")
    if crc32c_update(0, t, 8) != dnb_ld32(t + 8):
        raise CorruptObject(object_name, base + at, "trailer CRC mismatch")
    if dnb_ld16(t + 4) != OBJECT_VERSION:
        raise CorruptObject(object_name, base + at + 4,
                            f"unsupported object format version {dnb_ld16(t + 4)}")
    if dnb_ld16(t + 6) != 0:
        raise CorruptObject(object_name, base + at + 6,
                            f"trailer reserved field {dnb_ld16(t + 6):#x}")
    footer_bytes = dnb_ld32(t)
    if footer_bytes < FOOTER_MIN_B:
        raise CorruptObject(object_name, base + at, f"footer length {footer_bytes} is impossible")
    return footer_bytes + TRAILER_B


def object_parse_header(data, object_name):
    cdef View v = View(data)
    cdef const uint8_t *p = v.ptr
    cdef Py_ssize_t topic_len, end
    if v.size < HEADER_FIXED_B:
        raise CorruptObject(object_name, 0, f"header truncated: {v.size} bytes")
    if memcmp(p, _OBJECT_MAGIC, 4) != 0:
        magic = PyBytes_FromStringAndSize(<const char *>p, 4)
        raise CorruptObject(object_name, 0, f"bad header magic {magic!r}")
    topic_len = dnb_ld16(p + 8)
    end = HEADER_FIXED_B + topic_len
    if topic_len == 0 or v.size < end + HEADER_CRC_B:
        raise CorruptObject(object_name, 8, f"header with a topic of {topic_len} bytes does not fit "
                                            f"in {v.size} bytes")
    if crc32c_update(0, p, <size_t>end) != dnb_ld32(p + end):
        raise CorruptObject(object_name, 0, "header CRC mismatch")
    if dnb_ld16(p + 4) != OBJECT_VERSION:
        raise CorruptObject(object_name, 4, f"unsupported object format version {dnb_ld16(p + 4)}")
    if dnb_ld16(p + 6) != 0:
        raise CorruptObject(object_name, 6, f"unknown object flags {dnb_ld16(p + 6):#x}")
    topic_b = PyBytes_FromStringAndSize(<const char *>p + HEADER_FIXED_B, topic_len)
    try:
        topic = topic_b.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptObject(object_name, HEADER_FIXED_B, "header topic is not UTF-8") from exc
    return ObjectHeader(topic, end + HEADER_CRC_B)


def object_parse_footer(tail, object_name, object_size):
    cdef View v = View(tail)
    cdef Py_ssize_t need = object_footer_bytes_needed(tail, object_name, object_size)
    cdef Py_ssize_t size = object_size, flen, index, topic_len, block_count
    cdef const uint8_t *f
    cdef const uint8_t *e
    cdef uint64_t first, last, count, tmin, tmax, header_bytes, expect_position, expect_offset
    cdef uint64_t position, b_first, b_last, b_min, b_max, union_min = 0, union_max = 0
    cdef uint32_t stored, raw
    cdef Py_ssize_t footer_position
    if need > size:
        raise CorruptObject(object_name, size - TRAILER_B,
                            f"trailer names a footer of {need - TRAILER_B} bytes in an object "
                            f"of {object_size}")
    if v.size < need or v.size > size:
        raise ValueError(f"parse_footer needs the last {need} bytes of the object, got {v.size}"
                         f" of an object of {object_size}")
    footer_position = size - need
    f = v.ptr + v.size - need
    flen = need - TRAILER_B
    at = footer_position
    if crc32c_update(0, f, <size_t>(flen - 4)) != dnb_ld32(f + flen - 4):
        raise CorruptObject(object_name, at, "footer CRC mismatch")
    if memcmp(f, _FOOTER_MAGIC, 4) != 0:
        raise CorruptObject(object_name, at,
                            f"bad footer magic {PyBytes_FromStringAndSize(<const char *>f, 4)!r}")
    if dnb_ld16(f + 4) != FOOTER_VERSION:
        raise CorruptObject(object_name, at + 4, f"unsupported footer version {dnb_ld16(f + 4)}")
    if dnb_ld16(f + 6) != 0:
        raise CorruptObject(object_name, at + 6, f"unknown footer flags {dnb_ld16(f + 6):#x}")
    first = dnb_ld64(f + 8)
    last = dnb_ld64(f + 16)
    count = dnb_ld64(f + 24)
    tmin = dnb_ld64(f + 32)
    tmax = dnb_ld64(f + 40)
    header_bytes = dnb_ld64(f + 48)
    block_count = dnb_ld32(f + 56)
    topic_len = dnb_ld16(f + 60)
    if block_count == 0 or topic_len == 0 or (
            FOOTER_FIXED_B + topic_len + <Py_ssize_t>ENTRY_BYTES * block_count + 4 != flen):
        raise CorruptObject(object_name, at + 56, f"footer of {flen} bytes cannot hold a topic of "
                                                  f"{topic_len} bytes and {block_count} blocks")
    if last < first or count != last - first + 1:
        raise CorruptObject(object_name, at + 8, f"footer says offsets {first}..{last} but "
                                                 f"{count} messages")
    if not dnb_utf8_valid(f + FOOTER_FIXED_B, topic_len):
        raise CorruptObject(object_name, at + FOOTER_FIXED_B, "footer topic is not UTF-8")
    topic = PyUnicode_DecodeUTF8(<const char *>f + FOOTER_FIXED_B, topic_len, "strict")
    cdef list blocks = []
    expect_position = header_bytes
    expect_offset = first
    e = f + FOOTER_FIXED_B + topic_len
    for index in range(block_count):
        position = dnb_ld64(e)
        b_first = dnb_ld64(e + 8)
        b_last = dnb_ld64(e + 16)
        stored = dnb_ld32(e + 24)
        raw = dnb_ld32(e + 28)
        b_min = dnb_ld64(e + 32)
        b_max = dnb_ld64(e + 40)
        if (position != expect_position or b_first != expect_offset or b_last < b_first
                or stored <= BLOCK_HDR or raw < BLOCK_RAW_MIN or b_min > b_max):
            raise CorruptObject(object_name, at + (e - f),
                                f"block index entry {index} is inconsistent (position {position}, "
                                f"offsets {b_first}..{b_last}, stored {stored}, raw {raw})")
        PyList_Append(blocks, dnb_tuple8(_BLOCK_TYPE, index, position, stored, raw, b_first,
                                         b_last, b_min, b_max))
        if index == 0 or b_min < union_min:
            union_min = b_min
        if index == 0 or b_max > union_max:
            union_max = b_max
        expect_position = position + stored
        # b_last == 2**64 - 1 can only be the last block; the check after the loop then fails
        # unless last is too, which the footer cannot express past u64 anyway.
        expect_offset = b_last + 1
        e += ENTRY_BYTES
    if expect_position != <uint64_t>footer_position or expect_offset != last + 1:
        raise CorruptObject(object_name, at, f"blocks end at byte {expect_position} and offset "
                                             f"{<object>expect_offset - 1}, footer is at "
                                             f"{footer_position} and says last offset {last}")
    if union_min != tmin or union_max != tmax:
        raise CorruptObject(object_name, at + 32, f"footer publish times {tmin}..{tmax} differ from "
                                                  f"its blocks' {union_min}..{union_max}")
    return Footer(topic, first, last, count, tmin, tmax, header_bytes, footer_position,
                  object_size, tuple(blocks))


cdef tuple _block_raw(data, block, object_name):
    """The validated, decompressed frame bytes of one block and whether it was stored as is."""
    cdef View v = View(data)
    cdef const uint8_t *p = v.ptr
    cdef Py_ssize_t stored_bytes = block.stored_bytes
    at = block.position
    index = block.index
    if v.size != stored_bytes:
        raise CorruptObject(object_name, at, f"block {index} is {v.size} bytes, index says "
                                             f"{stored_bytes}")
    # stored_bytes > 16 is guaranteed by the footer check; a hand-made Block may lie.
    if v.size < BLOCK_HDR or crc32c_update(0, p + 4, <size_t>(v.size - 4)) != dnb_ld32(p):
        raise CorruptObject(object_name, at, f"block {index} CRC mismatch")
    cdef uint8_t codec = p[4], reserved8 = p[5]
    cdef uint16_t reserved16 = dnb_ld16(p + 6)
    cdef uint32_t stored = dnb_ld32(p + 8), raw_bytes = dnb_ld32(p + 12)
    if reserved8 or reserved16 or (codec != CODEC_NONE and codec != CODEC_ZSTD):
        raise CorruptObject(object_name, at + 4, f"block {index} codec {codec} / reserved "
                                                 f"{reserved8:#x} {reserved16:#x} unknown")
    if stored != stored_bytes - BLOCK_HDR or raw_bytes != block.raw_bytes or (
            codec == CODEC_NONE and stored != raw_bytes):
        raise CorruptObject(object_name, at + 8, f"block {index} sizes {stored}/{raw_bytes} "
                                                 f"disagree with its index entry")
    body = memoryview(data)[BLOCK_HDR:]
    if codec == CODEC_NONE:
        return body, True
    try:
        raw = zstandard.ZstdDecompressor().decompress(body, max_output_size=raw_bytes)
    except zstandard.ZstdError as exc:
        raise CorruptObject(object_name, at + BLOCK_HDR,
                            f"block {index} does not decompress: {exc}") from exc
    if len(raw) != raw_bytes:
        raise CorruptObject(object_name, at + BLOCK_HDR,
                            f"block {index} decompresses to {len(raw)} bytes, not {raw_bytes}")
    return raw, False


cdef object _frame_position(block, bint stored_as_is, Py_ssize_t position_in_raw):
    """Absolute position of a frame error: exact in a stored block, the block start otherwise."""
    if stored_as_is:
        return block.position + BLOCK_HDR + position_in_raw
    return block.position


cdef int _check_block_scan(object_name, block, count, last_offset, time_min, time_max) except -1:
    """Pairs the decoded frames with the index entry that promised them."""
    if count != block.last_offset - block.first_offset + 1 or last_offset != block.last_offset:
        raise CorruptObject(object_name, block.position,
                            f"block {block.index} holds {count} frames ending at offset "
                            f"{last_offset}, index says {block.first_offset}..{block.last_offset}")
    if time_min < block.min_publish_time or time_max > block.max_publish_time:
        raise CorruptObject(object_name, block.position,
                            f"block {block.index} publish times {time_min}..{time_max} outside "
                            f"its index range {block.min_publish_time}..{block.max_publish_time}")
    return 0


def object_decode_block(data, block, object_name, first_offset, last_offset, min_publish_time,
                        max_publish_time, bint want_records):
    raw, stored_as_is = _block_raw(data, block, object_name)
    cdef View v = View(raw)
    cdef const uint8_t *b = v.ptr
    cdef Py_ssize_t pos = 0, count = 0, limit = v.size // (FRAME_HDR + 1) + 1
    cdef uint64_t expected = block.first_offset, offset = 0, last = 0
    cdef uint64_t lo, hi, tmin, tmax, time_min = 0, time_max = 0
    cdef bint expected_overflow = False
    cdef uint32_t length = 0
    cdef int code
    cdef RecordParse rp
    cdef list records = []
    lo = 0 if first_offset is None else as_u64(first_offset, "first_offset")
    hi = block.last_offset if last_offset is None else as_u64(last_offset, "last_offset")
    tmin = 0 if min_publish_time is None else as_u64(min_publish_time, "min_publish_time")
    tmax = (block.max_publish_time if max_publish_time is None
            else as_u64(max_publish_time, "max_publish_time"))
    while pos < v.size and count < limit:
        code = check_frame(b, pos, v.size, True, expected_overflow, expected, &length, &offset)
        if code != F_OK:
            stop = frame_stop(code, pos, v.size, length, offset,
                               _U64_LIMIT if expected_overflow else expected)
        elif parse_record(b + pos + FRAME_HDR, length, &rp) != R_OK:
            stop = ScanStop(pos, STOP_RECORD, record_error(&rp))
        else:
            stop = None
        if stop is not None:
            raise CorruptObject(object_name, _frame_position(block, stored_as_is, pos),
                                f"frame at byte {pos} of block {block.index}: "
                                f"{stop.reason}: {stop.detail}")
        if count == 0 or rp.publish_time < time_min:
            time_min = rp.publish_time
        if count == 0 or rp.publish_time > time_max:
            time_max = rp.publish_time
        if (want_records and lo <= offset <= hi and tmin <= rp.publish_time <= tmax):
            PyList_Append(records, build_record(offset, b + pos + FRAME_HDR, length, &rp))
        last = offset
        count += 1
        expected_overflow = offset == UINT64_MAX
        expected = offset + 1
        pos += FRAME_HDR + length
    _check_block_scan(object_name, block, count, last if count else -1, time_min, time_max)
    if not want_records:
        return bytes(raw)
    return records
