/*
 * kern_ref.c: the scalar reference of every kernel: kern.h's summation contract
 * written plainly (16 lane accumulators, element i -> lane i % 16 by fmaf, tail as
 * zero padding, fixed reduction tree). The SIMD tables must match it bit for bit;
 * tests/t_kern.c compares them with memcmp.
 */
#include <math.h>
#include <string.h>
#include "base.h"
#include "kern.h"
#include "num.h"
#include "st.h"

/* The fixed tree of kern.h: halves, quarters, eighths, then the last pair. */
static float ref_reduce16(const float a[16]) {
    float b[8], c[4], d[2];
    for (int l = 0; l < 8; l++) b[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) c[l] = b[l] + b[l + 4];
    for (int l = 0; l < 2; l++) d[l] = c[l] + c[l + 2];
    return d[0] + d[1];
}

static float ref_load(const void *W, int dtype, int64_t i) {
    switch (dtype) {
    case DT_F32: return ((const float *)W)[i];
    case DT_BF16: return num_bf16_to_f32(((const uint16_t *)W)[i]);
    default: return num_f16_to_f32(((const uint16_t *)W)[i]);
    }
}

static void ref_matmul(float *Y, int64_t ldy, const void *W, int dtype, int64_t cols,
                       const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    ST_ASSERT(dtype == DT_F32 || dtype == DT_BF16 || dtype == DT_F16);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < T; t++) {
            float acc[16] = {0};
            const float *x = X + t * ldx;
            for (int64_t base = 0; base < cols; base += 16)
                for (int l = 0; l < 16; l++) {
                    int64_t i = base + l;
                    float w = i < cols ? ref_load(W, dtype, r * cols + i) : 0.0f;
                    float xv = i < cols ? x[i] : 0.0f;
                    acc[l] = fmaf(w, xv, acc[l]);
                }
            Y[t * ldy + r] = ref_reduce16(acc);
        }
}

static void ref_matmul_mxfp4(float *Y, int64_t ldy, const uint8_t *packed,
                             const uint8_t *scales, int64_t cols, const float *X, int64_t ldx,
                             int64_t T, int64_t r0, int64_t r1) {
    ST_ASSERT(cols % KERN_MXFP4_GROUP == 0);
    const int64_t ng = cols / KERN_MXFP4_GROUP;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < T; t++) {
            float acc[16] = {0};
            const float *x = X + t * ldx;
            const uint8_t *prow = packed + r * (cols / 2);
            for (int64_t g = 0; g < ng; g++) {
                float sf = kern_e8m0_f32(scales[r * ng + g]);
                for (int k = 0; k < KERN_MXFP4_GROUP; k++) {
                    int64_t i = g * KERN_MXFP4_GROUP + k;
                    float w = k_e2m1[num_mxfp4_code(prow, (size_t)i)] * sf;
                    acc[i % 16] = fmaf(w, x[i], acc[i % 16]);
                }
            }
            Y[t * ldy + r] = ref_reduce16(acc);
        }
}

/* FP8: element i of row r is kern_e4m3_f32(W[r][i]) * S[r / 128][i / 128], one
 * f32 multiply; the tail is padded like ref_matmul's. */
void kern_ref_matmul_fp8(float *Y, int64_t ldy, const uint8_t *W, const float *S, int64_t cols,
                         const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    const int64_t nb = (cols + KERN_FP8_BLOCK - 1) / KERN_FP8_BLOCK;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < T; t++) {
            float acc[16] = {0};
            const float *x = X + t * ldx, *srow = S + (r / KERN_FP8_BLOCK) * nb;
            for (int64_t base = 0; base < cols; base += 16)
                for (int l = 0; l < 16; l++) {
                    const int64_t i = base + l;
                    const float w = i < cols ? kern_e4m3_f32(W[r * cols + i]) * srow[i / KERN_FP8_BLOCK] : 0.0f;
                    acc[l] = fmaf(w, i < cols ? x[i] : 0.0f, acc[l]);
                }
            Y[t * ldy + r] = ref_reduce16(acc);
        }
}

/* INT4: element i of row r is kern_int4_f32 (q times the bf16 group scale). */
void kern_ref_matmul_int4(float *Y, int64_t ldy, const int32_t *Wp, const uint16_t *S, int64_t cols,
                          const float *X, int64_t ldx, int64_t T, int64_t r0, int64_t r1) {
    ST_ASSERT(cols % KERN_INT4_GROUP == 0);
    const int64_t ng = cols / KERN_INT4_GROUP;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < T; t++) {
            float acc[16] = {0};
            const float *x = X + t * ldx;
            for (int64_t i = 0; i < cols; i++)
                acc[i % 16] = fmaf(kern_int4_f32(Wp + r * (cols / 8), i, S[r * ng + i / KERN_INT4_GROUP]), x[i], acc[i % 16]);
            Y[t * ldy + r] = ref_reduce16(acc);
        }
}

static float ref_dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    for (int64_t base = 0; base < n; base += 16)
        for (int l = 0; l < 16; l++) {
            int64_t i = base + l;
            acc[l] = fmaf(i < n ? a[i] : 0.0f, i < n ? b[i] : 0.0f, acc[l]);
        }
    return ref_reduce16(acc);
}

/* SiTU in double without libm's scalar tanh/exp (40-60 ns per element there, a
 * tenth of a demo decode): exp(z) and expm1(z) = exp(z) - 1 share the reduction
 * z = k ln2 + r, |r| <= ln2/2, and the Taylor polynomial p = expm1(r) of degree
 * 13 (truncation below 2e-17 relative); then expm1(z) = 2^k p + (2^k - 1) and
 * exp(z) = 2^k p + 2^k, each one fma. With m = expm1(-2|y|), tanh(|y|) =
 * -m / (2 + m) keeps full relative precision near 0. The whole SiTU is then one
 * quotient: |b1 b2 m1 m2 / ((2 + m1)(2 + m2)(1 + exp(-g)))|, the sign of g u
 * applied after the f32 rounding. Double error ~1e-16 relative, so the f32
 * result is the correctly rounded one but for rare near-ties (the libm version
 * it replaces rounded the same way). The SIMD tables run this exact sequence. */
static double ref_exp_parts(double z, double *p) {
    double t = z * KERN_INV_LN2 + KERN_SHIFTER, kd = t - KERN_SHIFTER;
    double r = fma(-kd, KERN_LN2_HI, z);
    r = fma(-kd, KERN_LN2_LO, r);
    double q = KERN_EXPM1_C13;
#define HORNER(c) q = fma(q, r, c);
    KERN_EXPM1_TAYLOR(HORNER)
#undef HORNER
    *p = fma(q, r * r, r);
    uint64_t b = (uint64_t)((int64_t)kd + 1023) << 52;
    double s;
    memcpy(&s, &b, 8);
    return s;
}

void kern_ref_situ(float *g, const float *u, int64_t n, float b1, float b2) {
    const double k1 = -2.0 / (double)b1, k2 = -2.0 / (double)b2, b12 = (double)b1 * (double)b2;
    for (int64_t i = 0; i < n; i++) {
        const double gd = g[i], ud = u[i];
        double a1 = fabs(gd) * k1, a2 = fabs(ud) * k2, z = -gd, p1, p2, pe;
        a1 = a1 < KERN_EXPM1_MIN ? KERN_EXPM1_MIN : a1;
        a2 = a2 < KERN_EXPM1_MIN ? KERN_EXPM1_MIN : a2;
        z = z > KERN_EXP_MAX ? KERN_EXP_MAX : z;
        z = z < -KERN_EXP_MAX ? -KERN_EXP_MAX : z;
        const double s1 = ref_exp_parts(a1, &p1), s2 = ref_exp_parts(a2, &p2), se = ref_exp_parts(z, &pe);
        const double m1 = fma(s1, p1, s1 - 1.0), m2 = fma(s2, p2, s2 - 1.0), e = fma(se, pe, se);
        const double num = (m1 * m2) * b12, den = ((2.0 + m1) * (2.0 + m2)) * (1.0 + e);
        float r = (float)fabs(num / den); /* m1 m2 may be -0 */
        if (!signbit(g[i]) != !signbit(u[i])) r = -r;
        g[i] = r;
    }
}

void kern_ref_exp_f64(double *y, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double z = x[i], p;
        z = z > KERN_EXP_MAX ? KERN_EXP_MAX : z;
        z = z < -KERN_EXP_MAX ? -KERN_EXP_MAX : z;
        const double s = ref_exp_parts(z, &p);
        y[i] = fma(s, p, s);
    }
}

/* Column j's whole update: S[.][j] *= alpha, u = sum_i S[i][j] k[i] (double, rows
 * in order, product then sum), w = (float)(beta (v[j] - u)), S[.][j] += k w (f32
 * product then sum), o[j] = (float) sum_i S[i][j] q[i] (double, as u). */
void kern_ref_kda_cols(float *S, int64_t D, const float *k, const float *v, const float *q,
                       const float *alpha, float beta, float *o, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; j++) {
        double u = 0, od = 0;
        for (int64_t i = 0; i < D; i++) {
            float *s = S + i * D + j;
            *s *= alpha[i];
            u += (double)*s * (double)k[i];
        }
        const float w = (float)((double)beta * ((double)v[j] - u));
        for (int64_t i = 0; i < D; i++) {
            float *s = S + i * D + j;
            *s += k[i] * w;
            od += (double)*s * (double)q[i];
        }
        o[j] = (float)od;
    }
}

void kern_ref_vecmat_cols(float *y, const float *x, const void *W, int dtype, int64_t ldw, int64_t n,
                          int64_t r0, int64_t r1) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = r0; r < r1; r++) y[r] += x[i] * ref_load(W, dtype, i * ldw + r);
}

static void ref_vecmat(float *y, const float *x, const void *W, int dtype, int64_t ldw, int64_t n, int64_t m) {
    kern_ref_vecmat_cols(y, x, W, dtype, ldw, n, 0, m);
}

static void ref_kda_step(float *S, int64_t D, const float *k, const float *v, const float *q,
                         const float *alpha, float beta, float *o) {
    kern_ref_kda_cols(S, D, k, v, q, alpha, beta, o, 0, D);
}

const kern_table kern_ref_table = {
    .name = "scalar",
    .matmul = ref_matmul,
    .matmul_mxfp4 = ref_matmul_mxfp4,
    .matmul_fp8 = kern_ref_matmul_fp8,
    .matmul_int4 = kern_ref_matmul_int4,
    .dot = ref_dot,
    .situ = kern_ref_situ,
    .exp_f64 = kern_ref_exp_f64,
    .kda_step = ref_kda_step,
    .vecmat = ref_vecmat,
};
