/*
 * tok_load.c: opening a tiktoken tokenizer (see tok.h): the pre-tokenizer
 * patterns, the vocabulary file (base64 token, space, rank per line),
 * tokenizer_config.json's added tokens and chat template, and the regex
 * compilation tok_hf.c shares.
 *
 * Apart from tok.c because building the tables is a one-time parse with its own
 * failure modes (every message names the file and line), while tok.c holds the
 * tables' layout and the hot paths that read them (BPE, splitting, decode). The
 * tables themselves (pool, id arrays, the bytes -> id map and its filters) are
 * filled only through tok.c's functions in tok_priv.h.
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

/* pcre2 allocates through the budget (MEM_TOK). */
static void *pc_malloc(size_t n, void *ud) { (void)ud; return base_alloc(n, MEM_TOK); }
static void pc_free(void *p, void *ud) { (void)ud; base_free(p); }

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

/* Kimi's tokenization_kimi.py appends num_reserved_special_tokens = 256
 * specials after the ranks and names the ones added_tokens_decoder does not
 * as <|reserved_token_{id}|> (family-formats.md 2.1), so a tokenizer_config.json
 * that lists only the named ones still decodes every id of the model's vocab
 * (163,584 + 256). A name a listed special already has is left out. */
static int name_reserved(tok *t, char *err, size_t errlen) {
    for (int32_t id = t->n_ranks; id < t->n_ranks + 256; id++) {
        if (id < t->n_vocab && t->id_len[id] != TOK_ABSENT) continue;
        char nm[48];
        const size_t n = (size_t)snprintf(nm, sizeof nm, "<|reserved_token_%d|>", (int)id);
        int rc = tok_special_id(t, nm) >= 0 ? STRATA_OK
                                             : add_special(t, (const uint8_t *)nm, n, id, "tokenizer: reserved specials", err, errlen);
        if (rc) return rc;
    }
    return STRATA_OK;
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
    if (!rc && pattern == TOK_PAT_KIMI) rc = name_reserved(t, err, errlen);
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
