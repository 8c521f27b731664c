/*
 * bw.h: what the benchmarks (b_kern.c, b_decode.c, ladder/place_run.c) add to the
 * library's memory probe (src/membw.h: bw_read, the same probe the planner's
 * prediction divides by): the load average beside each number. Static functions
 * for bench programs only (one includer each).
 */
#ifndef STRATA_BENCH_BW_H
#define STRATA_BENCH_BW_H

#include <stdint.h>
#include <stdio.h>
#include "base.h"
#include "membw.h"

/* Other processes share the cores and the memory bus: the load average says how
 * much to trust a run. */
static void bw_print_load(const char *what) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = -1;
    if (f) { if (fscanf(f, "%lf", &l1) != 1) l1 = -1; fclose(f); }
    if (l1 >= 0) printf("%s: 1-minute load average %.2f\n", what, l1);
}

#endif
