/* t_num.c: exhaustive bf16/f16 round trips, RNE ties at every midpoint, MXFP4
 * decoding over all codes x scales and the nibble order. */
#include <float.h>
#include <string.h>
#include "kern.h"
#include "num.h"
#include "st.h"
#include "test.h"

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

TEST(num_bf16) {
    int bad = 0;
    /* every pattern: exact round trip, NaN comes back as the same NaN made quiet */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = num_bf16_to_f32((uint16_t)h);
        uint16_t back = num_f32_to_bf16(f);
        int nan = (h & 0x7F80) == 0x7F80 && (h & 0x7F);
        if (nan ? !(isnan(f) && back == (h | 0x40)) : back != h) bad++;
    }
    CHECK_MSG(bad == 0, "%d bf16 patterns do not round-trip", bad);
    /* every midpoint between neighbours h, h+1 (both signs): ties to even, one f32 ulp
     * either side rounds to the nearer one; includes max finite -> inf */
    bad = 0;
    for (uint32_t m = 0; m < 0x7F80; m++)
        for (uint32_t s = 0; s < 2; s++) {
            uint32_t sign = s << 15;
            uint32_t mid = ((sign | m) << 16) | 0x8000u;
            uint16_t even = (uint16_t)(sign | ((m & 1) ? m + 1 : m));
            if (num_f32_to_bf16(bitsf(mid)) != even) bad++;
            if (num_f32_to_bf16(bitsf(mid - 1)) != (sign | m)) bad++;
            if (num_f32_to_bf16(bitsf(mid + 1)) != (sign | (m + 1))) bad++;
        }
    CHECK_MSG(bad == 0, "%d bf16 RNE cases wrong", bad);
    CHECK(num_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(num_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(num_f32_to_bf16(FLT_MAX) == 0x7F80);          /* above the last tie: inf */
    CHECK(num_f32_to_bf16(bitsf(0x7F800001u)) == 0x7FC0); /* tiny-payload NaN stays NaN */
    CHECK(num_f32_to_bf16(bitsf(0xFFFFFFFFu)) == 0xFFFF);
    CHECK(num_f32_to_bf16(INFINITY) == 0x7F80 && num_f32_to_bf16(-INFINITY) == 0xFF80);
    CHECK(num_f32_to_bf16(bitsf(1)) == 0);               /* smallest subnormal rounds to 0 */
}

/* f16 value as float for midpoint tests; 0x7C00 ("next" after max) treated as 2^16. */
static float f16_or_2p16(uint32_t h) { return (h & 0x7FFF) == 0x7C00 ? 65536.0f : num_f16_to_f32((uint16_t)h); }

TEST(num_f16) {
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = num_f16_to_f32((uint16_t)h);
        uint16_t back = num_f32_to_f16(f);
        int nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
        if (nan ? !(isnan(f) && back == (h | 0x200)) : back != h) bad++;
        /* widening is exact: compare against the definition in double */
        if (!nan && (h & 0x7C00) != 0x7C00) {
            int e = (h >> 10) & 31, m = h & 0x3FF;
            double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
            if (h & 0x8000) v = -v;
            if ((double)f != v || !!signbit(f) != !!(h & 0x8000)) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d f16 patterns do not round-trip", bad);
    /* every midpoint between neighbours, subnormals and max -> inf included: the
     * midpoint of two f16 values needs 12 significant bits, exact in f32 */
    bad = 0;
    for (uint32_t m = 0; m < 0x7C00; m++)
        for (uint32_t s = 0; s < 2; s++) {
            uint32_t sign = s << 15;
            float lo = f16_or_2p16(m), hi = f16_or_2p16(m + 1);
            float mid = (lo + hi) * 0.5f;
            uint16_t even = (uint16_t)(sign | ((m & 1) ? m + 1 : m));
            float smid = s ? -mid : mid;
            if (num_f32_to_f16(smid) != even) bad++;
            if (num_f32_to_f16(nextafterf(smid, 0.0f)) != (sign | m)) bad++;
            if (num_f32_to_f16(nextafterf(smid, s ? -INFINITY : INFINITY)) != (sign | (m + 1))) bad++;
        }
    CHECK_MSG(bad == 0, "%d f16 RNE cases wrong", bad);
    CHECK(num_f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(num_f32_to_f16(65519.99f) == 0x7BFF);
    CHECK(num_f32_to_f16(65520.0f) == 0x7C00);
    CHECK(num_f32_to_f16(-1e10f) == 0xFC00);
    CHECK(num_f32_to_f16(0x1p-24f) == 0x0001);
    CHECK(num_f32_to_f16(0x1p-25f) == 0x0000);            /* tie to even (zero) */
    CHECK(num_f32_to_f16(0x1.8p-24f) == 0x0002);          /* tie 1.5 ulp -> 2 */
    CHECK(num_f32_to_f16(-0x1p-26f) == 0x8000);
    CHECK(num_f32_to_f16(0x1.ff8p-15f) == 0x03FF);        /* largest subnormal */
    CHECK(num_f32_to_f16(0x1.ffcp-15f) == 0x0400);        /* tie rounds up into the normals */
    CHECK(num_f32_to_f16(bitsf(0x7F800001u)) == 0x7E00);
    CHECK(num_f32_to_f16(bitsf(0xFFC00000u)) == 0xFE00);
    CHECK(num_f32_to_f16(INFINITY) == 0x7C00);
}

TEST(num_mxfp4) {
    static const int half_mag[8] = {0, 1, 2, 3, 4, 6, 8, 12}; /* E2M1 magnitudes x 2 */
    int bad = 0, badlut = 0;
    for (int c = 0; c < 16; c++)
        for (int s = 0; s < 256; s++) {
            double v = num_mxfp4_value((uint8_t)c, (uint8_t)s);
            if (s == 255) { bad += !isnan(v); continue; }
            double want = ldexp(half_mag[c & 7], s - 128);
            if (c & 8) want = -want;
            if (v != want || !!signbit(v) != !!(c & 8)) bad++;
            /* the kernels' f32 LUT entry: exact, or inf where the value exceeds float */
            float lut = k_e2m1[c] * kern_e8m0_f32((uint8_t)s);
            float wantf = fabs(want) > FLT_MAX ? (c & 8 ? -INFINITY : INFINITY) : (float)want;
            if (fbits(lut) != fbits(wantf) || (fabs(want) <= FLT_MAX && (double)lut != want)) badlut++;
        }
    CHECK_MSG(bad == 0, "%d MXFP4 values wrong", bad);
    CHECK_MSG(badlut == 0, "%d MXFP4 LUT entries wrong", badlut);
    /* codes 6 and 7 (magnitudes 4 and 6) at scale 254 exceed float: doubles hold them */
    CHECK(num_mxfp4_value(6, 254) == ldexp(1.0, 129) && num_mxfp4_value(7, 254) == 6.0 * ldexp(1.0, 127));
    CHECK(num_mxfp4_value(4, 254) > FLT_MAX && num_mxfp4_value(3, 254) < FLT_MAX);
    CHECK(num_mxfp4_value(1, 0) == ldexp(1.0, -128));
    CHECK(num_mxfp4_value(15, 127) == -6.0);
    CHECK(isnan(num_mxfp4_value(0, 255)));
    CHECK(kern_e8m0_f32(255) == 0.0f);
    /* nibble order: low nibble is the even element */
    const uint8_t packed[2] = {0x21, 0xF7};
    CHECK(num_mxfp4_code(packed, 0) == 1 && num_mxfp4_code(packed, 1) == 2);
    CHECK(num_mxfp4_code(packed, 2) == 7 && num_mxfp4_code(packed, 3) == 15);
    const uint8_t sc[5] = {0, 255, 127, 255, 254};
    CHECK(num_mxfp4_count_nan_scales(sc, 5) == 2);
    CHECK(num_mxfp4_count_nan_scales(sc, 0) == 0 && num_mxfp4_count_nan_scales(sc + 3, 1) == 1);
    /* runs of 255 at both ends and across a vector width, against a byte count */
    uint8_t big[333];
    size_t want = 0;
    for (size_t i = 0; i < sizeof big; i++) {
        big[i] = (uint8_t)(i < 3 || i >= 330 || (i % 37 == 5) || (i >= 60 && i < 130) ? 255 : i % 255);
        want += big[i] == 255;
    }
    CHECK(num_mxfp4_count_nan_scales(big, sizeof big) == want);
}

/* The router copies' quantizer: a decoded group quantizes back to itself when
 * its largest magnitude is code 7 (6 x scale, so the scale is the smallest that
 * holds it); any value lands on the nearest code of the smallest scale that holds
 * its group's max; non-finite values as documented. */
static uint32_t q_rnd(uint32_t *st) { return (*st = *st * 1664525u + 1013904223u) >> 8; }
TEST(num_mxfp4_quantize) {
    uint32_t st = 12345u;
#define R() q_rnd(&st)
    enum { N = 32 * 64 };
    static float x[N];
    static uint8_t P[N / 2], S[N / 32], P2[N / 2], S2[N / 32];
    for (int i = 0; i < N / 2; i++) P[i] = (uint8_t)R();
    for (int g = 0; g < N / 32; g++) {
        S[g] = (uint8_t)(g == 0 ? 0 : g == 1 ? 254 : 1 + R() % 252);
        P[g * 16 + R() % 16] |= 0x07; /* one element of magnitude 6 in each group */
        for (int i = 0; i < 32; i++) {
            double v = num_mxfp4_value(num_mxfp4_code(P + g * 16, (size_t)i), S[g]);
            x[g * 32 + i] = fabs(v) > FLT_MAX ? (v < 0 ? -FLT_MAX : FLT_MAX) : (float)v;
        }
    }
    /* scale 254 holds values past float: its group quantizes from +-FLT_MAX, so check it apart */
    num_mxfp4_quantize(P2, S2, x, N);
    int bad = 0;
    for (int g = 0; g < N / 32; g++) {
        if (S[g] == 254) { bad += S2[g] != 253; continue; }
        bad += S2[g] != S[g];
        for (int i = 0; i < 32; i++) {
            uint8_t a = num_mxfp4_code(P + g * 16, (size_t)i), b = num_mxfp4_code(P2 + g * 16, (size_t)i);
            bad += (a & 7) != (b & 7) || ((a & 7) && a != b); /* -0 may come back as +0 */
        }
    }
    CHECK_MSG(bad == 0, "%d round-trip mismatches", bad);
    /* random values: the nearest code of the smallest scale holding the group's max */
    for (int i = 0; i < N; i++) x[i] = (float)ldexp((double)(R() % 2000001) / 1e6 - 1.0, (int)(R() % 60) - 30 + (i / 32) % 5);
    num_mxfp4_quantize(P2, S2, x, N);
    bad = 0;
    for (int g = 0; g < N / 32; g++) {
        double amax = 0;
        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs((double)x[g * 32 + i]));
        const double sc = ldexp(1.0, S2[g] - 127);
        bad += !(amax <= 6 * sc) || !(amax > 3 * sc || S2[g] == 0);
        for (int i = 0; i < 32; i++) {
            const double v = x[g * 32 + i], q = num_mxfp4_value(num_mxfp4_code(P2 + g * 16, (size_t)i), S2[g]);
            for (int c = 0; c < 16; c++) /* no code of this scale is strictly nearer */
                bad += fabs(num_mxfp4_value((uint8_t)c, S2[g]) - v) < fabs(q - v);
        }
    }
    CHECK_MSG(bad == 0, "%d nearest-code violations", bad);
    /* zeros, tiny values, NaN and infinities */
    for (int i = 0; i < 64; i++) x[i] = 0;
    x[32] = NAN; x[33] = INFINITY; x[34] = -INFINITY; x[35] = 1.5f; x[36] = -0.2f; x[37] = 1e-45f;
    num_mxfp4_quantize(P2, S2, x, 64);
    CHECK(S2[0] == 0 && P2[0] == 0 && P2[15] == 0);
    CHECK(S2[1] == 125); /* max 1.5 (the infinities left out) -> 2^-2: 1.5 = 6 x 0.25 */
    CHECK(num_mxfp4_code(P2 + 16, 0) == 0 && num_mxfp4_code(P2 + 16, 1) == 7 && num_mxfp4_code(P2 + 16, 2) == 15);
    CHECK(num_mxfp4_code(P2 + 16, 3) == 7 && num_mxfp4_code(P2 + 16, 4) == 10 && num_mxfp4_code(P2 + 16, 5) == 0);
#undef R
}

TEST(num_to_f32) {
    uint16_t h[3] = {0x3F80, 0xC000, 0x0001};
    float f[3], src[3] = {1.5f, -0.0f, 3.0f};
    num_to_f32(f, h, DT_BF16, 3);
    CHECK(f[0] == 1.0f && f[1] == -2.0f && f[2] == bitsf(0x00010000u));
    uint16_t g[3] = {0x3C00, 0xC000, 0x0001};
    num_to_f32(f, g, DT_F16, 3);
    CHECK(f[0] == 1.0f && f[1] == -2.0f && f[2] == 0x1p-24f);
    num_to_f32(f, src, DT_F32, 3);
    CHECK(memcmp(f, src, sizeof f) == 0);
    /* the blocked bf16 path: every pattern, and every length 0..40 at odd offsets
     * (blocks of 16 plus the tail), against the one-value conversion */
    static uint16_t all[65536 + 48];
    static float out[65536 + 48];
    for (uint32_t i = 0; i < 65536 + 48; i++) all[i] = (uint16_t)(i * 40503u);
    num_to_f32(out, all, DT_BF16, 65536 + 48);
    int bad = 0;
    for (uint32_t i = 0; i < 65536 + 48; i++) {
        float w = num_bf16_to_f32(all[i]);
        bad += memcmp(&out[i], &w, 4) != 0;
    }
    for (size_t n = 0; n <= 40; n++) {
        float o[48];
        for (int k = 0; k < 48; k++) o[k] = 7.0f;
        num_to_f32(o + 1, all + 3 + n, DT_BF16, n);
        for (size_t k = 0; k < n; k++) { float w = num_bf16_to_f32(all[3 + n + k]); bad += memcmp(&o[1 + k], &w, 4) != 0; }
        bad += o[0] != 7.0f || o[1 + n] != 7.0f;
    }
    CHECK(bad == 0);
}
