/*
 * model.h: a K3 model bound to its weights, and the one interface through which
 * the forward pass sees weights (wsrc). The forward pass never knows whether a
 * tensor is resident, pinned, streamed through a ring or read from the expert
 * cache: it asks wsrc and gets a borrowed view that stays valid until it returns it.
 */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include "base.h"
#include "cfg.h"
#include "schema.h"
#include "st.h"

/* A borrowed view of one tensor's bytes. Matrices are (rows, cols) row-major with
 * y = W x; vectors have rows = 1. MXFP4 experts: role R_EXP_W*P holds the packed
 * codes (rows, cols/2 bytes) with cols the LOGICAL input width, R_EXP_W*S the scales.
 * A quantised matrix (fmt, schema.h WF_*) is one view with its companion scales
 * in s: FP8 p = e4m3 codes (rows, cols), s = f32 (ceil(rows/128), ceil(cols/128));
 * INT4 p = int32 words (rows, cols/8), s = bf16 (rows, cols/32); rows and cols
 * are the logical shape, dtype the main tensor's (F8_E4M3, I32). */
typedef struct wt {
    const void *p;
    int32_t dtype;   /* st_dtype; DT_U8 for MXFP4 packed/scale */
    int64_t rows, cols;
    int32_t fmt;     /* WF_PLAIN, WF_FP8, WF_INT4 */
    const void *s;   /* the companion scales of an FP8 / INT4 matrix, else NULL */
    /* A matrix the source streams in row slices (p == NULL, sliced = 1): its rows
     * come through wsrc rows_get, a slice at a time; unit and role name it there.
     * Only matrices the forward pass uses as whole-row products are ever sliced. */
    int32_t sliced, role;
    int64_t unit;
    /* Row blocks to check as they are used (wblk.h): set by the streaming source
     * for a matrix it did not hash as it landed; NULL when the bytes are checked
     * already or come from no pack. */
    struct wblk *vb;
} wt;

/* Binding check: every tensor the config needs exists with the right shape and an
 * accepted dtype (trunk F32/BF16/F16; experts MXFP4 U8 packed+scale, or BF16/F32/F16
 * `weight`). All problems go to *problems (one line each). Also records layout facts. */
typedef struct model_layout {
    int experts_bf16;            /* experts stored as plain weights */
    int experts_contiguous;      /* every expert's tensors are one gap-free run in one shard */
    int layers_contiguous;       /* every layer's trunk tensors are one gap-free run in one shard */
    int64_t n_expert_noncontig, n_layer_noncontig;
    uint64_t expert_bytes;       /* bytes of one expert as stored (max over experts) */
    uint64_t layer_bytes[CFG_MAX_LAYERS]; /* trunk bytes of each layer as stored */
    uint64_t embed_bytes, head_bytes;     /* embed_tokens; final vectors + lm_head */
    uint64_t trunk_bytes, experts_bytes;  /* totals as stored */
    /* Added by bind.c (appended; fields above unchanged). */
    int n_expert_parts;          /* tensors per expert (6 MXFP4, 3 plain) */
    int expert_order[6];         /* roles (enum trole) of expert 0 by file offset (the first 6) */
    int expert_order_uniform;    /* every expert stores its tensors in that order */
    int64_t n_unused;            /* checkpoint tensors the model does not use */
    uint64_t unused_bytes;
    int wf;                      /* the formats the headers show (schema.h SW_*; model_wf) */
    int expert_kinds[9];         /* kinds (enum tkind) of expert 0's tensors by file offset */
    int expert_roles[9];         /* and their roles (FP8: 6 tensors, INT4: 9) */
} model_layout;

/* The weight formats a checkpoint stores (schema.h SW_*), read off its headers:
 * expert 0 of the first MoE layer (MXFP4 `weight_packed` U8, INT4
 * `weight_packed` I32, FP8 `weight` F8_E4M3, else plain) and the first trunk
 * matrix that may be FP8. The binder then requires every tensor to match. */
int model_wf(const cfg *c, const st_index *ix);
/* The view of tensor t stored as dtype, before its bytes are placed (p NULL):
 * matrices (rows, cols) with cols the logical input width; vectors (1, n);
 * convs (P, conv_k). */
static inline wt wt_view_of(const tspec *t, int dtype) {
    wt v = {.dtype = dtype, .rows = t->shape[0], .cols = t->ndim > 1 ? t->shape[1] : t->shape[0],
            .fmt = schema_kind_fmt(t->kind)};
    if (t->kind == TK_VECTOR) { v.rows = 1; v.cols = t->numel; }
    if (t->kind == TK_CONV) { v.rows = t->shape[0]; v.cols = t->shape[1] * t->shape[2]; }
    if (t->kind == TK_PACKED) v.cols = t->shape[1] * 2;
    if (t->kind == TK_I4_PACKED) v.cols = t->shape[1] * 8;
    return v;
}
/* Puts the view of a record's tensor (kind) into roles[role]: a main tensor sets
 * the view and keeps a companion's s already there; a companion scale sets s; an
 * INT4 weight_shape adds nothing. Any order. */
static inline void wt_put(wt *roles, int role, int kind, wt v) {
    if (kind == TK_FP8_SCALE || kind == TK_I4_SCALE) { roles[role].s = v.p; return; }
    if (kind == TK_I4_SHAPE) return;
    v.s = roles[role].s;
    roles[role] = v;
}
int model_bind_check(const cfg *c, const st_index *ix, model_layout *lay, sbuf *problems);
/* The same, and lists checkpoint tensors the model does not use in *warnings
 * (grouped by name prefix; may be NULL). Unused tensors are not errors. Problem
 * listings are capped at ~50 lines plus "and N more"; problems->n counts them
 * all. Returns STRATA_OK, STRATA_EFORMAT (problems) or STRATA_ENOMEM. */
int model_bind_check_ex(const cfg *c, const st_index *ix, model_layout *lay, sbuf *problems, sbuf *warnings);

/* Reads every MXFP4 expert's weight_scale bytes (all of them: ~85 GB on K3) and
 * counts E8M0 bytes of 255 (NaN by the MX spec; the kernels zero such groups, so
 * a checkpoint holding them is defective). Problem lines name the tensor. */
typedef struct model_scan {
    int64_t n_experts;       /* experts scanned */
    int64_t n_bad_experts;   /* experts with at least one 255 */
    int64_t n_bad_groups;    /* scale bytes equal to 255 */
    int64_t first_layer, first_expert; /* first defective expert, or -1 */
    uint64_t scale_bytes;    /* bytes read */
} model_scan;
int model_scan_scales(const cfg *c, const st_index *ix, model_scan *out, sbuf *problems,
                      void (*progress)(void *ud, int64_t done, int64_t total), void *ud,
                      char *err, size_t errlen);

/* Reads every F32/BF16/F16 tensor of the checkpoint and counts non-finite values
 * (NaN, +-inf: a norm weight of NaN turns every output into NaN). One problem
 * line per defective tensor (capped like the rest), naming the first bad element. */
typedef struct model_fscan {
    int64_t n_tensors;       /* float tensors scanned */
    int64_t n_bad_tensors;   /* with at least one non-finite value */
    int64_t n_nonfinite;     /* values */
    uint64_t bytes;          /* bytes read */
} model_fscan;
int model_scan_floats(const st_index *ix, model_fscan *out, sbuf *problems,
                      void (*progress)(void *ud, int64_t done, int64_t total), void *ud,
                      char *err, size_t errlen);

/* ---- the weight source ---- */
typedef struct wsrc wsrc;
struct pool; /* pool.h */
typedef struct wsrc_ops {
    /* Trunk of layer L (0..n_layers-1), or the head pseudo-layer L == n_layers
     * (final norm, output AttnRes vectors, lm_head). *roles points to an array of
     * R_COUNT views indexed by enum trole (unused roles have p == NULL). Valid until
     * layer_put(L). May block on I/O. */
    int (*layer_get)(wsrc *w, int64_t L, const wt **roles);
    void (*layer_put)(wsrc *w, int64_t L);
    /* Starts loading the given experts of layer L (may return before they land). */
    int (*experts_request)(wsrc *w, int64_t L, int n, const int32_t *ids);
    /* Waits for one requested expert; *roles as above (R_EXP_*). Valid until experts_put. */
    int (*expert_wait)(wsrc *w, int64_t L, int32_t id, const wt **roles);
    /* Releases every expert of layer L requested so far. */
    void (*experts_put)(wsrc *w, int64_t L);
    /* Embedding rows for ids, converted to f32: out is (n, hidden). */
    int (*embed_rows)(wsrc *w, int n, const int32_t *ids, float *out);
    /* Hint: layer L will be needed soon (read-ahead). Optional (may be NULL). */
    void (*hint_layer)(wsrc *w, int64_t L);
    void (*close)(wsrc *w);
    const char *(*errmsg)(wsrc *w);
    /* 1 if expert_wait(L, id) of a requested expert would not block (it may still
     * fail). Optional: NULL means every requested expert is ready at once. */
    int (*expert_ready)(wsrc *w, int64_t L, int32_t id);
    /* Releases one requested expert of layer L before experts_put (its views become
     * invalid), so a layer whose expert union exceeds the cache streams it in a
     * sliding window. Optional: NULL when every expert stays available anyway. */
    void (*expert_put)(wsrc *w, int64_t L, int32_t id);
    /* Experts that can be leased at once (the cache's slots). Optional: NULL or a
     * value <= 0 means no limit. */
    int64_t (*experts_capacity)(wsrc *w);
    /* Self-drafting (optional; NULL: the source cannot draft). draft_mode(w, 1)
     * starts a pass that reads nothing: layer_peek gives a layer's trunk only when
     * it is pinned in RAM (0, nothing to put back) and returns 1 otherwise;
     * expert_resident says whether an expert is in the cache now, and
     * experts_request then asks only for such experts (a miss is refused, never
     * read). draft_mode(w, 0) ends it; the cache's statistics are as before. */
    int (*draft_mode)(wsrc *w, int on);
    int (*layer_peek)(wsrc *w, int64_t L, const wt **roles);
    int (*expert_resident)(wsrc *w, int64_t L, int32_t id);
    /* Expert reads a layer ahead. predict_layer: 0 and *roles (unit L's trunk, as
     * layer_get; the caller owes a layer_put) when the source would act on a
     * prediction of layer L's experts now: prefetch on, room in the cache, and
     * unit L in RAM so that nothing blocks; 1 otherwise (nothing to release).
     * experts_prefetch: ids are the predicted experts of layer L (the next layer
     * to request experts); their reads start into free cache slots. Never blocks,
     * never fails, never changes what a later request returns: a wrong guess
     * costs only bandwidth. Both optional (NULL: no prediction). predict_layer's
     * *guess: NULL, or an MXFP4 copy of L's router (codes, scales) that a guess
     * may multiply instead (a quarter of the bytes; place_plan.guess_u). */
    int (*predict_layer)(wsrc *w, int64_t L, const wt **roles, const wt **guess);
    void (*experts_prefetch)(wsrc *w, int64_t L, int n, const int32_t *ids);
    /* Row slices of a sliced matrix t (a view of a held unit). rows_slice: the most
     * rows one slice may hold. rows_get: rows [r0, r1) (at most rows_slice of them)
     * into *p, r1 - r0 rows of t->cols, valid until rows_put; may block on I/O;
     * the slices of a matrix must be asked in row order from row 0 (the source
     * checks each matrix's checksum as its slices land). rows_hint: these rows will
     * be asked next; their read may start now. Required when a view is sliced. */
    int64_t (*rows_slice)(wsrc *w, const wt *t);
    int (*rows_get)(wsrc *w, const wt *t, int64_t r0, int64_t r1, const void **p);
    void (*rows_put)(wsrc *w, const wt *t, int64_t r0, int64_t r1);
    void (*rows_hint)(wsrc *w, const wt *t, int64_t r0, int64_t r1);
    /* The calling engine's thread pool for the duration of one pass (NULL after
     * it): the source may run independent work of its own on it (pool_for from
     * inside an op, which the engine calls from the pool's driving thread, never
     * from inside a pool job). Optional (NULL: the source never asks). */
    void (*use_pool)(wsrc *w, struct pool *p);
    /* Checks of landed reads run as tasks of the engine's next pool job, from the
     * driving thread between jobs: checks_begin takes what has landed and returns
     * how many checks it holds (0: none); check_run(i) runs check i on any pool
     * thread (each i at most once, all within one job); checks_end, after the
     * job, finishes them (a failed check fails the expert's later expert_wait).
     * A source never hands out an expert whose check has not finished. Optional
     * (NULL: the source checks on its own). */
    int (*checks_begin)(wsrc *w);
    void (*check_run)(wsrc *w, int i);
    void (*checks_end)(wsrc *w);
} wsrc_ops;
struct wsrc {
    const wsrc_ops *ops;
    const cfg *c;
};

/* Resident source: every tensor read from the shards into MEM_WEIGHTS at open. */
int wsrc_resident_open(wsrc **out, const cfg *c, const st_index *ix, char *err, size_t errlen);

#endif
