/*
 * api_int.h: the public API's objects (strata_model, strata_seq, strata_gen),
 * shared by the files of the API layer that reach into them: api.c (open, load,
 * sequences, steps, generators) and api_report.c (info, stats, reports).
 * Only the API layer (the .c files in src/ itself) includes it.
 */
#ifndef STRATA_API_INT_H
#define STRATA_API_INT_H
#include "cfg.h"
#include "cluster.h"
#include "infer.h"
#include "jgram.h"
#include "model.h"
#include "place.h"
#include "prefix.h"
#include "sample.h"
#include "st.h"
#include "strata.h"
#include "tok.h"

#define API_MAX_STOP 16
#define API_DEFAULT_CTX 4096
#define API_PREFIX_EVERY 256

struct strata_model {
    char dir[4096];
    cfg c;
    st_index *ix;
    model_layout lay;
    place_plan plan;
    strata_model_opts o;
    int loaded, placed;
    wsrc *w;
    engine *e;
    tok *tk;
    char tok_err[512];
    int32_t stop[API_MAX_STOP];
    int n_stop;
    int64_t ctx, rows;
    int threads, max_seqs, n_live;
    int64_t max_out;          /* logits rows one generator step can want */
    int spec;                 /* drafted tokens per verification the engine records */
    const char *kname;
    double t_load;
    strata_row *grows;        /* (rows) a generator step's rows */
    strata_gen **gown;        /* (rows) the generator of each row */
    float *glogits;           /* (max_out, vocab) */
    infer_row *irows;         /* (rows) strata_step's rows in engine form */
    strata_gen **gdec, **gself, **gmtp; /* (rows) a generator step's decoding / self-drafting / MTP-drafting generators */
    prefix_cache *px;         /* NULL: no prefix cache */
    int64_t px_every;         /* prompt positions between snapshots */
    strata_cluster *cl;       /* the cluster this model is spread over (cluster.h), or NULL */
    cluster_stage stage;      /* the layers this process holds */
    uint64_t model_id;        /* model_identity at load */
    int id_source;            /* IDENT_FROM_* */
    char unverified[640];     /* non-empty: the model has a pack that cannot be used (why) */
    jg_vocab *jv;             /* the tokenizer's byte trie, built by the first constrained generator */
};

struct strata_seq {
    strata_model *m;
    session *s;
};

struct strata_gen {
    strata_seq *seq;
    strata_gen_opts o;
    int32_t *prompt;
    int64_t n_prompt, n_fed;  /* prompt tokens, and how many were evaluated */
    int32_t *out;             /* (max_tokens) generated ids */
    int64_t n_out;
    int32_t next;             /* sampled, not yet evaluated (valid when has_next) */
    int has_next, done, stopped;
    /* speculation */
    int32_t *draft_ids;       /* copy of opts.draft_ids */
    int32_t drafts[64];       /* this step's drafted tokens */
    int64_t n_drafts;         /* this step's (0: a plain decode row) */
    int spec_k, spec_fail, spec_off; /* current draft length, rejections in a row, steps left switched off */
    int64_t n_drafted, n_accepted, n_verifies;
    int self_pending;         /* n_drafts are to come from a self-draft this step */
    int mtp_pending;          /* ... from the MTP layer */
    int32_t stop_ids[16];     /* opts.stop_ids */
    int n_stop_ids;
    /* prefix cache */
    int64_t n_reused;         /* prompt positions restored from a snapshot */
    int64_t px_last;          /* position of the last snapshot stored */
    int px_prompt, px_final;  /* stored: at the end of the prompt, at the end */
    sampler *sm;
    jg_matcher *jm;           /* opts.grammar's document so far (NULL: unconstrained) */
    tok_stream *ts;
    /* opts.logprobs: the last reported token's log-probability and the top ones */
    double lp, lp_top[STRATA_MAX_TOP_LOGPROBS];
    int32_t lp_ids[STRATA_MAX_TOP_LOGPROBS];
    int n_lp;
    uint64_t lhash;
    void *user;
};

#endif
