/*
 * gen.c: `strata gen-model`: K3-format checkpoints with random, numerically alive
 * weights, streamed to disk at any size (see gen.h for the guarantees).
 *
 * Pipeline: two generator threads fill a ring of 16 MB buffers (any buffer can
 * be generated from the plan alone) while the calling thread keeps up to eight
 * O_DIRECT writes in flight through io_uring into preallocated shard files, so
 * generation and I/O overlap and memory stays at a few buffers whatever the
 * model size. Every value is a pure function of (seed, tensor name, element
 * index) through a counter-based RNG (splitmix64 of seed + i * golden), so bytes
 * never depend on buffer sizes or thread timing.
 *
 * This file holds the model writer: config.json and the index, the write
 * pipeline, the directory dance (partial directory, --force, publish) and the
 * API. Not here: the tensor list and its values (gen_weights.c), the tokenizer
 * files (gen_tok.c), the schema (schema.c), config JSON (cfg.c), safetensors
 * header syntax (stw.c), presets (preset.c).
 */
#include "gen.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <liburing.h>
#include "base.h"
#include "gen_priv.h"
#include "schema.h"
#include "stw.h"
#include "vfs.h"

/* ============================================================ small text files */

/* config.json: cfg_to_json's released shape, plus max_position_embeddings (which
 * cfg_to_json omits at its default) and a root "strata_generator" record. */
static int write_config(const char *dir, const cfg *c, const gen_opts *o, char *err, size_t errlen) {
    char *js = cfg_to_json(c);
    if (!js) return base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf b = {0};
    const char *tc = strstr(js, "\"text_config\": {\n");
    const char *root = strchr(js, '{');
    if (root && !tc) { /* a flat config (Kimi Linear): the record after the root brace, keys as published */
        sbuf_printf(&b, "{\n  \"strata_generator\": {\"tool\": \"strata gen-model\", \"version\": \"%s\", "
                        "\"preset\": \"%s\", \"seed\": %llu, \"sparse\": %s, \"experts\": \"bf16\", \"trunk_dtype\": \"%s\"},%s",
                    STRATA_VERSION, o->preset ? o->preset : "", (unsigned long long)o->seed, o->sparse ? "true" : "false",
                    o->trunk_dtype == GEN_TRUNK_MIXED ? "mixed" : o->trunk_dtype == GEN_TRUNK_F32 ? "f32" : "bf16", root + 1);
        base_free(js);
        char fp[4200];
        int frc = snprintf(fp, sizeof fp, "%s/config.json", dir) >= (int)sizeof fp
                      ? base_fail(err, errlen, STRATA_EINVAL, "gen: path too long")
                      : b.s ? base_write_file_atomic(fp, b.s, b.len, err, errlen)
                            : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
        sbuf_free(&b);
        return frc;
    }
    if (!tc || !root) { base_free(js); return base_fail(err, errlen, STRATA_EFORMAT, "gen: unexpected cfg_to_json output"); }
    sbuf_printf(&b, "%.*s\n  \"strata_generator\": {\"tool\": \"strata gen-model\", \"version\": \"%s\", "
                    "\"preset\": \"%s\", \"seed\": %llu, \"sparse\": %s, \"experts\": \"%s\", \"trunk_dtype\": \"%s\"},",
                (int)(root - js + 1), js, STRATA_VERSION, o->preset ? o->preset : "", (unsigned long long)o->seed,
                o->sparse ? "true" : "false",
                o->weights == GEN_W_FP8 ? "fp8" : o->weights == GEN_W_INT4 ? "int4" : o->experts_bf16 ? "bf16" : "mxfp4",
                o->trunk_dtype == GEN_TRUNK_MIXED ? "mixed" : o->trunk_dtype == GEN_TRUNK_F32 ? "f32" : "bf16");
    const char *after_tc = tc + strlen("\"text_config\": {\n");
    sbuf_printf(&b, "%.*s", (int)(after_tc - root - 1), root + 1);
    if (!strstr(js, "\"max_position_embeddings\""))
        sbuf_printf(&b, "    \"max_position_embeddings\": %lld,\n", (long long)c->max_ctx);
    sbuf_printf(&b, "%s", after_tc);
    base_free(js);
    char path[4200];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        b.len = 0, base_free(b.s), b.s = NULL;
    int rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen)
                 : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    return rc;
}


/* =================================================================== pipeline */

/* The data of shard s is cut into buffers of GEN_BUF_BYTES (the last one of a
 * shard shorter); buffer j can be generated from nothing but (plan, j), so
 * GEN_NPROD threads fill them in any order while the writer keeps up to GEN_QD
 * O_DIRECT writes in flight through io_uring and releases slots in order.
 * Memory: GEN_NBUF x 16 MB whatever the model size. */
#define GEN_NBUF 12
#define GEN_NPROD 2
#define GEN_QD 8
#define GEN_BUF_BYTES (16u << 20) /* fewer wake-ups: on a loaded 2-core box each costs ms */

typedef struct gpipe {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *buf[GEN_NBUF];
    uint64_t ready[GEN_NBUF];   /* buffer number the slot holds (UINT64_MAX: none) */
    uint64_t written[GEN_NBUF]; /* buffer number whose write completed */
    uint64_t released;          /* buffers below this are on disk: their slots are free */
    uint64_t n_bufs;
    uint64_t *shard_buf0;       /* first buffer of each shard; [n_shards] = n_bufs */
    int stop;                   /* writer failed: producers quit */
    int next_id;                /* producer numbering */
    const plan *p;
} gpipe;

/* Shard and byte range of buffer j. */
static void buf_range(const gpipe *g, uint64_t j, int *shard, uint64_t *off, size_t *len) {
    int lo = 0, hi = g->p->n_shards;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (g->shard_buf0[mid] <= j) lo = mid; else hi = mid;
    }
    *shard = lo;
    *off = (j - g->shard_buf0[lo]) * GEN_BUF_BYTES;
    uint64_t left = g->p->shard_data[lo] - *off;
    *len = left < GEN_BUF_BYTES ? (size_t)left : GEN_BUF_BYTES;
}


static void *producer_main(void *arg) {
    gpipe *g = arg;
    float tmp[2048];
    pthread_mutex_lock(&g->mu);
    int id = g->next_id++;
    pthread_mutex_unlock(&g->mu);
    for (uint64_t j = (uint64_t)id; j < g->n_bufs; j += GEN_NPROD) {
        pthread_mutex_lock(&g->mu);
        while (!g->stop && j >= g->released + GEN_NBUF) pthread_cond_wait(&g->cv, &g->mu);
        int stop = g->stop;
        pthread_mutex_unlock(&g->mu);
        if (stop) break;
        int s;
        uint64_t off;
        size_t len;
        buf_range(g, j, &s, &off, &len);
        gen_fill_buffer(g->p, s, off, len, g->buf[j % GEN_NBUF], tmp, sizeof tmp / sizeof *tmp);
        pthread_mutex_lock(&g->mu);
        g->ready[j % GEN_NBUF] = j;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

/* -1 with errno set on failure */
static int pwrite_all(int fd, const uint8_t *p, size_t n, uint64_t off) {
    int e = vfs_pwrite_full(fd, p, n, off);
    if (e) errno = e;
    return e ? -1 : 0;
}

/* Write queue: io_uring when available, else synchronous pwrite (same results,
 * queue depth 1). Completions carry the buffer number. */
typedef struct wq {
    struct io_uring ring;
    int uring;
    int inflight;
    uint64_t sync_done[GEN_QD];  /* sync mode: completed but not reaped */
    int sync_res[GEN_QD];
    int n_sync;
} wq;

typedef struct wjob { const uint8_t *p; size_t len; uint64_t off; int fd; } wjob;

static int wq_submit(wq *q, uint64_t j, const wjob *w) {
    if (q->uring) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
        if (!sqe) return -1;
        io_uring_prep_write(sqe, w->fd, w->p, (unsigned)w->len, w->off);
        io_uring_sqe_set_data64(sqe, j);
        if (io_uring_submit(&q->ring) < 1) return -1;
    } else {
        q->sync_done[q->n_sync] = j;
        q->sync_res[q->n_sync++] = pwrite_all(w->fd, w->p, w->len, w->off) ? -errno : (int)w->len;
    }
    q->inflight++;
    return 0;
}

/* Waits for one completion: its buffer number and result (bytes or -errno). */
static void wq_reap(wq *q, uint64_t *j, int *res) {
    if (q->uring) {
        struct io_uring_cqe *cqe;
        int rc;
        while ((rc = io_uring_wait_cqe(&q->ring, &cqe)) == -EINTR) {}
        if (rc < 0) { *j = UINT64_MAX; *res = rc; q->inflight--; return; }
        *j = io_uring_cqe_get_data64(cqe);
        *res = vfs_cqe(cqe->res, UINT64_MAX, 1);
        io_uring_cqe_seen(&q->ring, cqe);
    } else {
        *j = q->sync_done[0];
        *res = q->sync_res[0];
        q->n_sync--;
        memmove(q->sync_done, q->sync_done + 1, (size_t)q->n_sync * sizeof *q->sync_done);
        memmove(q->sync_res, q->sync_res + 1, (size_t)q->n_sync * sizeof *q->sync_res);
    }
    q->inflight--;
}

/* What the writer needs to retire a completed buffer. All writes in flight
 * belong to the current shard (the writer drains at shard ends). */
typedef struct wctx {
    gpipe *g;
    wq *q;
    const gen_opts *o;
    int fd;
    uint64_t hlen;           /* header bytes of the current shard */
    const char *path;
    uint64_t done_bytes, total_bytes, abort_after;
    double t0;
} wctx;

/* Buffer j (len bytes) is on disk: free its slot in order, report progress. */
static int buffer_done(wctx *w, uint64_t j, size_t len) {
    gpipe *g = w->g;
    w->done_bytes += len;
    pthread_mutex_lock(&g->mu);
    g->written[j % GEN_NBUF] = j;
    while (g->released < g->n_bufs && g->written[g->released % GEN_NBUF] == g->released) g->released++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (w->o->progress) w->o->progress(w->o->progress_ud, w->done_bytes, w->total_bytes, base_now() - w->t0);
    /* test hook: die mid-way like a kill -9 would */
    if (w->abort_after && w->done_bytes >= w->abort_after) _exit(99);
    return STRATA_OK;
}

/* Waits for one write to complete (finishing a short write synchronously). */
static int reap_one(wctx *w, gen_stats *st, char *err, size_t errlen) {
    uint64_t j;
    int res, s;
    uint64_t off;
    size_t len;
    double t = base_now();
    wq_reap(w->q, &j, &res);
    if (j == UINT64_MAX || res < 0)
        return base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", w->path, strerror(res < 0 ? -res : EIO));
    buf_range(w->g, j, &s, &off, &len);
    if ((size_t)res < len && pwrite_all(w->fd, w->g->buf[j % GEN_NBUF] + res, len - (size_t)res, w->hlen + off + (uint64_t)res))
        return base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", w->path, strerror(errno));
    st->io_secs += base_now() - t;
    return buffer_done(w, j, len);
}

/* ============================================================ directory dance */

/* Removes OUT.partial-<pid>[...] siblings whose process is gone. */
static void clean_stale(const char *parent, const char *base) {
    DIR *d = opendir(parent);
    if (!d) return;
    char pfx[512];
    if (snprintf(pfx, sizeof pfx, "%s.partial-", base) >= (int)sizeof pfx) { closedir(d); return; }
    size_t pl = strlen(pfx);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, pfx, pl)) continue;
        char *end;
        long pid = strtol(de->d_name + pl, &end, 10);
        if (end == de->d_name + pl || pid <= 0) continue;
        if (pid != (long)getpid() && kill((pid_t)pid, 0) == 0) continue; /* still running */
        if (pid != (long)getpid() && errno != ESRCH) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", parent, de->d_name);
        LOGI("gen: removing stale partial model %s", path);
        base_rm_rf(path);
    }
    closedir(d);
}

static int fsync_dir(const char *path) {
    int fd = vfs_open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return -1;
    int rc = vfs_fsync(fd), e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* Whether a directory entry is one the generator (or `strata pack` beside it)
 * writes into a model directory. */
static int is_model_file(const char *n) {
    size_t l = strlen(n);
    return !strcmp(n, "config.json") || !strcmp(n, "model.safetensors.index.json") || !strcmp(n, "tiktoken.model") ||
           !strcmp(n, "tokenizer.json") ||
           !strcmp(n, "tokenizer_config.json") || (n[0] != '.' && l > 12 && !strcmp(n + l - 12, ".safetensors"));
}

/* What --force may replace: only a model an earlier gen-model wrote. That is a
 * directory (not a symlink) whose config.json carries the generator's
 * "strata_generator" record (written since the generator's first version) and
 * which holds nothing but the generator's files and a strata.pack/ of pack files.
 * Anything else (user files, a downloaded model, a regular file, a FIFO, a
 * device, a symlink) is refused, naming what is in the way. */
static int check_replaceable(const char *out, char *err, size_t errlen) {
    struct stat st;
    if (lstat(out, &st)) return errno == ENOENT ? STRATA_OK : base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", out, strerror(errno));
    const char *refuse = "; --force replaces only a model directory written by strata gen-model";
    if (S_ISLNK(st.st_mode)) return base_fail(err, errlen, STRATA_EINVAL, "gen: %s is a symbolic link, not replaced%s", out, refuse);
    if (!S_ISDIR(st.st_mode))
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s is %s, not replaced%s", out,
                         S_ISREG(st.st_mode) ? "a regular file" : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a directory", refuse);
    char path[8400];
    DIR *d = opendir(out);
    if (!d) return base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", out, strerror(errno));
    struct dirent *de;
    int rc = STRATA_OK;
    while (!rc && (de = readdir(d))) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", out, n);
        if (lstat(path, &st)) { rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", path, strerror(errno)); break; }
        if (S_ISREG(st.st_mode) && is_model_file(n)) continue;
        if (!strcmp(n, "strata.pack") && S_ISDIR(st.st_mode)) {
            /* the pack writer keeps its directory to the pack's own files */
            DIR *pd = opendir(path);
            struct dirent *pe;
            while (pd && (pe = readdir(pd))) {
                const char *m = pe->d_name;
                if (!strcmp(m, ".") || !strcmp(m, "..") || !strncmp(m, "trunk.bin", 9) || !strncmp(m, "manifest.json", 13) ||
                    !strcmp(m, ".strata-pack.lock"))
                    continue;
                rc = base_fail(err, errlen, STRATA_EINVAL, "gen: %s holds %s/%s, which gen-model and pack do not write; "
                               "not replaced%s", out, path, m, refuse);
                break;
            }
            if (pd) closedir(pd);
            else rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", path, strerror(errno));
            continue;
        }
        rc = base_fail(err, errlen, STRATA_EINVAL, "gen: %s holds %s, which gen-model does not write; not replaced%s", out,
                       path, refuse);
    }
    closedir(d);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/config.json", out);
    uint8_t *cj = NULL;
    size_t cl = 0;
    if (lstat(path, &st) || !S_ISREG(st.st_mode) || base_read_file(path, 1u << 24, &cj, &cl, NULL, 0) ||
        !strstr((const char *)cj, "\"strata_generator\"")) {
        base_free(cj);
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s is not a model written by strata gen-model (%s has no "
                         "\"strata_generator\" record), not replaced%s", out, path, refuse);
    }
    base_free(cj);
    return STRATA_OK;
}

/* Puts the finished tmp directory at out: an atomic exchange when out exists
 * (so out is never missing), a plain rename otherwise. */
static int publish(const char *tmp, const char *out, const char *parent, char *err, size_t errlen) {
    struct stat st;
    if (lstat(out, &st) == 0) {
        if (vfs_rename_exchange(tmp, out) == 0) {
            base_rm_rf(tmp); /* now holds the old model */
        } else {
            /* Filesystems without RENAME_EXCHANGE: move the old one aside under a
             * .partial name (a crash here leaves it to the stale cleanup). */
            char old[8200];
            snprintf(old, sizeof old, "%s-old", tmp);
            if (vfs_rename(out, old))
                return base_fail(err, errlen, STRATA_EIO, "%s: cannot move the old model aside: %s", out, strerror(errno));
            if (vfs_rename(tmp, out)) {
                int e = errno;
                /* put the old model back: out must not end up missing */
                if (vfs_rename(old, out))
                    return base_fail(err, errlen, STRATA_EIO, "%s: rename: %s; the old model is at %s", out, strerror(e), old);
                return base_fail(err, errlen, STRATA_EIO, "%s: rename: %s", out, strerror(e));
            }
            base_rm_rf(old);
        }
    } else if (vfs_rename(tmp, out)) {
        return base_fail(err, errlen, STRATA_EIO, "%s: rename: %s", out, strerror(errno));
    }
    /* The model is in place; only the rename's durability is in doubt. */
    if (fsync_dir(parent)) LOGW("gen: fsync %s: %s (%s is complete; a crash now could undo its rename)", parent, strerror(errno), out);
    return STRATA_OK;
}

/* ======================================================================== API */

static int check_cfg(const cfg *c, const gen_opts *o, char *err, size_t errlen) {
    int rc = cfg_validate(c, "gen-model config", err, errlen);
    if (rc) return rc;
    if ((o->weights == GEN_W_INT4 || (!o->experts_bf16 && o->weights != GEN_W_FP8)) &&
        (c->latent % MXFP4_GROUP || c->moe_inter % MXFP4_GROUP))
        return base_fail(err, errlen, STRATA_EINVAL,
                         "gen: MXFP4 and INT4 experts need routed_expert_hidden_size (%lld) and moe_intermediate_size (%lld) "
                         "to be multiples of %d", (long long)c->latent, (long long)c->moe_inter, MXFP4_GROUP);
    int64_t res = gen_n_reserved(c, o);
    if (res < 6 || c->vocab - res < 256)
        return base_fail(err, errlen, STRATA_EINVAL,
                         "gen: vocab_size %lld with %lld reserved specials leaves %lld BPE ranks; need >= 256 ranks and >= 6 specials",
                         (long long)c->vocab, (long long)res, (long long)(c->vocab - res));
    return STRATA_OK;
}

/* The config as written: special ids from the tokenizer layout, mxfp4 flag. */
static void final_cfg(cfg *w, const cfg *c, const gen_opts *o) {
    *w = *c;
    int64_t ranks = c->vocab - gen_n_reserved(c, o);
    w->bos_id = ranks;
    w->n_eos = 2;
    w->eos_ids[0] = ranks + 1;
    w->eos_ids[1] = ranks + 2;
    w->pad_id = c->vocab - 1;
    if (c->arch == ARCH_KIMI_LINEAR) { /* eos_token_id <|im_end|> (ranks + 2), one id as published */
        w->n_eos = 1;
        w->eos_ids[0] = ranks + 2;
    }
    if (c->no_kda) { /* DeepSeek-V3 and K2: one eos_token_id, [EOS] (K2: 163585 = [BOS] + 1) */
        w->n_eos = 1;
        w->eos_ids[0] = ranks + 1;
    }
    if (o->tok >= GEN_TOK_DS_V3) { /* DeepSeek's tokenizer.json: BOS 0, EOS 1, no pad_token_id (gen_tok_hf.c) */
        w->bos_id = 0;
        w->eos_ids[0] = 1;
        w->n_eos = 1;
        w->pad_id = -1;
    }
    w->wf = gen_wf(c, o);
    w->mxfp4_experts = (w->wf & SW_EXP_MASK) == SW_EXP_MXFP4;
    if (w->max_ctx <= 0) w->max_ctx = CFG_DEFAULT_CTX;
}

static void shard_name(char *buf, size_t n, const plan *p, int i) {
    const int k = p->o->shard_names;
    if (k == GEN_SHARDS_PLAIN) snprintf(buf, n, "model-%d-of-%d.safetensors", i + 1, p->n_shards);
    else snprintf(buf, n, k == GEN_SHARDS_5_6 ? "model-%05d-of-%06d.safetensors" : "model-%05d-of-%05d.safetensors", i + 1,
                  p->n_shards);
}

/* Header bytes of shard s (built to know its length); caller base_free()s. */
static uint8_t *shard_header(const plan *p, int s, size_t *hlen, char *err, size_t errlen) {
    size_t a = p->shard_first[s], b = p->shard_first[s + 1];
    stw_entry *e = base_alloc((b - a ? b - a : 1) * sizeof *e, MEM_MISC);
    if (!e) { base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory"); return NULL; }
    for (size_t i = a; i < b; i++) {
        const gitem *t = &p->it[i];
        stw_entry *x = &e[i - a];
        x->name = gen_item_name(p, t);
        x->dtype = t->dtype;
        x->ndim = t->ndim;
        for (int d = 0; d < 4; d++) x->shape[d] = t->shape[d];
        x->nbytes = t->nbytes;
    }
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->o->seed);
    const char *meta[] = {"format", "pt", "strata_generator", "strata gen-model " STRATA_VERSION,
                          "strata_seed", seed, "strata_preset", p->o->preset ? p->o->preset : "",
                          "strata_sparse", "true"};
    uint64_t dbytes;
    uint8_t *h = stw_header(e, b - a, meta, p->o->sparse ? 5 : 4, 4096, hlen, &dbytes, err, errlen);
    base_free(e);
    return h;
}

static int write_index(const char *dir, const plan *p, char *err, size_t errlen) {
    sbuf b = {0};
    uint64_t total = 0;
    for (int s = 0; s < p->n_shards; s++) total += p->shard_data[s];
    sbuf_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu%s\n  },\n  \"weight_map\": {",
                (unsigned long long)total, p->o->sparse ? ",\n    \"strata_sparse\": \"true\"" : "");
    char sn[64];
    for (size_t i = 0; i < p->n; i++) {
        shard_name(sn, sizeof sn, p, p->it[i].shard);
        sbuf_printf(&b, "%s\n    \"%s\": \"%s\"", i ? "," : "", gen_item_name(p, &p->it[i]), sn);
    }
    sbuf_printf(&b, "\n  }\n}\n");
    char path[4200];
    if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= (int)sizeof path)
        b.len = 0, base_free(b.s), b.s = NULL;
    int rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen)
                 : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    return rc;
}

int gen_model_sizes(const cfg *c, const gen_opts *o, gen_sizes *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int rc = check_cfg(c, o, err, errlen);
    if (rc) return rc;
    plan p;
    rc = gen_plan_build(&p, c, o, err, errlen);
    if (rc) return rc;
    for (size_t i = 0; i < p.n; i++) {
        const gitem *t = &p.it[i];
        out->total += t->nbytes;
        if (t->cls == TC_EXPERT) out->experts += t->nbytes;
        else if (t->role == R_EMBED || t->role == R_LM_HEAD) out->embed += t->nbytes;
        else out->trunk += t->nbytes;
    }
    /* one expert: the bytes of expert 0 of the first MoE layer */
    if (c->first_dense < c->n_layers) {
        uint64_t eb = 0;
        for (size_t i = 0; i < p.n; i++)
            if (p.it[i].cls == TC_EXPERT && p.it[i].layer == c->first_dense && p.it[i].expert == 0) eb += p.it[i].nbytes;
        out->expert_bytes = eb;
    }
    out->n_tensors = p.n;
    out->n_shards = p.n_shards;
    gen_plan_free(&p);
    return STRATA_OK;
}

/* One gen_model call: what its steps share. */
typedef struct grun {
    const gen_opts *o;
    cfg c;                    /* the config as written (final_cfg) */
    plan p;
    gpipe g;
    wq q;
    pthread_t th[GEN_NPROD];
    int n_threads, have_sync;
    stw_file f;               /* the shard being written */
    uint8_t *hdr;
    int *shard_fds;           /* finished shards awaiting the final fsync */
    gen_stats stats;
    wctx wc;
    uint64_t data_total;
    double t0;
    int lock_fd;
    char out[4096], parent[4096], base[1024], tmp[4200], lock_path[4200], shard_path[4300];
} grun;

/* OUT, its parent and base name (trailing slashes ignored); the parents made
 * like mkdir -p (only OUT itself is built crash-safely); the lock's path. */
static int out_paths(grun *r, const char *out_dir, char *err, size_t errlen) {
    int rc;
    size_t ol = strlen(out_dir);
    while (ol > 1 && out_dir[ol - 1] == '/') ol--;
    if (ol == 0 || ol >= sizeof r->out) return base_fail(err, errlen, STRATA_EINVAL, "gen: bad output path");
    memcpy(r->out, out_dir, ol);
    r->out[ol] = 0;
    const char *sl = strrchr(r->out, '/');
    if (sl) {
        snprintf(r->parent, sizeof r->parent, "%.*s", (int)(sl == r->out ? 1 : sl - r->out), r->out);
        if (snprintf(r->base, sizeof r->base, "%s", sl + 1) >= (int)sizeof r->base)
            return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: name too long", r->out);
    } else {
        snprintf(r->parent, sizeof r->parent, ".");
        if (snprintf(r->base, sizeof r->base, "%s", r->out) >= (int)sizeof r->base)
            return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: name too long", r->out);
    }
    if (!r->base[0] || !strcmp(r->base, ".") || !strcmp(r->base, ".."))
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: not a usable directory name", out_dir);
    if (!base_is_dir(r->parent) && (rc = base_mkdir_p(r->parent, err, errlen))) return rc;
    /* One writer of OUT at a time: two gen-model OUT at once both reported success
     * and the later silently replaced the earlier. The lock also keeps a second
     * writer's clean_stale away from our partial directory. */
    if (snprintf(r->lock_path, sizeof r->lock_path, "%s/.%s.strata-lock", r->parent, r->base) >= (int)sizeof r->lock_path)
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: path too long", r->out);
    return STRATA_OK;
}

/* Under the lock: whether OUT may be written, the plan, the free space, and an
 * empty partial directory to build in. */
static int prepare(grun *r, char *err, size_t errlen) {
    const gen_opts *o = r->o;
    int rc;
    clean_stale(r->parent, r->base);
    struct stat sst;
    if (lstat(r->out, &sst) == 0 && !o->force)
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s exists (use --force to replace it)", r->out);
    if (o->force && (rc = check_replaceable(r->out, err, errlen))) return rc;

    if ((rc = gen_plan_build(&r->p, &r->c, o, err, errlen))) return rc;
    for (int s = 0; s < r->p.n_shards; s++) r->data_total += r->p.shard_data[s];

    /* Free space: data (unless sparse) + headers/index/tokenizer (~1 KB per
     * tensor is generous) + 64 MB slack. */
    struct statvfs vfs;
    uint64_t need = (o->sparse ? 0 : r->data_total) + r->p.n * 1024 + (64u << 20);
    if (statvfs(r->parent, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        if (need > avail) {
            char a[32], b[32];
            return base_fail(err, errlen, STRATA_EIO, "gen: the model needs %s but %s has only %s free%s",
                             base_fmt_bytes(need, a, sizeof a), r->parent, base_fmt_bytes(avail, b, sizeof b),
                             o->sparse ? "" : " (--sparse writes headers and holes only)");
        }
    }

    if (snprintf(r->tmp, sizeof r->tmp, "%s/%s.partial-%d", r->parent, r->base, (int)getpid()) >= (int)sizeof r->tmp)
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: path too long", r->out);
    base_rm_rf(r->tmp);
    if (mkdir(r->tmp, 0755)) return base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", r->tmp, strerror(errno));
    return STRATA_OK;
}

/* The buffer ring, the generator threads and the write queue (not for --sparse). */
static int pipe_start(grun *r, char *err, size_t errlen) {
    gpipe *g = &r->g;
    const plan *p = &r->p;
    if (pthread_mutex_init(&g->mu, NULL) || pthread_cond_init(&g->cv, NULL))
        return base_fail(err, errlen, STRATA_ENOMEM, "gen: cannot create a mutex");
    r->have_sync = 1;
    g->p = p;
    g->shard_buf0 = base_alloc(((size_t)p->n_shards + 1) * sizeof *g->shard_buf0, MEM_MISC);
    if (!g->shard_buf0) return base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    for (int s = 0; s < p->n_shards; s++) {
        g->shard_buf0[s] = g->n_bufs;
        g->n_bufs += (p->shard_data[s] + GEN_BUF_BYTES - 1) / GEN_BUF_BYTES;
    }
    g->shard_buf0[p->n_shards] = g->n_bufs;
    for (int k = 0; k < GEN_NBUF; k++) {
        g->ready[k] = g->written[k] = UINT64_MAX;
        if (!(g->buf[k] = base_alloc_aligned(GEN_BUF_BYTES, STW_DIRECT_ALIGN, MEM_IO)))
            return base_fail(err, errlen, STRATA_ENOMEM, "gen: cannot allocate write buffers");
    }
    for (int k = 0; k < GEN_NPROD; k++) {
        if (pthread_create(&r->th[k], NULL, producer_main, g))
            return base_fail(err, errlen, STRATA_ENOMEM, "gen: cannot start a generator thread");
        r->n_threads++;
    }
    /* STRATA_GEN_NO_URING (tests): the synchronous fallback path */
    const char *nu = getenv("STRATA_GEN_NO_URING");
    r->q.uring = !(nu && *nu) && io_uring_queue_init(GEN_QD * 2, &r->q.ring, 0) == 0;
    return STRATA_OK;
}

/* Writes buffer j of the current shard: waits for the generators (reaping
 * completions meanwhile), then queues it, or writes it at once when it is the
 * short last buffer of the shard. */
static int write_buffer(grun *r, uint64_t j, char *err, size_t errlen) {
    gpipe *g = &r->g;
    wq *q = &r->q;
    stw_file *f = &r->f;
    int rc, bs;
    uint64_t boff;
    size_t blen;
    buf_range(g, j, &bs, &boff, &blen);
    /* Wait for buffer j; reap completions meanwhile: writes finish out of
     * order, and the producers need the in-order release to move on. */
    for (;;) {
        double tw = base_now();
        pthread_mutex_lock(&g->mu);
        while (g->ready[j % GEN_NBUF] != j && !q->inflight) pthread_cond_wait(&g->cv, &g->mu);
        int rdy = g->ready[j % GEN_NBUF] == j;
        pthread_mutex_unlock(&g->mu);
        r->stats.gen_wait_secs += base_now() - tw;
        if (rdy) break;
        if ((rc = reap_one(&r->wc, &r->stats, err, errlen))) return rc;
    }
    /* the short last buffer of a shard cannot go O_DIRECT: drain, then
     * write it through the page cache */
    int tail = blen % STW_DIRECT_ALIGN != 0 || !f->direct;
    while (q->inflight && (tail || q->inflight >= GEN_QD))
        if ((rc = reap_one(&r->wc, &r->stats, err, errlen))) return rc;
    wjob w = {g->buf[j % GEN_NBUF], blen, r->wc.hlen + boff, f->fd};
    double tw = base_now();
    if (tail) {
        /* aligned part still direct, only the last < 4 KB through the cache */
        size_t al = f->direct ? blen - blen % STW_DIRECT_ALIGN : 0;
        if (al && pwrite_all(f->fd, w.p, al, w.off))
            return base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", r->shard_path, strerror(errno));
        if (f->direct) stw_file_direct(f, 0);
        if (pwrite_all(f->fd, w.p + al, w.len - al, w.off + al))
            return base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", r->shard_path, strerror(errno));
        r->stats.io_secs += base_now() - tw;
        return buffer_done(&r->wc, j, blen);
    }
    if (wq_submit(q, j, &w)) return base_fail(err, errlen, STRATA_EIO, "gen: %s: cannot queue a write", r->shard_path);
    r->stats.io_secs += base_now() - tw;
    return STRATA_OK;
}

/* Shard s: its header, then its data buffers; the file is kept open for the
 * final fsync (or finished now when there are too many shards to keep open). */
static int write_shard(grun *r, int s, char *err, size_t errlen) {
    const gen_opts *o = r->o;
    const plan *p = &r->p;
    stw_file *f = &r->f;
    char sn[64];
    size_t hlen;
    int rc;
    shard_name(sn, sizeof sn, p, s);
    snprintf(r->shard_path, sizeof r->shard_path, "%s/%s", r->tmp, sn);
    if (!(r->hdr = shard_header(p, s, &hlen, err, errlen))) return STRATA_ENOMEM;
    if ((rc = stw_file_create(f, r->shard_path, err, errlen))) return rc;
    if ((rc = stw_file_write(f, r->hdr, hlen, err, errlen))) return rc;
    base_free(r->hdr);
    r->hdr = NULL;
    r->stats.total_bytes += hlen;
    /* Data bypasses the page cache: on the busy 2-core test machine buffered
     * writes ran at ~90 MB/s with writeback where O_DIRECT wrote ~600 MB/s (dd). */
    if (!o->sparse) {
        /* Preallocating makes every data write non-extending: ext4 serialises
         * O_DIRECT writes past EOF, which defeats the queue depth. Also
         * fails early when the disk is full. Unsupported -> plain writes. */
        int fe = vfs_fallocate(f->fd, hlen + p->shard_data[s]) ? errno : 0;
        if (fe == ENOSPC) return base_fail(err, errlen, STRATA_EIO, "gen: %s: no space left on the device", r->shard_path);
        stw_file_direct(f, 1);
    }
    r->wc.fd = f->fd;
    r->wc.hlen = hlen;
    r->wc.path = r->shard_path;
    for (uint64_t j = o->sparse ? 0 : r->g.shard_buf0[s]; !o->sparse && j < r->g.shard_buf0[s + 1]; j++)
        if ((rc = write_buffer(r, j, err, errlen))) return rc;
    while (r->q.inflight)
        if ((rc = reap_one(&r->wc, &r->stats, err, errlen))) return rc;
    /* Sparse: the INT4 weight_shape tensors still hold their values (8 bytes
     * each), which the loader checks; everything else stays a hole. */
    for (size_t i = p->shard_first[s]; o->sparse && i < p->shard_first[s + 1]; i++) {
        const gitem *t = &p->it[i];
        uint8_t v[16];
        float tmp[4];
        if (t->kind != TK_I4_SHAPE || t->nbytes > sizeof v) continue;
        gen_fill_buffer(p, s, t->off, (size_t)t->nbytes, v, tmp, 4);
        if (pwrite_all(f->fd, v, (size_t)t->nbytes, hlen + t->off))
            return base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", r->shard_path, strerror(errno));
    }
    double tf = base_now();
    if (r->shard_fds) {
        /* fsync later, all at once: on ext4 each fsync is a journal commit
         * (~0.6 s here), and one commit covers every shard */
        if (o->sparse && vfs_ftruncate(f->fd, hlen + p->shard_data[s]))
            return base_fail(err, errlen, STRATA_EIO, "gen: %s: cannot extend: %s", r->shard_path, strerror(errno));
        r->shard_fds[s] = f->fd;
        f->fd = -1;
    } else if ((rc = stw_file_finish(f, hlen + p->shard_data[s], err, errlen))) {
        return rc;
    }
    r->stats.sync_secs += base_now() - tf;
    r->stats.total_bytes += p->shard_data[s];
    return STRATA_OK;
}

/* The shards and the partial directory on disk (fsync), then the model in place
 * at OUT, and the final numbers. */
static int finish(grun *r, char *err, size_t errlen) {
    const plan *p = &r->p;
    int rc;
    double tpub = base_now();
    for (int s = 0; r->shard_fds && s < p->n_shards; s++) {
        int e = vfs_fsync(r->shard_fds[s]) ? errno : 0;
        close(r->shard_fds[s]);
        r->shard_fds[s] = -1;
        if (e) {
            char sn[64];
            shard_name(sn, sizeof sn, p, s);
            return base_fail(err, errlen, STRATA_EIO, "gen: %s/%s: fsync: %s", r->tmp, sn, strerror(e));
        }
    }
    if (fsync_dir(r->tmp)) return base_fail(err, errlen, STRATA_EIO, "gen: fsync %s: %s", r->tmp, strerror(errno));
    struct stat sst;
    if (!r->o->force && lstat(r->out, &sst) == 0) /* made by something that ignores the lock */
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s appeared while generating; not replaced (use --force)", r->out);
    if (r->o->force && (rc = check_replaceable(r->out, err, errlen))) return rc; /* again: it may have changed meanwhile */
    if ((rc = publish(r->tmp, r->out, r->parent, err, errlen))) return rc;

    r->stats.data_bytes = r->data_total;
    r->stats.n_tensors = p->n;
    r->stats.n_shards = p->n_shards;
    r->stats.secs = base_now() - r->t0;
    r->stats.sync_secs += r->stats.secs - (tpub - r->t0);
    r->stats.mb_per_s = r->stats.secs > 0 ? (double)r->stats.total_bytes / r->stats.secs / 1e6 : 0;
    return STRATA_OK;
}

/* Everything into the partial directory, then published at OUT. */
static int build(grun *r, char *err, size_t errlen) {
    const gen_opts *o = r->o;
    int rc;
    int64_t n_ranks = r->c.vocab - gen_n_reserved(&r->c, o);
    if ((rc = write_config(r->tmp, &r->c, o, err, errlen))) return rc;
    if (o->tok >= GEN_TOK_DS_V3) rc = gen_tok_write_hf(r->tmp, r->c.vocab, o->tok - GEN_TOK_DS_V3, err, errlen);
    else rc = gen_write_tokenizer(r->tmp, &r->c, o, n_ranks, err, errlen);
    if (rc) return rc;
    if ((rc = write_index(r->tmp, &r->p, err, errlen))) return rc;

    r->stats.prep_secs = base_now() - r->t0;
    /* Test hook (see gen.h): die mid-way like a kill -9 would. */
    uint64_t abort_after = 0;
    const char *ab = getenv("STRATA_GEN_ABORT_AFTER_BYTES");
    if (ab && *ab) abort_after = strtoull(ab, NULL, 10);

    if (!o->sparse && (rc = pipe_start(r, err, errlen))) return rc;
    r->wc = (wctx){&r->g, &r->q, o, -1, 0, NULL, 0, r->data_total, abort_after, r->t0};
    if (r->p.n_shards <= 256) {
        r->shard_fds = base_alloc((size_t)r->p.n_shards * sizeof *r->shard_fds, MEM_MISC);
        for (int s = 0; r->shard_fds && s < r->p.n_shards; s++) r->shard_fds[s] = -1;
    }
    for (int s = 0; s < r->p.n_shards; s++)
        if ((rc = write_shard(r, s, err, errlen))) return rc;
    for (; r->n_threads > 0; r->n_threads--) pthread_join(r->th[r->n_threads - 1], NULL);
    if (o->progress) o->progress(o->progress_ud, r->data_total, r->data_total, base_now() - r->t0);
    return finish(r, err, errlen);
}

/* After a failed build: no write left in flight, no shard open, no partial
 * directory. */
static void discard(grun *r) {
    while (r->q.inflight) { uint64_t dj; int res; wq_reap(&r->q, &dj, &res); }
    if (r->f.fd >= 0) stw_file_abort(&r->f);
    base_rm_rf(r->tmp);
}

/* Stops the generators and frees what the run holds, the lock last. */
static void release(grun *r) {
    gpipe *g = &r->g;
    if (r->n_threads) {
        pthread_mutex_lock(&g->mu);
        g->stop = 1;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        for (; r->n_threads > 0; r->n_threads--) pthread_join(r->th[r->n_threads - 1], NULL);
    }
    if (r->q.uring) {
        /* in-flight writes target buffers freed below: wait for them first */
        while (r->q.inflight) { uint64_t dj; int res; wq_reap(&r->q, &dj, &res); }
        io_uring_queue_exit(&r->q.ring);
    }
    base_free(g->shard_buf0);
    for (int s = 0; r->shard_fds && s < r->p.n_shards; s++)
        if (r->shard_fds[s] >= 0) close(r->shard_fds[s]);
    base_free(r->shard_fds);
    if (r->have_sync) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
    }
    for (int k = 0; k < GEN_NBUF; k++) base_free(g->buf[k]);
    base_free(r->hdr);
    gen_plan_free(&r->p);
    base_unlock(r->lock_path, r->lock_fd);
}

int gen_model(const char *out_dir, const cfg *c_in, const gen_opts *o, gen_stats *st, char *err, size_t errlen) {
    grun run = {.o = o, .t0 = base_now(), .f = {.fd = -1}, .lock_fd = -1}, *r = &run;
    int rc;
    final_cfg(&r->c, c_in, o);
    if ((rc = check_cfg(&r->c, o, err, errlen))) return rc;
    if ((rc = out_paths(r, out_dir, err, errlen))) return rc;
    if ((r->lock_fd = base_lock(r->lock_path, r->out, err, errlen)) < 0) return r->lock_fd;
    rc = prepare(r, err, errlen);
    if (!rc) {
        rc = build(r, err, errlen);
        if (rc) discard(r);
        else if (st) *st = r->stats;
    }
    release(r);
    return rc;
}
