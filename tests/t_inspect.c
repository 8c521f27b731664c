/*
 * t_inspect.c: model_bind_check and `strata inspect` on tiny model directories
 * written here by a minimal safetensors writer (independent of the generator and
 * of stw.c, so a bug there cannot hide one here), and the K3 census through the
 * CLI on a config written by cfg_to_json(cfg_k3()).
 */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include "cfg.h"
#include "jsonx.h"
#include "model.h"
#include "st.h"
#include "strata.h"
#include "test.h"

/* ---------------------------------------------------------- tiny model */

static void tiny_cfg(cfg *c) {
    cfg_k3(c);
    memset(c->is_mla, 0, sizeof c->is_mla);
    c->hidden = 64; c->n_layers = 4; c->vocab = 256; c->rms_eps = 1e-5;
    c->kda_heads = 2; c->kda_head_dim = 16;
    c->n_heads = 2; c->q_lora = 32; c->kv_lora = 32; c->qk_nope = 16; c->qk_rope = 8; c->v_head = 16;
    c->n_experts = 4; c->topk = 2; c->n_shared = 1; c->latent = 64; c->moe_inter = 32;
    c->dense_inter = 96; c->attn_res_block = 2;
    c->is_mla[1] = c->is_mla[3] = 1; c->n_mla = 2;
    c->bos_id = 0; c->pad_id = 255; c->n_eos = 1; c->eos_ids[0] = 1;
}

/* What to break while writing. */
typedef struct mw {
    const char *reshape;    /* tensor whose first dimension is doubled */
    const char *drop;       /* tensor left out */
    const char *retype;     /* tensor written as F16 -> fine for trunk; U8 otherwise */
    int extra;              /* add two unused tensors */
    int bf16_experts;       /* plain BF16 expert weights */
    int scale255;           /* one scale byte of 255 in layer 2 expert 1 w2 */
    int split_expert;       /* move layer 1 expert 0's w3.weight_scale to the end */
    int truncate;           /* cut the file short by 100 bytes */
    int vec2d;              /* vectors stored as [1, n] */
} mw;

typedef struct ent {
    char name[160];
    int dtype, ndim, role;
    int64_t shape[3], layer, expert;
    uint64_t nbytes;
} ent;

typedef struct ents {
    ent *e;
    size_t n, cap;
    const mw *m;
} ents;

static int collect(void *ud, const tspec *t) {
    ents *es = ud;
    if (es->m->drop && !strcmp(t->name, es->m->drop)) return 0;
    if (es->n == es->cap) {
        es->cap = es->cap ? es->cap * 2 : 256;
        es->e = base_realloc(es->e, es->cap * sizeof *es->e, MEM_MISC);
    }
    ent *e = &es->e[es->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", t->name);
    e->ndim = t->ndim;
    e->role = t->role;
    e->layer = t->layer;
    e->expert = t->expert;
    for (int i = 0; i < 3; i++) e->shape[i] = t->shape[i];
    e->dtype = (t->kind == TK_PACKED || t->kind == TK_SCALE) ? DT_U8 : DT_BF16;
    if (es->m->reshape && !strcmp(t->name, es->m->reshape)) e->shape[0] *= 2;
    if (es->m->vec2d && t->kind == TK_VECTOR) { e->ndim = 2; e->shape[1] = e->shape[0]; e->shape[0] = 1; }
    if (es->m->retype && !strcmp(t->name, es->m->retype)) e->dtype = e->dtype == DT_U8 ? DT_BF16 : DT_U8;
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    e->nbytes = (uint64_t)n * (uint64_t)st_dtype_size(e->dtype);
    return 0;
}

/* Writes DIR/config.json and DIR/model.safetensors; returns DIR (static). */
static const char *write_model(const char *name, const cfg *c, const mw *m) {
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", t_tmpdir, name);
    base_rm_rf(dir);
    base_mkdir_p(dir, NULL, 0);
    char path[1200];
    char *js = cfg_to_json(c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    fputs(js, f);
    fclose(f);
    base_free(js);

    ents es = {NULL, 0, 0, m};
    schema_walk(c, m->bf16_experts, collect, &es);
    if (m->extra) {
        mw none = {0};
        es.m = &none;
        tspec t = {0};
        snprintf(t.name, sizeof t.name, "vision_tower.blocks.0.weight");
        t.ndim = 1; t.shape[0] = 8; t.kind = TK_VECTOR;
        collect(&es, &t);
        snprintf(t.name, sizeof t.name, "language_model.model.mtp.0.weight");
        collect(&es, &t);
        es.m = m;
    }
    if (m->split_expert) {
        for (size_t i = 0; i < es.n; i++)
            if (es.e[i].layer == 1 && es.e[i].expert == 0 && es.e[i].role == R_EXP_W3S) {
                ent t = es.e[i];
                memmove(&es.e[i], &es.e[i + 1], (es.n - i - 1) * sizeof t);
                es.e[es.n - 1] = t;
                break;
            }
    }
    /* Header JSON, padded with spaces to a multiple of 8 as the format asks. */
    sbuf h = {0};
    uint64_t off = 0;
    sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < es.n; i++) {
        const ent *e = &es.e[i];
        sbuf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", e->name, st_dtype_name(e->dtype));
        for (int d = 0; d < e->ndim; d++) sbuf_printf(&h, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        sbuf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + e->nbytes));
        off += e->nbytes;
    }
    sbuf_printf(&h, "}");
    while (h.len % 8) sbuf_printf(&h, " ");
    uint8_t *data = base_calloc(off ? off : 1, 1, MEM_MISC);
    /* Scales of 127 (= 2^0) everywhere, as a sane checkpoint would have. */
    uint64_t o = 0;
    for (size_t i = 0; i < es.n; i++) {
        const ent *e = &es.e[i];
        int is_scale = e->role == R_EXP_W1S || e->role == R_EXP_W2S || e->role == R_EXP_W3S;
        if (is_scale && e->dtype == DT_U8) {
            memset(data + o, 127, e->nbytes);
            if (m->scale255 && e->layer == 2 && e->expert == 1 && e->role == R_EXP_W2S) data[o + 5] = 255;
        }
        o += e->nbytes;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    f = fopen(path, "wb");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(h.s, 1, h.len, f);
    fwrite(data, 1, off - (m->truncate ? 100 : 0), f);
    fclose(f);
    base_free(data);
    sbuf_free(&h);
    base_free(es.e);
    return dir;
}

static int run_inspect(const char *args, char **out) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "%s inspect %s", t_strata(), args);
    return t_run(cmd, out);
}

/* ---------------------------------------------------------------- tests */

TEST(inspect_usage) {
    char *out;
    CHECK(run_inspect("", &out) == 2);
    CHECK(strstr(out, "missing MODEL_DIR"));
    base_free(out);
    CHECK(run_inspect("--frobnicate", &out) == 2);
    CHECK(strstr(out, "unknown option '--frobnicate'"));
    base_free(out);
    CHECK(run_inspect("--config", &out) == 2);
    CHECK(strstr(out, "needs a value"));
    base_free(out);
    CHECK(run_inspect("somedir --config x.json", &out) == 2);
    base_free(out);
    CHECK(run_inspect("a b", &out) == 2);
    base_free(out);
    CHECK(run_inspect("--config x.json --scan", &out) == 2);
    base_free(out);
    CHECK(run_inspect("--help", &out) == 0);
    CHECK(strstr(out, "usage: strata inspect"));
    base_free(out);
}

TEST(inspect_config_errors) {
    cfg c;
    tiny_cfg(&c);
    char *js = cfg_to_json(&c);
    char *out;
    /* Missing key: the message names the file and the key. */
    char *p = strstr(js, "\"q_lora_rank\"");
    CHECK(p != NULL);
    memcpy(p + 1, "Q", 1);
    const char *path = t_write("nokey.json", js, strlen(js));
    char args[1200];
    snprintf(args, sizeof args, "--config %s", path);
    CHECK(run_inspect(args, &out) == 1);
    CHECK_MSG(strstr(out, path) && strstr(out, "missing required key 'text_config.q_lora_rank'"), "%s", out);
    base_free(out);
    memcpy(p + 1, "q", 1);
    /* Out-of-range full_attn_layers entry (one-based: 5 of 4 layers). */
    p = strstr(js, "\"full_attn_layers\": [\n        2");
    CHECK(p != NULL);
    p[strlen("\"full_attn_layers\": [\n        ")] = '5';
    path = t_write("range.json", js, strlen(js));
    snprintf(args, sizeof args, "--config %s", path);
    CHECK(run_inspect(args, &out) == 1);
    CHECK_MSG(strstr(out, path) && strstr(out, "entry 5 is out of range 1..4"), "%s", out);
    base_free(out);
    /* JSON output on a broken config: ok false, the problems listed. */
    snprintf(args, sizeof args, "--json --config %s", path);
    CHECK(run_inspect(args, &out) == 1);
    CHECK(strstr(out, "\"ok\": false") && strstr(out, "out of range"));
    base_free(out);
    /* Missing file. */
    CHECK(run_inspect("--config /nonexistent/config.json", &out) == 1);
    CHECK(strstr(out, "/nonexistent/config.json"));
    base_free(out);
    base_free(js);
}

TEST(inspect_k3_census) {
    cfg c;
    cfg_k3(&c);
    char *js = cfg_to_json(&c);
    const char *path = t_write("k3.json", js, strlen(js));
    base_free(js);
    char args[1200], *out;
    snprintf(args, sizeof args, "--config %s", path);
    CHECK(run_inspect(args, &out) == 0);
    CHECK_MSG(strstr(out, "2.78T parameters (2,779,484,478,208)"), "%s", out);
    CHECK(strstr(out, "82,432 experts x 17,547,264 bytes = 1.446 TB"));
    CHECK(strstr(out, "trunk + embeddings (bf16): 113.49 GB (trunk 108.79 GB, embeddings 4.70 GB)"));
    CHECK(strstr(out, "KDA + dense: 1 layer x 2.341 GB"));
    CHECK(strstr(out, "KDA + MoE: 68 layers x 1.267 GB"));
    CHECK(strstr(out, "MLA + MoE: 24 layers x 0.844 GB"));
    CHECK(strstr(out, "69 KDA + 24 MLA; 1 dense + 92 MoE"));
    CHECK(strstr(out, "MLA layers (0-based): 3 7 11 15 19 23 27 31 35 39 43 47 51 55 59 63 67 71 75 79 83 87 91 92\n"));
    CHECK(strstr(out, "active per token: 105.36B"));
    CHECK(strstr(out, "24 x (512 + 64) = 13,824 elements"));
    CHECK(strstr(out, "problems: none"));
    base_free(out);
    /* --json: parseable, with the exact numbers. */
    snprintf(args, sizeof args, "--config %s --json 2>/dev/null", path);
    CHECK(run_inspect(args, &out) == 0);
    char err[512];
    json_t *j = jsonx_load((const uint8_t *)out, strlen(out), "inspect --json", err, sizeof err);
    CHECK_MSG(j != NULL, "%s", err);
    if (j) {
        json_t *cen = json_object_get(j, "census");
        CHECK(json_is_true(json_object_get(j, "ok")));
        CHECK(json_integer_value(json_object_get(cen, "expert_bytes")) == 17547264);
        CHECK(json_integer_value(json_object_get(cen, "n_expert_total")) == 82432);
        CHECK(json_integer_value(json_object_get(cen, "params_total")) == 2779484478208LL);
        CHECK(json_array_size(json_object_get(json_object_get(j, "layers"), "mla")) == 24);
        json_decref(j);
    }
    base_free(out);
}

TEST(inspect_model_dirs) {
    cfg c;
    tiny_cfg(&c);
    char args[1200], *out;
    mw ok = {0};
    const char *dir = write_model("good", &c, &ok);
    CHECK(run_inspect(dir, &out) == 0);
    CHECK_MSG(strstr(out, "1 shard,") && strstr(out, "experts contiguous: yes") &&
              strstr(out, "layer trunks contiguous: yes") && strstr(out, "problems: none"), "%s", out);
    CHECK(strstr(out, "expert tensor order on disk: w1.weight_packed w1.weight_scale w2.weight_packed "
                      "w2.weight_scale w3.weight_packed w3.weight_scale (all experts)"));
    base_free(out);

    /* An expert tensor with the wrong shape: exit 1, names the tensor and shapes. */
    mw bad = {0};
    bad.reshape = "language_model.model.layers.2.block_sparse_moe.experts.3.w2.weight_packed";
    dir = write_model("badshape", &c, &bad);
    CHECK(run_inspect(dir, &out) == 1);
    CHECK_MSG(strstr(out, "tensor language_model.model.layers.2.block_sparse_moe.experts.3.w2.weight_packed "
                          "has shape [128, 16], expected [64, 16]"), "%s", out);
    CHECK(strstr(out, dir));
    base_free(out);

    /* Missing tensor plus unused ones: the missing one is the error. */
    mw miss = {0};
    miss.drop = "language_model.model.layers.1.self_attn.kv_b_proj.weight";
    miss.extra = 1;
    dir = write_model("missing", &c, &miss);
    CHECK(run_inspect(dir, &out) == 1);
    CHECK_MSG(strstr(out, "missing tensor language_model.model.layers.1.self_attn.kv_b_proj.weight [64, 32]"), "%s", out);
    CHECK(strstr(out, "2 checkpoint tensors not used"));
    base_free(out);

    /* Unused tensors alone are warnings: exit 0. */
    mw extra = {0};
    extra.extra = 1;
    dir = write_model("extra", &c, &extra);
    CHECK(run_inspect(dir, &out) == 0);
    CHECK_MSG(strstr(out, "unused tensor vision_tower.blocks.0.weight") &&
              strstr(out, "unused tensor language_model.model.mtp.0.weight"), "%s", out);
    base_free(out);

    /* Wrong dtype on a trunk matrix. */
    mw ty = {0};
    ty.retype = "language_model.model.layers.0.self_attn.q_proj.weight";
    dir = write_model("dtype", &c, &ty);
    CHECK(run_inspect(dir, &out) == 1);
    CHECK_MSG(strstr(out, "q_proj.weight has dtype U8, expected F32/BF16/F16"), "%s", out);
    base_free(out);

    /* A truncated shard: st_open's message, exit 1. */
    mw tr = {0};
    tr.truncate = 1;
    dir = write_model("trunc", &c, &tr);
    CHECK(run_inspect(dir, &out) == 1);
    CHECK_MSG(strstr(out, "model.safetensors"), "%s", out);
    base_free(out);

    /* No config.json in the directory: no silent K3 fallback. */
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    CHECK(run_inspect(dir, &out) == 1);
    CHECK(strstr(out, "config.json"));
    base_free(out);

    /* Scale byte 255: only reported with --scan. */
    mw sc = {0};
    sc.scale255 = 1;
    dir = write_model("scale", &c, &sc);
    CHECK(run_inspect(dir, &out) == 0);
    base_free(out);
    snprintf(args, sizeof args, "%s --scan", dir);
    CHECK(run_inspect(args, &out) == 1);
    CHECK_MSG(strstr(out, "layers.2.block_sparse_moe.experts.1.w2.weight_scale: 1 scale bytes of 255"), "%s", out);
    CHECK(strstr(out, "1 experts with scale 255"));
    base_free(out);
    snprintf(args, sizeof args, "%s --scan --json", dir);
    CHECK(run_inspect(args, &out) == 1);
    CHECK(strstr(out, "\"n_bad_experts\": 1"));
    base_free(out);
}

TEST(bind_layout_facts) {
    cfg c;
    tiny_cfg(&c);
    char err[1024];
    model_layout *lay = base_alloc(sizeof *lay, MEM_MISC);
    /* Good MXFP4 model: contiguous experts and layers, sizes as the census says. */
    mw ok = {0};
    const char *dir = write_model("lay_ok", &c, &ok);
    st_index *ix = NULL;
    CHECK_MSG(st_open(&ix, dir, err, sizeof err) == 0, "%s", err);
    sbuf pb = {0}, wb = {0};
    CHECK(model_bind_check_ex(&c, ix, lay, &pb, &wb) == 0 && pb.n == 0 && wb.n == 0);
    cfg_census s;
    schema_census(&c, &s);
    CHECK(!lay->experts_bf16 && lay->experts_contiguous && lay->layers_contiguous);
    CHECK(lay->expert_bytes == s.expert_bytes);
    CHECK(lay->experts_bytes == s.experts_bytes);
    CHECK(lay->trunk_bytes == s.trunk_bytes_bf16);
    CHECK(lay->embed_bytes + lay->head_bytes == s.embed_bytes_bf16);
    for (int64_t L = 0; L < c.n_layers; L++) CHECK(lay->layer_bytes[L] == s.layer_bytes_bf16[L]);
    CHECK(lay->n_expert_parts == 6 && lay->expert_order[0] == R_EXP_W1P && lay->expert_order[5] == R_EXP_W3S);
    st_close(ix);
    sbuf_free(&pb);

    /* One expert split by a gap: experts_contiguous = 0, exactly one counted. */
    mw sp = {0};
    sp.split_expert = 1;
    dir = write_model("lay_split", &c, &sp);
    CHECK(st_open(&ix, dir, err, sizeof err) == 0);
    CHECK(model_bind_check(&c, ix, lay, &pb) == 0);
    CHECK(!lay->experts_contiguous && lay->n_expert_noncontig == 1);
    /* The layer-1 trunk run is unaffected; layer 1 experts follow it. */
    CHECK(lay->layers_contiguous);
    st_close(ix);
    sbuf_free(&pb);

    /* Plain BF16 experts are detected from expert 0 and accepted. */
    mw bf = {0};
    bf.bf16_experts = 1;
    dir = write_model("lay_bf16", &c, &bf);
    CHECK(st_open(&ix, dir, err, sizeof err) == 0);
    CHECK(model_bind_check_ex(&c, ix, lay, &pb, &wb) == 0);
    CHECK(lay->experts_bf16 && lay->experts_contiguous && lay->n_expert_parts == 3);
    /* tiny_cfg declares mxfp4 (from the K3 preset): a warning, not an error. */
    CHECK(wb.n == 1 && strstr(wb.s, "declares quantization_config.format mxfp4 but the experts are plain BF16"));
    sbuf_free(&wb);
    CHECK(lay->expert_bytes == (uint64_t)(3 * c.latent * c.moe_inter * 2));
    st_close(ix);
    sbuf_free(&pb);

    /* Vectors as [1, n] are accepted. */
    mw v2 = {0};
    v2.vec2d = 1;
    dir = write_model("lay_vec2d", &c, &v2);
    CHECK(st_open(&ix, dir, err, sizeof err) == 0);
    CHECK(model_bind_check(&c, ix, lay, &pb) == 0 && pb.n == 0);
    st_close(ix);
    sbuf_free(&pb);

    /* Config and checkpoint disagree everywhere: capped listing, full count. */
    dir = write_model("lay_ok2", &c, &ok);
    CHECK(st_open(&ix, dir, err, sizeof err) == 0);
    cfg other = c;
    other.hidden = 96;
    CHECK(model_bind_check(&other, ix, lay, &pb) == STRATA_EFORMAT);
    CHECK(pb.n > 50);
    CHECK_MSG(strstr(pb.s, "more problems"), "%s", pb.s);
    int lines = 0;
    for (const char *q = pb.s; *q; q++) lines += *q == '\n';
    CHECK(lines == 51);
    st_close(ix);
    sbuf_free(&pb);
    sbuf_free(&wb);
    base_free(lay);
}

/* Models from the generator (several shards, mixed trunk dtypes, plain experts):
 * inspect must find them sound, with the layout the generator promises. */
TEST(inspect_generated_models) {
    static const char *const presets[] = {"tiny-shards", "tiny-mixed", "tiny-bf16experts"};
    for (int i = 0; i < 3; i++) {
        char cmd[2048], *out;
        snprintf(cmd, sizeof cmd, "%s gen-model %s/gen-%s --preset %s --quiet", t_strata(), t_tmpdir, presets[i], presets[i]);
        int rc = t_run(cmd, &out);
        CHECK_MSG(rc == 0, "%s: %s", presets[i], out);
        base_free(out);
        if (rc) continue;
        snprintf(cmd, sizeof cmd, "%s/gen-%s --scan", t_tmpdir, presets[i]);
        CHECK(run_inspect(cmd, &out) == 0);
        CHECK_MSG(strstr(out, "experts contiguous: yes") && strstr(out, "layer trunks contiguous: yes") &&
                  strstr(out, "problems: none"), "%s: %s", presets[i], out);
        if (i == 0) CHECK(strstr(out, "16 shards,"));
        if (i == 2) CHECK(strstr(out, "experts stored as plain weights"));
        else CHECK(strstr(out, "with scale 255 (0 bytes)"));
        base_free(out);
    }
}

/* Writes v (len bytes) at byte `at` of tensor `name`'s data in its shard. */
static int poke_tensor(st_index *ix, const char *name, uint64_t at, const void *v, size_t len) {
    const st_tensor *t = st_find(ix, name);
    if (!t) return -1;
    int fd = open(st_shard_path(ix, t->shard), O_RDWR);
    int rc = fd >= 0 && pwrite(fd, v, len, (off_t)(t->off + at)) == (ssize_t)len ? 0 : -1;
    if (fd >= 0) close(fd);
    return rc;
}

/* Regression (issue 16, item 7): `inspect --scan` reported no problem for a NaN in
 * a norm weight (the engine's every output turns NaN) nor for inf in a float
 * tensor; MXFP4 scale bytes of 255 per tensor as before. Each defective tensor is
 * named and the exit status is 1; a sound model still passes. */
TEST(inspect_scan_nonfinite) {
    char dir[1100], cmd[2400], *out = NULL, err[512];
    snprintf(dir, sizeof dir, "%s/scan-nf", t_tmpdir);
    snprintf(cmd, sizeof cmd, "%s gen-model %s --preset tiny --seed 3 --quiet", t_strata(), dir);
    CHECK(t_run(cmd, NULL) == 0);
    snprintf(cmd, sizeof cmd, "%s --scan", dir);
    CHECK(run_inspect(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "with non-finite values (0 values)"), "%s", out ? out : "");
    base_free(out);
    st_index *ix = NULL;
    if (st_open(&ix, dir, err, sizeof err)) { CHECK_MSG(0, "%s", err); return; }
    const uint8_t nan_bf16[2] = {0xc0, 0x7f}, inf_bf16[2] = {0x80, 0xff}, s255 = 255;
    const char *norm = "language_model.model.layers.0.input_layernorm.weight";
    const char *head = "language_model.lm_head.weight";
    const char *scale = "language_model.model.layers.2.block_sparse_moe.experts.5.w2.weight_scale";
    CHECK(poke_tensor(ix, norm, 2 * 3, nan_bf16, 2) == 0);
    CHECK(poke_tensor(ix, head, 2 * 10, inf_bf16, 2) == 0 && poke_tensor(ix, head, 2 * 11, inf_bf16, 2) == 0);
    CHECK(poke_tensor(ix, scale, 1, &s255, 1) == 0);
    st_close(ix);
    CHECK(run_inspect(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, "layers.0.input_layernorm.weight: 1 non-finite values of 64 (first: element 3 is NaN)") &&
                  strstr(out, "lm_head.weight: 2 non-finite values") && strstr(out, "(first: element 10 is inf)") &&
                  strstr(out, "experts.5.w2.weight_scale: 1 scale bytes of 255") && strstr(out, "problems: 3"),
              "%s", out ? out : "");
    base_free(out);
    /* without --scan the weights are not read */
    CHECK(run_inspect(dir, NULL) == 0);
    snprintf(cmd, sizeof cmd, "%s --scan --json", dir);
    CHECK(run_inspect(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, "\"float_scan\": {\"n_tensors\": ") && strstr(out, "\"n_bad_tensors\": 2, \"n_nonfinite\": 3"),
              "%s", out ? out : "");
    base_free(out);
}

/* ------------------------------------------------- strata_inspect (strata.h) */

/* Reads a FILE written by the library back into a MEM_MISC string. */
static char *slurp(FILE *f) {
    long n = ftell(f);
    char *s = base_alloc((size_t)n + 1, MEM_MISC);
    rewind(f);
    size_t got = s ? fread(s, 1, (size_t)n, f) : 0;
    if (s) s[got] = 0;
    return s;
}

/* The library call writes the same report the CLI prints, to the caller's FILE,
 * and hands the problems back instead of printing them. */
TEST(inspect_api_report) {
    const char *dir = t_model("inspapi", "tiny", -1, 0);
    CHECK_MSG(dir != NULL, "model");
    if (!dir) return;
    char cmd[1024], err[256], *cli = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect %s --json 2>/dev/null", t_strata(), dir);
    CHECK_MSG(t_run(cmd, &cli) == 0, "cli");
    FILE *f = tmpfile();
    strata_inspect_opts o = {.model_dir = dir, .json = 1};
    strata_inspect_result r;
    CHECK_MSG(strata_inspect(&o, f, &r, err, sizeof err) == STRATA_OK, "%s", err);
    CHECK_MSG(r.n_problems == 0 && r.problems && !r.problems[0] && !r.listed, "%d problems", r.n_problems);
    strata_free(r.problems);
    char *lib = slurp(f);
    CHECK_MSG(lib && cli && !strcmp(lib, cli), "library and CLI reports differ");
    base_free(lib);
    base_free(cli);
    fclose(f);

    /* a missing directory: a report with one problem (nothing listed on out) */
    f = tmpfile();
    o.model_dir = t_write("inspapi-nodir", "", 0);
    CHECK_MSG(strata_inspect(&o, f, &r, err, sizeof err) == STRATA_OK, "%s", err);
    CHECK_MSG(r.n_problems == 1 && strstr(r.problems, "not a directory") && r.problems[strlen(r.problems) - 1] == '\n',
          "%s", r.problems);
    strata_free(r.problems);
    fclose(f);

    /* both a directory and a config: refused, err says so */
    o.config = "x.json";
    CHECK_MSG(strata_inspect(&o, stdout, &r, err, sizeof err) == STRATA_EINVAL && err[0], "both");
}
