/*
 * tok.h: byte-level BPE tokenizer over a tiktoken vocabulary (Kimi K3's
 * tiktoken.model, or cl100k_base / o200k_base exported in the same format).
 *
 * Vocabulary file, one token per line: base64(token bytes) SP rank LF. Ranks are
 * the ids, dense from 0. Special tokens ("[BOS]", "<|open|>", ...) come from
 * tokenizer_config.json's added_tokens_decoder ("ID" -> {"content": ...}) and take
 * ids of their own, usually right after the ranks.
 *
 * Encoding = pre-tokenizer regex split (TOK_PAT_*), then rank-based BPE on each
 * piece (repeatedly merge the adjacent pair whose concatenation has the lowest
 * rank), which is what tiktoken does. With TOK_PAT_KIMI the text is first cut the
 * way Kimi's shipped encode (tokenization_kimi.py) cuts it: 400,000-character
 * chunks, and a cut wherever a whitespace or non-whitespace run passes 25,000
 * characters; each cut is a BPE boundary (ids differ from plain tiktoken there). Ordinary encoding treats special-token text
 * as text; with allow_special the special contents are matched longest-first and
 * emitted as their ids.
 *
 * Threading: every call is safe from any thread. Encoding (tok_encode*,
 * tok_split) shares the regex match state, BPE scratch and piece cache of the tok,
 * so it holds the tok's mutex: concurrent encodes on one tok serialize (open one
 * tok per thread for parallel encoding). tok_add_special must not race encodes.
 */
#ifndef STRATA_TOK_H
#define STRATA_TOK_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok tok;

/* Pre-tokenizer patterns. TOK_PAT_KIMI is tokenization_kimi.py's pat_str (o200k
 * with a leading Han-run rule and Han removed from the letter classes). */
enum tok_pattern { TOK_PAT_KIMI = 0, TOK_PAT_O200K = 1, TOK_PAT_CL100K = 2, TOK_PAT_HF = 3 };

/* "kimi" | "o200k" | "cl100k" -> TOK_PAT_*, or -1. */
int tok_pattern_parse(const char *name);
const char *tok_pattern_name(int pattern);

/* Loads vocab_path (tiktoken.model) and, when tokcfg_path is not NULL, the special
 * tokens of tokenizer_config.json. Errors name the file and line. *out is released
 * with tok_close. All memory is MEM_TOK. */
int tok_open(tok **out, const char *vocab_path, const char *tokcfg_path, int pattern,
             char *err, size_t errlen);
/* tok_open that also says which file failed: on failure *cfg_bad (when not NULL)
 * is 1 when tokenizer_config.json is at fault, 0 when tiktoken.model is. */
int tok_open_ex(tok **out, const char *vocab_path, const char *tokcfg_path, int pattern, int *cfg_bad,
                char *err, size_t errlen);
/* Same from memory (the fuzzable parser). name is used in messages. tokcfg may be
 * NULL. Buffers are not retained. */
int tok_open_mem(tok **out, const uint8_t *vocab, size_t vocab_len, const char *name,
                 const uint8_t *tokcfg, size_t tokcfg_len, const char *tokcfg_name,
                 int pattern, char *err, size_t errlen);
/* A Hugging Face tokenizer.json byte-level BPE (DeepSeek-V3/R1/V3.1), with
 * tokenizers' semantics: model BPE (vocab, merges by rank, ignore_merges),
 * added_tokens matched before the pre-tokenizer (the not-normalized ones first,
 * then the normalized ones; lstrip/rstrip; single_word refused), the
 * pre_tokenizer's Split (Regex or String, behavior Isolated) steps in order then
 * ByteLevel (add_prefix_space false; use_regex adds GPT-2's split), normalizer
 * null, decoder ByteLevel, post_processor TemplateProcessing whose BOS
 * tok_bos_id reports. What it does not implement is refused, naming the JSON
 * path. Special added tokens match only with allow_special; the others always
 * (as Hugging Face does). Invalid UTF-8 (which Hugging Face cannot be given)
 * encodes byte by byte as with tiktoken vocabularies, so decode stays exact.
 * tokcfg (tokenizer_config.json, may be NULL) gives add_bos_token and
 * chat_template; its added_tokens_decoder is not read (tokenizer.json is whole).
 * The pattern of such a tok is TOK_PAT_HF. */
int tok_open_hf(tok **out, const char *json_path, const char *tokcfg_path, int *cfg_bad, char *err, size_t errlen);
int tok_open_hf_mem(tok **out, const uint8_t *json, size_t len, const char *name, const uint8_t *tokcfg,
                    size_t tokcfg_len, const char *tokcfg_name, int *cfg_bad, char *err, size_t errlen);
/* The tokenizer of a model directory: tiktoken.model (Kimi pattern) if there is
 * one, else tokenizer.json; tokenizer_config.json beside either when present.
 * STRATA_EIO when there is neither. */
int tok_open_dir(tok **out, const char *dir, int *cfg_bad, char *err, size_t errlen);
/* The id Hugging Face's encode(add_special_tokens=True) puts in front (the
 * post-processor's BOS, unless tokenizer_config.json's add_bos_token is false),
 * or -1. tok_encode never adds it. */
int32_t tok_bos_id(const tok *t);
/* tokenizer_config.json's chat_template (for a tokenizer.json model the "default"
 * one of a list), else (tok_open_dir) the directory's chat_template.jinja, or
 * NULL. chat.c looks for format markers in it. */
const char *tok_chat_template(const tok *t);

/* Adds one special token (content matched literally when specials are allowed).
 * id must not collide with a rank or another special. */
int tok_add_special(tok *t, const char *content, int32_t id, char *err, size_t errlen);
void tok_close(tok *t);

/* Number of ids: max(rank, special id) + 1. */
int32_t tok_n_vocab(const tok *t);
/* Number of BPE ranks (ids below this are byte tokens, the rest may be specials). */
int32_t tok_n_ranks(const tok *t);
/* Id of a special token by content ("<|open|>"), or -1. */
int32_t tok_special_id(const tok *t, const char *content);
/* 1 if id is a special token. */
int tok_is_special(const tok *t, int32_t id);
/* Bytes of one id (rank or special); NULL if id is unknown. Valid until tok_close. */
const uint8_t *tok_token_bytes(const tok *t, int32_t id, size_t *len);
int tok_pattern(const tok *t);

/* Encodes len bytes (any bytes; invalid UTF-8 is split bytewise and still
 * roundtrips). *ids is MEM_TOK, caller base_free()s it (NULL when *n == 0).
 * Returns STRATA_OK, STRATA_ENOMEM/EBUDGET (memory, or the regex engine's limits:
 * tok_errmsg says which), or STRATA_EFORMAT if the vocab cannot represent some
 * byte (a vocab without all 256 single bytes). */
int tok_encode(tok *t, const uint8_t *text, size_t len, int allow_special,
               int32_t **ids, size_t *n);
/* Why the last tok_encode / tok_encode_append failed ("" when it did not say):
 * e.g. the pre-tokenizer regex ran out of resources (STRATA_ENOMEM). Valid until
 * the next encode on t. */
const char *tok_errmsg(const tok *t);
/* Appends the ids of text to a growing array (*ids, *n, *cap: caller-owned, MEM_TOK,
 * may be reallocated: the old pointer is invalid afterwards). */
int tok_encode_append(tok *t, const uint8_t *text, size_t len, int allow_special,
                      int32_t **ids, size_t *n, size_t *cap);
/* Concatenated bytes of ids. *out is MEM_TOK (NUL-terminated for convenience, the
 * NUL is not counted), caller base_free()s it. STRATA_EINVAL on an unknown id. */
int tok_decode(const tok *t, const int32_t *ids, size_t n, uint8_t **out, size_t *len);

/* Pre-tokenizer only: calls fn for each piece (offset, length) of text in order:
 * the regex split alone (no special tokens, no Kimi chunking), i.e. the pieces
 * tok_encode feeds to BPE for text without long runs. For tests and the regex
 * equivalence proof. */
int tok_split(tok *t, const uint8_t *text, size_t len,
              void (*fn)(void *ud, size_t off, size_t n), void *ud);

/* ---- streaming decode for generation ----
 * Bytes of a UTF-8 character split across tokens are held until the character is
 * complete; bytes that can never complete a character (invalid UTF-8) are emitted
 * as soon as that is known, so nothing is held forever. */
typedef struct tok_stream tok_stream;
int tok_stream_open(tok_stream **out, const tok *t);
/* Feeds one id. *p and *n receive the bytes ready to print (possibly 0 bytes); they
 * point into the stream and are valid until the next call on it. STRATA_EINVAL on
 * an unknown id (the stream is unchanged). */
int tok_stream_push(tok_stream *s, int32_t id, const uint8_t **p, size_t *n);
/* Emits whatever is held (an incomplete character at the end of the output). */
void tok_stream_flush(tok_stream *s, const uint8_t **p, size_t *n);
void tok_stream_close(tok_stream *s);

#endif
