/*
 * jgram.h: byte-level JSON automata for constrained decoding (structured output).
 *
 * A compiled grammar (struct strata_grammar, built by jschema.c from a JSON schema
 * or as "any JSON object") is a graph of nodes: objects with their properties in
 * schema order, arrays, strings, pattern strings (a DFA over the content bytes,
 * jregex.h), numbers, integers in a range (a DFA over the digits), literal sets
 * (enum, const, true, false,
 * null) and choices between nodes that differ in their first byte (type lists,
 * anyOf). It is immutable once built and may be shared by any number of matchers.
 *
 * A matcher runs one document: a pushdown machine over bytes whose whole state
 * is jg_state (a bounded stack of small frames, no pointers), so it copies like a
 * value. Per decode step it gives the set of token ids whose bytes can continue a
 * valid document (a depth-first walk of the vocabulary's byte trie, each subtree
 * dropped at its first dead byte; inside a string, a precomputed set of plain
 * content ids filtered by the remaining maxLength plus a walk of the few other
 * ids, except in pattern strings, which walk the whole trie; results cached
 * per state), with the end ids
 * allowed exactly when the document is complete. The mask depends only on the
 * bytes fed so far, never on other sequences.
 *
 * The language (docs/serve.md "Structured output"): properties appear in schema
 * order, each optional one may be left out, no others are generated; keys and
 * literals in the bytes jansson writes for them (compact); at most JG_MAX_WS
 * whitespace bytes (space, tab, LF) in a row between tokens and none after the
 * document; numbers of at most 15 integer and 15 fraction digits and 3 exponent
 * digits; strings of well-formed UTF-8 (no control bytes; \uXXXX escapes other
 * than surrogates); nesting at most JG_MAX_DEPTH - 1 containers.
 */
#ifndef STRATA_JGRAM_H
#define STRATA_JGRAM_H

#include <stddef.h>
#include <stdint.h>

#define JG_MAX_DEPTH 32 /* frames of a matcher's stack */
#define JG_MAX_WS 16    /* whitespace bytes in a row */

/* JG_PAT: a string whose content a DFA (jregex.h) constrains: pattern, format and
 * the length bounds folded in; lo = its table's offset in pat[] (256 byte classes,
 * then a row of extra + 1 per state), n = its states, extra = its byte classes. */
/* JG_INTR: an integer in a range (minimum, maximum, ...): a DFA over its digits,
 * laid out as JG_PAT's. */
enum { JG_OBJ = 1, JG_ARR, JG_STR, JG_NUM, JG_INT, JG_LIT, JG_CHOICE, JG_ALIAS,
       /* composition (tool calls: a format's call syntax around argument documents):
        * SEQ: alts[lo, lo+n) one after the other; KEYED: props[lo, lo+n) each a
        * literal key (prefix-free, so the bytes pick one) followed by its node
        * (-1: nothing); RAW: text of min..max code points (no quotes, no escapes)
        * up to the first byte that cannot be content: a special-token lead or a
        * control byte other than tab, LF, CR. */
       JG_SEQ, JG_KEYED, JG_RAW, JG_PAT, JG_INTR };

typedef struct jg_node {
    int32_t kind;       /* JG_* */
    int32_t lo, n;      /* OBJ: props[lo, lo+n); LIT: lits; CHOICE: alts; ARR: lo = items node */
    int32_t extra;      /* OBJ without props: value node of free-form keys (-1: only {}); ALIAS: target;
                         * LIT: 1 exact (a composition literal: no white space before it) */
    int64_t min, max;   /* STR: code points; ARR: items; max -1 = unbounded */
} jg_node;

typedef struct jg_prop {
    int32_t off, len;   /* the key as JSON text ("name", quotes included) in bytes[] */
    int32_t node;
    int32_t req_next;   /* index (within its object) of the first required property at or after it, or n */
} jg_prop;

typedef struct jg_lit { int32_t off, len; } jg_lit;

struct strata_grammar {
    jg_node *nodes;  int32_t n_nodes, cap_nodes;
    jg_prop *props;  int32_t n_props, cap_props;
    jg_lit *lits;    int32_t n_lits, cap_lits;
    int32_t *alts;   int32_t n_alts, cap_alts;
    uint8_t *bytes;  int64_t n_bytes, cap_bytes;
    uint16_t *pat;   int64_t n_pat, cap_pat; /* pattern DFA tables (jregex.h) */
    int32_t root;
};
typedef struct strata_grammar jgram;

void jgram_free(jgram *g); /* accepts NULL */

/* ---- building composed grammars (each returns the new node, or -1 out of
 * memory or invalid: keys not prefix-free, an empty literal) ---- */

/* Special tokens appear in grammars and in the vocabulary trie as 4 bytes that
 * no UTF-8 text contains: JG_SPECIAL_LEAD and the id's 3 bytes, big-endian, so
 * JSON and raw-text nodes never take them and literals can demand them. */
#define JG_SPECIAL_LEAD 0xFF
#define JG_SPECIAL_LEN 4
void jgram_special_bytes(int32_t id, uint8_t out[JG_SPECIAL_LEN]);
/* The mark a vocabulary's bytes callback returns for a special token. */
extern const uint8_t jgram_special_mark[1];

jgram *jgram_new(void); /* empty, MEM_MISC; NULL out of memory */
/* src's nodes copied into g: the node of src's root in g. */
int32_t jgram_append(jgram *g, const jgram *src);
/* One literal of n >= 1 bytes, or a set of them (lits[i], lens[i]). */
int32_t jgram_add_lit(jgram *g, const uint8_t *p, size_t n);
int32_t jgram_add_lits(jgram *g, const uint8_t *const *lits, const size_t *lens, int n);
int32_t jgram_add_seq(jgram *g, const int32_t *kids, int n);
int32_t jgram_add_keyed(jgram *g, const uint8_t *const *keys, const size_t *lens, const int32_t *nodes, int n);
int32_t jgram_add_raw(jgram *g, int64_t min, int64_t max);

/* ---- the byte machine ---- */

typedef struct jg_frame {
    int32_t node;
    uint8_t kind, sub, ws, pad; /* F_* (jgram.c), its sub-state, whitespace run */
    int32_t a, b;
} jg_frame;

typedef struct jg_state {
    int32_t depth;               /* frames in use; 0: the document is complete */
    int32_t pad;
    jg_frame f[JG_MAX_DEPTH];
} jg_state;

void jgram_start(const jgram *g, jg_state *s);
/* Feeds one byte: 0, or -1 when no document continues so (s is then undefined). */
int jgram_feed(const jgram *g, jg_state *s, uint8_t c);
/* 1: the bytes so far are a whole document (an end id may follow). */
int jgram_can_end(const jgram *g, const jg_state *s);
/* 1 complete, 0 a proper prefix of a document, -1 no document starts so. */
int jgram_check(const jgram *g, const uint8_t *p, size_t n);

/* ---- the vocabulary trie (one per tokenizer, shared read-only) ---- */

typedef struct jg_vocab jg_vocab;
/* bytes(ud, id, &len): the bytes of id, NULL for ids never generated (holes),
 * or jgram_special_mark for a special token (it then matches only grammar
 * literals that name it: JG_SPECIAL_LEAD ...). All memory MEM_TOK. */
int jgram_vocab_build(jg_vocab **out, int32_t n_vocab, const uint8_t *(*bytes)(void *ud, int32_t id, size_t *len),
                      void *ud, char *err, size_t errlen);
void jgram_vocab_free(jg_vocab *v); /* accepts NULL */
uint64_t jgram_vocab_bytes(const jg_vocab *v);

/* ---- a matcher: one document over one vocabulary ---- */

typedef struct jg_matcher jg_matcher;
/* end ids: allowed (only) when the document is complete; at least one. MEM_STATE. */
int jgram_matcher_create(jg_matcher **out, const jgram *g, const jg_vocab *v, const int32_t *end_ids, int n_end,
                         char *err, size_t errlen);
void jgram_matcher_free(jg_matcher *m); /* accepts NULL */
/* The allowed ids now as a bitset of n_vocab bits (valid until the next call);
 * *n_allowed gets their number. No allocation. */
const uint64_t *jgram_matcher_mask(jg_matcher *m, int64_t *n_allowed);
/* Advances by the bytes of the chosen id (an end id ends the document): 0, or -1
 * when the id could not continue it (the state is then unchanged). */
int jgram_matcher_accept(jg_matcher *m, int32_t id);
/* When a mask allows nothing (a recursive schema at the depth bound): *mask gets
 * the end ids alone, and the next end id ends the document as it is. */
void jgram_matcher_end_only(jg_matcher *m, const uint64_t **mask);
/* on = 0: every mask from a walk of the whole trie, not the string fast path
 * (the same masks, slower: for tests and benchmarks). Empties the cache. */
void jgram_matcher_set_fast(jg_matcher *m, int on);
/* Masks computed and of them served from the per-state cache. */
void jgram_matcher_stats(const jg_matcher *m, int64_t *masks, int64_t *cached);

#endif
