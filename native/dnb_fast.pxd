# Cython declarations of dnb_fast.h (little-endian loads/stores, strict UTF-8 validation, fast
# NamedTuple construction). The header is stateless (only static inline helpers), so every
# compiled module that cimports these gets its own copy with no set-up; contrast crc32c_impl.h,
# which is included by native/_frames.pyx alone (see native/_frames.pxd).
from cpython.object cimport PyTypeObject
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t


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
