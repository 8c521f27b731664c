/*
 * sched.c: the engine thread (see sched.h).
 *
 * Locks: s->mu guards the queue, the slots' job pointers, the counts and the
 * reference counts; each job's mu guards its output. The engine never holds s->mu
 * while stepping, and takes a job's mu only to publish text, so a waiter is never
 * blocked behind a step and submitting never waits for one.
 */
#include "sched.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SCHED_MAX_END 16

struct sched {
    strata_model *m;
    strata_model_opts mopts;
    strata_tokenizer *tk;
    sched_opts o;
    metrics *mt;
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;               /* engine wake-up: submit, cancel, shutdown */
    int state;                       /* 0 loading, 1 ready, -1 load failed */
    char load_err[1024];
    int load_rc;                     /* the STRATA_E* code of a failed load */
    int draining, cancel_all, stopping;
    job *q_head, *q_tail;
    int n_queued, n_active;
    strata_seq **seqs;               /* (parallel) */
    job **slot;                      /* (parallel) job in each sequence, or NULL */
    strata_gen **gens;               /* (parallel) step argument */
    int64_t *fed;                    /* (parallel) prefilled counts before a step */
    int64_t *drafted;                /* (parallel) drafted tokens before a step */
    int32_t end_ids[SCHED_MAX_END];
    int n_end;
    strata_chat_ids ci;              /* the tokenizer's control ids (chat logprobs) */
    strata_model_info info;          /* after the load */
    strata_stats st_load;
};

/* ===== jobs ===== */

job *job_new(void) {
    job *j = strata_calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancelled, 0);
    atomic_init(&j->refs, 1);
    j->slot = -1;
    j->n_group = 1;
    j->notify = j;
    j->stop_hit = -1;
    return j;
}

static void job_unref(job *j);

static void job_destroy(job *j) {
    if (j->notify != j) job_unref(j->notify); /* a member's hold on its leader */
    strata_free(j->group);
    strata_free(j->lp);
    strata_gen_free(j->g);
    if (j->notify == j) strata_grammar_free((strata_grammar *)j->go.grammar); /* members borrow the leader's */
    strata_chat_follow_close(j->follow);
    strata_detok_close(j->ts);
    strata_tool_parser_close(j->tp);
    for (size_t i = 0; i < j->n_calls; i++) {
        strata_free(j->call_name[i]);
        strata_free(j->call_args[i]);
    }
    strata_free(j->call_name);
    strata_free(j->call_args);
    strata_free(j->call_at);
    req_buf_free(&j->pend);
    req_buf_free(&j->content);
    req_buf_free(&j->reasoning);
    strata_free(j->prompt);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    strata_free(j);
}

static void job_unref(job *j) {
    if (atomic_fetch_sub(&j->refs, 1) == 1) job_destroy(j);
}

void job_release(sched *s, job *j) {
    (void)s;
    if (j) job_unref(j);
}

int job_group(job **jobs, int n) {
    job *lead = jobs[0];
    lead->group = strata_calloc((size_t)n, sizeof *lead->group);
    if (!lead->group) return -1;
    for (int k = 0; k < n; k++) {
        lead->group[k] = jobs[k];
        jobs[k]->index = k;
        jobs[k]->n_group = n;
        if (k) {
            jobs[k]->notify = lead;
            atomic_fetch_add(&lead->refs, 1);
        }
    }
    return 0;
}

/* After a change of j (its mu released): wakes whoever waits on j's group. */
static void job_notify(job *j) {
    job *w = j->notify;
    pthread_mutex_lock(&w->mu);
    w->ver++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Marks j finished (reason "stop"/"length"), or failed with status and message. */
static void job_end(job *j, const char *reason, int status, const char *msg) {
    pthread_mutex_lock(&j->mu);
    if (!j->finished) {
        j->finished = 1;
        j->finish_reason = reason && j->n_calls ? "tool_calls" : reason;
        if (status) {
            j->err_status = status;
            snprintf(j->err_msg, sizeof j->err_msg, "%.250s", msg ? msg : "failed");
        }
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_notify(j);
}

/* Publishes text of a channel (1 = reasoning, 0 = response/plain). */
static void job_publish(job *j, int reasoning, const char *p, size_t n) {
    if (!n) return;
    pthread_mutex_lock(&j->mu);
    req_buf_add_utf8(reasoning ? &j->reasoning : &j->content, p, n);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_notify(j);
}

/* Records the log-probabilities of the token just sampled (inside the token
 * callback). Grows amortised, like the text buffers; an allocation failure
 * drops the entry (the text goes on). */
static void job_logprob(job *j, strata_gen *g, int32_t id) {
    lp_ent e;
    e.id = id;
    e.n_top = strata_gen_logprob(g, &e.lp, e.top_ids, e.top_lp);
    if (e.n_top < 0) return;
    pthread_mutex_lock(&j->mu);
    if (j->n_lp == j->cap_lp) {
        const size_t cap = j->cap_lp ? 2 * j->cap_lp : 16;
        lp_ent *p = strata_realloc(j->lp, cap * sizeof *p);
        if (p) { j->lp = p; j->cap_lp = cap; }
    }
    if (j->n_lp < j->cap_lp) j->lp[j->n_lp++] = e;
    pthread_mutex_unlock(&j->mu);
}

/* Response text through the stop-string filter: everything that cannot be the
 * start of a stop string is published; a match publishes what precedes it and
 * returns 1 (the job ends with "stop"). */
static int job_text(job *j, const char *p, size_t n) {
    if (!j->n_stop) { job_publish(j, 0, p, n); return 0; }
    req_buf_add(&j->pend, p, n);
    if (j->pend.oom) return 0;
    size_t cut = j->pend.n;
    int hit = 0;
    for (int k = 0; k < j->n_stop; k++) {
        const size_t L = j->stop_len[k];
        for (size_t i = 0; i + L <= j->pend.n && i < cut; i++)
            if (!memcmp(j->pend.p + i, j->stop[k], L)) { cut = i; hit = 1; j->stop_hit = k; break; }
    }
    if (!hit) {
        /* hold back the longest tail that is a proper prefix of a stop string */
        size_t hold = 0;
        for (int k = 0; k < j->n_stop; k++)
            for (size_t L = j->stop_len[k] - 1; L > hold; L--)
                if (L <= j->pend.n && !memcmp(j->pend.p + j->pend.n - L, j->stop[k], L)) { hold = L; break; }
        cut = j->pend.n - hold;
    }
    job_publish(j, 0, j->pend.p, cut);
    memmove(j->pend.p, j->pend.p + cut, j->pend.n - cut);
    j->pend.n -= cut;
    j->pend.p[j->pend.n] = 0;
    return hit;
}

static void job_flush(job *j);

/* A copy with invalid UTF-8 replaced (a forced call's arguments are whatever
 * the model wrote, and JSON strings must be UTF-8). */
static char *dup_text(const char *s) {
    req_buf b = {0};
    req_buf_add_utf8(&b, s, strlen(s));
    req_buf_add(&b, "", 0);
    if (b.oom) { req_buf_free(&b); return NULL; }
    return b.p;
}

/* Publishes the tool calls the parser has handed out since the last time. */
static void job_calls(job *j) {
    const size_t n = strata_tool_parser_n_calls(j->tp);
    if (n == j->n_calls) return;
    pthread_mutex_lock(&j->mu);
    for (size_t i = j->n_calls; i < n; i++) {
        if (i == j->cap_calls) {
            size_t cap = j->cap_calls ? j->cap_calls * 2 : 4;
            char **a = strata_realloc(j->call_name, cap * sizeof *a);
            if (a) j->call_name = a;
            char **b = a ? strata_realloc(j->call_args, cap * sizeof *b) : NULL;
            if (b) j->call_args = b;
            size_t *at = b ? strata_realloc(j->call_at, cap * sizeof *at) : NULL;
            if (at) j->call_at = at;
            if (!a || !b || !at) break;
            j->cap_calls = cap;
        }
        const strata_chat_call *c = strata_tool_parser_call(j->tp, i);
        char *name = dup_text(c->name), *args = dup_text(c->args);
        if (!name || !args) { strata_free(name); strata_free(args); break; }
        j->call_name[i] = name;
        j->call_args[i] = args;
        j->call_at[i] = j->content.n;
        j->n_calls = i + 1;
    }
    pthread_mutex_unlock(&j->mu);
    job_notify(j);
}

/* Reply text (response or tools channel): through the tool-call parser when the
 * request declared tools, then the stop strings. 1: a stop string matched. */
static int job_reply(job *j, const char *p, size_t n) {
    if (!j->tp) return job_text(j, p, n);
    const char *c;
    size_t cn;
    if (strata_tool_parser_push(j->tp, p, n, &c, &cn)) return 0;
    job_calls(j);
    return job_text(j, c, cn);
}

/* ===== the token callback (engine thread, during strata_gen_step) ===== */

typedef struct step_ctx {
    sched *s;
    double now;
} step_ctx;

static int is_end_id(const sched *s, int32_t id) {
    for (int i = 0; i < s->n_end; i++)
        if (s->end_ids[i] == id) return 1;
    return 0;
}

/* The chat logprobs list the response channel's tokens: a channel tag's ids
 * are recorded while the tag is open and taken back when it closes the
 * response (a broken tag is text, and stays). */
static void chat_logprob(sched *s, job *j, strata_gen *g, int32_t id, int ch_before, int ch_after, int rc) {
    const strata_chat_ids *ci = &s->ci;
    if (id == ci->open || id == ci->close) {
        if (ch_before == STRATA_CHAT_CH_RESPONSE && !j->in_tag) { j->in_tag = 1; j->lp_mark = j->n_lp; }
        return;
    }
    if (j->in_tag && id == ci->sep) {
        j->in_tag = 0;
        if (ch_after != STRATA_CHAT_CH_RESPONSE) {
            pthread_mutex_lock(&j->mu);
            j->n_lp = j->lp_mark;
            pthread_mutex_unlock(&j->mu);
        }
        return;
    }
    if (rc == STRATA_EFORMAT) j->in_tag = 0;
    if (ch_before == STRATA_CHAT_CH_RESPONSE && rc != 1 && id != ci->eos && id != ci->eom && id != ci->sep) job_logprob(j, g, id);
}

static void on_token(void *ud, strata_gen *g, int32_t id, const char *text, size_t len, const float *logits) {
    step_ctx *c = ud;
    job *j = strata_gen_user(g);
    if (id < 0 || j->finished || j->pre) return; /* pre: the leader's prompt pass samples nothing kept */
    j->n_gen++;
    if (j->n_gen == 1) metrics_ttft(c->s->mt, c->now - j->t_submit);
    else metrics_itl(c->s->mt, c->now - j->t_prev);
    j->t_prev = c->now;
    const uint8_t *p = NULL;
    size_t n = 0;
    int ch = STRATA_CHAT_CH_RESPONSE, hit = 0, ended = 0;
    if (j->kind == REQ_CHAT) {
        /* a broken channel tag comes back as text in the current channel */
        const int rc = strata_chat_follow_push(j->follow, id, &ch, &p, &n);
        ended = rc == 1;
        if (j->go.logprobs) chat_logprob(c->s, j, g, id, j->ch_last, ch, rc);
        j->ch_last = ch;
    } else {
        if (j->go.logprobs) job_logprob(j, g, id);
        if (!is_end_id(c->s, id) && strata_detok_push(j->ts, id, &p, &n)) n = 0;
    }
    if (ch == STRATA_CHAT_CH_THINK) {
        j->n_reasoning++;
        job_publish(j, 1, (const char *)p, n);
    } else {
        hit = job_reply(j, (const char *)p, n);
    }
    if (hit) {
        job_end(j, "stop", 0, NULL);
    } else if (ended || (j->tp && strata_tool_parser_done(j->tp))) { /* the turn is over even if its end id is not a stop id */
        job_flush(j);
        job_end(j, "stop", 0, NULL);
    }
}

/* Flushes decoders and held-back text at the end of a generation. */
static void job_flush(job *j) {
    const uint8_t *p = NULL;
    size_t n = 0;
    int ch = STRATA_CHAT_CH_RESPONSE;
    if (j->kind == REQ_CHAT && j->follow) strata_chat_follow_flush(j->follow, &ch, &p, &n);
    else if (j->ts) strata_detok_flush(j->ts, &p, &n);
    if (ch == STRATA_CHAT_CH_THINK) job_publish(j, 1, (const char *)p, n);
    else if (n && job_reply(j, (const char *)p, n)) return;
    if (j->tp) { /* a call cut off comes back as content (or as the forced call) */
        const char *c;
        size_t cn;
        if (!strata_tool_parser_flush(j->tp, &c, &cn)) {
            job_calls(j);
            if (cn && job_text(j, c, cn)) return;
        }
    }
    job_publish(j, 0, j->pend.p, j->pend.n);
    j->pend.n = 0;
}

/* ===== the engine thread ===== */

/* Frees slot i's generator and drops the engine's reference to its job. */
static void slot_clear(sched *s, int i) {
    job *j = s->slot[i];
    if (j->g) {
        int64_t d, a, v;
        strata_gen_spec_stats(j->g, &d, &a, &v);
        if (v) metrics_spec(s->mt, d, a, v);
    }
    strata_gen_free(j->g);
    j->g = NULL;
    s->slot[i] = NULL;
    s->n_active--;
    job_unref(j);
}

/* Ends every unfinished member of j's group (j itself for one choice). */
static void group_fail(job *j, int status, const char *msg) {
    job *lead = j->notify;
    const int n = lead->group ? lead->n_group : 1;
    for (int k = 0; k < n; k++) job_end(lead->group ? lead->group[k] : lead, NULL, status, msg);
}

/* A generator for j over slot i's sequence: prompt[0, n), continuing the
 * sequence (a member after its copy) or from empty. */
static int job_gen(sched *s, job *j, const int32_t *prompt, int64_t n, const strata_gen_opts *go, int cont, char *err, size_t errlen) {
    int rc = strata_gen_create(&j->g, s->seqs[j->slot], prompt, n, go, cont, err, errlen);
    if (rc) return rc;
    j->n_gen_prompt = n;
    strata_gen_set_user(j->g, j);
    return 0;
}

/* The leader's prompt (but its last token) is in: every member's sequence
 * becomes a copy of the leader's and evaluates the last token itself, so each
 * choice is what a single request with its seed gives (batch invariance). With
 * a one-token prompt (no pass before) every member starts from empty. */
static void group_fork(sched *s, job *lead) {
    char err[512];
    const int cont = lead->pre;
    if (lead->pre) {
        strata_gen_free(lead->g);
        lead->g = NULL;
        lead->pre = 0;
    }
    for (int k = 0; k < lead->n_group; k++) {
        job *j = lead->group[k];
        if (j->finished || j->slot < 0) continue;
        int rc = 0;
        if (cont && k) rc = strata_seq_copy(s->seqs[j->slot], s->seqs[lead->slot], err, sizeof err);
        if (!rc && cont) rc = job_gen(s, j, lead->prompt + lead->n_prompt - 1, 1, &j->go, 1, err, sizeof err);
        else if (!rc) rc = job_gen(s, j, lead->prompt, lead->n_prompt, &j->go, 0, err, sizeof err);
        if (rc) { job_end(j, NULL, 500, err); continue; }
        j->prompt_base = cont ? lead->n_prompt - 1 : 0;
    }
}

/* Starts job j in free slot i: its generator over the slot's sequence (a
 * group's leader: the prompt pass of the group; members wait for it). */
static void slot_start(sched *s, int i, job *j) {
    char err[512];
    int rc = 0;
    if (j->kind == REQ_CHAT) rc = strata_chat_follow_open((strata_chat_follow **)&j->follow, s->tk, j->follow_from, err, sizeof err);
    else if (strata_detok_open(&j->ts, s->tk)) rc = strata_fail(err, sizeof err, STRATA_ENOMEM, "out of memory");
    j->go.spec = s->o.spec;
    j->ch_last = j->think_first ? STRATA_CHAT_CH_THINK : STRATA_CHAT_CH_RESPONSE;
    j->go.mtp_draft = s->o.mtp_draft;
    s->slot[i] = j;
    s->n_active++;
    j->slot = i;
    if (j->index > 0) { /* a member: its leader forks it */
        if (rc) job_end(j, NULL, 500, err);
        return;
    }
    if (!rc && j->n_group > 1 && j->n_prompt > 1) {
        strata_gen_opts pre = j->go;
        pre.max_tokens = 1;
        pre.stop_at_end = 0;
        pre.logprobs = pre.top_logprobs = 0;
        pre.spec = 0;
        rc = job_gen(s, j, j->prompt, j->n_prompt - 1, &pre, 0, err, sizeof err);
        j->pre = !rc;
    } else if (!rc && j->n_group == 1) {
        rc = job_gen(s, j, j->prompt, j->n_prompt, &j->go, 0, err, sizeof err);
    }
    if (rc) {
        group_fail(j, rc == STRATA_EINVAL ? 400 : 500, err);
        return;
    }
    pthread_mutex_lock(&j->mu);
    j->n_cached = j->g ? strata_gen_reused(j->g) : 0;
    j->prompt_done = j->n_cached;
    pthread_mutex_unlock(&j->mu);
    metrics_tokens(s->mt, j->n_prompt, 0);
}

static void publish_gauges(sched *s) { metrics_gauges(s->mt, s->n_queued, s->n_active, s->o.parallel); }
static void progress(sched *s);

/* At a step boundary (s->mu held): drop cancelled and failed jobs, admit queued
 * ones (a group when it has a slot for each member). */
static void boundary(sched *s) {
    for (int i = 0; i < s->o.parallel; i++)
        if (s->slot[i] && (atomic_load(&s->slot[i]->cancelled) || s->cancel_all || (s->slot[i]->finished && !s->slot[i]->g))) {
            job_end(s->slot[i], NULL, s->cancel_all ? 503 : 499, s->cancel_all ? "the server is shutting down" : "cancelled");
            slot_clear(s, i);
        }
    for (job **pp = &s->q_head; *pp;) {
        job *j = *pp;
        if (atomic_load(&j->cancelled) || s->cancel_all) {
            *pp = j->next;
            s->n_queued--;
            for (int k = 0; k < j->n_group; k++) {
                job *m = j->group ? j->group[k] : j;
                job_end(m, NULL, s->cancel_all ? 503 : 499, s->cancel_all ? "the server is shutting down" : "cancelled");
                if (m != j) job_unref(m);
            }
            job_unref(j);
        } else {
            pp = &j->next;
        }
    }
    s->q_tail = NULL;
    for (job *j = s->q_head; j; j = j->next) s->q_tail = j;
    while (s->q_head && s->q_head->n_group <= s->o.parallel - s->n_active) {
        job *j = s->q_head;
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->n_queued--;
        j->next = NULL;
        for (int k = 0, i = 0; k < j->n_group; k++) {
            while (s->slot[i]) i++;
            slot_start(s, i, j->group ? j->group[k] : j);
        }
        if (j->n_group > 1 && !j->pre && !j->finished) group_fork(s, j); /* a one-token prompt: no pass before */
    }
    publish_gauges(s);
    progress(s);
}

/* After a step (s->mu held): each job's prompt progress, and the requests'
 * total for /metrics. */
static void progress(sched *s) {
    int64_t done = 0, total = 0, n = 0;
    for (int i = 0; i < s->o.parallel; i++) {
        job *j = s->slot[i];
        if (!j || !j->g) continue;
        const int64_t d = j->prompt_base + strata_gen_prefilled(j->g);
        pthread_mutex_lock(&j->mu);
        j->prompt_done = d;
        pthread_mutex_unlock(&j->mu);
        if (d < j->n_prompt && j->index == 0) { done += d; total += j->n_prompt; n++; }
    }
    metrics_prefill(s->mt, n, done, total);
}

static void step_delay(int ms) {
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int load(sched *s) {
    char err[1024];
    int rc;
    if ((rc = strata_model_load(s->m, &s->mopts, err, sizeof err))) goto fail;
    for (int i = 0; i < s->o.parallel; i++)
        if ((rc = strata_seq_create(s->m, &s->seqs[i], err, sizeof err))) goto fail;
    s->n_end = strata_end_ids(s->m, s->end_ids, SCHED_MAX_END);
    if (strata_chat_ids_get(s->tk, &s->ci, err, sizeof err)) memset(&s->ci, 0xff, sizeof s->ci); /* no chat format: -1 ids */
    strata_model_get_info(s->m, &s->info);
    strata_model_get_stats(s->m, &s->st_load);
    return 0;
fail:
    pthread_mutex_lock(&s->mu);
    snprintf(s->load_err, sizeof s->load_err, "%s", err);
    s->load_rc = rc;
    s->state = -1;
    pthread_mutex_unlock(&s->mu);
    return -1;
}

static void *engine_main(void *arg) {
    sched *s = arg;
    char err[1024];
    if (load(s)) return NULL;
    strata_stats st;
    strata_model_get_stats(s->m, &st);
    metrics_model(s->mt, &st);
    pthread_mutex_lock(&s->mu);
    s->state = 1;
    publish_gauges(s);
    for (;;) {
        boundary(s);
        if (!s->n_active) {
            if (s->stopping) break;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        int n = 0;
        for (int i = 0; i < s->o.parallel; i++)
            if (s->slot[i] && s->slot[i]->g) {
                int64_t a, v;
                s->fed[n] = strata_gen_prefilled(s->slot[i]->g);
                strata_gen_spec_stats(s->slot[i]->g, &s->drafted[n], &a, &v);
                s->gens[n++] = s->slot[i]->g;
            }
        pthread_mutex_unlock(&s->mu);

        step_delay(s->o.step_delay_ms);
        step_ctx c = {s, 0};
        const double t0 = strata_now();
        c.now = t0;
        int rc = strata_gen_step(s->m, s->gens, n, on_token, &c, err, sizeof err);
        const double dt = strata_now() - t0;
        /* rows of this step: each prompt row fed, plus one decode row per generator
         * whose prompt was already in before the step and its drafted rows */
        int64_t rows = 0;
        for (int k = 0; k < n; k++) {
            const strata_gen *g = s->gens[k];
            const job *j = strata_gen_user(g);
            int64_t d, a, v;
            strata_gen_spec_stats(g, &d, &a, &v);
            rows += strata_gen_prefilled(g) - s->fed[k] + (s->fed[k] == j->n_gen_prompt) + d - s->drafted[k];
        }
        metrics_step(s->mt, rows, dt);
        strata_model_get_stats(s->m, &st);
        metrics_model(s->mt, &st);

        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->o.parallel; i++) {
            job *j = s->slot[i];
            if (!j) continue;
            if (rc < 0) {
                job_end(j, NULL, 500, err);
            } else if (j->finished) {
                /* ended inside the step (stop string, end of turn) */
            } else if (!j->g) {
                continue; /* a member waiting for its leader's prompt */
            } else if (j->pre) {
                if (strata_gen_done(j->g)) group_fork(s, j);
                continue;
            } else if (strata_gen_done(j->g)) {
                job_flush(j);
                job_end(j, strata_gen_stopped(j->g) ? "stop" : "length", 0, NULL);
            } else {
                continue;
            }
            metrics_tokens(s->mt, 0, j->n_gen);
            slot_clear(s, i);
        }
        progress(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ===== control ===== */

int sched_create(sched **out, strata_model *m, const strata_model_opts *mopts, strata_tokenizer *tk, const sched_opts *o, metrics *mt,
                 char *err, size_t errlen) {
    *out = NULL;
    sched *s = strata_calloc(1, sizeof *s);
    if (!s) return strata_fail(err, errlen, STRATA_ENOMEM, "out of memory");
    s->m = m;
    s->mopts = *mopts;
    s->mopts.max_seqs = o->parallel;
    s->tk = tk;
    s->o = *o;
    s->mt = mt;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    const size_t P = (size_t)o->parallel;
    s->seqs = strata_calloc(P, sizeof *s->seqs);
    s->slot = strata_calloc(P, sizeof *s->slot);
    s->gens = strata_calloc(P, sizeof *s->gens);
    s->fed = strata_calloc(P, sizeof *s->fed);
    s->drafted = strata_calloc(P, sizeof *s->drafted);
    if (!s->seqs || !s->slot || !s->gens || !s->fed || !s->drafted) {
        sched_free(s);
        return strata_fail(err, errlen, STRATA_ENOMEM, "out of memory");
    }
    *out = s;
    return 0;
}

int sched_start(sched *s, char *err, size_t errlen) {
    if (pthread_create(&s->th, NULL, engine_main, s)) return strata_fail(err, errlen, STRATA_ENOMEM, "cannot start the engine thread");
    s->started = 1;
    return 0;
}

int sched_state(sched *s) {
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    pthread_mutex_unlock(&s->mu);
    return st;
}

const char *sched_load_error(sched *s) { return s->load_err; }
int sched_load_rc(sched *s) { return s->load_rc; }
const strata_model_info *sched_info(sched *s) { return &s->info; }
const strata_stats *sched_load_stats(sched *s) { return &s->st_load; }

int sched_submit(sched *s, job *j, req_error *e) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->state != 1 || s->draining) {
        metrics_rejected(s->mt, "draining");
        rc = req_fail(e, 503, "server_error", s->draining ? "shutting_down" : "loading", NULL,
                      s->draining ? "the server is shutting down" : "the model is loading");
    } else {
        int free_slots = s->o.parallel - s->n_active;
        if (s->n_queued >= s->o.queue_max + (free_slots > 0 ? free_slots : 0)) {
            metrics_rejected(s->mt, "queue_full");
            rc = req_fail(e, 429, "rate_limit_error", "queue_full", NULL,
                          "the server is busy: %d sequences generating and %d requests queued (--queue %d); retry later",
                          s->n_active, s->n_queued, s->o.queue_max);
        }
    }
    if (!rc && j->n_group > s->o.parallel)
        rc = req_fail(e, 400, "invalid_request_error", "invalid_value", "n", "'n' is %d; this server generates at most %d sequences at once (--parallel)",
                      j->n_group, s->o.parallel);
    if (!rc) {
        for (int k = 0; k < j->n_group; k++) {
            job *m = j->group ? j->group[k] : j;
            atomic_fetch_add(&m->refs, 1);
            m->t_submit = strata_now();
        }
        j->next = NULL;
        if (s->q_tail) s->q_tail->next = j;
        else s->q_head = j;
        s->q_tail = j;
        s->n_queued++;
        publish_gauges(s);
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sched_cancel(sched *s, job *j) {
    atomic_store(&j->cancelled, 1);
    for (int k = 0; j->group && k < j->n_group; k++) atomic_store(&j->group[k]->cancelled, 1);
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sched_shutdown(sched *s, double grace_s) {
    if (!s->started) return;
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_mutex_unlock(&s->mu);
    const double t_end = strata_now() + grace_s;
    for (;;) {
        int q, a;
        sched_counts(s, &q, &a);
        if ((q == 0 && a == 0) || strata_now() >= t_end || sched_state(s) != 1) break;
        step_delay(20);
    }
    pthread_mutex_lock(&s->mu);
    s->cancel_all = 1;
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    s->started = 0;
}

void sched_counts(sched *s, int *queued, int *active) {
    pthread_mutex_lock(&s->mu);
    *queued = s->n_queued;
    *active = s->n_active;
    pthread_mutex_unlock(&s->mu);
}

void sched_free(sched *s) {
    if (!s) return;
    for (int i = 0; s->seqs && i < s->o.parallel; i++) strata_seq_free(s->seqs[i]);
    strata_free(s->seqs);
    strata_free(s->slot);
    strata_free(s->gens);
    strata_free(s->fed);
    strata_free(s->drafted);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    strata_free(s);
}

json_t *sched_slots_json(sched *s) {
    json_t *a = json_array();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->o.parallel; i++) {
        job *j = s->slot[i];
        if (!j) continue;
        pthread_mutex_lock(&j->mu);
        const char *state = j->finished ? "finishing" : !j->g ? "waiting" : (j->pre || j->prompt_done < j->n_prompt) ? "prefill" : "generating";
        json_array_append_new(a, json_pack("{s:i,s:s,s:i,s:s,s:I,s:I,s:I}", "slot", i, "id", j->rid, "choice", j->index, "state", state,
                                           "prompt_tokens", (json_int_t)j->n_prompt, "prompt_done", (json_int_t)j->prompt_done,
                                           "generated", (json_int_t)j->n_gen));
        pthread_mutex_unlock(&j->mu);
    }
    for (job *j = s->q_head; j; j = j->next)
        json_array_append_new(a, json_pack("{s:n,s:s,s:i,s:s,s:I,s:I,s:I}", "slot", "id", j->rid, "choice", 0, "state", "queued",
                                           "prompt_tokens", (json_int_t)j->n_prompt, "prompt_done", (json_int_t)0, "generated", (json_int_t)0));
    const int parallel = s->o.parallel, active = s->n_active, queued = s->n_queued;
    pthread_mutex_unlock(&s->mu);
    return json_pack("{s:i,s:i,s:i,s:o}", "parallel", parallel, "active", active, "queued", queued, "slots", a);
}
