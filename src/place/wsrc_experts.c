/*
 * wsrc_experts.c: the streaming source's routed experts: each cache slot's record,
 * its reads on the caller's ring and the checks of what landed (checksum, NaN
 * scales; in the engine's pool where it can), the leases of a layer's request,
 * and the expert ops (experts_request, expert_wait, expert_ready, experts_put,
 * expert_put, the checks_* ops, draft_mode, expert_resident).
 */
#include <string.h>
#include "num.h"
#include "pool.h"
#include "wsrc_stream_int.h"

/* ============================================================== expert ops */

typedef struct xg { const st_index *ix; pend p[MAX_XT]; int n; int bad; } xg;
static int xg_fn(void *ud, const tspec *t) {
    xg *g = ud;
    const st_tensor *s = st_find(g->ix, t->name);
    if (!s || g->n == MAX_XT) { g->bad = 1; return 0; }
    g->p[g->n++] = (pend){s, t->role, t->kind, stream_view_of(t, s->dtype)};
    return 0;
}

/* Fills slot sl's record for expert (L, E) and submits its reads. */
int stream_expert_submit(stream *s, int sl, int64_t L, int64_t E) {
    xslot *x = &s->xs[sl];
    xg g = {.ix = s->ix};
    schema_walk_expert(s->c, L, E, s->wf, xg_fn, &g);
    if (g.bad) return base_fail(s->err, sizeof s->err, STRATA_EFORMAT, "stream: layer %lld expert %lld: tensor missing", (long long)L, (long long)E);
    /* the checksum covers the tensors in schema order (pack.c hash_experts), also
     * when they are scattered: remember the order before stream_layout_inplace sorts */
    const st_tensor *order[MAX_XT];
    for (int i = 0; i < g.n; i++) order[i] = g.p[i].s;
    x->has_sum = VERIFY(s);
    if (x->has_sum) x->xxh3_want = s->pk->expert_xxh3[(L - s->c->first_dense) * s->NE + E];
    uint64_t need = stream_layout_inplace(g.p, g.n, x->segs, MAX_XT, &x->n_seg, x->t);
    x->n_h = 0;
    for (int k = 0; k < g.n && need; k++)
        for (int i = 0; i < g.n; i++)
            if (g.p[i].s == order[k]) { x->h_rel[x->n_h] = x->t[i].rel; x->h_len[x->n_h++] = order[k]->nbytes; break; }
    if (!need || need > s->xslot_bytes)
        return base_fail(s->err, sizeof s->err, STRATA_EFORMAT, "stream: layer %lld expert %lld needs %llu bytes, the slot holds %llu",
                         (long long)L, (long long)E, (unsigned long long)need, (unsigned long long)s->xslot_bytes);
    x->n_t = g.n;
    x->L = L;
    x->E = E;
    x->rc = 0;
    x->pf_lease = x->pf_fresh = 0;
    x->pending = x->n_seg;
    uint8_t *buf = cache_data(s->xc, sl);
    if (x->pending) stream_io_enter_l(s);
    for (int i = 0; i < x->n_seg; i++) {
        const seg *q = &x->segs[i];
        x->reqs[i] = (io_req){.f = &s->files[q->file], .off = q->off, .len = q->len, .need = q->need, .dst = buf + q->buf_off,
                              .ud = (void *)(intptr_t)sl};
        io_submit(s->xring, &x->reqs[i]);
    }
    return 0;
}

/* Drops the lease a prefetch held while its read was in flight. */
static void prefetch_release(stream *s, int sl) {
    xslot *x = &s->xs[sl];
    if (!x->pf_lease) return;
    x->pf_lease = 0;
    s->n_pf--;
    cache_unpin(s->xc, sl);
}

/* One read of an expert landed: its slot when that was the expert's last
 * segment (expert_check and expert_finish are then owed), else -1. */
static int expert_arrive(stream *s, io_req *d) {
    int sl = (int)(intptr_t)d->ud;
    xslot *x = &s->xs[sl];
    if (d->rc && !x->rc) x->rc = d->rc;
    int last = --x->pending == 0;
    stream_io_leave_l(s, &s->st.bytes_experts, d->got, 0, 0);
    if (!last) return -1;
    stream_io_leave_l(s, NULL, 0, (uint64_t)x->n_seg, 0);
    return sl;
}

/* The checks of a landed expert that only read its slot: the pack's XXH3 and the
 * NaN scales. Any thread may run them (reap_experts), one slot per thread. */
static void expert_check(stream *s, int sl) {
    xslot *x = &s->xs[sl];
    const uint8_t *buf = cache_data(s->xc, sl);
    x->got = 0;
    x->nan_bad = 0;
    if (!x->rc && x->has_sum) {
        XXH3_state_t h;
        const double t0 = base_now();
        uint64_t nb = 0;
        XXH3_64bits_reset(&h);
        for (int k = 0; k < x->n_h; k++) { wblk_hash_cold(&h, buf + x->h_rel[k], x->h_len[k]); nb += x->h_len[k]; }
        x->got = XXH3_64bits_digest(&h);
        stream_verify_count(s, nb, base_now() - t0);
        if (x->got != x->xxh3_want) x->rc = STRATA_ECORRUPT;
    }
    if (x->rc) return;
    /* an MXFP4 scale of 255 is NaN by the MX spec: a defective checkpoint is an
     * error, never silently computed with (the kernels would zero the group).
     * Scanned once per read: the scales are 1/17 of the expert's bytes. */
    for (int i = 0; i < x->n_t; i++) {
        const int r = x->t[i].role;
        if (r != R_EXP_W1S && r != R_EXP_W2S && r != R_EXP_W3S) continue;
        const wt *v = &x->t[i].view;
        x->nan_bad += num_mxfp4_count_nan_scales(buf + x->t[i].rel, (size_t)(v->rows * v->cols));
    }
}

/* The rest, on the thread that drives the stream: the error, or the views and
 * the slot published. A failed read that only a prefetch holds fails silently
 * (the slot is forgotten, so a request reads it again and reports what happens
 * then). */
static void expert_finish(stream *s, int sl) {
    xslot *x = &s->xs[sl];
    const int silent = x->pf_lease && cache_leases(s->xc, sl) == 1;
    uint8_t *buf = cache_data(s->xc, sl);
    if (x->rc) {
        if (silent) {
        } else if (x->rc == STRATA_ECORRUPT) {
            const seg *a = &x->segs[0], *b = &x->segs[x->n_seg - 1];
            base_fail(s->err, sizeof s->err, STRATA_ECORRUPT,
                      "layer %lld expert %lld: checksum mismatch in %s bytes %llu..%llu%s (expected %016llx, got %016llx): "
                      "the shard changed after packing or is corrupt; run strata pack --verify",
                      (long long)x->L, (long long)x->E, s->files[a->file].path, (unsigned long long)a->off,
                      (unsigned long long)(a->file == b->file ? b->off + b->need : a->off + a->need),
                      a->file == b->file ? "" : " and more", (unsigned long long)x->xxh3_want, (unsigned long long)x->got);
        } else {
            char e2[600];
            for (int i = 0; i < x->n_seg; i++) if (x->reqs[i].rc) { io_req_errstr(&x->reqs[i], e2, sizeof e2); break; }
            base_fail(s->err, sizeof s->err, STRATA_EIO, "layer %lld expert %lld unreadable: %s", (long long)x->L, (long long)x->E, e2);
        }
        cache_fail(s->xc, sl);
        prefetch_release(s, sl);
        return;
    }
    if (x->nan_bad) {
        if (!silent)
            base_fail(s->err, sizeof s->err, STRATA_EFORMAT,
                      "layer %lld expert %lld: %zu MXFP4 scale bytes are 255 (NaN in the MX spec): the checkpoint is "
                      "defective (strata inspect --scan lists every such tensor)", (long long)x->L, (long long)x->E, x->nan_bad);
        cache_fail(s->xc, sl);
        prefetch_release(s, sl);
        return;
    }
    memset(x->roles, 0, sizeof x->roles);
    for (int i = 0; i < x->n_t; i++) {
        wt v = x->t[i].view;
        v.p = buf + x->t[i].rel;
        wt_put(x->roles, x->t[i].role, x->t[i].kind, v);
    }
    cache_publish(s->xc, sl);
    prefetch_release(s, sl);
}

/* One read landed: when it completes its expert, check and bind or fail it. */
void stream_expert_landed(stream *s, io_req *d) {
    const int sl = expert_arrive(s, d);
    if (sl < 0) return;
    expert_check(s, sl);
    expert_finish(s, sl);
}

typedef struct { stream *s; const int *sl; } check_job;
static void check_fn(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const check_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) expert_check(j->s, j->sl[i]);
}

/* Reaps completions until slot sl's read has fully arrived (blocking when wait,
 * else only what has landed) and checks the experts they complete. The checks
 * (an XXH3 pass over each expert) ran one after another on the engine's
 * driving thread while the other threads idled: at 6.2 GB on ladder the driving
 * thread spent +10 ms per token outside the pool against 16 GB (81 MB of experts
 * landed per token). The experts that complete together are now checked at
 * once on the pass's pool (use_pool), one expert per thread. It stops at sl as
 * the one-at-a-time loops did: reaping further would end the leases of reads
 * ahead early, and at 4 GB the cache then evicted more of them before their
 * request (misses 270 -> 560 per 31 tokens). Returns the reads reaped. */
#define REAP_MAX 64
static int reap_experts(stream *s, int sl, int wait) {
    int done[REAP_MAX], nd = 0, n = 0;
    io_req *d;
    stream_ck_flush(s);
    while (nd < REAP_MAX && s->xs[sl].pending > 0 && cache_state(s->xc, sl) == 1 /* INFLIGHT */ &&
           io_reap(s->xring, wait, &d) == 1) {
        n++;
        const int got = expert_arrive(s, d);
        if (got >= 0) done[nd++] = got;
    }
    if (nd > 1 && s->pool) {
        check_job j = {s, done};
        pool_for(s->pool, nd, 1, check_fn, &j);
    } else {
        for (int i = 0; i < nd; i++) expert_check(s, done[i]);
    }
    for (int i = 0; i < nd; i++) expert_finish(s, done[i]);
    return n;
}

/* Checks inside the engine's pool job. Landed experts were checked when the
 * driving thread reaped them, mostly one at a time (the run at 6.2 GB on ladder:
 * 1,541 reaps found one landed expert, 318 two), and the other threads waited
 * through each XXH3 pass (~130 us per 1.68 MB expert). Right after a layer's
 * request (the experts a late guess read ahead have landed by then, and the
 * reads just started have not) the engine takes what has landed
 * (stream_checks_begin) and runs the checks as tasks of its next job, beside that
 * job's products (stream_check_run, any thread, each once); stream_checks_end then
 * finishes them on the driving thread (the error, or the views published).
 * Nothing is computed with an expert before its check: the batch that uses it
 * comes after. Every other entry point on the expert path finishes pending
 * checks first (stream_ck_flush), so a caller that skips stream_checks_end changes only
 * where the checks run. */
int stream_checks_begin(wsrc *w) {
    stream *s = (stream *)w;
    if (!s->xc) return 0;
    stream_ck_flush(s);
    io_req *d;
    while (s->n_ck < CK_MAX && io_reap(s->xring, 0, &d) == 1) {
        const int sl = expert_arrive(s, d);
        if (sl >= 0) { s->ck_ran[s->n_ck] = 0; s->ck_sl[s->n_ck++] = sl; }
    }
    return s->n_ck;
}

void stream_check_run(wsrc *w, int i) {
    stream *s = (stream *)w;
    if (i < 0 || i >= s->n_ck || s->ck_ran[i]) return;
    expert_check(s, s->ck_sl[i]);
    s->ck_ran[i] = 1;
}

void stream_ck_flush(stream *s) {
    const int n = s->n_ck;
    s->n_ck = 0;
    for (int i = 0; i < n; i++) {
        if (!s->ck_ran[i]) expert_check(s, s->ck_sl[i]);
        expert_finish(s, s->ck_sl[i]);
    }
}

void stream_checks_end(wsrc *w) { stream_ck_flush((stream *)w); }

/* Reaps completions until slot sl's read is no longer in flight. */
static void expert_settle(stream *s, int sl) {
    while (cache_state(s->xc, sl) == 1 /* INFLIGHT */ && reap_experts(s, sl, 1) > 0) {}
}

/* Releases the open request's leases once their reads have landed; reads a
 * prefetch started stay in flight (they hold their own leases). */
static void release_request(stream *s) {
    for (int i = 0; i < s->n_req; i++) expert_settle(s, s->req_slot[s->req_list[i]]);
    for (int i = 0; i < s->n_req; i++) {
        int32_t id = s->req_list[i];
        cache_unpin(s->xc, s->req_slot[id]);
        s->req_slot[id] = -1;
    }
    s->n_req = 0;
    s->req_L = -1;
}

int stream_experts_request(wsrc *w, int64_t L, int n, const int32_t *ids) {
    stream *s = (stream *)w;
    stream_ck_flush(s);
    if (L < s->c->first_dense || L >= s->c->n_layers)
        return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: layer %lld has no routed experts", (long long)L);
    if (s->req_L >= 0 && s->req_L != L) release_request(s); /* the caller skipped experts_put */
    s->req_L = L;
    const int predicted = s->pf_L == L;
    if (predicted && s->n_req == 0) s->st.pred_layers++;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= s->NE) {
            release_request(s);
            return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: expert %d of layer %lld out of range", id, (long long)L);
        }
        if (s->req_slot[id] >= 0) continue; /* already requested in this layer */
        if (s->draft && !cache_resident(s->xc, (L - s->c->first_dense) * s->NE + id)) {
            release_request(s);
            return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: a draft pass asked for expert %d of layer %lld, "
                             "which is not in RAM", id, (long long)L);
        }
        if (s->trace && !s->draft) {
            int32_t rec[2] = {(int32_t)L, id};
            fwrite(rec, sizeof rec, 1, s->trace); /* stdio buffer from open: no allocation here */
        }
        if (predicted) {
            s->st.pred_requests++;
            s->st.pred_hits += s->pf_mark[id];
        }
        const int64_t key = (L - s->c->first_dense) * s->NE + id;
        int kind;
        int sl = cache_pin(s->xc, key, &kind);
        /* slots a prefetch holds come free as their reads land */
        io_req *d;
        while (sl < 0 && s->n_pf > 0 && io_reap(s->xring, 1, &d) == 1) {
            stream_expert_landed(s, d);
            sl = cache_pin(s->xc, key, &kind);
        }
        if (sl < 0) {
            int64_t held = s->n_req;
            release_request(s);
            return base_fail(s->err, sizeof s->err, STRATA_EBUDGET,
                             "stream: the expert cache (%lld slots) cannot lease %lld experts of layer %lld at once: "
                             "stream them in waves of at most experts_capacity", (long long)cache_n_slots(s->xc), (long long)held + (n - i),
                             (long long)L);
        }
        s->req_slot[id] = sl;
        s->req_list[s->n_req++] = id;
        if (kind == CACHE_MISS) {
            s->pf_quiet[L] = s->pf_skip[L] = 0; /* waited for: guess this layer again */
            stream_prefault_note(s, sl);
            int rc = stream_expert_submit(s, sl, L, id);
            if (rc) { cache_fail(s->xc, sl); release_request(s); return rc; }
        } else if (s->xs[sl].pf_fresh) {
            s->xs[sl].pf_fresh = 0;
            s->st.prefetch_used++;
        }
    }
    return 0;
}

int stream_expert_wait(wsrc *w, int64_t L, int32_t id, const wt **roles) {
    stream *s = (stream *)w;
    if (L != s->req_L || id < 0 || id >= s->NE || s->req_slot[id] < 0)
        return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: expert %d of layer %lld was not requested", id, (long long)L);
    int sl = s->req_slot[id];
    double t0 = base_now();
    expert_settle(s, sl);
    stream_io_leave_l(s, NULL, 0, 0, base_now() - t0);
    if (cache_state(s->xc, sl) != 2) {
        if (!s->err[0]) base_fail(s->err, sizeof s->err, STRATA_EIO, "layer %lld expert %d: read failed", (long long)L, id);
        return strstr(s->err, "checksum") ? STRATA_ECORRUPT : strstr(s->err, "MXFP4") ? STRATA_EFORMAT : STRATA_EIO;
    }
    *roles = s->xs[sl].roles;
    return 0;
}

/* Ready without blocking: collects the reads that have landed (never waits), then
 * asks the slot. A failed read counts as ready (expert_wait reports it). */
int stream_expert_ready(wsrc *w, int64_t L, int32_t id) {
    stream *s = (stream *)w;
    if (L != s->req_L || id < 0 || id >= s->NE || s->req_slot[id] < 0) return 1;
    const int sl = s->req_slot[id];
    while (cache_state(s->xc, sl) == 1 /* INFLIGHT */ && reap_experts(s, sl, 0) > 0) {}
    return cache_state(s->xc, sl) != 1;
}

void stream_experts_put(wsrc *w, int64_t L) {
    stream *s = (stream *)w;
    stream_ck_flush(s);
    if (s->req_L == L) release_request(s);
    if (s->pf_L == L) s->pf_L = -1; /* the prediction was used */
    else if (s->pf_L >= 0 && s->pf_L != L + 1) { /* never requested: not counted */
        s->pf_L = -1;
    }
}

/* One expert of the open request, released early (its compute is done). The
 * request list is short (at most the cache's slots): a linear search is cheap. */
void stream_expert_put(wsrc *w, int64_t L, int32_t id) {
    stream *s = (stream *)w;
    stream_ck_flush(s);
    if (s->req_L != L || id < 0 || id >= s->NE || s->req_slot[id] < 0) return;
    const int sl = s->req_slot[id];
    expert_settle(s, sl);
    cache_unpin(s->xc, sl);
    s->req_slot[id] = -1;
    for (int i = 0; i < s->n_req; i++)
        if (s->req_list[i] == id) { s->req_list[i] = s->req_list[--s->n_req]; break; }
}

int64_t stream_experts_capacity(wsrc *w) { return cache_n_slots(((stream *)w)->xc); }

/* ========================================================== self-drafting */

int stream_draft_mode(wsrc *w, int on) {
    stream *s = (stream *)w;
    stream_ck_flush(s);
    if (!s->xc) return STRATA_EINVAL;
    if (on && !s->draft) cache_get_stats(s->xc, &s->draft_saved);
    if (!on && s->draft) cache_set_stats(s->xc, &s->draft_saved);
    s->draft = on;
    return 0;
}

int stream_expert_resident(wsrc *w, int64_t L, int32_t id) {
    stream *s = (stream *)w;
    if (!s->xc || L < s->c->first_dense || L >= s->c->n_layers || id < 0 || id >= s->NE) return 0;
    return cache_resident(s->xc, (L - s->c->first_dense) * s->NE + id);
}
