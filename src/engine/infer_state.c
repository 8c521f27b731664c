/*
 * infer_state.c: session state files (session_save, session_load) and the
 * configuration fingerprint that names the model a state or prefix file belongs
 * to (infer_cfg_fingerprint). A state file is the session's regions (ids, KDA
 * state, MLA caches, the MTP layer's pending row) behind a header and followed
 * by their checksum; loading validates the whole file before it touches the
 * session. Split from infer.c, which owns the session itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine_int.h"
#include "infer.h"
#include "vfs.h"

/* ======================================================================= */
/* State files                                                              */
/* ======================================================================= */

#define STATE_MAGIC "STRS"
#define STATE_VERSION 3u /* 2: the id is the model's identity (config + tensor table + data samples); 3: ... + every weight byte (ident.h) */

uint64_t infer_cfg_fingerprint(const cfg *c) {
    int64_t f[] = {c->hidden, c->n_layers, c->vocab, c->kda_heads, c->kda_head_dim, c->conv_k,
                   c->n_heads, c->q_lora, c->kv_lora, c->qk_nope, c->qk_rope, c->v_head,
                   c->n_experts, c->topk, c->n_shared, c->latent, c->moe_inter, c->first_dense,
                   c->dense_inter, c->attn_res_block};
    uint64_t h = base_fnv1a(f, sizeof f, BASE_FNV_INIT);
    h = base_fnv1a(c->is_mla, (size_t)c->n_layers, h);
    /* the architecture and the router convention (K3 with unbiased weights, all
     * zero, keeps the fingerprint it always had): states and prefix files of one
     * convention never load into the other */
    if (c->arch || c->router_hf) {
        int64_t a[] = {c->arch, c->plain_res, c->kda_softplus, c->kda_g_lowrank, c->act_silu, c->moe_plain, c->router_hf,
                       (int64_t)(c->kv_norm_eps * 1e12)};
        h = base_fnv1a(a, sizeof a, h);
    }
    if (c->no_kda) { /* DeepSeek-V3: RoPE and routing */
        double d[] = {c->rope_theta, c->yarn_factor, c->yarn_beta_fast, c->yarn_beta_slow, c->yarn_mscale,
                      c->yarn_mscale_all_dim, c->qa_norm_eps, c->rms_eps};
        int64_t a[] = {c->mla_rope, c->ds_names, c->yarn_orig_ctx, c->n_group, c->topk_group, c->moe_renorm};
        h = base_fnv1a(d, sizeof d, h);
        h = base_fnv1a(a, sizeof a, h);
    }
    if (c->mtp) { /* the MTP layer's cache and hidden row are part of the state */
        const int64_t m = c->mtp;
        h = base_fnv1a(&m, sizeof m, h);
    }
    return h;
}

/* The id a state file carries: the model's identity when the caller set one
 * (engine_set_model_id), else the configuration's fingerprint. */
static uint64_t state_id(const engine *e) { return e->model_id ? e->model_id : infer_cfg_fingerprint(e->c); }

/* State files are read and written through vfs.h (fault injection reaches them). */
typedef struct { int fd; uint64_t h; int err_no; } wstream;

static void ws_put(wstream *w, const void *p, size_t n) {
    if (w->err_no || n == 0) return;
    w->h = base_fnv1a(p, n, w->h);
    w->err_no = vfs_write_full(w->fd, p, n);
}

int session_save(session *s, const char *path, char *err, size_t errlen) {
    engine *e = s->e;
    const cfg *c = e->c;
    if (s->broken) return base_fail(err, errlen, STRATA_EINVAL, "infer: cannot save a failed session");
    if (e->L0 != 0 || e->L1 != e->n_main)
        return base_fail(err, errlen, STRATA_EINVAL, "infer: state files are not supported across ranks (this process holds layers %lld-%lld)",
                         (long long)e->L0, (long long)e->L1 - 1);
    char tmp[4096];
    struct stat sb;
    /* never rename over a device, a FIFO or a directory that happens to be there */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return base_fail(err, errlen, STRATA_EINVAL, "%s: exists and is not a regular file; not overwritten", path);
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: path too long", path);
    int fd = vfs_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    /* the user gave path: a failure names it, not the temporary file beside it */
    if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    wstream w = {fd, BASE_FNV_INIT, 0};
    uint32_t ver = STATE_VERSION;
    uint64_t fp = state_id(e);
    int64_t pos = s->pos;
    ws_put(&w, STATE_MAGIC, 4);
    ws_put(&w, &ver, 4);
    ws_put(&w, &fp, 8);
    ws_put(&w, &pos, 8);
    ws_put(&w, s->ids, (size_t)pos * sizeof(int32_t));
    ws_put(&w, s->kda, (size_t)e->n_kda * (size_t)kda_floats(c) * sizeof(float));
    for (int64_t i = 0; i < e->n_mla; i++)
        ws_put(&w, s->cache + i * s->max_ctx * e->C, (size_t)(pos * e->C) * sizeof(float));
    if (e->mtp && pos > 0) ws_put(&w, session_mtp_hidden(s, pos - 1), (size_t)c->hidden * sizeof(float));
    uint64_t h = w.h;
    ws_put(&w, &h, 8);
    if (!w.err_no && vfs_fsync(fd)) w.err_no = errno;
    if (close(fd) && !w.err_no) w.err_no = errno;
    if (!w.err_no && vfs_rename(tmp, path)) w.err_no = errno;
    if (w.err_no) {
        unlink(tmp);
        return base_fail(err, errlen, STRATA_EIO, "%s: write failed: %s", path, strerror(w.err_no));
    }
    return 0;
}

typedef struct {
    int fd;
    uint64_t off, h;
    int bad, err_no;
    int64_t nonfinite;    /* file offset of the first non-finite float, or -1 */
    const char *nf_where; /* which part of the state holds it */
} rstream;

/* n bytes at the cursor; bad at end of file, err_no too on an I/O error */
static void rs_raw(rstream *r, void *p, size_t n) {
    if (r->bad || n == 0) return;
    int e = vfs_pread_full(r->fd, p, n, r->off);
    if (e) { r->bad = 1; r->err_no = e > 0 ? e : 0; return; }
    r->off += n;
}

static void rs_get(rstream *r, void *p, size_t n) {
    rs_raw(r, p, n);
    if (!r->bad) r->h = base_fnv1a(p, n, r->h);
}

/* Notes the first non-finite float of the n bytes just read at file offset off
 * (n is a multiple of 4: the floats are 4-byte aligned in the file). */
static void rs_scan(rstream *r, const void *p, size_t n, uint64_t off, const char *where) {
    if (r->bad || r->nonfinite >= 0 || !where) return;
    for (size_t i = 0; i + sizeof(float) <= n; i += sizeof(float)) {
        float x;
        memcpy(&x, (const uint8_t *)p + i, sizeof x);
        if (!isfinite(x)) { r->nonfinite = (int64_t)(off + i); r->nf_where = where; return; }
    }
}

/* Reads n bytes into p (or, with p NULL, through a bounce buffer: the
 * validation pass), hashing them. floats names the part when the bytes are
 * floats, which are then checked to be finite; NULL for other bytes. */
static void rs_take(rstream *r, void *p, size_t n, const char *floats) {
    if (p) {
        const uint64_t off = r->off;
        rs_get(r, p, n);
        rs_scan(r, p, n, off, floats);
        return;
    }
    float tmp[2048];
    while (n && !r->bad) {
        size_t k = n < sizeof tmp ? n : sizeof tmp;
        const uint64_t off = r->off;
        rs_get(r, tmp, k);
        rs_scan(r, tmp, k, off, floats);
        n -= k;
    }
}

/* One pass over a state file: header checks, then the body into s (apply = 1)
 * or only hashed (apply = 0). Returns 0 or an error in err. */
static int load_pass(session *s, int fd, const char *path, int apply, int64_t *pos_out, char *err, size_t errlen) {
    engine *e = s->e;
    const cfg *c = e->c;
    rstream r = {fd, 0, BASE_FNV_INIT, 0, 0, -1, NULL};
    char magic[4];
    uint32_t ver = 0;
    uint64_t fp = 0, h = 0;
    int64_t pos = -1;
    rs_get(&r, magic, 4);
    rs_get(&r, &ver, 4);
    rs_get(&r, &fp, 8);
    rs_get(&r, &pos, 8);
    if (r.err_no) return base_fail(err, errlen, STRATA_EIO, "%s: read failed: %s", path, strerror(r.err_no));
    if (r.bad || memcmp(magic, STATE_MAGIC, 4)) return base_fail(err, errlen, STRATA_EFORMAT, "%s: not a strata session state file", path);
    if (ver != STATE_VERSION)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: state version %u, this build reads %u", path, ver, STATE_VERSION);
    if (fp != state_id(e))
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: state was saved for a different model (its weights or configuration differ)", path);
    if (pos < 0 || pos > s->max_ctx)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: state holds %lld positions, the session only %lld", path,
                         (long long)pos, (long long)s->max_ctx);
    rs_take(&r, apply ? s->ids : NULL, (size_t)pos * sizeof(int32_t), NULL);
    rs_take(&r, apply ? s->kda : NULL, (size_t)e->n_kda * (size_t)kda_floats(c) * sizeof(float), "KDA state");
    for (int64_t i = 0; i < e->n_mla; i++)
        rs_take(&r, apply ? s->cache + i * s->max_ctx * e->C : NULL, (size_t)(pos * e->C) * sizeof(float), "MLA cache");
    if (e->mtp && pos > 0) rs_take(&r, apply ? session_mtp_hidden(s, pos - 1) : NULL, (size_t)c->hidden * sizeof(float), "MTP hidden state");
    uint64_t want = r.h;
    rs_raw(&r, &h, 8);
    if (r.err_no) return base_fail(err, errlen, STRATA_EIO, "%s: read failed: %s", path, strerror(r.err_no));
    if (r.bad) return base_fail(err, errlen, STRATA_EFORMAT, "%s: truncated state file", path);
    if (h != want) return base_fail(err, errlen, STRATA_ECORRUPT, "%s: state checksum mismatch", path);
    /* The state ends with its checksum: more bytes mean the file is not the one
     * that was saved (appended to, or two files joined). */
    struct stat sb;
    if (fstat(fd, &sb)) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    if ((uint64_t)sb.st_size > r.off)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: %llu bytes after the end of the state (the state is %llu bytes, "
                         "the file %llu): not a file strata saved", path,
                         (unsigned long long)((uint64_t)sb.st_size - r.off), (unsigned long long)r.off,
                         (unsigned long long)sb.st_size);
    /* A state strata saved is finite (a session that produced NaN fails and
     * cannot be saved): NaN or Inf here would surface later as non-finite
     * logits blamed on the weights. */
    if (r.nonfinite >= 0)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: the state's %s holds a non-finite value (NaN or Inf) at byte %lld: "
                         "not a state strata saved", path, r.nf_where, (long long)r.nonfinite);
    *pos_out = pos;
    return 0;
}

/* Validates the whole file first (header, size, checksum) without touching the
 * session, then reads it in: a bad file leaves the session exactly as it was. */
int session_load(session *s, const char *path, char *err, size_t errlen) {
    const cfg *c = s->e->c;
    if (s->e->L0 != 0 || s->e->L1 != s->e->n_main)
        return base_fail(err, errlen, STRATA_EINVAL, "infer: state files are not supported across ranks (this process holds layers %lld-%lld)",
                         (long long)s->e->L0, (long long)s->e->L1 - 1);
    int fd = vfs_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", path, strerror(errno));
    int64_t pos = 0;
    int rc = load_pass(s, fd, path, 0, &pos, err, errlen);
    if (!rc) {
        /* ids are checked before anything is applied: read them once more */
        int32_t buf[1024];
        for (int64_t i = 0; !rc && i < pos; i += 1024) {
            const size_t k = (size_t)(pos - i < 1024 ? pos - i : 1024);
            int en = vfs_pread_full(fd, buf, k * sizeof(int32_t), 24 + (uint64_t)i * sizeof(int32_t));
            if (en) {
                rc = base_fail(err, errlen, STRATA_EIO, "%s: read failed: %s", path, en > 0 ? strerror(en) : "end of file");
                break;
            }
            for (size_t j = 0; j < k; j++)
                if (buf[j] < 0 || buf[j] >= c->vocab) { rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: token id out of range", path); break; }
        }
    }
    if (!rc) {
        session_reset(s);
        rc = load_pass(s, fd, path, 1, &pos, err, errlen);
        if (rc) {
            /* the file changed under us between the passes, or a read failed: the
             * old state is gone, so the session is left empty, and says so */
            session_reset(s);
            size_t k = strlen(err ? err : "");
            if (err && k + 1 < errlen) snprintf(err + k, errlen - k, " (the session was reset)");
        } else {
            session_restored(s, pos);
        }
    }
    close(fd);
    return rc;
}
