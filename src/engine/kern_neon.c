/*
 * kern_neon.c: arm64 Advanced SIMD fast paths. Same contract as kern_ref.c: the 16
 * lanes live in four float32x4_t (lanes 0-3, 4-7, 8-11, 12-15), vfmaq_f32 is a
 * fused multiply-add, the tail is zero padding and the tree is kern.h's, so the
 * outputs are bit-identical to the scalar reference.
 * Blocking as in kern_x86.c: decode (T = 1) runs 4 rows at once (16 accumulators),
 * prefill runs 2 rows x 2 activations. SiTU, exp_f64, kda_step and vecmat follow
 * their kern_ref.c sequences op for op on float64x2_t / float32x4_t lanes.
 */
#include "kern.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>
#include <string.h>
#include "base.h"
#include "num.h"
#include "st.h"

#define INL static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 4")
#define PF_DIST 1024

typedef struct { float32x4_t v[4]; } v16;

/* 16 weights at element i of a full chunk. */
INL v16 wn(const void *W, int dt, int64_t i) {
    v16 w;
    if (dt == DT_F32) {
        const float *p = (const float *)W + i;
        for (int q = 0; q < 4; q++) w.v[q] = vld1q_f32(p + 4 * q);
        return w;
    }
    const uint16_t *h = (const uint16_t *)W + i;
    uint16x8_t h0 = vld1q_u16(h), h1 = vld1q_u16(h + 8);
    if (dt == DT_BF16) { /* bf16 -> f32 is a 16-bit left shift (exact) */
        w.v[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h0), 16));
        w.v[1] = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h0), 16));
        w.v[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h1), 16));
        w.v[3] = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h1), 16));
    } else { /* fcvtl: exact widening, subnormals kept (FPCR.FZ is off on Linux) */
        w.v[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h0)));
        w.v[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h0)));
        w.v[2] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h1)));
        w.v[3] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h1)));
    }
    return w;
}

/* Tail chunk (n < 16 left): through a zeroed stack buffer = the contract's padding. */
INL v16 wn_tail(const void *W, int dt, int64_t i, int64_t n) {
    if (dt == DT_F32) {
        float buf[16] = {0};
        memcpy(buf, (const float *)W + i, (size_t)n * 4);
        return wn(buf, DT_F32, 0);
    }
    uint16_t h[16] = {0};
    memcpy(h, (const uint16_t *)W + i, (size_t)n * 2);
    return wn(h, dt, 0);
}

/* kern.h's tree: (0-3 + 8-11), (4-7 + 12-15); then + across halves; then pairs. */
INL float redn(const float32x4_t a[4]) {
    float32x4_t b0 = vaddq_f32(a[0], a[2]), b1 = vaddq_f32(a[1], a[3]);
    float32x4_t c = vaddq_f32(b0, b1);
    float32x2_t d = vadd_f32(vget_low_f32(c), vget_high_f32(c));
    return vget_lane_f32(d, 0) + vget_lane_f32(d, 1);
}

INL void blkn(float *Y, int64_t ldy, const void *W, int dt, int64_t cols, const float *X,
              int64_t ldx, int64_t r, int64_t t, int RB, int TB) {
    const size_t esz = dt == DT_F32 ? 4 : 2;
    const char *wr[4];
    const float *xr[2];
    float32x4_t acc[4][2][4];
    UNROLL for (int i = 0; i < RB; i++) wr[i] = (const char *)W + (size_t)((r + i) * cols) * esz;
    UNROLL for (int j = 0; j < TB; j++) xr[j] = X + (t + j) * ldx;
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        UNROLL for (int q = 0; q < 4; q++) acc[i][j][q] = vdupq_n_f32(0.0f);
    int64_t k = 0;
    for (; k + 16 <= cols; k += 16) {
        v16 w[4];
        UNROLL for (int i = 0; i < RB; i++) {
            if (TB == 1) { /* PF_DIST ahead, wrapping into the next block (kern_x86.c) */
                size_t o = (size_t)k * esz + PF_DIST, rbytes = (size_t)cols * esz;
                __builtin_prefetch(wr[i] + (o >= rbytes ? o + (size_t)(RB - 1) * rbytes : o));
            }
            w[i] = wn(wr[i], dt, k);
        }
        UNROLL for (int j = 0; j < TB; j++) {
            v16 x = wn(xr[j], DT_F32, k);
            UNROLL for (int i = 0; i < RB; i++) UNROLL for (int q = 0; q < 4; q++)
                acc[i][j][q] = vfmaq_f32(acc[i][j][q], w[i].v[q], x.v[q]);
        }
    }
    if (k < cols) {
        v16 w[4];
        UNROLL for (int i = 0; i < RB; i++) w[i] = wn_tail(wr[i], dt, k, cols - k);
        UNROLL for (int j = 0; j < TB; j++) {
            v16 x = wn_tail(xr[j], DT_F32, k, cols - k);
            UNROLL for (int i = 0; i < RB; i++) UNROLL for (int q = 0; q < 4; q++)
                acc[i][j][q] = vfmaq_f32(acc[i][j][q], w[i].v[q], x.v[q]);
        }
    }
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        Y[(t + j) * ldy + r + i] = redn(acc[i][j]);
}

INL void drvn(float *Y, int64_t ldy, const void *W, int dt, int64_t cols, const float *X,
              int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    int64_t r = r0;
    if (T == 1) {
        for (; r + 4 <= r1; r += 4) blkn(Y, ldy, W, dt, cols, X, ldx, r, 0, 4, 1);
    } else {
        for (; r + 2 <= r1; r += 2) {
            int64_t t = 0;
            for (; t + 2 <= T; t += 2) blkn(Y, ldy, W, dt, cols, X, ldx, r, t, 2, 2);
            for (; t < T; t++) blkn(Y, ldy, W, dt, cols, X, ldx, r, t, 2, 1);
        }
    }
    for (; r < r1; r++) {
        int64_t t = 0;
        for (; t + 2 <= T; t += 2) blkn(Y, ldy, W, dt, cols, X, ldx, r, t, 1, 2);
        for (; t < T; t++) blkn(Y, ldy, W, dt, cols, X, ldx, r, t, 1, 1);
    }
}

static void matmul_neon(float *Y, int64_t ldy, const void *W, int dt, int64_t cols,
                        const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    switch (dt) {
    case DT_F32: drvn(Y, ldy, W, DT_F32, cols, X, ldx, T, r0, r1); break;
    case DT_BF16: drvn(Y, ldy, W, DT_BF16, cols, X, ldx, T, r0, r1); break;
    case DT_F16: drvn(Y, ldy, W, DT_F16, cols, X, ldx, T, r0, r1); break;
    default: ST_ASSERT(!"matmul: dtype must be F32, BF16 or F16");
    }
}

static float dot_neon(const float *a, const float *b, int64_t n) {
    float y;
    blkn(&y, 1, a, DT_F32, n, b, n, 0, 0, 1, 1);
    return y;
}

/* MXFP4: 8 bytes -> 16 codes in element order (low nibble first) by zipping the
 * low and high nibbles. Every value k_e2m1[c] * 2^(s-127) has at most two
 * significant bits, so its f32 bits are its top 16 bits followed by 16 zeros
 * (subnormals, inf and -0 included): a group's 16 LUT entries are two 16-byte
 * tables (bytes 2 and 3 of each f32 of kern_fp4_lut[s], one de-interleaving
 * vld4q_u8), each code looks both bytes up (vqtbl1q_u8), and the byte pairs,
 * zipped to 16 bits, widen into the top of each f32 (vshll 16): the LUT's own
 * bits, no arithmetic: 13 vector ops per 16 weights (load and fma aside) where
 * widening the magnitude, converting, scaling and xoring the sign took 35. Not
 * timed (no arm64 hardware here); bit-identical to the reference under
 * qemu-aarch64 for every scale byte, random codes, T = 1..8 and rows of 64 to
 * 8,224 columns (test kern_mxfp4_every_scale covers it in the test suite). */
typedef struct { uint8x16_t lo, hi; } fp4_lutn;
INL fp4_lutn fp4_lut_n(uint8_t s) {
    const uint8x16x4_t q = vld4q_u8((const uint8_t *)kern_fp4_lut[s]);
    return (fp4_lutn){q.val[2], q.val[3]};
}
INL v16 fp4_wn(const uint8_t *p, fp4_lutn t) {
    const uint8x8_t b = vld1_u8(p), lo_n = vand_u8(b, vdup_n_u8(15)), hi_n = vshr_n_u8(b, 4);
    const uint8x16_t codes = vcombine_u8(vzip1_u8(lo_n, hi_n), vzip2_u8(lo_n, hi_n));
    const uint8x16_t lo = vqtbl1q_u8(t.lo, codes), hi = vqtbl1q_u8(t.hi, codes);
    const uint16x8_t w0 = vreinterpretq_u16_u8(vzip1q_u8(lo, hi)), w1 = vreinterpretq_u16_u8(vzip2q_u8(lo, hi));
    v16 w;
    w.v[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(w0), 16));
    w.v[1] = vreinterpretq_f32_u32(vshll_high_n_u16(w0, 16));
    w.v[2] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(w1), 16));
    w.v[3] = vreinterpretq_f32_u32(vshll_high_n_u16(w1, 16));
    return w;
}

INL void fp4blkn(float *Y, int64_t ldy, const uint8_t *P, const uint8_t *S, int64_t cols,
                 const float *X, int64_t ldx, int64_t r, int64_t t, int RB, int TB) {
    const int64_t ng = cols / KERN_MXFP4_GROUP, rb = cols / 2;
    const uint8_t *pr[4], *sr[4];
    const float *xr[2];
    float32x4_t acc[4][2][4];
    UNROLL for (int i = 0; i < RB; i++) { pr[i] = P + (r + i) * rb; sr[i] = S + (r + i) * ng; }
    UNROLL for (int j = 0; j < TB; j++) xr[j] = X + (t + j) * ldx;
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        UNROLL for (int q = 0; q < 4; q++) acc[i][j][q] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < ng; g++) {
        fp4_lutn hs[4];
        UNROLL for (int i = 0; i < RB; i++) {
            if (TB == 1 && (g & 3) == 0) /* next row block, as kern_x86.c explains */
                __builtin_prefetch(pr[i] + RB * rb + g * 16);
            hs[i] = fp4_lut_n(sr[i][g]);
        }
        UNROLL for (int h = 0; h < 2; h++) {
            v16 w[4];
            UNROLL for (int i = 0; i < RB; i++) w[i] = fp4_wn(pr[i] + g * 16 + h * 8, hs[i]);
            UNROLL for (int j = 0; j < TB; j++) {
                v16 x = wn(xr[j], DT_F32, g * 32 + h * 16);
                UNROLL for (int i = 0; i < RB; i++) UNROLL for (int q = 0; q < 4; q++)
                    acc[i][j][q] = vfmaq_f32(acc[i][j][q], w[i].v[q], x.v[q]);
            }
        }
    }
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        Y[(t + j) * ldy + r + i] = redn(acc[i][j]);
}

static void mxfp4_neon(float *Y, int64_t ldy, const uint8_t *P, const uint8_t *S, int64_t cols,
                       const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    ST_ASSERT(cols % KERN_MXFP4_GROUP == 0);
    int64_t r = r0;
    if (T == 1) {
        for (; r + 4 <= r1; r += 4) fp4blkn(Y, ldy, P, S, cols, X, ldx, r, 0, 4, 1);
    } else {
        for (; r + 2 <= r1; r += 2) {
            int64_t t = 0;
            for (; t + 2 <= T; t += 2) fp4blkn(Y, ldy, P, S, cols, X, ldx, r, t, 2, 2);
            for (; t < T; t++) fp4blkn(Y, ldy, P, S, cols, X, ldx, r, t, 2, 1);
        }
    }
    for (; r < r1; r++) {
        int64_t t = 0;
        for (; t + 2 <= T; t += 2) fp4blkn(Y, ldy, P, S, cols, X, ldx, r, t, 1, 2);
        for (; t < T; t++) fp4blkn(Y, ldy, P, S, cols, X, ldx, r, t, 1, 1);
    }
}

/* FP8 e4m3fn: as kern_x86q.c, s << 15 | (b & 0x7F) << 7 is an f16 of e4m3 / 256
 * (vshll of the sign-extended byte by 7, bit 14 cleared), fcvtl widens it exactly
 * (subnormals kept: FPCR.FZ is off on Linux), and the weight is h (256 S), or
 * (256 h) S where 256 S would overflow (finite |S| >= 2^120): the reference's one
 * rounding of e4m3 S either way. NaN codes decode to +-1.875: a row holding one
 * gets NaN (its dot is NaN) from a byte scan. Not timed (no arm64 hardware here);
 * bit-identical to the reference under qemu-aarch64 (tests/t_kern.c). */
INL v16 fp8_wn(const uint8_t *p, float32x4_t sc, float32x4_t pre, int slow) {
    const int8x16_t b = vreinterpretq_s8_u8(vld1q_u8(p));
    const uint16x8_t m = vdupq_n_u16(0x4000);
    const uint16x8_t h0 = vbicq_u16(vreinterpretq_u16_s16(vshll_n_s8(vget_low_s8(b), 7)), m);
    const uint16x8_t h1 = vbicq_u16(vreinterpretq_u16_s16(vshll_n_s8(vget_high_s8(b), 7)), m);
    v16 w;
    w.v[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h0)));
    w.v[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h0)));
    w.v[2] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h1)));
    w.v[3] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h1)));
    for (int q = 0; q < 4; q++) w.v[q] = vmulq_f32(slow ? vmulq_f32(w.v[q], pre) : w.v[q], sc);
    return w;
}

static int fp8_has_nan_n(const uint8_t *p, int64_t n) {
    uint8x16_t a = vdupq_n_u8(0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) a = vmaxq_u8(a, vandq_u8(vld1q_u8(p + i), vdupq_n_u8(0x7F)));
    int bad = vmaxvq_u8(a) == 0x7F;
    for (; i < n; i++) bad |= (p[i] & 0x7F) == 0x7F;
    return bad;
}

INL void fp8blkn(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols, const float *X,
                 int64_t ldx, int64_t r, int64_t t, int RB, int TB) {
    const int64_t nb = (cols + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK, full = cols & ~(int64_t)15;
    const uint8_t *wr[4];
    const float *sr[4], *xr[2];
    float32x4_t acc[4][2][4];
    UNROLL for (int i = 0; i < RB; i++) { wr[i] = W + (r + i) * cols; sr[i] = S + ((r + i) / KERN_FP8_BLOCK) * nb; }
    UNROLL for (int j = 0; j < TB; j++) xr[j] = X + (t + j) * ldx;
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        UNROLL for (int q = 0; q < 4; q++) acc[i][j][q] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b * KERN_FP8_BLOCK < full; b++) {
        const int64_t k0 = b * KERN_FP8_BLOCK, k1 = k0 + KERN_FP8_BLOCK < full ? k0 + KERN_FP8_BLOCK : full;
        float32x4_t sc[4], pre[4];
        int slow = 0;
        UNROLL for (int i = 0; i < RB; i++) {
            const float s = sr[i][b];
            const int sl = isfinite(s) && fabsf(s) >= 0x1p120f;
            slow |= sl;
            sc[i] = vdupq_n_f32(sl ? s : s * 256.0f);
            pre[i] = vdupq_n_f32(sl ? 256.0f : 1.0f);
            if (TB == 1) { /* next row block, as kern_x86.c explains */
                __builtin_prefetch(wr[i] + RB * cols + k0);
                __builtin_prefetch(wr[i] + RB * cols + k0 + 64);
            }
        }
        for (int64_t k = k0; k < k1; k += 16) {
            v16 w[4];
            UNROLL for (int i = 0; i < RB; i++) w[i] = fp8_wn(wr[i] + k, sc[i], pre[i], slow);
            UNROLL for (int j = 0; j < TB; j++) {
                const v16 x = wn(xr[j], DT_F32, k);
                UNROLL for (int i = 0; i < RB; i++) UNROLL for (int q = 0; q < 4; q++)
                    acc[i][j][q] = vfmaq_f32(acc[i][j][q], w[i].v[q], x.v[q]);
            }
        }
    }
    if (full < cols) { /* the contract's zero padding, weights by the reference's decode */
        v16 w[4];
        UNROLL for (int i = 0; i < RB; i++) {
            float wt[16] = {0};
            for (int64_t k = full; k < cols; k++) wt[k - full] = kern_e4m3_f32(wr[i][k]) * sr[i][k / KERN_FP8_BLOCK];
            w[i] = wn(wt, DT_F32, 0);
        }
        UNROLL for (int j = 0; j < TB; j++) {
            const v16 x = wn_tail(xr[j], DT_F32, full, cols - full);
            UNROLL for (int i = 0; i < RB; i++) UNROLL for (int q = 0; q < 4; q++)
                acc[i][j][q] = vfmaq_f32(acc[i][j][q], w[i].v[q], x.v[q]);
        }
    }
    UNROLL for (int i = 0; i < RB; i++) {
        const int bad = fp8_has_nan_n(wr[i], full);
        UNROLL for (int j = 0; j < TB; j++) Y[(t + j) * ldy + r + i] = bad ? NAN : redn(acc[i][j]);
    }
}

/* INT4: 8 bytes -> 16 codes in element order (fp4_wn's zip: the packing is the
 * MXFP4 one, low nibble first), q = code - 8 widened to s32, converted exactly,
 * then the reference's product (float)q * s. Not timed; bit-identical under qemu. */
INL v16 int4_wn(const int32_t *p, float32x4_t s) {
    const uint8x8_t b = vld1_u8((const uint8_t *)p), lo_n = vand_u8(b, vdup_n_u8(15)), hi_n = vshr_n_u8(b, 4);
    const uint8x16_t codes = vcombine_u8(vzip1_u8(lo_n, hi_n), vzip2_u8(lo_n, hi_n));
    const int8x16_t q8 = vreinterpretq_s8_u8(vsubq_u8(codes, vdupq_n_u8(8)));
    const int16x8_t q0 = vmovl_s8(vget_low_s8(q8)), q1 = vmovl_s8(vget_high_s8(q8));
    v16 w;
    w.v[0] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q0))), s);
    w.v[1] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(q0))), s);
    w.v[2] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q1))), s);
    w.v[3] = vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(q1))), s);
    return w;
}

INL void int4blkn(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols, const float *X,
                  int64_t ldx, int64_t r, int64_t t, int RB, int TB) {
    const int64_t ng = cols / KERN_INT4_GROUP, rw = cols / 8;
    const int32_t *wr[4];
    const uint16_t *sr[4];
    const float *xr[2];
    float32x4_t acc[4][2][4];
    UNROLL for (int i = 0; i < RB; i++) { wr[i] = Wp + (r + i) * rw; sr[i] = S + (r + i) * ng; }
    UNROLL for (int j = 0; j < TB; j++) xr[j] = X + (t + j) * ldx;
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        UNROLL for (int q = 0; q < 4; q++) acc[i][j][q] = vdupq_n_f32(0.0f);
    for (int64_t g = 0; g < ng; g++) {
        float32x4_t sv[4];
        UNROLL for (int i = 0; i < RB; i++) {
            if (TB == 1 && (g & 3) == 0) __builtin_prefetch(wr[i] + RB * rw + g * 4);
            sv[i] = vreinterpretq_f32_u32(vdupq_n_u32((uint32_t)sr[i][g] << 16));
        }
        UNROLL for (int h = 0; h < 2; h++) {
            v16 w[4];
            UNROLL for (int i = 0; i < RB; i++) w[i] = int4_wn(wr[i] + g * 4 + h * 2, sv[i]);
            UNROLL for (int j = 0; j < TB; j++) {
                const v16 x = wn(xr[j], DT_F32, g * 32 + h * 16);
                UNROLL for (int i = 0; i < RB; i++) UNROLL for (int q = 0; q < 4; q++)
                    acc[i][j][q] = vfmaq_f32(acc[i][j][q], w[i].v[q], x.v[q]);
            }
        }
    }
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        Y[(t + j) * ldy + r + i] = redn(acc[i][j]);
}

/* The MXFP4 walk: decode 4 rows at once, prefill 2 x 2 blocks, the rest singly. */
#define QWALK_N(BLK)                                                                  \
    int64_t r = r0;                                                                   \
    if (T == 1) {                                                                     \
        for (; r + 4 <= r1; r += 4) BLK(r, 0, 4, 1);                                  \
    } else {                                                                          \
        for (; r + 2 <= r1; r += 2) {                                                 \
            int64_t t = 0;                                                            \
            for (; t + 2 <= T; t += 2) BLK(r, t, 2, 2);                               \
            for (; t < T; t++) BLK(r, t, 2, 1);                                       \
        }                                                                             \
    }                                                                                 \
    for (; r < r1; r++) {                                                             \
        int64_t t = 0;                                                                \
        for (; t + 2 <= T; t += 2) BLK(r, t, 1, 2);                                   \
        for (; t < T; t++) BLK(r, t, 1, 1);                                           \
    }

static void fp8_neon(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols, const float *X,
                     int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
#define BLK8(R, TT, RB, TB) fp8blkn(Y, ldy, W, S, cols, X, ldx, R, TT, RB, TB)
    QWALK_N(BLK8)
#undef BLK8
}

static void int4_neon(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols, const float *X,
                      int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    ST_ASSERT(cols % KERN_INT4_GROUP == 0);
#define BLK4(R, TT, RB, TB) int4blkn(Y, ldy, Wp, S, cols, X, ldx, R, TT, RB, TB)
    QWALK_N(BLK4)
#undef BLK4
}

/* SiTU, 4 elements per step as two float64x2_t: kern_ref_situ's sequence op for op
 * (mul then add where it has two roundings, vfmaq/vfmsq where it has one fma); 2^k
 * from the shifter's low bits as kern_x86.c does. vmaxq/vminq (not the *nm forms)
 * keep a NaN argument NaN, as the reference's compares. The tail runs the reference. */
INL float64x2_t exp_parts_n(float64x2_t z, float64x2_t *p) {
    const float64x2_t sh = vdupq_n_f64(KERN_SHIFTER);
    const float64x2_t t = vaddq_f64(vmulq_f64(z, vdupq_n_f64(KERN_INV_LN2)), sh), kd = vsubq_f64(t, sh);
    float64x2_t r = vfmsq_f64(z, kd, vdupq_n_f64(KERN_LN2_HI)); /* fma(-kd, hi, z) */
    r = vfmsq_f64(r, kd, vdupq_n_f64(KERN_LN2_LO));
    float64x2_t q = vdupq_n_f64(KERN_EXPM1_C13);
#define HORNER(c) q = vfmaq_f64(vdupq_n_f64(c), q, r);
    KERN_EXPM1_TAYLOR(HORNER)
#undef HORNER
    *p = vfmaq_f64(r, q, vmulq_f64(r, r));
    return vreinterpretq_f64_s64(vshlq_n_s64(vaddq_s64(vreinterpretq_s64_f64(t), vdupq_n_s64(1023)), 52));
}

INL float64x2_t situ2(float64x2_t gd, float64x2_t ud, float64x2_t k1, float64x2_t k2, float64x2_t b12) {
    const float64x2_t one = vdupq_n_f64(1.0), two = vdupq_n_f64(2.0), lo = vdupq_n_f64(KERN_EXPM1_MIN);
    const float64x2_t a1 = vmaxq_f64(lo, vmulq_f64(vabsq_f64(gd), k1));
    const float64x2_t a2 = vmaxq_f64(lo, vmulq_f64(vabsq_f64(ud), k2));
    const float64x2_t z = vmaxq_f64(vdupq_n_f64(-KERN_EXP_MAX), vminq_f64(vdupq_n_f64(KERN_EXP_MAX), vnegq_f64(gd)));
    float64x2_t p1, p2, pe;
    const float64x2_t s1 = exp_parts_n(a1, &p1), s2 = exp_parts_n(a2, &p2), se = exp_parts_n(z, &pe);
    const float64x2_t m1 = vfmaq_f64(vsubq_f64(s1, one), s1, p1), m2 = vfmaq_f64(vsubq_f64(s2, one), s2, p2);
    const float64x2_t e = vfmaq_f64(se, se, pe);
    const float64x2_t num = vmulq_f64(vmulq_f64(m1, m2), b12);
    const float64x2_t den = vmulq_f64(vmulq_f64(vaddq_f64(two, m1), vaddq_f64(two, m2)), vaddq_f64(one, e));
    return vabsq_f64(vdivq_f64(num, den));
}

static void situ_neon(float *g, const float *u, int64_t n, float b1, float b2) {
    const float64x2_t k1 = vdupq_n_f64(-2.0 / (double)b1), k2 = vdupq_n_f64(-2.0 / (double)b2);
    const float64x2_t b12 = vdupq_n_f64((double)b1 * (double)b2);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t gf = vld1q_f32(g + i), uf = vld1q_f32(u + i);
        const float64x2_t rlo = situ2(vcvt_f64_f32(vget_low_f32(gf)), vcvt_f64_f32(vget_low_f32(uf)), k1, k2, b12);
        const float64x2_t rhi = situ2(vcvt_high_f64_f32(gf), vcvt_high_f64_f32(uf), k1, k2, b12);
        const float32x4_t r = vcvt_high_f32_f64(vcvt_f32_f64(rlo), rhi);
        const uint32x4_t sgn = vandq_u32(veorq_u32(vreinterpretq_u32_f32(gf), vreinterpretq_u32_f32(uf)),
                                         vdupq_n_u32(0x80000000u));
        vst1q_f32(g + i, vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(r), sgn)));
    }
    kern_ref_situ(g + i, u + i, n - i, b1, b2);
}

static void exp_f64_neon(double *y, const double *x, int64_t n) {
    const float64x2_t hi = vdupq_n_f64(KERN_EXP_MAX), lo = vdupq_n_f64(-KERN_EXP_MAX);
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        float64x2_t p;
        const float64x2_t s = exp_parts_n(vmaxq_f64(lo, vminq_f64(hi, vld1q_f64(x + i))), &p);
        vst1q_f64(y + i, vfmaq_f64(s, s, p));
    }
    kern_ref_exp_f64(y + i, x + i, n - i);
}

/* KDA delta rule on NB blocks of 4 columns from j: kern_ref_kda_cols's operations
 * per column (f32 scale, double products summed in row order, f32 update), 2 NB
 * double accumulator chains in flight. */
INL void kda_blkn(float *S, int64_t D, const float *k, const float *v, const float *q,
                  const float *alpha, float beta, float *o, int64_t j, int NB) {
    float64x2_t u[8], od[8];
    float32x4_t w[4];
    UNROLL for (int b = 0; b < 2 * NB; b++) u[b] = od[b] = vdupq_n_f64(0.0);
    for (int64_t i = 0; i < D; i++) {
        const float32x4_t a = vdupq_n_f32(alpha[i]);
        const float64x2_t kd = vdupq_n_f64((double)k[i]);
        UNROLL for (int b = 0; b < NB; b++) {
            float *s = S + i * D + j + 4 * b;
            const float32x4_t sv = vmulq_f32(vld1q_f32(s), a);
            vst1q_f32(s, sv);
            u[2 * b] = vaddq_f64(u[2 * b], vmulq_f64(vcvt_f64_f32(vget_low_f32(sv)), kd));
            u[2 * b + 1] = vaddq_f64(u[2 * b + 1], vmulq_f64(vcvt_high_f64_f32(sv), kd));
        }
    }
    const float64x2_t bd = vdupq_n_f64((double)beta);
    UNROLL for (int b = 0; b < NB; b++) {
        const float32x4_t vv = vld1q_f32(v + j + 4 * b);
        const float32x2_t wlo = vcvt_f32_f64(vmulq_f64(bd, vsubq_f64(vcvt_f64_f32(vget_low_f32(vv)), u[2 * b])));
        w[b] = vcvt_high_f32_f64(wlo, vmulq_f64(bd, vsubq_f64(vcvt_high_f64_f32(vv), u[2 * b + 1])));
    }
    for (int64_t i = 0; i < D; i++) {
        const float32x4_t kf = vdupq_n_f32(k[i]);
        const float64x2_t qd = vdupq_n_f64((double)q[i]);
        UNROLL for (int b = 0; b < NB; b++) {
            float *s = S + i * D + j + 4 * b;
            const float32x4_t sv = vaddq_f32(vld1q_f32(s), vmulq_f32(kf, w[b]));
            vst1q_f32(s, sv);
            od[2 * b] = vaddq_f64(od[2 * b], vmulq_f64(vcvt_f64_f32(vget_low_f32(sv)), qd));
            od[2 * b + 1] = vaddq_f64(od[2 * b + 1], vmulq_f64(vcvt_high_f64_f32(sv), qd));
        }
    }
    UNROLL for (int b = 0; b < NB; b++) vst1q_f32(o + j + 4 * b, vcvt_high_f32_f64(vcvt_f32_f64(od[2 * b]), od[2 * b + 1]));
}

static void kda_step_neon(float *S, int64_t D, const float *k, const float *v, const float *q,
                          const float *alpha, float beta, float *o) {
    int64_t j = 0;
    for (; j + 16 <= D; j += 16) kda_blkn(S, D, k, v, q, alpha, beta, o, j, 4);
    for (; j + 4 <= D; j += 4) kda_blkn(S, D, k, v, q, alpha, beta, o, j, 1);
    kern_ref_kda_cols(S, D, k, v, q, alpha, beta, o, j, D);
}

/* vecmat: 16 columns per step (one v16), rows in order, vmulq then vaddq (two
 * roundings, as the reference: -ffp-contract=off keeps them apart). */
INL void vecmat_drv(float *y, const float *x, const void *W, int dt, int64_t ldw, int64_t n, int64_t m) {
    int64_t r = 0;
    for (; r + 16 <= m; r += 16) {
        float32x4_t a[4];
        UNROLL for (int c = 0; c < 4; c++) a[c] = vld1q_f32(y + r + 4 * c);
        for (int64_t i = 0; i < n; i++) {
            const float32x4_t xv = vdupq_n_f32(x[i]);
            const v16 w = wn(W, dt, i * ldw + r);
            UNROLL for (int c = 0; c < 4; c++) a[c] = vaddq_f32(a[c], vmulq_f32(xv, w.v[c]));
        }
        UNROLL for (int c = 0; c < 4; c++) vst1q_f32(y + r + 4 * c, a[c]);
    }
    kern_ref_vecmat_cols(y, x, W, dt, ldw, n, r, m);
}

static void vecmat_neon(float *y, const float *x, const void *W, int dt, int64_t ldw, int64_t n, int64_t m) {
    switch (dt) {
    case DT_F32: vecmat_drv(y, x, W, DT_F32, ldw, n, m); break;
    case DT_BF16: vecmat_drv(y, x, W, DT_BF16, ldw, n, m); break;
    default: vecmat_drv(y, x, W, DT_F16, ldw, n, m); break;
    }
}

const kern_table kern_neon_table = {
    .name = "neon", .matmul = matmul_neon, .matmul_mxfp4 = mxfp4_neon, .matmul_fp8 = fp8_neon, .matmul_int4 = int4_neon, .dot = dot_neon,
    .situ = situ_neon, .exp_f64 = exp_f64_neon, .kda_step = kda_step_neon, .vecmat = vecmat_neon,
};

#endif
