/*
 * st.c: safetensors shards indexed from their headers (see st.h).
 *
 * Owns: the shard table (path, read-only fd, size), one st_tensor per tensor in
 * shard order then data-offset order, the tensor names (an append-only arena, so
 * name pointers never move), and an open-addressing hash name -> tensor.
 * Never reads tensor data while indexing: 8 bytes, then the header, per shard.
 * Does not interpret tensor bytes; binding names to roles is model.c's job.
 * The JSON itself (the strict cursor, model.safetensors.index.json) is read in
 * st_json.c; here the header's meaning: entries, sizes, offsets, overlaps, names.
 *
 * Invariant after a successful st_parse_header: every tensor's bytes lie inside
 * its shard file, no two non-empty tensors of one shard overlap, and every name is
 * unique across the whole index. On failure the index is left as it was before
 * the call (the arena may hold a few unreachable names).
 */
#include "st.h"
#include "jcur.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "base.h"
#include "vfs.h"

/* ===== dtypes ===== */

static const struct { const char *name; size_t size; } k_dtypes[DT_COUNT] = {
    [DT_F32] = {"F32", 4},  [DT_F16] = {"F16", 2}, [DT_BF16] = {"BF16", 2},
    [DT_U8] = {"U8", 1},    [DT_I8] = {"I8", 1},   [DT_I32] = {"I32", 4},
    [DT_I64] = {"I64", 8},  [DT_F8_E4M3] = {"F8_E4M3", 1},
};

size_t st_dtype_size(int dtype) {
    return dtype >= 0 && dtype < DT_COUNT ? k_dtypes[dtype].size : 0;
}

const char *st_dtype_name(int dtype) {
    return dtype >= 0 && dtype < DT_COUNT ? k_dtypes[dtype].name : "?";
}

int st_dtype_parse(const char *s) {
    for (int i = 0; i < DT_COUNT; i++)
        if (!strcmp(s, k_dtypes[i].name)) return i;
    return -1;
}

/* ===== types ===== */

/* Names live in chunks that are never reallocated, so st_tensor.name stays valid
 * while the tensor array grows. 497,220 K3 names average ~75 bytes: ~37 MB. */
typedef struct name_chunk {
    struct name_chunk *next;
    size_t used, cap;
    char data[];
} name_chunk;

/* idx1 = tensor index + 1 (0 = empty slot); tag = high hash bits, compared before
 * the string so a probe rarely touches the name. */
typedef struct { uint32_t idx1, tag; } st_slot;

typedef struct {
    char *path;      /* MEM_INDEX */
    int fd;          /* O_RDONLY, owned; -1 until opened */
    uint64_t size;   /* bytes, from fstat at open */
} st_shard;

struct st_index {
    st_tensor *t;       /* (n) shard order, then data offset */
    size_t n, cap;
    st_slot *slots;     /* (n_slots) power of two, load <= 1/2 */
    size_t n_slots;
    name_chunk *names;
    st_shard *shards;   /* (n_shards) */
    int n_shards;
};

/* ===== small helpers ===== */

static char *arena_put(name_chunk **head, const char *s, size_t len) {
    name_chunk *c = *head;
    if (!c || c->cap - c->used < len + 1) {
        /* Chunks double from 4 KiB to 1 MiB: small checkpoints (and the fuzzer,
         * where a fixed 1 MiB chunk cost 20x in exec/s under ASan) stay small. */
        size_t cap = c ? (c->cap < (1u << 20) ? c->cap * 2 : c->cap) : 4096;
        if (cap < len + 1) cap = len + 1;
        c = base_alloc(sizeof *c + cap, MEM_INDEX);
        if (!c) return NULL;
        c->next = *head;
        c->used = 0;
        c->cap = cap;
        *head = c;
    }
    char *p = c->data + c->used;
    memcpy(p, s, len);
    p[len] = 0;
    c->used += len + 1;
    return p;
}

static void arena_free(name_chunk *c) {
    while (c) {
        name_chunk *next = c->next;
        base_free(c);
        c = next;
    }
}

static uint64_t name_hash(const char *s, size_t len) { return XXH3_64bits(s, len); }

/* Slot of `name` or of the empty slot where it would go. */
static size_t hash_probe(const st_index *ix, const char *name, size_t len, uint64_t h) {
    size_t mask = ix->n_slots - 1, i = (size_t)h & mask;
    uint32_t tag = (uint32_t)(h >> 32);
    for (;;) {
        const st_slot *s = &ix->slots[i];
        if (!s->idx1) return i;
        if (s->tag == tag) {
            const char *nm = ix->t[s->idx1 - 1].name;
            if (!strncmp(nm, name, len) && nm[len] == 0) return i;
        }
        i = (i + 1) & mask;
    }
}

/* Grows the table so that `want` entries keep the load at or below 1/2. */
static int hash_reserve(st_index *ix, size_t want) {
    if (want <= ix->n_slots / 2) return 0;
    if (want > UINT32_MAX - 1) return -1;
    size_t n = ix->n_slots ? ix->n_slots : 64;
    while (n / 2 < want) n *= 2;
    st_slot *s = base_calloc(n, sizeof *s, MEM_INDEX);
    if (!s) return -1;
    st_slot *old = ix->slots;
    size_t n_old = ix->n_slots;
    ix->slots = s;
    ix->n_slots = n;
    for (size_t i = 0; i < n_old; i++) {
        if (!old[i].idx1) continue;
        const char *nm = ix->t[old[i].idx1 - 1].name;
        size_t len = strlen(nm);
        size_t j = hash_probe(ix, nm, len, name_hash(nm, len));
        ix->slots[j] = old[i];
    }
    base_free(old);
    return 0;
}

static int tensors_reserve(st_index *ix, size_t want) {
    if (want <= ix->cap) return 0;
    size_t cap = ix->cap ? ix->cap : 16;
    while (cap < want) cap *= 2;
    st_tensor *t = base_realloc(ix->t, cap * sizeof *t, MEM_INDEX);
    if (!t) return -1;
    ix->t = t;
    ix->cap = cap;
    return 0;
}

/* "[64, 64]" into buf (truncated if needed). */
static const char *fmt_shape(const st_tensor *t, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int d = 0; d < t->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", t->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* ===== header parsing ===== */

/* Validates the 8-byte length prefix against the limit and the file size. */
static int header_len(const uint8_t *buf, size_t len, uint64_t file_size, const char *what,
                      uint64_t *out, char *err, size_t errlen) {
    if (file_size < 8 || len < 8)
        return base_fail(err, errlen, STRATA_EFORMAT,
                         "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length",
                         what, file_size < len ? file_size : (uint64_t)len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
    if (n > file_size - 8)
        return base_fail(err, errlen, STRATA_EFORMAT,
                         "%s: header length %" PRIu64 " but the file is only %" PRIu64 " bytes",
                         what, n, file_size);
    if (n > ST_MAX_HEADER)
        return base_fail(err, errlen, STRATA_EFORMAT,
                         "%s: header length %" PRIu64 " exceeds the %u-byte limit", what, n,
                         (unsigned)ST_MAX_HEADER);
    *out = n;
    return STRATA_OK;
}

/* Reads `[a, b, ...]` of at most max non-negative integers into v; *n = count.
 * field names the array in messages ("shape", "data_offsets"). */
static int jc_uints(jcur *c, const char *name, const char *field, size_t max, uint64_t *v, size_t *n) {
    *n = 0;
    jcur_ws(c);
    if (!jcur_eat(c, '['))
        return base_fail(c->err, c->errlen, STRATA_EFORMAT, "%s: tensor '%s': %s is not an array",
                         c->what, name, field);
    if (jcur_eat(c, ']')) return 0;
    do {
        int64_t x = 0;
        int kind, rc;
        jcur_ws(c);
        if (*n == max)
            return base_fail(c->err, c->errlen, STRATA_EFORMAT, "%s: tensor '%s': %s has more than %zu %s",
                             c->what, name, field, max, max == 2 ? "values" : "dims");
        if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
            if ((rc = jcur_num(c, &x, &kind, name))) return rc;
        } else {
            kind = JN_REAL; /* a string, bool, null, array or object: not an integer */
        }
        if (kind != JN_INT || x < 0)
            return base_fail(c->err, c->errlen, STRATA_EFORMAT, "%s: tensor '%s': %s[%zu] is %s", c->what,
                             name, field, *n, kind == JN_RANGE ? "out of range"
                             : kind == JN_REAL ? "not an integer" : "negative");
        v[(*n)++] = (uint64_t)x;
    } while (jcur_eat(c, ','));
    return jcur_eat(c, ']') ? 0 : jcur_syntax(c, name, "expected ',' or ']'");
}

/* Parses one tensor entry `{"dtype":..,"shape":..,"data_offsets":..}` into *t.
 * data_start = 8 + N, the file offset that data_offsets are relative to. */
static int parse_entry(jcur *c, const char *name, uint64_t data_start, uint64_t file_size,
                       st_tensor *t, jstr *val) {
#define BAD(...) do { char m_[512]; snprintf(m_, sizeof m_, __VA_ARGS__); \
    return base_fail(c->err, c->errlen, STRATA_EFORMAT, "%s: tensor '%s': %s", c->what, name, m_); } while (0)
    enum { F_DTYPE = 1, F_SHAPE = 2, F_OFFS = 4 };
    int seen = 0, rc, dt = -1;
    uint64_t shape[ST_MAX_DIMS], offs[2];
    size_t nd = 0, no = 0;
    if (!jcur_eat(c, '{')) BAD("entry is not a JSON object");
    if (!jcur_eat(c, '}')) {
        do {
            if ((rc = jcur_str(c, val, name))) return rc;
            if (!jcur_eat(c, ':')) return jcur_syntax(c, name, "expected ':'");
            int f = !strcmp(val->s, "dtype") ? F_DTYPE : !strcmp(val->s, "shape") ? F_SHAPE
                    : !strcmp(val->s, "data_offsets") ? F_OFFS : 0;
            if (!f || strlen(val->s) != val->len)
                BAD("unknown key '%s' (expected dtype, shape, data_offsets)", val->s);
            if (seen & f) BAD("duplicate key '%s'", val->s);
            seen |= f;
            if (f == F_DTYPE) {
                jcur_ws(c);
                if (c->p >= c->end || *c->p != '"') BAD("dtype is not a string");
                if ((rc = jcur_str(c, val, name))) return rc;
                dt = strlen(val->s) == val->len ? st_dtype_parse(val->s) : -1;
                if (dt < 0) BAD("unknown dtype '%s'", val->s);
            } else if (f == F_SHAPE) {
                if ((rc = jc_uints(c, name, "shape", ST_MAX_DIMS, shape, &nd))) return rc;
            } else {
                if ((rc = jc_uints(c, name, "data_offsets", 2, offs, &no))) return rc;
            }
        } while (jcur_eat(c, ','));
        if (!jcur_eat(c, '}')) return jcur_syntax(c, name, "expected ',' or '}'");
    }
    if (!(seen & F_DTYPE)) BAD("missing \"dtype\"");
    if (!(seen & F_SHAPE)) BAD("missing \"shape\"");
    if (!(seen & F_OFFS)) BAD("missing \"data_offsets\"");
    if (no != 2) BAD("data_offsets is not an array of two integers");
    t->dtype = dt;
    t->ndim = (int32_t)nd;
    /* Any zero dim makes the tensor empty whatever the other dims are, so the
     * product only overflows when every dim is non-zero. */
    int has_zero = 0, overflow = 0;
    for (size_t d = 0; d < nd; d++) {
        t->shape[d] = (int64_t)shape[d];
        has_zero |= shape[d] == 0;
    }
    uint64_t count = 1;
    for (size_t d = 0; d < nd && !has_zero; d++) {
        if (count > UINT64_MAX / shape[d]) overflow = 1;
        count *= shape[d];
    }
    if (has_zero) count = 0;
    char sh[160];
    size_t dsz = st_dtype_size(dt);
    if (overflow) BAD("shape %s element count overflows", fmt_shape(t, sh, sizeof sh));
    if (count > UINT64_MAX / dsz)
        BAD("shape %s x %s byte size overflows", fmt_shape(t, sh, sizeof sh), st_dtype_name(dt));
    uint64_t want = count * dsz, b = offs[0], e = offs[1];
    if (b > e) BAD("data_offsets [%" PRIu64 ", %" PRIu64 "] has begin > end", b, e);
    if (e - b != want)
        BAD("data_offsets [%" PRIu64 ", %" PRIu64 "] but shape %s x %s = %" PRIu64 " bytes", b, e,
            fmt_shape(t, sh, sizeof sh), st_dtype_name(dt), want);
    if (e > file_size - data_start)
        BAD("data_offsets [%" PRIu64 ", %" PRIu64 "] end past EOF: data would end at byte %" PRIu64
            " but the file is %" PRIu64 " bytes", b, e, data_start + e, file_size);
    t->off = data_start + b;
    t->nbytes = want;
    return STRATA_OK;
#undef BAD
}

static int cmp_off(const void *a, const void *b) {
    const st_tensor *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Rebuilds the hash over the first ix->n tensors (after a failed insertion). */
static void hash_rebuild(st_index *ix) {
    if (!ix->slots) return;
    memset(ix->slots, 0, ix->n_slots * sizeof *ix->slots);
    for (size_t i = 0; i < ix->n; i++) {
        const char *nm = ix->t[i].name;
        size_t l = strlen(nm);
        uint64_t h = name_hash(nm, l);
        size_t j = hash_probe(ix, nm, l, h);
        ix->slots[j].idx1 = (uint32_t)(i + 1);
        ix->slots[j].tag = (uint32_t)(h >> 32);
    }
}

int st_parse_header(st_index *ix, int32_t shard, const uint8_t *buf, size_t len,
                    uint64_t file_size, const char *what, char *err, size_t errlen) {
    if (!what) what = "safetensors";
    if (!ix || shard < 0 || (!buf && len))
        return base_fail(err, errlen, STRATA_EINVAL, "%s: bad arguments to st_parse_header", what);
    uint64_t hlen;
    int rc = header_len(buf, len, file_size, what, &hlen, err, errlen);
    if (rc) return rc;
    if (len - 8 < hlen)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: header length %" PRIu64
                         " but only %zu header bytes given", what, hlen, len - 8);
    jcur c = {.p = buf + 8, .end = buf + 8 + hlen, .base = buf, .what = what, .err = err, .errlen = errlen,
              .tag = MEM_INDEX, .ctx_kind = "tensor"};
    jstr key = {0}, val = {0};
    size_t n0 = ix->n;
    uint64_t data_start = 8 + hlen;
    int seen_meta = 0, inserting = 0;
    if (!jcur_eat(&c, '{')) {
        rc = jcur_syntax(&c, NULL, "the header is not a JSON object");
        goto fail;
    }
    if (!jcur_eat(&c, '}')) {
        do {
            if ((rc = jcur_str(&c, &key, NULL))) goto fail;
            if (!jcur_eat(&c, ':')) { rc = jcur_syntax(&c, key.s, "expected ':'"); goto fail; }
            if (strlen(key.s) != key.len) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: tensor '%s': name contains a NUL byte",
                               what, key.s);
                goto fail;
            }
            if (!strcmp(key.s, "__metadata__")) {
                /* An object of strings; its contents mean nothing to the engine. */
                if (seen_meta++) {
                    rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: duplicate __metadata__", what);
                    goto fail;
                }
                if (!jcur_eat(&c, '{')) {
                    rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: __metadata__ is not an object", what);
                    goto fail;
                }
                if (jcur_eat(&c, '}')) continue;
                do {
                    if ((rc = jcur_str(&c, &key, "__metadata__"))) goto fail;
                    if (!jcur_eat(&c, ':')) { rc = jcur_syntax(&c, "__metadata__", "expected ':'"); goto fail; }
                    jcur_ws(&c);
                    if (c.p >= c.end || *c.p != '"') {
                        rc = base_fail(err, errlen, STRATA_EFORMAT,
                                       "%s: __metadata__ value '%s' is not a string", what, key.s);
                        goto fail;
                    }
                    if ((rc = jcur_str(&c, &val, "__metadata__"))) goto fail;
                } while (jcur_eat(&c, ','));
                if (!jcur_eat(&c, '}')) { rc = jcur_syntax(&c, "__metadata__", "expected ',' or '}'"); goto fail; }
                continue;
            }
            if (key.len == 0) {
                rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: tensor '': empty tensor name", what);
                goto fail;
            }
            if (ix->n >= UINT32_MAX - 1 || tensors_reserve(ix, ix->n + 1)) goto oom;
            st_tensor *t = &ix->t[ix->n];
            memset(t, 0, sizeof *t);
            t->shard = shard;
            if ((rc = parse_entry(&c, key.s, data_start, file_size, t, &val))) goto fail;
            if (!(t->name = arena_put(&ix->names, key.s, key.len))) goto oom;
            ix->n++;
        } while (jcur_eat(&c, ','));
        if (!jcur_eat(&c, '}')) { rc = jcur_syntax(&c, NULL, "expected ',' or '}'"); goto fail; }
    }
    if ((rc = jcur_finish(&c))) goto fail;

    /* Overlap check in offset order; this order is also st_at's "file order".
     * Empty tensors occupy no bytes and never overlap. */
    size_t n_new = ix->n - n0;
    st_tensor *nt = n_new ? ix->t + n0 : NULL; /* ix->t is NULL while no shard has a tensor: no offset on it */
    if (n_new > 1) qsort(nt, n_new, sizeof *nt, cmp_off);
    const st_tensor *last = NULL;
    for (size_t i = 0; i < n_new; i++) {
        if (!nt[i].nbytes) continue;
        if (last && nt[i].off < last->off + last->nbytes) {
            rc = base_fail(err, errlen, STRATA_EFORMAT,
                           "%s: tensor '%s': bytes [%" PRIu64 ", %" PRIu64 ") overlap tensor '%s' bytes [%"
                           PRIu64 ", %" PRIu64 ") (data_offsets relative to byte %" PRIu64 ")",
                           what, nt[i].name, nt[i].off - data_start, nt[i].off - data_start + nt[i].nbytes,
                           last->name, last->off - data_start, last->off - data_start + last->nbytes,
                           data_start);
            goto fail;
        }
        if (!last || nt[i].off + nt[i].nbytes > last->off + last->nbytes) last = &nt[i];
    }

    /* Names must be unique in the header and across shards. */
    if (hash_reserve(ix, ix->n)) goto oom;
    inserting = 1;
    for (size_t i = n0; i < ix->n; i++) {
        const char *nm = ix->t[i].name;
        size_t l = strlen(nm);
        uint64_t h = name_hash(nm, l);
        size_t j = hash_probe(ix, nm, l, h);
        if (ix->slots[j].idx1) {
            const st_tensor *o = &ix->t[ix->slots[j].idx1 - 1];
            const char *op = ix->slots[j].idx1 - 1 >= n0 ? "this header"
                             : o->shard < ix->n_shards ? ix->shards[o->shard].path : "an earlier shard";
            rc = base_fail(err, errlen, STRATA_EFORMAT,
                           "%s: tensor '%s': duplicate tensor name, also in %s", what, nm, op);
            goto fail;
        }
        ix->slots[j].idx1 = (uint32_t)(i + 1);
        ix->slots[j].tag = (uint32_t)(h >> 32);
    }
    base_free(key.s);
    base_free(val.s);
    base_free(c.tmp.s);
    return STRATA_OK;
oom:
    rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory while indexing the header", what);
fail:
    base_free(key.s);
    base_free(val.s);
    base_free(c.tmp.s);
    ix->n = n0;
    if (inserting) hash_rebuild(ix);
    return rc;
}


/* ===== opening ===== */

st_index *st_index_create(void) {
    st_index *ix = base_calloc(1, sizeof *ix, MEM_INDEX);
    return ix;
}

void st_close(st_index *ix) {
    if (!ix) return;
    for (int i = 0; i < ix->n_shards; i++) {
        if (ix->shards[i].fd >= 0) close(ix->shards[i].fd);
        base_free(ix->shards[i].path);
    }
    base_free(ix->shards);
    base_free(ix->t);
    base_free(ix->slots);
    arena_free(ix->names);
    base_free(ix);
}

static int add_shard(st_index *ix, const char *path) {
    st_shard *s = base_realloc(ix->shards, (size_t)(ix->n_shards + 1) * sizeof *s, MEM_INDEX);
    if (!s) return -1;
    ix->shards = s;
    s = &s[ix->n_shards];
    s->path = base_strdup(path, MEM_INDEX);
    if (!s->path) return -1;
    s->fd = -1;
    s->size = 0;
    ix->n_shards++;
    return 0;
}

/* Opens shard k, reads its length prefix and header, and indexes it. */
static int open_shard(st_index *ix, int k, char *err, size_t errlen) {
    st_shard *s = &ix->shards[k];
    s->fd = vfs_open(s->path, O_RDONLY | O_CLOEXEC, 0);
    if (s->fd < 0) return base_fail(err, errlen, STRATA_EIO, "%s: %s", s->path, strerror(errno));
    struct stat sb;
    if (fstat(s->fd, &sb)) return base_fail(err, errlen, STRATA_EIO, "%s: %s", s->path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return base_fail(err, errlen, STRATA_EIO, "%s: not a regular file", s->path);
    s->size = (uint64_t)sb.st_size;
    uint8_t pre[8];
    size_t npre = s->size < 8 ? (size_t)s->size : 8;
    int r = vfs_pread_full(s->fd, pre, npre, 0);
    if (r) return base_fail(err, errlen, STRATA_EIO, "%s: cannot read the header length: %s", s->path,
                            r > 0 ? strerror(r) : "short read");
    uint64_t hlen;
    int rc = header_len(pre, npre, s->size, s->path, &hlen, err, errlen);
    if (rc) return rc;
    uint8_t *buf = base_alloc((size_t)hlen + 8, MEM_INDEX);
    if (!buf) return base_fail(err, errlen, STRATA_ENOMEM, "%s: cannot allocate the %" PRIu64
                               "-byte header", s->path, hlen);
    r = vfs_pread_full(s->fd, buf, hlen + 8, 0);
    if (r) rc = base_fail(err, errlen, STRATA_EIO, "%s: cannot read the %" PRIu64 "-byte header: %s",
                          s->path, hlen, r > 0 ? strerror(r) : "short read");
    else rc = st_parse_header(ix, k, buf, (size_t)hlen + 8, s->size, s->path, err, errlen);
    base_free(buf);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n > m && !strcmp(s + n - m, suf);
}

/* Every *.safetensors regular file in dir (symlinks followed, as in a Hugging Face
 * cache snapshot), lexical order. Names starting with '.' are skipped: macOS "._"
 * droppings and partial downloads are not shards. */
static int scan_dir(st_index *ix, const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return base_fail(err, errlen, STRATA_EIO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = STRATA_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !has_suffix(e->d_name, ".safetensors")) continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        if (!base_is_file(path)) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            char **nn = base_realloc(names, nc * sizeof *nn, MEM_INDEX);
            if (!nn) { rc = STRATA_ENOMEM; break; }
            names = nn;
            cap = nc;
        }
        if (!(names[n] = base_strdup(path, MEM_INDEX))) { rc = STRATA_ENOMEM; break; }
        n++;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = base_fail(err, errlen, STRATA_EIO, "%s: no *.safetensors files and no "
                       "model.safetensors.index.json", dir);
    else if (rc) base_fail(err, errlen, rc, "%s: out of memory listing shards", dir);
    if (!rc) {
        qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n && !rc; i++)
            if (add_shard(ix, names[i])) rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", dir);
    }
    for (size_t i = 0; i < n; i++) base_free(names[i]);
    base_free(names);
    return rc;
}

/* weight_map collected from the index json: tensor -> file number. */
typedef struct {
    name_chunk *arena;
    char **names;        /* (n) tensor names, in the arena */
    int32_t *file;       /* (n) index into files */
    size_t n, cap;
    char **files;        /* (n_files) distinct shard names, MEM_INDEX */
    uint64_t *file_hash; /* (n_files) */
    int n_files, last;
} wmap;

static int wmap_add(void *ud, const char *tensor, const char *file) {
    wmap *w = ud;
    if (w->n == w->cap) {
        size_t nc = w->cap ? w->cap * 2 : 1024;
        char **nn = base_realloc(w->names, nc * sizeof *nn, MEM_INDEX);
        if (!nn) return STRATA_ENOMEM;
        w->names = nn;
        int32_t *nf = base_realloc(w->file, nc * sizeof *nf, MEM_INDEX);
        if (!nf) return STRATA_ENOMEM;
        w->file = nf;
        w->cap = nc;
    }
    /* weight_map values repeat a few dozen file names; compare hashes, try the
     * last hit first (entries of one shard are usually adjacent). */
    size_t fl = strlen(file);
    uint64_t h = name_hash(file, fl);
    int f = -1;
    if (w->last < w->n_files && w->file_hash[w->last] == h && !strcmp(w->files[w->last], file)) f = w->last;
    for (int i = 0; f < 0 && i < w->n_files; i++)
        if (w->file_hash[i] == h && !strcmp(w->files[i], file)) f = i;
    if (f < 0) {
        char **nf = base_realloc(w->files, (size_t)(w->n_files + 1) * sizeof *nf, MEM_INDEX);
        if (!nf) return STRATA_ENOMEM;
        w->files = nf;
        uint64_t *nh = base_realloc(w->file_hash, (size_t)(w->n_files + 1) * sizeof *nh, MEM_INDEX);
        if (!nh) return STRATA_ENOMEM;
        w->file_hash = nh;
        if (!(w->files[w->n_files] = base_strdup(file, MEM_INDEX))) return STRATA_ENOMEM;
        w->file_hash[w->n_files] = h;
        f = w->n_files++;
    }
    w->last = f;
    if (!(w->names[w->n] = arena_put(&w->arena, tensor, strlen(tensor)))) return STRATA_ENOMEM;
    w->file[w->n++] = f;
    return 0;
}

static void wmap_free(wmap *w) {
    arena_free(w->arena);
    base_free(w->names);
    base_free(w->file);
    for (int i = 0; i < w->n_files; i++) base_free(w->files[i]);
    base_free(w->files);
    base_free(w->file_hash);
}

/* Shards named by the index, lexical order; then every mapping is checked against
 * the headers in both directions. Shard files the index does not name are ignored. */
static int open_with_index(st_index *ix, const char *dir, const char *ipath, char *err, size_t errlen) {
    wmap w = {0};
    uint8_t *buf = NULL;
    size_t len;
    int *order = NULL, *rank = NULL;
    uint8_t *seen = NULL;
    int rc = base_read_file(ipath, (size_t)1 << 31, &buf, &len, err, errlen);
    if (rc) goto done;
    rc = st_parse_index_json(buf, len, ipath, wmap_add, &w, err, errlen);
    base_free(buf);
    if (rc) goto done;
    if (w.n == 0) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: weight_map is empty", ipath);
        goto done;
    }
    order = base_alloc((size_t)w.n_files * sizeof *order, MEM_INDEX);
    rank = base_alloc((size_t)w.n_files * sizeof *rank, MEM_INDEX);
    if (!order || !rank) goto oom;
    /* Sort file numbers by name: shard numbers are stable across index rewrites. */
    char **sorted = base_alloc((size_t)w.n_files * sizeof *sorted, MEM_INDEX);
    if (!sorted) goto oom;
    memcpy(sorted, w.files, (size_t)w.n_files * sizeof *sorted);
    qsort(sorted, (size_t)w.n_files, sizeof *sorted, cmp_str);
    for (int i = 0; i < w.n_files; i++)
        for (int j = 0; j < w.n_files; j++)
            if (sorted[i] == w.files[j]) { order[i] = j; rank[j] = i; }
    base_free(sorted);
    for (int i = 0; i < w.n_files; i++) {
        char path[4096];
        const char *fname = w.files[order[i]];
        if (snprintf(path, sizeof path, "%s/%s", dir, fname) >= (int)sizeof path) {
            rc = base_fail(err, errlen, STRATA_EINVAL, "%s: shard path too long", ipath);
            goto done;
        }
        if (!base_is_file(path)) {
            const char *example = "";
            for (size_t k = 0; k < w.n; k++) if (w.file[k] == order[i]) { example = w.names[k]; break; }
            rc = base_fail(err, errlen, STRATA_EIO, "%s: weight_map names shard '%s' (for tensor '%s') "
                           "but %s does not exist or is not a regular file", ipath, fname, example, path);
            goto done;
        }
        if (add_shard(ix, path)) goto oom;
    }
    /* The index tells the tensor count: size the tables once instead of doubling
     * (at K3 scale the doublings copy ~100 MB). A lying index only costs memory
     * until st_open refuses it. */
    if (tensors_reserve(ix, w.n) || hash_reserve(ix, w.n)) goto oom;
    for (int i = 0; i < ix->n_shards; i++)
        if ((rc = open_shard(ix, i, err, errlen))) goto done;
    seen = base_calloc(ix->n ? ix->n : 1, 1, MEM_INDEX);
    if (!seen) goto oom;
    for (size_t k = 0; k < w.n; k++) {
        const st_tensor *t = st_find(ix, w.names[k]);
        int want = rank[w.file[k]];
        if (!t || t->shard != want) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: weight_map puts tensor '%s' in '%s' but %s",
                           ipath, w.names[k], w.files[w.file[k]],
                           t ? "it is in another shard" : "that shard's header does not contain it");
            if (t) {
                char m[256];
                snprintf(m, sizeof m, " (%s)", ix->shards[t->shard].path);
                size_t l = err && errlen ? strlen(err) : 0;
                if (err && l + 1 < errlen) snprintf(err + l, errlen - l, "%s", m);
            }
            goto done;
        }
        if (seen[t - ix->t]++) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: tensor '%s': duplicate key in weight_map",
                           ipath, w.names[k]);
            goto done;
        }
    }
    for (size_t i = 0; i < ix->n; i++)
        if (!seen[i]) {
            rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: tensor '%s': in the shard header but absent "
                           "from %s", ix->shards[ix->t[i].shard].path, ix->t[i].name, ipath);
            goto done;
        }
    rc = STRATA_OK;
    goto done;
oom:
    rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", ipath);
done:
    base_free(seen);
    base_free(order);
    base_free(rank);
    wmap_free(&w);
    return rc;
}

int st_open(st_index **out, const char *path, char *err, size_t errlen) {
    *out = NULL;
    st_index *ix = st_index_create();
    if (!ix) return base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", path);
    int rc;
    if (base_is_dir(path)) {
        char ipath[4096];
        if (snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", path) >= (int)sizeof ipath) {
            rc = base_fail(err, errlen, STRATA_EINVAL, "%s: path too long", path);
            goto fail;
        }
        if (base_is_file(ipath)) {
            rc = open_with_index(ix, path, ipath, err, errlen);
        } else {
            rc = scan_dir(ix, path, err, errlen);
            for (int i = 0; !rc && i < ix->n_shards; i++) rc = open_shard(ix, i, err, errlen);
        }
    } else if (base_is_file(path) && has_suffix(path, ".index.json")) {
        /* The index file itself: its shards sit next to it. */
        char dir[4096];
        const char *slash = strrchr(path, '/');
        size_t dl = slash ? (size_t)(slash - path) : 1;
        if (dl >= sizeof dir) {
            rc = base_fail(err, errlen, STRATA_EINVAL, "%s: path too long", path);
            goto fail;
        }
        memcpy(dir, slash ? path : ".", dl);
        dir[dl] = 0;
        if (slash == path) strcpy(dir, "/");
        rc = open_with_index(ix, dir, path, err, errlen);
    } else if (base_is_file(path)) {
        rc = add_shard(ix, path) ? base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", path)
                                 : open_shard(ix, 0, err, errlen);
    } else {
        rc = base_fail(err, errlen, STRATA_EIO, "%s: no such file or directory", path);
    }
    if (rc) goto fail;
    *out = ix;
    return STRATA_OK;
fail:
    st_close(ix);
    return rc;
}

/* ===== queries ===== */

size_t st_count(const st_index *ix) { return ix ? ix->n : 0; }

const st_tensor *st_at(const st_index *ix, size_t i) {
    return ix && i < ix->n ? &ix->t[i] : NULL;
}

const st_tensor *st_find(const st_index *ix, const char *name) {
    if (!ix || !ix->n_slots || !name) return NULL;
    size_t l = strlen(name);
    size_t j = hash_probe(ix, name, l, name_hash(name, l));
    return ix->slots[j].idx1 ? &ix->t[ix->slots[j].idx1 - 1] : NULL;
}

int st_n_shards(const st_index *ix) { return ix ? ix->n_shards : 0; }

const char *st_shard_path(const st_index *ix, int shard) {
    return ix && shard >= 0 && shard < ix->n_shards ? ix->shards[shard].path : NULL;
}

uint64_t st_shard_size(const st_index *ix, int shard) {
    return ix && shard >= 0 && shard < ix->n_shards ? ix->shards[shard].size : 0;
}

int st_shard_fd(const st_index *ix, int shard) {
    return ix && shard >= 0 && shard < ix->n_shards ? ix->shards[shard].fd : -1;
}

int st_read(const st_index *ix, const st_tensor *t, uint64_t rel, void *dst, uint64_t nbytes,
            char *err, size_t errlen) {
    if (!ix || !t || t->shard < 0 || t->shard >= ix->n_shards || ix->shards[t->shard].fd < 0)
        return base_fail(err, errlen, STRATA_EINVAL, "st_read: tensor '%s' has no open shard",
                         t && t->name ? t->name : "?");
    const st_shard *s = &ix->shards[t->shard];
    if (rel > t->nbytes || nbytes > t->nbytes - rel)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: tensor '%s': read of %" PRIu64 " bytes at %"
                         PRIu64 " is outside its %" PRIu64 " bytes", s->path, t->name, nbytes, rel, t->nbytes);
    if (nbytes && !dst)
        return base_fail(err, errlen, STRATA_EINVAL, "%s: tensor '%s': NULL destination", s->path, t->name);
    int r = vfs_pread_full(s->fd, dst, nbytes, t->off + rel);
    if (r)
        return base_fail(err, errlen, STRATA_EIO, "%s: tensor '%s': reading %" PRIu64 " bytes at byte %"
                         PRIu64 ": %s", s->path, t->name, nbytes, t->off + rel,
                         r > 0 ? strerror(r) : "short read (file truncated?)");
    return STRATA_OK;
}
