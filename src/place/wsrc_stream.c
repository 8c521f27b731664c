/*
 * wsrc_stream.c: the streaming weight source (place_open in place.h).
 *
 * Owns: the trunk units (layers 0..n-1 and the head), pinned in their own buffers
 * or streamed through one arena; the expert cache (cache.h) and its reads; the
 * embedding table (resident or read by row). Does not interpret weights: views are
 * built from the schema exactly as wsrc_resident builds them, over the same bytes.
 *
 * Records: a unit or an expert is a list of segments, each one aligned read of a
 * file range into the buffer at an aligned offset; tensors are views into them. From
 * a pack a unit is one segment (its padded run in trunk.bin); in place, the
 * tensors are sorted by (shard, offset) and neighbours less than 64 KB apart share
 * a segment, so a contiguous layer is one read there too.
 *
 * Threads: the caller (forward thread) and one reader thread that loads trunk
 * units ahead of use, each with its own io ring. One mutex guards unit states and
 * the arena. Invariants (the seed engine's two worst bugs): a unit whose read is in
 * flight is never handed out (layer_get waits for READY); a held unit is never
 * dropped or overwritten (arena space is only reused after layer_put, and the
 * prefetch that makes room only drops units with held == 0, after their read).
 * Experts are read on the caller's ring: all misses of a layer are submitted at
 * once (many in flight), expert_wait consumes completions as they land.
 *
 * Reads ahead (issue 17): experts_prefetch starts predicted experts' reads into
 * free slots, each holding its own lease until it lands (a request that finds
 * every slot taken reaps them first; a failed guess fails silently and is read
 * again on request). The warm start (preload) fills the pinned units and the
 * cache at open through the same path. Row slices (plan.sliced): a streamed
 * unit's large matrices are not in its record; rows_get reads them a slice at a
 * time into a few buffers on a third ring of the caller's, checking each
 * matrix's own checksum as its slices are consumed in row order.
 *
 * Files: this one (open, close, the embeddings, the wsrc_ops table, stats);
 * wsrc_trunk.c (trunk records and reads, the reader thread, the arena, the trunk
 * ops); wsrc_rows.c (row slices); wsrc_experts.c (expert slots, reads, checks
 * and leases); wsrc_ahead.c (the slot prefaulter, guesses and reads ahead, the
 * warm start). What they share is in wsrc_stream_int.h.
 */
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "num.h"
#include "wsrc_stream_int.h"

static const wsrc_ops k_stream_ops;

/* ============================================================ small helpers */

/* The roles whose matrices may be read by row slices (plan.slice_min_bytes). Here
 * rather than in plan.c so that the planner depends on the source and not back. */
int place_sliceable_role(int r) {
    switch (r) {
    case R_KDA_Q: case R_KDA_K: case R_KDA_V: case R_KDA_G: case R_KDA_O: case R_KDA_FA: case R_KDA_FB: case R_KDA_B:
    case R_KDA_GA: case R_KDA_GB:
    case R_MLA_QA: case R_MLA_QB: case R_MLA_KVA: case R_MLA_O: case R_MLA_G:
    case R_DENSE_GATE: case R_DENSE_UP: case R_DENSE_DOWN:
    case R_MOE_ROUTER: case R_MOE_LAT_DOWN: case R_MOE_LAT_UP: case R_MOE_SH_GATE: case R_MOE_SH_UP: case R_MOE_SH_DOWN:
    case R_LM_HEAD:
        return 1;
    default:
        return 0;
    }
}

/* The expert cache's bookkeeping beside its slot bytes (the planner counts it). */
uint64_t place_cache_meta_bytes(int64_t n_keys, int64_t n_layers, int64_t n_experts, int64_t n_slots) {
    if (n_keys <= 0 || n_slots < 0) return 0;
    /* xs per slot; req_slot, req_list and pf_mark per expert of a layer (place_open) */
    return cache_meta_bytes(n_keys, n_slots, n_layers) + (uint64_t)n_slots * sizeof(xslot) +
           (uint64_t)n_experts * (2 * sizeof(int32_t) + 1);
}

/* =============================================================== embeddings */

static int st_embed_rows(wsrc *w, int n, const int32_t *ids, float *out) {
    stream *s = (stream *)w;
    const int64_t H = s->c->hidden;
    if (s->plan.no_head) return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: the embedding is held by another stage");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->c->vocab)
            return base_fail(s->err, sizeof s->err, STRATA_EINVAL, "stream: token id %d outside the vocabulary (%lld)", ids[i],
                             (long long)s->c->vocab);
    if (s->emb) {
        for (int i = 0; i < n; i++) num_to_f32(out + (int64_t)i * H, s->emb + (uint64_t)ids[i] * s->emb_row, s->emb_dtype, (size_t)H);
        return 0;
    }
    double t0 = base_now();
    io_req q[EMB_BATCH];
    int rc = 0;
    for (int i0 = 0; i0 < n && !rc; i0 += EMB_BATCH) {
        int m = n - i0 < EMB_BATCH ? n - i0 : EMB_BATCH;
        uint64_t got = 0;
        stream_io_enter_l(s);
        for (int i = 0; i < m; i++) {
            uint64_t off = s->emb_off + (uint64_t)ids[i0 + i] * s->emb_row;
            uint64_t a0 = io_align_down(off), a1 = io_align_up(off + s->emb_row);
            q[i] = (io_req){.f = &s->files[s->emb_file], .off = a0, .len = a1 - a0, .need = off + s->emb_row - a0,
                            .dst = s->emb_bounce + (uint64_t)i * s->emb_slot, .ud = (void *)(intptr_t)(off - a0)};
            io_submit(s->xring, &q[i]);
        }
        /* The ring also carries expert reads, and reads ahead may still be in
         * flight: a completion that is not one of these rows is an expert's,
         * landed as any reap would land it (taking it for a row lost the
         * expert's read, "read failed" at its wait, and could hand out a row
         * whose read had not finished). */
        for (int left = m; left > 0;) {
            io_req *d;
            if (io_reap(s->xring, 1, &d) != 1) { rc = STRATA_EIO; break; }
            int mine = 0;
            for (int i = 0; i < m && !mine; i++) mine = d == &q[i];
            if (!mine) { stream_expert_landed(s, d); continue; }
            left--;
            if (d->rc && !rc) {
                char e2[600];
                io_req_errstr(d, e2, sizeof e2);
                rc = base_fail(s->err, sizeof s->err, STRATA_EIO, "embedding row: %s", e2);
            }
            got += d->got;
        }
        stream_io_leave_l(s, &s->st.bytes_embed, got, (uint64_t)m, 0);
        for (int i = 0; i < m && !rc; i++)
            num_to_f32(out + (int64_t)(i0 + i) * H, q[i].dst + (uint64_t)(intptr_t)q[i].ud, s->emb_dtype, (size_t)H);
    }
    stream_io_leave_l(s, NULL, 0, 0, base_now() - t0);
    return rc;
}

/* ==================================================================== close */

static void ws_close(wsrc *w) {
    stream *s = (stream *)w;
    if (!s) return;
    if (s->xc) stream_ck_flush(s);
    if (s->th_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    if (s->pf_started) {
        pthread_mutex_lock(&s->pf_mu);
        s->pf_stop = 1;
        pthread_cond_signal(&s->pf_cv);
        pthread_mutex_unlock(&s->pf_mu);
        pthread_join(s->pf_th, NULL);
    }
    if (s->xring && s->xc) {
        io_req *d;
        while (io_pending(s->xring) && io_reap(s->xring, 1, &d) == 1) stream_expert_landed(s, d);
    }
    if (s->sring) {
        io_req *d;
        while (io_pending(s->sring) && io_reap(s->sring, 1, &d) == 1) {}
    }
    io_ring_free(s->rring);
    io_ring_free(s->xring);
    io_ring_free(s->sring);
    if (s->sl) for (int i = 0; i < s->n_sl; i++) base_free(s->sl[i].buf);
    base_free(s->sl);
    if (s->u) {
        for (int64_t u = 0; u < s->n_units; u++) {
            if (s->u[u].pinned) base_free(s->u[u].buf);
            base_free(s->u[u].gq);
            base_free(s->u[u].t);
            base_free(s->u[u].segs);
            base_free(s->u[u].big);
            base_free(s->u[u].sum);
            for (int k = 0; s->u[u].wb && k < s->u[u].n_wb; k++) base_free((void *)s->u[u].wb[k].done);
            base_free(s->u[u].wb);
            base_free(s->u[u].wb_t);
        }
    }
    base_free(s->u);
    base_free(s->arena);
    cache_free(s->xc);
    base_free(s->xs);
    base_free(s->req_slot);
    base_free(s->req_list);
    base_free(s->pf_mark);
    base_free(s->emb);
    base_free(s->emb_bounce);
    if (s->files) for (int i = 0; i < s->n_files; i++) io_file_close(&s->files[i]);
    base_free(s->files);
    pack_close(s->pk);
    if (s->trace) fclose(s->trace);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->pf_mu);
    pthread_cond_destroy(&s->pf_cv);
    base_free(s);
}

static const char *st_errmsg(wsrc *w) { return ((stream *)w)->err; }

static void st_use_pool(wsrc *w, struct pool *p) { ((stream *)w)->pool = p; }

static const wsrc_ops k_stream_ops = {
    stream_layer_get, stream_layer_put, stream_experts_request, stream_expert_wait, stream_experts_put,
    st_embed_rows, stream_hint_layer, ws_close, st_errmsg, stream_expert_ready, stream_expert_put, stream_experts_capacity,
    stream_draft_mode, stream_layer_peek, stream_expert_resident,
    stream_predict_layer, stream_experts_prefetch, stream_rows_slice, stream_rows_get, stream_rows_put, stream_rows_hint, st_use_pool,
    stream_checks_begin, stream_check_run, stream_checks_end,
};

/* ===================================================================== open */

/* The embedding region of the pack against its XXH3: the resident table as read
 * (buf, n), or, when rows are read one by one (a row cannot be checked alone), the
 * region streamed once through the row buffers in `chunk`-byte reads at open
 * (K3: 2.3 GB, a few seconds, inside the budget). */
static int embed_check(stream *s, const uint8_t *buf, uint64_t n, uint64_t chunk, char *err, size_t errlen) {
    const pack_region *r = &s->pk->embed;
    uint64_t got;
    if (buf) {
        got = stream_hash_cold(buf, n);
    } else {
        if (chunk < IO_ALIGN) chunk = IO_ALIGN; /* emb_slot > IO_ALIGN, so the bounce holds it */
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        for (uint64_t o = 0; o < r->nbytes; o += chunk) {
            uint64_t k = r->nbytes - o < chunk ? r->nbytes - o : chunk;
            io_req q = {.f = &s->files[s->emb_file], .off = r->off + o, .len = k, .need = k, .dst = s->emb_bounce}, *d;
            io_submit(s->xring, &q);
            io_reap(s->xring, 1, &d);
            if (q.rc) { io_req_errstr(&q, err, errlen); return STRATA_EIO; }
            XXH3_64bits_update(&h, s->emb_bounce, k);
        }
        got = XXH3_64bits_digest(&h);
    }
    if (got == r->xxh3) return STRATA_OK;
    return base_fail(err, errlen, STRATA_ECORRUPT,
                     "embed: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is corrupt or "
                     "stale; run strata pack --verify",
                     s->files[s->emb_file].path, (unsigned long long)r->off, (unsigned long long)(r->off + r->nbytes),
                     (unsigned long long)r->xxh3, (unsigned long long)got);
}

/* The embeddings at open (place_open): a row is embed_row bytes at a known offset
 * (pack region or the shard); the table is read whole when resident, else rows
 * are read through the bounce buffers; from a pack, checked against its XXH3. */
static int open_embed(stream *s, const cfg *c, const st_index *ix, const place_plan *p, char *err, size_t errlen) {
    int rc = 0;
    char en[96];
    snprintf(en, sizeof en, "%sembed_tokens.weight", arch_of(c)->pfx);
    const st_tensor *t = st_find(ix, en);
    if (!t || t->ndim != 2 || t->shape[0] != c->vocab || t->shape[1] != c->hidden)
        return base_fail(err, errlen, STRATA_EFORMAT, "stream: %s missing or misshapen", en);
    s->emb_dtype = t->dtype;
    s->emb_row = t->nbytes / (uint64_t)c->vocab;
    if (s->pk) { s->emb_file = s->n_files - 1; s->emb_off = s->pk->embed.off + s->pk->embed.t[0].off; }
    else { s->emb_file = t->shard; s->emb_off = t->off; }
    if (p->embed_resident) {
        s->emb = base_alloc_aligned(io_align_up(t->nbytes) + 2 * IO_ALIGN, IO_ALIGN, MEM_WEIGHTS);
        if (!s->emb) return base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the embedding table");
        uint64_t a0 = io_align_down(s->emb_off), a1 = io_align_up(s->emb_off + t->nbytes);
        /* from a pack [a0, a1) is exactly the embed region (aligned, padded): read it all for its checksum */
        const int check = VERIFY(s) && a0 == s->pk->embed.off && a1 - a0 == s->pk->embed.nbytes;
        io_req q = {.f = &s->files[s->emb_file], .off = a0, .len = a1 - a0,
                    .need = check ? a1 - a0 : s->emb_off + t->nbytes - a0, .dst = s->emb};
        io_submit(s->xring, &q);
        io_req *d;
        io_reap(s->xring, 1, &d);
        if (q.rc) { io_req_errstr(&q, err, errlen); return STRATA_EIO; }
        s->st.bytes_embed += q.got;
        if (check && (rc = embed_check(s, s->emb, a1 - a0, 0, err, errlen))) return rc;
        if (a0 != s->emb_off) memmove(s->emb, s->emb + (s->emb_off - a0), t->nbytes);
    } else {
        s->emb_slot = io_align_up(s->emb_row) + 2 * IO_ALIGN;
        s->emb_bounce = base_alloc_aligned(s->emb_slot * EMB_BATCH, IO_ALIGN, MEM_IO);
        if (!s->emb_bounce) return base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory");
        if (VERIFY(s) && (rc = embed_check(s, NULL, 0, io_align_down(s->emb_slot * EMB_BATCH), err, errlen))) return rc;
    }
    return rc;
}

const struct pack *place_pack(const wsrc *w) {
    return w && w->ops == &k_stream_ops ? ((const stream *)w)->pk : NULL;
}

int place_open(wsrc **out, const cfg *c, const st_index *ix, const char *model_dir, const place_plan *p, char *err,
               size_t errlen) {
    *out = NULL;
    stream *s = base_calloc(1, sizeof *s, MEM_INDEX);
    if (!s) return base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory");
    s->base.ops = &k_stream_ops;
    s->base.c = c;
    s->c = c;
    s->ix = ix;
    s->plan = *p;
    s->q_head = s->q_tail = -1;
    s->req_L = -1;
    s->pf_L = -1;
    s->last_get = -1;
    s->head_follows = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->pf_mu, NULL);
    pthread_cond_init(&s->pf_cv, NULL);
    int rc = 0;
    if (p->n_layers != c->n_layers) { rc = base_fail(err, errlen, STRATA_EINVAL, "stream: the plan is for another model"); goto fail; }
    if (p->has_pack && (rc = pack_open(&s->pk, p->pack_dir, model_dir, c, ix, err, errlen))) goto fail;
    s->n_files = st_n_shards(ix) + (s->pk ? 1 : 0);
    s->files = base_calloc((size_t)s->n_files, sizeof *s->files, MEM_IO);
    if (!s->files) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto fail; }
    for (int i = 0; i < s->n_files; i++) s->files[i].fd_direct = s->files[i].fd_buf = -1;
    for (int i = 0; i < s->n_files && !rc; i++)
        rc = io_file_open(&s->files[i], i < st_n_shards(ix) ? st_shard_path(ix, i) : s->pk->trunk_path, err, errlen);
    if (rc) goto fail;
    if ((rc = io_ring_create(&s->xring, IO_DEPTH, 0, p->no_uring, err, errlen))) goto fail;
    s->wf = model_wf(c, ix); /* the records' tensors (trunk units and experts) depend on it */
    /* trunk */
    s->n_units = c->n_layers + 1;
    s->arena_bytes = p->ring_bytes;
    s->u = base_calloc((size_t)s->n_units, sizeof *s->u, MEM_INDEX);
    if (!s->u) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto fail; }
    if ((rc = stream_build_units(s, err, errlen))) goto fail;
    for (int64_t u = 0; u < s->n_units; u++) {
        unit *x = &s->u[u];
        if (!x->pinned || p->absent[u]) continue;
        x->buf = base_alloc_aligned(x->buf_bytes ? x->buf_bytes : IO_ALIGN, IO_ALIGN, MEM_TRUNK);
        if (!x->buf) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate pinned layer %lld", (long long)u); goto fail; }
        /* huge pages, like the arena and the expert cache: the pinned trunk was
         * the one large buffer on 4 KB pages (2.4 GB of ladder's 6.2 GB) */
        io_buffer_advise(x->buf, x->buf_bytes);
        if (p->guess_bytes && p->guess_u[u] && !(x->gq = base_alloc_aligned(p->guess_one_bytes, 64, MEM_TRUNK))) {
            rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate layer %lld's guess router", (long long)u);
            goto fail;
        }
    }
    if (p->sliced) { /* row slice buffers and the forward thread's ring for them */
        s->n_sl = p->n_slices > 0 ? p->n_slices : 1;
        s->sl = base_calloc((size_t)s->n_sl, sizeof *s->sl, MEM_TRUNK);
        if (!s->sl) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the row slices"); goto fail; }
        for (int i = 0; i < s->n_sl; i++) {
            s->sl[i].buf = base_alloc_aligned(p->slice_bytes + 2 * IO_ALIGN, IO_ALIGN, MEM_TRUNK);
            if (!s->sl[i].buf) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the row slices"); goto fail; }
            io_buffer_advise(s->sl[i].buf, p->slice_bytes + 2 * IO_ALIGN);
        }
        if ((rc = io_ring_create(&s->sring, IO_DEPTH, 0, p->no_uring, err, errlen))) goto fail;
    }
    if (s->arena_bytes) {
        s->arena = base_alloc_aligned(s->arena_bytes, 1u << 20, MEM_TRUNK);
        if (!s->arena) { rc = base_fail(err, errlen, STRATA_EBUDGET, "stream: cannot allocate the %llu-byte arena", (unsigned long long)s->arena_bytes); goto fail; }
        io_buffer_advise(s->arena, s->arena_bytes);
    }
    /* experts */
    s->NE = c->n_experts;
    s->n_moe = p->n_moe > 0 ? c->n_layers - c->first_dense : 0; /* cache keys span every MoE layer */
    s->xslot_bytes = p->expert_slot_bytes;
    if (s->n_moe > 0) {
        if ((rc = cache_create(&s->xc, s->n_moe * s->NE, p->n_expert_slots, p->expert_slot_bytes, p->cache_policy, s->n_moe, 1,
                               err, errlen)))
            goto fail;
        s->xs = base_calloc((size_t)p->n_expert_slots, sizeof *s->xs, MEM_CACHE);
        s->req_slot = base_alloc((size_t)s->NE * sizeof *s->req_slot, MEM_CACHE);
        s->req_list = base_alloc((size_t)s->NE * sizeof *s->req_list, MEM_CACHE);
        s->pf_mark = base_calloc((size_t)s->NE, 1, MEM_CACHE);
        if (!s->xs || !s->req_slot || !s->req_list || !s->pf_mark) { rc = base_fail(err, errlen, STRATA_ENOMEM, "stream: out of memory"); goto fail; }
        for (int64_t i = 0; i < s->NE; i++) s->req_slot[i] = -1;
        s->x_low = cache_n_slots(s->xc);
        s->pf_want = s->pf_asked = PF_AHEAD;
        if (pthread_create(&s->pf_th, NULL, stream_prefault_main, s) == 0) s->pf_started = 1;
    }
    /* embeddings: a row is embed_row bytes at a known offset (pack region or the shard) */
    if (!p->no_head && (rc = open_embed(s, c, ix, p, err, errlen))) goto fail;
    /* reader thread: read-ahead of the trunk (needs an arena or pinned units) */
    if (p->trace_path[0] && !(s->trace = fopen(p->trace_path, "wb"))) {
        rc = base_fail(err, errlen, STRATA_EIO, "stream: cannot write the trace %s", p->trace_path);
        goto fail;
    }
    if ((rc = io_ring_create(&s->rring, IO_DEPTH, 0, p->no_uring, err, errlen))) goto fail;
    if (!p->no_preload) stream_preload(s);
    if (!p->no_readahead && pthread_create(&s->th, NULL, stream_reader_main, s) == 0) s->th_started = 1;
    *out = &s->base;
    return STRATA_OK;
fail:
    ws_close(&s->base);
    return rc;
}

/* ==================================================================== stats */

void place_stats_get(wsrc *w, place_stats *o) {
    memset(o, 0, sizeof *o);
    o->peak_rss = base_peak_rss();
    if (!w || w->ops != &k_stream_ops) return;
    stream *s = (stream *)w;
    pthread_mutex_lock(&s->mu);
    *o = s->st;
    if (s->io_active) o->read_s += base_now() - s->io_t0;
    pthread_mutex_unlock(&s->mu);
    if (s->xc) {
        cache_stats cs;
        cache_get_stats(s->xc, &cs);
        o->expert_requests = cs.requests;
        o->expert_hits = cs.hits;
        o->expert_misses = cs.misses;
        o->expert_evictions = cs.evictions;
        o->hit_rate = cs.requests ? (double)cs.hits / (double)cs.requests : 0;
    }
    o->verify_bytes = atomic_load_explicit(&s->verify_bytes, memory_order_relaxed);
    o->verify_s = (double)atomic_load_explicit(&s->verify_ns, memory_order_relaxed) * 1e-9;
    for (int64_t u = 0; u < s->n_units; u++) /* the blocks the compute threads checked */
        for (int k = 0; k < s->u[u].n_wb; k++) {
            o->verify_blk_bytes += atomic_load_explicit(&s->u[u].wb[k].bytes, memory_order_relaxed);
            o->verify_blk_s += (double)atomic_load_explicit(&s->u[u].wb[k].ns, memory_order_relaxed) * 1e-9;
        }
    o->verify_bytes += o->verify_blk_bytes;
    o->verify_s += o->verify_blk_s;
    o->bytes_read = o->bytes_trunk + o->bytes_head + o->bytes_embed + o->bytes_experts;
    o->read_bw = o->read_s > 0 ? (double)o->bytes_read / o->read_s : 0;
    o->peak_rss = base_peak_rss();
}

void place_stats_reset(wsrc *w) {
    if (!w || w->ops != &k_stream_ops) return;
    stream *s = (stream *)w;
    pthread_mutex_lock(&s->mu);
    const place_stats keep = s->st; /* the warm start is a fact of the open */
    memset(&s->st, 0, sizeof s->st);
    atomic_store(&s->verify_bytes, 0);
    atomic_store(&s->verify_ns, 0);
    for (int64_t u = 0; u < s->n_units; u++)
        for (int k = 0; k < s->u[u].n_wb; k++) {
            atomic_store(&s->u[u].wb[k].bytes, 0);
            atomic_store(&s->u[u].wb[k].ns, 0);
        }
    s->st.preload_bytes = keep.preload_bytes;
    s->st.preload_s = keep.preload_s;
    s->st.preload_experts = keep.preload_experts;
    s->st.guess_copies = keep.guess_copies;
    if (s->io_active) s->io_t0 = base_now();
    pthread_mutex_unlock(&s->mu);
    if (s->xc) cache_reset_stats(s->xc);
}

void place_stats_print(const place_stats *s, const place_plan *p, FILE *f) {
    uint64_t bytes = s->bytes_trunk + s->bytes_head + s->bytes_embed + s->bytes_experts;
    fprintf(f, "io: read %.3f GB (trunk %.3f, head %.3f, embeddings %.4f, experts %.3f) in %llu reads, %.2f GB/s while reading\n",
            (double)bytes / 1e9, (double)s->bytes_trunk / 1e9, (double)s->bytes_head / 1e9, (double)s->bytes_embed / 1e9,
            (double)s->bytes_experts / 1e9, (unsigned long long)s->n_reads, s->read_bw / 1e9);
    fprintf(f, "io: %.2f s with reads in flight, %.2f s waited on I/O; layer gets %llu (%llu pinned)\n", s->read_s, s->wait_s,
            (unsigned long long)s->layer_gets, (unsigned long long)s->layer_gets_pinned);
    if (s->verify_bytes)
        fprintf(f, "verify: %.3f GB checked against the pack's XXH3 in %.3f s of hashing (%.1f GB/s)\n",
                (double)s->verify_bytes / 1e9, s->verify_s, s->verify_s > 0 ? (double)s->verify_bytes / 1e9 / s->verify_s : 0);
    if (s->verify_blk_bytes)
        fprintf(f, "verify: of which %.3f GB matrix blocks hashed by the compute threads after their products, in %.3f s (%.1f GB/s)\n",
                (double)s->verify_blk_bytes / 1e9, s->verify_blk_s, s->verify_blk_s > 0 ? (double)s->verify_blk_bytes / 1e9 / s->verify_blk_s : 0);
    fprintf(f, "experts: %llu requests, %llu true resident hits (%.1f%%), %llu misses, %llu evictions\n",
            (unsigned long long)s->expert_requests, (unsigned long long)s->expert_hits, 100 * s->hit_rate,
            (unsigned long long)s->expert_misses, (unsigned long long)s->expert_evictions);
    if (s->pred_layers)
        fprintf(f, "prefetch: %llu layers predicted a layer ahead: %.1f%% of their %llu requested experts predicted, "
                   "%.1f%% of %llu predictions requested; %llu read ahead, %llu of them requested (%.1f%%)\n",
                (unsigned long long)s->pred_layers, s->pred_requests ? 100.0 * (double)s->pred_hits / (double)s->pred_requests : 0,
                (unsigned long long)s->pred_requests, s->pred_ids ? 100.0 * (double)s->pred_hits / (double)s->pred_ids : 0,
                (unsigned long long)s->pred_ids, (unsigned long long)s->prefetch_reads, (unsigned long long)s->prefetch_used,
                s->prefetch_reads ? 100.0 * (double)s->prefetch_used / (double)s->prefetch_reads : 0);
    if (s->guess_copies)
        fprintf(f, "prefetch: MXFP4 copies of %lld routers, lent to %llu guesses\n", (long long)s->guess_copies,
                (unsigned long long)s->guess_lends);
    if (s->pred_skipped)
        fprintf(f, "prefetch: %llu guesses skipped (their layer all in RAM, or its last guesses found everything there)\n",
                (unsigned long long)s->pred_skipped);
    if (s->preload_bytes)
        fprintf(f, "preload: %.3f GB read at open in %.2f s (%.2f GB/s): the pinned trunk and %lld experts\n",
                (double)s->preload_bytes / 1e9, s->preload_s, s->preload_s > 0 ? (double)s->preload_bytes / 1e9 / s->preload_s : 0,
                (long long)s->preload_experts);
    if (p && p->budget_bytes)
        fprintf(f, "memory: peak RSS %.3f GB, budget %.3f GB (planned %.3f GB)\n", (double)s->peak_rss / 1e9,
                (double)p->budget_bytes / 1e9, (double)p->total_bytes / 1e9);
    else
        fprintf(f, "memory: peak RSS %.3f GB (no budget)\n", (double)s->peak_rss / 1e9);
}
