/* t_stream_util.c: what the streaming suites share (t_stream.c,
 * t_stream_bits.c, t_stream_verify.c): a generated model opened with its
 * resident oracle, plans at a budget, the streamed source compared view by view,
 * greedy decodes compared bit for bit, and damage that keeps the mtime. No TEST
 * here; declared (and described) in stream_test.h. */
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "stream_test.h"

int tstream_model_open(tstream_model *m, const char *dir) {
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

void tstream_model_close(tstream_model *m) {
    if (m->res) m->res->ops->close(m->res);
    st_close(m->ix);
}

const char *tstream_preset_open(tstream_model *m, const char *preset, const char *dirname, uint64_t seed) {
    const char *dir = tpack_model(preset, dirname, seed);
    if (!dir || tstream_model_open(m, dir)) { CHECK_MSG(0, "%s: not made or not opened", dirname); return NULL; }
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

int tstream_compare_all(tstream_model *m, wsrc *w, int shuffle) {
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

place_opts tstream_opts(uint64_t ram) {
    place_opts o = place_opts_default();
    o.ram_bytes = ram;
    o.ctx = 64;
    o.prefill_chunk = 4;
    o.session_bytes = infer_session_bytes;
    o.engine_bytes = infer_engine_bytes;
    o.overhead_bytes = 32u << 20; /* fixed, so budgets computed here stay comparable */
    return o;
}

wsrc *tstream_open(tstream_model *m, const char *dir, const place_opts *o, place_plan *p) {
    char err[2048];
    wsrc *w = NULL;
    if (place_plan_compute(&m->c, &m->lay, dir, o, p, err, sizeof err) || place_open(&w, &m->c, m->ix, dir, p, err, sizeof err)) {
        CHECK_MSG(0, "%s", err);
        return NULL;
    }
    return w;
}

void tstream_budgets(tstream_model *m, const char *dir, uint64_t b[3]) {
    place_plan p;
    place_opts o = tstream_opts(1ull << 40);
    char err[1024];
    place_plan_compute(&m->c, &m->lay, dir, &o, &p, err, sizeof err);
    uint64_t all = p.total_bytes; /* the floor plus everything pinned and cached */
    b[0] = p.min_bytes;
    b[1] = p.min_bytes + (all - p.min_bytes) / 3;
    b[2] = 0;
}

int tstream_decode(tstream_model *m, wsrc *w, int64_t chunk, int32_t *ids_out, int n_gen, float *last_logits) {
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

void tstream_pair_init(tstream_pair *d, tstream_model *m, int g, int resident) {
    memset(d, 0, sizeof *d);
    d->g = g;
    d->wl = base_alloc((size_t)m->c.vocab * sizeof(float), MEM_MISC);
    d->gl = base_alloc((size_t)m->c.vocab * sizeof(float), MEM_MISC);
    if (resident) CHECK(tstream_decode(m, m->res, 4, d->want, g, d->wl) == 0);
}

void tstream_pair_free(tstream_pair *d) {
    base_free(d->wl);
    base_free(d->gl);
}

void tstream_pair_check(const tstream_pair *d, const tstream_model *m, const char *what) {
    CHECK_MSG(!memcmp(d->want, d->got, (size_t)d->g * sizeof(int32_t)), "%s: ids differ", what);
    CHECK_MSG(!memcmp(d->wl, d->gl, (size_t)m->c.vocab * sizeof(float)), "%s: logits bits differ", what);
}

void tstream_pair_same(tstream_pair *d, tstream_model *m, wsrc *w, int64_t chunk, const char *what) {
    memset(d->got, 0, sizeof d->got);
    CHECK_MSG(tstream_decode(m, w, chunk, d->got, d->g, d->gl) == 0, "%s", what);
    tstream_pair_check(d, m, what);
}

void tstream_flip_keep_mtime(const char *path, uint64_t off) {
    struct stat sb;
    if (stat(path, &sb)) return;
    int fd = open(path, O_RDWR);
    uint8_t b;
    if (fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1) { b ^= 0x10; if (pwrite(fd, &b, 1, (off_t)off) != 1) {} }
    if (fd >= 0) close(fd);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    utimensat(AT_FDCWD, path, ts, 0);
}
