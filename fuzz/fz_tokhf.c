/*
 * fz_tokhf.c: the tokenizer.json reader (tok_hf.c) on arbitrary bytes. The input
 * is a tokenizer.json; when it loads, a fixed text (specials, CJK, digits,
 * invalid UTF-8) must encode with and without special tokens, every id must
 * decode, and the streaming decoder must give the same bytes as tok_decode.
 * A load that fails must say why. Seeds: fuzz/corpus/tokhf (small valid files).
 */
#include <string.h>
#include "fuzz.h"
#include "fuzz_tok.h"
#include "tok.h"

static void check(tok *t, int special) {
    static const char text[] = "Hello, world! \xe4\xb8\xad\xe6\x96\x87 <think> 12345 \xff\xfe  \n\n x <s>abc";
    fuzz_tok_check(t, (const uint8_t *)text, sizeof text - 1, special, 0);
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
