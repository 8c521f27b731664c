/*
 * b_batch.c: many rows per weight pass (make bench-batch). One configuration per
 * process, driven only through strata.h:
 *
 *   b_batch MODEL --ram-gb X --seqs N [--gen G] [--prompt-len P] [--csv F]
 *       N sequences with distinct P-token prompts are prefilled, then decoded
 *       together for G steps: aggregate decode tokens/s, GB read per token.
 *   b_batch MODEL --ram-gb X --prefill P [--csv F]
 *       one P-token prompt (passes of 64 rows): seconds, GB read, against the
 *       ideal bytes (every pass reads the streamed trunk once and each distinct
 *       expert of its union once) over the disk bandwidth given by --disk-bw
 *       (measured by run.sh in the same run).
 *
 * One CSV line per run: budget_gb,mode,n,tokens,seconds,tokens_per_s,gb_read,
 * gb_read_per_token,ideal_gb,floor_s,time_over_floor,read_over_ideal,ids_hash.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "strata.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ULL; }
    return h;
}

static int usage(void) {
    fprintf(stderr, "usage: b_batch MODEL --ram-gb X (--seqs N [--gen G] [--prompt-len P] | --prefill P) "
                    "[--disk-bw BYTES_PER_S] [--threads N] [--csv FILE]\n");
    return 2;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *csv = NULL;
    double ram_gb = -1, disk_bw = 0;
    int seqs = 0, gen = 4, plen = 16, prefill = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--ram-gb")) { ram_gb = atof(v); i++; }
        else if (!strcmp(a, "--seqs")) { seqs = atoi(v); i++; }
        else if (!strcmp(a, "--gen")) { gen = atoi(v); i++; }
        else if (!strcmp(a, "--prompt-len")) { plen = atoi(v); i++; }
        else if (!strcmp(a, "--prefill")) { prefill = atoi(v); i++; }
        else if (!strcmp(a, "--disk-bw")) { disk_bw = atof(v); i++; }
        else if (!strcmp(a, "--threads")) { threads = atoi(v); i++; }
        else if (!strcmp(a, "--csv")) { csv = v; i++; }
        else if (!dir) dir = a;
        else return usage();
    }
    if (!dir || ram_gb < 0 || (seqs < 1) == (prefill < 1) || gen < 1 || plen < 1) return usage();
    char err[4096];
    strata_model *m = NULL;
    if (strata_model_open(&m, dir, err, sizeof err)) { fprintf(stderr, "b_batch: %s\n", err); return 1; }
    strata_model_opts o = strata_model_opts_default();
    o.ram_bytes = (uint64_t)(ram_gb * 1e9);
    o.max_seqs = prefill ? 1 : seqs;
    o.ctx = prefill ? prefill + 2 : plen + gen + 2;
    o.n_threads = threads;
    if (strata_model_load(m, &o, err, sizeof err)) { fprintf(stderr, "b_batch: %s\n", err); strata_model_close(m); return 1; }
    strata_model_info info;
    strata_model_get_info(m, &info);
    fprintf(stderr, "b_batch: %s, %s\n", dir, info.placement);
    const int n = prefill ? 1 : seqs;
    strata_seq **sq = calloc((size_t)n, sizeof *sq);
    strata_gen **g = calloc((size_t)n, sizeof *g);
    const int P = prefill ? prefill : plen;
    int32_t *prompt = malloc((size_t)P * sizeof(int32_t));
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    int rc = 1;
    for (int i = 0; i < n; i++) {
        if (strata_seq_create(m, &sq[i], err, sizeof err)) { fprintf(stderr, "b_batch: %s\n", err); goto out; }
        for (int j = 0; j < P; j++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            prompt[j] = (int32_t)((rng >> 33) % (uint64_t)(info.vocab - 8));
        }
        strata_gen_opts go = strata_gen_opts_default();
        go.max_tokens = prefill ? 1 : gen + 1;
        go.stop_at_end = 0;
        if (strata_gen_create(&g[i], sq[i], prompt, P, &go, 0, err, sizeof err)) { fprintf(stderr, "b_batch: %s\n", err); goto out; }
    }
    /* decode runs: each prompt is prefilled alone first (its first token
     * sampled), then the measurement steps all sequences together */
    double t_pre = 0;
    if (!prefill) {
        double tp = now_s();
        for (int i = 0; i < n; i++) {
            int64_t k = 0;
            while (k == 0) {
                if (strata_gen_step(m, &g[i], 1, NULL, NULL, err, sizeof err) < 0) { fprintf(stderr, "b_batch: %s\n", err); goto out; }
                strata_gen_ids(g[i], &k);
            }
        }
        t_pre = now_s() - tp;
    } else {
        /* warm-up: one token loads the pinned trunk (what a server does once at
         * start), then the sequence starts over; only the prompt is measured */
        strata_row w = {sq[0], prompt[0], 0};
        if (strata_step(m, &w, 1, NULL, err, sizeof err)) { fprintf(stderr, "b_batch: %s\n", err); goto out; }
        strata_seq_reset(sq[0]);
    }
    strata_model_reset_stats(m);
    double t0 = now_s();
    for (int active = n; active > 0;) {
        active = strata_gen_step(m, g, n, NULL, NULL, err, sizeof err);
        if (active < 0) { fprintf(stderr, "b_batch: %s\n", err); goto out; }
    }
    const double secs = now_s() - t0;
    strata_stats st;
    strata_model_get_stats(m, &st);
    const double gb_read = (double)(st.bytes_trunk + st.bytes_head + st.bytes_embed + st.bytes_experts) / 1e9;
    const int64_t tokens = prefill ? prefill : (int64_t)n * gen;
    /* ideal: the streamed trunk once per pass, each union expert once (the window
     * requests a pass's union exactly once per layer: requests = sum of unions) */
    const int64_t passes = prefill ? (prefill + info.rows - 1) / info.rows : gen;
    const double per_exp = st.expert_misses ? (double)st.bytes_experts / (double)st.expert_misses : (double)info.expert_bytes;
    const double ideal = ((double)info.streamed_bytes * (double)passes + (double)st.expert_requests * per_exp) / 1e9;
    const double floor_s = disk_bw > 0 ? ideal * 1e9 / disk_bw : 0;
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) { int64_t k; const int32_t *ids = strata_gen_ids(g[i], &k); h = fnv(ids, (size_t)k * 4, h); }
    char line[512];
    snprintf(line, sizeof line, "%g,%s,%d,%lld,%.3f,%.3f,%.3f,%.4f,%.3f,%.3f,%.3f,%.3f,%016llx", ram_gb,
             prefill ? "prefill" : "decode", prefill ? prefill : n, (long long)tokens, secs, secs > 0 ? (double)tokens / secs : 0,
             gb_read, gb_read / (double)tokens, ideal, floor_s, floor_s > 0 ? secs / floor_s : 0, ideal > 0 ? gb_read / ideal : 0,
             (unsigned long long)h);
    printf("%s\n", line);
    fprintf(stderr, "b_batch: %s (prefill %.2f s; %llu expert requests, %.1f%% hits, peak RSS %.3f GB)\n", line, t_pre,
            (unsigned long long)st.expert_requests, 100 * st.hit_rate, (double)st.peak_rss / 1e9);
    if (csv) {
        FILE *f = fopen(csv, "a");
        if (f) { fprintf(f, "%s\n", line); fclose(f); }
    }
    rc = 0;
out:
    for (int i = 0; i < n; i++) { strata_gen_free(g[i]); strata_seq_free(sq[i]); }
    free(g);
    free(sq);
    free(prompt);
    strata_model_close(m);
    return rc;
}
