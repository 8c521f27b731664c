/*
 * fz_tok.c: the tokenizer on arbitrary bytes. The first byte picks the case:
 *   0-3  (mod 4 == 0..2) decode(encode(rest)) == rest on a built-in vocab (256
 *        bytes, merges that overlap and chain, specials), pattern = byte % 3,
 *        specials allowed when byte & 4; streaming decode gives the same bytes.
 *   mod 4 == 3: rest is a tiktoken.model; if it loads, it must encode and
 *        roundtrip a fixed text and its ranks must be dense.
 *   byte & 0x80 with mod 4 == 3: rest is a tokenizer_config.json over the
 *        built-in vocab instead.
 * No external files. The built-in tokenizers are built once and kept (reachable,
 * so LeakSanitizer does not count them).
 */
#include <string.h>
#include "fuzz.h"
#include "fuzz_tok.h"
#include "tok.h"

static const char *k_merges[] = {"ab", "ba", "aba", "bab", "abab", "  ", "   ", "    ", "\n\n", "th", "the", " the",
                                 "in", "ing", "\xc3\xa9", "\xe4\xb8", "\xe4\xb8\xad", "\xf0\x9f", "\xf0\x9f\x98",
                                 "12", "123", "<|", "|>", NULL};

static char *vocab_text(size_t *len) {
    static const char b64c[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    sbuf b = {0};
    int r = 0;
    for (int w = -256; w < 0 || k_merges[w]; w++) {
        uint8_t one = (uint8_t)(w + 256);
        const uint8_t *p = w < 0 ? &one : (const uint8_t *)k_merges[w];
        size_t n = w < 0 ? 1 : strlen(k_merges[w]);
        for (size_t i = 0; i < n; i += 3) {
            uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
            sbuf_printf(&b, "%c%c%c%c", b64c[v >> 18], b64c[(v >> 12) & 63], i + 1 < n ? b64c[(v >> 6) & 63] : '=',
                        i + 2 < n ? b64c[v & 63] : '=');
        }
        sbuf_printf(&b, " %d\n", r++);
    }
    *len = b.len;
    return b.s;
}

static tok *builtin(int pattern) {
    static tok *cache[3];
    if (!cache[pattern]) {
        size_t len;
        char *v = vocab_text(&len);
        char err[256];
        int rc = tok_open_mem(&cache[pattern], (const uint8_t *)v, len, "builtin", NULL, 0, NULL, pattern, err, sizeof err);
        ST_ASSERT(rc == 0);
        const char *sp[] = {"[BOS]", "[EOS]", "<|open|>", "<|close|>", "<|sep|>", "<|open|>x", NULL};
        for (int i = 0; sp[i]; i++) ST_ASSERT(tok_add_special(cache[pattern], sp[i], 1000 + i, err, sizeof err) == 0);
        base_free(v);
    }
    return cache[pattern];
}

/* decode(encode(p)) == p, streamed the same. */
static void roundtrip(tok *t, const uint8_t *p, size_t n, int special) { fuzz_tok_check(t, p, n, special, 1); }

FUZZ_ENTRY(tok) {
    if (size == 0) return 0;
    uint8_t sel = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if (sel % 4 != 3) {
        roundtrip(builtin(sel % 3), p, n, sel & 4);
        return 0;
    }
    char err[512];
    tok *t = NULL;
    if (sel & 0x80) {
        size_t len;
        char *v = vocab_text(&len);
        int rc = tok_open_mem(&t, (const uint8_t *)v, len, "builtin", p, n, "fuzz.json", TOK_PAT_O200K, err, sizeof err);
        base_free(v);
        if (rc) { ST_ASSERT(err[0] != 0 && t == NULL); return 0; }
    } else {
        int rc = tok_open_mem(&t, p, n, "fuzz.model", NULL, 0, NULL, TOK_PAT_KIMI, err, sizeof err);
        if (rc) { ST_ASSERT(err[0] != 0 && t == NULL); return 0; }
        for (int32_t i = 0; i < tok_n_ranks(t); i++) {
            size_t l;
            ST_ASSERT(tok_token_bytes(t, i, &l) != NULL && l > 0);
        }
    }
    static const char text[] = "Hello, world! \xe4\xb8\xad\xe6\x96\x87 <|open|> 12345 \xff\xfe  \n\n x";
    roundtrip(t, (const uint8_t *)text, sizeof text - 1, 0);
    roundtrip(t, (const uint8_t *)text, sizeof text - 1, 1);
    tok_close(t);
    return 0;
}
