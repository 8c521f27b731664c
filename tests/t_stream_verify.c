/* t_stream_verify.c: damaged bytes never become data: reads from a pack are
 * verified by default, per unit, per row block and per expert, each mismatch
 * named; an unreadable shard is an error; the cold hash equals XXH3. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include "pack.h"
#include "pool.h"
#include "stream_test.h"
#include "wblk.h"

/* a pool job that runs a source's checks (wsrc check_run), as the engine's do */
typedef struct { wsrc *w; } check_task;
static void check_task_fn(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const check_task *c = ctx;
    for (int64_t i = i0; i < i1; i++) c->w->ops->check_run(c->w, (int)i);
}

TEST(stream_errors) {
    /* a copy of a tiny model whose shards we damage after opening */
    const char *dir = tpack_fresh("tiny", "st_err", 21);
    if (!dir) { CHECK(0); return; }
    tstream_model m;
    if (tstream_model_open(&m, dir)) { CHECK(0); return; }
    char err[2048];
    pack_result pr;
    CHECK(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0);
    /* 1. a flipped byte in a streamed layer of the pack: ECORRUPT naming the layer */
    uint64_t b[3];
    tstream_budgets(&m, dir, b);
    place_opts o = tstream_opts(b[0]);
    o.verify_reads = 1;
    place_plan p;
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
    pack *pk = NULL;
    CHECK(pack_open(&pk, p.pack_dir, dir, &m.c, m.ix, err, sizeof err) == 0);
    if (!pk) { tstream_model_close(&m); return; }
    int fd = open(pk->trunk_path, O_RDWR);
    uint8_t byte;
    off_t at = (off_t)(pk->units[2].off + 10);
    CHECK(pread(fd, &byte, 1, at) == 1);
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, at) == 1);
    wsrc *w = NULL;
    CHECK(place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) == 0);
    const wt *v;
    if (w) {
        CHECK(w->ops->layer_get(w, 0, &v) == 0);
        w->ops->layer_put(w, 0);
        CHECK(w->ops->layer_get(w, 2, &v) == STRATA_ECORRUPT);
        CHECK_MSG(strstr(w->ops->errmsg(w), "layer 2: checksum mismatch") != NULL, "%s", w->ops->errmsg(w));
        w->ops->close(w);
    }
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, at) == 1);
    close(fd);
    pack_close(pk);
    /* 2. an unreadable expert (the shard truncated under us): an error, never data */
    o.pack_dir = "";
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
    w = NULL;
    CHECK(place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) == 0);
    char name[200];
    int64_t L = m.c.n_layers - 1;
    snprintf(name, sizeof name, "language_model.model.layers.%lld.block_sparse_moe.experts.3.w1.weight_packed", (long long)L);
    const st_tensor *t = st_find(m.ix, name);
    CHECK(t != NULL);
    if (w && t) {
        CHECK(truncate(st_shard_path(m.ix, t->shard), (off_t)t->off) == 0);
        int32_t id = 3;
        int rc = w->ops->experts_request(w, L, 1, &id);
        if (!rc) rc = w->ops->expert_wait(w, L, id, &v);
        CHECK(rc == STRATA_EIO);
        CHECK_MSG(strstr(w->ops->errmsg(w), "expert 3 unreadable") != NULL, "%s", w->ops->errmsg(w));
        w->ops->experts_put(w, L);
        /* asking again is still an error (the failed slot was not published) */
        rc = w->ops->experts_request(w, L, 1, &id);
        if (!rc) rc = w->ops->expert_wait(w, L, id, &v);
        CHECK(rc == STRATA_EIO);
        w->ops->experts_put(w, L);
    }
    if (w) w->ops->close(w);
    tstream_model_close(&m);
}

/* The w2 scale tensor of expert e of layer L (a byte to damage), or NULL. */
static const st_tensor *expert_w2_scale(const tstream_model *m, int64_t L, int64_t e) {
    char name[200];
    snprintf(name, sizeof name, "language_model.model.layers.%lld.block_sparse_moe.experts.%lld.w2.weight_scale", (long long)L,
             (long long)e);
    return st_find(m->ix, name);
}

/* Regression (issue 16, item 1): reads from a pack are verified by default (a
 * zeroed or place_opts_default verify_reads), for pinned and streamed units, the
 * embedding table and experts (in place in the shards), each
 * mismatch naming the file and byte range; PLACE_VERIFY_OFF reaches the source. */
TEST(stream_verify_default) {
    const char *dir = tpack_fresh("tiny-shards", "st_vd", 23);
    if (!dir) { CHECK(0); return; }
    char err[2048];
    tstream_model m;
    if (tstream_model_open(&m, dir)) { CHECK(0); return; }
    pack_result pr;
    CHECK(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0);
    pack *pk = NULL;
    char found[1024];
    CHECK(pack_find(dir, found, sizeof found) && pack_open(&pk, found, dir, &m.c, m.ix, err, sizeof err) == 0);
    if (!pk) { tstream_model_close(&m); return; }
    uint64_t b[3];
    tstream_budgets(&m, dir, b);
    const int64_t L = 2;
    /* trunk: layer 2 damaged; at the floor (streamed) and with everything pinned */
    tstream_flip_keep_mtime(pk->trunk_path, pk->units[L].off + 33);
    for (int i = 0; i < 2; i++) {
        for (int off = 0; off < 2; off++) {
            place_opts o = tstream_opts(i ? 0 : b[0]);
            CHECK(o.verify_reads == 0); /* the default verifies */
            if (off) o.verify_reads = PLACE_VERIFY_OFF;
            place_plan p;
            wsrc *w = NULL;
            CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0 && p.has_pack);
            CHECK_MSG(place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) == 0, "%s", err);
            if (!w) continue;
            const wt *v;
            int rc = w->ops->layer_get(w, L, &v);
            if (off) {
                CHECK(rc == 0); /* opted out: served as read */
                if (!rc) w->ops->layer_put(w, L);
            } else {
                CHECK(rc == STRATA_ECORRUPT);
                const char *e = w->ops->errmsg(w);
                CHECK_MSG(strstr(e, "layer 2: checksum mismatch in") && strstr(e, "trunk.bin bytes"), "%s", e);
            }
            w->ops->close(w);
        }
    }
    tstream_flip_keep_mtime(pk->trunk_path, pk->units[L].off + 33);
    /* embedding table: refused at open, resident or read by row */
    tstream_flip_keep_mtime(pk->trunk_path, pk->embed.off + 5);
    for (int i = 0; i < 3; i++) {
        place_opts o = tstream_opts(b[i]);
        place_plan p;
        wsrc *w = NULL;
        CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
        CHECK(place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) == STRATA_ECORRUPT);
        CHECK_MSG(strstr(err, "embed: checksum mismatch in") && strstr(err, "trunk.bin"), "budget %d: %s", i, err);
        if (w) w->ops->close(w);
    }
    tstream_flip_keep_mtime(pk->trunk_path, pk->embed.off + 5);
    /* an expert, in place in the shards (checked against the manifest's hash in
     * schema order, whether its tensors are contiguous or not) */
    int64_t xl = m.c.n_layers - 1;
    int64_t experts[2] = {0, m.c.n_experts - 1};
    for (int k = 0; k < 2; k++) {
        const st_tensor *t = expert_w2_scale(&m, xl, experts[k]);
        CHECK(t != NULL);
        if (!t) continue;
        tstream_flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
        place_opts o = tstream_opts(b[0]);
        place_plan p;
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (w) {
            int32_t id = (int32_t)experts[k];
            const wt *v;
            int rc = w->ops->experts_request(w, xl, 1, &id);
            if (!rc) rc = w->ops->expert_wait(w, xl, id, &v);
            CHECK_MSG(rc == STRATA_ECORRUPT, "expert %lld: rc %d", (long long)experts[k], rc);
            char want[1300];
            snprintf(want, sizeof want, "expert %lld: checksum mismatch in %s", (long long)experts[k], dir);
            CHECK_MSG(strstr(w->ops->errmsg(w), want), "%s", w->ops->errmsg(w));
            w->ops->experts_put(w, xl);
            w->ops->close(w);
        }
        tstream_flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
    }
    /* several experts landing together, one of them damaged: the damaged one
     * fails with its own message, the others arrive intact, whichever thread
     * checked them. mode 0: checked on a lent pool when reaped (reap_experts);
     * 1: as tasks of an engine's job (checks_begin, check_run on the pool's
     * threads, checks_end); 2: checks taken but neither run nor ended, so the
     * next call on the expert path finishes them */
    for (int mode = 0; mode < 3; mode++) {
        const st_tensor *t = expert_w2_scale(&m, xl, experts[1]);
        CHECK(t != NULL);
        place_opts o = tstream_opts(b[0]);
        place_plan p;
        wsrc *w = NULL;
        pool *pl = NULL;
        CHECK(pool_create(&pl, 2) == 0);
        CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
        if (t) tstream_flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
        CHECK_MSG(t && place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) == 0, "%s", err);
        if (w) {
            CHECK(w->ops->use_pool && w->ops->checks_begin && w->ops->check_run && w->ops->checks_end);
            if (mode == 0) w->ops->use_pool(w, pl);
            int64_t cap = w->ops->experts_capacity(w);
            int32_t ids[4];
            int n = 0;
            ids[n++] = (int32_t)experts[1];
            for (int32_t e = 0; n < 4 && n < cap && e < m.c.n_experts - 1; e++) ids[n++] = e;
            CHECK(n >= 2);
            CHECK(w->ops->experts_request(w, xl, n, ids) == 0);
            int taken = 0;
            for (int tries = 0; mode > 0 && tries < 2000 && taken < n; tries++) {
                const int k = w->ops->checks_begin(w);
                taken += k;
                if (mode == 2 && k) break;
                check_task ct = {w};
                pool_for(pl, k, 1, check_task_fn, &ct);
                w->ops->checks_end(w);
                if (taken < n) usleep(1000);
            }
            if (mode) CHECK_MSG(mode == 2 ? taken >= 1 : taken == n, "%d of %d reads taken", taken, n);
            for (int i = n - 1; i >= 0; i--) { /* the last asked first: the others land in the same reap */
                const wt *v;
                int rc = w->ops->expert_wait(w, xl, ids[i], &v);
                if (i == 0) {
                    CHECK_MSG(rc == STRATA_ECORRUPT && strstr(w->ops->errmsg(w), "checksum mismatch"), "rc %d: %s", rc,
                              w->ops->errmsg(w));
                } else {
                    CHECK_MSG(rc == 0 && (v[R_EXP_W2].p || v[R_EXP_W2P].p), "expert %d: rc %d", ids[i], rc);
                }
            }
            w->ops->experts_put(w, xl);
            if (mode == 0) w->ops->use_pool(w, NULL);
            w->ops->close(w);
        }
        pool_free(pl);
        if (t) tstream_flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
    }
    /* all restored: the whole model streams equal to the resident oracle, verified */
    {
        place_opts o = tstream_opts(b[0]);
        place_plan p;
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (w) { CHECK(tstream_compare_all(&m, w, 1) == 0); w->ops->close(w); }
    }
    pack_close(pk);
    tstream_model_close(&m);
}

/* Decodes the fixed prompt on w as tstream_decode() does; returns the rc and the
 * session's message in msg. */
static int decode_msg(tstream_model *m, wsrc *w, int64_t chunk, char *msg, size_t n) {
    char err[1024];
    engine *e = NULL;
    session *s = NULL;
    engine_opts eo = {.n_threads = 2, .prefill_chunk = chunk};
    msg[0] = 0;
    if (engine_create(&e, &m->c, w, &eo, err, sizeof err)) { snprintf(msg, n, "%s", err); return -1; }
    if (session_create(&s, e, 64, err, sizeof err)) { engine_free(e); snprintf(msg, n, "%s", err); return -1; }
    int32_t prompt[7] = {1, 17, 42, 99, 3, 250, 8};
    float *lg = base_alloc((size_t)m->c.vocab * sizeof(float), MEM_MISC);
    int rc = session_eval(s, prompt, 7, lg);
    for (int g = 0; g < 3 && !rc; g++) rc = session_eval(s, prompt + g, 1, lg);
    if (rc) snprintf(msg, n, "%s", session_errmsg(s));
    base_free(lg);
    session_free(s);
    engine_free(e);
    return rc;
}

/* Row blocks on other shapes and dtypes: odd widths (tiny-odd) and F32/BF16/F16
 * trunk matrices (tiny-mixed), packed with PACK_SMALL_BLOCKS, decode at the floor
 * (every matrix checked block by block) with the resident run's ids and logits. */
static void blocks_identity(const char *preset, const char *dirname) {
    tstream_model m;
    const char *dir = tstream_preset_open(&m, preset, dirname, 31);
    if (!dir) return;
    char err[1024];
    pack_result pr;
    CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, PACK_SMALL_BLOCKS | PACK_FORCE, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    tstream_pair d;
    tstream_pair_init(&d, &m, 5, 1);
    uint64_t b[3];
    tstream_budgets(&m, dir, b);
    place_opts o = tstream_opts(b[0]);
    place_plan p;
    wsrc *w = tstream_open(&m, dir, &o, &p);
    if (w) {
        tstream_pair_same(&d, &m, w, p.prefill_chunk, preset);
        place_stats st;
        place_stats_get(w, &st);
        CHECK_MSG(st.verify_blk_bytes > 0, "%s: no block checked", preset);
        w->ops->close(w);
    }
    tstream_pair_free(&d);
    tstream_model_close(&m);
}

/* Landed bytes are hashed in pieces with prefetches ahead (wblk_hash_cold): the
 * value must be XXH3_64bits's at every length and alignment, pieces split
 * anywhere, across the prefetch distance and the end. */
TEST(stream_hash_cold_same_value) {
    const size_t cap = 3 * WBLK_COLD_AHEAD + 777;
    uint8_t *buf = malloc(cap + 64);
    if (!buf) { CHECK(0); return; }
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < cap + 64; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; buf[i] = (uint8_t)x; }
    const size_t lens[] = {0, 1, 63, 64, 240, 241, WBLK_COLD_STEP - 1, WBLK_COLD_STEP, WBLK_COLD_STEP + 1,
                           WBLK_COLD_AHEAD, WBLK_COLD_AHEAD + WBLK_COLD_STEP + 3, cap};
    for (size_t a = 0; a < 3; a++)
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            const uint8_t *p = buf + a * 13;
            XXH3_state_t h;
            XXH3_64bits_reset(&h);
            wblk_hash_cold(&h, p, lens[i]);
            CHECK_MSG(XXH3_64bits_digest(&h) == XXH3_64bits(p, lens[i]), "length %zu at offset %zu", lens[i], a * 13);
            /* two calls into one state: the expert check feeds its tensors so */
            XXH3_64bits_reset(&h);
            wblk_hash_cold(&h, p, lens[i] / 3);
            wblk_hash_cold(&h, p + lens[i] / 3, lens[i] - lens[i] / 3);
            CHECK_MSG(XXH3_64bits_digest(&h) == XXH3_64bits(p, lens[i]), "length %zu split", lens[i]);
        }
    free(buf);
}

TEST(stream_verify_blocks_shapes) {
    blocks_identity("tiny-odd", "st_vb_odd");
    blocks_identity("tiny-mixed", "st_vb_mixed");
}

/* Issue 16, the cost of verification: a pack with row-block checksums (here
 * PACK_SMALL_BLOCKS, so tiny matrices get them) has the matrices of streamed
 * units checked block by block by the threads that multiply with them (wblk.h).
 * At the floor (everything streamed) and a third of the way up, decoding gives
 * the resident run's ids and logits bits (at the floor with blocks counted); a flipped byte
 * in a streamed matrix is a checksum error naming the tensor, its rows, trunk.bin
 * and the byte range (PLACE_VERIFY_OFF: served as read); a flipped byte in a
 * small tensor of the unit fails its own checksum at layer_get; a wrong block
 * hash in the manifest fails the run and pack --verify, which names the block. */
TEST(stream_verify_blocks) {
    const char *dir = tpack_fresh("tiny", "st_vb", 29);
    if (!dir) { CHECK(0); return; }
    char err[2048], msg[2048], what[96];
    tstream_model m;
    if (tstream_model_open(&m, dir)) { CHECK(0); return; }
    pack_result pr;
    CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, PACK_SMALL_BLOCKS, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    pack *pk = NULL;
    char found[1024];
    CHECK(pack_find(dir, found, sizeof found) && pack_open(&pk, found, dir, &m.c, m.ix, err, sizeof err) == 0);
    if (!pk) { tstream_model_close(&m); return; }
    const int64_t L = 3;
    const pack_region *r = &pk->units[L];
    const pack_tensor *tb = NULL, *ts = NULL;
    for (int i = 0; i < r->n_tensors; i++) {
        if (!tb && r->t[i].n_blk >= 3) tb = &r->t[i];
        if (!ts && !r->t[i].n_blk && r->t[i].ndim == 1) ts = &r->t[i];
    }
    CHECK(tb && ts);
    if (!tb || !ts) { pack_close(pk); tstream_model_close(&m); return; }
    tstream_pair d;
    tstream_pair_init(&d, &m, 5, 1);
    uint64_t b[3];
    tstream_budgets(&m, dir, b);
    for (int i = 0; i < 2; i++) {
        place_opts o = tstream_opts(b[i]);
        place_plan p;
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (!w) continue;
        snprintf(what, sizeof what, "budget %llu", (unsigned long long)b[i]);
        tstream_pair_same(&d, &m, w, p.prefill_chunk, what);
        place_stats st;
        place_stats_get(w, &st);
        CHECK_MSG((i || st.verify_blk_bytes > 0) && st.verify_blk_bytes <= st.verify_bytes, "budget %llu: %llu block bytes",
                  (unsigned long long)b[i], (unsigned long long)st.verify_blk_bytes);
        w->ops->close(w);
    }
    /* a byte of block 1 of a streamed matrix */
    const uint64_t rb = tb->nbytes / (uint64_t)tb->shape[0], at = r->off + tb->off + (uint64_t)tb->blk_rows * rb + 7;
    tstream_flip_keep_mtime(pk->trunk_path, at);
    for (int off = 0; off < 2; off++) {
        place_opts o = tstream_opts(b[0]);
        if (off) o.verify_reads = PLACE_VERIFY_OFF;
        place_plan p;
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (!w) continue;
        int rc = decode_msg(&m, w, p.prefill_chunk, msg, sizeof msg);
        if (off) {
            CHECK_MSG(rc == 0, "%s", msg);
        } else {
            char rows[64];
            snprintf(rows, sizeof rows, "rows %lld..%lld", (long long)tb->blk_rows, (long long)(2 * tb->blk_rows));
            CHECK_MSG(rc == STRATA_ECORRUPT && strstr(msg, "layer 3: checksum mismatch in") && strstr(msg, tb->name) &&
                      strstr(msg, rows) && strstr(msg, "trunk.bin bytes"), "rc %d: %s", rc, msg);
        }
        w->ops->close(w);
    }
    tstream_flip_keep_mtime(pk->trunk_path, at);
    /* a byte of a vector of the same unit: its own checksum, as the unit lands */
    tstream_flip_keep_mtime(pk->trunk_path, r->off + ts->off + 1);
    {
        place_opts o = tstream_opts(b[0]);
        place_plan p;
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (w) {
            const wt *v;
            CHECK(w->ops->layer_get(w, L, &v) == STRATA_ECORRUPT);
            const char *e = w->ops->errmsg(w);
            CHECK_MSG(strstr(e, "layer 3: checksum mismatch in") && strstr(e, ts->name) && strstr(e, "trunk.bin bytes"), "%s", e);
            w->ops->close(w);
        }
    }
    tstream_flip_keep_mtime(pk->trunk_path, r->off + ts->off + 1);
    /* a wrong block hash in the manifest: the bytes no longer match it */
    char mpath[1200], hex[20];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", found);
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)tb->blk[2]);
    char hex2[20];
    snprintf(hex2, sizeof hex2, "%s", hex);
    hex2[0] = hex[0] == '0' ? '1' : '0';
    char sed[3000];
    snprintf(sed, sizeof sed, "grep -c %s %s && sed -i s/%s/%s/ %s", hex, mpath, hex, hex2, mpath);
    int h = t_run(sed, NULL) == 0;
    CHECK(h);
    if (h) {
        pack *p2 = NULL;
        CHECK_MSG(pack_open(&p2, found, dir, &m.c, m.ix, err, sizeof err) == 0, "%s", err);
        if (p2) {
            CHECK(pack_verify(p2, &m.c, m.ix, NULL, NULL, err, sizeof err) == STRATA_ECORRUPT);
            CHECK_MSG(strstr(err, "block 2: checksum mismatch in") && strstr(err, tb->name), "%s", err);
            pack_close(p2);
        }
        place_opts o = tstream_opts(b[0]);
        place_plan p;
        wsrc *w = tstream_open(&m, dir, &o, &p);
        if (w) {
            CHECK(decode_msg(&m, w, p.prefill_chunk, msg, sizeof msg) == STRATA_ECORRUPT);
            CHECK_MSG(strstr(msg, "checksum mismatch in") && strstr(msg, tb->name), "%s", msg);
            w->ops->close(w);
        }
    }
    tstream_pair_free(&d);
    pack_close(pk);
    tstream_model_close(&m);
}
