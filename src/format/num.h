/*
 * num.h: numeric formats. bf16/f16 <-> f32 with round-to-nearest-even (NaN stays
 * NaN, quiet), and MXFP4 (OCP MX FP4: E2M1 codes, two per byte, LOW nibble = even
 * element; one E8M0 scale byte per 32 inputs, value = E2M1[code] * 2^(scale-127);
 * scale 255 is NaN in the MX spec and is reported as a checkpoint defect).
 */
#ifndef STRATA_NUM_H
#define STRATA_NUM_H

#include <stddef.h>
#include <stdint.h>

extern const float k_e2m1[16]; /* 0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ..., -6 */

float num_bf16_to_f32(uint16_t h);
uint16_t num_f32_to_bf16(float f);   /* RNE */
float num_f16_to_f32(uint16_t h);
uint16_t num_f32_to_f16(float f);    /* RNE, overflow -> inf */
/* Exact value of one MXFP4 element as a double (scale 254 with code 6 exceeds
 * float range). Scale 255 returns NaN. */
double num_mxfp4_value(uint8_t code, uint8_t scale);
/* Element i of a packed row. */
static inline uint8_t num_mxfp4_code(const uint8_t *packed, size_t i) {
    return (uint8_t)((packed[i >> 1] >> ((i & 1) * 4)) & 0xF);
}
/* The nearest MXFP4 encoding of n f32 values (n % 32 == 0) into packed (n / 2
 * bytes) and scales (n / 32): each group's scale is the smallest 2^(s-127),
 * s in 0 .. 254, with max |x| <= 6 * 2^(s-127) (non-finite values left out of
 * the max), each code the E2M1 value nearest x / 2^(s-127) (ties to the smaller
 * magnitude); NaN encodes as 0, +-inf as +-6. A lossy copy for estimates only
 * (the early expert guesses' routers): nothing exact is ever computed from it. */
void num_mxfp4_quantize(uint8_t *packed, uint8_t *scales, const float *x, size_t n);
/* Counts scale bytes == 255 in a scale array (the checkpoint defect). */
size_t num_mxfp4_count_nan_scales(const uint8_t *scales, size_t n);
/* Converts n values of dtype (DT_F32/DT_BF16/DT_F16) to f32. */
void num_to_f32(float *dst, const void *src, int dtype, size_t n);

#endif
