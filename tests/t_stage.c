/*
 * t_stage.c: pipeline stages without MPI. A first-stage engine linked to two
 * stage engines in this process (the link copies the residual blocks from one
 * engine to the next, as strata-mpi's ring does between ranks) must give the
 * single engine's logits bit for bit: prefill, decode, two sequences in one
 * step, speculation rolled back; and the cluster split and the stage plans must
 * hold together. strata-mpi itself is tested under mpirun by tests/mpi/run.sh.
 */
#include <string.h>
#include "cfg.h"
#include "infer.h"
#include "model.h"
#include "place.h"
#include "preset.h"
#include "sample.h"
#include "st.h"
#include "test.h"

#define N_SEQ 2

typedef struct chain {
    engine *st[2];             /* the stages after the first */
    session *seqs[2][N_SEQ];   /* each stage's sessions, by slot */
    int used[N_SEQ];
    infer_row rows[64];
    int64_t hi[2];             /* where each stage ends */
    int64_t passes;
    engine_link link;
} chain;

/* The link: the pass's residual blocks into each stage engine in turn, its
 * rows from the slots, engine_stage_step, and the blocks after the last layer
 * back into the first engine. */
static int chain_pass(void *ud, const engine_pass *p, char *err, size_t errlen) {
    chain *ch = ud;
    const float *src = p->res;
    int64_t src_stride = p->stride, nb = p->nb_have, stride = 0;
    float *dst = NULL;
    for (int k = 0; k < 2; k++) {
        dst = engine_res(ch->st[k], &stride);
        for (int64_t i = 0; i <= nb; i++) memcpy(dst + i * stride, src + i * src_stride, (size_t)(p->T * p->hidden) * sizeof(float));
        int64_t t = 0;
        for (int64_t g = 0; g < p->n_grp; g++)
            for (int64_t r = p->g_r0[g]; r < p->g_r0[g + 1]; r++, t++) ch->rows[t] = (infer_row){ch->seqs[k][p->g_slot[g]], p->ids[t], 0};
        int rc = engine_stage_step(ch->st[k], ch->rows, p->T);
        if (rc) { snprintf(err, errlen, "stage %d: %s", k + 1, engine_errmsg(ch->st[k])); return rc; }
        src = dst;
        src_stride = stride;
        nb = infer_blocks_before(engine_cfg(ch->st[k]), ch->hi[k]);
    }
    if (nb != p->nb_want) { snprintf(err, errlen, "%lld blocks after the last stage, %lld wanted", (long long)nb, (long long)p->nb_want); return STRATA_EINVAL; }
    for (int64_t i = 0; i <= nb; i++) memcpy(p->res + i * p->stride, src + i * src_stride, (size_t)(p->T * p->hidden) * sizeof(float));
    ch->passes++;
    return 0;
}

static int chain_open(void *ud, int32_t *slot, char *err, size_t errlen) {
    chain *ch = ud;
    for (int i = 0; i < N_SEQ; i++)
        if (!ch->used[i]) { ch->used[i] = 1; *slot = i; return 0; }
    snprintf(err, errlen, "no slot");
    return STRATA_EBUSY;
}

static void chain_event(void *ud, int32_t slot, int ev, int64_t arg) {
    chain *ch = ud;
    for (int k = 0; k < 2; k++) {
        session *s = ch->seqs[k][slot];
        if (ev == ENGINE_EV_RESET) session_reset(s);
        else if (ev == ENGINE_EV_SPEC_BEGIN) session_spec_begin(s);
        else if (ev == ENGINE_EV_SPEC_END) session_spec_end(s, arg);
        else if (ev == ENGINE_EV_CLOSE) ch->used[slot] = 0;
    }
}

static const int32_t k_prompt[] = {1, 17, 42, 9, 250, 3, 88, 130, 7};
#define NP ((int64_t)(sizeof k_prompt / sizeof k_prompt[0]))

/* Prefill, 6 greedy decode steps, a step with both sequences, then a drafted
 * pass of 3 rows rolled back to 1: every logits row into L (in order). */
static int64_t script(engine *e, session *a, session *b, float *L) {
    const int64_t V = engine_cfg(e)->vocab;
    int64_t n = 0;
    if (session_eval(a, k_prompt, NP, L + n++ * V)) return -1;
    if (session_eval(b, k_prompt + 2, 4, L + n++ * V)) return -1;
    for (int i = 0; i < 6; i++) {
        int32_t id = sample_argmax(L + (n - 1) * V, V);
        if (session_eval(a, &id, 1, L + n++ * V)) return -1;
    }
    infer_row r[3] = {{a, 5, 1}, {b, 6, 1}, {b, 7, 1}};
    if (engine_step(e, r, 3, L + n * V)) return -1;
    n += 3;
    if (session_spec_begin(a)) return -1;
    infer_row d[3] = {{a, 11, 1}, {a, 12, 1}, {a, 13, 1}};
    if (engine_step(e, d, 3, L + n * V)) return -1;
    n += 3;
    if (session_spec_end(a, 1)) return -1;
    int32_t id = 99;
    if (session_eval(a, &id, 1, L + n++ * V)) return -1;
    return n;
}

TEST(stage_chain_bits) {
    const char *d = t_model("m_stage", "tiny", 3, 0);
    char cmd[1024], err[512];
    CHECK(d != NULL);
    if (!d) return;
    cfg c;
    st_index *ix = NULL;
    wsrc *w = NULL;
    snprintf(cmd, sizeof cmd, "%s/config.json", d);
    CHECK(cfg_load(&c, cmd, err, sizeof err) == 0);
    CHECK(st_open(&ix, d, err, sizeof err) == 0);
    CHECK(wsrc_resident_open(&w, &c, ix, err, sizeof err) == 0);
    if (!w) { st_close(ix); return; }
    const int64_t V = c.vocab, nl = c.n_layers, a = 2, b = nl - 3; /* stages [0,2) [2,nl-3) [nl-3,nl) */
    float *L1 = base_alloc((size_t)(32 * V) * sizeof(float), MEM_MISC), *L2 = base_alloc((size_t)(32 * V) * sizeof(float), MEM_MISC);
    /* one engine */
    engine *e1 = NULL;
    session *s1[2] = {NULL, NULL};
    engine_opts eo = {.n_threads = 2, .prefill_chunk = 4, .spec_rows = 4};
    CHECK(engine_create(&e1, &c, w, &eo, err, sizeof err) == 0);
    for (int i = 0; i < 2; i++) CHECK(session_create(&s1[i], e1, 64, err, sizeof err) == 0);
    const int64_t n1 = script(e1, s1[0], s1[1], L1);
    CHECK(n1 > 0);
    /* three stages */
    chain ch;
    memset(&ch, 0, sizeof ch);
    engine *e0 = NULL;
    engine_opts o0 = eo, oa = eo, ob = eo;
    o0.layer_hi = a;
    oa.layer_lo = a;
    oa.layer_hi = b;
    ob.layer_lo = b;
    CHECK(engine_create(&e0, &c, w, &o0, err, sizeof err) == 0);
    CHECK(engine_create(&ch.st[0], &c, w, &oa, err, sizeof err) == 0);
    CHECK(engine_create(&ch.st[1], &c, w, &ob, err, sizeof err) == 0);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_SEQ; i++) CHECK(session_create(&ch.seqs[k][i], ch.st[k], 64, err, sizeof err) == 0);
    ch.hi[0] = b;
    ch.hi[1] = nl;
    ch.link = (engine_link){&ch, chain_pass, chain_open, chain_event};
    engine_set_link(e0, &ch.link);
    session *s0[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) CHECK(session_create(&s0[i], e0, 64, err, sizeof err) == 0);
    const int64_t n2 = script(e0, s0[0], s0[1], L2);
    CHECK_MSG(n2 == n1, "%lld vs %lld rows (%s)", (long long)n2, (long long)n1, engine_errmsg(e0));
    if (n1 > 0 && n2 == n1) CHECK_MSG(memcmp(L1, L2, (size_t)(n1 * V) * sizeof(float)) == 0, "staged logits differ");
    CHECK(ch.passes >= 8);
    /* a stage engine is driven by engine_stage_step only; state files need every layer */
    infer_row r = {ch.seqs[0][0], 1, 1};
    CHECK(engine_step(ch.st[0], &r, 1, L2) == STRATA_EINVAL);
    CHECK(session_save(s0[0], "/nonexistent/x", err, sizeof err) == STRATA_EINVAL && strstr(err, "across ranks"));
    /* the planner's bytes for a stage's sequences are what session_create allocates */
    CHECK(infer_session_bytes_range(&c, 64, 0, nl) == infer_session_bytes(&c, 64));
    for (int i = 0; i < 2; i++) { session_free(s0[i]); session_free(s1[i]); }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < N_SEQ; i++) session_free(ch.seqs[k][i]);
    for (int i = 0; i < N_SEQ; i++) CHECK(ch.used[i] == 0);
    engine_free(e0);
    engine_free(ch.st[0]);
    engine_free(ch.st[1]);
    engine_free(e1);
    base_free(L1);
    base_free(L2);
    w->ops->close(w);
    st_close(ix);
}

/* The split covers every layer once, in order, each stage non-empty; the
 * largest stage is no larger than an even split's; stage plans hold only their
 * own units and the whole K3 fits 16 x 128 GB with nothing read per token. */
TEST(stage_split_and_plans) {
    cfg c;
    gen_opts go;
    char err[2048];
    CHECK(preset_get("k3", &c, &go) == 0);
    static const int k_ranks[] = {1, 2, 4, 8, 16, 93};
    for (size_t i = 0; i < sizeof k_ranks / sizeof k_ranks[0]; i++) {
        int64_t lo[128], hi[128];
        const int n = k_ranks[i];
        const uint64_t worst = place_cluster_split(&c, NULL, n, lo, hi);
        int64_t next = 0;
        uint64_t mx = 0;
        for (int r = 0; r < n; r++) {
            CHECK(lo[r] == next && hi[r] > lo[r]);
            next = hi[r];
            const uint64_t sb = place_stage_bytes(&c, NULL, lo[r], hi[r], r == 0);
            if (sb > mx) mx = sb;
        }
        CHECK(next == c.n_layers);
        CHECK(mx == worst);
        /* no worse than cutting every n_layers / n layers */
        uint64_t even = 0;
        for (int r = 0; r < n; r++) {
            const uint64_t sb = place_stage_bytes(&c, NULL, c.n_layers * r / n, c.n_layers * (r + 1) / n, r == 0);
            if (sb > even) even = sb;
        }
        CHECK(worst <= even);
    }
    /* 16 x 128 GB: every stage resident, no reads per token */
    int64_t lo[16], hi[16];
    place_cluster_split(&c, NULL, 16, lo, hi);
    static place_plan q;
    for (int r = 0; r < 16; r++) {
        place_opts o = place_opts_default();
        o.ram_bytes = 128000000000ull;
        o.layer_lo = lo[r];
        o.layer_hi = hi[r];
        o.no_head = r > 0;
        o.seq_bytes = infer_session_bytes_range(&c, 4096, lo[r], hi[r]);
        CHECK_MSG(place_plan_compute(&c, NULL, NULL, &o, &q, err, sizeof err) == 0, "rank %d: %s", r, err);
        CHECK(q.n_owned == hi[r] - lo[r] + (r == 0));
        CHECK(q.n_pinned == q.n_units);
        CHECK(q.n_expert_slots >= q.n_moe * c.n_experts);
        CHECK(q.read_bytes_per_token == (r == 0 ? q.embed_row_bytes : 0));
        CHECK(q.total_bytes <= o.ram_bytes);
    }
}

/* strata plan --ranks: a row per rank, the prediction, one machine beside it;
 * more ranks than layers is a usage error. */
TEST(stage_plan_cli) {
    char cmd[1024];
    char *out = NULL;
    const char *p = t_model("m_stage_plan", "tiny", 5, 0);
    CHECK(p != NULL);
    if (!p) return;
    snprintf(cmd, sizeof cmd, "./strata plan %s --ranks 3 --ram-gb 0.5 --disk-gbs 2 --mem-gbs 20 --net-gbs 1.25 --net-lat-us 50", p);
    CHECK(t_run(cmd, &out) == 0);
    CHECK_MSG(out && strstr(out, "cluster plan: 3 ranks x 0.5 GB") && strstr(out, "predicted decode (one sequence)") &&
                  strstr(out, "one machine of 0.5 GB") && strstr(out, "\n     2  "),
              "%s", out ? out : "");
    base_free(out);
    out = NULL;
    snprintf(cmd, sizeof cmd, "./strata plan %s --ranks 9 --ram-gb 0.5", p);
    CHECK(t_run(cmd, &out) == 2);
    CHECK(out && strstr(out, "at most one rank per layer"));
    base_free(out);
}
