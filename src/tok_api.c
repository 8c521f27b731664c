/*
 * tok_api.c: the "tokenizer files" section of strata.h: a tokenizer opened on its
 * own (tok.h) behind the public handle. A strata_tokenizer is the tok itself; the
 * public type only hides its layout.
 */
#include <string.h>
#include "strata.h"
#include "tok.h"

_Static_assert((int)STRATA_TOK_KIMI == (int)TOK_PAT_KIMI && (int)STRATA_TOK_O200K == (int)TOK_PAT_O200K &&
                   (int)STRATA_TOK_CL100K == (int)TOK_PAT_CL100K, "public pattern ids are tok.h's");

static tok *T(strata_tokenizer *t) { return (tok *)t; }
static const tok *CT(const strata_tokenizer *t) { return (const tok *)t; }

int strata_tokenizer_pattern(const char *name) { return tok_pattern_parse(name); }

/* A vocab path ending in ".json" is a Hugging Face tokenizer.json. */
static int is_json(const char *path) {
    size_t n = strlen(path);
    return n >= 5 && !strcmp(path + n - 5, ".json");
}

int strata_tokenizer_open(strata_tokenizer **out, const char *vocab_path, const char *config_path, int pattern,
                          char *err, size_t errlen) {
    tok *t = NULL;
    int rc = is_json(vocab_path) ? tok_open_hf(&t, vocab_path, config_path, NULL, err, errlen)
                                 : tok_open(&t, vocab_path, config_path, pattern, err, errlen);
    *out = rc ? NULL : (strata_tokenizer *)t;
    return rc;
}

int strata_tokenizer_open_dir(strata_tokenizer **out, const char *dir, char *err, size_t errlen) {
    tok *t = NULL;
    int rc = tok_open_dir(&t, dir, NULL, err, errlen);
    *out = rc ? NULL : (strata_tokenizer *)t;
    return rc;
}

int32_t strata_tokenizer_bos(const strata_tokenizer *t) { return tok_bos_id(CT(t)); }

void strata_tokenizer_close(strata_tokenizer *t) { tok_close(T(t)); }

int strata_tokenizer_encode(strata_tokenizer *t, const void *text, size_t len, int allow_special, int32_t **ids,
                            size_t *n) {
    return tok_encode(T(t), text, len, allow_special, ids, n);
}

const char *strata_tokenizer_errmsg(const strata_tokenizer *t) { return tok_errmsg(CT(t)); }

int strata_tokenizer_decode(const strata_tokenizer *t, const int32_t *ids, size_t n, uint8_t **out, size_t *len) {
    return tok_decode(CT(t), ids, n, out, len);
}

int32_t strata_tokenizer_n_vocab(const strata_tokenizer *t) { return tok_n_vocab(CT(t)); }

const uint8_t *strata_tokenizer_token_bytes(const strata_tokenizer *t, int32_t id, size_t *len) {
    return tok_token_bytes(CT(t), id, len);
}
