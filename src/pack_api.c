/*
 * pack_api.c: the "packs" section of strata.h: `strata pack` and `strata pack
 * --verify` as library calls over pack.h (the model's config and index read
 * here, the pack written or checked there).
 */
#include <string.h>
#include "base.h"
#include "cfg.h"
#include "pack.h"
#include "st.h"
#include "strata.h"

_Static_assert(STRATA_PACK_FORCE == PACK_FORCE && STRATA_PACK_MEASURE == PACK_MEASURE, "pack.h's flags");

/* The model's config and index; *c allocated here (cfg is large). */
static int open_model(const char *model_dir, cfg **c, st_index **ix, char *err, size_t errlen) {
    char path[2048];
    *ix = NULL;
    if (!(*c = base_alloc(sizeof **c, MEM_MISC))) return base_fail(err, errlen, STRATA_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    int rc = cfg_load(*c, path, err, errlen);
    if (!rc) rc = st_open(ix, model_dir, err, errlen);
    return rc;
}

int strata_pack_build(const char *model_dir, const char *out_dir, int flags, strata_pack_progress_fn progress, void *ud,
                      strata_pack_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    cfg *c = NULL;
    st_index *ix = NULL;
    int rc = open_model(model_dir, &c, &ix, err, errlen);
    if (!rc) {
        pack_result pr;
        res->started = 1;
        rc = pack_build(model_dir, c, ix, out_dir, flags & (PACK_FORCE | PACK_MEASURE), progress, ud, &pr, err, errlen);
        if (!rc) {
            res->already = pr.already;
            snprintf(res->dir, sizeof res->dir, "%s", pr.dir);
            snprintf(res->stale, sizeof res->stale, "%s", pr.stale);
            res->trunk_bytes = pr.trunk_bytes;
            res->trunk_secs = pr.trunk_secs;
            res->write_bw = pr.write_bw;
            res->disk_bw = pr.disk_bw;
            res->src_direct_bytes = pr.src_direct_bytes;
            res->src_cached_bytes = pr.src_cached_bytes;
            res->expert_bytes_hashed = pr.expert_bytes_hashed;
            res->expert_secs = pr.expert_secs;
        }
    }
    st_close(ix);
    base_free(c);
    return rc;
}

int strata_pack_verify(const char *model_dir, const char *pack_dir, strata_pack_progress_fn progress, void *ud,
                       strata_pack_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    cfg *c = NULL;
    st_index *ix = NULL;
    int rc = open_model(model_dir, &c, &ix, err, errlen);
    if (!rc && !pack_dir) {
        if (pack_find(model_dir, res->dir, sizeof res->dir))
            pack_dir = res->dir;
        else
            rc = base_fail(err, errlen, STRATA_EIO, "no pack found for %s (run strata pack %s)", model_dir, model_dir);
    }
    if (!rc) {
        if (pack_dir != res->dir) snprintf(res->dir, sizeof res->dir, "%s", pack_dir);
        res->started = 1;
        pack *p = NULL;
        double t0 = base_now();
        /* stale stamps: verify the bytes anyway, that is what tells what changed */
        rc = pack_open_ex(&p, pack_dir, model_dir, c, ix, PACK_OPEN_STALE_OK, err, errlen);
        if (!rc) rc = pack_verify(p, c, ix, progress, ud, err, errlen);
        if (!rc) {
            res->trunk_bytes = p->trunk_bytes;
            res->n_experts = p->n_moe * p->n_experts;
            res->secs = base_now() - t0;
            snprintf(res->stale, sizeof res->stale, "%s", p->stale);
        }
        pack_close(p);
    }
    st_close(ix);
    base_free(c);
    return rc;
}
