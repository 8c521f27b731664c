/*
 * cluster.h: the narrow hooks through which a model is spread over the ranks of
 * a cluster (include/strata_mpi.h; implemented in src/mpi/ when the build has
 * MPI). api.c sees only this: no MPI type crosses it, so the library builds and
 * runs without MPI and a NULL cluster is a single process.
 *
 * strata_model_load on any rank asks `stage` which layers this process holds:
 * rank 0 computes the split (place_cluster_split), ships the load to the other
 * ranks (they load in parallel) and keeps layers [0, hi) plus the embedding and
 * the head; another rank gets its range from that message. Once the engine
 * exists, `attach` on rank 0 waits for the other ranks' loads, refuses a model
 * whose identity differs, and links the engine to the other stages
 * (engine_set_link). `detach` (strata_model_close on rank 0) closes the others'.
 */
#ifndef STRATA_CLUSTER_H
#define STRATA_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include "infer.h"
#include "strata.h"

typedef struct cluster_stage {
    int64_t lo, hi;   /* layers [lo, hi) */
    int head;         /* 1: the embedding and the head too (rank 0) */
} cluster_stage;

struct strata_cluster {
    int rank, size;
    int (*stage)(strata_cluster *cl, strata_model *m, const strata_model_opts *o, cluster_stage *out, char *err, size_t errlen);
    int (*attach)(strata_cluster *cl, strata_model *m, engine *e, uint64_t model_id, char *err, size_t errlen);
    void (*detach)(strata_cluster *cl, strata_model *m);
};

/* The engine and the model's config of a loaded model (for the stage loop). */
engine *api_model_engine(strata_model *m);
const cfg *api_model_cfg(const strata_model *m);
const model_layout *api_model_layout(const strata_model *m);
const char *api_model_dir(const strata_model *m);
uint64_t api_model_id(const strata_model *m);  /* the identity computed at load */

#endif
