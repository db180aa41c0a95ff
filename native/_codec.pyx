# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``native/_codec_py.py``: the hot path.

Same API, same bytes, same errors as the pure-Python twin; the format is specified once, in
``native/format.py`` (frames) and ``native/object_format.py`` (dnb1 objects). What makes it
fast: CRC32C runs in C (SSE4.2 when the CPU has it, see crc32c_impl.h) and every per-frame
loop (batch encode, scan/validate/decode, block assembly) is a C loop with no Python-level
call per frame. Detail strings of errors are kept identical to the twin's on purpose, so the
twin-equality tests can compare whole results.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromObject, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport UINT32_MAX, UINT64_MAX, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from collections.abc import Mapping
import operator

from native.errors import CodecError, CorruptSegmentHeader
from native.format import (
    FRAME_HEADER_BYTES as _PY_FRAME_HEADER_BYTES,
    MAX_RECORD_BYTES as _PY_MAX_RECORD_BYTES,
    RECORD_FIXED_BYTES as _PY_RECORD_FIXED_BYTES,
    SEGMENT_HEADER_BYTES as _PY_SEGMENT_HEADER_BYTES,
    SEGMENT_MAGIC,
    SEGMENT_VERSION as _PY_SEGMENT_VERSION,
    STOP_BAD_LENGTH,
    STOP_CRC,
    STOP_OFFSET,
    STOP_RECORD,
    STOP_TORN,
    Record,
    ScanResult,
    ScanStop,
)

cdef extern from "crc32c_impl.h":
    int dnb_crc32c_init(int force_sw)
    uint32_t dnb_crc32c(uint32_t crc, const uint8_t *p, size_t n) nogil
    uint32_t dnb_crc32c_software(uint32_t crc, const uint8_t *p, size_t n) nogil

cdef extern from "dnb_fast.h":
    uint16_t dnb_ld16(const uint8_t *p) nogil
    uint32_t dnb_ld32(const uint8_t *p) nogil
    uint64_t dnb_ld64(const uint8_t *p) nogil
    void dnb_st16(uint8_t *p, uint16_t v) nogil
    void dnb_st32(uint8_t *p, uint32_t v) nogil
    void dnb_st64(uint8_t *p, uint64_t v) nogil
    int dnb_utf8_valid(const uint8_t *p, size_t n) nogil
    object dnb_tuple5(PyTypeObject *t, object a, object b, object c, object d, object e)
    object dnb_record_untracked(PyTypeObject *t, object a, object b, object c, object d, object e)
    int dnb_as_u64(object o, uint64_t *out)
    object dnb_tuple8(PyTypeObject *t, object a, object b, object c, object d, object e,
                      object f, object g, object h)

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)

IMPLEMENTATION = "cython"

# Format constants as C constants; asserted equal to the spec module's below (pair with the
# spec so a change there cannot silently diverge from the compiled twin).
cdef enum:
    FRAME_HDR = 16
    RECORD_FIXED = 10
    MAX_RECORD = 64 * 1024 * 1024
    FLAG_KEY = 0x01
    FLAG_ATTRS = 0x02
    FLAGS_KNOWN = 0x03
    RECORD_VERSION = 1
    SEG_HDR = 32
    SEG_VERSION = 1
    U16_MAX = 0xFFFF

assert _PY_FRAME_HEADER_BYTES == FRAME_HDR and _PY_RECORD_FIXED_BYTES == RECORD_FIXED
assert _PY_MAX_RECORD_BYTES == MAX_RECORD and _PY_SEGMENT_HEADER_BYTES == SEG_HDR
assert _PY_SEGMENT_VERSION == SEG_VERSION
# dnb_tuple5 fills tuple slots directly; that is only sound for a plain tuple layout.
assert Record.__basicsize__ == tuple.__basicsize__ and Record.__itemsize__ == tuple.__itemsize__
assert not hasattr(Record(0, 0, None, {}, b""), "__dict__")

CRC32C_HARDWARE = bool(dnb_crc32c_init(0))

cdef PyTypeObject *_RECORD_TYPE = <PyTypeObject *>Record
cdef object _U64_LIMIT = 1 << 64


# ---------------------------------------------------------------------------------------------
# Buffers

cdef class _View:
    """A read-only, contiguous view of any bytes-like object, released on dealloc."""
    cdef Py_buffer buf
    cdef bint held
    cdef const uint8_t *ptr
    cdef Py_ssize_t size

    def __cinit__(self, obj):
        self.held = False
        PyObject_GetBuffer(obj, &self.buf, PyBUF_SIMPLE)
        self.held = True
        self.ptr = <const uint8_t *>self.buf.buf
        self.size = self.buf.len

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.buf)


cdef inline _View _view(obj):
    return _View(obj)


def crc32c(data, value=0):
    """CRC32C of ``data``, continuing from ``value``."""
    cdef _View v = _view(data)
    cdef uint32_t start = <uint32_t>_u32(value, "value")
    cdef uint32_t crc
    if v.size >= 1 << 20:
        # Long inputs (whole blocks) release the GIL so WAL writer threads keep going; the
        # buffer export pins the memory while we read it.
        with nogil:
            crc = dnb_crc32c(start, v.ptr, <size_t>v.size)
        return crc
    return dnb_crc32c(start, v.ptr, <size_t>v.size)


def _crc32c_software(data, value=0):
    """The portable slicing-by-8 path, for tests on machines where the hardware path is active."""
    cdef _View v = _view(data)
    return dnb_crc32c_software(<uint32_t>_u32(value, "value"), v.ptr, <size_t>v.size)


cdef object _u32(value, str what):
    try:
        value = operator.index(value)
    except TypeError as exc:
        raise CodecError(f"{what} must be an int, not {type(value).__name__}") from exc
    if not 0 <= value <= UINT32_MAX:
        raise CodecError(f"{what} {value} is not a u32")
    return value


cdef uint64_t _u64(value, str what) except? 0:
    cdef uint64_t fast
    if dnb_as_u64(value, &fast) == 0:
        return fast
    try:
        value = operator.index(value)
    except TypeError as exc:
        raise CodecError(f"{what} must be an int, not {type(value).__name__}") from exc
    if not 0 <= value <= UINT64_MAX:
        raise CodecError(f"{what} {value} is not a u64")
    return <uint64_t>value


# ---------------------------------------------------------------------------------------------
# Encoding

cdef struct MsgInfo:
    uint64_t publish_time
    const uint8_t *key          # NULL when the message has no key
    Py_ssize_t key_len
    const uint8_t *payload
    Py_ssize_t payload_len
    PyObject *attrs             # borrowed (kept alive by `keep`), NULL when none
    Py_ssize_t record_len


cdef const uint8_t *_bytes_ptr(obj, str what, list keep, Py_ssize_t *size) except NULL:
    """Pointer and size of a bytes-like value; non-bytes buffers are copied once into bytes
    (kept alive by ``keep``) exactly as the twin's ``bytes(memoryview(x))`` does."""
    if type(obj) is not bytes:
        if isinstance(obj, str) or not PyObject_CheckBuffer(obj):
            raise CodecError(f"{what} must be bytes-like, not {type(obj).__name__}")
        obj = PyBytes_FromObject(obj)
        keep.append(obj)
    size[0] = len(<bytes>obj)
    return <const uint8_t *>PyBytes_AS_STRING(obj)


cdef const char *_utf8(obj, str what, Py_ssize_t *size) except NULL:
    if not isinstance(obj, str):
        raise CodecError("attribute names and values must be str")
    try:
        return PyUnicode_AsUTF8AndSize(obj, size)
    except UnicodeEncodeError as exc:
        raise CodecError(f"attribute {what} is not encodable as UTF-8") from exc


cdef int _measure(MsgInfo *m, publish_time, key, attributes, payload, list keep) except -1:
    """Validates one message and fills ``m``; the same checks, in the same order, as the twin."""
    cdef Py_ssize_t n = RECORD_FIXED, name_len, value_len, pos = 0
    cdef PyObject *pk
    cdef PyObject *pv
    m.publish_time = _u64(publish_time, "publish_time")
    m.key = NULL
    m.key_len = 0
    if key is not None:
        m.key = _bytes_ptr(key, "key", keep, &m.key_len)
        if m.key_len > UINT32_MAX:
            raise CodecError("key longer than 4 GiB")
        n += 4 + m.key_len
    m.attrs = NULL
    if attributes is not None:
        if type(attributes) is not dict:
            if not isinstance(attributes, Mapping):
                raise CodecError(
                    f"attributes must be a mapping of str to str, not {type(attributes).__name__}")
            if attributes:
                # The twin iterates .items(); a dict built from it iterates in the same order.
                attributes = dict(attributes.items())
                keep.append(attributes)
        if attributes:
            if len(attributes) > U16_MAX:
                raise CodecError(f"{len(attributes)} attributes (max {U16_MAX})")
            m.attrs = <PyObject *>attributes
            n += 2
            while PyDict_Next(attributes, &pos, &pk, &pv):
                if not isinstance(<object>pk, str) or not isinstance(<object>pv, str):
                    raise CodecError("attribute names and values must be str")
                _utf8(<object>pk, "name", &name_len)
                _utf8(<object>pv, "value", &value_len)
                if name_len > U16_MAX:
                    raise CodecError(f"attribute name of {name_len} bytes (max {U16_MAX})")
                n += 2 + name_len + 4 + value_len
    m.payload = _bytes_ptr(payload, "payload", keep, &m.payload_len)
    n += m.payload_len
    m.record_len = n
    return 0


cdef Py_ssize_t _write_record(const MsgInfo *m, uint8_t *out) except -1:
    """Writes the record of ``m`` at ``out``; returns its length (asserted equal to _measure's)."""
    cdef uint8_t flags = 0
    cdef uint8_t *p = out + RECORD_FIXED
    cdef Py_ssize_t pos = 0, name_len, value_len
    cdef const char *s
    cdef PyObject *pk
    cdef PyObject *pv
    if m.key != NULL:
        flags |= FLAG_KEY
        dnb_st32(p, <uint32_t>m.key_len)
        memcpy(p + 4, m.key, m.key_len)
        p += 4 + m.key_len
    if m.attrs != NULL:
        flags |= FLAG_ATTRS
        dnb_st16(p, <uint16_t>len(<object>m.attrs))
        p += 2
        while PyDict_Next(<object>m.attrs, &pos, &pk, &pv):
            # UTF-8 is cached inside the str since _measure, so this does not encode again.
            s = PyUnicode_AsUTF8AndSize(<object>pk, &name_len)
            dnb_st16(p, <uint16_t>name_len)
            memcpy(p + 2, s, name_len)
            p += 2 + name_len
            s = PyUnicode_AsUTF8AndSize(<object>pv, &value_len)
            dnb_st32(p, <uint32_t>value_len)
            memcpy(p + 4, s, value_len)
            p += 4 + value_len
    memcpy(p, m.payload, m.payload_len)
    p += m.payload_len
    out[0] = RECORD_VERSION
    out[1] = flags
    dnb_st64(out + 2, m.publish_time)
    if p - out != m.record_len:
        raise AssertionError("record length changed between measuring and writing")
    return p - out


cdef inline void _seal_frame(uint8_t *frame, uint64_t offset, Py_ssize_t record_len) noexcept nogil:
    dnb_st32(frame + 4, <uint32_t>record_len)
    dnb_st64(frame + 8, offset)
    dnb_st32(frame, dnb_crc32c(0, frame + 4, <size_t>(12 + record_len)))


cdef inline int _check_record_size(Py_ssize_t record_len) except -1:
    if record_len > MAX_RECORD:
        raise CodecError(
            f"record of {record_len} bytes exceeds the format limit {MAX_RECORD}")
    return 0


def encode_record(publish_time, key, attributes, payload):
    cdef MsgInfo m
    cdef list keep = []
    _measure(&m, publish_time, key, attributes, payload, keep)
    out = PyBytes_FromStringAndSize(NULL, m.record_len)
    _write_record(&m, <uint8_t *>PyBytes_AS_STRING(out))
    return out


def encode_frame(offset, publish_time, key, attributes, payload):
    """One frame (header + record) for one message."""
    cdef MsgInfo m
    cdef list keep = []
    cdef uint64_t off
    _measure(&m, publish_time, key, attributes, payload, keep)
    off = _u64(offset, "offset")
    _check_record_size(m.record_len)
    out = PyBytes_FromStringAndSize(NULL, FRAME_HDR + m.record_len)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    _write_record(&m, p + FRAME_HDR)
    _seal_frame(p, off, m.record_len)
    return out


def encode_batch(first_offset, messages):
    """Frames for ``(publish_time, key, attributes, payload)`` tuples at first_offset, +1, …

    Two C passes over the messages: measure and validate (so the output is allocated once, at
    its exact size), then write and checksum each frame in place.
    """
    cdef uint64_t first = _u64(first_offset, "first_offset")
    cdef list items = messages if type(messages) is list else list(messages)
    cdef Py_ssize_t count = len(items), i, total = 0
    cdef MsgInfo *infos
    cdef list keep = []
    cdef uint8_t *p
    cdef tuple t
    if count == 0:
        return b""
    if <uint64_t>(count - 1) > UINT64_MAX - first:
        # The twin fails on the first offset past u64 with this message.
        raise CodecError(f"offset {_U64_LIMIT} is not a u64")
    infos = <MsgInfo *>malloc(count * sizeof(MsgInfo))
    if infos == NULL:
        raise MemoryError()
    try:
        for i in range(count):
            message = items[i]
            if type(message) is not tuple:
                if not isinstance(message, (tuple, list)):
                    raise CodecError(
                        "each message must be a (publish_time, key, attributes, payload) tuple")
                message = tuple(message)
            t = <tuple>message
            if len(t) != 4:
                raise CodecError(
                    "each message must be a (publish_time, key, attributes, payload) tuple")
            _measure(&infos[i], t[0], t[1], t[2], t[3], keep)
            _check_record_size(infos[i].record_len)
            total += FRAME_HDR + infos[i].record_len
        out = PyBytes_FromStringAndSize(NULL, total)
        p = <uint8_t *>PyBytes_AS_STRING(out)
        for i in range(count):
            _write_record(&infos[i], p + FRAME_HDR)
            _seal_frame(p, first + <uint64_t>i, infos[i].record_len)
            p += FRAME_HDR + infos[i].record_len
        if p - <uint8_t *>PyBytes_AS_STRING(out) != total:
            raise AssertionError("batch length changed between measuring and writing")
        return out
    finally:
        free(infos)


# ---------------------------------------------------------------------------------------------
# Decoding

# Record parse outcomes (0 = ok). The matching twin messages are built in _record_error.
cdef enum:
    R_OK = 0
cdef enum:
    R_SHORT = 1
cdef enum:
    R_VERSION = 2
cdef enum:
    R_FLAGS = 3
cdef enum:
    R_TRUNC = 4
cdef enum:
    R_ZERO_ATTRS = 5
cdef enum:
    R_UTF8 = 6


cdef struct RecordParse:
    int code
    Py_ssize_t at            # field position for R_TRUNC, bad value for R_VERSION/R_FLAGS
    uint64_t publish_time
    Py_ssize_t key_pos       # -1 when the record has no key
    Py_ssize_t key_len
    Py_ssize_t attrs_pos     # first attribute, -1 when none
    Py_ssize_t attrs_count
    Py_ssize_t payload_pos


cdef int _parse_record(const uint8_t *r, Py_ssize_t size, RecordParse *out) noexcept nogil:
    """Validates one record without creating objects; mirrors the twin's decode_record checks
    in the same order so the first error reported is the same one."""
    cdef Py_ssize_t pos, n, count, k, name_len, value_len, name_pos
    cdef uint8_t flags
    out.key_pos = -1
    out.attrs_pos = -1
    out.attrs_count = 0
    if size < RECORD_FIXED:
        out.code = R_SHORT
        out.at = size
        return out.code
    if r[0] != RECORD_VERSION:
        out.code = R_VERSION
        out.at = r[0]
        return out.code
    flags = r[1]
    if flags & ~FLAGS_KNOWN:
        out.code = R_FLAGS
        out.at = flags
        return out.code
    out.publish_time = dnb_ld64(r + 2)
    pos = RECORD_FIXED
    if flags & FLAG_KEY:
        if pos + 4 > size:
            out.code = R_TRUNC
            out.at = pos
            return out.code
        n = dnb_ld32(r + pos)
        pos += 4
        if pos + n > size:
            out.code = R_TRUNC
            out.at = pos
            return out.code
        out.key_pos = pos
        out.key_len = n
        pos += n
    if flags & FLAG_ATTRS:
        if pos + 2 > size:
            out.code = R_TRUNC
            out.at = pos
            return out.code
        count = dnb_ld16(r + pos)
        pos += 2
        if count == 0:
            out.code = R_ZERO_ATTRS
            return out.code
        out.attrs_pos = pos
        out.attrs_count = count
        for k in range(count):
            if pos + 2 > size:
                out.code = R_TRUNC
                out.at = pos
                return out.code
            name_len = dnb_ld16(r + pos)
            pos += 2
            if pos + name_len > size:
                out.code = R_TRUNC
                out.at = pos
                return out.code
            name_pos = pos
            pos += name_len
            if pos + 4 > size:
                out.code = R_TRUNC
                out.at = pos
                return out.code
            value_len = dnb_ld32(r + pos)
            pos += 4
            if pos + value_len > size:
                out.code = R_TRUNC
                out.at = pos
                return out.code
            # The twin decodes each attribute before reading the next, so a bad name/value
            # here wins over a truncation further on.
            if not dnb_utf8_valid(r + name_pos, name_len) or not dnb_utf8_valid(r + pos, value_len):
                out.code = R_UTF8
                return out.code
            pos += value_len
    out.payload_pos = pos
    out.code = R_OK
    return R_OK


cdef str _record_error(const RecordParse *p):
    if p.code == R_SHORT:
        return f"record of {p.at} bytes is shorter than its fixed part"
    if p.code == R_VERSION:
        return f"unsupported record version {p.at}"
    if p.code == R_FLAGS:
        return f"unknown record flags {p.at:#x}"
    if p.code == R_TRUNC:
        return f"record truncated at field position {p.at}"
    if p.code == R_ZERO_ATTRS:
        return "attributes flag set with zero attributes"
    if p.code == R_UTF8:
        return "attribute is not valid UTF-8"
    raise AssertionError(p.code)


cdef object _build_record(object offset, const uint8_t *r, Py_ssize_t size, const RecordParse *p):
    """The Record for a record that _parse_record accepted."""
    cdef Py_ssize_t pos, k, name_len, value_len
    cdef dict attributes = {}
    key = None
    if p.key_pos >= 0:
        key = PyBytes_FromStringAndSize(<const char *>r + p.key_pos, p.key_len)
    if p.attrs_count:
        pos = p.attrs_pos
        for k in range(p.attrs_count):
            name_len = dnb_ld16(r + pos)
            name = PyUnicode_DecodeUTF8(<const char *>r + pos + 2, name_len, "strict")
            pos += 2 + name_len
            value_len = dnb_ld32(r + pos)
            value = PyUnicode_DecodeUTF8(<const char *>r + pos + 4, value_len, "strict")
            pos += 4 + value_len
            PyDict_SetItem(attributes, name, value)
    payload = PyBytes_FromStringAndSize(<const char *>r + p.payload_pos, size - p.payload_pos)
    return dnb_record_untracked(_RECORD_TYPE, offset, p.publish_time, key, attributes, payload)


def decode_record(offset, record):
    """Parse one record body; raises CodecError when it is malformed."""
    cdef _View v = _view(record)
    cdef RecordParse p
    if _parse_record(v.ptr, v.size, &p) != R_OK:
        raise CodecError(_record_error(&p))
    return _build_record(offset, v.ptr, v.size, &p)


# Frame check outcomes; reasons are the spec's stable stop names.
cdef enum:
    F_OK = 0
cdef enum:
    F_TORN_HEADER = 1
cdef enum:
    F_BAD_LENGTH = 2
cdef enum:
    F_TORN_BODY = 3
cdef enum:
    F_CRC = 4
cdef enum:
    F_OFFSET = 5


cdef inline int _check_frame(const uint8_t *b, Py_ssize_t pos, Py_ssize_t end, bint have_expected,
                             bint expected_overflow, uint64_t expected,
                             uint32_t *length, uint64_t *offset) noexcept nogil:
    if end - pos < FRAME_HDR:
        return F_TORN_HEADER
    cdef uint32_t crc = dnb_ld32(b + pos)
    length[0] = dnb_ld32(b + pos + 4)
    offset[0] = dnb_ld64(b + pos + 8)
    if length[0] == 0 or length[0] > MAX_RECORD:
        return F_BAD_LENGTH
    if end - pos - FRAME_HDR < <Py_ssize_t>length[0]:
        return F_TORN_BODY
    if dnb_crc32c(0, b + pos + 4, <size_t>(12 + length[0])) != crc:
        return F_CRC
    if have_expected and (expected_overflow or offset[0] != expected):
        return F_OFFSET
    return F_OK


cdef object _frame_stop(int code, Py_ssize_t pos, Py_ssize_t end, uint32_t length, uint64_t offset,
                        object expected):
    if code == F_TORN_HEADER:
        return ScanStop(pos, STOP_TORN, f"{end - pos} bytes left, frame header needs {FRAME_HDR}")
    if code == F_BAD_LENGTH:
        return ScanStop(pos, STOP_BAD_LENGTH, f"record length {length}")
    if code == F_TORN_BODY:
        return ScanStop(pos, STOP_TORN, f"record of {length} bytes, {end - pos - FRAME_HDR} left")
    if code == F_CRC:
        return ScanStop(pos, STOP_CRC, f"CRC mismatch in frame claiming offset {offset}")
    if code == F_OFFSET:
        return ScanStop(pos, STOP_OFFSET, f"offset {offset}, expected {expected}")
    raise AssertionError(code)


def scan_frames(buf, Py_ssize_t pos=0, end=None, expected_offset=None, bint decode=True,
                bint positions=False, max_frames=None):
    """Validate frames in ``buf[pos:end]``; stop at the first invalid one (see format.py)."""
    cdef _View v = _view(buf)
    cdef const uint8_t *b = v.ptr
    cdef Py_ssize_t stop_at, limit, count = 0
    cdef bint have_expected = expected_offset is not None, expected_overflow = False
    cdef uint64_t expected = 0, offset = 0, first = 0, last = 0
    cdef uint32_t length = 0
    cdef int code
    cdef RecordParse rp
    cdef list records = []
    cdef list starts = []
    error = None
    if pos < 0 or (end is not None and end < 0):
        raise CodecError(f"scan window [{pos}, {end}) is negative")
    if have_expected:
        expected = _u64(expected_offset, "expected_offset")
    if max_frames is not None and max_frames < 0:
        raise CodecError(f"max_frames {max_frames} is negative")
    stop_at = v.size if end is None else min(<Py_ssize_t>end, v.size)
    # Every frame consumes at least FRAME_HDR + 1 bytes, so the loop is bounded by the buffer.
    limit = (stop_at // (FRAME_HDR + 1)) + 1
    if max_frames is not None and max_frames < limit:
        limit = max_frames
    while pos < stop_at and count < limit:
        code = _check_frame(b, pos, stop_at, have_expected, expected_overflow, expected,
                            &length, &offset)
        if code != F_OK:
            error = _frame_stop(code, pos, stop_at, length, offset,
                                _U64_LIMIT if expected_overflow else expected)
            break
        if decode:
            if _parse_record(b + pos + FRAME_HDR, length, &rp) != R_OK:
                error = ScanStop(pos, STOP_RECORD, _record_error(&rp))
                break
            PyList_Append(records, _build_record(offset, b + pos + FRAME_HDR, length, &rp))
        if positions:
            PyList_Append(starts, pos)
        if count == 0:
            first = offset
        last = offset
        count += 1
        have_expected = True
        expected_overflow = offset == UINT64_MAX
        expected = offset + 1
        pos += FRAME_HDR + length
    if count == 0:
        return ScanResult(records, starts, 0, -1, -1, pos, error)
    return ScanResult(records, starts, count, first, last, pos, error)


# ---------------------------------------------------------------------------------------------
# Segment headers

def encode_segment_header(base_offset, created_ms):
    cdef uint64_t base = _u64(base_offset, "base_offset")
    cdef uint64_t created = _u64(created_ms, "created_ms")
    out = PyBytes_FromStringAndSize(NULL, SEG_HDR)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    memcpy(p, <const char *>SEGMENT_MAGIC, 4)
    dnb_st16(p + 4, SEG_VERSION)
    dnb_st16(p + 6, 0)
    dnb_st64(p + 8, base)
    dnb_st64(p + 16, created)
    dnb_st32(p + 24, 0)
    dnb_st32(p + 28, dnb_crc32c(0, p, 28))
    return out


def decode_segment_header(buf):
    """Returns ``(base_offset, created_ms)``; raises CorruptSegmentHeader."""
    cdef _View v = _view(buf)
    cdef const uint8_t *p = v.ptr
    if v.size < SEG_HDR:
        raise CorruptSegmentHeader(f"segment header truncated: {v.size} of {SEG_HDR} bytes")
    magic = PyBytes_FromStringAndSize(<const char *>p, 4)
    if magic != SEGMENT_MAGIC:
        raise CorruptSegmentHeader(f"bad segment magic {magic!r}")
    if dnb_crc32c(0, p, 28) != dnb_ld32(p + 28):
        raise CorruptSegmentHeader("segment header CRC mismatch")
    if dnb_ld16(p + 4) != SEG_VERSION:
        raise CorruptSegmentHeader(f"unsupported segment format version {dnb_ld16(p + 4)}")
    if dnb_ld16(p + 6) != 0:
        raise CorruptSegmentHeader(f"unknown segment flags {dnb_ld16(p + 6):#x}")
    return dnb_ld64(p + 8), dnb_ld64(p + 16)
