/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init 0, final xor 0xFFFFFFFF) for the
 * Cython hot path. Included by native/_frames.pyx only: the tables and the implementation
 * choice are static state set up by dnb_crc32c_init(), so other compiled modules call
 * _frames' crc32c_update() (native/_frames.pxd) rather than include a second copy.
 *
 * Why our own instead of calling the `crc32c` package: the codec computes one CRC per frame,
 * and a Python-level call per frame costs more than the CRC itself for small frames.
 *
 * Two implementations, chosen once at start-up by dnb_crc32c_init():
 *  - SSE4.2 `crc32` instructions, three independent streams for long inputs (the instruction
 *    has a 3-cycle latency but 1-cycle throughput, so one stream would run at a third of the
 *    possible speed); the three partial CRCs are merged with precomputed "append N zero
 *    bytes" tables (the method of Mark Adler's public-domain crc32c.c).
 *  - slicing-by-8 in portable C, for CPUs without SSE4.2 and non-x86 builds.
 * Both are tested against the same known vectors and against the `crc32c` package.
 */
#ifndef DNB_CRC32C_IMPL_H
#define DNB_CRC32C_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define DNB_CRC32C_POLY 0x82F63B78u

static uint32_t dnb_crc32c_sw_table[8][256];

static uint32_t dnb_crc32c_sw(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    /* Byte at a time until 8-byte aligned, so the 8-byte loads below are aligned. */
    while (n && ((uintptr_t)p & 7u)) {
        crc = dnb_crc32c_sw_table[0][(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= crc;
        crc = dnb_crc32c_sw_table[7][lo & 0xFFu] ^ dnb_crc32c_sw_table[6][(lo >> 8) & 0xFFu] ^
              dnb_crc32c_sw_table[5][(lo >> 16) & 0xFFu] ^ dnb_crc32c_sw_table[4][lo >> 24] ^
              dnb_crc32c_sw_table[3][hi & 0xFFu] ^ dnb_crc32c_sw_table[2][(hi >> 8) & 0xFFu] ^
              dnb_crc32c_sw_table[1][(hi >> 16) & 0xFFu] ^ dnb_crc32c_sw_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = dnb_crc32c_sw_table[0][(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
    }
    return ~crc;
}

static void dnb_crc32c_sw_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1u) ? (c >> 1) ^ DNB_CRC32C_POLY : c >> 1;
        }
        dnb_crc32c_sw_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = dnb_crc32c_sw_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = dnb_crc32c_sw_table[0][c & 0xFFu] ^ (c >> 8);
            dnb_crc32c_sw_table[t][i] = c;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DNB_CRC32C_HAVE_HW 1
#include <nmmintrin.h>

/* Stream lengths for the three-way split: LONG for big buffers, SHORT for frames of a few KiB. */
#define DNB_CRC_LONG 8192
#define DNB_CRC_SHORT 256

static uint32_t dnb_crc32c_long[4][256];
static uint32_t dnb_crc32c_short[4][256];

static uint32_t dnb_gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    while (vec) { /* at most 32 rounds: one per bit of vec */
        if (vec & 1u) sum ^= *mat;
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void dnb_gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) square[n] = dnb_gf2_times(mat, mat[n]);
}

/* Operator that appends `len` zero bytes (len a power of two) to a raw CRC register. */
static void dnb_crc32c_zeros_op(uint32_t *even, size_t len)
{
    uint32_t odd[32];
    uint32_t row = 1;
    odd[0] = DNB_CRC32C_POLY; /* one zero bit */
    for (int n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    dnb_gf2_square(even, odd); /* two zero bits */
    dnb_gf2_square(odd, even); /* four zero bits */
    do { /* bounded: len halves every round */
        dnb_gf2_square(even, odd);
        len >>= 1;
        if (len == 0) return;
        dnb_gf2_square(odd, even);
        len >>= 1;
    } while (len);
    for (int n = 0; n < 32; n++) even[n] = odd[n];
}

static void dnb_crc32c_zeros(uint32_t zeros[][256], size_t len)
{
    uint32_t op[32];
    dnb_crc32c_zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        zeros[0][n] = dnb_gf2_times(op, n);
        zeros[1][n] = dnb_gf2_times(op, n << 8);
        zeros[2][n] = dnb_gf2_times(op, n << 16);
        zeros[3][n] = dnb_gf2_times(op, n << 24);
    }
}

static inline uint32_t dnb_crc32c_shift(uint32_t zeros[][256], uint32_t crc)
{
    return zeros[0][crc & 0xFFu] ^ zeros[1][(crc >> 8) & 0xFFu] ^ zeros[2][(crc >> 16) & 0xFFu] ^
           zeros[3][crc >> 24];
}

static inline uint64_t dnb_load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

__attribute__((target("sse4.2")))
static uint32_t dnb_crc32c_hw(uint32_t crc, const uint8_t *next, size_t len)
{
    uint64_t crc0 = (uint32_t)~crc, crc1, crc2;
    const uint8_t *end;

    while (len && ((uintptr_t)next & 7u)) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    while (len >= DNB_CRC_LONG * 3) {
        crc1 = 0;
        crc2 = 0;
        end = next + DNB_CRC_LONG;
        do {
            crc0 = _mm_crc32_u64(crc0, dnb_load64(next));
            crc1 = _mm_crc32_u64(crc1, dnb_load64(next + DNB_CRC_LONG));
            crc2 = _mm_crc32_u64(crc2, dnb_load64(next + 2 * DNB_CRC_LONG));
            next += 8;
        } while (next < end);
        crc0 = dnb_crc32c_shift(dnb_crc32c_long, (uint32_t)crc0) ^ crc1;
        crc0 = dnb_crc32c_shift(dnb_crc32c_long, (uint32_t)crc0) ^ crc2;
        next += DNB_CRC_LONG * 2;
        len -= DNB_CRC_LONG * 3;
    }
    while (len >= DNB_CRC_SHORT * 3) {
        crc1 = 0;
        crc2 = 0;
        end = next + DNB_CRC_SHORT;
        do {
            crc0 = _mm_crc32_u64(crc0, dnb_load64(next));
            crc1 = _mm_crc32_u64(crc1, dnb_load64(next + DNB_CRC_SHORT));
            crc2 = _mm_crc32_u64(crc2, dnb_load64(next + 2 * DNB_CRC_SHORT));
            next += 8;
        } while (next < end);
        crc0 = dnb_crc32c_shift(dnb_crc32c_short, (uint32_t)crc0) ^ crc1;
        crc0 = dnb_crc32c_shift(dnb_crc32c_short, (uint32_t)crc0) ^ crc2;
        next += DNB_CRC_SHORT * 2;
        len -= DNB_CRC_SHORT * 3;
    }
    end = next + (len - (len & 7u));
    while (next < end) {
        crc0 = _mm_crc32_u64(crc0, dnb_load64(next));
        next += 8;
    }
    len &= 7u;
    while (len) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    return ~(uint32_t)crc0;
}
#endif

typedef uint32_t (*dnb_crc32c_fn)(uint32_t, const uint8_t *, size_t);
static dnb_crc32c_fn dnb_crc32c_impl = dnb_crc32c_sw;
static int dnb_crc32c_hw_active = 0;

/* Called once at module import (under the GIL); returns 1 when the hardware path is active.
 * force_sw lets tests exercise the software fallback on a machine that has SSE4.2. */
static int dnb_crc32c_init(int force_sw)
{
    dnb_crc32c_sw_init();
    dnb_crc32c_impl = dnb_crc32c_sw;
    dnb_crc32c_hw_active = 0;
#ifdef DNB_CRC32C_HAVE_HW
    __builtin_cpu_init();
    if (!force_sw && __builtin_cpu_supports("sse4.2")) {
        dnb_crc32c_zeros(dnb_crc32c_long, DNB_CRC_LONG);
        dnb_crc32c_zeros(dnb_crc32c_short, DNB_CRC_SHORT);
        dnb_crc32c_impl = dnb_crc32c_hw;
        dnb_crc32c_hw_active = 1;
    }
#endif
    return dnb_crc32c_hw_active;
}

static inline uint32_t dnb_crc32c(uint32_t crc, const uint8_t *p, size_t n)
{
    return dnb_crc32c_impl(crc, p, n);
}

/* Software path callable directly, so tests can compare both paths on the same input. */
static inline uint32_t dnb_crc32c_software(uint32_t crc, const uint8_t *p, size_t n)
{
    return dnb_crc32c_sw(crc, p, n);
}

#endif /* DNB_CRC32C_IMPL_H */
