/*
 * bind.c: checks a checkpoint against the tensor list of its config and records
 * the layout facts the loader relies on (see model.h, model_bind_check).
 *
 * Everything is verified, nothing assumed: each tensor schema_walk names must
 * exist with its shape and an accepted dtype; the expert format (MXFP4 packed +
 * scale, or plain `weight`) is read off expert 0 of the first MoE layer and then
 * required of every expert, because the expert cache sizes its slots once. The
 * layout facts (one gap-free run per expert and per layer trunk, in one shard)
 * decide whether an expert is one pread and a layer one sequential copy.
 */
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "model.h"

/* Listing caps: a wrong config can produce 500k identical lines. */
#define BIND_MAX_LINES 50
#define BIND_MAX_WARN_GROUPS 24
/* Tensors in one group (a layer's trunk has ~30, an expert 6). */
#define BIND_GROUP_MAX 64

/* ------------------------------------------------------------ pointer set */

/* Open-addressing set of st_tensor pointers, to find checkpoint tensors the
 * model does not use without assuming how st stores them. */
typedef struct pset {
    const st_tensor **slot;
    size_t cap; /* power of two */
} pset;

static int pset_init(pset *s, size_t n) {
    s->cap = 16;
    while (s->cap < 2 * n + 16) s->cap *= 2;
    s->slot = base_calloc(s->cap, sizeof *s->slot, MEM_INDEX);
    return s->slot ? 0 : -1;
}

static size_t pset_hash(const st_tensor *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static void pset_add(pset *s, const st_tensor *p) {
    size_t m = s->cap - 1, i = pset_hash(p) & m;
    while (s->slot[i] && s->slot[i] != p) i = (i + 1) & m;
    s->slot[i] = p;
}

static int pset_has(const pset *s, const st_tensor *p) {
    size_t m = s->cap - 1, i = pset_hash(p) & m;
    while (s->slot[i]) {
        if (s->slot[i] == p) return 1;
        i = (i + 1) & m;
    }
    return 0;
}

/* ------------------------------------------------------------------ walker */

typedef struct part {
    int32_t shard;
    int role, kind;
    uint64_t off, nbytes;
} part;

typedef struct bctx {
    const cfg *c;
    const st_index *ix;
    model_layout *lay;
    sbuf *pb;
    int64_t n_prob;         /* problems found (listed or not) */
    pset used;
    int expert_dtype;       /* plain experts: dtype of expert 0 (all must match) */
    int64_t i4_rows, i4_cols; /* the INT4 matrix whose weight_shape comes next */
    int order_known;
    /* the group being collected: one layer's trunk or one expert */
    int g_cls;
    int64_t g_layer, g_expert;
    int g_n, g_bad;
    part g[BIND_GROUP_MAX];
} bctx;

static void bproblem(bctx *b, const char *fmt, ...) ST_PRINTF(2, 3);
static void bproblem(bctx *b, const char *fmt, ...) {
    if (b->n_prob++ >= BIND_MAX_LINES) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sbuf_printf(b->pb, "  - %s\n", msg);
}

static const char *fmt_dims(int ndim, const int64_t *d, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

static int cmp_part(const void *a, const void *b) {
    const part *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Closes the current group: one shard, and back to back in offset order. */
static void group_flush(bctx *b) {
    if (b->g_n == 0) return;
    model_layout *lay = b->lay;
    uint64_t bytes = 0;
    for (int i = 0; i < b->g_n; i++) bytes += b->g[i].nbytes;
    int ok = !b->g_bad;
    if (ok) {
        part s[BIND_GROUP_MAX];
        memcpy(s, b->g, sizeof(part) * (size_t)b->g_n);
        qsort(s, (size_t)b->g_n, sizeof s[0], cmp_part);
        for (int i = 1; i < b->g_n && ok; i++)
            ok = s[i].shard == s[0].shard && s[i].off == s[i - 1].off + s[i - 1].nbytes;
        /* The order of an expert's tensors on disk, recorded once (the release
         * has w1.packed, w1.scale, w2.packed, w2.scale, w3.packed, w3.scale). */
        if (b->g_cls == TC_EXPERT) {
            if (!b->order_known) {
                b->order_known = 1;
                lay->expert_order_uniform = 1;
                lay->n_expert_parts = b->g_n < 9 ? b->g_n : 9;
                for (int i = 0; i < lay->n_expert_parts; i++) {
                    if (i < 6) lay->expert_order[i] = s[i].role;
                    lay->expert_roles[i] = s[i].role;
                    lay->expert_kinds[i] = s[i].kind;
                }
            } else {
                int same = b->g_n == lay->n_expert_parts;
                for (int i = 0; same && i < b->g_n; i++)
                    same = lay->expert_roles[i] == s[i].role && lay->expert_kinds[i] == s[i].kind;
                if (!same) lay->expert_order_uniform = 0;
            }
        }
    }
    if (b->g_cls == TC_EXPERT) {
        if (bytes > lay->expert_bytes) lay->expert_bytes = bytes;
        lay->experts_bytes += bytes;
        if (!ok) lay->n_expert_noncontig++;
    } else {
        lay->layer_bytes[b->g_layer] = bytes;
        lay->trunk_bytes += bytes;
        if (!ok) lay->n_layer_noncontig++;
    }
    b->g_n = 0;
    b->g_bad = 0;
}

static int dtype_float(int dt) { return dt == DT_F32 || dt == DT_BF16 || dt == DT_F16; }

static int shape_ok(const tspec *t, const st_tensor *s) {
    if (t->kind == TK_VECTOR && t->ndim == 4) { /* [1, 1, n, 1] exactly (Kimi Linear's A_log) */
        if (s->ndim != 4) return 0;
        for (int i = 0; i < 4; i++)
            if (s->shape[i] != t->shape[i]) return 0;
        return 1;
    }
    if (t->kind == TK_VECTOR) {
        /* Vectors are [n] or [1, n]: both appear in exported checkpoints. */
        if (s->ndim == 1) return s->shape[0] == t->shape[0];
        return s->ndim == 2 && s->shape[0] == 1 && s->shape[1] == t->shape[0];
    }
    if (s->ndim != t->ndim) return 0;
    for (int i = 0; i < t->ndim; i++)
        if (s->shape[i] != t->shape[i]) return 0;
    return 1;
}

static int on_tensor(void *ud, const tspec *t) {
    bctx *b = ud;
    char want[96], got[96];
    /* Group bookkeeping: trunk tensors of a layer, or the tensors of one expert. */
    if (t->cls == TC_LAYER || t->cls == TC_EXPERT) {
        if (b->g_n && (t->cls != b->g_cls || t->layer != b->g_layer || t->expert != b->g_expert)) group_flush(b);
        b->g_cls = t->cls;
        b->g_layer = t->layer;
        b->g_expert = t->expert;
    } else {
        group_flush(b);
    }
    const st_tensor *s = st_find(b->ix, t->name);
    if (!s) {
        bproblem(b, "missing tensor %s %s", t->name, fmt_dims(t->ndim, t->shape, want, sizeof want));
        b->g_bad = 1;
        return 0;
    }
    pset_add(&b->used, s);
    int dt_ok;
    const char *accepted;
    switch (t->kind) {
    case TK_PACKED: case TK_SCALE:
        dt_ok = s->dtype == DT_U8;
        accepted = "U8 (MXFP4)";
        break;
    case TK_FP8:
        dt_ok = s->dtype == DT_F8_E4M3;
        accepted = "F8_E4M3 (FP8, as the other FP8 matrices)";
        break;
    case TK_FP8_SCALE:
        dt_ok = s->dtype == DT_F32;
        accepted = "F32 (FP8 weight_scale_inv)";
        break;
    case TK_I4_PACKED:
        dt_ok = s->dtype == DT_I32;
        accepted = "I32 (INT4 weight_packed, as the other INT4 experts)";
        b->i4_rows = t->shape[0];
        b->i4_cols = t->shape[1] * 8;
        break;
    case TK_I4_SCALE:
        dt_ok = s->dtype == DT_BF16;
        accepted = "BF16 (INT4 weight_scale)";
        break;
    case TK_I4_SHAPE:
        dt_ok = s->dtype == DT_I32 || s->dtype == DT_I64;
        accepted = "I32 or I64 (INT4 weight_shape)";
        break;
    default:
        if (t->cls == TC_EXPERT) {
            dt_ok = s->dtype == b->expert_dtype;
            accepted = b->expert_dtype >= 0 ? st_dtype_name(b->expert_dtype) : "F32/BF16/F16";
        } else {
            dt_ok = dtype_float(s->dtype);
            accepted = s->dtype == DT_F8_E4M3 ? "F32/BF16/F16 (this matrix is never FP8, or the checkpoint's other matrices are plain)"
                                              : "F32/BF16/F16";
        }
    }
    /* weight_shape must say the matrix's logical shape: it is how the packed
     * words' padding would be known, so a disagreement is a wrong checkpoint */
    if (t->kind == TK_I4_SHAPE && dt_ok && shape_ok(t, s)) {
        int64_t v[2] = {0, 0};
        uint8_t raw[16];
        char e2[256];
        if (st_read(b->ix, s, 0, raw, s->nbytes, e2, sizeof e2)) {
            bproblem(b, "tensor %s: cannot read: %s", t->name, e2);
            b->g_bad = 1;
        } else {
            for (int i = 0; i < 2; i++) {
                if (s->dtype == DT_I32) { int32_t x; memcpy(&x, raw + 4 * i, 4); v[i] = x; }
                else memcpy(&v[i], raw + 8 * i, 8);
            }
            if (v[0] != b->i4_rows || v[1] != b->i4_cols) {
                bproblem(b, "tensor %s says [%lld, %lld], expected [%lld, %lld] (weight_packed and weight_scale's shape)",
                         t->name, (long long)v[0], (long long)v[1], (long long)b->i4_rows, (long long)b->i4_cols);
                b->g_bad = 1;
            }
        }
    }
    if (!shape_ok(t, s)) {
        bproblem(b, "tensor %s has shape %s, expected %s%s", t->name, fmt_dims(s->ndim, s->shape, got, sizeof got),
                 fmt_dims(t->ndim, t->shape, want, sizeof want), t->kind == TK_VECTOR ? " (or [1, n])" : "");
        b->g_bad = 1;
    }
    if (!dt_ok) {
        bproblem(b, "tensor %s has dtype %s, expected %s", t->name, st_dtype_name(s->dtype), accepted);
        b->g_bad = 1;
    }
    if (t->cls == TC_LAYER || t->cls == TC_EXPERT) {
        if (b->g_n < BIND_GROUP_MAX) {
            part *p = &b->g[b->g_n++];
            p->shard = s->shard;
            p->role = t->role;
            p->kind = t->kind;
            p->off = s->off;
            p->nbytes = s->nbytes;
        } else {
            b->g_bad = 1; /* cannot happen with the current schema */
        }
    } else if (t->cls == TC_EMBED) {
        b->lay->embed_bytes += s->nbytes;
    } else {
        b->lay->head_bytes += s->nbytes;
    }
    return 0;
}

/* Name prefix for grouping unused tensors: up to the first numeric component,
 * so 400 vision-tower blocks read as one line. */
static size_t group_prefix(const char *name) {
    const char *p = name;
    for (;;) {
        const char *dot = strchr(p, '.');
        if (!dot) return strlen(name);
        if (dot[1] >= '0' && dot[1] <= '9') return (size_t)(dot - name);
        p = dot + 1;
    }
}

typedef struct ugroup {
    const char *name; /* first member; prefix length len */
    size_t len;
    int64_t n;
    uint64_t bytes;
} ugroup;

static void report_unused(bctx *b, sbuf *warn) {
    ugroup g[BIND_MAX_WARN_GROUPS];
    int ng = 0;
    int64_t other = 0;
    uint64_t other_bytes = 0;
    size_t n = st_count(b->ix);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *s = st_at(b->ix, i);
        if (pset_has(&b->used, s)) continue;
        b->lay->n_unused++;
        b->lay->unused_bytes += s->nbytes;
        size_t len = group_prefix(s->name);
        int k;
        for (k = 0; k < ng; k++)
            if (g[k].len == len && !memcmp(g[k].name, s->name, len)) break;
        if (k == ng && ng < BIND_MAX_WARN_GROUPS) g[ng++] = (ugroup){s->name, len, 0, 0};
        if (k < ng) {
            g[k].n++;
            g[k].bytes += s->nbytes;
        } else {
            other++;
            other_bytes += s->nbytes;
        }
    }
    if (!warn) return;
    char hb[32];
    for (int k = 0; k < ng; k++) {
        if (g[k].n == 1) {
            sbuf_line(warn, "unused tensor %s (%s)", g[k].name, base_fmt_bytes(g[k].bytes, hb, sizeof hb));
        } else {
            sbuf_line(warn, "%lld unused tensors %.*s.* (%s)", (long long)g[k].n, (int)g[k].len, g[k].name,
                      base_fmt_bytes(g[k].bytes, hb, sizeof hb));
        }
    }
    if (other)
        sbuf_line(warn, "and %lld more unused tensors (%s)", (long long)other, base_fmt_bytes(other_bytes, hb, sizeof hb));
}

/* The first trunk matrix that may be FP8 (schema.c trunk_mat: not the router). */
typedef struct probe { const st_index *ix; int found, fp8; } probe;
static int probe_fn(void *ud, const tspec *t) {
    probe *p = ud;
    if (t->kind != TK_MATRIX || t->role == R_MOE_ROUTER) return 0;
    const st_tensor *s = st_find(p->ix, t->name);
    if (!s) return 0;
    p->found = 1;
    p->fp8 = s->dtype == DT_F8_E4M3;
    return 1;
}

int model_wf(const cfg *c, const st_index *ix) {
    int wf = SW_EXP_MXFP4;
    char name[256];
    if (c->first_dense < c->n_layers) {
        schema_expert_w1_name(c, c->first_dense, 0, 1, name, sizeof name);
        const st_tensor *s = st_find(ix, name);
        if (s) {
            wf = s->dtype == DT_I32 ? SW_EXP_INT4 : SW_EXP_MXFP4;
        } else {
            schema_expert_w1_name(c, c->first_dense, 0, 0, name, sizeof name);
            s = st_find(ix, name);
            if (s) wf = s->dtype == DT_F8_E4M3 ? SW_EXP_FP8 : SW_EXP_PLAIN;
        }
    }
    probe p = {ix, 0, 0};
    for (int64_t L = 0; L < c->n_layers && !p.found; L++) schema_walk_layer(c, L, 0, probe_fn, &p);
    if (p.fp8) wf |= SW_TRUNK_FP8;
    return wf;
}

/* The formats of the checkpoint, and plain experts' dtype (every expert must have it). */
static void detect_experts(bctx *b) {
    const cfg *c = b->c;
    b->expert_dtype = -1;
    b->lay->wf = model_wf(c, b->ix);
    if ((b->lay->wf & SW_EXP_MASK) != SW_EXP_PLAIN) return;
    char name[256];
    schema_expert_w1_name(c, c->first_dense, 0, 0, name, sizeof name);
    const st_tensor *s = st_find(b->ix, name);
    b->lay->experts_bf16 = 1;
    if (dtype_float(s->dtype)) b->expert_dtype = s->dtype;
    else bproblem(b, "tensor %s has dtype %s, expected F32/BF16/F16, F8_E4M3 (with weight_scale_inv) or MXFP4/INT4 weight_packed",
                  name, st_dtype_name(s->dtype));
}

int model_bind_check_ex(const cfg *c, const st_index *ix, model_layout *lay, sbuf *problems, sbuf *warnings) {
    memset(lay, 0, sizeof *lay);
    sbuf local = {0};
    bctx *b = base_calloc(1, sizeof *b, MEM_MISC);
    if (!b) return STRATA_ENOMEM;
    b->c = c;
    b->ix = ix;
    b->lay = lay;
    b->pb = problems ? problems : &local;
    if (pset_init(&b->used, st_count(ix))) { base_free(b); return STRATA_ENOMEM; }
    detect_experts(b);
    schema_walk(c, lay->wf, on_tensor, b);
    group_flush(b);
    int64_t n_experts = 0;
    for (int64_t L = 0; L < c->n_layers; L++)
        if (cfg_is_moe(c, L)) n_experts += c->n_experts;
    lay->experts_contiguous = n_experts > 0 && lay->n_expert_noncontig == 0;
    lay->layers_contiguous = lay->n_layer_noncontig == 0;
    /* A config that declares MXFP4 experts over plain weights is a mislabelled
     * checkpoint; the bytes decide, but say so. */
    if (warnings && c->mxfp4_experts && (lay->wf & SW_EXP_MASK) != SW_EXP_MXFP4)
        sbuf_line(warnings, "config declares quantization_config.format mxfp4 but the experts are %s%s weights",
                  lay->experts_bf16 ? "plain " : "",
                  lay->experts_bf16 ? (b->expert_dtype >= 0 ? st_dtype_name(b->expert_dtype) : "float")
                                    : (lay->wf & SW_EXP_MASK) == SW_EXP_FP8 ? "FP8" : "INT4");
    report_unused(b, warnings);
    if (b->n_prob > BIND_MAX_LINES)
        sbuf_printf(b->pb, "  - and %lld more problems\n", (long long)(b->n_prob - BIND_MAX_LINES));
    b->pb->n += (int)(b->n_prob < INT32_MAX ? b->n_prob : INT32_MAX);
    int64_t np = b->n_prob;
    base_free(b->used.slot);
    base_free(b);
    sbuf_free(&local);
    return np ? STRATA_EFORMAT : STRATA_OK;
}

int model_bind_check(const cfg *c, const st_index *ix, model_layout *lay, sbuf *problems) {
    return model_bind_check_ex(c, ix, lay, problems, NULL);
}

/* ------------------------------------------------------------ scale scan */

int model_scan_scales(const cfg *c, const st_index *ix, model_scan *out, sbuf *problems,
                      void (*progress)(void *ud, int64_t done, int64_t total), void *ud,
                      char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->first_layer = out->first_expert = -1;
    int64_t total = 0, done = 0;
    for (int64_t L = 0; L < c->n_layers; L++)
        if (cfg_is_moe(c, L)) total += c->n_experts;
    /* One expert's scales at a time: w1/w3 are moe_inter x latent/32 bytes, w2
     * latent x moe_inter/32; a buffer of the largest is enough. */
    uint64_t cap = (uint64_t)(c->moe_inter * (c->latent / MXFP4_GROUP));
    uint64_t cap2 = (uint64_t)(c->latent * (c->moe_inter / MXFP4_GROUP));
    if (cap2 > cap) cap = cap2;
    uint8_t *buf = base_alloc(cap ? cap : 1, MEM_SCRATCH);
    if (!buf) return base_fail(err, errlen, STRATA_ENOMEM, "cannot allocate %llu bytes for the scale scan",
                               (unsigned long long)cap);
    static const char *const k_w[3] = {"w1", "w2", "w3"};
    int rc = STRATA_OK;
    for (int64_t L = 0; L < c->n_layers && !rc; L++) {
        if (!cfg_is_moe(c, L)) continue;
        for (int64_t E = 0; E < c->n_experts && !rc; E++) {
            int64_t bad_here = 0;
            for (int w = 0; w < 3; w++) {
                char name[256];
                snprintf(name, sizeof name, "%slayers.%lld.block_sparse_moe.experts.%lld.%s.weight_scale", arch_of(c)->pfx,
                         (long long)L, (long long)E, k_w[w]);
                const st_tensor *t = st_find(ix, name);
                if (!t || t->dtype != DT_U8 || t->nbytes > cap) continue; /* bind reports these */
                rc = st_read(ix, t, 0, buf, t->nbytes, err, errlen);
                if (rc) break;
                int64_t n255 = 0;
                for (uint64_t i = 0; i < t->nbytes; i++) n255 += buf[i] == 255;
                if (n255 && bad_here == 0 && problems && out->n_bad_experts < BIND_MAX_LINES)
                    sbuf_line(problems, "%s: %lld scale bytes of 255 (NaN in E8M0)", name, (long long)n255);
                bad_here += n255;
                out->scale_bytes += t->nbytes;
            }
            if (bad_here) {
                if (out->n_bad_experts == 0) { out->first_layer = L; out->first_expert = E; }
                out->n_bad_experts++;
                out->n_bad_groups += bad_here;
            }
            out->n_experts++;
            if (progress && (++done % 256 == 0 || done == total)) progress(ud, done, total);
        }
    }
    if (!rc && problems && out->n_bad_experts > BIND_MAX_LINES)
        sbuf_line(problems, "and %lld more experts with scale bytes of 255",
                  (long long)(out->n_bad_experts - BIND_MAX_LINES));
    base_free(buf);
    return rc;
}

/* ------------------------------------------------------------ float scan */

/* Element i of p (dtype dt): 0 finite, 1 +-inf, 2 NaN (exponent bits all set;
 * the mantissa tells NaN from inf). */
static int value_class(const uint8_t *p, int dt, uint64_t i) {
    uint32_t e, m;
    if (dt == DT_F32) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        e = (u & 0x7f800000u) == 0x7f800000u, m = u & 0x007fffffu;
    } else {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        if (dt == DT_BF16) e = (h & 0x7f80u) == 0x7f80u, m = h & 0x007fu;
        else e = (h & 0x7c00u) == 0x7c00u, m = h & 0x03ffu;
    }
    return e ? (m ? 2 : 1) : 0;
}

int model_scan_floats(const st_index *ix, model_fscan *out, sbuf *problems,
                      void (*progress)(void *ud, int64_t done, int64_t total), void *ud,
                      char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const uint64_t cap = 4u << 20; /* a multiple of every element size */
    uint8_t *buf = base_alloc(cap, MEM_SCRATCH);
    if (!buf) return base_fail(err, errlen, STRATA_ENOMEM, "cannot allocate %llu bytes for the float scan", (unsigned long long)cap);
    const int64_t total = (int64_t)st_count(ix);
    int rc = STRATA_OK;
    for (int64_t k = 0; k < total && !rc; k++) {
        const st_tensor *t = st_at(ix, (size_t)k);
        if (!t || !dtype_float(t->dtype)) continue;
        const uint64_t es = st_dtype_size(t->dtype);
        int64_t bad = 0, first = -1;
        int first_class = 0;
        for (uint64_t o = 0; o < t->nbytes && !rc; o += cap) {
            uint64_t n = t->nbytes - o < cap ? t->nbytes - o : cap;
            if ((rc = st_read(ix, t, o, buf, n, err, errlen))) break;
            for (uint64_t i = 0; i < n / es; i++) {
                int k2 = value_class(buf, t->dtype, i);
                if (!k2) continue;
                if (first < 0) { first = (int64_t)(o / es + i); first_class = k2; }
                bad++;
            }
        }
        out->bytes += t->nbytes;
        out->n_tensors++;
        if (bad) {
            const char *what = first_class == 2 ? "NaN" : "inf";
            if (problems && out->n_bad_tensors < BIND_MAX_LINES)
                sbuf_line(problems, "%s: %lld non-finite values of %lld (first: element %lld is %s)", t->name, (long long)bad,
                          (long long)(t->nbytes / es), (long long)first, what);
            out->n_bad_tensors++;
            out->n_nonfinite += bad;
        }
        if (progress && (k % 256 == 0 || k == total - 1)) progress(ud, k + 1, total);
    }
    if (!rc && problems && out->n_bad_tensors > BIND_MAX_LINES)
        sbuf_line(problems, "and %lld more tensors with non-finite values", (long long)(out->n_bad_tensors - BIND_MAX_LINES));
    base_free(buf);
    return rc;
}
