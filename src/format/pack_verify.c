/*
 * pack_verify.c: pack_verify (every trunk region and tensor re-hashed from
 * trunk.bin, and the experts from the source shards, against the manifest) and
 * the content digest, which a manifest and the shards give alike for the same bytes.
 */

#define XXH_STATIC_LINKING_ONLY
#include "arch.h"
#include "pack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>
#include "io.h"
#include "jsonx.h"
#include "pack_priv.h"
#include "vfs.h"

/* ============================================================ content digest */

/* XXH3 over the record hashes in the pack's order: each trunk tensor's own XXH3
 * (embedding, layers 0.., head; tensors in layout order), then each expert's (its
 * tensors in schema order, (layer, expert) order). A pack holds these hashes, so a
 * digest from its manifest and one from the shards agree for the same bytes. */
static void digest_begin(XXH3_state_t *h, int64_t n_trunk, int64_t n_exp) {
    XXH3_64bits_reset(h);
    const char tag[16] = "strata-content1";
    XXH3_64bits_update(h, tag, sizeof tag);
    XXH3_64bits_update(h, &n_trunk, sizeof n_trunk);
    XXH3_64bits_update(h, &n_exp, sizeof n_exp);
}

int pack_content_digest(const pack *p, uint64_t *out) {
    int64_t nt = p->embed.n_tensors;
    for (int64_t u = 0; u <= p->n_layers; u++) nt += p->units[u].n_tensors;
    XXH3_state_t h;
    digest_begin(&h, nt, p->n_moe * p->n_experts);
    for (int64_t u = -1; u <= p->n_layers; u++) {
        const pack_region *r = u < 0 ? &p->embed : &p->units[u];
        for (int i = 0; i < r->n_tensors; i++) {
            if (!r->t[i].has_xxh3) return -1;
            XXH3_64bits_update(&h, &r->t[i].xxh3, sizeof r->t[i].xxh3);
        }
    }
    if (p->n_moe > 0 && p->n_experts > 0)
        XXH3_64bits_update(&h, p->expert_xxh3, (size_t)(p->n_moe * p->n_experts) * sizeof *p->expert_xxh3);
    *out = XXH3_64bits_digest(&h);
    return 0;
}

int pack_content_digest_shards(const cfg *c, const st_index *ix, int flags, pack_progress_fn progress, void *ud,
                               uint64_t *out, char *err, size_t errlen) {
    layout l;
    int rc = pack_layout_build(c, ix, &l, err, errlen);
    if (rc) return rc;
    const int64_t n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0, n_exp = n_moe * c->n_experts;
    uint64_t *hashes = base_calloc((size_t)(l.n_units + 1), sizeof *hashes, MEM_INDEX);
    uint64_t *xh = base_calloc((size_t)(n_exp + 1), sizeof *xh, MEM_INDEX);
    pack_result res;
    memset(&res, 0, sizeof res);
    if (!hashes || !xh) rc = base_fail(err, errlen, STRATA_ENOMEM, "identity: out of memory");
    if (!rc) rc = pack_write_trunk(&l, ix, NULL, flags, progress, ud, hashes, &res, err, errlen);
    if (!rc) rc = pack_hash_experts(c, ix, xh, NULL, flags, progress, ud, NULL, err, errlen);
    if (!rc) {
        int64_t nt = 0;
        for (int64_t u = -1; u < l.n_units; u++) nt += (u < 0 ? &l.embed : &l.units[u])->n;
        XXH3_state_t h;
        digest_begin(&h, nt, n_exp);
        for (int64_t u = -1; u < l.n_units; u++) {
            const lregion *r = u < 0 ? &l.embed : &l.units[u];
            for (int i = 0; i < r->n; i++) XXH3_64bits_update(&h, &r->t[i].xxh3, sizeof r->t[i].xxh3);
        }
        if (n_exp) XXH3_64bits_update(&h, xh, (size_t)n_exp * sizeof *xh);
        *out = XXH3_64bits_digest(&h);
    }
    base_free(hashes);
    base_free(xh);
    pack_layout_free(&l);
    return rc;
}

/* ==================================================================== verify */

static const pack_region *verify_reg(const pack *p, int64_t i) { return i == 0 ? &p->embed : &p->units[i - 1]; }

static const char *trunk_path(const void *p, int i) { (void)i; return ((const pack *)p)->trunk_path; }

/* Releases what tw_pack_region allocated. */
static void tw_pack_free(twalk *w) {
    if (w->t) base_free(w->t[w->n].blk); /* the sentinel entry holds the hashes' storage */
    base_free(w->t);
    w->t = NULL;
}

/* Sets w up to recompute the hashes of r's tensors and blocks (into storage it
 * allocates; tw_pack_free releases it). */
static int tw_pack_region(twalk *w, const pack_region *r, char *err, size_t errlen) {
    tw_pack_free(w);
    int64_t nb = 0;
    for (int i = 0; i < r->n_tensors; i++) nb += r->t[i].n_blk + 1;
    twt *a = base_calloc((size_t)r->n_tensors + 1, sizeof *a, MEM_INDEX);
    uint64_t *h = a ? base_calloc((size_t)nb + 1, sizeof *h, MEM_INDEX) : NULL;
    if (!h) { base_free(a); return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); }
    a[r->n_tensors].blk = h;
    for (int i = 0; i < r->n_tensors; i++) {
        const pack_tensor *t = &r->t[i];
        const uint64_t rb = t->n_blk ? t->nbytes / (uint64_t)t->shape[0] : 0;
        a[i] = (twt){t->off, t->nbytes, (uint64_t)t->blk_rows * rb, h, h + 1};
        h += t->n_blk + 1;
    }
    pack_tw_start(w, a, r->n_tensors);
    return STRATA_OK;
}

/* The recomputed tensor and block hashes of r against the manifest's. */
static int tw_pack_check(const twalk *w, const pack *p, const pack_region *r, const char *what, char *err, size_t errlen) {
    for (int i = 0; i < r->n_tensors; i++) {
        const pack_tensor *t = &r->t[i];
        const twt *x = &w->t[i];
        if (t->has_xxh3 && *x->h != t->xxh3)
            return base_fail(err, errlen, STRATA_ECORRUPT, "%s: tensor %s: checksum mismatch in %s bytes %llu..%llu (expected "
                             "%016llx, got %016llx): the manifest or the pack is corrupt; re-run strata pack --force", what,
                             t->name, p->trunk_path, (unsigned long long)(r->off + t->off),
                             (unsigned long long)(r->off + t->off + t->nbytes), (unsigned long long)t->xxh3,
                             (unsigned long long)*x->h);
        for (int64_t k = 0; k < t->n_blk; k++) {
            if (x->blk[k] == t->blk[k]) continue;
            const uint64_t a = r->off + t->off + (uint64_t)k * x->bb, b = a + x->bb < r->off + t->off + t->nbytes ? a + x->bb : r->off + t->off + t->nbytes;
            return base_fail(err, errlen, STRATA_ECORRUPT, "%s: tensor %s block %lld: checksum mismatch in %s bytes %llu..%llu "
                             "(expected %016llx, got %016llx): the manifest or the pack is corrupt; re-run strata pack --force",
                             what, t->name, (long long)k, p->trunk_path, (unsigned long long)a, (unsigned long long)b,
                             (unsigned long long)t->blk[k], (unsigned long long)x->blk[k]);
        }
    }
    return STRATA_OK;
}

/* The trunk regions (embed, layers, head) are one pass of the source stream over
 * trunk.bin, read with O_DIRECT and SRC_SLOTS reads in flight, each region hashed
 * as its pieces land. Demo pack, cold cache, 8 interleaved runs each: one 16 MB
 * read at a time hashed in between, median 1.65 GB/s; this, median 1.79 GB/s. */
static int verify_trunk(const pack *p, pack_progress_fn progress, void *ud, char *err, size_t errlen) {
    const int64_t nreg = p->n_layers + 2;
    sext *x = base_alloc((size_t)nreg * sizeof *x, MEM_INDEX);
    if (!x) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int64_t i = 0; i < nreg; i++) x[i] = (sext){0, verify_reg(p, i)->off, verify_reg(p, i)->nbytes};
    sstream s;
    int rc = pack_src_open_files(&s, 1, trunk_path, p, x, nreg, PACK_SRC_DIRECT, SRC_CHUNK, err, errlen);
    if (rc) { base_free(x); return rc; }
    twalk tw = {0};
    double t0 = base_now();
    for (int64_t i = 0; i < nreg && !rc; i++) {
        const pack_region *r = verify_reg(p, i);
        char what[64];
        if (i == 0) snprintf(what, sizeof what, "embed");
        else if (i - 1 < p->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)(i - 1));
        else snprintf(what, sizeof what, "head");
        XXH3_state_t h;
        XXH3_64bits_reset(&h);
        /* the tensors' and blocks' own hashes too: a run checks those */
        rc = tw_pack_region(&tw, r, err, errlen);
        for (uint64_t left = r->nbytes; left && !rc;) {
            spiece pc;
            int got = pack_src_next(&s, &pc, err, errlen);
            if (got <= 0 || pc.n > left) {
                char e2[1024];
                snprintf(e2, sizeof e2, "%s", got < 0 ? err : "read plan out of step");
                rc = base_fail(err, errlen, STRATA_ECORRUPT, "%s: unreadable (truncated pack?): %s", what, e2);
                break;
            }
            XXH3_64bits_update(&h, pc.p, pc.n);
            pack_tw_bytes(&tw, pc.p, pc.n);
            left -= pc.n;
        }
        if (rc) break;
        uint64_t digest = XXH3_64bits_digest(&h);
        if (digest != r->xxh3)
            rc = base_fail(err, errlen, STRATA_ECORRUPT,
                           "%s: checksum mismatch in %s bytes %llu..%llu (expected %016llx, got %016llx): the pack is corrupt; re-run strata pack --force",
                           what, p->trunk_path, (unsigned long long)r->off, (unsigned long long)(r->off + r->nbytes),
                           (unsigned long long)r->xxh3, (unsigned long long)digest);
        if (!rc) rc = tw_pack_check(&tw, p, r, what, err, errlen);
        if (progress && i > 0) progress(ud, "trunk", r->off + r->nbytes, p->trunk_bytes, base_now() - t0);
    }
    tw_pack_free(&tw);
    pack_src_close(&s);
    base_free(x);
    return rc;
}

/* A region whose source no longer hashes to the manifest's checksum: finds the
 * first tensor byte where the shards differ from trunk.bin (already verified
 * against the manifest) and names the tensor, the shard and the byte. */
static int source_mismatch(const pack *p, const pack_region *r, const st_index *ix, const char *what, uint64_t got,
                           char *err, size_t errlen) {
    const uint64_t B = 1u << 20;
    uint8_t *a = base_alloc(B, MEM_IO), *b = base_alloc(B, MEM_IO);
    int fd = vfs_open(p->trunk_path, O_RDONLY | O_CLOEXEC, 0);
    int found = 0;
    for (int i = 0; i < r->n_tensors && !found && a && b && fd >= 0; i++) {
        const st_tensor *s = st_find(ix, r->t[i].name);
        for (uint64_t o = 0; s && o < s->nbytes && !found; o += B) {
            uint64_t n = s->nbytes - o < B ? s->nbytes - o : B, k = 0;
            char e2[256];
            if (st_read(ix, s, o, a, n, e2, sizeof e2) || vfs_pread_full(fd, b, n, r->off + r->t[i].off + o)) break;
            if (!memcmp(a, b, n)) continue;
            while (a[k] == b[k]) k++;
            base_fail(err, errlen, STRATA_ECORRUPT,
                      "%s: tensor %s differs from the pack at %s byte %llu (the tensor is bytes %llu..%llu there): the model "
                      "changed after packing; re-run strata pack",
                      what, s->name, st_shard_path(ix, s->shard), (unsigned long long)(s->off + o + k),
                      (unsigned long long)s->off, (unsigned long long)(s->off + s->nbytes));
            found = 1;
        }
    }
    if (fd >= 0) close(fd);
    base_free(a);
    base_free(b);
    if (!found)
        base_fail(err, errlen, STRATA_ECORRUPT,
                  "%s: the model's shards hash to %016llx, the pack to %016llx: the model changed after packing; re-run strata pack",
                  what, (unsigned long long)got, (unsigned long long)r->xxh3);
    return STRATA_ECORRUPT;
}

/* The trunk as the shards would pack now, region by region, against the manifest:
 * trunk.bin can be intact while the model under it changed (same sizes, same
 * headers, other tensor bytes), and then a run from the pack and one from the
 * shards would differ. */
static int verify_source(const pack *p, const cfg *c, const st_index *ix, pack_progress_fn progress, void *ud,
                         char *err, size_t errlen) {
    layout l;
    int rc = pack_layout_build(c, ix, &l, err, errlen);
    if (rc) return rc;
    uint64_t *h = base_calloc((size_t)(l.n_units + 1), sizeof *h, MEM_INDEX);
    pack_result res;
    memset(&res, 0, sizeof res);
    if (!h) rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    else rc = pack_write_trunk(&l, ix, NULL, 0, progress, ud, h, &res, err, errlen);
    for (int64_t i = 0; i < l.n_units + 1 && !rc; i++) {
        const pack_region *r = verify_reg(p, i);
        if (h[i] == r->xxh3) continue;
        char what[64];
        if (i == 0) snprintf(what, sizeof what, "embed");
        else if (i - 1 < p->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)(i - 1));
        else snprintf(what, sizeof what, "head");
        rc = source_mismatch(p, r, ix, what, h[i], err, errlen);
    }
    base_free(h);
    pack_layout_free(&l);
    return rc;
}

int pack_verify(const pack *p, const cfg *c, const st_index *ix, pack_progress_fn progress, void *ud,
                char *err, size_t errlen) {
    int rc = verify_trunk(p, progress, ud, err, errlen);
    if (!rc) rc = verify_source(p, c, ix, progress, ud, err, errlen);
    if (rc) return rc;
    uint64_t *xh = base_calloc((size_t)(p->n_moe * p->n_experts + 1), sizeof *xh, MEM_INDEX);
    if (!xh) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    rc = pack_hash_experts(c, ix, xh, p->expert_xxh3, 0, progress, ud, NULL, err, errlen);
    base_free(xh);
    return rc;
}
