/*
 * bench_io.c: disk read bandwidth the way the streaming source reads.
 *
 * On a model directory: (1) routed experts read in place (the 4096-aligned range
 * enclosing each expert's contiguous run) vs the same number of bytes at aligned
 * offsets (what a repacked expert file would read), at several queue depths; (2)
 * large trunk-like reads cut into chunks of 1/4/8 MiB at depth 8/16/32. Every
 * configuration reads experts no earlier configuration touched, with O_DIRECT,
 * so neither the page cache nor a previous pass serves it.
 *
 * With --slices: only (3), the row-slice reads of a trunk streamed below the
 * whole-unit floor (wsrc_rows.c rows_get): 512 MB of fresh shard bytes read in
 * slices of 4..128 MiB, each one request of 4 MiB chunks, the next slice in flight
 * while one is consumed (as infer.c mm_slices asks), three rounds.
 *
 * The measurement is strata_bench_io (include/strata_bench.h, src/bench.c).
 *
 * usage: bench_io MODEL_DIR [--n N] [--slices]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "strata_bench.h"

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bench_io MODEL_DIR [--n N] [--slices]\n"); return 2; }
    strata_bench_io_opts o = {.model_dir = argv[1], .n = 192};
    if (argc > 3 && !strcmp(argv[2], "--n")) o.n = atoi(argv[3]);
    o.slices = !strcmp(argv[argc - 1], "--slices");
    char err[2048];
    if (strata_bench_io(&o, stdout, err, sizeof err)) {
        fprintf(stderr, "bench_io: %s\n", err);
        return 1;
    }
    return 0;
}
