/*
 * place.h: where every weight byte lives under a RAM budget, and the streaming
 * weight source that puts it there.
 *
 * A plan (place_plan_compute) is computed before anything big is allocated: which
 * trunk units (layers 0..n_layers-1 and the head pseudo-layer n_layers) are pinned
 * in RAM, how big the streaming arena is (it must hold the largest streamed unit;
 * more lets the reader thread load the next layers while this one computes), how
 * many expert cache slots remain, whether the embedding table is resident or read
 * by row, plus the session (KDA state + MLA cache), engine scratch, I/O buffers and
 * the process's fixed overhead. Below the minimum the plan is refused with
 * STRATA_EBUDGET and the minimum in the message (the CLI exits 2).
 *
 * place_open builds the wsrc (model.h) that serves the plan: pinned units and the
 * arena read with O_DIRECT (io_uring, many reads in flight), experts through a
 * leased cache (cache.h). The source reads from a pack (pack.h: one aligned run per
 * unit) when one exists for the model, else in place from the shards. The budget
 * only moves bytes: every view holds the same bytes a direct st_read gives.
 *
 * Wiring in strata run (app/cmd_run.c):
 *     place_opts po = place_opts_default();
 *     po.ram_bytes = budget (0 = resident); po.pack_dir = --pack or NULL;
 *     po.ctx = prompt + gen; po.prefill_chunk = chunk; po.n_threads = threads;
 *     po.session_bytes = infer_session_bytes; po.engine_bytes = infer_engine_bytes;
 *     if (--no-verify) po.verify_reads = PLACE_VERIFY_OFF;  // verified by default
 *     rc = place_plan_compute(&c, &lay, model_dir, &po, &plan, err, sizeof err);
 *     // rc == STRATA_EBUDGET: print err (names the minimum) and exit 2
 *     // --plan: place_plan_print(&plan, stderr) and exit 0
 *     rc = place_open(&w, &c, ix, model_dir, &plan, err, sizeof err);
 *     engine_opts eo = {.n_threads = threads, .prefill_chunk = plan.prefill_chunk};
 *     ... run ...; place_stats_get(w, &st); place_stats_print(&st, &plan, stderr);
 * The plan never lowers prefill_chunk: a pass's expert union larger than the cache
 * is streamed through it in a sliding window (wsrc expert_put/experts_capacity).
 */
#ifndef STRATA_PLACE_H
#define STRATA_PLACE_H

#include <stdio.h>
#include <jansson.h>
#include "model.h"

/* Same signatures as infer_session_bytes / infer_engine_bytes (infer.h). */
typedef uint64_t (*place_session_bytes_fn)(const cfg *c, int64_t max_ctx);
typedef uint64_t (*place_engine_bytes_fn)(const cfg *c, int64_t prefill_chunk, int n_threads);

/* Expert cache policies (= cache.h CACHE_*); LAYER is the default: the best of
 * the four at every size in trace replay (docs/performance.md, bench/ladder/cache_replay). */
enum { PLACE_POLICY_S3FIFO = 0, PLACE_POLICY_LRU = 1, PLACE_POLICY_LFU = 2, PLACE_POLICY_LAYER = 3 };
/* "s3fifo", "lru", "lfu", "layer" -> PLACE_POLICY_*, or -1; and back. */
int place_policy_parse(const char *name);
const char *place_policy_name(int policy);

/* Row slices: below the budget whose arena holds the largest streamed unit, every
 * streamed unit is read as its small tensors (through the arena, read ahead like
 * whole units) plus its large matrices in row slices of at most slice_bytes
 * (n_slices buffers: one computing, the next ones reading). Matrices above a
 * quarter of a slice are sliced, only of the roles place_sliceable_role names
 * (whole-row products, mm.c mm_run); the rest of a unit stays whole.
 * 64 MiB: 16 reads of IO_CHUNK (4 MiB, the best read size measured on this disk,
 * io.h) in flight per slice, and the K3 floor fits 2 GB with 4 of them. */
#define PLACE_SLICE_BYTES (64ull << 20)
#define PLACE_N_SLICES 4 /* a GLU's gate and up slices computing, the next two reading */
int place_sliceable_role(int role);

typedef struct place_opts {
    uint64_t ram_bytes;       /* whole-process peak RSS budget; 0 = no budget: all resident */
    const char *pack_dir;     /* NULL = auto-find the model's pack; "" = never (read in place) */
    int64_t ctx;              /* positions the session must hold (prompt + generated) */
    int64_t prefill_chunk;    /* rows per pass (0 = 64); never lowered by the budget */
    int n_seqs;               /* sequences held at once (each a session); 0 = 1 */
    uint64_t extra_bytes;     /* the caller's own buffers (the API's step rows, samplers) */
    uint64_t prefix_bytes;    /* the prefix cache's RAM (snapshots of sequences; api.c) */
    int n_threads;            /* compute threads (0 = default) */
    place_session_bytes_fn session_bytes; /* NULL = the planner's own estimate */
    place_engine_bytes_fn engine_bytes;   /* NULL = the planner's own estimate */
    int cache_policy;         /* PLACE_POLICY_*; default LAYER */
    int verify_reads;         /* PLACE_VERIFY_OFF: skip the checksums; else (the default, 0,
                                 or 1) every record read with a pack is checked against the
                                 manifest's XXH3 as it lands: trunk units (pinned and
                                 streamed), experts (in the shards), the embedding table
                                 (at open). A mismatch is STRATA_ECORRUPT naming the file,
                                 the record and the byte range, never different output.
                                 Tri-state so that a zeroed or default opts verifies. */
    int no_uring;             /* 1: pread fallback even when io_uring works */
    int no_readahead;         /* 1: no reader thread (every streamed unit read on demand) */
    int mem_limit;            /* 1: also cap base_alloc at the planned bytes (STRATA_EBUDGET) */
    uint64_t overhead_bytes;  /* process baseline; 0 = measure (VmRSS now + stacks + slack) */
    const char *trace_path;   /* NULL = off; else every expert request is appended as two
                                 int32 LE (layer, expert) for offline policy replay */
    int no_prefetch;          /* 1: no expert reads ahead of the router (wsrc predict_layer
                                 says no); the output is the same either way */
    /* A pipeline stage (src/mpi/): this process holds layers [layer_lo, layer_hi) and
     * their experts only (layer_hi 0 = every layer); no_head = 1: the head and the
     * embedding are held elsewhere. Units it does not hold cost nothing and are
     * never read. */
    int64_t layer_lo, layer_hi;
    int no_head;
    uint64_t seq_bytes;       /* one sequence's bytes; 0 = session_bytes(c, ctx) */
    int no_preload;           /* 1: no warm start (see place_open) */
    int force_slices;         /* tests: row slices even where whole units fit */
    uint64_t slice_bytes;     /* 0 = PLACE_SLICE_BYTES */
    /* place_open's warm start: bytes read of the total, every ~256 MB and at the end */
    void (*progress)(void *ud, uint64_t done, uint64_t total);
    void *progress_ud;
} place_opts;

/* A router copy's layout for n = experts x hidden weights: n / 2 code bytes
 * padded to 64, then n / 32 scale bytes padded to 64 (plan and source alike). */
static inline uint64_t place_guess_codes_bytes(uint64_t n) { return (n / 2 + 63) & ~63ull; }
static inline uint64_t place_guess_bytes(uint64_t n) { return place_guess_codes_bytes(n) + ((n / 32 + 63) & ~63ull); }

#define PLACE_VERIFY_OFF (-1) /* place_opts.verify_reads: `strata run --no-verify` */

place_opts place_opts_default(void);

#define PLACE_MAX_UNITS (CFG_MAX_LAYERS + 1)

typedef struct place_plan {
    /* inputs */
    uint64_t budget_bytes;    /* 0 = unbudgeted */
    int64_t n_layers, n_units; /* n_units = n_layers + 1 (the head pseudo-layer) */
    int64_t ctx, prefill_chunk; /* prefill_chunk: rows per pass, what the engine must use */
    int n_seqs;               /* sequences planned for (session_bytes = n_seqs x seq_bytes) */
    uint64_t seq_bytes;       /* one sequence's KDA state + MLA cache at ctx */
    int n_threads;
    int has_pack;             /* 1 if pack_dir holds this model's pack */
    char pack_dir[1024];      /* the pack used ("" = in place from the shards) */
    char unverified[640];     /* non-empty: the model has a pack that cannot be used (why);
                                 the weights are read in place, unverified */
    /* trunk */
    uint64_t unit_bytes[PLACE_MAX_UNITS]; /* RAM buffer bytes of each unit */
    uint8_t pinned[PLACE_MAX_UNITS];
    int64_t n_pinned;
    uint64_t pinned_bytes;    /* sum of pinned units */
    uint64_t streamed_bytes;  /* bytes of the unpinned units (read every forward pass) */
    uint64_t ring_bytes;      /* streaming arena */
    uint64_t ring_min_bytes;  /* largest unpinned unit (the arena's floor) */
    /* row slices (see PLACE_SLICE_BYTES): streamed units are their small tensors
     * (small_bytes each, through the arena) plus matrices read in row slices */
    int sliced;
    uint64_t slice_bytes;     /* payload of one slice buffer */
    uint64_t slice_min_bytes; /* matrices of more bytes than this are sliced */
    int n_slices;
    uint64_t slice_pool_bytes; /* the slice buffers (payload + alignment) */
    uint64_t small_bytes[PLACE_MAX_UNITS]; /* a unit's arena bytes when sliced (bound) */
    /* embeddings */
    int embed_resident;
    uint64_t embed_bytes;     /* table bytes if resident (else 0) */
    uint64_t embed_row_bytes;
    /* experts */
    uint64_t expert_bytes;    /* one expert as stored */
    uint64_t expert_slot_bytes;
    int64_t n_expert_slots, min_expert_slots;
    uint64_t slot_meta_bytes; /* bookkeeping per slot, beside its bytes (place_cache_meta_bytes) */
    uint64_t cache_meta_bytes; /* bookkeeping of the cache as a whole */
    uint64_t cache_bytes;     /* slots x (slot + bookkeeping) + the cache's tables */
    int cache_policy;
    /* the early expert guesses (guess.c guess_predict) multiply a MoE layer's router
     * a layer ahead; from an MXFP4 copy of it they stream a quarter of its bytes.
     * A copy for each pinned MoE unit, planned where the cache cannot hold every
     * expert (so guesses read something) and the copies take at most 1/8 of what
     * the cache would get. */
    uint8_t guess_u[PLACE_MAX_UNITS]; /* unit u's router may have a copy (a MoE layer held here, prefetch on) */
    uint64_t guess_one_bytes; /* one copy: place_guess_codes_bytes, then the scales (0: hidden % 32 != 0) */
    uint64_t guess_bytes;     /* the copies planned: guess_one_bytes x n_guess */
    int64_t n_guess;
    /* the rest */
    uint64_t session_bytes, engine_bytes, io_bytes, index_bytes, overhead_bytes, extra_bytes;
    uint64_t prefix_bytes;    /* prefix cache snapshots (RAM tier and its tables) */
    uint64_t total_bytes;     /* planned peak RSS */
    uint64_t min_bytes;       /* smallest budget that gives a valid plan */
    int resident;             /* every unit pinned and the embedding resident */
    /* prediction (decode, batch 1, expert cache assumed cold) */
    double disk_bw, mem_bw;   /* bytes/s */
    char bw_source[256];      /* "measured now", "cached <path>[, why it is stale]", "default" */
    uint64_t read_bytes_per_token;  /* streamed trunk + routed experts */
    uint64_t touch_bytes_per_token; /* every weight byte a decode token reads, and its KDA state */
    uint64_t state_touch_bytes;     /* the KDA state one row reads and writes per token (this process's layers) */
    int64_t n_kda_layers, n_mla_layers; /* this process's layers of each kind (what a sequence holds) */
    double expert_hit_uniform;      /* the cache's hit rate the reads assume: slots / experts (uniform routing) */
    double pred_s_per_token;
    /* options carried to place_open */
    int verify_reads, no_uring, no_readahead, mem_limit;
    char trace_path[1024];
    /* a pipeline stage: units held elsewhere (never read; counted pinned at 0 bytes) */
    uint8_t absent[PLACE_MAX_UNITS];
    int64_t n_owned;          /* units this process holds */
    int64_t n_moe;            /* MoE layers this process holds */
    int no_head;
    int no_prefetch, no_preload;
    void (*progress)(void *ud, uint64_t done, uint64_t total);
    void *progress_ud;
} place_plan;

/* Computes the plan. lay may be NULL (sizes from the config's census: `plan
 * --config`), model_dir may be NULL (no pack lookup). On STRATA_EBUDGET err says
 * "needs at least X GB" and out->min_bytes holds X. Does not allocate big buffers. */
int place_plan_compute(const cfg *c, const model_layout *lay, const char *model_dir,
                       const place_opts *o, place_plan *out, char *err, size_t errlen);
void place_plan_print(const place_plan *p, FILE *f);

/* The cluster split: layers into n_ranks contiguous stages [lo[r], hi[r]) with
 * the largest stage's bytes (trunk + experts; rank 0 also the head and the
 * embedding) as small as it can be. lay may be NULL (sizes from the config).
 * Returns the largest stage's bytes; n_ranks <= n_layers. */
uint64_t place_cluster_split(const cfg *c, const model_layout *lay, int n_ranks, int64_t *lo, int64_t *hi);
/* Weight bytes of the stage [lo, hi) (with the head and embedding when head). */
uint64_t place_stage_bytes(const cfg *c, const model_layout *lay, int64_t lo, int64_t hi, int head);
/* Predicted seconds of one decode step of n_rows rows, one per sequence (the
 * trunk once, the rows' expert union), from the plan's bandwidths. */
double place_plan_step_seconds(const place_plan *p, const cfg *c, int n_rows);
json_t *place_plan_json(const place_plan *p); /* new reference */

/* Measured or cached disk (O_DIRECT, engine read size, several in flight) and
 * memory read bandwidths. dir: a directory on the disk to test (a scratch file is
 * written there); NULL skips the disk test. Caches the result under
 * $XDG_CACHE_HOME/strata/bw.json (or ~/.cache); force = 1 re-measures. */
int place_bandwidth(const char *dir, int force, double *disk_bw, double *mem_bw,
                    char *source, size_t srclen);

/* Opens the streaming weight source for plan p. ix and c are borrowed and must
 * outlive the source. Allocates everything the plan names (pinned buffers, arena,
 * cache slots) up front; the per-token path allocates nothing. Close through
 * w->ops->close.
 * Warm start (unless p->no_preload): the pinned trunk units are read at open, in
 * file order with many reads in flight, and the expert cache is filled: with
 * every expert when it holds them all, else, when the whole trunk is pinned, with
 * each MoE layer's equal share of the slots, its experts of highest router bias
 * first (on generated models that ranking covers nearly what the most requested
 * experts of a decode do: bench/RESULTS.md, Warm start). Nothing else changes: a warm cache only
 * saves reads. */
int place_open(wsrc **out, const cfg *c, const st_index *ix, const char *model_dir,
               const place_plan *p, char *err, size_t errlen);
/* The pack a source from place_open reads (NULL: in place, or w is another source). */
struct pack;
const struct pack *place_pack(const wsrc *w);

/* RAM the streaming source keeps beside an expert cache of n_slots slots over
 * n_keys experts in n_layers MoE layers of n_experts each: each slot's read
 * and binding record and the cache's tables (no arena). Linear in n_slots (at
 * 0 slots: the tables alone); the planner counts it with the slots (ladder at 16 GB: 7,990 slots x 4.8 KB =
 * 38 MB, which had put the peak 8 MB over the budget). */
uint64_t place_cache_meta_bytes(int64_t n_keys, int64_t n_layers, int64_t n_experts, int64_t n_slots);

/* The weight source's counters: the STRATA_STATS_IO list of strata.h (meanings there). */
typedef struct place_stats {
    STRATA_STATS_IO(STRATA_STAT_MEMBER)
} place_stats;
/* w must come from place_open (or be NULL: zeros). */
void place_stats_get(wsrc *w, place_stats *s);
void place_stats_reset(wsrc *w);   /* counters back to zero (e.g. between prefill and decode) */
void place_stats_print(const place_stats *s, const place_plan *p, FILE *f);

#endif
