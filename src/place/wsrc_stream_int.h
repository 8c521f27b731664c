/*
 * wsrc_stream_int.h: what the streaming weight source's files share (private to
 * src/place/wsrc_*.c; wsrc_stream.c describes the source as a whole).
 *
 * The files: wsrc_stream.c (open, close, embeddings, the wsrc_ops table, stats),
 * wsrc_trunk.c (trunk records, their reads, the reader thread, the arena, the
 * trunk ops), wsrc_rows.c (row slices), wsrc_experts.c (expert slots, reads,
 * checks, leases and the expert ops), wsrc_ahead.c (the slot prefaulter, the
 * guesses and reads ahead, the warm start).
 */
#ifndef STRATA_WSRC_STREAM_INT_H
#define STRATA_WSRC_STREAM_INT_H

#ifndef XXH_STATIC_LINKING_ONLY
#define XXH_STATIC_LINKING_ONLY
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <xxhash.h>
#if defined(__x86_64__) && defined(__linux__)
/* The library's runtime-dispatched XXH3 (AVX2 / AVX-512 where the CPU has them;
 * the inline default is SSE2): checksumming every streamed byte sits beside the
 * compute threads on a small machine. Same hash values. */
#include <xxh_x86dispatch.h>
#endif
#include "cache.h"
#include "io.h"
#include "pack.h"
#include "place.h"
#include "wblk.h"

#define SEG_GAP (64u << 10)   /* coalesce tensors closer than this into one read */
#define MAX_XT 9              /* tensors of one expert (INT4: 3 x packed, scale, shape) */
#define EMB_BATCH 64          /* embedding rows in flight */
#define PF_AHEAD 256          /* fresh expert slots kept faulted in ahead of use */
#define CK_MAX 64              /* landed experts one stream_checks_begin takes */
#define PF_QUIET_MAX 7        /* guesses that read nothing, in a row, counted per layer (skip up to 2^6 - 1) */
/* Checksums are on unless the caller opted out (place.h: verify_reads) */
#define VERIFY(s) ((s)->pk && (s)->plan.verify_reads != PLACE_VERIFY_OFF)

enum { U_IDLE = 0, U_QUEUED, U_LOADING, U_READY, U_ERROR };

typedef struct seg {
    int32_t file;
    uint64_t off, len, need;   /* aligned file range; bytes that must exist */
    uint64_t buf_off;          /* where it lands in the record's buffer */
} seg;

typedef struct tref {
    int16_t role, kind;        /* kind: a quantised matrix's part (wt_put) */
    int32_t seg;
    uint64_t rel;              /* offset of the tensor's bytes in the buffer */
    wt view;                   /* p relative to the buffer start until bound */
} tref;

/* A tensor of a record being built: its index entry, role, kind and view. */
typedef struct pend { const st_tensor *s; int role, kind; wt view; } pend;

/* A matrix of a sliced unit, read in row slices (rows_get). Its checksum runs
 * over the slices as they are consumed, in row order. */
typedef struct bigt {
    int16_t role;
    int32_t file;
    uint64_t off, nbytes, row_bytes; /* the tensor's bytes in the file */
    int64_t rows;
    wt view;                   /* sliced = 1, p = NULL */
    uint64_t xxh3;
    int has_sum;
    int64_t next_row;          /* rows hashed so far (the running hash below) */
    XXH3_state_t h;
    const char *name;
} bigt;

/* Checksums of a sliced unit's whole tensors (each its own, from the pack). */
typedef struct tsum { uint64_t rel, nbytes, xxh3, foff; const char *name; } tsum; /* foff: its first byte in trunk.bin */

/* A row slice buffer (rows_get / rows_hint), used by the forward thread only. */
enum { SL_FREE = 0, SL_LOADING, SL_READY };
typedef struct slice {
    int state, held, rc;
    int64_t unit, r0, r1;
    int role;
    uint64_t data_off;         /* row r0's first byte in buf */
    uint64_t seq;              /* last use: a free buffer is the oldest unheld one */
    uint8_t *buf;
    io_req q;
} slice;

typedef struct unit {
    int32_t n_seg, n_t;
    seg *segs;
    tref *t;
    uint64_t buf_bytes, data_bytes;
    uint64_t xxh3;
    int has_sum;
    int pinned;
    uint8_t *buf;              /* pinned buffer, or arena position while placed */
    int state, held;
    int in_arena;
    uint64_t a_off;            /* arena offset while placed */
    int64_t a_seq;             /* allocation order in the arena */
    int qnext;                 /* reader queue link (-1 none) */
    char err[400];
    wt roles[R_COUNT];
    /* row slices (plan.sliced and not pinned): the matrices read by rows, and the
     * checksums of the tensors in buf (verified after each read) */
    int n_big, n_sum;
    bigt *big;
    tsum *sum;
    /* a streamed unit from a pack with block checksums: its matrices are checked
     * block by block by the threads that use them (wblk.h), its other tensors
     * against their own checksums (sum) after each read */
    int n_wb;
    wblk *wb;
    int16_t *wb_t;             /* each one's index in t */
    /* a pinned MoE unit's router as MXFP4 for the early guesses (place_plan.guess_u):
     * made once the unit is read and checked (guess_build), lent by predict_layer */
    uint8_t *gq;
    wt gqw[2];                 /* codes, scales */
    int gq_ok;
} unit;

typedef struct xslot {         /* per cache slot: the expert being read into it */
    int n_seg, n_t, pending, rc;
    seg segs[MAX_XT];
    tref t[MAX_XT];
    io_req reqs[MAX_XT];
    uint64_t xxh3_want;
    int has_sum;
    int n_h;                   /* the checksum's ranges in the buffer, in schema order */
    uint64_t h_rel[MAX_XT], h_len[MAX_XT];
    int64_t L, E;
    wt roles[R_COUNT];
    uint8_t pf_lease;          /* the read was started by experts_prefetch, which holds a
                                  lease until it lands */
    uint8_t pf_fresh;          /* read ahead and not requested since */
    uint64_t got;              /* expert_check: the XXH3 of what landed */
    size_t nan_bad;            /* expert_check: MXFP4 scale bytes that are NaN */
} xslot;

typedef struct stream {
    wsrc base;
    const cfg *c;
    const st_index *ix;
    place_plan plan;
    pack *pk;
    int n_files;
    io_file *files;            /* shards, then trunk.bin (if packed) */
    int64_t n_units;
    unit *u;
    /* arena */
    uint8_t *arena;
    uint64_t arena_bytes;
    int64_t a_seq;
    /* reader */
    pthread_t th;
    int th_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int q_head, q_tail;
    io_ring *rring, *xring;
    int head_follows;          /* 1 if the last pass used the head after the last layer */
    int64_t last_get;
    /* experts */
    cache *xc;
    xslot *xs;
    int64_t n_moe, NE;
    int wf;                    /* the checkpoint's weight formats (model_wf) */
    int64_t req_L;             /* layer of the open request (-1 none) */
    /* slot prefaulter (stream_prefault_main): fresh slots leave the free list from the
     * top index down; the thread keeps PF_AHEAD of them below the lowest used
     * faulted in. pf_want (slots from the top) is guarded by pf_mu. */
    pthread_t pf_th;
    int pf_started, pf_stop;
    pthread_mutex_t pf_mu;
    pthread_cond_t pf_cv;
    int64_t pf_want, pf_asked, x_low;
    int32_t *req_slot;         /* expert id -> slot for req_L, -1 */
    int32_t *req_list;         /* ids requested, in order */
    int n_req;
    /* reads a layer ahead: the layer predicted last (-1 none) and its predicted
     * ids (pf_mark[id] = 1), prefetch leases outstanding */
    int64_t pf_L;
    uint8_t *pf_mark;
    int64_t n_pf;
    /* guesses that pay (stream_experts_prefetch): per layer, the guesses in a row
     * that read nothing (everything guessed was in RAM or in flight) and how many
     * of the next ones to skip; a read the layer had to wait for resets both */
    uint8_t pf_quiet[CFG_MAX_LAYERS], pf_skip[CFG_MAX_LAYERS];
    /* landed experts whose checks the engine runs inside its next pool job
     * (stream_checks_begin .. stream_checks_end); ck_ran[i]: check i has run */
    int ck_sl[CK_MAX], n_ck;
    uint8_t ck_ran[CK_MAX];
    struct pool *pool;         /* the pass's engine threads (use_pool), or NULL */
    uint64_t xslot_bytes;
    /* embeddings */
    int32_t emb_file;
    uint64_t emb_off, emb_row;
    int emb_dtype;
    uint8_t *emb;              /* resident table or NULL */
    uint8_t *emb_bounce;       /* EMB_BATCH row buffers */
    uint64_t emb_slot;
    FILE *trace;               /* expert request trace, or NULL */
    /* row slices: buffers and their ring (the forward thread's) */
    slice *sl;
    int n_sl;
    uint64_t sl_seq;
    io_ring *sring;
    /* stats (under mu) */
    place_stats st;
    _Atomic uint64_t verify_ns, verify_bytes; /* hashing, from any thread */
    int draft;                 /* a self-draft pass: nothing is read (draft_mode) */
    cache_stats draft_saved;   /* the cache's statistics before it */
    int io_active;
    double io_t0;
    char err[1024];
} stream;

/* ------------------------------------------------------------ wsrc_trunk.c */

/* Wall time with reads in flight, from the caller's thread (takes mu); the bytes,
 * reads and wait accounted with it. */
void stream_io_enter_l(stream *s);
void stream_io_leave_l(stream *s, uint64_t *counter, uint64_t bytes, uint64_t reads, double waited);
wt stream_view_of(const tspec *t, int dtype);
uint64_t stream_layout_inplace(pend *p, int n, seg *segs, int max_seg, int *n_seg, tref *t);
int stream_build_units(stream *s, char *err, size_t errlen);
uint64_t stream_hash_cold(const uint8_t *p, uint64_t n);
void stream_verify_count(stream *s, uint64_t bytes, double secs);
void stream_unit_name(const stream *s, int64_t u, char *b, size_t n);
void stream_load_unit_locked(stream *s, int64_t u, io_ring *r);
void *stream_reader_main(void *arg);
int stream_layer_get(wsrc *w, int64_t L, const wt **roles);
void stream_layer_put(wsrc *w, int64_t L);
void stream_hint_layer(wsrc *w, int64_t L);
int stream_layer_peek(wsrc *w, int64_t L, const wt **roles);

/* ------------------------------------------------------------- wsrc_rows.c */

int64_t stream_rows_slice(wsrc *w, const wt *t);
void stream_rows_hint(wsrc *w, const wt *t, int64_t r0, int64_t r1);
int stream_rows_get(wsrc *w, const wt *t, int64_t r0, int64_t r1, const void **p);
void stream_rows_put(wsrc *w, const wt *t, int64_t r0, int64_t r1);

/* ---------------------------------------------------------- wsrc_experts.c */

int stream_expert_submit(stream *s, int sl, int64_t L, int64_t E);
void stream_expert_landed(stream *s, io_req *d);
void stream_ck_flush(stream *s);
int stream_checks_begin(wsrc *w);
void stream_check_run(wsrc *w, int i);
void stream_checks_end(wsrc *w);
int stream_experts_request(wsrc *w, int64_t L, int n, const int32_t *ids);
int stream_expert_wait(wsrc *w, int64_t L, int32_t id, const wt **roles);
int stream_expert_ready(wsrc *w, int64_t L, int32_t id);
void stream_experts_put(wsrc *w, int64_t L);
void stream_expert_put(wsrc *w, int64_t L, int32_t id);
int64_t stream_experts_capacity(wsrc *w);
int stream_draft_mode(wsrc *w, int on);
int stream_expert_resident(wsrc *w, int64_t L, int32_t id);

/* ------------------------------------------------------------ wsrc_ahead.c */

void *stream_prefault_main(void *arg);
void stream_prefault_note(stream *s, int sl);
int stream_predict_layer(wsrc *w, int64_t L, const wt **roles, const wt **guess);
void stream_experts_prefetch(wsrc *w, int64_t L, int n, const int32_t *ids);
void stream_preload(stream *s);

#endif
