/*
 * b_index.c: how long st_open takes on K3-shaped shards, without the checkpoint.
 *
 * Writes `n_shards` sparse shards (default 8) of ~5,200 tensors each with K3 names
 * and shapes (one layer's trunk, then experts' w1/w2/w3 packed+scale), headers of
 * ~790 KB like the real 96 shards, data left as a hole via ftruncate, plus a
 * model.safetensors.index.json. Times st_open with and without the index and one
 * st_find per tensor. The measurement is strata_bench_index (include/strata_bench.h,
 * src/bench.c). Usage: b_index [n_shards] [tensors_per_shard]
 */
#include <stdio.h>
#include <stdlib.h>
#include "strata_bench.h"

int main(int argc, char **argv) {
    strata_bench_index_opts o = {.n_shards = argc > 1 ? atoi(argv[1]) : 8, .per_shard = argc > 2 ? atoi(argv[2]) : 5200};
    if (o.n_shards < 1 || o.n_shards > 96 || o.per_shard < 8) {
        fprintf(stderr, "usage: b_index [n_shards 1..96] [tensors_per_shard >= 8]\n");
        return 2;
    }
    char err[512];
    if (strata_bench_index(&o, stdout, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}
