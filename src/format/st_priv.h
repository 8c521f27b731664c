/*
 * st_priv.h: the strict JSON cursor st_json.c gives st.c, which reads shard
 * headers with it. Only the st module (st.c, st_json.c) includes it; it includes
 * no header of the module, so it names nothing of st.h.
 *
 * The header grammar is narrow (an object of objects of strings and integer
 * arrays), so it is read by a cursor instead of a jansson tree: on a K3-like
 * 787 KB header with 5,200 tensors, building the jansson tree alone took 26-39 ms
 * CPU (~60k nodes, each through the budgeted allocator), while this cursor parses,
 * validates and indexes the same header in 2.5-6.5 ms CPU (bench/b_index.c and a
 * side-by-side microbenchmark). It also lets model.safetensors.index.json
 * (~497k entries) stream through a callback without a ~100 MB tree, and makes
 * allocation failures exact (jansson's lexer drops a byte when its string
 * buffer cannot grow). Accepts RFC 8259 JSON only: UTF-8 validated, no
 * comments, no trailing commas, no NaN, nesting depth <= 64.
 */
#ifndef STRATA_ST_PRIV_H
#define STRATA_ST_PRIV_H

#include <stddef.h>
#include <stdint.h>

typedef struct { char *s; size_t len, cap; } jstr; /* decoded string, NUL-terminated; MEM_INDEX */

typedef struct {
    const uint8_t *p, *end, *base; /* base: byte 0 of the file, for offsets in messages */
    const char *what;
    char *err;
    size_t errlen;
    jstr tmp;                      /* scratch for skipped values */
} jcur;

enum { JN_INT, JN_REAL, JN_RANGE }; /* integer that fits int64, has . or e, integer too large */

/* Inline: called for every token of a header (here rather than in st_json.c so
 * the header loop keeps them inlined, as when they were static in st.c). */
static inline void st_json_ws(jcur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

/* Skips whitespace, then consumes ch if it is next. */
static inline int st_json_eat(jcur *c, uint8_t ch) {
    st_json_ws(c);
    if (c->p < c->end && *c->p == ch) { c->p++; return 1; }
    return 0;
}

/* STRATA_EFORMAT: "<what>: [tensor '<ctx>': ]invalid JSON at byte N: <why>". */
int st_json_syntax(jcur *c, const char *ctx, const char *why);
/* Reads a string (cursor after optional whitespace on '"') into *s. "\u0000" is
 * kept as a NUL byte: callers compare s->len with strlen to refuse it in names. */
int st_json_str(jcur *c, jstr *s, const char *ctx);
/* Reads a JSON number (cursor after optional whitespace); *kind is a JN_*. */
int st_json_num(jcur *c, int64_t *v, int *kind, const char *ctx);
/* Only whitespace may follow the top-level value (safetensors pads with spaces). */
int st_json_finish(jcur *c);

#endif
