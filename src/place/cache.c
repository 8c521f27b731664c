/*
 * cache.c: leased expert slots with LRU, S3-FIFO, LFU or LAYER eviction (see
 * cache.h).
 *
 * Slot lists are intrusive (prev/next slot indices), the key -> slot map is a
 * dense array, and the ghost FIFO is a global sequence number per key (a key is
 * a ghost iff it was evicted within the last n_slots evictions), so nothing is
 * allocated after cache_create. LRU is O(1) per operation, S3-FIFO too except its
 * skip over leased slots at a queue's tail (bounded by the queue length).
 *
 * LFU and LAYER keep the unleased resident slots in one list per layer (newest
 * at the head) and each layer's victim cached: the least requested key of the
 * layer, the oldest of equals. Within a layer both policies rank keys the same
 * way (LAYER's expected time to the next request only grows as the count falls:
 * every key of a layer shares its distance and its visits), so an eviction
 * compares one candidate per layer and rescans only the layer it took from:
 * O(n_layers + slots per layer) instead of O(n_slots).
 */
#include "cache.h"
#include "io.h"

#include <string.h>
#include "base.h"

enum { ST_EMPTY = 0, ST_INFLIGHT = 1, ST_READY = 2 };
/* Lists: Q_LAYER0 + l is layer l's candidate list (LFU, LAYER). */
enum { Q_NONE = 0, Q_SMALL = 1, Q_MAIN = 2, Q_LRU = 3, Q_FREE = 4, Q_LAYER0 = 5 };

typedef struct slot {
    int64_t key;
    uint64_t stamp;          /* LFU/LAYER: when it became a candidate (older = smaller) */
    int32_t prev, next;
    int32_t pins;
    int32_t queue;
    uint8_t state, freq;
} slot;

typedef struct list { int32_t head, tail; int64_t n; } list; /* head = newest */

struct cache {
    int policy;
    int64_t n_keys, n_slots;
    uint64_t slot_bytes;
    uint8_t *arena;
    slot *s;
    int32_t *slot_of;        /* key -> slot or -1 */
    uint64_t *ghost_at;      /* key -> eviction sequence + 1 (0 = never) */
    uint64_t evict_seq;
    list *q;                 /* Q_LAYER0 + n_layers lists */
    int64_t n_pinned;
    int64_t small_target;    /* S3-FIFO: 10% of the slots */
    /* LFU / LAYER: requests per key and visits per layer (a visit: a request
     * of another layer than the one before), both halved every 4 n_keys
     * requests so that recent ones weigh more; the layer requested last; each
     * layer's victim (-1 = none or to be found again) */
    uint32_t *cnt, *visits;
    uint64_t age_left, stamp;
    int64_t n_layers, per_layer, cur_layer;
    int32_t *lmin;
    int64_t *held;           /* per layer: keys bound to a slot (any state) */
    cache_stats st;
};

static void l_remove(cache *c, int32_t i) {
    slot *x = &c->s[i];
    list *l = &c->q[x->queue];
    if (x->prev >= 0) c->s[x->prev].next = x->next; else l->head = x->next;
    if (x->next >= 0) c->s[x->next].prev = x->prev; else l->tail = x->prev;
    if (x->queue >= Q_LAYER0 && c->lmin[x->queue - Q_LAYER0] == i) c->lmin[x->queue - Q_LAYER0] = -1;
    x->prev = x->next = -1;
    x->queue = Q_NONE;
    l->n--;
}

static void l_push_head(cache *c, int q, int32_t i) {
    slot *x = &c->s[i];
    list *l = &c->q[q];
    x->queue = q;
    x->prev = -1;
    x->next = l->head;
    if (l->head >= 0) c->s[l->head].prev = i; else l->tail = i;
    l->head = i;
    l->n++;
}

static int scored(const cache *c) { return c->policy == CACHE_LFU || c->policy == CACHE_LAYER; }

/* 1 if slot a is a better victim than b within one layer: fewer requests, or as
 * many and older. */
static int worse(const cache *c, int32_t a, int32_t b) {
    const uint32_t ca = c->cnt[c->s[a].key], cb = c->cnt[c->s[b].key];
    return ca < cb || (ca == cb && c->s[a].stamp < c->s[b].stamp);
}

/* An unleased resident slot becomes a candidate (LFU, LAYER). */
static void cand_add(cache *c, int32_t i) {
    const int64_t l = c->s[i].key / c->per_layer;
    const int32_t m = c->lmin[l];
    const int64_t n = c->q[Q_LAYER0 + l].n;
    c->s[i].stamp = ++c->stamp;
    l_push_head(c, (int)(Q_LAYER0 + l), i);
    /* the cached victim stays valid unless the list was empty or this one is
     * requested less (it is the newest, so it loses ties) */
    if (n == 0 || (m >= 0 && worse(c, i, m))) c->lmin[l] = i;
}

int cache_create(cache **out, int64_t n_keys, int64_t n_slots, uint64_t slot_bytes, int policy, int64_t n_layers,
                 int with_arena, char *err, size_t errlen) {
    *out = NULL;
    if (n_layers < 1) n_layers = 1;
    if (n_keys <= 0 || n_slots <= 0 || n_slots > INT32_MAX / 2 || n_keys % n_layers || n_layers > INT32_MAX / 2)
        return base_fail(err, errlen, STRATA_EINVAL, "cache: bad size (%lld keys in %lld layers, %lld slots)",
                         (long long)n_keys, (long long)n_layers, (long long)n_slots);
    cache *c = base_calloc(1, sizeof *c, MEM_CACHE);
    if (!c) goto oom;
    c->policy = policy;
    c->n_keys = n_keys;
    c->n_slots = n_slots;
    c->slot_bytes = slot_bytes;
    c->n_layers = n_layers;
    c->per_layer = n_keys / n_layers;
    c->cur_layer = -1;
    c->age_left = 4 * (uint64_t)n_keys;
    c->s = base_calloc((size_t)n_slots, sizeof *c->s, MEM_CACHE);
    c->slot_of = base_alloc((size_t)n_keys * sizeof *c->slot_of, MEM_CACHE);
    c->ghost_at = base_calloc((size_t)n_keys, sizeof *c->ghost_at, MEM_CACHE);
    c->q = base_alloc((size_t)(Q_LAYER0 + n_layers) * sizeof *c->q, MEM_CACHE);
    c->held = base_calloc((size_t)n_layers, sizeof *c->held, MEM_CACHE);
    if (!c->s || !c->slot_of || !c->ghost_at || !c->q || !c->held) goto oom;
    if (scored(c)) {
        c->cnt = base_calloc((size_t)n_keys, sizeof *c->cnt, MEM_CACHE);
        c->visits = base_calloc((size_t)n_layers, sizeof *c->visits, MEM_CACHE);
        c->lmin = base_alloc((size_t)n_layers * sizeof *c->lmin, MEM_CACHE);
        if (!c->cnt || !c->visits || !c->lmin) goto oom;
        for (int64_t l = 0; l < n_layers; l++) c->lmin[l] = -1;
    }
    if (with_arena) {
        if (slot_bytes && (uint64_t)n_slots > UINT64_MAX / slot_bytes) goto oom;
        c->arena = base_alloc_aligned((size_t)(n_slots * slot_bytes), 1u << 20, MEM_CACHE);
        if (!c->arena) goto oom;
        io_buffer_advise(c->arena, n_slots * slot_bytes);
    }
    for (int64_t k = 0; k < n_keys; k++) c->slot_of[k] = -1;
    for (int64_t q = 0; q < Q_LAYER0 + n_layers; q++) c->q[q] = (list){-1, -1, 0};
    for (int64_t i = n_slots - 1; i >= 0; i--) {
        c->s[i] = (slot){.key = -1, .prev = -1, .next = -1};
        l_push_head(c, Q_FREE, (int32_t)i);
    }
    c->small_target = n_slots / 10 > 0 ? n_slots / 10 : 1;
    *out = c;
    return STRATA_OK;
oom:
    cache_free(c);
    return base_fail(err, errlen, STRATA_EBUDGET, "cache: cannot allocate %lld slots of %llu bytes",
                     (long long)n_slots, (unsigned long long)slot_bytes);
}

uint64_t cache_meta_bytes(int64_t n_keys, int64_t n_slots, int64_t n_layers) {
    if (n_layers < 1) n_layers = 1;
    return sizeof(cache) + (uint64_t)n_slots * sizeof(slot) +
           (uint64_t)n_keys * (sizeof(int32_t) + sizeof(uint64_t) + sizeof(uint32_t)) +
           (uint64_t)(Q_LAYER0 + n_layers) * sizeof(list) + (uint64_t)n_layers * (sizeof(uint32_t) + sizeof(int32_t) + sizeof(int64_t));
}

void cache_free(cache *c) {
    if (!c) return;
    base_free(c->arena);
    base_free(c->s);
    base_free(c->slot_of);
    base_free(c->ghost_at);
    base_free(c->q);
    base_free(c->held);
    base_free(c->cnt);
    base_free(c->visits);
    base_free(c->lmin);
    base_free(c);
}

/* One more request of key (LFU, LAYER). Counted before a victim is chosen for
 * it: the walk has moved to its layer. */
static void count_request(cache *c, int64_t key) {
    const int64_t l = key / c->per_layer;
    if (l != c->cur_layer) {
        c->cur_layer = l;
        c->visits[l]++;
    }
    if (c->cnt[key] < UINT32_MAX) c->cnt[key]++; /* the key is leased now: no list holds it */
    if (--c->age_left == 0) {
        for (int64_t k = 0; k < c->n_keys; k++) c->cnt[k] >>= 1;
        for (int64_t k = 0; k < c->n_layers; k++) {
            c->visits[k] >>= 1;
            c->lmin[k] = -1; /* halving can make equals of unequal counts */
        }
        c->age_left = 4 * (uint64_t)c->n_keys;
    }
}

/* Layer steps until key is expected to be requested again (LAYER): d to its
 * layer's next visit in the cyclic walk, plus n for every visit it is expected
 * to skip, (1 - p) / p with p = its requests per visit of its layer. */
static double next_use(const cache *c, int64_t key) {
    const int64_t n = c->n_layers, l = key / c->per_layer;
    const int64_t d = c->cur_layer < 0 ? n : ((l - c->cur_layer - 1) % n + n) % n + 1;
    const double p = ((double)c->cnt[key] + 0.5) / ((double)c->visits[l] + 1);
    return (double)d + (double)n * (p >= 1 ? 0 : (1 - p) / p);
}

static void forget(cache *c, int32_t i) {
    slot *x = &c->s[i];
    if (x->key >= 0) {
        c->slot_of[x->key] = -1;
        c->held[x->key / c->per_layer]--;
        c->ghost_at[x->key] = ++c->evict_seq;
    }
    x->key = -1;
    x->state = ST_EMPTY;
    x->freq = 0;
}

static int is_ghost(const cache *c, int64_t key) {
    uint64_t g = c->ghost_at[key];
    return g && c->evict_seq - g < (uint64_t)c->n_slots;
}

/* LFU / LAYER: the best victim of every layer (found again where unknown), then
 * the best of those: fewest requests (LFU) or latest expected request (LAYER),
 * the oldest of equals. */
static int32_t evict_scored(cache *c) {
    int32_t best = -1;
    double bs = 0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        const list *L = &c->q[Q_LAYER0 + l];
        if (L->n == 0) continue;
        int32_t m = c->lmin[l];
        if (m < 0) {
            for (int32_t i = L->tail; i >= 0; i = c->s[i].prev)
                if (m < 0 || worse(c, i, m)) m = i;
            c->lmin[l] = m;
        }
        const double sc = c->policy == CACHE_LFU ? (double)c->cnt[c->s[m].key] : -next_use(c, c->s[m].key);
        if (best < 0 || sc < bs || (sc == bs && c->s[m].stamp < c->s[best].stamp)) { best = m; bs = sc; }
    }
    if (best >= 0) l_remove(c, best);
    return best;
}

/* Picks a victim with no lease; returns its slot (detached from queues) or -1. */
static int32_t evict(cache *c) {
    if (scored(c)) return evict_scored(c);
    if (c->policy == CACHE_LRU) {
        int32_t i = c->q[Q_LRU].tail;
        if (i < 0) return -1;
        l_remove(c, i);
        return i;
    }
    int64_t skip_s = 0, skip_m = 0;
    for (int64_t guard = 0; guard < 8 * c->n_slots + 16; guard++) {
        list *S = &c->q[Q_SMALL], *M = &c->q[Q_MAIN];
        int s_ok = S->n > 0 && skip_s < S->n, m_ok = M->n > 0 && skip_m < M->n;
        if (!s_ok && !m_ok) return -1;
        int from_s = s_ok && (S->n > c->small_target || !m_ok);
        int q = from_s ? Q_SMALL : Q_MAIN;
        int32_t i = c->q[q].tail;
        slot *x = &c->s[i];
        l_remove(c, i);
        if (x->pins > 0 || x->state == ST_INFLIGHT) { /* leased: never evicted */
            l_push_head(c, q, i);
            if (from_s) skip_s++; else skip_m++;
            continue;
        }
        if (from_s) {
            if (x->freq > 0) { x->freq = 0; l_push_head(c, Q_MAIN, i); skip_m = 0; continue; }
        } else if (x->freq > 0) {
            x->freq--;
            l_push_head(c, Q_MAIN, i);
            skip_m = 0; /* skips count consecutive leased slots only */
            continue;
        }
        return i;
    }
    return -1;
}

/* A free or evicted slot for key, reserved INFLIGHT with one lease; -1 if none. */
static int32_t take_slot(cache *c, int64_t key) {
    int32_t i = c->q[Q_FREE].tail;
    if (i >= 0) {
        l_remove(c, i);
    } else {
        i = evict(c);
        if (i < 0) return -1;
        ST_ASSERT(c->s[i].pins == 0 && c->s[i].state != ST_INFLIGHT);
        forget(c, i);
        c->st.evictions++;
    }
    slot *x = &c->s[i];
    x->key = key;
    x->state = ST_INFLIGHT;
    x->freq = 0;
    x->pins = 1;
    c->n_pinned++;
    c->slot_of[key] = i;
    c->held[key / c->per_layer]++;
    if (c->policy == CACHE_S3FIFO) {
        int ghost = is_ghost(c, key);
        if (ghost) c->ghost_at[key] = 0;
        l_push_head(c, ghost ? Q_MAIN : Q_SMALL, i);
    } /* the other policies: leased slots stay off the lists until unpinned */
    return i;
}

int cache_pin(cache *c, int64_t key, int *kind) {
    ST_ASSERT(key >= 0 && key < c->n_keys);
    c->st.requests++;
    int32_t i = c->slot_of[key];
    if (i >= 0) {
        slot *x = &c->s[i];
        if (x->state == ST_READY) { c->st.hits++; *kind = CACHE_HIT; }
        else { c->st.inflight_joins++; *kind = CACHE_INFLIGHT; }
        if (x->freq < 3) x->freq++;
        if (x->pins++ == 0) {
            c->n_pinned++;
            if (x->queue == Q_LRU || x->queue >= Q_LAYER0) l_remove(c, i);
        }
        if (scored(c)) count_request(c, key);
        return i;
    }
    if (scored(c)) count_request(c, key);
    i = take_slot(c, key);
    if (i < 0) { c->st.requests--; return STRATA_EBUDGET; }
    c->st.misses++;
    *kind = CACHE_MISS;
    return i;
}

int cache_prefetch(cache *c, int64_t key) {
    ST_ASSERT(key >= 0 && key < c->n_keys);
    if (c->slot_of[key] >= 0) return -1;
    int32_t i = take_slot(c, key);
    if (i >= 0) c->st.prefetches++;
    return i;
}

void cache_seed(cache *c, int64_t key, uint32_t n) {
    if (!scored(c) || key < 0 || key >= c->n_keys || c->cnt[key] >= n) return;
    c->cnt[key] = n;
    c->lmin[key / c->per_layer] = -1; /* the layer's victim is found again */
}

int64_t cache_layer_held(const cache *c, int64_t layer) {
    return layer >= 0 && layer < c->n_layers ? c->held[layer] : 0;
}

int cache_find(const cache *c, int64_t key) {
    ST_ASSERT(key >= 0 && key < c->n_keys);
    return c->slot_of[key];
}

void cache_publish(cache *c, int slot_i) {
    ST_ASSERT(c->s[slot_i].state == ST_INFLIGHT);
    c->s[slot_i].state = ST_READY;
}

void cache_fail(cache *c, int slot_i) {
    slot *x = &c->s[slot_i];
    ST_ASSERT(x->state == ST_INFLIGHT && x->pins > 0);
    if (x->queue != Q_NONE) l_remove(c, slot_i);
    c->slot_of[x->key] = -1;
    c->held[x->key / c->per_layer]--;
    x->key = -1;
    x->state = ST_EMPTY;
    x->freq = 0;
}

void cache_unpin(cache *c, int slot_i) {
    slot *x = &c->s[slot_i];
    ST_ASSERT(x->pins > 0);
    if (--x->pins > 0) return;
    c->n_pinned--;
    if (x->state == ST_EMPTY) {
        if (x->queue != Q_NONE) l_remove(c, slot_i);
        l_push_head(c, Q_FREE, slot_i);
    } else if (c->policy == CACHE_LRU) {
        l_push_head(c, Q_LRU, slot_i);
    } else if (scored(c)) {
        cand_add(c, slot_i);
    }
}

uint8_t *cache_data(cache *c, int slot_i) {
    return c->arena ? c->arena + (uint64_t)slot_i * c->slot_bytes : NULL;
}
int cache_state(const cache *c, int slot_i) { return c->s[slot_i].state; }
int64_t cache_key(const cache *c, int slot_i) { return c->s[slot_i].key; }
int cache_leases(const cache *c, int slot_i) { return c->s[slot_i].pins; }
int64_t cache_n_slots(const cache *c) { return c->n_slots; }
int64_t cache_n_pinned(const cache *c) { return c->n_pinned; }
void cache_get_stats(const cache *c, cache_stats *s) { *s = c->st; }
void cache_reset_stats(cache *c) { memset(&c->st, 0, sizeof c->st); }
void cache_set_stats(cache *c, const cache_stats *s) { c->st = *s; }
int cache_resident(const cache *c, int64_t key) {
    if (key < 0 || key >= c->n_keys) return 0;
    const int32_t i = c->slot_of[key];
    return i >= 0 && c->s[i].state == ST_READY;
}

int cache_check(const cache *c) {
    const int64_t nq = Q_LAYER0 + c->n_layers;
    int64_t counts[Q_LAYER0] = {0}, pinned = 0;
    for (int64_t q = 0; q < nq; q++) {
        int32_t prev = -1;
        int64_t n = 0;
        for (int32_t i = c->q[q].head; i >= 0; i = c->s[i].next) {
            if (c->s[i].queue != q || c->s[i].prev != prev) return 1;
            if (++n > c->n_slots) return 2;
            if (q >= Q_LAYER0 && c->s[i].key / c->per_layer != q - Q_LAYER0) return 13;
            prev = i;
        }
        if (c->q[q].tail != prev || n != c->q[q].n) return 3;
        if (q < Q_LAYER0) counts[q] = n;
        if (q >= Q_LAYER0 && n && c->lmin[q - Q_LAYER0] >= 0) { /* the cached victim is the best of its layer */
            const int32_t m = c->lmin[q - Q_LAYER0];
            if (c->s[m].queue != q) return 14;
            for (int32_t i = c->q[q].head; i >= 0; i = c->s[i].next)
                if (i != m && worse(c, i, m)) return 15;
        }
    }
    (void)counts;
    for (int64_t i = 0; i < c->n_slots; i++) {
        const slot *x = &c->s[i];
        if (x->pins < 0) return 4;
        if (x->pins) pinned++;
        if (x->queue == Q_FREE && (x->state != ST_EMPTY || x->pins || x->key >= 0)) return 5;
        if ((x->queue == Q_LRU || x->queue >= Q_LAYER0) && (x->pins || x->state == ST_INFLIGHT)) return 6;
        if (x->key >= 0 && c->slot_of[x->key] != i) return 7;
        if (x->state != ST_EMPTY && x->key < 0) return 8;
        if (x->state == ST_INFLIGHT && x->pins == 0) return 9;
        if (x->queue == Q_NONE && x->pins == 0) return 10; /* an unleased slot must be findable */
    }
    for (int64_t l = 0; l < c->n_layers; l++) { /* the lookup table, and each layer's count of held keys */
        int64_t n = 0;
        for (int64_t k = l * c->per_layer; k < (l + 1) * c->per_layer; k++) {
            if (c->slot_of[k] >= 0 && c->s[c->slot_of[k]].key != k) return 11;
            n += c->slot_of[k] >= 0;
        }
        if (n != c->held[l]) return 16;
    }
    if (pinned != c->n_pinned) return 12;
    return 0;
}
