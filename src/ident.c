/*
 * ident.c: the model identity (see ident.h).
 */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include "ident.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>
#include <xxhash.h>
#include "infer.h"
#include "jsonx.h"
#include "st.h"

#define IDENT_FORMAT "strata-identity"
#define IDENT_VERSION 1
/* Smaller models are hashed on every load (256 MiB: ~0.1 s from the page cache)
 * and leave no file behind; STRATA_IDENT_CACHE_MIN (bytes) overrides it (tests). */
#define IDENT_CACHE_MIN (256ull << 20)

static uint64_t cache_min(void) {
    const char *e = getenv("STRATA_IDENT_CACHE_MIN");
    int64_t v;
    return e && !base_parse_i64(e, 0, INT64_MAX, &v) ? (uint64_t)v : IDENT_CACHE_MIN;
}

void ident_cache_path(const char *model_dir, char *out, size_t n) {
    char real[4096];
    if (!realpath(model_dir, real)) snprintf(real, sizeof real, "%s", model_dir);
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[2048];
    if (xdg && *xdg) snprintf(base, sizeof base, "%s/strata/identity", xdg);
    else snprintf(base, sizeof base, "%s/.cache/strata/identity", home && *home ? home : "/tmp");
    snprintf(out, n, "%s/%016llx.json", base, (unsigned long long)XXH3_64bits(real, strlen(real)));
}

/* Config fingerprint and tensor table. */
static uint64_t table_hash(const cfg *c, const st_index *ix) {
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    uint64_t fp = infer_cfg_fingerprint(c);
    XXH3_64bits_update(&h, &fp, sizeof fp);
    for (size_t i = 0; i < st_count(ix); i++) {
        const st_tensor *t = st_at(ix, i);
        XXH3_64bits_update(&h, t->name, strlen(t->name) + 1);
        int64_t rec[4 + ST_MAX_DIMS] = {t->shard, t->dtype, t->ndim, (int64_t)t->nbytes};
        for (int d = 0; d < t->ndim && d < ST_MAX_DIMS; d++) rec[4 + d] = t->shape[d];
        XXH3_64bits_update(&h, rec, sizeof rec);
        XXH3_64bits_update(&h, &t->off, sizeof t->off);
    }
    return XXH3_64bits_digest(&h);
}

static const char *base_name(const char *p) {
    const char *b = strrchr(p, '/');
    return b ? b + 1 : p;
}

static int hex64(const char *h, uint64_t *out) {
    if (!h || strlen(h) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        int ch = h[i], d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* Every shard's stamp, as the cache records it (NULL if a shard cannot be stat'ed). */
static json_t *stamps(const st_index *ix) {
    json_t *a = json_array();
    for (int s = 0; a && s < st_n_shards(ix); s++) {
        struct stat sb;
        if (stat(st_shard_path(ix, s), &sb)) { json_decref(a); return NULL; }
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(base_name(st_shard_path(ix, s))));
        json_object_set_new(o, "size", json_integer((json_int_t)sb.st_size));
        json_object_set_new(o, "mtime_ns", json_integer((json_int_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec));
        json_object_set_new(o, "ino", json_integer((json_int_t)sb.st_ino));
        json_object_set_new(o, "dev", json_integer((json_int_t)sb.st_dev));
        json_array_append_new(a, o);
    }
    return a;
}

/* The cached content digest of the model, if the cache file matches the model as
 * it is now in every field (anything else: 0, recompute). */
static int cache_get(const char *path, const char *real, uint64_t table, const json_t *now, uint64_t *content) {
    if (!base_is_file(path)) return 0; /* absent, or not a regular file (a FIFO would block) */
    uint8_t *buf;
    size_t len;
    if (base_read_file(path, 1u << 20, &buf, &len, NULL, 0)) return 0;
    json_t *j = NULL;
    int ok = 0;
    if (!jsonx_parse(&j, buf, len, path, NULL, 0)) {
        const char *fmt = json_string_value(json_object_get(j, "format"));
        const char *model = json_string_value(json_object_get(j, "model"));
        int64_t ver;
        uint64_t t, d;
        ok = fmt && !strcmp(fmt, IDENT_FORMAT) && !jsonx_int(json_object_get(j, "version"), &ver) && ver == IDENT_VERSION &&
             model && !strcmp(model, real) && !hex64(json_string_value(json_object_get(j, "table")), &t) && t == table &&
             !hex64(json_string_value(json_object_get(j, "content")), &d) && json_equal(json_object_get(j, "shards"), now);
        if (ok) *content = d;
    }
    json_decref(j);
    base_free(buf);
    return ok;
}

/* Best effort: a cache that cannot be written costs the next run a rehash. */
static void cache_put(const char *path, const char *real, uint64_t table, json_t *now, uint64_t content) {
    char hex[2][20], dir[4200];
    snprintf(hex[0], sizeof hex[0], "%016llx", (unsigned long long)table);
    snprintf(hex[1], sizeof hex[1], "%016llx", (unsigned long long)content);
    snprintf(dir, sizeof dir, "%s", path);
    char *sl = strrchr(dir, '/');
    if (sl) *sl = 0;
    if (base_mkdir_p(dir, NULL, 0)) return;
    jsonx_build_begin();
    json_t *j = json_object();
    json_object_set_new(j, "format", json_string(IDENT_FORMAT));
    json_object_set_new(j, "version", json_integer(IDENT_VERSION));
    json_object_set_new(j, "model", json_string(real));
    json_object_set_new(j, "table", json_string(hex[0]));
    json_object_set_new(j, "content", json_string(hex[1]));
    json_object_set(j, "shards", now);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s && !jsonx_build_failed()) base_write_file_atomic(path, s, strlen(s), NULL, 0);
    json_malloc_t jm;
    json_free_t jf;
    json_get_alloc_funcs(&jm, &jf);
    if (s) jf(s);
}

int ident_model(const char *model_dir, const cfg *c, const st_index *ix, const pack *pk, const ident_opts *o,
                ident_result *res, char *err, size_t errlen) {
    static const ident_opts k_none;
    if (!o) o = &k_none;
    memset(res, 0, sizeof *res);
    double t0 = base_now();
    res->table = table_hash(c, ix);
    char path[4200], real[4096];
    if (!realpath(model_dir, real)) snprintf(real, sizeof real, "%s", model_dir);
    ident_cache_path(model_dir, path, sizeof path);
    jsonx_build_begin();
    json_t *now = stamps(ix);
    if (now && jsonx_build_failed()) { json_decref(now); now = NULL; }
    uint64_t cached = 0, total = 0;
    for (int s = 0; s < st_n_shards(ix); s++) total += st_shard_size(ix, s);
    const int use_cache = total >= cache_min();
    const int have_cache = use_cache && now && cache_get(path, real, res->table, now, &cached);
    int rc = STRATA_OK;
    if (pk && !pack_content_digest(pk, &res->content)) {
        res->source = IDENT_FROM_PACK;
        if (have_cache && cached != res->content)
            rc = base_fail(err, errlen, STRATA_EINVAL,
                           "%s is not this model's pack: its record hashes give content %016llx, the shards of %s hashed to "
                           "%016llx (cached in %s with their current size, mtime and inode); re-run strata pack --force",
                           pk->dir, (unsigned long long)res->content, model_dir, (unsigned long long)cached, path);
    } else if (have_cache) {
        res->source = IDENT_FROM_CACHE;
        res->content = cached;
    } else {
        res->source = IDENT_HASHED;
        res->bytes_hashed = total;
        rc = pack_content_digest_shards(c, ix, o->flags, o->progress, o->ud, &res->content, err, errlen);
        /* stamps taken before the reads: a shard written meanwhile leaves a stale entry, never a wrong one */
        if (!rc && now && use_cache) cache_put(path, real, res->table, now, res->content);
    }
    json_decref(now);
    if (rc) return rc;
    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    XXH3_64bits_update(&h, &res->table, sizeof res->table);
    XXH3_64bits_update(&h, &res->content, sizeof res->content);
    res->id = XXH3_64bits_digest(&h);
    if (!res->id) res->id = 1;
    res->secs = base_now() - t0;
    return STRATA_OK;
}
