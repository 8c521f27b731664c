/* fz_manifest.c: bytes -> a pack's manifest.json -> pack_open (and, when it opens,
 * pack_verify). The manifest is on-disk state that a crash, a full disk or a hand
 * edit can damage; `strata run` and `strata pack --verify` then read offsets,
 * sizes and hashes from it. A refusal must name the file and say why; a manifest
 * that opens must only ever point inside trunk.bin (pack_verify reads through it).
 *
 * The pack is that of the `tiny` preset (seed 1), generated and packed once per
 * process into a fresh directory under $TMPDIR (removed at exit); the corpus's
 * seed is its manifest. The model directory is not given to pack_open, so the
 * identity and shard stamps (which name that directory) are not what refuses an
 * input: the parsing behind them is. */
/* fuzz.h's opening comment holds "corpus/name/" followed by a star, which
 * -Wcomment flags (an error under make check); silence it for that include. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcomment"
#include "fuzz.h"
#pragma GCC diagnostic pop
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cfg.h"
#include "gen.h"
#include "pack.h"
#include "preset.h"
#include "st.h"

static struct {
    int state; /* 0: not set up, 1: ready, -1: setup failed */
    char root[512], model[600], pack[700], manifest[800];
    cfg c;
    st_index *ix;
} g;

static void cleanup(void) {
    if (g.ix) st_close(g.ix);
    g.ix = NULL;
    if (g.root[0]) base_rm_rf(g.root);
}

static int setup(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g.root, sizeof g.root, "%s/strata-fz-manifest-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g.root)) { g.root[0] = 0; return -1; }
    atexit(cleanup);
    snprintf(g.model, sizeof g.model, "%s/model", g.root);
    snprintf(g.pack, sizeof g.pack, "%s/pack", g.root);
    snprintf(g.manifest, sizeof g.manifest, "%s/manifest.json", g.pack);
    gen_opts o;
    gen_stats st;
    char err[1024], path[700];
    if (preset_get("tiny", &g.c, &o)) return -1;
    o.seed = 1;
    if (gen_model(g.model, &g.c, &o, &st, err, sizeof err)) { fprintf(stderr, "fz_manifest: %s\n", err); return -1; }
    snprintf(path, sizeof path, "%s/config.json", g.model);
    if (cfg_load(&g.c, path, err, sizeof err) || st_open(&g.ix, g.model, err, sizeof err)) {
        fprintf(stderr, "fz_manifest: %s\n", err);
        return -1;
    }
    pack_result res;
    if (pack_build(g.model, &g.c, g.ix, g.pack, 0, NULL, NULL, &res, err, sizeof err)) {
        fprintf(stderr, "fz_manifest: %s\n", err);
        return -1;
    }
    return 0;
}

FUZZ_ENTRY(manifest) {
    if (g.state == 0) g.state = setup() ? -1 : 1;
    ST_ASSERT(g.state == 1); /* a harness that cannot set up must not pass silently */
    FILE *f = fopen(g.manifest, "wb");
    ST_ASSERT(f != NULL);
    if (size) ST_ASSERT(fwrite(data, 1, size, f) == size);
    ST_ASSERT(fclose(f) == 0);
    pack *p = NULL;
    char err[2048];
    err[0] = 0;
    if (pack_open_ex(&p, g.pack, NULL, &g.c, g.ix, 0, err, sizeof err)) {
        ST_ASSERT(p == NULL && err[0] != 0 && (strstr(err, g.pack) || strstr(err, "pack:")));
        return 0;
    }
    /* it opened: every offset it holds lies inside trunk.bin and the shards, so
     * re-reading and hashing them is an answer (a mismatch is an error), never a
     * read out of bounds */
    err[0] = 0;
    if (pack_verify(p, &g.c, g.ix, NULL, NULL, err, sizeof err)) ST_ASSERT(err[0] != 0);
    pack_close(p);
    return 0;
}
