/*
 * kern.h: compute kernels. kern_ref.c holds the plain scalar reference of every op;
 * kern_x86.c (AVX2+FMA, AVX-512; FP8 / INT4 in kern_x86q.c, shared blocks in
 * kern_x86.h) and kern_neon.c (arm64) hold fast paths, picked once
 * by kern_init() into the table `K`. Kernels take (out, in..., dims), never allocate,
 * log or fail.
 *
 * Summation contract (why SIMD == scalar bit for bit): a dot product of length n
 * uses 16 f32 lane accumulators; element i goes to lane i % 16 via fmaf
 * (acc[l] = fmaf(w_i, x_i, acc[l])); lanes reduce by the fixed tree
 * b[l] = (a[l] + a[l+8]) for l < 8, c[l] = b[l] + b[l+4], d[l] = c[l] + c[l+2],
 * r = d[0] + d[1]. A tail (n % 16) is handled as if zero-padded to 16.
 * MXFP4 rows decode each weight exactly as E2M1[code] * 2^(scale-127) (in f32; a
 * power-of-two scaling is exact except overflow) and use the same lane contract.
 * FP8 rows (e4m3fn, DeepSeek-V3 / K2-Instruct) decode each weight as ONE f32
 * multiply w = kern_e4m3_f32(byte) * S[block] (round to nearest; the e4m3 value is
 * exact in f32), S the f32 scale of the weight's 128 x 128 block; a NaN byte or a
 * NaN scale gives NaN. INT4 rows (compressed-tensors pack-quantized, K2-Thinking /
 * K2.5) decode as w = (float)q * bf16(S[group]), q = nibble - 8, exact in f32 but
 * for overflow to inf. Both then use the same lane contract (a fast path may compute
 * the same product another way only where it is the same f32 for every input:
 * kern_x86q.c says how).
 * Every implementation (scalar, AVX2, AVX-512, NEON) therefore returns identical bits
 * (for NaN inputs the result is NaN everywhere, but the NaN payload may differ).
 */
/*
 * Speed notes for callers (measured on the 2-core Zen 5 dev VM, see bench/b_kern.c):
 * - Decode (T = 1) is memory-bound: the AVX-512 tables compute bf16 at ~30-37 G
 *   weights/s and MXFP4 at ~25-35 G weights/s per core from L2, far above DRAM, so
 *   split rows over threads with pool_for (contiguous ranges) and keep ranges large
 *   (thousands of rows); blocks are 4 rows, a range's last < 4 rows run singly.
 * - Prefill: pass all T activations in one call (the x86 tables walk 64-activation
 *   x 1024-column panels, so activations stay in L2); per-(row, t) bits equal the
 *   T = 1 result.
 * - One dot is one FMA chain per register (the contract fixes the lanes), so K.dot
 *   tops out near 4 elements per cycle whatever the ISA. Many dots against the
 *   same vector (attention scores over cached keys) are a K.matmul with the keys as
 *   rows and the query as X: 4 rows per block run 4 chains at once.
 * - Kernels use up to 16 KB of stack (panel state) and never allocate.
 */
#ifndef STRATA_KERN_H
#define STRATA_KERN_H

#include <stddef.h>
#include <stdint.h>

typedef struct kern_table {
    const char *name; /* "scalar", "avx2", "avx512", "neon" */
    /* Y[t][r - r0 ... ] : for rows r in [r0, r1) and t in [0, T):
     *   Y[t * ldy + r] = dot(W row r, X[t * ldx ...]) with W (rows, cols) of dtype
     *   DT_F32 / DT_BF16 / DT_F16, row stride = cols elements. */
    void (*matmul)(float *Y, int64_t ldy, const void *W, int dtype, int64_t cols,
                   const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);
    /* The same for MXFP4: packed (rows, cols/2) bytes, scales (rows, cols/32). */
    void (*matmul_mxfp4)(float *Y, int64_t ldy, const uint8_t *packed, const uint8_t *scales,
                         int64_t cols, const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);
    /* FP8 e4m3fn with 128 x 128 block scales: W (rows, cols) bytes, row r at
     * W + r * cols; S the f32 grid (ceil(rows/128), ceil(cols/128)) row-major. Rows
     * are absolute indices into both (a caller with a row slice shifts W and S by
     * whole 128-row blocks, or passes the full tensor and its range). Any cols. */
    void (*matmul_fp8)(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols,
                       const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);
    /* INT4 pack-quantized, group 32: Wp (rows, cols/8) little-endian int32 words,
     * element 8j + i of a row in bits 4i..4i+3 of word j; S (rows, cols/32) bf16
     * bits. Requires cols % KERN_INT4_GROUP == 0 (asserted). */
    void (*matmul_int4)(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols,
                        const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);
    /* Plain f32 dot with the lane contract. */
    float (*dot)(const float *a, const float *b, int64_t n);
    /* g[i] = SiTU(g[i], u[i]) = b1 tanh(g/b1) sigmoid(g) * b2 tanh(u/b2) for i in
     * [0, n): the double-precision sequence of kern_ref_situ (kern_ref.c), one f32
     * rounding at the end; every table returns its bits. */
    void (*situ)(float *g, const float *u, int64_t n, float b1, float b2);
    /* y[i] = exp(x[i]) in double by the SiTU kernel's exp (argument clamped to
     * +-KERN_EXP_MAX, NaN kept) for i in [0, n); y may equal x. */
    void (*exp_f64)(double *y, const double *x, int64_t n);
    /* KDA delta rule, one head and one token, D = d_k = d_v:
     *   S = diag(alpha) S;  u = S^T k;  w = beta (v - u);  S += k w^T;  o = S^T q
     * S (D, D) f32 row-major, updated in place; u and o are sums over rows in row
     * order in double, w and S are f32 (kern_ref_kda_cols spells out each
     * rounding). Columns are independent, so fast paths may walk them in blocks. */
    void (*kda_step)(float *S, int64_t D, const float *k, const float *v, const float *q,
                     const float *alpha, float beta, float *o);
    /* y[r] += sum_i x[i] W[i][r] for r in [0, m): rows i = 0 .. n-1 in order, each
     * term an f32 product added in f32 (no fma), W rows ldw elements apart (dtype
     * F32 / BF16 / F16). Row-vector times matrix: MLA's absorbed q_lat = W_k^T q
     * and the attention's probability-weighted sum of cached latents. */
    void (*vecmat)(float *y, const float *x, const void *W, int dtype, int64_t ldw, int64_t n, int64_t m);
} kern_table;

/* MXFP4 group: one E8M0 scale byte per 32 inputs. matmul_mxfp4 requires
 * cols % KERN_MXFP4_GROUP == 0 (asserted). */
#define KERN_MXFP4_GROUP 32

/* The f32 factor 2^(s-127) of an E8M0 scale byte (s = 0 gives the subnormal 2^-127,
 * exact). Scale 255 (NaN in the MX spec, a checkpoint defect counted at load by
 * num_mxfp4_count_nan_scales) gives 0: the kernels zero the whole 32-group, as the
 * seed engine does, instead of spreading NaN through the residual stream.
 * LUT entry k_e2m1[c] * kern_e8m0_f32(s) is an exact f32 product (or inf on overflow:
 * scale 254 with |code| 6), which is how every table decodes weights. */
static inline float kern_e8m0_f32(uint8_t s) {
    union { uint32_t u; float f; } v;
    v.u = s == 0 ? 0x00400000u : s == 255 ? 0u : (uint32_t)s << 23;
    return v.f;
}
/* Each scale's whole 16-entry LUT, k_e2m1[c] * kern_e8m0_f32(s) (the same f32
 * products, folded at compile time; 16 KB, 64-byte aligned rows): every SIMD
 * decoder loads a group's LUT instead of multiplying it (AVX-512 the row, AVX2
 * prefill its first 8 entries, NEON bytes 2 and 3 of each entry, AVX2 decode
 * the same bytes from kern_x86_fp4_bf16; see kern_x86.c and kern_neon.c). */
extern const float kern_fp4_lut[256][16];

/* FP8 scale blocks are 128 x 128 weights; INT4 groups 32 inputs. */
#define KERN_FP8_BLOCK 128
#define KERN_INT4_GROUP 32

/* The value of an e4m3fn byte, exactly (every e4m3 value is an f32): sign, 4
 * exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m * 2^-9), no
 * infinities, S.1111.111 is NaN. The references decode with it; kern_e4m3_lut holds
 * its 256 values (tests/t_kern.c checks they agree) for callers that widen FP8
 * outside the matmuls. The SIMD matmuls decode arithmetically instead (an e4m3
 * byte is an f16 pattern times 256, or shifted and masked an f32 pattern times
 * 2^120: kern_x86q.c), a few ops per 16 weights where a 256-entry table would
 * need a gather. */
static inline float kern_e4m3_f32(uint8_t b) {
    union { uint32_t u; float f; } v;
    const uint32_t s = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) v.u = s | 0x7FC00000u;
    else if (e) v.u = s | (e + 120) << 23 | m << 20;
    else {
        const float f = (float)m * 0x1p-9f;
        return s ? -f : f;
    }
    return v.f;
}
extern const float kern_e4m3_lut[256];

/* INT4 weight i of a row: q = nibble - 8 of word i / 8, times the bf16 scale s as
 * one f32 multiply (exact: |q| <= 8 has 4 significant bits, s 8). */
static inline float kern_int4_f32(const int32_t *row, int64_t i, uint16_t s) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)s << 16;
    const int q = (int)(((uint32_t)row[i / 8] >> (4 * (i % 8))) & 15) - 8;
    return (float)q * v.f;
}

#if defined(__x86_64__)
extern const kern_table kern_avx2_table;   /* AVX2 + FMA + F16C */
extern const kern_table kern_avx512_table; /* AVX-512 F/BW/VL */
extern const kern_table kern_avx512vbmi_table; /* same paths as avx512 (name kept) */
int kern_x86_has_avx2(void);               /* CPU and OS support, for kern.c */
int kern_x86_has_avx512(void);
int kern_x86_has_avx512vbmi(void);
/* The AVX2 FP8 decode (T = 1, Y indexed by row) with its decoder chosen: pat 1
 * the f32 bit patterns (what AMD CPUs run), 0 the f16 conversion (the others);
 * matmul_fp8 picks by vendor. For tests, which run both. */
void kern_x86_fp8_avx2_decode(float *Y, const uint8_t *W, const float *S, int64_t cols, const float *X,
                              int64_t r0, int64_t r1, int pat);
/* The zmm FP8 decode (T = 1), what AVX-512 CPUs other than AMD's run; for tests. */
void kern_x86_fp8_avx512_decode(float *Y, const uint8_t *W, const float *S, int64_t cols, const float *X,
                                int64_t r0, int64_t r1);
/* AVX2 MXFP4 decode's tables (kern_x86.c): row s the low then the high bytes of
 * the top 16 bits of kern_fp4_lut[s][0..15] (the rest of each f32 is zero). */
extern const uint8_t kern_x86_fp4_bf16[256][32];
#endif
#if defined(__aarch64__)
extern const kern_table kern_neon_table;
#endif
/* Tables in kern_available() order (best first): avx512vbmi, avx512, avx2 | neon,
 * then scalar. */

/* The SiTU reference, shared by the tables for their tails. Its exp/expm1 use
 * these constants (a round-to-nearest shifter, ln2 split in two, 1/n! for the
 * degree-13 Taylor polynomial of expm1 on |r| <= ln2/2, c13 then c12 .. c2 by
 * Horner) and clamps: */
void kern_ref_situ(float *g, const float *u, int64_t n, float b1, float b2);
void kern_ref_exp_f64(double *y, const double *x, int64_t n);
/* The FP8 and INT4 references (tables without a fast path use them). */
void kern_ref_matmul_fp8(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols,
                         const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);
void kern_ref_matmul_int4(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols,
                          const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1);
/* vecmat on columns [r0, r1) only. */
void kern_ref_vecmat_cols(float *y, const float *x, const void *W, int dtype, int64_t ldw, int64_t n,
                          int64_t r0, int64_t r1);
/* The delta rule on columns [j0, j1) of S only (kda_step is j0 = 0, j1 = D). */
void kern_ref_kda_cols(float *S, int64_t D, const float *k, const float *v, const float *q,
                       const float *alpha, float beta, float *o, int64_t j0, int64_t j1);
#define KERN_SHIFTER 0x1.8p52                 /* x + it - it rounds x to an integer */
#define KERN_INV_LN2 0x1.71547652b82fep0
#define KERN_LN2_HI 0x1.62e42fefa39efp-1
#define KERN_LN2_LO 0x1.abc9e3b39803fp-56
#define KERN_EXPM1_MIN -40.0                  /* expm1 below is -1 in double */
#define KERN_EXP_MAX 708.0                    /* |exp argument| clamp: 2^k stays normal */
#define KERN_EXPM1_C13 (1.0 / 6227020800.0)
#define KERN_EXPM1_TAYLOR(X) X(1.0 / 479001600.0) X(1.0 / 39916800.0) X(1.0 / 3628800.0) X(1.0 / 362880.0) \
    X(1.0 / 40320.0) X(1.0 / 5040.0) X(1.0 / 720.0) X(1.0 / 120.0) X(1.0 / 24.0) X(1.0 / 6.0) X(1.0 / 2.0)

extern kern_table K;                      /* the selected table (scalar until kern_init) */
extern const kern_table kern_ref_table;   /* always available */
/* Picks the best table this CPU supports; `force` ("scalar", "avx2", ...) or NULL.
 * STRATA_KERNEL env var overrides (for tests and A/B). Returns the chosen name. */
const char *kern_init(const char *force);
/* All tables usable on this CPU, for tests (NULL-terminated). */
const kern_table *const *kern_available(void);

#endif
