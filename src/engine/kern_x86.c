/*
 * kern_x86.c: AVX2+FMA and AVX-512 fast paths. Same contract as kern_ref.c (16
 * lanes, element i -> lane i % 16 by a fused multiply-add, zero-padded tail, fixed
 * tree), so the outputs are bit-identical to the scalar reference:
 *   AVX-512: one zmm holds lanes 0-15;  AVX2: two ymm hold lanes 0-7 and 8-15.
 * Functions carry target attributes and are picked at run time (kern.c), so the
 * default build needs no -m flags.
 *
 * Blocking: a block is RB weight rows x TB activation rows with RB*TB accumulators.
 * Decode (T = 1) uses 4 rows x 1: four weight streams plus software prefetch reach
 * 94-98% of the measured read bandwidth for bf16 on the dev VM (best runs of
 * `make bench-kernels`). The four rows of a decode block are a quarter of the row
 * range apart (r, r+q, r+2q, r+3q), so each stream is one long sequential run
 * instead of 4 adjacent short rows: with 1-2 KB rows (hidden 512-1024, expert
 * rows) the hardware prefetcher kept restarting, and 200 bf16 matrices of 2 MB ran
 * at 9 GB/s on 1 thread (1024 cols) vs 17 GB/s strided; 7168-col rows 17 -> 20. Prefill uses 4 x 4 (AVX-512) or 2 x 2 (AVX2): every
 * decoded weight chunk feeds several activations and every activation chunk
 * several rows; for larger T the walk is in panels (PAN_T x PAN_K below) so the
 * activations stay in L2. 8-row decode blocks were tried and measured no faster
 * (in-L2 MXFP4 ~33 G weights/s per core either way), so the shapes stay small.
 * In-L2 compute per core (Zen 5 VM, CPU time): bf16 T=1 ~32, T=8 ~70 G weight x
 * activation products/s; MXFP4 T=1 ~24 (F decoder) / ~29 (VBMI decoder), T=8 ~55.
 * Those decoders are gone: the shift decoder (below) measured MXFP4 T=1 25 vs 20
 * (VBMI) in one later run on a loaded machine.
 */
#include "kern.h"

#if defined(__x86_64__)
#include "kern_x86.h"

/* Widens columns [k0, k0 + kn) of row r to f32 at dst: 16-bit floats (P == NULL:
 * W, dt) or MXFP4 (P, S: each group's 32 codes through its LUT row, the values
 * fp4blk512 multiplies with). */
A512 INL void widen_row512(float *dst, const void *W, int dt, const uint8_t *P, const uint8_t *S, int64_t cols,
                           int64_t r, int64_t k0, int64_t kn) {
    if (!P) {
        const uint16_t *src = (const uint16_t *)W + r * cols + k0;
        for (int64_t c = 0; c < kn; c += 16) {
            const __mmask16 m = kn - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (kn - c)) - 1);
            _mm512_store_ps(dst + c, w512(src, dt, c, m));
        }
        return;
    }
    const __m512i ev = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i od = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    const __m512i lo4 = _mm512_set1_epi32(0xF);
    const int64_t ng = cols / KERN_MXFP4_GROUP;
    for (int64_t c = 0; c < kn; c += KERN_MXFP4_GROUP) {
        const int64_t g = (k0 + c) / KERN_MXFP4_GROUP;
        const __m512 lut = _mm512_load_ps(kern_fp4_lut[S[r * ng + g]]);
        /* byte j holds element 2j (low nibble) and 2j + 1 (high) */
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(P + r * (cols / 2) + g * 16)));
        const __m512 wl = _mm512_permutexvar_ps(_mm512_and_si512(b, lo4), lut);
        const __m512 wh = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), lut);
        _mm512_store_ps(dst + c, _mm512_permutex2var_ps(wl, ev, wh));
        _mm512_store_ps(dst + c + 16, _mm512_permutex2var_ps(wl, od, wh));
    }
}

A512 static void drv512_wide(float *Y, int64_t ldy, const void *W, int dt, const uint8_t *P, const uint8_t *S,
                             int64_t cols, const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    float wt[4 * PAN_K] __attribute__((aligned(64)));
#define PREP_W(rbn, k0, k1) for (int i_ = 0; i_ < (rbn); i_++) widen_row512(wt + i_ * PAN_K, W, dt, P, S, cols, r + i_, k0, (k1) - (k0))
#define BLK_W(RB, TB, k0, k1, st, sts) blk512(NULL, 0, wt, DT_F32, PAN_K, X + (k0), ldx, 0, 1, t, RB, TB, 0, (k1) - (k0), st, sts)
    PANELS512(BLK_W, PREP_W)
#undef BLK_W
#undef PREP_W
}

A512 INL void drv512(float *Y, int64_t ldy, const void *W, int dt, int64_t cols,
                     const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    if (T >= WIDE_MIN_T && dt != DT_F32) { drv512_wide(Y, ldy, W, dt, NULL, NULL, cols, X, ldx, T, r0, r1); return; }
#define BLK_D(RB, TB, k0, k1, st, sts) blk512(Y, ldy, W, dt, cols, X, ldx, r, rs, t, RB, TB, k0, k1, st, sts)
    DRIVER512(BLK_D)
#undef BLK_D
}

A512 static void matmul_avx512(float *Y, int64_t ldy, const void *W, int dt, int64_t cols,
                               const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    switch (dt) {
    case DT_F32: drv512(Y, ldy, W, DT_F32, cols, X, ldx, T, r0, r1); break;
    case DT_BF16: drv512(Y, ldy, W, DT_BF16, cols, X, ldx, T, r0, r1); break;
    case DT_F16: drv512(Y, ldy, W, DT_F16, cols, X, ldx, T, r0, r1); break;
    default: ST_ASSERT(!"matmul: dtype must be F32, BF16 or F16");
    }
}

A512 static float dot_avx512(const float *a, const float *b, int64_t n) {
    float y;
    blk512(&y, 1, a, DT_F32, n, b, n, 0, 1, 0, 1, 1, 0, n, NULL, 0);
    return y;
}

/* MXFP4: per 32-group and row, the 16-entry LUT k_e2m1[c] * 2^(s-127) is one
 * 64-byte load from kern_fp4_lut (the same products, folded at compile time);
 * 16 codes then decode with one vpermps (index = low 4 bits of each dword).
 * The load replaced a vmulps per row and group: 3 instead of 3.25 vector-ALU
 * ops per 16 weights, on the two ports Intel runs 512-bit ops on; Xeon (this
 * dev VM, 2026-12-05), same run: in-L2 T = 1 27.6 vs 26.0 G weights/s per
 * core, from DRAM with 2 threads 74-75% vs 71-72% of read bandwidth.
 * Index builder: vpbroadcastq of 8 code bytes (a load-port op) puts bytes 0-3 in
 * every even dword and bytes 4-7 in every odd one; vpsrlvd by 4i in dwords 2i and
 * 2i+1 leaves code i in dword 2i and code 8+i in dword 2i+1. So SIMD lane 2i
 * carries contract lane i and lane 2i+1 contract lane 8+i: a fixed relabelling of
 * the 16 chains, each still fed its elements in order, so the bits are the
 * contract's. x is loaded through the same permutation (one vpermps per 16
 * columns, shared by the block's rows) and accumulators return to contract order
 * before the reduction tree or the panel state. Shuffle-port ops per 16 weights
 * and row: 1 + 1/RB, where the previous decoders (zero-extend + shift + or, or the
 * VBMI vpmultishiftqb) needed 2: in-L2 T = 1 MXFP4 25 vs 20 G weights/s per core
 * (`make bench-kernels`, same run), so the VBMI table now shares this path.
 * idx_s (kern_x86.h) is that index builder. */

/* Block over groups [k0/32, k1/32) with the same state convention as blk512. */
A512 INL void fp4blk512(float *Y, int64_t ldy, const uint8_t *P, const uint8_t *S, int64_t cols,
                        const float *X, int64_t ldx, int64_t r, int64_t rs, int64_t t, int RB, int TB,
                        int64_t k0, int64_t k1, float *st, int64_t sts) {
    const __m512i sh = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
    const __m512i fwd = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
    const __m512i inv = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    const int64_t ng = cols / KERN_MXFP4_GROUP, rb = cols / 2;
    const uint8_t *pr[4], *sr[4];
    const float *xr[4];
    __m512 acc[4][4];
    UNROLL for (int i = 0; i < RB; i++) { pr[i] = P + (r + i * rs) * rb; sr[i] = S + (r + i * rs) * ng; }
    UNROLL for (int j = 0; j < TB; j++) xr[j] = X + (t + j) * ldx;
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++)
        acc[i][j] = st ? _mm512_permutexvar_ps(fwd, _mm512_load_ps(st + (i * sts + j) * 16)) : _mm512_setzero_ps();
    for (int64_t g = k0 / KERN_MXFP4_GROUP; g < k1 / KERN_MXFP4_GROUP; g++) {
        __m512 lut[4];
        UNROLL for (int i = 0; i < RB; i++) {
            if (TB == 1 && (g & 3) == 0) /* the stream's next row, once per line */
                _mm_prefetch((const char *)pr[i] + (rs == 1 ? RB : 1) * rb + g * 16, _MM_HINT_T0);
            lut[i] = _mm512_load_ps(kern_fp4_lut[sr[i][g]]);
        }
        UNROLL for (int h = 0; h < 2; h++) {
            __m512 w[4];
            UNROLL for (int i = 0; i < RB; i++) w[i] = _mm512_permutexvar_ps(idx_s(pr[i] + g * 16 + h * 8, sh), lut[i]);
            UNROLL for (int j = 0; j < TB; j++) {
                __m512 x = _mm512_permutexvar_ps(fwd, _mm512_loadu_ps(xr[j] + g * 32 + h * 16));
                UNROLL for (int i = 0; i < RB; i++) acc[i][j] = _mm512_fmadd_ps(w[i], x, acc[i][j]);
            }
        }
    }
    UNROLL for (int i = 0; i < RB; i++) UNROLL for (int j = 0; j < TB; j++) {
        __m512 a = _mm512_permutexvar_ps(inv, acc[i][j]);
        if (st) _mm512_store_ps(st + (i * sts + j) * 16, a);
        else Y[(t + j) * ldy + r + i * rs] = red512(a);
    }
}

/* Decode (T = 1) block: RB rows rs apart against x already permuted by fwd, the
 * loop unrolled by 4 groups (64 code bytes per row: one prefetch per row and
 * iteration, pf bytes ahead) and no state, so every pointer stays in a register.
 * Same lanes and order as fp4blk512. fp4blk512 for T = 1 spilled row pointers,
 * moved them through xmm registers and tested the prefetch condition every
 * group; this shape, with x permuted once per call (below), measured in-L2
 * 50 vs 44-46 G weights/s per core (CPU time, best of 15, same shapes as
 * b_kern's experts) and from DRAM 24 vs 21 GB/s on 1 thread, 46-47 vs 34-40 GB/s
 * on 2 (72% of the old single-stream probe; 60% of bench/bw.h's 4-stream probe,
 * which reads 70-80 GB/s here). 6 and 8 rows per block measured no faster (39
 * and 48 G weights/s). */
#define FP4_XPRE_MAX 8192 /* widest decode row whose x is permuted once per call (32 KB of stack) */
A512 INL void fp4dec512(float *Y, const uint8_t *P, const uint8_t *S, int64_t cols, const float *xp, int64_t r,
                        int64_t rs, int RB, int64_t pf) {
    const __m512i sh = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
    const __m512i inv = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    const int64_t ng = cols / KERN_MXFP4_GROUP, rb = cols / 2;
    const uint8_t *pr[4], *sr[4];
    __m512 acc[4];
    UNROLL for (int i = 0; i < RB; i++) {
        pr[i] = P + (r + i * rs) * rb;
        sr[i] = S + (r + i * rs) * ng;
        acc[i] = _mm512_setzero_ps();
    }
#define FP4_LUT(i, g) _mm512_load_ps(kern_fp4_lut[sr[i][g]])
    LUTDEC512_WALK(FP4_LUT);
#undef FP4_LUT
}

A512 static void mxfp4_avx512(float *Y, int64_t ldy, const uint8_t *P, const uint8_t *S,
                              int64_t cols, const float *X, int64_t ldx, int64_t T, int64_t r0,
                              int64_t r1) {
    ST_ASSERT(cols % KERN_MXFP4_GROUP == 0);
    if (T == 1 && cols <= FP4_XPRE_MAX) {
        /* decode: x permuted once per call instead of once per 16 columns and
         * row block (the same values in the same lanes, so the same bits) */
        float xp[FP4_XPRE_MAX] __attribute__((aligned(64)));
        const __m512i fwd = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
        for (int64_t k = 0; k < cols; k += 16) _mm512_store_ps(xp + k, _mm512_permutexvar_ps(fwd, _mm512_loadu_ps(X + k)));
        const int64_t rs = (r1 - r0) / 4, rb = cols / 2, pf = fp4_pf_rows(rb) * rb;
        int64_t r = r0;
        for (; r < r0 + rs; r++) fp4dec512(Y, P, S, cols, xp, r, rs, 4, pf); /* each stream, rows ahead */
        for (r = r0 + 4 * rs; r < r1; r++) fp4dec512(Y, P, S, cols, xp, r, 1, 1, rb);
        return;
    }
    if (T >= WIDE_MIN_T) { drv512_wide(Y, ldy, NULL, DT_F32, P, S, cols, X, ldx, T, r0, r1); return; }
#define BLK_F(RB, TB, k0, k1, st, sts) fp4blk512(Y, ldy, P, S, cols, X, ldx, r, rs, t, RB, TB, k0, k1, st, sts)
    DRIVER512(BLK_F)
#undef BLK_F
}

/* SiTU, 8 elements per step: kern_ref_situ's sequence op for op on doubles
 * (mul then add where it has two roundings, fma where it has one); 2^k from the
 * shifter's low bits: bits(t) = bits(2^52 + 2^51) + k, so ((bits(t) + 1023) << 52)
 * is 2^k. The tail runs the reference. */
A512 INL __m512d exp_parts512(__m512d z, __m512d *p) {
    const __m512d sh = _mm512_set1_pd(KERN_SHIFTER);
    __m512d t = _mm512_add_pd(_mm512_mul_pd(z, _mm512_set1_pd(KERN_INV_LN2)), sh), kd = _mm512_sub_pd(t, sh);
    __m512d r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(KERN_LN2_HI), z);
    r = _mm512_fnmadd_pd(kd, _mm512_set1_pd(KERN_LN2_LO), r);
    __m512d q = _mm512_set1_pd(KERN_EXPM1_C13);
#define HORNER(c) q = _mm512_fmadd_pd(q, r, _mm512_set1_pd(c));
    KERN_EXPM1_TAYLOR(HORNER)
#undef HORNER
    *p = _mm512_fmadd_pd(q, _mm512_mul_pd(r, r), r);
    __m512i b = _mm512_slli_epi64(_mm512_add_epi64(_mm512_castpd_si512(t), _mm512_set1_epi64(1023)), 52);
    return _mm512_castsi512_pd(b);
}

A512 static void situ_avx512(float *g, const float *u, int64_t n, float b1, float b2) {
    const __m512d k1 = _mm512_set1_pd(-2.0 / (double)b1), k2 = _mm512_set1_pd(-2.0 / (double)b2);
    const __m512d b12 = _mm512_set1_pd((double)b1 * (double)b2), one = _mm512_set1_pd(1.0), two = _mm512_set1_pd(2.0);
    const __m512d lo = _mm512_set1_pd(KERN_EXPM1_MIN), zhi = _mm512_set1_pd(KERN_EXP_MAX), zlo = _mm512_set1_pd(-KERN_EXP_MAX);
    const __m512i abs = _mm512_set1_epi64(0x7FFFFFFFFFFFFFFFll);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gf = _mm256_loadu_ps(g + i), uf = _mm256_loadu_ps(u + i);
        const __m512d gd = _mm512_cvtps_pd(gf), ud = _mm512_cvtps_pd(uf);
        /* max(lo, x) and min(hi, x) return x when x is NaN, as the reference's compares */
        __m512d a1 = _mm512_mul_pd(_mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(gd), abs)), k1);
        __m512d a2 = _mm512_mul_pd(_mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(ud), abs)), k2);
        a1 = _mm512_max_pd(lo, a1);
        a2 = _mm512_max_pd(lo, a2);
        __m512d z = _mm512_sub_pd(_mm512_setzero_pd(), gd);
        z = _mm512_max_pd(zlo, _mm512_min_pd(zhi, z));
        __m512d p1, p2, pe;
        const __m512d s1 = exp_parts512(a1, &p1), s2 = exp_parts512(a2, &p2), se = exp_parts512(z, &pe);
        const __m512d m1 = _mm512_fmadd_pd(s1, p1, _mm512_sub_pd(s1, one));
        const __m512d m2 = _mm512_fmadd_pd(s2, p2, _mm512_sub_pd(s2, one));
        const __m512d e = _mm512_fmadd_pd(se, pe, se);
        const __m512d num = _mm512_mul_pd(_mm512_mul_pd(m1, m2), b12);
        const __m512d den = _mm512_mul_pd(_mm512_mul_pd(_mm512_add_pd(two, m1), _mm512_add_pd(two, m2)), _mm512_add_pd(one, e));
        const __m512d q = _mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(_mm512_div_pd(num, den)), abs));
        const __m256 r = _mm512_cvtpd_ps(q);
        const __m256 sgn = _mm256_and_ps(_mm256_xor_ps(gf, uf), _mm256_set1_ps(-0.0f));
        _mm256_storeu_ps(g + i, _mm256_xor_ps(r, sgn));
    }
    kern_ref_situ(g + i, u + i, n - i, b1, b2);
}

A512 static void exp_f64_avx512(double *y, const double *x, int64_t n) {
    const __m512d hi = _mm512_set1_pd(KERN_EXP_MAX), lo = _mm512_set1_pd(-KERN_EXP_MAX);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d z = _mm512_max_pd(lo, _mm512_min_pd(hi, _mm512_loadu_pd(x + i))), p;
        const __m512d s = exp_parts512(z, &p);
        _mm512_storeu_pd(y + i, _mm512_fmadd_pd(s, p, s));
    }
    kern_ref_exp_f64(y + i, x + i, n - i);
}

/* The state's first pass over a column block walks its rows D floats apart, a
 * line or two per row, which the hardware prefetchers followed poorly: each head's
 * state comes from DRAM every token (ladder: 1 MB per KDA layer). The pass
 * prefetches the block's row KDA_PF_ROWS ahead, wrapping into the next block's
 * first rows. Intel Xeon VM, one thread, 28 layers x 16 heads of 128 x 128 cold
 * states, 4 interleaved rounds: 6.1 ms per sweep without, 4.4 at 8 rows ahead,
 * 3.7 at 24-32 (the same states hot in L2: 1.85). */
#define KDA_PF_ROWS 32
static inline const float *kda_pf(const float *S, int64_t D, int64_t i, int64_t j, int64_t w) {
    const int64_t r = i + KDA_PF_ROWS;
    if (r < D) return S + r * D + j;
    return r - D < D ? S + (r - D) * D + j + w : S; /* j + w <= D: inside the state */
}

/* KDA delta rule on NB blocks of 16 columns from j: kern_ref_kda_cols's operations
 * per column, 2 NB double accumulator chains in flight (the row walk is a chain). */
A512 INL void kda_blk512(float *S, int64_t D, const float *k, const float *v, const float *q,
                         const float *alpha, float beta, float *o, int64_t j, int NB) {
    __m512d u[4], od[4];
    UNROLL for (int b = 0; b < 2 * NB; b++) u[b] = _mm512_setzero_pd();
    for (int64_t i = 0; i < D; i++) {
        const __m512 a = _mm512_set1_ps(alpha[i]);
        const __m512d kd = _mm512_set1_pd((double)k[i]);
        const float *pf = kda_pf(S, D, i, j, 16 * NB); /* a hint: never dereferenced */
        UNROLL for (int b = 0; b < NB; b++) _mm_prefetch((const char *)(pf + 16 * b), _MM_HINT_T0);
        UNROLL for (int b = 0; b < NB; b++) {
            float *s = S + i * D + j + 16 * b;
            const __m512 sv = _mm512_mul_ps(_mm512_loadu_ps(s), a);
            _mm512_storeu_ps(s, sv);
            const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(sv));
            const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sv), 1)));
            u[2 * b] = _mm512_add_pd(u[2 * b], _mm512_mul_pd(lo, kd));
            u[2 * b + 1] = _mm512_add_pd(u[2 * b + 1], _mm512_mul_pd(hi, kd));
        }
    }
    const __m512d bd = _mm512_set1_pd((double)beta);
    __m512 w[2];
    UNROLL for (int b = 0; b < NB; b++) {
        const __m256 wlo = _mm512_cvtpd_ps(_mm512_mul_pd(bd, _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(v + j + 16 * b)), u[2 * b])));
        const __m256 whi = _mm512_cvtpd_ps(_mm512_mul_pd(bd, _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(v + j + 16 * b + 8)), u[2 * b + 1])));
        w[b] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(wlo)), _mm256_castps_pd(whi), 1));
        od[2 * b] = od[2 * b + 1] = _mm512_setzero_pd();
    }
    for (int64_t i = 0; i < D; i++) {
        const __m512 kf = _mm512_set1_ps(k[i]);
        const __m512d qd = _mm512_set1_pd((double)q[i]);
        UNROLL for (int b = 0; b < NB; b++) {
            float *s = S + i * D + j + 16 * b;
            const __m512 sv = _mm512_add_ps(_mm512_loadu_ps(s), _mm512_mul_ps(kf, w[b]));
            _mm512_storeu_ps(s, sv);
            const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(sv));
            const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sv), 1)));
            od[2 * b] = _mm512_add_pd(od[2 * b], _mm512_mul_pd(lo, qd));
            od[2 * b + 1] = _mm512_add_pd(od[2 * b + 1], _mm512_mul_pd(hi, qd));
        }
    }
    UNROLL for (int b = 0; b < NB; b++) {
        _mm256_storeu_ps(o + j + 16 * b, _mm512_cvtpd_ps(od[2 * b]));
        _mm256_storeu_ps(o + j + 16 * b + 8, _mm512_cvtpd_ps(od[2 * b + 1]));
    }
}

/* vecmat: 16 columns per vector (64 per step), rows in order, mul then add. */
A512 static void vecmat_avx512(float *y, const float *x, const void *W, int dt, int64_t ldw, int64_t n, int64_t m) {
    const size_t esz = dt == DT_F32 ? 4 : 2;
    int64_t r = 0;
    for (; r + 64 <= m; r += 64) {
        __m512 a[4];
        UNROLL for (int b = 0; b < 4; b++) a[b] = _mm512_loadu_ps(y + r + 16 * b);
        for (int64_t i = 0; i < n; i++) {
            const __m512 xv = _mm512_set1_ps(x[i]);
            const char *wr = (const char *)W + (size_t)(i * ldw + r) * esz;
            UNROLL for (int b = 0; b < 4; b++)
                a[b] = _mm512_add_ps(a[b], _mm512_mul_ps(xv, w512(wr + 16 * b * esz, dt, 0, 0xFFFF)));
        }
        UNROLL for (int b = 0; b < 4; b++) _mm512_storeu_ps(y + r + 16 * b, a[b]);
    }
    for (; r + 16 <= m; r += 16) {
        __m512 a = _mm512_loadu_ps(y + r);
        for (int64_t i = 0; i < n; i++)
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_set1_ps(x[i]), w512((const char *)W + (size_t)(i * ldw + r) * esz, dt, 0, 0xFFFF)));
        _mm512_storeu_ps(y + r, a);
    }
    kern_ref_vecmat_cols(y, x, W, dt, ldw, n, r, m);
}

A512 static void kda_step_avx512(float *S, int64_t D, const float *k, const float *v, const float *q,
                                 const float *alpha, float beta, float *o) {
    int64_t j = 0;
    for (; j + 32 <= D; j += 32) kda_blk512(S, D, k, v, q, alpha, beta, o, j, 2);
    for (; j + 16 <= D; j += 16) kda_blk512(S, D, k, v, q, alpha, beta, o, j, 1);
    kern_ref_kda_cols(S, D, k, v, q, alpha, beta, o, j, D);
}

A256 INL void drv256(float *Y, int64_t ldy, const void *W, int dt, int64_t cols,
                     const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
#define BLK_D(RB, TB, k0, k1, st, sts) blk256(Y, ldy, W, dt, cols, X, ldx, r, rs, t, RB, TB, k0, k1, st, sts)
    DRIVER256(BLK_D)
#undef BLK_D
}

A256 static void matmul_avx2(float *Y, int64_t ldy, const void *W, int dt, int64_t cols,
                             const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    switch (dt) {
    case DT_F32: drv256(Y, ldy, W, DT_F32, cols, X, ldx, T, r0, r1); break;
    case DT_BF16: drv256(Y, ldy, W, DT_BF16, cols, X, ldx, T, r0, r1); break;
    case DT_F16: drv256(Y, ldy, W, DT_F16, cols, X, ldx, T, r0, r1); break;
    default: ST_ASSERT(!"matmul: dtype must be F32, BF16 or F16");
    }
}

A256 static float dot_avx2(const float *a, const float *b, int64_t n) {
    float y;
    blk256(&y, 1, a, DT_F32, n, b, n, 0, 1, 0, 1, 1, 0, n, NULL, 0);
    return y;
}

/* MXFP4 prefill's weight decoder on AVX2 (fp4_widen256; decode, T = 1, has its
 * own, fp4_group256): vpermps indexes only 8 entries, so the LUT holds the 8 scaled
 * magnitudes and bit 3 of the code becomes the sign by xor (exact: the reference's
 * k_e2m1[c] * s equals +-(|k_e2m1[c]| * s), -0 included). 8 bytes -> 16 codes:
 * each 4-byte word broadcast to the 8 lanes and shifted right by 4i in lane i
 * leaves element i's code in the low nibble of lane i (it replaced duplicate +
 * widen + shift).
 * The sign: code << 28 puts bit 3 at the sign bit, but also the magnitude bits
 * m at bits 28-30 (the exponent's top). The group's LUT row is stored xor'ed
 * with m << 28 in entry m (fp4_lut256), so that xor cancels and only the sign
 * is left: the same bits as masking, one vector op fewer per 8 weights (6 -> 5
 * with the fma). b_kern in-cache, AVX2 table, Intel Xeon VM, alternating runs
 * where bf16 read the same: T = 1 12.2-12.5 vs 10.3-10.5 G weights/s per core,
 * T = 8 and 64 16.6-17.5 vs 15.3-15.8 (as the block that then multiplied). */
A256 INL v16 fp4_w256(const uint8_t *p, __m256 lut) {
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    int32_t qa, qb;
    memcpy(&qa, p, 4);
    memcpy(&qb, p + 4, 4);
    __m256i ca = _mm256_srlv_epi32(_mm256_set1_epi32(qa), sh);
    __m256i cb = _mm256_srlv_epi32(_mm256_set1_epi32(qb), sh);
    v16 w;
    w.a = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut, ca), _mm256_castsi256_ps(_mm256_slli_epi32(ca, 28)));
    w.b = _mm256_xor_ps(_mm256_permutevar8x32_ps(lut, cb), _mm256_castsi256_ps(_mm256_slli_epi32(cb, 28)));
    return w;
}

/* The LUT row fp4_w256 takes for scale byte s: entry m (0..7) is the magnitude
 * k_e2m1[m] * 2^(s-127) (kern_fp4_lut's first 8 entries) xor'ed with m << 28. */
A256 INL __m256 fp4_lut256(uint8_t s) {
    const __m256i fix = _mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28, 7 << 28);
    return _mm256_xor_ps(_mm256_load_ps(kern_fp4_lut[s]), _mm256_castsi256_ps(fix));
}

/* MXFP4 decode's byte tables: every k_e2m1[c] * 2^(s-127) has at most two
 * significant bits, so its f32 is its top 16 bits (a bf16) and 16 zeros,
 * subnormals (down to 2^-128), inf and -0 included. Row s holds those bf16's low
 * bytes for c = 0..15, then their high bytes: kern_fp4_lut[s]'s bytes 2 and 3,
 * computed here from integers (kern_mxfp4_bf16_table checks them against it).
 * Magnitude m = c & 7 (m >= 1) is 2^E (1 + F/2): E = -1 for m = 1, else
 * m / 2 - 1; F = m & 1 for m >= 2. t = E + s - 127 is the f32 exponent: from 128
 * on inf, from -126 on normal, below it the subnormal (2 + F) 2^(t+132) in bf16
 * units (2^-133). Scale 255 zeroes the group, keeping the code's sign. */
#define FP4_E(m) ((m) == 1 ? -1 : ((m) >> 1) - 1)
#define FP4_F(m) ((m) >= 2 && ((m) & 1))
#define FP4_T(s, m) (FP4_E(m) + (s) - 127)
#define FP4_MAG(s, m)                                                                                    \
    ((s) == 255 || (m) == 0 ? 0                                                                          \
     : FP4_T(s, m) >= 128   ? 0x7F80                                                                     \
     : FP4_T(s, m) >= -126  ? (FP4_T(s, m) + 127) << 7 | FP4_F(m) << 6                                   \
                            : (2 + FP4_F(m)) << (FP4_T(s, m) + 132 < 0 ? 0 : FP4_T(s, m) + 132))
#define FP4_BF(s, c) (FP4_MAG(s, (c) & 7) | ((c) >> 3) << 15)
#define FP4_B16(s, SH) \
    (uint8_t)(FP4_BF(s, 0) >> (SH)), (uint8_t)(FP4_BF(s, 1) >> (SH)), (uint8_t)(FP4_BF(s, 2) >> (SH)), \
    (uint8_t)(FP4_BF(s, 3) >> (SH)), (uint8_t)(FP4_BF(s, 4) >> (SH)), (uint8_t)(FP4_BF(s, 5) >> (SH)), \
    (uint8_t)(FP4_BF(s, 6) >> (SH)), (uint8_t)(FP4_BF(s, 7) >> (SH)), (uint8_t)(FP4_BF(s, 8) >> (SH)), \
    (uint8_t)(FP4_BF(s, 9) >> (SH)), (uint8_t)(FP4_BF(s, 10) >> (SH)), (uint8_t)(FP4_BF(s, 11) >> (SH)), \
    (uint8_t)(FP4_BF(s, 12) >> (SH)), (uint8_t)(FP4_BF(s, 13) >> (SH)), (uint8_t)(FP4_BF(s, 14) >> (SH)), \
    (uint8_t)(FP4_BF(s, 15) >> (SH))
#define FP4_BROW(s) {FP4_B16(s, 0), FP4_B16(s, 8)}
#define FP4_B4(s) FP4_BROW(s), FP4_BROW((s) + 1), FP4_BROW((s) + 2), FP4_BROW((s) + 3)
#define FP4_B16R(s) FP4_B4(s), FP4_B4((s) + 4), FP4_B4((s) + 8), FP4_B4((s) + 12)
#define FP4_B64(s) FP4_B16R(s), FP4_B16R((s) + 16), FP4_B16R((s) + 32), FP4_B16R((s) + 48)
_Alignas(64) const uint8_t kern_x86_fp4_bf16[256][32] = {FP4_B64(0), FP4_B64(64), FP4_B64(128), FP4_B64(192)};

/* Decode (T = 1) of one 32-group of RB rows: the 16 code bytes broadcast to both
 * halves and the high half shifted right by 4 per 64 bits give, masked, 32
 * codes (low half: columns 0, 2, .. 30; high half: 1, 3, .. 31); two vpshufb
 * look each code's bf16 low and high byte up in the scale's row of
 * kern_x86_fp4_bf16, two vpunpck[lh]bw pair them into 16-bit words, and each
 * 32-bit word's two bf16 become f32 by a shift (the low one) and a mask (the
 * high one): the LUT's own bits, sign and zero scales included, in XO_Q order.
 * 7 shift / shuffle ops per 32 weights, 3 ands, 4 fmas. The LUT decoder before
 * (fp4_w256: per 8 weights a broadcast, vpsrlvd, vpermps, shift and xor) spent
 * 2 vpermps per 16 weights, and vpermps issues at about one per 1.3 cycles on
 * Zen 3 (vpshufb, shifts: 2 per cycle); a vpshufb + shift form of that decoder
 * (as the INT4 one) gained nothing, as it kept both vpermps. In cache on the
 * Zen 3 VM (64 rows x 2048 columns, 16 x 7168; ns per 16 weights of one row, CPU
 * time): 1.51-1.52 before, 0.92-0.98 after; 4 rows, x permuted per chunk: 1.53
 * vs 1.17. b_kern, 24 K3 experts from DRAM: 5.5-5.9 -> 9.3-10.0 GB/s on 1
 * thread (23-25% -> 38-43% of the probe; still this core's compute), 10.9-11.0
 * -> 18.2-19.1 on 2 (20% -> 33-35%). */
A256 INL void fp4_group256(__m256 acc[4][2], const uint8_t *const pr[4], const uint8_t *const tb[4], const float *X,
                           const float *xp, int64_t g, int RB, int XP) {
    const __m256i sh = _mm256_setr_epi64x(0, 0, 4, 4), m15 = _mm256_set1_epi8(15);
    const __m256i hm = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 xa[2], xb[2];
    xperm_at(X, xp, g * 32, XP, XO_Q, &xa[0], &xb[0]);
    xperm_at(X, xp, g * 32 + 16, XP, XO_Q, &xa[1], &xb[1]);
    UNROLL for (int i = 0; i < RB; i++) {
        const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(pr[i] + g * 16)));
        const __m256i c = _mm256_and_si256(_mm256_srlv_epi64(v, sh), m15);
        const __m256i tl = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(const void *)tb[i]));
        const __m256i th = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(const void *)(tb[i] + 16)));
        const __m256i lo = _mm256_shuffle_epi8(tl, c), hi = _mm256_shuffle_epi8(th, c);
        UNROLL for (int h = 0; h < 2; h++) { /* columns 16 h .. 16 h + 15 */
            const __m256i w = h ? _mm256_unpackhi_epi8(lo, hi) : _mm256_unpacklo_epi8(lo, hi);
            acc[i][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), xa[h], acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, hm)), xb[h], acc[i][1]);
        }
    }
}

/* Decode block: 4 groups per iteration (one 64-byte line per row), one prefetch
 * per row and line pf bytes ahead. */
A256 INL void fp4dec256(float *Y, const uint8_t *P, const uint8_t *S, int64_t cols, const float *X, const float *xp,
                        int64_t r, int64_t rs, int RB, int64_t pf, int XP) {
    const int64_t ng = cols / KERN_MXFP4_GROUP, rb = cols / 2;
    const uint8_t *pr[4], *sr[4], *tb[4];
    __m256 acc[4][2];
    UNROLL for (int i = 0; i < RB; i++) {
        pr[i] = P + (r + i * rs) * rb;
        sr[i] = S + (r + i * rs) * ng;
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
    int64_t g = 0;
    for (; g + 4 <= ng; g += 4) {
        UNROLL for (int i = 0; i < RB; i++) _mm_prefetch((const char *)pr[i] + pf + g * 16, _MM_HINT_T0);
        UNROLL for (int u = 0; u < 4; u++) {
            UNROLL for (int i = 0; i < RB; i++) tb[i] = kern_x86_fp4_bf16[sr[i][g + u]];
            fp4_group256(acc, pr, tb, X, xp, g + u, RB, XP);
        }
    }
    for (; g < ng; g++) {
        UNROLL for (int i = 0; i < RB; i++) tb[i] = kern_x86_fp4_bf16[sr[i][g]];
        fp4_group256(acc, pr, tb, X, xp, g, RB, XP);
    }
    UNROLL for (int i = 0; i < RB; i++) Y[r + i * rs] = red_q256(acc[i][0], acc[i][1]);
}

/* Prefill tile row: columns [k0, k1) of row r as f32 in column order. Prefill
 * runs PANELS256 with this as PREP (each 2-row x PAN_K tile decoded once for
 * the panel's up to 64 activations, then blk256 on f32, as FP8 / INT4 do): the
 * same weights and lanes as the block that decoded per 2 activations
 * (fp4blk256) did. In cache on the Zen 3 VM (64 x 3584, G products/s per core,
 * 2 interleaved runs): T = 2 14.2-14.3 vs 13.9-14.8, T = 4 18.3-20.2 vs
 * 14.3-14.8, T = 8 22.7-23.9 vs 14.3-15.2, T = 64 23.5-24.9 vs 13.9-14.4. */
A256 INL void fp4_widen256(float *dst, const uint8_t *P, const uint8_t *S, int64_t cols, int64_t r, int64_t k0,
                           int64_t k1) {
    const uint8_t *pr = P + r * (cols / 2), *sr = S + r * (cols / KERN_MXFP4_GROUP);
    for (int64_t g = k0 / KERN_MXFP4_GROUP; g < k1 / KERN_MXFP4_GROUP; g++) {
        const __m256 lut = fp4_lut256(sr[g]);
        UNROLL for (int h = 0; h < 2; h++) {
            const v16 w = fp4_w256(pr + g * 16 + h * 8, lut);
            _mm256_store_ps(dst + g * 32 - k0 + h * 16, w.a);
            _mm256_store_ps(dst + g * 32 - k0 + h * 16 + 8, w.b);
        }
    }
}

A256 static void mxfp4_avx2(float *Y, int64_t ldy, const uint8_t *P, const uint8_t *S,
                            int64_t cols, const float *X, int64_t ldx, int64_t T, int64_t r0,
                            int64_t r1) {
    ST_ASSERT(cols % KERN_MXFP4_GROUP == 0);
    if (T == 1) {
        const int64_t rs = (r1 - r0) / 4, rb = cols / 2, pf = fp4_pf_rows(rb) * rb;
        int64_t r;
#define FP4_ROWS(XP)                                                                         \
    do {                                                                                     \
        for (r = r0; r < r0 + rs; r++) fp4dec256(Y, P, S, cols, X, xp, r, rs, 4, pf, XP);   \
        for (r = r0 + 4 * rs; r < r1; r++) fp4dec256(Y, P, S, cols, X, xp, r, 1, 1, rb, XP); \
    } while (0)
        if (cols <= XPRE_MAX && r1 - r0 >= 16) {
            float xp[XPRE_MAX] __attribute__((aligned(32)));
            xperm_fill(xp, X, cols, XO_Q);
            FP4_ROWS(1);
        } else {
            const float *xp = NULL;
            FP4_ROWS(0);
        }
#undef FP4_ROWS
        return;
    }
    float wt[2 * PAN_K] __attribute__((aligned(32)));
#define PREP_F(rbn, k0, k1) for (int i_ = 0; i_ < (rbn); i_++) fp4_widen256(wt + i_ * PAN_K, P, S, cols, r + i_, k0, k1)
#define BLK_F(RB, TB, k0, k1, st, sts) blk256(NULL, 0, wt, DT_F32, PAN_K, X + (k0), ldx, 0, 1, t, RB, TB, 0, (k1) - (k0), st, sts)
    PANELS256(BLK_F, PREP_F)
#undef PREP_F
#undef BLK_F
}

/* SiTU, 4 elements per step: the same sequence as situ_avx512 on ymm. */
A256 INL __m256d exp_parts256(__m256d z, __m256d *p) {
    const __m256d sh = _mm256_set1_pd(KERN_SHIFTER);
    __m256d t = _mm256_add_pd(_mm256_mul_pd(z, _mm256_set1_pd(KERN_INV_LN2)), sh), kd = _mm256_sub_pd(t, sh);
    __m256d r = _mm256_fnmadd_pd(kd, _mm256_set1_pd(KERN_LN2_HI), z);
    r = _mm256_fnmadd_pd(kd, _mm256_set1_pd(KERN_LN2_LO), r);
    __m256d q = _mm256_set1_pd(KERN_EXPM1_C13);
#define HORNER(c) q = _mm256_fmadd_pd(q, r, _mm256_set1_pd(c));
    KERN_EXPM1_TAYLOR(HORNER)
#undef HORNER
    *p = _mm256_fmadd_pd(q, _mm256_mul_pd(r, r), r);
    __m256i b = _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(t), _mm256_set1_epi64x(1023)), 52);
    return _mm256_castsi256_pd(b);
}

A256 static void situ_avx2(float *g, const float *u, int64_t n, float b1, float b2) {
    const __m256d k1 = _mm256_set1_pd(-2.0 / (double)b1), k2 = _mm256_set1_pd(-2.0 / (double)b2);
    const __m256d b12 = _mm256_set1_pd((double)b1 * (double)b2), one = _mm256_set1_pd(1.0), two = _mm256_set1_pd(2.0);
    const __m256d lo = _mm256_set1_pd(KERN_EXPM1_MIN), zhi = _mm256_set1_pd(KERN_EXP_MAX), zlo = _mm256_set1_pd(-KERN_EXP_MAX);
    const __m256d abs = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFll));
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128 gf = _mm_loadu_ps(g + i), uf = _mm_loadu_ps(u + i);
        const __m256d gd = _mm256_cvtps_pd(gf), ud = _mm256_cvtps_pd(uf);
        __m256d a1 = _mm256_max_pd(lo, _mm256_mul_pd(_mm256_and_pd(gd, abs), k1));
        __m256d a2 = _mm256_max_pd(lo, _mm256_mul_pd(_mm256_and_pd(ud, abs), k2));
        __m256d z = _mm256_sub_pd(_mm256_setzero_pd(), gd);
        z = _mm256_max_pd(zlo, _mm256_min_pd(zhi, z));
        __m256d p1, p2, pe;
        const __m256d s1 = exp_parts256(a1, &p1), s2 = exp_parts256(a2, &p2), se = exp_parts256(z, &pe);
        const __m256d m1 = _mm256_fmadd_pd(s1, p1, _mm256_sub_pd(s1, one));
        const __m256d m2 = _mm256_fmadd_pd(s2, p2, _mm256_sub_pd(s2, one));
        const __m256d e = _mm256_fmadd_pd(se, pe, se);
        const __m256d num = _mm256_mul_pd(_mm256_mul_pd(m1, m2), b12);
        const __m256d den = _mm256_mul_pd(_mm256_mul_pd(_mm256_add_pd(two, m1), _mm256_add_pd(two, m2)), _mm256_add_pd(one, e));
        const __m128 r = _mm256_cvtpd_ps(_mm256_and_pd(_mm256_div_pd(num, den), abs));
        const __m128 sgn = _mm_and_ps(_mm_xor_ps(gf, uf), _mm_set1_ps(-0.0f));
        _mm_storeu_ps(g + i, _mm_xor_ps(r, sgn));
    }
    kern_ref_situ(g + i, u + i, n - i, b1, b2);
}

A256 static void exp_f64_avx2(double *y, const double *x, int64_t n) {
    const __m256d hi = _mm256_set1_pd(KERN_EXP_MAX), lo = _mm256_set1_pd(-KERN_EXP_MAX);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d z = _mm256_max_pd(lo, _mm256_min_pd(hi, _mm256_loadu_pd(x + i))), p;
        const __m256d s = exp_parts256(z, &p);
        _mm256_storeu_pd(y + i, _mm256_fmadd_pd(s, p, s));
    }
    kern_ref_exp_f64(y + i, x + i, n - i);
}

/* kda_blk512 on ymm: NB blocks of 8 columns. */
A256 INL void kda_blk256(float *S, int64_t D, const float *k, const float *v, const float *q,
                         const float *alpha, float beta, float *o, int64_t j, int NB) {
    __m256d u[4], od[4];
    UNROLL for (int b = 0; b < 2 * NB; b++) u[b] = _mm256_setzero_pd();
    for (int64_t i = 0; i < D; i++) {
        const __m256 a = _mm256_set1_ps(alpha[i]);
        const __m256d kd = _mm256_set1_pd((double)k[i]);
        _mm_prefetch((const char *)kda_pf(S, D, i, j, 8 * NB), _MM_HINT_T0); /* NB x 8 floats: one line at most */
        UNROLL for (int b = 0; b < NB; b++) {
            float *s = S + i * D + j + 8 * b;
            const __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(s), a);
            _mm256_storeu_ps(s, sv);
            u[2 * b] = _mm256_add_pd(u[2 * b], _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(sv)), kd));
            u[2 * b + 1] = _mm256_add_pd(u[2 * b + 1], _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(sv, 1)), kd));
        }
    }
    const __m256d bd = _mm256_set1_pd((double)beta);
    __m256 w[2];
    UNROLL for (int b = 0; b < NB; b++) {
        const __m128 wlo = _mm256_cvtpd_ps(_mm256_mul_pd(bd, _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(v + j + 8 * b)), u[2 * b])));
        const __m128 whi = _mm256_cvtpd_ps(_mm256_mul_pd(bd, _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(v + j + 8 * b + 4)), u[2 * b + 1])));
        w[b] = _mm256_insertf128_ps(_mm256_castps128_ps256(wlo), whi, 1);
        od[2 * b] = od[2 * b + 1] = _mm256_setzero_pd();
    }
    for (int64_t i = 0; i < D; i++) {
        const __m256 kf = _mm256_set1_ps(k[i]);
        const __m256d qd = _mm256_set1_pd((double)q[i]);
        UNROLL for (int b = 0; b < NB; b++) {
            float *s = S + i * D + j + 8 * b;
            const __m256 sv = _mm256_add_ps(_mm256_loadu_ps(s), _mm256_mul_ps(kf, w[b]));
            _mm256_storeu_ps(s, sv);
            od[2 * b] = _mm256_add_pd(od[2 * b], _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(sv)), qd));
            od[2 * b + 1] = _mm256_add_pd(od[2 * b + 1], _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(sv, 1)), qd));
        }
    }
    UNROLL for (int b = 0; b < NB; b++) {
        _mm_storeu_ps(o + j + 8 * b, _mm256_cvtpd_ps(od[2 * b]));
        _mm_storeu_ps(o + j + 8 * b + 4, _mm256_cvtpd_ps(od[2 * b + 1]));
    }
}

/* vecmat_avx512 on ymm: 8 columns per vector, 32 per step. */
A256 static void vecmat_avx2(float *y, const float *x, const void *W, int dt, int64_t ldw, int64_t n, int64_t m) {
    const size_t esz = dt == DT_F32 ? 4 : 2;
    int64_t r = 0;
    for (; r + 16 <= m; r += 16) {
        __m256 a0 = _mm256_loadu_ps(y + r), a1 = _mm256_loadu_ps(y + r + 8);
        for (int64_t i = 0; i < n; i++) {
            const __m256 xv = _mm256_set1_ps(x[i]);
            const v16 w = w256((const char *)W + (size_t)(i * ldw + r) * esz, dt, 0);
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(xv, w.a));
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(xv, w.b));
        }
        _mm256_storeu_ps(y + r, a0);
        _mm256_storeu_ps(y + r + 8, a1);
    }
    kern_ref_vecmat_cols(y, x, W, dt, ldw, n, r, m);
}

A256 static void kda_step_avx2(float *S, int64_t D, const float *k, const float *v, const float *q,
                               const float *alpha, float beta, float *o) {
    int64_t j = 0;
    for (; j + 16 <= D; j += 16) kda_blk256(S, D, k, v, q, alpha, beta, o, j, 2);
    for (; j + 8 <= D; j += 8) kda_blk256(S, D, k, v, q, alpha, beta, o, j, 1);
    kern_ref_kda_cols(S, D, k, v, q, alpha, beta, o, j, D);
}

/* ======================= tables ======================= */

int kern_x86_has_avx2(void) {
    __builtin_cpu_init();
    /* F16C through cpuid: clang's __builtin_cpu_supports does not know "f16c" */
    unsigned a, b, c, d;
    int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

int kern_x86_has_avx512vbmi(void) {
    return kern_x86_has_avx512() && __builtin_cpu_supports("avx512vbmi");
}

int kern_x86_has_avx512(void) {
    __builtin_cpu_init();
    return kern_x86_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

const kern_table kern_avx2_table = {
    .name = "avx2", .matmul = matmul_avx2, .matmul_mxfp4 = mxfp4_avx2, .matmul_fp8 = kern_x86_fp8_avx2, .matmul_int4 = kern_x86_int4_avx2, .dot = dot_avx2, .situ = situ_avx2,
    .exp_f64 = exp_f64_avx2, .kda_step = kda_step_avx2, .vecmat = vecmat_avx2,
};
/* FP8 and INT4 (kern_x86q.c): bit-identical to the reference on an AMD EPYC Zen 4
 * VM (kern_fp8, kern_int4, kern_quant_decode_paths); INT4 decode there 21.9-22.2
 * G weights/s on 1 thread and 42.6-43.2 on 2 (47-48% / 66-67% of the probe)
 * against AVX2's 16.3-16.4 and 31.1-32.2 (35% / 48-50%), prefill 180 vs 108
 * GFLOP/s; FP8 decode stays AVX2's on AMD (kern_x86_fp8_avx512 says why). */
const kern_table kern_avx512_table = {
    .name = "avx512", .matmul = matmul_avx512, .matmul_mxfp4 = mxfp4_avx512, .matmul_fp8 = kern_x86_fp8_avx512, .matmul_int4 = kern_x86_int4_avx512, .dot = dot_avx512,
    .situ = situ_avx512, .exp_f64 = exp_f64_avx512, .kda_step = kda_step_avx512,
    .vecmat = vecmat_avx512,
};
/* Kept as a name (STRATA_KERNEL=avx512vbmi, run reports): its vpmultishiftqb MXFP4
 * decoder lost to the shift decoder above, which it now shares. */
const kern_table kern_avx512vbmi_table = {
    .name = "avx512vbmi", .matmul = matmul_avx512, .matmul_mxfp4 = mxfp4_avx512, .matmul_fp8 = kern_x86_fp8_avx512, .matmul_int4 = kern_x86_int4_avx512, .dot = dot_avx512,
    .situ = situ_avx512, .exp_f64 = exp_f64_avx512, .kda_step = kda_step_avx512,
    .vecmat = vecmat_avx512,
};

#endif
