/*
 * kern_x86q.c: FP8 e4m3fn (128 x 128 block scales) and INT4 pack-quantized (group
 * 32) matmuls on AVX2 and AVX-512. kern.h's lane contract and
 * kern_ref.c's weight values, bit for bit; where a path computes a weight another
 * way, the comment says why it is the same f32.
 *
 * Walks as the MXFP4 ones: decode (T = 1) runs 4 rows a quarter of the range apart
 * (four long sequential streams, each prefetching its next row), then the last < 4
 * rows singly; prefill (T > 1) runs PANELS256, whose PREP decodes each 2-row x
 * PAN_K weight tile to f32 once for all activations of the panel (the reference's
 * weights, as the decode path's), then blk256 runs the f32 tile: per (row, t) the
 * same lanes in the same order as T = 1. AVX2 decode takes each 16 weights as
 * its even and odd columns (x permuted alike), the AVX-512 one in order.
 */
#include "kern.h"

#if defined(__x86_64__)
#include <float.h>
#include <math.h>
#include "kern_x86.h"

/* ======================= FP8 ======================= */

/* The prefill tiles (AVX2 and AVX-512) and AVX-512 decode widen e4m3fn through
 * f16 bits: s << 15 | (b & 0x7F) << 7 is an f16 of exactly e4m3 / 256
 * (exponent e -> f16 exponent e, bias 15 vs 7; e = 0 is an f16 subnormal, which
 * vcvtph2ps widens exactly), so one sign-extension, shift and mask per 16 bytes
 * and the hardware conversion decode 16 weights. The weight is then h * (256 S):
 * the exact product h 256 S = e4m3 S rounded once, the reference's f32, whenever
 * 256 S is exact, i.e. unless S is finite with |S| >= 2^120; such a block (never
 * in a real checkpoint, but in the contract) multiplies (256 h) S instead, both
 * steps exact but the last. The NaN codes S.1111.111 decode to +-1.875 (480 / 256),
 * not NaN: decode checks each row's bytes (a NaN weight makes the row's dot
 * NaN, so the row's result becomes NaN), the prefill tile blends NaN in. */
A256 INL __m256i fp8_h16(const uint8_t *p) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xBFFF));
}

static inline int fp8_slow(float s) { return isfinite(s) && fabsf(s) >= 0x1p120f; }

/* Block b's scale and pre-factor per row (fp8_slow's split: s and 256, else
 * s * 256 and 1) and whether any row is slow; prefetches each row's 128 bytes
 * at offset `at`. Shared by the AVX2 and AVX-512 decoders. */
INL int fp8_block_scales(float sc[4], float pre[4], const float *const sr[4], const uint8_t *const wr[4],
                       int64_t b, int64_t at, int RB) {
    int slow = 0;
    UNROLL for (int i = 0; i < RB; i++) {
        const float s = sr[i][b];
        const int sl = fp8_slow(s);
        slow |= sl;
        sc[i] = sl ? s : s * 256.0f;
        pre[i] = sl ? 256.0f : 1.0f;
        _mm_prefetch((const char *)wr[i] + at, _MM_HINT_T0);
        _mm_prefetch((const char *)wr[i] + at + 64, _MM_HINT_T0);
    }
    return slow;
}

/* Any NaN code (b & 0x7F == 0x7F) in n bytes: one and + unsigned max per 32. */
A256 INL int fp8_has_nan(const uint8_t *p, int64_t n) {
    const __m256i m7 = _mm256_set1_epi8(0x7F);
    __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a = _mm256_max_epu8(a, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + i)), m7));
        b = _mm256_max_epu8(b, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(p + i + 32)), m7));
    }
    int bad = _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(a, b), m7)) != 0;
    for (; i < n; i++) bad |= (p[i] & 0x7F) == 0x7F;
    return bad;
}

/* AVX2 decode (T = 1) decodes without vcvtph2ps. In-L1 microbenchmark on the
 * Zen 3 VM (4 and 64 rows x 2048 columns, one scale, no NaN pass; ns per 16
 * weights of one row, 2 interleaved runs on a loaded machine): vpmovsxbw +
 * shift + mask + 2 vcvtph2ps 1.65-1.9; the bit patterns below with the scale as
 * vmulps 1.3-1.4 without subnormal codes but 1.9-3.3 with b_kern's uniform bytes
 * (6% subnormal codes: vmulps takes an f32 denormal input slowly on Zen 3),
 * with the scale as an fma 1.2-1.3 either way (no denormal cost there).
 * Bit patterns: sext16(b) << 20 in each dword's low word, or sext16(b) << 4 in
 * its high word, masked by 0x87F00000, is s << 31 | (b & 0x7F) << 20: the f32
 * e4m3 * 2^-120 exactly (exponent field e, mantissa m; e = 0 lands on the f32
 * subnormals m 2^-3 2^-126 = m 2^-9 2^-120). So 16 bytes give two vectors, the
 * even columns {0, 2, .. 14} and the odd ones, by 2 shifts and 2 ands after the
 * widening; x is permuted the same way once per 16 columns for all RB rows
 * (xeo256), and the accumulators back (red_eo256) before the contract's tree:
 * every lane still sees its columns in order. */
A256 INL void fp8_eo(const uint8_t *p, __m256 *e, __m256 *o) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p));
    const __m256i m = _mm256_set1_epi32((int)0x87F00000u);
    *e = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(w, 20), m));
    *o = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(w, 4), m));
}

/* The weight from h = e4m3 2^-120: FAST, h (2^120 S), the one rounding of the
 * exact e4m3 S whenever 2^120 S is exact (|S| < 2^8 or S not finite: inf and NaN
 * stay themselves, 0 h inf is NaN as 0 inf); else (h 2^120) S, h 2^120 = e4m3
 * exactly. As fma(., ., -0): the product's rounding and sign of zero, and a
 * denormal h costs nothing (vmulps: see above). */
A256 INL __m256 fp8_wt(__m256 h, __m256 sc, int FAST) {
    const __m256 nz = _mm256_set1_ps(-0.0f);
    if (FAST) return _mm256_fmadd_ps(h, sc, nz);
    return _mm256_mul_ps(_mm256_fmadd_ps(h, _mm256_set1_ps(0x1p120f), nz), sc);
}

/* Whether every scale of rows [r0, r1) takes the FAST form: fp8_wt's (lim 2^8)
 * or fp8_w16's (lim 2^120). */
static int fp8_all_fast(const float *S, int64_t nb, int64_t r0, int64_t r1, float lim) {
    for (int64_t i = (r0 / KERN_FP8_BLOCK) * nb; i < ((r1 - 1) / KERN_FP8_BLOCK + 1) * nb; i++)
        if (isfinite(S[i]) && fabsf(S[i]) >= lim) return 0;
    return 1;
}

/* The decoder other CPUs keep: fp8_h16's f16 bits widened by vcvtph2ps (lanes
 * in order), then h (256 S) (FAST, sc = 256 S) or (256 h) S (sc = S). A subnormal
 * code is an f32 denormal in the bit-pattern decoder: Zen 3's fma takes it at
 * full speed (measured above), but Intel's cost is not measured (no Intel machine
 * at hand), and a microcode assist per such vector would undo the gain, so only
 * AMD CPUs take the patterns (fp8_use_patterns). */
A256 INL void fp8_w16(const uint8_t *p, __m256 sc, int FAST, __m256 *a, __m256 *b) {
    const __m256i h = fp8_h16(p);
    __m256 ha = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), hb = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if (!FAST) {
        ha = _mm256_mul_ps(ha, _mm256_set1_ps(256.0f));
        hb = _mm256_mul_ps(hb, _mm256_set1_ps(256.0f));
    }
    *a = _mm256_mul_ps(ha, sc);
    *b = _mm256_mul_ps(hb, sc);
}

static int fp8_use_patterns(void) { return __builtin_cpu_is("amd"); }

/* Columns [k, k1) of one 128-column block for RB rows, full 16-column chunks.
 * PAT: the bit patterns (even / odd lanes), else fp8_w16 (lanes in order). */
A256 INL void fp8_span256(__m256 acc[4][2], const uint8_t *const wr[4], const __m256 sc[4], const float *X,
                          const float *xp, int64_t k, int64_t k1, int RB, int FAST, int XP, int PAT) {
    for (; k + 16 <= k1; k += 16) {
        __m256 xa, xb;
        if (PAT) xperm_at(X, xp, k, XP, XO_EO, &xa, &xb);
        else {
            xa = _mm256_loadu_ps(X + k);
            xb = _mm256_loadu_ps(X + k + 8);
        }
        UNROLL for (int i = 0; i < RB; i++) {
            __m256 wa, wb;
            if (PAT) {
                fp8_eo(wr[i] + k, &wa, &wb);
                wa = fp8_wt(wa, sc[i], FAST);
                wb = fp8_wt(wb, sc[i], FAST);
            } else {
                fp8_w16(wr[i] + k, sc[i], FAST, &wa, &wb);
            }
            acc[i][0] = _mm256_fmadd_ps(wa, xa, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(wb, xb, acc[i][1]);
        }
    }
}

/* Decode block: RB rows rs apart, each prefetching pf bytes ahead once per 64. */
A256 INL void fp8dec256(float *Y, const uint8_t *W, const float *S, int64_t cols, const float *X, const float *xp,
                        int64_t r, int64_t rs, int RB, int64_t pf, int FAST, int XP, int PAT) {
    const int64_t nb = (cols + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK, full = cols & ~(int64_t)15;
    const uint8_t *wr[4];
    const float *sr[4];
    __m256 acc[4][2];
    UNROLL for (int i = 0; i < RB; i++) {
        wr[i] = W + (r + i * rs) * cols;
        sr[i] = S + ((r + i * rs) / KERN_FP8_BLOCK) * nb;
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
    const __m256i m7 = _mm256_set1_epi8(0x7F);
    __m256i nanm = _mm256_setzero_si256();
    int64_t nanb = 0;
    for (int64_t b = 0; b * KERN_FP8_BLOCK < full; b++) {
        const int64_t k0 = b * KERN_FP8_BLOCK, k1 = k0 + KERN_FP8_BLOCK < full ? k0 + KERN_FP8_BLOCK : full;
        __m256 sc[4];
        UNROLL for (int i = 0; i < RB; i++) {
            sc[i] = _mm256_set1_ps(FAST ? sr[i][b] * (PAT ? 0x1p120f : 256.0f) : sr[i][b]);
            _mm_prefetch((const char *)wr[i] + pf + k0, _MM_HINT_T0);
            _mm_prefetch((const char *)wr[i] + pf + k0 + 64, _MM_HINT_T0);
        }
        fp8_span256(acc, wr, sc, X, xp, k0, k1, RB, FAST, XP, PAT);
        if (k1 - k0 == KERN_FP8_BLOCK)
            UNROLL for (int i = 0; i < RB; i++) UNROLL for (int q = 0; q < KERN_FP8_BLOCK; q += 32)
                nanm = _mm256_max_epu8(nanm, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(wr[i] + k0 + q)), m7));
        else
            nanb = 1;
    }
    if (full < cols) { /* tail: the contract's zero padding, weights by the reference's decode */
        float xt[16] = {0}, wt[16];
        memcpy(xt, X + full, (size_t)(cols - full) * 4);
        __m256 xe = _mm256_loadu_ps(xt), xo = _mm256_loadu_ps(xt + 8);
        if (PAT) xeo256(xt, &xe, &xo);
        UNROLL for (int i = 0; i < RB; i++) {
            memset(wt, 0, sizeof wt);
            for (int64_t k = full; k < cols; k++) wt[k - full] = kern_e4m3_f32(wr[i][k]) * sr[i][k / KERN_FP8_BLOCK];
            __m256 we = _mm256_loadu_ps(wt), wo = _mm256_loadu_ps(wt + 8);
            if (PAT) xeo256(wt, &we, &wo);
            acc[i][0] = _mm256_fmadd_ps(we, xe, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(wo, xo, acc[i][1]);
        }
    }
    /* NaN codes: the blocks' maximum of b & 0x7F over all RB rows is 0x7F only if
     * some row has one (then each row is checked); a partial last block, rows
     * checked whole. */
    const int any = nanb || _mm256_movemask_epi8(_mm256_cmpeq_epi8(nanm, m7)) != 0;
    UNROLL for (int i = 0; i < RB; i++)
        Y[r + i * rs] = any && fp8_has_nan(wr[i], full) ? NAN
                        : PAT ? red_eo256(acc[i][0], acc[i][1]) : red256(acc[i][0], acc[i][1]);
}

/* Prefill tile: columns [k0, k0 + kn) of row r as f32 at dst (the decode path's
 * values, NaN codes as NaN; kn - kn % 16 by vectors, the rest by the reference). */
A256 INL void fp8_widen256(float *dst, const uint8_t *W, const float *S, int64_t cols, int64_t r, int64_t k0,
                           int64_t kn) {
    const int64_t nb = (cols + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK;
    const uint8_t *wr = W + r * cols + k0;
    const float *sr = S + (r / KERN_FP8_BLOCK) * nb;
    const __m256 nanpat = _mm256_set1_ps(1.875f), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    int64_t c = 0;
    for (; c + 16 <= kn; c += 16) {
        const float s = sr[(k0 + c) / KERN_FP8_BLOCK];
        const int sl = fp8_slow(s);
        const __m256i h = fp8_h16(wr + c);
        const __m256 ha = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), hb = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        const __m256 pre = _mm256_set1_ps(sl ? 256.0f : 1.0f), sc = _mm256_set1_ps(sl ? s : s * 256.0f);
        const __m256 na = _mm256_cmp_ps(_mm256_and_ps(ha, absm), nanpat, _CMP_EQ_OQ);
        const __m256 nbm = _mm256_cmp_ps(_mm256_and_ps(hb, absm), nanpat, _CMP_EQ_OQ);
        _mm256_store_ps(dst + c, _mm256_or_ps(_mm256_mul_ps(_mm256_mul_ps(ha, pre), sc), na));
        _mm256_store_ps(dst + c + 8, _mm256_or_ps(_mm256_mul_ps(_mm256_mul_ps(hb, pre), sc), nbm));
    }
    for (; c < kn; c++) dst[c] = kern_e4m3_f32(wr[c]) * sr[(k0 + c) / KERN_FP8_BLOCK];
}

A256 void kern_x86_fp8_avx2_decode(float *Y, const uint8_t *W, const float *S, int64_t cols, const float *X,
                                   int64_t r0, int64_t r1, int pat) {
    const int64_t rs = (r1 - r0) / 4, pf = fp4_pf_rows(cols) * cols;
    int64_t r = r0;
    if (r0 >= r1) return;
    const int fast = fp8_all_fast(S, (cols + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK, r0, r1, pat ? 0x1p8f : 0x1p120f);
#define FP8_ROWS(F, XP, PAT)                                                                             \
    do {                                                                                                 \
        for (r = r0; r < r0 + rs; r++) fp8dec256(Y, W, S, cols, X, xp, r, rs, 4, pf, F, XP, PAT);        \
        for (r = r0 + 4 * rs; r < r1; r++) fp8dec256(Y, W, S, cols, X, xp, r, 1, 1, cols, F, XP, PAT);   \
    } while (0)
    if (!pat) {
        const float *xp = NULL;
        if (fast) FP8_ROWS(1, 0, 0);
        else FP8_ROWS(0, 0, 0);
    } else if (cols <= XPRE_MAX && r1 - r0 >= 16) {
        float xp[XPRE_MAX] __attribute__((aligned(32)));
        xperm_fill(xp, X, cols, XO_EO);
        if (fast) FP8_ROWS(1, 1, 1);
        else FP8_ROWS(0, 1, 1);
    } else {
        const float *xp = NULL;
        if (fast) FP8_ROWS(1, 0, 1);
        else FP8_ROWS(0, 0, 1);
    }
#undef FP8_ROWS
}

A256 void kern_x86_fp8_avx2(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols, const float *X,
                            int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    if (T == 1) {
        kern_x86_fp8_avx2_decode(Y, W, S, cols, X, r0, r1, fp8_use_patterns());
        return;
    }
    float wt[2 * PAN_K] __attribute__((aligned(32)));
#define PREP_Q(rbn, k0, k1) for (int i_ = 0; i_ < (rbn); i_++) fp8_widen256(wt + i_ * PAN_K, W, S, cols, r + i_, k0, (k1) - (k0))
#define BLK_Q(RB, TB, k0, k1, st, sts) blk256(NULL, 0, wt, DT_F32, PAN_K, X + (k0), ldx, 0, 1, t, RB, TB, 0, (k1) - (k0), st, sts)
    PANELS256(BLK_Q, PREP_Q)
#undef PREP_Q
}

/* ======================= INT4 ======================= */

/* 8 weights of one word: broadcast, lane i shifted left by 28 - 4i so nibble i
 * is on top, then shifted down. Fast (0 < s < 2^124): the nibble c unsigned and
 * w = fma(c, s, -8 s): c s and 8 s are exact, so the one rounding of their exact
 * difference q s is q s itself (q = 0 gives +0 as 0 * s with s > 0). Otherwise
 * (zero, negative, huge or non-finite scales; never a real checkpoint's) the
 * reference's product: the word xor 0x88888888 makes each nibble's signed value
 * q, sign-extended by the arithmetic shift, then (float)q * s. */
A256 INL __m256 int4_w8(const int32_t *p, __m256 s, __m256 s8, int FAST) {
    const __m256i sh = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    const __m256i v = _mm256_set1_epi32(*p);
    if (FAST) return _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(_mm256_sllv_epi32(v, sh), 28)), s, s8);
    const __m256i q = _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_xor_si256(v, _mm256_set1_epi32((int)0x88888888u)), sh), 28);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
}

static inline float bf16f(uint16_t h) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}

/* Decode (T = 1) takes a group's 16 bytes at once: broadcast to both halves,
 * one vpshufb per 16 weights puts byte p (weights 2p, 2p + 1) alone in dword p,
 * then an and / a shift give the even / odd weights' nibbles: the FP8 decoder's
 * even/odd lanes, so x and the accumulators take xeo256 / red_eo256. In-L1
 * microbenchmark on the Zen 3 VM (4 and 64 rows x 2048 columns, 3 interleaved
 * runs, ns per 16 weights of one row): per word vpbroadcastd + vpsllvd + vpsrld
 * 1.93-2.07, this 1.47-1.49 (the same cvt + fmsub + fma follow). FAST: int4_w8's
 * fma(c, s, -8 s); else (float)(c - 8) * s, the reference's product. */
A256 INL __m256 int4_wq(__m256i c, __m256 s, __m256 s8, int FAST) {
    if (FAST) return _mm256_fmsub_ps(_mm256_cvtepi32_ps(c), s, s8);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c, _mm256_set1_epi32(8))), s);
}

/* One 32-group of RB rows (pr: each row's bytes); row i's scale s and 8 s at
 * sf[i] and sf[i] + 4 (f32). */
A256 INL void int4_group256(__m256 acc[4][2], const uint8_t *const pr[4], const float *const sf[4], const float *X,
                            const float *xp, int64_t g, int RB, int FAST, int XP) {
    const __m256i c0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1, 5,
                                        -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i c1 = _mm256_add_epi8(c0, _mm256_setr_epi8(8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0,
                                                           8, 0, 0, 0, 8, 0, 0, 0, 8, 0, 0, 0));
    const __m256i m = _mm256_set1_epi32(15);
    __m256 xe[2], xo[2];
    xperm_at(X, xp, g * 32, XP, XO_EO, &xe[0], &xo[0]);
    xperm_at(X, xp, g * 32 + 16, XP, XO_EO, &xe[1], &xo[1]);
    UNROLL for (int i = 0; i < RB; i++) {
        const __m256 s = _mm256_broadcast_ss(sf[i]), s8 = _mm256_broadcast_ss(sf[i] + 4);
        const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(pr[i] + g * 16)));
        UNROLL for (int h = 0; h < 2; h++) {
            const __m256i d = _mm256_shuffle_epi8(v, h ? c1 : c0);
            acc[i][0] = _mm256_fmadd_ps(int4_wq(_mm256_and_si256(d, m), s, s8, FAST), xe[h], acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(int4_wq(_mm256_srli_epi32(d, 4), s, s8, FAST), xo[h], acc[i][1]);
        }
    }
}

/* Decode block; FAST: every scale of the call takes the fast decoder (checked
 * once per call by int4_all_fast, so the group loop has no branch). Unrolled by 4
 * groups: one 64-byte line per row and iteration, one prefetch pf bytes ahead. */
A256 INL void int4dec256(float *Y, const int32_t *Wp, const uint16_t *S, int64_t cols, const float *X, const float *xp,
                         int64_t r, int64_t rs, int RB, int64_t pf, int FAST, int XP) {
    const int64_t ng = cols / KERN_INT4_GROUP;
    const uint8_t *pr[4];
    const uint16_t *sr[4];
    __m256 acc[4][2];
    UNROLL for (int i = 0; i < RB; i++) {
        pr[i] = (const uint8_t *)(Wp + (r + i * rs) * (cols / 8));
        sr[i] = S + (r + i * rs) * ng;
        acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    }
    /* the scales of 4 groups widened at once and kept on the stack, so each group
     * broadcasts them by loads (vmovd + vbroadcastss + a scalar multiply per group
     * and row were ~4 of its ~22 vector ops) */
    float sb[4][8] __attribute__((aligned(32)));
    const float *sf[4];
    int64_t g = 0;
    for (; g + 4 <= ng; g += 4) {
        UNROLL for (int i = 0; i < RB; i++) {
            _mm_prefetch((const char *)pr[i] + pf + g * 16, _MM_HINT_T0);
            const __m128 s = _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(sr[i] + g))), 16));
            _mm_store_ps(sb[i], s);
            _mm_store_ps(sb[i] + 4, _mm_mul_ps(s, _mm_set1_ps(8.0f)));
        }
        UNROLL for (int u = 0; u < 4; u++) {
            UNROLL for (int i = 0; i < RB; i++) sf[i] = sb[i] + u;
            int4_group256(acc, pr, sf, X, xp, g + u, RB, FAST, XP);
        }
    }
    for (; g < ng; g++) {
        UNROLL for (int i = 0; i < RB; i++) {
            sb[i][0] = bf16f(sr[i][g]);
            sb[i][4] = sb[i][0] * 8.0f;
            sf[i] = sb[i];
        }
        int4_group256(acc, pr, sf, X, xp, g, RB, FAST, XP);
    }
    UNROLL for (int i = 0; i < RB; i++) Y[r + i * rs] = red_eo256(acc[i][0], acc[i][1]);
}

/* Whether every scale of rows [r0, r1) takes the fast decoder (0 < s < 2^124 as
 * bf16 bits: sign clear, nonzero, exponent field below 127 + 124). */
A256 INL int int4_all_fast(const uint16_t *S, int64_t n) {
    /* bits - 1 (wrapping) at most LIM: one subtract and unsigned max per 16 scales
     * (the scalar loop was ~10% of an in-L1 decode call) */
    const uint16_t lim = (uint16_t)(((127 + 124) << 7) - 2);
    const __m256i one = _mm256_set1_epi16(1), vl = _mm256_set1_epi16((short)lim);
    __m256i mx = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        mx = _mm256_max_epu16(mx, _mm256_sub_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(S + i)), one));
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_max_epu16(mx, vl), vl)) != -1) return 0;
    for (; i < n; i++)
        if ((uint16_t)(S[i] - 1) > lim) return 0;
    return 1;
}

/* Prefill tile row: columns [k0, k0 + kn) of row r as f32 (kn a multiple of 32). */
A256 INL void int4_widen256(float *dst, const int32_t *Wp, const uint16_t *S, int64_t cols, int64_t r, int64_t k0,
                            int64_t kn) {
    const int32_t *wr = Wp + r * (cols / 8) + k0 / 8;
    const uint16_t *sr = S + r * (cols / KERN_INT4_GROUP) + k0 / KERN_INT4_GROUP;
    for (int64_t c = 0; c < kn; c += 8) {
        const __m256 s = _mm256_set1_ps(bf16f(sr[c / KERN_INT4_GROUP]));
        _mm256_store_ps(dst + c, int4_w8(wr + c / 8, s, s, 0));
    }
}

A256 void kern_x86_int4_avx2(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols,
                             const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    ST_ASSERT(cols % KERN_INT4_GROUP == 0);
    if (T == 1) {
        const int64_t rs = (r1 - r0) / 4, rb = cols / 2, pf = fp4_pf_rows(rb) * rb;
        int64_t r = r0;
        const int64_t ng = cols / KERN_INT4_GROUP;
        const int fast = int4_all_fast(S + r0 * ng, (r1 - r0) * ng);
#define INT4_ROWS(F, XP)                                                                           \
    do {                                                                                           \
        for (r = r0; r < r0 + rs; r++) int4dec256(Y, Wp, S, cols, X, xp, r, rs, 4, pf, F, XP);     \
        for (r = r0 + 4 * rs; r < r1; r++) int4dec256(Y, Wp, S, cols, X, xp, r, 1, 1, rb, F, XP); \
    } while (0)
        if (cols <= XPRE_MAX && r1 - r0 >= 16) {
            float xp[XPRE_MAX] __attribute__((aligned(32)));
            xperm_fill(xp, X, cols, XO_EO);
            if (fast) INT4_ROWS(1, 1);
            else INT4_ROWS(0, 1);
        } else {
            const float *xp = NULL;
            if (fast) INT4_ROWS(1, 0);
            else INT4_ROWS(0, 0);
        }
#undef INT4_ROWS
        return;
    }
    float wt[2 * PAN_K] __attribute__((aligned(32)));
#define PREP_Q(rbn, k0, k1) for (int i_ = 0; i_ < (rbn); i_++) int4_widen256(wt + i_ * PAN_K, Wp, S, cols, r + i_, k0, (k1) - (k0))
    PANELS256(BLK_Q, PREP_Q)
#undef PREP_Q
#undef BLK_Q
}

/* ======================= AVX-512 ======================= */

/* The AVX2 decoders' arithmetic on zmm (decode; prefill is PANELS512 over the
 * AVX2 tile decoders, as drv512_wide does for bf16 / MXFP4), to the same
 * contract: tests/t_kern.c checks them bit for bit wherever the CPU has AVX-512
 * (an AMD EPYC Zen 4 VM, 2026-12-07).
 * FP8: one vcvtph2ps zmm per 16 weights (fp8_h16's words in element order, so no
 * lane relabelling), then h (256 S) or (256 h) S as fp8_widen256. */
A512 INL void fp8_span512(__m512 acc[4], const uint8_t *const wr[4], const __m512 sc[4], const __m512 pre[4],
                          const float *X, int64_t k, int64_t k1, int RB, int SLOW) {
    for (; k + 16 <= k1; k += 16) {
        const __m512 x = _mm512_loadu_ps(X + k);
        UNROLL for (int i = 0; i < RB; i++) {
            __m512 w = _mm512_cvtph_ps(fp8_h16(wr[i] + k));
            if (SLOW) w = _mm512_mul_ps(w, pre[i]);
            acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(w, sc[i]), x, acc[i]);
        }
    }
}

A512 INL void fp8dec512(float *Y, const uint8_t *W, const float *S, int64_t cols, const float *X, int64_t r,
                        int64_t rs, int RB, int64_t pf) {
    const int64_t nb = (cols + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK, full = cols & ~(int64_t)15;
    const uint8_t *wr[4];
    const float *sr[4];
    __m512 acc[4];
    UNROLL for (int i = 0; i < RB; i++) {
        wr[i] = W + (r + i * rs) * cols;
        sr[i] = S + ((r + i * rs) / KERN_FP8_BLOCK) * nb;
        acc[i] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b * KERN_FP8_BLOCK < full; b++) {
        const int64_t k0 = b * KERN_FP8_BLOCK, k1 = k0 + KERN_FP8_BLOCK < full ? k0 + KERN_FP8_BLOCK : full;
        float scs[4], pres[4];
        const int slow = fp8_block_scales(scs, pres, sr, wr, b, pf + k0, RB);
        __m512 sc[4], pre[4];
        UNROLL for (int i = 0; i < RB; i++) {
            sc[i] = _mm512_set1_ps(scs[i]);
            pre[i] = _mm512_set1_ps(pres[i]);
        }
        if (slow) fp8_span512(acc, wr, sc, pre, X, k0, k1, RB, 1);
        else fp8_span512(acc, wr, sc, pre, X, k0, k1, RB, 0);
    }
    if (full < cols) {
        const __mmask16 m = (__mmask16)((1u << (cols - full)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(m, X + full);
        UNROLL for (int i = 0; i < RB; i++) {
            float wt[16] = {0};
            for (int64_t k = full; k < cols; k++) wt[k - full] = kern_e4m3_f32(wr[i][k]) * sr[i][k / KERN_FP8_BLOCK];
            acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(wt), x, acc[i]);
        }
    }
    UNROLL for (int i = 0; i < RB; i++) Y[r + i * rs] = fp8_has_nan(wr[i], full) ? NAN : red512(acc[i]);
}

/* Prefill: PANELS512 over 4-row tiles decoded once (a function of its own, so
 * the decode path's stack stays small). */
#define BLK_Q(RB, TB, k0, k1, st, sts) blk512(NULL, 0, wt, DT_F32, PAN_K, X + (k0), ldx, 0, 1, t, RB, TB, 0, (k1) - (k0), st, sts)
A512 __attribute__((noinline)) static void fp8_wide512(float *Y, int64_t ldy, const uint8_t *W, const float *S,
                                                      int64_t cols, const float *X, int64_t ldx, int64_t T, int64_t r0,
                                                      int64_t r1) {
    float wt[4 * PAN_K] __attribute__((aligned(64)));
#define PREP_Q(rbn, k0, k1) for (int i_ = 0; i_ < (rbn); i_++) fp8_widen256(wt + i_ * PAN_K, W, S, cols, r + i_, k0, (k1) - (k0))
    PANELS512(BLK_Q, PREP_Q)
#undef PREP_Q
}

A512 __attribute__((noinline)) static void int4_wide512(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S,
                                                       int64_t cols, const float *X, int64_t ldx, int64_t T, int64_t r0,
                                                       int64_t r1) {
    float wt[4 * PAN_K] __attribute__((aligned(64)));
#define PREP_Q(rbn, k0, k1) for (int i_ = 0; i_ < (rbn); i_++) int4_widen256(wt + i_ * PAN_K, Wp, S, cols, r + i_, k0, (k1) - (k0))
    PANELS512(BLK_Q, PREP_Q)
#undef PREP_Q
}
#undef BLK_Q

A512 void kern_x86_fp8_avx512_decode(float *Y, const uint8_t *W, const float *S, int64_t cols, const float *X,
                                     int64_t r0, int64_t r1) {
    const int64_t rs = (r1 - r0) / 4, pf = fp4_pf_rows(cols) * cols;
    int64_t r = r0;
    for (; r < r0 + rs; r++) fp8dec512(Y, W, S, cols, X, r, rs, 4, pf);
    for (r = r0 + 4 * rs; r < r1; r++) fp8dec512(Y, W, S, cols, X, r, 1, 1, cols);
}

/* Decode: where the AVX2 decoder takes the bit patterns (AMD), it, else the zmm
 * f16 decoder above. AMD EPYC (Zen 4) VM, `b_kern --quant`, 3 runs: patterns
 * 16.6-17.0 G weights/s on 1 thread and 29.1-31.7 on 2 (63-65% / 81-87% of the
 * probe), the zmm decoder 12.9-13.2 and 24.7-25.6 (49-51% / 68-70%); in L2
 * 18.4 vs 14.0 G/s. Prefill (T = 64, 2 threads): 169-171 GFLOP/s against the
 * AVX2 tiles' 109. */
A512 void kern_x86_fp8_avx512(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols, const float *X,
                              int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    if (T == 1 && fp8_use_patterns()) kern_x86_fp8_avx2_decode(Y, W, S, cols, X, r0, r1, 1);
    else if (T == 1) kern_x86_fp8_avx512_decode(Y, W, S, cols, X, r0, r1);
    else fp8_wide512(Y, ldy, W, S, cols, X, ldx, T, r0, r1);
}

/* INT4: the MXFP4 decoder (fp4dec512) with the group's LUT computed instead of
 * loaded: lut[c] = (float)(c - 8) * s, one vmulps per row and group, the
 * reference's products; the nibble packing is MXFP4's, so idx_s's lane
 * relabelling (x permuted once per call, accumulators back before the tree)
 * applies unchanged. */
A512 INL void int4dec512(float *Y, const int32_t *Wp, const uint16_t *S, int64_t cols, const float *xp, int64_t r,
                         int64_t rs, int RB, int64_t pf) {
    const __m512i sh = _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
    const __m512i inv = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512 qv = _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8); /* lane c: c - 8 */
    const int64_t ng = cols / KERN_INT4_GROUP;
    const uint8_t *pr[4];
    const uint16_t *sr[4];
    __m512 acc[4];
    UNROLL for (int i = 0; i < RB; i++) {
        pr[i] = (const uint8_t *)(Wp + (r + i * rs) * (cols / 8));
        sr[i] = S + (r + i * rs) * ng;
        acc[i] = _mm512_setzero_ps();
    }
#define INT4_LUT(i, g) _mm512_mul_ps(qv, _mm512_set1_ps(bf16f(sr[i][g])))
    LUTDEC512_WALK(INT4_LUT);
#undef INT4_LUT
}

A512 void kern_x86_int4_avx512(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols,
                               const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    ST_ASSERT(cols % KERN_INT4_GROUP == 0);
    if (T == 1 && cols <= XPRE_MAX) {
        float xp[XPRE_MAX] __attribute__((aligned(64)));
        const __m512i fwd = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
        for (int64_t k = 0; k < cols; k += 16) _mm512_store_ps(xp + k, _mm512_permutexvar_ps(fwd, _mm512_loadu_ps(X + k)));
        const int64_t rs = (r1 - r0) / 4, rb = cols / 2, pf = fp4_pf_rows(rb) * rb;
        int64_t r = r0;
        for (; r < r0 + rs; r++) int4dec512(Y, Wp, S, cols, xp, r, rs, 4, pf);
        for (r = r0 + 4 * rs; r < r1; r++) int4dec512(Y, Wp, S, cols, xp, r, 1, 1, rb);
        return;
    }
    if (T == 1) { kern_x86_int4_avx2(Y, ldy, Wp, S, cols, X, ldx, T, r0, r1); return; }
    int4_wide512(Y, ldy, Wp, S, cols, X, ldx, T, r0, r1);
}

#endif
