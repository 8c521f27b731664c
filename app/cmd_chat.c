/*
 * cmd_chat.c: `strata chat MODEL_DIR`: an interactive chat with retained state, in the
 * chat format of the model's architecture and tokenizer (K3, K2, DeepSeek, ...).
 *
 * The session keeps its KDA/conv state and MLA cache across turns: each user line
 * is rendered as a continuation (chat.h STRATA_CHAT_CONTINUE: the turn plus the
 * generation prompt) and only those ids are prefilled; the reply's ids, including
 * its end id, are already in the session when the next turn starts. Nothing is
 * re-prefilled except after /reset. /save and /load write and read the session
 * state (strata_seq_save/_load), so a conversation resumes exactly.
 *
 * stdout carries the response channel only; the think channel goes to stderr
 * (or to stdout between <think> lines with --show-think), so `echo hi | strata
 * chat M` prints just the answer. Exit: 0 ok, 1 model/IO failure, 2 usage.
 */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli.h"
#include "model_open.h"
#include "strata.h"

#define CMD "chat"
#define CHAT_DEFAULT_GEN 4096
#define CHAT_DEFAULT_CTX 32768

static void usage(FILE *f) {
    fprintf(f,
        "usage: strata chat MODEL_DIR [options]\n"
        "\n"
        "Each line on stdin is one user message; the reply streams to stdout.\n"
        "REPL commands: /help, /reset (forget the conversation, keep --system),\n"
        "  /save FILE (session state), /load FILE, /exit (or end of input). A /save or\n"
        "  /load that failed makes the exit status 1 (the REPL goes on after it).\n"
        "\n"
        "  --system TEXT        system message\n"
        "  --think EFFORT       low, high, max (default) or off (no think channel)\n"
        "  --show-think         print the think channel to stdout between <think> lines\n"
        "                       (default: to stderr)\n"
        "  --gen N              max tokens per reply (default %d)\n"
        "  --ctx N              context positions for the whole chat (default min(model, %d))\n",
        CHAT_DEFAULT_GEN, CHAT_DEFAULT_CTX);
    opts_help(f, OPT_CHAT, OPT_HELP_GEN);
    opts_help(f, OPT_CHAT, OPT_HELP_PLACE);
    fputs("\n"
        "With --ram-gb/--ram (or --pack) the weights go through the memory planner, as in\n"
        "`strata run` (a budget below the minimum is refused with the minimum, exit 2):\n"
        "--ctx sizes the MLA cache in the plan. At the end (end of input or /exit) the run\n"
        "report goes to stderr: prefill/decode speed, peak RSS and, when planned, reads,\n"
        "expert hit rate and peak RSS vs the budget.\n", f);
}

typedef struct chat_opts {
    const char *model_dir, *system;
    int effort, show_think;
    app_opts ao;              /* the shared flags (opts.h) */
} chat_opts;

static int effort_flag(void *field, const char *v) { return (*(int *)field = strata_chat_effort_parse(v)) < 0; }

static const opt_row k_chat_flags[] = {
    {.flag = "--system", .kind = OPT_STR, .off = offsetof(chat_opts, system)},
    {.flag = "--think", .kind = OPT_FN, .off = offsetof(chat_opts, effort), .fn = effort_flag, .what = "low, high, max or off; the K3 encoder refuses medium"},
    {.flag = "--show-think", .kind = OPT_FLAG, .off = offsetof(chat_opts, show_think)},
};

static int parse_args(int argc, char **argv, chat_opts *o) {
    memset(o, 0, sizeof *o);
    opts_init(&o->ao, OPT_CHAT, CHAT_DEFAULT_GEN);
    o->effort = STRATA_CHAT_THINK_MAX;
    return opts_parse(argc, argv, &o->ao, usage, k_chat_flags, sizeof k_chat_flags / sizeof *k_chat_flags, o, &o->model_dir);
}

typedef struct chat_state {
    mo_model m;
    int64_t vocab;
    strata_seq *s;
    strata_row *rows; /* prefill rows (counted, grows with the render buffer) */
    size_t cap_rows;
    strata_tokenizer *tk;
    strata_chat_ids ci;
    float *logits;
    int32_t *ids; /* render buffer (counted, grows) */
    size_t n_ids, cap_ids;
    char *line;   /* input line (counted, grows) */
    size_t line_cap;
    /* for the report at exit */
    int64_t n_turns, n_prefill, n_decode, n_drafted, n_accepted;
    int n_failed;             /* /save and /load commands that failed: exit status 1 */
    int n_refused;            /* user lines refused (the context is full): exit status 1 when stdin is not a terminal */
    double t_prefill, t_decode;
} chat_state;

static void chat_release(chat_state *r) {
    strata_free(r->line);
    strata_free(r->ids);
    strata_free(r->logits);
    strata_tokenizer_close(r->tk);
    strata_free(r->rows);
    strata_seq_free(r->s);
    mo_close(&r->m);
}

/* One line from stdin without its newline; 0 at end of input. */
static int read_line(chat_state *r, size_t *len) {
    size_t n = 0;
    int ch, any = 0;
    while ((ch = getchar()) != EOF) {
        any = 1;
        if (ch == '\n') break;
        if (n + 2 > r->line_cap) {
            size_t cap = r->line_cap ? r->line_cap * 2 : 1024;
            char *nl = strata_realloc(r->line, cap);
            if (!nl) return 0;
            r->line = nl;
            r->line_cap = cap;
        }
        r->line[n++] = (char)ch;
    }
    if (!any) return 0;
    if (!r->line) { r->line = strata_alloc(1); if (!r->line) return 0; r->line_cap = 1; }
    if (n && r->line[n - 1] == '\r') n--;
    r->line[n] = 0;
    *len = n;
    return 1;
}

/* Renders msgs with flags into r->ids and, when prefill, evaluates them (a
 * user turn is evaluated by reply's generator instead). */
static int feed(chat_state *r, const strata_chat_msg *msgs, size_t n, int effort, int flags, int prefill) {
    char err[512];
    r->n_ids = 0;
    if (strata_chat_render(r->tk, msgs, n, effort, flags, &r->ids, &r->n_ids, &r->cap_ids, err, sizeof err)) {
        fprintf(stderr, "strata chat: %s\n", err);
        return -1;
    }
    if (r->n_ids == 0) return 0;
    if (strata_seq_pos(r->s) + (int64_t)r->n_ids >= r->m.info.ctx) {
        fprintf(stderr, "strata chat: the context is full (%lld positions); /reset or a larger --ctx\n",
                (long long)r->m.info.ctx);
        return 1;
    }
    for (size_t i = 0; i < r->n_ids; i++)
        if (r->ids[i] >= r->vocab) {
            fprintf(stderr, "strata chat: id %d is outside the model's vocabulary\n", r->ids[i]);
            return -1;
        }
    if (!prefill) return 0;
    if (r->n_ids > r->cap_rows) {
        strata_row *nr = strata_realloc(r->rows, r->n_ids * sizeof *nr);
        if (!nr) { fprintf(stderr, "strata chat: out of memory\n"); return -1; }
        r->rows = nr;
        r->cap_rows = r->n_ids;
    }
    for (size_t i = 0; i < r->n_ids; i++) r->rows[i] = (strata_row){r->s, r->ids[i], i + 1 == r->n_ids};
    double t0 = strata_now();
    if (strata_step(r->m.m, r->rows, (int64_t)r->n_ids, r->logits, err, sizeof err)) {
        fprintf(stderr, "strata chat: %s\n", err);
        return -1;
    }
    r->t_prefill += strata_now() - t0;
    r->n_prefill += (int64_t)r->n_ids;
    return 0;
}

/* The preamble: thinking-effort message and --system, evaluated from empty. */
static int preamble(chat_state *r, const chat_opts *o) {
    strata_seq_reset(r->s);
    strata_chat_msg sys = {.role = STRATA_CHAT_SYSTEM, .content = o->system};
    return feed(r, &sys, o->system ? 1 : 0, o->effort, 0, 1);
}

static void show(const chat_opts *o, int ch, int *cur, const uint8_t *p, size_t n) {
    if (!n) return;
    FILE *f = ch == STRATA_CHAT_CH_THINK && !o->show_think ? stderr : stdout;
    if (o->show_think && ch != *cur) {
        if (*cur == STRATA_CHAT_CH_THINK) fputs("\n</think>\n", stdout);
        if (ch == STRATA_CHAT_CH_THINK) fputs("<think>\n", stdout);
    }
    *cur = ch;
    fwrite(p, 1, n, f);
    fflush(f);
}

/* One reply's progress, for the token callback. */
typedef struct reply_ctx {
    const chat_opts *o;
    strata_chat_follow *f;
    int cur, ended;
    double t0, t_first;
} reply_ctx;

static void on_token(void *ud, strata_gen *g, int32_t id, const char *text, size_t len, const float *logits) {
    (void)g; (void)text; (void)len; (void)logits;
    reply_ctx *x = ud;
    if (id < 0 || x->ended) return;
    if (x->t_first == 0) x->t_first = strata_now();
    int ch;
    const uint8_t *p;
    size_t pn;
    if (strata_chat_follow_push(x->f, id, &ch, &p, &pn) == 1) x->ended = 1;
    show(x->o, ch, &x->cur, p, pn);
}

/* Prefills the rendered turn (r->ids) and generates the reply through the
 * generator API (sampling, speculation); its ids, the end id included, stay in
 * the session: the generator leaves its last id unevaluated, so it joins here. */
static int reply(chat_state *r, const chat_opts *o) {
    char err[512];
    reply_ctx x = {.o = o, .cur = STRATA_CHAT_CH_NONE};
    if (strata_chat_follow_open(&x.f, r->tk, o->effort != STRATA_CHAT_THINK_OFF, err, sizeof err)) {
        fprintf(stderr, "strata chat: %s\n", err);
        return -1;
    }
    strata_gen_opts go = opts_gen(&o->ao);
    go.stop_at_end = 0;
    const int32_t stop[2] = {r->ci.eos, r->ci.eom};
    go.stop_ids = stop[0] >= 0 ? stop : stop + 1;
    go.n_stop_ids = stop[0] >= 0 ? 2 : 1;
    strata_gen *g = NULL;
    int ret = 0;
    const int64_t pos0 = strata_seq_pos(r->s);
    x.t0 = strata_now();
    if (strata_gen_create(&g, r->s, r->ids, (int64_t)r->n_ids, &go, 1, err, sizeof err)) {
        fprintf(stderr, "strata chat: %s\n", err);
        strata_chat_follow_close(x.f);
        return -1;
    }
    for (;;) {
        int a = strata_gen_step(r->m.m, &g, 1, on_token, &x, err, sizeof err);
        if (a < 0) { fprintf(stderr, "\nstrata chat: %s\n", err); ret = -1; break; }
        if (a == 0) break;
    }
    int64_t n = 0;
    const int32_t *ids = strata_gen_ids(g, &n);
    if (!ret && n > 0) {
        if (strata_seq_pos(r->s) + 1 > r->m.info.ctx) {
            fprintf(stderr, "\nstrata chat: the context is full; /reset or a larger --ctx\n");
        } else {
            strata_row row = {r->s, ids[n - 1], 0};
            if (strata_step(r->m.m, &row, 1, NULL, err, sizeof err)) { fprintf(stderr, "\nstrata chat: %s\n", err); ret = -1; }
        }
    }
    const double t1 = strata_now();
    if (x.t_first == 0) x.t_first = t1;
    r->t_prefill += x.t_first - x.t0;
    r->t_decode += t1 - x.t_first;
    r->n_prefill += (int64_t)r->n_ids;
    r->n_decode += strata_seq_pos(r->s) - pos0 - (int64_t)r->n_ids;
    int64_t d, acc, v;
    strata_gen_spec_stats(g, &d, &acc, &v);
    r->n_drafted += d;
    r->n_accepted += acc;
    strata_gen_free(g);
    int ch;
    const uint8_t *p;
    size_t pn;
    strata_chat_follow_flush(x.f, &ch, &p, &pn);
    show(o, ch, &x.cur, p, pn);
    if (o->show_think && x.cur == STRATA_CHAT_CH_THINK) fputs("\n</think>", stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (!x.ended && !ret) fprintf(stderr, "strata chat: (reply cut at %lld tokens)\n", (long long)n);
    strata_chat_follow_close(x.f);
    return ret;
}

int cmd_chat(int argc, char **argv) {
    chat_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == OPTS_HELP ? 0 : rc;
    chat_state r;
    memset(&r, 0, sizeof r);
    char err[4096];
    int ret = 1;
    if (mo_open(&r.m, CMD, o.model_dir)) goto out;
    r.vocab = r.m.info.vocab;
    if (strata_tokenizer_open_dir(&r.tk, o.model_dir, err, sizeof err)) { fprintf(stderr, "strata chat: %s\n", err); goto out; }
    if (strata_chat_ids_get(r.tk, &r.ci, err, sizeof err)) { fprintf(stderr, "strata chat: %s\n", err); goto out; }
    fprintf(stderr, "strata chat: chat format %s (from the tokenizer)\n", strata_chat_fmt_name(r.ci.fmt));
    const int64_t mctx = r.m.info.model_max_ctx;
    if (o.ao.ctx > mctx)
        fprintf(stderr, "strata chat: note: --ctx %lld is above the model's maximum of %lld positions\n", (long long)o.ao.ctx,
                (long long)mctx);
    int64_t ctx = o.ao.ctx ? o.ao.ctx : (mctx < CHAT_DEFAULT_CTX ? mctx : CHAT_DEFAULT_CTX);
    if ((rc = mo_place(&r.m, &o.ao, ctx, 1))) {
        ret = rc == MO_PLANNED ? 0 : rc;
        goto out;
    }
    const int threads = r.m.info.n_threads;
    if (strata_seq_create(r.m.m, &r.s, err, sizeof err)) { fprintf(stderr, "strata chat: %s\n", err); goto out; }
    r.logits = strata_alloc((size_t)r.vocab * sizeof(float));
    if (!r.logits) { fprintf(stderr, "strata chat: out of memory\n"); goto out; }
    if (preamble(&r, &o)) goto out;
    const int tty = isatty(0);
    if (tty)
        fprintf(stderr, "strata chat: %lld layers, ctx %lld, thinking %s, %d threads. /help for commands.\n",
                (long long)r.m.info.n_layers, (long long)ctx, strata_chat_effort_name(o.effort), threads);
    size_t len;
    for (;;) {
        if (tty) { fputs("> ", stderr); fflush(stderr); }
        if (!read_line(&r, &len)) break;
        if (len == 0) continue;
        if (r.line[0] == '/') {
            char *arg = strchr(r.line, ' ');
            if (arg) { *arg++ = 0; while (*arg == ' ') arg++; }
            if (!strcmp(r.line, "/exit") || !strcmp(r.line, "/quit")) break;
            if (!strcmp(r.line, "/help")) {
                fputs("/reset  forget the conversation\n/save FILE  write the session state\n"
                      "/load FILE  resume a saved session\n/exit\n", stderr);
            } else if (!strcmp(r.line, "/reset")) {
                if (preamble(&r, &o)) goto out;
                fputs("strata chat: conversation reset\n", stderr);
            } else if ((!strcmp(r.line, "/save") || !strcmp(r.line, "/load")) && !(arg && *arg)) {
                fprintf(stderr, "strata chat: usage: %s FILE\n", r.line);
            } else if (!strcmp(r.line, "/save")) {
                if (strata_seq_save(r.s, arg, err, sizeof err)) {
                    fprintf(stderr, "strata chat: %s\n", err); /* names ARG (session_save) */
                    r.n_failed++;
                } else fprintf(stderr, "strata chat: saved %lld positions to %s\n", (long long)strata_seq_pos(r.s), arg);
            } else if (!strcmp(r.line, "/load")) {
                /* a refused file leaves the conversation as it was; a read that failed
                 * after the file was checked leaves an empty sequence (strata.h) */
                const int64_t before = strata_seq_pos(r.s);
                struct stat sb;
                if (stat(arg, &sb) == 0 && !S_ISREG(sb.st_mode)) {
                    /* a FIFO or device: the reader refuses it without blocking; say why */
                    fprintf(stderr, "strata chat: %s: not a regular file (the conversation is unchanged)\n", arg);
                    r.n_failed++;
                } else if (strata_seq_load(r.s, arg, err, sizeof err)) {
                    r.n_failed++;
                    if (strata_seq_pos(r.s) == before) {
                        fprintf(stderr, "strata chat: %s (the conversation is unchanged)\n", err);
                    } else {
                        fprintf(stderr, "strata chat: %s (the conversation was reset)\n", err);
                        if (preamble(&r, &o)) goto out;
                    }
                } else
                    fprintf(stderr, "strata chat: loaded %lld positions from %s\n", (long long)strata_seq_pos(r.s), arg);
            } else {
                fprintf(stderr, "strata chat: unknown command '%s' (/help)\n", r.line);
            }
            continue;
        }
        strata_chat_msg m = {.role = STRATA_CHAT_USER, .content = r.line};
        rc = feed(&r, &m, 1, o.effort, STRATA_CHAT_GEN | STRATA_CHAT_CONTINUE, 0);
        if (rc < 0) goto out;
        if (rc > 0) { r.n_refused++; continue; } /* said why; the chat goes on */
        r.n_turns++;
        if (reply(&r, &o)) goto out;
    }
    /* the run report, as `strata run` gives it (placement part only when planned) */
    char speed[512];
    mo_fmt_speed(&r.m, r.n_prefill, r.t_prefill, r.n_decode, r.t_decode, strata_peak_rss(), speed, sizeof speed);
    fprintf(stderr, "strata chat: %lld turns, prefilled %lld tokens, decoded %lld; %s\n", (long long)r.n_turns,
            (long long)r.n_prefill, (long long)r.n_decode, speed);
    if (o.ao.spec)
        fprintf(stderr, "speculation: %lld drafted, %lld accepted (%.1f%%)\n", (long long)r.n_drafted, (long long)r.n_accepted,
                r.n_drafted ? 100.0 * (double)r.n_accepted / (double)r.n_drafted : 0);
    mo_report(&r.m, stderr);
    if (strata_mem_guard_violations())
        fprintf(stderr, "strata chat: warning: %llu allocations inside the decode loop\n",
                (unsigned long long)strata_mem_guard_violations());
    if (r.n_failed) fprintf(stderr, "strata chat: %d /save or /load commands failed\n", r.n_failed);
    /* a script's input that was not all answered is a failure; at a terminal the
     * user saw each refusal and went on */
    if (r.n_refused && !tty) fprintf(stderr, "strata chat: %d input lines were refused\n", r.n_refused);
    ret = r.n_failed || (r.n_refused && !tty) ? 1 : 0;
out:
    chat_release(&r);
    return ret;
}
