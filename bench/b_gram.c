/*
 * b_gram.c: constrained decoding (structured output) against plain decoding.
 *
 * Two measurements:
 *   --masks DIR   the mask alone on DIR's vocabulary (strata_bench_grammar_masks:
 *                 whole-trie walk vs the string fast path, ms per step); `make
 *                 bench-grammar` gives it a generated model with K3's 163,840 ids;
 *                 --schema FILE measures FILE's schema instead of the built-in one.
 *   MODEL_DIR     greedy decode of --tokens tokens after a 3-token prompt, plain
 *                 and under a JSON schema (mostly length-bounded strings, as tool
 *                 arguments are), alternating, --reps times each; prints the
 *                 median s/token of each, their ratio (the target at 1 GB on
 *                 ladder: <= 1.05) and, for a resident model, the memory floor
 *                 (bytes/token / measured read bandwidth, as b_decode does).
 * A constrained document may end before --tokens (its end id): s/token counts
 * the tokens actually generated, prefill excluded.
 *
 * usage: b_gram [MODEL_DIR] [--ram-gb X] [--threads N] [--tokens N] [--reps N] [--masks DIR] [--schema FILE] [--steps N]
 * Reference run: docs/performance.md, Structured output.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bw.h"
#include "strata.h"
#include "strata_bench.h"

static const char k_schema[] =
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"maxLength\":40},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},"
    "\"count\":{\"type\":\"integer\"},\"body\":{\"type\":\"string\",\"maxLength\":400}},"
    "\"required\":[\"title\",\"tags\",\"count\",\"body\"]}";

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* CPU seconds of the whole process: with --threads 1, far less disturbed by
 * other processes than wall time (as in b_decode). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct { double t_first, c_first; int64_t n; } clock_ud;

static void on_token(void *ud, strata_gen *g, int32_t id, const char *text, size_t len, const float *logits) {
    clock_ud *c = ud;
    if (c->n++ == 0) { c->t_first = strata_now(); c->c_first = cpu_now(); } /* decode starts after the first token */
}

/* One greedy generation; *s_tok, *c_tok: wall and CPU seconds per decoded token after the first. */
static int run_one(strata_model *m, strata_seq *s, const strata_grammar *gr, int n_tok, double *s_tok, double *c_tok, int64_t *n_out,
                   char *err, size_t errlen) {
    const int32_t prompt[3] = {1, 2, 3};
    strata_gen_opts o = strata_gen_opts_default();
    o.temp = 0;
    o.max_tokens = n_tok;
    o.stop_at_end = gr != NULL; /* the grammar's end; plain decode runs all n_tok */
    o.prefix = 0;
    o.grammar = gr;
    strata_gen *g = NULL;
    int rc = strata_gen_create(&g, s, prompt, 3, &o, 0, err, errlen);
    clock_ud c = {0, 0, 0};
    if (!rc)
        while ((rc = strata_gen_step(m, &g, 1, on_token, &c, err, errlen)) > 0) {}
    const double t_end = strata_now(), c_end = cpu_now();
    strata_gen_free(g);
    if (rc < 0) return rc;
    *n_out = c.n;
    *s_tok = c.n > 1 ? (t_end - c.t_first) / (double)(c.n - 1) : 0;
    *c_tok = c.n > 1 ? (c_end - c.c_first) / (double)(c.n - 1) : 0;
    return 0;
}

static int parse_num(const char *s, const char *what, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (*s == 0 || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "b_gram: %s must be a number in [%g, %g]\n", what, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *dir = NULL, *masks = NULL, *schema_file = NULL;
    double ram_gb = 0, threads = strata_default_threads(), n_tok = 64, reps = 3, steps = 2000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int need = !strcmp(a, "--ram-gb") || !strcmp(a, "--threads") || !strcmp(a, "--tokens") || !strcmp(a, "--reps") ||
                   !strcmp(a, "--masks") || !strcmp(a, "--steps") || !strcmp(a, "--schema");
        if (need && i + 1 >= argc) { fprintf(stderr, "b_gram: %s needs a value\n", a); return 2; }
        int bad = 0;
        if (!strcmp(a, "--ram-gb")) bad = parse_num(argv[++i], a, 0, 1e6, &ram_gb);
        else if (!strcmp(a, "--threads")) bad = parse_num(argv[++i], a, 1, 64, &threads);
        else if (!strcmp(a, "--tokens")) bad = parse_num(argv[++i], a, 2, 4096, &n_tok);
        else if (!strcmp(a, "--reps")) bad = parse_num(argv[++i], a, 1, 99, &reps);
        else if (!strcmp(a, "--steps")) bad = parse_num(argv[++i], a, 1, 1e7, &steps);
        else if (!strcmp(a, "--masks")) masks = argv[++i];
        else if (!strcmp(a, "--schema")) schema_file = argv[++i];
        else if (a[0] == '-') bad = 1;
        else dir = a;
        if (bad) {
            fprintf(stderr, "usage: b_gram [MODEL_DIR] [--ram-gb X] [--threads N] [--tokens N] [--reps N] [--masks DIR] [--schema FILE] [--steps N]\n");
            return 2;
        }
    }
    char err[4096];
    if (masks) {
        static char text[1 << 16];
        if (schema_file) {
            FILE *f = fopen(schema_file, "rb");
            size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
            if (f) fclose(f);
            if (!n) { fprintf(stderr, "b_gram: cannot read %s\n", schema_file); return 1; }
            text[n] = 0;
        }
        strata_bench_gmask_opts go = {masks, schema_file ? text : NULL, (int)steps};
        if (strata_bench_grammar_masks(&go, stdout, err, sizeof err)) { fprintf(stderr, "b_gram: %s\n", err); return 1; }
    }
    if (!dir) return 0;
    strata_model *m = NULL;
    strata_seq *s = NULL;
    strata_grammar *gr = NULL;
    strata_membw *bp = NULL;
    int ret = 1;
    strata_model_opts mo = strata_model_opts_default();
    mo.n_threads = (int)threads;
    mo.ram_bytes = (uint64_t)(ram_gb * 1e9);
    mo.ctx = 3 + (int64_t)n_tok + 1;
    if (strata_model_open(&m, dir, err, sizeof err) || strata_model_load(m, &mo, err, sizeof err) ||
        strata_seq_create(m, &s, err, sizeof err) || strata_grammar_json_schema(&gr, k_schema, strlen(k_schema), err, sizeof err)) {
        fprintf(stderr, "b_gram: %s\n", err);
        goto out;
    }
    strata_model_info info;
    strata_model_get_info(m, &info);
    bw_print_load("load before");
    printf("strata grammar bench: %s, vocab %lld, %s, %d threads, %d tokens x %d reps\n", dir, (long long)info.vocab,
           ram_gb > 0 ? "under a RAM budget" : "resident", (int)threads, (int)n_tok, (int)reps);
    if (ram_gb > 0) printf("RAM budget %.2f GB\n", ram_gb);
    double plain[100], cons[100], cplain[100], ccons[100];
    int64_t n_cons = 0;
    {   /* warm-up: the vocabulary trie is built at the first constrained generator */
        double t, c;
        int64_t n;
        const double t0 = strata_now();
        if (run_one(m, s, gr, 2, &t, &c, &n, err, sizeof err)) { fprintf(stderr, "b_gram: %s\n", err); goto out; }
        printf("first constrained generator (builds the vocabulary trie): %.3f s\n", strata_now() - t0);
    }
    for (int r = 0; r < (int)reps; r++) {
        int64_t n;
        if (run_one(m, s, NULL, (int)n_tok, &plain[r], &cplain[r], &n, err, sizeof err) ||
            run_one(m, s, gr, (int)n_tok, &cons[r], &ccons[r], &n_cons, err, sizeof err)) {
            fprintf(stderr, "b_gram: %s\n", err);
            goto out;
        }
        printf("  rep %d: plain %.4f s/token (CPU %.4f), constrained %.4f s/token (CPU %.4f, %lld tokens)\n", r + 1, plain[r], cplain[r],
               cons[r], ccons[r], (long long)n_cons);
    }
    const double mp = median(plain, (int)reps), mc = median(cons, (int)reps);
    const double cp = median(cplain, (int)reps), cc = median(ccons, (int)reps);
    printf("decode: plain %.4f s/token, constrained %.4f s/token (median of %d); ratio %.3f (target <= 1.05)\n", mp, mc, (int)reps,
           mc / mp);
    printf("CPU time: plain %.4f s/token, constrained %.4f s/token (all threads, spinning included); ratio %.3f\n", cp, cc, cc / cp);
    if (ram_gb <= 0 && !strata_membw_open(&bp, (int)threads, 512u << 20)) {
        const double tok_bytes = (double)(info.trunk_bytes + (uint64_t)info.n_moe_layers * (uint64_t)info.topk * info.expert_bytes +
                                          info.head_bytes + info.embed_row_bytes + info.state_touch_bytes);
        double bw = strata_membw_read(bp, 8);
        printf("memory floor: %.1f MB/token / %.2f GB/s = %.4f s/token; plain %.2fx, constrained %.2fx of it\n", tok_bytes / 1e6, bw,
               tok_bytes / (bw * 1e9), mp / (tok_bytes / (bw * 1e9)), mc / (tok_bytes / (bw * 1e9)));
    }
    bw_print_load("load after");
    ret = 0;
out:
    strata_membw_close(bp);
    strata_grammar_free(gr);
    strata_seq_free(s);
    strata_model_close(m);
    return ret;
}
