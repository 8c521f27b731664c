/*
 * wsrc_ahead.c: the streaming source's work ahead of use: the thread that faults
 * fresh expert slots in, the guesses a layer ahead and their reads into free slots
 * (predict_layer, experts_prefetch, with the backoff of guesses that read
 * nothing), and the warm start that fills the pinned trunk and the cache at open
 * (preload).
 */
#include <string.h>
#include "num.h"
#include "wsrc_stream_int.h"

/* The first read into a never-used cache slot faults in and zeroes its pages
 * (~2.5 s per GB in this VM: 4 ms per ladder expert), and the forward thread
 * waits for that read. This thread does it ahead of use instead, with
 * MADV_POPULATE_WRITE (no data written, so it may overlap a read into the slot).
 * Peak RSS grows at most PF_AHEAD slots ahead of use, inside the budgeted arena. */
void *stream_prefault_main(void *arg) {
    stream *s = arg;
    const int64_t n = cache_n_slots(s->xc);
    int64_t done = 0;
    pthread_mutex_lock(&s->pf_mu);
    for (;;) {
        while (!s->pf_stop && done >= s->pf_want) pthread_cond_wait(&s->pf_cv, &s->pf_mu);
        if (s->pf_stop) break;
        int64_t want = s->pf_want < n ? s->pf_want : n;
        pthread_mutex_unlock(&s->pf_mu);
        while (done < want) { /* 8 adjacent slots per call, top index down */
            int64_t k = want - done < 8 ? want - done : 8, lo = n - done - k;
            if (io_buffer_populate(cache_data(s->xc, (int)lo), (uint64_t)k * s->xslot_bytes)) { want = done = n; break; }
            done += k;
        }
        pthread_mutex_lock(&s->pf_mu);
        if (done >= n) break;
    }
    pthread_mutex_unlock(&s->pf_mu);
    return NULL;
}

/* A miss took slot sl: when it is a fresh one, move the prefaulter's target. */
void stream_prefault_note(stream *s, int sl) {
    if (!s->pf_started || sl >= s->x_low) return;
    s->x_low = sl;
    const int64_t want = cache_n_slots(s->xc) - sl + PF_AHEAD;
    if (want < s->pf_asked + PF_AHEAD / 4) return; /* wake it every PF_AHEAD / 4 slots */
    pthread_mutex_lock(&s->pf_mu);
    s->pf_want = s->pf_asked = want;
    pthread_cond_signal(&s->pf_cv);
    pthread_mutex_unlock(&s->pf_mu);
}

/* Room for reads ahead: the slots neither leased nor in flight, less what one
 * row's experts need so a request never waits on a guess. */
static int64_t prefetch_room(const stream *s) {
    return cache_n_slots(s->xc) - cache_n_pinned(s->xc) - s->c->topk;
}

int stream_predict_layer(wsrc *w, int64_t L, const wt **roles, const wt **guess) {
    stream *s = (stream *)w;
    *guess = NULL;
    if (s->plan.no_prefetch || !s->xc || L < s->c->first_dense || L >= s->c->n_layers || prefetch_room(s) < 1) return 1;
    if (s->pf_skip[L]) { s->pf_skip[L]--; s->st.pred_skipped++; return 1; }
    /* every expert of L holds a slot, so a guess could read nothing (a budget
     * that holds the whole model; the backoff below would still guess every
     * 64th time) */
    if (cache_layer_held(s->xc, L - s->c->first_dense) >= s->NE) { s->st.pred_skipped++; return 1; }
    pthread_mutex_lock(&s->mu);
    unit *x = &s->u[L];
    /* pinned units only: a streamed one would be dropped from the arena at its put */
    const int ok = x->pinned && x->state == U_READY;
    if (ok) {
        x->held++;
        *roles = x->roles;
        *guess = x->gq_ok ? x->gqw : NULL;
        s->st.guess_lends += x->gq_ok;
    }
    pthread_mutex_unlock(&s->mu);
    return !ok;
}

void stream_experts_prefetch(wsrc *w, int64_t L, int n, const int32_t *ids) {
    stream *s = (stream *)w;
    stream_ck_flush(s);
    if (s->plan.no_prefetch || !s->xc || L < s->c->first_dense || L >= s->c->n_layers) return;
    if (s->pf_L != L) memset(s->pf_mark, 0, (size_t)s->NE); /* a second guess for L adds to the first */
    s->pf_L = L;
    int reads = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->NE && !s->pf_mark[ids[i]]) {
            s->pf_mark[ids[i]] = 1;
            s->st.pred_ids++;
        }
    for (int i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (id < 0 || id >= s->NE || prefetch_room(s) < 1) continue;
        const int sl = cache_prefetch(s->xc, (L - s->c->first_dense) * s->NE + id);
        if (sl < 0) continue; /* resident, in flight, or no victim */
        stream_prefault_note(s, sl);
        if (stream_expert_submit(s, sl, L, id)) { /* a record that cannot be read: the request will say why */
            s->err[0] = 0;
            cache_fail(s->xc, sl);
            cache_unpin(s->xc, sl);
            continue;
        }
        s->xs[sl].pf_lease = s->xs[sl].pf_fresh = 1;
        s->n_pf++;
        s->st.prefetch_reads++;
        reads++;
    }
    /* A guess costs its layer's router (a matvec of E x hidden over the whole
     * trunk's bandwidth) and its top-k; where the cache already holds what the
     * layer picks, that is all it does. Ladder at 8 GB (96.5% hits), 48 tokens,
     * two interleaved pairs: 0.119 s/token with every guess, 0.112-0.116 with
     * none (--no-prefetch). So a layer whose last guesses read nothing skips the
     * next 1, 3, 7, ... up to 63 of them, and a read it waits for (a miss in
     * stream_experts_request) restores every guess. Guesses never change a bit. Up
     * to 63 instead of 15: ladder at 16 GB (everything it uses preloaded), 63
     * tokens, 216 guesses instead of 357 (~90 us each); at 8 GB the misses reset
     * the count first (1,340 guesses either way, the same misses). */
    if (reads) { s->pf_quiet[L] = 0; return; }
    if (s->pf_quiet[L] < PF_QUIET_MAX) s->pf_quiet[L]++;
    s->pf_skip[L] = (uint8_t)((1u << (s->pf_quiet[L] - 1)) - 1);
}

/* ============================================================== warm start */

#define PRELOAD_INFLIGHT 32        /* reads in flight while the cache is filled */
#define PRELOAD_STEP (256ull << 20) /* progress every so many bytes */

static void preload_note(stream *s, uint64_t done, uint64_t total, uint64_t *next) {
    if (!s->plan.progress || (done < *next && done < total)) return;
    s->plan.progress(s->plan.progress_ud, done, total);
    *next = done + PRELOAD_STEP;
}

/* ids[0 .. n) by descending key, ties by ascending id (shell sort: no state
 * outside the call, no allocation). */
static void sort_desc(int32_t *ids, int64_t n, const float *key) {
    for (int64_t gap = n / 2; gap > 0; gap /= 2)
        for (int64_t i = gap; i < n; i++) {
            const int32_t x = ids[i];
            int64_t j = i;
            while (j >= gap && (key[ids[j - gap]] < key[x] || (key[ids[j - gap]] == key[x] && ids[j - gap] > x))) {
                ids[j] = ids[j - gap];
                j -= gap;
            }
            ids[j] = x;
        }
}

/* The requests a partial warm start credits each expert it chose by router bias
 * with (cache_seed). Without a prior those experts had no count until requested,
 * so LAYER evicted them before any expert requested once. The generated models'
 * routing follows the bias, and the counts came too slowly to learn it. Ladder at
 * 6.2 GB, 16-token prompt: over 63 tokens, true hits 86.5% -> 88.6 / 90.0 /
 * 90.4 / 90.5% for priors 1 / 2 / 3 / 4, and 0.072 -> 0.053 GB read per token at
 * 2. Over 199 tokens, 88.8% -> 90.3% (2) / 90.6% (4); a static cache of the 2137
 * experts the trace requests most would hold 91.5%. At 4 GB (2): 54.2 -> 58.1%,
 * 0.242 -> 0.222 GB per token; 8 GB: 96.3 -> 97.7%, 0.019 -> 0.012. Where the
 * bias says little (a trained model balances its load with it) the prior costs
 * only its first requests' worth of stickiness. */
#define PRELOAD_PRIOR 2

/* The warm start (place.h place_open). Reads that fail are left to the first
 * use, which reads again and reports: a warm start never fails an open. */
void stream_preload(stream *s) {
    const cfg *c = s->c;
    const double t0 = base_now();
    const uint64_t b0 = s->st.bytes_trunk + s->st.bytes_head + s->st.bytes_experts;
    uint64_t total = 0, done = 0, next = 0;
    int trunk_pinned = 1;
    for (int64_t u = 0; u < s->n_units; u++) {
        if (s->u[u].pinned) total += s->u[u].buf_bytes;
        else if (u < c->n_layers) trunk_pinned = 0;
    }
    const int64_t n_all = s->n_moe * s->NE, slots = s->xc ? cache_n_slots(s->xc) : 0;
    const int64_t n_x = slots >= n_all ? n_all : trunk_pinned ? slots : 0;
    total += (uint64_t)n_x * s->plan.expert_bytes;
    if (!total) return;
    pthread_mutex_lock(&s->mu);
    for (int64_t u = 0; u < s->n_units; u++) {
        unit *x = &s->u[u];
        if (!x->pinned || x->state != U_IDLE) continue;
        x->state = U_LOADING;
        stream_load_unit_locked(s, u, s->rring);
        done += x->buf_bytes;
        pthread_mutex_unlock(&s->mu);
        preload_note(s, done, total, &next);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    float *bias = n_x && n_x < n_all ? base_alloc((size_t)s->NE * sizeof(float), MEM_INDEX) : NULL;
    int32_t *ids = s->req_list; /* free until the first request */
    int64_t got = 0;
    for (int64_t l = 0; l < s->n_moe && n_x; l++) {
        const int64_t L = c->first_dense + l, q = n_x / s->n_moe + (l < n_x % s->n_moe);
        int64_t n = 0;
        for (int32_t e = 0; e < s->NE; e++) ids[n++] = e;
        if (q < s->NE) { /* this layer's share: highest router bias first */
            const unit *x = &s->u[L];
            const wt *v = &x->roles[R_MOE_BIAS];
            if (!bias || x->state != U_READY || !v->p || v->rows * v->cols != s->NE) continue;
            num_to_f32(bias, v->p, v->dtype, (size_t)s->NE);
            sort_desc(ids, n, bias);
            n = q;
            memset(s->pf_mark, 0, (size_t)(uint32_t)s->NE); /* back to file order */
            for (int64_t i = 0; i < n; i++) s->pf_mark[ids[i]] = 1;
            n = 0;
            for (int32_t e = 0; e < s->NE; e++) if (s->pf_mark[e]) ids[n++] = e;
            memset(s->pf_mark, 0, (size_t)(uint32_t)s->NE);
        }
        for (int64_t i = 0; i < n; i++) {
            io_req *d;
            while (io_pending(s->xring) >= PRELOAD_INFLIGHT && io_reap(s->xring, 1, &d) == 1) stream_expert_landed(s, d);
            const int sl = cache_prefetch(s->xc, l * s->NE + ids[i]);
            if (sl < 0) continue;
            stream_prefault_note(s, sl);
            if (stream_expert_submit(s, sl, L, ids[i])) {
                s->err[0] = 0;
                cache_fail(s->xc, sl);
                cache_unpin(s->xc, sl);
                continue;
            }
            s->xs[sl].pf_lease = 1;
            s->n_pf++;
            got++;
            if (q < s->NE) cache_seed(s->xc, l * s->NE + ids[i], PRELOAD_PRIOR);
            done += s->plan.expert_bytes;
            preload_note(s, done, total, &next);
        }
    }
    io_req *d;
    while (io_pending(s->xring) && io_reap(s->xring, 1, &d) == 1) stream_expert_landed(s, d);
    base_free(bias);
    if (done < total) preload_note(s, total, total, &next);
    s->st.preload_bytes = s->st.bytes_trunk + s->st.bytes_head + s->st.bytes_experts - b0;
    s->st.preload_s = base_now() - t0;
    s->st.preload_experts = got;
}
