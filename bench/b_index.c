/*
 * b_index.c: how long st_open takes on K3-shaped shards, without the checkpoint.
 *
 * Writes `n_shards` sparse shards (default 8) of ~5,200 tensors each with K3 names
 * and shapes (one layer's trunk, then experts' w1/w2/w3 packed+scale), headers of
 * ~790 KB like the real 96 shards, data left as a hole via ftruncate, plus a
 * model.safetensors.index.json. Times st_open with and without the index and one
 * st_find per tensor. Usage: b_index [n_shards] [tensors_per_shard]
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base.h"
#include "st.h"

static const char *k_trunk[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.g_proj.weight", "self_attn.o_proj.weight", "block_sparse_moe.gate.weight"};
static const int64_t k_trunk_shape[][2] = {{7168, 1}, {7168, 1}, {12288, 7168}, {12288, 7168},
    {12288, 7168}, {12288, 7168}, {7168, 12288}, {896, 7168}};
static const char *k_exp[] = {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                              "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"};
static const int64_t k_exp_shape[][2] = {{3072, 1792}, {3072, 112}, {3584, 1536}, {3584, 96},
                                         {3072, 1792}, {3072, 112}};

/* Name of tensor i of a shard holding layer L (the same sequence the header uses). */
static void tensor_name(char *buf, size_t n, int L, int i, int64_t *rows, int64_t *cols, int *bf16) {
    if (i < 8) {
        snprintf(buf, n, "language_model.model.layers.%d.%s", L, k_trunk[i]);
        *rows = k_trunk_shape[i][0];
        *cols = k_trunk_shape[i][1];
        *bf16 = 1;
    } else {
        int e = (i - 8) / 6, k = (i - 8) % 6;
        snprintf(buf, n, "language_model.model.layers.%d.block_sparse_moe.experts.%d.%s", L, e, k_exp[k]);
        *rows = k_exp_shape[k][0];
        *cols = k_exp_shape[k][1];
        *bf16 = 0;
    }
}

static int write_shard(const char *path, int L, int n, size_t *hdr_bytes) {
    sbuf h = {0};
    uint64_t off = 0;
    char name[256];
    sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        int64_t r, c;
        int bf16;
        tensor_name(name, sizeof name, L, i, &r, &c, &bf16);
        uint64_t nb = (uint64_t)r * (uint64_t)c * (bf16 ? 2 : 1);
        if (c == 1)
            sbuf_printf(&h, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%lld],\"data_offsets\":[%llu,%llu]}",
                        name, (long long)r, (unsigned long long)off, (unsigned long long)(off + nb));
        else
            sbuf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%llu,%llu]}",
                        name, bf16 ? "BF16" : "U8", (long long)r, (long long)c, (unsigned long long)off,
                        (unsigned long long)(off + nb));
        off += nb;
    }
    sbuf_printf(&h, "}");
    uint8_t pre[8];
    for (int i = 0; i < 8; i++) pre[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int ok = fd >= 0 && write(fd, pre, 8) == 8 && write(fd, h.s, h.len) == (ssize_t)h.len &&
             ftruncate(fd, (off_t)(8 + h.len + off)) == 0;
    if (fd >= 0) close(fd);
    *hdr_bytes = h.len;
    sbuf_free(&h);
    return ok ? 0 : -1;
}

/* CPU seconds of this process: the wall clock on a shared box mostly measures
 * the neighbours (seen: 8 ms CPU vs 93 ms wall per header at load 10 on 2 cores). */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int n_shards = argc > 1 ? atoi(argv[1]) : 8;
    int per = argc > 2 ? atoi(argv[2]) : 5200;
    if (n_shards < 1 || n_shards > 96 || per < 8) {
        fprintf(stderr, "usage: b_index [n_shards 1..96] [tensors_per_shard >= 8]\n");
        return 2;
    }
    char dir[] = "/tmp/strata-b_index-XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    size_t hdr = 0;
    sbuf ij = {0};
    sbuf_printf(&ij, "{\"metadata\":{},\"weight_map\":{");
    for (int s = 0; s < n_shards; s++) {
        char path[512], shard[64], name[256];
        snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        if (write_shard(path, s + 1, per, &hdr)) { fprintf(stderr, "%s: write failed\n", path); return 1; }
        for (int i = 0; i < per; i++) {
            int64_t r, c;
            int bf16;
            tensor_name(name, sizeof name, s + 1, i, &r, &c, &bf16);
            sbuf_printf(&ij, "%s\"%s\":\"%s\"", s || i ? "," : "", name, shard);
        }
    }
    sbuf_printf(&ij, "}}");
    char err[512], ipath[512];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    st_index *ix;
    /* 3 runs each, best time: the page cache is warm after the first. */
    double best_scan = 1e9, best_idx = 1e9, t_find = 0, cpu_scan = 1e9, cpu_idx = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = base_now(), c0 = cpu_now();
        if (st_open(&ix, dir, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        double dt = base_now() - t0, dc = cpu_now() - c0;
        if (dt < best_scan) best_scan = dt;
        if (dc < cpu_scan) cpu_scan = dc;
        if (rep == 0) {
            t0 = base_now();
            size_t hit = 0;
            for (size_t i = 0; i < st_count(ix); i++) hit += st_find(ix, st_at(ix, i)->name) == st_at(ix, i);
            t_find = base_now() - t0;
            if (hit != st_count(ix)) { fprintf(stderr, "lookup mismatch\n"); return 1; }
        }
        st_close(ix);
    }
    if (base_write_file_atomic(ipath, ij.s, ij.len, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    for (int rep = 0; rep < 3; rep++) {
        double t0 = base_now(), c0 = cpu_now();
        if (st_open(&ix, dir, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        double dt = base_now() - t0, dc = cpu_now() - c0;
        if (dt < best_idx) best_idx = dt;
        if (dc < cpu_idx) cpu_idx = dc;
        if (rep < 2) st_close(ix);
    }
    size_t n = st_count(ix);
    uint64_t mem = base_mem_used_tag(MEM_INDEX);
    st_close(ix);
    printf("b_index: %d shards x %d tensors, %zu-byte headers, index.json %zu bytes\n", n_shards, per, hdr, ij.len);
    printf("  st_open scan:  wall %.1f ms (%.2f ms/shard), cpu %.2f ms/shard (%.0f MB/s of header)\n",
           best_scan * 1e3, best_scan * 1e3 / n_shards, cpu_scan * 1e3 / n_shards,
           (double)hdr * n_shards / cpu_scan / 1e6);
    printf("  st_open index: wall %.1f ms (%.2f ms/shard), cpu %.2f ms/shard\n", best_idx * 1e3,
           best_idx * 1e3 / n_shards, cpu_idx * 1e3 / n_shards);
    printf("  st_find:       %.0f ns/lookup over %zu tensors\n", t_find * 1e9 / (double)n, n);
    printf("  index RAM:     %.1f MB (%.0f B/tensor); K3 estimate for 497,220 tensors: %.0f MB\n",
           (double)mem / 1e6, (double)mem / (double)n, (double)mem / (double)n * 497220 / 1e6);
    sbuf_free(&ij);
    base_rm_rf(dir);
    return 0;
}
