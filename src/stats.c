/*
 * stats.c: the table of strata_stats' counters, made from the STRATA_STATS_*
 * lists of strata.h, for the front-ends that walk them (the --json report,
 * /metrics, strata-mpi's per-rank table).
 */
#include <string.h>
#include "strata.h"

/* (metric and col expand to four initialisers each) */
#define IO(t, n, json, metric, col) {#n, offsetof(strata_stats, n), STRATA_STAT_##t, "stats", json, metric, col},
#define DRAFT(t, n, json, metric, col) {#n, offsetof(strata_stats, n), STRATA_STAT_##t, NULL, json, metric, col},
#define PREFIX(t, n, json, metric, col) \
    {"prefix_" #n, offsetof(strata_stats, prefix_##n), STRATA_STAT_##t, "prefix", json, metric, col},

static const strata_stat_field k_fields[] = {
    STRATA_STATS_IO(IO)
    STRATA_STATS_DRAFT(DRAFT)
    STRATA_STATS_PREFIX(PREFIX)
};

const strata_stat_field *strata_stats_fields(int *n) {
    *n = (int)(sizeof k_fields / sizeof *k_fields);
    return k_fields;
}

double strata_stat_value(const strata_stats *s, const strata_stat_field *f) {
    const char *p = (const char *)s + f->offset;
    if (f->type == STRATA_STAT_f64) { double v; memcpy(&v, p, sizeof v); return v; }
    if (f->type == STRATA_STAT_i64) { int64_t v; memcpy(&v, p, sizeof v); return (double)v; }
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return (double)v;
}
