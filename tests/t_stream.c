/* t_stream.c: the streaming weight source serves the bytes the shards hold, at
 * every budget, with and without a pack; plan refusals; end-to-end determinism. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>
#include "gen.h"
#include "infer.h"
#include "pack.h"
#include "place.h"
#include "pool.h"
#include "preset.h"
#include "test.h"
#include "wblk.h"

/* a pool job that runs a source's checks (wsrc check_run), as the engine's do */
typedef struct { wsrc *w; } check_task;
static void check_task_fn(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const check_task *c = ctx;
    for (int64_t i = i0; i < i1; i++) c->w->ops->check_run(c->w, (int)i);
}

const char *tpack_model(const char *name, const char *dir, uint64_t seed); /* t_pack.c */
const char *tpack_fresh(const char *name, const char *dir, uint64_t seed); /* t_pack.c: a copy to damage */

typedef struct model {
    cfg c;
    st_index *ix;
    model_layout lay;
    wsrc *res;       /* resident oracle */
} model;

static int model_open(model *m, const char *dir) {
    char path[1100], err[1024];
    memset(m, 0, sizeof *m);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (cfg_load(&m->c, path, err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
    if (st_open(&m->ix, dir, err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
    sbuf pr = {0};
    int rc = model_bind_check(&m->c, m->ix, &m->lay, &pr);
    if (rc) fprintf(stderr, "%s", pr.s ? pr.s : "");
    sbuf_free(&pr);
    if (rc) return -1;
    if (wsrc_resident_open(&m->res, &m->c, m->ix, err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
    return 0;
}

static void model_close(model *m) {
    if (m->res) m->res->ops->close(m->res);
    st_close(m->ix);
}

/* The generated model preset (t_pack.c's tpack_model) opened into m: its
 * directory, or NULL (a failed check) when it cannot be made or opened. */
static const char *preset_open(model *m, const char *preset, const char *dirname, uint64_t seed) {
    const char *dir = tpack_model(preset, dirname, seed);
    if (!dir || model_open(m, dir)) { CHECK_MSG(0, "%s: not made or not opened", dirname); return NULL; }
    return dir;
}


static int same_view(const wt *a, const wt *b, int role) {
    if (!a->p != !b->p) return 0;
    if (!a->p) return 1;
    if (a->dtype != b->dtype || a->rows != b->rows || a->cols != b->cols) return 0;
    uint64_t n = (uint64_t)a->rows * (uint64_t)a->cols * st_dtype_size(a->dtype);
    if (role == R_EXP_W1P || role == R_EXP_W2P || role == R_EXP_W3P) n /= 2; /* logical width, 2 codes a byte */
    return memcmp(a->p, b->p, (size_t)n) == 0;
}

/* Every unit (twice, so streamed units are re-read), every expert, some embedding
 * rows: the stream's views equal the resident oracle's. Returns mismatches. */
static int compare_all(model *m, wsrc *w, int shuffle) {
    const cfg *c = &m->c;
    int bad = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t k = 0; k <= c->n_layers; k++) {
            int64_t L = shuffle && pass ? (k * 5 + 3) % (c->n_layers + 1) : k;
            const wt *a, *b;
            if (w->ops->hint_layer) w->ops->hint_layer(w, L + 1);
            if (w->ops->layer_get(w, L, &a)) { fprintf(stderr, "layer_get %lld: %s\n", (long long)L, w->ops->errmsg(w)); bad++; continue; }
            m->res->ops->layer_get(m->res, L, &b);
            for (int r = 0; r < R_COUNT; r++) {
                if (r == R_EMBED) continue; /* the resident source parks the table in the head */
                if (!same_view(&a[r], &b[r], r)) { bad++; fprintf(stderr, "  unit %lld role %s differs\n", (long long)L, schema_role_name(r)); }
            }
            w->ops->layer_put(w, L);
        }
    for (int64_t L = c->first_dense; L < c->n_layers; L++) {
        for (int32_t e0 = 0; e0 < c->n_experts; e0 += (int32_t)c->topk) {
            int32_t ids[CFG_MAX_TOPK];
            int n = 0;
            for (int32_t e = e0; e < c->n_experts && n < c->topk; e++) ids[n++] = (e * 7 + (int32_t)L) % (int32_t)c->n_experts;
            if (w->ops->experts_request(w, L, n, ids)) { fprintf(stderr, "request: %s\n", w->ops->errmsg(w)); bad++; continue; }
            for (int i = n - 1; i >= 0; i--) {
                const wt *a, *b;
                if (w->ops->expert_wait(w, L, ids[i], &a)) { bad++; continue; }
                m->res->ops->expert_wait(m->res, L, ids[i], &b);
                for (int r = R_EXP_W1P; r < R_COUNT; r++)
                    if (!same_view(&a[r], &b[r], r)) { bad++; fprintf(stderr, "  layer %lld expert %d role %s differs\n", (long long)L, ids[i], schema_role_name(r)); }
            }
            w->ops->experts_put(w, L);
        }
    }
    int32_t ids[] = {0, 1, (int32_t)c->vocab - 1, 5, 5, 77};
    float *x = base_alloc(sizeof ids / sizeof *ids * (size_t)c->hidden * sizeof(float), MEM_MISC);
    float *y = base_alloc(sizeof ids / sizeof *ids * (size_t)c->hidden * sizeof(float), MEM_MISC);
    CHECK(w->ops->embed_rows(w, 6, ids, x) == 0);
    m->res->ops->embed_rows(m->res, 6, ids, y);
    if (memcmp(x, y, 6 * (size_t)c->hidden * sizeof(float))) { bad++; fprintf(stderr, "  embedding rows differ\n"); }
    /* expert reads ahead still in flight while rows of a streamed embedding are
     * read (they share a ring): the rows come out right, and the experts still
     * land and match */
    if (w->ops->experts_prefetch && c->n_layers > c->first_dense) {
        const int64_t L = c->n_layers - 1;
        int32_t pids[2] = {0, (int32_t)c->n_experts - 1};
        w->ops->experts_prefetch(w, L, 2, pids);
        memset(x, 0, 6 * (size_t)c->hidden * sizeof(float));
        CHECK(w->ops->embed_rows(w, 6, ids, x) == 0);
        if (memcmp(x, y, 6 * (size_t)c->hidden * sizeof(float))) { bad++; fprintf(stderr, "  embedding rows differ with reads ahead\n"); }
        if (w->ops->experts_request(w, L, 2, pids)) { fprintf(stderr, "request: %s\n", w->ops->errmsg(w)); bad++; }
        else {
            for (int i = 0; i < 2; i++) {
                const wt *a, *b;
                if (w->ops->expert_wait(w, L, pids[i], &a)) { bad++; fprintf(stderr, "  read ahead: expert %d: %s\n", pids[i], w->ops->errmsg(w)); continue; }
                m->res->ops->expert_wait(m->res, L, pids[i], &b);
                for (int r = R_EXP_W1P; r < R_COUNT; r++)
                    if (!same_view(&a[r], &b[r], r)) { bad++; fprintf(stderr, "  read ahead: expert %d role %s differs\n", pids[i], schema_role_name(r)); }
            }
            w->ops->experts_put(w, L);
        }
    }
    int32_t badid = (int32_t)c->vocab;
    CHECK(w->ops->embed_rows(w, 1, &badid, x) == STRATA_EINVAL);
    base_free(x);
    base_free(y);
    return bad;
}

static place_opts opts_for(uint64_t ram) {
    place_opts o = place_opts_default();
    o.ram_bytes = ram;
    o.ctx = 64;
    o.prefill_chunk = 4;
    o.session_bytes = infer_session_bytes;
    o.engine_bytes = infer_engine_bytes;
    o.overhead_bytes = 32u << 20; /* fixed, so budgets computed here stay comparable */
    return o;
}

/* Plans m at o and opens the streaming source: NULL (a failed check naming the
 * error) when either fails. */
static wsrc *stream_open(model *m, const char *dir, const place_opts *o, place_plan *p) {
    char err[2048];
    wsrc *w = NULL;
    if (place_plan_compute(&m->c, &m->lay, dir, o, p, err, sizeof err) || place_open(&w, &m->c, m->ix, dir, p, err, sizeof err)) {
        CHECK_MSG(0, "%s", err);
        return NULL;
    }
    return w;
}

/* `strata pack DIR && strata plan DIR --json`: the plan's minimum and total
 * bytes; 0, or -1 after a failed check. */
static int cli_plan_bytes(const char *dir, uint64_t *min, uint64_t *total) {
    char cmd[2400], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s pack %s >/dev/null && %s plan %s --ram-gb 50 --json", t_strata(), dir, t_strata(), dir);
    CHECK(t_run(cmd, &out) == 0);
    const char *a = out ? strstr(out, "\"min_bytes\": ") : NULL, *b = out ? strstr(out, "\"total_bytes\": ") : NULL;
    CHECK_MSG(a && b, "%s", out ? out : "");
    *min = a ? strtoull(a + 13, NULL, 10) : 0;
    *total = b ? strtoull(b + 15, NULL, 10) : 0;
    base_free(out);
    return a && b ? 0 : -1;
}

static void budgets_for(model *m, const char *dir, uint64_t b[3]) {
    place_plan p;
    place_opts o = opts_for(1ull << 40);
    char err[1024];
    place_plan_compute(&m->c, &m->lay, dir, &o, &p, err, sizeof err);
    uint64_t all = p.total_bytes; /* the floor plus everything pinned and cached */
    b[0] = p.min_bytes;
    b[1] = p.min_bytes + (all - p.min_bytes) / 3;
    b[2] = 0;
}

static void stream_budgets(const char *preset, const char *dirname, int packed, int no_uring) {
    model m;
    const char *dir = preset_open(&m, preset, dirname, 11);
    if (!dir) return;
    char err[2048];
    if (packed) {
        pack_result pr;
        CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    }
    uint64_t b[3];
    budgets_for(&m, dir, b);
    for (int i = 0; i < 3; i++) {
        for (int ra = 0; ra < 2; ra++) {
            place_opts o = opts_for(b[i]);
            o.pack_dir = packed ? NULL : "";
            o.no_uring = no_uring;
            o.no_readahead = ra;
            o.verify_reads = packed;
            place_plan p;
            wsrc *w = stream_open(&m, dir, &o, &p);
            if (!w) continue;
            CHECK(p.has_pack == packed);
            if (i == 0) CHECK(p.n_pinned == 0 && !p.embed_resident);
            if (i == 2) CHECK(p.resident);
            int bad = compare_all(&m, w, i == 1);
            CHECK_MSG(bad == 0, "%s budget %llu packed %d: %d mismatches", preset, (unsigned long long)b[i], packed, bad);
            place_stats st;
            place_stats_get(w, &st);
            /* every request a resident hit, a miss or a read ahead (compare_all reads two ahead) */
            CHECK_MSG(st.expert_requests > 0 && st.expert_hits + st.expert_misses <= st.expert_requests &&
                          st.expert_requests <= st.expert_hits + st.expert_misses + st.prefetch_used,
                      "requests %llu hits %llu misses %llu read ahead and used %llu", (unsigned long long)st.expert_requests,
                      (unsigned long long)st.expert_hits, (unsigned long long)st.expert_misses, (unsigned long long)st.prefetch_used);
            if (i == 0) CHECK(st.bytes_trunk > 0);
            w->ops->close(w);
        }
    }
    model_close(&m);
}

TEST(stream_bytes_in_place) { stream_budgets("tiny-shards", "st_shards", 0, 0); }
TEST(stream_bytes_packed) { stream_budgets("tiny", "st_tiny", 1, 0); }
TEST(stream_bytes_pread) { stream_budgets("tiny-bf16experts", "st_bf16x", 0, 1); }
TEST(stream_bytes_mixed_packed) { stream_budgets("tiny-mixed", "st_mixed", 1, 0); }

TEST(stream_plan_refusal) {
    cfg c;
    cfg_k3(&c);
    place_opts o = opts_for(4000000000ull);
    o.ctx = 4096;
    o.prefill_chunk = 64;
    static place_plan p;
    char err[1024];
    /* the real K3 at 4 GB: a valid plan, peak within the budget */
    CHECK_MSG(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.total_bytes <= 4000000000ull && p.min_bytes < 4000000000ull);
    CHECK(p.ring_bytes >= p.ring_min_bytes && p.n_expert_slots >= c.topk);
    CHECK(p.prefill_chunk == 64); /* never lowered: unions stream through the cache */
    CHECK(p.pred_s_per_token > 0);
    /* issue 17: at 2 GB, every streamed unit in row slices (K3's lm_head is 2.35
     * GB): a valid plan, the sequence's state for the whole context inside it */
    o.ram_bytes = 2000000000ull;
    CHECK_MSG(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == 0, "%s", err);
    CHECK(p.sliced && p.total_bytes <= 2000000000ull && p.ring_bytes < 1000000000ull && p.seq_bytes > 500000000ull);
    CHECK(p.prefill_chunk == 64 && p.n_expert_slots >= c.topk && p.pred_s_per_token > 0);
    /* below the floor: refused, the minimum named */
    o.ram_bytes = 1000000000ull;
    CHECK(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == STRATA_EBUDGET);
    CHECK(strstr(err, "needs at least") != NULL);
    CHECK(p.min_bytes > 1000000000ull && p.min_bytes < 4000000000ull);
    /* more RAM pins more layers, largest first */
    o.ram_bytes = 24000000000ull;
    CHECK(place_plan_compute(&c, NULL, NULL, &o, &p, err, sizeof err) == 0);
    CHECK(p.n_pinned > 0 && p.pinned[0]); /* layer 0 (dense, the largest) first */
    CHECK(p.total_bytes <= 24000000000ull);
    /* CLI: exit 2 with the minimum; exit 0 with a plan */
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s plan --config /dev/null --ram-gb 1", t_strata());
    CHECK(t_run(cmd, NULL) == 1); /* not a config */
    const char *cj = t_write("k3.json", "", 0);
    char *js = cfg_to_json(&c);
    cj = t_write("k3.json", js, strlen(js));
    base_free(js);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 1", t_strata(), cj);
    CHECK(t_run(cmd, &out) == 2);
    CHECK_MSG(out && strstr(out, "needs at least"), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 4", t_strata(), cj);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "predicted decode"), "%s", out ? out : "");
    base_free(out);
}

TEST(stream_errors) {
    /* a copy of a tiny model whose shards we damage after opening */
    const char *dir = tpack_fresh("tiny", "st_err", 21);
    if (!dir) { CHECK(0); return; }
    model m;
    if (model_open(&m, dir)) { CHECK(0); return; }
    char err[2048];
    pack_result pr;
    CHECK(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0);
    /* 1. a flipped byte in a streamed layer of the pack: ECORRUPT naming the layer */
    uint64_t b[3];
    budgets_for(&m, dir, b);
    place_opts o = opts_for(b[0]);
    o.verify_reads = 1;
    place_plan p;
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
    pack *pk = NULL;
    CHECK(pack_open(&pk, p.pack_dir, dir, &m.c, m.ix, err, sizeof err) == 0);
    if (!pk) { model_close(&m); return; }
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
    model_close(&m);
}

/* Greedy decode through the engine at several budgets: the same ids and logits
 * bits as the resident source. */
static int decode(model *m, wsrc *w, int64_t chunk, int32_t *ids_out, int n_gen, float *last_logits) {
    char err[1024];
    engine *e = NULL;
    session *s = NULL;
    engine_opts eo = {.n_threads = 2, .prefill_chunk = chunk};
    if (engine_create(&e, &m->c, w, &eo, err, sizeof err)) { fprintf(stderr, "%s\n", err); return -1; }
    if (session_create(&s, e, 64, err, sizeof err)) { engine_free(e); fprintf(stderr, "%s\n", err); return -1; }
    int32_t prompt[7] = {1, 17, 42, 99, 3, 250, 8};
    float *lg = base_alloc((size_t)m->c.vocab * sizeof(float), MEM_MISC);
    int rc = session_eval(s, prompt, 7, lg);
    for (int g = 0; g < n_gen && !rc; g++) {
        int32_t best = 0;
        for (int64_t i = 1; i < m->c.vocab; i++) if (lg[i] > lg[best]) best = (int32_t)i;
        ids_out[g] = best;
        rc = session_eval(s, &best, 1, lg);
    }
    if (rc) fprintf(stderr, "eval: %s\n", session_errmsg(s));
    memcpy(last_logits, lg, (size_t)m->c.vocab * sizeof(float));
    base_free(lg);
    session_free(s);
    engine_free(e);
    return rc;
}

/* G greedy tokens' ids and last logits: a reference decode's (want, wl) and
 * the one compared with it (got, gl). */
enum { MAX_G = 8 };
typedef struct {
    int g;
    int32_t want[MAX_G], got[MAX_G];
    float *wl, *gl;
} dec_pair;

/* With m's resident source decoded into the reference half when resident. */
static void pair_init(dec_pair *d, model *m, int g, int resident) {
    memset(d, 0, sizeof *d);
    d->g = g;
    d->wl = base_alloc((size_t)m->c.vocab * sizeof(float), MEM_MISC);
    d->gl = base_alloc((size_t)m->c.vocab * sizeof(float), MEM_MISC);
    if (resident) CHECK(decode(m, m->res, 4, d->want, g, d->wl) == 0);
}

static void pair_free(dec_pair *d) {
    base_free(d->wl);
    base_free(d->gl);
}

/* The compared ids and logits bits equal the reference's; what names the case. */
static void pair_check(const dec_pair *d, const model *m, const char *what) {
    CHECK_MSG(!memcmp(d->want, d->got, (size_t)d->g * sizeof(int32_t)), "%s: ids differ", what);
    CHECK_MSG(!memcmp(d->wl, d->gl, (size_t)m->c.vocab * sizeof(float)), "%s: logits bits differ", what);
}

/* Decodes on w into the compared half, then pair_check. */
static void pair_same(dec_pair *d, model *m, wsrc *w, int64_t chunk, const char *what) {
    memset(d->got, 0, sizeof d->got);
    CHECK_MSG(decode(m, w, chunk, d->got, d->g, d->gl) == 0, "%s", what);
    pair_check(d, m, what);
}

TEST(stream_decode_identical) {
    model m;
    const char *dir = preset_open(&m, "tiny", "st_dec", 5);
    if (!dir) return;
    dec_pair d;
    pair_init(&d, &m, 6, 1);
    uint64_t b[3];
    char err[1024], what[96];
    for (int packed = 0; packed < 2; packed++) {
        if (packed) {
            pack_result pr;
            CHECK(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0);
        }
        budgets_for(&m, dir, b); /* a pack changes the unit sizes */
        for (int i = 0; i < 3; i++) {
            place_opts o = opts_for(b[i]);
            place_plan p;
            wsrc *w = stream_open(&m, dir, &o, &p);
            if (!w) continue;
            snprintf(what, sizeof what, "budget %llu packed %d", (unsigned long long)b[i], packed);
            pair_same(&d, &m, w, p.prefill_chunk, what);
            w->ops->close(w);
        }
    }
    pair_free(&d);
    model_close(&m);
}

/* `strata run` of dir with and without the switch `off_flag` (a speed option) at
 * the budget ram: the same ids and logits bits; the report has a line starting
 * with `report` only with the option on. Files are t_tmpdir/TAG_{0,1}.{bin,err}. */
static void cli_off_identity(const char *dir, const char *tag, const char *ids, int gen, uint64_t ram,
                             const char *off_flag, const char *report) {
    char cmd[4096], *ia = NULL, *ib = NULL;
    for (int off = 0; off < 2; off++) {
        snprintf(cmd, sizeof cmd, "%s run %s --ids %s --gen %d --print-ids --ram %llu %s --dump-logits %s/%s_%d.bin 2>%s/%s_%d.err",
                 t_strata(), dir, ids, gen, (unsigned long long)ram, off ? off_flag : "", t_tmpdir, tag, off, t_tmpdir, tag, off);
        CHECK_MSG(t_run(cmd, off ? &ib : &ia) == 0, "%s", cmd);
    }
    CHECK_MSG(ia && ib && !strcmp(ia, ib), "ids %s vs %s with %s", ia ? ia : "", ib ? ib : "", off_flag);
    snprintf(cmd, sizeof cmd, "cmp -s %s/%s_0.bin %s/%s_1.bin && grep -q '^%s' %s/%s_0.err && ! grep -q '^%s' %s/%s_1.err", t_tmpdir,
             tag, t_tmpdir, tag, report, t_tmpdir, tag, report, t_tmpdir, tag);
    CHECK_MSG(t_run(cmd, NULL) == 0, "logits bits or reports differ: %s", cmd);
    base_free(ia);
    base_free(ib);
}

/* Expert reads a layer ahead never change bits: greedy decode with prefetch on
 * and off at budgets where the trunk is pinned and the cache has room gives the
 * same ids and logits bits, and the predictions are made and used. */
TEST(stream_prefetch_identity) {
    model m;
    const char *dir = preset_open(&m, "tiny", "st_pf", 6);
    if (!dir) return;
    dec_pair d;
    pair_init(&d, &m, 8, 0);
    uint64_t b[3];
    budgets_for(&m, dir, b);
    char what[96];
    uint64_t pred = 0, reads = 0;
    int64_t copies = 0;
    /* the third holds every expert (the warm start reads them all): there the
     * guesses find everything in RAM, and most of them are skipped */
    const uint64_t budgets[3] = {b[1], b[1] + (b[1] - b[0]), 1ull << 40};
    for (int i = 0; i < 3; i++)
        for (int off = 1; off >= 0; off--) {
            place_opts o = opts_for(budgets[i]);
            o.no_prefetch = off;
            place_plan p;
            wsrc *w = stream_open(&m, dir, &o, &p);
            if (!w) continue;
            CHECK(decode(&m, w, p.prefill_chunk, off ? d.want : d.got, d.g, off ? d.wl : d.gl) == 0);
            place_stats st;
            place_stats_get(w, &st);
            if (off) {
                CHECK(st.pred_layers == 0 && st.prefetch_reads == 0);
            } else {
                snprintf(what, sizeof what, "budget %llu with prefetch", (unsigned long long)budgets[i]);
                pair_check(&d, &m, what);
                CHECK(st.pred_hits <= st.pred_requests && st.prefetch_used <= st.prefetch_reads);
                /* the guesses' router copies: one per pinned MoE unit where planned, lent */
                CHECK(st.guess_copies == p.n_guess && (p.n_guess == 0) == (st.guess_lends == 0 || i == 2));
                copies += st.guess_copies;
                if (i == 2) CHECK_MSG(st.prefetch_reads == 0 && st.pred_skipped > st.pred_layers,
                                      "everything in RAM: %llu read ahead, %llu guesses skipped, %llu layers predicted",
                                      (unsigned long long)st.prefetch_reads, (unsigned long long)st.pred_skipped,
                                      (unsigned long long)st.pred_layers);
                pred += st.pred_layers;
                reads += st.prefetch_reads;
                printf("    budget %llu: %llu slots, %llu layers predicted, %.1f%% of requests predicted, %llu read ahead, %llu used\n",
                       (unsigned long long)budgets[i], (unsigned long long)p.n_expert_slots, (unsigned long long)st.pred_layers,
                       st.pred_requests ? 100.0 * (double)st.pred_hits / (double)st.pred_requests : 0.0,
                       (unsigned long long)st.prefetch_reads, (unsigned long long)st.prefetch_used);
            }
            w->ops->close(w);
        }
    CHECK(pred > 0 && reads > 0 && copies > 0);
    pair_free(&d);
    model_close(&m);
    /* the CLI: --no-prefetch gives the same ids and logits bits; the run report
     * says what was predicted */
    uint64_t lo, hi;
    cli_plan_bytes(dir, &lo, &hi);
    const uint64_t ram = lo + (hi > lo ? (hi - lo) / 2 : 0) + (4u << 20);
    cli_off_identity(dir, "st_pf", "1,2,3,4,5,6,7", 6, ram, "--no-prefetch", "prefetch: ");
}

/* The warm start never changes bits: decode with and without it at a budget that
 * holds a part of the experts and at one that holds them all gives the same ids
 * and logits bits; with every expert preloaded no expert is read afterwards, and
 * the partial preload fills the cache with each layer's share. */
static void preload_progress(void *ud, uint64_t done, uint64_t total) {
    uint64_t *last = ud;
    if (done < last[0] || done > total) last[2]++; /* never backwards, never past the total */
    last[0] = done;
    last[1] = total;
}

TEST(stream_preload_identity) {
    model m;
    const char *dir = preset_open(&m, "tiny", "st_pl", 8);
    if (!dir) return;
    dec_pair d;
    pair_init(&d, &m, 6, 0);
    char err[1024], what[96];
    const int64_t n_exp = (m.c.n_layers - m.c.first_dense) * m.c.n_experts;
    place_plan full;
    place_opts fo = opts_for(1ull << 40);
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &fo, &full, err, sizeof err) == 0);
    /* the whole trunk pinned, a third of the experts cached; and everything */
    const uint64_t budgets[2] = {full.total_bytes - (uint64_t)(2 * n_exp / 3) * full.expert_slot_bytes, 1ull << 40};
    for (int i = 0; i < 2; i++)
        for (int off = 1; off >= 0; off--) {
            place_opts o = opts_for(budgets[i]);
            o.no_preload = off;
            uint64_t prog[3] = {0, 0, 0};
            o.progress = preload_progress;
            o.progress_ud = prog;
            place_plan p;
            wsrc *w = stream_open(&m, dir, &o, &p);
            if (!w) continue;
            place_stats st;
            place_stats_get(w, &st);
            if (off) {
                CHECK(st.preload_bytes == 0 && prog[1] == 0);
            } else {
                CHECK(p.n_pinned == p.n_units);
                CHECK(st.preload_bytes > 0 && prog[1] > 0 && prog[0] == prog[1] && prog[2] == 0);
                CHECK_MSG(st.preload_experts == (p.n_expert_slots < n_exp ? p.n_expert_slots : n_exp), "%lld experts preloaded, %lld slots",
                          (long long)st.preload_experts, (long long)p.n_expert_slots);
            }
            place_stats_reset(w);
            CHECK(decode(&m, w, p.prefill_chunk, off ? d.want : d.got, d.g, off ? d.wl : d.gl) == 0);
            place_stats_get(w, &st);
            if (!off) {
                snprintf(what, sizeof what, "budget %llu with the warm start", (unsigned long long)budgets[i]);
                pair_check(&d, &m, what);
                if (p.n_expert_slots >= n_exp) CHECK(st.bytes_experts == 0 && st.bytes_trunk == 0 && st.expert_misses == 0);
                CHECK(st.preload_bytes > 0); /* kept across a stats reset */
            }
            w->ops->close(w);
        }
    pair_free(&d);
    model_close(&m);
    /* the CLI at a budget that holds everything: --no-preload gives the same ids and
     * logits bits; the report names the warm start */
    uint64_t lo, all;
    cli_plan_bytes(dir, &lo, &all);
    const uint64_t ram = all + (8u << 20);
    cli_off_identity(dir, "st_pl", "5,6,7", 5, ram, "--no-preload", "preload: ");
}

/* A child process decodes at a budget computed in the child (its own baseline
 * RSS): its peak RSS stays within the budget, and its ids equal the resident run's. */
/* The plan counts every byte the streaming source allocates for its expert cache
 * (the slots and, per slot, the read and binding records and the cache's
 * tables): at ladder's 16 GB rung 7,990 slots carried 38 MB the plan did not
 * count, and the peak went 8 MB over the budget. */
TEST(stream_cache_counted) {
    model m;
    const char *dir = preset_open(&m, "tiny", "st_cc", 9);
    if (!dir) return;
    char err[512];
    place_opts o = opts_for(1ull << 40);
    place_plan p;
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
    const uint64_t budgets[2] = {p.total_bytes, p.min_bytes + (p.total_bytes - p.min_bytes) / 2};
    for (int i = 0; i < 2; i++) {
        o.ram_bytes = budgets[i];
        const uint64_t before = base_mem_used_tag(MEM_CACHE);
        wsrc *w = stream_open(&m, dir, &o, &p);
        if (!w) continue;
        const uint64_t used = base_mem_used_tag(MEM_CACHE) - before;
        CHECK(p.n_expert_slots > p.min_expert_slots && p.slot_meta_bytes > 0);
        CHECK_MSG(used <= p.cache_bytes && used + p.cache_bytes / 50 >= p.cache_bytes,
                  "budget %llu: %lld slots, the cache allocated %llu bytes, the plan counted %llu", (unsigned long long)budgets[i],
                  (long long)p.n_expert_slots, (unsigned long long)used, (unsigned long long)p.cache_bytes);
        w->ops->close(w);
    }
    model_close(&m);
}

TEST(stream_child_rss) {
    const char *dir = tpack_model("tiny", "st_rss", 9);
    if (!dir) { CHECK(0); return; }
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        model m;
        uint64_t out[2] = {0, 0};
        if (model_open(&m, dir) == 0) {
            int32_t want[4], got[4];
            float *l = base_alloc((size_t)m.c.vocab * sizeof(float), MEM_MISC);
            decode(&m, m.res, 4, want, 4, l);
            place_opts o = opts_for(1ull << 40);
            o.overhead_bytes = 0; /* measure this process */
            place_plan p;
            char err[512];
            place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err);
            o.ram_bytes = p.min_bytes + (p.total_bytes - p.min_bytes) / 4;
            wsrc *w = NULL;
            if (!place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) &&
                !place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) && !decode(&m, w, p.prefill_chunk, got, 4, l) &&
                !memcmp(want, got, sizeof want))
                out[0] = o.ram_bytes;
            if (w) w->ops->close(w);
            out[1] = base_peak_rss();
        }
        if (write(fds[1], out, sizeof out) != sizeof out) _exit(3);
        _exit(0);
    }
    close(fds[1]);
    uint64_t got[2] = {0, 0};
    CHECK(read(fds[0], got, sizeof got) == sizeof got);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK_MSG(WIFEXITED(st) && got[0] > 0, "child failed");
    /* the child's getrusage(RUSAGE_SELF) peak: RUSAGE_CHILDREN in this runner would
     * also cover every earlier child (CLI runs of other suites) */
    CHECK_MSG(got[1] <= got[0], "peak RSS %llu over the budget %llu", (unsigned long long)got[1], (unsigned long long)got[0]);
}

/* strata run at three budgets from the floor to resident, packed: the same ids and
 * the same logits bits as the resident source, peak RSS (/usr/bin/time) within each
 * budget. */
TEST(stream_run_cli) {
    const char *m = tpack_model("tiny-blocks", "st_cli", 4);
    if (!m) { CHECK(0); return; }
    uint64_t min, all;
    if (cli_plan_bytes(m, &min, &all)) return;
    char cmd[4096];
    uint64_t budgets[3] = {min + (4u << 20), min + (4u << 20) + (all > min ? (all - min) / 2 : 0), 0};
    char ref[1100];
    snprintf(ref, sizeof ref, "%s/st_cli_res.bin", t_tmpdir);
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2,3,4,5,6,7 --gen 5 --print-ids --dump-logits %s 2>/dev/null", t_strata(), m, ref);
    char *want = NULL;
    CHECK(t_run(cmd, &want) == 0);
    int have_time = base_is_file("/usr/bin/time");
    for (int i = 0; i < 3; i++) {
        char lg[1100], ram[64];
        snprintf(lg, sizeof lg, "%s/st_cli_%d.bin", t_tmpdir, i);
        if (budgets[i]) snprintf(ram, sizeof ram, "--ram %llu", (unsigned long long)budgets[i]);
        else snprintf(ram, sizeof ram, "--ram auto");
        if (have_time) {
            snprintf(cmd, sizeof cmd, "/usr/bin/time -f 'rss_kb %%M' -o %s.rss %s run %s --ids 1,2,3,4,5,6,7 --gen 5 --print-ids %s --dump-logits %s 2>%s.err",
                     lg, t_strata(), m, ram, lg, lg);
        } else {
            snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2,3,4,5,6,7 --gen 5 --print-ids %s --dump-logits %s 2>%s.err", t_strata(), m, ram, lg, lg);
        }
        char *got = NULL;
        CHECK_MSG(t_run(cmd, &got) == 0, "%s", cmd);
        CHECK_MSG(want && got && !strcmp(want, got), "budget %llu: ids %s vs %s", (unsigned long long)budgets[i], got ? got : "",
                  want ? want : "");
        base_free(got);
        snprintf(cmd, sizeof cmd, "cmp -s %s %s", ref, lg);
        CHECK_MSG(t_run(cmd, NULL) == 0, "budget %llu: logits bits differ", (unsigned long long)budgets[i]);
        if (have_time && budgets[i]) {
            char rp[1200];
            snprintf(rp, sizeof rp, "%s.rss", lg);
            uint8_t *rb;
            size_t rn;
            if (!base_read_file(rp, 4096, &rb, &rn, NULL, 0)) {
                const char *k = strstr((char *)rb, "rss_kb ");
                uint64_t kb = k ? strtoull(k + 7, NULL, 10) : 0;
                CHECK_MSG(kb > 0 && kb * 1024 <= budgets[i], "peak RSS %llu KB over %llu B", (unsigned long long)kb,
                          (unsigned long long)budgets[i]);
                base_free(rb);
            }
        }
    }
    base_free(want);
}

static void flip_keep_mtime(const char *path, uint64_t off);

/* Row slices never change bits: greedy decode with every streamed unit's matrices
 * read a few rows at a time (4 KiB slices: many slices per matrix, gate and up
 * interleaved) gives the resident source's ids and logits bits, packed (every
 * slice's matrix checked against its own checksum) and in place, through
 * io_uring and pread, at the sliced floor and above it (some units pinned); a
 * flipped byte in a sliced matrix is named by its own checksum. */
static void sliced_case(const char *preset, const char *dirname, int packed, int no_uring) {
    model m;
    const char *dir = preset_open(&m, preset, dirname, 12);
    if (!dir) return;
    char err[2048], what[160];
    if (packed) {
        pack_result pr;
        CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, PACK_FORCE, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    }
    dec_pair d;
    pair_init(&d, &m, 5, 1);
    place_opts o = opts_for(1ull << 40);
    o.pack_dir = packed ? NULL : "";
    place_plan whole, p;
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &whole, err, sizeof err) == 0);
    o.force_slices = 1;
    o.slice_bytes = 4096;
    o.ram_bytes = 1; /* below any floor: the error names the sliced minimum */
    CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == STRATA_EBUDGET);
    const uint64_t floor = p.min_bytes; /* on tiny, slices and alignment outweigh its small units */
    const uint64_t budgets[2] = {floor, floor + whole.pinned_bytes / 2}; /* about half the trunk pinned */
    for (int i = 0; i < 2; i++) {
        o.ram_bytes = budgets[i];
        o.no_uring = no_uring;
        o.verify_reads = packed;
        wsrc *w = stream_open(&m, dir, &o, &p);
        if (!w) continue;
        CHECK_MSG(p.sliced && p.n_pinned < p.n_units && (i == 0 || p.n_pinned > 0), "%s budget %llu: sliced %d, %lld of %lld units pinned", preset,
                  (unsigned long long)budgets[i], p.sliced, (long long)p.n_pinned, (long long)p.n_units);
        if (i == 0) CHECK(p.n_pinned == 0);
        snprintf(what, sizeof what, "%s budget %llu in row slices", preset, (unsigned long long)budgets[i]);
        pair_same(&d, &m, w, p.prefill_chunk, what);
        place_stats st;
        place_stats_get(w, &st);
        CHECK(st.bytes_trunk > 0 && st.bytes_head > 0);
        w->ops->close(w);
    }
    if (packed) { /* a flipped byte inside a sliced matrix: named, never computed with */
        pack *pk = NULL;
        CHECK(pack_open(&pk, p.pack_dir, dir, &m.c, m.ix, err, sizeof err) == 0);
        const pack_region *r = pk ? &pk->units[m.c.n_layers] : NULL; /* the head: lm_head is sliced */
        int k = -1;
        for (int j = 0; r && j < r->n_tensors; j++) if (r->t[j].role == R_LM_HEAD) k = j;
        CHECK(k >= 0);
        if (k >= 0) {
            flip_keep_mtime(pk->trunk_path, r->off + r->t[k].off + r->t[k].nbytes - 7);
            o.ram_bytes = floor;
            wsrc *w = stream_open(&m, dir, &o, &p);
            int rc = w ? decode(&m, w, p.prefill_chunk, d.got, 1, d.gl) : 0;
            CHECK(rc == STRATA_ECORRUPT);
            CHECK_MSG(w && strstr(w->ops->errmsg(w), "checksum mismatch") && strstr(w->ops->errmsg(w), "lm_head"), "%s",
                      w ? w->ops->errmsg(w) : "");
            if (w) w->ops->close(w);
            flip_keep_mtime(pk->trunk_path, r->off + r->t[k].off + r->t[k].nbytes - 7); /* back */
        }
        pack_close(pk);
    }
    pair_free(&d);
    model_close(&m);
}

TEST(stream_sliced_identity) {
    sliced_case("tiny", "st_sl", 1, 0);
    sliced_case("tiny-shards", "st_sl_shards", 0, 0);
    sliced_case("tiny-mixed", "st_sl_mixed", 1, 1);
    sliced_case("tiny-blocks", "st_sl_blocks", 0, 1);
}

/* Flips one byte and puts the file's modification time back: damage the pack's
 * stamps cannot see (bit rot, or an editor that keeps mtimes). */
static void flip_keep_mtime(const char *path, uint64_t off) {
    struct stat sb;
    if (stat(path, &sb)) return;
    int fd = open(path, O_RDWR);
    uint8_t b;
    if (fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1) { b ^= 0x10; if (pwrite(fd, &b, 1, (off_t)off) != 1) {} }
    if (fd >= 0) close(fd);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    utimensat(AT_FDCWD, path, ts, 0);
}

/* Regression (issue 16, item 1): reads from a pack are verified by default (a
 * zeroed or place_opts_default verify_reads), for pinned and streamed units, the
 * embedding table and experts (in place in the shards), each
 * mismatch naming the file and byte range; PLACE_VERIFY_OFF reaches the source. */
/* The w2 scale tensor of expert e of layer L (a byte to damage), or NULL. */
static const st_tensor *expert_w2_scale(const model *m, int64_t L, int64_t e) {
    char name[200];
    snprintf(name, sizeof name, "language_model.model.layers.%lld.block_sparse_moe.experts.%lld.w2.weight_scale", (long long)L,
             (long long)e);
    return st_find(m->ix, name);
}

TEST(stream_verify_default) {
    const char *dir = tpack_fresh("tiny-shards", "st_vd", 23);
    if (!dir) { CHECK(0); return; }
    char err[2048];
    model m;
    if (model_open(&m, dir)) { CHECK(0); return; }
    pack_result pr;
    CHECK(pack_build(dir, &m.c, m.ix, NULL, 0, NULL, NULL, &pr, err, sizeof err) == 0);
    pack *pk = NULL;
    char found[1024];
    CHECK(pack_find(dir, found, sizeof found) && pack_open(&pk, found, dir, &m.c, m.ix, err, sizeof err) == 0);
    if (!pk) { model_close(&m); return; }
    uint64_t b[3];
    budgets_for(&m, dir, b);
    const int64_t L = 2;
    /* trunk: layer 2 damaged; at the floor (streamed) and with everything pinned */
    flip_keep_mtime(pk->trunk_path, pk->units[L].off + 33);
    for (int i = 0; i < 2; i++) {
        for (int off = 0; off < 2; off++) {
            place_opts o = opts_for(i ? 0 : b[0]);
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
    flip_keep_mtime(pk->trunk_path, pk->units[L].off + 33);
    /* embedding table: refused at open, resident or read by row */
    flip_keep_mtime(pk->trunk_path, pk->embed.off + 5);
    for (int i = 0; i < 3; i++) {
        place_opts o = opts_for(b[i]);
        place_plan p;
        wsrc *w = NULL;
        CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
        CHECK(place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err) == STRATA_ECORRUPT);
        CHECK_MSG(strstr(err, "embed: checksum mismatch in") && strstr(err, "trunk.bin"), "budget %d: %s", i, err);
        if (w) w->ops->close(w);
    }
    flip_keep_mtime(pk->trunk_path, pk->embed.off + 5);
    /* an expert, in place in the shards (checked against the manifest's hash in
     * schema order, whether its tensors are contiguous or not) */
    int64_t xl = m.c.n_layers - 1;
    int64_t experts[2] = {0, m.c.n_experts - 1};
    for (int k = 0; k < 2; k++) {
        const st_tensor *t = expert_w2_scale(&m, xl, experts[k]);
        CHECK(t != NULL);
        if (!t) continue;
        flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
        place_opts o = opts_for(b[0]);
        place_plan p;
        wsrc *w = stream_open(&m, dir, &o, &p);
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
        flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
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
        place_opts o = opts_for(b[0]);
        place_plan p;
        wsrc *w = NULL;
        pool *pl = NULL;
        CHECK(pool_create(&pl, 2) == 0);
        CHECK(place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err) == 0);
        if (t) flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
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
        if (t) flip_keep_mtime(st_shard_path(m.ix, t->shard), t->off + 1);
    }
    /* all restored: the whole model streams equal to the resident oracle, verified */
    {
        place_opts o = opts_for(b[0]);
        place_plan p;
        wsrc *w = stream_open(&m, dir, &o, &p);
        if (w) { CHECK(compare_all(&m, w, 1) == 0); w->ops->close(w); }
    }
    pack_close(pk);
    model_close(&m);
}

/* Decodes the fixed prompt on w as decode() does; returns the rc and the
 * session's message in msg. */
static int decode_msg(model *m, wsrc *w, int64_t chunk, char *msg, size_t n) {
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
    model m;
    const char *dir = preset_open(&m, preset, dirname, 31);
    if (!dir) return;
    char err[1024];
    pack_result pr;
    CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, PACK_SMALL_BLOCKS | PACK_FORCE, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    dec_pair d;
    pair_init(&d, &m, 5, 1);
    uint64_t b[3];
    budgets_for(&m, dir, b);
    place_opts o = opts_for(b[0]);
    place_plan p;
    wsrc *w = stream_open(&m, dir, &o, &p);
    if (w) {
        pair_same(&d, &m, w, p.prefill_chunk, preset);
        place_stats st;
        place_stats_get(w, &st);
        CHECK_MSG(st.verify_blk_bytes > 0, "%s: no block checked", preset);
        w->ops->close(w);
    }
    pair_free(&d);
    model_close(&m);
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
    model m;
    if (model_open(&m, dir)) { CHECK(0); return; }
    pack_result pr;
    CHECK_MSG(pack_build(dir, &m.c, m.ix, NULL, PACK_SMALL_BLOCKS, NULL, NULL, &pr, err, sizeof err) == 0, "%s", err);
    pack *pk = NULL;
    char found[1024];
    CHECK(pack_find(dir, found, sizeof found) && pack_open(&pk, found, dir, &m.c, m.ix, err, sizeof err) == 0);
    if (!pk) { model_close(&m); return; }
    const int64_t L = 3;
    const pack_region *r = &pk->units[L];
    const pack_tensor *tb = NULL, *ts = NULL;
    for (int i = 0; i < r->n_tensors; i++) {
        if (!tb && r->t[i].n_blk >= 3) tb = &r->t[i];
        if (!ts && !r->t[i].n_blk && r->t[i].ndim == 1) ts = &r->t[i];
    }
    CHECK(tb && ts);
    if (!tb || !ts) { pack_close(pk); model_close(&m); return; }
    dec_pair d;
    pair_init(&d, &m, 5, 1);
    uint64_t b[3];
    budgets_for(&m, dir, b);
    for (int i = 0; i < 2; i++) {
        place_opts o = opts_for(b[i]);
        place_plan p;
        wsrc *w = stream_open(&m, dir, &o, &p);
        if (!w) continue;
        snprintf(what, sizeof what, "budget %llu", (unsigned long long)b[i]);
        pair_same(&d, &m, w, p.prefill_chunk, what);
        place_stats st;
        place_stats_get(w, &st);
        CHECK_MSG((i || st.verify_blk_bytes > 0) && st.verify_blk_bytes <= st.verify_bytes, "budget %llu: %llu block bytes",
                  (unsigned long long)b[i], (unsigned long long)st.verify_blk_bytes);
        w->ops->close(w);
    }
    /* a byte of block 1 of a streamed matrix */
    const uint64_t rb = tb->nbytes / (uint64_t)tb->shape[0], at = r->off + tb->off + (uint64_t)tb->blk_rows * rb + 7;
    flip_keep_mtime(pk->trunk_path, at);
    for (int off = 0; off < 2; off++) {
        place_opts o = opts_for(b[0]);
        if (off) o.verify_reads = PLACE_VERIFY_OFF;
        place_plan p;
        wsrc *w = stream_open(&m, dir, &o, &p);
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
    flip_keep_mtime(pk->trunk_path, at);
    /* a byte of a vector of the same unit: its own checksum, as the unit lands */
    flip_keep_mtime(pk->trunk_path, r->off + ts->off + 1);
    {
        place_opts o = opts_for(b[0]);
        place_plan p;
        wsrc *w = stream_open(&m, dir, &o, &p);
        if (w) {
            const wt *v;
            CHECK(w->ops->layer_get(w, L, &v) == STRATA_ECORRUPT);
            const char *e = w->ops->errmsg(w);
            CHECK_MSG(strstr(e, "layer 3: checksum mismatch in") && strstr(e, ts->name) && strstr(e, "trunk.bin bytes"), "%s", e);
            w->ops->close(w);
        }
    }
    flip_keep_mtime(pk->trunk_path, r->off + ts->off + 1);
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
        place_opts o = opts_for(b[0]);
        place_plan p;
        wsrc *w = stream_open(&m, dir, &o, &p);
        if (w) {
            CHECK(decode_msg(&m, w, p.prefill_chunk, msg, sizeof msg) == STRATA_ECORRUPT);
            CHECK_MSG(strstr(msg, "checksum mismatch in") && strstr(msg, tb->name), "%s", msg);
            w->ops->close(w);
        }
    }
    pair_free(&d);
    pack_close(pk);
    model_close(&m);
}

/* A self-draft pass (engine_draft_step: pinned layers only, cached experts
 * only) inside a speculation that is rolled back leaves no trace: decoding with
 * three draft passes before every token gives the resident run's ids and logits
 * bits. The placement pins the head and every other layer, so the drafts skip
 * the streamed layers and drop the experts not in the cache. */
TEST(stream_draft_leaves_no_trace) {
    model m;
    const char *dir = preset_open(&m, "tiny", "st_draft", 5);
    if (!dir) return;
    enum { G = 6 };
    int32_t want[G], got[G];
    const int64_t V = m.c.vocab;
    float *wl = base_alloc((size_t)V * sizeof(float), MEM_MISC), *lg = base_alloc((size_t)V * sizeof(float), MEM_MISC);
    CHECK(decode(&m, m.res, 4, want, G, wl) == 0);
    uint64_t b[3];
    budgets_for(&m, dir, b);
    char err[1024];
    place_opts o = opts_for(b[1]);
    place_plan p;
    if (place_plan_compute(&m.c, &m.lay, dir, &o, &p, err, sizeof err)) { CHECK_MSG(0, "%s", err); return; }
    /* pin the head and the even layers, stream the odd ones */
    uint64_t largest = 0;
    p.n_pinned = 0;
    p.pinned_bytes = p.streamed_bytes = 0;
    for (int64_t u = 0; u < p.n_units; u++) {
        p.pinned[u] = u == p.n_layers || u % 2 == 0;
        if (p.pinned[u]) { p.n_pinned++; p.pinned_bytes += p.unit_bytes[u]; }
        else { p.streamed_bytes += p.unit_bytes[u]; if (p.unit_bytes[u] > largest) largest = p.unit_bytes[u]; }
    }
    p.ring_min_bytes = largest;
    if (p.ring_bytes < 2 * largest) p.ring_bytes = 2 * largest;
    p.resident = 0;
    p.budget_bytes = 0;
    wsrc *w = NULL;
    if (place_open(&w, &m.c, m.ix, dir, &p, err, sizeof err)) { CHECK_MSG(0, "%s", err); return; }
    engine *e = NULL;
    session *s = NULL;
    engine_opts eo = {.n_threads = 2, .prefill_chunk = p.prefill_chunk, .spec_rows = 4};
    CHECK_MSG(engine_create(&e, &m.c, w, &eo, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(e && session_create(&s, e, 64, err, sizeof err) == 0, "%s", err);
    if (!e || !s) return;
    CHECK(engine_can_draft(e) == 0 || engine_can_draft(e) == 1);
    int32_t prompt[7] = {1, 17, 42, 99, 3, 250, 8};
    int rc = session_eval(s, prompt, 7, lg);
    CHECK(engine_can_draft(e) == 1); /* the pinned units are in RAM once a pass has run */
    for (int g = 0; g < G && !rc; g++) {
        int32_t best = 0;
        for (int64_t i = 1; i < V; i++) if (lg[i] > lg[best]) best = (int32_t)i;
        got[g] = best;
        /* three draft passes, then roll back */
        CHECK(session_spec_begin(s) == 0);
        int32_t t = best;
        for (int k = 0; k < 3; k++) {
            infer_row r = {s, t, 1};
            CHECK_MSG(engine_draft_step(e, &r, 1, lg) == 0, "%s", engine_errmsg(e));
            t = 0;
            for (int64_t i = 1; i < V; i++) if (lg[i] > lg[t]) t = (int32_t)i;
        }
        CHECK(session_spec_end(s, 0) == 0);
        rc = session_eval(s, &best, 1, lg);
    }
    CHECK_MSG(rc == 0, "%s", session_errmsg(s));
    CHECK_MSG(!memcmp(want, got, sizeof want), "ids differ after draft passes");
    CHECK_MSG(!memcmp(wl, lg, (size_t)V * sizeof(float)), "logits bits differ after draft passes");
    engine_draft_stats ds;
    engine_draft_stats_get(e, &ds);
    CHECK(ds.passes == 3 * G);
    CHECK_MSG(ds.layers_skipped > 0 && ds.layers_skipped < ds.layers, "%lld of %lld layers skipped", (long long)ds.layers_skipped,
              (long long)ds.layers);
    CHECK(ds.experts > 0);
    /* with every layer pinned and the token's experts in the cache, a draft pass
     * is the model itself: the same logits bits as the pass that loaded them */
    {
        place_opts oa = opts_for(1ull << 40);
        place_plan pa;
        wsrc *wa = NULL;
        engine *ea = NULL;
        session *sa = NULL;
        float *la = base_alloc((size_t)V * sizeof(float), MEM_MISC), *lb = base_alloc((size_t)V * sizeof(float), MEM_MISC);
        wa = stream_open(&m, dir, &oa, &pa);
        CHECK(wa && engine_create(&ea, &m.c, wa, &eo, err, sizeof err) == 0);
        CHECK(ea && session_create(&sa, ea, 64, err, sizeof err) == 0);
        if (sa) {
            CHECK(session_eval(sa, prompt, 7, la) == 0);
            for (int32_t tok = 5; tok < 8; tok++) {
                infer_row r = {sa, tok, 1};
                engine_draft_stats d0, d1;
                CHECK(session_spec_begin(sa) == 0 && engine_step(ea, &r, 1, la) == 0 && session_spec_end(sa, 0) == 0);
                engine_draft_stats_get(ea, &d0);
                CHECK(session_spec_begin(sa) == 0);
                CHECK_MSG(engine_draft_step(ea, &r, 1, lb) == 0, "%s", engine_errmsg(ea));
                CHECK(session_spec_end(sa, 0) == 0);
                engine_draft_stats_get(ea, &d1);
                CHECK(d1.layers_skipped == d0.layers_skipped && d1.experts_dropped == d0.experts_dropped && d1.experts > d0.experts);
                CHECK_MSG(!memcmp(la, lb, (size_t)V * sizeof(float)), "token %d: a draft with nothing missing differs", tok);
                CHECK(session_eval(sa, &tok, 1, la) == 0);
            }
        }
        session_free(sa);
        engine_free(ea);
        if (wa) wa->ops->close(wa);
        base_free(la);
        base_free(lb);
    }
    /* a draft pass outside a speculation is refused; a resident source cannot draft */
    infer_row r = {s, 1, 1};
    CHECK(engine_draft_step(e, &r, 1, lg) != 0);
    session_free(s);
    engine_free(e);
    w->ops->close(w);
    engine *er = NULL;
    CHECK(engine_create(&er, &m.c, m.res, &eo, err, sizeof err) == 0);
    if (er) CHECK(engine_can_draft(er) == 0);
    engine_free(er);
    base_free(wl);
    base_free(lg);
    model_close(&m);
}
