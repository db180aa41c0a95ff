# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``native/_frames_py.py``: CRC32C, records, frames, frame scanning, segment
headers and round markers, on the hot path of every append and read.

Same API, same bytes, same errors as the pure-Python twin; the format is specified once, in
``native/format.py``. What makes it fast: CRC32C runs in C (SSE4.2 when the CPU has it, see
crc32c_impl.h) and every per-frame loop (batch encode, scan/validate/decode) is a C loop with
no Python-level call per frame. Detail strings of errors are kept identical to the twin's on
purpose, so the twin-equality tests can compare whole results.

The record and frame primitives are also a C-level API (declared in ``native/_frames.pxd``)
for ``native/_append.pyx`` and ``native/_objects.pyx``.
"""
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromObject, PyBytes_FromStringAndSize
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport UINT32_MAX, UINT64_MAX, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from native.dnb_fast cimport (
    dnb_as_u64,
    dnb_ld16,
    dnb_ld32,
    dnb_ld64,
    dnb_record_untracked,
    dnb_st16,
    dnb_st32,
    dnb_st64,
    dnb_utf8_valid,
)

from collections.abc import Mapping
import operator

from native.errors import CodecError, CorruptSegmentHeader
from native.format import (
    FRAME_HEADER_BYTES as _PY_FRAME_HEADER_BYTES,
    MAX_RECORD_BYTES as _PY_MAX_RECORD_BYTES,
    RECORD_FIXED_BYTES as _PY_RECORD_FIXED_BYTES,
    RECORD_FLAG_ATTRIBUTES as _PY_RECORD_FLAG_ATTRIBUTES,
    RECORD_FLAG_KEY as _PY_RECORD_FLAG_KEY,
    RECORD_FLAGS_KNOWN as _PY_RECORD_FLAGS_KNOWN,
    RECORD_VERSION as _PY_RECORD_VERSION,
    SEGMENT_HEADER_BYTES as _PY_SEGMENT_HEADER_BYTES,
    SEGMENT_MAGIC,
    ROUND_MARKER_BYTES as _PY_ROUND_MARKER_BYTES,
    ROUND_MARKER_TAG as _PY_ROUND_MARKER_TAG,
    SEGMENT_VERSION as _PY_SEGMENT_VERSION,
    SEGMENT_VERSION_KEYED as _PY_SEGMENT_VERSION_KEYED,
    SEGMENT_VERSIONS_READABLE,
    STOP_BAD_LENGTH,
    STOP_CRC,
    STOP_OFFSET,
    STOP_RECORD,
    STOP_TORN,
    Record,
    ScanResult,
    ScanStop,
)

# Only this module includes crc32c_impl.h (see native/_frames.pxd for why).
cdef extern from "crc32c_impl.h":
    int dnb_crc32c_init(int force_sw)
    uint32_t dnb_crc32c(uint32_t crc, const uint8_t *p, size_t n) nogil
    uint32_t dnb_crc32c_software(uint32_t crc, const uint8_t *p, size_t n) nogil

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL
    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t size, const char *errors)

IMPLEMENTATION = "cython"

__all__ = [
    "CRC32C_HARDWARE", "crc32c", "encode_record", "encode_frame", "encode_batch",
    "decode_record", "scan_frames", "encode_round_marker", "encode_segment_header",
    "decode_segment_header", "write_rounds",
]

# The C constants of native/_frames.pxd, paired with the spec so a change there cannot
# silently diverge from the compiled twins.
cdef uint32_t MARKER_TAG = 0xFFFFFFFF
cdef const char *_SEGMENT_MAGIC = b"DNBW"
assert SEGMENT_MAGIC == b"DNBW"
assert _PY_FRAME_HEADER_BYTES == FRAME_HDR and _PY_RECORD_FIXED_BYTES == RECORD_FIXED
assert _PY_MAX_RECORD_BYTES == MAX_RECORD and _PY_SEGMENT_HEADER_BYTES == SEG_HDR
assert _PY_SEGMENT_VERSION == SEG_VERSION and _PY_RECORD_VERSION == RECORD_VERSION
assert _PY_SEGMENT_VERSION_KEYED == SEG_VERSION_KEYED
assert (_PY_RECORD_FLAG_KEY, _PY_RECORD_FLAG_ATTRIBUTES, _PY_RECORD_FLAGS_KNOWN) == (
    FLAG_KEY, FLAG_ATTRS, FLAGS_KNOWN)
assert _PY_ROUND_MARKER_BYTES == MARKER_BYTES == FRAME_HDR and _PY_ROUND_MARKER_TAG == MARKER_TAG
# dnb_record_untracked fills tuple slots directly; that is only sound for a plain tuple layout.
assert Record.__basicsize__ == tuple.__basicsize__ and Record.__itemsize__ == tuple.__itemsize__
assert not hasattr(Record(0, 0, None, {}, b""), "__dict__")

CRC32C_HARDWARE = bool(dnb_crc32c_init(0))

cdef PyTypeObject *_RECORD_TYPE = <PyTypeObject *>Record
cdef object _U64_LIMIT = 1 << 64


# ---------------------------------------------------------------------------------------------
# Buffers and integers

cdef class View:
    """A read-only, contiguous view of any bytes-like object, released on dealloc."""

    def __cinit__(self, obj):
        self.held = False
        PyObject_GetBuffer(obj, &self.buf, PyBUF_SIMPLE)
        self.held = True
        self.ptr = <const uint8_t *>self.buf.buf
        self.size = self.buf.len

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.buf)


cdef uint32_t crc32c_update(uint32_t crc, const uint8_t *p, size_t n) noexcept nogil:
    return dnb_crc32c(crc, p, n)


def crc32c(data, value=0):
    """CRC32C of ``data``, continuing from ``value``."""
    cdef View v = View(data)
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
    cdef View v = View(data)
    return dnb_crc32c_software(<uint32_t>_u32(value, "value"), v.ptr, <size_t>v.size)


cdef object _u32(value, str what):
    try:
        value = operator.index(value)
    except TypeError as exc:
        raise CodecError(f"{what} must be an int, not {type(value).__name__}") from exc
    if not 0 <= value <= UINT32_MAX:
        raise CodecError(f"{what} {value} is not a u32")
    return value


cdef uint64_t as_u64(value, str what) except? 0:
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


cdef uint32_t as_u32(value, str what) except? 0:
    """``_u32`` with the common case (an exact int in range) in C: a commit round encodes a
    keyed marker for every topic of every round."""
    cdef uint64_t fast
    if dnb_as_u64(value, &fast) == 0 and fast <= UINT32_MAX:
        return <uint32_t>fast
    return <uint32_t>_u32(value, what)


# ---------------------------------------------------------------------------------------------
# Encoding

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
    m.publish_time = as_u64(publish_time, "publish_time")
    return measure_body(m, key, attributes, payload, keep)


cdef int measure_body(MsgInfo *m, key, attributes, payload, list keep) except -1:
    """Everything of _measure after publish_time (the AppendBuffer fills that from its clock)."""
    cdef Py_ssize_t n = RECORD_FIXED, name_len, value_len, pos = 0
    cdef PyObject *pk
    cdef PyObject *pv
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
    """Writes the record of ``m`` at ``out``, never past ``out + m.record_len``; returns its length.

    The bound is checked before every copy because Python code may have run since _measure
    (a Mapping converted, an ``__index__`` called, the AppendBuffer's normalise hook), so another
    thread may have grown an attributes dict in between: such a record is refused with an
    AssertionError before a single byte lands past the space that was measured for it.
    """
    cdef uint8_t flags = 0
    cdef uint8_t *p = out + RECORD_FIXED
    cdef uint8_t *end = out + m.record_len - m.payload_len  # where the payload must start
    cdef Py_ssize_t pos = 0, name_len, value_len
    cdef const char *s
    cdef const char *v
    cdef PyObject *pk
    cdef PyObject *pv
    if m.key != NULL:
        flags |= FLAG_KEY
        if p + 4 + m.key_len > end:
            raise AssertionError("record length changed between measuring and writing")
        dnb_st32(p, <uint32_t>m.key_len)
        memcpy(p + 4, m.key, m.key_len)
        p += 4 + m.key_len
    if m.attrs != NULL:
        flags |= FLAG_ATTRS
        if p + 2 > end or len(<object>m.attrs) > U16_MAX:
            raise AssertionError("record length changed between measuring and writing")
        dnb_st16(p, <uint16_t>len(<object>m.attrs))
        p += 2
        while PyDict_Next(<object>m.attrs, &pos, &pk, &pv):
            # UTF-8 is cached inside the str since _measure, so this does not encode again.
            s = PyUnicode_AsUTF8AndSize(<object>pk, &name_len)
            v = PyUnicode_AsUTF8AndSize(<object>pv, &value_len)
            if name_len > U16_MAX or p + 6 + name_len + value_len > end:
                raise AssertionError("record length changed between measuring and writing")
            dnb_st16(p, <uint16_t>name_len)
            memcpy(p + 2, s, name_len)
            p += 2 + name_len
            dnb_st32(p, <uint32_t>value_len)
            memcpy(p + 4, v, value_len)
            p += 4 + value_len
    if p != end:
        raise AssertionError("record length changed between measuring and writing")
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


cdef int write_frames(const MsgInfo *infos, Py_ssize_t n, uint64_t first_offset, uint8_t *out,
                      Py_ssize_t total) except -1:
    """Writes the frames of ``n`` measured messages back to back at ``out``, at offsets
    first_offset, +1, ...; they must take exactly ``total`` bytes, as measured (the caller
    checked the offsets fit). One loop for encode_batch and the AppendBuffer alike."""
    cdef uint8_t *p = out
    cdef Py_ssize_t i
    for i in range(n):
        _write_record(&infos[i], p + FRAME_HDR)
        _seal_frame(p, first_offset + <uint64_t>i, infos[i].record_len)
        p += FRAME_HDR + infos[i].record_len
    if p - out != total:
        raise AssertionError("batch length changed between measuring and writing")
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
    off = as_u64(offset, "offset")
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
    cdef uint64_t first = as_u64(first_offset, "first_offset")
    # A private copy: it owns a reference to every message (and through the tuples to their
    # payloads, keys and attribute dicts) while the C loops hold raw pointers into them, even
    # if Python code run mid-batch (a publish_time's __index__, a Mapping's items()) empties
    # or rebinds the caller's list.
    cdef list items = list(messages)
    cdef Py_ssize_t count = len(items), i, total = 0
    cdef MsgInfo *infos
    cdef list keep = []
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
        write_frames(infos, count, first, <uint8_t *>PyBytes_AS_STRING(out), total)
        return out
    finally:
        free(infos)


# ---------------------------------------------------------------------------------------------
# Decoding

cdef str record_error(const RecordParse *p):
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


cdef object build_record(object offset, const uint8_t *r, Py_ssize_t size, const RecordParse *p):
    """The Record for a record that parse_record accepted."""
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
    cdef View v = View(record)
    cdef RecordParse p
    if parse_record(v.ptr, v.size, &p) != R_OK:
        raise CodecError(record_error(&p))
    return build_record(offset, v.ptr, v.size, &p)


cdef object frame_stop(int code, Py_ssize_t pos, Py_ssize_t end, uint32_t length, uint64_t offset,
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


cdef inline uint32_t marker_crc(const uint8_t *p, bint keyed, uint32_t key) noexcept nogil:
    """The CRC a round marker at ``p`` must carry: over its bytes [4, 16), then (version 3)
    over the segment's marker key, little-endian (native/format.py, "Commit rounds")."""
    cdef uint8_t key_bytes[4]
    cdef uint32_t crc = dnb_crc32c(0, p + 4, 12)
    if keyed:
        dnb_st32(key_bytes, key)
        crc = dnb_crc32c(crc, key_bytes, 4)
    return crc


def scan_frames(buf, Py_ssize_t pos=0, end=None, expected_offset=None, bint decode=True,
                bint positions=False, max_frames=None, bint rounds=False, marker_key=None):
    """Validate frames in ``buf[pos:end]``; stop at the first invalid one (see format.py).

    ``rounds``: the buffer is segment data of version 2 or 3, where round markers may stand
    between frames; they are checked and skipped (and listed in ``markers`` with
    ``positions``). ``marker_key``: the segment's marker key (version 3), which their CRC
    covers; None for version 2."""
    cdef bint keyed = marker_key is not None
    cdef uint32_t key = as_u32(marker_key, "marker_key") if keyed else 0
    cdef View v = View(buf)
    cdef const uint8_t *b = v.ptr
    cdef Py_ssize_t stop_at, limit, count = 0
    cdef bint have_expected = expected_offset is not None, expected_overflow = False
    cdef uint64_t expected = 0, offset = 0, first = 0, last = 0
    cdef uint32_t length = 0
    cdef int code
    cdef RecordParse rp
    cdef list records = []
    cdef list starts = []
    cdef list marks = []
    error = None
    if pos < 0 or (end is not None and end < 0):
        raise CodecError(f"scan window [{pos}, {end}) is negative")
    if have_expected:
        expected = as_u64(expected_offset, "expected_offset")
    if max_frames is not None and max_frames < 0:
        raise CodecError(f"max_frames {max_frames} is negative")
    stop_at = v.size if end is None else min(<Py_ssize_t>end, v.size)
    # Every frame consumes at least FRAME_HDR + 1 bytes, so the loop is bounded by the buffer.
    limit = (stop_at // (FRAME_HDR + 1)) + 1
    if max_frames is not None and max_frames < limit:
        limit = max_frames
    while pos < stop_at and count < limit:
        if rounds and stop_at - pos >= MARKER_BYTES and dnb_ld32(b + pos + 4) == MARKER_TAG:
            offset = dnb_ld64(b + pos + 8)
            if marker_crc(b + pos, keyed, key) != dnb_ld32(b + pos):
                error = ScanStop(pos, STOP_CRC, f"CRC mismatch in round marker claiming offset {offset}")
                break
            if have_expected and (expected_overflow or offset != expected):
                error = ScanStop(pos, STOP_OFFSET, f"round marker offset {offset}, expected "
                                 f"{_U64_LIMIT if expected_overflow else expected}")
                break
            if positions:
                PyList_Append(marks, pos)
            have_expected = True
            expected_overflow = False
            expected = offset
            pos += MARKER_BYTES
            continue
        code = check_frame(b, pos, stop_at, have_expected, expected_overflow, expected,
                            &length, &offset)
        if code != F_OK:
            error = frame_stop(code, pos, stop_at, length, offset,
                                _U64_LIMIT if expected_overflow else expected)
            break
        if decode:
            if parse_record(b + pos + FRAME_HDR, length, &rp) != R_OK:
                error = ScanStop(pos, STOP_RECORD, record_error(&rp))
                break
            PyList_Append(records, build_record(offset, b + pos + FRAME_HDR, length, &rp))
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
        return ScanResult(records, starts, 0, -1, -1, pos, error, marks)
    return ScanResult(records, starts, count, first, last, pos, error, marks)


def encode_round_marker(first_offset, marker_key=None):
    """The 16-byte marker that starts a commit round: keyed with the segment's
    ``marker_key`` (format version 3), or without a key when None (version 2)."""
    cdef uint64_t first = as_u64(first_offset, "first_offset")
    cdef bint keyed = marker_key is not None
    cdef uint32_t key = as_u32(marker_key, "marker_key") if keyed else 0
    out = PyBytes_FromStringAndSize(NULL, MARKER_BYTES)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    dnb_st32(p + 4, MARKER_TAG)
    dnb_st64(p + 8, first)
    dnb_st32(p, marker_crc(p, keyed, key))
    return out


# ---------------------------------------------------------------------------------------------
# Segment headers

def encode_segment_header(base_offset, created_ms, version=SEG_VERSION, marker_key=0):
    """A segment header; ``marker_key`` (a u32) only in version 3, else it must be 0."""
    cdef uint64_t base = as_u64(base_offset, "base_offset")
    cdef uint64_t created = as_u64(created_ms, "created_ms")
    cdef uint32_t key = <uint32_t>_u32(marker_key, "marker_key")
    if version not in SEGMENT_VERSIONS_READABLE:
        raise CodecError(f"segment format version {version} is not one of {SEGMENT_VERSIONS_READABLE}")
    if key and version < SEG_VERSION_KEYED:
        raise CodecError(f"segment format version {version} has no marker key")
    out = PyBytes_FromStringAndSize(NULL, SEG_HDR)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    memcpy(p, _SEGMENT_MAGIC, 4)
    dnb_st16(p + 4, <uint16_t>version)
    dnb_st16(p + 6, 0)
    dnb_st64(p + 8, base)
    dnb_st64(p + 16, created)
    dnb_st32(p + 24, key)
    dnb_st32(p + 28, dnb_crc32c(0, p, 28))
    return out


def decode_segment_header(buf):
    """Returns ``(base_offset, created_ms)``; raises CorruptSegmentHeader. Any readable
    version is accepted; ``native.format.segment_version`` says which one it is."""
    cdef View v = View(buf)
    cdef const uint8_t *p = v.ptr
    if v.size < SEG_HDR:
        raise CorruptSegmentHeader(f"segment header truncated: {v.size} of {SEG_HDR} bytes")
    magic = PyBytes_FromStringAndSize(<const char *>p, 4)
    if magic != SEGMENT_MAGIC:
        raise CorruptSegmentHeader(f"bad segment magic {magic!r}")
    if dnb_crc32c(0, p, 28) != dnb_ld32(p + 28):
        raise CorruptSegmentHeader("segment header CRC mismatch")
    if dnb_ld16(p + 4) not in SEGMENT_VERSIONS_READABLE:
        raise CorruptSegmentHeader(f"unsupported segment format version {dnb_ld16(p + 4)}")
    if dnb_ld16(p + 6) != 0:
        raise CorruptSegmentHeader(f"unknown segment flags {dnb_ld16(p + 6):#x}")
    return dnb_ld64(p + 8), dnb_ld64(p + 16)


# ---------------------------------------------------------------------------------------------
# Writing the rounds of many files

from libc.errno cimport EINTR, EIO, errno
from posix.uio cimport iovec, writev

cdef enum:
    IOV_MAX_WRITE = 1024  # writev's vector limit on Linux (sysconf(_SC_IOV_MAX))


cdef int _writev_whole(int fd, iovec *iov, Py_ssize_t count) noexcept nogil:
    """errno of writing the ``count`` buffers at ``iov`` whole to ``fd``, or 0. Advances
    ``iov`` in place over what was written (short writes and EINTR continue)."""
    cdef ssize_t written
    cdef int n
    while count > 0 and iov[0].iov_len == 0:
        iov += 1
        count -= 1
    while count > 0:
        n = <int>(count if count < IOV_MAX_WRITE else IOV_MAX_WRITE)
        written = writev(fd, iov, n)
        if written < 0:
            if errno == EINTR:
                continue
            return errno if errno != 0 else EIO
        if written == 0:
            return EIO
        while count > 0 and <size_t>written >= iov[0].iov_len:
            written -= iov[0].iov_len
            iov += 1
            count -= 1
        if written > 0:
            iov[0].iov_base = <void *>(<char *>iov[0].iov_base + written)
            iov[0].iov_len -= written
        while count > 0 and iov[0].iov_len == 0:
            iov += 1
            count -= 1
    return 0


def write_rounds(list fds, list rounds):
    """Write ``rounds[i]`` (bytes objects, in order) to descriptor ``fds[i]``, for every i,
    with vectored writes until every byte is out; returns one errno per file (0: written
    whole). One failing file does not stop the others. All of it in ONE release of the GIL:
    a commit group writing 1,000 topics' rounds would otherwise give the GIL away and wait to
    take it back 1,000 times per round."""
    cdef Py_ssize_t n = len(fds), total = 0, i, j, k = 0
    if len(rounds) != n:
        raise ValueError("write_rounds needs one list of parts per descriptor")
    for parts in rounds:
        if type(parts) is not list:
            raise TypeError("write_rounds takes lists of bytes")
        for part in <list>parts:
            if type(part) is not bytes:
                raise TypeError("write_rounds takes lists of bytes")
        total += len(<list>parts)
    cdef int *fd_of = <int *>malloc((n if n > 0 else 1) * sizeof(int))
    cdef int *result = <int *>malloc((n if n > 0 else 1) * sizeof(int))
    cdef Py_ssize_t *start = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
    cdef iovec *iov = <iovec *>malloc((total if total > 0 else 1) * sizeof(iovec))
    if fd_of == NULL or result == NULL or start == NULL or iov == NULL:
        free(fd_of); free(result); free(start); free(iov)
        raise MemoryError()
    try:
        for i in range(n):
            fd_of[i] = fds[i]
            start[i] = k
            for part in <list>rounds[i]:
                iov[k].iov_base = <void *>PyBytes_AS_STRING(part)
                iov[k].iov_len = len(<bytes>part)
                k += 1
        start[n] = k
        # The bytes objects stay alive: ``rounds`` holds them for the whole call.
        with nogil:
            for i in range(n):
                result[i] = _writev_whole(fd_of[i], iov + start[i], start[i + 1] - start[i])
        return [result[i] for i in range(n)]
    finally:
        free(fd_of); free(result); free(start); free(iov)
