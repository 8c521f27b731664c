/*
 * bench_gram.c: strata_bench_grammar_masks (include/strata_bench.h): the per-step
 * cost of a constrained-decoding mask on a model's vocabulary, with the string
 * fast path and with a walk of the whole trie, over the same random documents.
 */
#include <stdio.h>
#include <string.h>
#include "base.h"
#include "jgram.h"
#include "jschema.h"
#include "strata.h"
#include "strata_bench.h"
#include "tok.h"

/* A document of every kind of position, most of it inside length-bounded strings
 * (where the fast path applies) as a tool call's arguments would be. */
static const char k_schema[] =
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":120},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":24},\"maxItems\":6},"
    "\"count\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"},\"body\":{\"type\":\"string\",\"maxLength\":600}},"
    "\"required\":[\"title\",\"tags\",\"count\",\"ok\",\"body\"]}";

static const uint8_t *text_bytes(void *ud, int32_t id, size_t *len) {
    const tok *t = ud;
    return tok_is_special(t, id) ? NULL : tok_token_bytes(t, id, len);
}

static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The allowed id of rank r (mod the count) in mask: a uniform draw among them. */
static int32_t nth_allowed(const uint64_t *mask, size_t words, int64_t n, uint64_t r) {
    int64_t k = (int64_t)(r % (uint64_t)n);
    for (size_t w = 0; w < words; w++) {
        const int c = __builtin_popcountll(mask[w]);
        if (k >= c) { k -= c; continue; }
        uint64_t b = mask[w];
        while (k--) b &= b - 1;
        return (int32_t)(w * 64 + (size_t)__builtin_ctzll(b));
    }
    return -1;
}

typedef struct { int64_t masks, cached; double t_computed, t_max, t_all; uint64_t ids; } gm_run;

/* steps masks over random documents of g (each ends on the end id when it may,
 * 1 in 8, else goes on), fast path on or off; the same draws both ways. */
static int run_path(const jgram *g, const jg_vocab *v, int32_t n_vocab, int32_t end, int fast, int steps, gm_run *r,
                    char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    jg_matcher *m = NULL;
    uint64_t seed = 0x5eed5eed1234ULL;
    const size_t words = ((size_t)n_vocab + 63) / 64;
    r->ids = BASE_FNV_INIT;
    for (int i = 0; i < steps; i++) {
        if (!m) {
            int rc = jgram_matcher_create(&m, g, v, &end, 1, err, errlen);
            if (rc) return rc;
            jgram_matcher_set_fast(m, fast);
        }
        int64_t n = 0, c0, c1, k;
        jgram_matcher_stats(m, &k, &c0);
        const double t0 = strata_now();
        const uint64_t *mask = jgram_matcher_mask(m, &n);
        const double dt = strata_now() - t0;
        jgram_matcher_stats(m, &k, &c1);
        r->masks++;
        r->t_all += dt;
        if (c1 > c0) r->cached++;
        else {
            r->t_computed += dt;
            if (dt > r->t_max) r->t_max = dt;
        }
        int32_t id = n > 0 ? nth_allowed(mask, words, n, xs(&seed)) : end;
        if (n > 0 && (mask[end >> 6] >> (end & 63) & 1) && xs(&seed) % 8 == 0) id = end;
        r->ids = base_fnv1a(&id, sizeof id, r->ids);
        if (id == end || n == 0 || jgram_matcher_accept(m, id)) {
            jgram_matcher_free(m);
            m = NULL;
        }
    }
    jgram_matcher_free(m);
    return 0;
}

int strata_bench_grammar_masks(const strata_bench_gmask_opts *o, FILE *out, char *err, size_t errlen) {
    char vp[4096], cp[4096];
    if (snprintf(vp, sizeof vp, "%s/tiktoken.model", o->model_dir) >= (int)sizeof vp ||
        snprintf(cp, sizeof cp, "%s/tokenizer_config.json", o->model_dir) >= (int)sizeof cp)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: path too long", o->model_dir);
    if (o->steps < 1) return base_fail(err, errlen, STRATA_EINVAL, "steps must be >= 1");
    tok *t = NULL;
    jgram *g = NULL;
    jg_vocab *v = NULL;
    int rc = tok_open(&t, vp, cp, TOK_PAT_KIMI, err, errlen);
    if (rc) return rc;
    const char *schema = o->schema ? o->schema : k_schema;
    rc = strata_grammar_json_schema(&g, schema, strlen(schema), err, errlen);
    const int32_t n_vocab = tok_n_vocab(t);
    double t0 = strata_now();
    if (!rc) rc = jgram_vocab_build(&v, n_vocab, text_bytes, t, err, errlen);
    const double t_build = strata_now() - t0;
    /* any special id ends the document (the bench needs one, not the model's) */
    int32_t end = -1;
    for (int32_t id = n_vocab - 1; id >= 0 && end < 0; id--)
        if (tok_is_special(t, id)) end = id;
    if (!rc && end < 0) rc = base_fail(err, errlen, STRATA_EINVAL, "%s: no special id to end a document", vp);
    gm_run r[2];
    for (int fast = 0; fast < 2 && !rc; fast++) rc = run_path(g, v, n_vocab, end, fast, o->steps, &r[fast], err, errlen);
    if (!rc && r[0].ids != r[1].ids) rc = base_fail(err, errlen, STRATA_ECORRUPT, "the two paths chose different ids: masks differ");
    if (!rc) {
        fprintf(out, "grammar masks: %s, vocabulary %d ids, trie and plain sets %.1f MB built in %.3f s\n", o->model_dir, n_vocab,
                jgram_vocab_bytes(v) / 1e6, t_build);
        static const char *const name[2] = {"whole-trie walk", "string fast path"};
        for (int f = 0; f < 2; f++)
            fprintf(out, "  %-16s %lld masks (%lld from the cache): %.3f ms per computed mask (max %.3f), %.3f ms per step\n", name[f],
                    (long long)r[f].masks, (long long)r[f].cached,
                    r[f].masks > r[f].cached ? r[f].t_computed / (double)(r[f].masks - r[f].cached) * 1e3 : 0, r[f].t_max * 1e3,
                    r[f].t_all / (double)r[f].masks * 1e3);
        fprintf(out, "  per step: fast path %.1fx faster (same ids, hash %016llx)\n",
                r[1].t_all > 0 ? r[0].t_all / r[1].t_all : 0, (unsigned long long)r[1].ids);
    }
    jgram_vocab_free(v);
    strata_grammar_free(g);
    tok_close(t);
    return rc;
}
