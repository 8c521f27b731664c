/*
 * cache_replay.c: replays an expert request trace (place_opts.trace_path: int32
 * LE (layer, expert) pairs; one experts_request call = one layer's union) through
 * the cache at several sizes with every policy of cache.h (S3-FIFO, LRU, LFU,
 * LAYER) and prints the TRUE resident hit rate of each (hits on keys already
 * resident when requested), beside two bounds: Belady's MIN (the optimal offline
 * policy: on a miss, evict the resident key requested again last) and the
 * ceiling (every request but a key's first). Leases are held for each layer's
 * union, as in the engine, in the policies and in MIN alike.
 *
 * usage: cache_replay TRACE N_EXPERTS SLOTS...   (--csv: comma-separated)
 */
#include <stdlib.h>
#include <string.h>
#include "cache.h"
#include "base.h"

#define MAX_UNION 4096

/* Belady's MIN with the layer's union leased: returns hits. */
static uint64_t belady(const int32_t *t, size_t n, int64_t ne, int64_t n_keys, int64_t slots) {
    int64_t *key = malloc(n * sizeof *key), *nxt = malloc(n * sizeof *nxt), *last = malloc((size_t)n_keys * sizeof *last);
    int64_t *res = malloc((size_t)slots * sizeof *res), *pos = malloc((size_t)n_keys * sizeof *pos);
    int64_t *nu = malloc((size_t)n_keys * sizeof *nu); /* next use of a resident key */
    uint8_t *leased = calloc((size_t)n_keys, 1);
    for (size_t i = 0; i < n; i++) key[i] = (int64_t)t[2 * i] * ne + t[2 * i + 1];
    for (int64_t k = 0; k < n_keys; k++) { last[k] = (int64_t)n; pos[k] = -1; }
    for (size_t i = n; i-- > 0;) { nxt[i] = last[key[i]]; last[key[i]] = (int64_t)i; }
    int64_t n_res = 0;
    uint64_t hits = 0;
    size_t g0 = 0; /* first request of the current layer's union */
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && t[2 * i] != t[2 * (i - 1)]) {
            for (size_t j = g0; j < i; j++) leased[key[j]] = 0;
            g0 = i;
        }
        const int64_t k = key[i];
        leased[k] = 1;
        if (pos[k] >= 0) { hits++; nu[k] = nxt[i]; continue; }
        if (n_res == slots) {
            int64_t v = -1;
            for (int64_t s = 0; s < n_res; s++)
                if (!leased[res[s]] && (v < 0 || nu[res[s]] > nu[res[v]])) v = s;
            if (v < 0) continue; /* every slot leased: the engine streams in waves; not counted */
            pos[res[v]] = -1;
            res[v] = res[--n_res];
            pos[res[v]] = v;
        }
        res[n_res] = k;
        pos[k] = n_res++;
        nu[k] = nxt[i];
    }
    free(key); free(nxt); free(last); free(res); free(pos); free(nu); free(leased);
    return hits;
}

static double replay(const int32_t *t, size_t n, int64_t ne, int64_t n_layers, int64_t slots, int pol) {
    char err[256];
    cache *c = NULL;
    if (cache_create(&c, n_layers * ne, slots, 0, pol, n_layers, 0, err, sizeof err)) { fprintf(stderr, "%s\n", err); exit(1); }
    static int held[MAX_UNION];
    int nh = 0;
    int32_t cur = -1;
    for (size_t i = 0; i < n; i++) {
        if (t[2 * i] != cur || nh == MAX_UNION) { /* a new layer: release the previous union */
            while (nh) cache_unpin(c, held[--nh]);
            cur = t[2 * i];
        }
        int kind, sl = cache_pin(c, (int64_t)t[2 * i] * ne + t[2 * i + 1], &kind);
        if (sl < 0) { while (nh) cache_unpin(c, held[--nh]); continue; }
        if (kind == CACHE_MISS) cache_publish(c, sl);
        held[nh++] = sl;
    }
    while (nh) cache_unpin(c, held[--nh]);
    cache_stats st;
    cache_get_stats(c, &st);
    cache_free(c);
    return st.requests ? (double)st.hits / (double)st.requests : 0;
}

int main(int argc, char **argv) {
    int csv = argc > 1 && !strcmp(argv[1], "--csv");
    if (argc < 4 + csv) { fprintf(stderr, "usage: cache_replay [--csv] TRACE N_EXPERTS SLOTS...\n"); return 2; }
    uint8_t *buf;
    size_t len;
    char err[512];
    if (base_read_file(argv[1 + csv], 1u << 30, &buf, &len, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    const int32_t *t = (const int32_t *)buf;
    const size_t n = len / 8;
    const int64_t ne = atoll(argv[2 + csv]);
    int64_t maxl = 0;
    for (size_t i = 0; i < n; i++) if (t[2 * i] > maxl) maxl = t[2 * i];
    /* the trace's layers are MoE layers counted from 0 at the first; keys as the engine's */
    int64_t minl = maxl;
    for (size_t i = 0; i < n; i++) if (t[2 * i] < minl) minl = t[2 * i];
    int32_t *tt = malloc(len);
    for (size_t i = 0; i < n; i++) { tt[2 * i] = t[2 * i] - (int32_t)minl; tt[2 * i + 1] = t[2 * i + 1]; }
    const int64_t nl = maxl - minl + 1;
    uint8_t *seen = calloc((size_t)(nl * ne), 1);
    uint64_t first = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t k = (int64_t)tt[2 * i] * ne + tt[2 * i + 1];
        if (!seen[k]) { seen[k] = 1; first++; }
    }
    if (csv) printf("slots,pct_of_experts,s3fifo,lru,lfu,layer,belady,ceiling\n");
    else printf("trace: %zu requests over %lld layers x %lld experts, ceiling %.2f%%\n%8s %7s %9s %9s %9s %9s %9s\n", n, (long long)nl,
                (long long)ne, 100.0 * (double)(n - first) / (double)n, "slots", "% keys", "S3-FIFO", "LRU", "LFU", "LAYER", "MIN");
    for (int a = 3 + csv; a < argc; a++) {
        const int64_t slots = atoll(argv[a]);
        double hr[4];
        for (int pol = 0; pol < 4; pol++) hr[pol] = replay(tt, n, ne, nl, slots, pol);
        const double opt = (double)belady(tt, n, ne, nl * ne, slots) / (double)n;
        const double pk = 100.0 * (double)slots / (double)(nl * ne);
        if (csv)
            printf("%lld,%.1f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n", (long long)slots, pk, hr[0], hr[1], hr[2], hr[3], opt,
                   (double)(n - first) / (double)n);
        else
            printf("%8lld %6.1f%% %8.2f%% %8.2f%% %8.2f%% %8.2f%% %8.2f%%\n", (long long)slots, pk, 100 * hr[0], 100 * hr[1],
                   100 * hr[2], 100 * hr[3], 100 * opt);
    }
    free(tt);
    free(seen);
    base_free(buf);
    return 0;
}
