/*
 * cluster_mpi.c: one model across the ranks of an MPI job as pipeline stages
 * (include/strata_mpi.h, src/cluster.h). Built only into `strata-mpi`.
 *
 * Owns: the MPI communicators, the heartbeat thread, the ring protocol, rank 0's
 * engine link (passes and sequence events) and the stage loop of the other
 * ranks. Does not own the math (infer.c runs each stage's layers through
 * engine_stage_step) or placement (each rank plans its own layers in plan.c).
 *
 * Ring: rank 0 sends to rank 1, rank r to r + 1, the last rank back to rank 0.
 * Every message from rank 0 to a stage (load, sequence event, pass, close,
 * stats, exit) travels the ring, so each rank receives only from its
 * predecessor, in order: a sequence reset can never overtake the pass before
 * it. A rank forwards control messages before acting on them (the loads run in
 * parallel); a pass it forwards after computing its layers. Replies (loads,
 * stats) go straight to rank 0. A message is a fixed header, then a body (the
 * pass's groups and ids, a load's parameters, an error text) when body > 0,
 * then for a pass the residual blocks, one message each (no derived datatypes).
 *
 * Threads and MPI: MPI_THREAD_SERIALIZED; every MPI call after start-up holds
 * k->mu. Waits are MPI_Test loops that release it, so the heartbeat thread runs
 * beside them: every 0.25 s it sends a 4-byte heartbeat to the peers this rank
 * watches (rank 0: every rank; others: rank 0), and every 50 ms it notes
 * theirs. A wait fails when a watched peer has been silent for the timeout
 * (STRATA_MPI_TIMEOUT, 5 s): the cluster is then broken, every later call fails
 * at once, and finalize aborts the job instead of hanging on the dead rank.
 *
 * Quick check (strata_mpi_quick_check, from rank 0's SIGCONT handler): when a
 * rank dies, Open MPI 4.1 stops the job by SIGCONT, then 1 s later SIGTERM and
 * SIGKILL ~1-6 ms apart (strace of mpirun, Debian 4.1.4). A SIGTERM handler on a
 * loaded machine often loses that race and rank 0 ends without a word (2 of 15
 * kills with 3 busy loops on 2 cores). The second between SIGCONT and SIGTERM is
 * long enough to tell which rank died: a watched peer whose heartbeat is not
 * noticed between QUICK_FRESH_MS and QUICK_MS after the SIGCONT is reported
 * dead, by name, before the runtime's SIGTERM. A SIGCONT after a job-control stop
 * finds every peer heartbeating and ends the check.
 */
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "base.h"
#include "cluster.h"
#include "place.h"
#include "strata_mpi.h"

#define CLU_MAGIC 0x504d5453u  /* "STMP" */
#define CLU_PROTO 1u           /* bump on any change of the messages below */
#define CLU_MAX_RANKS 256
#define HB_PERIOD_MS 250       /* a heartbeat sent */
#define HB_POLL_MS 50          /* the peers' heartbeats noticed */
#define HELLO_TIMEOUT_S 120.0  /* start-up: every rank must arrive */
/* The quick check (see the top): a heartbeat noticed within QUICK_FRESH_MS of the
 * SIGCONT may have been sent before it (noticed up to HB_POLL_MS late, more on a
 * busy machine); a live peer sends 2-3 in the 600 ms after that; the verdict at
 * QUICK_MS leaves rank 0 ~250 ms before the runtime's SIGTERM to name the rank. */
#define QUICK_FRESH_MS 150
#define QUICK_MS 750

enum { TAG_RING = 1, TAG_BODY, TAG_STATE, TAG_REPLY, TAG_HB, TAG_HELLO };
enum { OP_LOAD = 1, OP_STEP, OP_CTL, OP_CLOSE, OP_STATS, OP_EXIT, OP_PING };
#define PING_MAX (64u << 20)   /* largest probe of strata_mpi_measure_net */

typedef struct clu_hdr {
    uint32_t magic, op;
    int32_t status, slot, ev, n_grp;
    int64_t T, arg, nb;       /* rows; event arg; blocks 0..nb that follow */
    int64_t body;             /* bytes of the body message that follows (0: none) */
} clu_hdr;

typedef struct clu_load {     /* OP_LOAD body */
    char dir[2048], pack[2048];
    int32_t has_pack, n_ranks;
    /* rank 0's options as they are, with what a stage must not take cleared: every
     * pointer (the pack path travels in pack; strata.h's struct says so for new
     * ones), the prefix cache (rank 0's alone); so an option added to
     * strata_model_opts reaches every stage without another copy here */
    strata_model_opts o;
    int64_t lo[CLU_MAX_RANKS], hi[CLU_MAX_RANKS];
} clu_load;

typedef struct clu_reply {    /* a stage to rank 0: a load's outcome, or its stats */
    int32_t rank, status;
    uint64_t model_id;
    int64_t lo, hi;
    uint64_t budget, plan, min_bytes;
    strata_stats st;
    uint64_t net_sent, net_recv, passes;
    char host[64];
    char placement[256];
    char err[1536];
} clu_reply;

typedef struct clu_hello {
    uint32_t magic, proto;
    char version[32], build[96], host[64];
} clu_hello;

typedef struct clu {
    strata_cluster pub;        /* first: the public handle */
    MPI_Comm comm, hbcomm;
    pthread_mutex_t mu;        /* every MPI call after start-up */
    int prev, next;
    double timeout;
    int delay_ms;              /* STRATA_MPI_STEP_DELAY_MS: rank 0 sleeps before each pass (tests) */
    char host[64];
    /* heartbeats */
    pthread_t hb;
    int hb_started;
    atomic_int hb_stop;
    pthread_mutex_t hb_mu;
    pthread_cond_t hb_cv;
    _Atomic int64_t *heard_ms; /* (size) last heartbeat from each rank, ms since start */
    MPI_Request *hb_r, *hb_s;  /* (size) pending heartbeat receive / send per peer */
    int32_t *hb_rbuf, hb_sbuf;
    double t0;
    _Atomic int64_t quick_ms;  /* a quick check began at this clu_ms, or -1 */
    atomic_int broken;
    int ready;                 /* start-up succeeded: the other ranks wait for messages */
    /* the load */
    clu_load ld;
    cluster_stage my;
    int64_t n_blocks;
    /* rank 0 */
    strata_model *m0;          /* rank 0's own model while attached */
    int load_sent, replies_pending, attached;
    uint64_t model_id;
    clu_reply *rep;            /* (size) each rank's load reply */
    uint8_t *slot_used;
    int n_slots;
    engine_link link;
    /* both: a pass's groups and ids, the block requests */
    int32_t *meta;             /* (3 x rows) */
    MPI_Request *reqs;         /* (n_blocks + 4) */
    /* stages */
    strata_model *m;
    engine *e;
    session **seqs;            /* (max_seqs) by slot */
    infer_row *rows;
    int64_t rows_cap;          /* rows of one pass */
    int ctl_bad;
    char ctl_msg[512];
    uint64_t net_sent, net_recv, passes;
    uint8_t *ping;             /* probe buffer (strata_mpi_measure_net), PING_MAX */
} clu;

/* ============================================================== helpers */

static double clu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int64_t clu_ms(const clu *k) { return (int64_t)((clu_now() - k->t0) * 1000.0); }


static void stage_name(const clu *k, int r, char *b, size_t n) {
    if (k->ld.n_ranks > r && k->ld.hi[r] > k->ld.lo[r])
        snprintf(b, n, "rank %d (layers %lld-%lld)", r, (long long)k->ld.lo[r], (long long)k->ld.hi[r] - 1);
    else
        snprintf(b, n, "rank %d", r);
}

/* A watched peer silent for longer than the timeout, or one not heard during a
 * quick check (*quick = 1), or -1. A quick check that hears every peer ends. */
static int clu_silent_peer(clu *k, double *silent, int *quick) {
    const int64_t now = clu_ms(k);
    int64_t q = atomic_load(&k->quick_ms);
    const int judge = q >= 0 && now - q >= QUICK_MS;
    *quick = 0;
    for (int r = 0; r < k->pub.size; r++) {
        if (r == k->pub.rank || (k->pub.rank != 0 && r != 0)) continue;
        const int64_t h = atomic_load(&k->heard_ms[r]);
        const double s = (double)(now - h) / 1000.0;
        if (s > k->timeout || (judge && h < q + QUICK_FRESH_MS)) {
            *silent = s;
            *quick = s <= k->timeout;
            return r;
        }
    }
    if (judge) atomic_compare_exchange_strong(&k->quick_ms, &q, -1);
    return -1;
}

/* Waits for req with MPI_Test, the lock released between tests, watching the
 * heartbeats. On failure the request is cancelled and the cluster broken. */
static int clu_wait(clu *k, MPI_Request *req, MPI_Status *st, const char *what, char *err, size_t errlen) {
    int spins = 0;
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&k->mu);
        int rc = MPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&k->mu);
        if (rc != MPI_SUCCESS) {
            char es[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, es, &len);
            atomic_store(&k->broken, 1);
            return base_fail(err, errlen, STRATA_EIO, "mpi: %s: %s", what, es);
        }
        if (done) return 0;
        double silent = 0;
        int quick = 0;
        const int who = clu_silent_peer(k, &silent, &quick);
        if (who >= 0 || atomic_load(&k->broken)) {
            pthread_mutex_lock(&k->mu);
            MPI_Cancel(req);
            MPI_Request_free(req);
            pthread_mutex_unlock(&k->mu);
            atomic_store(&k->broken, 1);
            if (who < 0) return base_fail(err, errlen, STRATA_EIO, "mpi: %s: the cluster failed earlier", what);
            char nm[96];
            stage_name(k, who, nm, sizeof nm);
            return base_fail(err, errlen, STRATA_EIO,
                            "mpi: %s has not answered for %.1f s while %s: it died or cannot be reached (rank %d on %s)%s",
                            nm, silent, what, k->pub.rank, k->host, quick ? "; the MPI runtime is stopping the job" : "");
        }
        /* a pass that comes back within microseconds is caught spinning; a long
         * wait (another stage computing for a second) polls every 0.5 ms at most */
        if (++spins < 2000) sched_yield();
        else usleep(spins < 4000 ? 50 : 500);
    }
}

static void clu_isend(clu *k, const void *buf, size_t n, int dst, int tag, MPI_Request *req) {
    pthread_mutex_lock(&k->mu);
    MPI_Isend(buf, (int)n, MPI_BYTE, dst, tag, k->comm, req);
    pthread_mutex_unlock(&k->mu);
    k->net_sent += n;
}

static void clu_irecv(clu *k, void *buf, size_t n, int src, int tag, MPI_Request *req) {
    pthread_mutex_lock(&k->mu);
    MPI_Irecv(buf, (int)n, MPI_BYTE, src, tag, k->comm, req);
    pthread_mutex_unlock(&k->mu);
    k->net_recv += n;
}

static int clu_send(clu *k, const void *buf, size_t n, int dst, int tag, const char *what, char *err, size_t errlen) {
    MPI_Request q;
    clu_isend(k, buf, n, dst, tag, &q);
    return clu_wait(k, &q, NULL, what, err, errlen);
}

static int clu_recv(clu *k, void *buf, size_t n, int src, int tag, const char *what, char *err, size_t errlen) {
    MPI_Request q;
    clu_irecv(k, buf, n, src, tag, &q);
    return clu_wait(k, &q, NULL, what, err, errlen);
}

/* A header, its body (when h->body > 0) and residual blocks 0..nb (when
 * blocks != NULL), all in flight at once, then waited for. */
static int clu_send_msg(clu *k, const clu_hdr *h, const void *body, const float *blocks, int64_t stride, int64_t per_block,
                        int dst, const char *what, char *err, size_t errlen) {
    MPI_Request ctl[2], *rq = blocks ? k->reqs : ctl; /* control messages need no model */
    int n = 0;
    clu_isend(k, h, sizeof *h, dst, TAG_RING, &rq[n++]);
    if (h->body > 0) clu_isend(k, body, (size_t)h->body, dst, TAG_BODY, &rq[n++]);
    for (int64_t i = 0; blocks && i <= h->nb; i++)
        clu_isend(k, blocks + i * stride, (size_t)per_block * sizeof(float), dst, TAG_STATE, &rq[n++]);
    int rc = 0;
    for (int i = 0; i < n; i++)
        if (!rc) rc = clu_wait(k, &rq[i], NULL, what, err, errlen);
    return rc;
}

static int clu_recv_blocks(clu *k, float *blocks, int64_t stride, int64_t per_block, int64_t nb, int src, const char *what,
                           char *err, size_t errlen) {
    for (int64_t i = 0; i <= nb; i++) clu_irecv(k, blocks + i * stride, (size_t)per_block * sizeof(float), src, TAG_STATE, &k->reqs[i]);
    int rc = 0;
    for (int64_t i = 0; i <= nb; i++)
        if (!rc) rc = clu_wait(k, &k->reqs[i], NULL, what, err, errlen);
    return rc;
}

/* ============================================================ heartbeats */

/* Notes the peers' heartbeats every HB_POLL_MS (so heard_ms is at most that
 * late) and sends this rank's every HB_PERIOD_MS. */
static void *hb_main(void *arg) {
    clu *k = arg;
    int64_t last_send = -HB_PERIOD_MS;
    pthread_mutex_lock(&k->hb_mu);
    while (!atomic_load(&k->hb_stop)) {
        pthread_mutex_unlock(&k->hb_mu);
        const int64_t now = clu_ms(k);
        const int send = now - last_send >= HB_PERIOD_MS;
        if (send) last_send = now;
        pthread_mutex_lock(&k->mu);
        for (int r = 0; r < k->pub.size; r++) {
            if (r == k->pub.rank || (k->pub.rank != 0 && r != 0)) continue;
            for (;;) { /* every heartbeat that has arrived */
                int done = 0;
                if (k->hb_r[r] == MPI_REQUEST_NULL) MPI_Irecv(&k->hb_rbuf[r], 1, MPI_INT32_T, r, TAG_HB, k->hbcomm, &k->hb_r[r]);
                if (MPI_Test(&k->hb_r[r], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
                atomic_store(&k->heard_ms[r], clu_ms(k));
                k->hb_r[r] = MPI_REQUEST_NULL;
            }
            int sent = 1;
            if (k->hb_s[r] != MPI_REQUEST_NULL) MPI_Test(&k->hb_s[r], &sent, MPI_STATUS_IGNORE);
            if (send && sent) MPI_Isend(&k->hb_sbuf, 1, MPI_INT32_T, r, TAG_HB, k->hbcomm, &k->hb_s[r]);
        }
        pthread_mutex_unlock(&k->mu);
        pthread_mutex_lock(&k->hb_mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += HB_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        if (!atomic_load(&k->hb_stop)) pthread_cond_timedwait(&k->hb_cv, &k->hb_mu, &ts);
    }
    pthread_mutex_unlock(&k->hb_mu);
    return NULL;
}

static void hb_stop(clu *k) {
    if (!k->hb_started) return;
    pthread_mutex_lock(&k->hb_mu);
    atomic_store(&k->hb_stop, 1);
    pthread_cond_broadcast(&k->hb_cv);
    pthread_mutex_unlock(&k->hb_mu);
    pthread_join(k->hb, NULL);
    k->hb_started = 0;
}

/* ======================================================= rank 0: the link */

static int link_pass(void *ud, const engine_pass *p, char *err, size_t errlen) {
    clu *k = ud;
    if (atomic_load(&k->broken)) return base_fail(err, errlen, STRATA_EIO, "mpi: the cluster failed earlier; no pass can run");
    if (k->delay_ms) usleep((useconds_t)k->delay_ms * 1000u);
    int64_t nm = 0;
    for (int64_t g = 0; g < p->n_grp; g++) {
        k->meta[nm++] = p->g_slot[g];
        k->meta[nm++] = (int32_t)(p->g_r0[g + 1] - p->g_r0[g]);
    }
    for (int64_t t = 0; t < p->T; t++) k->meta[nm++] = p->ids[t];
    clu_hdr h = {CLU_MAGIC, OP_STEP, 0, 0, 0, (int32_t)p->n_grp, p->T, 0, p->nb_have, nm * (int64_t)sizeof(int32_t)};
    const int64_t per = p->T * p->hidden;
    int rc = clu_send_msg(k, &h, k->meta, p->res, p->stride, per, k->next, "sending a pass to rank 1", err, errlen);
    if (rc) return rc;
    clu_hdr r;
    const int last = k->pub.size - 1;
    if ((rc = clu_recv(k, &r, sizeof r, last, TAG_RING, "waiting for the pass to come back", err, errlen))) return rc;
    if (r.magic != CLU_MAGIC || r.op != OP_STEP) {
        atomic_store(&k->broken, 1);
        return base_fail(err, errlen, STRATA_EIO, "mpi: rank %d sent an unexpected message (op %u) instead of the pass", last, r.op);
    }
    if (r.status) {
        char msg[1536] = "";
        const size_t n = r.body > 0 && (size_t)r.body < sizeof msg ? (size_t)r.body : 0;
        if (n && (rc = clu_recv(k, msg, n, last, TAG_BODY, "receiving a stage's error", err, errlen))) return rc;
        msg[sizeof msg - 1] = 0;
        return base_fail(err, errlen, r.status, "%s", msg[0] ? msg : "a stage failed");
    }
    if (r.nb != p->nb_want || r.T != p->T) {
        atomic_store(&k->broken, 1);
        return base_fail(err, errlen, STRATA_EIO, "mpi: the pass came back with %lld blocks of %lld rows, expected %lld of %lld",
                        (long long)r.nb + 1, (long long)r.T, (long long)p->nb_want + 1, (long long)p->T);
    }
    rc = clu_recv_blocks(k, p->res, p->stride, per, r.nb, last, "receiving the residual stream", err, errlen);
    if (!rc) k->passes++;
    return rc;
}

static int link_seq_open(void *ud, int32_t *slot, char *err, size_t errlen) {
    clu *k = ud;
    for (int i = 0; i < k->n_slots; i++)
        if (!k->slot_used[i]) {
            k->slot_used[i] = 1;
            *slot = i;
            return 0;
        }
    return base_fail(err, errlen, STRATA_EBUSY, "mpi: every one of the %d sequence slots is in use", k->n_slots);
}

static void link_seq_event(void *ud, int32_t slot, int ev, int64_t arg) {
    clu *k = ud;
    if (ev == ENGINE_EV_CLOSE && slot >= 0 && slot < k->n_slots) k->slot_used[slot] = 0;
    if (atomic_load(&k->broken)) return;
    clu_hdr h = {CLU_MAGIC, OP_CTL, 0, slot, ev, 0, 0, arg, 0, 0};
    char e2[256];
    /* a failure here breaks the cluster; the next pass reports it */
    clu_send_msg(k, &h, NULL, NULL, 0, 0, k->next, "sending a sequence event", e2, sizeof e2);
}

/* ================================================ the load (cluster.h) */

static int clu_stage(strata_cluster *cl, strata_model *m, const strata_model_opts *o, cluster_stage *out, char *err, size_t errlen) {
    clu *k = (clu *)cl;
    if (atomic_load(&k->broken)) return base_fail(err, errlen, STRATA_EIO, "mpi: the cluster failed earlier");
    if (cl->rank != 0) { *out = k->my; return 0; }
    const cfg *c = api_model_cfg(m);
    *out = (cluster_stage){0, c->n_layers, 1};
    if (cl->size == 1) return 0;
    if (k->load_sent) return base_fail(err, errlen, STRATA_EBUSY, "mpi: the cluster already holds a model; close it first");
    if (cl->size > c->n_layers)
        return base_fail(err, errlen, STRATA_EINVAL, "mpi: %d ranks for a model of %lld layers: at most one rank per layer", cl->size,
                        (long long)c->n_layers);
    clu_load *ld = &k->ld;
    memset(ld, 0, sizeof *ld);
    if (strlen(api_model_dir(m)) >= sizeof ld->dir || (o->pack_dir && strlen(o->pack_dir) >= sizeof ld->pack))
        return base_fail(err, errlen, STRATA_EINVAL, "mpi: model or pack path too long");
    snprintf(ld->dir, sizeof ld->dir, "%s", api_model_dir(m));
    ld->has_pack = o->pack_dir != NULL;
    if (o->pack_dir) snprintf(ld->pack, sizeof ld->pack, "%s", o->pack_dir);
    ld->n_ranks = cl->size;
    ld->o = *o;
    ld->o.pack_dir = NULL;
    ld->o.prefix_ram = 0;
    ld->o.prefix_dir = NULL;
    ld->o.cluster = NULL;
    ld->o.progress = NULL;
    ld->o.progress_ud = NULL;
    ld->o.hash_progress = NULL;
    ld->o.plan_only = 0;
    if (ld->o.max_seqs < 1) ld->o.max_seqs = 1;
    place_cluster_split(c, api_model_layout(m), cl->size, ld->lo, ld->hi);
    *out = (cluster_stage){ld->lo[0], ld->hi[0], 1};
    k->my = *out;
    if (o->plan_only) return 0; /* rank 0's plan only: `strata plan --ranks N` plans them all */
    const int64_t rows = o->rows > 0 ? o->rows : INFER_DEFAULT_CHUNK;
    k->n_blocks = infer_blocks_before(c, c->n_layers);
    k->n_slots = ld->o.max_seqs;
    k->slot_used = base_calloc((size_t)k->n_slots, 1, MEM_MISC);
    k->meta = base_alloc((size_t)(3 * rows) * sizeof(int32_t), MEM_SCRATCH);
    k->reqs = base_alloc((size_t)(k->n_blocks + 4) * sizeof(MPI_Request), MEM_SCRATCH);
    if (!k->slot_used || !k->meta || !k->reqs) return base_fail(err, errlen, STRATA_ENOMEM, "mpi: out of memory");
    clu_hdr h = {CLU_MAGIC, OP_LOAD, 0, 0, 0, 0, 0, 0, 0, (int64_t)sizeof *ld};
    int rc = clu_send_msg(k, &h, ld, NULL, 0, 0, k->next, "sending the load to rank 1", err, errlen);
    if (rc) return rc;
    k->load_sent = 1;
    k->replies_pending = 1;
    return 0;
}

/* Rank 0: every stage's load reply (slow: they read their weights). */
static int collect_replies(clu *k, char *err, size_t errlen) {
    int rc = 0;
    for (int r = 1; r < k->pub.size && k->replies_pending; r++) {
        char what[96];
        snprintf(what, sizeof what, "waiting for rank %d to load its layers", r);
        int e = clu_recv(k, &k->rep[r], sizeof k->rep[r], r, TAG_REPLY, what, err, errlen);
        if (e) { k->replies_pending = 0; return e; }
        k->rep[r].err[sizeof k->rep[r].err - 1] = 0;
    }
    k->replies_pending = 0;
    return rc;
}

static int clu_attach(strata_cluster *cl, strata_model *m, engine *e, uint64_t model_id, char *err, size_t errlen) {
    clu *k = (clu *)cl;
    if (cl->rank != 0 || !k->load_sent) return 0;
    int rc = collect_replies(k, err, errlen);
    if (rc) return rc;
    for (int r = 1; r < cl->size; r++) {
        const clu_reply *p = &k->rep[r];
        char nm[96];
        stage_name(k, r, nm, sizeof nm);
        if (p->status) return base_fail(err, errlen, p->status, "%s on %s: %s", nm, p->host, p->err);
        if (p->model_id != model_id)
            return base_fail(err, errlen, STRATA_EFORMAT,
                            "%s on %s opened a different model at %s (identity %016llx, rank 0 has %016llx): every rank must "
                            "see the same files",
                            nm, p->host, k->ld.dir, (unsigned long long)p->model_id, (unsigned long long)model_id);
    }
    k->model_id = model_id;
    k->link = (engine_link){k, link_pass, link_seq_open, link_seq_event};
    engine_set_link(e, &k->link);
    k->attached = 1;
    k->m0 = m;
    return 0;
}

static void clu_detach(strata_cluster *cl, strata_model *m) {
    clu *k = (clu *)cl;
    if (cl->rank != 0 || !k->load_sent) return;
    char e2[256];
    if (k->replies_pending && !atomic_load(&k->broken)) collect_replies(k, e2, sizeof e2); /* never left to match a later load */
    if (!atomic_load(&k->broken)) {
        clu_hdr h = {CLU_MAGIC, OP_CLOSE, 0, 0, 0, 0, 0, 0, 0, 0};
        clu_send_msg(k, &h, NULL, NULL, 0, 0, k->next, "closing the model", e2, sizeof e2);
    }
    k->load_sent = k->attached = 0;
    k->m0 = NULL;
    base_free(k->slot_used);
    base_free(k->meta);
    base_free(k->reqs);
    k->slot_used = NULL;
    k->meta = NULL;
    k->reqs = NULL;
    k->n_slots = 0;
}

/* ============================================================ the stages */

static void stage_close(clu *k) {
    for (int i = 0; k->seqs && i < k->ld.o.max_seqs; i++) session_free(k->seqs[i]);
    base_free(k->seqs);
    base_free(k->rows);
    base_free(k->meta);
    base_free(k->reqs);
    k->seqs = NULL;
    k->rows = NULL;
    k->meta = NULL;
    k->reqs = NULL;
    strata_model_close(k->m);
    k->m = NULL;
    k->e = NULL;
}

static void fill_reply(clu *k, clu_reply *p) {
    memset(p, 0, sizeof *p);
    p->rank = k->pub.rank;
    p->lo = k->my.lo;
    p->hi = k->my.hi;
    snprintf(p->host, sizeof p->host, "%s", k->host);
    p->net_sent = k->net_sent;
    p->net_recv = k->net_recv;
    p->passes = k->passes;
    if (!k->m) return;
    strata_model_info in;
    strata_model_get_info(k->m, &in);
    p->model_id = api_model_id(k->m);
    p->budget = in.budget_bytes;
    p->plan = in.plan_bytes;
    p->min_bytes = in.min_bytes;
    snprintf(p->placement, sizeof p->placement, "%s", in.placement);
    strata_model_get_stats(k->m, &p->st);
}

/* OP_LOAD on a stage: open, load this rank's layers, a session per slot. */
static void stage_load(clu *k, clu_reply *p) {
    const clu_load *ld = &k->ld;
    char err[1536] = "";
    int rc;
    k->my = (cluster_stage){ld->lo[k->pub.rank], ld->hi[k->pub.rank], 0};
    k->net_sent = k->net_recv = k->passes = 0;
    k->ctl_bad = 0;
    if ((rc = strata_model_open(&k->m, ld->dir, err, sizeof err))) goto done;
    strata_model_opts o = ld->o;
    o.pack_dir = ld->has_pack ? ld->pack : NULL;
    o.cluster = &k->pub;
    if ((rc = strata_model_load(k->m, &o, err, sizeof err))) goto done;
    k->e = api_model_engine(k->m);
    const cfg *c = api_model_cfg(k->m);
    strata_model_info in;
    strata_model_get_info(k->m, &in);
    k->n_blocks = infer_blocks_before(c, c->n_layers);
    k->seqs = base_calloc((size_t)ld->o.max_seqs, sizeof *k->seqs, MEM_STATE);
    k->rows = base_alloc((size_t)in.rows * sizeof *k->rows, MEM_SCRATCH);
    k->rows_cap = in.rows;
    k->meta = base_alloc((size_t)(3 * in.rows) * sizeof(int32_t), MEM_SCRATCH);
    k->reqs = base_alloc((size_t)(k->n_blocks + 4) * sizeof(MPI_Request), MEM_SCRATCH);
    if (!k->seqs || !k->rows || !k->meta || !k->reqs) { rc = base_fail(err, sizeof err, STRATA_ENOMEM, "out of memory"); goto done; }
    for (int i = 0; i < ld->o.max_seqs && !rc; i++) rc = session_create(&k->seqs[i], k->e, in.ctx, err, sizeof err);
done:
    fill_reply(k, p);
    p->status = rc;
    snprintf(p->err, sizeof p->err, "%s", err);
    if (rc) stage_close(k);
}

/* OP_CTL: a sequence event, in the order rank 0 made it. A failure is kept
 * and fails the next pass (the sequences would no longer match rank 0's). */
static void stage_ctl(clu *k, const clu_hdr *h) {
    if (!k->m || h->slot < 0 || h->slot >= k->ld.o.max_seqs) return;
    session *s = k->seqs[h->slot];
    int rc = 0;
    if (h->ev == ENGINE_EV_RESET || h->ev == ENGINE_EV_CLOSE) session_reset(s);
    else if (h->ev == ENGINE_EV_SPEC_BEGIN) rc = session_spec_begin(s);
    else if (h->ev == ENGINE_EV_SPEC_END) rc = session_spec_end(s, h->arg);
    if (rc && !k->ctl_bad) {
        k->ctl_bad = rc;
        snprintf(k->ctl_msg, sizeof k->ctl_msg, "sequence slot %d: %s", h->slot, session_errmsg(s));
    }
}

/* OP_STEP: this stage's layers over the pass, then on to the next rank (the
 * last one back to rank 0). An error travels on in place of the state. */
static int stage_step(clu *k, clu_hdr *h, char *err, size_t errlen) {
    const int dst = k->next;
    char what[96], msg[1536];
    snprintf(what, sizeof what, "receiving a pass from rank %d", k->prev);
    int rc;
    if (h->status) { /* failed upstream: pass the message on */
        const size_t n = h->body > 0 && (size_t)h->body < sizeof msg ? (size_t)h->body : 0;
        msg[0] = 0;
        if (n && (rc = clu_recv(k, msg, n, k->prev, TAG_BODY, what, err, errlen))) return rc;
        h->body = (int64_t)n;
        h->nb = 0;
        return clu_send_msg(k, h, msg, NULL, 0, 0, dst, "passing a stage's error on", err, errlen);
    }
    if (!k->m || h->T < 1 || !k->meta || h->body != (int64_t)(2 * h->n_grp + h->T) * (int64_t)sizeof(int32_t) ||
        h->T > k->rows_cap || h->n_grp < 1 || h->n_grp > h->T) {
        atomic_store(&k->broken, 1);
        return base_fail(err, errlen, STRATA_EIO, "mpi: rank %d got a pass it cannot take (no model loaded or a bad header)", k->pub.rank);
    }
    if ((rc = clu_recv(k, k->meta, (size_t)h->body, k->prev, TAG_BODY, what, err, errlen))) return rc;
    const int64_t Hd = api_model_cfg(k->m)->hidden;
    int64_t stride;
    float *res = engine_res(k->e, &stride);
    if ((rc = clu_recv_blocks(k, res, stride, h->T * Hd, h->nb, k->prev, what, err, errlen))) return rc;
    /* the rows: each group's slot and row count, then the ids */
    int bad = 0;
    int64_t t = 0;
    const int32_t *ids = k->meta + 2 * h->n_grp;
    for (int32_t g = 0; g < h->n_grp && !bad; g++) {
        const int32_t slot = k->meta[2 * g], n = k->meta[2 * g + 1];
        if (slot < 0 || slot >= k->ld.o.max_seqs || n < 1 || t + n > h->T) { bad = 1; break; }
        for (int32_t i = 0; i < n; i++, t++) k->rows[t] = (infer_row){k->seqs[slot], ids[t], 0};
    }
    const int64_t want = infer_blocks_before(api_model_cfg(k->m), k->my.hi);
    char nm[96];
    stage_name(k, k->pub.rank, nm, sizeof nm);
    int st = 0;
    if (bad || t != h->T) {
        st = STRATA_EIO;
        snprintf(msg, sizeof msg, "mpi: %s: a pass with bad rows", nm);
    } else if (k->ctl_bad) {
        st = k->ctl_bad;
        snprintf(msg, sizeof msg, "mpi: %s: %s", nm, k->ctl_msg);
    } else if (h->nb != infer_blocks_before(api_model_cfg(k->m), k->my.lo)) {
        st = STRATA_EIO;
        snprintf(msg, sizeof msg, "mpi: %s: a pass with %lld residual blocks, expected %lld", nm, (long long)h->nb + 1,
                 (long long)infer_blocks_before(api_model_cfg(k->m), k->my.lo) + 1);
    } else if ((st = engine_stage_step(k->e, k->rows, h->T))) {
        snprintf(msg, sizeof msg, "%s on %s: %s", nm, k->host, engine_errmsg(k->e));
    }
    k->passes++;
    if (st) {
        h->status = st;
        h->body = (int64_t)strlen(msg) + 1;
        h->nb = 0;
        return clu_send_msg(k, h, msg, NULL, 0, 0, dst, "passing a stage's error on", err, errlen);
    }
    h->nb = want;
    if (dst == 0) h->body = 0; /* rank 0 knows the rows */
    snprintf(what, sizeof what, "sending the pass to rank %d", dst);
    return clu_send_msg(k, h, k->meta, res, stride, h->T * Hd, dst, what, err, errlen);
}

int strata_mpi_work(strata_cluster *cl, char *err, size_t errlen) {
    clu *k = (clu *)cl;
    if (cl->rank == 0) return base_fail(err, errlen, STRATA_EINVAL, "mpi: rank 0 drives the model; only the other ranks work");
    clu_reply *rep = base_alloc(sizeof *rep, MEM_MISC);
    clu_load *ld = base_alloc(sizeof *ld, MEM_MISC);
    if (!rep || !ld) { base_free(rep); base_free(ld); return base_fail(err, errlen, STRATA_ENOMEM, "mpi: out of memory"); }
    int rc = 0;
    char what[64];
    snprintf(what, sizeof what, "waiting for rank %d", k->prev);
    for (;;) {
        clu_hdr h;
        if ((rc = clu_recv(k, &h, sizeof h, k->prev, TAG_RING, what, err, errlen))) break;
        if (h.magic != CLU_MAGIC) { rc = base_fail(err, errlen, STRATA_EIO, "mpi: rank %d: a message that is not ours", cl->rank); break; }
        const int fwd = h.op != OP_STEP && h.op != OP_PING && k->next != 0; /* control travels on first */
        if (h.op == OP_LOAD) {
            if (h.body != (int64_t)sizeof *ld) { rc = base_fail(err, errlen, STRATA_EIO, "mpi: a load message of the wrong size"); break; }
            if ((rc = clu_recv(k, ld, sizeof *ld, k->prev, TAG_BODY, what, err, errlen))) break;
        }
        if (fwd && (rc = clu_send_msg(k, &h, ld, NULL, 0, 0, k->next, "passing a message on", err, errlen))) break;
        if (h.op == OP_EXIT) break;
        switch (h.op) {
        case OP_LOAD:
            if (k->m) stage_close(k);
            k->ld = *ld;
            k->ld.dir[sizeof k->ld.dir - 1] = k->ld.pack[sizeof k->ld.pack - 1] = 0;
            stage_load(k, rep);
            rc = clu_send(k, rep, sizeof *rep, 0, TAG_REPLY, "replying to rank 0", err, errlen);
            break;
        case OP_STATS:
            fill_reply(k, rep);
            rc = clu_send(k, rep, sizeof *rep, 0, TAG_REPLY, "replying to rank 0", err, errlen);
            break;
        case OP_CTL: stage_ctl(k, &h); break;
        case OP_CLOSE: if (k->m) stage_close(k); break;
        case OP_STEP: rc = stage_step(k, &h, err, errlen); break;
        case OP_PING: /* a network probe: the body goes round the ring */
            if (h.body < 0 || (uint64_t)h.body > PING_MAX) { rc = base_fail(err, errlen, STRATA_EIO, "mpi: a probe of %lld bytes", (long long)h.body); break; }
            if (!k->ping && !(k->ping = base_alloc(PING_MAX, MEM_IO))) { rc = base_fail(err, errlen, STRATA_ENOMEM, "mpi: out of memory"); break; }
            if (h.body && (rc = clu_recv(k, k->ping, (size_t)h.body, k->prev, TAG_BODY, what, err, errlen))) break;
            rc = clu_send_msg(k, &h, k->ping, NULL, 0, 0, k->next, "passing a probe on", err, errlen);
            break;
        default: rc = base_fail(err, errlen, STRATA_EIO, "mpi: rank %d: unknown message %u", cl->rank, h.op);
        }
        if (rc) break;
    }
    if (k->m) stage_close(k);
    base_free(rep);
    base_free(ld);
    base_free(k->ping);
    k->ping = NULL;
    if (rc) atomic_store(&k->broken, 1); /* rank 0 would wait for this rank forever */
    return rc;
}

/* ================================================================ public */

int strata_mpi_rank(const strata_cluster *cl) { return cl ? cl->rank : 0; }
int strata_mpi_size(const strata_cluster *cl) { return cl ? cl->size : 1; }
void strata_mpi_quick_check(strata_cluster *cl) {
    clu *k = (clu *)cl;
    if (!k || !k->ready || k->pub.size < 2) return;
    int64_t none = -1; /* a check already running keeps its start */
    atomic_compare_exchange_strong(&k->quick_ms, &none, clu_ms(k));
}

int strata_mpi_broken(const strata_cluster *cl) { return cl ? atomic_load(&((const clu *)cl)->broken) : 0; }

static void hello_of(clu_hello *h, const char *host) {
    memset(h, 0, sizeof *h);
    h->magic = CLU_MAGIC;
    h->proto = CLU_PROTO;
    const char *fake = getenv("STRATA_MPI_FAKE_VERSION"); /* tests: a rank that claims another version */
    snprintf(h->version, sizeof h->version, "%s", fake && *fake ? fake : STRATA_VERSION);
    /* same version and protocol, same message layouts: the build facts that matter */
    snprintf(h->build, sizeof h->build, "hdr %zu load %zu reply %zu; %s", sizeof(clu_hdr), sizeof(clu_load), sizeof(clu_reply),
#ifdef __VERSION__
             __VERSION__
#else
             "cc"
#endif
    );
    snprintf(h->host, sizeof h->host, "%s", host);
}

/* Start-up: every rank's version, protocol and build facts to rank 0, which
 * refuses any difference and tells everyone (nonblocking, with a deadline, so a
 * rank that never arrives does not hang the others forever). */
static int hello(clu *k, char *err, size_t errlen) {
    const int n = k->pub.size;
    clu_hello mine;
    hello_of(&mine, k->host);
    clu_hello *all = k->pub.rank == 0 ? base_calloc((size_t)n, sizeof *all, MEM_MISC) : NULL;
    if (k->pub.rank == 0 && !all) return base_fail(err, errlen, STRATA_ENOMEM, "mpi: out of memory");
    struct { int32_t ok; char msg[1024]; } verdict = {1, ""};
    MPI_Request q;
    int rc = 0;
    MPI_Igather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, 0, k->comm, &q);
    double t0 = clu_now();
    for (int done = 0; !done;) {
        MPI_Test(&q, &done, MPI_STATUS_IGNORE);
        if (!done && clu_now() - t0 > HELLO_TIMEOUT_S) { rc = base_fail(err, errlen, STRATA_EIO, "mpi: not every rank started within %.0f s", HELLO_TIMEOUT_S); break; }
        if (!done) usleep(200);
    }
    if (!rc && k->pub.rank == 0)
        for (int r = 1; r < n && verdict.ok; r++) {
            const clu_hello *h = &all[r];
            if (h->magic != CLU_MAGIC || h->proto != mine.proto || strcmp(h->version, mine.version) || strcmp(h->build, mine.build)) {
                verdict.ok = 0;
                snprintf(verdict.msg, sizeof verdict.msg,
                         "mpi: rank %d on %.60s runs strata %.30s (protocol %u; %.90s), rank 0 on %.60s runs strata %.30s (protocol %u; "
                         "%.90s): every rank must run the same binary",
                         r, h->host, h->magic == CLU_MAGIC ? h->version : "?", h->proto, h->build, mine.host, mine.version, mine.proto,
                         mine.build);
            }
        }
    base_free(all);
    if (rc) return rc;
    MPI_Ibcast(&verdict, sizeof verdict, MPI_BYTE, 0, k->comm, &q);
    t0 = clu_now();
    for (int done = 0; !done;) {
        MPI_Test(&q, &done, MPI_STATUS_IGNORE);
        if (!done && clu_now() - t0 > HELLO_TIMEOUT_S) return base_fail(err, errlen, STRATA_EIO, "mpi: rank 0 did not answer the start-up");
        if (!done) usleep(200);
    }
    if (!verdict.ok) return base_fail(err, errlen, STRATA_EINVAL, "%s", verdict.msg);
    return 0;
}

int strata_mpi_init(int *argc, char ***argv, strata_cluster **out, char *err, size_t errlen) {
    *out = NULL;
    int provided = 0, flag = 0;
    MPI_Initialized(&flag);
    if (!flag && MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return base_fail(err, errlen, STRATA_EIO, "mpi: MPI_Init_thread failed");
    if (flag) MPI_Query_thread(&provided);
    clu *k = base_calloc(1, sizeof *k, MEM_MISC);
    if (!k) return base_fail(err, errlen, STRATA_ENOMEM, "mpi: out of memory");
    *out = &k->pub;
    k->t0 = clu_now();
    pthread_mutex_init(&k->mu, NULL);
    pthread_mutex_init(&k->hb_mu, NULL);
    pthread_cond_init(&k->hb_cv, NULL);
    MPI_Comm_dup(MPI_COMM_WORLD, &k->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &k->hbcomm);
    MPI_Comm_set_errhandler(k->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(k->hbcomm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(k->comm, &k->pub.rank);
    MPI_Comm_size(k->comm, &k->pub.size);
    k->pub.stage = clu_stage;
    k->pub.attach = clu_attach;
    k->pub.detach = clu_detach;
    k->prev = (k->pub.rank + k->pub.size - 1) % k->pub.size;
    k->next = (k->pub.rank + 1) % k->pub.size;
    int hl = 0;
    char hn[MPI_MAX_PROCESSOR_NAME];
    MPI_Get_processor_name(hn, &hl);
    snprintf(k->host, sizeof k->host, "%.*s", hl, hn);
    k->timeout = 5.0;
    atomic_store(&k->quick_ms, -1);
    const char *t = getenv("STRATA_MPI_TIMEOUT");
    double tv;
    if (t && *t && !base_parse_f64(t, 0.5, 86400, &tv)) k->timeout = tv;
    const char *d = getenv("STRATA_MPI_STEP_DELAY_MS");
    int64_t dv;
    if (d && *d && !base_parse_i64(d, 0, 60000, &dv)) k->delay_ms = (int)dv;
    if (provided < MPI_THREAD_SERIALIZED)
        return base_fail(err, errlen, STRATA_EINVAL, "mpi: this MPI library offers thread level %d; strata needs MPI_THREAD_SERIALIZED", provided);
    if (k->pub.size > CLU_MAX_RANKS) return base_fail(err, errlen, STRATA_EINVAL, "mpi: at most %d ranks", CLU_MAX_RANKS);
    const int n = k->pub.size;
    k->heard_ms = base_calloc((size_t)n, sizeof *k->heard_ms, MEM_MISC);
    k->hb_r = base_alloc((size_t)n * sizeof *k->hb_r, MEM_MISC);
    k->hb_s = base_alloc((size_t)n * sizeof *k->hb_s, MEM_MISC);
    k->hb_rbuf = base_calloc((size_t)n, sizeof *k->hb_rbuf, MEM_MISC);
    k->rep = base_calloc((size_t)n, sizeof *k->rep, MEM_MISC);
    if (!k->heard_ms || !k->hb_r || !k->hb_s || !k->hb_rbuf || !k->rep) return base_fail(err, errlen, STRATA_ENOMEM, "mpi: out of memory");
    for (int r = 0; r < n; r++) k->hb_r[r] = k->hb_s[r] = MPI_REQUEST_NULL;
    int rc = hello(k, err, errlen);
    if (rc == STRATA_EIO) atomic_store(&k->broken, 1); /* a rank never arrived; a refusal was agreed by all */
    if (rc) return rc;
    for (int r = 0; r < n; r++) atomic_store(&k->heard_ms[r], clu_ms(k));
    if (n > 1) {
        if (pthread_create(&k->hb, NULL, hb_main, k)) return base_fail(err, errlen, STRATA_ENOMEM, "mpi: cannot start the heartbeat thread");
        k->hb_started = 1;
    }
    k->ready = 1;
    return 0;
}

void strata_mpi_print_stages(const strata_cluster *cl, FILE *f) {
    const clu *k = (const clu *)cl;
    if (!cl || cl->rank != 0 || cl->size < 2 || !k->attached) return;
    for (int r = 0; r < cl->size; r++) {
        const int64_t lo = k->ld.lo[r], hi = k->ld.hi[r];
        if (r == 0) {
            fprintf(f, "mpi: rank 0 on %s: layers %lld-%lld, embedding and head\n", k->host, (long long)lo, (long long)hi - 1);
            continue;
        }
        const clu_reply *p = &k->rep[r];
        fprintf(f, "mpi: rank %d on %s: layers %lld-%lld, %s, planned %.3f GB of %.3f GB\n", r, p->host, (long long)lo, (long long)hi - 1,
                p->placement, (double)p->plan / 1e9, (double)p->budget / 1e9);
    }
}

int strata_mpi_stats(strata_cluster *cl, strata_mpi_rank_stats *out, int max, char *err, size_t errlen) {
    clu *k = (clu *)cl;
    if (cl->rank != 0) return base_fail(err, errlen, STRATA_EINVAL, "mpi: stats are gathered by rank 0");
    if (atomic_load(&k->broken)) return base_fail(err, errlen, STRATA_EIO, "mpi: the cluster failed earlier");
    if (max < cl->size) return base_fail(err, errlen, STRATA_EINVAL, "mpi: room for %d ranks, %d needed", max, cl->size);
    memset(out, 0, (size_t)cl->size * sizeof *out);
    out[0].rank = 0;
    out[0].layer_lo = k->my.lo;
    out[0].layer_hi = k->my.hi;
    out[0].net_sent = k->net_sent;
    out[0].net_recv = k->net_recv;
    out[0].passes = k->passes;
    if (k->m0) {
        strata_model_info in;
        strata_model_get_info(k->m0, &in);
        strata_model_get_stats(k->m0, &out[0].st);
        out[0].budget_bytes = in.budget_bytes;
        out[0].plan_bytes = in.plan_bytes;
    }
    if (cl->size < 2 || !k->attached) return 1;
    clu_hdr h = {CLU_MAGIC, OP_STATS, 0, 0, 0, 0, 0, 0, 0, 0};
    int rc = clu_send_msg(k, &h, NULL, NULL, 0, 0, k->next, "asking for stats", err, errlen);
    for (int r = 1; r < cl->size && !rc; r++) {
        clu_reply p;
        if ((rc = clu_recv(k, &p, sizeof p, r, TAG_REPLY, "waiting for stats", err, errlen))) break;
        out[r] = (strata_mpi_rank_stats){r, p.lo, p.hi, p.st, p.budget, p.plan, p.net_sent, p.net_recv, p.passes};
    }
    return rc ? rc : cl->size;
}

/* One trip of n bytes round the ring (rank 0 -> 1 -> ... -> 0), in seconds. */
static int ring_trip(clu *k, size_t n, double *s, char *err, size_t errlen) {
    clu_hdr h = {CLU_MAGIC, OP_PING, 0, 0, 0, 0, 0, 0, 0, (int64_t)n}, r;
    const double t0 = clu_now();
    int rc = clu_send_msg(k, &h, k->ping, NULL, 0, 0, k->next, "sending a probe", err, errlen);
    if (!rc) rc = clu_recv(k, &r, sizeof r, k->pub.size - 1, TAG_RING, "waiting for a probe", err, errlen);
    if (!rc && n) rc = clu_recv(k, k->ping, n, k->pub.size - 1, TAG_BODY, "waiting for a probe", err, errlen);
    *s = clu_now() - t0;
    return rc;
}

int strata_mpi_measure_net(strata_cluster *cl, double *bw, double *lat, char *err, size_t errlen) {
    clu *k = (clu *)cl;
    if (!cl || cl->rank != 0 || cl->size < 2) return base_fail(err, errlen, STRATA_EINVAL, "mpi: measuring the network needs 2 ranks or more");
    if (atomic_load(&k->broken)) return base_fail(err, errlen, STRATA_EIO, "mpi: the cluster failed earlier");
    const size_t big = 16u << 20;
    if (!k->ping && !(k->ping = base_calloc(1, PING_MAX, MEM_IO))) return base_fail(err, errlen, STRATA_ENOMEM, "mpi: out of memory");
    double small = 1e30, large = 1e30, t;
    int rc = 0;
    for (int i = 0; i < 50 && !rc; i++) if (!(rc = ring_trip(k, 8, &t, err, errlen)) && t < small) small = t;
    for (int i = 0; i < 8 && !rc; i++) if (!(rc = ring_trip(k, big, &t, err, errlen)) && t < large) large = t;
    if (rc) return rc;
    /* per hop: a small message's time, and the large body's extra time */
    *lat = small / cl->size;
    *bw = large > small ? (double)big * cl->size / (large - small) : 0;
    return 0;
}

void strata_mpi_print_report(strata_cluster *cl, FILE *f) {
    if (!cl || cl->rank != 0 || cl->size < 2) return;
    strata_mpi_rank_stats s[CLU_MAX_RANKS];
    char err[512];
    int n = strata_mpi_stats(cl, s, CLU_MAX_RANKS, err, sizeof err);
    if (n < 0) { fprintf(f, "mpi: no stats: %s\n", err); return; }
    /* the columns: the counters strata_stats_fields places in this table (read,
     * experts, peak RSS) at their positions, the cluster's own in the others */
    static const struct { const char *title; int width; } own[] = {{"rank", 5}, {"layers", 9}, {"sent MB", 12}, {"recv MB", 12}};
    enum { N_OWN = 4, MAX_COL = 16 };
    int nf, ncol = N_OWN;
    const strata_stat_field *sf = strata_stats_fields(&nf), *col[MAX_COL] = {0};
    for (int i = 0; i < nf; i++)
        if (sf[i].col > 0 && sf[i].col <= MAX_COL && ncol < MAX_COL) col[sf[i].col - 1] = &sf[i], ncol++;
    int which[MAX_COL]; /* own column of a slot without a counter */
    for (int c = 0, k = 0; c < ncol; c++) which[c] = col[c] ? -1 : k < N_OWN ? k++ : -2;
    fputs("mpi:", f);
    for (int c = 0; c < ncol; c++)
        if (col[c]) fprintf(f, " %*s", col[c]->col_width, col[c]->col_title);
        else if (which[c] >= 0) fprintf(f, " %*s", own[which[c]].width, own[which[c]].title);
    fputc('\n', f);
    uint64_t rd = 0, sent = 0;
    for (int r = 0; r < n; r++) {
        const strata_stats *t = &s[r].st;
        rd += t->bytes_read;
        sent += s[r].net_sent;
        char lay[32];
        snprintf(lay, sizeof lay, "%lld-%lld", (long long)s[r].layer_lo, (long long)s[r].layer_hi - 1);
        fputs("mpi:", f);
        for (int c = 0; c < ncol; c++) {
            if (col[c]) fprintf(f, " %*.3f", col[c]->col_width, strata_stat_value(t, col[c]) / col[c]->col_scale);
            else if (which[c] == 0) fprintf(f, " %*d", own[0].width, r);
            else if (which[c] == 1) fprintf(f, " %*s", own[1].width, lay);
            else if (which[c] >= 2)
                fprintf(f, " %*.3f", own[which[c]].width, (double)(which[c] == 2 ? s[r].net_sent : s[r].net_recv) / 1e6);
        }
        fputc('\n', f);
    }
    fprintf(f, "mpi: all ranks read %.3f GB and sent %.3f MB in %llu passes\n", (double)rd / 1e9, (double)sent / 1e6,
            (unsigned long long)s[0].passes);
}

int strata_mpi_finalize(strata_cluster *cl, int failed) {
    clu *k = (clu *)cl;
    if (!k) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin) MPI_Finalize();
        return failed ? 1 : 0;
    }
    int ok = !atomic_load(&k->broken); /* a command that failed still finishes cleanly */
    char e2[256];
    if (ok && k->ready && cl->rank == 0 && cl->size > 1) {
        clu_hdr h = {CLU_MAGIC, OP_EXIT, 0, 0, 0, 0, 0, 0, 0, 0};
        if (clu_send_msg(k, &h, NULL, NULL, 0, 0, k->next, "stopping the other ranks", e2, sizeof e2)) ok = 0;
    }
    hb_stop(k);
    if (!ok) MPI_Abort(MPI_COMM_WORLD, 1); /* a dead rank would make a clean finalize hang */
    /* heartbeats: cancel the receives, let the (4-byte, eager) sends finish */
    for (int r = 0; r < cl->size; r++) {
        if (k->hb_r && k->hb_r[r] != MPI_REQUEST_NULL) { MPI_Cancel(&k->hb_r[r]); MPI_Wait(&k->hb_r[r], MPI_STATUS_IGNORE); }
        if (k->hb_s && k->hb_s[r] != MPI_REQUEST_NULL) MPI_Wait(&k->hb_s[r], MPI_STATUS_IGNORE);
    }
    MPI_Barrier(k->comm);
    MPI_Comm_free(&k->hbcomm);
    MPI_Comm_free(&k->comm);
    MPI_Finalize();
    base_free(k->heard_ms);
    base_free(k->hb_r);
    base_free(k->hb_s);
    base_free(k->hb_rbuf);
    base_free(k->rep);
    pthread_mutex_destroy(&k->mu);
    pthread_mutex_destroy(&k->hb_mu);
    pthread_cond_destroy(&k->hb_cv);
    base_free(k);
    return failed ? 1 : 0;
}
