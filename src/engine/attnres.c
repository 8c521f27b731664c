/*
 * attnres.c: Block Attention Residuals (docs/architecture.md, Decoder layer with Block Attention Residuals). The residual
 * stream is a list of sources: the closed block sums B_0 .. B_{n-1} and the
 * partial sum P of the current block. A layer's attention and FFN inputs, and
 * the head's, are
 *   h = sum_s p_s s,  p = softmax_s((s . f) / rms(s)),  f = res_norm * res_proj
 * over the raw sources; the layer loop (infer.c layers_run) closes a block every
 * attn_res_block layers.
 */
#include <math.h>
#include "engine_int.h"

/* AttnRes over nsrc sources (row t of each (T, n) buffer): softmax over sources of
 * (s . f) / rms(s), output the p-weighted sum of the RAW sources. Every sum is in
 * double in element (then source) order; the loops below only interleave
 * independent sums (four sources' at once, eight outputs at once) so they run
 * at throughput instead of one add's latency per element: the same bits, and
 * 24 -> 15 us per call for 5 sources of 2048 (ladder's widths; isolated, cold
 * caches). It runs twice per layer and once per expert guess, on the driving
 * thread while the others wait. */
void attnres_row(float *out, float *const *src, int64_t nsrc, int64_t t, int64_t n,
                 const float *f, double eps) {
    double sc[CFG_MAX_LAYERS + 2], mx = -INFINITY, den = 0;
    int64_t s = 0;
    for (; s + 4 <= nsrc; s += 4) {
        const float *x0 = src[s] + t * n, *x1 = src[s + 1] + t * n, *x2 = src[s + 2] + t * n, *x3 = src[s + 3] + t * n;
        double q0 = 0, q1 = 0, q2 = 0, q3 = 0, d0 = 0, d1 = 0, d2 = 0, d3 = 0;
        for (int64_t i = 0; i < n; i++) {
            const double fi = f[i], v0 = x0[i], v1 = x1[i], v2 = x2[i], v3 = x3[i];
            q0 += v0 * v0; d0 += v0 * fi;
            q1 += v1 * v1; d1 += v1 * fi;
            q2 += v2 * v2; d2 += v2 * fi;
            q3 += v3 * v3; d3 += v3 * fi;
        }
        sc[s] = d0 / sqrt(q0 / (double)n + eps);
        sc[s + 1] = d1 / sqrt(q1 / (double)n + eps);
        sc[s + 2] = d2 / sqrt(q2 / (double)n + eps);
        sc[s + 3] = d3 / sqrt(q3 / (double)n + eps);
    }
    for (; s < nsrc; s++) {
        const float *x = src[s] + t * n;
        double ss = 0, d = 0;
        for (int64_t i = 0; i < n; i++) { ss += (double)x[i] * x[i]; d += (double)x[i] * f[i]; }
        sc[s] = d / sqrt(ss / (double)n + eps);
    }
    for (s = 0; s < nsrc; s++) if (sc[s] > mx) mx = sc[s];
    for (s = 0; s < nsrc; s++) { sc[s] = exp(sc[s] - mx); den += sc[s]; }
    float *o = out + t * n;
    for (s = 0; s < nsrc; s++) sc[s] /= den;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        double a[8] = {0};
        for (s = 0; s < nsrc; s++) {
            const float *x = src[s] + t * n + i;
            for (int l = 0; l < 8; l++) a[l] += sc[s] * x[l];
        }
        for (int l = 0; l < 8; l++) o[i + l] = (float)a[l];
    }
    for (; i < n; i++) {
        double a = 0;
        for (s = 0; s < nsrc; s++) a += sc[s] * src[s][t * n + i];
        o[i] = (float)a;
    }
}
