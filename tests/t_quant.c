/*
 * t_quant.c: FP8 (e4m3fn + weight_scale_inv) and INT4 (pack-quantized) weights
 * through the whole engine. The strongest check is bit-identity against the
 * plain checkpoint of the same numbers (gen-model --dequantize): FP8 * scale is
 * one f32 rounding and (nibble - 8) * bf16 scale is exact in f32, so an F32 twin
 * holds exactly the weights the kernels decode (random scales), and a BF16 twin
 * does too when the scales are powers of two. Both must give the same logits,
 * resident and streamed under budgets, threads 1 and 2. Then the binder's
 * errors, pack and verification, inspect's byte counts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test.h"

/* A Kimi Linear model larger than its minimum budget's weights share, in
 * format w (fp8, int4) with scales (pow2, random), or its dequantised twin. */
static const char *q_model(const char *w, const char *scales, int twin) {
    static char dir[8][1024];
    static int n;
    char cfgp[1024], cmd[4096], *out = NULL;
    snprintf(cfgp, sizeof cfgp, "%s/q_med.json", t_tmpdir);
    /* the kimi-linear-tiny layout with 96 experts of 128 x 128 (bigger than the
     * engine's own floor, so budgets below the model's size stream) */
    snprintf(cmd, sizeof cmd,
             "test -f %s || { %s gen-model %s/q_base --preset kimi-linear-tiny --quiet --force >/dev/null && "
             "/usr/bin/python3 -c \"import json,sys; c=json.load(open('%s/q_base/config.json')); "
             "[c.pop(k, None) for k in ('quantization_config', 'strata_generator')]; "
             "c.update(hidden_size=128, num_experts=96, num_experts_per_token=8, moe_intermediate_size=128, intermediate_size=256); "
             "json.dump(c, open('%s', 'w'))\"; }",
             cfgp, t_strata(), t_tmpdir, t_tmpdir, cfgp);
    if (t_run(cmd, &out)) { fprintf(stderr, "%s\n", out ? out : ""); base_free(out); return NULL; }
    base_free(out);
    char *d = dir[n++ % 8];
    snprintf(d, 1024, "%s/q_%s_%s%s", t_tmpdir, w, scales, twin ? "_twin" : "");
    snprintf(cmd, sizeof cmd, "test -d %s || %s gen-model %s --config %s --weights %s --scales %s %s --quiet", d, t_strata(), d, cfgp,
             w, scales, twin ? "--dequantize" : "");
    int rc = t_run(cmd, &out);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    base_free(out);
    return rc ? NULL : d;
}

#define Q_ARGS "--ids 5,6,7,8,9 --gen 12 --print-ids"

/* md5 of the logits of a run of dir with extra args ("" resident). */
static char *q_logits(const char *dir, const char *extra) {
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s " Q_ARGS " %s --dump-logits %s/q.lg >/dev/null 2>%s/q.err && md5sum < %s/q.lg || cat %s/q.err",
             t_strata(), dir, extra, t_tmpdir, t_tmpdir, t_tmpdir, t_tmpdir);
    t_run(cmd, &out);
    return out;
}

/* The minimum budget the engine names for dir, in MB. */
static double q_min_mb(const char *dir) {
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s " Q_ARGS " --ram-gb 0.001", t_strata(), dir);
    t_run(cmd, &out);
    const char *at = out ? strstr(out, "needs at least ") : NULL;
    double mb = at ? atof(at + strlen("needs at least ")) : 0;
    base_free(out);
    return mb;
}

/* dir and its twin: the same logits resident, and at two budgets below dir's
 * size (streamed: experts through the cache), threads 1 and 2. */
static void q_identical(const char *w, const char *scales) {
    const char *q = q_model(w, scales, 0), *d = q_model(w, scales, 1);
    CHECK(q && d);
    if (!q || !d) return;
    char *ref = q_logits(d, "");
    char *got = q_logits(q, "");
    CHECK_MSG(ref && got && strlen(ref) > 30 && !strcmp(ref, got), "%s %s resident: %s vs twin %s", w, scales, got ? got : "",
              ref ? ref : "");
    base_free(got);
    const double min_mb = q_min_mb(q);
    CHECK_MSG(min_mb > 1, "minimum %.2f MB", min_mb);
    for (int k = 0; k < 2 && min_mb > 1; k++)
        for (int t = 1; t <= 2; t++) {
            char extra[128];
            snprintf(extra, sizeof extra, "--ram-gb %.5f --threads %d", min_mb * (k ? 1.6e-3 : 1.1e-3), t);
            got = q_logits(q, extra);
            CHECK_MSG(got && ref && !strcmp(ref, got), "%s %s %s: %s vs twin %s", w, scales, extra, got ? got : "", ref ? ref : "");
            base_free(got);
        }
    base_free(ref);
}

TEST(quant_fp8_pow2_equals_bf16_twin) { q_identical("fp8", "pow2"); }
TEST(quant_fp8_random_equals_f32_twin) { q_identical("fp8", "random"); }
TEST(quant_int4_pow2_equals_bf16_twin) { q_identical("int4", "pow2"); }
TEST(quant_int4_random_equals_f32_twin) { q_identical("int4", "random"); }

/* The published names and dtypes, read back from the safetensors header. */
TEST(quant_gen_names_dtypes) {
    const char *q8 = q_model("fp8", "random", 0), *q4 = q_model("int4", "random", 0);
    CHECK(q8 && q4);
    if (!q8 || !q4) return;
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import json,struct,sys\n"
             "def hdr(d):\n"
             "  f=open(d+'/model-00001-of-00001.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]; return json.loads(f.read(n))\n"
             "a=hdr('%s'); b=hdr('%s'); L='model.layers.'\n"
             "print(a[L+'0.self_attn.q_proj.weight']['dtype'], a[L+'0.self_attn.q_proj.weight_scale_inv']['dtype'],"
             " a[L+'0.self_attn.q_proj.weight_scale_inv']['shape'], a[L+'1.block_sparse_moe.gate.weight']['dtype'],"
             " a[L+'1.block_sparse_moe.experts.3.w2.weight_scale_inv']['shape'], a['lm_head.weight']['dtype'])\n"
             "print(b[L+'1.block_sparse_moe.experts.3.w1.weight_packed']['dtype'], b[L+'1.block_sparse_moe.experts.3.w1.weight_packed']['shape'],"
             " b[L+'1.block_sparse_moe.experts.3.w1.weight_scale']['dtype'], b[L+'1.block_sparse_moe.experts.3.w1.weight_scale']['shape'],"
             " b[L+'1.block_sparse_moe.experts.3.w1.weight_shape']['dtype'], b[L+'0.self_attn.q_proj.weight']['dtype'])\"",
             q8, q4);
    CHECK(t_run(cmd, &out) == 0);
    /* q_proj (64, 128): one scale block row, one column; the router stays BF16 */
    CHECK_MSG(out && strstr(out, "F8_E4M3 F32 [1, 1] BF16 [1, 1] BF16\n"), "%s", out ? out : "");
    CHECK_MSG(out && strstr(out, "I32 [128, 16] BF16 [128, 4] I32 BF16\n"), "%s", out ? out : "");
    base_free(out);
}

/* Edits dir's header: py is Python over h (the header text) and ix (the index text). */
static int q_edit(const char *src, const char *dst, const char *py) {
    char cmd[8192], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && cp -r %s %s && rm -rf %s/strata.pack && /usr/bin/python3 -c \"import struct\n"
             "p='%s/model-00001-of-00001.safetensors'; b=bytearray(open(p,'rb').read()); n=struct.unpack('<Q',b[:8])[0]\n"
             "h=b[8:8+n].decode(); ix=open('%s/model.safetensors.index.json').read()\n%s\n"
             "assert len(h.encode())==n; b[8:8+n]=h.encode(); open(p,'wb').write(b)\n"
             "open('%s/model.safetensors.index.json','w').write(ix)\"",
             dst, src, dst, dst, dst, dst, py, dst);
    int rc = t_run(cmd, &out);
    if (rc) fprintf(stderr, "%s\n", out ? out : "");
    base_free(out);
    return rc;
}

/* `strata run` of an edited checkpoint: its output with "rc=N" last. */
static char *run_bad(const char *dir) {
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run %s --ids 1,2 --gen 2 2>&1; echo rc=$?", t_strata(), dir);
    t_run(cmd, &out);
    return out;
}

/* Missing companions, wrong companion dtypes and shapes: exit 1, each named. */
TEST(quant_bind_errors) {
    const char *q8 = q_model("fp8", "random", 0), *q4 = q_model("int4", "random", 0);
    CHECK(q8 && q4);
    if (!q8 || !q4) return;
    char bad[1024], *out = NULL;
    snprintf(bad, sizeof bad, "%s/q_bad8", t_tmpdir);
    CHECK(q_edit(q8, bad,
                 "L='model.layers.0.self_attn.'\n"
                 "i=h.index(L+'q_proj.weight_scale_inv'); j=h.index('F32',i); h=h[:j]+'I32'+h[j+3:]\n"
                 "for s in (h, ix): pass\n"
                 "h=h.replace(L+'k_proj.weight_scale_inv', L+'k_proj.weight_scale_xxx'); ix=ix.replace(L+'k_proj.weight_scale_inv', L+'k_proj.weight_scale_xxx')") == 0);
    out = run_bad(bad);
    CHECK_MSG(out && strstr(out, "tensor model.layers.0.self_attn.q_proj.weight_scale_inv has dtype I32, expected F32"), "%s", out ? out : "");
    CHECK_MSG(out && strstr(out, "missing tensor model.layers.0.self_attn.k_proj.weight_scale_inv [1, 1]"), "%s", out ? out : "");
    CHECK_MSG(out && strstr(out, "rc=1"), "%s", out ? out : "");
    base_free(out);
    /* INT4: a scale stored F16 instead of BF16, a weight_shape that disagrees */
    snprintf(bad, sizeof bad, "%s/q_bad4", t_tmpdir);
    CHECK(q_edit(q4, bad,
                 "E='model.layers.2.block_sparse_moe.experts.5.'\n"
                 "i=h.index(E+'w2.weight_scale'); j=h.index('BF16',i); h=h[:j]+'F16\\\"'+h[j+4:]\n"
                 "h=h.replace('\\\"F16\\\"\\\"', '\\\"F16\\\" ')\n"
                 "import json; o=json.loads(h)[E+'w3.weight_shape']['data_offsets'][0]+8+n; b[o:o+4]=struct.pack('<i', 99)") == 0);
    out = run_bad(bad);
    CHECK_MSG(out && strstr(out, "rc=1") && strstr(out, "experts.5.w2.weight_scale has dtype F16, expected BF16 (INT4 weight_scale)"), "%s",
              out ? out : "");
    CHECK_MSG(out && strstr(out, "experts.5.w3.weight_shape says [99, 128], expected [128, 128]"), "%s", out ? out : "");
    base_free(out);
}

/* strata pack of FP8 and INT4 experts (one record each, checksummed): the same
 * logits from the pack at a budget; a flipped byte in an INT4 expert's packed
 * words is caught by the verification, naming the expert. */
TEST(quant_pack_and_verify) {
    const char *q4 = q_model("int4", "random", 0), *q8 = q_model("fp8", "random", 0);
    CHECK(q4 && q8);
    if (!q4 || !q8) return;
    char dir[1024], cmd[8192], *out = NULL;
    for (int k = 0; k < 2; k++) {
        snprintf(dir, sizeof dir, "%s/q_pack%d", t_tmpdir, k);
        snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && %s pack %s --no-measure >/dev/null 2>&1 && %s pack --verify %s 2>&1",
                 dir, k ? q8 : q4, dir, t_strata(), dir, t_strata(), dir);
        CHECK(t_run(cmd, &out) == 0);
        CHECK_MSG(out && strstr(out, "480 experts, every checksum matches"), "%s", out ? out : "");
        base_free(out);
        char *ref = q_logits(k ? q8 : q4, "");
        char extra[64];
        snprintf(extra, sizeof extra, "--ram-gb %.5f", q_min_mb(dir) * 1.1e-3);
        char *got = q_logits(dir, extra);
        CHECK_MSG(ref && got && strlen(ref) > 30 && !strcmp(ref, got), "%s: %s vs %s", dir, got ? got : "", ref ? ref : "");
        base_free(ref);
        base_free(got);
    }
    /* flip one byte of w2.weight_packed in every expert of layer 1 */
    snprintf(dir, sizeof dir, "%s/q_pack0", t_tmpdir);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import json,struct,os\n"
             "p='%s/model-00001-of-00001.safetensors'; st=os.stat(p); b=bytearray(open(p,'rb').read()); n=struct.unpack('<Q',b[:8])[0]; h=json.loads(b[8:8+n])\n"
             "for e in range(96):\n"
             "  o=h['model.layers.1.block_sparse_moe.experts.%%d.w2.weight_packed' %% e]['data_offsets'][0]+8+n+100; b[o]^=0x10\n"
             "open(p,'wb').write(b); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\" && %s run %s " Q_ARGS " --ram-gb %.5f 2>&1; echo rc=$?",
             dir, t_strata(), dir, q_min_mb(dir) * 1.1e-3);
    t_run(cmd, &out);
    CHECK_MSG(out && strstr(out, "rc=1") && strstr(out, "layer 1 expert") && strstr(out, "checksum mismatch"), "%s", out ? out : "");
    base_free(out);
}

/* inspect counts bytes as stored: an FP8 expert is 3 x 128 x 128 bytes of codes
 * plus 3 f32 scales; an INT4 one 3 x (128 x 64 + 128 x 4 x 2 + 8) bytes. */
TEST(quant_inspect_bytes) {
    const char *q8 = q_model("fp8", "random", 0), *q4 = q_model("int4", "random", 0);
    CHECK(q8 && q4);
    if (!q8 || !q4) return;
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1; %s inspect %s 2>&1", t_strata(), q8, t_strata(), q4);
    t_run(cmd, &out);
    CHECK_MSG(out && strstr(out, "one expert: 49,164 bytes"), "%s", out ? out : "");
    CHECK_MSG(out && strstr(out, "one expert: 27,672 bytes"), "%s", out ? out : "");
    CHECK_MSG(out && strstr(out, "experts stored as FP8") && strstr(out, "experts stored as INT4"), "%s", out ? out : "");
    base_free(out);
}
