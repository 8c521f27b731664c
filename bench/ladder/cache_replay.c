/*
 * cache_replay.c: replays an expert request trace (place_opts.trace_path: int32
 * LE (layer, expert) pairs; one experts_request call = one layer's union) through
 * the cache at several sizes with LRU and S3-FIFO, and prints the TRUE resident hit
 * rate of each (hits on keys already resident when requested). Leases are held for
 * each layer's union, as in the engine.
 *
 * usage: cache_replay TRACE N_EXPERTS SLOTS...
 */
#include <stdlib.h>
#include <string.h>
#include "cache.h"
#include "base.h"

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: cache_replay TRACE N_EXPERTS SLOTS...\n"); return 2; }
    uint8_t *buf;
    size_t len;
    char err[512];
    if (base_read_file(argv[1], 1u << 30, &buf, &len, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    const int32_t *t = (const int32_t *)buf;
    size_t n = len / 8;
    int64_t ne = atoll(argv[2]), maxl = 0;
    for (size_t i = 0; i < n; i++) if (t[2 * i] > maxl) maxl = t[2 * i];
    printf("trace: %zu requests over %lld layers\n%8s %10s %10s\n", n, (long long)maxl + 1, "slots", "S3-FIFO", "LRU");
    int *held = malloc(4096 * sizeof *held);
    for (int a = 3; a < argc; a++) {
        int64_t slots = atoll(argv[a]);
        double hr[2];
        for (int pol = 0; pol < 2; pol++) {
            cache *c = NULL;
            if (cache_create(&c, (maxl + 1) * ne, slots, 0, pol, 0, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
            int nh = 0;
            int32_t cur = -1;
            for (size_t i = 0; i < n; i++) {
                if (t[2 * i] != cur || nh == 4096) { /* a new layer: release the previous union */
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
            hr[pol] = st.requests ? (double)st.hits / (double)st.requests : 0;
            cache_free(c);
        }
        printf("%8lld %9.2f%% %9.2f%%\n", (long long)slots, 100 * hr[0], 100 * hr[1]);
    }
    return 0;
}
