/*
 * infer.h: the K3 forward pass. An engine is one model (config, weight source,
 * thread pool, per-chunk scratch); a session is one sequence evaluated on it
 * (KDA conv history + recurrent state for the KDA layers only, the MLA latent
 * cache, the position and the token history).
 *
 * Math: docs/architecture.md, Model spec. Order of operations per layer: Block Attention
 * Residuals (8 steps), KDA (sequential delta rule, carried conv/state) or Gated MLA
 * (latent cache with W_kvb absorbed on both sides, so the cache holds only the
 * normed latent and the rope slot: n_mla x (kv_lora + qk_rope) f32 per position),
 * dense SiTU-GLU or Stable LatentMoE. Weights come only through wsrc (model.h).
 *
 * Determinism: every output element is computed by one thread in a fixed order
 * (rows of matmuls, heads, experts' rows), so logits are bit-identical for any
 * thread count and any weight source; prefill (T tokens as a batch) gives the same
 * bits as T single-token steps.
 *
 * Threading: an engine and its sessions are single-caller objects: one eval at a
 * time per engine (they share the engine's scratch).
 */
#ifndef STRATA_INFER_H
#define STRATA_INFER_H

#include <stddef.h>
#include <stdint.h>
#include "cfg.h"
#include "engine_stats.h"
#include "model.h"

typedef struct engine engine;
typedef struct session session;

typedef struct engine_opts {
    int n_threads;          /* >= 1; 0 = pool_default_threads() */
    int64_t prefill_chunk;  /* tokens per batched forward; 0 = INFER_DEFAULT_CHUNK */
    int64_t spec_rows;      /* rows a sequence may verify speculatively at once (0 = none);
                               sessions then also hold a KDA snapshot and per-row records */
    /* Pipeline stage (src/mpi/): this engine computes layers [layer_lo, layer_hi) only
     * and its sessions hold those layers' state; layer_hi 0 = every layer. The first
     * stage (layer_lo 0) embeds the rows and computes the head; the others are driven
     * by engine_stage_step. */
    int64_t layer_lo, layer_hi;
} engine_opts;
#define INFER_DEFAULT_CHUNK 64

/* Creates an engine over c and w (both borrowed: they must outlive the engine).
 * Allocates the pool and all scratch (MEM_SCRATCH); nothing is allocated later by
 * evaluation. *out NULL on failure. Free with engine_free. */
int engine_create(engine **out, const cfg *c, wsrc *w, const engine_opts *o, char *err, size_t errlen);
void engine_free(engine *e); /* accepts NULL; sessions must be freed first */
int engine_threads(const engine *e);
/* The model identity written into and required from state files (0 = the
 * config fingerprint only). */
void engine_set_model_id(engine *e, uint64_t id);

/* One row of a step: the next token of sequence s, at s's next position.
 * logits != 0: the row's logits are wanted. */
typedef struct infer_row {
    session *s;
    int32_t id;
    int32_t logits;
} infer_row;

/* Evaluates rows of several sequences together: each layer's trunk weights are
 * fetched once per pass for all rows, the experts chosen by any row once per
 * pass (their union, streamed through the source in a sliding window when it
 * exceeds the cache), KDA and MLA run per sequence on its own state. The rows of
 * one sequence must be consecutive and in position order; a sequence may appear
 * in one run only. More rows than the engine's chunk run as several passes.
 * Writes one vocab-sized row of logits per row with logits set, in row order.
 * Batch invariance: a row's logits and its sequence's state are bit-identical
 * whatever else is in the step, its place in it, the pass split, the budget and
 * the thread count. Everything is checked first (ids, contexts, broken
 * sequences): nothing is evaluated then. A failure during a pass (weight source,
 * non-finite values) leaves every sequence of the step broken until reset.
 * Message: engine_errmsg (also copied to each sequence's session_errmsg). */
int engine_step(engine *e, const infer_row *rows, int64_t n, float *logits);
/* Self-drafting: a pass over rows of sequences inside session_spec_begin that
 * uses only weights already in RAM (pinned trunk layers, cached experts; the
 * others are skipped) and reads nothing but embedding rows. Its logits only
 * propose drafts; the caller ends with session_spec_end(s, 0). 0 from
 * engine_can_draft: the head or every layer streams, or the source is resident
 * (a draft would be the model itself). */
/* engine_draft_stats (passes, layers, layers_skipped, experts, experts_dropped): engine_stats.h */
int engine_can_draft(const engine *e);
int engine_draft_step(engine *e, const infer_row *rows, int64_t n, float *logits);
void engine_draft_stats_get(const engine *e, engine_draft_stats *out);
void engine_draft_stats_reset(engine *e);
const char *engine_errmsg(const engine *e);
int64_t engine_prefill_chunk(const engine *e);
const cfg *engine_cfg(const engine *e);

/* ---- pipeline stages ----
 * Between stages a pass travels as its residual stream: Block AttnRes keeps the
 * closed block sums and the partial sum, so before layer L the state is blocks
 * 0 .. infer_blocks_before(c, L) of (rows, hidden) floats, the last one the
 * partial. A first stage whose engine stops before the last layer hands the pass
 * to its link after its own layers; the link runs the other stages and returns
 * with the state after the last layer in place, then the head runs. Sequences are
 * mirrored: each session of a linked engine has a slot (link->seq_open), and
 * resets and speculation are reported to the link in the order they happen. */
typedef struct engine_pass {
    int64_t T, n_grp;          /* rows, groups (one per sequence, rows consecutive) */
    const int32_t *g_slot;     /* (n_grp) slot of each group's sequence */
    const int64_t *g_r0;       /* (n_grp + 1) first row of each group */
    const int32_t *ids;        /* (T) token of each row */
    float *res;                /* residual block i at res + i * stride; T x hidden floats each */
    int64_t stride, hidden;
    int64_t nb_have, nb_want;  /* blocks 0..nb_have valid now; 0..nb_want wanted back */
} engine_pass;
enum { ENGINE_EV_RESET = 1, ENGINE_EV_SPEC_BEGIN, ENGINE_EV_SPEC_END, ENGINE_EV_CLOSE };
typedef struct engine_link {
    void *ud;
    int (*pass)(void *ud, const engine_pass *p, char *err, size_t errlen);
    int (*seq_open)(void *ud, int32_t *slot, char *err, size_t errlen);
    /* ENGINE_EV_*; arg: rows kept for SPEC_END. Failures surface at the next pass. */
    void (*seq_event)(void *ud, int32_t slot, int ev, int64_t arg);
} engine_link;
/* Set before any session exists (borrowed; must outlive the engine). */
void engine_set_link(engine *e, const engine_link *l);
/* Blocks of the residual stream before layer L (L = n_layers: before the head). */
int64_t infer_blocks_before(const cfg *c, int64_t L);
/* The engine's residual blocks: block i at base + i * *stride floats. A stage
 * receives a pass's state there before engine_stage_step and sends it on after. */
float *engine_res(engine *e, int64_t *stride);
/* A non-first stage: runs this engine's layers over rows (n <= prefill chunk;
 * ids are recorded as the sequences' history) whose residual state
 * (infer_blocks_before(layer_lo) + 1 blocks) is in engine_res, leaving
 * infer_blocks_before(layer_hi) + 1 blocks there, and advances the sequences.
 * Checks like engine_step; a failure breaks the step's sequences. */
int engine_stage_step(engine *e, const infer_row *rows, int64_t n);
/* Session bytes for a stage owning layers [lo, hi) (the planner's seq_bytes). */
uint64_t infer_session_bytes_range(const cfg *c, int64_t max_ctx, int64_t lo, int64_t hi);

/* A sequence of at most max_ctx positions (1 <= max_ctx). Allocates its KDA state
 * (MEM_STATE) and MLA cache (MEM_KV) up front. Free with session_free. */
int session_create(session **out, engine *e, int64_t max_ctx, char *err, size_t errlen);
void session_free(session *s); /* accepts NULL */
/* Back to the empty sequence (zero state, position 0). */
void session_reset(session *s);

/* Appends n >= 1 tokens (prefill in chunks of the engine's prefill_chunk as a
 * batch) and, if logits != NULL, writes the last token's logits (vocab floats).
 * Fails with STRATA_EINVAL for an id outside [0, vocab) or when the context would
 * overflow max_ctx (nothing is evaluated then), or with the weight source's error
 * (the session is then unusable until session_reset). Message: session_errmsg. */
int session_eval(session *s, const int32_t *ids, int64_t n, float *logits);
/* Test oracle: session_reset, then evaluates all n ids from the empty state. */
int session_eval_full(session *s, const int32_t *ids, int64_t n, float *logits);

int64_t session_pos(const session *s);          /* tokens evaluated so far */
int64_t session_max_ctx(const session *s);
const int32_t *session_tokens(const session *s); /* the pos ids evaluated; valid until the next eval/reset/load */
const char *session_errmsg(const session *s);   /* last error ("" if none) */
/* Speculation: session_spec_begin snapshots the sequence; the rows evaluated
 * after it (at most the engine's spec_rows, in any number of steps) are recorded;
 * session_spec_end(s, keep) keeps the first `keep` of them exactly as if only
 * those had been evaluated (KDA recurrence replayed from the records, conv history
 * and position cut back), without reading a weight. */
int session_spec_begin(session *s);
int session_spec_end(session *s, int64_t keep);
/* MTP drafts (cfg mtp: DeepSeek-V3's multi-token-prediction layer bound as layer
 * cfg_main_layers(c)). Every step also runs the MTP layer over its rows (its own
 * latent cache, one position behind the sequence: the last row's successor is
 * not known yet), never changing the step's logits or state. engine_mtp_step
 * then drafts: rows hold one sequence each (distinct) and the token after its
 * position pos - 1 + depth: depth 0 the token sampled from the last step's
 * logits, depth d > 0 the draft of depth d - 1 (the calls in depth order, no
 * step between them). The MTP predicts the token after that one from the main
 * model's final hidden state at pos - 1 (depth 0) or its own output of the
 * previous depth (chained drafts, as DeepSeek's and vLLM's MTP drafts),
 * writing one vocab-sized row of logits per row. The rows it writes past the
 * sequence's last position are rewritten by the next step; the sequence itself
 * (tokens, position, main state) is untouched. A sequence restored from a
 * snapshot or a state file drafts at once (the hidden row travels with it). */
int engine_has_mtp(const engine *e);
/* 1 when s can draft at depth 0 now: a position evaluated, room for the row. */
int session_mtp_ready(const session *s);
int engine_mtp_step(engine *e, const infer_row *rows, int64_t n, int64_t depth, float *logits);
/* Bytes session_create adds per sequence for spec_rows (snapshot + records). */
uint64_t infer_session_spec_bytes(const cfg *c, int64_t spec_rows);

/* A sequence's state at a position as memory regions, for snapshots (the prefix
 * cache): ids[pos] (int32), the KDA block of every KDA layer (conv history and
 * recurrent state at pos, one region), then each MLA layer's latent rows [0, pos)
 * (the MTP layer's last), then with cfg mtp the final hidden state at pos - 1.
 * Copying the regions out while s is at pos takes a snapshot; writing them back
 * (into any sequence of the engine with max_ctx >= pos) and then calling
 * session_restored(s, pos) makes that sequence continue exactly as the original
 * did from pos. Returns the number of regions (2 + MLA layers, + 1 with cfg mtp), or -1 when pos is
 * outside [0, max_ctx] or max is too small. */
typedef struct session_part { void *p; size_t n; } session_part;
int session_parts(session *s, int64_t pos, session_part *parts, int max);
void session_restored(session *s, int64_t pos);
int session_broken(const session *s); /* 1: failed during a step, unusable until reset */

/* Marks s unusable until session_reset (its state was partly updated). */
void session_mark_broken(session *s, const char *why);

/* State files (the chat REPL resumes with them). Byte layout, little-endian:
 *   "STRS" magic, u32 version (1), u64 config fingerprint (infer_cfg_fingerprint),
 *   i64 pos, i32 ids[pos], for each KDA layer in order: f32 conv[3][conv_k-1][P],
 *   f32 S[heads][D][D]; for each MLA layer in order: f32 cache[pos][kv_lora+rope];
 *   with cfg mtp (pos > 0) f32 hidden[hidden], the final hidden state at pos - 1;
 *   u64 fnv1a of everything before it.
 * Only occupied positions are stored, so a file loads into a session of any
 * max_ctx >= pos. save writes path.tmp.PID, fsyncs and renames. load refuses a
 * different fingerprint, a bad magic/version/checksum or pos > max_ctx, and leaves
 * the session reset on failure. */
int session_save(session *s, const char *path, char *err, size_t errlen);
int session_load(session *s, const char *path, char *err, size_t errlen);
uint64_t infer_cfg_fingerprint(const cfg *c);

/* Exact bytes (as requested from base_alloc) that session_create and engine_create
 * allocate, for the memory planner. n_threads 0 / prefill_chunk 0 mean the defaults
 * (the pool's own threads are not counted). */
uint64_t infer_session_bytes(const cfg *c, int64_t max_ctx);
uint64_t infer_engine_bytes(const cfg *c, int64_t prefill_chunk, int n_threads);
/* MLA latent cache bytes per position: n_mla x (kv_lora + qk_rope) x 4. */
uint64_t infer_mla_cache_bytes_per_pos(const cfg *c);

#endif
