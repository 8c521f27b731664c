/*
 * kern_ref.c: the scalar reference of every kernel: kern.h's summation contract
 * written plainly (16 lane accumulators, element i -> lane i % 16 by fmaf, tail as
 * zero padding, fixed reduction tree). The SIMD tables must match it bit for bit;
 * tests/t_kern.c compares them with memcmp.
 */
#include <math.h>
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

static float ref_dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    for (int64_t base = 0; base < n; base += 16)
        for (int l = 0; l < 16; l++) {
            int64_t i = base + l;
            acc[l] = fmaf(i < n ? a[i] : 0.0f, i < n ? b[i] : 0.0f, acc[l]);
        }
    return ref_reduce16(acc);
}

const kern_table kern_ref_table = {
    .name = "scalar",
    .matmul = ref_matmul,
    .matmul_mxfp4 = ref_matmul_mxfp4,
    .dot = ref_dot,
};
