/*
 * kern_x86.h: what the x86 kernel files share (kern_x86.c: dense, MXFP4 and the
 * other ops; kern_x86q.c: FP8 and INT4): target attributes, the 16-lane blocks over
 * 16-bit / f32 rows with their panel state, the row/activation walks and their
 * reduction trees. Included only by those files, only on x86-64.
 */
#ifndef STRATA_KERN_X86_H
#define STRATA_KERN_X86_H

#include "kern.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "num.h"
#include "st.h"

#define INL static inline __attribute__((always_inline))
#define A512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define A256 __attribute__((target("avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 4")

/* Bytes ahead of the current chunk that decode prefetches each dense weight row:
 * 4 rows x 1 KB ahead keeps ~64 lines in flight per core.
 * MXFP4 rows are short (1.5-1.8 KB for expert matrices) and compute per byte is
 * 4x higher, so MXFP4 decode instead prefetches the next row block at the same
 * column (one prefetch per line): in an interleaved A/B over a 421 MB expert stack
 * (1 thread, loaded machine) best 12-13 GB/s vs 5-10 GB/s, mean 3.4-3.8 vs 2.1-2.2. */
#define PF_DIST 1024

/* Prefetch offset from row start for decode: PF_DIST bytes ahead in the row, and
 * past the row's end into the same row of the next block (rows of a block are
 * adjacent, so the plain offset would land on a row already streaming). A/B on a
 * 205 MB bf16 matrix with 7 KB rows, 1 thread, 5 interleaved runs: mean 6.6-11.4
 * GB/s vs 5.4-9.8 GB/s without the wrap (+12-20%). */
static inline size_t pf_off(int64_t k, size_t esz, int64_t cols, int RB, int64_t rs) {
    size_t o = (size_t)k * esz + PF_DIST, rbytes = (size_t)cols * esz;
    return o >= rbytes && rs == 1 ? o + (size_t)(RB - 1) * rbytes : o;
}

/* Rows ahead that MXFP4 decode prefetches in each of its quarter-range streams: at
 * least FP4_PF_MIN bytes. One row was best for 1.8 KB rows (2 or 4 rows: 1-6%
 * slower), but a 512-byte row (1024 columns, ladder's experts) left too little in
 * flight: 1024 x 1024 expert stack, 2 interleaved rounds, 1 KB minimum vs one row
 * 22.5-23.0 vs 21.6-21.7 GB/s on 1 thread, 33.5-33.9 vs 31.4-32.2 on 2; 4 KB was
 * slower than either. */
#define FP4_PF_MIN 1024
static inline int64_t fp4_pf_rows(int64_t row_bytes) {
    return row_bytes >= FP4_PF_MIN ? 1 : (FP4_PF_MIN + row_bytes - 1) / row_bytes;
}

/* ======================= AVX-512 ======================= */

/* 16 weights at element i of a row (masked: lanes beyond the tail read as 0). */
A512 INL __m512 w512(const void *W, int dt, int64_t i, __mmask16 m) {
    if (dt == DT_F32) return _mm512_maskz_loadu_ps(m, (const float *)W + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)W + i);
    if (dt == DT_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* kern.h's tree: lanes l + l+8, then l + l+4, then l + l+2, then 0 + 1. */
A512 INL float red512(__m512 a) {
    __m256 lo = _mm512_castps512_ps256(a);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 b = _mm256_add_ps(lo, hi);
    __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

/* Prefill panels: for T > 4 the activations of one call can exceed L2 (64 x 7168 x
 * 4 B = 1.8 MB, re-read for every 4 weight rows), so the driver walks PAN_T
 * activations x PAN_K columns at a time and keeps each (row, activation) 16-lane
 * accumulator in a stack state between column panels. Each lane still sees its
 * elements in order, so the bits do not change. Panels: X tile 64 x 1024 x 4 B =
 * 256 KB (L2), weight tile 4 x 1024 x 2 B = 8 KB (L1). */
#define PAN_T 64
#define PAN_K 1024

/* Accumulates rows r..r+RB-1 x activations t..t+TB-1 over columns [k0, k1).
 * st == NULL: start from zero, store the reduced dot products to Y.
 * st != NULL: continue from and save to the state st[(i * sts + j) * 16]. */
A512 INL void blk512(float *Y, int64_t ldy, const void *W, int dt, int64_t cols,
                     const float *X, int64_t ldx, int64_t r, int64_t rs, int64_t t, int RB, int TB,
                     int64_t k0, int64_t k1, float *st, int64_t sts) {
    const size_t esz = dt == DT_F32 ? 4 : 2;
    const char *wr[4];
    const float *xr[4];
    __m512 acc[4][4];
    UNROLL for (int i = 0; i < RB; i++) wr[i] = (const char *)W + (size_t)((r + i * rs) * cols) * esz;
    UNROLL for (int j = 0; j < TB; j++) xr[j] = X + (t + j) * ldx;
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        acc[i][j] = st ? _mm512_load_ps(st + (i * sts + j) * 16) : _mm512_setzero_ps();
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
        __m512 w[4];
        UNROLL for (int i = 0; i < RB; i++) {
            if (TB == 1) _mm_prefetch(wr[i] + pf_off(k, esz, cols, RB, rs), _MM_HINT_T0);
            w[i] = w512(wr[i], dt, k, 0xFFFF);
        }
        UNROLL for (int j = 0; j < TB; j++) {
            __m512 x = _mm512_loadu_ps(xr[j] + k);
            UNROLL for (int i = 0; i < RB; i++) acc[i][j] = _mm512_fmadd_ps(w[i], x, acc[i][j]);
        }
    }
    if (k < k1) { /* tail: masked loads give the contract's zero padding */
        __mmask16 m = (__mmask16)((1u << (k1 - k)) - 1);
        __m512 w[4];
        UNROLL for (int i = 0; i < RB; i++) w[i] = w512(wr[i], dt, k, m);
        UNROLL for (int j = 0; j < TB; j++) {
            __m512 x = _mm512_maskz_loadu_ps(m, xr[j] + k);
            UNROLL for (int i = 0; i < RB; i++) acc[i][j] = _mm512_fmadd_ps(w[i], x, acc[i][j]);
        }
    }
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++) {
        if (st) _mm512_store_ps(st + (i * sts + j) * 16, acc[i][j]);
        else Y[(t + j) * ldy + r + i * rs] = red512(acc[i][j]);
    }
}

/* The row/activation walk shared by the dense and MXFP4 drivers. BLK(RB, TB, k0, k1,
 * st, sts) runs one block at (r, t); PAN_K is the panel width in columns.
 * DECODE512: T <= 4, no state. PANELS512: the panels, with PREP(rbn, k0, k1) run
 * once per rbn-row x [k0, k1) weight tile before its activation blocks. */
#define NO_PREP(rbn, k0, k1) ((void)0)
#define DRIVER512(BLK) DECODE512(BLK) PANELS512(BLK, NO_PREP)
#define DECODE512(BLK)                                                                        \
    if (T <= 4) {                                                                             \
        int64_t rs = (r1 - r0) / 4, r = r0;                                                   \
        for (; r < r0 + rs; r++) {                                                            \
            int64_t t = 0;                                                                    \
            for (; t + 4 <= T; t += 4) BLK(4, 4, 0, cols, NULL, 0);                           \
            for (; t < T; t++) BLK(4, 1, 0, cols, NULL, 0);                                   \
        }                                                                                     \
        r = r0 + 4 * rs;                                                                      \
        rs = 1;                                                                               \
        for (; r < r1; r++) {                                                                 \
            int64_t t = 0;                                                                    \
            for (; t + 4 <= T; t += 4) BLK(1, 4, 0, cols, NULL, 0);                           \
            for (; t < T; t++) BLK(1, 1, 0, cols, NULL, 0);                                   \
        }                                                                                     \
        return;                                                                               \
    }
/* The T x rows walk in PAN_T x PAN_K panels of N-row tiles (N = 4 on AVX-512, 2
 * on AVX2), the state reduced into Y by RED once per panel column. */
#define PANELS_(BLK, PREP, N, ALIGN, RED)                                                     \
    float st_[N * PAN_T * 16] __attribute__((aligned(ALIGN)));                                \
    const int64_t rs = 1;                                                                     \
    (void)rs;                                                                                 \
    for (int64_t ts = 0; ts < T; ts += PAN_T) {                                               \
        int64_t tn = T - ts < PAN_T ? T - ts : PAN_T;                                         \
        for (int64_t r = r0; r < r1;) {                                                       \
            int rbn = r + N <= r1 ? N : 1;                                                    \
            for (int i = 0; i < rbn; i++) /* +0 start, as the unpanelled path */              \
                memset(st_ + i * PAN_T * 16, 0, (size_t)tn * 16 * sizeof(float));             \
            for (int64_t k0 = 0; k0 < cols; k0 += PAN_K) {                                    \
                int64_t k1 = cols - k0 < PAN_K ? cols : k0 + PAN_K;                           \
                PREP(rbn, k0, k1);                                                            \
                for (int64_t t = ts; t < ts + tn;) {                                          \
                    float *s_ = st_ + (t - ts) * 16;                                          \
                    if (t + N <= ts + tn) {                                                   \
                        if (rbn == N) BLK(N, N, k0, k1, s_, PAN_T);                           \
                        else BLK(1, N, k0, k1, s_, PAN_T);                                    \
                        t += N;                                                               \
                    } else {                                                                  \
                        if (rbn == N) BLK(N, 1, k0, k1, s_, PAN_T);                           \
                        else BLK(1, 1, k0, k1, s_, PAN_T);                                    \
                        t += 1;                                                               \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            for (int i = 0; i < rbn; i++)                                                     \
                for (int64_t j = 0; j < tn; j++)                                              \
                    Y[(ts + j) * ldy + r + i] = RED(st_ + (i * PAN_T + j) * 16);              \
            r += rbn;                                                                         \
        }                                                                                     \
    }
#define RED512_AT(q) red512(_mm512_load_ps(q))
#define PANELS512(BLK, PREP) PANELS_(BLK, PREP, 4, 64, RED512_AT)

/* Prefill with T >= WIDE_MIN_T over 16-bit or MXFP4 weights: PANELS512, whose PREP
 * widens each 4-row x PAN_K weight tile to f32 once into a 16 KB stack tile that
 * every activation block of the panel then reads. DRIVER512 widened or
 * decoded the tile again for every block of 4 activations (16 times at T = 64).
 * The f32 values are the ones the blocks multiplied with (exact widening, the
 * MXFP4 LUT), and each lane still sees its elements in order (fp4blk512's lane
 * relabelling is undone before its state), so the bits do not change. Intel
 * Xeon VM, b_kern, 3 interleaved rounds: in-cache (64 x 3584, 1 thread, CPU time)
 * T = 64 bf16 59.3-62.7 vs 53.7-54.2 G products/s, MXFP4 61.7-64.6 vs
 * 46.8-47.5; from DRAM with 2 threads MXFP4 T = 64 198-199 vs 165-166 GFLOP/s.
 * At T = 8 the extra store and load of the tile cost more than they saved (bf16
 * from DRAM: 83-92 vs 108-133 GFLOP/s), hence the threshold. */
/* MXFP4 / INT4 index builder (kern_x86.c, before fp4blk512): 8 code bytes
 * broadcast, dword 2i and 2i + 1 shifted right by 4i (sh), leave element i's code
 * in dword 2i and element 8 + i's in dword 2i + 1 (vpermps reads the low 4 bits). */
A512 INL __m512i idx_s(const uint8_t *p, __m512i sh) {
    uint64_t q;
    memcpy(&q, p, 8);
    return _mm512_srlv_epi32(_mm512_set1_epi64((long long)q), sh);
}

/* One 32-column group of a 4-bit LUT decode (fp4dec512, int4dec512): each row's
 * 16 code bytes index its 16-entry table lut[i] (the group's values, lane c for
 * code c), against x already permuted by fwd. */
A512 INL void lutdec512_group(__m512 acc[4], const uint8_t *const pr[4], const __m512 lut[4], const float *xp,
                              int64_t g, __m512i sh, int RB) {
    UNROLL for (int h = 0; h < 2; h++) {
        const __m512 x = _mm512_load_ps(xp + g * 32 + h * 16);
        UNROLL for (int i = 0; i < RB; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx_s(pr[i] + g * 16 + h * 8, sh), lut[i]), x, acc[i]);
    }
}

/* The decoders' walk over the ng groups, unrolled by 4 with one prefetch per row
 * and iteration pf bytes ahead, then each row's sum into Y (lanes back by inv).
 * LUT(i, g) is row i's table for group g; the caller declares pr, acc, xp, sh,
 * inv, ng, pf, RB, r, rs and Y. */
#define LUTDEC512_WALK(LUT)                                                                                 \
    do {                                                                                                    \
        int64_t g_ = 0;                                                                                     \
        for (; g_ + 4 <= ng; g_ += 4) {                                                                     \
            UNROLL for (int i = 0; i < RB; i++) _mm_prefetch((const char *)pr[i] + pf + g_ * 16, _MM_HINT_T0); \
            UNROLL for (int u_ = 0; u_ < 4; u_++) {                                                         \
                __m512 lut_[4];                                                                             \
                UNROLL for (int i = 0; i < RB; i++) lut_[i] = LUT(i, g_ + u_);                              \
                lutdec512_group(acc, pr, lut_, xp, g_ + u_, sh, RB);                                        \
            }                                                                                               \
        }                                                                                                   \
        for (; g_ < ng; g_++) {                                                                             \
            __m512 lut_[4];                                                                                 \
            UNROLL for (int i = 0; i < RB; i++) lut_[i] = LUT(i, g_);                                       \
            lutdec512_group(acc, pr, lut_, xp, g_, sh, RB);                                                 \
        }                                                                                                   \
        UNROLL for (int i = 0; i < RB; i++) Y[r + i * rs] = red512(_mm512_permutexvar_ps(inv, acc[i]));     \
    } while (0)

#ifndef WIDE_MIN_T
#define WIDE_MIN_T 16
#endif

/* ======================= AVX2 ======================= */

typedef struct { __m256 a, b; } v16; /* lanes 0-7, 8-15 */

/* 16 weights at element i of a full chunk. */
A256 INL v16 w256(const void *W, int dt, int64_t i) {
    v16 v;
    if (dt == DT_F32) {
        v.a = _mm256_loadu_ps((const float *)W + i);
        v.b = _mm256_loadu_ps((const float *)W + i + 8);
        return v;
    }
    __m128i h0 = _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)W + i));
    __m128i h1 = _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)W + i + 8));
    if (dt == DT_BF16) {
        v.a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16));
        v.b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16));
    } else {
        v.a = _mm256_cvtph_ps(h0);
        v.b = _mm256_cvtph_ps(h1);
    }
    return v;
}

/* Tail chunk (n < 16 elements left): widened through a zeroed stack buffer. */
A256 INL v16 w256_tail(const void *W, int dt, int64_t i, int64_t n) {
    float buf[16] = {0};
    if (dt == DT_F32) memcpy(buf, (const float *)W + i, (size_t)n * 4);
    else {
        uint16_t h[16] = {0};
        memcpy(h, (const uint16_t *)W + i, (size_t)n * 2);
        return w256(h, dt, 0);
    }
    return w256(buf, DT_F32, 0);
}

A256 INL float red256(__m256 a, __m256 b) {
    __m256 s = _mm256_add_ps(a, b);
    __m128 c = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 d = _mm_add_ps(c, _mm_movehl_ps(c, c));
    return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

/* The AVX2 blocks' state convention (blk512's): accumulators start from the
 * panel state st (sts apart per row) or zero, and end there or reduced into Y. */
A256 INL void acc256_start(__m256 acc[4][4][2], const float *st, int64_t sts, int RB, int TB) {
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++) {
        acc[i][j][0] = st ? _mm256_load_ps(st + (i * sts + j) * 16) : _mm256_setzero_ps();
        acc[i][j][1] = st ? _mm256_load_ps(st + (i * sts + j) * 16 + 8) : _mm256_setzero_ps();
    }
}

A256 INL void acc256_end(__m256 acc[4][4][2], float *Y, int64_t ldy, int64_t r, int64_t rs, int64_t t, float *st,
                         int64_t sts, int RB, int TB) {
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++) {
        if (st) {
            _mm256_store_ps(st + (i * sts + j) * 16, acc[i][j][0]);
            _mm256_store_ps(st + (i * sts + j) * 16 + 8, acc[i][j][1]);
        } else {
            Y[(t + j) * ldy + r + i * rs] = red256(acc[i][j][0], acc[i][j][1]);
        }
    }
}

/* RB x TB block over columns [k0, k1) with blk512's state convention; 16 ymm
 * registers allow 4x1 and 2x2 (8 accumulators). */
A256 INL void blk256(float *Y, int64_t ldy, const void *W, int dt, int64_t cols,
                     const float *X, int64_t ldx, int64_t r, int64_t rs, int64_t t, int RB, int TB,
                     int64_t k0, int64_t k1, float *st, int64_t sts) {
    const size_t esz = dt == DT_F32 ? 4 : 2;
    const char *wr[4];
    const float *xr[4];
    __m256 acc[4][4][2];
    UNROLL for (int i = 0; i < RB; i++) wr[i] = (const char *)W + (size_t)((r + i * rs) * cols) * esz;
    UNROLL for (int j = 0; j < TB; j++) xr[j] = X + (t + j) * ldx;
    acc256_start(acc, st, sts, RB, TB);
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) {
        v16 w[4];
        UNROLL for (int i = 0; i < RB; i++) {
            if (TB == 1) _mm_prefetch(wr[i] + pf_off(k, esz, cols, RB, rs), _MM_HINT_T0);
            w[i] = w256(wr[i], dt, k);
        }
        UNROLL for (int j = 0; j < TB; j++) {
            __m256 xa = _mm256_loadu_ps(xr[j] + k), xb = _mm256_loadu_ps(xr[j] + k + 8);
            UNROLL for (int i = 0; i < RB; i++) {
                acc[i][j][0] = _mm256_fmadd_ps(w[i].a, xa, acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(w[i].b, xb, acc[i][j][1]);
            }
        }
    }
    if (k < k1) {
        v16 w[4];
        UNROLL for (int i = 0; i < RB; i++) w[i] = w256_tail(wr[i], dt, k, k1 - k);
        UNROLL for (int j = 0; j < TB; j++) {
            v16 x = w256_tail(xr[j], DT_F32, k, k1 - k);
            UNROLL for (int i = 0; i < RB; i++) {
                acc[i][j][0] = _mm256_fmadd_ps(w[i].a, x.a, acc[i][j][0]);
                acc[i][j][1] = _mm256_fmadd_ps(w[i].b, x.b, acc[i][j][1]);
            }
        }
    }
    acc256_end(acc, Y, ldy, r, rs, t, st, sts, RB, TB);
}

/* The AVX2 decoders' column orders. A decoder that produces a 16-column chunk's
 * weights in another lane order than the contract's permutes x the same way
 * (x permuted once per call, or per chunk for all rows of a block) and its
 * accumulators back before the contract's tree, so every lane still sees its
 * columns in order. XO_EO (FP8, INT4: kern_x86q.c): the even columns {0, 2, ..
 * 14}, then the odd ones. XO_Q (MXFP4: kern_x86.c fp4_group256): {0, 4, 8, 12,
 * 1, 5, 9, 13}, then {2, 6, 10, 14, 3, 7, 11, 15}. */
enum { XO_EO, XO_Q };

/* x[0..15] in XO_EO order: {0-3 | 8-11} and {4-7 | 12-15} shuffled by their even
 * and odd elements. */
A256 INL void xeo256(const float *x, __m256 *e, __m256 *o) {
    const __m256 a = _mm256_loadu2_m128(x + 8, x), b = _mm256_loadu2_m128(x + 12, x + 4);
    *e = _mm256_shuffle_ps(a, b, 0x88);
    *o = _mm256_shuffle_ps(a, b, 0xDD);
}

/* x[0..15] in XO_Q order: the same halves interleaved ({0, 4, 1, 5 | 8, 12, 9,
 * 13} and {2, 6, 3, 7 | 10, 14, 11, 15}), then their 64-bit pairs 1 and 2
 * swapped. */
A256 INL void xq256(const float *x, __m256 *a, __m256 *b) {
    const __m256 p = _mm256_loadu2_m128(x + 8, x), q = _mm256_loadu2_m128(x + 12, x + 4);
    *a = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_unpacklo_ps(p, q)), 0xD8));
    *b = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_unpackhi_ps(p, q)), 0xD8));
}

A256 INL void xperm256(const float *x, int ord, __m256 *a, __m256 *b) {
    if (ord == XO_Q) xq256(x, a, b);
    else xeo256(x, a, b);
}

/* x in order ord for columns [k, k + 16): XP, from xp, where the caller stored
 * all of x's permuted once per call (cols <= XPRE_MAX); else permuted here, once
 * per 16 columns for all rows of the block. Once per call saves those ~4
 * shuffles per 16 columns and block (in-L2 decode of 64 rows x 2048, best of 6
 * interleaved runs: FP8 1.37 -> 1.25 ns per 16 weights, INT4 1.40 -> 1.22);
 * calls of under 16 rows permute in the loop, as the fill would not pay. */
#define XPRE_MAX 8192 /* widest decode row whose x is permuted once per call (32 KB of stack) */
A256 INL void xperm_at(const float *X, const float *xp, int64_t k, int XP, int ord, __m256 *a, __m256 *b) {
    if (XP) {
        *a = _mm256_load_ps(xp + k);
        *b = _mm256_load_ps(xp + k + 8);
    } else {
        xperm256(X + k, ord, a, b);
    }
}

/* xp = x in order ord for the n - n % 16 columns. */
A256 INL void xperm_fill(float *xp, const float *X, int64_t n, int ord) {
    for (int64_t k = 0; k + 16 <= n; k += 16) {
        __m256 a, b;
        xperm256(X + k, ord, &a, &b);
        _mm256_store_ps(xp + k, a);
        _mm256_store_ps(xp + k + 8, b);
    }
}

/* The lane sum of XO_EO accumulators: interleaved back to lanes 0-7, 8-15. */
A256 INL float red_eo256(__m256 e, __m256 o) {
    const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
    return red256(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* The lane sum of XO_Q accumulators: interleaved ({0, 2, 4, 6 | 1, 3, 5, 7} and
 * {8, 10, 12, 14 | 9, 11, 13, 15}), then each in lane order by one vpermps. */
A256 INL float red_q256(__m256 a, __m256 b) {
    const __m256i ix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    return red256(_mm256_permutevar8x32_ps(_mm256_unpacklo_ps(a, b), ix),
                  _mm256_permutevar8x32_ps(_mm256_unpackhi_ps(a, b), ix));
}

/* DRIVER512's walk with AVX2 block shapes: decode 4x1, otherwise 2x2 blocks in
 * PAN_T x PAN_K panels (PANELS256's PREP as PANELS512's, per 2-row tile). */
#define DRIVER256(BLK) DECODE256(BLK) PANELS256(BLK, NO_PREP)
#define DECODE256(BLK)                                                                        \
    if (T == 1) {                                                                             \
        int64_t rs = (r1 - r0) / 4, r = r0;                                                   \
        const int64_t t = 0;                                                                  \
        for (; r < r0 + rs; r++) BLK(4, 1, 0, cols, NULL, 0);                                 \
        r = r0 + 4 * rs;                                                                      \
        rs = 1;                                                                               \
        for (; r < r1; r++) BLK(1, 1, 0, cols, NULL, 0);                                      \
        return;                                                                               \
    }
#define RED256_AT(q) red256(_mm256_load_ps(q), _mm256_load_ps((q) + 8))
#define PANELS256(BLK, PREP) PANELS_(BLK, PREP, 2, 32, RED256_AT)

/* FP8 and INT4 (kern_x86q.c). */
A256 void kern_x86_fp8_avx2(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols, const float *X,
                            int64_t ldx, int64_t T, int64_t r0, int64_t r1);
A256 void kern_x86_int4_avx2(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols,
                             const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);
A512 void kern_x86_fp8_avx512(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols, const float *X,
                              int64_t ldx, int64_t T, int64_t r0, int64_t r1);
A512 void kern_x86_int4_avx512(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols,
                               const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);

#endif
