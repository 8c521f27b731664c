/*
 * cfg.c: config.json reader, the K3 preset, the nested writer and the census
 * (see cfg.h). The structural validation every config passes (after reading
 * here, or from a preset through cfg_validate) is cfg_check.c.
 *
 * The reader refuses to guess: a required key that is absent or ill-typed is an
 * error, and every problem found is reported in one pass, one line each, naming
 * the file and the key (the seed engine's defaulting reader once produced an
 * all-KDA model). Integers must be JSON integers: 2.5, "2" and true are refused,
 * because a config written by a tool that confused types is not one to trust.
 */
#include "cfg.h"
#include "cfg_priv.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "arch.h"
#include "base.h"
#include "jsonx.h"

/* ============================================================== key table */

enum { S_GEN, S_KDA };            /* where a key lives */
enum { T_INT, T_NUM, T_BOOL };    /* its JSON type */

typedef struct key {
    int id;
    const char *name;   /* primary JSON name */
    const char *alias;  /* alternative name or NULL */
    int scope, type, required;
    size_t off;         /* offsetof(cfg, field) */
} key;

#define KI(id, n, a, s, f) {id, n, a, s, T_INT, 1, offsetof(cfg, f)}
#define KN(id, n, a, s, f) {id, n, a, s, T_NUM, 1, offsetof(cfg, f)}
#define KB(id, n, a, f) {id, n, a, S_GEN, T_BOOL, 0, offsetof(cfg, f)}

/* docs/architecture.md, Config keys. For KDA keys the alias is the kda_-prefixed name, which
 * wins over the generic one when the keys share a scope (flat shape). The MoE
 * keys' aliases are DeepSeek-V3's names (n_routed_experts, ...). */
static const key k_keys[] = {
    KI(F_HIDDEN, "hidden_size", NULL, S_GEN, hidden),
    KI(F_LAYERS, "num_hidden_layers", NULL, S_GEN, n_layers),
    KI(F_VOCAB, "vocab_size", NULL, S_GEN, vocab),
    KN(F_EPS, "rms_norm_eps", NULL, S_GEN, rms_eps),
    KI(F_KDA_HEADS, "num_heads", "kda_num_heads", S_KDA, kda_heads),
    KI(F_KDA_D, "head_dim", "kda_head_dim", S_KDA, kda_head_dim),
    KI(F_CONV, "short_conv_kernel_size", NULL, S_KDA, conv_k),
    KN(F_GLB, "gate_lower_bound", NULL, S_KDA, gate_lb),
    KI(F_NHEADS, "num_attention_heads", NULL, S_GEN, n_heads),
    KI(F_QLORA, "q_lora_rank", NULL, S_GEN, q_lora),
    KI(F_KVLORA, "kv_lora_rank", NULL, S_GEN, kv_lora),
    KI(F_NOPE, "qk_nope_head_dim", NULL, S_GEN, qk_nope),
    KI(F_ROPE, "qk_rope_head_dim", NULL, S_GEN, qk_rope),
    KI(F_VHEAD, "v_head_dim", NULL, S_GEN, v_head),
    KB(F_MLA_GATE, "mla_use_output_gate", NULL, mla_out_gate),
    KI(F_NEXP, "num_experts", "n_routed_experts", S_GEN, n_experts),
    KI(F_TOPK, "num_experts_per_token", "num_experts_per_tok", S_GEN, topk),
    KI(F_NSHARED, "num_shared_experts", "n_shared_experts", S_GEN, n_shared),
    KI(F_LATENT, "routed_expert_hidden_size", NULL, S_GEN, latent),
    KI(F_MOE_I, "moe_intermediate_size", NULL, S_GEN, moe_inter),
    KN(F_RSCALE, "routed_scaling_factor", NULL, S_GEN, routed_scale),
    KB(F_RENORM, "moe_renormalize", "norm_topk_prob", moe_renorm),
    KB(F_LNORM, "latent_moe_use_norm", NULL, latent_norm),
    KI(F_FDENSE, "first_k_dense_replace", NULL, S_GEN, first_dense),
    KI(F_DENSE_I, "intermediate_size", NULL, S_GEN, dense_inter),
    KI(F_ARB, "attn_res_block_size", NULL, S_GEN, attn_res_block),
    KN(F_B1, "activation_situ_beta", "situ_beta", S_GEN, situ_b1),
    KN(F_B2, "activation_situ_linear_beta", "situ_linear_beta", S_GEN, situ_b2),
};
#define N_KEYS (sizeof k_keys / sizeof k_keys[0])

/* JSON name of a field, for validation messages. */
const char *cfg_field_name(int id) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (k_keys[i].id == id) return k_keys[i].name;
    return id == F_FULL ? "full_attn_layers" : "?";
}

/* ================================================================== reader */

typedef struct cfg_rd {
    const char *what;
    sbuf *pb;            /* problems, one line each */
    const json_t *root;
    const json_t *text;  /* text_config or NULL (flat shape) */
    const json_t *lin;   /* linear_attn_config or NULL */
    const char *lin_pfx; /* its dotted name in messages ("text_config.linear_attn_config." when nested) */
    int64_t layer_base;  /* the layer lists' first index: kda_layer_index_base (default 1) */
    uint64_t have;       /* fields read successfully */
} rd;

void cfg_problem_va(sbuf *pb, const char *what, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    sbuf_printf(pb, "%s: %s\n", what, msg);
    pb->n++;
}

void cfg_rd_problem(struct cfg_rd *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cfg_problem_va(r->pb, r->what, fmt, ap);
    va_end(ap);
}

static void problem(rd *r, const char *fmt, ...) ST_PRINTF(2, 3);
static void problem(rd *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cfg_problem_va(r->pb, r->what, fmt, ap);
    va_end(ap);
}

/* A JSON real as it was most likely written: the shortest digits that read back
 * to the same double, with ".0" kept on whole numbers, so `64.0` is reported as
 * "got 64.0" rather than the confusing "must be an integer, got 64" (jansson
 * keeps the value, not the text). */
static const char *real_text(double x, char *buf, size_t n) {
    if (x == floor(x) && fabs(x) < 1e15) { snprintf(buf, n, "%.1f", x); return buf; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (isfinite(x) && !strpbrk(buf, ".e")) strncat(buf, ".0", n - strlen(buf) - 1);
    return buf;
}

static const char *jtype(const json_t *j, char *buf, size_t n) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: snprintf(buf, n, "the string \"%.40s\"", json_string_value(j)); return buf;
    case JSON_INTEGER: snprintf(buf, n, "%lld", (long long)json_integer_value(j)); return buf;
    case JSON_REAL: return real_text(json_real_value(j), buf, n);
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

const char *cfg_rd_jtype(const struct json_t *v, char *buf, size_t n) { return jtype(v, buf, n); }

/* Looks a key up in one object; sets *path to its dotted display name. */
static const json_t *get_in(const json_t *obj, const char *prefix, const char *name,
                            char *path, size_t n) {
    if (!obj) return NULL;
    const json_t *v = json_object_get(obj, name);
    if (v) snprintf(path, n, "%s%s", prefix, name);
    return v;
}

#define TEXT_PFX "text_config."

/* Finds key k by the shape rules: general keys in text_config then the root;
 * KDA keys only in linear_attn_config when it exists (so a generic head_dim in
 * text_config cannot shadow them), else where the general keys live with the
 * kda_ alias first. *path names where it was found, or where it was expected. */
static const json_t *find_key(const rd *r, const key *k, char *path, size_t n) {
    const json_t *v = NULL;
    if (k->scope == S_KDA && r->lin) {
        if (!(v = get_in(r->lin, r->lin_pfx, k->name, path, n)) && k->alias)
            v = get_in(r->lin, r->lin_pfx, k->alias, path, n);
        if (!v) snprintf(path, n, "%s%s", r->lin_pfx, k->name);
        return v;
    }
    const char *first = k->name, *second = k->alias;
    if (k->scope == S_KDA && k->alias) { first = k->alias; second = k->name; }
    const json_t *objs[2] = {r->text, r->root};
    const char *pfx[2] = {TEXT_PFX, ""};
    for (int o = 0; o < 2 && !v; o++) {
        if (!objs[o]) continue;
        /* In the nested shape the KDA fallback stays inside text_config: a
         * root-level head_dim is an unrelated key. */
        if (o == 1 && r->text && k->scope == S_KDA) break;
        if (!(v = get_in(objs[o], pfx[o], first, path, n)) && second)
            v = get_in(objs[o], pfx[o], second, path, n);
    }
    if (!v) snprintf(path, n, "%s%s", r->text ? TEXT_PFX : "", k->name);
    return v;
}

static void read_key(rd *r, cfg *c, const key *k) {
    char path[160], tb[64];
    const json_t *v = find_key(r, k, path, sizeof path);
    if (!v || (json_is_null(v) && !k->required)) {
        if (k->required && k->alias) problem(r, "missing required key '%s' (or '%s')", path, k->alias);
        else if (k->required) problem(r, "missing required key '%s'", path);
        else r->have |= UINT64_C(1) << k->id; /* default stays */
        return;
    }
    char *base = (char *)c;
    switch (k->type) {
    case T_INT:
        if (!json_is_integer(v)) { problem(r, "'%s' must be an integer, got %s", path, jtype(v, tb, sizeof tb)); return; }
        *(int64_t *)(base + k->off) = (int64_t)json_integer_value(v);
        break;
    case T_NUM:
        if (!json_is_number(v)) { problem(r, "'%s' must be a number, got %s", path, jtype(v, tb, sizeof tb)); return; }
        *(double *)(base + k->off) = json_number_value(v);
        break;
    default:
        if (!json_is_boolean(v)) { problem(r, "'%s' must be true or false, got %s", path, jtype(v, tb, sizeof tb)); return; }
        *(int *)(base + k->off) = json_is_true(v);
        break;
    }
    r->have |= UINT64_C(1) << k->id;
}

/* A general-scope optional key (text_config first, then the root). */
static const json_t *find_opt(const rd *r, const char *name, char *path, size_t n) {
    const json_t *v = get_in(r->text, TEXT_PFX, name, path, n);
    if (!v) v = get_in(r->root, "", name, path, n);
    if (v && json_is_null(v)) v = NULL; /* HF writes null for "not set" */
    return v;
}

const struct json_t *cfg_rd_find(struct cfg_rd *r, const char *name, char *path, size_t n) {
    const json_t *v = find_opt(r, name, path, n);
    if (!v) snprintf(path, n, "%s%s", r->text ? TEXT_PFX : "", name);
    return v;
}

const struct json_t *cfg_rd_quant(struct cfg_rd *r, char *path, size_t n) {
    const json_t *q = get_in(r->root, "", "quantization_config", path, n);
    if (!q) q = get_in(r->text, TEXT_PFX, "quantization_config", path, n);
    return q && json_is_object(q) ? q : NULL;
}

static void read_id(rd *r, const char *name, int64_t *ids, int64_t *nids, int max) {
    char path[160], tb[64];
    const json_t *v = find_opt(r, name, path, sizeof path);
    if (!v) return;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0) { problem(r, "'%s' must be >= 0, got %s", path, jtype(v, tb, sizeof tb)); return; }
        ids[0] = json_integer_value(v);
        *nids = 1;
        return;
    }
    if (max > 1 && json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n == 0 || n > (size_t)max) { problem(r, "'%s' must list 1..%d token ids, got %zu", path, max, n); return; }
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0) {
                problem(r, "'%s'[%zu] must be a token id (integer >= 0), got %s", path, i, jtype(e, tb, sizeof tb));
                *nids = 0;
                return;
            }
            ids[i] = json_integer_value(e);
        }
        *nids = (int64_t)n;
        return;
    }
    problem(r, "'%s' must be %s, got %s", path, max > 1 ? "an integer or a list of integers" : "an integer",
            jtype(v, tb, sizeof tb));
}

/* Reads a one-based layer list into mark[] (1 = listed). Returns the count, or
 * -1 after reporting problems. n_layers < 1 means it is unknown: range checks
 * are then skipped (the missing key is reported on its own). */
static int64_t read_layer_list(rd *r, const char *name, int required, int64_t n_layers, uint8_t *mark) {
    char path[160], tb[64];
    const json_t *v;
    if (r->lin) {
        v = get_in(r->lin, r->lin_pfx, name, path, sizeof path);
        if (!v) snprintf(path, sizeof path, "%s%s", r->lin_pfx, name);
    } else {
        v = find_opt(r, name, path, sizeof path);
        if (!v) snprintf(path, sizeof path, "%s%s", r->text ? TEXT_PFX : "", name);
    }
    if (!v) {
        if (required) problem(r, "missing required key '%s'", path);
        return -1;
    }
    const char *based = r->layer_base ? "one-based" : "zero-based";
    if (!json_is_array(v)) { problem(r, "'%s' must be a list of %s layer numbers, got %s", path, based, jtype(v, tb, sizeof tb)); return -1; }
    if (required && json_array_size(v) == 0) { problem(r, "'%s' is empty: at least one full-attention layer is needed", path); return -1; }
    int bad = 0, shown = 0;
    int64_t count = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) {
            /* A fuzzed list can hold thousands of entries: cap the lines. */
            if (shown++ < 8) problem(r, "'%s'[%zu] must be an integer, got %s", path, i, jtype(e, tb, sizeof tb));
            bad = 1;
            continue;
        }
        int64_t x = json_integer_value(e);
        if (n_layers < 1) continue;
        if (x < r->layer_base || x > n_layers - 1 + r->layer_base) {
            if (shown++ < 8)
                problem(r, "'%s' entry %lld is out of range %lld..%lld (the list is %s)", path, (long long)x,
                        (long long)r->layer_base, (long long)(n_layers - 1 + r->layer_base), based);
            bad = 1;
            continue;
        }
        x += 1 - r->layer_base; /* one-based from here */
        if (mark[x - 1]) {
            if (shown++ < 8) problem(r, "'%s' lists layer %lld twice", path, (long long)x);
            bad = 1;
            continue;
        }
        mark[x - 1] = 1;
        count++;
    }
    return bad ? -1 : count;
}

/* Whether a layer list is given (present and not null), where read_layer_list looks. */
static int layer_list_given(const rd *r, const char *name) {
    char path[160];
    const json_t *v = r->lin ? get_in(r->lin, r->lin_pfx, name, path, sizeof path) : find_opt(r, name, path, sizeof path);
    return v && !json_is_null(v);
}

/* compressed-tensors config_groups: every group's weights must be what
 * pack-quantized INT4 decodes (4 bits, symmetric int, groups of 32); keys
 * absent are not checked. */
static void read_i4_groups(rd *r, const json_t *q, const char *path) {
    const json_t *g = json_object_get(q, "config_groups"), *grp;
    const char *gname;
    if (!g || !json_is_object(g)) return;
    json_object_foreach((json_t *)g, gname, grp) {
        const json_t *w = json_is_object(grp) ? json_object_get(grp, "weights") : NULL;
        if (!w || !json_is_object(w)) continue;
        const json_t *nb = json_object_get(w, "num_bits"), *gs = json_object_get(w, "group_size"),
                     *sy = json_object_get(w, "symmetric"), *ty = json_object_get(w, "type"),
                     *st = json_object_get(w, "strategy");
        if (nb && !(json_is_integer(nb) && json_integer_value(nb) == 4))
            problem(r, "'%s.config_groups.%s.weights.num_bits' must be 4 (INT4 pack-quantized)", path, gname);
        if (gs && !(json_is_integer(gs) && json_integer_value(gs) == I4_GROUP))
            problem(r, "'%s.config_groups.%s.weights.group_size' must be %d (INT4 pack-quantized)", path, gname, I4_GROUP);
        if (sy && !json_is_true(sy))
            problem(r, "'%s.config_groups.%s.weights.symmetric' must be true: asymmetric INT4 (zero points) is not "
                       "implemented", path, gname);
        if (ty && !(json_is_string(ty) && !strcasecmp(json_string_value(ty), "int")))
            problem(r, "'%s.config_groups.%s.weights.type' must be \"int\" (INT4 pack-quantized)", path, gname);
        if (st && !(json_is_string(st) && !strcasecmp(json_string_value(st), "group")))
            problem(r, "'%s.config_groups.%s.weights.strategy' must be \"group\" (scales per %d inputs)", path, gname,
                    I4_GROUP);
    }
}

static void read_quant(rd *r, cfg *c) {
    char path[160], tb[64];
    const json_t *q = get_in(r->root, "", "quantization_config", path, sizeof path);
    if (!q) q = get_in(r->text, TEXT_PFX, "quantization_config", path, sizeof path);
    if (!q || json_is_null(q)) return;
    if (!json_is_object(q)) { problem(r, "'%s' must be an object, got %s", path, jtype(q, tb, sizeof tb)); return; }
    const json_t *f = json_object_get(q, "format");
    if (f && !json_is_string(f)) { problem(r, "'%s.format' must be a string, got %s", path, jtype(f, tb, sizeof tb)); return; }
    c->mxfp4_experts = f && !strcasecmp(json_string_value(f), "mxfp4");
    /* FP8 (DeepSeek-V3, K2-Instruct) and INT4 (K2-Thinking) checkpoints: the
     * census counts bytes as they declare; the headers decide at bind (model_wf). */
    const json_t *m = json_object_get(q, "quant_method");
    if (m && json_is_string(m) && !strcasecmp(json_string_value(m), "fp8")) {
        c->wf = SW_EXP_FP8 | SW_TRUNK_FP8;
        const json_t *bs = json_object_get(q, "weight_block_size");
        if (bs && !(json_is_array(bs) && json_array_size(bs) == 2 && json_is_integer(json_array_get(bs, 0)) &&
                    json_integer_value(json_array_get(bs, 0)) == FP8_BLOCK && json_is_integer(json_array_get(bs, 1)) &&
                    json_integer_value(json_array_get(bs, 1)) == FP8_BLOCK))
            problem(r, "'%s.weight_block_size' must be [%d, %d] for fp8", path, FP8_BLOCK, FP8_BLOCK);
    } else if (m && json_is_string(m) && !strcasecmp(json_string_value(m), "compressed-tensors")) {
        c->wf = (c->wf & ~SW_EXP_MASK) | SW_EXP_INT4;
        /* compressed-tensors names many layouts; only pack-quantized symmetric
         * INT4 in groups of 32 is what the kernels decode (another value of
         * format is refused by the architecture's fixed keys) */
        if (!f) problem(r, "'%s.format' is missing: compressed-tensors weights are read only as \"pack-quantized\" "
                           "(INT4, 8 values per int32, groups of %d)", path, I4_GROUP);
        read_i4_groups(r, q, path);
    }
    /* format and quant_method must describe one format: a config that says
     * pack-quantized for MXFP4 experts (or the reverse) describes weights one of
     * the two readings would decode wrongly */
    const int ct = m && json_is_string(m) && !strcasecmp(json_string_value(m), "compressed-tensors");
    const int pq = f && !strcasecmp(json_string_value(f), "pack-quantized");
    if (ct && !pq)
        problem(r, "'%s.quant_method' is \"compressed-tensors\": only its \"pack-quantized\" format is implemented, 'format' is %s",
                path, f ? json_string_value(f) : "absent");
    else if (pq && !ct)
        problem(r, "'%s.format' is \"pack-quantized\", which needs 'quant_method' \"compressed-tensors\"", path);
    const json_t *g = json_object_get(q, "group_size");
    /* The MXFP4 group is a compile-time constant of the kernels: a config that
     * claims another one describes weights we would decode wrongly. */
    if (c->mxfp4_experts && g && !(json_is_integer(g) && json_integer_value(g) == MXFP4_GROUP))
        problem(r, "'%s.group_size' must be %d for mxfp4, got %s", path, MXFP4_GROUP, jtype(g, tb, sizeof tb));
}

/* ================================================= keys fixed by the engine */

/* Keys whose value selects math the engine does not implement: each
 * architecture's table (arch_k3.c, arch_kimi_linear.c) lists the values it does
 * implement, as JSON texts. Any other value is refused, naming the file, the key
 * and the value, rather than run with the wrong math. Keys that do not change the
 * math are not listed and never refused. A key under "quantization_config." is
 * looked up in that object (root, else text_config); any other key in
 * text_config and at the root, both checked. */

/* Does v equal the JSON text (a string, true, false or an integer)? Strings
 * compare without case ("MXFP4" has always been read as mxfp4); 1.0 is not the
 * integer 1, nor "1". No allocation: a parse under memory pressure must fail
 * with ENOMEM, never with a wrong refusal. */
static int fixed_accepts(const json_t *v, const char *text) {
    size_t n = strlen(text);
    if (n >= 2 && text[0] == '"' && text[n - 1] == '"')
        return json_is_string(v) && json_string_length(v) == n - 2 && !strncasecmp(json_string_value(v), text + 1, n - 2);
    if (!strcmp(text, "true")) return json_is_true(v);
    if (!strcmp(text, "false")) return json_is_false(v);
    char *end;
    long long x = strtoll(text, &end, 10);
    return *end == 0 && json_is_integer(v) && json_integer_value(v) == x;
}

static void check_fixed_one(rd *r, const fixed_key *k, const json_t *v, const char *path) {
    if (!v || json_is_null(v)) return;
    for (int i = 0; i < FIXED_MAX_ACCEPT && k->accept[i]; i++)
        if (fixed_accepts(v, k->accept[i])) return;
    char tb[64], acc[128] = "";
    for (int i = 0; i < FIXED_MAX_ACCEPT && k->accept[i]; i++) {
        size_t n = strlen(acc);
        snprintf(acc + n, sizeof acc - n, "%s%s", i ? " or " : "", k->accept[i]);
    }
    const char *val = tb;
    if (json_is_string(v)) snprintf(tb, sizeof tb, "\"%.40s\"", json_string_value(v));
    else val = jtype(v, tb, sizeof tb);
    problem(r, "'%s' is %s: not supported, this engine implements only %s (%s)", path, val, acc, k->why);
}

static void check_fixed(rd *r, const arch_desc *ad) {
    static const char qpfx[] = "quantization_config.";
    char path[160];
    const json_t *q = json_object_get(r->root, "quantization_config");
    const char *qp = "";
    if (!q && r->text) { q = json_object_get(r->text, "quantization_config"); qp = TEXT_PFX; }
    if (q && !json_is_object(q)) q = NULL; /* reported by read_quant */
    for (size_t i = 0; i < ad->n_fixed; i++) {
        const fixed_key *k = &ad->fixed[i];
        if (!strncmp(k->name, qpfx, sizeof qpfx - 1)) {
            if (!q) continue;
            const char *sub = k->name + sizeof qpfx - 1;
            snprintf(path, sizeof path, "%s%s", qp, k->name);
            const json_t *v = json_object_get(q, sub);
            /* a non-string format is reported by read_quant */
            if (!strcmp(sub, "format") && v && !json_is_string(v)) continue;
            check_fixed_one(r, k, v, path);
            continue;
        }
        if (r->text) {
            snprintf(path, sizeof path, TEXT_PFX "%s", k->name);
            check_fixed_one(r, k, json_object_get(r->text, k->name), path);
        }
        check_fixed_one(r, k, json_object_get(r->root, k->name), k->name);
    }
}

/* The architecture the config names (arch.h): model_type at the root, else in
 * text_config, and architectures[]. Names that disagree are a problem; names
 * this engine does not know read as K3, as before architectures were told apart. */
static const arch_desc *parse_arch(rd *r) {
    const json_t *mt = json_object_get(r->root, "model_type");
    if (!json_is_string(mt) && r->text) mt = json_object_get(r->text, "model_type");
    const char *archs[4] = {0};
    size_t na = 0;
    const json_t *a = json_object_get(r->root, "architectures");
    for (size_t i = 0; json_is_array(a) && i < json_array_size(a) && na < 4; i++)
        if (json_is_string(json_array_get(a, i))) archs[na++] = json_string_value(json_array_get(a, i));
    const char *mts = json_is_string(mt) ? json_string_value(mt) : NULL;
    const char *why = arch_refused(mts, archs, na);
    if (why) { problem(r, "%s", why); return NULL; }
    int conflict;
    const arch_desc *ad = arch_detect(json_is_string(mt) ? json_string_value(mt) : NULL, archs, na, &conflict);
    if (conflict)
        problem(r, "'model_type' \"%.40s\" and 'architectures' name different architectures", json_string_value(mt));
    return ad;
}

static void cfg_defaults(cfg *c) {
    memset(c, 0, sizeof *c);
    c->mla_out_gate = 1;
    c->moe_renorm = 1;
    c->latent_norm = 1;
    c->bos_id = -1;
    c->pad_id = -1;
    c->max_ctx = CFG_DEFAULT_CTX;
}

/* Copies the collected problems into err; when they do not fit, cuts at a line
 * boundary and says so rather than stopping mid-sentence. */
int cfg_flush_problems(sbuf *pb, char *err, size_t errlen) {
    static const char more[] = "\n(more problems not shown)";
    if (err && errlen) {
        size_t n = pb->len;
        while (n && pb->s[n - 1] == '\n') n--; /* no trailing newline */
        const char *tail = "";
        if (n >= errlen) {
            n = errlen > sizeof more ? errlen - sizeof more : 0;
            while (n && pb->s[n] != '\n') n--;
            if (n) tail = more;
            else n = errlen - 1; /* not even one line fits: its start, raw */
        }
        if (n) memcpy(err, pb->s, n);
        memcpy(err + n, tail, strlen(tail) + 1);
    }
    sbuf_free(pb);
    return STRATA_EFORMAT;
}

int cfg_parse(cfg *c, const uint8_t *buf, size_t len, const char *what, char *err, size_t errlen) {
    cfg_defaults(c);
    if (!what) what = "config";
    json_t *root;
    int jrc = jsonx_parse(&root, buf, len, what, err, errlen);
    if (jrc) return jrc;
    sbuf pb = {0};
    rd r = {.what = what, .pb = &pb, .root = root, .lin_pfx = "linear_attn_config.", .layer_base = 1};
    char tb[64];
    if (!json_is_object(root)) {
        problem(&r, "the top level must be an object, got %s", jtype(root, tb, sizeof tb));
        goto done;
    }
    const json_t *t = json_object_get(root, "text_config");
    if (t && !json_is_null(t)) {
        if (!json_is_object(t)) { problem(&r, "'text_config' must be an object, got %s", jtype(t, tb, sizeof tb)); goto done; }
        r.text = t;
    }
    const json_t *scope = r.text ? r.text : root;
    const json_t *l = json_object_get(scope, "linear_attn_config");
    if (l && !json_is_null(l)) {
        if (!json_is_object(l)) {
            problem(&r, "'%slinear_attn_config' must be an object, got %s", r.text ? TEXT_PFX : "", jtype(l, tb, sizeof tb));
            goto done;
        }
        r.lin = l;
        r.lin_pfx = r.text ? "text_config.linear_attn_config." : "linear_attn_config.";
        /* kda_layer_index_base (family-math 12.2): some configs number the lists
         * from 0; Kimi Linear and K3 from 1 (the default). */
        const json_t *b = json_object_get(l, "kda_layer_index_base");
        if (b && !json_is_null(b)) {
            if (!json_is_integer(b) || (json_integer_value(b) != 0 && json_integer_value(b) != 1))
                problem(&r, "'%skda_layer_index_base' must be 0 or 1", r.lin_pfx);
            else
                r.layer_base = json_integer_value(b);
        }
    }
    const arch_desc *ad = parse_arch(&r);
    if (!ad) goto done;
    c->arch = ad->id;
    ad->defaults(c);
    for (size_t i = 0; i < N_KEYS; i++) {
        const key *k = &k_keys[i];
        const uint64_t bit = ARCH_BIT(k->id);
        if (ad->keys_skip & bit) { r.have |= bit; continue; } /* the description sets it */
        if ((ad->keys_nullable & bit) && k->type == T_INT) {
            char kp[160];
            const json_t *v = find_key(&r, k, kp, sizeof kp);
            if (v && json_is_null(v)) { *(int64_t *)((char *)c + k->off) = 0; r.have |= bit; continue; }
        }
        read_key(&r, c, k);
    }

    /* The layer map needs a usable n_layers; otherwise its range check is moot
     * and the n_layers problem is reported by validation. */
    int64_t nl = (HAVE(r.have, F_LAYERS) && c->n_layers >= 1 && c->n_layers <= CFG_MAX_LAYERS) ? c->n_layers : 0;
    /* every layer MLA (no_kda): the description fills the map in finish() */
    int64_t nfull = -1;
    int from_kda = 0;
    if (!(ad->keys_skip & ARCH_BIT(F_FULL))) {
        /* Hugging Face's and vLLM's is_kda_layer read kda_layers alone (family-math
         * 2): full_attn_layers is its complement, so a config that gives only
         * kda_layers names every layer's kind and is read that way. */
        from_kda = !layer_list_given(&r, "full_attn_layers") && layer_list_given(&r, "kda_layers");
        if (from_kda) {
            uint8_t *km = base_calloc(CFG_MAX_LAYERS, 1, MEM_MISC);
            if (!km) problem(&r, "out of memory reading kda_layers");
            int64_t nk = km ? read_layer_list(&r, "kda_layers", 0, nl, km) : -1;
            if (nk >= 0 && nl) {
                for (int64_t L = 0; L < nl; L++) c->is_mla[L] = !km[L];
                nfull = nl - nk;
            }
            base_free(km);
        } else {
            nfull = read_layer_list(&r, "full_attn_layers", 1, nl, c->is_mla);
        }
    }
    if (ad->keys_skip & ARCH_BIT(F_FULL)) r.have |= ARCH_BIT(F_FULL);
    if (nfull >= 0 && nl && from_kda) {
        c->n_mla = nfull;
        r.have |= UINT64_C(1) << F_FULL;
    } else if (nfull >= 0 && nl) {
        c->n_mla = nfull;
        r.have |= UINT64_C(1) << F_FULL;
        /* kda_layers is redundant; when present it must be the exact complement. */
        uint8_t *km = base_calloc(CFG_MAX_LAYERS, 1, MEM_MISC);
        if (km) {
            int64_t nk = read_layer_list(&r, "kda_layers", 0, nl, km);
            if (nk >= 0) {
                int shown = 0;
                for (int64_t L = 0; L < nl; L++)
                    if (km[L] == c->is_mla[L] && shown++ < 8)
                        problem(&r, "kda_layers and full_attn_layers disagree on layer %lld (one-based): "
                                    "it must be in exactly one of them", (long long)L + 1);
            }
            base_free(km);
        } else {
            problem(&r, "out of memory checking kda_layers");
        }
    }

    /* Special ids and context (optional). */
    int64_t nb = 0, np = 0;
    read_id(&r, "bos_token_id", &c->bos_id, &nb, 1);
    read_id(&r, "pad_token_id", &c->pad_id, &np, 1);
    read_id(&r, "eos_token_id", c->eos_ids, &c->n_eos, CFG_MAX_EOS);
    char path[160];
    const json_t *m = find_opt(&r, "max_position_embeddings", path, sizeof path);
    if (!m && c->arch == ARCH_KIMI_LINEAR) m = find_opt(&r, "model_max_length", path, sizeof path);
    if (m) {
        if (!json_is_integer(m) || json_integer_value(m) < 1)
            problem(&r, "'%s' must be a positive integer, got %s", path, jtype(m, tb, sizeof tb));
        else c->max_ctx = json_integer_value(m);
    }
    r.have |= (UINT64_C(1) << F_IDS) | (UINT64_C(1) << F_CTX);
    read_quant(&r, c);
    check_fixed(&r, ad);
    if (ad->read) ad->read(c, &r);
    ad->finish(c);
    cfg_check_all(c, r.have, what, &pb);
done:
    json_decref(root);
    if (pb.n) return cfg_flush_problems(&pb, err, errlen);
    sbuf_free(&pb);
    return STRATA_OK;
}

int cfg_load(cfg *c, const char *path, char *err, size_t errlen) {
    uint8_t *buf;
    size_t len;
    /* Real configs are a few KB; 16 MB leaves room for any sane file. */
    int rc = base_read_file(path, 16u << 20, &buf, &len, err, errlen);
    if (rc) { cfg_defaults(c); return rc; }
    rc = cfg_parse(c, buf, len, path, err, errlen);
    base_free(buf);
    return rc;
}

/* ==================================================================== K3 */

void cfg_k3(cfg *c) {
    cfg_defaults(c);
    c->hidden = 7168;
    c->n_layers = 93;
    c->vocab = 163840;
    c->rms_eps = 1e-5;
    c->kda_heads = 96;
    c->kda_head_dim = 128;
    c->conv_k = 4;
    c->gate_lb = -5.0;
    c->n_heads = 96;
    c->q_lora = 1536;
    c->kv_lora = 512;
    c->qk_nope = 128;
    c->qk_rope = 64;
    c->v_head = 128;
    c->n_experts = 896;
    c->topk = 16;
    c->n_shared = 2;
    c->latent = 3584;
    c->moe_inter = 3072;
    c->routed_scale = 1.0;
    c->first_dense = 1;
    c->dense_inter = 33792;
    c->attn_res_block = 12;
    c->situ_b1 = 4.0;
    c->situ_b2 = 25.0;
    /* One-based full_attn_layers 4, 8, ..., 92 and 93: every fourth layer plus a
     * final MLA so the last layer is global (docs/architecture.md, Layer map). */
    for (int64_t L1 = 4; L1 <= 92; L1 += 4) c->is_mla[L1 - 1] = 1;
    c->is_mla[92] = 1;
    c->n_mla = 24;
    c->bos_id = 163584;
    c->pad_id = 163839;
    c->n_eos = 1;
    c->eos_ids[0] = 163585;
    c->mxfp4_experts = 1;
}

/* ================================================================ writer */

void cfg_json_quant(sbuf *b, const cfg *c) {
    if (c->wf & SW_TRUNK_FP8 || (c->wf & SW_EXP_MASK) == SW_EXP_FP8)
        sbuf_printf(b, ",\n  \"quantization_config\": {\n    \"activation_scheme\": \"dynamic\",\n    \"fmt\": \"e4m3\",\n"
                       "    \"quant_method\": \"fp8\",\n    \"weight_block_size\": [\n      %d,\n      %d\n    ]\n  }",
                    FP8_BLOCK, FP8_BLOCK);
    else if ((c->wf & SW_EXP_MASK) == SW_EXP_INT4)
        /* K2-Thinking's fragment as published (tests/data/configs/kimi-k2-thinking-style.config.json) */
        sbuf_printf(b, ",\n  \"quantization_config\": {\n    \"config_groups\": {\n      \"group_0\": {\n"
                       "        \"input_activations\": null,\n        \"output_activations\": null,\n"
                       "        \"targets\": [\"Linear\"],\n        \"weights\": {\n          \"actorder\": null,\n"
                       "          \"block_structure\": null,\n          \"dynamic\": false,\n          \"group_size\": %d,\n"
                       "          \"num_bits\": 4,\n          \"observer\": \"minmax\",\n          \"observer_kwargs\": {},\n"
                       "          \"strategy\": \"group\",\n          \"symmetric\": true,\n"
                       "          \"type\": \"int\"\n        }\n      }\n    },\n    \"format\": \"pack-quantized\",\n"
                       "    \"ignore\": [\"lm_head\", \"re:.*self_attn.*\", \"re:.*shared_experts.*\", \"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"],\n"
                       "    \"kv_cache_scheme\": null,\n    \"quant_method\": \"compressed-tensors\",\n"
                       "    \"quantization_status\": \"compressed\"\n  }",
                    I4_GROUP);
}

/* Shortest "%.Ng" that reads back to the same double, so the file stays
 * readable (1e-05, not 1.0000000000000001e-05) and still round-trips. */
void cfg_json_num(sbuf *b, double x) {
    char s[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(s, sizeof s, "%.*g", p, x);
        if (strtod(s, NULL) == x) break;
    }
    if (!strpbrk(s, ".eEn")) strcat(s, ".0"); /* keep it a JSON real */
    sbuf_printf(b, "%s", s);
}

void cfg_json_layers(sbuf *b, const cfg *c, int want_mla, const char *ind, const char *close_ind) {
    sbuf_printf(b, "[");
    int first = 1;
    for (int64_t L = 0; L < c->n_layers && L < CFG_MAX_LAYERS; L++) {
        if (!!c->is_mla[L] != want_mla) continue;
        sbuf_printf(b, "%s\n%s%lld", first ? "" : ",", ind, (long long)L + 1);
        first = 0;
    }
    sbuf_printf(b, "%s%s]", first ? "" : "\n", first ? "" : close_ind);
}

char *cfg_to_json(const cfg *c) { return arch_of(c)->to_json(c); }

/* The released K3 shape (nested). */
char *arch_k3_to_json(const cfg *c) {
    sbuf b = {0};
#define I(k, v) sbuf_printf(&b, "    \"%s\": %lld,\n", k, (long long)(v))
#define BO(k, v) sbuf_printf(&b, "    \"%s\": %s,\n", k, (v) ? "true" : "false")
#define N(k, v) do { sbuf_printf(&b, "    \"%s\": ", k); cfg_json_num(&b, v); sbuf_printf(&b, ",\n"); } while (0)
    sbuf_printf(&b, "{\n  \"architectures\": [\n    \"KimiK3ForConditionalGeneration\"\n  ],\n"
                    "  \"model_type\": \"kimi_k3\",\n  \"torch_dtype\": \"bfloat16\",\n"
                    "  \"text_config\": {\n    \"model_type\": \"kimi_k3_text\",\n");
    I("vocab_size", c->vocab);
    I("hidden_size", c->hidden);
    I("num_hidden_layers", c->n_layers);
    N("rms_norm_eps", c->rms_eps);
    BO("tie_word_embeddings", 0);
    I("num_attention_heads", c->n_heads);
    I("q_lora_rank", c->q_lora);
    I("kv_lora_rank", c->kv_lora);
    I("qk_nope_head_dim", c->qk_nope);
    I("qk_rope_head_dim", c->qk_rope);
    I("v_head_dim", c->v_head);
    BO("mla_use_nope", 1);
    BO("mla_use_output_gate", c->mla_out_gate);
    I("num_experts", c->n_experts);
    I("num_experts_per_token", c->topk);
    I("num_shared_experts", c->n_shared);
    I("routed_expert_hidden_size", c->latent);
    I("moe_intermediate_size", c->moe_inter);
    N("routed_scaling_factor", c->routed_scale);
    BO("moe_renormalize", c->moe_renorm);
    BO("latent_moe_use_norm", c->latent_norm);
    sbuf_printf(&b, "    \"moe_router_activation_func\": \"sigmoid\",\n");
    I("num_expert_group", 1);
    I("topk_group", 1);
    I("first_k_dense_replace", c->first_dense);
    I("intermediate_size", c->dense_inter);
    I("attn_res_block_size", c->attn_res_block);
    N("activation_situ_beta", c->situ_b1);
    N("activation_situ_linear_beta", c->situ_b2);
    I("num_nextn_predict_layers", 0);
    if (c->max_ctx != CFG_DEFAULT_CTX) I("max_position_embeddings", c->max_ctx);
    if (c->bos_id >= 0) I("bos_token_id", c->bos_id);
    if (c->n_eos == 1) I("eos_token_id", c->eos_ids[0]);
    else if (c->n_eos > 1) {
        sbuf_printf(&b, "    \"eos_token_id\": [");
        for (int64_t i = 0; i < c->n_eos && i < CFG_MAX_EOS; i++)
            sbuf_printf(&b, "%s%lld", i ? ", " : "", (long long)c->eos_ids[i]);
        sbuf_printf(&b, "],\n");
    }
    if (c->pad_id >= 0) I("pad_token_id", c->pad_id);
    sbuf_printf(&b, "    \"torch_dtype\": \"bfloat16\",\n    \"linear_attn_config\": {\n");
    sbuf_printf(&b, "      \"num_heads\": %lld,\n      \"head_dim\": %lld,\n      \"short_conv_kernel_size\": %lld,\n"
                    "      \"gate_lower_bound\": ",
                (long long)c->kda_heads, (long long)c->kda_head_dim, (long long)c->conv_k);
    cfg_json_num(&b, c->gate_lb);
    sbuf_printf(&b, ",\n      \"full_attn_layers\": ");
    cfg_json_layers(&b, c, 1, "        ", "      ");
    sbuf_printf(&b, ",\n      \"kda_layers\": ");
    cfg_json_layers(&b, c, 0, "        ", "      ");
    sbuf_printf(&b, "\n    }\n  }");
    if (c->wf > SW_EXP_PLAIN)
        cfg_json_quant(&b, c);
    else if (c->mxfp4_experts)
        sbuf_printf(&b, ",\n  \"quantization_config\": {\n    \"format\": \"mxfp4\",\n    \"group_size\": %d,\n"
                        "    \"scale_format\": \"e8m0\",\n"
                        "    \"pack_order\": \"element 2i in the low nibble of byte i\",\n"
                        "    \"modules\": \"language_model.model.layers.*.block_sparse_moe.experts.*.w{1,2,3}\"\n  }",
                    MXFP4_GROUP);
    sbuf_printf(&b, "\n}\n");
#undef I
#undef BO
#undef N
    return b.s;
}

/* ================================================================ census */

int cfg_bind_mtp(cfg *c) {
    if (c->mtp || c->n_mtp < 1 || !c->no_kda || c->n_layers + 1 > CFG_MAX_LAYERS) return -1;
    c->is_mla[c->n_layers] = 1; /* DeepSeek-V3's MTP block: MLA, then MoE (n_layers >= first_dense) */
    c->n_layers++;
    c->n_mla++;
    c->mtp = 1;
    return 0;
}
