/*
 * jcur.h: a strict JSON cursor, for JSON too large or too hot for a jansson tree.
 *
 * safetensors shard headers are read with it (st.c): on a K3-like 787 KB header
 * with 5,200 tensors, building the jansson tree alone took 26-39 ms CPU (~60k
 * nodes, each through the budgeted allocator), while the cursor parses,
 * validates and indexes the same header in 2.5-6.5 ms CPU (bench/b_index.c and
 * a side-by-side microbenchmark). model.safetensors.index.json (~497k entries)
 * streams through it without a ~100 MB tree (st_json.c), and tokenizer.json's
 * model.vocab and model.merges are read in place with it (tok_hf.c: DeepSeek-V3's
 * file as one jansson tree peaked at 138 MB of RSS). It also makes allocation
 * failures exact (jansson's lexer drops a byte when its string buffer cannot
 * grow). Accepts RFC 8259 JSON only: UTF-8 validated, no comments, no trailing
 * commas, no NaN, nesting depth <= 64.
 */
#ifndef STRATA_JCUR_H
#define STRATA_JCUR_H

#include <stddef.h>
#include <stdint.h>

typedef struct { char *s; size_t len, cap; } jstr; /* decoded string, NUL-terminated; the cursor's tag */

typedef struct {
    const uint8_t *p, *end, *base; /* base: byte 0 of the file, for offsets in messages */
    const char *what;              /* the file, first in messages */
    char *err;
    size_t errlen;
    int tag;                       /* base_alloc tag of the strings */
    const char *ctx_kind;          /* what a message's context names ("tensor"), or NULL */
    jstr tmp;                      /* scratch for skipped values and member names; base_free(tmp.s) */
} jcur;

enum { JN_INT, JN_REAL, JN_RANGE }; /* integer that fits int64, has . or e, integer too large */

/* Inline: called for every token of a header (here rather than in jcur.c so
 * the header loop keeps them inlined, as when they were static in st.c). */
static inline void jcur_ws(jcur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

/* Skips whitespace, then consumes ch if it is next. */
static inline int jcur_eat(jcur *c, uint8_t ch) {
    jcur_ws(c);
    if (c->p < c->end && *c->p == ch) { c->p++; return 1; }
    return 0;
}

/* STRATA_EFORMAT: "<what>: [<ctx_kind> '<ctx>': ]invalid JSON at byte N: <why>". */
int jcur_syntax(jcur *c, const char *ctx, const char *why);
/* Reads a string (cursor after optional whitespace on '"') into *s. "\u0000" is
 * kept as a NUL byte: callers compare s->len with strlen to refuse it in names. */
int jcur_str(jcur *c, jstr *s, const char *ctx);
/* Reads a JSON number (cursor after optional whitespace); *kind is a JN_*. */
int jcur_num(jcur *c, int64_t *v, int *kind, const char *ctx);
/* Skips one value, checked as strictly as the rest. */
int jcur_skip(jcur *c, const char *ctx);
/* Only whitespace may follow the top-level value (safetensors pads with spaces). */
int jcur_finish(jcur *c);

/* In the object at the cursor, the first member named key (compared after
 * unescaping): 0 with its value's bytes [*val, *val + *n), 1 when there is
 * none (the cursor then after the object), or the error. */
int jcur_member(jcur *c, const char *key, const uint8_t **val, size_t *n);
/* Turns the object or array b[0, n) into an empty one of its kind padded with
 * spaces, newlines kept (so a parser's line numbers after it stay the file's). */
void jcur_blank(uint8_t *b, size_t n);

#endif
