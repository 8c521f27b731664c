/*
 * strata.h: the public boundary of strata, an inference engine for Kimi K3.
 *
 * strata runs a mixture-of-experts model whose checkpoint is far larger than RAM:
 * routed experts stay on disk and are read on demand, the always-used trunk is
 * pinned in RAM as far as the budget allows and streamed for the rest. The RAM
 * budget changes only the speed, never an output bit.
 *
 * Error convention: fallible calls return int, STRATA_OK (0) on success or a
 * negative STRATA_E* code; detail goes to a caller buffer (char *err, size_t errlen)
 * or the object's sticky message. Library code never exits.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stddef.h>
#include <stdint.h>

#define STRATA_VERSION "0.1.0"

enum strata_err {
    STRATA_OK = 0,
    STRATA_EIO = -1,      /* read/write failed, file missing */
    STRATA_ENOMEM = -2,   /* allocation failed */
    STRATA_EFORMAT = -3,  /* malformed or inconsistent input bytes */
    STRATA_EBUDGET = -4,  /* the RAM budget does not allow it */
    STRATA_EINVAL = -5,   /* bad argument from the caller */
    STRATA_EBUSY = -6,    /* resource in use */
    STRATA_ECORRUPT = -7, /* checksum mismatch */
};

/* Short static description of a STRATA_E* code ("format error", ...). */
const char *strata_errstr(int rc);

/* ==================================================================== models
 *
 * A model is one directory (config.json, safetensors shards, optional tokenizer
 * and pack) opened under a RAM budget. Opening validates the config and every
 * tensor, computes the memory plan for `max_seqs` sequences of `ctx` positions
 * and `rows` rows per pass, refuses a budget below the plan's minimum
 * (STRATA_EBUDGET; err names the minimum), then opens the weights (pinned,
 * streamed or resident, as planned) and the engine. Nothing in a model is shared
 * with another model: two models may be open in one process.
 *
 *     strata_model_opts o = strata_model_opts_default();
 *     o.ram_bytes = 4000000000;  o.max_seqs = 8;
 *     strata_model *m;
 *     if (strata_model_open(&m, "models/demo", err, sizeof err) ||
 *         strata_model_load(m, &o, err, sizeof err)) ... print err, close ...
 *     strata_seq *s;  strata_seq_create(m, &s, err, sizeof err);
 *     strata_row r[3] = {{s, 1, 0}, {s, 17, 0}, {s, 42, 1}};
 *     strata_step(m, r, 3, logits, err, sizeof err);   // logits of the last row
 *     strata_seq_free(s);  strata_model_close(m);
 *
 * Threading: a model and its sequences are single-caller objects (one call at a
 * time); the model's compute pool and I/O threads are its own. */

#include <stdio.h>

typedef struct strata_model strata_model;
typedef struct strata_seq strata_seq;
typedef struct strata_cluster strata_cluster;

/* strata-mpi sends this struct to its stages as bytes (src/mpi/cluster_mpi.c,
 * clu_load): a pointer field added here must be cleared there too. */
typedef struct strata_model_opts {
    uint64_t ram_bytes;      /* whole-process peak RSS budget; 0 = none (every weight read into RAM) */
    const char *pack_dir;    /* NULL = the model's own pack if there is one; "" = read in place */
    int64_t ctx;             /* positions per sequence; 0 = 4096 capped at the model's maximum */
    int max_seqs;            /* sequences held at once (each planned); 0 = 1 */
    int64_t rows;            /* rows per pass (prefill chunk / batch); 0 = 64; never lowered by the budget */
    int n_threads;           /* compute threads; 0 = physical cores */
    int plan_only;           /* 1: stop after the plan (strata_model_print_plan); no weights opened */
    int place;               /* 1: plan and stream even without a budget (as with a pack) */
    int no_verify;           /* 1: skip checksum verification of reads from a pack */
    int spec;                /* most drafted tokens a generator may verify per step (0 = no
                                speculation); each sequence then holds a KDA snapshot and
                                per-row replay records, counted in the plan */
    /* Prefix cache (see "prefix reuse" below). Off unless prefix_ram or prefix_dir. */
    uint64_t prefix_ram;     /* RAM for snapshots, counted in the plan; 0 = none;
                                STRATA_PREFIX_AUTO = two sequences' state; at a budget, at most
                                a quarter of what it leaves above its minimum (0 when that is
                                less than a snapshot of 256 positions), and 0 when prefix_dir
                                is given (snapshots then go to files, leaving RAM to the
                                weights) */
    const char *prefix_dir;  /* NULL = no disk tier; else snapshots leaving RAM (or larger
                                than it) are written here and read back on a later match */
    uint64_t prefix_dir_bytes; /* bound on this model's snapshot files there; 0 = 8 GB */
    int64_t prefix_every;    /* prompt positions between snapshots; 0 = 256 */
    int no_prefetch;         /* 1: no expert reads a layer ahead of the router (placed
                                models); outputs are the same bits either way */
    struct strata_cluster *cluster; /* NULL: this process holds the whole model; else this
                                process is one rank of a cluster (include/strata_mpi.h):
                                ram_bytes is each rank's own budget, and rank 0 loads the
                                model across every rank */
    int no_preload;          /* 1: no warm start. By default a placed model reads its pinned
                                trunk and fills its expert cache at load (all experts when
                                they fit, else the likeliest), with large reads in flight */
    void (*progress)(void *ud, uint64_t done, uint64_t total); /* the warm start's bytes */
    void *progress_ud;
    /* The identity's content hash (strata_model_info.identity): bytes of the shards
     * hashed so far, with progress_ud. Called only when the model has no usable
     * pack and no cached hash: the first load reads every weight byte once. */
    void (*hash_progress)(void *ud, uint64_t done, uint64_t total);
    /* Routed expert weights (STRATA_ROUTER_*): the unbiased sigmoid scores, as vLLM,
     * llama.cpp and K3's own code use (default), or STRATA_ROUTER_HF: the scores
     * plus e_score_correction_bias, as the Kimi Linear release's modeling_kimi.py
     * computes them. Part of the model's identity: states and prefix files of one
     * convention never load under the other. */
    int router;
    /* 1: bind the model's multi-token-prediction layer (DeepSeek-V3's
     * `model.layers.<num_hidden_layers>.*`; num_nextn_predict_layers >= 1) so that
     * generators can draft with it (strata_gen_opts.mtp_draft). It is planned and
     * streamed as one more layer and runs in every step (its own latent cache per
     * sequence); the model's output is the same bits with it. Refused, naming them,
     * when the config has none or its tensors are missing. 0: never read. */
    int mtp;
} strata_model_opts;

#define STRATA_ROUTER_DEFAULT 0  /* unbiased */
#define STRATA_ROUTER_UNBIASED 1
#define STRATA_ROUTER_HF 2

#define STRATA_PREFIX_AUTO UINT64_MAX

strata_model_opts strata_model_opts_default(void);

/* Opening is two calls. strata_model_open reads what is cheap and needed first:
 * config, shard headers, the binding check of every tensor, the tokenizer and the
 * end ids (headers only; no weight bytes). strata_model_load then plans and opens
 * the weights and the engine; the caller can tokenize a prompt in between to size
 * the context. Errors: STRATA_EFORMAT for a malformed model, STRATA_EIO, and from
 * load STRATA_EBUDGET below the minimum budget (err names the minimum); err says
 * which file and why. Close with strata_model_close (also after a failed load). */
int strata_model_open(strata_model **out, const char *dir, char *err, size_t errlen);
int strata_model_load(strata_model *m, const strata_model_opts *o, char *err, size_t errlen);
void strata_model_close(strata_model *m); /* accepts NULL; free its sequences first */

typedef struct strata_model_info {
    int64_t n_layers, n_mla, vocab, hidden, model_max_ctx;
    int64_t ctx, rows;         /* as opened */
    int max_seqs, n_threads;
    int placed;                /* 1: planned placement (budget or pack); 0: resident */
    int has_tokenizer;
    int mtp;                   /* 1: the MTP layer is bound (strata_model_opts.mtp; n_layers and
                                  n_mla count the model's own layers, the byte counts include it) */
    const char *kernel;        /* kernel table in use ("avx512", ...) */
    const char *arch;          /* the config's architecture ("k3", "kimi_linear", "deepseek_v3",
                                  "kimi_k2", "kimi_k25"); known once the model is open */
    int router_hf_ok;          /* 1: STRATA_ROUTER_HF applies (an architecture with Kimi Linear's router code) */
    double load_s;             /* seconds to open the weights */
    uint64_t mla_cache_bytes_per_pos, seq_bytes, engine_bytes;
    uint64_t budget_bytes, plan_bytes, min_bytes; /* 0 when not placed */
    uint64_t streamed_bytes;   /* trunk bytes read from disk by every pass (0 when resident) */
    uint64_t expert_bytes;     /* one routed expert as stored */
    uint64_t trunk_bytes;      /* every layer's non-expert tensors as stored */
    uint64_t head_bytes;       /* final vectors + lm_head as stored */
    uint64_t embed_row_bytes;  /* one embedding row as stored */
    uint64_t state_touch_bytes; /* KDA state a decode row reads and writes back per token (both counted, as the plan's touched bytes) */
    int64_t n_moe_layers, topk;
    int64_t n_expert_slots;    /* experts the cache holds (0 when resident) */
    double disk_bw, mem_bw;    /* bandwidths the plan used, bytes/s (0 when not placed) */
    char placement[256];       /* "placed: 3 of 9 trunk units pinned, ..." or "resident" */
    char weights_unverified[640]; /* non-empty: the model has a pack that cannot be used
                                     (why); the weights are read from the shards unchecked */
    uint64_t identity;         /* the model identity (config, tensor table, every weight
                                  byte) that state and prefix-cache files carry */
    const char *identity_source; /* how it was had: "the pack's record hashes", "the
                                    cached content hash", "a content hash of the shards" */
} strata_model_info;
void strata_model_get_info(const strata_model *m, strata_model_info *out);

/* The memory plan, as `strata plan` prints it (nothing when not placed). */
void strata_model_print_plan(const strata_model *m, FILE *f);

/* Reads and cache behaviour since open (or the last reset), defined once: each
 * counter is one line of these lists, which make the members of strata_stats
 * (and of the library's own place_stats / prefix_stats), the copies between
 * them, the "stats" and "prefix" objects of the --json report, the series of
 * `strata serve`'s /metrics and the columns of strata-mpi's per-rank table (all
 * through strata_stats_fields()). A new counter is a new line here.
 *
 * X(type, name, json, metric, col):
 *   type    u64, i64 or f64 (uint64_t, int64_t, double)
 *   name    the member (in STRATA_STATS_PREFIX: strata_stats has it as prefix_NAME)
 *   json    its key in the report's object (NULL: not in the report)
 *   metric  STRATA_METRIC(name, labels, gauge, help) or STRATA_NOMETRIC; series of one
 *           name take the HELP of their first line, in the order of the lists
 *   col     STRATA_COL(position, width, title, scale) in strata-mpi's per-rank table,
 *           or STRATA_NOCOL */
#define STRATA_METRIC(name, labels, gauge, help) name, labels, gauge, help
#define STRATA_NOMETRIC NULL, NULL, 0, NULL
#define STRATA_COL(pos, width, title, scale) pos, width, title, scale
#define STRATA_NOCOL 0, 0, NULL, 0.0

/* the weight sources: reads, the expert cache, checksums, prefetch (report object "stats") */
#define STRATA_STATS_IO(X) \
    X(u64, bytes_trunk, "bytes_trunk", STRATA_METRIC("strata_read_bytes_total", "what=\"trunk\"", 0, \
      "Bytes read from disk, by what."), STRATA_NOCOL) \
    X(u64, bytes_head, "bytes_head", STRATA_METRIC("strata_read_bytes_total", "what=\"head\"", 0, NULL), STRATA_NOCOL) \
    X(u64, bytes_embed, "bytes_embed", STRATA_METRIC("strata_read_bytes_total", "what=\"embed\"", 0, NULL), STRATA_NOCOL) \
    X(u64, bytes_experts, "bytes_experts", STRATA_METRIC("strata_read_bytes_total", "what=\"experts\"", 0, NULL), \
      STRATA_COL(4, 12, "experts GB", 1e9)) \
    X(u64, bytes_read, NULL, STRATA_NOMETRIC, STRATA_COL(3, 12, "read GB", 1e9)) /* the four above together */ \
    X(u64, n_reads, "n_reads", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(f64, read_s, "read_s", STRATA_NOMETRIC, STRATA_NOCOL)     /* wall seconds with at least one read in flight */ \
    X(f64, wait_s, "wait_s", STRATA_NOMETRIC, STRATA_NOCOL)     /* seconds the caller blocked on I/O */ \
    X(f64, read_bw, "bw", STRATA_NOMETRIC, STRATA_NOCOL)        /* bytes read / read_s */ \
    X(u64, layer_gets, "layer_gets", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, layer_gets_pinned, "layer_gets_pinned", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, expert_requests, "expert_requests", STRATA_METRIC("strata_expert_requests_total", "", 0, \
      "Expert lookups in the expert cache."), STRATA_NOCOL) \
    X(u64, expert_hits, "expert_hits", STRATA_METRIC("strata_expert_hits_total", "", 0, \
      "Expert lookups served from the cache."), STRATA_NOCOL) \
    X(u64, expert_misses, "expert_misses", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, expert_evictions, "expert_evictions", STRATA_NOMETRIC, STRATA_NOCOL) \
    /* TRUE resident: hits on experts resident before the request */ \
    X(f64, hit_rate, "hit_rate", STRATA_METRIC("strata_expert_hit_rate", "", 1, "Expert cache hit rate since start."), \
      STRATA_NOCOL) \
    X(u64, peak_rss, "peak_rss", STRATA_METRIC("strata_peak_rss_bytes", "", 1, "Peak resident set size."), \
      STRATA_COL(7, 10, "peak RSS GB", 1e9)) /* getrusage */ \
    X(u64, verify_bytes, "verify_bytes", STRATA_NOMETRIC, STRATA_NOCOL) /* bytes checked against the pack's XXH3 */ \
    X(f64, verify_s, "verify_s", STRATA_NOMETRIC, STRATA_NOCOL)  /* thread-seconds spent hashing them (any thread) */ \
    /* of them: matrix blocks hashed by the compute threads as used (wblk.h), and their time */ \
    X(u64, verify_blk_bytes, NULL, STRATA_NOMETRIC, STRATA_NOCOL) \
    X(f64, verify_blk_s, NULL, STRATA_NOMETRIC, STRATA_NOCOL) \
    /* reads a layer ahead: layers whose experts were predicted before their request, experts \
     * requested in those layers, of them predicted, experts predicted (distinct per layer), \
     * guesses skipped (their layer all held, or its last ones read nothing) */ \
    X(u64, pred_layers, "pred_layers", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, pred_requests, "pred_requests", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, pred_hits, "pred_hits", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, pred_ids, "pred_ids", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, pred_skipped, "pred_skipped", STRATA_NOMETRIC, STRATA_NOCOL) \
    /* MXFP4 router copies made (counted since open), guesses lent one */ \
    X(i64, guess_copies, "guess_copies", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, guess_lends, "guess_lends", STRATA_NOMETRIC, STRATA_NOCOL) \
    /* read by the warm start at open (kept by a reset) */ \
    X(u64, preload_bytes, "preload_bytes", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(f64, preload_s, "preload_s", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(i64, preload_experts, "preload_experts", STRATA_NOMETRIC, STRATA_NOCOL) \
    /* experts read ahead (the rest of the predictions were resident), of them requested afterwards */ \
    X(u64, prefetch_reads, "prefetch_reads", STRATA_NOMETRIC, STRATA_NOCOL) \
    X(u64, prefetch_used, "prefetch_used", STRATA_NOMETRIC, STRATA_NOCOL)

/* self-draft passes (strata_gen_opts.self_draft) and what they could use: layers run
 * of those visited, experts in RAM of those chosen (not in the report) */
#define STRATA_STATS_DRAFT(X) \
    X(i64, draft_passes, NULL, STRATA_NOMETRIC, STRATA_NOCOL) \
    X(i64, draft_layers, NULL, STRATA_NOMETRIC, STRATA_NOCOL) \
    X(i64, draft_layers_run, NULL, STRATA_NOMETRIC, STRATA_NOCOL) \
    X(i64, draft_experts, NULL, STRATA_NOMETRIC, STRATA_NOCOL) \
    X(i64, draft_experts_used, NULL, STRATA_NOMETRIC, STRATA_NOCOL)

/* the prefix cache (report object "prefix"; strata_stats members prefix_NAME) */
#define STRATA_STATS_PREFIX(X) \
    X(u64, lookups, "lookups", STRATA_METRIC("strata_prefix_lookups_total", "", 0, \
      "Requests that looked for a cached prefix of their prompt."), STRATA_NOCOL) /* restores attempted */ \
    X(u64, hits, "hits", STRATA_NOMETRIC, STRATA_NOCOL) /* restores that found a prefix */ \
    X(u64, ram_hits, NULL, STRATA_METRIC("strata_prefix_hits_total", "tier=\"ram\"", 0, \
      "Requests that started from a cached prefix, by where it was."), STRATA_NOCOL) /* of them, from RAM */ \
    X(u64, disk_hits, "disk_hits", STRATA_METRIC("strata_prefix_hits_total", "tier=\"disk\"", 0, NULL), \
      STRATA_NOCOL) /* of them, read from the disk tier */ \
    X(u64, tokens, "tokens_reused", STRATA_METRIC("strata_prefix_tokens_reused_total", "", 0, \
      "Prompt tokens restored from the prefix cache instead of evaluated."), STRATA_NOCOL) /* positions restored */ \
    X(u64, stores, "stores", STRATA_METRIC("strata_prefix_snapshots_stored_total", "", 0, \
      "Snapshots of sequences kept by the prefix cache."), STRATA_NOCOL) /* snapshots kept (RAM or disk) */ \
    X(u64, spills, "spills", STRATA_NOMETRIC, STRATA_NOCOL) /* files written */ \
    X(u64, rejected, "rejected", STRATA_METRIC("strata_prefix_files_refused_total", "", 0, \
      "Snapshot files refused on reading (damaged, another model's)."), STRATA_NOCOL) /* files refused */ \
    X(u64, failed, NULL, STRATA_NOMETRIC, STRATA_NOCOL) /* stores or spills that could not be written */ \
    X(u64, disk_read, "disk_read_bytes", STRATA_METRIC("strata_prefix_disk_bytes_total", "op=\"read\"", 0, \
      "Bytes of snapshot files, by direction."), STRATA_NOCOL) \
    X(u64, disk_written, "disk_written_bytes", STRATA_METRIC("strata_prefix_disk_bytes_total", "op=\"written\"", 0, \
      NULL), STRATA_NOCOL) \
    /* held now and the bounds */ \
    X(u64, ram_used, "ram_used_bytes", STRATA_METRIC("strata_prefix_bytes", "tier=\"ram\"", 1, \
      "Bytes the prefix cache holds now, by tier."), STRATA_NOCOL) \
    X(u64, ram_bytes, "ram_bytes", STRATA_METRIC("strata_prefix_capacity_bytes", "tier=\"ram\"", 1, \
      "Bounds of the prefix cache, by tier."), STRATA_NOCOL) \
    X(u64, disk_used, "disk_used_bytes", STRATA_METRIC("strata_prefix_bytes", "tier=\"disk\"", 1, NULL), STRATA_NOCOL) \
    X(u64, dir_bytes, "dir_bytes", STRATA_METRIC("strata_prefix_capacity_bytes", "tier=\"disk\"", 1, NULL), \
      STRATA_NOCOL) \
    X(i64, n_ram, NULL, STRATA_NOMETRIC, STRATA_NOCOL) /* snapshots held in RAM */ \
    X(i64, n_disk, NULL, STRATA_NOMETRIC, STRATA_NOCOL) /* and on disk */

#define STRATA_STAT_CTYPE_u64 uint64_t
#define STRATA_STAT_CTYPE_i64 int64_t
#define STRATA_STAT_CTYPE_f64 double
#define STRATA_STAT_MEMBER(t, n, json, metric, col) STRATA_STAT_CTYPE_##t n;
#define STRATA_STAT_PREFIX_MEMBER(t, n, json, metric, col) STRATA_STAT_CTYPE_##t prefix_##n;

typedef struct strata_stats {
    STRATA_STATS_IO(STRATA_STAT_MEMBER)
    STRATA_STATS_DRAFT(STRATA_STAT_MEMBER)
    STRATA_STATS_PREFIX(STRATA_STAT_PREFIX_MEMBER)
} strata_stats;
void strata_model_get_stats(strata_model *m, strata_stats *out);
void strata_model_reset_stats(strata_model *m);

/* One counter of strata_stats, for front-ends that walk them all. */
enum { STRATA_STAT_u64 = 0, STRATA_STAT_i64 = 1, STRATA_STAT_f64 = 2 };
typedef struct strata_stat_field {
    const char *name;     /* the strata_stats member ("prefix_lookups") */
    size_t offset;        /* offsetof(strata_stats, member) */
    int type;             /* STRATA_STAT_u64, _i64, _f64 */
    const char *section;  /* the --json report's object: "stats", "prefix" (NULL: none) */
    const char *json;     /* key there (NULL: not in the report) */
    const char *metric;   /* /metrics series name (NULL: not exported) */
    const char *labels;   /* its label set ("tier=\"ram\""; "" none) */
    int gauge;            /* 1: gauge, 0: counter */
    const char *help;     /* HELP text (NULL on a name's later series) */
    int col, col_width;   /* strata-mpi per-rank table: column (0: none), width */
    const char *col_title;
    double col_scale;     /* printed as value / col_scale, 3 decimals */
} strata_stat_field;
/* Every counter in the order of the lists; *n gets their number. */
const strata_stat_field *strata_stats_fields(int *n);
/* A counter's value as a double (f64 as is; integers converted). */
double strata_stat_value(const strata_stats *s, const strata_stat_field *f);
/* The placement report lines (reads, hit rate, I/O wait, peak RSS vs budget). */
void strata_model_print_report(strata_model *m, FILE *f);
/* {"plan": {...}, "stats": {...}} or {"plan": "resident"}: JSON text, release
 * with strata_free. NULL on allocation failure. */
char *strata_model_report_json(strata_model *m);
void strata_free(void *p);

/* ============================================================== sequences
 *
 * A sequence is one conversation's state: KDA conv + recurrent state, MLA latent
 * cache, position and token history. At most max_seqs exist at once
 * (STRATA_EBUSY beyond). */
int strata_seq_create(strata_model *m, strata_seq **out, char *err, size_t errlen);
void strata_seq_free(strata_seq *s);      /* accepts NULL */
void strata_seq_reset(strata_seq *s);     /* back to the empty sequence */
int64_t strata_seq_pos(const strata_seq *s);
const int32_t *strata_seq_tokens(const strata_seq *s); /* pos ids; valid until the next step/reset/load */
const char *strata_seq_errmsg(const strata_seq *s);
/* State files: carry the model's fingerprint; save is atomic (temp + rename);
 * load checks the whole file first and leaves the sequence unchanged when it
 * refuses it; a read that fails after that (an I/O error, the file replaced
 * between the two passes) leaves the sequence empty, and the message says so. */
int strata_seq_save(strata_seq *s, const char *path, char *err, size_t errlen);
/* dst becomes an exact copy of src (position, token history, KDA conv and
 * recurrent state, MLA cache rows): both continue bit-identically. Both of one
 * model; STRATA_EINVAL for a broken src or a model spread over a cluster. */
int strata_seq_copy(strata_seq *dst, strata_seq *src, char *err, size_t errlen);
int strata_seq_load(strata_seq *s, const char *path, char *err, size_t errlen);

/* Prefix reuse. A model loaded with a prefix cache keeps snapshots of sequences'
 * state: the token ids, the KDA conv + recurrent state at exactly that position
 * and the MLA latent rows before it. Generators store them on their own (every
 * prefix_every prompt positions, at the end of the prompt and at the end of the
 * generation) and start from the longest one that the prompt extends, so a chat
 * that re-sends its history evaluates only the new tokens. A sequence continued
 * from a snapshot gives bit-identical logits and tokens to a full re-prefill.
 * Snapshots live in RAM (least recently used leave first) and, with prefix_dir,
 * in files there (written atomically, tied to the model's identity, checked when
 * read; a bad file is refused with a warning on the log and counts as a miss).
 *
 * strata_seq_prefix_store keeps a snapshot of s at its current position (0, or a
 * negative code when it could not be kept: not fatal). strata_seq_prefix_restore
 * resets s and restores the longest snapshot of a prefix of ids[0, n) (at most n
 * positions: pass n - 1 to leave a token whose logits the next step gives);
 * returns the positions restored (0: none; s is then empty) or a negative code.
 * Both: STRATA_EINVAL without a prefix cache. */
int strata_seq_prefix_store(strata_seq *s, char *err, size_t errlen);
int64_t strata_seq_prefix_restore(strata_seq *s, const int32_t *ids, int64_t n, char *err, size_t errlen);

/* =================================================================== steps
 *
 * A step evaluates rows of several sequences together: each weight is read once
 * per pass of at most `rows` rows for all of them (the trunk once, the union of
 * the experts any row chose once). The rows of one sequence are consecutive and
 * continue it in order. For each row with logits != 0 one vocab-sized row of
 * float logits is written to `logits`, in row order.
 * Batch invariance: a sequence's logits and state are bit-identical whatever
 * else is in the step, where, how rows split into passes, at any budget and
 * thread count. A bad row (id outside the vocabulary, a full context, a
 * sequence given twice) fails the step before anything runs; a failure while
 * running (I/O, checksum, non-finite values) breaks every sequence of the step
 * until strata_seq_reset. */
typedef struct strata_row {
    strata_seq *seq;
    int32_t token;
    int32_t logits;          /* 1: this row's logits are wanted */
} strata_row;
int strata_step(strata_model *m, const strata_row *rows, int64_t n, float *logits, char *err, size_t errlen);

/* ============================================================== generation
 *
 * A generator drives one sequence from a prompt to its end: prefill, then one
 * sampled token per step, stop ids, streamed text. strata_gen_step advances
 * several generators in one step (decode rows first, then prompt rows up to the
 * model's rows per pass), so concurrent users share every weight read. The
 * random draw for position p depends only on (seed, p): a sequence samples the
 * same tokens alone or batched. */
typedef struct strata_gen strata_gen;

typedef struct strata_gen_opts {
    double temp;             /* 0 = greedy (ties to the lowest id) */
    int64_t top_k;           /* 0 = off */
    double top_p;            /* (0, 1]; 1 = off */
    double min_p;            /* [0, 1]; 0 = off */
    double repeat_penalty;   /* > 0; 1 = off */
    int64_t repeat_last_n;   /* penalty window; 0 = whole history */
    uint64_t seed;
    int64_t max_tokens;      /* tokens to generate (>= 1) */
    int stop_at_end;         /* 1: stop at the model's end ids (config + tokenizer_config.json) */
    int want_text;           /* 1: stream detokenized text (needs the tokenizer) */
    int want_logits;         /* 1: keep each sampled position's logits for the callback */
    /* Speculation (needs the model loaded with spec >= 1): up to `spec` drafted
     * tokens are verified with the next token in one step; the longest prefix the
     * model agrees with is kept, the rest rolled back exactly. The output (ids and
     * logits bits) is identical with and without it, sampled output included.
     * Drafts come from draft_ids (a proposed continuation of the generated ids:
     * draft_ids[i] proposes generated token i) when given, else from the longest
     * recent n-gram of the prompt and generated text that occurred before. The
     * draft length adapts to the acceptance and turns itself off while drafts fail. */
    int spec;
    const int32_t *draft_ids;  /* copied at create */
    int64_t n_draft_ids;
    /* 1: drafts from the model itself evaluated on what is already in RAM (the
     * layers pinned by the plan, the experts in the cache; the rest skipped), a
     * pass that reads nothing from disk; n-grams where the placement cannot
     * (strata_model_info.can_self_draft 0: a resident model, or a streamed head). */
    int self_draft;
    /* 1: drafts from the MTP layer (the model loaded with strata_model_opts.mtp):
     * the first from the model's last hidden state and the sampled token, the
     * next ones chained on the MTP's own output. Excludes self_draft. */
    int mtp_draft;
    /* Ids that also end the generation (at most 16, copied at create), besides
     * the model's end ids when stop_at_end: a chat front-end's end-of-message. */
    const int32_t *stop_ids;
    int n_stop_ids;
    int prefix;              /* 1 (default): with a prefix cache, start from the longest
                                snapshot the prompt extends (not with continue_seq) and
                                store snapshots of this sequence; 0: neither */
    /* Constrained decoding (see "structured output" below): NULL, or a grammar the
     * generated text must follow (borrowed: it must outlive the generator; needs
     * the model's tokenizer). At each step the ids whose bytes cannot continue a
     * document get -inf after the repetition penalty and before the temperature;
     * the end ids (stop_at_end's and stop_ids) are allowed only once the document
     * is complete, and then only they. Drafted tokens are checked against the
     * same mask (a draft outside it is never what the draw chose), so output bits
     * are the same with and without speculation, alone or batched. */
    const struct strata_grammar *grammar;
    /* Log-probabilities (strata_gen_logprob): 1: each sampled token's, and the
     * top_logprobs (0..STRATA_MAX_TOP_LOGPROBS) likeliest alternatives'. */
    int logprobs;
    int top_logprobs;
} strata_gen_opts;
#define STRATA_MAX_TOP_LOGPROBS 20
strata_gen_opts strata_gen_opts_default(void);

/* Called for each generated token: its id, the text it completes (may be empty
 * while a UTF-8 sequence is split), and its logits (NULL unless want_logits). */
typedef void (*strata_token_fn)(void *ud, strata_gen *g, int32_t id, const char *text, size_t len, const float *logits);

/* A generator over seq (borrowed; reset first unless continue_seq = 1) with a
 * copied prompt. Allocates everything it needs now. */
int strata_gen_create(strata_gen **out, strata_seq *seq, const int32_t *prompt, int64_t n_prompt,
                      const strata_gen_opts *o, int continue_seq, char *err, size_t errlen);
void strata_gen_free(strata_gen *g);  /* accepts NULL */
/* One step over the unfinished generators of gens[0 .. n). Returns the number
 * still unfinished (0: all done) or a negative STRATA_E* code. */
int strata_gen_step(strata_model *m, strata_gen *const *gens, int n, strata_token_fn cb, void *ud,
                    char *err, size_t errlen);
int strata_gen_done(const strata_gen *g);
int strata_gen_stopped(const strata_gen *g);           /* 1: ended on an end id */
int64_t strata_gen_prefilled(const strata_gen *g);     /* prompt tokens evaluated so far */
const int32_t *strata_gen_ids(const strata_gen *g, int64_t *n); /* generated ids so far */
void strata_gen_set_user(strata_gen *g, void *user);
void *strata_gen_user(const strata_gen *g);
uint64_t strata_gen_logits_hash(const strata_gen *g);  /* FNV-1a of every logits row produced */
/* Prompt tokens restored from the prefix cache instead of evaluated (<= n_prompt - 1). */
int64_t strata_gen_reused(const strata_gen *g);
/* Inside the token callback (opts.logprobs): the log-probability of the token
 * just reported and of the top_logprobs likeliest ids (prob desc, id asc) into
 * top_ids / top_lp (room for top_logprobs); returns how many were written, or -1
 * without opts.logprobs. The distribution is the log-softmax of the logits the
 * sampler chose from after the repetition penalty and any token mask, before
 * temperature, top-k, top-p and min-p (so a greedy draw's token is the top one).
 * A masked-out id's value is -inf. */
int strata_gen_logprob(const strata_gen *g, double *lp, int32_t *top_ids, double *top_lp);
/* Speculation counts: tokens drafted, drafted tokens accepted, verification steps. */
void strata_gen_spec_stats(const strata_gen *g, int64_t *drafted, int64_t *accepted, int64_t *verifies);

/* ======================================================== structured output
 *
 * A grammar is a compiled JSON schema: immutable, shareable between generators
 * and threads. The language it generates (docs/serve.md "Structured output"):
 * properties in schema order, optional ones maybe left out, no others; keys and
 * enum/const values in compact JSON text; at most 16 whitespace bytes (space,
 * tab, LF) in a row; numbers of at most 15 + 15 digits; strings of well-formed
 * UTF-8. Supported keywords: type (a name or a list), properties, required,
 * additionalProperties, enum, const, items, minItems, maxItems, minLength,
 * maxLength, anyOf / oneOf of different JSON types, local $ref (recursion
 * allowed), and annotations (title, description, default, ...). Any other
 * keyword is STRATA_EINVAL naming it ("json schema at #/properties/x:
 * unsupported keyword 'pattern'"). */
typedef struct strata_grammar strata_grammar;
struct json_t;
/* From the schema's JSON text (len bytes). STRATA_EINVAL (bad JSON, an
 * unsupported keyword, an unsatisfiable or oversized schema), STRATA_ENOMEM. */
int strata_grammar_json_schema(strata_grammar **out, const char *schema, size_t len, char *err, size_t errlen);
/* The same from a parsed schema (a jansson tree: a response_format's schema, a
 * tool's "parameters"). */
int strata_grammar_json_schema_tree(strata_grammar **out, const struct json_t *schema, char *err, size_t errlen);
/* Any JSON object (response_format {"type": "json_object"}). */
int strata_grammar_json_object(strata_grammar **out, char *err, size_t errlen);
void strata_grammar_free(strata_grammar *g); /* accepts NULL */
/* The grammar of a forced tool call (tools->choice REQUIRED or NAMED; *out NULL
 * otherwise) in t's chat format, for the tokens after the prompt that
 * strata_chat_render_tools rendered with the same tools: a declared name (NAMED:
 * that one), arguments that are a document of the tool's parameters (every
 * forced call; a schema that cannot be enforced is STRATA_EINVAL for a strict
 * tool, any JSON object otherwise), with parallel calls (REQUIRED only) up to 8
 * calls, then the end of the turn. calls_before: the calls in the history.
 * Special-token markers match only their ids. Needs the generator's end ids
 * (stop_at_end). docs/serve.md "Tool calls". */
struct strata_tokenizer;
struct strata_chat_tools;
int strata_grammar_tools(strata_grammar **out, const struct strata_tokenizer *t, const struct strata_chat_tools *tools,
                         size_t calls_before, char *err, size_t errlen);
/* Whether bytes are a document of g: 1 a whole one, 0 a proper prefix of one,
 * -1 neither (tests, diagnostics). */
int strata_grammar_check(const strata_grammar *g, const void *bytes, size_t n);

/* ============================================================== tokenizer */

/* Text -> ids (no special tokens recognised unless allow_special). *ids is
 * released with strata_free. STRATA_EINVAL when the model has no tokenizer. */
int strata_tokenize(strata_model *m, const char *text, size_t len, int allow_special, int32_t **ids, size_t *n,
                    char *err, size_t errlen);
/* Longest token in bytes (0 without a tokenizer): a text of B bytes has at least
 * B / this many tokens, so an oversized prompt is refused before tokenizing. */
size_t strata_token_max_bytes(const strata_model *m);
/* The model's end ids (at most max), from config.json and tokenizer_config.json. */
int strata_end_ids(const strata_model *m, int32_t *ids, int max);

/* ===================================================================== plans
 *
 * The memory plan without loading weights (`strata plan`): where every byte goes
 * under a RAM budget (pinned trunk layers, stream arena, expert cache,
 * embeddings, sequences, scratch), the predicted decode s/token from this
 * machine's disk and memory bandwidth, and the trade between sequence slots and
 * weights for 1..16 sequences; with ranks, the layer split of a cluster of
 * pipeline stages (strata-mpi), each rank's plan and the predicted tokens/s. */
#define STRATA_PLAN_DEFAULT_CHUNK 64

typedef struct strata_plan_opts {
    const char *model_dir;   /* a model directory, or NULL ... */
    const char *config;      /* ... and a config.json alone */
    const char *pack_dir;    /* NULL: the model's own pack, if any */
    uint64_t ram_bytes;      /* the budget (> 0); each rank's with ranks */
    int64_t ctx;             /* positions per sequence; 0 = 4096 */
    int64_t chunk;           /* prefill chunk (rows per pass) */
    int threads;             /* compute threads; 0 = physical cores */
    int seqs;                /* sequences held at once; 0 = 1 */
    int policy;              /* expert cache policy (strata_plan_policy); -1 = default (layer) */
    int json;                /* 1: the plan as JSON (no sequence table) */
    int measure;             /* 1: measure disk and memory bandwidth now (else cached) */
    int ranks;               /* > 0: plan a cluster of this many ranks */
    double disk_gbs, mem_gbs;/* ranks: bandwidths in GB/s; 0 = measured or cached */
    double net_gbs, lat_us;  /* ranks: network GB/s and one message's latency in us */
    int net_given, lat_given;/* 1: net_gbs / lat_us given, not to be measured */
    /* ranks: measures the network between the ranks of a running cluster
     * (net_ranks >= 2), bytes/s and seconds; NULL: not measured */
    int (*measure_net)(void *ud, double *bw, double *lat, char *err, size_t errlen);
    void *net_ud;
    int net_ranks;
} strata_plan_opts;
strata_plan_opts strata_plan_opts_default(void);
/* "layer", "lfu", "s3fifo", "lru" -> a policy for strata_plan_opts, or -1. */
int strata_plan_policy(const char *name);

/* Writes the plan to out. STRATA_EBUDGET: the budget is below the minimum (err
 * names the minimum), or a rank of the cluster does not fit (err empty: out
 * says so); STRATA_EINVAL: bad options (more ranks than layers); any other code:
 * the model or config could not be read or does not match (err says why). */
int strata_plan(const strata_plan_opts *o, FILE *out, char *err, size_t errlen);

/* ===================================================================== packs
 *
 * A pack is the streaming layout of a model (`strata pack`): its trunk rewritten
 * so each layer is one 4096-aligned read (trunk.bin) and a manifest.json with an
 * XXH3 checksum per layer and per expert; experts stay in place in the shards.
 * Its default place is MODEL_DIR/STRATA_PACK_DIRNAME; strata_model_load finds it.
 * Progress: the phase ("trunk", "source", "experts"), its bytes done and total,
 * and the seconds since the phase began. */
#define STRATA_PACK_DIRNAME "strata.pack"
typedef void (*strata_pack_progress_fn)(void *ud, const char *phase, uint64_t done, uint64_t total, double secs);

#define STRATA_PACK_FORCE 1   /* rebuild even an up-to-date pack (or one with an unreadable manifest) */
#define STRATA_PACK_MEASURE 2 /* first measure the disk's write bandwidth in the pack's directory */

typedef struct strata_pack_result {
    int started;              /* 1: the model was read and packing (or checking) began */
    int already;              /* 1: an identical pack existed; nothing written */
    char dir[1024];           /* the pack's directory */
    char stale[900];          /* build: the pack there was stale (why) and was rebuilt; verify:
                                 why the shards no longer match the pack's stamps ("" if they do) */
    uint64_t trunk_bytes;     /* the trunk, as packed */
    double trunk_secs, write_bw;  /* build: trunk written in, bytes/s (open to fsync) */
    double disk_bw;           /* STRATA_PACK_MEASURE: the disk's write bandwidth just before; else 0 */
    uint64_t src_direct_bytes, src_cached_bytes; /* trunk source read from disk / from the page cache */
    uint64_t expert_bytes_hashed;
    double expert_secs;
    int64_t n_experts;        /* verify: experts checked */
    double secs;              /* verify: seconds in all */
} strata_pack_result;

/* Writes the pack of model_dir into out_dir (NULL: the default); flags
 * STRATA_PACK_*. An up-to-date pack is left alone (res->already); a stale pack of
 * this model is rebuilt; a directory holding another model's pack is refused,
 * even with STRATA_PACK_FORCE; a second writer gets STRATA_EBUSY. */
int strata_pack_build(const char *model_dir, const char *out_dir, int flags, strata_pack_progress_fn progress, void *ud,
                      strata_pack_result *res, char *err, size_t errlen);
/* Re-reads the pack (pack_dir, or NULL: the one strata_model_load would use) and
 * checks every checksum: trunk.bin against the manifest, and the model's shards
 * against it; a stale pack is checked all the same (res->stale says why it is).
 * STRATA_ECORRUPT (or another code) with err naming the first record that differs. */
int strata_pack_verify(const char *model_dir, const char *pack_dir, strata_pack_progress_fn progress, void *ud,
                       strata_pack_result *res, char *err, size_t errlen);

/* ================================================================== inspect
 *
 * What a model is before anything is loaded (`strata inspect`): the config
 * summary, the layer map, parameters and bytes by class, and for a model
 * directory the checkpoint facts (shards, tensors, layout) and every binding
 * problem; with scan, every weight read for non-finite values and MXFP4 scale
 * bytes of 255. A broken model is a report with problems, not a failure. */
typedef struct strata_inspect_opts {
    const char *model_dir;   /* a model directory, or NULL ... */
    const char *config;      /* ... and a config.json alone (no weights) */
    int json;                /* 1: one JSON object instead of the human report */
    int scan;                /* 1: read every weight (model_dir only) */
    /* the scans' progress ("float tensors", "expert scales"); may be NULL */
    void (*progress)(void *ud, const char *what, int64_t done, int64_t total);
    void *progress_ud;
} strata_inspect_opts;

typedef struct strata_inspect_result {
    int n_problems;          /* 0: a sound model */
    int listed;              /* 1: the report on out already lists the problems */
    char *problems;          /* one problem per line ("" when none); release with strata_free */
} strata_inspect_result;

/* Writes the report to out. STRATA_OK when it was made (whatever the model's
 * problems), else STRATA_EINVAL (neither or both of model_dir and config, scan
 * without model_dir) or STRATA_ENOMEM, with err set. */
int strata_inspect(const strata_inspect_opts *o, FILE *out, strata_inspect_result *res, char *err, size_t errlen);

/* ============================================================ tokenizer files
 *
 * A tokenizer opened on its own, without a model (`strata tokenize`, the
 * tokenizer benchmark): a tiktoken.model vocabulary (base64 token, space, rank
 * per line) and optionally a tokenizer_config.json whose added_tokens_decoder
 * entries become special tokens; or a Hugging Face tokenizer.json byte-level BPE
 * (DeepSeek-V3), encoding as Hugging Face tokenizers does (docs/architecture.md,
 * "Tokenizers and chat formats"). Read-only once open: encode and decode may be
 * called from several threads at once. */
typedef struct strata_tokenizer strata_tokenizer;

/* Pre-tokenizer split patterns. */
enum strata_tok_pattern { STRATA_TOK_KIMI = 0, STRATA_TOK_O200K = 1, STRATA_TOK_CL100K = 2 };
/* "kimi" | "o200k" | "cl100k" -> STRATA_TOK_*, or -1. */
int strata_tokenizer_pattern(const char *name);
/* config may be NULL. A vocab_path ending in ".json" is a tokenizer.json (pattern
 * is then unused; config gives add_bos_token and chat_template). Errors
 * (STRATA_EIO, STRATA_EFORMAT, STRATA_ENOMEM) name the file and line or JSON
 * path. Close with strata_tokenizer_close. */
int strata_tokenizer_open(strata_tokenizer **out, const char *vocab_path, const char *config_path, int pattern,
                          char *err, size_t errlen);
/* The tokenizer of a model directory: tiktoken.model (Kimi) when there is one,
 * else tokenizer.json; tokenizer_config.json beside it when present. */
int strata_tokenizer_open_dir(strata_tokenizer **out, const char *dir, char *err, size_t errlen);
/* The id Hugging Face's encode(add_special_tokens=True) puts first (a
 * tokenizer.json post-processor's BOS unless add_bos_token is false), or -1.
 * strata_tokenizer_encode never adds it. */
int32_t strata_tokenizer_bos(const strata_tokenizer *t);
void strata_tokenizer_close(strata_tokenizer *t); /* accepts NULL */
/* Bytes -> ids (special-token text stays text unless allow_special). *ids is
 * released with strata_free; on failure strata_tokenizer_errmsg may say why. */
int strata_tokenizer_encode(strata_tokenizer *t, const void *text, size_t len, int allow_special, int32_t **ids,
                            size_t *n);
const char *strata_tokenizer_errmsg(const strata_tokenizer *t); /* "" when none */
/* Ids -> the exact bytes (*out released with strata_free). */
int strata_tokenizer_decode(const strata_tokenizer *t, const int32_t *ids, size_t n, uint8_t **out, size_t *len);
int32_t strata_tokenizer_n_vocab(const strata_tokenizer *t);
/* The bytes of one id, or NULL for an id that has none (a hole in the ranks). */
const uint8_t *strata_tokenizer_token_bytes(const strata_tokenizer *t, int32_t id, size_t *len);

/* =============================================================== chat format
 *
 * The Kimi K3 chat template on a tokenizer opened with strata_tokenizer_open
 * (pattern STRATA_TOK_KIMI, the model's tiktoken.model and
 * tokenizer_config.json): messages rendered to ids, and a follower that splits a
 * reply streamed id by id into its think and response channels. Control markers
 * are encoded as special tokens, every text piece with special tokens disabled,
 * so text typed by a user can never become a control id. */
enum strata_chat_role { STRATA_CHAT_SYSTEM = 0, STRATA_CHAT_USER = 1, STRATA_CHAT_ASSISTANT = 2, STRATA_CHAT_TOOL = 3 };
/* OFF: no thinking-effort message and no think channel (reasoning of earlier
 * assistant turns is dropped, as the official encoder does). */
enum strata_chat_effort { STRATA_CHAT_THINK_OFF = 0, STRATA_CHAT_THINK_LOW = 1, STRATA_CHAT_THINK_HIGH = 2,
                          STRATA_CHAT_THINK_MAX = 3 };
/* Render flags: GEN appends the generation prompt; CONTINUE renders a
 * continuation of a conversation already rendered (no thinking-effort message). */
enum { STRATA_CHAT_GEN = 1, STRATA_CHAT_CONTINUE = 2 };
/* The channel a followed reply's text belongs to. TOOLS: K3's tools channel,
 * its tags spelled as text (for strata_tool_parser). */
enum { STRATA_CHAT_CH_NONE = 0, STRATA_CHAT_CH_THINK = 1, STRATA_CHAT_CH_RESPONSE = 2, STRATA_CHAT_CH_TOOLS = 3 };

/* One tool call of an assistant turn (no API's JSON shape: any front end fills it). */
typedef struct strata_chat_call {
    const char *name;      /* the tool */
    const char *args;      /* its arguments as JSON text (an object; any text renders) */
} strata_chat_call;

typedef struct strata_chat_msg {
    int role;              /* STRATA_CHAT_SYSTEM, _USER, _ASSISTANT, _TOOL */
    const char *content;   /* UTF-8, NUL-terminated, not NULL */
    const char *reasoning; /* assistant only; NULL renders an empty think channel */
    const strata_chat_call *calls; /* assistant only: its tool calls (n_calls) */
    size_t n_calls;
    size_t call_of;        /* _TOOL: the call it answers, numbered 0, 1, ... over every
                            * call of the earlier assistant messages in order */
} strata_chat_msg;

/* A declared tool (name [A-Za-z0-9_-]{1,64}; description and the JSON-schema
 * parameters as JSON text may be NULL). strict: a schema that cannot be
 * enforced is an error (strata_grammar_tools) rather than any JSON object. Only
 * forced calls are constrained: with tool_choice AUTO the arguments are what the
 * model writes, strict or not (docs/serve.md "Tool calls"). */
typedef struct strata_chat_tool {
    const char *name, *description, *parameters;
    int strict;
} strata_chat_tool;
/* tool_choice: AUTO the model chooses; NONE the tools are declared but no call is
 * read; REQUIRED / NAMED force a call (the generation prompt opens it). */
enum { STRATA_CHAT_TOOLS_AUTO = 0, STRATA_CHAT_TOOLS_NONE = 1, STRATA_CHAT_TOOLS_REQUIRED = 2, STRATA_CHAT_TOOLS_NAMED = 3 };
typedef struct strata_chat_tools {
    const strata_chat_tool *tools; /* (n_tools) */
    size_t n_tools;
    int choice;                    /* STRATA_CHAT_TOOLS_* */
    const char *choice_name;       /* NAMED: the tool */
    int parallel;                  /* 0: at most one call per turn */
} strata_chat_tools;

/* The chat formats: Kimi K3's XTML, Kimi K2 / Kimi Linear's <|im_*|> format and
 * its thinking variants, DeepSeek-V3's and its R1 / V3.1 variants; the
 * tokenizer's own special tokens (and chat_template) say which one a model uses. */
enum { STRATA_CHAT_FMT_XTML = 0, STRATA_CHAT_FMT_K2 = 1, STRATA_CHAT_FMT_DSV3 = 2, STRATA_CHAT_FMT_R1 = 3,
       STRATA_CHAT_FMT_V31 = 4, STRATA_CHAT_FMT_K2_THINKING = 5, STRATA_CHAT_FMT_K25 = 6 };
/* The control ids of a Kimi tokenizer: eom ends a message (<|end_of_msg|> or
 * <|im_end|>); the markers of the other format, and bos/eos when absent, are -1. */
typedef struct strata_chat_ids {
    int fmt;                                 /* STRATA_CHAT_FMT_* */
    int32_t open, close, sep, eom, eos, bos;
    int32_t im_system, im_user, im_assistant, im_middle;
    int32_t think, think_end; /* <think>, </think>, or -1 */
} strata_chat_ids;

/* "low" | "high" | "max" | "off" -> STRATA_CHAT_THINK_*, or -1 ("medium" too). */
int strata_chat_effort_parse(const char *s);
const char *strata_chat_effort_name(int effort);
/* "system" | "user" | "assistant" -> STRATA_CHAT_*, or -1. */
int strata_chat_role_parse(const char *s);
/* XTML when <|open|>, <|close|>, <|sep|> and <|end_of_msg|> are special tokens
 * of t, else K2 when <|im_system|>, <|im_user|>, <|im_assistant|>, <|im_middle|>
 * and <|im_end|> are; else STRATA_EFORMAT naming what is missing. */
int strata_chat_ids_get(const strata_tokenizer *t, strata_chat_ids *out, char *err, size_t errlen);
/* Appends the ids of msgs (and the generation prompt with STRATA_CHAT_GEN) to
 * *ids / *n / *cap (a caller's array, NULL at first; grown as needed, released
 * with strata_free). STRATA_EINVAL for a bad role or effort, STRATA_EFORMAT when
 * t lacks the control tokens, STRATA_ENOMEM / STRATA_EBUDGET. */
int strata_chat_render(strata_tokenizer *t, const strata_chat_msg *msgs, size_t n_msgs, int effort, int flags,
                       int32_t **ids, size_t *n, size_t *cap, char *err, size_t errlen);
/* The same with declared tools (NULL: none): their declaration, the tool_choice
 * option and, for a forced choice with STRATA_CHAT_GEN, the call's opening after
 * the generation prompt (follow such a reply with thinking = 2 on K3). */
int strata_chat_render_tools(strata_tokenizer *t, const strata_chat_msg *msgs, size_t n_msgs,
                             const strata_chat_tools *tools, int effort, int flags, int32_t **ids, size_t *n,
                             size_t *cap, char *err, size_t errlen);

/* Tool calls in generated text, streamed: feed the reply's response (and tools
 * channel) text; content comes back, calls are kept once complete and well
 * formed (a declared name, arguments a JSON object); a call that is not comes
 * back as content, at the latest at flush. With a forced choice a call cut
 * short (max_tokens) is kept when its name is a declared tool (its arguments
 * as written); strata_grammar_tools makes forced calls well formed. fmt: STRATA_CHAT_FMT_*; calls_before: the calls in the history. */
typedef struct strata_tool_parser strata_tool_parser;
int strata_tool_parser_open(strata_tool_parser **out, int fmt, const strata_chat_tools *tools, size_t calls_before,
                            char *err, size_t errlen);
/* *content / *n: content to show (valid until the next call). STRATA_ENOMEM. */
int strata_tool_parser_push(strata_tool_parser *p, const char *s, size_t n, const char **content, size_t *content_n);
/* The end of the turn: held text comes out (a truncated call as content). */
int strata_tool_parser_flush(strata_tool_parser *p, const char **content, size_t *content_n);
size_t strata_tool_parser_n_calls(const strata_tool_parser *p);
const strata_chat_call *strata_tool_parser_call(const strata_tool_parser *p, size_t i);
int strata_tool_parser_done(const strata_tool_parser *p); /* 1: parallel off and a call kept */
void strata_tool_parser_close(strata_tool_parser *p);     /* accepts NULL */

/* A reply in chat format fmt (STRATA_CHAT_FMT_*) for a request's effort:
 * whether it starts in the think channel (XTML, V3.1, K2.5: effort not off; R1
 * always: its prompt opens <think>; K2, K2-Thinking, DeepSeek-V3 never), and
 * whether it may carry reasoning at all (the same, plus K2-Thinking, whose
 * model opens <think> itself whatever the effort). */
int strata_chat_fmt_starts_thinking(int fmt, int effort);
/* "Kimi K3 (XTML)", "Kimi K2", "DeepSeek-V3", "DeepSeek-R1", "DeepSeek-V3.1",
 * "Kimi K2-Thinking", "Kimi K2.5"; "unknown" for another value. */
const char *strata_chat_fmt_name(int fmt);
int strata_chat_fmt_reasons(int fmt, int effort);

/* Following a reply while it is generated, one id at a time, with streaming
 * UTF-8 decoding. thinking: whether the generation prompt opened the think
 * channel; 2: a forced call's prefill opened K3's tools channel. */
typedef struct strata_chat_follow strata_chat_follow;
int strata_chat_follow_open(strata_chat_follow **out, const strata_tokenizer *t, int thinking, char *err,
                            size_t errlen);
/* Feeds one id; *channel and *p / *n give the text to show (valid until the next
 * call; may be empty). 1: the turn has ended (an end id); 0: go on;
 * STRATA_EFORMAT: the reply breaks the format (the id is shown as text). */
int strata_chat_follow_push(strata_chat_follow *f, int32_t id, int *channel, const uint8_t **p, size_t *n);
/* Bytes still held by the UTF-8 decoder at the end of a turn. */
void strata_chat_follow_flush(strata_chat_follow *f, int *channel, const uint8_t **p, size_t *n);
void strata_chat_follow_close(strata_chat_follow *f); /* accepts NULL */

/* Streaming detokenizer: ids in, the text they complete out (bytes of a split
 * UTF-8 sequence are held until it completes). */
typedef struct strata_detok strata_detok;
int strata_detok_open(strata_detok **out, const strata_tokenizer *t); /* STRATA_OK or STRATA_ENOMEM */
/* Feeds one id: *p / *n receive the bytes ready to print (maybe none; valid until
 * the next call). STRATA_EINVAL for an unknown id (the stream is unchanged). */
int strata_detok_push(strata_detok *s, int32_t id, const uint8_t **p, size_t *n);
void strata_detok_flush(strata_detok *s, const uint8_t **p, size_t *n);
void strata_detok_close(strata_detok *s); /* accepts NULL */

/* ========================================================== benchmark hooks
 *
 * What the benchmark programs (bench/) measure beside the engine: the memory
 * read bandwidth with the probe the planner divides by (a buffer summed by a
 * pool of threads, best of several passes). */
typedef struct strata_membw strata_membw;
/* A buffer of `bytes` (written once, so its pages are real) and `threads`
 * compute threads. STRATA_ENOMEM when either cannot be had. */
int strata_membw_open(strata_membw **out, int threads, size_t bytes);
/* Best read bandwidth of `passes` sums over the buffer, GB/s. */
double strata_membw_read(strata_membw *b, int passes);
void strata_membw_close(strata_membw *b); /* accepts NULL */

/* ================================================================ utilities
 *
 * Small helpers the front ends (the strata CLI, the server, the benchmarks)
 * share with the library, so that they parse and print as it does. */

/* printf-style format checking for a front end's own variadic functions. */
#if defined(__GNUC__)
#define STRATA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define STRATA_PRINTF(a, b)
#endif

/* Strict parsers: the whole string must parse and lie in [lo, hi]; STRATA_OK or
 * STRATA_EINVAL (out untouched). */
int strata_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int strata_parse_f64(const char *s, double lo, double hi, double *out);
/* "4096", "512K", "1.5G", "24GB", "2GiB" -> bytes (K/M/G/T are powers of 1024). */
int strata_parse_size(const char *s, uint64_t *out);
/* The values two or more front ends take (the CLI's flags, the server's JSON
 * fields): one range and one message each, so `strata run --temp` and a request's
 * "temperature" cannot drift. lo_open: the range is (lo, hi]. */
enum strata_param {
    STRATA_PARAM_TEMP,           /* --temp, "temperature": [0, 2] (OpenAI's range) */
    STRATA_PARAM_TOP_K,          /* --top-k, "top_k": [0, 2^31-1] (HTTP also takes -1 = off) */
    STRATA_PARAM_TOP_P,          /* --top-p, "top_p": (0, 1] */
    STRATA_PARAM_MIN_P,          /* --min-p, "min_p": [0, 1] */
    STRATA_PARAM_REPEAT_PENALTY, /* --repeat-penalty, "repetition_penalty": (0, 100] */
    STRATA_PARAM_SPEC,           /* --spec: [0, 16] drafted tokens */
    STRATA_PARAM_CTX,            /* --ctx: [1, 2^24] positions */
    STRATA_PARAM_THREADS,        /* --threads: [1, 256] */
    STRATA_PARAM_CHUNK,          /* --chunk: [1, 4096] rows */
    STRATA_PARAM_GEN,            /* --gen: [1, 2^20] tokens */
    STRATA_PARAM_COUNT
};
typedef struct strata_param_info {
    const char *flag;    /* the CLI flag ("--temp") */
    const char *json;    /* the request field ("temperature"), NULL: none */
    int integer;         /* 1: an integer */
    double lo, hi;
    int lo_open;         /* 1: lo itself is outside */
    const char *range;   /* how the CLI says it: "a number in [0, 2]" */
} strata_param_info;
/* The row of p (NULL outside the enum). */
const strata_param_info *strata_param(enum strata_param p);
/* STRATA_OK when v lies in p's range; else STRATA_EINVAL with "'<json or flag>'
 * must be in [lo, hi] (got v)" in err. */
int strata_param_check(enum strata_param p, double v, char *err, size_t errlen);
/* strata_parse_i64 / _f64 with p's range (and kind). */
int strata_param_parse(enum strata_param p, const char *s, double *out);
/* Human-readable bytes, decimal units ("17.55 MB"); returns buf (n >= 32). */
const char *strata_fmt_bytes(uint64_t bytes, char *buf, size_t n);
double strata_now(void);              /* monotonic seconds */
/* Writes the formatted message into err (when err && errlen) and returns rc: the
 * library's error convention, for front-ends that follow it (the server). */
int strata_fail(char *err, size_t errlen, int rc, const char *fmt, ...) STRATA_PRINTF(4, 5);
uint64_t strata_mem_available(void);  /* MemAvailable of /proc/meminfo in bytes; 0 if unknown */
uint64_t strata_peak_rss(void);       /* this process's peak RSS in bytes */
int strata_is_dir(const char *path);  /* 1: a directory */
int strata_is_file(const char *path); /* 1: a regular file */
/* At most max bytes of a whole file, NUL-terminated; *buf released with strata_free. */
int strata_read_file(const char *path, size_t max, uint8_t **buf, size_t *len, char *err, size_t errlen);
/* Compute threads a model gets by default (the physical cores). */
int strata_default_threads(void);
/* "1,2,3" -> ids in [lo, hi]; *out released with strata_free. STRATA_OK,
 * STRATA_EINVAL or STRATA_ENOMEM. */
int strata_parse_id_list(const char *s, int64_t lo, int64_t hi, int64_t **out, size_t *n);
/* FNV-1a over n bytes, continuing h (STRATA_FNV_INIT to start). */
uint64_t strata_fnv1a(const void *p, size_t n, uint64_t h);
#define STRATA_FNV_INIT 1469598103934665603ULL

/* Counted allocation: a front end's own memory on the inference path goes
 * through the library's allocator, so it counts against the RAM budget and the
 * STRATA_FAIL_ALLOC sweep reaches it. NULL when refused; release with
 * strata_free (which accepts NULL). */
void *strata_alloc(size_t bytes);
void *strata_calloc(size_t n, size_t size);  /* zeroed, overflow-checked */
void *strata_realloc(void *p, size_t bytes); /* p NULL or from these */
uint64_t strata_mem_peak(void);              /* high-water mark of counted bytes */
/* Allocations made during decode steps, where none should be (0 when sound). */
uint64_t strata_mem_guard_violations(void);

/* The library's file door (the calls STRATA_FAULT numbers and fails): the
 * system call's contract (-1 and errno), EINTR retried inside. A read-only open
 * accepts only a regular file or a directory and never blocks. write_full loops
 * over short writes: 0 or an errno. */
int strata_file_open(const char *path, int flags, unsigned mode);
int strata_file_write_full(int fd, const void *buf, uint64_t n);
int strata_file_fsync(int fd);
int strata_file_rename(const char *from, const char *to);
/* Writes a whole file atomically (path.tmp.PID, fsync, rename). */
int strata_write_file_atomic(const char *path, const void *buf, size_t len, char *err, size_t errlen);
/* Temporary files in progress, removed by the handler that
 * strata_tmp_cleanup_on_signals installs for SIGINT and SIGTERM (where their
 * action is the default) before the default action. register returns a slot
 * (-1: not tracked; at most 64 at once) for unregister. */
int strata_tmp_register(const char *path);
void strata_tmp_unregister(int slot);
void strata_tmp_cleanup_on_signals(void);

/* Test hooks from the environment (tests and CI only): STRATA_FAULT=KIND:N makes
 * the Nth call of the file door fail once (eio, enospc, short, eintr; count:0
 * only counts), STRATA_FAIL_ALLOC=N the Nth counted allocation. STRATA_OK, or
 * STRATA_EINVAL with err saying which variable is malformed. With STRATA_FAULT
 * set, strata_fault_report prints what happened to f (the CLI calls it at exit). */
int strata_faults_from_env(char *err, size_t errlen);
void strata_fault_report(FILE *f);

/* A prefix-cache directory (strata_model_opts.prefix_dir) checked before a load
 * that would take it: STRATA_EBUSY (err names dir and the holder's pid) when
 * another process holds its lock, else STRATA_OK (also when dir does not exist
 * yet). A check only: it takes nothing; strata_model_load takes the lock. */
int strata_prefix_dir_check(const char *dir, char *err, size_t errlen);

/* JSON as the library reads it (jansson, a declared dependency): strict (no
 * duplicate keys), its nodes counted against the budget. strata_json_init
 * routes jansson's allocations through the counted allocator; call it once
 * before threads build JSON. parse: a new reference in *out, or STRATA_EFORMAT
 * ("what: invalid JSON at line L column C: reason") / STRATA_ENOMEM. */
struct json_t;
void strata_json_init(void);
int strata_json_parse(struct json_t **out, const void *buf, size_t len, const char *what, char *err,
                      size_t errlen);
/* Exact integer (an integer, or a real without fraction that fits) / any
 * number: 0, or -1 for another type. */
int strata_json_int(const struct json_t *j, int64_t *out);
int strata_json_num(const struct json_t *j, double *out);

#endif
