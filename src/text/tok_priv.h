/*
 * tok_priv.h: the tokenizer's layout and the helpers tok.c shares with
 * tok_load.c (the tiktoken vocabulary loader) and tok_hf.c (the tokenizer.json
 * loader and merge-rank BPE). Only the tok module includes it.
 */
#ifndef STRATA_TOK_PRIV_H
#define STRATA_TOK_PRIV_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* tok.h's typedef again (C11 allows it), so this header needs no other of the module. */
typedef struct tok tok;

#define TOK_MAX_TOKEN (64 * 1024)  /* longest token we accept, bytes */
#define TOK_MAX_ID (1 << 24)        /* ids (ranks and specials) stay below this */
#define TOK_ABSENT UINT32_MAX       /* id_len[] marker: no token with this id */
#define RANK_NONE INT32_MAX

/* One slot holds the first 8 bytes of its token and the length, so a probe
 * touches one cache line; only tokens longer than 8 bytes read the pool. With a
 * {hash, id} slot every probe also chased id_len[] and the pool: 12 -> 16 MB/s
 * (CPU time, o200k, bench-tokenizer) from this layout alone. */
typedef struct {
    uint64_t k8;  /* first min(8, len) bytes, zero padded */
    int32_t id;   /* -1: empty slot */
    uint32_t len;
} map_slot;

/* An added token: matched literally before the pre-tokenizer. tiktoken's
 * specials are all special=1, normalized=0, no strip. */
typedef struct {
    uint32_t off, len; /* content in pool */
    int32_t id;
    uint8_t special;    /* 0: an ordinary added token, matched even without allow_special */
    uint8_t normalized; /* tokenizer.json: matched in the second pass (HF matches these after the others) */
    uint8_t lstrip, rstrip; /* the match takes the whitespace before / after it */
} special;

/* Direct-mapped cache of BPE results for pieces that are not a token themselves
 * (multi-token words, CJK runs). Pieces longer than CACHE_KEY or with more than
 * CACHE_IDS ids are not cached. */
#define CACHE_N 4096
#define CACHE_KEY 30
#define CACHE_IDS 12
typedef struct {
    uint64_t hash;
    uint8_t len, n_ids;
    uint8_t key[CACHE_KEY];
    int32_t ids[CACHE_IDS];
} cache_slot;

/* A merge of the tokenizer.json model: the pair (a, b) -> merged id, at rank. */
typedef struct {
    uint64_t key;   /* (uint64_t)a << 32 | b; UINT64_MAX: empty slot */
    int32_t rank, id;
} merge_slot;

#define TOK_MAX_SPLITS 8 /* pre-tokenizer Split steps of a tokenizer.json */

struct tok {
    int pattern;       /* TOK_PAT_* (tiktoken) or TOK_PAT_HF */
    int32_t n_ranks;   /* ids 0..n_ranks-1 are BPE tokens */
    int32_t n_vocab;   /* max id + 1 */
    uint8_t *pool;     /* token bytes of every id */
    size_t pool_len, pool_cap;
    uint32_t *id_off;  /* (n_vocab) offset into pool */
    uint32_t *id_len;  /* (n_vocab) byte length, TOK_ABSENT if unused */
    uint8_t *id_special; /* (n_vocab) 1 for special tokens */
    map_slot *map;     /* rank lookup by bytes, open addressing */
    size_t map_mask;
    int32_t byte_rank[256];
    int32_t *pair_rank; /* (65536) rank of every 2-byte token, by b0 << 8 | b1 */
    uint64_t *bloom;    /* (BLOOM_BITS / 64) one bit per token hash: fast misses */
    special *sp;       /* sorted by length, longest first */
    int n_sp;
    int n_plain;       /* added tokens that are not special (matched without allow_special) */
    uint8_t sp_first[256]; /* 1 if some special starts with this byte */
    size_t max_token_len;
    /* regex */
    pcre2_general_context *gctx;
    pcre2_code *re;
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
    int jit;
    char err[256];      /* why the last encode failed (tok_errmsg); under mu */
    /* encode state below (match data, scratch, cache) is shared: one encode at a time */
    pthread_mutex_t mu;
    int mu_init;
    /* BPE scratch (grown on demand) */
    uint32_t *s_start, *s_next, *s_prev;
    int32_t *s_rank;
    uint64_t *s_heap;
    size_t s_cap;
    cache_slot *cache;
    /* tokenizer.json (TOK_PAT_HF) */
    merge_slot *merges;  /* open addressing by pair; NULL for tiktoken vocabularies */
    size_t merges_mask;
    int ignore_merges;   /* a piece that is a token is emitted whole (model.ignore_merges) */
    int n_splits;        /* Isolated regex splits, applied in order */
    pcre2_code *split_re[TOK_MAX_SPLITS];
    int split_jit[TOK_MAX_SPLITS];
    int32_t bos;         /* id the post-processor puts in front (add_bos), or -1 */
    char *chat_template; /* tokenizer_config.json's chat_template, else chat_template.jinja, or NULL */
};

typedef struct {
    int32_t *v;
    size_t n, cap;
} idvec;

int tok_idvec_push(idvec *o, int32_t id);
/* The BPE min-heap of (rank << 32 | position) keys both BPEs merge from
 * (tok.c's long pieces, tok_hf.c's merges): the smallest key pops first. */
static inline void tok_heap_push(uint64_t *h, size_t *hn, uint64_t v) {
    size_t i = (*hn)++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (h[up] <= v) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = v;
}

static inline uint64_t tok_heap_pop(uint64_t *h, size_t *hn) {
    uint64_t top = h[0], v = h[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}
/* BPE scratch for pieces of up to n bytes. */
int tok_scratch(tok *t, size_t n);
int tok_pool_add(tok *t, const uint8_t *p, size_t n, uint32_t *off);
/* Grows the per-id arrays to hold ids < n. */
int tok_ids_grow(tok *t, int32_t n);
/* The bytes -> id table, sized for n tokens. */
int tok_map_init(tok *t, size_t n);
/* Inserts id (its bytes already in the pool); the id already holding the same
 * bytes, or -1 when inserted. */
int32_t tok_map_put(tok *t, int32_t id);
/* Id of the token with exactly these bytes (after tok_build_lookups), or RANK_NONE. */
int32_t tok_map_lookup(const tok *t, const uint8_t *p, size_t n);
/* Bloom filter, pair and byte tables over ids 0..n-1 (absent ids skipped); every
 * byte must have a token. */
int tok_build_lookups(tok *t, int32_t n, const char *name, char *err, size_t errlen);
/* Registers an added token; sp gives its flags (off/len/id are filled here). */
int tok_add_token(tok *t, const uint8_t *content, size_t len, int32_t id, special flags, const char *where,
                  char *err, size_t errlen);
/* Compiles pat (UTF, UCP) with JIT when available. what names it in messages. */
int tok_compile(tok *t, const char *pat, pcre2_code **re, int *jit, const char *what, char *err, size_t errlen);
/* The merge-rank BPE of a tokenizer.json model on one piece (tok_hf.c). */
int tok_bpe_merges(tok *t, const uint8_t *p, size_t n, idvec *o);
/* Fills t from a tokenizer.json (tok_hf.c): vocab, merges, added tokens,
 * pre-tokenizer splits, post-processor BOS. */
int tok_hf_load(tok *t, const uint8_t *buf, size_t len, const char *name, char *err, size_t errlen);
/* add_bos_token and chat_template of a tokenizer_config.json beside a tokenizer.json. */
int tok_hf_config(tok *t, const uint8_t *buf, size_t len, const char *name, char *err, size_t errlen);

#endif
