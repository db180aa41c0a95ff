# The C-level API of native/_frames.pyx: the record and frame primitives that the other compiled
# twins build on (native/_append.pyx encodes frames into the WAL's pending buffer,
# native/_objects.pyx validates and decodes the frames inside dnb1 blocks). It mirrors the
# helpers that native/_append_py.py and native/_objects_py.py import from native/_frames_py.py.
#
# Functions only declared here are exported by _frames through Cython's C-API capsule: a
# cimporting module calls them through a pointer it resolves when it is imported (importing
# native._frames first), and there is one copy of the code. CRC32C in particular lives only in
# _frames: crc32c_impl.h keeps its tables and hardware choice in static variables that
# dnb_crc32c_init() sets up, so a second module that included the header would have its own,
# uninitialised copy; other modules call crc32c_update() instead. The two per-frame checks at
# the end are defined here instead, see there.
#
# The format is specified in native/format.py; the constants below repeat its numbers for C, and
# _frames.pyx asserts at import that they agree.
from cpython.object cimport PyObject
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from native.dnb_fast cimport dnb_ld16, dnb_ld32, dnb_ld64, dnb_utf8_valid


cdef enum:
    FRAME_HDR = 16                  # FRAME_HEADER_BYTES
    RECORD_FIXED = 10               # RECORD_FIXED_BYTES
    MAX_RECORD = 64 * 1024 * 1024   # MAX_RECORD_BYTES
    FLAG_KEY = 0x01
    FLAG_ATTRS = 0x02
    FLAGS_KNOWN = 0x03
    RECORD_VERSION = 1
    SEG_HDR = 32                    # SEGMENT_HEADER_BYTES
    SEG_VERSION = 3                 # SEGMENT_VERSION, the one written
    SEG_VERSION_KEYED = 3           # SEGMENT_VERSION_KEYED
    U16_MAX = 0xFFFF
    MARKER_BYTES = 16               # ROUND_MARKER_BYTES

# Outcomes of parse_record (0 = ok); record_error() turns them into the twin's messages.
cdef enum:
    R_OK = 0
    R_SHORT = 1
    R_VERSION = 2
    R_FLAGS = 3
    R_TRUNC = 4
    R_ZERO_ATTRS = 5
    R_UTF8 = 6

# Outcomes of check_frame (0 = ok); frame_stop() turns them into the spec's ScanStop.
cdef enum:
    F_OK = 0
    F_TORN_HEADER = 1
    F_BAD_LENGTH = 2
    F_TORN_BODY = 3
    F_CRC = 4
    F_OFFSET = 5


cdef class View:
    # A read-only, contiguous view of any bytes-like object, released on dealloc.
    cdef Py_buffer buf
    cdef bint held
    cdef const uint8_t *ptr
    cdef Py_ssize_t size


cdef struct MsgInfo:
    # One message, validated and measured by measure_body(), ready for write_frames().
    uint64_t publish_time
    const uint8_t *key          # NULL when the message has no key
    Py_ssize_t key_len
    const uint8_t *payload
    Py_ssize_t payload_len
    PyObject *attrs             # borrowed (kept alive by the caller's `keep`), NULL when none
    Py_ssize_t record_len


cdef struct RecordParse:
    # Where the parts of a record parse_record() accepted lie, or why it refused it.
    int code
    Py_ssize_t at            # field position for R_TRUNC, bad value for R_VERSION/R_FLAGS
    uint64_t publish_time
    Py_ssize_t key_pos       # -1 when the record has no key
    Py_ssize_t key_len
    Py_ssize_t attrs_pos     # first attribute, -1 when none
    Py_ssize_t attrs_count
    Py_ssize_t payload_pos


# CRC32C of p[0:n] continuing from crc, with the implementation chosen at import.
cdef uint32_t crc32c_update(uint32_t crc, const uint8_t *p, size_t n) noexcept nogil

# An int in [0, 2**64) as a u64, else CodecError naming `what`.
cdef uint64_t as_u64(value, str what) except? 0

# Encoding: validate and measure a message (publish_time is left to the caller), then write the
# frames of measured messages (records, frame headers, CRCs) back to back, in one call per batch
# so the per-message work stays inside _frames.
cdef int measure_body(MsgInfo *m, key, attributes, payload, list keep) except -1
cdef int write_frames(const MsgInfo *infos, Py_ssize_t n, uint64_t first_offset, uint8_t *out,
                      Py_ssize_t total) except -1

# Decoding: explain a refusal of parse_record() below, build the Record for a record it accepted.
cdef str record_error(const RecordParse *p)
cdef object build_record(object offset, const uint8_t *r, Py_ssize_t size, const RecordParse *p)

# Build the ScanStop for a refusal of check_frame() below.
cdef object frame_stop(int code, Py_ssize_t pos, Py_ssize_t end, uint32_t length, uint64_t offset,
                       object expected)


# ---------------------------------------------------------------------------------------------
# The per-frame checks, defined here rather than declared, so that every module that cimports
# them compiles them inline into its own loops (scan_frames here, block reading and object
# building in _objects) instead of calling across modules once per frame. They are plain C
# with no state of their own (CRC32C goes through crc32c_update), so a copy per module is safe.

cdef inline int parse_record(const uint8_t *r, Py_ssize_t size, RecordParse *out) noexcept nogil:
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



cdef inline int check_frame(const uint8_t *b, Py_ssize_t pos, Py_ssize_t end, bint have_expected,
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
    if crc32c_update(0, b + pos + 4, <size_t>(12 + length[0])) != crc:
        return F_CRC
    if have_expected and (expected_overflow or offset[0] != expected):
        return F_OFFSET
    return F_OK
