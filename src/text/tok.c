/*
 * tok.c: tiktoken-compatible byte-level BPE (see tok.h).
 *
 * Owns: the vocabulary parser (tiktoken.model, tokenizer_config.json specials),
 * the pre-tokenizer patterns (PCRE2, UTF+UCP, JIT), rank-based BPE, decode and
 * streaming decode. It does not know about chat markup (chat.c).
 *
 * Invariants: ranks are dense 0..n_ranks-1 and every single byte has a rank, so
 * every byte string encodes and decode(encode(x)) == x for any bytes. Text that
 * is not valid UTF-8 is cut into maximal valid runs; each invalid byte becomes its
 * own piece (tiktoken only ever sees valid text, so this is our extension).
 *
 * Fidelity notes on the patterns (each checked against an oracle by t_tok.c):
 * - \s is written out as Unicode White_Space, the set Rust's regex (tiktoken)
 *   and Python's regex module use. PCRE2's UCP \s also matches U+180E, which is
 *   not White_Space since Unicode 6.3.
 * - \p{Han} is written \p{sc:Han}: PCRE2 >= 10.40 matches bare script names by
 *   Script_Extensions (so it would take U+3001 and U+30FC as Han), while Python's
 *   regex and Rust's regex match the Script property.
 * - Kimi's class intersections [X&&[^\p{Han}]] become (?:(?!\p{sc:Han})[X]).
 */
#include "tok.h"
#include "tok_priv.h"

#include <string.h>
#include <xxhash.h>
#include "base.h"
#include "jsonx.h"


/* ===== Patterns ===== */

/* Unicode White_Space (Rust regex \s, Python regex \s). */
#define WS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define CONTR "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
#define UPPER_NOHAN "(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define LOWER_NOHAN "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"

static const char k_pat_kimi[] =
    "\\p{sc:Han}+"
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER_NOHAN "*" LOWER_NOHAN "+" CONTR
    "|[^\\r\\n\\p{L}\\p{N}]?" UPPER_NOHAN "+" LOWER_NOHAN "*" CONTR
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

static const char k_pat_o200k[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" CONTR
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTR
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n/]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

static const char k_pat_cl100k[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";

static const struct { const char *name, *pat; } k_pats[] = {
    [TOK_PAT_KIMI] = {"kimi", k_pat_kimi},
    [TOK_PAT_O200K] = {"o200k", k_pat_o200k},
    [TOK_PAT_CL100K] = {"cl100k", k_pat_cl100k},
};
#define N_PATS ((int)(sizeof k_pats / sizeof k_pats[0]))

int tok_pattern_parse(const char *name) {
    for (int i = 0; i < N_PATS; i++)
        if (!strcmp(name, k_pats[i].name)) return i;
    return -1;
}

const char *tok_pattern_name(int pattern) {
    if (pattern == TOK_PAT_HF) return "tokenizer.json";
    return pattern >= 0 && pattern < N_PATS ? k_pats[pattern].name : "?";
}

/* ===== The tokenizer object ===== */


static void *pc_malloc(size_t n, void *ud) { (void)ud; return base_alloc(n, MEM_TOK); }
static void pc_free(void *p, void *ud) { (void)ud; base_free(p); }

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

/* ===== Loading ===== */

static int b64_val(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Strict standard base64 with padding; canonical (zero) trailing bits.
 * Returns decoded length or -1. out must hold n/4*3 bytes. */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=') {
                if (i + 4 != n || k < 2) return -1;
                v[k] = 0;
                pad++;
            } else {
                if (pad) return -1;
                v[k] = b64_val(s[i + k]);
                if (v[k] < 0) return -1;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if (pad == 2 && (w & 0xFFFF)) return -1;
        if (pad == 1 && (w & 0xFF)) return -1;
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return (long)o;
}

/* The general context, match data and match context every pattern shares. */
static int regex_init(tok *t, char *err, size_t errlen) {
    if (t->gctx) return STRATA_OK;
    t->gctx = pcre2_general_context_create(pc_malloc, pc_free, NULL);
    if (!t->gctx) return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    t->md = pcre2_match_data_create(1, t->gctx);
    t->mctx = pcre2_match_context_create(t->gctx);
    if (!t->md || !t->mctx) return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    /* No match limit: the default (10 M backtracking steps) made a 10 MB run of
     * spaces fail under o200k/cl100k, whose \s*[\r\n]+ alternative backtracks
     * over the whole run once before \s+(?!\S) takes it. The patterns are fixed
     * and each match costs time linear in its length, so the limit guards against
     * nothing here (100 MB of spaces: 31 s, linear). */
    pcre2_set_match_limit(t->mctx, UINT32_MAX);
    pcre2_set_heap_limit(t->mctx, 1u << 20); /* KiB: the interpreter fallback in split */
    /* JIT: 4-10x faster than the interpreter on these patterns. Its stack grows
     * lazily up to 64 MiB so megabyte-long whitespace runs (backtracking for
     * \s+(?!\S)) still match. */
    t->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, t->gctx);
    if (t->jstack) pcre2_jit_stack_assign(t->mctx, NULL, t->jstack);
    return STRATA_OK;
}

int tok_compile(tok *t, const char *pat, pcre2_code **re, int *jit, const char *what, char *err, size_t errlen) {
    int rc = regex_init(t, err, errlen);
    if (rc) return rc;
    pcre2_compile_context *cc = pcre2_compile_context_create(t->gctx);
    if (!cc) return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    int ec;
    PCRE2_SIZE eo;
    *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    if (!*re && ec == PCRE2_ERROR_HEAP_FAILED) return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return base_fail(err, errlen, STRATA_EFORMAT, "%s does not compile at offset %zu: %s", what, (size_t)eo,
                         (char *)msg);
    }
    *jit = t->jstack && pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return STRATA_OK;
}

static int compile_pattern(tok *t, int pattern, char *err, size_t errlen) {
    char what[64];
    snprintf(what, sizeof what, "tokenizer: pattern %s", k_pats[pattern].name);
    return tok_compile(t, k_pats[pattern].pat, &t->re, &t->jit, what, err, errlen);
}

int tok_add_token(tok *t, const uint8_t *content, size_t len, int32_t id, special flags, const char *where,
                  char *err, size_t errlen) {
    if (len == 0 || len > TOK_MAX_TOKEN)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: special token %d has %s content", where, id,
                         len ? "too long" : "empty");
    if (id < 0 || id >= TOK_MAX_ID)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: special token id %d out of range", where, id);
    if (id < t->n_vocab && t->id_len[id] != TOK_ABSENT) {
        /* A config may list a normal token again; identical bytes are harmless. */
        if (id < t->n_ranks && t->id_len[id] == len && !memcmp(t->pool + t->id_off[id], content, len))
            return STRATA_OK;
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: special token id %d is already taken", where, id);
    }
    for (int i = 0; i < t->n_sp; i++)
        if (t->sp[i].len == len && !memcmp(t->pool + t->sp[i].off, content, len))
            return base_fail(err, errlen, STRATA_EFORMAT, "%s: special token '%.*s' appears twice (ids %d and %d)",
                             where, (int)len, (const char *)content, t->sp[i].id, id);
    int rc = tok_ids_grow(t, id + 1);
    if (rc) return base_fail(err, errlen, rc, "%s: out of memory", where);
    uint32_t off;
    if ((rc = tok_pool_add(t, content, len, &off))) return base_fail(err, errlen, rc, "%s: out of memory", where);
    special *sp = base_realloc(t->sp, (size_t)(t->n_sp + 1) * sizeof *sp, MEM_TOK);
    if (!sp) return base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", where);
    t->sp = sp;
    /* Keep longest first so the first match at a position is the longest. */
    int at = t->n_sp;
    while (at > 0 && t->sp[at - 1].len < len) { t->sp[at] = t->sp[at - 1]; at--; }
    flags.off = off;
    flags.len = (uint32_t)len;
    flags.id = id;
    t->sp[at] = flags;
    t->n_sp++;
    t->id_off[id] = off;
    t->id_len[id] = (uint32_t)len;
    t->id_special[id] = flags.special;
    t->sp_first[content[0]] = 1;
    t->n_plain += !flags.special;
    if (len > t->max_token_len) t->max_token_len = len;
    return STRATA_OK;
}

/* A tiktoken special: matched only with allow_special, no stripping. */
static int add_special(tok *t, const uint8_t *content, size_t len, int32_t id, const char *where, char *err,
                       size_t errlen) {
    return tok_add_token(t, content, len, id, (special){.special = 1}, where, err, errlen);
}

int tok_add_special(tok *t, const char *content, int32_t id, char *err, size_t errlen) {
    return add_special(t, (const uint8_t *)content, strlen(content), id, "tok_add_special", err, errlen);
}

/* The rank after the space of a line (sp: the space, re: the line's end):
 * decimal digits, no leading zero, at most TOK_MAX_ID and a digit. */
static int parse_rank(const uint8_t *sp, const uint8_t *re, int64_t *out, const char *name, uint32_t line, char *err,
                      size_t errlen) {
    const uint8_t *r = sp + 1;
    int64_t rank = 0;
    if (r == re || (*r == '0' && re - r > 1)) return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: bad rank", name, line);
    for (; r < re; r++) {
        if (*r < '0' || *r > '9' || rank > TOK_MAX_ID)
            return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: bad rank '%.*s'", name, line,
                             (int)((re - sp - 1) > 20 ? 20 : (re - sp - 1)), (const char *)sp + 1);
        rank = rank * 10 + (*r - '0');
    }
    *out = rank;
    return STRATA_OK;
}

/* One "base64 SP rank" line (l, ll bytes, CR stripped) of a vocabulary of n
 * lines: its token into the pool at its rank. line_of (rank -> line, for
 * messages) catches a rank given twice; tmp is scratch for the decoded bytes. */
static int parse_vocab_line(tok *t, const uint8_t *l, size_t ll, uint32_t line, int32_t n, uint32_t *line_of,
                            uint8_t *tmp, const char *name, char *err, size_t errlen) {
    if (ll == 0) return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: empty line", name, line);
    const uint8_t *sp = memchr(l, ' ', ll);
    if (!sp) return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: expected 'base64 rank'", name, line);
    size_t bl = (size_t)(sp - l);
    if (bl > (TOK_MAX_TOKEN / 3) * 4)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: token longer than %d bytes", name, line, TOK_MAX_TOKEN);
    long tl = b64_decode(l, bl, tmp);
    if (tl <= 0)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: bad base64 '%.*s'", name, line,
                         (int)(bl > 40 ? 40 : bl), (const char *)l);
    int64_t rank = 0;
    int rc = parse_rank(sp, l + ll, &rank, name, line, err, errlen);
    if (rc) return rc;
    if (rank >= n)
        return base_fail(err, errlen, STRATA_EFORMAT,
                         "%s:%u: rank %lld leaves a gap (%d lines, so ranks must be 0..%d)", name, line,
                         (long long)rank, n, n - 1);
    int32_t id = (int32_t)rank;
    if (line_of[id])
        return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: duplicate rank %d (first on line %u)", name,
                         line, id, line_of[id]);
    line_of[id] = line;
    if ((rc = tok_pool_add(t, tmp, (size_t)tl, &t->id_off[id]))) return base_fail(err, errlen, rc, "%s: out of memory", name);
    t->id_len[id] = (uint32_t)tl;
    if ((size_t)tl > t->max_token_len) t->max_token_len = (size_t)tl;
    int32_t dup = tok_map_put(t, id);
    if (dup >= 0)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s:%u: duplicate token (same bytes as rank %d on line %u)",
                         name, line, dup, line_of[dup]);
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

/* Parses "base64 SP rank" lines. Lines are checked in one pass; the rank table
 * must come out dense (0..n-1, each once). */
static int parse_vocab(tok *t, const uint8_t *buf, size_t len, const char *name, char *err, size_t errlen) {
    size_t n_lines = 0;
    for (size_t i = 0; i < len; i++) n_lines += buf[i] == '\n';
    if (len && buf[len - 1] != '\n') n_lines++;
    if (n_lines == 0) return base_fail(err, errlen, STRATA_EFORMAT, "%s: empty vocabulary", name);
    if (n_lines >= TOK_MAX_ID)
        return base_fail(err, errlen, STRATA_EFORMAT, "%s: %zu lines, more than the %d ids supported",
                         name, n_lines, TOK_MAX_ID);
    int32_t n = (int32_t)n_lines;
    int rc = tok_ids_grow(t, n);
    if (rc) return base_fail(err, errlen, rc, "%s: out of memory for %d tokens", name, n);
    t->n_ranks = n;
    rc = tok_map_init(t, (size_t)n);
    uint32_t *line_of = base_calloc((size_t)n, sizeof *line_of, MEM_TOK); /* rank -> line, for messages */
    uint8_t *tmp = base_alloc(TOK_MAX_TOKEN + 4, MEM_TOK);
    if (rc || !line_of || !tmp) { rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", name); goto done; }
    size_t pos = 0;
    for (uint32_t line = 1; pos < len; line++) {
        const uint8_t *l = buf + pos;
        const uint8_t *nl = memchr(l, '\n', len - pos);
        size_t ll = nl ? (size_t)(nl - l) : len - pos;
        pos += ll + (nl ? 1 : 0);
        if (ll && l[ll - 1] == '\r') ll--;
        if ((rc = parse_vocab_line(t, l, ll, line, n, line_of, tmp, name, err, errlen))) goto done;
    }
    /* Each line holds one rank < n, no duplicates, n lines: so the ranks are dense. */
    rc = tok_build_lookups(t, n, name, err, errlen);
done:
    base_free(line_of);
    base_free(tmp);
    return rc;
}

static int parse_tokcfg(tok *t, const uint8_t *buf, size_t len, const char *name, char *err, size_t errlen) {
    json_t *root;
    int rc = jsonx_parse(&root, buf, len, name, err, errlen);
    if (rc) return rc;
    char where[512];
    if (!json_is_object(root)) { rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: top level is not an object", name); goto done; }
    json_t *ct = json_object_get(root, "chat_template"); /* chat.c reads format markers in it */
    if (json_is_string(ct) && !(t->chat_template = base_strdup(json_string_value(ct), MEM_TOK))) {
        rc = base_fail(err, errlen, STRATA_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    json_t *dec = json_object_get(root, "added_tokens_decoder");
    if (!dec) goto done; /* no specials is legal */
    if (!json_is_object(dec)) {
        rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: added_tokens_decoder is not an object", name);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(dec, key, v) {
        snprintf(where, sizeof where, "%s: added_tokens_decoder[\"%.40s\"]", name, key);
        int64_t id;
        if (base_parse_i64(key, 0, TOK_MAX_ID - 1, &id)) { rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: key is not an id", where); goto done; }
        json_t *c = json_is_object(v) ? json_object_get(v, "content") : NULL;
        if (!c || !json_is_string(c)) { rc = base_fail(err, errlen, STRATA_EFORMAT, "%s: no string \"content\"", where); goto done; }
        if ((rc = add_special(t, (const uint8_t *)json_string_value(c), json_string_length(c), (int32_t)id, where, err, errlen)))
            goto done;
    }
done:
    json_decref(root);
    return rc;
}

/* tok_open_mem; *cfg_bad (when not NULL) is set when tokenizer_config.json is
 * the file at fault. */
static int open_mem(tok **out, const uint8_t *vocab, size_t vocab_len, const char *name, const uint8_t *tokcfg,
                    size_t tokcfg_len, const char *tokcfg_name, int pattern, int *cfg_bad, char *err, size_t errlen) {
    *out = NULL;
    if (pattern < 0 || pattern >= N_PATS)
        return base_fail(err, errlen, STRATA_EINVAL, "tokenizer: unknown pattern %d", pattern);
    tok *t = base_calloc(1, sizeof *t, MEM_TOK);
    if (!t) return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    t->pattern = pattern;
    if (pthread_mutex_init(&t->mu, NULL)) { tok_close(t); return base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: no mutex"); }
    t->mu_init = 1;
    int rc = parse_vocab(t, vocab, vocab_len, name, err, errlen);
    if (!rc && tokcfg) {
        rc = parse_tokcfg(t, tokcfg, tokcfg_len, tokcfg_name ? tokcfg_name : "tokenizer_config.json", err, errlen);
        if (rc && cfg_bad) *cfg_bad = 1;
    }
    if (!rc) rc = compile_pattern(t, pattern, err, errlen);
    if (!rc) {
        t->cache = base_calloc(CACHE_N, sizeof *t->cache, MEM_TOK);
        if (!t->cache) rc = base_fail(err, errlen, STRATA_ENOMEM, "tokenizer: out of memory");
    }
    if (rc) { tok_close(t); return rc; }
    *out = t;
    return STRATA_OK;
}

int tok_open_mem(tok **out, const uint8_t *vocab, size_t vocab_len, const char *name, const uint8_t *tokcfg,
                 size_t tokcfg_len, const char *tokcfg_name, int pattern, char *err, size_t errlen) {
    return open_mem(out, vocab, vocab_len, name, tokcfg, tokcfg_len, tokcfg_name, pattern, NULL, err, errlen);
}

int tok_open(tok **out, const char *vocab_path, const char *tokcfg_path, int pattern, char *err, size_t errlen) {
    return tok_open_ex(out, vocab_path, tokcfg_path, pattern, NULL, err, errlen);
}

int tok_open_ex(tok **out, const char *vocab_path, const char *tokcfg_path, int pattern, int *cfg_bad, char *err,
                size_t errlen) {
    *out = NULL;
    if (cfg_bad) *cfg_bad = 0;
    uint8_t *v = NULL, *c = NULL;
    size_t vl = 0, cl = 0;
    /* 2.8 MB for K3's files; 64 MiB leaves room for any real vocabulary. */
    int rc = base_read_file(vocab_path, 64u << 20, &v, &vl, err, errlen);
    if (!rc && tokcfg_path) {
        rc = base_read_file(tokcfg_path, 64u << 20, &c, &cl, err, errlen);
        if (rc && cfg_bad) *cfg_bad = 1;
    }
    if (!rc) rc = open_mem(out, v, vl, vocab_path, c, cl, tokcfg_path, pattern, cfg_bad, err, errlen);
    base_free(v);
    base_free(c);
    return rc;
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
