/*
 * cmd_run.c: `strata run`: load a model directory, evaluate a prompt (ids or
 * text), generate with greedy or sampled decoding, report.
 *
 * stdout carries only the output: with --print-ids ONE comma-separated line of the
 * generated ids (not the prompt); otherwise the generated text, streamed, when the
 * model has a tokenizer, else the ids. Everything else (logs, the run report) goes
 * to stderr. Exit: 0 ok, 1 model/IO/runtime failure, 2 usage or bad input.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "cli.h"
#include "cfg.h"
#include "infer.h"
#include "jsonx.h"
#include "kern.h"
#include "model.h"
#include "model_open.h"
#include "place.h"
#include "pool.h"
#include "sample.h"
#include "st.h"
#include "tok.h"

#define CMD "run"
#define RUN_DEFAULT_GEN 32
#define RUN_MAX_GEN (1 << 20)
#define RUN_MAX_STOP 16

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "--dump-logits writes host floats; this build assumes a little-endian host"
#endif

static void usage(FILE *f) {
    fprintf(f,
        "usage: strata run MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file F) [options]\n"
        "\n"
        "  --ids LIST           prompt as comma-separated token ids (no tokenizer needed)\n"
        "  --prompt TEXT        prompt text (needs the model's tiktoken.model)\n"
        "  --prompt-file F      prompt text read verbatim from F\n"
        "  --gen N              tokens to generate (default %d, >= 1)\n"
        "  --temp T             temperature; 0 = greedy, ties to the lowest id (default 0)\n"
        "  --top-k K            keep the K most likely tokens (0 = off)\n"
        "  --top-p P            nucleus sampling mass in (0, 1] (1 = off)\n"
        "  --min-p P            drop tokens below P x the top probability (0 = off)\n"
        "  --repeat-penalty R   penalise the last 64 ids (1 = off)\n"
        "  --seed S             sampling seed (default 0; same seed, same tokens)\n"
        "  --ctx N              context positions (default prompt + gen, at most the model's maximum)\n"
        "  --chunk N            prefill tokens per batched forward (default %d)\n"
        "  --print-ids          print the generated ids as one line on stdout, nothing else\n"
        "  --dump-logits FILE   float32 LE logits of every step (steps x vocab; step 0 = after the prompt)\n"
        "  --json FILE          write a JSON run report\n"
        MO_USAGE
        "  --stop-eos           with --ids: also stop at an end id (text prompts always do)\n"
        "  --ignore-eos         never stop at an end id\n"
        "\n"
        "End ids: config eos ids plus tokenizer_config.json's. Env: STRATA_KERNEL=scalar|avx2|...\n",
        RUN_DEFAULT_GEN, INFER_DEFAULT_CHUNK);
}

typedef struct run_opts {
    const char *model_dir, *ids, *prompt, *prompt_file, *dump_logits, *json_path;
    mo_opts mo;
    int64_t gen, ctx;
    sample_opts so;
    int print_ids, stop_eos, ignore_eos;
} run_opts;

static int parse_args(int argc, char **argv, run_opts *o) {
    sample_opts sd = SAMPLE_OPTS_DEFAULT;
    memset(o, 0, sizeof *o);
    o->so = sd;
    o->gen = RUN_DEFAULT_GEN;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        double d;
        int64_t n;
        int f = mo_flag(argc, argv, &i, CMD, &o->mo);
        if (f == EXIT_USAGE) return f;
        if (f == 0) continue;
#define NEED() do { if (!(v = cli_need_arg(argc, argv, &i, CMD))) return EXIT_USAGE; } while (0)
#define BAD(what) return cli_usage_error(CMD, "bad value for %s: '%s' (%s)", a, v, what)
        if (!strcmp(a, "--ids")) { NEED(); o->ids = v; }
        else if (!strcmp(a, "--prompt")) { NEED(); o->prompt = v; }
        else if (!strcmp(a, "--prompt-file")) { NEED(); o->prompt_file = v; }
        else if (!strcmp(a, "--gen")) { NEED(); if (base_parse_i64(v, 1, RUN_MAX_GEN, &o->gen)) BAD("an integer in [1, 1048576]"); }
        else if (!strcmp(a, "--temp")) { NEED(); if (base_parse_f64(v, 0, 1e6, &o->so.temp)) BAD(">= 0"); }
        else if (!strcmp(a, "--top-k")) { NEED(); if (base_parse_i64(v, 0, INT32_MAX, &o->so.top_k)) BAD("an integer >= 0"); }
        else if (!strcmp(a, "--top-p")) { NEED(); if (base_parse_f64(v, 0, 1, &d) || d <= 0) BAD("in (0, 1]"); o->so.top_p = d; }
        else if (!strcmp(a, "--min-p")) { NEED(); if (base_parse_f64(v, 0, 1, &o->so.min_p)) BAD("in [0, 1]"); }
        else if (!strcmp(a, "--repeat-penalty")) { NEED(); if (base_parse_f64(v, 0, 1e6, &d) || d <= 0) BAD("> 0"); o->so.repeat_penalty = d; }
        else if (!strcmp(a, "--seed")) { NEED(); if (base_parse_i64(v, 0, INT64_MAX, &n)) BAD("an integer >= 0"); o->so.seed = (uint64_t)n; }
        else if (!strcmp(a, "--ctx")) { NEED(); if (base_parse_i64(v, 1, (int64_t)1 << 32, &o->ctx)) BAD("an integer >= 1"); }
        else if (!strcmp(a, "--chunk")) { NEED(); if (base_parse_i64(v, 1, 4096, &o->mo.chunk)) BAD("1..4096"); }
        else if (!strcmp(a, "--dump-logits")) { NEED(); o->dump_logits = v; }
        else if (!strcmp(a, "--json")) { NEED(); o->json_path = v; }
        else if (!strcmp(a, "--print-ids")) o->print_ids = 1;
        else if (!strcmp(a, "--stop-eos")) o->stop_eos = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (a[0] == '-' && a[1]) return cli_usage_error(CMD, "unknown option '%s'", a);
        else if (!o->model_dir) o->model_dir = a;
        else return cli_usage_error(CMD, "unexpected argument '%s'", a);
#undef NEED
#undef BAD
    }
    if (!o->model_dir) return cli_usage_error(CMD, "missing MODEL_DIR");
    int np = (o->ids != NULL) + (o->prompt != NULL) + (o->prompt_file != NULL);
    if (np != 1 && !(o->mo.plan_only && np == 0)) return cli_usage_error(CMD, "give exactly one of --ids, --prompt, --prompt-file");
    return 0;
}

/* Everything the run holds, released in one place. */
typedef struct run_state {
    mo_model m;
    cfg c;                    /* = m.c */
    session *s;
    sampler *sm;
    tok *tk;
    tok_stream *ts;
    int32_t *prompt, *gen_ids;
    float *logits;
    FILE *dump;
    char dump_tmp[4096]; /* the file being written; renamed to --dump-logits on success */
} run_state;

/* --dump-logits is written beside its destination and renamed only once the run
 * has finished, so a failed or interrupted run never leaves a plausible-looking
 * partial dump. A destination that exists and is not a regular file (/dev/stdout,
 * a FIFO) is written directly. */
static int dump_open(run_state *r, const char *path) {
    struct stat sb;
    r->dump_tmp[0] = 0;
    if (!(stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))) {
        if (snprintf(r->dump_tmp, sizeof r->dump_tmp, "%s.partial-%d", path, (int)getpid()) >= (int)sizeof r->dump_tmp) {
            fprintf(stderr, "strata run: %s: path too long\n", path);
            r->dump_tmp[0] = 0;
            return 1;
        }
    }
    if (!(r->dump = fopen(r->dump_tmp[0] ? r->dump_tmp : path, "wb"))) {
        fprintf(stderr, "strata run: --dump-logits %s: %s\n", path, strerror(errno));
        r->dump_tmp[0] = 0;
        return 1;
    }
    return 0;
}

static int dump_commit(run_state *r, const char *path) {
    int bad = fflush(r->dump) || (r->dump_tmp[0] && fsync(fileno(r->dump)));
    bad |= fclose(r->dump) != 0;
    r->dump = NULL;
    if (!bad && r->dump_tmp[0] && rename(r->dump_tmp, path)) bad = 1;
    if (bad) {
        fprintf(stderr, "strata run: %s: write failed (%s)\n", path, strerror(errno));
        if (r->dump_tmp[0]) unlink(r->dump_tmp);
    }
    r->dump_tmp[0] = 0;
    return bad;
}

static void run_release(run_state *r) {
    if (r->dump) fclose(r->dump);
    if (r->dump_tmp[0]) unlink(r->dump_tmp);
    base_free(r->logits);
    base_free(r->gen_ids);
    base_free(r->prompt);
    tok_stream_close(r->ts);
    tok_close(r->tk);
    sampler_free(r->sm);
    session_free(r->s);
    mo_close(&r->m);
}

static int load_prompt(run_state *r, const run_opts *o, int64_t *n_prompt) {
    char err[1024];
    const int64_t V = r->c.vocab;
    if (o->ids) {
        int64_t *ids;
        size_t n;
        if (base_parse_id_list(o->ids, 0, V - 1, &ids, &n) || n == 0) {
            fprintf(stderr, "strata run: bad --ids '%s': need comma-separated ids in [0, %lld)\n", o->ids, (long long)V);
            return EXIT_USAGE;
        }
        r->prompt = base_alloc(n * sizeof(int32_t), MEM_MISC);
        if (!r->prompt) { base_free(ids); fprintf(stderr, "strata run: out of memory\n"); return 1; }
        for (size_t i = 0; i < n; i++) r->prompt[i] = (int32_t)ids[i];
        base_free(ids);
        *n_prompt = (int64_t)n;
        return 0;
    }
    if (!r->tk) {
        fprintf(stderr, "strata run: text prompts need the model's tokenizer (%s/tiktoken.model); use --ids\n", o->model_dir);
        return EXIT_USAGE;
    }
    uint8_t *text = NULL;
    size_t len = 0;
    if (o->prompt_file) {
        if (base_read_file(o->prompt_file, 1u << 30, &text, &len, err, sizeof err)) {
            fprintf(stderr, "strata run: %s\n", err);
            return EXIT_USAGE;
        }
    } else {
        len = strlen(o->prompt);
    }
    if (len == 0) { base_free(text); fprintf(stderr, "strata run: empty prompt\n"); return EXIT_USAGE; }
    size_t n = 0;
    int rc = tok_encode(r->tk, text ? text : (const uint8_t *)o->prompt, len, 0, &r->prompt, &n);
    base_free(text);
    if (rc) { fprintf(stderr, "strata run: cannot tokenize the prompt: %s\n", strata_errstr(rc)); return 1; }
    if (n == 0) { fprintf(stderr, "strata run: empty prompt\n"); return EXIT_USAGE; }
    for (size_t i = 0; i < n; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= V) {
            fprintf(stderr, "strata run: the tokenizer produced id %d outside the model's vocabulary (%lld)\n",
                    r->prompt[i], (long long)V);
            return EXIT_USAGE;
        }
    *n_prompt = (int64_t)n;
    return 0;
}

static void print_ids_line(FILE *f, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
    fputc('\n', f);
}

static json_t *ids_json(const int32_t *ids, int64_t n) {
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

int cmd_run(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (cli_is_help(argv[i])) { usage(stdout); return 0; }
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;

    run_state r;
    memset(&r, 0, sizeof r);
    char err[4096], path[4096];
    int ret = 1;
    if (mo_open(&r.m, CMD, o.model_dir)) goto out;
    r.c = r.m.c;
    /* tokenizer (optional with --ids) */
    snprintf(path, sizeof path, "%s/tiktoken.model", o.model_dir);
    if (base_is_file(path)) {
        char tc[4096];
        snprintf(tc, sizeof tc, "%s/tokenizer_config.json", o.model_dir);
        if (tok_open(&r.tk, path, base_is_file(tc) ? tc : NULL, TOK_PAT_KIMI, err, sizeof err)) {
            if (!o.ids) { fprintf(stderr, "strata run: %s\n", err); goto out; }
            fprintf(stderr, "strata run: warning: tokenizer unusable (%s); printing ids\n", err);
            r.tk = NULL;
        }
    }
    int64_t n_prompt = 0;
    if ((o.ids || o.prompt || o.prompt_file) && (rc = load_prompt(&r, &o, &n_prompt))) { ret = rc; goto out; }

    /* context */
    int64_t ctx = o.ctx;
    if (!ctx) {
        /* exactly what the run needs: the MLA cache and the memory plan are sized by it */
        ctx = n_prompt + o.gen;
        if (ctx > r.c.max_ctx) ctx = r.c.max_ctx;
    }
    if (n_prompt > ctx) {
        fprintf(stderr, "strata run: the prompt has %lld tokens, more than the context of %lld%s\n", (long long)n_prompt,
                (long long)ctx, o.ctx ? " (--ctx)" : " (the model's maximum)");
        ret = EXIT_USAGE;
        goto out;
    }
    if (n_prompt + o.gen > ctx)
        fprintf(stderr, "strata run: note: generation stops at the context limit (%lld positions)\n", (long long)ctx);

    /* stop ids */
    int32_t stop[RUN_MAX_STOP];
    int n_stop = sample_stop_ids(o.model_dir, &r.c, stop, RUN_MAX_STOP, err, sizeof err);
    if (n_stop < 0) { fprintf(stderr, "strata run: %s\n", err); goto out; }
    const int use_stop = !o.ignore_eos && (!o.ids || o.stop_eos);

    /* the dump file before the weights load, so a bad path fails at once */
    if (o.dump_logits && !o.mo.plan_only && dump_open(&r, o.dump_logits)) goto out;

    /* placement, weights, engine */
    if ((rc = mo_place(&r.m, &o.mo, ctx))) {
        ret = rc == MO_PLANNED ? 0 : rc;
        goto out;
    }
    const int threads = r.m.threads;
    if (session_create(&r.s, r.m.e, ctx, err, sizeof err)) { fprintf(stderr, "strata run: %s\n", err); goto out; }
    if (sampler_create(&r.sm, r.c.vocab, &o.so, err, sizeof err)) { fprintf(stderr, "strata run: %s\n", err); goto out; }
    r.logits = base_alloc((size_t)r.c.vocab * sizeof(float), MEM_SCRATCH);
    r.gen_ids = base_alloc((size_t)o.gen * sizeof(int32_t), MEM_SCRATCH);
    if (!r.logits || !r.gen_ids) { fprintf(stderr, "strata run: out of memory\n"); goto out; }
    const int stream_text = !o.print_ids && r.tk;
    if (stream_text && tok_stream_open(&r.ts, r.tk)) { fprintf(stderr, "strata run: out of memory\n"); goto out; }

    /* prefill, then one token per step */
    double t0 = base_now();
    if (session_eval(r.s, r.prompt, n_prompt, r.logits)) {
        fprintf(stderr, "strata run: %s\n", session_errmsg(r.s));
        goto out;
    }
    double t_prefill = base_now() - t0, t_decode = 0;
    int64_t n_gen = 0, n_decode = 0;
    uint64_t lhash = BASE_FNV_INIT;
    int stopped = 0;
    for (;;) {
        if (r.dump && fwrite(r.logits, sizeof(float), (size_t)r.c.vocab, r.dump) != (size_t)r.c.vocab) {
            fprintf(stderr, "strata run: %s: write failed\n", o.dump_logits);
            goto out;
        }
        lhash = base_fnv1a(r.logits, (size_t)r.c.vocab * sizeof(float), lhash);
        base_mem_guard(1);
        int32_t id = sampler_next(r.sm, r.logits, session_tokens(r.s), session_pos(r.s));
        base_mem_guard(0);
        r.gen_ids[n_gen++] = id;
        int is_stop = 0;
        for (int i = 0; i < n_stop; i++) is_stop |= stop[i] == id;
        if (stream_text && !(use_stop && is_stop)) {
            const uint8_t *p;
            size_t n;
            if (!tok_stream_push(r.ts, id, &p, &n) && n) { fwrite(p, 1, n, stdout); fflush(stdout); }
        } else if (!o.print_ids && !r.tk) {
            printf(n_gen > 1 ? ",%d" : "%d", id);
            fflush(stdout);
        }
        if (use_stop && is_stop) { stopped = 1; break; }
        if (n_gen == o.gen || session_pos(r.s) >= ctx) break;
        double t1 = base_now();
        base_mem_guard(1);
        rc = session_eval(r.s, &id, 1, r.logits);
        base_mem_guard(0);
        t_decode += base_now() - t1;
        n_decode++;
        if (rc) { fprintf(stderr, "strata run: %s\n", session_errmsg(r.s)); goto out; }
    }
    if (stream_text) {
        const uint8_t *p;
        size_t n;
        tok_stream_flush(r.ts, &p, &n);
        if (n) fwrite(p, 1, n, stdout);
        fputc('\n', stdout);
    } else if (o.print_ids) {
        print_ids_line(stdout, r.gen_ids, n_gen);
    } else {
        fputc('\n', stdout);
    }
    fflush(stdout);
    if (r.dump && dump_commit(&r, o.dump_logits)) goto out;

    /* report */
    double pf = t_prefill / (double)n_prompt, dc = n_decode ? t_decode / (double)n_decode : 0;
    uint64_t rss = base_peak_rss();
    char speed[512];
    mo_fmt_speed(&r.m, n_prompt, t_prefill, n_decode, t_decode, rss, speed, sizeof speed);
    fprintf(stderr, "strata run: prompt %lld tokens, generated %lld%s; %s; logits hash %016llx\n", (long long)n_prompt,
            (long long)n_gen, stopped ? " (end id)" : "", speed, (unsigned long long)lhash);
    mo_report(&r.m, stderr);
    if (base_mem_guard_violations())
        fprintf(stderr, "strata run: warning: %llu allocations inside the decode loop\n",
                (unsigned long long)base_mem_guard_violations());
    if (o.json_path) {
        /* jsonx routes jansson through base_alloc once it has loaded anything; make
         * sure of that so json_dumps' buffer is released with base_free */
        json_decref(jsonx_load((const uint8_t *)"{}", 2, "init", NULL, 0));
        json_t *j = json_object();
        char hx[32];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)lhash);
        json_object_set_new(j, "model_dir", json_string(o.model_dir));
        json_object_set_new(j, "prompt_ids", ids_json(r.prompt, n_prompt));
        json_object_set_new(j, "generated_ids", ids_json(r.gen_ids, n_gen));
        json_object_set_new(j, "stopped_at_end_id", json_boolean(stopped));
        json_t *tm = json_object();
        json_object_set_new(tm, "load_s", json_real(r.m.t_load));
        json_object_set_new(tm, "prefill_s", json_real(t_prefill));
        json_object_set_new(tm, "prefill_s_per_token", json_real(pf));
        json_object_set_new(tm, "decode_s", json_real(t_decode));
        json_object_set_new(tm, "decode_s_per_token", json_real(dc));
        json_object_set_new(tm, "tokens_per_s", json_real(dc > 0 ? 1 / dc : 0));
        json_object_set_new(j, "timings", tm);
        json_object_set_new(j, "mla_cache_bytes_per_pos", json_integer((json_int_t)infer_mla_cache_bytes_per_pos(&r.c)));
        json_object_set_new(j, "session_bytes", json_integer((json_int_t)infer_session_bytes(&r.c, ctx)));
        json_object_set_new(j, "engine_bytes", json_integer((json_int_t)infer_engine_bytes(&r.c, engine_prefill_chunk(r.m.e), threads)));
        json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)rss));
        json_object_set_new(j, "threads", json_integer(threads));
        json_object_set_new(j, "kernel", json_string(r.m.kname));
        json_object_set_new(j, "ctx", json_integer(ctx));
        json_object_set_new(j, "logits_hash", json_string(hx));
        json_object_set_new(j, "placement", mo_placement_json(&r.m));
        char *txt = json_dumps(j, JSON_INDENT(2));
        json_decref(j);
        if (!txt || base_write_file_atomic(o.json_path, txt, strlen(txt), err, sizeof err)) {
            fprintf(stderr, "strata run: %s\n", txt ? err : "cannot format the JSON report");
            base_free(txt);
            goto out;
        }
        base_free(txt);
    }
    ret = 0;
out:
    run_release(&r);
    return ret;
}
