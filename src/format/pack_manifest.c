/*
 * pack_manifest.c: a pack's identity and its manifest: the model id and the
 * source stamps, finding a model's pack (in place or through the pointer under
 * $XDG_CACHE_HOME), the manifest's JSON records, and pack_open / pack_close,
 * which read a manifest back and check it against the model.
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

/* ================================================================== identity */

static int hash_file(XXH3_state_t *st, const char *path, int required, char *err, size_t errlen) {
    uint8_t *buf;
    size_t len;
    if (!base_is_file(path)) {
        if (required) return base_fail(err, errlen, STRATA_EIO, "%s: missing", path);
        return STRATA_OK;
    }
    int rc = base_read_file(path, 1u << 30, &buf, &len, err, errlen);
    if (rc) return rc;
    XXH3_64bits_update(st, buf, len);
    base_free(buf);
    return STRATA_OK;
}

int pack_model_id(const char *model_dir, const st_index *ix, uint64_t *id, char *err, size_t errlen) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    int rc = hash_file(&st, path, 1, err, errlen);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", model_dir);
    if ((rc = hash_file(&st, path, 0, err, errlen))) return rc;
    for (int s = 0; s < st_n_shards(ix); s++) {
        const char *sp = st_shard_path(ix, s);
        const char *base = strrchr(sp, '/');
        base = base ? base + 1 : sp;
        uint64_t size = st_shard_size(ix, s);
        XXH3_64bits_update(&st, base, strlen(base) + 1);
        XXH3_64bits_update(&st, &size, sizeof size);
        int fd = st_shard_fd(ix, s);
        uint8_t len8[8];
        int e = vfs_pread_full(fd, len8, 8, 0);
        if (e) return base_fail(err, errlen, STRATA_EIO, "%s: cannot read the header: %s", sp, e > 0 ? strerror(e) : "end of file");
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
        if (n > ST_MAX_HEADER || n + 8 > size) return base_fail(err, errlen, STRATA_EFORMAT, "%s: bad header length", sp);
        uint8_t *h = base_alloc(n + 8, MEM_IO);
        if (!h) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        if ((e = vfs_pread_full(fd, h, n + 8, 0))) {
            base_free(h);
            return base_fail(err, errlen, STRATA_EIO, "%s: cannot read the header: %s", sp, e > 0 ? strerror(e) : "end of file");
        }
        XXH3_64bits_update(&st, h, n + 8);
        base_free(h);
    }
    *id = XXH3_64bits_digest(&st);
    return STRATA_OK;
}

/* The manifest's hashes are exactly 16 hex digits (as written): anything else,
 * which strtoull read as 0 or as a prefix, is a malformed manifest. */
static int hex64(const char *h, uint64_t *out) {
    if (!h || strlen(h) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int c = h[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* Size and modification time of every shard: the part of the pack's identity that
 * covers tensor data at the cost of a stat (the model id covers only the
 * headers). Hashing the data on every run would read the whole model. */
json_t *pack_stamps_json(const st_index *ix, char *err, size_t errlen) {
    json_t *a = json_array();
    for (int s = 0; s < st_n_shards(ix); s++) {
        struct stat sb;
        if (stat(st_shard_path(ix, s), &sb)) {
            base_fail(err, errlen, STRATA_EIO, "%s: %s", st_shard_path(ix, s), strerror(errno));
            json_decref(a);
            return NULL;
        }
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(base_name(st_shard_path(ix, s))));
        json_object_set_new(o, "size", json_integer((json_int_t)sb.st_size));
        json_object_set_new(o, "mtime_ns", json_integer((json_int_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec));
        json_array_append_new(a, o);
    }
    return a;
}

/* 0: every shard has the size and modification time recorded at packing; 1: stale,
 * why says which shard changed and how. */
int pack_stamps_stale(const json_t *rec, const st_index *ix, char *why, size_t n) {
    if (!json_is_array(rec) || (int)json_array_size(rec) != st_n_shards(ix)) {
        snprintf(why, n, "the manifest does not list the model's %d shards", st_n_shards(ix));
        return 1;
    }
    for (int s = 0; s < st_n_shards(ix); s++) {
        const json_t *o = json_array_get(rec, (size_t)s);
        const char *name = json_string_value(json_object_get(o, "name"));
        int64_t size, mt;
        struct stat sb;
        const char *path = st_shard_path(ix, s);
        if (!name || strcmp(name, base_name(path)) || jsonx_int(json_object_get(o, "size"), &size) ||
            jsonx_int(json_object_get(o, "mtime_ns"), &mt)) {
            snprintf(why, n, "the manifest's shard %d is not %s", s, base_name(path));
            return 1;
        }
        if (stat(path, &sb)) { snprintf(why, n, "%s: %s", path, strerror(errno)); return 1; }
        int64_t now = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
        if ((int64_t)sb.st_size != size) {
            snprintf(why, n, "%s changed size after packing (%lld bytes, packed %lld)", path, (long long)sb.st_size, (long long)size);
            return 1;
        }
        if (now != mt) {
            snprintf(why, n, "%s was modified after packing (mtime %+.3f s from the packed one)", path, (double)(now - mt) / 1e9);
            return 1;
        }
    }
    return 0;
}

/* ============================================================ finding a pack */

void pack_pointer_path(const char *model_dir, char *out, size_t n) {
    char real[4096];
    if (!realpath(model_dir, real)) snprintf(real, sizeof real, "%s", model_dir);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[2048];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/strata/packs", xdg);
    else snprintf(base, sizeof base, "%s/.cache/strata/packs", home && *home ? home : "/tmp");
    snprintf(out, n, "%s/%016llx", base, (unsigned long long)XXH3_64bits(real, strlen(real)));
}

int pack_find_ex(const char *model_dir, char *out, size_t n, char *why, size_t whylen) {
    char path[4200], dir[4096];
    struct stat sb;
    if (why && whylen) why[0] = 0;
    snprintf(dir, sizeof dir, "%s/%s", model_dir, PACK_DIRNAME);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (base_is_file(path)) {
        snprintf(out, n, "%s", dir);
        return 1;
    }
    /* the model's own pack directory without a usable manifest: an interrupted
     * `strata pack` (the manifest is written last), a removed manifest, or a
     * directory this user cannot read. Never silently the unverified shards. */
    if (!lstat(dir, &sb)) {
        int e = stat(path, &sb) ? errno : 0;
        if (why && whylen)
            snprintf(why, whylen, "%s %s (%s); run strata pack", dir,
                     e == ENOENT ? "holds no manifest.json" : e ? "is unreadable" : "holds a manifest.json that is not a regular file",
                     e == ENOENT ? "an interrupted or removed pack" : e ? strerror(e) : "refused");
        return -1;
    }
    char ptr[4096];
    pack_pointer_path(model_dir, ptr, sizeof ptr);
    if (!base_is_file(ptr)) return 0; /* no pointer (or not a regular file: never opened, a FIFO would block) */
    uint8_t *buf;
    size_t len;
    char e2[512];
    if (base_read_file(ptr, 4096, &buf, &len, e2, sizeof e2)) {
        if (why && whylen) snprintf(why, whylen, "the pack pointer %s is unreadable: %s", ptr, e2);
        return -1;
    }
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) buf[--len] = 0;
    snprintf(path, sizeof path, "%s/manifest.json", (char *)buf);
    int ok = base_is_file(path);
    if (ok) snprintf(out, n, "%s", (char *)buf);
    else if (why && whylen)
        snprintf(why, whylen, "the pack pointer %s names %s, which holds no readable manifest.json (%s); run strata pack again "
                 "or remove the pointer", ptr, (char *)buf, stat(path, &sb) ? strerror(errno) : "not a regular file");
    base_free(buf);
    return ok ? 1 : -1;
}

int pack_find(const char *model_dir, char *out, size_t n) { return pack_find_ex(model_dir, out, n, NULL, 0) == 1; }

/* ================================================================== manifest */

json_t *pack_region_json(const lregion *r, uint64_t h) {
    json_t *o = json_object(), *ts = json_array();
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    json_object_set_new(o, "off", json_integer((json_int_t)r->off));
    json_object_set_new(o, "nbytes", json_integer((json_int_t)r->nbytes));
    json_object_set_new(o, "xxh3", json_string(hex));
    for (int i = 0; i < r->n; i++) {
        const st_tensor *s = r->t[i].src;
        json_t *t = json_object(), *sh = json_array();
        json_object_set_new(t, "name", json_string(s->name));
        json_object_set_new(t, "role", json_integer(r->t[i].role));
        json_object_set_new(t, "dtype", json_string(st_dtype_name(s->dtype)));
        for (int d = 0; d < s->ndim; d++) json_array_append_new(sh, json_integer(s->shape[d]));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "off", json_integer((json_int_t)r->t[i].off));
        json_object_set_new(t, "nbytes", json_integer((json_int_t)s->nbytes));
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)r->t[i].xxh3);
        json_object_set_new(t, "xxh3", json_string(hex));
        if (r->t[i].n_blk) {
            json_t *b = json_array();
            for (int64_t k = 0; k < r->t[i].n_blk; k++) {
                snprintf(hex, sizeof hex, "%016llx", (unsigned long long)r->t[i].blk[k]);
                json_array_append_new(b, json_string(hex));
            }
            json_object_set_new(t, "block_rows", json_integer(r->t[i].blk_rows));
            json_object_set_new(t, "blocks", b);
        }
        json_array_append_new(ts, t);
    }
    json_object_set_new(o, "tensors", ts);
    return o;
}

/* A manifest written before row-block checksums: some layer or head matrix
 * large enough for blocks (pack_block_rows) has none. Such a pack still runs,
 * verified as each unit lands, at a higher cost; plain `pack` rewrites it. */
int pack_lacks_blocks(json_t *j) {
    json_t *units = json_object_get(j, "units");
    for (size_t u = 0; u < json_array_size(units); u++) {
        json_t *ts = json_object_get(json_array_get(units, u), "tensors");
        for (size_t i = 0; i < json_array_size(ts); i++) {
            json_t *t = json_array_get(ts, i), *sh = json_object_get(t, "shape");
            int64_t nb, rows;
            if (json_object_get(t, "blocks") || json_array_size(sh) != 2 || jsonx_int(json_object_get(t, "nbytes"), &nb) ||
                jsonx_int(json_array_get(sh, 0), &rows) || nb < 0)
                continue;
            if (pack_block_rows(2, rows, (uint64_t)nb, PACK_BLOCK_BYTES)) return 1;
        }
    }
    return 0;
}

/* Reads dir/manifest.json: the format, the model id and the version (checked by
 * the callers: pack_open refuses another version, pack_build replaces it). */
int pack_load_manifest(const char *dir, json_t **out, uint64_t *id, int64_t *version, char *err, size_t errlen) {
    char path[2048];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    uint8_t *buf;
    size_t len;
    int rc = base_read_file(path, 1u << 30, &buf, &len, err, errlen);
    if (rc) return rc;
    json_t *j;
    rc = jsonx_parse(&j, buf, len, path, err, errlen);
    base_free(buf);
    if (rc) return rc;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    const char *mid = json_string_value(json_object_get(j, "model_id"));
    if (!fmt || strcmp(fmt, "strata-pack") || !mid) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: not a strata pack manifest", path);
    }
    if (hex64(mid, id) || jsonx_int(json_object_get(j, "version"), version)) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: model_id must be 16 hex digits and version an integer", path);
    }
    *out = j;
    return STRATA_OK;
}

/* ====================================================================== open */

static int parse_region(json_t *o, pack_region *r, uint64_t trunk_bytes, const st_index *ix, const char *mpath,
                        const char *what, char *err, size_t errlen) {
    int64_t off, nb;
    json_t *ts = json_object_get(o, "tensors");
    const char *hx = json_string_value(json_object_get(o, "xxh3"));
    if (!o || jsonx_int(json_object_get(o, "off"), &off) || jsonx_int(json_object_get(o, "nbytes"), &nb) || !hx ||
        !json_is_array(ts) || off < 0 || nb < 0 || (uint64_t)off % PACK_ALIGN || (uint64_t)nb % PACK_ALIGN ||
        (uint64_t)(off + nb) > trunk_bytes)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: bad region (off, nbytes, xxh3 or tensors missing or out of "
                         "the %llu-byte trunk)", mpath, what, (unsigned long long)trunk_bytes);
    r->off = (uint64_t)off;
    r->nbytes = (uint64_t)nb;
    if (hex64(hx, &r->xxh3))
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: xxh3 \"%.40s\" is not 16 hex digits", mpath, what, hx);
    r->n_tensors = (int32_t)json_array_size(ts);
    r->t = base_calloc((size_t)r->n_tensors + 1, sizeof *r->t, MEM_INDEX);
    if (!r->t) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
    for (int i = 0; i < r->n_tensors; i++) {
        json_t *t = json_array_get(ts, (size_t)i);
        const char *name = json_string_value(json_object_get(t, "name"));
        int64_t role, toff, tnb;
        const st_tensor *s = name ? st_find(ix, name) : NULL;
        if (!s || jsonx_int(json_object_get(t, "role"), &role) || jsonx_int(json_object_get(t, "off"), &toff) ||
            jsonx_int(json_object_get(t, "nbytes"), &tnb) || role < 0 || role >= R_COUNT || toff < 0 ||
            (uint64_t)tnb != s->nbytes || (uint64_t)(toff + tnb) > r->nbytes || s->ndim > 4)
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %d (%s) does not match the model", mpath, what, i,
                             name ? name : "?");
        pack_tensor *pt = &r->t[i];
        pt->name = s->name;
        pt->role = (int32_t)role;
        pt->dtype = s->dtype;
        pt->ndim = s->ndim;
        for (int d = 0; d < s->ndim; d++) pt->shape[d] = s->shape[d];
        pt->off = (uint64_t)toff;
        pt->nbytes = (uint64_t)tnb;
        /* optional (packs before it lack it): the tensor's own XXH3, for slices */
        const char *th = json_string_value(json_object_get(t, "xxh3"));
        if (th && hex64(th, &pt->xxh3))
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %s: xxh3 \"%.40s\" is not 16 hex digits", mpath, what,
                             name, th);
        pt->has_xxh3 = th != NULL;
        /* optional too: the hashes of its row blocks */
        json_t *bl = json_object_get(t, "blocks"), *br = json_object_get(t, "block_rows");
        if (!bl && !br) continue;
        int64_t rows_b;
        if (!json_is_array(bl) || jsonx_int(br, &rows_b) || rows_b < 1 || s->ndim != 2 || s->shape[0] < 1 ||
            s->nbytes % (uint64_t)s->shape[0] || (int64_t)json_array_size(bl) != (s->shape[0] + rows_b - 1) / rows_b)
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %s: bad blocks (block_rows and one hash per block "
                             "of a 2-D tensor expected)", mpath, what, name);
        pt->blk_rows = rows_b;
        pt->n_blk = (int64_t)json_array_size(bl);
        if (!(pt->blk = base_alloc((size_t)pt->n_blk * sizeof *pt->blk, MEM_INDEX))) return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory");
        for (int64_t k = 0; k < pt->n_blk; k++) {
            const char *bh = json_string_value(json_array_get(bl, (size_t)k));
            if (!bh || hex64(bh, &pt->blk[k]))
                return base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: tensor %s: blocks[%lld] is not 16 hex digits", mpath, what,
                                 name, (long long)k);
        }
    }
    return STRATA_OK;
}

static void region_free(pack_region *r) {
    for (int i = 0; r->t && i < r->n_tensors; i++) base_free(r->t[i].blk);
    base_free(r->t);
}

void pack_close(pack *p) {
    if (!p) return;
    region_free(&p->embed);
    if (p->units)
        for (int64_t u = 0; u <= p->n_layers; u++) region_free(&p->units[u]);
    base_free(p->units);
    base_free(p->expert_xxh3);
    base_free(p);
}

/* The manifest's regions and tensors must sit exactly where the model's layout
 * puts them (pack_layout_build is deterministic): an edited offset would otherwise pass
 * the bounds checks and serve another tensor's bytes under this one's name. */
static int check_layout(const pack *p, const cfg *c, const st_index *ix, const char *mpath, char *err, size_t errlen) {
    layout l;
    int rc = pack_layout_build(c, ix, &l, err, errlen);
    if (rc) return rc;
    if (l.total != p->trunk_bytes)
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: trunk_bytes %llu, the model's layout needs %llu; re-run strata pack --force",
                       mpath, (unsigned long long)p->trunk_bytes, (unsigned long long)l.total);
    for (int64_t u = -1; u < l.n_units && !rc; u++) {
        const lregion *lr = u < 0 ? &l.embed : &l.units[u];
        const pack_region *r = u < 0 ? &p->embed : &p->units[u];
        char what[64];
        if (u < 0) snprintf(what, sizeof what, "embed");
        else if (u < c->n_layers) snprintf(what, sizeof what, "layer %lld", (long long)u);
        else snprintf(what, sizeof what, "head");
        if (r->off != lr->off || r->nbytes != lr->nbytes) {
            rc = base_fail(err, errlen, STRATA_EFORMAT,
                           "%s: %s: region at bytes %llu..%llu, the model's layout puts it at %llu..%llu (edited or "
                           "corrupt manifest); re-run strata pack --force",
                           mpath, what, (unsigned long long)r->off, (unsigned long long)(r->off + r->nbytes),
                           (unsigned long long)lr->off, (unsigned long long)(lr->off + lr->nbytes));
            break;
        }
        if (r->n_tensors != lr->n) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: %s: %d tensors, the model's layout has %d; re-run strata pack --force",
                           mpath, what, r->n_tensors, lr->n);
            break;
        }
        for (int i = 0; i < lr->n && !rc; i++)
            if (strcmp(r->t[i].name, lr->t[i].src->name) || r->t[i].off != lr->t[i].off)
                rc = base_fail(err, errlen, STRATA_EFORMAT,
                               "%s: %s: tensor %d (%s) at region offset %llu, the model's layout puts %s at %llu (edited or "
                               "corrupt manifest); re-run strata pack --force",
                               mpath, what, i, r->t[i].name, (unsigned long long)r->t[i].off, lr->t[i].src->name,
                               (unsigned long long)lr->t[i].off);
    }
    pack_layout_free(&l);
    return rc;
}

int pack_open(pack **out, const char *pack_dir, const char *model_dir, const cfg *c, const st_index *ix,
              char *err, size_t errlen) {
    return pack_open_ex(out, pack_dir, model_dir, c, ix, 0, err, errlen);
}

int pack_open_ex(pack **out, const char *pack_dir, const char *model_dir, const cfg *c, const st_index *ix, int flags,
                 char *err, size_t errlen) {
    *out = NULL;
    json_t *j = NULL;
    uint64_t mid;
    int64_t ver;
    char mpath[1100];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", pack_dir);
    int rc = pack_load_manifest(pack_dir, &j, &mid, &ver, err, errlen);
    if (rc) return rc;
    if (ver != PACK_VERSION) {
        json_decref(j);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: manifest version %lld is not supported (this strata reads version %d); "
                         "re-run strata pack", mpath, (long long)ver, PACK_VERSION);
    }
    pack *p = base_calloc(1, sizeof *p, MEM_INDEX);
    if (!p) { json_decref(j); return base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); }
    snprintf(p->dir, sizeof p->dir, "%s", pack_dir);
    snprintf(p->trunk_path, sizeof p->trunk_path, "%s/trunk.bin", pack_dir);
    p->model_id = mid;
    if (model_dir) {
        uint64_t id;
        if ((rc = pack_model_id(model_dir, ix, &id, err, errlen))) goto fail;
        if (id != mid) {
            rc = base_fail(err, errlen, STRATA_EINVAL,
                           "%s is the pack of another model (id %016llx; %s is %016llx): re-run strata pack", pack_dir,
                           (unsigned long long)mid, model_dir, (unsigned long long)id);
            goto fail;
        }
        /* the shards' data may have changed under unchanged headers */
        if (pack_stamps_stale(json_object_get(j, "shards"), ix, p->stale, sizeof p->stale) && !(flags & PACK_OPEN_STALE_OK)) {
            rc = base_fail(err, errlen, STRATA_EINVAL, "%s is stale: %s; re-run strata pack (it rebuilds a stale pack)",
                           pack_dir, p->stale);
            goto fail;
        }
    }
    int64_t nl, tb, align;
    if (jsonx_int(json_object_get(j, "n_layers"), &nl) || jsonx_int(json_object_get(j, "trunk_bytes"), &tb) ||
        jsonx_int(json_object_get(j, "align"), &align) || nl != c->n_layers || align != PACK_ALIGN || tb < 0) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: n_layers/align/trunk_bytes do not match the model", pack_dir);
        goto fail;
    }
    p->n_layers = nl;
    p->trunk_bytes = (uint64_t)tb;
    struct stat sb;
    if (stat(p->trunk_path, &sb) || (uint64_t)sb.st_size != p->trunk_bytes) {
        rc = base_fail(err, errlen, STRATA_ECORRUPT, "%s: %s (manifest says %llu bytes): truncated or missing; re-run strata pack",
                       p->trunk_path, stat(p->trunk_path, &sb) ? "missing" : "wrong size", (unsigned long long)p->trunk_bytes);
        goto fail;
    }
    if ((rc = parse_region(json_object_get(j, "embed"), &p->embed, p->trunk_bytes, ix, mpath, "embed", err, errlen))) goto fail;
    json_t *units = json_object_get(j, "units");
    if (!json_is_array(units) || (int64_t)json_array_size(units) != nl + 1) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: units must have n_layers + 1 entries", pack_dir);
        goto fail;
    }
    p->units = base_calloc((size_t)nl + 1, sizeof *p->units, MEM_INDEX);
    if (!p->units) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto fail; }
    for (int64_t u = 0; u <= nl; u++) {
        char what[64];
        if (u < nl) snprintf(what, sizeof what, "layer %lld", (long long)u); else snprintf(what, sizeof what, "head");
        if ((rc = parse_region(json_array_get(units, (size_t)u), &p->units[u], p->trunk_bytes, ix, mpath, what, err, errlen))) goto fail;
    }
    if ((rc = check_layout(p, c, ix, mpath, err, errlen))) goto fail;
    json_t *ex = json_object_get(j, "experts"), *xa = json_object_get(ex, "xxh3");
    int64_t n_moe, ne;
    p->n_moe = c->n_layers > c->first_dense ? c->n_layers - c->first_dense : 0;
    p->n_experts = c->n_experts;
    if (jsonx_int(json_object_get(ex, "n_layers_moe"), &n_moe) || jsonx_int(json_object_get(ex, "n_experts"), &ne) ||
        n_moe != p->n_moe || ne != p->n_experts || !json_is_array(xa) || (int64_t)json_array_size(xa) != n_moe * ne) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s/manifest.json: experts do not match the model", pack_dir);
        goto fail;
    }
    p->expert_xxh3 = base_alloc((size_t)(n_moe * ne + 1) * sizeof *p->expert_xxh3, MEM_INDEX);
    if (!p->expert_xxh3) { rc = base_fail(err, errlen, STRATA_ENOMEM, "pack: out of memory"); goto fail; }
    for (int64_t i = 0; i < n_moe * ne; i++) {
        const char *h = json_string_value(json_array_get(xa, (size_t)i));
        if (hex64(h, &p->expert_xxh3[i])) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: experts.xxh3[%lld] (layer %lld expert %lld) is not 16 hex digits", mpath,
                           (long long)i, (long long)(c->first_dense + i / ne), (long long)(i % ne));
            goto fail;
        }
    }
    json_decref(j);
    *out = p;
    return STRATA_OK;
fail:
    json_decref(j);
    pack_close(p);
    return rc;
}
