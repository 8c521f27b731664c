/*
 * t_sample.c: the sampler: greedy ties, seeded reproducibility, each filter's
 * effect, the repetition penalty, and the stop-id set.
 */
#include <string.h>
#include "sample.h"
#include "test.h"

static sampler *mk(int64_t n, double temp, int64_t top_k, double top_p, double min_p, double rp, uint64_t seed) {
    sample_opts o = SAMPLE_OPTS_DEFAULT;
    o.temp = temp; o.top_k = top_k; o.top_p = top_p; o.min_p = min_p; o.repeat_penalty = rp; o.seed = seed;
    sampler *s = NULL;
    char err[128];
    CHECK(sampler_create(&s, n, &o, err, sizeof err) == 0);
    return s;
}

TEST(sample_greedy_and_filters) {
    float x[8] = {1, 3, 3, -2, 0.5f, 3, -1, 2};
    CHECK(sample_argmax(x, 8) == 1); /* ties to the lowest id */
    float nanx[3] = {NAN, 1, 2};
    CHECK(sample_argmax(nanx, 3) == 2);
    sampler *g = mk(8, 0, 0, 1, 0, 1, 0);
    CHECK(sampler_next(g, x, NULL, 0) == 1);
    /* repetition penalty: ids 1 and 2 seen -> 3/2 = 1.5 < 2 (id 7) and id 5 = 3 wins */
    sampler_free(g);
    g = mk(8, 0, 0, 1, 0, 2.0, 0);
    int32_t hist[3] = {1, 2, 1};
    CHECK(sampler_next(g, x, hist, 3) == 5);
    int32_t hist2[2] = {1, 5};
    float y[8] = {1, 3, 2.9f, -2, 0.5f, 3, -1, 2};
    CHECK(sampler_next(g, y, hist2, 2) == 2); /* 3/2 for both 1 and 5 */
    sampler_free(g);
    const float z[8] = {1, 3, 2.9f, -2, 0.5f, 2.8f, -1, 2};
    /* top-k 1, min-p 1 and a tiny top-p are all greedy whatever the seed */
    for (uint64_t seed = 0; seed < 20; seed++) {
        sampler *a = mk(8, 1.5, 1, 1, 0, 1, seed), *b = mk(8, 1.5, 0, 1, 1.0, 1, seed), *c = mk(8, 1.5, 0, 1e-6, 0, 1, seed);
        CHECK(sampler_next(a, x, NULL, 0) == 1);
        CHECK(sampler_next(b, z, NULL, 0) == 1); /* min-p 1 keeps every tie of the max: use z */
        CHECK(sampler_next(c, x, NULL, 0) == 1);
        sampler_free(a); sampler_free(b); sampler_free(c);
    }
    /* top-k 3 never leaves {1, 2, 5}; top-p 0.5 of a flat 4-way distribution keeps 2 */
    sampler *k3 = mk(8, 1.0, 3, 1, 0, 1, 7);
    float flat[4] = {0, 0, 0, 0};
    sampler *tp = mk(4, 1.0, 0, 0.5, 0, 1, 9);
    int hits[4] = {0};
    for (int i = 0; i < 400; i++) {
        int32_t id = sampler_next(k3, x, NULL, 0);
        CHECK(id == 1 || id == 2 || id == 5);
        hits[sampler_next(tp, flat, NULL, 0)]++;
    }
    CHECK(hits[0] > 120 && hits[1] > 120 && hits[2] == 0 && hits[3] == 0);
    sampler_free(k3);
    sampler_free(tp);
}

TEST(sample_seeded) {
    enum { V = 1000, N = 200 };
    float *lg = base_alloc(V * sizeof(float), MEM_MISC);
    pcg32 r;
    pcg32_seed(&r, 42, 1);
    for (int i = 0; i < V; i++) lg[i] = (float)(pcg32_unit(&r) * 4.0);
    int32_t a[N], b[N], c[N];
    sampler *s1 = mk(V, 0.8, 50, 0.9, 0.01, 1.1, 123), *s2 = mk(V, 0.8, 50, 0.9, 0.01, 1.1, 123), *s3 = mk(V, 0.8, 50, 0.9, 0.01, 1.1, 124);
    for (int i = 0; i < N; i++) {
        a[i] = sampler_next(s1, lg, a, i);
        b[i] = sampler_next(s2, lg, b, i);
        c[i] = sampler_next(s3, lg, c, i);
    }
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(memcmp(a, c, sizeof a) != 0);
    /* frequencies follow softmax(x / T): two ids, logits 0 and ln 3 -> 1:3 */
    float two[2] = {0, (float)log(3.0)};
    sampler *s4 = mk(2, 1.0, 0, 1, 0, 1, 5);
    int n1 = 0;
    for (int i = 0; i < 8000; i++) n1 += sampler_next(s4, two, NULL, 0);
    CHECK_MSG(n1 > 5800 && n1 < 6200, "n1 = %d of 8000 (expected ~6000)", n1);
    /* pcg32_unit stays in [0, 1) */
    double lo = 1, hi = 0;
    for (int i = 0; i < 100000; i++) { double u = pcg32_unit(&r); if (u < lo) lo = u; if (u > hi) hi = u; }
    CHECK(lo >= 0 && lo < 1e-3 && hi < 1 && hi > 0.999);
    sampler_free(s1); sampler_free(s2); sampler_free(s3); sampler_free(s4);
    base_free(lg);
    /* bad options */
    sample_opts o = SAMPLE_OPTS_DEFAULT;
    sampler *x = NULL;
    o.top_p = 0;
    CHECK(sampler_create(&x, 10, &o, NULL, 0) == STRATA_EINVAL && !x);
    o.top_p = 1; o.temp = -1;
    CHECK(sampler_create(&x, 10, &o, NULL, 0) == STRATA_EINVAL);
}

TEST(sample_stop_ids) {
    cfg c;
    memset(&c, 0, sizeof c);
    c.vocab = 163840;
    c.n_eos = 1;
    c.eos_ids[0] = 163586;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/stopcfg", t_tmpdir);
    base_mkdir_p(dir, NULL, 0);
    int32_t ids[8];
    CHECK(sample_stop_ids(dir, &c, ids, 8, NULL, 0) == 1 && ids[0] == 163586);
    const char *tc = "{\"eos_token\": {\"content\": \"[EOS]\"}, \"added_tokens_decoder\": {"
                     "\"163584\": {\"content\": \"[BOS]\"}, \"163585\": {\"content\": \"[EOS]\"},"
                     "\"163586\": {\"content\": \"<|end_of_msg|>\"}, \"999999\": {\"content\": \"[EOS]\"}}}";
    char p[700];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(tc, f);
    fclose(f);
    int n = sample_stop_ids(dir, &c, ids, 8, NULL, 0);
    CHECK(n == 2);
    CHECK((ids[0] == 163586 && ids[1] == 163585));
    f = fopen(p, "w");
    fputs("{broken", f);
    fclose(f);
    char err[256];
    CHECK(sample_stop_ids(dir, &c, ids, 8, err, sizeof err) < 0);
}
