/*
 * sample.c: token sampling (see sample.h) and the stop-id set.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "jsonx.h"
#include "sample.h"

/* A candidate token: probability and id, sorted by (p desc, id asc). */
typedef struct { float p; int32_t id; } cand_t;

struct sampler {
    sample_opts o;
    int64_t n;
    float *work;       /* (n) penalised logits */
    cand_t *cand;      /* (n) candidates */
    int32_t *seen;     /* (n) stamp per id for the penalty window */
    int32_t stamp;
    pcg32 rng;
};

void pcg32_seed(pcg32 *r, uint64_t seed, uint64_t seq) {
    r->state = 0;
    r->inc = (seq << 1) | 1u;
    (void)pcg32_next(r);
    r->state += seed;
    (void)pcg32_next(r);
}

/* 64-bit LCG step; output = xorshift-high then a data-dependent rotation. */
uint32_t pcg32_next(pcg32 *r) {
    uint64_t old = r->state;
    r->state = old * 6364136223846793005ULL + r->inc;
    uint32_t x = (uint32_t)(((old >> 18) ^ old) >> 27);
    uint32_t rot = (uint32_t)(old >> 59);
    return (x >> rot) | (x << ((32 - rot) & 31));
}

double pcg32_unit(pcg32 *r) {
    uint64_t hi = pcg32_next(r) >> 5, lo = pcg32_next(r) >> 6; /* 27 + 26 bits */
    return ((double)hi * 67108864.0 + (double)lo) / 9007199254740992.0;
}

/* splitmix64 finaliser: decorrelates (seed, position) pairs. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

int32_t sampler_next_at(sampler *s, const float *logits, const int32_t *hist, int64_t n_hist, int64_t pos) {
    return sampler_next_masked_at(s, logits, NULL, hist, n_hist, pos);
}

int32_t sampler_next_masked_at(sampler *s, const float *logits, const uint64_t *allow, const int32_t *hist, int64_t n_hist,
                               int64_t pos) {
    pcg32_seed(&s->rng, mix64(s->o.seed ^ mix64((uint64_t)pos)), 0x5354524154414bULL);
    return sampler_next_masked(s, logits, allow, hist, n_hist);
}

const float *sampler_logits(const sampler *s) { return s->work; }

int sampler_logprobs(const sampler *s, int32_t id, int k, double *lp, int32_t *top_ids, double *top_lp) {
    const float *w = s->work;
    const int64_t V = s->n;
    double mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) if (w[i] > mx) mx = w[i];
    double sum = 0;
    if (isfinite(mx)) for (int64_t i = 0; i < V; i++) sum += exp((double)w[i] - mx);
    /* every id masked (all -inf): every log-probability is -inf */
    const double lse = isfinite(mx) ? mx + log(sum) : INFINITY;
    *lp = (double)w[id] - lse;
    int n = 0;
    for (int64_t i = 0; i < V && k > 0; i++) {
        const float x = w[i];
        if (x != x || (n == k && !(x > w[top_ids[n - 1]]))) continue; /* ties keep the lower id */
        int at = n < k ? n++ : n - 1;
        while (at > 0 && x > w[top_ids[at - 1]]) { top_ids[at] = top_ids[at - 1]; at--; }
        top_ids[at] = (int32_t)i;
    }
    for (int i = 0; i < n; i++) top_lp[i] = (double)w[top_ids[i]] - lse;
    return n;
}

int32_t sample_argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i;
    return (int32_t)best;
}

int sampler_create(sampler **out, int64_t n_vocab, const sample_opts *o, char *err, size_t errlen) {
    *out = NULL;
    sample_opts d = SAMPLE_OPTS_DEFAULT;
    if (!o) o = &d;
    if (n_vocab < 1 || n_vocab > INT32_MAX) return base_fail(err, errlen, STRATA_EINVAL, "sample: bad vocabulary size");
    if (!(o->temp >= 0) || !(o->top_p > 0 && o->top_p <= 1) || !(o->min_p >= 0 && o->min_p <= 1) ||
        !(o->repeat_penalty > 0) || o->top_k < 0 || o->repeat_last_n < 0)
        return base_fail(err, errlen, STRATA_EINVAL, "sample: option out of range");
    sampler *s = base_calloc(1, sizeof *s, MEM_SCRATCH);
    if (!s) return base_fail(err, errlen, STRATA_ENOMEM, "sample: out of memory");
    s->o = *o;
    s->n = n_vocab;
    s->work = base_alloc((size_t)n_vocab * sizeof(float), MEM_SCRATCH);
    s->cand = base_alloc((size_t)n_vocab * sizeof(cand_t), MEM_SCRATCH);
    s->seen = base_calloc((size_t)n_vocab, sizeof(int32_t), MEM_SCRATCH);
    if (!s->work || !s->cand || !s->seen) {
        sampler_free(s);
        return base_fail(err, errlen, STRATA_ENOMEM, "sample: out of memory");
    }
    pcg32_seed(&s->rng, o->seed, 0x5354524154414bULL);
    *out = s;
    return 0;
}

void sampler_free(sampler *s) {
    if (!s) return;
    base_free(s->work);
    base_free(s->cand);
    base_free(s->seen);
    base_free(s);
}

static int cand_cmp(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

int32_t sampler_next(sampler *s, const float *logits, const int32_t *hist, int64_t n_hist) {
    return sampler_next_masked(s, logits, NULL, hist, n_hist);
}

int32_t sampler_next_masked(sampler *s, const float *logits, const uint64_t *allow, const int32_t *hist, int64_t n_hist) {
    const int64_t n = s->n;
    float *w = s->work;
    memcpy(w, logits, (size_t)n * sizeof(float));
    if (s->o.repeat_penalty != 1.0 && n_hist > 0) {
        const float r = (float)s->o.repeat_penalty;
        int64_t from = s->o.repeat_last_n > 0 && n_hist > s->o.repeat_last_n ? n_hist - s->o.repeat_last_n : 0;
        if (++s->stamp == INT32_MAX) { memset(s->seen, 0, (size_t)n * sizeof(int32_t)); s->stamp = 1; }
        for (int64_t i = from; i < n_hist; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= n || s->seen[id] == s->stamp) continue;
            s->seen[id] = s->stamp;
            w[id] = w[id] > 0 ? w[id] / r : w[id] * r;
        }
    }
    if (allow)
        for (int64_t i = 0; i < n; i++)
            if (!(allow[i >> 6] >> (i & 63) & 1)) w[i] = -INFINITY;
    const int32_t am = sample_argmax(w, n);
    if (s->o.temp == 0 || !isfinite(w[am])) return am;
    /* softmax of logits / temp in double */
    const double it = 1.0 / s->o.temp, mx = (double)w[am] * it;
    double den = 0;
    for (int64_t i = 0; i < n; i++) den += exp((double)w[i] * it - mx);
    /* min-p keeps p >= min_p * p_max (p_max = 1 / den) */
    const double pmin = s->o.min_p / den;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        double p = exp((double)w[i] * it - mx) / den;
        if (p > 0 && p >= pmin) s->cand[m++] = (cand_t){(float)p, (int32_t)i};
    }
    if (m == 0) return am;
    if ((s->o.top_k > 0 && s->o.top_k < m) || s->o.top_p < 1.0) {
        qsort(s->cand, (size_t)m, sizeof(cand_t), cand_cmp);
        if (s->o.top_k > 0 && s->o.top_k < m) m = s->o.top_k;
        if (s->o.top_p < 1.0) {
            double tot = 0, cum = 0;
            for (int64_t i = 0; i < m; i++) tot += s->cand[i].p;
            for (int64_t i = 0; i < m; i++) {
                cum += s->cand[i].p;
                if (cum >= s->o.top_p * tot) { m = i + 1; break; }
            }
        }
    }
    double tot = 0;
    for (int64_t i = 0; i < m; i++) tot += s->cand[i].p;
    double u = pcg32_unit(&s->rng) * tot, cum = 0;
    for (int64_t i = 0; i < m; i++) {
        cum += s->cand[i].p;
        if (u < cum) return s->cand[i].id;
    }
    return s->cand[m - 1].id;
}

/* ---- stop ids ---- */

static int add_id(int32_t *ids, int n, int max, int64_t id, const cfg *c) {
    if (id < 0 || id >= c->vocab || n >= max) return n;
    for (int i = 0; i < n; i++) if (ids[i] == id) return n;
    ids[n] = (int32_t)id;
    return n + 1;
}

int sample_stop_ids(const char *model_dir, const cfg *c, int32_t *ids, int max, char *err, size_t errlen) {
    int n = 0;
    for (int64_t i = 0; i < c->n_eos; i++) n = add_id(ids, n, max, c->eos_ids[i], c);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    if (!base_is_file(path)) return n;
    uint8_t *buf;
    size_t len;
    int rc = base_read_file(path, 64u << 20, &buf, &len, err, errlen);
    if (rc) return rc;
    json_t *root;
    rc = jsonx_parse(&root, buf, len, path, err, errlen);
    base_free(buf);
    if (rc) return rc;
    if (!json_is_object(root)) { json_decref(root); return base_fail(err, errlen, STRATA_EFORMAT, "%s: not an object", path); }
    const char *eos = NULL;
    json_t *et = json_object_get(root, "eos_token");
    if (json_is_string(et)) eos = json_string_value(et);
    else if (json_is_object(et) && json_is_string(json_object_get(et, "content")))
        eos = json_string_value(json_object_get(et, "content"));
    json_t *dec = json_object_get(root, "added_tokens_decoder");
    if (json_is_object(dec)) {
        const char *key;
        json_t *v;
        json_object_foreach(dec, key, v) {
            json_t *ct = json_object_get(v, "content");
            if (!json_is_string(ct)) continue;
            const char *s = json_string_value(ct);
            int64_t id;
            if (base_parse_i64(key, 0, INT32_MAX, &id)) continue;
            if ((eos && !strcmp(s, eos)) || !strcmp(s, "[EOS]") || !strcmp(s, "<|end_of_msg|>"))
                n = add_id(ids, n, max, id, c);
        }
    }
    json_decref(root);
    return n;
}
