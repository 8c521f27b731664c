/*
 * strata_mpi.h: one model across the ranks of an MPI job (Open MPI), as
 * pipeline stages. Only the MPI build (`strata-mpi`, built when mpicc is found)
 * has these functions; strata.h alone never needs MPI.
 *
 * Every rank runs the same program. Rank 0 owns the sequences, the tokenizer,
 * sampling, the embedding and the head, and drives the model through strata.h
 * as one process would, with strata_model_opts.cluster set; the other ranks call
 * strata_mpi_work, which serves the loads, steps and sequence events that rank 0
 * sends until rank 0 finishes. Each rank holds a contiguous range of layers
 * (trunk, experts, the sequences' KDA/MLA state of those layers) within its own
 * budget; a pass's rows travel from stage to stage as their residual stream, so
 * batched steps and speculative verification work unchanged and every output bit
 * equals the single-process run.
 *
 *     strata_cluster *cl;
 *     if (strata_mpi_init(&argc, &argv, &cl, err, sizeof err)) ... exit 1 ...
 *     if (strata_mpi_rank(cl) > 0) rc = strata_mpi_work(cl, err, sizeof err);
 *     else { o.cluster = cl; strata_model_load(m, &o, ...); ... steps ...; strata_model_close(m); }
 *     strata_mpi_finalize(cl, rc != 0);
 *
 * Failure: start-up exchanges the version and protocol and refuses a rank that
 * differs; loads compare the model's identity (config, tensor table, shard
 * samples) on every rank. Every rank sends a heartbeat every 0.25 s; a rank that
 * is silent for STRATA_MPI_TIMEOUT seconds (default 5) fails the step that waits
 * for it with an error naming it, and the cluster is then broken: every later
 * call fails at once and strata_mpi_finalize aborts the job.
 */
#ifndef STRATA_MPI_H
#define STRATA_MPI_H

#include <stdio.h>
#include "strata.h"

/* MPI_Init_thread (serialized), the version handshake, the heartbeat thread.
 * On failure *out may still be set (finalize it). */
int strata_mpi_init(int *argc, char ***argv, strata_cluster **out, char *err, size_t errlen);
int strata_mpi_rank(const strata_cluster *cl);
int strata_mpi_size(const strata_cluster *cl);
/* Ranks > 0: serves rank 0 until it finishes (0) or the cluster breaks. */
int strata_mpi_work(strata_cluster *cl, char *err, size_t errlen);
/* Rank 0 after a load: one line per rank (layers, placement, planned bytes). */
void strata_mpi_print_stages(const strata_cluster *cl, FILE *f);

/* What each rank read and sent since its load (strata_mpi_stats on rank 0). */
typedef struct strata_mpi_rank_stats {
    int rank;
    int64_t layer_lo, layer_hi;
    strata_stats st;          /* reads, cache, peak RSS of that rank */
    uint64_t budget_bytes, plan_bytes;
    uint64_t net_sent, net_recv; /* bytes of messages (headers, rows, residual state) */
    uint64_t passes;          /* passes this rank computed */
} strata_mpi_rank_stats;
/* Rank 0: fills out[0 .. size) (at most max); returns the count or a STRATA_E* code. */
int strata_mpi_stats(strata_cluster *cl, strata_mpi_rank_stats *out, int max, char *err, size_t errlen);
/* Rank 0: the stats of every rank as a table, with totals. */
void strata_mpi_print_report(strata_cluster *cl, FILE *f);
/* Rank 0: the network between the ranks, from trips round the ring of 8 bytes
 * and 16 MB (best of several): bytes/s and seconds per message, per hop. */
int strata_mpi_measure_net(strata_cluster *cl, double *bw, double *lat, char *err, size_t errlen);
/* Rank 0's SIGCONT handler calls this (async-signal-safe: a clock read and an
 * atomic store). Open MPI stops a job whose rank died by SIGCONT, then 1 s later
 * SIGTERM and SIGKILL within milliseconds of each other; in that second a wait
 * fails with an error naming any watched rank whose heartbeat stops (0.75 s after
 * the call) instead of after STRATA_MPI_TIMEOUT. Peers that keep heartbeating
 * (a SIGCONT after a job-control stop) end the check. Accepts NULL. */
void strata_mpi_quick_check(strata_cluster *cl);
/* 1 once a rank stopped answering or a transfer failed. */
int strata_mpi_broken(const strata_cluster *cl);
/* Rank 0 tells the others to stop, then MPI_Finalize; MPI_Abort when failed or
 * the cluster is broken (a dead rank would make a clean finalize hang).
 * Accepts NULL. Returns the exit status to use. */
int strata_mpi_finalize(strata_cluster *cl, int failed);

#endif
