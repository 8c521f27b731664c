/*
 * gen_api.c: include/strata_gen.h over the generator (gen.h) and its presets
 * (preset.h): what `strata gen-model` calls.
 */
#include <stddef.h>
#include <string.h>
#include "base.h"
#include "cfg.h"
#include "gen.h"
#include "preset.h"
#include "strata.h"
#include "strata_gen.h"

_Static_assert(sizeof(strata_genmodel_preset) == sizeof(preset_info) &&
                   offsetof(strata_genmodel_preset, name) == offsetof(preset_info, name) &&
                   offsetof(strata_genmodel_preset, summary) == offsetof(preset_info, summary) &&
                   offsetof(strata_genmodel_preset, big) == offsetof(preset_info, big) &&
                   offsetof(strata_genmodel_preset, tiny) == offsetof(preset_info, tiny),
               "the public preset is preset_info");
_Static_assert((int)STRATA_GENMODEL_TRUNK_BF16 == (int)GEN_TRUNK_BF16 && (int)STRATA_GENMODEL_TRUNK_MIXED == (int)GEN_TRUNK_MIXED &&
                   (int)STRATA_GENMODEL_TRUNK_F32 == (int)GEN_TRUNK_F32,
               "gen.h's trunk dtypes");

size_t strata_genmodel_preset_count(void) { return preset_count(); }
const strata_genmodel_preset *strata_genmodel_preset_at(size_t i) { return (const strata_genmodel_preset *)preset_at(i); }
const strata_genmodel_preset *strata_genmodel_preset_find(const char *name) {
    return (const strata_genmodel_preset *)preset_find(name);
}

int strata_genmodel_preset_sizes(const char *name, strata_genmodel_sizes *out, char *err, size_t errlen) {
    cfg c;
    gen_opts o;
    gen_sizes s;
    memset(out, 0, sizeof *out);
    if (preset_get(name, &c, &o)) return base_fail(err, errlen, STRATA_EINVAL, "unknown preset '%s'", name);
    int rc = gen_model_sizes(&c, &o, &s, err, errlen);
    if (rc) return rc;
    out->total = s.total;
    out->experts = s.experts;
    out->n_shards = s.n_shards;
    return STRATA_OK;
}

int strata_genmodel_write(const char *out_dir, const strata_genmodel_opts *go, strata_genmodel_stats *out, char *err,
                          size_t errlen) {
    cfg c;
    gen_opts o;
    memset(out, 0, sizeof *out);
    if (go->preset) {
        if (preset_get(go->preset, &c, &o)) return base_fail(err, errlen, STRATA_EINVAL, "unknown preset '%s'", go->preset);
    } else {
        memset(&o, 0, sizeof o);
        int rc = cfg_load(&c, go->config, err, errlen);
        if (rc) return rc;
    }
    if (go->have_seed) o.seed = go->seed;
    if (go->shard_bytes > 0) o.shard_bytes = go->shard_bytes;
    if (go->n_reserved) o.n_reserved = go->n_reserved;
    if (go->experts_bf16 || go->weights == STRATA_GENMODEL_W_BF16) { o.experts_bf16 = 1; o.weights = GEN_W_PRESET; }
    else if (go->weights) o.weights = go->weights;
    if ((go->scales_pow2 || go->dequantize) && o.weights == GEN_W_PRESET)
        return base_fail(err, errlen, STRATA_EINVAL, "--scales and --dequantize need FP8 or INT4 weights (--weights, or a "
                         "preset in such a layout)");
    if (go->scales_pow2) o.scales_pow2 = 1;
    if (go->dequantize) o.dequantize = 1;
    if (go->trunk_dtype >= 0) o.trunk_dtype = go->trunk_dtype;
    o.force = go->force;
    o.sparse = go->sparse;
    o.progress = go->progress;
    o.progress_ud = go->progress_ud;
    gen_stats st;
    int rc = gen_model(out_dir, &c, &o, &st, err, errlen);
    if (rc) return rc;
    out->total_bytes = st.total_bytes;
    out->n_tensors = st.n_tensors;
    out->n_shards = st.n_shards;
    out->secs = st.secs;
    out->mb_per_s = st.mb_per_s;
    out->prep_secs = st.prep_secs;
    out->io_secs = st.io_secs;
    out->gen_wait_secs = st.gen_wait_secs;
    out->sync_secs = st.sync_secs;
    return STRATA_OK;
}
