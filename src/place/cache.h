/*
 * cache.h: the routed-expert cache: a fixed arena of equal slots, leased.
 *
 * Keys are dense integers (moe_layer * n_experts + expert). A slot is EMPTY,
 * INFLIGHT (reserved for a read that has not landed: never handed to another key,
 * never evicted) or READY. cache_pin returns a leased slot; only slots with no
 * lease are eviction candidates, so a caller's view stays valid until cache_unpin
 * (ST_ASSERT fires if the policy ever picks a leased slot). The arena is allocated
 * once (MEM_CACHE), so the budget is never exceeded after cache_create.
 *
 * Policies: LRU; S3-FIFO (a small FIFO of 10% of the slots for first-time keys, a
 * main FIFO with a 2-bit frequency for keys seen again, and a ghost FIFO of
 * recently evicted keys that admits a returning key straight to main); LFU and
 * LAYER (below). Hits are TRUE resident hits: the key was READY when it was
 * requested. Replay of traces of generated models (bench/ladder/cache_replay;
 * table in docs/performance.md): LAYER is the best of the four at every size, e.g. ladder (216
 * tokens, 59,304 requests, 36 x 448 keys) at 1024 slots: LAYER 62.7%, LFU 62.4%,
 * S3-FIFO 55.9%, LRU 46.4% (Belady's MIN 79.6%); the place.h default.
 * Not thread-safe: one caller (the forward thread) owns a cache.
 */
#ifndef STRATA_CACHE_H
#define STRATA_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* LFU: the least often requested key goes first (counts per key kept across
 * evictions, halved every 4 n_keys requests), the oldest of equals. LAYER: keys
 * are layer-major and layers are requested in a cyclic walk; evicts the key
 * whose next request is expected last: its layer's next visit d layers ahead,
 * plus a whole walk of n layers for each visit it is expected to skip ((1 - p) /
 * p, p its requests per recent visit of its layer). */
enum { CACHE_S3FIFO = 0, CACHE_LRU = 1, CACHE_LFU = 2, CACHE_LAYER = 3 };
enum { CACHE_HIT = 0, CACHE_MISS = 1, CACHE_INFLIGHT = 2 };

typedef struct cache cache;

typedef struct cache_stats {
    uint64_t requests, hits, misses, evictions, inflight_joins;
    uint64_t prefetches;      /* slots reserved by cache_prefetch (not requests) */
} cache_stats;

/* n_keys keys, n_slots slots of slot_bytes each (IO_ALIGN multiple). Keys are
 * layer * (n_keys / n_layers) + expert (n_layers divides n_keys; 0 or 1: one
 * layer). with_arena = 0 makes a simulation cache (no data, for trace replay). */
int cache_create(cache **out, int64_t n_keys, int64_t n_slots, uint64_t slot_bytes, int policy, int64_t n_layers,
                 int with_arena, char *err, size_t errlen);
void cache_free(cache *c); /* accepts NULL */
/* Bytes cache_create allocates beside the arena (every policy's tables counted),
 * for the planner: at ladder's 7,990 slots and 16,128 keys ~0.6 MB. */
uint64_t cache_meta_bytes(int64_t n_keys, int64_t n_slots, int64_t n_layers);

/* Leases the slot of key. *kind: CACHE_HIT (READY: use it), CACHE_MISS (the slot is
 * reserved INFLIGHT for this key: the caller reads into it, then cache_publish, or
 * cache_fail on error), CACHE_INFLIGHT (another lease is loading it). Returns the
 * slot index, or STRATA_EBUDGET when every slot is leased or in flight. */
int cache_pin(cache *c, int64_t key, int *kind);
/* A read ahead of a request: when key is not resident and a slot can be taken
 * (a free one, or a victim), reserves it INFLIGHT with one lease exactly as a
 * miss would, without counting a request. Returns the slot, or -1 when the key
 * is already resident or in flight, or no slot can be taken. A later cache_pin
 * of the key finds it (CACHE_INFLIGHT until published, then CACHE_HIT). */
int cache_prefetch(cache *c, int64_t key);
/* A prior for LFU and LAYER: key counts as requested at least n times (its count
 * is raised to n; later requests add to it and the halving ages it like any
 * count). Other policies ignore it. */
void cache_seed(cache *c, int64_t key, uint32_t n);
/* Keys of layer `layer` that hold a slot (READY or INFLIGHT); 0 outside the layers. */
int64_t cache_layer_held(const cache *c, int64_t layer);
/* The slot holding key (any state), or -1; changes nothing. */
int cache_find(const cache *c, int64_t key);
void cache_publish(cache *c, int slot);   /* INFLIGHT -> READY */
void cache_fail(cache *c, int slot);      /* INFLIGHT -> EMPTY (key forgotten); lease kept */
void cache_unpin(cache *c, int slot);     /* drops one lease */
uint8_t *cache_data(cache *c, int slot);  /* slot bytes; valid while leased */
int cache_state(const cache *c, int slot); /* 0 EMPTY, 1 INFLIGHT, 2 READY */
int64_t cache_key(const cache *c, int slot);
int cache_leases(const cache *c, int slot); /* leases held on slot */
int64_t cache_n_slots(const cache *c);
int64_t cache_n_pinned(const cache *c);
void cache_get_stats(const cache *c, cache_stats *s);
void cache_reset_stats(cache *c);
void cache_set_stats(cache *c, const cache_stats *s);
/* 1 if key is READY in a slot now (no lease, no statistics, no policy update). */
int cache_resident(const cache *c, int64_t key);
/* Checks every invariant (queues, lookup table, leases); 0 if consistent. */
int cache_check(const cache *c);

#endif
