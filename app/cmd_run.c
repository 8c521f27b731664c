/*
 * cmd_run.c: `strata run`: load a model directory, evaluate a prompt (ids or
 * text), generate with greedy or sampled decoding, report.
 *
 * stdout carries only the output: with --print-ids ONE comma-separated line of the
 * generated ids (not the prompt); otherwise the generated text, streamed, when the
 * model has a tokenizer, else the ids. With --batch FILE every line of FILE is its
 * own sequence, all stepped together through the public API's generators (each
 * weight read once per pass for all of them); the outputs are printed at the end,
 * one line per input line, in input order. Everything else (logs, progress, the
 * run report) goes to stderr. Exit: 0 ok, 1 model/IO/runtime failure, 2 usage or
 * bad input.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "cli.h"
#include "model_open.h"
#include "strata.h"

#define CMD "run"

/* A growing NUL-terminated text (counted; NULL until the first append). Text is
 * taken up to its first NUL byte, as printf's "%.*s" did; an append that cannot
 * grow the buffer is dropped (best effort, like the rest of the batch output). */
typedef struct text_buf {
    char *s;
    size_t len, cap;
} text_buf;

static void text_add(text_buf *b, const char *p, size_t n) {
    n = strnlen(p, n);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *s = strata_realloc(b->s, cap);
        if (!s) return;
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->len, p, n);
    b->len += n;
    b->s[b->len] = 0;
}
#define RUN_DEFAULT_GEN 32
#define RUN_MAX_GEN (1 << 20)
#define RUN_MAX_BATCH (1 << 20)
#define RUN_DEFAULT_PARALLEL 16

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "--dump-logits writes host floats; this build assumes a little-endian host"
#endif

static void usage(FILE *f) {
    fprintf(f,
        "usage: strata run MODEL_DIR (--ids 1,2,3 | --prompt TEXT | --prompt-file F | --batch FILE) [options]\n"
        "\n"
        "  --ids LIST           prompt as comma-separated token ids (no tokenizer needed)\n"
        "  --prompt TEXT        prompt text (needs the model's tiktoken.model or tokenizer.json)\n"
        "  --prompt-file F      prompt text read verbatim from F\n"
        "  --batch FILE         every line of FILE is a prompt of its own sequence (ids 1,2,3), all\n"
        "                       stepped together; outputs one line per input line, in order;\n"
        "                       --dump-logits F writes F.0, F.1, ... (one per line)\n"
        "  --batch-text         --batch lines are text, not ids\n"
        "  --parallel N         sequences held at once with --batch (default min(lines, %d))\n"
        "  --gen N              tokens to generate (default %d, >= 1)\n",
        RUN_DEFAULT_PARALLEL, RUN_DEFAULT_GEN);
    opts_help(f, OPT_RUN, OPT_HELP_GEN);
    fprintf(f,
        "  --draft-ids LIST     with --spec: propose this continuation as the drafts (benchmarks, tests)\n"
        "  --ctx N              context positions (default prompt + gen, at most the model's maximum)\n"
        "  --chunk N            rows per pass (prefill chunk / batch; default %d)\n"
        "  --print-ids          print the generated ids as one line on stdout, nothing else\n"
        "  --dump-logits FILE   float32 LE logits of every step (steps x vocab; step 0 = after the prompt)\n"
        "  --json FILE          write a JSON run report\n"
        "  --json-schema FILE   constrain the output to a JSON document of this schema (a\n"
        "                       subset: docs/serve.md \"Structured output\"); implies --stop-eos\n"
        "  --json-object        constrain the output to one JSON object\n",
        64);
    opts_help(f, OPT_RUN, OPT_HELP_PLACE);
    fprintf(f,
        "  --stop-eos           with --ids: also stop at an end id (text prompts always do)\n"
        "  --ignore-eos         never stop at an end id\n"
        "\n"
        "End ids: config eos ids plus tokenizer_config.json's. Env: STRATA_KERNEL=scalar|avx2|...\n");
}

typedef struct run_opts {
    const char *model_dir, *ids, *prompt, *prompt_file, *batch, *dump_logits, *json_path, *draft_ids, *json_schema;
    app_opts ao;              /* the shared flags (opts.h) */
    int64_t parallel;
    int print_ids, stop_eos, ignore_eos, batch_text, json_object;
} run_opts;

#define R(field) offsetof(run_opts, field)
static const opt_row k_run_flags[] = {
    {.flag = "--ids", .kind = OPT_STR, .off = R(ids)},
    {.flag = "--prompt", .kind = OPT_STR, .off = R(prompt)},
    {.flag = "--prompt-file", .kind = OPT_STR, .off = R(prompt_file)},
    {.flag = "--batch", .kind = OPT_STR, .off = R(batch)},
    {.flag = "--batch-text", .kind = OPT_FLAG, .off = R(batch_text)},
    {.flag = "--parallel", .kind = OPT_I64, .off = R(parallel), .ilo = 1, .ihi = 4096, .what = "an integer in [1, 4096]"},
    {.flag = "--dump-logits", .kind = OPT_STR, .off = R(dump_logits)},
    {.flag = "--draft-ids", .kind = OPT_STR, .off = R(draft_ids)},
    {.flag = "--json", .kind = OPT_STR, .off = R(json_path)},
    {.flag = "--json-schema", .kind = OPT_STR, .off = R(json_schema)},
    {.flag = "--json-object", .kind = OPT_FLAG, .off = R(json_object)},
    {.flag = "--print-ids", .kind = OPT_FLAG, .off = R(print_ids)},
    {.flag = "--stop-eos", .kind = OPT_FLAG, .off = R(stop_eos)},
    {.flag = "--ignore-eos", .kind = OPT_FLAG, .off = R(ignore_eos)},
};
#undef R

static int parse_args(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    opts_init(&o->ao, OPT_RUN, RUN_DEFAULT_GEN);
    int rc = opts_parse(argc, argv, &o->ao, usage, k_run_flags, sizeof k_run_flags / sizeof *k_run_flags, o, &o->model_dir);
    if (rc) return rc;
    int np = (o->ids != NULL) + (o->prompt != NULL) + (o->prompt_file != NULL) + (o->batch != NULL);
    if (np != 1 && !(o->ao.plan_only && np == 0))
        return cli_usage_error(CMD, "give exactly one of --ids, --prompt, --prompt-file, --batch");
    if (o->stop_eos && o->ignore_eos) return cli_usage_error(CMD, "--stop-eos and --ignore-eos exclude each other");
    if (o->batch_text && !o->batch) return cli_usage_error(CMD, "--batch-text needs --batch");
    if (o->parallel && !o->batch) return cli_usage_error(CMD, "--parallel needs --batch");
    if (o->draft_ids && !o->ao.spec) return cli_usage_error(CMD, "--draft-ids needs --spec K");
    if (o->draft_ids && (o->ao.go.self_draft || o->ao.go.mtp_draft))
        return cli_usage_error(CMD, "--draft-ids and --draft %s exclude each other", o->ao.go.self_draft ? "self" : "mtp");
    if (o->json_schema && o->json_object) return cli_usage_error(CMD, "--json-schema and --json-object exclude each other");
    if ((o->json_schema || o->json_object) && o->ignore_eos)
        return cli_usage_error(CMD, "--json-schema / --json-object end the document with an end id; --ignore-eos excludes them");
    return 0;
}

/* One sequence of the run: its prompt, its generator, its dump file. */
typedef struct run_seq {
    int32_t *prompt;
    int64_t n_prompt;
    strata_gen *g;
    int64_t n_gen;            /* generated (copied out when the generator ends) */
    int32_t *gen_ids;
    int stopped;
    uint64_t lhash;
    int64_t drafted, accepted, verifies;
    text_buf text;            /* batch: the generated text */
    int dump_on, dump_fd;      /* --dump-logits: open, through the vfs layer (fault injection) */
    char dump_path[4096], dump_tmp[4200];
    int dump_slot;             /* dump_tmp's entry in the signal cleanup (strata_tmp_register) */
} run_seq;

/* Everything the run holds, released in one place. */
typedef struct run_state {
    mo_model m;
    const run_opts *o;
    run_seq *q;
    int64_t n_q;
    strata_seq **seqs;
    strata_gen **active;
    int single, stream_text, failed;
    double t_first;           /* seconds until the first generated token (single run) */
    int32_t *draft;           /* --draft-ids */
    double t0;
    int64_t ctx, n_tokens, total_prompt, sp_d, sp_a, sp_v; /* the context; totals at the end */
    double t_all;
} run_state;

/* Where an output named by the user lands: a symlink is followed to its target
 * (the temporary file is renamed over the target, not over the link: renaming
 * over /dev/stdout used to replace the link with a regular file); anything else
 * as given. */
static void out_dest(const char *path, char *out, size_t n) {
    struct stat sl;
    char real[PATH_MAX];
    if (lstat(path, &sl) == 0 && S_ISLNK(sl.st_mode) && realpath(path, real)) snprintf(out, n, "%s", real);
    else snprintf(out, n, "%s", path);
}

/* Whether path is this process's stdout (/dev/stdout, /proc/self/fd/1, or the
 * file stdout was redirected to): written through fd 1, at its offset. */
static int is_stdout(const char *path) {
    struct stat a, b;
    return stat(path, &a) == 0 && fstat(1, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* Writes a whole output file: a FIFO, a device or stdout (anything that exists
 * and is not a regular file) directly, with every write and the close checked;
 * a regular file atomically (temporary file, fsync, rename). 0 ok, else prints
 * why (naming path). */
static int out_write(const char *flag, const char *path, const void *buf, size_t len) {
    char dest[PATH_MAX + 8], err[4096];
    struct stat sb;
    out_dest(path, dest, sizeof dest);
    if (is_stdout(path)) {
        fflush(stdout);
        int e = strata_file_write_full(1, buf, len);
        if (e) { fprintf(stderr, "strata run: %s %s: write failed: %s\n", flag, path, strerror(e)); return 1; }
        return 0;
    }
    if (stat(dest, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        int fd = strata_file_open(dest, O_WRONLY | O_CLOEXEC, 0), e = 0;
        if (fd < 0) e = errno;
        else {
            e = strata_file_write_full(fd, buf, len);
            if (close(fd) && !e) e = errno;
        }
        if (e) { fprintf(stderr, "strata run: %s %s: write failed: %s\n", flag, path, strerror(e)); return 1; }
        return 0;
    }
    if (strata_write_file_atomic(dest, buf, len, err, sizeof err)) { fprintf(stderr, "strata run: %s %s: %s\n", flag, path, err); return 1; }
    return 0;
}

/* --dump-logits is written beside its destination and renamed only once the run
 * has finished, so a failed or interrupted run never leaves a plausible-looking
 * partial dump. A destination that exists and is not a regular file (/dev/stdout,
 * a FIFO) is written directly. */
static int dump_open(run_seq *q, const char *path) {
    struct stat sb;
    out_dest(path, q->dump_path, sizeof q->dump_path);
    path = q->dump_path;
    q->dump_tmp[0] = 0;
    if (is_stdout(path)) {
        fflush(stdout);
        if ((q->dump_fd = dup(1)) < 0) { fprintf(stderr, "strata run: --dump-logits %s: %s\n", path, strerror(errno)); return 1; }
        q->dump_on = 1;
        return 0;
    }
    if (!(stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))) {
        if (snprintf(q->dump_tmp, sizeof q->dump_tmp, "%s.partial-%d", path, (int)getpid()) >= (int)sizeof q->dump_tmp) {
            fprintf(stderr, "strata run: %s: path too long\n", path);
            q->dump_tmp[0] = 0;
            return 1;
        }
    }
    q->dump_slot = q->dump_tmp[0] ? strata_tmp_register(q->dump_tmp) : -1;
    q->dump_fd = strata_file_open(q->dump_tmp[0] ? q->dump_tmp : path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (q->dump_fd < 0) {
        fprintf(stderr, "strata run: --dump-logits %s: %s\n", path, strerror(errno));
        strata_tmp_unregister(q->dump_slot);
        q->dump_tmp[0] = 0;
        return 1;
    }
    q->dump_on = 1;
    return 0;
}

static int dump_commit(run_seq *q) {
    int bad = q->dump_tmp[0] && strata_file_fsync(q->dump_fd);
    bad |= close(q->dump_fd) != 0;
    q->dump_on = 0;
    if (!bad && q->dump_tmp[0] && strata_file_rename(q->dump_tmp, q->dump_path)) bad = 1;
    if (bad) {
        fprintf(stderr, "strata run: %s: write failed (%s)\n", q->dump_path, strerror(errno));
        if (q->dump_tmp[0]) unlink(q->dump_tmp);
    }
    if (q->dump_tmp[0]) strata_tmp_unregister(q->dump_slot);
    q->dump_tmp[0] = 0;
    return bad;
}

static void run_release(run_state *r) {
    for (int64_t i = 0; r->q && i < r->n_q; i++) {
        run_seq *q = &r->q[i];
        if (q->dump_on) close(q->dump_fd);
        if (q->dump_tmp[0]) { unlink(q->dump_tmp); strata_tmp_unregister(q->dump_slot); }
        strata_gen_free(q->g);
        strata_free(q->prompt);
        strata_free(q->gen_ids);
        strata_free(q->text.s);
        memset(&q->text, 0, sizeof q->text);
    }
    strata_free(r->q);
    strata_free(r->draft);
    for (int64_t i = 0; r->seqs && i < r->o->parallel; i++) strata_seq_free(r->seqs[i]);
    strata_free(r->seqs);
    strata_free(r->active);
    mo_close(&r->m);
}

/* Text -> ids through the model's tokenizer; ids checked against the vocabulary. */
static int tokenize(run_state *r, const char *text, size_t len, int32_t **ids, int64_t *n, const char *what) {
    char err[1024];
    size_t k = 0;
    if (len == 0) { fprintf(stderr, "strata run: %s: empty prompt\n", what); return EXIT_USAGE; }
    if (strata_tokenize(r->m.m, text, len, 0, ids, &k, err, sizeof err)) {
        fprintf(stderr, "strata run: %s: %s\n", what, err);
        return r->m.info.has_tokenizer ? 1 : EXIT_USAGE;
    }
    if (k == 0) { fprintf(stderr, "strata run: %s: empty prompt\n", what); return EXIT_USAGE; }
    *n = (int64_t)k;
    return 0;
}

static int parse_ids(run_state *r, const char *s, int32_t **ids, int64_t *n, const char *what) {
    const int64_t V = r->m.info.vocab;
    int64_t *v;
    size_t k;
    int prc = strata_parse_id_list(s, 0, V - 1, &v, &k);
    if (prc == STRATA_ENOMEM) { fprintf(stderr, "strata run: out of memory reading %s\n", what); return 1; }
    if (prc || k == 0) {
        fprintf(stderr, "strata run: bad %s '%.200s': need comma-separated ids in [0, %lld)\n", what, s, (long long)V);
        return EXIT_USAGE;
    }
    *ids = strata_alloc(k * sizeof(int32_t));
    if (!*ids) { strata_free(v); fprintf(stderr, "strata run: out of memory\n"); return 1; }
    for (size_t i = 0; i < k; i++) (*ids)[i] = (int32_t)v[i];
    strata_free(v);
    *n = (int64_t)k;
    return 0;
}

/* The largest prompt the context can take, in bytes: a longer text cannot fit
 * (every token is at most max_token bytes), so it is refused before it is read
 * and tokenized (a 200 MB file used to peak at 1.26 GB RSS under --ram-gb 0.1). */
static uint64_t max_prompt_bytes(run_state *r, int64_t ctx_cap) {
    size_t mt = strata_token_max_bytes(r->m.m);
    return mt ? (uint64_t)ctx_cap * mt : UINT64_MAX;
}

static int load_prompts(run_state *r, int64_t ctx_cap) {
    const run_opts *o = r->o;
    char err[1024];
    int rc;
    if (!o->batch) {
        r->n_q = 1;
        r->q = strata_calloc(1, sizeof *r->q);
        if (!r->q) { fprintf(stderr, "strata run: out of memory\n"); return 1; }
        run_seq *q = &r->q[0];
        if (o->ids) return parse_ids(r, o->ids, &q->prompt, &q->n_prompt, "--ids");
        if (!r->m.info.has_tokenizer) {
            fprintf(stderr, "strata run: text prompts need the model's tokenizer (tiktoken.model or tokenizer.json in %s); use --ids\n", o->model_dir);
            return EXIT_USAGE;
        }
        if (o->prompt) return tokenize(r, o->prompt, strlen(o->prompt), &q->prompt, &q->n_prompt, "--prompt");
        struct stat sb;
        const uint64_t lim = max_prompt_bytes(r, ctx_cap);
        if (stat(o->prompt_file, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > lim) {
            fprintf(stderr, "strata run: %s: %lld bytes cannot fit a context of %lld tokens (at most %llu bytes)\n",
                    o->prompt_file, (long long)sb.st_size, (long long)ctx_cap, (unsigned long long)lim);
            return EXIT_USAGE;
        }
        uint8_t *text = NULL;
        size_t len = 0;
        if (strata_read_file(o->prompt_file, lim < (1u << 30) ? (size_t)lim + 1 : 1u << 30, &text, &len, err, sizeof err)) {
            fprintf(stderr, "strata run: %s\n", err);
            return EXIT_USAGE;
        }
        rc = tokenize(r, (const char *)text, len, &q->prompt, &q->n_prompt, o->prompt_file);
        strata_free(text);
        return rc;
    }
    /* --batch: one prompt per line (blank lines are errors: each line is a sequence) */
    if (o->batch_text && !r->m.info.has_tokenizer) {
        fprintf(stderr, "strata run: --batch-text needs the model's tokenizer (tiktoken.model or tokenizer.json in %s)\n", o->model_dir);
        return EXIT_USAGE;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (strata_read_file(o->batch, 1u << 30, &buf, &len, err, sizeof err)) { fprintf(stderr, "strata run: %s\n", err); return EXIT_USAGE; }
    int64_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n' || (i + 1 == len);
    if (lines == 0 || lines > RUN_MAX_BATCH) {
        fprintf(stderr, "strata run: %s: %s\n", o->batch, lines ? "too many lines" : "no prompts (one per line)");
        strata_free(buf);
        return EXIT_USAGE;
    }
    r->q = strata_calloc((size_t)lines, sizeof *r->q);
    if (!r->q) { strata_free(buf); fprintf(stderr, "strata run: out of memory\n"); return 1; }
    rc = 0;
    size_t p = 0;
    for (int64_t k = 0; k < lines && !rc; k++) {
        size_t e = p;
        while (e < len && buf[e] != '\n') e++;
        size_t n = e - p;
        if (n && buf[p + n - 1] == '\r') n--;
        char what[4200];
        snprintf(what, sizeof what, "%s line %lld", o->batch, (long long)k + 1);
        run_seq *q = &r->q[k];
        r->n_q = k + 1;
        if (o->batch_text) rc = tokenize(r, (const char *)buf + p, n, &q->prompt, &q->n_prompt, what);
        else {
            buf[p + n] = 0;
            rc = parse_ids(r, (const char *)buf + p, &q->prompt, &q->n_prompt, what);
        }
        p = e + 1;
    }
    strata_free(buf);
    return rc;
}

/* Whether path is inside model_dir: one of its files (a shard, config.json,
 * strata.pack/trunk.bin, ...) or a new name there (a stray *.safetensors would
 * change the model). Prints why. */
static int inside_model(const char *flag, const char *path, const char *model_dir) {
    char dir[4096], rm[PATH_MAX], ro[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *sl = strrchr(dir, '/');
    if (!sl) snprintf(dir, sizeof dir, ".");
    else if (sl == dir) dir[1] = 0;
    else *sl = 0;
    if (!realpath(model_dir, rm) || !(realpath(path, ro) || realpath(dir, ro))) return 0;
    size_t n = strlen(rm);
    if (strncmp(ro, rm, n) || (ro[n] != '/' && ro[n] != 0)) return 0;
    fprintf(stderr, "strata run: %s %s: is inside the model directory %s; refusing to write there\n", flag, path, model_dir);
    return 1;
}

/* An output path must not be one of the model's own files (a shard, the
 * config, the pack manifest) and must be writable before hours of work start:
 * its directory exists and takes new files. 0 ok, else prints why. */
static int check_out_path(const char *flag, const char *path, const char *model_dir) {
    struct stat sp, se;
    char dir[4096], full[8400];
    if (stat(path, &sp) == 0) {
        if (S_ISDIR(sp.st_mode)) { fprintf(stderr, "strata run: %s %s: is a directory\n", flag, path); return 1; }
        DIR *d = opendir(model_dir);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            snprintf(full, sizeof full, "%s/%s", model_dir, de->d_name);
            if (stat(full, &se) == 0 && S_ISREG(se.st_mode) && se.st_dev == sp.st_dev && se.st_ino == sp.st_ino) {
                closedir(d);
                fprintf(stderr, "strata run: %s %s: is one of the model's own files; refusing to overwrite it\n", flag, path);
                return 1;
            }
        }
        if (d) closedir(d);
        if (inside_model(flag, path, model_dir)) return 1;
        if (!S_ISREG(sp.st_mode)) return 0; /* /dev/stdout, a FIFO: written directly */
    } else if (inside_model(flag, path, model_dir)) {
        return 1;
    }
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (access(dir, W_OK | X_OK)) {
        fprintf(stderr, "strata run: %s %s: cannot write in %s: %s\n", flag, path, dir, strerror(errno));
        return 1;
    }
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

/* Each generated token: dump its logits, stream it (single run) or keep its text. */
static void on_token(void *ud, strata_gen *g, int32_t id, const char *text, size_t len, const float *logits) {
    run_state *r = ud;
    run_seq *q = strata_gen_user(g);
    if (logits && q->dump_on && strata_file_write_full(q->dump_fd, logits, (uint64_t)r->m.info.vocab * sizeof(float))) {
        fprintf(stderr, "strata run: %s: write failed\n", q->dump_path);
        r->failed = 1;
    }
    if (id >= 0 && r->t_first == 0) r->t_first = strata_now() - r->t0;
    if (!r->single) {
        if (len) text_add(&q->text, text, len);
        return;
    }
    if (r->stream_text) {
        if (len) { fwrite(text, 1, len, stdout); fflush(stdout); }
    } else if (!r->o->print_ids && !r->m.info.has_tokenizer && id >= 0) {
        int64_t n;
        strata_gen_ids(g, &n);
        printf(n > 1 ? ",%d" : "%d", id);
        fflush(stdout);
    }
}

/* Long prefills say how far they are: tokens done / total, rate, time left. */
static void progress(run_state *r, int64_t total, double *last) {
    if (total < 256) return;
    const double now = strata_now();
    if (now - *last < 1.0) return;
    *last = now;
    int64_t done = 0;
    for (int64_t i = 0; i < r->n_q; i++) done += r->q[i].g ? strata_gen_prefilled(r->q[i].g) : (r->q[i].gen_ids ? r->q[i].n_prompt : 0);
    if (done >= total) return;
    const double el = now - r->t0, rate = el > 0 ? (double)done / el : 0;
    fprintf(stderr, "strata run: prefill %lld/%lld tokens, %.1f tok/s, ETA %.0f s\n", (long long)done, (long long)total, rate,
            rate > 0 ? (double)(total - done) / rate : 0);
}

/* Every sequence stepped together; a finished one hands its slot to the next
 * line. 0, or 1 after printing why. */
static int run_steps(run_state *r, const strata_gen_opts *go) {
    char err[4096];
    int rc;
    int64_t next = 0;
    for (int64_t i = 0; i < r->n_q; i++) r->total_prompt += r->q[i].n_prompt;
    double last_progress = strata_now();
    r->t0 = strata_now();
    for (;;) {
        int n_act = 0;
        for (int64_t k = 0; k < r->o->parallel; k++) {
            strata_gen *g = r->active[k];
            if (g && strata_gen_done(g)) {
                run_seq *q = strata_gen_user(g);
                const int32_t *ids = strata_gen_ids(g, &q->n_gen);
                q->gen_ids = strata_alloc((size_t)q->n_gen * sizeof(int32_t) + 1);
                if (!q->gen_ids) { fprintf(stderr, "strata run: out of memory\n"); return 1; }
                memcpy(q->gen_ids, ids, (size_t)q->n_gen * sizeof(int32_t));
                q->stopped = strata_gen_stopped(g);
                q->lhash = strata_gen_logits_hash(g);
                strata_gen_spec_stats(g, &q->drafted, &q->accepted, &q->verifies);
                r->n_tokens += q->n_gen;
                strata_gen_free(g);
                q->g = NULL;
                r->active[k] = g = NULL;
            }
            if (!g && next < r->n_q) {
                run_seq *q = &r->q[next++];
                if (strata_gen_create(&q->g, r->seqs[k], q->prompt, q->n_prompt, go, 0, err, sizeof err)) {
                    fprintf(stderr, "strata run: %s\n", err);
                    return 1;
                }
                strata_gen_set_user(q->g, q);
                r->active[k] = g = q->g;
            }
            if (g) r->active[n_act++] = g;
        }
        /* compact: active[0 .. n_act) in slot order is fine, slots are interchangeable */
        for (int64_t k = n_act; k < r->o->parallel; k++) r->active[k] = NULL;
        if (n_act == 0) break;
        rc = strata_gen_step(r->m.m, r->active, n_act, on_token, r, err, sizeof err);
        if (rc < 0) { fprintf(stderr, "strata run: %s\n", err); return 1; }
        if (r->failed) return 1;
        progress(r, r->total_prompt, &last_progress);
    }
    r->t_all = strata_now() - r->t0;
    for (int64_t i = 0; i < r->n_q; i++) { r->sp_d += r->q[i].drafted; r->sp_a += r->q[i].accepted; r->sp_v += r->q[i].verifies; }
    return 0;
}

/* The outputs on stdout: the single run's ids or newline, or one line per --batch line. */
static void run_outputs(const run_state *r) {
    const run_seq *q0 = &r->q[0];
    if (r->single) {
        if (r->o->print_ids) print_ids_line(stdout, q0->gen_ids, q0->n_gen);
        else fputc('\n', stdout);
    } else {
        for (int64_t i = 0; i < r->n_q; i++) {
            if (r->o->print_ids || !r->m.info.has_tokenizer) print_ids_line(stdout, r->q[i].gen_ids, r->q[i].n_gen);
            else {
                /* one line per input: newlines inside a reply are escaped */
                for (size_t k = 0; r->q[i].text.s && k < r->q[i].text.len; k++) {
                    char ch = r->q[i].text.s[k];
                    if (ch == '\n') fputs("\\n", stdout);
                    else if (ch == '\\') fputs("\\\\", stdout);
                    else fputc(ch, stdout);
                }
                fputc('\n', stdout);
            }
        }
    }
}

/* --json: the run report as a JSON file. 0, or 1 after printing why. */
static int run_json(run_state *r, uint64_t lhash, uint64_t rss, int64_t n_prompt_all, int64_t n_decode, double t_prefill, double t_decode) {
    const run_seq *q0 = &r->q[0];
    strata_json_init();
    json_t *j = json_object();
    char hx[32];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)lhash);
    const double pf = n_prompt_all ? t_prefill / (double)n_prompt_all : 0, dc = n_decode > 0 ? t_decode / (double)n_decode : 0;
    json_object_set_new(j, "model_dir", json_string(r->o->model_dir));
    if (r->single) {
        json_object_set_new(j, "prompt_ids", ids_json(q0->prompt, q0->n_prompt));
        json_object_set_new(j, "generated_ids", ids_json(q0->gen_ids, q0->n_gen));
        json_object_set_new(j, "stopped_at_end_id", json_boolean(q0->stopped));
    } else {
        json_t *a = json_array();
        for (int64_t i = 0; i < r->n_q; i++)
            json_array_append_new(a, json_pack("{s:o, s:o, s:b}", "prompt_ids", ids_json(r->q[i].prompt, r->q[i].n_prompt),
                                               "generated_ids", ids_json(r->q[i].gen_ids, r->q[i].n_gen),
                                               "stopped_at_end_id", r->q[i].stopped));
        json_object_set_new(j, "sequences", a);
        json_object_set_new(j, "parallel", json_integer(r->o->parallel));
    }
    json_t *tm = json_object();
    json_object_set_new(tm, "load_s", json_real(r->m.info.load_s));
    json_object_set_new(tm, "total_s", json_real(r->t_all));
    json_object_set_new(tm, "prefill_s", json_real(t_prefill));
    json_object_set_new(tm, "prefill_s_per_token", json_real(pf));
    json_object_set_new(tm, "decode_s", json_real(t_decode));
    json_object_set_new(tm, "decode_s_per_token", json_real(dc));
    json_object_set_new(tm, "tokens_per_s", json_real(dc > 0 ? 1 / dc : 0));
    json_object_set_new(tm, "aggregate_tokens_per_s", json_real(r->t_all > 0 ? (double)r->n_tokens / r->t_all : 0));
    json_object_set_new(j, "timings", tm);
    json_object_set_new(j, "mla_cache_bytes_per_pos", json_integer((json_int_t)r->m.info.mla_cache_bytes_per_pos));
    json_object_set_new(j, "session_bytes", json_integer((json_int_t)r->m.info.seq_bytes));
    json_object_set_new(j, "engine_bytes", json_integer((json_int_t)r->m.info.engine_bytes));
    json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)rss));
    json_object_set_new(j, "threads", json_integer(r->m.info.n_threads));
    json_object_set_new(j, "kernel", json_string(r->m.info.kernel));
    json_object_set_new(j, "ctx", json_integer(r->ctx));
    json_object_set_new(j, "logits_hash", json_string(hx));
    json_object_set_new(j, "placement", mo_placement_json(&r->m));
    json_object_set_new(j, "speculation",
                        json_pack("{s:i, s:I, s:I, s:I, s:f}", "max_drafts", (int)r->o->ao.spec, "drafted", (json_int_t)r->sp_d,
                                  "accepted", (json_int_t)r->sp_a, "verifying_passes", (json_int_t)r->sp_v,
                                  "acceptance", r->sp_d ? (double)r->sp_a / (double)r->sp_d : 0.0));
    {
        strata_stats ss;
        strata_model_get_stats(r->m.m, &ss);
        json_t *sp = json_object_get(j, "speculation");
        if (sp) {
            json_object_set_new(sp, "draft_source", json_string(r->o->ao.go.self_draft ? "self" : r->o->ao.go.mtp_draft ? "mtp" : r->o->draft_ids ? "ids" : "ngram"));
            json_object_set_new(sp, "self_draft_passes", json_integer((json_int_t)ss.draft_passes));
            json_object_set_new(sp, "self_draft_layers_run",
                                json_real(ss.draft_layers ? (double)ss.draft_layers_run / (double)ss.draft_layers : 0.0));
            json_object_set_new(sp, "self_draft_experts_in_ram",
                                json_real(ss.draft_experts ? (double)ss.draft_experts_used / (double)ss.draft_experts : 0.0));
        }
    }
    char *txt = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!txt) { fprintf(stderr, "strata run: cannot format the JSON report\n"); return 1; }
    if (out_write("--json", r->o->json_path, txt, strlen(txt))) { strata_free(txt); return 1; }
    strata_free(txt);
    return 0;
}

/* The run report on stderr (prefill = until the first token; decode = the
 * rest), then --json; 0, or 1 when the JSON report could not be written. */
static int run_report(run_state *r) {
    const run_seq *q0 = &r->q[0];
    uint64_t rss = strata_peak_rss();
    char speed[512];
    int64_t n_decode = r->n_tokens - r->n_q, n_prompt_all = r->total_prompt;
    double t_prefill = r->single ? r->t_first : 0, t_decode = r->single ? r->t_all - r->t_first : r->t_all;
    uint64_t lhash = q0->lhash;
    if (r->single) {
        mo_fmt_speed(&r->m, n_prompt_all, t_prefill, n_decode, t_decode, rss, speed, sizeof speed);
        fprintf(stderr, "strata run: prompt %lld tokens, generated %lld%s; %s; logits hash %016llx\n", (long long)n_prompt_all,
                (long long)q0->n_gen, q0->stopped ? " (end id)" : "", speed, (unsigned long long)lhash);
    } else {
        lhash = STRATA_FNV_INIT;
        for (int64_t i = 0; i < r->n_q; i++) lhash = strata_fnv1a(&r->q[i].lhash, sizeof r->q[i].lhash, lhash);
        char b1[32];
        fprintf(stderr,
                "strata run: %lld sequences (%lld at once), prompts %lld tokens, generated %lld tokens in %.3f s: "
                "%.2f tokens/s aggregate; peak RSS %s; logits hash %016llx\n",
                (long long)r->n_q, (long long)r->o->parallel, (long long)n_prompt_all, (long long)r->n_tokens, r->t_all,
                r->t_all > 0 ? (double)r->n_tokens / r->t_all : 0, strata_fmt_bytes(rss, b1, sizeof b1), (unsigned long long)lhash);
    }
    if (r->o->ao.spec)
        fprintf(stderr, "speculation: %lld drafted, %lld accepted (%.1f%%) in %lld verifying passes; %.2f tokens per decode pass\n",
                (long long)r->sp_d, (long long)r->sp_a, r->sp_d ? 100.0 * (double)r->sp_a / (double)r->sp_d : 0, (long long)r->sp_v,
                n_decode > 0 ? (double)n_decode / (double)(n_decode - r->sp_a) : 0);
    if (r->o->ao.spec && r->o->ao.go.self_draft) {
        strata_stats ss;
        strata_model_get_stats(r->m.m, &ss);
        if (ss.draft_passes)
            fprintf(stderr, "self-draft: %lld passes from RAM, %.1f%% of layers run (the rest streamed: skipped), %.1f%% of chosen "
                    "experts in the cache\n", (long long)ss.draft_passes,
                    ss.draft_layers ? 100.0 * (double)ss.draft_layers_run / (double)ss.draft_layers : 0,
                    ss.draft_experts ? 100.0 * (double)ss.draft_experts_used / (double)ss.draft_experts : 0);
        else
            fprintf(stderr, "self-draft: not possible with this placement (resident model or streamed head): n-gram drafts\n");
    }
    mo_report(&r->m, stderr);
    if (strata_mem_guard_violations())
        fprintf(stderr, "strata run: warning: %llu allocations inside the decode loop\n",
                (unsigned long long)strata_mem_guard_violations());
    return r->o->json_path ? run_json(r, lhash, rss, n_prompt_all, n_decode, t_prefill, t_decode) : 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc == OPTS_HELP ? 0 : rc;

    run_state r;
    memset(&r, 0, sizeof r);
    r.o = &o;
    char err[4096];
    int ret = 1;
    strata_grammar *gram = NULL;
    if (o.json_schema || o.json_object) { /* before the model: a bad schema fails at once */
        uint8_t *txt = NULL;
        size_t len = 0;
        rc = o.json_object ? strata_grammar_json_object(&gram, err, sizeof err)
                           : strata_read_file(o.json_schema, 16u << 20, &txt, &len, err, sizeof err);
        if (!rc && o.json_schema) rc = strata_grammar_json_schema(&gram, (const char *)txt, len, err, sizeof err);
        strata_free(txt);
        if (rc) {
            fprintf(stderr, "strata run: --json-schema %s: %s\n", o.json_schema ? o.json_schema : "", err);
            ret = rc == STRATA_EINVAL ? EXIT_USAGE : 1;
            goto out;
        }
    }
    if (mo_open(&r.m, CMD, o.model_dir)) goto out;
    const int64_t max_ctx = r.m.info.model_max_ctx;
    if (o.ao.ctx > max_ctx)
        fprintf(stderr, "strata run: note: --ctx %lld is above the model's maximum of %lld positions\n", (long long)o.ao.ctx,
                (long long)max_ctx);
    const int64_t ctx_cap = o.ao.ctx ? o.ao.ctx : max_ctx;
    if ((o.ids || o.prompt || o.prompt_file || o.batch) && (rc = load_prompts(&r, ctx_cap))) { ret = rc; goto out; }
    r.single = !o.batch;

    /* context: exactly what the run needs (the MLA cache and the plan are sized by it) */
    int64_t ctx = o.ao.ctx, need = 0;
    for (int64_t i = 0; i < r.n_q; i++) if (r.q[i].n_prompt + o.ao.gen > need) need = r.q[i].n_prompt + o.ao.gen;
    if (!ctx) ctx = need ? (need < max_ctx ? need : max_ctx) : (max_ctx < 4096 ? max_ctx : 4096);
    for (int64_t i = 0; i < r.n_q; i++)
        if (r.q[i].n_prompt > ctx) {
            char which[64] = "the prompt";
            if (!r.single) snprintf(which, sizeof which, "line %lld", (long long)i + 1);
            fprintf(stderr, "strata run: %s has %lld tokens, more than the context of %lld%s\n", which, (long long)r.q[i].n_prompt,
                    (long long)ctx, o.ao.ctx ? " (--ctx)" : " (the model's maximum)");
            ret = EXIT_USAGE;
            goto out;
        }
    r.ctx = ctx;
    if (need > ctx) fprintf(stderr, "strata run: note: generation stops at the context limit (%lld positions)\n", (long long)ctx);

    /* output paths before the weights load, so a bad path fails at once */
    if (o.json_path && !o.ao.plan_only && check_out_path("--json", o.json_path, o.model_dir)) goto out;
    if (o.dump_logits && !o.ao.plan_only && r.single && check_out_path("--dump-logits", o.dump_logits, o.model_dir)) goto out;
    if (o.dump_logits && !o.ao.plan_only)
        for (int64_t i = 0; i < r.n_q; i++) {
            char p[4096];
            if (r.single) snprintf(p, sizeof p, "%s", o.dump_logits);
            else snprintf(p, sizeof p, "%s.%lld", o.dump_logits, (long long)i);
            if (!r.single && check_out_path("--dump-logits", p, o.model_dir)) goto out;
            if (dump_open(&r.q[i], p)) goto out;
        }

    /* placement, weights, engine: one sequence slot per parallel line */
    if (!o.parallel) o.parallel = r.n_q < RUN_DEFAULT_PARALLEL ? (r.n_q ? r.n_q : 1) : RUN_DEFAULT_PARALLEL;
    if (o.parallel > r.n_q && r.n_q) o.parallel = r.n_q;
    if ((rc = mo_place(&r.m, &o.ao, ctx, (int)o.parallel))) {
        ret = rc == MO_PLANNED ? 0 : rc;
        goto out;
    }
    r.seqs = strata_calloc((size_t)o.parallel, sizeof *r.seqs);
    r.active = strata_calloc((size_t)o.parallel, sizeof *r.active);
    if (!r.seqs || !r.active) { fprintf(stderr, "strata run: out of memory\n"); goto out; }
    for (int64_t i = 0; i < o.parallel; i++)
        if (strata_seq_create(r.m.m, &r.seqs[i], err, sizeof err)) { fprintf(stderr, "strata run: %s\n", err); goto out; }
    strata_gen_opts go = opts_gen(&o.ao);
    go.stop_at_end = !o.ignore_eos && (!(o.ids || (o.batch && !o.batch_text)) || o.stop_eos);
    go.want_text = r.m.info.has_tokenizer && !o.print_ids;
    go.want_logits = o.dump_logits != NULL;
    go.grammar = gram;
    if (gram) go.stop_at_end = 1;
    if (o.draft_ids) {
        if ((rc = parse_ids(&r, o.draft_ids, &r.draft, &go.n_draft_ids, "--draft-ids"))) { ret = rc; goto out; }
        go.draft_ids = r.draft;
    }
    r.stream_text = r.single && go.want_text;

    if (run_steps(&r, &go)) goto out;
    run_outputs(&r);
    fflush(stdout);
    for (int64_t i = 0; i < r.n_q; i++)
        if (r.q[i].dump_on && dump_commit(&r.q[i])) goto out;

    if (run_report(&r)) goto out;
    ret = 0;
out:
    run_release(&r);
    strata_grammar_free(gram);
    return ret;
}
