/*
 * num.c: bf16/f16 <-> f32 conversions (round-to-nearest-even, NaN kept quiet) and
 * exact MXFP4 element decoding. Everything works on bit patterns, so results do
 * not depend on the FPU rounding mode or on compiler flags.
 */
#include <float.h>
#include <math.h>
#include <string.h>
#include "base.h"
#include "num.h"
#include "st.h"

/* E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; bit 3 is the sign (code 8 = -0). */
const float k_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float num_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t num_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: truncate and force the quiet bit so
                                            rounding can never carry it into inf */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* RNE: add 0x7FFF plus the lowest kept bit; a carry may ripple into the exponent,
     * which is the correct rounding (up to inf for values >= bf16 max + half ulp). */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float num_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        /* zero or subnormal: m * 2^-24 is exact in f32 */
        float v = (float)m * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31) /* inf, or NaN made quiet (as F16C's vcvtph2ps does) */
        return bits_f32(sign | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t num_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: keep the top payload bits, set the quiet bit */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    /* 65520 = halfway between f16 max 65504 (odd mantissa) and 2^16: ties go up to inf */
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);
    if (a < 0x38800000u) {
        /* below the smallest normal 2^-14: result = RNE(value / 2^-24) */
        uint32_t e = a >> 23;
        if (e < 101) return sign; /* < 2^-26: rounds to zero (and f32 zero/subnormals) */
        uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126 - e; /* value = m * 2^(e-150) = (m >> shift) * 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q); /* q may reach 0x400 = the smallest normal: correct */
    }
    a -= 112u << 23; /* rebias exponent 127 -> 15 */
    a += 0xFFFu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}

double num_mxfp4_value(uint8_t code, uint8_t scale) {
    if (scale == 255) return NAN;
    return ldexp((double)k_e2m1[code & 0xF], (int)scale - 127);
}

void num_mxfp4_quantize(uint8_t *packed, uint8_t *scales, const float *x, size_t n) {
    /* upper ends of the magnitudes that round to E2M1 codes 0 .. 6 (the rest is 7,
     * i.e. 6): the midpoints of k_e2m1[0 .. 7], a tie going to the smaller */
    static const double up[7] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
    for (size_t g = 0; g < n / 32; g++) {
        const float *v = x + g * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(v[i]);
            if (a > amax && a <= FLT_MAX) amax = a;
        }
        int k = -127; /* the smallest k >= -127 with amax <= 6 * 2^k */
        if (amax > 0) {
            int e;
            const double m = frexp((double)amax / 6.0, &e); /* amax / 6 = m 2^e, m in [0.5, 1) */
            k = m == 0.5 ? e - 1 : e;
            if (k < -127) k = -127;
        }
        scales[g] = (uint8_t)(k + 127); /* amax <= FLT_MAX < 6 * 2^126: k <= 126 */
        const double inv = ldexp(1.0, -k);
        for (int i = 0; i < 32; i += 2) {
            uint8_t c[2];
            for (int h = 0; h < 2; h++) {
                const float f = v[i + h];
                const double a = isnan(f) ? 0 : fabs((double)f) * inv;
                uint8_t q = 0;
                while (q < 7 && a > up[q]) q++;
                c[h] = (uint8_t)(q | (q && signbit(f) ? 8 : 0));
            }
            packed[g * 16 + (size_t)i / 2] = (uint8_t)(c[0] | c[1] << 4);
        }
    }
}

/* memchr skips to each 255 with libc's vector code: the byte loop was 1.3% of
 * decode CPU at 6.2 GB on ladder (perf, Zen 5), every landed expert's scales
 * scanned once; a healthy checkpoint has none, so the scan is one memchr */
size_t num_mxfp4_count_nan_scales(const uint8_t *scales, size_t n) {
    size_t c = 0;
    const uint8_t *p = scales, *end = scales + n;
    while (p < end && (p = memchr(p, 255, (size_t)(end - p))) != NULL) {
        c++;
        p++;
    }
    return c;
}

void num_to_f32(float *dst, const void *src, int dtype, size_t n) {
    const uint16_t *h = src;
    switch (dtype) {
    case DT_F32: memmove(dst, src, n * sizeof(float)); break;
    case DT_BF16: {
        /* Norm and projection vectors are converted from a weight unit every pass,
         * straight from DRAM: the element-at-a-time loop waited on each line
         * (~1% of a ladder decode's driving thread, perf). Blocks of 16 with a
         * fixed trip count vectorize at -O2, and a prefetch runs 1 KB ahead. */
        size_t i = 0;
        for (; i + 16 <= n; i += 16) {
            uint32_t t[16];
            if (n - i > 512) __builtin_prefetch(h + i + 512);
            for (int j = 0; j < 16; j++) t[j] = (uint32_t)h[i + j] << 16;
            memcpy(dst + i, t, sizeof t);
        }
        for (; i < n; i++) dst[i] = num_bf16_to_f32(h[i]);
        break;
    }
    case DT_F16: for (size_t i = 0; i < n; i++) dst[i] = num_f16_to_f32(h[i]); break;
    default: ST_ASSERT(!"num_to_f32: dtype must be F32, BF16 or F16");
    }
}
