/*
 * cache.c: leased expert slots with LRU or S3-FIFO eviction (see cache.h).
 *
 * Everything is O(1) per operation except S3-FIFO's skip over leased slots at the
 * tail (bounded by the queue length). Slot lists are intrusive (prev/next slot
 * indices), the key -> slot map is a dense array, and the ghost FIFO is a global
 * sequence number per key (a key is a ghost iff it was evicted within the last
 * n_slots evictions), so nothing is allocated after cache_create.
 */
#include "cache.h"
#include "io.h"

#include <string.h>
#include "base.h"

enum { ST_EMPTY = 0, ST_INFLIGHT = 1, ST_READY = 2 };
enum { Q_NONE = 0, Q_SMALL = 1, Q_MAIN = 2, Q_LRU = 3, Q_FREE = 4 };

typedef struct slot {
    int64_t key;
    int32_t prev, next;
    int32_t pins;
    uint8_t state, queue, freq;
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
    list q[5];               /* indexed by Q_* */
    int64_t n_pinned;
    int64_t small_target;    /* S3-FIFO: 10% of the slots */
    cache_stats st;
};

static void l_remove(cache *c, int32_t i) {
    slot *x = &c->s[i];
    list *l = &c->q[x->queue];
    if (x->prev >= 0) c->s[x->prev].next = x->next; else l->head = x->next;
    if (x->next >= 0) c->s[x->next].prev = x->prev; else l->tail = x->prev;
    x->prev = x->next = -1;
    x->queue = Q_NONE;
    l->n--;
}

static void l_push_head(cache *c, int q, int32_t i) {
    slot *x = &c->s[i];
    list *l = &c->q[q];
    x->queue = (uint8_t)q;
    x->prev = -1;
    x->next = l->head;
    if (l->head >= 0) c->s[l->head].prev = i; else l->tail = i;
    l->head = i;
    l->n++;
}

int cache_create(cache **out, int64_t n_keys, int64_t n_slots, uint64_t slot_bytes, int policy,
                 int with_arena, char *err, size_t errlen) {
    *out = NULL;
    if (n_keys <= 0 || n_slots <= 0 || n_slots > INT32_MAX / 2)
        return base_fail(err, errlen, STRATA_EINVAL, "cache: bad size (%lld keys, %lld slots)",
                         (long long)n_keys, (long long)n_slots);
    cache *c = base_calloc(1, sizeof *c, MEM_CACHE);
    if (!c) goto oom;
    c->policy = policy;
    c->n_keys = n_keys;
    c->n_slots = n_slots;
    c->slot_bytes = slot_bytes;
    c->s = base_calloc((size_t)n_slots, sizeof *c->s, MEM_CACHE);
    c->slot_of = base_alloc((size_t)n_keys * sizeof *c->slot_of, MEM_CACHE);
    c->ghost_at = base_calloc((size_t)n_keys, sizeof *c->ghost_at, MEM_CACHE);
    if (!c->s || !c->slot_of || !c->ghost_at) goto oom;
    if (with_arena) {
        if (slot_bytes && (uint64_t)n_slots > UINT64_MAX / slot_bytes) goto oom;
        c->arena = base_alloc_aligned((size_t)(n_slots * slot_bytes), 1u << 20, MEM_CACHE);
        if (!c->arena) goto oom;
        io_buffer_advise(c->arena, n_slots * slot_bytes);
    }
    for (int64_t k = 0; k < n_keys; k++) c->slot_of[k] = -1;
    for (int q = 0; q < 5; q++) c->q[q] = (list){-1, -1, 0};
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

void cache_free(cache *c) {
    if (!c) return;
    base_free(c->arena);
    base_free(c->s);
    base_free(c->slot_of);
    base_free(c->ghost_at);
    base_free(c);
}

static void forget(cache *c, int32_t i) {
    slot *x = &c->s[i];
    if (x->key >= 0) {
        c->slot_of[x->key] = -1;
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

/* Picks a victim with no lease; returns its slot (detached from queues) or -1. */
static int32_t evict(cache *c) {
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
    if (c->policy == CACHE_S3FIFO) {
        int ghost = is_ghost(c, key);
        if (ghost) c->ghost_at[key] = 0;
        l_push_head(c, ghost ? Q_MAIN : Q_SMALL, i);
    } /* LRU: leased slots stay off the list until unpinned */
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
            if (x->queue == Q_LRU) l_remove(c, i);
        }
        return i;
    }
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
    int64_t counts[5] = {0}, pinned = 0;
    for (int q = 0; q < 5; q++) {
        int32_t prev = -1;
        for (int32_t i = c->q[q].head; i >= 0; i = c->s[i].next) {
            if (c->s[i].queue != q || c->s[i].prev != prev) return 1;
            if (++counts[q] > c->n_slots) return 2;
            prev = i;
        }
        if (c->q[q].tail != prev || counts[q] != c->q[q].n) return 3;
    }
    for (int64_t i = 0; i < c->n_slots; i++) {
        const slot *x = &c->s[i];
        if (x->pins < 0) return 4;
        if (x->pins) pinned++;
        if (x->queue == Q_FREE && (x->state != ST_EMPTY || x->pins || x->key >= 0)) return 5;
        if (x->queue == Q_LRU && (x->pins || x->state == ST_INFLIGHT)) return 6;
        if (x->key >= 0 && c->slot_of[x->key] != i) return 7;
        if (x->state != ST_EMPTY && x->key < 0) return 8;
        if (x->state == ST_INFLIGHT && x->pins == 0) return 9;
        if (x->queue == Q_NONE && x->pins == 0) return 10; /* an unleased slot must be findable */
    }
    for (int64_t k = 0; k < c->n_keys; k++)
        if (c->slot_of[k] >= 0 && c->s[c->slot_of[k]].key != k) return 11;
    if (pinned != c->n_pinned) return 12;
    return 0;
}
