/*
 * strata_bench.h: the microbenchmarks behind bench/ as library calls (src/bench.c).
 *
 * Each one measures a piece of the engine that the public API does not expose
 * on its own (the kernel tables, the safetensors index, the io ring, the expert
 * cache, one planned rung of the memory ladder), so the programs under bench/
 * are front ends on include/ alone: they parse their arguments, call one of
 * these, and print. Each writes its tables to `out` exactly as the program
 * prints them (bench/ladder/run.sh and friends parse some of them), returns
 * STRATA_OK or a STRATA_E* code with err set (the file and the reason), and
 * never exits. None of them is meant to run inside a RAM budget.
 */
#ifndef STRATA_BENCH_H
#define STRATA_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include "strata.h"

/* ------------------------------------------------------------ kernels (b_kern)
 *
 * Kernel throughput against this machine's memory read bandwidth: bf16 and
 * MXFP4 matvec (decode, T = 1) for every kernel table with 1 and 2 threads, the
 * same as matrix-matrix products (prefill, T = 8, 64), and in-cache compute per
 * core. Needs ~1.5 GB (quick: ~0.7 GB). */
typedef struct strata_bench_kern_opts {
    int quick;               /* 1: a 256 MB bandwidth buffer and 8 experts (else 1 GB, 24) */
} strata_bench_kern_opts;
int strata_bench_kernels(const strata_bench_kern_opts *o, FILE *out, char *err, size_t errlen);
/* The same for FP8 e4m3 (128 x 128 block scales) and INT4 (group 32) over Kimi K2
 * expert shapes: decode G weights/s and GB/s vs the read bandwidth measured in
 * the same run, prefill T = 64, in-L2 compute. Needs ~1.2 GB (quick: ~0.6 GB). */
int strata_bench_kernels_quant(const strata_bench_kern_opts *o, FILE *out, char *err, size_t errlen);

/* -------------------------------------------------------- the index (b_index)
 *
 * The safetensors index on K3-shaped shards without the checkpoint: writes
 * n_shards sparse shards of per_shard tensors (K3 names and shapes, data left as
 * a hole) to a temporary directory under /tmp (removed after), and times opening
 * them with and without model.safetensors.index.json, a lookup per tensor, and
 * the index's RAM. STRATA_EINVAL unless 1 <= n_shards <= 96 and per_shard >= 8. */
typedef struct strata_bench_index_opts {
    int n_shards;            /* 1..96 (the program's default: 8) */
    int per_shard;           /* >= 8 (default 5200: ~790 KB headers like K3's) */
} strata_bench_index_opts;
int strata_bench_index(const strata_bench_index_opts *o, FILE *out, char *err, size_t errlen);

/* ------------------------------------------------------ disk reads (bench_io)
 *
 * Disk read bandwidth the way the streaming source reads, on a model directory
 * with routed experts: each expert's contiguous run read in place (the aligned
 * range enclosing it) vs the same bytes at aligned offsets, at depths 1..32,
 * then 64 MB trunk-like runs in 1/4/8 MiB chunks at depth 8/16/32; every
 * configuration reads bytes no earlier one touched, with O_DIRECT. With slices:
 * only the row-slice reads of a streamed trunk (512 MB in slices of 4..128 MiB,
 * two in flight, three rounds). */
typedef struct strata_bench_io_opts {
    const char *model_dir;
    int n;                   /* experts read per configuration (the program's default: 192) */
    int slices;              /* 1: only the row-slice table */
} strata_bench_io_opts;
int strata_bench_io(const strata_bench_io_opts *o, FILE *out, char *err, size_t errlen);

/* -------------------------------------------------- cache replay (cache_replay)
 *
 * Replays an expert request trace (the engine's trace file: int32 LE (layer,
 * expert) pairs, one layer's union at a time) through the expert cache at each
 * size in slots with every policy (S3-FIFO, LRU, LFU, LAYER), and prints the true
 * resident hit rate of each beside Belady's MIN and the ceiling (every request
 * but a key's first); csv: the comma-separated table run.sh reads. */
typedef struct strata_bench_replay_opts {
    const char *trace;
    int64_t n_experts;       /* experts per layer (>= 1) */
    const int64_t *slots;    /* cache sizes to replay at (each >= 1) */
    int n_slots;
    int csv;
} strata_bench_replay_opts;
int strata_bench_cache_replay(const strata_bench_replay_opts *o, FILE *out, char *err, size_t errlen);

/* ---------------------------------------------- one ladder rung (place_run)
 *
 * Plans a RAM budget for one sequence of prompt_len + gen + 1 positions, opens
 * the streaming weights and the engine directly (the options below reach the
 * planner beneath strata_model_opts), prefills a fixed prompt (from seed) and
 * decodes greedily. The plan, the load and decode reports, the decode window
 * (CLOCK_MONOTONIC seconds, for perf samples), the stolen CPU time and the ids
 * go to log; the result line (the ladder's CSV row, see bench/ladder/run.sh) to
 * res->line. STRATA_EBUDGET: the budget is below the plan's minimum. */
typedef struct strata_bench_place_opts {
    const char *model_dir;
    double ram_gb;           /* the budget in GB (1e9 bytes); 0 = resident */
    int gen;                 /* tokens generated (>= 1) */
    int prompt_len;          /* >= 1 */
    int seed;                /* the prompt's ids */
    int threads;             /* 0 = physical cores */
    int chunk;               /* prefill rows per pass */
    int policy;              /* strata_plan_policy(); -1 = the default (layer) */
    int no_readahead, no_prefetch, no_preload, no_verify;
    const char *pack_dir;    /* NULL = the model's own pack */
    const char *trace;       /* NULL, or a file the expert requests are written to */
    double disk_gbs, mem_gbs;/* the bandwidths the limit divides by; 0 = the plan's */
    double (*steal_s)(void); /* CPU seconds stolen by the hypervisor so far (< 0: none to
                                read); NULL: not measured */
} strata_bench_place_opts;
strata_bench_place_opts strata_bench_place_opts_default(void);

typedef struct strata_bench_place_result {
    char line[640];          /* budget,pinned,prefill s/tok,decode s/tok,... (no newline) */
    uint64_t peak_rss;       /* bytes */
} strata_bench_place_result;
int strata_bench_place_run(const strata_bench_place_opts *o, FILE *log, strata_bench_place_result *res, char *err,
                           size_t errlen);

/* Disk and memory read bandwidth as `strata plan --measure` measures them (the
 * disk in dir, NULL: not measured; memory with threads threads, 0 = the
 * engine's default), bytes/s. STRATA_EIO when memory could not be measured. */
int strata_bench_bandwidth(const char *dir, int threads, double *disk_bw, double *mem_bw);

/* ------------------------------------------- grammar masks (b_gram --masks)
 *
 * The per-step cost of a constrained-decoding mask on the vocabulary of
 * model_dir's tokenizer (tiktoken.model + tokenizer_config.json): steps masks
 * over random valid documents of schema (NULL: a built-in tool-arguments-like
 * object, mostly length-bounded strings), once with a walk of the whole trie
 * and once with the string fast path, the same draws both ways (STRATA_ECORRUPT
 * if the chosen ids differ). Prints ms per computed mask and per step. */
typedef struct strata_bench_gmask_opts {
    const char *model_dir;
    const char *schema;      /* JSON schema text, or NULL */
    int steps;               /* >= 1 (the program's default: 2000) */
} strata_bench_gmask_opts;
int strata_bench_grammar_masks(const strata_bench_gmask_opts *o, FILE *out, char *err, size_t errlen);

#endif
