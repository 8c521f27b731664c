/*
 * engine_stats.h: the engine's counters, below both infer.h (which hands them out)
 * and engine_int.h (whose struct engine holds them), so neither header needs the
 * other.
 */
#ifndef STRATA_ENGINE_STATS_H
#define STRATA_ENGINE_STATS_H

#include <stdint.h>

/* Self-drafting (engine_draft_step): passes run, layers visited and skipped (not
 * in RAM), experts chosen and dropped (not in RAM). */
typedef struct engine_draft_stats {
    int64_t passes, layers, layers_skipped, experts, experts_dropped;
} engine_draft_stats;

#endif
