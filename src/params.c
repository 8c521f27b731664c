/*
 * params.c: the value table of strata.h's strata_param: one range and one
 * message per value that the CLI and the server both take.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include "base.h"
#include "strata.h"

static const strata_param_info k_params[STRATA_PARAM_COUNT] = {
    [STRATA_PARAM_TEMP] = {"--temp", "temperature", 0, 0, 2, 0, "a number in [0, 2]"},
    [STRATA_PARAM_TOP_K] = {"--top-k", "top_k", 1, 0, INT32_MAX, 0, "an integer >= 0"},
    [STRATA_PARAM_TOP_P] = {"--top-p", "top_p", 0, 0, 1, 1, "in (0, 1]"},
    [STRATA_PARAM_MIN_P] = {"--min-p", "min_p", 0, 0, 1, 0, "in [0, 1]"},
    [STRATA_PARAM_REPEAT_PENALTY] = {"--repeat-penalty", "repetition_penalty", 0, 0, 100, 1, "in (0, 100]"},
    [STRATA_PARAM_SPEC] = {"--spec", NULL, 1, 0, 16, 0, "an integer in [0, 16]"},
    [STRATA_PARAM_CTX] = {"--ctx", NULL, 1, 1, 1 << 24, 0, "an integer in [1, 16777216]"},
    [STRATA_PARAM_THREADS] = {"--threads", NULL, 1, 1, 256, 0, "1..256"},
    [STRATA_PARAM_CHUNK] = {"--chunk", NULL, 1, 1, 4096, 0, "1..4096"},
    [STRATA_PARAM_GEN] = {"--gen", NULL, 1, 1, 1 << 20, 0, "an integer in [1, 1048576]"},
};

const strata_param_info *strata_param(enum strata_param p) {
    return (unsigned)p < STRATA_PARAM_COUNT ? &k_params[p] : NULL;
}

static int in_range(const strata_param_info *r, double v) {
    return isfinite(v) && (r->lo_open ? v > r->lo : v >= r->lo) && v <= r->hi && (!r->integer || v == floor(v));
}

int strata_param_check(enum strata_param p, double v, char *err, size_t errlen) {
    const strata_param_info *r = strata_param(p);
    if (!r) return base_fail(err, errlen, STRATA_EINVAL, "unknown parameter %d", (int)p);
    if (in_range(r, v)) return STRATA_OK;
    return base_fail(err, errlen, STRATA_EINVAL, "'%s' must be in %c%.15g, %.15g] (got %.15g)", r->json ? r->json : r->flag,
                     r->lo_open ? '(' : '[', r->lo, r->hi, v);
}

int strata_param_parse(enum strata_param p, const char *s, double *out) {
    const strata_param_info *r = strata_param(p);
    if (!r) return STRATA_EINVAL;
    double v;
    if (r->integer) {
        int64_t n;
        if (base_parse_i64(s, (int64_t)r->lo, (int64_t)r->hi, &n)) return STRATA_EINVAL;
        v = (double)n;
    } else if (base_parse_f64(s, r->lo, r->hi, &v)) {
        return STRATA_EINVAL;
    }
    if (!in_range(r, v)) return STRATA_EINVAL;
    *out = v;
    return STRATA_OK;
}
