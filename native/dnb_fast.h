/*
 * Small C helpers for the compiled twins in native/ (declared for Cython in dnb_fast.pxd):
 * little-endian loads/stores, strict UTF-8 validation and a fast constructor for NamedTuple
 * instances. Stateless, so every module that includes it gets a private copy.
 */
#ifndef DNB_FAST_H
#define DNB_FAST_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Not every including module calls every helper; that is expected, not worth a warning. */
#if defined(__GNUC__) || defined(__clang__)
#define DNB_MAYBE_UNUSED __attribute__((unused))
#else
#define DNB_MAYBE_UNUSED
#endif

/* The format is little-endian on every platform; memcpy keeps unaligned access legal. */
static inline uint16_t dnb_ld16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    return v; }
static inline uint32_t dnb_ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v; }
static inline uint64_t dnb_ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v; }
static inline void dnb_st16(uint8_t *p, uint16_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap16(v);
#endif
    memcpy(p, &v, 2); }
static inline void dnb_st32(uint8_t *p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    memcpy(p, &v, 4); }
static inline void dnb_st64(uint8_t *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8); }

/*
 * 1 when p[0:n] is UTF-8 that Python's strict "utf-8" codec accepts (no overlong forms, no
 * surrogates, nothing above U+10FFFF); used where the codec validates records without
 * creating str objects. The loop advances at least one byte per round, so it is bounded by n.
 */
DNB_MAYBE_UNUSED
static int dnb_utf8_valid(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (p[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = p[i + 1];
            if ((c1 & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;  /* overlong */
            if (c == 0xED && c1 >= 0xA0) return 0; /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = p[i + 1];
            if ((c1 & 0xC0) != 0x80 || (p[i + 2] & 0xC0) != 0x80 || (p[i + 3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;  /* overlong */
            if (c == 0xF4 && c1 >= 0x90) return 0; /* above U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/*
 * A NamedTuple instance built the way tuple.__new__(cls, items) does it (tp_alloc of the
 * subclass, then fill the slots), minus the temporary tuple and the argument parsing of
 * cls.__new__. Only valid for tuple subclasses without extra instance fields; the modules that
 * use it assert that at import. References are taken (not stolen) so Cython's own refcounting
 * stays straightforward.
 */
DNB_MAYBE_UNUSED
static PyObject *dnb_tuple5(PyTypeObject *type, PyObject *a, PyObject *b, PyObject *c, PyObject *d,
                            PyObject *e)
{
    PyObject *t = type->tp_alloc(type, 5);
    if (t == NULL) return NULL;
    PyObject **items = ((PyTupleObject *)t)->ob_item;
    Py_INCREF(a); items[0] = a;
    Py_INCREF(b); items[1] = b;
    Py_INCREF(c); items[2] = c;
    Py_INCREF(d); items[3] = d;
    Py_INCREF(e); items[4] = e;
    return t;
}

/*
 * Like dnb_tuple5, for a Record whose items are all atomic for the GC (ints, None, bytes, and
 * a dict holding only str, which CPython leaves untracked). The collector would untrack such
 * a tuple at its first pass anyway (_PyTuple_MaybeUntrack); doing it now spares every young
 * collection from walking the freshly decoded records, which doubled the decode cost.
 */
DNB_MAYBE_UNUSED
static PyObject *dnb_record_untracked(PyTypeObject *type, PyObject *a, PyObject *b, PyObject *c,
                                      PyObject *d, PyObject *e)
{
    PyObject *t = dnb_tuple5(type, a, b, c, d, e);
    if (t != NULL && !PyObject_GC_IsTracked(d) && PyObject_GC_IsTracked(t)) {
        PyObject_GC_UnTrack(t);
    }
    return t;
}

DNB_MAYBE_UNUSED
static PyObject *dnb_tuple8(PyTypeObject *type, PyObject *a, PyObject *b, PyObject *c, PyObject *d,
                            PyObject *e, PyObject *f, PyObject *g, PyObject *h)
{
    PyObject *t = type->tp_alloc(type, 8);
    if (t == NULL) return NULL;
    PyObject **items = ((PyTupleObject *)t)->ob_item;
    Py_INCREF(a); items[0] = a;
    Py_INCREF(b); items[1] = b;
    Py_INCREF(c); items[2] = c;
    Py_INCREF(d); items[3] = d;
    Py_INCREF(e); items[4] = e;
    Py_INCREF(f); items[5] = f;
    Py_INCREF(g); items[6] = g;
    Py_INCREF(h); items[7] = h;
    return t;
}

/*
 * Exact ints in [0, 2**64) converted without a Python-level call; returns 0 on success, 1 for
 * anything else (the caller then takes the slow path, which also builds the error message).
 */
DNB_MAYBE_UNUSED
static int dnb_as_u64(PyObject *o, uint64_t *out)
{
    if (!PyLong_CheckExact(o)) return 1;
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 1;
    }
    *out = (uint64_t)v;
    return 0;
}

#endif /* DNB_FAST_H */
