# cython: language_level=3
"""Cython twin of ``native/_columns_py.py``; the specification is ``native/columns.py``.

Two passes over the frames, both in C without the GIL: the first validates every frame and
record and sums the sizes of the kept rows, the second copies them into buffers allocated
once at their exact size. Nothing is allocated per row, so a block of ~8 k small records
costs a few tens of microseconds instead of ~8 k Python tuples.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport INT64_MAX, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcmp, memcpy, memset

from native.dnb_fast cimport dnb_ld16, dnb_ld32, dnb_ld64, dnb_st32, dnb_st64, dnb_utf8_valid

from native.errors import ColumnsError, ColumnsTooLarge
from native.format import COLUMN_BUFFER_BYTES_MAX, Columns

IMPLEMENTATION = "cython"

__all__ = ["decode_columns"]

_U64_MAX = 2**64 - 1

# Values of native/format.py, repeated as C constants; test_columns pins them to format.py.
cdef enum:
    FRAME_HDR = 16
    RECORD_FIXED = 10
    RECORD_VERSION = 1
    FLAG_KEY = 1
    FLAG_ATTRIBUTES = 2
    FLAGS_KNOWN = 3
    MAX_RECORD = 64 * 1024 * 1024
FORMAT_CONSTANTS = {"FRAME_HEADER_BYTES": FRAME_HDR, "RECORD_FIXED_BYTES": RECORD_FIXED,
                    "RECORD_VERSION": RECORD_VERSION, "RECORD_FLAG_KEY": FLAG_KEY,
                    "RECORD_FLAG_ATTRIBUTES": FLAG_ATTRIBUTES, "MAX_RECORD_BYTES": MAX_RECORD}

cdef enum Fail:
    OK = 0
    E_HEADER
    E_LENGTH
    E_RUNS_PAST
    E_OFFSET_GAP
    E_OFFSET_INT64
    E_VERSION
    E_FLAGS
    E_TIME_INT64
    E_TRUNCATED
    E_ZERO_ATTRIBUTES
    E_UTF8
    E_REPEATED_NAME

cdef struct Failure:
    int code
    Py_ssize_t position   # the frame's position in the buffer
    uint64_t a            # code-specific values for the message
    uint64_t b

cdef struct Record:
    uint64_t offset
    uint64_t time_ms
    const uint8_t *body
    uint32_t length
    int has_key
    uint32_t key_at
    uint32_t key_len
    uint32_t attributes_at  # position of the first attribute (after the count)
    uint32_t attribute_count
    uint32_t names_bytes
    uint32_t values_bytes
    uint32_t payload_at

cdef struct Totals:
    Py_ssize_t frames
    Py_ssize_t rows
    Py_ssize_t key_nulls
    Py_ssize_t key_bytes
    Py_ssize_t payload_bytes
    Py_ssize_t entries
    Py_ssize_t names_bytes
    Py_ssize_t values_bytes
    uint64_t first
    uint64_t last

cdef struct Window:
    uint64_t olo, ohi, tlo, thi
    int keep_any


cdef inline bint _kept(const Record *rec, const Window *w) noexcept nogil:
    return (w.keep_any and w.olo <= rec.offset <= w.ohi and w.tlo <= rec.time_ms <= w.thi)


cdef int _record(const uint8_t *r, uint32_t n, Record *rec, Failure *f) noexcept nogil:
    """Parses and validates one record body (same checks, same order as the Python twin)."""
    cdef uint32_t pos = RECORD_FIXED, i, j, count, name_len, value_len, other_at, other_len
    cdef uint8_t flags = r[1]
    if r[0] != RECORD_VERSION:
        f.code = E_VERSION; f.a = r[0]; return -1
    if flags & ~FLAGS_KNOWN:
        f.code = E_FLAGS; f.a = flags; return -1
    rec.time_ms = dnb_ld64(r + 2)
    if rec.time_ms > <uint64_t>INT64_MAX:
        f.code = E_TIME_INT64; f.a = rec.time_ms; return -1
    rec.has_key = 0
    rec.key_at = rec.key_len = 0
    if flags & FLAG_KEY:
        if 4 > n - pos:
            f.code = E_TRUNCATED; f.a = pos; return -1
        rec.key_len = dnb_ld32(r + pos)
        pos += 4
        if rec.key_len > n - pos:
            f.code = E_TRUNCATED; f.a = pos; return -1
        rec.has_key = 1
        rec.key_at = pos
        pos += rec.key_len
    rec.attribute_count = rec.names_bytes = rec.values_bytes = 0
    rec.attributes_at = pos
    if flags & FLAG_ATTRIBUTES:
        if 2 > n - pos:
            f.code = E_TRUNCATED; f.a = pos; return -1
        count = dnb_ld16(r + pos)
        pos += 2
        if count == 0:
            f.code = E_ZERO_ATTRIBUTES; return -1
        rec.attributes_at = pos
        for i in range(count):
            if 2 > n - pos:
                f.code = E_TRUNCATED; f.a = pos; return -1
            name_len = dnb_ld16(r + pos)
            pos += 2
            if name_len > n - pos:
                f.code = E_TRUNCATED; f.a = pos; return -1
            pos += name_len
            if 4 > n - pos:
                f.code = E_TRUNCATED; f.a = pos; return -1
            value_len = dnb_ld32(r + pos)
            pos += 4
            if value_len > n - pos:
                f.code = E_TRUNCATED; f.a = pos; return -1
            if (not dnb_utf8_valid(r + pos - 4 - name_len, name_len)
                    or not dnb_utf8_valid(r + pos, value_len)):
                f.code = E_UTF8; f.a = i; return -1
            # Compare with every earlier name (bounded by count <= 65535, and only names of
            # equal length are compared byte by byte).
            other_at = rec.attributes_at
            for j in range(i):
                other_len = dnb_ld16(r + other_at)
                if (other_len == name_len
                        and memcmp(r + other_at + 2, r + pos - 4 - name_len, name_len) == 0):
                    f.code = E_REPEATED_NAME; f.a = i; return -1
                other_at += 2 + other_len
                other_at += 4 + dnb_ld32(r + other_at)
            pos += value_len
            rec.names_bytes += name_len
            rec.values_bytes += value_len
        rec.attribute_count = count
    rec.payload_at = pos
    return 0


cdef int _frame(const uint8_t *b, Py_ssize_t size, Py_ssize_t pos, int has_previous,
                uint64_t previous, Record *rec, Failure *f) noexcept nogil:
    """Validates the frame at ``pos`` and its record; fills ``rec``."""
    cdef uint32_t length
    f.position = pos
    if size - pos < FRAME_HDR:
        f.code = E_HEADER; f.a = <uint64_t>(size - pos); return -1
    length = dnb_ld32(b + pos + 4)
    rec.offset = dnb_ld64(b + pos + 8)
    if length < RECORD_FIXED or length > MAX_RECORD:
        f.code = E_LENGTH; f.a = length; return -1
    if length > size - pos - FRAME_HDR:
        f.code = E_RUNS_PAST; f.a = length; f.b = <uint64_t>(size - pos - FRAME_HDR); return -1
    if has_previous and (previous == 0xFFFFFFFFFFFFFFFFULL or rec.offset != previous + 1):
        f.code = E_OFFSET_GAP; f.a = rec.offset; f.b = previous; return -1
    if rec.offset > <uint64_t>INT64_MAX:
        f.code = E_OFFSET_INT64; f.a = rec.offset; return -1
    rec.body = b + pos + FRAME_HDR
    rec.length = length
    return _record(rec.body, length, rec, f)


cdef int _measure(const uint8_t *b, Py_ssize_t size, const Window *w, Totals *t,
                  Failure *f) noexcept nogil:
    """Pass 1: validate every frame, sum what the kept rows need."""
    cdef Py_ssize_t pos = 0, frames_max = size // (FRAME_HDR + RECORD_FIXED) + 1
    cdef Record rec
    memset(t, 0, sizeof(Totals))
    while pos < size and t.frames < frames_max:
        if _frame(b, size, pos, t.frames > 0, t.last, &rec, f) != 0:
            return -1
        if t.frames == 0:
            t.first = rec.offset
        t.last = rec.offset
        t.frames += 1
        pos += FRAME_HDR + rec.length
        if _kept(&rec, w):
            t.rows += 1
            if rec.has_key:
                t.key_bytes += rec.key_len
            else:
                t.key_nulls += 1
            t.payload_bytes += rec.length - rec.payload_at
            t.entries += rec.attribute_count
            t.names_bytes += rec.names_bytes
            t.values_bytes += rec.values_bytes
    return 0


cdef struct Out:
    uint8_t *offsets
    uint8_t *times
    uint8_t *validity
    uint8_t *key_offsets
    uint8_t *key_data
    uint8_t *payload_offsets
    uint8_t *payload_data
    uint8_t *attribute_offsets
    uint8_t *names_offsets
    uint8_t *names_data
    uint8_t *values_offsets
    uint8_t *values_data


cdef void _fill(const uint8_t *b, Py_ssize_t size, const Window *w, Out *o) noexcept nogil:
    """Pass 2: copy the kept rows; the structure was validated by pass 1."""
    cdef Py_ssize_t pos = 0, row = 0, entry = 0, frames = 0
    cdef Py_ssize_t frames_max = size // (FRAME_HDR + RECORD_FIXED) + 1
    cdef uint32_t key_end = 0, payload_end = 0, names_end = 0, values_end = 0, i, at
    cdef uint32_t name_len, value_len, payload_len
    cdef Record rec
    dnb_st32(o.key_offsets, 0)
    dnb_st32(o.payload_offsets, 0)
    dnb_st32(o.attribute_offsets, 0)
    dnb_st32(o.names_offsets, 0)
    dnb_st32(o.values_offsets, 0)
    while pos < size and frames < frames_max:
        rec.length = dnb_ld32(b + pos + 4)
        rec.offset = dnb_ld64(b + pos + 8)
        rec.body = b + pos + FRAME_HDR
        rec.time_ms = dnb_ld64(rec.body + 2)
        pos += FRAME_HDR + rec.length
        frames += 1
        if not _kept(&rec, w):
            continue
        _locate(rec.body, &rec)
        dnb_st64(o.offsets + 8 * row, rec.offset)
        dnb_st64(o.times + 8 * row, rec.time_ms)
        if rec.has_key:
            o.validity[row >> 3] |= <uint8_t>(1 << (row & 7))
            memcpy(o.key_data + key_end, rec.body + rec.key_at, rec.key_len)
            key_end += rec.key_len
        dnb_st32(o.key_offsets + 4 * (row + 1), key_end)
        payload_len = rec.length - rec.payload_at
        memcpy(o.payload_data + payload_end, rec.body + rec.payload_at, payload_len)
        payload_end += payload_len
        dnb_st32(o.payload_offsets + 4 * (row + 1), payload_end)
        at = rec.attributes_at
        for i in range(rec.attribute_count):
            name_len = dnb_ld16(rec.body + at)
            memcpy(o.names_data + names_end, rec.body + at + 2, name_len)
            names_end += name_len
            at += 2 + name_len
            value_len = dnb_ld32(rec.body + at)
            memcpy(o.values_data + values_end, rec.body + at + 4, value_len)
            values_end += value_len
            at += 4 + value_len
            entry += 1
            dnb_st32(o.names_offsets + 4 * entry, names_end)
            dnb_st32(o.values_offsets + 4 * entry, values_end)
        row += 1
        dnb_st32(o.attribute_offsets + 4 * row, <uint32_t>entry)


cdef inline void _locate(const uint8_t *r, Record *rec) noexcept nogil:
    """Field positions of a record pass 1 already validated."""
    cdef uint8_t flags = r[1]
    cdef uint32_t pos = RECORD_FIXED, i
    rec.has_key = flags & FLAG_KEY
    rec.key_len = 0
    if rec.has_key:
        rec.key_len = dnb_ld32(r + pos)
        rec.key_at = pos + 4
        pos += 4 + rec.key_len
    rec.attribute_count = 0
    if flags & FLAG_ATTRIBUTES:
        rec.attribute_count = dnb_ld16(r + pos)
        pos += 2
        rec.attributes_at = pos
        for i in range(rec.attribute_count):
            pos += 2 + dnb_ld16(r + pos)
            pos += 4 + dnb_ld32(r + pos)
    rec.payload_at = pos


cdef str _message(const Failure *f):
    if f.code == E_HEADER:
        return f"frame header needs {FRAME_HDR} bytes, {f.a} left"
    if f.code == E_LENGTH:
        return f"record length {f.a} outside {RECORD_FIXED}..{MAX_RECORD}"
    if f.code == E_RUNS_PAST:
        return f"record of {f.a} bytes runs past the end ({f.b} bytes left)"
    if f.code == E_OFFSET_GAP:
        return f"offset {f.a} does not follow {f.b}"
    if f.code == E_OFFSET_INT64:
        return f"offset {f.a} exceeds int64"
    if f.code == E_VERSION:
        return f"unsupported record version {f.a}"
    if f.code == E_FLAGS:
        return f"unknown record flags {f.a:#x}"
    if f.code == E_TIME_INT64:
        return f"publish time {f.a} exceeds int64"
    if f.code == E_TRUNCATED:
        return f"record truncated at field position {f.a}"
    if f.code == E_ZERO_ATTRIBUTES:
        return "attributes flag set with zero attributes"
    if f.code == E_UTF8:
        return f"attribute {f.a} is not valid UTF-8"
    if f.code == E_REPEATED_NAME:
        return f"attribute {f.a} repeats a name"
    raise AssertionError(f"unknown failure code {f.code}")


cdef bytes _alloc(Py_ssize_t size, uint8_t **ptr):
    cdef bytes out = PyBytes_FromStringAndSize(NULL, size)
    ptr[0] = <uint8_t *>PyBytes_AS_STRING(out)
    return out


cdef tuple _window(lo, hi):
    """An inclusive window clamped to u64, and whether it is empty."""
    lo_v = 0 if lo is None else max(int(lo), 0)
    hi_v = _U64_MAX if hi is None else min(int(hi), _U64_MAX)
    return min(lo_v, _U64_MAX), max(hi_v, 0), lo_v > hi_v


cdef object _buffer_limit(buffer_bytes_max):
    if buffer_bytes_max is None:
        return COLUMN_BUFFER_BYTES_MAX
    if not 0 <= buffer_bytes_max <= COLUMN_BUFFER_BYTES_MAX:
        raise ValueError(f"buffer_bytes_max {buffer_bytes_max} outside 0..{COLUMN_BUFFER_BYTES_MAX}")
    return buffer_bytes_max


def decode_columns(frames, first_offset=None, last_offset=None, min_publish_time=None,
                   max_publish_time=None, buffer_bytes_max=None):
    cdef Py_buffer view
    cdef Window w
    cdef Totals t
    cdef Failure f
    cdef Out o
    cdef int status
    cdef Py_ssize_t limit = _buffer_limit(buffer_bytes_max)
    olo, ohi, o_empty = _window(first_offset, last_offset)
    tlo, thi, t_empty = _window(min_publish_time, max_publish_time)
    w.olo, w.ohi, w.tlo, w.thi = olo, ohi, tlo, thi
    w.keep_any = not (o_empty or t_empty)
    PyObject_GetBuffer(frames, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            status = _measure(<const uint8_t *>view.buf, view.len, &w, &t, &f)
        if status != 0:
            raise ColumnsError(f.position, _message(&f))
        for name, size in (("key_data", t.key_bytes), ("payload_data", t.payload_bytes),
                           ("attribute_names_data", t.names_bytes),
                           ("attribute_values_data", t.values_bytes)):
            if size > limit:
                raise ColumnsTooLarge(name, size, limit)
        offsets = _alloc(8 * t.rows, &o.offsets)
        times = _alloc(8 * t.rows, &o.times)
        validity = _alloc((t.rows + 7) // 8, &o.validity)
        memset(o.validity, 0, (t.rows + 7) // 8)
        key_offsets = _alloc(4 * (t.rows + 1), &o.key_offsets)
        key_data = _alloc(t.key_bytes, &o.key_data)
        payload_offsets = _alloc(4 * (t.rows + 1), &o.payload_offsets)
        payload_data = _alloc(t.payload_bytes, &o.payload_data)
        attribute_offsets = _alloc(4 * (t.rows + 1), &o.attribute_offsets)
        names_offsets = _alloc(4 * (t.entries + 1), &o.names_offsets)
        names_data = _alloc(t.names_bytes, &o.names_data)
        values_offsets = _alloc(4 * (t.entries + 1), &o.values_offsets)
        values_data = _alloc(t.values_bytes, &o.values_data)
        with nogil:
            _fill(<const uint8_t *>view.buf, view.len, &w, &o)
    finally:
        PyBuffer_Release(&view)
    return Columns(
        t.rows, offsets, times, validity, t.key_nulls, key_offsets, key_data, payload_offsets,
        payload_data, t.entries, attribute_offsets, names_offsets, names_data, values_offsets,
        values_data, t.frames, t.first if t.frames else None, t.last if t.frames else None)
