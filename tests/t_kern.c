/* t_kern.c: every kernel table in kern_available() must be bit-identical to the
 * scalar reference (memcmp) over odd sizes, tails, sub-ranges and T = 1/3/8, on
 * data with negative zeros, subnormal products and wide magnitudes; the reference
 * itself is checked against a float64 dot with a rounding-error bound. */
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include "kern.h"
#include "num.h"
#include "st.h"
#include "test.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng >> 12; g_rng ^= g_rng << 25; g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545F4914F6CDD1Dull) >> 32);
}

/* A value with a random sign and exponent in [-emax, emax], some exact zeros of
 * either sign and some tiny ones (products underflow to subnormals or zero). */
static float rnd_val(int emax) {
    uint32_t k = rnd() % 32;
    float sgn = (rnd() & 1) ? -1.0f : 1.0f;
    if (k == 0) return sgn * 0.0f;
    if (k == 1) return sgn * ldexpf(1.0f + (float)(rnd() % 1024) / 1024.0f, -70 - (int)(rnd() % 40));
    if (k == 2) return sgn * ldexpf(1.0f + (float)(rnd() % 1024) / 1024.0f, -127 - (int)(rnd() % 20)); /* f32 subnormal */
    float m = 1.0f + (float)(rnd() & 0xFFFFFF) * 0x1p-24f;
    return sgn * ldexpf(m, (int)(rnd() % (2 * emax + 1)) - emax);
}

/* Fills W (rows x cols) of dtype with finite values; returns them widened in wf. */
static void fill_w(void *W, float *wf, int dtype, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = rnd_val(dtype == DT_F16 ? 14 : 40);
        if (dtype == DT_F32) ((float *)W)[i] = v;
        else if (dtype == DT_BF16) ((uint16_t *)W)[i] = num_f32_to_bf16(v);
        else ((uint16_t *)W)[i] = num_f32_to_f16(v);
        if (dtype != DT_F32 && rnd() % 16 == 0) /* subnormal 16-bit patterns, either sign */
            ((uint16_t *)W)[i] = (uint16_t)(rnd() & (dtype == DT_F16 ? 0x83FFu : 0x807Fu));
    }
    num_to_f32(wf, W, dtype, (size_t)n);
}

/* |ref - exact| <= (n/16 + 5) u sum|w x| (each lane sums n/16 products by fma, then
 * four tree additions), plus a subnormal slack. */
static int ref_close(float got, const float *w, const float *x, int64_t n) {
    double exact = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) { exact += (double)w[i] * x[i]; mag += fabs((double)w[i] * x[i]); }
    double bound = ((double)n / 16 + 6) * 0x1p-24 * mag * 1.01 + 0x1p-120;
    return fabs((double)got - exact) <= bound;
}

static const int64_t k_cols[] = {1, 15, 16, 17, 33, 200, 1000};
static const int64_t k_T[] = {1, 3, 8};

/* Y cells inside (t < TT, r0 <= r < r1) equal Yref bit for bit (or, with
 * nan_ok, both NaN); the others still hold the 0x7F fill. */
static int same_range(const float *Y, const float *Yref, int64_t ldy, int64_t T, int64_t rows, int64_t TT,
                      int64_t r0, int64_t r1, int nan_ok) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) {
            uint32_t a, b;
            memcpy(&a, &Y[t * ldy + r], 4);
            memcpy(&b, &Yref[t * ldy + r], 4);
            const int inside = t < TT && r >= r0 && r < r1;
            const int both_nan = nan_ok && isnan(Y[t * ldy + r]) && isnan(Yref[t * ldy + r]);
            if (inside ? a != b && !both_nan : a != 0x7F7F7F7Fu) return 0;
        }
    return 1;
}

TEST(kern_matmul) {
    const kern_table *const *av = kern_available();
    CHECK(av[0] != NULL);
    int ntab = 0;
    while (av[ntab]) ntab++;
    for (int dtype = 0; dtype < 3; dtype++) {
        int dt = dtype == 0 ? DT_F32 : dtype == 1 ? DT_BF16 : DT_F16;
        for (size_t ci = 0; ci < sizeof k_cols / sizeof k_cols[0]; ci++) {
            int64_t cols = k_cols[ci], rows = 13 + (int64_t)(ci & 1) * 4, T = 8;
            int64_t ldx = cols + 3, ldy = rows + 5;
            void *W = base_alloc((size_t)(rows * cols) * 4, MEM_MISC);
            float *wf = base_alloc((size_t)(rows * cols) * 4, MEM_MISC);
            float *X = base_alloc((size_t)(T * ldx) * 4, MEM_MISC);
            float *Yref = base_alloc((size_t)(T * ldy) * 4, MEM_MISC);
            float *Y = base_alloc((size_t)(T * ldy) * 4, MEM_MISC);
            fill_w(W, wf, dt, rows * cols);
            for (int64_t i = 0; i < T * ldx; i++) X[i] = rnd_val(40);
            memset(Yref, 0x7F, (size_t)(T * ldy) * 4);
            kern_ref_table.matmul(Yref, ldy, W, dt, cols, X, ldx, T, 0, rows);
            int close = 1;
            for (int64_t t = 0; t < T; t++)
                for (int64_t r = 0; r < rows; r++)
                    close &= ref_close(Yref[t * ldy + r], wf + r * cols, X + t * ldx, cols);
            CHECK_MSG(close, "reference vs float64, dtype %d cols %lld", dt, (long long)cols);
            for (int k = 0; k < ntab; k++)
                for (size_t ti = 0; ti < sizeof k_T / sizeof k_T[0]; ti++) {
                    int64_t TT = k_T[ti];
                    /* a sub-range of rows with an odd start; untouched cells keep 0x7F */
                    int64_t r0 = 1 + (int64_t)ti, r1 = rows - (int64_t)ti;
                    memset(Y, 0x7F, (size_t)(T * ldy) * 4);
                    av[k]->matmul(Y, ldy, W, dt, cols, X, ldx, TT, r0, r1);
                    CHECK_MSG(same_range(Y, Yref, ldy, T, rows, TT, r0, r1, 0), "table %s dtype %d cols %lld T %lld not bit-identical",
                              av[k]->name, dt, (long long)cols, (long long)TT);
                }
            base_free(W); base_free(wf); base_free(X); base_free(Yref); base_free(Y);
        }
    }
}

TEST(kern_mxfp4) {
    const kern_table *const *av = kern_available();
    /* 8192: the widest decode row whose x is permuted once per call; 8224: past it */
    static const int64_t cols_l[] = {32, 64, 96, 224, 1024, 8192, 8224};
    for (size_t ci = 0; ci < sizeof cols_l / sizeof cols_l[0]; ci++) {
        int64_t cols = cols_l[ci], rows = 11, T = 8, ng = cols / 32;
        int64_t ldx = cols + 1, ldy = rows + 2;
        uint8_t *P = base_alloc((size_t)(rows * cols / 2), MEM_MISC);
        uint8_t *S = base_alloc((size_t)(rows * ng), MEM_MISC);
        float *wf = base_alloc((size_t)(rows * cols) * 4, MEM_MISC);
        float *X = base_alloc((size_t)(T * ldx) * 4, MEM_MISC);
        float *Yref = base_alloc((size_t)(T * ldy) * 4, MEM_MISC);
        float *Y = base_alloc((size_t)(T * ldy) * 4, MEM_MISC);
        for (int64_t i = 0; i < rows * cols / 2; i++) P[i] = (uint8_t)rnd();
        /* scales: mostly near 127, some 0 (subnormal LUT), some 255 (group zeroed) */
        for (int64_t i = 0; i < rows * ng; i++) {
            uint32_t k = rnd() % 16;
            S[i] = k == 0 ? 0 : k == 1 ? 255 : (uint8_t)(107 + rnd() % 40);
        }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < cols; i++) {
                uint8_t s = S[r * ng + i / 32];
                wf[r * cols + i] = s == 255 ? 0.0f : (float)num_mxfp4_value(num_mxfp4_code(P + r * cols / 2, (size_t)i), s);
            }
        for (int64_t i = 0; i < T * ldx; i++) X[i] = rnd_val(30);
        kern_ref_table.matmul_mxfp4(Yref, ldy, P, S, cols, X, ldx, T, 0, rows);
        int close = 1;
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < rows; r++)
                close &= ref_close(Yref[t * ldy + r], wf + r * cols, X + t * ldx, cols);
        CHECK_MSG(close, "mxfp4 reference vs float64, cols %lld", (long long)cols);
        for (int k = 0; av[k]; k++)
            for (size_t ti = 0; ti < sizeof k_T / sizeof k_T[0]; ti++) {
                int64_t TT = k_T[ti], r0 = (int64_t)ti, r1 = rows - 1;
                memset(Y, 0x7F, (size_t)(T * ldy) * 4);
                av[k]->matmul_mxfp4(Y, ldy, P, S, cols, X, ldx, TT, r0, r1);
                CHECK_MSG(same_range(Y, Yref, ldy, T, rows, TT, r0, r1, 0), "table %s mxfp4 cols %lld T %lld not bit-identical", av[k]->name,
                          (long long)cols, (long long)TT);
            }
        base_free(P); base_free(S); base_free(wf); base_free(X); base_free(Yref); base_free(Y);
    }
    /* a known row: codes 1..15 then 0 (x = 1), scale 128 (x2), then a zeroed group */
    uint8_t P[32], S[2] = {128, 255};
    float X[64], Y = 0;
    for (int i = 0; i < 32; i++) P[i] = (uint8_t)(((2 * i + 1) & 15) | (((2 * i + 2) & 15) << 4));
    for (int i = 0; i < 64; i++) X[i] = 1.0f;
    for (int k = 0; av[k]; k++) {
        av[k]->matmul_mxfp4(&Y, 1, P, S, 64, X, 64, 1, 0, 1);
        CHECK_MSG(Y == 0.0f, "%s: %g", av[k]->name, Y); /* positive and negative codes cancel */
    }
    X[0] = 3.0f; /* element 0 = code 1 = 0.5, x2 scale: +2 extra */
    for (int k = 0; av[k]; k++) {
        av[k]->matmul_mxfp4(&Y, 1, P, S, 64, X, 64, 1, 0, 1);
        CHECK_MSG(Y == 2.0f, "%s: %g", av[k]->name, Y);
    }
}

/* Every scale byte (subnormal 0, overflow to inf at 254 with codes +-6, zeroed
 * 255) and every code in every lane, decode (T = 1) and prefill blocks: each
 * table's bits are the scalar reference's (a NaN where it has one: inf - inf).
 * The AVX2 prefill decoder gets the sign from an xor that a pre-xored LUT
 * cancels, which must hold at inf and zero as well; AVX2 decode looks the bf16
 * bytes up (kern_mxfp4_bf16_table). */
TEST(kern_mxfp4_every_scale) {
    const kern_table *const *av = kern_available();
    enum { ROWS = 256, COLS = 64, T = 8 };
    static uint8_t P[ROWS * COLS / 2], S[ROWS * COLS / 32];
    static float X[T * COLS], Yref[T * ROWS], Y[T * ROWS];
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < COLS / 2; i++) P[r * COLS / 2 + i] = (uint8_t)(r + 17 * i + (i >> 3)); /* every code in every lane */
        S[r * 2] = S[r * 2 + 1] = (uint8_t)r;
    }
    for (int i = 0; i < T * COLS; i++) X[i] = rnd_val(8);
    for (int tt = 1; tt <= T; tt += T - 1) {
        kern_ref_table.matmul_mxfp4(Yref, ROWS, P, S, COLS, X, COLS, tt, 0, ROWS);
        for (int k = 0; av[k]; k++) {
            av[k]->matmul_mxfp4(Y, ROWS, P, S, COLS, X, COLS, tt, 0, ROWS);
            int bad = -1;
            for (int i = 0; i < tt * ROWS && bad < 0; i++) {
                uint32_t a, b;
                memcpy(&a, &Y[i], 4);
                memcpy(&b, &Yref[i], 4);
                if (a != b && !(Y[i] != Y[i] && Yref[i] != Yref[i])) bad = i;
            }
            CHECK_MSG(bad < 0, "table %s T %d: scale %d differs (%g vs %g)", av[k]->name, tt, bad % ROWS,
                      bad < 0 ? 0.0 : (double)Y[bad], bad < 0 ? 0.0 : (double)Yref[bad]);
        }
    }
}

/* The compile-time LUT table is the runtime product, bit for bit, at every scale
 * (subnormal, overflow to inf at 254, zeroed at 255) and code (-0 included). */
TEST(kern_fp4_lut) {
    for (int sc = 0; sc < 256; sc++)
        for (int c = 0; c < 16; c++) {
            float want = k_e2m1[c] * kern_e8m0_f32((uint8_t)sc), got = kern_fp4_lut[sc][c];
            uint32_t a, b;
            memcpy(&a, &want, 4);
            memcpy(&b, &got, 4);
            CHECK_MSG(a == b, "scale %d code %d: %08x, want %08x", sc, c, b, a);
        }
    CHECK(((uintptr_t)kern_fp4_lut & 63) == 0);
}

#if defined(__x86_64__)
/* AVX2 MXFP4 decode's byte tables are kern_fp4_lut's top 16 bits (low bytes,
 * then high bytes), and the bits below them are zero, at every scale and code. */
TEST(kern_mxfp4_bf16_table) {
    for (int sc = 0; sc < 256; sc++)
        for (int c = 0; c < 16; c++) {
            uint32_t u;
            memcpy(&u, &kern_fp4_lut[sc][c], 4);
            const uint32_t got = (uint32_t)kern_x86_fp4_bf16[sc][16 + c] << 24 | (uint32_t)kern_x86_fp4_bf16[sc][c] << 16;
            CHECK_MSG(got == u, "scale %d code %d: %08x, want %08x", sc, c, got, u);
        }
    CHECK(((uintptr_t)kern_x86_fp4_bf16 & 63) == 0);
}
#endif

/* MXFP4 decode (T = 1) ranges the suites above do not reach: 16 rows or more (x
 * permuted once per call) at and past the widest such row (XPRE_MAX = 8192
 * columns: 8224 permutes per 16 columns), a group count that leaves 1 after the
 * 4-group unroll (2080 columns), ranges that are no multiple of 4 and under 16
 * rows; scales anywhere in 0..255 with x of either sign. */
TEST(kern_mxfp4_decode_paths) {
    const kern_table *const *av = kern_available();
    static const int64_t cols_l[] = {8192, 8224, 2080};
    const int64_t rows = 41, ldy = rows + 1;
    float *Yref = base_alloc((size_t)ldy * 4, MEM_MISC), *Y = base_alloc((size_t)ldy * 4, MEM_MISC);
    for (size_t ci = 0; ci < sizeof cols_l / sizeof cols_l[0]; ci++) {
        const int64_t cols = cols_l[ci], ng = cols / 32;
        uint8_t *P = base_alloc((size_t)(rows * cols / 2), MEM_MISC), *S = base_alloc((size_t)(rows * ng), MEM_MISC);
        float *X = base_alloc((size_t)cols * 4, MEM_MISC);
        for (int64_t i = 0; i < rows * cols / 2; i++) P[i] = (uint8_t)rnd();
        for (int64_t i = 0; i < rows * ng; i++) S[i] = (uint8_t)(rnd() % 32 == 0 ? rnd() : 112 + rnd() % 24);
        for (int64_t i = 0; i < cols; i++) X[i] = rnd_val(20);
        kern_ref_table.matmul_mxfp4(Yref, ldy, P, S, cols, X, cols, 1, 0, rows);
        for (int k = 0; av[k]; k++)
            for (int rg = 0; rg < 4; rg++) {
                static const int64_t lo[] = {0, 3, 5, 40}, hi[] = {41, 41, 18, 41};
                memset(Y, 0x7F, (size_t)ldy * 4);
                av[k]->matmul_mxfp4(Y, ldy, P, S, cols, X, cols, 1, lo[rg], hi[rg]);
                CHECK_MSG(same_range(Y, Yref, ldy, 1, rows, 1, lo[rg], hi[rg], 1), "table %s mxfp4 cols %lld rows %lld-%lld",
                          av[k]->name, (long long)cols, (long long)lo[rg], (long long)hi[rg]);
            }
        base_free(P); base_free(S); base_free(X);
    }
    base_free(Yref); base_free(Y);
}

TEST(kern_dot) {
    const kern_table *const *av = kern_available();
    static const int64_t ns[] = {0, 1, 2, 15, 16, 17, 31, 33, 64, 200, 1000, 4099};
    float *a = base_alloc(4099 * 4, MEM_MISC), *b = base_alloc(4099 * 4, MEM_MISC);
    for (int i = 0; i < 4099; i++) { a[i] = rnd_val(40); b[i] = rnd_val(40); }
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        float r = kern_ref_table.dot(a, b, ns[k]);
        CHECK(ref_close(r, a, b, ns[k]));
        for (int j = 0; av[j]; j++) {
            float v = av[j]->dot(a + 1, b + 3, ns[k] > 4096 ? 4096 : ns[k]); /* unaligned */
            float w = kern_ref_table.dot(a + 1, b + 3, ns[k] > 4096 ? 4096 : ns[k]);
            CHECK_MSG(memcmp(&v, &w, 4) == 0, "%s dot n=%lld", av[j]->name, (long long)ns[k]);
        }
    }
    /* -0 accumulators meet the zero padding: every lane underflows to -0 in the first
     * chunk; with n = 17, lanes 1-15 are padded in the second, and fmaf(0, 0, -0) = +0
     * turns the result into +0 (an implementation that skips padding returns -0) */
    float m[17], o[17];
    for (int i = 0; i < 17; i++) { m[i] = -1e-30f; o[i] = 1e-30f; }
    CHECK(kern_ref_table.dot(m, o, 16) == 0.0f && signbit(kern_ref_table.dot(m, o, 16)));
    CHECK(kern_ref_table.dot(m, o, 17) == 0.0f && !signbit(kern_ref_table.dot(m, o, 17)));
    for (int j = 0; av[j]; j++) {
        float v = av[j]->dot(m, o, 17), w = kern_ref_table.dot(m, o, 17);
        CHECK_MSG(memcmp(&v, &w, 4) == 0, "%s -0 tail", av[j]->name);
        float y[2];
        av[j]->matmul(y, 1, m, DT_F32, 17, o, 17, 1, 0, 1);
        av[j]->matmul(y + 1, 1, m, DT_F32, 16, o, 16, 1, 0, 1);
        CHECK_MSG(!signbit(y[0]) && signbit(y[1]), "%s -0 tail (matmul)", av[j]->name);
    }
    base_free(a); base_free(b);
}

TEST(kern_select) {
    const char *env = getenv("STRATA_KERNEL");
    char saved[64] = {0};
    if (env) snprintf(saved, sizeof saved, "%s", env);
    unsetenv("STRATA_KERNEL");
    const kern_table saved_k = K; /* other suites keep whatever table was selected */
    const kern_table *const *av = kern_available();
    CHECK(strcmp(kern_init("scalar"), "scalar") == 0);
    CHECK(strcmp(kern_init(NULL), av[0]->name) == 0);        /* best first */
    base_log_level(LOG_ERROR);                                 /* expected warning */
    CHECK(strcmp(kern_init("no-such-isa"), av[0]->name) == 0);
    setenv("STRATA_KERNEL", "scalar", 1);
    CHECK(strcmp(kern_init(NULL), "scalar") == 0);
    base_log_level(LOG_WARN);
    if (saved[0]) setenv("STRATA_KERNEL", saved, 1);
    else unsetenv("STRATA_KERNEL");
    K = saved_k;
    CHECK(K.matmul && K.matmul_mxfp4 && K.dot);
}

/* Prefill shapes that cross the fast paths' panel boundaries (1024 columns, 64
 * activations): results must still equal the reference bit for bit. */
TEST(kern_prefill_panels) {
    const kern_table *const *av = kern_available();
    const int64_t rows = 6, T = 67, cols = 2080, ldx = cols + 16, ldy = rows;
    uint16_t *W = base_alloc((size_t)(rows * cols) * 2, MEM_MISC);
    float *wf = base_alloc((size_t)(rows * cols) * 4, MEM_MISC);
    uint8_t *P = base_alloc((size_t)(rows * cols / 2), MEM_MISC), S[6 * 65];
    float *X = base_alloc((size_t)(T * ldx) * 4, MEM_MISC);
    float *Yr = base_alloc((size_t)(T * ldy) * 4, MEM_MISC), *Y = base_alloc((size_t)(T * ldy) * 4, MEM_MISC);
    fill_w(W, wf, DT_BF16, rows * cols);
    for (int64_t i = 0; i < rows * cols / 2; i++) P[i] = (uint8_t)rnd();
    for (int i = 0; i < 6 * 65; i++) { /* some 0 (subnormal LUT) and 255 (group zeroed) */
        const uint32_t k = rnd() % 16;
        S[i] = k == 0 ? 0 : k == 1 ? 255 : (uint8_t)(110 + rnd() % 30);
    }
    for (int64_t i = 0; i < T * ldx; i++) X[i] = rnd_val(30);
    static const int64_t colsd[] = {2056, 2080};
    for (int c = 0; c < 4; c++) { /* bf16, then f16 (the same widened tiles) */
        const int dt = c < 2 ? DT_BF16 : DT_F16;
        if (c == 2) fill_w(W, wf, DT_F16, rows * cols);
        kern_ref_table.matmul(Yr, ldy, W, dt, colsd[c % 2], X, ldx, T, 0, rows);
        for (int k = 0; av[k]; k++) {
            memset(Y, 0, (size_t)(T * ldy) * 4);
            av[k]->matmul(Y, ldy, W, dt, colsd[c % 2], X, ldx, T, 0, rows);
            CHECK_MSG(memcmp(Y, Yr, (size_t)(T * ldy) * 4) == 0, "%s %s cols %lld", av[k]->name, dt == DT_BF16 ? "bf16" : "f16",
                      (long long)colsd[c % 2]);
        }
    }
    kern_ref_table.matmul_mxfp4(Yr, ldy, P, S, cols, X, ldx, T, 0, rows);
    for (int k = 0; av[k]; k++) {
        memset(Y, 0, (size_t)(T * ldy) * 4);
        av[k]->matmul_mxfp4(Y, ldy, P, S, cols, X, ldx, T, 0, rows);
        CHECK_MSG(memcmp(Y, Yr, (size_t)(T * ldy) * 4) == 0, "%s mxfp4 prefill", av[k]->name);
    }
    base_free(W); base_free(wf); base_free(P); base_free(X); base_free(Yr); base_free(Y);
}

/* SiTU: every table equals the reference bit for bit (tails, signed zeros, huge,
 * subnormal, infinite and NaN inputs), and the reference matches libm's double
 * tanh/exp formula to within one f32 ulp (almost always exactly). */
TEST(kern_situ) {
    const kern_table *const *av = kern_available();
    enum { N = 4099 };
    float *g = base_alloc(N * 4, MEM_MISC), *u = base_alloc(N * 4, MEM_MISC);
    float *r = base_alloc(N * 4, MEM_MISC), *y = base_alloc(N * 4, MEM_MISC);
    for (int i = 0; i < N; i++) {
        g[i] = rnd_val(i % 3 ? 4 : 40);
        u[i] = rnd_val(i % 5 ? 6 : 40);
    }
    static const float sp[] = {0.0f, -0.0f, 1e-30f, -1e-45f, 0x1p-149f, 3e38f, -3e38f, INFINITY, -INFINITY, 700.0f,
                               -709.0f, 1e-8f, -2.5f, 80.0f, -80.0f};
    const int nsp = (int)(sizeof sp / sizeof sp[0]);
    for (int i = 0; i < nsp * nsp; i++) { g[i] = sp[i % nsp]; u[i] = sp[i / nsp]; }
    g[nsp * nsp] = NAN;
    u[nsp * nsp + 1] = -NAN;
    memcpy(r, g, N * 4);
    kern_ref_situ(r, u, N, 4.0f, 25.0f);
    int exact = 0, close = 1, nan_ok = isnan(r[nsp * nsp]) && isnan(r[nsp * nsp + 1]);
    for (int i = 0; i < N; i++) {
        if (i == nsp * nsp || i == nsp * nsp + 1) continue;
        const double gd = g[i];
        const float want = (float)((4.0 * tanh(gd / 4.0) / (1.0 + exp(-gd))) * (25.0 * tanh((double)u[i] / 25.0)));
        if (memcmp(&want, &r[i], 4) == 0) { exact++; continue; }
        float up = nextafterf(want, INFINITY), dn = nextafterf(want, -INFINITY);
        if (r[i] != up && r[i] != dn && !(want == 0 && r[i] == 0)) {
            close = 0;
            CHECK_MSG(0, "situ(%g, %g) = %g, libm formula %g", g[i], u[i], r[i], want);
        }
    }
    CHECK(close && nan_ok);
    CHECK_MSG(exact >= N - 4, "only %d of %d equal to the libm formula", exact, N);
    static const int64_t ns[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 4096};
    for (int k = 0; av[k]; k++)
        for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
            memcpy(y, g, N * 4);
            av[k]->situ(y + 1, u + 2, ns[q], 4.0f, 25.0f); /* unaligned, offset inputs */
            memcpy(r, g, N * 4);
            kern_ref_situ(r + 1, u + 2, ns[q], 4.0f, 25.0f);
            int same = 1;
            for (int i = 0; i < N; i++) same &= memcmp(&y[i], &r[i], 4) == 0 || (isnan(y[i]) && isnan(r[i]));
            CHECK_MSG(same, "%s situ n=%lld", av[k]->name, (long long)ns[q]);
        }
    base_free(g); base_free(u); base_free(r); base_free(y);
}

/* exp_f64: within 2 ulp of libm's exp over the clamp range, the clamp itself, NaN
 * kept; every table equal to the reference bit for bit (tails, in place). */
TEST(kern_exp_f64) {
    const kern_table *const *av = kern_available();
    enum { N = 1037 };
    double *x = base_alloc(N * 8, MEM_MISC), *r = base_alloc(N * 8, MEM_MISC), *y = base_alloc(N * 8, MEM_MISC);
    for (int i = 0; i < N; i++) x[i] = ldexp((double)(int32_t)(rnd() - 0x80000000u), -31) * (i % 7 == 0 ? 700 : 20);
    x[0] = 0; x[1] = -0.0; x[2] = 1e-300; x[3] = 708; x[4] = -708; x[5] = 800; x[6] = -1e300; x[7] = NAN;
    kern_ref_exp_f64(r, x, N);
    int ok = 1;
    for (int i = 0; i < N; i++) {
        if (i == 7) { ok &= isnan(r[i]); continue; }
        double want = exp(x[i] > 708 ? 708 : x[i] < -708 ? -708 : x[i]);
        ok &= fabs(r[i] - want) <= 2 * (nextafter(want, INFINITY) - want);
    }
    CHECK_MSG(ok, "reference exp off by more than 2 ulp");
    static const int64_t ns[] = {0, 1, 3, 4, 5, 8, 9, 1037};
    for (int k = 0; av[k]; k++)
        for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
            memcpy(y, x, N * 8);
            av[k]->exp_f64(y, y, ns[q]);
            int same = 1;
            for (int64_t i = 0; i < ns[q]; i++) same &= memcmp(&y[i], &r[i], 8) == 0 || (isnan(y[i]) && isnan(r[i]));
            for (int64_t i = ns[q]; i < N; i++) same &= memcmp(&y[i], &x[i], 8) == 0 || isnan(x[i]);
            CHECK_MSG(same, "%s exp_f64 n=%lld", av[k]->name, (long long)ns[q]);
        }
    base_free(x); base_free(r); base_free(y);
}

/* kda_step: several steps on one state for head sizes with and without column
 * tails; every table keeps S and o equal to the reference bit for bit, and the
 * reference agrees with a float64 evaluation of the same recurrence. */
TEST(kern_kda_step) {
    const kern_table *const *av = kern_available();
    static const int64_t Ds[] = {1, 7, 16, 24, 40, 128};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) {
        const int64_t D = Ds[di];
        float *S0 = base_alloc((size_t)(D * D) * 4, MEM_MISC), *Sr = base_alloc((size_t)(D * D) * 4, MEM_MISC);
        float *St = base_alloc((size_t)(D * D) * 4, MEM_MISC);
        double *Sd = base_alloc((size_t)(D * D) * 8, MEM_MISC);
        float vec[5][128], orf[128], ot[128];
        for (int64_t i = 0; i < D * D; i++) { S0[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f; Sd[i] = S0[i]; }
        memcpy(Sr, S0, (size_t)(D * D) * 4);
        double worst = 0;
        for (int step = 0; step < 3; step++) {
            for (int a = 0; a < 4; a++)
                for (int64_t i = 0; i < D; i++) vec[a][i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
            for (int64_t i = 0; i < D; i++) vec[4][i] = 0.5f + (float)(rnd() % 500) * 1e-3f; /* alpha */
            const float beta = 0.25f + (float)(rnd() % 500) * 1e-3f;
            kern_ref_table.kda_step(Sr, D, vec[0], vec[1], vec[2], vec[4], beta, orf);
            /* float64 recurrence for the bound */
            for (int64_t j = 0; j < D; j++) {
                double u = 0, od = 0;
                for (int64_t i = 0; i < D; i++) { Sd[i * D + j] *= vec[4][i]; u += Sd[i * D + j] * vec[0][i]; }
                double w = beta * (vec[1][j] - u);
                for (int64_t i = 0; i < D; i++) { Sd[i * D + j] += vec[0][i] * w; od += Sd[i * D + j] * vec[2][i]; }
                double err = fabs(od - orf[j]) / (1 + fabs(od));
                if (err > worst) worst = err;
            }
        }
        CHECK_MSG(worst < 1e-4, "D=%lld: reference vs float64 %.3e", (long long)D, worst);
        /* the tables from the same start, the same three steps */
        for (int k = 0; av[k]; k++) {
            uint64_t save = g_rng;
            memcpy(St, S0, (size_t)(D * D) * 4);
            float *Sq = base_alloc((size_t)(D * D) * 4, MEM_MISC);
            memcpy(Sq, S0, (size_t)(D * D) * 4);
            int same = 1;
            for (int step = 0; step < 3; step++) {
                for (int a = 0; a < 4; a++)
                    for (int64_t i = 0; i < D; i++) vec[a][i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
                for (int64_t i = 0; i < D; i++) vec[4][i] = 0.5f + (float)(rnd() % 500) * 1e-3f;
                const float beta = 0.25f + (float)(rnd() % 500) * 1e-3f;
                kern_ref_table.kda_step(Sq, D, vec[0], vec[1], vec[2], vec[4], beta, orf);
                av[k]->kda_step(St, D, vec[0], vec[1], vec[2], vec[4], beta, ot);
                same &= memcmp(orf, ot, (size_t)D * 4) == 0 && memcmp(Sq, St, (size_t)(D * D) * 4) == 0;
            }
            CHECK_MSG(same, "%s kda_step D=%lld", av[k]->name, (long long)D);
            base_free(Sq);
            g_rng = save;
        }
        base_free(S0); base_free(Sr); base_free(St); base_free(Sd);
    }
}

/* vecmat: every table equals the reference bit for bit, for f32/bf16/f16 rows
 * with a row stride, column counts around the vector widths, n = 0 and 1. */
TEST(kern_vecmat) {
    const kern_table *const *av = kern_available();
    enum { NMAX = 70, LDW = 300 };
    uint16_t *W = base_alloc(NMAX * LDW * 4, MEM_MISC);
    float *wf = base_alloc(NMAX * LDW * 4, MEM_MISC), x[NMAX], y0[LDW], yr[LDW], yt[LDW];
    for (int i = 0; i < NMAX; i++) x[i] = rnd_val(20);
    for (int i = 0; i < LDW; i++) y0[i] = rnd_val(20);
    static const int dts[] = {DT_F32, DT_BF16, DT_F16};
    static const int64_t ms[] = {1, 15, 16, 17, 63, 64, 65, 130, 256};
    static const int64_t ns[] = {0, 1, 7, 70};
    for (int d = 0; d < 3; d++) {
        fill_w(W, wf, dts[d], NMAX * LDW);
        for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++) {
                memcpy(yr, y0, sizeof yr);
                kern_ref_table.vecmat(yr, x, W, dts[d], LDW, ns[b], ms[a]);
                for (int k = 0; av[k]; k++) {
                    memcpy(yt, y0, sizeof yt);
                    av[k]->vecmat(yt, x, W, dts[d], LDW, ns[b], ms[a]);
                    CHECK_MSG(memcmp(yt, yr, sizeof yt) == 0, "%s vecmat dtype %d m=%lld n=%lld", av[k]->name,
                              dts[d], (long long)ms[a], (long long)ns[b]);
                }
            }
    }
    base_free(W); base_free(wf);
}

/* ======================= FP8 e4m3fn and INT4 ======================= */

/* The e4m3fn decoder against the format's definition (sign, exponent bias 7,
 * subnormals m 2^-9, S.1111.111 NaN, no infinities) and the LUT against it. */
TEST(kern_e4m3) {
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        const double mag = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp((double)m, -9);
        const float want = (float)((b & 0x80) ? -mag : mag), got = kern_e4m3_f32((uint8_t)b), lut = kern_e4m3_lut[b];
        if ((b & 0x7F) == 0x7F) {
            CHECK_MSG(isnan(got) && isnan(lut), "byte %02x: %g / %g, want NaN", b, got, lut);
            continue;
        }
        CHECK_MSG(memcmp(&got, &want, 4) == 0 && memcmp(&lut, &want, 4) == 0, "byte %02x: %g / %g, want %g", b, got,
                  lut, want);
    }
    CHECK(kern_e4m3_f32(0x7E) == 448.0f && kern_e4m3_f32(0x38) == 1.0f && kern_e4m3_f32(0x01) == 0x1p-9f);
    CHECK(kern_e4m3_f32(0x80) == 0.0f && signbit(kern_e4m3_f32(0x80)) && kern_e4m3_f32(0xFE) == -448.0f);
    CHECK(((uintptr_t)kern_e4m3_lut & 63) == 0);
}

/* An f32 scale: mostly ordinary (2^-12 .. 2^-4), some subnormal, huge (2^120 and
 * up: the fast paths' folded 256 S would overflow), zero, negative, and with
 * `special` inf or NaN. */
static float rnd_fp8_scale(int special) {
    const uint32_t k = rnd() % 24;
    const float m = 1.0f + (float)(rnd() % 256) / 256.0f;
    if (k == 0) return ldexpf(m, -130 - (int)(rnd() % 15));
    if (k == 1) return ldexpf(m, 119 + (int)(rnd() % 8));
    if (k == 2) return (rnd() & 1) ? 0.0f : -0.0f;
    if (k == 3) return -ldexpf(m, -8);
    if (k == 4 && special) return (rnd() & 1) ? INFINITY : NAN;
    return ldexpf(m, -12 + (int)(rnd() % 9));
}

/* FP8: every table equals the reference bit for bit over odd row counts (the
 * 128-row scale block boundary crossed), edge column blocks (cols not a multiple
 * of 128 or 16), row ranges starting past 0, T = 1 .. 67 (decode blocks, prefill
 * blocks and panels); the reference matches a float64 dot on finite data. */
TEST(kern_fp8) {
    const kern_table *const *av = kern_available();
    static const int64_t cols_l[] = {1, 15, 16, 17, 100, 128, 129, 300, 1040, 2100};
    static const int64_t T_l[] = {1, 3, 8, 20, 67};
    for (size_t ci = 0; ci < sizeof cols_l / sizeof cols_l[0]; ci++) {
        const int64_t cols = cols_l[ci], rows = cols > 1000 ? 133 : 261, T = 67, nb = (cols + 127) / 128;
        const int64_t ldx = cols + 3, ldy = rows + 2, nrb = (rows + 127) / 128;
        uint8_t *W = base_alloc((size_t)(rows * cols), MEM_MISC);
        float *S = base_alloc((size_t)(nrb * nb) * 4, MEM_MISC);
        float *wf = base_alloc((size_t)(rows * cols) * 4, MEM_MISC);
        float *X = base_alloc((size_t)(T * ldx) * 4, MEM_MISC);
        float *Yref = base_alloc((size_t)(T * ldy) * 4, MEM_MISC), *Y = base_alloc((size_t)(T * ldy) * 4, MEM_MISC);
        for (int64_t i = 0; i < rows * cols; i++) {
            W[i] = (uint8_t)rnd();
            if ((W[i] & 0x7F) == 0x7F) W[i] ^= 1; /* NaN codes below, in chosen rows only */
        }
        for (int pass = 0; pass < 3; pass++) {
            /* pass 0: finite scales, checked against float64; pass 1: one block of
             * scale 2^120, the smallest the fast paths must not fold into 256 S
             * (inf), on bytes below 256 and tiny x, so the reference's sums are
             * finite; pass 2: inf and NaN scales, NaN codes in rows 5 and rows - 2,
             * x with inf and NaN */
            const int pk = pass;
            for (int64_t i = 0; i < nrb * nb; i++) S[i] = pk == 2 ? rnd_fp8_scale(rnd() % 4 == 0) : ldexpf(1.0f + (float)(rnd() % 256) / 256.0f, -12 + (int)(rnd() % 9));
            for (int64_t i = 0; i < T * ldx; i++) X[i] = pk == 1 ? ldexpf(rnd_val(20), -60) : rnd_val(20);
            if (pk == 1) {
                const int64_t rsp = rows - 5; /* inside every tested range */
                S[(rsp / 128) * nb + nb - 1] = 0x1p120f;
                for (int64_t i = (rsp / 128) * 128 * cols; i < rows * cols; i++) /* the scale's whole row block */
                    if ((W[i] & 0x78) == 0x78) W[i] &= 0xF7;                          /* |e4m3| < 256 */
            }
            if (pk == 2) {
                W[5 * cols + cols / 2] = 0x7F;
                W[(rows - 2) * cols] = 0xFF;
                X[1] = INFINITY;
                X[ldx + cols - 1] = NAN;
            }
            memset(Yref, 0x7F, (size_t)(T * ldy) * 4);
            kern_ref_table.matmul_fp8(Yref, ldy, W, S, cols, X, ldx, T, 0, rows);
            if (pk != 2) {
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t i = 0; i < cols; i++) wf[r * cols + i] = kern_e4m3_f32(W[r * cols + i]) * S[(r / 128) * nb + i / 128];
                int close = 1;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < rows; r++) close &= ref_close(Yref[t * ldy + r], wf + r * cols, X + t * ldx, cols);
                CHECK_MSG(close, "fp8 reference vs float64, cols %lld pass %d", (long long)cols, pass);
            } else {
                CHECK(isnan(Yref[5]) && isnan(Yref[rows - 2]) && isnan(Yref[ldy + 5]));
            }
            for (int k = 0; av[k]; k++)
                for (size_t ti = 0; ti < sizeof T_l / sizeof T_l[0]; ti++) {
                    const int64_t TT = T_l[ti], r0 = (int64_t)ti * 3, r1 = rows - (int64_t)ti;
                    memset(Y, 0x7F, (size_t)(T * ldy) * 4);
                    av[k]->matmul_fp8(Y, ldy, W, S, cols, X, ldx, TT, r0, r1);
                    CHECK_MSG(same_range(Y, Yref, ldy, T, rows, TT, r0, r1, 1), "table %s fp8 cols %lld T %lld pass %d",
                              av[k]->name, (long long)cols, (long long)TT, pk);
                }
#if defined(__x86_64__)
            for (int pat = 0; pat < 2 && kern_x86_has_avx2(); pat++) /* both AVX2 decoders, whatever the vendor */
                for (int rg = 0; rg < 2; rg++) {
                    const int64_t r0 = rg ? 5 : 3, r1 = rg ? 14 : rows - 1;
                    memset(Y, 0x7F, (size_t)(T * ldy) * 4);
                    kern_x86_fp8_avx2_decode(Y, W, S, cols, X, r0, r1, pat);
                    CHECK_MSG(same_range(Y, Yref, ldy, T, rows, 1, r0, r1, 1), "avx2 fp8 decoder %d cols %lld pass %d", pat,
                              (long long)cols, pk);
                }
            for (int rg = 0; rg < 2 && kern_x86_has_avx512(); rg++) { /* the zmm decoder, whatever the vendor */
                const int64_t r0 = rg ? 5 : 3, r1 = rg ? 14 : rows - 1;
                memset(Y, 0x7F, (size_t)(T * ldy) * 4);
                kern_x86_fp8_avx512_decode(Y, W, S, cols, X, r0, r1);
                CHECK_MSG(same_range(Y, Yref, ldy, T, rows, 1, r0, r1, 1), "avx512 fp8 decoder cols %lld pass %d",
                          (long long)cols, pk);
            }
#endif
        }
        base_free(W); base_free(S); base_free(wf); base_free(X); base_free(Yref); base_free(Y);
    }
    /* a known row: 448 (0x7E) x scale 0.5, 2^-9 (0x01) x 0.5, -1 (0xB8) x 2 in block 1 */
    uint8_t w[130] = {0};
    float s[2] = {0.5f, 2.0f}, x[130], y;
    for (int i = 0; i < 130; i++) x[i] = 1.0f;
    w[0] = 0x7E; w[17] = 0x01; w[129] = 0xB8;
    for (int k = 0; av[k]; k++) {
        av[k]->matmul_fp8(&y, 1, w, s, 130, x, 130, 1, 0, 1);
        CHECK_MSG(y == 224.0f + 0x1p-10f - 2.0f, "%s: %.9g", av[k]->name, y);
    }
}

/* The x86 decode (T = 1) paths the suites above do not reach: rows wider than
 * XPRE_MAX (x permuted per 16 columns instead of once per call, with a
 * partial last FP8 block and a tail), ranges under 16 rows, FP8 scales at the
 * fast form's bound 2^8 (2^120 S still exact below it), both AVX2 FP8 decoders
 * whatever the CPU's vendor, and INT4 scales at the
 * fast decoder's bound, NaN codes in a full block, the partial block and the
 * tail, subnormal e4m3 codes everywhere (random bytes). */
TEST(kern_quant_decode_paths) {
    const kern_table *const *av = kern_available();
    static const int64_t fcols[] = {8200, 2048, 8192 + 128}, icols[] = {8224, 2048};
    const int64_t rows = 40, ldy = rows + 1;
    float *Yref = base_alloc((size_t)ldy * 4, MEM_MISC), *Y = base_alloc((size_t)ldy * 4, MEM_MISC);
    for (size_t ci = 0; ci < 3; ci++) {
        const int64_t cols = fcols[ci], nb = (cols + 127) / 128;
        uint8_t *W = base_alloc((size_t)(rows * cols), MEM_MISC);
        float *S = base_alloc((size_t)nb * 4, MEM_MISC), *X = base_alloc((size_t)cols * 4, MEM_MISC);
        for (int pass = 0; pass < 2; pass++) {
            for (int64_t i = 0; i < rows * cols; i++) {
                W[i] = (uint8_t)rnd();
                if ((W[i] & 0x7F) == 0x7F) W[i] ^= 1;
                if (pass == 1 && (W[i] & 0x78) == 0x78) W[i] &= 0xF7; /* |e4m3| < 256 */
            }
            for (int64_t b = 0; b < nb; b++) /* pass 1: |S| at and just below 2^8 (the call's largest) */
                S[b] = pass == 0 ? ldexpf(1.0f + (float)(rnd() % 256) / 256.0f, -12 + (int)(rnd() % 9))
                                 : (b % 3 == 0 ? 0x1p8f : b % 3 == 1 ? -0x1.fffffep7f : 0x1p-10f);
            for (int64_t i = 0; i < cols; i++) X[i] = pass == 1 ? ldexpf(rnd_val(20), -40) : rnd_val(20);
            if (pass == 0) {
                W[3 * cols + 130] = 0x7F;         /* full block */
                W[17 * cols + cols - 9] = 0xFF;   /* partial block (8200) or last full one */
                W[38 * cols + cols - 1] = 0x7F;   /* tail (8200) */
            }
            kern_ref_table.matmul_fp8(Yref, ldy, W, S, cols, X, cols, 1, 0, rows);
            if (pass == 0) CHECK(isnan(Yref[3]) && isnan(Yref[17]) && isnan(Yref[38]) && !isnan(Yref[4]));
            for (int k = 0; av[k]; k++)
                for (int rg = 0; rg < 2; rg++) {
                    const int64_t r0 = rg ? 3 : 0, r1 = rg ? 12 : rows;
                    memset(Y, 0x7F, (size_t)ldy * 4);
                    av[k]->matmul_fp8(Y, ldy, W, S, cols, X, cols, 1, r0, r1);
                    CHECK_MSG(same_range(Y, Yref, ldy, 1, rows, 1, r0, r1, 1), "table %s fp8 cols %lld pass %d rows %lld-%lld",
                              av[k]->name, (long long)cols, pass, (long long)r0, (long long)r1);
                }
#if defined(__x86_64__)
            for (int pat = 0; pat < 2 && kern_x86_has_avx2(); pat++)
                for (int rg = 0; rg < 2; rg++) {
                    const int64_t r0 = rg ? 3 : 0, r1 = rg ? 12 : rows;
                    memset(Y, 0x7F, (size_t)ldy * 4);
                    kern_x86_fp8_avx2_decode(Y, W, S, cols, X, r0, r1, pat);
                    CHECK_MSG(same_range(Y, Yref, ldy, 1, rows, 1, r0, r1, 1), "avx2 fp8 decoder %d cols %lld pass %d", pat,
                              (long long)cols, pass);
                }
            for (int rg = 0; rg < 2 && kern_x86_has_avx512(); rg++) {
                const int64_t r0 = rg ? 3 : 0, r1 = rg ? 12 : rows;
                memset(Y, 0x7F, (size_t)ldy * 4);
                kern_x86_fp8_avx512_decode(Y, W, S, cols, X, r0, r1);
                CHECK_MSG(same_range(Y, Yref, ldy, 1, rows, 1, r0, r1, 1), "avx512 fp8 decoder cols %lld pass %d",
                          (long long)cols, pass);
            }
#endif
        }
        base_free(W); base_free(S); base_free(X);
    }
    for (size_t ci = 0; ci < 2; ci++) {
        const int64_t cols = icols[ci], ng = cols / 32;
        int32_t *Wp = base_alloc((size_t)(rows * cols / 8) * 4, MEM_MISC);
        uint16_t *S = base_alloc((size_t)(rows * ng) * 2, MEM_MISC);
        float *X = base_alloc((size_t)cols * 4, MEM_MISC);
        for (int64_t i = 0; i < rows * cols / 8; i++) Wp[i] = (int32_t)rnd() ^ (int32_t)(rnd() << 8);
        for (int pass = 0; pass < 2; pass++) {
            /* pass 1: the largest fast scale (0x7D7F) everywhere but one group of the
             * smallest slow one (0x7D80), tiny x */
            for (int64_t i = 0; i < rows * ng; i++) S[i] = pass ? 0x7D7F : (uint16_t)(0x3A00 + rnd() % 0x300);
            if (pass) S[21 * ng + 5] = 0x7D80;
            for (int64_t i = 0; i < cols; i++) X[i] = pass ? ldexpf(rnd_val(20), -140) : rnd_val(20);
            kern_ref_table.matmul_int4(Yref, ldy, Wp, S, cols, X, cols, 1, 0, rows);
            for (int k = 0; av[k]; k++)
                for (int rg = 0; rg < 3; rg++) {
                    const int64_t r0 = rg == 1 ? 3 : rg == 2 ? 20 : 0, r1 = rg == 1 ? 12 : rg == 2 ? 23 : rows;
                    memset(Y, 0x7F, (size_t)ldy * 4);
                    av[k]->matmul_int4(Y, ldy, Wp, S, cols, X, cols, 1, r0, r1);
                    CHECK_MSG(same_range(Y, Yref, ldy, 1, rows, 1, r0, r1, 1), "table %s int4 cols %lld pass %d rows %lld-%lld",
                              av[k]->name, (long long)cols, pass, (long long)r0, (long long)r1);
                }
        }
        base_free(Wp); base_free(S); base_free(X);
    }
    base_free(Yref); base_free(Y);
}

/* A bf16 scale: mostly ordinary, some subnormal, huge (up to the largest bf16,
 * where q s overflows to inf), zero of either sign, negative, and with `special`
 * inf or NaN. */
static uint16_t rnd_int4_scale(int special) {
    const uint32_t k = rnd() % 24;
    if (k == 0) return (uint16_t)(rnd() % 0x80);                         /* subnormal or +0 */
    if (k == 1) return (uint16_t)(0x7D00 + rnd() % 0x280);               /* 2^123 .. max */
    if (k == 2) return (rnd() & 1) ? 0x0000 : 0x8000;
    if (k == 3) return (uint16_t)(0xBB00 + rnd() % 0x100);               /* negative */
    if (k == 4 && special) return (rnd() & 1) ? 0x7F80 : 0x7FC1;         /* inf, NaN */
    return (uint16_t)(0x3A00 + rnd() % 0x300);                           /* ~2^-11 .. 2^-6 */
}

/* INT4: every table equals the reference bit for bit (odd rows, r0 > 0, T = 1 ..
 * 67 across the 1024-column panels, extreme and non-finite scales); the reference
 * matches a float64 dot on finite data. */
TEST(kern_int4) {
    const kern_table *const *av = kern_available();
    static const int64_t cols_l[] = {32, 64, 96, 224, 1024, 2080};
    static const int64_t T_l[] = {1, 3, 8, 20, 67};
    for (size_t ci = 0; ci < sizeof cols_l / sizeof cols_l[0]; ci++) {
        const int64_t cols = cols_l[ci], rows = 37, T = 67, ng = cols / 32, ldx = cols + 1, ldy = rows + 2;
        int32_t *Wp = base_alloc((size_t)(rows * cols / 8) * 4, MEM_MISC);
        uint16_t *S = base_alloc((size_t)(rows * ng) * 2, MEM_MISC);
        float *wf = base_alloc((size_t)(rows * cols) * 4, MEM_MISC);
        float *X = base_alloc((size_t)(T * ldx) * 4, MEM_MISC);
        float *Yref = base_alloc((size_t)(T * ldy) * 4, MEM_MISC), *Y = base_alloc((size_t)(T * ldy) * 4, MEM_MISC);
        for (int64_t i = 0; i < rows * cols / 8; i++) Wp[i] = (int32_t)rnd() ^ (int32_t)(rnd() << 8);
        for (int pass = 0; pass < 3; pass++) {
            /* pass 0: ordinary scales, checked against float64; 1: extreme and
             * non-finite ones; 2: ordinary but for one group of scale 2^125 (8 s
             * overflows: the fast decoder must not take the call) in row rows - 5
             * (inside every tested range) on nonzero nibbles (|q| s finite) and
             * tiny x, so the reference's sums are finite */
            for (int64_t i = 0; i < rows * ng; i++) S[i] = pass == 1 ? rnd_int4_scale(rnd() % 4 == 0) : (uint16_t)(0x3A00 + rnd() % 0x300);
            for (int64_t i = 0; i < T * ldx; i++) X[i] = pass == 2 ? ldexpf(rnd_val(20), -60) : rnd_val(20);
            if (pass == 2) {
                const int64_t rsp = rows - 5;
                S[rsp * ng + ng - 1] = 0x7E00;
                for (int64_t i = 0; i < cols / 8; i++) Wp[rsp * cols / 8 + i] = (int32_t)0x9ABCDEF1u;
            }
            memset(Yref, 0x7F, (size_t)(T * ldy) * 4);
            kern_ref_table.matmul_int4(Yref, ldy, Wp, S, cols, X, ldx, T, 0, rows);
            if (pass != 1) {
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t i = 0; i < cols; i++) {
                        const int q = (int)(((uint32_t)Wp[r * cols / 8 + i / 8] >> (4 * (i % 8))) & 15) - 8;
                        wf[r * cols + i] = (float)((double)q * num_bf16_to_f32(S[r * ng + i / 32]));
                    }
                int close = 1;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < rows; r++) close &= ref_close(Yref[t * ldy + r], wf + r * cols, X + t * ldx, cols);
                CHECK_MSG(close, "int4 reference vs float64, cols %lld pass %d", (long long)cols, pass);
            }
            for (int k = 0; av[k]; k++)
                for (size_t ti = 0; ti < sizeof T_l / sizeof T_l[0]; ti++) {
                    const int64_t TT = T_l[ti], r0 = 1 + (int64_t)ti, r1 = rows - (int64_t)ti;
                    memset(Y, 0x7F, (size_t)(T * ldy) * 4);
                    av[k]->matmul_int4(Y, ldy, Wp, S, cols, X, ldx, TT, r0, r1);
                    CHECK_MSG(same_range(Y, Yref, ldy, T, rows, TT, r0, r1, 1), "table %s int4 cols %lld T %lld pass %d",
                              av[k]->name, (long long)cols, (long long)TT, pass);
                }
        }
        base_free(Wp); base_free(S); base_free(wf); base_free(X); base_free(Yref); base_free(Y);
    }
    /* a known row: word 0 = nibbles 0..7 (q = -8..-1), word 1 = 8..15 (q = 0..7),
     * then words of 8s (q = 0); scale 0.5 (bf16 0x3F00), x = 1: sum -36 + 28 = -8, x 0.5 */
    int32_t wp[4] = {0x76543210, (int32_t)0xFEDCBA98u, (int32_t)0x88888888u, (int32_t)0x88888888u};
    uint16_t s = 0x3F00;
    float x[32], y;
    for (int i = 0; i < 32; i++) x[i] = 1.0f;
    for (int k = 0; av[k]; k++) {
        av[k]->matmul_int4(&y, 1, wp, &s, 32, x, 32, 1, 0, 1);
        CHECK_MSG(y == -4.0f, "%s: %g", av[k]->name, y);
    }
}
