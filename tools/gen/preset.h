/*
 * preset.h: named model configurations for `strata gen-model` and for tests and
 * other modules that need a model of a given shape (tiny variants for tests, demo
 * for the quick start, ladder larger than RAM, k3 the real configuration).
 */
#ifndef STRATA_PRESET_H
#define STRATA_PRESET_H

#include <stddef.h>
#include "cfg.h"
#include "gen.h"

typedef struct preset_info {
    const char *name;
    const char *summary;
    int big;      /* larger than a test machine's disk: writing needs --force or --sparse */
    int tiny;     /* a few MB at most: cheap enough for unit tests */
} preset_info;

size_t preset_count(void);
const preset_info *preset_at(size_t i);    /* i < preset_count() */
const preset_info *preset_find(const char *name);  /* NULL if unknown */

/* Fills c (from scratch) and o (defaults, then the preset's generator options;
 * o->preset = name) for preset `name`. STRATA_EINVAL if there is no such preset. */
int preset_get(const char *name, cfg *c, gen_opts *o);

#endif
