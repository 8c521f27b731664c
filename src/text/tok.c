/*
 * tok.c: tiktoken-compatible byte-level BPE (see tok.h).
 *
 * Owns: the tokenizer's tables (token bytes, the bytes -> id map and its
 * filters), rank-based BPE, the pre-tokenizer split (PCRE2, UTF+UCP, JIT),
 * encode, decode and streaming decode. Opening a tiktoken vocabulary (its
 * patterns, the vocabulary file, tokenizer_config.json's specials) is tok_load.c;
 * a tokenizer.json is tok_hf.c. It does not know about chat markup (chat.c).
 *
 * Invariants: ranks are dense 0..n_ranks-1 and every single byte has a rank, so
 * every byte string encodes and decode(encode(x)) == x for any bytes. Text that
 * is not valid UTF-8 is cut into maximal valid runs; each invalid byte becomes its
 * own piece (tiktoken only ever sees valid text, so this is our extension).
 */
#include "tok.h"
#include "tok_priv.h"

#include <string.h>
#include <xxhash.h>
#include "base.h"

/* ===== The tokenizer object ===== */

static uint64_t hash_bytes(const uint8_t *p, size_t n) { return XXH3_64bits(p, n); }

static inline uint64_t load8(const uint8_t *p, size_t n) {
    uint64_t k = 0;
    memcpy(&k, p, n < 8 ? n : 8);
    return k;
}

/* The hash table is 8 MB for o200k, so almost every probe is a cache miss
 * (perf: 45% of encode time on the first probe). Two small L2-resident filters
 * answer most lookups without touching it: a direct table for 2-byte strings (the
 * first round of every merge) and a one-hash Bloom bitset that rejects strings
 * that are no token (~9% false positives at 200k tokens in 2^21 bits). */
#define BLOOM_SHIFT 43 /* 64 - 21: top hash bits index the bitset */
#define BLOOM_BITS (1u << 21)

static inline int bloom_has(const tok *t, uint64_t h) {
    uint64_t b = h >> BLOOM_SHIFT;
    return (t->bloom[b >> 6] >> (b & 63)) & 1;
}

/* Rank of the token with exactly these bytes, or RANK_NONE. No filters: used
 * while loading, before they exist. */
static int32_t map_find(const tok *t, const uint8_t *p, size_t n, uint64_t h) {
    uint64_t k8 = load8(p, n);
    for (size_t i = (size_t)h & t->map_mask;; i = (i + 1) & t->map_mask) {
        const map_slot *s = &t->map[i];
        if (s->id < 0) return RANK_NONE;
        if (s->k8 == k8 && s->len == n && (n <= 8 || !memcmp(t->pool + t->id_off[s->id] + 8, p + 8, n - 8)))
            return s->id;
    }
}

/* Rank of the token with exactly these bytes, or RANK_NONE. Hot path of BPE. */
static inline int32_t map_get(const tok *t, const uint8_t *p, size_t n) {
    if (n == 2) return t->pair_rank[p[0] << 8 | p[1]];
    if (n == 1) return t->byte_rank[p[0]];
    uint64_t h = hash_bytes(p, n);
    if (!bloom_has(t, h)) return RANK_NONE;
    return map_find(t, p, n, h);
}

int32_t tok_map_lookup(const tok *t, const uint8_t *p, size_t n) { return map_get(t, p, n); }

/* Inserts id (whose bytes are in the pool); returns the id already holding these
 * bytes, or -1 when inserted. */
int32_t tok_map_put(tok *t, int32_t id) {
    const uint8_t *p = t->pool + t->id_off[id];
    size_t n = t->id_len[id];
    uint64_t h = hash_bytes(p, n);
    int32_t old = map_find(t, p, n, h);
    if (old != RANK_NONE) return old;
    size_t i = (size_t)h & t->map_mask;
    while (t->map[i].id >= 0) i = (i + 1) & t->map_mask;
    t->map[i] = (map_slot){load8(p, n), id, (uint32_t)n};
    return -1;
}

int tok_map_init(tok *t, size_t n) {
    size_t slots = 16;
    while (slots < n * 2) slots *= 2;
    t->map = base_alloc(slots * sizeof *t->map, MEM_TOK);
    if (!t->map) return STRATA_ENOMEM;
    for (size_t i = 0; i < slots; i++) t->map[i].id = -1;
    t->map_mask = slots - 1;
    return STRATA_OK;
}

int tok_pool_add(tok *t, const uint8_t *p, size_t n, uint32_t *off) {
    if (t->pool_len + n > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 4096;
        while (cap < t->pool_len + n) cap *= 2;
        if (cap > UINT32_MAX) return STRATA_EFORMAT;
        uint8_t *np = base_realloc(t->pool, cap, MEM_TOK);
        if (!np) return STRATA_ENOMEM;
        t->pool = np;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, p, n);
    *off = (uint32_t)t->pool_len;
    t->pool_len += n;
    return STRATA_OK;
}

/* Grows the per-id arrays to hold ids < n. */
int tok_ids_grow(tok *t, int32_t n) {
    if (n <= t->n_vocab) return STRATA_OK;
    uint32_t *o = base_realloc(t->id_off, (size_t)n * sizeof *o, MEM_TOK);
    if (!o) return STRATA_ENOMEM;
    t->id_off = o;
    uint32_t *l = base_realloc(t->id_len, (size_t)n * sizeof *l, MEM_TOK);
    if (!l) return STRATA_ENOMEM;
    t->id_len = l;
    uint8_t *s = base_realloc(t->id_special, (size_t)n, MEM_TOK);
    if (!s) return STRATA_ENOMEM;
    t->id_special = s;
    for (int32_t i = t->n_vocab; i < n; i++) { t->id_len[i] = TOK_ABSENT; t->id_off[i] = 0; t->id_special[i] = 0; }
    t->n_vocab = n;
    return STRATA_OK;
}

/* The lookups built once all n ranks are in: the Bloom filter over every token,
 * the rank of each byte pair, and the rank of each single byte (every byte needs
 * one, or some text could not be encoded). */
int tok_build_lookups(tok *t, int32_t n, const char *name, char *err, size_t errlen) {
    t->pair_rank = base_alloc(65536 * sizeof *t->pair_rank, MEM_TOK);
    t->bloom = base_calloc(BLOOM_BITS / 64, sizeof *t->bloom, MEM_TOK);
    if (!t->pair_rank || !t->bloom) return base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", name);
    for (int32_t id = 0; id < n; id++) {
        if (t->id_len[id] == TOK_ABSENT) continue;
        uint64_t b = hash_bytes(t->pool + t->id_off[id], t->id_len[id]) >> BLOOM_SHIFT;
        t->bloom[b >> 6] |= 1ull << (b & 63);
    }
    for (int w = 0; w < 65536; w++) {
        uint8_t pr[2] = {(uint8_t)(w >> 8), (uint8_t)w};
        t->pair_rank[w] = map_find(t, pr, 2, hash_bytes(pr, 2));
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        t->byte_rank[b] = map_find(t, &c, 1, hash_bytes(&c, 1));
        if (t->byte_rank[b] == RANK_NONE)
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: byte 0x%02x has no token, so some text cannot be encoded",
                             name, b);
    }
    return STRATA_OK;
}

void tok_close(tok *t) {
    if (!t) return;
    if (t->md) pcre2_match_data_free(t->md);
    if (t->mctx) pcre2_match_context_free(t->mctx);
    if (t->jstack) pcre2_jit_stack_free(t->jstack);
    if (t->re) pcre2_code_free(t->re);
    for (int i = 0; i < t->n_splits; i++) pcre2_code_free(t->split_re[i]);
    base_free(t->merges);
    base_free(t->chat_template);
    if (t->gctx) pcre2_general_context_free(t->gctx);
    if (t->mu_init) pthread_mutex_destroy(&t->mu);
    base_free(t->pool);
    base_free(t->id_off);
    base_free(t->id_len);
    base_free(t->id_special);
    base_free(t->map);
    base_free(t->pair_rank);
    base_free(t->bloom);
    base_free(t->sp);
    base_free(t->s_start);
    base_free(t->s_next);
    base_free(t->s_prev);
    base_free(t->s_rank);
    base_free(t->s_heap);
    base_free(t->cache);
    base_free(t);
}

int32_t tok_bos_id(const tok *t) { return t->bos; }
const char *tok_chat_template(const tok *t) { return t->chat_template; }

int32_t tok_n_vocab(const tok *t) { return t->n_vocab; }
int32_t tok_n_ranks(const tok *t) { return t->n_ranks; }
int tok_pattern(const tok *t) { return t->pattern; }

int32_t tok_special_id(const tok *t, const char *content) {
    size_t n = strlen(content);
    for (int i = 0; i < t->n_sp; i++)
        if (t->sp[i].len == n && !memcmp(t->pool + t->sp[i].off, content, n)) return t->sp[i].id;
    return -1;
}

int tok_is_special(const tok *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->id_special[id]; }

const uint8_t *tok_token_bytes(const tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab || t->id_len[id] == TOK_ABSENT) { *len = 0; return NULL; }
    *len = t->id_len[id];
    return t->pool + t->id_off[id];
}

/* ===== BPE ===== */

int tok_idvec_push(idvec *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *nv = base_realloc(o->v, cap * sizeof *nv, MEM_TOK);
        if (!nv) return STRATA_ENOMEM;
        o->v = nv;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return STRATA_OK;
}

int tok_scratch(tok *t, size_t n) {
    if (n <= t->s_cap) return STRATA_OK;
    size_t cap = t->s_cap ? t->s_cap : 256;
    while (cap < n) cap *= 2;
    uint32_t *a = base_realloc(t->s_start, cap * sizeof *a, MEM_TOK);
    if (!a) return STRATA_ENOMEM;
    t->s_start = a;
    uint32_t *b = base_realloc(t->s_next, cap * sizeof *b, MEM_TOK);
    if (!b) return STRATA_ENOMEM;
    t->s_next = b;
    uint32_t *c = base_realloc(t->s_prev, cap * sizeof *c, MEM_TOK);
    if (!c) return STRATA_ENOMEM;
    t->s_prev = c;
    int32_t *d = base_realloc(t->s_rank, cap * sizeof *d, MEM_TOK);
    if (!d) return STRATA_ENOMEM;
    t->s_rank = d;
    uint64_t *e = base_realloc(t->s_heap, cap * 3 * sizeof *e, MEM_TOK); /* <= 3n pushes */
    if (!e) return STRATA_ENOMEM;
    t->s_heap = e;
    t->s_cap = cap;
    return STRATA_OK;
}

/* tiktoken's merge loop for short pieces: parts are start offsets s[0..m] (s[m] =
 * n); r[i] is the rank of the pair s[i]..s[i+2]. Each step merges the leftmost
 * lowest-ranked pair. O(n^2) but n is small and it is branch-friendly. */
static int bpe_linear(tok *t, const uint8_t *p, size_t n, idvec *o) {
    uint32_t *s = t->s_start;
    int32_t *r = t->s_rank;
    size_t m = n;
    for (size_t i = 0; i <= n; i++) s[i] = (uint32_t)i;
    for (size_t i = 0; i + 1 < m; i++) r[i] = map_get(t, p + i, 2);
    while (m > 1) {
        int32_t best = RANK_NONE;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (r[i] < best) { best = r[i]; bi = i; }
        if (best == RANK_NONE) break;
        /* merge parts bi and bi+1 */
        memmove(s + bi + 1, s + bi + 2, (m - bi - 1) * sizeof *s);
        memmove(r + bi + 1, r + bi + 2, (m >= bi + 3 ? m - bi - 3 : 0) * sizeof *r);
        m--;
        if (bi + 1 < m) r[bi] = map_get(t, p + s[bi], s[bi + 2] - s[bi]);
        if (bi > 0) r[bi - 1] = map_get(t, p + s[bi - 1], s[bi + 1] - s[bi - 1]);
    }
    for (size_t i = 0; i < m; i++) {
        int32_t id = map_get(t, p + s[i], s[i + 1] - s[i]);
        if (id == RANK_NONE) return STRATA_EFORMAT;
        if (tok_idvec_push(o, id)) return STRATA_ENOMEM;
    }
    return STRATA_OK;
}

/* Same merges as bpe_linear in O(n log n), for long pieces (whitespace runs,
 * base64 blobs, long CJK runs): parts form a linked list indexed by start
 * offset; a min-heap holds (rank << 32 | start) with lazy deletion. Ties pop the
 * smallest start, i.e. the leftmost pair, exactly as the linear scan picks. */
static int bpe_heap(tok *t, const uint8_t *p, size_t n, idvec *o) {
    uint32_t *nx = t->s_next, *pv = t->s_prev;
    int32_t *r = t->s_rank;
    uint64_t *h = t->s_heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) { nx[i] = (uint32_t)i + 1; pv[i] = (uint32_t)i - 1; }
    for (size_t i = 0; i + 1 < n; i++) {
        r[i] = map_get(t, p + i, 2);
        if (r[i] != RANK_NONE) tok_heap_push(h, &hn, (uint64_t)r[i] << 32 | i);
    }
    r[n - 1] = RANK_NONE;
    while (hn) {
        uint64_t e = tok_heap_pop(h, &hn);
        uint32_t i = (uint32_t)e;
        int32_t rk = (int32_t)(e >> 32);
        if (r[i] != rk) continue; /* stale: i was absorbed or its pair changed */
        uint32_t j = nx[i], k = nx[j];
        nx[i] = k;
        if (k < n) pv[k] = i;
        r[j] = RANK_NONE;
        r[i] = k < n ? map_get(t, p + i, nx[k] - i) : RANK_NONE;
        if (r[i] != RANK_NONE) tok_heap_push(h, &hn, (uint64_t)r[i] << 32 | i);
        if (i > 0) {
            uint32_t q = pv[i];
            r[q] = map_get(t, p + q, k - q);
            if (r[q] != RANK_NONE) tok_heap_push(h, &hn, (uint64_t)r[q] << 32 | q);
        }
    }
    for (uint32_t i = 0; i < n; i = nx[i]) {
        int32_t id = map_get(t, p + i, nx[i] - i);
        if (id == RANK_NONE) return STRATA_EFORMAT;
        if (tok_idvec_push(o, id)) return STRATA_ENOMEM;
    }
    return STRATA_OK;
}

/* Piece length from which the heap beats the linear scan. */
#define BPE_HEAP_MIN 48

static int bpe_piece(tok *t, const uint8_t *p, size_t n, idvec *o) {
    if (n == 1) return tok_idvec_push(o, t->byte_rank[p[0]]);
    /* tiktoken emits a piece that is a token whole; a tokenizer.json model only
     * with ignore_merges (else the merges decide, and may not rebuild it). */
    int32_t whole = !t->merges || t->ignore_merges ? map_get(t, p, n) : RANK_NONE;
    if (whole != RANK_NONE) return tok_idvec_push(o, whole);
    uint64_t h = 0;
    cache_slot *c = NULL;
    if (n <= CACHE_KEY) {
        h = hash_bytes(p, n);
        c = &t->cache[h & (CACHE_N - 1)];
        if (c->hash == h && c->len == n && !memcmp(c->key, p, n)) {
            for (int i = 0; i < c->n_ids; i++)
                if (tok_idvec_push(o, c->ids[i])) return STRATA_ENOMEM;
            return STRATA_OK;
        }
    }
    if (tok_scratch(t, n + 1)) return STRATA_ENOMEM;
    size_t before = o->n;
    int rc = t->merges ? tok_bpe_merges(t, p, n, o) : n < BPE_HEAP_MIN ? bpe_linear(t, p, n, o) : bpe_heap(t, p, n, o);
    if (rc) return rc;
    if (c && o->n - before <= CACHE_IDS) {
        c->hash = h;
        c->len = (uint8_t)n;
        c->n_ids = (uint8_t)(o->n - before);
        memcpy(c->key, p, n);
        memcpy(c->ids, o->v + before, c->n_ids * sizeof(int32_t));
    }
    return STRATA_OK;
}

/* ===== Pre-tokenizer ===== */

/* Length of the longest valid UTF-8 prefix of p[0..n) (the rules PCRE2 checks:
 * no overlongs, no surrogates, nothing above U+10FFFF). */
static size_t utf8_valid_prefix(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return i;
        if (i + k >= n) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t j = 2; j <= k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return i;
        i += k + 1;
    }
    return i;
}

typedef void (*piece_fn)(void *ud, size_t off, size_t n);

/* The regex engine's resource errors (limits, memory) are not format errors:
 * STRATA_ENOMEM with the reason in t->err. */
static int match_failed(tok *t, int m, size_t at, size_t run) {
    PCRE2_UCHAR msg[160];
    if (pcre2_get_error_message(m, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "error %d", m);
    int resource = m == PCRE2_ERROR_MATCHLIMIT || m == PCRE2_ERROR_DEPTHLIMIT || m == PCRE2_ERROR_HEAPLIMIT ||
                   m == PCRE2_ERROR_JIT_STACKLIMIT || m == PCRE2_ERROR_NOMEMORY;
    base_fail(t->err, sizeof t->err, resource ? STRATA_ENOMEM : STRATA_EINVAL,
              "tokenizer: the pre-tokenizer regex gave up at byte %zu of a %zu-byte run (%s: %s)", at, run,
              resource ? "out of resources" : "internal error", (char *)msg);
    return resource ? STRATA_ENOMEM : STRATA_EINVAL;
}

/* Calls emit for each pre-tokenizer piece of text[0..len). Returns STRATA_OK, or
 * the error of match_failed / emit. */
typedef int (*emit_fn)(void *ud, const uint8_t *p, size_t n);

static int split_re(tok *t, const pcre2_code *re, int jit, const uint8_t *text, size_t len, emit_fn emit, void *ud) {
    size_t pos = 0;
    while (pos < len) {
        size_t run = utf8_valid_prefix(text + pos, len - pos);
        if (run == 0) { /* one invalid byte: its own piece */
            int rc = emit(ud, text + pos, 1);
            if (rc) return rc;
            pos++;
            continue;
        }
        const uint8_t *s = text + pos;
        size_t off = 0;
        while (off < run) {
            int m = jit ? pcre2_jit_match(re, s, run, off, PCRE2_NO_UTF_CHECK, t->md, t->mctx)
                        : pcre2_match(re, s, run, off, PCRE2_NO_UTF_CHECK, t->md, t->mctx);
            /* the JIT stack is capped (64 MiB): the interpreter keeps its frames on the heap */
            if (m == PCRE2_ERROR_JIT_STACKLIMIT) m = pcre2_match(re, s, run, off, PCRE2_NO_UTF_CHECK, t->md, t->mctx);
            size_t a, b;
            if (m > 0) {
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
                a = ov[0];
                b = ov[1];
            } else if (m == PCRE2_ERROR_NOMATCH) {
                a = b = run;
            } else {
                return match_failed(t, m, pos + off, run);
            }
            if (a > off) { /* unmatched gap (no pattern leaves one; kept for safety) */
                int rc = emit(ud, s + off, a - off);
                if (rc) return rc;
            }
            if (b == a) { /* empty match: cannot happen with these patterns; step one char */
                if (a >= run) break;
                b = a + 1;
                while (b < run && (s[b] & 0xC0) == 0x80) b++;
            }
            int rc = emit(ud, s + a, b - a);
            if (rc) return rc;
            off = b;
        }
        pos += run;
    }
    return STRATA_OK;
}

/* A tokenizer.json's splits run in order, each on the pieces of the one before
 * (Hugging Face's pre_tokenizer Sequence of Split, behavior Isolated: matches and
 * the gaps between them are pieces). The match data is shared, but split_re
 * reads a match's bounds before it emits, so nesting is safe. */
typedef struct { tok *t; int k; emit_fn emit; void *ud; } chain_ctx;

static int chain_emit(void *ud, const uint8_t *p, size_t n) {
    chain_ctx *c = ud;
    if (c->k + 1 >= c->t->n_splits) return c->emit(c->ud, p, n);
    chain_ctx nx = *c;
    nx.k++;
    return split_re(c->t, c->t->split_re[nx.k], c->t->split_jit[nx.k], p, n, chain_emit, &nx);
}

/* The pre-tokenizer of t: its pattern, or a tokenizer.json's splits (none: the
 * whole text is one piece). */
static int split(tok *t, const uint8_t *text, size_t len, emit_fn emit, void *ud) {
    if (t->pattern != TOK_PAT_HF) return split_re(t, t->re, t->jit, text, len, emit, ud);
    if (t->n_splits == 0) return len ? emit(ud, text, len) : STRATA_OK;
    chain_ctx c = {t, 0, emit, ud};
    return split_re(t, t->split_re[0], t->split_jit[0], text, len, chain_emit, &c);
}

typedef struct { tok *t; idvec *o; } enc_ctx;

static int emit_bpe(void *ud, const uint8_t *p, size_t n) {
    enc_ctx *c = ud;
    return bpe_piece(c->t, p, n, c->o);
}

typedef struct { const uint8_t *base; piece_fn fn; void *ud; } split_ctx;

static int emit_split(void *ud, const uint8_t *p, size_t n) {
    split_ctx *c = ud;
    c->fn(c->ud, (size_t)(p - c->base), n);
    return STRATA_OK;
}

int tok_split(tok *t, const uint8_t *text, size_t len, void (*fn)(void *ud, size_t off, size_t n), void *ud) {
    split_ctx c = {text, fn, ud};
    pthread_mutex_lock(&t->mu);
    int rc = split(t, text, len, emit_split, &c);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Leftmost added token at or after from, longest at a position, among those of
 * one class (normalized or not) that may match (specials only with allow). */
static const special *find_special(const tok *t, const uint8_t *text, size_t len, size_t from, int allow,
                                   int normalized, size_t *at) {
    for (size_t i = from; i < len; i++) {
        if (!t->sp_first[text[i]]) continue;
        for (int k = 0; k < t->n_sp; k++) {
            const special *sp = &t->sp[k];
            if ((sp->special && !allow) || sp->normalized != normalized) continue;
            if (sp->len <= len - i && !memcmp(t->pool + sp->off, text + i, sp->len)) { *at = i; return sp; }
        }
    }
    return NULL;
}

/* Unicode White_Space (Rust's char::is_whitespace, which lstrip/rstrip use). */
static int is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static uint32_t utf8_next(const uint8_t *p, size_t n, size_t *len);

/* Added tokens cut the text (Hugging Face's AddedVocabulary: the tokens that are
 * not normalized first, then the normalized ones in the gaps; a tiktoken
 * vocabulary's specials are all in the first class). lstrip / rstrip tokens take
 * the whitespace beside them. The rest goes through the pre-tokenizer and BPE. */
static int encode_added(tok *t, const uint8_t *text, size_t len, int allow, int pass, enc_ctx *c) {
    if (pass == 2 || !t->n_sp || (!allow && !t->n_plain)) return split(t, text, len, emit_bpe, c);
    size_t pos = 0;
    while (pos < len) {
        size_t at = len;
        const special *sp = find_special(t, text, len, pos, allow, pass, &at);
        size_t a = at, e = sp ? at + sp->len : len, cl;
        while (sp && sp->lstrip && a > pos) { /* step back one character while it is white space */
            size_t b = a - 1;
            while (b > pos && (text[b] & 0xC0) == 0x80) b--;
            if (!is_white_space(utf8_next(text + b, a - b, &cl)) || b + cl != a) break;
            a = b;
        }
        while (sp && sp->rstrip && e < len && is_white_space(utf8_next(text + e, len - e, &cl))) e += cl;
        int rc = encode_added(t, text + pos, a - pos, allow, pass + 1, c);
        if (rc || !sp) return rc;
        if ((rc = tok_idvec_push(c->o, sp->id))) return rc;
        pos = e;
    }
    return STRATA_OK;
}

static int encode_segment(tok *t, const uint8_t *text, size_t len, int allow_special, enc_ctx *c) {
    return encode_added(t, text, len, allow_special, 0, c);
}

/* Kimi's shipped encode (tokenization_kimi.py, from Llama 3's tokenizer) does
 * not hand the whole text to tiktoken: it cuts it into 400,000-character chunks
 * and cuts each chunk wherever a run of whitespace or of non-whitespace (Python
 * str.isspace) would exceed 25,000 characters, then encodes the pieces one by
 * one. The cuts are BPE boundaries, so ids differ from plain tiktoken at each
 * seam; K3 saw the chunked ids, so TOK_PAT_KIMI encodes the same way. Counts are
 * code points; an invalid UTF-8 byte counts as one non-space character. */
#define KIMI_CHUNK_CHARS 400000
#define KIMI_RUN_CHARS 25000

static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Code point at p (n > 0 bytes left) and its byte length; invalid -> (0xFFFFFFFF, 1). */
static uint32_t utf8_next(const uint8_t *p, size_t n, size_t *len) {
    size_t k = utf8_valid_prefix(p, n < 4 ? n : 4);
    if (k == 0) { *len = 1; return 0xFFFFFFFFu; }
    uint8_t c = p[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return (uint32_t)(c & 0x1F) << 6 | (p[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return (uint32_t)(c & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F); }
    *len = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

static int encode_kimi_chunked(tok *t, const uint8_t *text, size_t len, int allow_special, enc_ctx *c) {
    size_t pos = 0;
    while (pos < len) {
        /* one chunk of up to KIMI_CHUNK_CHARS characters, cut at long runs */
        size_t start = pos, chars = 0, run = 0;
        int run_space = 0;
        while (pos < len && chars < KIMI_CHUNK_CHARS) {
            size_t cl;
            int sp = py_isspace(utf8_next(text + pos, len - pos, &cl));
            if (chars == 0) run_space = sp;
            if (sp != run_space) {
                run = 1;
                run_space = sp;
            } else if (++run > KIMI_RUN_CHARS) {
                int rc = encode_segment(t, text + start, pos - start, allow_special, c);
                if (rc) return rc;
                start = pos;
                run = 1;
            }
            pos += cl;
            chars++;
        }
        int rc = encode_segment(t, text + start, pos - start, allow_special, c);
        if (rc) return rc;
    }
    return STRATA_OK;
}

int tok_encode_append(tok *t, const uint8_t *text, size_t len, int allow_special, int32_t **ids, size_t *n,
                      size_t *cap) {
    idvec o = {*ids, *n, *cap};
    enc_ctx c = {t, &o};
    pthread_mutex_lock(&t->mu);
    t->err[0] = 0;
    int rc = t->pattern == TOK_PAT_KIMI ? encode_kimi_chunked(t, text, len, allow_special, &c)
                                        : encode_segment(t, text, len, allow_special, &c);
    pthread_mutex_unlock(&t->mu);
    *ids = o.v;
    *n = o.n;
    *cap = o.cap;
    return rc;
}

const char *tok_errmsg(const tok *t) { return t->err; }

int tok_encode(tok *t, const uint8_t *text, size_t len, int allow_special, int32_t **ids, size_t *n) {
    int32_t *v = NULL;
    size_t k = 0, cap = 0;
    int rc = tok_encode_append(t, text, len, allow_special, &v, &k, &cap);
    if (rc) { base_free(v); *ids = NULL; *n = 0; return rc; }
    *ids = v;
    *n = k;
    return STRATA_OK;
}

int tok_decode(const tok *t, const int32_t *ids, size_t n, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab || t->id_len[ids[i]] == TOK_ABSENT) return STRATA_EINVAL;
        total += t->id_len[ids[i]];
    }
    uint8_t *b = base_alloc(total + 1, MEM_TOK);
    if (!b) return STRATA_ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(b + o, t->pool + t->id_off[ids[i]], t->id_len[ids[i]]);
        o += t->id_len[ids[i]];
    }
    b[o] = 0;
    *out = b;
    *len = o;
    return STRATA_OK;
}

/* ===== Streaming decode ===== */

struct tok_stream {
    const tok *t;
    uint8_t held[4]; /* incomplete UTF-8 prefix carried to the next token */
    size_t n_held;
    uint8_t *buf;    /* held + one token */
    size_t cap;
};

int tok_stream_open(tok_stream **out, const tok *t) {
    *out = NULL;
    tok_stream *s = base_calloc(1, sizeof *s, MEM_TOK);
    if (!s) return STRATA_ENOMEM;
    s->t = t;
    s->cap = t->max_token_len + 8;
    s->buf = base_alloc(s->cap, MEM_TOK);
    if (!s->buf) { base_free(s); return STRATA_ENOMEM; }
    *out = s;
    return STRATA_OK;
}

/* Length of the tail of p[0..n) that is a proper, still-completable prefix of a
 * UTF-8 sequence (0..3). Anything else is either complete or can never become
 * valid and is emitted now. */
static size_t utf8_incomplete_tail(const uint8_t *p, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = p[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 2;
        else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return 0;
        if (back >= need) return 0;                          /* complete (or too long) */
        if (back >= 2 && (p[n - back + 1] < lo || p[n - back + 1] > hi)) return 0; /* can never complete */
        return back;
    }
    return 0;
}

int tok_stream_push(tok_stream *s, int32_t id, const uint8_t **p, size_t *n) {
    size_t len;
    const uint8_t *b = tok_token_bytes(s->t, id, &len);
    *p = s->buf;
    *n = 0;
    if (!b) return STRATA_EINVAL;
    memcpy(s->buf, s->held, s->n_held);
    memcpy(s->buf + s->n_held, b, len);
    size_t total = s->n_held + len;
    size_t keep = utf8_incomplete_tail(s->buf, total);
    s->n_held = keep;
    memcpy(s->held, s->buf + total - keep, keep);
    *n = total - keep;
    return STRATA_OK;
}

void tok_stream_flush(tok_stream *s, const uint8_t **p, size_t *n) {
    memcpy(s->buf, s->held, s->n_held);
    *p = s->buf;
    *n = s->n_held;
    s->n_held = 0;
}

void tok_stream_close(tok_stream *s) {
    if (!s) return;
    base_free(s->buf);
    base_free(s);
}
