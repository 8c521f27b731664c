/*
 * fuzz_tok.h: the encode / decode / streaming-decode check the tokenizer
 * targets share (fz_tok.c, fz_tokhf.c). A header, not a fz_*.c, because every
 * fz_*.c is a target of its own.
 */
#ifndef STRATA_FUZZ_TOK_H
#define STRATA_FUZZ_TOK_H
#include <string.h>
#include "fuzz.h"
#include "tok.h"

/* Encodes p[0..n), decodes the ids, and streams them: the streamed bytes must be
 * the decoded ones in order. exact: the decode must also give p back, and the
 * flush hold at most 3 bytes (an unfinished UTF-8 character). */
static void fuzz_tok_check(tok *t, const uint8_t *p, size_t n, int special, int exact) {
    int32_t *ids;
    size_t k;
    ST_ASSERT(tok_encode(t, p, n, special, &ids, &k) == 0);
    uint8_t *back;
    size_t bl;
    ST_ASSERT(tok_decode(t, ids, k, &back, &bl) == 0);
    if (exact) ST_ASSERT(bl == n && (n == 0 || !memcmp(back, p, n)));
    tok_stream *s;
    ST_ASSERT(tok_stream_open(&s, t) == 0);
    size_t at = 0;
    for (size_t i = 0; i < k; i++) {
        const uint8_t *q;
        size_t qn;
        ST_ASSERT(tok_stream_push(s, ids[i], &q, &qn) == 0);
        ST_ASSERT(at + qn <= bl && (qn == 0 || !memcmp(back + at, q, qn)));
        at += qn;
    }
    const uint8_t *q;
    size_t qn;
    tok_stream_flush(s, &q, &qn);
    ST_ASSERT(at + qn == bl);
    if (exact) ST_ASSERT(qn <= 3 && (qn == 0 || !memcmp(back + at, q, qn)));
    tok_stream_close(s);
    base_free(back);
    base_free(ids);
}
#endif
