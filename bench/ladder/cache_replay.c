/*
 * cache_replay.c: replays an expert request trace (place_run --trace FILE: int32
 * LE (layer, expert) pairs; one experts_request call = one layer's union) through
 * the cache at several sizes with every policy (S3-FIFO, LRU, LFU, LAYER) and
 * prints the TRUE resident hit rate of each (hits on keys already resident when
 * requested), beside two bounds: Belady's MIN (the optimal offline policy: on a
 * miss, evict the resident key requested again last) and the ceiling (every
 * request but a key's first). Leases are held for each layer's union, as in the
 * engine, in the policies and in MIN alike. The replay is strata_bench_cache_replay
 * (include/strata_bench.h, src/bench.c).
 *
 * usage: cache_replay TRACE N_EXPERTS SLOTS...   (--csv: comma-separated)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "strata_bench.h"

int main(int argc, char **argv) {
    int csv = argc > 1 && !strcmp(argv[1], "--csv");
    if (argc < 4 + csv) { fprintf(stderr, "usage: cache_replay [--csv] TRACE N_EXPERTS SLOTS...\n"); return 2; }
    int64_t ne = 0;
    if (strata_parse_i64(argv[2 + csv], 1, INT32_MAX, &ne)) {
        fprintf(stderr, "cache_replay: N_EXPERTS %s: expected an integer >= 1\n", argv[2 + csv]);
        return 2;
    }
    const int n_slots = argc - 3 - csv;
    int64_t *slots = calloc((size_t)n_slots, sizeof *slots);
    if (!slots) { fprintf(stderr, "cache_replay: out of memory\n"); return 1; }
    for (int a = 0; a < n_slots; a++)
        if (strata_parse_i64(argv[3 + csv + a], 1, INT64_MAX / 2, &slots[a])) {
            fprintf(stderr, "cache_replay: SLOTS %s: expected an integer >= 1\n", argv[3 + csv + a]);
            free(slots);
            return 2;
        }
    strata_bench_replay_opts o = {.trace = argv[1 + csv], .n_experts = ne, .slots = slots, .n_slots = n_slots, .csv = csv};
    char err[512];
    int rc = strata_bench_cache_replay(&o, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "cache_replay: %s\n", err);
    free(slots);
    return rc ? 1 : 0;
}
