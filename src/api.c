/*
 * api.c: the public API (include/strata.h): model open -> plan -> weights ->
 * engine, sequences, steps over rows of several sequences, generators.
 *
 * Owns: the strata_model (config, index, layout, plan, weight source, engine,
 * tokenizer, end ids, the step's row and logits buffers: api_int.h) and the
 * generators. What a model reports (info, stats, the plan and run reports) is
 * api_report.c's.
 * Does not own the math (infer.c), placement (plan.c, wsrc_*.c) or text (tok.c):
 * it wires them in the one order every front-end used to repeat. Everything a
 * model holds is in its struct: two models in one process share nothing.
 *
 * Generation step: decode rows first (one per generator with a sampled token to
 * evaluate), then prompt rows up to the model's rows per pass, so a running
 * stream never waits behind more than one pass of someone's prompt. A row's
 * logits are wanted only where a token is sampled (a decode row, a prompt's last
 * row): at most min(rows, max_seqs) logits rows per pass, sized at load.
 */
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include <xxhash.h>
#include "api_int.h"
#include "arch.h"
#include "cfg.h"
#include "cluster.h"
#include "ident.h"
#include "infer.h"
#include "jgram.h"
#include "jsonx.h"
#include "kern.h"
#include "model.h"
#include "place.h"
#include "pool.h"
#include "prefix.h"
#include "sample.h"
#include "st.h"
#include "strata.h"
#include "tok.h"
#include "vfs.h"

strata_model_opts strata_model_opts_default(void) {
    return (strata_model_opts){.ram_bytes = 0, .pack_dir = NULL, .ctx = 0, .max_seqs = 1, .rows = INFER_DEFAULT_CHUNK};
}

strata_gen_opts strata_gen_opts_default(void) {
    return (strata_gen_opts){.temp = 0, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1, .repeat_last_n = 64,
                             .seed = 0, .max_tokens = 32, .stop_at_end = 1, .prefix = 1};
}

void strata_free(void *p) { base_free(p); }

/* ================================================================== models */

int strata_model_open(strata_model **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    char path[4200];
    strata_model *m = base_calloc(1, sizeof *m, MEM_MISC);
    if (!m) return base_fail(err, errlen, STRATA_ENOMEM, "out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    m->kname = kern_init(NULL);
    int rc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = cfg_load(&m->c, path, err, errlen))) goto fail;
    if ((rc = st_open(&m->ix, dir, err, errlen))) goto fail;
    sbuf pb = {0};
    if ((rc = model_bind_check(&m->c, m->ix, &m->lay, &pb))) {
        if (rc == STRATA_ENOMEM) base_fail(err, errlen, rc, "%s: out of memory checking the tensors against the config", dir);
        else base_fail(err, errlen, rc, "%s: the model does not match its config (%d problems):\n%s", dir, pb.n, pb.s ? pb.s : "");
        sbuf_free(&pb);
        goto fail;
    }
    sbuf_free(&pb);
    m->c.wf = m->lay.wf; /* the headers decide the formats: plan and census count bytes as stored */
    m->n_stop = sample_stop_ids(dir, &m->c, m->stop, API_MAX_STOP, err, errlen);
    if (m->n_stop < 0) { rc = m->n_stop; goto fail; }
    snprintf(path, sizeof path, "%s/tiktoken.model", dir);
    char js[4200];
    snprintf(js, sizeof js, "%s/tokenizer.json", dir);
    if (base_is_file(path) || base_is_file(js)) {
        /* A tokenizer that cannot be read now (I/O error, out of memory) fails the
         * open: tolerating it would turn a text run into an ids run. So does a
         * malformed tokenizer_config.json, as it already does when its JSON does
         * not parse (sample_stop_ids above): it names the specials and end ids,
         * and an ids-only model would blame tiktoken.model (issue 38). A
         * malformed tiktoken.model leaves an ids-only model, as one without a
         * tokenizer, its reason kept for text requests. */
        int cfg_bad = 0;
        rc = tok_open_dir(&m->tk, dir, &cfg_bad, m->tok_err, sizeof m->tok_err); /* tiktoken.model wins */
        if (rc == STRATA_EIO || rc == STRATA_ENOMEM || (rc && cfg_bad)) {
            base_fail(err, errlen, rc, "%s", m->tok_err);
            goto fail;
        }
        if (rc) m->tk = NULL;
    } else {
        snprintf(m->tok_err, sizeof m->tok_err, "%s has no tokenizer (tiktoken.model or tokenizer.json)", dir);
    }
    *out = m;
    return 0;
fail:
    strata_model_close(m);
    return rc;
}

/* Hashing the shards for the identity (ident.h), as one byte count over its
 * phases (the trunk, then the experts) for the caller's hash_progress. */
typedef struct hash_ui {
    const strata_model_opts *o;
    uint64_t base, last_total, total;
    char phase[16];
} hash_ui;
static void hash_progress(void *ud, const char *phase, uint64_t done, uint64_t total, double secs) {
    (void)secs;
    hash_ui *u = ud;
    if (strcmp(phase, u->phase)) {
        if (u->phase[0]) u->base += u->last_total;
        snprintf(u->phase, sizeof u->phase, "%s", phase);
    }
    u->last_total = total;
    uint64_t d = u->base + done;
    u->o->hash_progress(u->o->progress_ud, d < u->total ? d : u->total, u->total);
}

/* What state files, prefix-cache files and a cluster's ranks are tied to: the
 * config, the tensor table and every weight byte (ident.h): from the pack's
 * record hashes where the weights come from a pack, else hashed from the shards
 * once and cached by their size, mtime and inode. */
static int model_identity(strata_model *m, uint64_t *id, char *err, size_t errlen) {
    hash_ui u = {.o = &m->o};
    for (int s = 0; s < st_n_shards(m->ix); s++) u.total += st_shard_size(m->ix, s);
    ident_opts io = {m->o.hash_progress ? hash_progress : NULL, &u, 0};
    ident_result r;
    int rc = ident_model(m->dir, &m->c, m->ix, place_pack(m->w), &io, &r, err, errlen);
    if (rc) return rc;
    if (m->o.hash_progress && r.source == IDENT_HASHED) m->o.hash_progress(m->o.progress_ud, u.total, u.total);
    m->id_source = r.source;
    *id = r.id;
    return STRATA_OK;
}

/* The memory plan of m for o with the API's extra bytes and the prefix cache's. */
static int api_plan(strata_model *m, const strata_model_opts *o, uint64_t extra, uint64_t prefix_bytes, char *err, size_t errlen) {
    place_opts po = place_opts_default();
    po.ram_bytes = o->ram_bytes;
    po.pack_dir = o->pack_dir;
    po.ctx = m->ctx;
    po.prefill_chunk = m->rows;
    po.n_threads = m->threads;
    po.n_seqs = m->max_seqs;
    po.extra_bytes = extra;
    po.prefix_bytes = prefix_bytes;
    po.session_bytes = infer_session_bytes;
    po.engine_bytes = infer_engine_bytes;
    if (o->no_verify) po.verify_reads = PLACE_VERIFY_OFF;
    po.no_prefetch = o->no_prefetch;
    po.no_preload = o->no_preload;
    po.progress = o->progress;
    po.progress_ud = o->progress_ud;
    if (m->stage.lo > 0 || m->stage.hi < m->c.n_layers || !m->stage.head) {
        /* a pipeline stage: its layers, their experts and sequence state only */
        po.layer_lo = m->stage.lo;
        po.layer_hi = m->stage.hi;
        po.no_head = !m->stage.head;
        po.seq_bytes = infer_session_bytes_range(&m->c, m->ctx, m->stage.lo, m->stage.hi);
    }
    return place_plan_compute(&m->c, &m->lay, m->dir, &po, &m->plan, err, errlen);
}

/* strata_model_opts.mtp: the MTP layer becomes the model's last layer (cfg
 * mtp), its tensors checked as the others (a missing one is named). */
static int api_bind_mtp(strata_model *m, char *err, size_t errlen) {
    if (m->c.mtp) return 0;
    if (m->c.n_mtp < 1 || !m->c.no_kda)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: --draft mtp: the model has no multi-token-prediction layer "
                         "(num_nextn_predict_layers is 0 or absent)", m->dir);
    if (m->o.cluster) return base_fail(err, errlen, STRATA_EINVAL, "%s: --draft mtp: not with a cluster", m->dir);
    cfg c = m->c;
    if (cfg_bind_mtp(&c)) return base_fail(err, errlen, STRATA_EINVAL, "%s: --draft mtp: too many layers", m->dir);
    sbuf pb = {0};
    int rc = model_bind_check(&c, m->ix, &m->lay, &pb);
    if (rc) {
        if (rc == STRATA_ENOMEM) base_fail(err, errlen, rc, "%s: out of memory checking the MTP layer", m->dir);
        else base_fail(err, errlen, rc, "%s: --draft mtp: the MTP layer (layer %lld) does not match the config (%d problems):\n%s",
                       m->dir, (long long)m->c.n_layers, pb.n, pb.s ? pb.s : "");
        sbuf_free(&pb);
        /* the layout as it was (the checkpoint without its MTP layer binds) */
        sbuf p2 = {0};
        model_bind_check(&m->c, m->ix, &m->lay, &p2);
        sbuf_free(&p2);
        return rc;
    }
    sbuf_free(&pb);
    m->c = c;
    return 0;
}

int strata_model_load(strata_model *m, const strata_model_opts *o, char *err, size_t errlen) {
    strata_model_opts d = strata_model_opts_default();
    if (!o) o = &d;
    if (m->loaded) return base_fail(err, errlen, STRATA_EINVAL, "%s: already loaded", m->dir);
    m->o = *o;
    if (o->router < STRATA_ROUTER_DEFAULT || o->router > STRATA_ROUTER_HF)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: unknown router convention %d", m->dir, o->router);
    /* The biased routed weights are what Kimi Linear's released modeling code
     * computes (family-formats.md C3); no DeepSeek-V3 code does that. */
    if (o->router == STRATA_ROUTER_HF && m->c.no_kda)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: --router hf is Kimi Linear's released router code; the %s "
                         "architecture has none like it (its weights are the unbiased sigmoid)", m->dir, arch_of(&m->c)->name);
    m->c.router_hf = o->router == STRATA_ROUTER_HF; /* before the identity and the engine */
    m->ctx = o->ctx > 0 ? o->ctx : (m->c.max_ctx < API_DEFAULT_CTX ? m->c.max_ctx : API_DEFAULT_CTX);
    m->rows = o->rows > 0 ? o->rows : INFER_DEFAULT_CHUNK;
    m->threads = o->n_threads > 0 ? o->n_threads : pool_default_threads();
    m->max_seqs = o->max_seqs > 0 ? o->max_seqs : 1;
    if (m->ctx < 1 || m->ctx > ((int64_t)1 << 32) || m->rows > (1 << 20) || m->max_seqs > (1 << 16))
        return base_fail(err, errlen, STRATA_EINVAL, "%s: options out of range", m->dir);
    m->spec = o->spec > 0 ? (o->spec < 63 ? o->spec : 63) : 0;
    m->max_out = m->max_seqs * (int64_t)(m->spec + 1);
    if (m->max_out > m->rows) m->max_out = m->rows;
    int rc;
    if (o->mtp && (rc = api_bind_mtp(m, err, errlen))) return rc;
    m->stage = (cluster_stage){0, m->c.n_layers, 1};
    if (o->cluster) {
        m->cl = o->cluster;
        if ((rc = m->cl->stage(m->cl, m, o, &m->stage, err, errlen))) return rc;
    }
    const int partial = m->stage.lo > 0 || m->stage.hi < m->c.n_layers || !m->stage.head;
    /* the API's own step buffers and each generator's sampler, counted in the plan */
    const uint64_t extra = (uint64_t)m->max_out * (uint64_t)m->c.vocab * sizeof(float) +
                           (uint64_t)m->rows * (sizeof(strata_row) + sizeof(strata_gen *) + sizeof(infer_row)) +
                           (uint64_t)m->max_seqs * ((uint64_t)m->c.vocab * 16 + 4096 +
                                                    infer_session_spec_bytes(&m->c, m->spec ? m->spec + 1 : 0));
    m->placed = o->ram_bytes || o->pack_dir || o->plan_only || o->place || partial;
    /* Without a budget the weights still come from the model's pack when it has
     * one, all resident and checked against its checksums as they land, so a
     * flipped byte or a stale pack is refused at every budget alike (the same
     * bytes either way: a verified pack holds the shards' bytes). A pack that
     * cannot be used is said (weights unverified), never silent. */
    m->unverified[0] = 0;
    if (!m->placed) {
        char pd[1024];
        if (pack_find_ex(m->dir, pd, sizeof pd, m->unverified, sizeof m->unverified) == 1) m->placed = 1;
    }
    /* the prefix cache's RAM; auto: two sequences' state, at most a quarter of
     * what the budget leaves above its minimum without it; none at a budget with
     * a directory: RAM for snapshots comes out of trunk pins, read every pass
     * (ladder at 1 GB: 87 MB cost 2 of 10 pins), a snapshot file costs one read
     * per hit */
    prefix_opts pxo = {o->prefix_ram, o->prefix_dir, o->prefix_dir_bytes, 0};
    m->px_every = o->prefix_every > 0 ? o->prefix_every : API_PREFIX_EVERY;
    if (pxo.ram_bytes == STRATA_PREFIX_AUTO) {
        pxo.ram_bytes = 2 * infer_session_bytes(&m->c, m->ctx);
        if (m->placed && o->ram_bytes && pxo.dir) {
            pxo.ram_bytes = 0;
        } else if (m->placed && o->ram_bytes) {
            prefix_opts p0 = pxo;
            p0.ram_bytes = 0;
            if ((rc = api_plan(m, o, extra, prefix_alloc_bytes(&p0), err, errlen))) return rc;
            const uint64_t q = (o->ram_bytes - m->plan.min_bytes) / 4;
            if (q < pxo.ram_bytes) pxo.ram_bytes = q;
        }
        if (pxo.ram_bytes < infer_session_bytes(&m->c, m->ctx < 256 ? m->ctx : 256)) pxo.ram_bytes = 0;
    }
    if (m->placed) {
        if ((rc = api_plan(m, o, extra, prefix_alloc_bytes(&pxo), err, errlen))) return rc;
        snprintf(m->unverified, sizeof m->unverified, "%s", m->plan.unverified);
        if (o->plan_only) return 0;
    }
    double t = base_now();
    rc = m->placed ? place_open(&m->w, &m->c, m->ix, m->dir, &m->plan, err, errlen)
                   : wsrc_resident_open(&m->w, &m->c, m->ix, err, errlen);
    if (rc) return rc;
    m->t_load = base_now() - t;
    engine_opts eo = {m->threads, m->rows, m->spec ? m->spec + 1 : 0, m->stage.lo, m->stage.hi};
    if ((rc = engine_create(&m->e, &m->c, m->w, &eo, err, errlen))) return rc;
    uint64_t id = 0;
    if ((rc = model_identity(m, &id, err, errlen))) return rc;
    engine_set_model_id(m->e, id);
    if (pxo.ram_bytes || pxo.dir) {
        pxo.model_id = id;
        if ((rc = prefix_open(&m->px, m->e, &pxo, err, errlen))) return rc;
    }
    m->model_id = id;
    if (m->cl && (rc = m->cl->attach(m->cl, m, m->e, id, err, errlen))) return rc;
    m->grows = base_alloc((size_t)m->rows * sizeof *m->grows, MEM_SCRATCH);
    m->gown = base_alloc((size_t)m->rows * sizeof *m->gown, MEM_SCRATCH);
    m->irows = base_alloc((size_t)m->rows * sizeof *m->irows, MEM_SCRATCH);
    m->gdec = base_alloc((size_t)m->rows * sizeof *m->gdec, MEM_SCRATCH);
    m->gself = base_alloc((size_t)m->rows * sizeof *m->gself, MEM_SCRATCH);
    m->gmtp = base_alloc((size_t)m->rows * sizeof *m->gmtp, MEM_SCRATCH);
    m->glogits = base_alloc((size_t)m->max_out * (size_t)m->c.vocab * sizeof(float), MEM_SCRATCH);
    if (!m->grows || !m->gown || !m->irows || !m->gdec || !m->gself || !m->gmtp || !m->glogits)
        return base_fail(err, errlen, STRATA_ENOMEM, "%s: cannot allocate the step buffers", m->dir);
    m->loaded = 1;
    return 0;
}

void strata_model_close(strata_model *m) {
    if (!m) return;
    if (m->cl) m->cl->detach(m->cl, m);
    base_free(m->grows);
    base_free(m->gown);
    base_free(m->irows);
    base_free(m->gdec);
    base_free(m->gself);
    base_free(m->gmtp);
    base_free(m->glogits);
    prefix_close(m->px);
    engine_free(m->e);
    if (m->w) m->w->ops->close(m->w);
    jgram_vocab_free(m->jv);
    tok_close(m->tk);
    st_close(m->ix);
    base_free(m);
}

engine *api_model_engine(strata_model *m) { return m->e; }
const cfg *api_model_cfg(const strata_model *m) { return &m->c; }
const model_layout *api_model_layout(const strata_model *m) { return &m->lay; }
const char *api_model_dir(const strata_model *m) { return m->dir; }
uint64_t api_model_id(const strata_model *m) { return m->model_id; }

/* =============================================================== sequences */

int strata_seq_create(strata_model *m, strata_seq **out, char *err, size_t errlen) {
    *out = NULL;
    if (!m->loaded) return base_fail(err, errlen, STRATA_EINVAL, "%s: the model is not loaded", m->dir);
    if (m->n_live >= m->max_seqs)
        return base_fail(err, errlen, STRATA_EBUSY, "%s: %d sequences exist, the model was loaded for %d", m->dir, m->n_live,
                         m->max_seqs);
    strata_seq *s = base_calloc(1, sizeof *s, MEM_STATE);
    if (!s) return base_fail(err, errlen, STRATA_ENOMEM, "out of memory");
    int rc = session_create(&s->s, m->e, m->ctx, err, errlen);
    if (rc) { base_free(s); return rc; }
    s->m = m;
    m->n_live++;
    *out = s;
    return 0;
}

void strata_seq_free(strata_seq *s) {
    if (!s) return;
    session_free(s->s);
    s->m->n_live--;
    base_free(s);
}

void strata_seq_reset(strata_seq *s) { session_reset(s->s); }
int64_t strata_seq_pos(const strata_seq *s) { return session_pos(s->s); }
const int32_t *strata_seq_tokens(const strata_seq *s) { return session_tokens(s->s); }
const char *strata_seq_errmsg(const strata_seq *s) { return session_errmsg(s->s); }
int strata_seq_save(strata_seq *s, const char *path, char *err, size_t errlen) { return session_save(s->s, path, err, errlen); }
int strata_seq_load(strata_seq *s, const char *path, char *err, size_t errlen) { return session_load(s->s, path, err, errlen); }

int strata_seq_copy(strata_seq *dst, strata_seq *src, char *err, size_t errlen) {
    strata_model *m = src->m;
    if (dst->m != m) return base_fail(err, errlen, STRATA_EINVAL, "seq_copy: the sequences belong to different models");
    if (dst == src) return 0;
    if (m->cl) return base_fail(err, errlen, STRATA_EINVAL, "seq_copy: a cluster's sequences live on its ranks; not copied");
    if (session_broken(src->s)) return base_fail(err, errlen, STRATA_EINVAL, "seq_copy: the source sequence failed earlier");
    /* the regions a prefix snapshot copies (session_parts) are the whole state */
    const int maxp = (int)m->c.n_layers + 2;
    session_part *a = base_alloc(2 * (size_t)maxp * sizeof *a, MEM_SCRATCH), *b = a ? a + maxp : NULL;
    if (!a) return base_fail(err, errlen, STRATA_ENOMEM, "seq_copy: out of memory");
    const int64_t pos = session_pos(src->s);
    session_reset(dst->s);
    const int na = session_parts(src->s, pos, a, maxp), nb = session_parts(dst->s, pos, b, maxp);
    int rc = na < 0 || na != nb ? base_fail(err, errlen, STRATA_EINVAL, "seq_copy: position %lld does not fit the target", (long long)pos) : 0;
    for (int i = 0; !rc && i < na; i++) {
        if (a[i].n != b[i].n) rc = base_fail(err, errlen, STRATA_EINVAL, "seq_copy: the sequences' layouts differ");
        else memcpy(b[i].p, a[i].p, a[i].n);
    }
    base_free(a);
    if (rc) return rc;
    session_restored(dst->s, pos);
    return 0;
}

int strata_seq_prefix_store(strata_seq *s, char *err, size_t errlen) {
    strata_model *m = s->m;
    if (!m->px) return base_fail(err, errlen, STRATA_EINVAL, "%s: the model was loaded without a prefix cache", m->dir);
    if (session_broken(s->s)) return base_fail(err, errlen, STRATA_EINVAL, "the sequence failed earlier; nothing to store");
    int rc = prefix_store(m->px, s->s);
    return rc ? base_fail(err, errlen, rc, "%s", prefix_errmsg(m->px)) : 0;
}

int64_t strata_seq_prefix_restore(strata_seq *s, const int32_t *ids, int64_t n, char *err, size_t errlen) {
    strata_model *m = s->m;
    if (!m->px) return base_fail(err, errlen, STRATA_EINVAL, "%s: the model was loaded without a prefix cache", m->dir);
    if (n < 0 || (n && !ids)) return base_fail(err, errlen, STRATA_EINVAL, "bad ids");
    session_reset(s->s);
    return prefix_restore(m->px, s->s, ids, n);
}

/* =================================================================== steps */

int strata_step(strata_model *m, const strata_row *rows, int64_t n, float *logits, char *err, size_t errlen) {
    if (!m->loaded) return base_fail(err, errlen, STRATA_EINVAL, "%s: the model is not loaded", m->dir);
    if (n < 1) return base_fail(err, errlen, STRATA_EINVAL, "step: no rows");
    /* a sequence given in two runs would be split across engine calls unseen */
    for (int64_t i = 0; i < n; i++) {
        if (!rows[i].seq || rows[i].seq->m != m) return base_fail(err, errlen, STRATA_EINVAL, "step: row %lld: no sequence of this model", (long long)i);
        if (i && rows[i].seq != rows[i - 1].seq)
            for (int64_t k = 0; k < i - 1; k++)
                if (rows[k].seq == rows[i].seq)
                    return base_fail(err, errlen, STRATA_EINVAL, "step: row %lld: a sequence's rows must be consecutive", (long long)i);
    }
    const int64_t V = m->c.vocab;
    for (int64_t i0 = 0; i0 < n; i0 += m->rows) {
        const int64_t k = n - i0 < m->rows ? n - i0 : m->rows;
        int64_t n_out = 0;
        for (int64_t i = 0; i < k; i++) {
            m->irows[i] = (infer_row){rows[i0 + i].seq->s, rows[i0 + i].token, rows[i0 + i].logits != 0};
            n_out += rows[i0 + i].logits != 0;
        }
        int rc = engine_step(m->e, m->irows, k, logits);
        if (rc) {
            /* rows of earlier passes advanced: the whole step's sequences are broken */
            for (int64_t i = 0; i < i0; i++) session_mark_broken(rows[i].seq->s, engine_errmsg(m->e));
            return base_fail(err, errlen, rc, "%s", engine_errmsg(m->e));
        }
        if (logits) logits += n_out * V;
    }
    return 0;
}

/* ============================================================== generators */

/* Special tokens take part as their own pseudo-bytes: only literals of a
 * composed grammar (a forced tool call's markers) accept them. */
static const uint8_t *text_bytes(void *ud, int32_t id, size_t *len) {
    const tok *t = ud;
    if (tok_is_special(t, id)) return tok_token_bytes(t, id, len) ? jgram_special_mark : NULL;
    return tok_token_bytes(t, id, len);
}

/* g's matcher of o->grammar, over the model's vocabulary trie (built once), with
 * g's end ids as the ids that end a document. */
static int gen_grammar(strata_model *m, strata_gen *g, const strata_gen_opts *o, char *err, size_t errlen) {
    if (!m->tk) return base_fail(err, errlen, STRATA_EINVAL, "a grammar needs the model's tokenizer: %s", m->tok_err);
    int rc;
    if (!m->jv && (rc = jgram_vocab_build(&m->jv, (int32_t)m->c.vocab, text_bytes, m->tk, err, errlen))) return rc;
    int32_t end[16];
    int n_end = 0;
    for (int i = 0; o->stop_at_end && i < m->n_stop && n_end < 16; i++) end[n_end++] = m->stop[i];
    for (int i = 0; i < g->n_stop_ids && n_end < 16; i++) end[n_end++] = g->stop_ids[i];
    if (!n_end) return base_fail(err, errlen, STRATA_EINVAL, "a grammar needs an end id (stop_at_end or stop_ids) to end the document");
    return jgram_matcher_create(&g->jm, o->grammar, m->jv, end, n_end, err, errlen);
}

int strata_gen_create(strata_gen **out, strata_seq *seq, const int32_t *prompt, int64_t n_prompt, const strata_gen_opts *o,
                      int continue_seq, char *err, size_t errlen) {
    *out = NULL;
    strata_model *m = seq->m;
    strata_gen_opts d = strata_gen_opts_default();
    if (!o) o = &d;
    if (n_prompt < 1) return base_fail(err, errlen, STRATA_EINVAL, "empty prompt");
    if (o->max_tokens < 1) return base_fail(err, errlen, STRATA_EINVAL, "max_tokens must be >= 1");
    if (o->want_text && !m->tk) return base_fail(err, errlen, STRATA_EINVAL, "%s", m->tok_err);
    if (o->spec < 0 || o->spec > m->spec)
        return base_fail(err, errlen, STRATA_EINVAL, "spec %d: the model was loaded for at most %d drafted tokens", o->spec, m->spec);
    if (o->n_draft_ids < 0 || (o->n_draft_ids && !o->draft_ids)) return base_fail(err, errlen, STRATA_EINVAL, "bad draft ids");
    if (o->mtp_draft && !m->c.mtp)
        return base_fail(err, errlen, STRATA_EINVAL, "MTP drafts: the model was loaded without its MTP layer (strata_model_opts.mtp)");
    if (o->mtp_draft && (o->self_draft || o->n_draft_ids))
        return base_fail(err, errlen, STRATA_EINVAL, "MTP drafts exclude self drafts and draft ids");
    if (o->n_stop_ids < 0 || o->n_stop_ids > 16 || (o->n_stop_ids && !o->stop_ids))
        return base_fail(err, errlen, STRATA_EINVAL, "stop ids: at most 16");
    if (o->top_logprobs < 0 || o->top_logprobs > STRATA_MAX_TOP_LOGPROBS)
        return base_fail(err, errlen, STRATA_EINVAL, "top_logprobs must be in [0, %d]", STRATA_MAX_TOP_LOGPROBS);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= m->c.vocab)
            return base_fail(err, errlen, STRATA_EINVAL, "prompt id %d at %lld outside the vocabulary [0, %lld)", prompt[i],
                             (long long)i, (long long)m->c.vocab);
    const int64_t start = continue_seq ? strata_seq_pos(seq) : 0;
    if (n_prompt > m->ctx - start)
        return base_fail(err, errlen, STRATA_EINVAL, "the prompt has %lld tokens, more than the %lld positions left in the context of %lld",
                         (long long)n_prompt, (long long)(m->ctx - start), (long long)m->ctx);
    strata_gen *g = base_calloc(1, sizeof *g, MEM_STATE);
    if (!g) return base_fail(err, errlen, STRATA_ENOMEM, "out of memory");
    g->seq = seq;
    g->o = *o;
    g->n_prompt = n_prompt;
    g->lhash = BASE_FNV_INIT;
    g->prompt = base_alloc((size_t)n_prompt * sizeof(int32_t), MEM_STATE);
    g->out = base_alloc((size_t)o->max_tokens * sizeof(int32_t), MEM_STATE);
    int rc = 0;
    if (!g->prompt || !g->out) { rc = base_fail(err, errlen, STRATA_ENOMEM, "out of memory"); goto fail; }
    memcpy(g->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (o->n_draft_ids) {
        g->draft_ids = base_alloc((size_t)o->n_draft_ids * sizeof(int32_t), MEM_STATE);
        if (!g->draft_ids) { rc = base_fail(err, errlen, STRATA_ENOMEM, "out of memory"); goto fail; }
        memcpy(g->draft_ids, o->draft_ids, (size_t)o->n_draft_ids * sizeof(int32_t));
    }
    g->o.draft_ids = NULL;
    g->n_stop_ids = o->n_stop_ids;
    if (o->n_stop_ids) memcpy(g->stop_ids, o->stop_ids, (size_t)o->n_stop_ids * sizeof(int32_t));
    g->o.stop_ids = NULL;
    g->spec_k = o->spec > 0 ? 1 : 0;
    sample_opts so = {o->temp, o->top_k, o->top_p, o->min_p, o->repeat_penalty, o->repeat_last_n, o->seed};
    if ((rc = sampler_create(&g->sm, m->c.vocab, &so, err, errlen))) goto fail;
    if (o->want_text && tok_stream_open(&g->ts, m->tk)) { rc = base_fail(err, errlen, STRATA_ENOMEM, "out of memory"); goto fail; }
    g->o.grammar = NULL;
    if (o->grammar && (rc = gen_grammar(m, g, o, err, errlen))) goto fail;
    if (!continue_seq) session_reset(seq->s);
    /* the longest snapshot the prompt extends (one token at least is left: its
     * logits give the first sampled token) */
    if (!continue_seq && o->prefix && m->px && n_prompt > 1)
        g->n_fed = g->n_reused = prefix_restore(m->px, seq->s, g->prompt, n_prompt - 1);
    g->px_last = session_pos(seq->s);
    *out = g;
    return 0;
fail:
    strata_gen_free(g);
    return rc;
}

void strata_gen_free(strata_gen *g) {
    if (!g) return;
    tok_stream_close(g->ts);
    jgram_matcher_free(g->jm);
    sampler_free(g->sm);
    base_free(g->prompt);
    base_free(g->out);
    base_free(g->draft_ids);
    base_free(g);
}

int strata_gen_done(const strata_gen *g) { return g->done; }
int strata_gen_stopped(const strata_gen *g) { return g->stopped; }
int64_t strata_gen_prefilled(const strata_gen *g) { return g->n_fed; }
int64_t strata_gen_reused(const strata_gen *g) { return g->n_reused; }
const int32_t *strata_gen_ids(const strata_gen *g, int64_t *n) { *n = g->n_out; return g->out; }
void strata_gen_set_user(strata_gen *g, void *user) { g->user = user; }
void *strata_gen_user(const strata_gen *g) { return g->user; }
uint64_t strata_gen_logits_hash(const strata_gen *g) { return g->lhash; }
void strata_gen_spec_stats(const strata_gen *g, int64_t *drafted, int64_t *accepted, int64_t *verifies) {
    *drafted = g->n_drafted;
    *accepted = g->n_accepted;
    *verifies = g->n_verifies;
}

int strata_gen_logprob(const strata_gen *g, double *lp, int32_t *top_ids, double *top_lp) {
    if (!g->o.logprobs) return -1;
    *lp = g->lp;
    for (int i = 0; i < g->n_lp; i++) { top_ids[i] = g->lp_ids[i]; top_lp[i] = g->lp_top[i]; }
    return g->n_lp;
}

/* Samples g's next token from its logits row, reports it, and decides whether g
 * goes on. The draw depends only on (seed, position). */
static void gen_emit(strata_model *m, strata_gen *g, const float *lg, int64_t pos, strata_token_fn cb, void *ud) {
    session *s = g->seq->s;
    g->lhash = base_fnv1a(lg, (size_t)m->c.vocab * sizeof(float), g->lhash);
    base_mem_guard(1);
    const uint64_t *allow = NULL;
    if (g->jm) {
        int64_t n_allowed;
        allow = jgram_matcher_mask(g->jm, &n_allowed);
        /* nothing continues the document (a recursive schema at the depth bound):
         * the end ids only, which the matcher takes as the end */
        if (n_allowed == 0) jgram_matcher_end_only(g->jm, &allow);
    }
    const int32_t id = sampler_next_masked_at(g->sm, lg, allow, session_tokens(s), pos, pos);
    if (g->jm) jgram_matcher_accept(g->jm, id);
    if (g->o.logprobs) g->n_lp = sampler_logprobs(g->sm, id, g->o.top_logprobs, &g->lp, g->lp_ids, g->lp_top);
    base_mem_guard(0);
    g->out[g->n_out++] = id;
    int is_stop = 0;
    for (int i = 0; i < m->n_stop; i++) is_stop |= m->stop[i] == id;
    is_stop &= g->o.stop_at_end;
    for (int i = 0; i < g->n_stop_ids; i++) is_stop |= g->stop_ids[i] == id;
    const uint8_t *p = NULL;
    size_t n = 0;
    if (g->ts && !is_stop && tok_stream_push(g->ts, id, &p, &n)) n = 0;
    if (cb) cb(ud, g, id, (const char *)p, n, g->o.want_logits ? lg : NULL);
    if (is_stop) g->stopped = 1;
    if (is_stop || g->n_out == g->o.max_tokens || pos >= m->ctx) {
        g->done = 1;
        if (g->ts) {
            tok_stream_flush(g->ts, &p, &n);
            if (n && cb) cb(ud, g, -1, (const char *)p, n, NULL);
        }
        return;
    }
    g->next = id;
    g->has_next = 1;
}

/* Drafts for g's next step into g->drafts (at most max): draft_ids aligned with
 * the generated ids when given, else what followed the most recent earlier
 * occurrence of the longest suffix (3, 2 or 1 tokens) of prompt + generated text. */
static int64_t gen_propose(const strata_gen *g, strata_gen *w, int64_t max) {
    if (max <= 0) return 0;
    if (g->draft_ids) {
        int64_t n = 0;
        for (int64_t i = g->n_out; i < g->o.n_draft_ids && n < max; i++) w->drafts[n++] = g->draft_ids[i];
        return n;
    }
    /* history: the sequence's tokens, then next (not yet evaluated) */
    const session *s = g->seq->s;
    const int32_t *h = session_tokens(s);
    const int64_t n = session_pos(s) + 1;
#define HIST(i) ((i) == n - 1 ? g->next : h[i])
    for (int64_t L = 3; L >= 1; L--) {
        if (n <= L) continue;
        for (int64_t st = n - L - 1; st >= 0; st--) { /* most recent occurrence first */
            int64_t k = 0;
            while (k < L && HIST(st + k) == HIST(n - L + k)) k++;
            if (k < L) continue;
            int64_t m = 0;
            for (int64_t i = st + L; i < n && m < max; i++) w->drafts[m++] = HIST(i);
            if (m) return m;
        }
    }
#undef HIST
    return 0;
}

/* A draft from RAM differs from the model only where the placement reads from
 * disk: with every trunk unit pinned and a cache that holds every expert it is
 * the model itself, at a token's full cost. */
static int self_draft_useful(const strata_model *m) {
    if (!m->placed) return 0;
    int64_t n_experts = 0;
    for (int64_t L = 0; L < m->c.n_layers; L++) n_experts += cfg_is_moe(&m->c, L) ? m->c.n_experts : 0;
    return m->plan.streamed_bytes > 0 || m->plan.n_expert_slots < n_experts;
}

/* Self-drafts for gens[0 .. n) (each with n_drafts tokens wanted): every
 * sequence inside a speculation, the draft passes of all of them stepped together
 * (one row each: the token to evaluate, then the last draft), each draft the
 * greedy choice of the pass's logits, then every sequence rolled back. A draft
 * pass that fails leaves those sequences with no drafts (plain decode). */
static void self_draft(strata_model *m, strata_gen **gens, int n) {
    const int64_t V = m->c.vocab;
    int64_t kmax = 0;
    for (int i = 0; i < n; i++) {
        strata_gen *g = gens[i];
        if (session_spec_begin(g->seq->s)) { g->n_drafts = 0; g->self_pending = 0; continue; }
        if (g->n_drafts > kmax) kmax = g->n_drafts;
    }
    for (int64_t k = 0; k < kmax; k++) {
        int64_t nr = 0;
        for (int i = 0; i < n; i++) {
            strata_gen *g = gens[i];
            if (!g->self_pending || g->n_drafts <= k) continue;
            m->irows[nr++] = (infer_row){g->seq->s, k == 0 ? g->next : g->drafts[k - 1], 1};
        }
        if (!nr) break;
        if (engine_draft_step(m->e, m->irows, nr, m->glogits)) {
            for (int i = 0; i < n; i++) if (gens[i]->self_pending && gens[i]->n_drafts > k) gens[i]->n_drafts = 0;
            continue;
        }
        int64_t r = 0;
        for (int i = 0; i < n; i++) {
            strata_gen *g = gens[i];
            if (!g->self_pending || g->n_drafts <= k) continue;
            const float *lg = m->glogits + r++ * V;
            int32_t best = 0;
            for (int64_t v = 1; v < V; v++) if (lg[v] > lg[best]) best = (int32_t)v;
            g->drafts[k] = best;
        }
    }
    for (int i = 0; i < n; i++) {
        strata_gen *g = gens[i];
        if (!g->self_pending) continue;
        g->self_pending = 0;
        if (session_spec_end(g->seq->s, 0)) g->n_drafts = 0;
    }
}

/* MTP drafts for gens[0 .. n) (each with n_drafts tokens wanted): depth k runs
 * the MTP layer once for every sequence still drafting (one row each: the
 * sampled token, then the last draft), each draft the greedy choice of its
 * logits. A failed pass keeps the drafts made before it. */
static void mtp_draft(strata_model *m, strata_gen **gens, int n) {
    const int64_t V = m->c.vocab;
    for (int64_t k = 0;; k++) {
        int64_t nr = 0;
        for (int i = 0; i < n; i++) {
            strata_gen *g = gens[i];
            if (g->mtp_pending && g->n_drafts > k) m->irows[nr++] = (infer_row){g->seq->s, k == 0 ? g->next : g->drafts[k - 1], 1};
        }
        if (!nr) break;
        const int rc = engine_mtp_step(m->e, m->irows, nr, k, m->glogits);
        int64_t r = 0;
        for (int i = 0; i < n; i++) {
            strata_gen *g = gens[i];
            if (!g->mtp_pending || g->n_drafts <= k) continue;
            if (rc) { g->n_drafts = k; continue; }
            const float *lg = m->glogits + r++ * V;
            int32_t best = 0;
            for (int64_t v = 1; v < V; v++) if (lg[v] > lg[best]) best = (int32_t)v;
            g->drafts[k] = best;
        }
    }
    for (int i = 0; i < n; i++) gens[i]->mtp_pending = 0;
}

/* After a verification: the draft length follows the acceptance, starting at
 * one token and doubling while every draft is accepted; two verifications in a
 * row that accept nothing switch speculation off for 64 steps (then one token is
 * probed). A failed draft costs a row's experts (at 1 GB on ladder about a third
 * of a token's reads): at most two such rows per 64 tokens keep text where
 * drafts fail within a few percent of plain decode. */
static void gen_adapt(strata_gen *g, int64_t drafted, int64_t accepted) {
    if (accepted == drafted) {
        g->spec_fail = 0;
        g->spec_k = 2 * g->spec_k < g->o.spec ? 2 * g->spec_k : g->o.spec;
    } else if (accepted == 0) {
        if (++g->spec_fail >= 2) { g->spec_off = 64; g->spec_fail = 0; }
        g->spec_k = 1;
    } else {
        g->spec_fail = 0;
        g->spec_k = (int)accepted + 1 < g->o.spec ? (int)accepted + 1 : g->o.spec;
    }
}

/* After a step: snapshots of the generators' sequences at a prompt boundary
 * (every px_every positions), at the end of the prompt and at the end of the
 * generation (prompt + every generated token but the last, which was sampled and
 * not evaluated). A snapshot that cannot be kept is not an error. */
static void gen_snapshots(strata_model *m, strata_gen *const *gens, int n) {
    for (int i = 0; i < n; i++) {
        strata_gen *g = gens[i];
        if (!g->o.prefix || g->px_final) continue;
        const int64_t pos = session_pos(g->seq->s);
        int want = 0;
        if (g->n_fed < g->n_prompt) want = pos % m->px_every == 0;
        else if (!g->px_prompt) want = g->px_prompt = 1;
        if (g->done) want = g->px_final = 1;
        if (!want || pos == g->px_last) continue;
        g->px_last = pos;
        prefix_store(m->px, g->seq->s);
    }
}

int strata_gen_step(strata_model *m, strata_gen *const *gens, int n, strata_token_fn cb, void *ud, char *err, size_t errlen) {
    if (!m->loaded) return base_fail(err, errlen, STRATA_EINVAL, "%s: the model is not loaded", m->dir);
    int64_t nr = 0, n_out = 0;
    /* decode rows first: each running stream advances every step, with its
     * drafted tokens when it speculates */
    int n_dec = 0, n_self = 0, n_mtp = 0, can_self = -1;
    for (int i = 0; i < n && nr < m->rows && n_out < m->max_out; i++) {
        strata_gen *g = gens[i];
        if (g->done || !g->has_next) continue;
        g->n_drafts = 0;
        g->self_pending = 0;
        g->mtp_pending = 0;
        if (g->o.spec > 0 && g->spec_off > 0) g->spec_off--;
        else if (g->o.spec > 0) {
            int64_t room = m->rows - nr - 1, lr = m->max_out - n_out - 1;
            if (lr < room) room = lr;
            const int64_t left_tok = g->o.max_tokens - g->n_out - 1, left_ctx = m->ctx - session_pos(g->seq->s) - 1;
            if (left_tok < room) room = left_tok;
            if (left_ctx < room) room = left_ctx;
            if (g->spec_k < room) room = g->spec_k;
            if (g->o.self_draft && room > 0 && can_self < 0) can_self = self_draft_useful(m) && engine_can_draft(m->e);
            if (g->o.mtp_draft) {
                if (room > 0 && session_mtp_ready(g->seq->s)) {
                    g->n_drafts = room;
                    g->mtp_pending = 1;
                    m->gmtp[n_mtp++] = g;
                }
            } else if (g->o.self_draft && room > 0 && can_self == 1) {
                g->n_drafts = room;
                g->self_pending = 1;
                m->gself[n_self++] = g;
            } else {
                g->n_drafts = gen_propose(g, g, room);
            }
        }
        m->gdec[n_dec++] = g;
        nr += 1 + g->n_drafts;
        n_out += 1 + g->n_drafts;
    }
    if (n_self) self_draft(m, m->gself, n_self);
    if (n_mtp) mtp_draft(m, m->gmtp, n_mtp);
    nr = n_out = 0;
    for (int i = 0; i < n_dec; i++) {
        strata_gen *g = m->gdec[i];
        if (g->n_drafts && session_spec_begin(g->seq->s)) g->n_drafts = 0;
        m->grows[nr] = (strata_row){g->seq, g->next, 1};
        m->gown[nr++] = g;
        for (int64_t j = 0; j < g->n_drafts; j++) {
            m->grows[nr] = (strata_row){g->seq, g->drafts[j], 1};
            m->gown[nr++] = g;
        }
        n_out += 1 + g->n_drafts;
    }
    /* then prompts, each a run of consecutive rows, until the pass is full */
    for (int i = 0; i < n && nr < m->rows; i++) {
        strata_gen *g = gens[i];
        if (g->done || g->n_fed == g->n_prompt) continue;
        const int64_t left = g->n_prompt - g->n_fed;
        int64_t k = left < m->rows - nr ? left : m->rows - nr;
        if (m->px && g->o.prefix) { /* a run ends at the next snapshot boundary */
            const int64_t to_b = m->px_every - session_pos(g->seq->s) % m->px_every;
            if (k > to_b) k = to_b;
        }
        const int last = k == left;
        if (last && n_out >= m->max_out) { if (k == 1) continue; k--; }
        for (int64_t j = 0; j < k; j++) {
            const int want = last && j == k - 1 && k == left;
            m->grows[nr] = (strata_row){g->seq, g->prompt[g->n_fed + j], want};
            m->gown[nr++] = g;
            n_out += want;
        }
    }
    int active = 0;
    for (int i = 0; i < n; i++) active += !gens[i]->done;
    if (nr == 0) return active;
    base_mem_guard(1);
    int rc = strata_step(m, m->grows, nr, m->glogits, err, errlen);
    base_mem_guard(0);
    if (rc) return rc;
    /* bookkeeping in row order; logits rows follow the rows that asked for them */
    int64_t lo = 0;
    for (int64_t r = 0; r < nr; r++) {
        strata_gen *g = m->gown[r];
        if (!g->has_next) { /* a prompt row */
            g->n_fed++;
            if (m->grows[r].logits) gen_emit(m, g, m->glogits + lo++ * m->c.vocab, session_pos(g->seq->s), cb, ud);
            continue;
        }
        /* a decode row and its drafts: row i's logits count while every draft
         * before it was what the model chose (the draw at each position depends
         * only on (seed, position), so this is exactly plain decode's output) */
        const int64_t nd = g->n_drafts, pos0 = session_pos(g->seq->s) - nd - 1;
        g->has_next = 0;
        gen_emit(m, g, m->glogits + lo * m->c.vocab, pos0 + 1, cb, ud);
        int64_t acc = 0;
        while (acc < nd && !g->done && g->has_next && g->next == g->drafts[acc]) {
            acc++;
            g->has_next = 0;
            gen_emit(m, g, m->glogits + (lo + acc) * m->c.vocab, pos0 + 1 + acc, cb, ud);
        }
        lo += nd + 1;
        r += nd;
        if (nd) {
            if ((rc = session_spec_end(g->seq->s, acc + 1)))
                return base_fail(err, errlen, rc, "%s", session_errmsg(g->seq->s));
            g->n_drafted += nd;
            g->n_accepted += acc;
            g->n_verifies++;
            gen_adapt(g, nd, acc);
        }
    }
    if (m->px) gen_snapshots(m, gens, n);
    active = 0;
    for (int i = 0; i < n; i++) active += !gens[i]->done;
    return active;
}

/* =============================================================== tokenizer */

int strata_tokenize(strata_model *m, const char *text, size_t len, int allow_special, int32_t **ids, size_t *n, char *err,
                    size_t errlen) {
    *ids = NULL;
    *n = 0;
    if (!m->tk) return base_fail(err, errlen, STRATA_EINVAL, "%s", m->tok_err);
    int rc = tok_encode(m->tk, (const uint8_t *)text, len, allow_special, ids, n);
    if (rc) {
        const char *why = tok_errmsg(m->tk);
        return base_fail(err, errlen, rc, "cannot tokenize the text: %s", why && *why ? why : strata_errstr(rc));
    }
    return 0;
}

size_t strata_token_max_bytes(const strata_model *m) {
    if (!m->tk) return 0;
    size_t mx = 1;
    const int64_t n = tok_n_vocab(m->tk);
    for (int64_t i = 0; i < n; i++) {
        size_t len = 0;
        if (tok_token_bytes(m->tk, (int32_t)i, &len) && len > mx) mx = len;
    }
    return mx;
}

int strata_end_ids(const strata_model *m, int32_t *ids, int max) {
    int k = m->n_stop < max ? m->n_stop : max;
    memcpy(ids, m->stop, (size_t)k * sizeof(int32_t));
    return k;
}
