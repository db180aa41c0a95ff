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
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromObject, PyBytes_FromStringAndSize, _PyBytes_Resize
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.list cimport PyList_Append
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport UINT32_MAX, UINT64_MAX, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from collections.abc import Mapping
import operator

from native.errors import CodecError, CorruptSegmentHeader, OffsetOverflow
from native.format import (
    MAX_OFFSET as _PY_MAX_OFFSET,
    FRAME_HEADER_BYTES as _PY_FRAME_HEADER_BYTES,
    MAX_RECORD_BYTES as _PY_MAX_RECORD_BYTES,
    RECORD_FIXED_BYTES as _PY_RECORD_FIXED_BYTES,
    SEGMENT_HEADER_BYTES as _PY_SEGMENT_HEADER_BYTES,
    SEGMENT_MAGIC,
    ROUND_MARKER_BYTES as _PY_ROUND_MARKER_BYTES,
    ROUND_MARKER_TAG as _PY_ROUND_MARKER_TAG,
    SEGMENT_VERSION as _PY_SEGMENT_VERSION,
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
    SEG_VERSION = 2
    U16_MAX = 0xFFFF
    MARKER_BYTES = 16
cdef uint32_t MARKER_TAG = 0xFFFFFFFF

assert _PY_FRAME_HEADER_BYTES == FRAME_HDR and _PY_RECORD_FIXED_BYTES == RECORD_FIXED
assert _PY_MAX_RECORD_BYTES == MAX_RECORD and _PY_SEGMENT_HEADER_BYTES == SEG_HDR
assert _PY_SEGMENT_VERSION == SEG_VERSION
assert _PY_ROUND_MARKER_BYTES == MARKER_BYTES == FRAME_HDR and _PY_ROUND_MARKER_TAG == MARKER_TAG
# dnb_tuple5 fills tuple slots directly; that is only sound for a plain tuple layout.
assert Record.__basicsize__ == tuple.__basicsize__ and Record.__itemsize__ == tuple.__itemsize__
assert not hasattr(Record(0, 0, None, {}, b""), "__dict__")

CRC32C_HARDWARE = bool(dnb_crc32c_init(0))

cdef PyTypeObject *_RECORD_TYPE = <PyTypeObject *>Record
cdef object _U64_LIMIT = 1 << 64
cdef uint64_t MAX_OFFSET = _PY_MAX_OFFSET  # 2**63 - 1, see native/format.py


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
    m.publish_time = _u64(publish_time, "publish_time")
    return _measure_body(m, key, attributes, payload, keep)


cdef int _measure_body(MsgInfo *m, key, attributes, payload, list keep) except -1:
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
    # A private copy: it owns a reference to every message (and through the tuples to their
    # payloads, keys and attribute dicts) while the C loops hold raw pointers into them, even
    # if Python code run mid-batch (a publish_time's __index__, a Mapping's items()) empties
    # or rebinds the caller's list.
    cdef list items = list(messages)
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
# The append core of a WAL: offsets, encoding and the pending buffer in one atomic C step

cdef inline uint64_t _clock_ms() noexcept nogil:
    """Wall clock in ms since the epoch, the same reading as ``time.time_ns() // 1_000_000``."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <uint64_t>ts.tv_sec * 1000 + <uint64_t>(ts.tv_nsec // 1000000)


cdef enum:
    APPEND_CHUNK = 1024 * 1024      # pending frames live in chunks of this size (or one batch)


cdef class AppendBuffer:
    """Allocates offsets and keeps the encoded frames the WAL writer has not taken yet.

    ``append`` validates a message, then allocates its offset, encodes its frame (C encoder, C
    CRC32C) straight into its pending chunk and counts it, as ONE atomic step: that part runs
    without releasing the GIL and without calling any Python code, so no other Python thread
    can observe or interleave with it. That is what keeps offsets unique, contiguous and in
    buffer (= file) order with any number of appending threads, with no lock. ``busy`` is set
    for exactly that step and checked on entry; finding it set means Python code ran inside
    the step (a bug), which raises instead of corrupting the buffer. The pure-Python twin
    (native/_codec_py.py) gets the same guarantee from a lock.

    Python is called back only on rare paths, never per message in steady state:
    ``wait_for_room()`` before appending while ``pending_bytes >= pending_bytes_max``
    (backpressure, bounded by the caller), ``wake()`` after appending when the writer parked
    itself idle or ``pending_bytes`` just crossed ``batch_bytes``, ``refusal()`` (a factory of
    the exception to raise, set once appends must be refused), ``too_large(message)`` for a
    record over ``max_message_bytes``, and ``normalize(message)`` for batch elements that are
    neither bytes nor a tuple. Callbacks run outside the atomic step.

    Frames are encoded in place into bytes chunks of APPEND_CHUNK (a batch larger than that
    gets a chunk of its own; a batch never spans chunks, so it can be written past the
    counted end and counted only once whole). ``take()`` hands the writer every chunk in one
    call without copying them (the last one is shrunk in place), ready for writev; copying
    tens of MB per group commit into fresh memory cost more than encoding them. It also says
    where the newest frames that fit ``tail_messages_max``/``tail_bytes_max`` start, so the
    WAL's cache of recent frames keeps working when one take holds thousands of records.
    """
    cdef list chunks              # full chunks, in offset order
    cdef object cur               # the chunk being filled (refcount 1, never exposed) or None
    cdef uint8_t *buf             # PyBytes_AS_STRING(cur)
    cdef Py_ssize_t cur_used, cap # bytes counted in cur / its size
    cdef Py_ssize_t used          # pending bytes across chunks and cur
    cdef uint64_t next_off        # the offset the next append gets
    cdef uint64_t first_off       # offset of the first pending frame (== next_off when empty)
    cdef Py_ssize_t count         # pending records; first_off + count == next_off
    cdef Py_ssize_t *ring         # start position of pending frame i at ring[i % tail_cap]
    cdef Py_ssize_t tail_cap, tail_bytes_max
    cdef readonly Py_ssize_t max_message_bytes, pending_bytes_max, batch_bytes
    cdef bint idle, in_step
    cdef object refusal_factory, wake_cb, wait_for_room_cb, too_large_cb, normalize_cb

    def __cinit__(self):
        self.buf = NULL
        self.ring = NULL
        self.chunks = []
        self.cur = None
        self.used = self.cur_used = self.cap = 0

    def __init__(self, next_offset, *, max_message_bytes, pending_bytes_max, batch_bytes,
                 tail_messages_max, tail_bytes_max, wake, wait_for_room, too_large,
                 normalize):
        self.next_off = self.first_off = _u64(next_offset, "next_offset")
        if self.next_off > MAX_OFFSET + 1:
            raise OffsetOverflow(f"next_offset {self.next_off} is past MAX_OFFSET {MAX_OFFSET} + 1")
        self.count = 0
        if not 1 <= max_message_bytes <= MAX_RECORD:
            raise ValueError(f"max_message_bytes must be in [1, {MAX_RECORD}]")
        if pending_bytes_max < max_message_bytes or batch_bytes <= 0:
            raise ValueError("pending_bytes_max must hold one maximal message, batch_bytes > 0")
        if tail_messages_max <= 0 or tail_bytes_max <= 0:
            raise ValueError("tail_messages_max and tail_bytes_max must be positive")
        self.max_message_bytes = max_message_bytes
        self.pending_bytes_max = pending_bytes_max
        self.batch_bytes = batch_bytes
        self.tail_cap = tail_messages_max
        self.tail_bytes_max = tail_bytes_max
        free(self.ring)
        self.ring = <Py_ssize_t *>malloc(self.tail_cap * sizeof(Py_ssize_t))
        if self.ring == NULL:
            raise MemoryError()
        self.idle = self.in_step = False
        self.refusal_factory = None
        self.wake_cb = wake
        self.wait_for_room_cb = wait_for_room
        self.too_large_cb = too_large
        self.normalize_cb = normalize

    def __dealloc__(self):
        free(self.ring)

    # -------------------------------------------------------------- the atomic step
    cdef inline int _enter(self) except -1:
        if self.in_step:
            raise AssertionError("AppendBuffer re-entered: Python code ran inside the atomic step")
        if self.first_off + <uint64_t>self.count != self.next_off or self.cur_used > self.cap:
            raise AssertionError("AppendBuffer counters disagree")
        self.in_step = True
        return 0

    cdef inline int _leave(self) except -1:
        # Paired with _enter; a mismatch here would mean two steps overlapped.
        if not self.in_step or self.first_off + <uint64_t>self.count != self.next_off:
            self.in_step = False
            raise AssertionError("AppendBuffer step left in an inconsistent state")
        self.in_step = False
        return 0

    cdef int _seal_chunk(self) except -1:
        """Moves the filled part of ``cur`` to ``chunks``, shrinking it in place (no copy)."""
        cdef PyObject *raw
        if self.cur is None:
            return 0
        if self.cur_used == 0:
            self.cur = None  # nothing in it; a new one is allocated when needed
        else:
            # _PyBytes_Resize needs the only reference: take it over from self.cur.
            raw = <PyObject *>self.cur
            Py_INCREF(<object>raw)
            self.cur = None
            if self.cur_used != self.cap:
                _PyBytes_Resize(&raw, self.cur_used)  # on failure it has released raw
            self.chunks.append(<object>raw)
            Py_DECREF(<object>raw)
        self.buf = NULL
        self.cur_used = self.cap = 0
        return 0

    cdef uint8_t *_reserve(self, Py_ssize_t n) except NULL:
        """Room for n more bytes in ``cur`` at cur_used (not counted until _write counts it)."""
        cdef Py_ssize_t size
        if self.cur is None or self.cur_used + n > self.cap:
            self._seal_chunk()
            size = APPEND_CHUNK if n <= APPEND_CHUNK else n
            self.cur = PyBytes_FromStringAndSize(NULL, size)
            self.buf = <uint8_t *>PyBytes_AS_STRING(self.cur)
            self.cap = size
        return self.buf + self.cur_used

    cdef int _write(self, MsgInfo *infos, Py_ssize_t n, Py_ssize_t total) except -1:
        """Encodes n measured messages at the next offsets and counts them; the atomic step.

        Frames are written past ``used`` first and counted only once all are written, so an
        error half-way (a record that changed since measuring) leaves nothing behind.
        """
        cdef uint8_t *p
        cdef uint8_t *start
        cdef Py_ssize_t i, pos
        if self.refusal_factory is not None:
            raise self.refusal_factory()
        # next_off <= MAX_OFFSET + 1 = 2**63 (checked at construction), so the sum cannot
        # wrap a u64 for any n a Py_ssize_t can hold.
        if self.next_off + <uint64_t>(n - 1) > MAX_OFFSET:
            raise OffsetOverflow(f"offset {self.next_off + <uint64_t>(n - 1)} would pass MAX_OFFSET "
                                 f"{MAX_OFFSET}: the topic is full")
        self._enter()
        try:
            start = p = self._reserve(total)
            for i in range(n):
                _write_record(&infos[i], p + FRAME_HDR)
                _seal_frame(p, self.next_off + <uint64_t>i, infos[i].record_len)
                p += FRAME_HDR + infos[i].record_len
            if p - start != total:
                raise AssertionError("batch length changed between measuring and writing")
            pos = self.used
            for i in range(n):
                self.ring[(self.count + i) % self.tail_cap] = pos
                pos += FRAME_HDR + infos[i].record_len
            self.cur_used += total
            self.used += total
            self.count += n
            self.next_off += <uint64_t>n
        finally:
            self._leave()
        return 0

    cdef inline bint _should_wake(self, Py_ssize_t added) noexcept:
        """After counting ``added`` bytes: wake the writer if it is parked or a batch is full.

        Only the crossing of batch_bytes wakes it: a writer that is busy re-checks the
        threshold under the WAL lock before it waits, so later appends need not notify.
        """
        if self.idle or (self.used - added < self.batch_bytes <= self.used):
            self.idle = False
            return True
        return False

    cdef int _check_size(self, const MsgInfo *m) except -1:
        if m.record_len > self.max_message_bytes:
            raise self.too_large_cb(f"record of {m.record_len} bytes exceeds max_message_bytes "
                                    f"{self.max_message_bytes}")
        return 0

    # -------------------------------------------------------------- appends
    def append(self, payload, key=None, attributes=None, publish_time=None):
        """Appends one message; returns its offset."""
        cdef MsgInfo m
        cdef list keep
        cdef uint64_t offset
        if self.used >= self.pending_bytes_max:
            self.wait_for_room_cb()
        m.publish_time = _clock_ms() if publish_time is None else _u64(publish_time, "publish_time")
        if type(payload) is bytes and key is None and attributes is None:
            # The common case measured inline: no list, no dict walk.
            m.key = NULL
            m.key_len = 0
            m.attrs = NULL
            m.payload = <const uint8_t *>PyBytes_AS_STRING(payload)
            m.payload_len = len(<bytes>payload)
            m.record_len = RECORD_FIXED + m.payload_len
        else:
            keep = []
            _measure_body(&m, key, attributes, payload, keep)
        self._check_size(&m)
        offset = self.next_off
        self._write(&m, 1, FRAME_HDR + m.record_len)
        if self._should_wake(FRAME_HDR + m.record_len):
            self.wake_cb()
        return offset

    def append_batch(self, messages, publish_time=None):
        """Appends messages (bytes, or (payload, key, attributes, publish_time) tuples with
        trailing items optional, or anything ``normalize`` turns into such a tuple); returns
        the first offset. All or nothing: a bad message appends none of them."""
        # A private copy that owns every message while infos[] holds raw pointers into them:
        # normalize(), a publish_time's __index__ or a Mapping's items() run Python code
        # mid-batch, which may empty the caller's list and free what was already measured.
        cdef list items = list(messages)
        cdef Py_ssize_t n = len(items), i, total = 0, size
        cdef MsgInfo *infos
        cdef MsgInfo *m
        cdef list keep = []
        cdef uint64_t default_time, first
        cdef tuple t
        if n == 0:
            raise ValueError("append_batch needs at least one message")
        default_time = _clock_ms() if publish_time is None else _u64(publish_time, "publish_time")
        if self.used >= self.pending_bytes_max:
            self.wait_for_room_cb()
        infos = <MsgInfo *>malloc(n * sizeof(MsgInfo))
        if infos == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                message = items[i]
                m = &infos[i]
                if type(message) is bytes:
                    m.publish_time = default_time
                    m.key = NULL
                    m.key_len = 0
                    m.attrs = NULL
                    m.payload = <const uint8_t *>PyBytes_AS_STRING(message)
                    m.payload_len = len(<bytes>message)
                    m.record_len = RECORD_FIXED + m.payload_len
                elif type(message) is bytearray or type(message) is memoryview:
                    m.publish_time = default_time
                    _measure_body(m, None, None, message, keep)
                else:
                    if type(message) is not tuple:
                        # Rare forms (wal.Message, lists) are turned into the tuple by Python.
                        message = self.normalize_cb(message)
                        keep.append(message)
                        if type(message) is not tuple:
                            raise CodecError("normalize must return a tuple")
                    t = <tuple>message
                    size = len(t)
                    if not 1 <= size <= 4:
                        raise CodecError("each message must be payload or a (payload, key, "
                                         "attributes, publish_time) tuple")
                    if size < 4 or t[3] is None:
                        m.publish_time = default_time
                    else:
                        m.publish_time = _u64(t[3], "publish_time")
                    _measure_body(m, t[1] if size > 1 else None, t[2] if size > 2 else None,
                                  t[0], keep)
                self._check_size(m)
                total += FRAME_HDR + m.record_len
            first = self.next_off
            self._write(infos, n, total)
        finally:
            free(infos)
        if self._should_wake(total):
            self.wake_cb()
        return first

    # -------------------------------------------------------------- the writer's side
    def take(self):
        """Everything pending, in one call: ``(chunks, first_offset, last_offset, count,
        tail_position, tail_count)``. ``b"".join(chunks)`` is the frames, back to back; each
        chunk holds whole frames (how they are split is not part of the contract).
        ``tail_position`` is a byte position in that join: from there on lie the newest
        ``tail_count`` frames, the most that fit tail_messages_max and tail_bytes_max
        (``tail_count`` 0 when not even one does). Nothing pending: ``count`` is 0."""
        cdef Py_ssize_t lo, hi, mid, k
        cdef list chunks
        self._enter()
        try:
            self._seal_chunk()
            chunks, self.chunks = self.chunks, []
            # The largest k whose last k frames fit; a frame's start only grows with its
            # index, so the predicate is monotone and a binary search over the ring finds k.
            lo = 0
            hi = self.count if self.count < self.tail_cap else self.tail_cap
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.used - self.ring[(self.count - mid) % self.tail_cap] <= self.tail_bytes_max:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            tail_position = self.used if k == 0 else self.ring[(self.count - k) % self.tail_cap]
            result = (chunks, self.first_off, <object>self.next_off - 1, self.count,
                      tail_position, k)
            self.first_off = self.next_off
            self.count = 0
            self.used = 0
        finally:
            self._leave()
        return result

    def park(self):
        """Writer, under the WAL lock: mark itself idle iff nothing is pending (atomically
        with appends, so an append either sees ``idle`` and wakes it or was taken first)."""
        if self.count:
            return False
        self.idle = True
        return True

    def unpark(self):
        self.idle = False

    # -------------------------------------------------------------- state
    @property
    def refusal(self):
        """None, or a zero-argument callable returning the exception every append raises."""
        return self.refusal_factory

    @refusal.setter
    def refusal(self, factory):
        if factory is not None and not callable(factory):
            raise TypeError("refusal must be None or a callable returning an exception")
        self.refusal_factory = factory

    @property
    def next_offset(self):
        return self.next_off

    @property
    def pending_first(self):
        return self.first_off

    @property
    def pending_count(self):
        return self.count

    @property
    def pending_bytes(self):
        return self.used

    @property
    def writer_idle(self):
        return self.idle

    @property
    def busy(self):
        return self.in_step


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
                bint positions=False, max_frames=None, bint rounds=False):
    """Validate frames in ``buf[pos:end]``; stop at the first invalid one (see format.py).

    ``rounds``: the buffer is version-2 segment data, where round markers may stand between
    frames; they are checked and skipped (and listed in ``markers`` with ``positions``)."""
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
    cdef list marks = []
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
        if rounds and stop_at - pos >= MARKER_BYTES and dnb_ld32(b + pos + 4) == MARKER_TAG:
            offset = dnb_ld64(b + pos + 8)
            if dnb_crc32c(0, b + pos + 4, 12) != dnb_ld32(b + pos):
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
        return ScanResult(records, starts, 0, -1, -1, pos, error, marks)
    return ScanResult(records, starts, count, first, last, pos, error, marks)


def encode_round_marker(first_offset):
    """The 16-byte marker that starts a commit round (format version 2)."""
    cdef uint64_t first = _u64(first_offset, "first_offset")
    out = PyBytes_FromStringAndSize(NULL, MARKER_BYTES)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    dnb_st32(p + 4, MARKER_TAG)
    dnb_st64(p + 8, first)
    dnb_st32(p, dnb_crc32c(0, p + 4, 12))
    return out


# ---------------------------------------------------------------------------------------------
# Segment headers

def encode_segment_header(base_offset, created_ms, version=SEG_VERSION):
    cdef uint64_t base = _u64(base_offset, "base_offset")
    cdef uint64_t created = _u64(created_ms, "created_ms")
    if version not in SEGMENT_VERSIONS_READABLE:
        raise CodecError(f"segment format version {version} is not one of {SEGMENT_VERSIONS_READABLE}")
    out = PyBytes_FromStringAndSize(NULL, SEG_HDR)
    cdef uint8_t *p = <uint8_t *>PyBytes_AS_STRING(out)
    memcpy(p, <const char *>SEGMENT_MAGIC, 4)
    dnb_st16(p + 4, <uint16_t>version)
    dnb_st16(p + 6, 0)
    dnb_st64(p + 8, base)
    dnb_st64(p + 16, created)
    dnb_st32(p + 24, 0)
    dnb_st32(p + 28, dnb_crc32c(0, p, 28))
    return out


def decode_segment_header(buf):
    """Returns ``(base_offset, created_ms)``; raises CorruptSegmentHeader. Any readable
    version is accepted; ``native.format.segment_version`` says which one it is."""
    cdef _View v = _view(buf)
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
# dnb1 objects (spec: native/object_format.py). Per-object work that is O(1) (argument checks,
# the 16-byte trailer, the header) is shared with the twin; everything that grows with the
# number of frames or blocks (validation, block split, CRCs, footer assembly and parsing,
# record decoding) runs in C here.

import zstandard

from native._object_py import (
    check_block_scan as _check_block_scan,
    check_object_args as _check_object_args,
    encode_header as _encode_header,
    encode_trailer as _encode_trailer,
    frame_position as _frame_position,
    object_footer_bytes_needed,
    object_parse_header,
    zstd_compressor as _zstd_compressor,
)
from native.errors import CorruptObject
from native.object_format import Block, Footer

cdef enum:
    BLOCK_HDR = 16
    ENTRY_BYTES = 48
    FOOTER_FIXED_B = 62
    TRAILER_B = 16
    CODEC_NONE = 0
    CODEC_ZSTD = 1
    BLOCK_RAW_MIN = 17

assert Block.__basicsize__ == tuple.__basicsize__ and len(Block._fields) == 8
cdef PyTypeObject *_BLOCK_TYPE = <PyTypeObject *>Block


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
    cdef _View v = _view(frames)
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
        expected = _u64(first_offset, "expected_offset")
    blocks = <BlockOut *>malloc(cap * sizeof(BlockOut))
    if blocks == NULL:
        raise MemoryError()
    try:
        # Pass 1, C only: validate every frame and its record, cut blocks at the target size.
        limit = v.size // (FRAME_HDR + 1) + 1
        cur = NULL
        while pos < v.size and <Py_ssize_t>count < limit:
            code = _check_frame(b, pos, v.size, have_expected, expected_overflow, expected,
                                &length, &offset)
            if code != F_OK:
                stop = _frame_stop(code, pos, v.size, length, offset,
                                   _U64_LIMIT if expected_overflow else expected)
                raise CodecError(f"frames invalid at byte {pos}: {stop.reason}: {stop.detail}")
            if _parse_record(b + pos + FRAME_HDR, length, &rp) != R_OK:
                raise CodecError(f"frames invalid at byte {pos}: {STOP_RECORD}: {_record_error(&rp)}")
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
        compressor = _zstd_compressor(zstd_level) if zstd_level else None
        header = _encode_header(topic_b)
        total = len(header)
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
        # Pass 3, C only: lay out blocks, footer and trailer in one allocation.
        result = PyBytes_FromStringAndSize(NULL, total)
        out = <uint8_t *>PyBytes_AS_STRING(result)
        memcpy(out, PyBytes_AS_STRING(header), len(header))
        p = out + len(header)
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
            dnb_st32(p, dnb_crc32c(0, p + 4, <size_t>(12 + cur.body_len)))
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
        memcpy(footer, <const char *>b"DNBF", 4)
        dnb_st16(footer + 4, 1)
        dnb_st16(footer + 6, 0)
        dnb_st64(footer + 8, first)
        dnb_st64(footer + 16, blocks[nblocks - 1].last)
        dnb_st64(footer + 24, count)
        dnb_st64(footer + 32, tmin)
        dnb_st64(footer + 40, tmax)
        dnb_st64(footer + 48, <uint64_t>len(header))
        dnb_st32(footer + 56, <uint32_t>nblocks)
        dnb_st16(footer + 60, <uint16_t>len(topic_b))
        memcpy(footer + FOOTER_FIXED_B, PyBytes_AS_STRING(topic_b), len(topic_b))
        dnb_st32(entry, dnb_crc32c(0, footer, <size_t>(entry - footer)))
        trailer = _encode_trailer(footer_len)
        memcpy(entry + 4, PyBytes_AS_STRING(trailer), TRAILER_B)
        if entry + 4 + TRAILER_B != out + total:
            raise AssertionError("object length changed between measuring and writing")
        return result
    finally:
        free(blocks)


def object_parse_footer(tail, object_name, object_size):
    cdef _View v = _view(tail)
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
    if dnb_crc32c(0, f, <size_t>(flen - 4)) != dnb_ld32(f + flen - 4):
        raise CorruptObject(object_name, at, "footer CRC mismatch")
    if memcmp(f, b"DNBF", 4) != 0:
        raise CorruptObject(object_name, at,
                            f"bad footer magic {PyBytes_FromStringAndSize(<const char *>f, 4)!r}")
    if dnb_ld16(f + 4) != 1:
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
    cdef _View v = _view(data)
    cdef const uint8_t *p = v.ptr
    cdef Py_ssize_t stored_bytes = block.stored_bytes
    at = block.position
    index = block.index
    if v.size != stored_bytes:
        raise CorruptObject(object_name, at, f"block {index} is {v.size} bytes, index says "
                                             f"{stored_bytes}")
    # stored_bytes > 16 is guaranteed by the footer check; a hand-made Block may lie.
    if v.size < BLOCK_HDR or dnb_crc32c(0, p + 4, <size_t>(v.size - 4)) != dnb_ld32(p):
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


def object_decode_block(data, block, object_name, first_offset, last_offset, min_publish_time,
                        max_publish_time, bint want_records):
    raw, stored_as_is = _block_raw(data, block, object_name)
    cdef _View v = _view(raw)
    cdef const uint8_t *b = v.ptr
    cdef Py_ssize_t pos = 0, count = 0, limit = v.size // (FRAME_HDR + 1) + 1
    cdef uint64_t expected = block.first_offset, offset = 0, last = 0
    cdef uint64_t lo, hi, tmin, tmax, time_min = 0, time_max = 0
    cdef bint expected_overflow = False
    cdef uint32_t length = 0
    cdef int code
    cdef RecordParse rp
    cdef list records = []
    lo = 0 if first_offset is None else _u64(first_offset, "first_offset")
    hi = block.last_offset if last_offset is None else _u64(last_offset, "last_offset")
    tmin = 0 if min_publish_time is None else _u64(min_publish_time, "min_publish_time")
    tmax = (block.max_publish_time if max_publish_time is None
            else _u64(max_publish_time, "max_publish_time"))
    while pos < v.size and count < limit:
        code = _check_frame(b, pos, v.size, True, expected_overflow, expected, &length, &offset)
        if code != F_OK:
            stop = _frame_stop(code, pos, v.size, length, offset,
                               _U64_LIMIT if expected_overflow else expected)
        elif _parse_record(b + pos + FRAME_HDR, length, &rp) != R_OK:
            stop = ScanStop(pos, STOP_RECORD, _record_error(&rp))
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
            PyList_Append(records, _build_record(offset, b + pos + FRAME_HDR, length, &rp))
        last = offset
        count += 1
        expected_overflow = offset == UINT64_MAX
        expected = offset + 1
        pos += FRAME_HDR + length
    _check_block_scan(object_name, block, count, last if count else -1, time_min, time_max)
    if not want_records:
        return bytes(raw)
    return records
