/*
 * fz_tokhf.c: the tokenizer.json reader (tok_hf.c) on arbitrary bytes. The input
 * is a tokenizer.json; when it loads, a fixed text (specials, CJK, digits,
 * invalid UTF-8) must encode with and without special tokens, every id must
 * decode, and the streaming decoder must give the same bytes as tok_decode.
 * A load that fails must say why. Seeds: fuzz/corpus/tokhf (small valid files).
 */
#include <string.h>
#include "fuzz.h"
#include "tok.h"

static void check(tok *t, int special) {
    static const char text[] = "Hello, world! \xe4\xb8\xad\xe6\x96\x87 <think> 12345 \xff\xfe  \n\n x <s>abc";
    int32_t *ids;
    size_t k;
    ST_ASSERT(tok_encode(t, (const uint8_t *)text, sizeof text - 1, special, &ids, &k) == 0);
    uint8_t *back;
    size_t bl;
    ST_ASSERT(tok_decode(t, ids, k, &back, &bl) == 0);
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
    tok_stream_close(s);
    base_free(back);
    base_free(ids);
}

FUZZ_ENTRY(tokhf) {
    char err[512] = "";
    tok *t = NULL;
    int rc = tok_open_hf_mem(&t, data, size, "fuzz.json", NULL, 0, NULL, NULL, err, sizeof err);
    if (rc) { ST_ASSERT(err[0] != 0 && t == NULL); return 0; }
    check(t, 0);
    check(t, 1);
    tok_close(t);
    return 0;
}
