/*
 * t_deepseek.c: the DeepSeek-V3 architecture (src/format/arch_deepseek_v3.c):
 * the real configs (DeepSeek-R1, K2-Instruct, K2.5's wrapper, a K2-Thinking-style
 * one) read, planned and refused where their math is not implemented; YaRN's
 * frequencies and scale; the group-limited router; the published layout of the
 * tiny presets; the forward pass's invariants (threads, budgets, batching,
 * chunking, speculation); the sparse full-size replicas. Agreement with the
 * float64 reference (tests/reference/dsref.py, branch h-dsref): ds_check.sh.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "cfg.h"
#include "engine_int.h"
#include "infer.h"
#include "schema.h"
#include "test.h"

#define DS_R1 "tests/data/configs/deepseek-r1.config.json"
#define DS_K2 "tests/data/configs/kimi-k2-instruct.config.json"
#define DS_K25 "tests/data/configs/kimi-k2.5.transformers-parsed.config.json"
#define DS_K2T "tests/data/configs/kimi-k2-thinking-style.config.json"
#define DS_V32 "tests/data/configs/deepseek-v3.2.config.json"

/* Reads a real config, checks it round-trips through the writer. */
static int load_rt(const char *path, cfg *c) {
    char err[2048];
    int rc = cfg_load(c, path, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: %s", path, err);
    if (rc) return rc;
    char *js = cfg_to_json(c);
    cfg r;
    rc = cfg_parse(&r, (const uint8_t *)js, strlen(js), "written", err, sizeof err);
    CHECK_MSG(rc == 0, "%s written: %s", path, err);
    CHECK_MSG(rc || infer_cfg_fingerprint(&r) == infer_cfg_fingerprint(c), "%s: the written config is another model", path);
    CHECK(rc || (r.arch == c->arch && r.yarn_factor == c->yarn_factor && r.n_group == c->n_group && r.max_ctx == c->max_ctx));
    base_free(js);
    return rc;
}

TEST(ds_real_configs) {
    cfg c, k;
    if (load_rt(DS_R1, &c)) return;
    cfg_deepseek_v3(&k);
    CHECK(c.arch == ARCH_DEEPSEEK_V3 && c.no_kda && c.plain_res && c.act_silu && c.moe_plain && c.mla_rope && c.ds_names);
    CHECK(c.n_mla == 61 && c.is_mla[0] && c.is_mla[60] && !c.is_mla[61] && c.first_dense == 3 && c.latent == 7168);
    CHECK(c.n_experts == 256 && c.topk == 8 && c.n_shared == 1 && c.n_group == 8 && c.topk_group == 4 && c.moe_renorm);
    CHECK(c.yarn_factor == 40 && c.yarn_orig_ctx == 4096 && c.yarn_beta_fast == 32 && c.yarn_mscale_all_dim == 1);
    CHECK(c.rope_theta == 10000 && c.routed_scale == 2.5 && c.n_mtp == 1 && c.kv_norm_eps == 1e-6 && c.rms_eps == 1e-6);
    CHECK(infer_cfg_fingerprint(&c) == infer_cfg_fingerprint(&k)); /* the built-in one is the real one */
    cfg_census s;
    schema_census(&c, &s);
    CHECK_MSG(s.params_total == 671026419200ull, "%llu", (unsigned long long)s.params_total); /* 671B without MTP */
    CHECK(s.n_mla == 61 && s.n_kda == 0 && s.n_dense == 3 && s.n_moe == 58 && s.kda_state_elems == 0);
    CHECK(fabs(arch_mla_scale(&c) - 0.1352338) < 1e-7);
    if (load_rt(DS_K2, &c)) return;
    CHECK(c.arch == ARCH_KIMI_K2 && c.n_heads == 64 && c.n_experts == 384 && c.n_group == 1 && c.first_dense == 1);
    CHECK(c.rope_theta == 50000 && c.yarn_factor == 32 && c.yarn_beta_fast == 1 && c.n_mtp == 0 && c.eos_ids[0] == 163585);
    CHECK(fabs(arch_mla_scale(&c) - 0.1308608) < 1e-7);
    if (load_rt(DS_K25, &c)) return;
    CHECK(c.arch == ARCH_KIMI_K25 && !strcmp(arch_of(&c)->pfx, "language_model.model.") && c.yarn_factor == 64 &&
          c.yarn_beta_fast == 32 && c.rms_eps == 1e-5 && c.max_ctx == 262144); /* rope_parameters read */
    CHECK(fabs(arch_mla_scale(&c) - 0.1446796) < 1e-7);
    if (load_rt(DS_K2T, &c)) return;
    cfg_kimi_k2_thinking(&k);
    CHECK(infer_cfg_fingerprint(&c) == infer_cfg_fingerprint(&k));
    schema_census(&c, &s);
    CHECK_MSG(s.params_total > 1.02e12 && s.params_total < 1.04e12, "%llu", (unsigned long long)s.params_total);
}

/* YaRN (family-math 8.2): the ramp's ends of DeepSeek-V3 (10, 23) and K2 (19, 20). */
TEST(ds_yarn_frequencies) {
    cfg c;
    cfg_deepseek_v3(&c);
    for (int64_t i = 0; i < 32; i++) {
        const double extra = 1.0 / pow(10000.0, (double)(2 * i) / 64.0), f = arch_rope_inv_freq(&c, i);
        if (i <= 10) CHECK_MSG(f == extra, "pair %lld", (long long)i);
        else if (i >= 23) CHECK_MSG(f == extra / 40.0, "pair %lld", (long long)i);
        else CHECK_MSG(f < extra && f > extra / 40.0, "pair %lld", (long long)i);
    }
    CHECK(arch_rope_mscale(&c) == 1.0);
    cfg_kimi_k2_thinking(&c);
    CHECK(arch_rope_inv_freq(&c, 19) == 1.0 / pow(50000.0, 38.0 / 64.0));
    CHECK(arch_rope_inv_freq(&c, 20) == 1.0 / pow(50000.0, 40.0 / 64.0) / 64.0);
    c.yarn_factor = 1; /* rope_scaling null: plain RoPE, plain scale */
    CHECK(arch_rope_inv_freq(&c, 20) == 1.0 / pow(50000.0, 40.0 / 64.0) && arch_mla_scale(&c) == 1.0 / sqrt(192.0));
}

/* Values whose math is not implemented are refused, naming the file and key. */
TEST(ds_config_refusals) {
    char *js = t_slurp(DS_R1);
    CHECK(js != NULL);
    if (!js) return;
    static const t_refusal k[] = {
        {"\"type\": \"yarn\"", "\"type\": \"dynamic\"", "'rope_scaling.type' is \"dynamic\": not supported"},
        {"\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\"", "'scoring_func' is \"softmax\": not supported"},
        {"\"topk_method\": \"noaux_tc\"", "\"topk_method\": \"greedy\"", "'topk_method' is \"greedy\": not supported"},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "'hidden_act' is \"gelu\": not supported"},
        {"\"ep_size\": 1,", "\"index_topk\": 2048,", "'index_topk' is set: DeepSeek-V3.2's sparse attention"},
        {"\"n_group\": 8", "\"n_group\": 7", "'n_group' = 7 must divide"},
        {"\"topk_group\": 4", "\"topk_group\": 9", "'topk_group' = 9 must be in 1..8"},
        {"\"quant_method\": \"fp8\"", "\"quant_method\": \"gptq\"", "'quantization_config.quant_method' is \"gptq\""},
        {"128,\n            128", "64,\n            64", "'quantization_config.weight_block_size' is another block"},
        {"\"factor\": 40,", "\"factor\": \"40\",", "'rope_scaling.factor' must be a number"},
        {"\"DeepseekV3ForCausalLM\"", "\"KimiLinearForCausalLM\"", "name different architectures"},
    };
    t_config_refusals(js, "ds", k, sizeof k / sizeof k[0]);
    base_free(js);
    /* DeepSeek-V3.2 (the DSA indexer) is refused by name */
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8", t_strata(), DS_V32);
    CHECK(t_run(cmd, &out) == 1);
    CHECK_MSG(out && strstr(out, "DeepSeek-V3.2") && strstr(out, "DSA indexer"), "%s", out ? out : "");
    base_free(out);
}

/* Group-limited routing (noaux_tc): 16 experts in 4 groups, 2 kept, top-4. */
TEST(ds_route_groups) {
    cfg c;
    memset(&c, 0, sizeof c);
    c.n_experts = 16;
    c.topk = 4;
    c.n_group = 4;
    c.topk_group = 2;
    c.moe_renorm = 1;
    c.routed_scale = 2.5;
    /* logits: group 0 holds the single best expert (3) but a weak second;
     * groups 1 and 2 have two good ones each; group 3 is weak. Ungrouped top-4
     * would be 3, 4, 5, 8; grouped keeps groups 1 (4+5) and 2 (8+9). */
    float lg[16] = {-4, -4, -4, 5, 3, 2.9f, -4, -4, 2.8f, 2.7f, -4, -4, -3, -3, -3, -3};
    float bias[16] = {0};
    bias[15] = 0.5f; /* lifts a weak expert's group score by 0.5: still out */
    float s[16];
    int32_t taken[16] = {0}, idx[4];
    float w[4];
    memcpy(s, lg, sizeof s);
    moe_route_row(&c, s, bias, taken, 1, idx, w);
    CHECK_MSG(idx[0] == 4 && idx[1] == 5 && idx[2] == 8 && idx[3] == 9, "%d %d %d %d", idx[0], idx[1], idx[2], idx[3]);
    double sum = 0, sg[4];
    for (int j = 0; j < 4; j++) sum += sg[j] = 1.0 / (1.0 + exp(-(double)lg[idx[j]]));
    for (int j = 0; j < 4; j++) CHECK(fabs(w[j] - sg[j] / sum * 2.5) < 1e-6); /* unbiased, renormalised, x rho */
    /* the bias selects (it moves expert 9 above 8 in its group) but never weighs */
    bias[9] = 0.2f;
    memset(taken, 0, sizeof taken);
    memcpy(s, lg, sizeof s);
    moe_route_row(&c, s, bias, taken, 1, idx, w);
    CHECK_MSG(idx[0] == 9 && idx[1] == 4 && idx[2] == 5 && idx[3] == 8, "%d %d %d %d", idx[0], idx[1], idx[2], idx[3]);
    CHECK(fabs(w[0] - sg[3] / sum * 2.5) < 1e-6);
    /* ungrouped: the plain top-4 */
    c.n_group = 1;
    c.topk_group = 1;
    bias[9] = 0;
    memset(taken, 0, sizeof taken);
    memcpy(s, lg, sizeof s);
    moe_route_row(&c, s, bias, taken, 1, idx, w);
    CHECK(idx[0] == 3 && idx[1] == 4 && idx[2] == 5 && idx[3] == 8);
    /* a tie between groups goes to the lower one; a stale stamp never leaks */
    c.n_group = 4;
    c.topk_group = 1;
    float eq[16] = {1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    memset(bias, 0, sizeof bias);
    for (int i = 0; i < 16; i++) taken[i] = (i % 2) ? 7 : -7;
    memcpy(s, eq, sizeof s);
    c.topk = 2;
    moe_route_row(&c, s, bias, taken, 1, idx, w);
    CHECK(idx[0] == 0 && idx[1] == 1);
}

/* A guess of the next layer's experts picks as the router does: with every
 * expert's score (sigmoid + bias) its best ranks are the router's top-k in order,
 * grouped or not; from candidates only it stays inside the kept groups. */
TEST(ds_guess_groups) {
    cfg c;
    memset(&c, 0, sizeof c);
    c.n_experts = 64;
    c.topk = 6;
    c.moe_renorm = 1;
    c.routed_scale = 1;
    uint64_t rng = 99;
    for (int trial = 0; trial < 200; trial++) {
        const int grouped = trial % 4 != 0;
        c.n_group = grouped ? (trial % 3 == 0 ? 8 : 4) : 1;
        c.topk_group = grouped ? 1 + trial % (int)(c.n_group / 2) : 1;
        float lg[64], s[64], bias[64], sc[64], gs[16], w[6];
        int32_t taken[64] = {0}, idx[6], mark[64] = {0}, list[64];
        for (int i = 0; i < 64; i++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            lg[i] = (float)((int)(rng >> 40) % 2000 - 1000) / 250.0f;
            bias[i] = (float)((int)(rng >> 20) % 100) / 400.0f;
        }
        memcpy(s, lg, sizeof s);
        moe_route_row(&c, s, bias, taken, 1, idx, w);
        for (int i = 0; i < 64; i++) sc[i] = s[i] + bias[i]; /* moe_route_row left the sigmoids in s */
        const int ranks = 1 + trial % 6;
        int n = guess_pick(&c, sc, NULL, 64, ranks, gs, mark, 1, list, 0);
        CHECK_MSG(n == ranks, "trial %d: %d of %d", trial, n, ranks);
        for (int r = 0; r < n; r++) CHECK_MSG(list[r] == idx[r], "trial %d rank %d: %d vs %d", trial, r, list[r], idx[r]);
        /* candidates: the 16 best scores, shuffled; every pick in a kept group of the candidates */
        int32_t id[16];
        float cs[16];
        int nc = 0;
        for (int i = 0; i < 64; i++) {
            int better = 0;
            for (int j = 0; j < 64; j++) better += sc[j] > sc[i] || (sc[j] == sc[i] && j < i);
            if (better < 16) { id[nc] = i; cs[nc++] = sc[i]; }
        }
        memset(mark, 0, sizeof mark);
        n = guess_pick(&c, cs, id, nc, c.topk, gs, mark, 1, list, 0);
        CHECK(n >= 1 && n <= c.topk);
        const int per = 64 / (int)(c.n_group > 1 ? c.n_group : 1);
        for (int r = 0; r < n && grouped; r++) CHECK(gs[c.n_group + list[r] / per] == 1);
    }
}

/* The published layouts: names, dtypes and shapes the releases use, the
 * tokenizer files and the quantization_config they declare. */
TEST(ds_tiny_layout) {
    static const struct { const char *preset, *must[6], *mustnot, *tok, *quant; int unused, wrapped; } k[] = {
        {"deepseek-v3-tiny",
         {"\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"F32\"", "\"model.layers.2.mlp.gate.e_score_correction_bias\":{\"dtype\":\"F32\"",
          "\"model.layers.2.mlp.experts.0.gate_proj.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[32,64]",
          "\"model.layers.2.mlp.experts.0.gate_proj.weight_scale_inv\":{\"dtype\":\"F32\",\"shape\":[1,1]",
          "\"model.layers.1.self_attn.q_b_proj.weight\":{\"dtype\":\"F8_E4M3\"", "\"model.layers.5.eh_proj.weight\""},
         "block_sparse_moe", "tokenizer.json", "\"quant_method\": \"fp8\"", 1, 0},
        {"deepseek-v3-bf16-tiny",
         {"\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"F32\"", "\"model.layers.2.mlp.gate.e_score_correction_bias\":{\"dtype\":\"F32\"",
          "\"model.layers.2.mlp.experts.0.gate_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[32,64]",
          "\"model.layers.1.mlp.down_proj.weight\"", "\"model.layers.5.eh_proj.weight\"", "\"model.layers.2.mlp.shared_experts.up_proj.weight\""},
         "weight_scale", "tiktoken.model", NULL, 1, 0},
        {"kimi-k2-tiny",
         {"\"model.layers.0.self_attn.q_a_layernorm.weight\":{\"dtype\":\"BF16\"", "\"model.layers.1.mlp.gate.e_score_correction_bias\":{\"dtype\":\"F32\"",
          "\"model.layers.1.mlp.experts.3.down_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[64,32]",
          "\"model.layers.0.self_attn.kv_a_proj_with_mqa.weight\":{\"dtype\":\"BF16\",\"shape\":[48,64]", "\"lm_head.weight\"",
          "\"model.norm.weight\""},
         "layers.4.", "tiktoken.model", NULL, 0, 0},
        {"kimi-k2-instruct-tiny",
         {"\"model.layers.0.self_attn.q_a_layernorm.weight\":{\"dtype\":\"BF16\"", "\"lm_head.weight\":{\"dtype\":\"BF16\"",
          "\"model.layers.1.mlp.experts.3.down_proj.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[64,32]",
          "\"model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv\":{\"dtype\":\"F32\",\"shape\":[1,1]",
          "\"model.layers.1.mlp.gate.weight\":{\"dtype\":\"BF16\"", "\"model.layers.1.mlp.shared_experts.up_proj.weight\":{\"dtype\":\"F8_E4M3\""},
         "layers.4.", "tiktoken.model", "\"quant_method\": \"fp8\"", 0, 0},
        {"kimi-k2-thinking-tiny",
         {"\"model.layers.1.mlp.experts.3.down_proj.weight_packed\":{\"dtype\":\"I32\",\"shape\":[64,4]",
          "\"model.layers.1.mlp.experts.3.down_proj.weight_scale\":{\"dtype\":\"BF16\",\"shape\":[64,1]",
          "\"model.layers.1.mlp.experts.3.down_proj.weight_shape\":{\"dtype\":\"I32\",\"shape\":[2]",
          "\"model.layers.0.self_attn.q_a_proj.weight\":{\"dtype\":\"BF16\"", "\"model.layers.1.mlp.shared_experts.up_proj.weight\":{\"dtype\":\"BF16\"",
          "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"BF16\""},
         "weight_scale_inv", "tiktoken.model", "\"format\": \"pack-quantized\"", 0, 0},
        {"kimi-k25-tiny",
         {"\"language_model.model.layers.1.mlp.experts.0.up_proj.weight\"", "\"language_model.lm_head.weight\"",
          "\"vision_tower.patch_embed.proj.weight\"", "\"mm_projector.proj.0.weight\"",
          "\"language_model.model.embed_tokens.weight\"", "\"language_model.model.layers.3.self_attn.q_b_proj.weight\""},
         "\"model.layers", "tiktoken.model", NULL, 1, 1},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        const char *m = t_model(k[i].preset, k[i].preset, 7, 0);
        CHECK(m != NULL);
        if (!m) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", m);
        char *raw = t_slurp(path), *st = raw ? raw + 8 : NULL;
        CHECK(st != NULL);
        if (!st) continue;
        for (int j = 0; j < 6; j++) CHECK_MSG(strstr(st, k[i].must[j]) != NULL, "%s: %s", k[i].preset, k[i].must[j]);
        CHECK_MSG(!strstr(st, k[i].mustnot), "%s: %s", k[i].preset, k[i].mustnot);
        base_free(raw);
        snprintf(path, sizeof path, "%s/%s", m, k[i].tok);
        FILE *tf = fopen(path, "rb");
        CHECK_MSG(tf != NULL, "%s: no %s", k[i].preset, k[i].tok);
        if (tf) fclose(tf);
        snprintf(path, sizeof path, "%s/config.json", m);
        char *js = t_slurp(path);
        CHECK(js && strstr(js, "\"rope_scaling\": {") && strstr(js, "\"n_routed_experts\": 16"));
        CHECK(js && k[i].wrapped == (strstr(js, "\"text_config\"") != NULL));
        CHECK_MSG(js && (k[i].quant ? strstr(js, k[i].quant) != NULL : !strstr(js, "quantization_config")), "%s", k[i].preset);
        base_free(js);
        /* the skipped tensors are warnings, not problems */
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s inspect %s", t_strata(), m);
        CHECK(t_run(cmd, &out) == 0);
        CHECK_MSG(out && strstr(out, "problems: none") && (!k[i].unused || strstr(out, "not used by the model")), "%s: %s",
                  k[i].preset, out ? out : "");
        base_free(out);
    }
}



/* Resident, budgets below the model, one or two threads, chunked, batched and
 * speculative runs: the same bits, on each tiny preset. */
TEST(ds_forward_invariants) {
    static const char *const k[] = {"deepseek-v3-tiny", "kimi-k2-tiny", "kimi-k25-tiny", "kimi-k2-instruct-tiny",
                                    "kimi-k2-thinking-tiny"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        const char *m = t_model(k[i], k[i], 7, 0);
        CHECK(m != NULL);
        if (!m) continue;
        char a[256], b[256];
        CHECK(t_run_logits(m, "--threads 2", "res", 8, a, sizeof a) == 0);
        CHECK(t_run_logits(m, "--threads 1", "t1", 8, b, sizeof b) == 0);
        CHECK_MSG(!strcmp(a, b) && t_same_logits("res", "t1"), "%s: threads", k[i]);
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2 --gen 1 --ram-gb 0.001", t_strata(), m);
        t_run(cmd, &out);
        const char *p = out ? strstr(out, "needs at least ") : NULL;
        double mb = p ? atof(p + 15) : 0;
        base_free(out);
        CHECK_MSG(mb > 0, "%s: no minimum named", k[i]);
        const double bud[2] = {mb * 1.02e-3, mb * 1.2e-3};
        for (int j = 0; j < 2 && mb > 0; j++) {
            char ex[128];
            snprintf(ex, sizeof ex, "--threads %d --ram-gb %.6f", 1 + j, bud[j]);
            CHECK(t_run_logits(m, ex, "bud", 8, b, sizeof b) == 0);
            CHECK_MSG(!strcmp(a, b) && t_same_logits("res", "bud"), "%s: budget %g", k[i], bud[j]);
        }
        CHECK(t_run_logits(m, "--threads 2 --chunk 3", "chunk", 8, b, sizeof b) == 0);
        CHECK_MSG(!strcmp(a, b) && t_same_logits("res", "chunk"), "%s: chunk", k[i]);
        CHECK(t_run_logits(m, "--threads 2 --spec 3", "spec", 8, b, sizeof b) == 0);
        CHECK_MSG(!strcmp(a, b), "%s: spec: %s vs %s", k[i], b, a);
        /* batched beside other prompts: the solo ids */
        const char batch[] = "1,5,9,2,7,3,11,40\n3,4\n1,5,9,2,7,3,11,40\n200,201,202,203,204,205,206,207,208,209\n";
        const char *bf = t_write("ds-batch.txt", batch, strlen(batch));
        snprintf(cmd, sizeof cmd, "%s run %s --batch %s --gen 8 --print-ids --threads 2 2>/dev/null", t_strata(), m, bf);
        CHECK(t_run(cmd, &out) == 0);
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)strcspn(a, "\n"), a);
        int hits = 0;
        for (const char *q = out; q && line[0] && (q = strstr(q, line)); q++) hits++;
        CHECK_MSG(hits >= 2, "%s: batched: %s vs %s", k[i], out ? out : "", line);
        base_free(out);
    }
}

/* inspect and plan on the real configs (K2-Thinking plans at 8 GB) and on the
 * sparse full-size replicas; plan names the minimum budget. */
TEST(ds_inspect_plan_real_and_sparse) {
    static const char *const cfgs[] = {DS_R1, DS_K2, DS_K25, DS_K2T};
    char cmd[2048], *out = NULL;
    for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++) {
        snprintf(cmd, sizeof cmd, "%s inspect --config %s", t_strata(), cfgs[i]);
        CHECK(t_run(cmd, &out) == 0);
        CHECK_MSG(out && strstr(out, "61 layers = 0 KDA + 61 MLA") && strstr(out, "problems: none") &&
                  strstr(out, "every layer MLA with q-LoRA"), "%s: %s", cfgs[i], out ? out : "");
        CHECK(i != 0 || (out && strstr(out, "671,026,419,200") && strstr(out, "MTP: 1 layer(s)")));
        base_free(out);
        snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8", t_strata(), cfgs[i]);
        CHECK(t_run(cmd, &out) == 0);
        CHECK_MSG(out && strstr(out, "minimum budget"), "%s: %s", cfgs[i], out ? out : "");
        base_free(out);
    }
    /* the releases' formats and shard names: FP8 experts 44,050,944 B (3 x
     * 2048 x 7168 e4m3 + 3 x 16 x 56 f32 scales), INT4 24,772,632 B */
    static const struct { const char *preset, *inspect, *shard; } k[] = {
        {"deepseek-v3", "one expert 44,050,944 bytes", "model-00163-of-00163.safetensors"},
        {"kimi-k2-thinking", "one expert 24,772,632 bytes", "model-00062-of-000062.safetensors"},
        {"kimi-k2-instruct", "one expert 44,050,944 bytes", "model-61-of-61.safetensors"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        snprintf(cmd, sizeof cmd, "rm -rf %s/dsfull && %s gen-model %s/dsfull --preset %s --sparse --quiet", t_tmpdir,
                 t_strata(), t_tmpdir, k[i].preset);
        CHECK_MSG(t_run(cmd, &out) == 0, "%s: %s", k[i].preset, out ? out : "");
        base_free(out);
        snprintf(cmd, sizeof cmd, "%s inspect %s/dsfull", t_strata(), t_tmpdir);
        CHECK(t_run(cmd, &out) == 0);
        CHECK_MSG(out && strstr(out, "problems: none") && strstr(out, k[i].inspect), "%s: %s", k[i].preset, out ? out : "");
        CHECK(i != 0 || (out && strstr(out, "unused tensors model.layers.*")));
        base_free(out);
        snprintf(cmd, sizeof cmd, "test -f %s/dsfull/%s", t_tmpdir, k[i].shard);
        CHECK_MSG(t_run(cmd, NULL) == 0, "%s: no %s", k[i].preset, k[i].shard);
        snprintf(cmd, sizeof cmd, "%s plan %s/dsfull --ram-gb 8", t_strata(), t_tmpdir);
        CHECK(t_run(cmd, &out) == 0);
        CHECK_MSG(out && strstr(out, "minimum budget"), "%s: %s", k[i].preset, out ? out : "");
        base_free(out);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s/dsfull", t_tmpdir);
    t_run(cmd, NULL);
}

/* A DeepSeek-V3 checkpoint well above its minimum budget (grouped routing, 384
 * BF16 experts, 157 MB): resident and at two budgets below its size (1.1x and
 * 1.6x the minimum the engine names) give the same ids and logits bits, and the
 * budget runs stream (their load line says "placed"). */
static const char k_medium[] =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"first_k_dense_replace\": 1, "
    "\"hidden_act\": \"silu\", \"hidden_size\": 256, \"intermediate_size\": 384, \"kv_lora_rank\": 32, "
    "\"max_position_embeddings\": 4096, \"moe_intermediate_size\": 256, \"moe_layer_freq\": 1, \"n_group\": 8, "
    "\"n_routed_experts\": 128, \"n_shared_experts\": 1, \"norm_topk_prob\": true, \"num_attention_heads\": 4, "
    "\"num_experts_per_tok\": 8, \"num_hidden_layers\": 4, \"num_key_value_heads\": 4, \"num_nextn_predict_layers\": 1, "
    "\"q_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 16, \"rms_norm_eps\": 1e-06, "
    "\"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
    "\"original_max_position_embeddings\": 256, \"type\": \"yarn\"}, \"rope_theta\": 10000, "
    "\"routed_scaling_factor\": 2.5, \"scoring_func\": \"sigmoid\", \"tie_word_embeddings\": false, \"topk_group\": 3, "
    "\"topk_method\": \"noaux_tc\", \"v_head_dim\": 16, \"vocab_size\": 512}\n";

TEST(ds_budgets_below_size) {
    char dir[1024], cmd[4096], *out = NULL;
    snprintf(dir, sizeof dir, "%s/ds_medium", t_tmpdir);
    const char *cj = t_write("ds-medium.json", k_medium, strlen(k_medium));
    snprintf(cmd, sizeof cmd, "rm -rf %s && %s gen-model %s --config %s --experts-bf16 --seed 12 --quiet", dir, t_strata(),
             dir, cj);
    CHECK_MSG(t_run(cmd, &out) == 0, "%s", out ? out : "");
    base_free(out);
    const char *args = "--ids 5,6,7,8,9 --gen 12 --print-ids";
    double min_mb = t_min_budget_mb(dir, args);
    CHECK_MSG(min_mb > 1 && min_mb * 1.6 < 150.0, "minimum %.2f MB", min_mb);
    if (!(min_mb > 1)) return;
    char budgets[3][64];
    t_budgets_agree(dir, args, min_mb, 1, "ds", budgets);
    /* the float64 reference (tests/reference/ds_check.sh, from branch h-dsref), when it is there */
    FILE *f = fopen("tests/reference/ds_check.sh", "r");
    if (f) {
        fclose(f);
        snprintf(cmd, sizeof cmd, "bash tests/reference/ds_check.sh %s %s -- %s", dir, t_strata(), budgets[1]);
        int rc = t_run(cmd, &out);
        CHECK_MSG(rc == 0 && out && strstr(out, "PASS"), "rc %d: %s", rc, out ? out : "");
        base_free(out);
        static const char *const tiny[] = {"deepseek-v3-tiny", "kimi-k2-tiny", "kimi-k25-tiny", "kimi-k2-instruct-tiny",
                                           "kimi-k2-thinking-tiny"};
        for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) {
            const char *m = t_model(tiny[i], tiny[i], 7, 0);
            snprintf(cmd, sizeof cmd, "bash tests/reference/ds_check.sh %s %s --long --gen 8", m ? m : "missing", t_strata());
            rc = t_run(cmd, &out);
            CHECK_MSG(rc == 0 && out && strstr(out, "PASS"), "%s: rc %d: %s", tiny[i], rc, out ? out : "");
            base_free(out);
        }
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    t_run(cmd, NULL);
}

/* plan --config counts FP8 / INT4 bytes as the checkpoint stores them (the
 * quantization_config decides): expert slots of 44.06 MB (FP8) and 24.78 MB
 * (INT4), 88.09 MB without a quantization_config (bf16); K2-Thinking plans at 8
 * GB; --disk-gbs / --mem-gbs set the prediction's bandwidths. */
TEST(ds_plan_bytes_as_stored) {
    static const struct { const char *cfg, *slot; } k[] = {
        {DS_K2, "slots of 44.06 MB"}, {DS_R1, "slots of 44.06 MB"}, {DS_K2T, "slots of 24.78 MB"},
    };
    char cmd[2048], *out = NULL;
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8 --disk-gbs 7 --mem-gbs 25", t_strata(), k[i].cfg);
        CHECK(t_run(cmd, &out) == 0);
        CHECK_MSG(out && strstr(out, k[i].slot) && strstr(out, "at 7.00 GB/s disk") && strstr(out, "at 25.00 GB/s memory (given)"),
                  "%s: %s", k[i].cfg, out ? out : "");
        base_free(out);
    }
    char *js = t_slurp(DS_K2T);
    const char *q = js ? strstr(js, "\"quantization_config\"") : NULL, *r = q ? strstr(q, "\"rms_norm_eps\"") : NULL;
    CHECK(q && r);
    if (!q || !r) { base_free(js); return; }
    char *plain = base_alloc(strlen(js) + 1, MEM_MISC);
    snprintf(plain, strlen(js) + 1, "%.*s%s", (int)(q - js), js, r);
    const char *pf = t_write("k2t-bf16.json", plain, strlen(plain));
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8", t_strata(), pf);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "slots of 88.09 MB"), "%s", out ? out : "");
    base_free(out);
    base_free(plain);
    base_free(js);
}

/* Helpers' reports: --router hf is refused on the DeepSeek-V3 architectures
 * (exit 2, naming it); plan's per-sequence line says what the model holds;
 * inspect names the stored formats; compressed-tensors must be pack-quantized
 * symmetric INT4 in groups of 32. */
TEST(ds_small_defects) {
    char cmd[2048], *out = NULL;
    const char *m = t_model("kimi-k2-thinking-tiny", "kimi-k2-thinking-tiny", 7, 0);
    CHECK(m != NULL);
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2 --gen 1 --router hf 2>&1", t_strata(), m ? m : "missing");
    CHECK(t_run(cmd, &out) == 2);
    CHECK_MSG(out && strstr(out, "--router hf") && strstr(out, "kimi_k2 architecture"), "%s", out ? out : "");
    base_free(out);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8", t_strata(), DS_R1);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "(MLA latent cache for ctx 4096)") && !strstr(out, "KDA"), "%s", out ? out : "");
    base_free(out);
    static const struct { const char *cfg, *want[3]; } k[] = {
        {DS_R1, {"bytes, FP8 e4m3 + 128x128 f32 scales)", "trunk + embeddings (FP8 matrices, bf16 rest)", "experts fp8 (quantization_config)"}},
        {DS_K2T, {"bytes, INT4 pack-quantized + bf16 group-32 scales)", "trunk + embeddings (bf16)", "experts int4 pack-quantized"}},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        snprintf(cmd, sizeof cmd, "%s inspect --config %s", t_strata(), k[i].cfg);
        CHECK(t_run(cmd, &out) == 0);
        for (int j = 0; j < 3; j++) CHECK_MSG(out && strstr(out, k[i].want[j]), "%s: %s", k[i].want[j], out ? out : "");
        base_free(out);
    }
    char *js = t_slurp(DS_K2T);
    static const struct { const char *from, *to, *want; } bad[] = {
        {"\"format\": \"pack-quantized\",", "", "'quantization_config.format' is missing: compressed-tensors weights are read only as"},
        {"\"format\": \"pack-quantized\"", "\"format\": \"float-quantized\"", "'quantization_config.format' is \"float-quantized\""},
        {"\"num_bits\": 4", "\"num_bits\": 8", "config_groups.group_0.weights.num_bits' must be 4"},
        {"\"symmetric\": true", "\"symmetric\": false", "asymmetric INT4 (zero points) is not implemented"},
        {"\"group_size\": 32", "\"group_size\": 128", "config_groups.group_0.weights.group_size' must be 32"},
    };
    for (size_t i = 0; js && i < sizeof bad / sizeof *bad; i++) {
        char *mut = t_subst1(js, bad[i].from, bad[i].to);
        CHECK(mut != NULL);
        if (!mut) continue;
        const char *pf = t_write("k2t-bad.json", mut, strlen(mut));
        snprintf(cmd, sizeof cmd, "%s plan --config %s --ram-gb 8 2>&1", t_strata(), pf);
        CHECK(t_run(cmd, &out) == 1);
        CHECK_MSG(out && strstr(out, bad[i].want), "case %zu: %s", i, out ? out : "");
        base_free(out);
        base_free(mut);
    }
    base_free(js);
}

/* strata chat picks the format from the model's tokenizer (tokenizer.json's
 * chat_template for DeepSeek, K2's specials and <think> for K2-Thinking, and
 * K2.5's template opening <think> in its prompt), and an R1 or K2.5 reply starts
 * in the think channel. */
TEST(ds_chat_formats_from_tokenizer) {
    static const struct { const char *preset, *fmt; int think; } k[] = {
        {"deepseek-v3-tiny", "DeepSeek-V3", 0}, {"deepseek-r1-tiny", "DeepSeek-R1", 1},
        {"kimi-k2-instruct-tiny", "Kimi K2 ", 0}, {"kimi-k2-thinking-tiny", "Kimi K2-Thinking", -1},
        {"kimi-k2-tiny", "Kimi K2 ", 0}, {"kimi-k25-tiny", "Kimi K2.5", 1},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        const char *m = t_model(k[i].preset, k[i].preset, 7, 0);
        CHECK(m != NULL);
        if (!m) continue;
        char cmd[1024], want[96], *out = NULL;
        snprintf(cmd, sizeof cmd, "echo 'hello there' | %s chat %s --gen 6 --show-think 2>&1", t_strata(), m);
        CHECK(t_run(cmd, &out) == 0);
        snprintf(want, sizeof want, "chat format %s", k[i].fmt);
        CHECK_MSG(out && strstr(out, want), "%s: %s", k[i].preset, out ? out : "");
        if (k[i].think >= 0) CHECK_MSG(out && !!strstr(out, "<think>\n") == k[i].think, "%s: %s", k[i].preset, out ? out : "");
        base_free(out);
    }
}
