/*
 * bench_tok.c: strata's tokenizer throughput. `bench_tok VOCAB PATTERN FILE [REPS]`
 * loads the vocab, encodes FILE REPS times (default 5) and prints the best pass
 * as "strata PATTERN: X MB/s (N ids, best of REPS, load S s)". Single thread,
 * the same work the npm oracles do in bench.mjs (ordinary encoding, no specials).
 * Time is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): the bench machine is
 * shared, and wall time there swings 3x with other jobs while CPU time holds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "strata.h"

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: bench_tok VOCAB kimi|o200k|cl100k FILE [REPS]\n"); return 2; }
    int pat = strata_tokenizer_pattern(argv[2]);
    int reps = argc > 4 ? atoi(argv[4]) : 5;
    if (pat < 0 || reps < 1) { fprintf(stderr, "bench_tok: bad pattern or reps\n"); return 2; }
    char err[512];
    strata_tokenizer *t;
    double t0 = strata_now();
    if (strata_tokenizer_open(&t, argv[1], NULL, pat, err, sizeof err)) { fprintf(stderr, "bench_tok: %s\n", err); return 1; }
    double t_load = strata_now() - t0;
    uint8_t *text;
    size_t len;
    if (strata_read_file(argv[3], 1u << 30, &text, &len, err, sizeof err)) { fprintf(stderr, "bench_tok: %s\n", err); return 1; }
    double best = 1e30;
    size_t n = 0;
    for (int r = 0; r < reps; r++) {
        int32_t *ids;
        t0 = cpu_now();
        if (strata_tokenizer_encode(t, text, len, 0, &ids, &n)) { fprintf(stderr, "bench_tok: encode failed\n"); return 1; }
        double dt = cpu_now() - t0;
        if (dt < best) best = dt;
        strata_free(ids);
    }
    printf("strata      %-7s %8.2f MB/s  (%zu ids, best of %d, vocab load %.2f s)\n", argv[2], len / best / 1e6, n,
           reps, t_load);
    strata_free(text);
    strata_tokenizer_close(t);
    return 0;
}
