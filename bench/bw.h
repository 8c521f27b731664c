/*
 * bw.h: what the benchmarks (b_kern.c, b_decode.c, ladder/place_run.c) add to the
 * library's memory probe (strata_membw_read, the same probe the planner's
 * prediction divides by): the load average beside each number, and the CPU time
 * the hypervisor stole from a run (place_run's steal_pct). Static functions
 * for bench programs only (one includer each).
 */
#ifndef STRATA_BENCH_BW_H
#define STRATA_BENCH_BW_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* Other processes share the cores and the memory bus: the load average says how
 * much to trust a run. */
static void bw_print_load(const char *what) {
    FILE *f = fopen("/proc/loadavg", "r");
    double l1 = -1;
    if (f) { if (fscanf(f, "%lf", &l1) != 1) l1 = -1; fclose(f); }
    if (l1 >= 0) printf("%s: 1-minute load average %.2f\n", what, l1);
}

/* CPU time the hypervisor gave to other guests ("steal", /proc/stat), summed over
 * every CPU, in seconds; -1 where there is none to read. On the shared VM the
 * ladder ran on (2026-12-06), 6.2 GB runs that lost 0.43-0.73 s of CPU to steal
 * decoded at 0.152-0.167 s/token, those that lost 0.04-0.06 s at 0.137-0.154: the
 * ladder reports it beside each rung so such a run can be told from a slower
 * engine. */
static inline double bw_steal_s(void) {
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    int n = 0;
    if (f) {
        n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
        fclose(f);
    }
    const long hz = sysconf(_SC_CLK_TCK);
    return n == 8 && hz > 0 ? (double)v[7] / (double)hz : -1;
}

#endif
