/*
 * kern.c: kernel table selection. kern_init() picks the best table this CPU
 * supports once at startup and copies it into K; STRATA_KERNEL overrides it for
 * tests and A/B runs. Every table obeys kern.h's summation contract, so the choice
 * changes speed only, never output bits.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "kern.h"

kern_table K = {
    .name = "scalar", .matmul = NULL, .matmul_mxfp4 = NULL, .matmul_fp8 = NULL, .matmul_int4 = NULL, .dot = NULL, .situ = NULL, .exp_f64 = NULL, .kda_step = NULL, .vecmat = NULL,
};

/* 2^(s-127) built from exact double powers of two at compile time; 255 -> 0. */
#define E8M0_P(s) ((((s) & 1) ? 0x1p1 : 1.0) * (((s) & 2) ? 0x1p2 : 1.0) * (((s) & 4) ? 0x1p4 : 1.0) * \
                   (((s) & 8) ? 0x1p8 : 1.0) * (((s) & 16) ? 0x1p16 : 1.0) * \
                   (((s) & 32) ? 0x1p32 : 1.0) * (((s) & 64) ? 0x1p64 : 1.0) * \
                   (((s) & 128) ? 0x1p128 : 1.0))
#define E8M0(s) ((s) == 255 ? 0.0f : (float)(0x1p-127 * E8M0_P(s)))

/* kern_fp4_lut[s][c] = k_e2m1[c] * 2^(s-127), folded by the compiler as the f32
 * product the kernels computed per row and group (exact, or inf at scale 254). */
#define FP4L(s, c) ((float)(c) * E8M0(s))
#define FP4L_ROW(s) {FP4L(s, 0.0f), FP4L(s, 0.5f), FP4L(s, 1.0f), FP4L(s, 1.5f), FP4L(s, 2.0f), \
                     FP4L(s, 3.0f), FP4L(s, 4.0f), FP4L(s, 6.0f), FP4L(s, -0.0f), FP4L(s, -0.5f), \
                     FP4L(s, -1.0f), FP4L(s, -1.5f), FP4L(s, -2.0f), FP4L(s, -3.0f), FP4L(s, -4.0f), FP4L(s, -6.0f)}
#define FP4L_4(s) FP4L_ROW(s), FP4L_ROW((s) + 1), FP4L_ROW((s) + 2), FP4L_ROW((s) + 3)
#define FP4L_16(s) FP4L_4(s), FP4L_4((s) + 4), FP4L_4((s) + 8), FP4L_4((s) + 12)
#define FP4L_64(s) FP4L_16(s), FP4L_16((s) + 16), FP4L_16((s) + 32), FP4L_16((s) + 48)
_Alignas(64) const float kern_fp4_lut[256][16] = {FP4L_64(0), FP4L_64(64), FP4L_64(128), FP4L_64(192)};

/* kern_e4m3_lut[b] = kern_e4m3_f32(b), folded at compile time from exact double
 * powers of two: (8 + m) 2^(e-10) for exponent e >= 1, m 2^-9 for e = 0, NaN for
 * S.1111.111 (sign of the NaN not kept). */
#define E4P(e) ((((e) & 1) ? 2.0 : 1.0) * (((e) & 2) ? 4.0 : 1.0) * (((e) & 4) ? 16.0 : 1.0) * (((e) & 8) ? 256.0 : 1.0))
#define E4M(b) (((b) & 0x78) ? (8 + ((b) & 7)) * E4P(((b) >> 3) & 15) * 0x1p-10 : ((b) & 7) * 0x1p-9)
#define E4(b) ((((b) & 0x7F) == 0x7F) ? NAN : (float)(((b) & 0x80) ? -E4M(b) : E4M(b)))
#define E4_4(b) E4(b), E4((b) + 1), E4((b) + 2), E4((b) + 3)
#define E4_16(b) E4_4(b), E4_4((b) + 4), E4_4((b) + 8), E4_4((b) + 12)
#define E4_64(b) E4_16(b), E4_16((b) + 16), E4_16((b) + 32), E4_16((b) + 48)
_Alignas(64) const float kern_e4m3_lut[256] = {E4_64(0), E4_64(64), E4_64(128), E4_64(192)};

typedef struct { const kern_table *t; int (*supported)(void); } kern_cand;

static int cand_always(void) { return 1; }

/* Best first. */
static const kern_cand k_cands[] = {
#if defined(__x86_64__)
    {&kern_avx512vbmi_table, kern_x86_has_avx512vbmi},
    {&kern_avx512_table, kern_x86_has_avx512},
    {&kern_avx2_table, kern_x86_has_avx2},
#endif
#if defined(__aarch64__)
    {&kern_neon_table, cand_always}, /* Advanced SIMD is mandatory on arm64 */
#endif
    {&kern_ref_table, cand_always},
};
#define N_CANDS (sizeof k_cands / sizeof k_cands[0])

static const kern_table *g_avail[N_CANDS + 1];
static pthread_once_t g_avail_once = PTHREAD_ONCE_INIT;

static void avail_build(void) {
    size_t n = 0;
    for (size_t i = 0; i < N_CANDS; i++)
        if (k_cands[i].supported()) g_avail[n++] = k_cands[i].t;
    g_avail[n] = NULL;
}

const kern_table *const *kern_available(void) {
    pthread_once(&g_avail_once, avail_build);
    return g_avail;
}

static const kern_table *find_name(const char *name) {
    for (size_t i = 0; i < N_CANDS; i++)
        if (!strcmp(k_cands[i].t->name, name)) return k_cands[i].t;
    return NULL;
}

const char *kern_init(const char *force) {
    const kern_table *const *av = kern_available();
    const kern_table *pick = av[0]; /* best supported */
    const char *env = getenv("STRATA_KERNEL");
    const char *want = env && *env ? env : force;
    if (want) {
        const kern_table *t = find_name(want);
        int ok = 0;
        for (size_t i = 0; t && av[i]; i++) ok |= av[i] == t;
        if (ok) pick = t;
        else LOGW("kernel table '%s' is %s on this CPU; using '%s'", want,
                  t ? "not supported" : "unknown", pick->name);
    }
    K = *pick;
    return K.name;
}

/* K starts as the scalar table so a caller that forgets kern_init still computes. */
__attribute__((constructor)) static void kern_default(void) { K = kern_ref_table; }
