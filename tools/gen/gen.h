/*
 * gen.h: writes a complete K3-format model directory with random but numerically
 * alive weights: config.json (released nested shape), sharded safetensors named like
 * the release plus model.safetensors.index.json, tiktoken.model and
 * tokenizer_config.json. Tensor names, dtypes and shapes are exactly schema_walk's.
 *
 * Layout guarantees (the ones the real checkpoint has, so the loader's checks are
 * exercised): each layer's trunk tensors form one gap-free run in one shard; each
 * routed expert's six MXFP4 tensors form one run in the released order (w1.packed,
 * w1.scale, w2.packed, w2.scale, w3.packed, w3.scale); experts of a layer follow its
 * trunk in a deterministic shuffled order (never id order), possibly in later shards.
 *
 * Determinism: every tensor's bytes depend only on (seed, tensor name, position),
 * so the same seed gives the same bytes whatever the buffer sizes or threads.
 * Memory: a few small buffers (independent of model size) plus the tensor list.
 * Crash safety: built in OUT.partial-<pid>, fsync'd, then renamed to OUT; stale
 * partial directories of dead processes are removed on the next run for OUT.
 *
 * Test hook (env, tests only): STRATA_GEN_ABORT_AFTER_BYTES=N makes the generator
 * _exit(99) after about N data bytes, to simulate a kill -9 mid-way;
 * STRATA_GEN_NO_URING=1 uses the synchronous pwrite path instead of io_uring.
 */
#ifndef STRATA_GEN_H
#define STRATA_GEN_H

#include <stddef.h>
#include <stdint.h>
#include "cfg.h"

enum gen_trunk_dtype {
    GEN_TRUNK_BF16 = 0,   /* every trunk tensor BF16 (the release) */
    GEN_TRUNK_MIXED = 1,  /* F32 / BF16 / F16 rotating per tensor (exercises the reader) */
    GEN_TRUNK_F32 = 2,
};

/* Progress: done/total data bytes (headers excluded), seconds since start. */
typedef void (*gen_progress_fn)(void *ud, uint64_t done, uint64_t total, double secs);

typedef struct gen_opts {
    uint64_t seed;            /* default 0 */
    uint64_t shard_bytes;     /* target shard size; 0 = GEN_DEFAULT_SHARD */
    int64_t n_reserved;       /* special ids at the end of the vocab; 0 = auto (256, or 16 if vocab is small) */
    int trunk_dtype;          /* enum gen_trunk_dtype */
    int experts_bf16;         /* plain BF16 `weight` experts instead of MXFP4 */
    int weights;              /* GEN_W_*: FP8 trunk and experts, or INT4 experts (strata_gen.h) */
    int scales_pow2;          /* FP8 / INT4 scales are powers of two */
    int dequantize;           /* write the FP8 / INT4 values as plain tensors (BF16 if pow2, else F32) */
    int sparse;               /* headers + holes, no data (metadata says so) */
    int force;                /* replace an existing OUT */
    int tok;                  /* GEN_TOK_*: the tokenizer files written */
    int shard_names;          /* GEN_SHARDS_*: how the shard files are numbered */
    const char *preset;       /* informational, recorded in metadata; may be NULL */
    gen_progress_fn progress; /* optional */
    void *progress_ud;
} gen_opts;
#define GEN_DEFAULT_SHARD (4ull << 30)
enum { GEN_W_PRESET = 0, GEN_W_FP8 = 1, GEN_W_INT4 = 2 };
/* Tokenizers: K3's tiktoken specials (Kimi Linear's: the K2 ones); Kimi's
 * tiktoken with K2's specials, with <think> </think> and a K2-Thinking
 * chat_template; DeepSeek's tokenizer.json with the V3 / R1 / V3.1 template. */
enum { GEN_TOK_DEFAULT = 0, GEN_TOK_K2 = 1, GEN_TOK_K2_THINKING = 2, GEN_TOK_DS_V3 = 3, GEN_TOK_DS_R1 = 4, GEN_TOK_DS_V31 = 5 };
/* Shard names: model-00001-of-00005 (most releases), model-00001-of-000062
 * (K2-Thinking, K2-Instruct-0905), model-1-of-61 (K2-Instruct). */
enum { GEN_SHARDS_5 = 0, GEN_SHARDS_5_6 = 1, GEN_SHARDS_PLAIN = 2 };
/* The schema formats (schema.h SW_*) of the tensors o writes for c. */
int gen_wf(const cfg *c, const gen_opts *o);

/* Result numbers of one generation. */
typedef struct gen_stats {
    uint64_t total_bytes;     /* all files written (apparent size) */
    uint64_t data_bytes;      /* tensor bytes */
    uint64_t n_tensors;
    int n_shards;
    double secs;
    double mb_per_s;          /* total_bytes / secs / 1e6 */
    double io_secs;           /* writer inside write(2) */
    double gen_wait_secs;     /* writer waiting for the generator threads */
    double prep_secs;         /* plan, config, tokenizer training, index */
    double sync_secs;         /* shard fsyncs and the final rename */
} gen_stats;

/* Writes the model for c into out_dir (see the file comment). c's special ids and
 * max_ctx are filled in from the tokenizer layout in a private copy. Returns
 * STRATA_OK or an error with the reason in err; on failure nothing is left at
 * out_dir (an existing out_dir is untouched unless the new model was complete). */
int gen_model(const char *out_dir, const cfg *c, const gen_opts *o, gen_stats *st,
              char *err, size_t errlen);

/* Byte sizes of the model gen_model would write, without writing it. */
typedef struct gen_sizes {
    uint64_t total, experts, trunk, embed;  /* embed: embed_tokens + lm_head */
    uint64_t expert_bytes;                  /* one expert */
    uint64_t n_tensors;
    int n_shards;
} gen_sizes;
int gen_model_sizes(const cfg *c, const gen_opts *o, gen_sizes *out, char *err, size_t errlen);

/* Tokenizer layout for a vocab: ranks = vocab - reserved; specials from `ranks` on. */
int64_t gen_n_reserved(const cfg *c, const gen_opts *o);

/* Trains the byte-level BPE on the embedded corpus and returns n_ranks tokens:
 * *bytes holds them back to back, (*offs)[i]..(*offs)[i+1] is token i; ranks
 * 0..255 are the single bytes. MEM_TOK buffers, caller base_free()s both. */
int gen_tokenizer_ranks(int64_t n_ranks, uint8_t **bytes, uint64_t **offs, char *err, size_t errlen);

/* A DeepSeek-V3-style tokenizer.json + tokenizer_config.json into dir
 * (gen_tok_hf.c): byte-level BPE merges from gen_tokenizer_ranks, DeepSeek's
 * Split regexes and special tokens (<｜begin▁of▁sentence｜> 0,
 * <｜end▁of▁sentence｜> 1, <think> .. <｜tool▁sep｜> 8 ids below vocab_size, or
 * at DeepSeek's ids when vocab_size >= 129,280), ids up to vocab_size - 1 with
 * the top ones unused. variant picks the chat_template written. */
enum { GEN_DS_V3 = 0, GEN_DS_R1 = 1, GEN_DS_V31 = 2 };
int gen_tok_write_hf(const char *dir, int64_t vocab_size, int variant, char *err, size_t errlen);
/* strata's transcription of DeepSeek's chat_template for a GEN_DS_* variant. */
const char *gen_ds_chat_template(int variant);
/* Byte b's character in the ByteLevel alphabet (GPT-2's bytes_to_unicode) as
 * UTF-8 into out (2 bytes at most); returns its length. */
size_t gen_bytelevel_char(int b, char *out);

/* Name of special id `i` of the reserved block (0 -> "[BOS]", 1 -> "[EOS]", ...,
 * 6.. -> "<|reserved_token_N|>"); writes into buf. */
const char *gen_special_name(int64_t i, char *buf, size_t n);

#endif
