/*
 * cmd_tokenize.c: `strata tokenize`: stdin bytes -> ids, or with --decode ids ->
 * bytes. The output format is a contract used by external checks: ids are one
 * comma-separated line ending in a newline (an empty line for empty input), and
 * --decode writes exactly the token bytes, nothing else.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "strata.h"

static const char k_usage[] =
    "usage: strata tokenize --vocab FILE [--config FILE] [--pattern kimi|o200k|cl100k]\n"
    "                       [--special] [--bos] [--decode]\n"
    "\n"
    "Reads stdin and writes to stdout.\n"
    "  encode (default): bytes -> ids as one comma-separated line (\"1,2,3\\n\"; empty\n"
    "                    input gives an empty line). Special-token text stays text\n"
    "                    unless --special is given.\n"
    "  --decode:         a comma-separated id line (whitespace ignored) -> the exact bytes.\n"
    "\n"
    "  --vocab FILE      tiktoken.model (base64 token, space, rank per line), or a\n"
    "                    Hugging Face tokenizer.json (a name ending in .json:\n"
    "                    byte-level BPE as DeepSeek-V3 ships; --pattern is unused)\n"
    "  --config FILE     tokenizer_config.json; its added_tokens_decoder entries become\n"
    "                    special tokens (default: tokenizer_config.json beside the vocab,\n"
    "                    if there is one)\n"
    "  --pattern NAME    pre-tokenizer split: kimi (default, Kimi K2/K3), o200k, cl100k\n"
    "  --special         encode special-token text (\"<|open|>\") as its id\n"
    "  --bos             put the BOS id first, as Hugging Face's encode does when the\n"
    "                    tokenizer.json's post-processor adds one and add_bos_token\n"
    "                    is not false (nothing for tiktoken vocabularies)\n"
    "\n"
    "Exit status: 0 ok, 1 bad vocab/config or input, 2 usage error.\n";

/* Reads all of stdin into a malloc buffer. */
static int read_stdin(uint8_t **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap);
    if (!b) return STRATA_ENOMEM;
    for (;;) {
        if (n == cap) {
            uint8_t *nb = realloc(b, cap * 2);
            if (!nb) { free(b); return STRATA_ENOMEM; }
            b = nb;
            cap *= 2;
        }
        ssize_t r = read(0, b + n, cap - n);
        if (r < 0) { free(b); return STRATA_EIO; }
        if (r == 0) break;
        n += (size_t)r;
    }
    *out = b;
    *len = n;
    return STRATA_OK;
}

static int write_all(const void *p, size_t n) { return fwrite(p, 1, n, stdout) == n ? 0 : -1; }

static int do_encode(strata_tokenizer *t, const uint8_t *in, size_t len, int special, int bos) {
    int32_t *ids;
    size_t n;
    int rc = strata_tokenizer_encode(t, in, len, special, &ids, &n);
    int32_t b = bos ? strata_tokenizer_bos(t) : -1;
    if (rc) {
        fprintf(stderr, "strata tokenize: encode failed: %s\n", strata_tokenizer_errmsg(t)[0] ? strata_tokenizer_errmsg(t) : strata_errstr(rc));
        return 1;
    }
    /* Format in one buffer: 11 bytes per id is enough for "-2147483648," */
    char *out = malloc(n * 12 + 14);
    if (!out) { strata_free(ids); fprintf(stderr, "strata tokenize: out of memory\n"); return 1; }
    size_t o = 0;
    if (b >= 0) o = (size_t)sprintf(out, "%d%s", b, n ? "," : "");
    for (size_t i = 0; i < n; i++) {
        if (i) out[o++] = ',';
        char tmp[12];
        int k = 0;
        uint32_t v = (uint32_t)ids[i];
        do { tmp[k++] = (char)('0' + v % 10); v /= 10; } while (v);
        while (k) out[o++] = tmp[--k];
    }
    out[o++] = '\n';
    int bad = write_all(out, o);
    free(out);
    strata_free(ids);
    if (bad || fflush(stdout)) { fprintf(stderr, "strata tokenize: write error\n"); return 1; }
    return 0;
}

static int do_decode(const strata_tokenizer *t, const uint8_t *in, size_t len) {
    size_t cap = 1024, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) { fprintf(stderr, "strata tokenize: out of memory\n"); return 1; }
    size_t i = 0;
    int rc = 1, expect_id = 1, any = 0;
    for (;;) {
        while (i < len && (in[i] == ' ' || in[i] == '\t' || in[i] == '\n' || in[i] == '\r')) i++;
        if (i == len) break;
        if (in[i] == ',') {
            if (expect_id) { fprintf(stderr, "strata tokenize: --decode: empty id at byte %zu\n", i); goto done; }
            expect_id = 1;
            i++;
            continue;
        }
        if (!expect_id) { fprintf(stderr, "strata tokenize: --decode: expected ',' at byte %zu\n", i); goto done; }
        int64_t v = 0;
        size_t start = i;
        while (i < len && in[i] >= '0' && in[i] <= '9' && v <= INT32_MAX) v = v * 10 + (in[i++] - '0');
        if (i == start || v > INT32_MAX || (i < len && in[i] >= '0' && in[i] <= '9')) {
            fprintf(stderr, "strata tokenize: --decode: bad id at byte %zu\n", start);
            goto done;
        }
        if (v >= strata_tokenizer_n_vocab(t) || !strata_tokenizer_token_bytes(t, (int32_t)v, &(size_t){0})) {
            fprintf(stderr, "strata tokenize: --decode: id %lld is not in the vocabulary (%d ids)\n",
                    (long long)v, strata_tokenizer_n_vocab(t));
            goto done;
        }
        if (n == cap) {
            int32_t *nv = realloc(ids, cap * 2 * sizeof *ids);
            if (!nv) { fprintf(stderr, "strata tokenize: out of memory\n"); goto done; }
            ids = nv;
            cap *= 2;
        }
        ids[n++] = (int32_t)v;
        expect_id = 0;
        any = 1;
    }
    if (any && expect_id) { fprintf(stderr, "strata tokenize: --decode: trailing ','\n"); goto done; }
    uint8_t *bytes;
    size_t nb;
    if (strata_tokenizer_decode(t, ids, n, &bytes, &nb)) { fprintf(stderr, "strata tokenize: decode failed\n"); goto done; }
    int bad = write_all(bytes, nb);
    strata_free(bytes);
    if (bad || fflush(stdout)) { fprintf(stderr, "strata tokenize: write error\n"); goto done; }
    rc = 0;
done:
    free(ids);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *vocab = NULL, *config = NULL;
    int pattern = STRATA_TOK_KIMI, decode = 0, special = 0, bos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_help(a)) { fputs(k_usage, stdout); return 0; }
        if (!strcmp(a, "--vocab")) {
            if (!(vocab = cli_need_arg(argc, argv, &i, cmd))) return EXIT_USAGE;
        } else if (!strcmp(a, "--config")) {
            if (!(config = cli_need_arg(argc, argv, &i, cmd))) return EXIT_USAGE;
        } else if (!strcmp(a, "--pattern")) {
            const char *v = cli_need_arg(argc, argv, &i, cmd);
            if (!v) return EXIT_USAGE;
            if ((pattern = strata_tokenizer_pattern(v)) < 0)
                return cli_usage_error(cmd, "unknown pattern '%s' (kimi, o200k or cl100k)", v);
        } else if (!strcmp(a, "--decode")) {
            decode = 1;
        } else if (!strcmp(a, "--special")) {
            special = 1;
        } else if (!strcmp(a, "--bos")) {
            bos = 1;
        } else {
            return cli_usage_error(cmd, "unknown argument '%s'", a);
        }
    }
    if (!vocab) return cli_usage_error(cmd, "--vocab FILE is required");
    /* K3 ships tiktoken.model and tokenizer_config.json side by side, DeepSeek
     * tokenizer.json and tokenizer_config.json. */
    char sibling[4096];
    if (!config) {
        const char *slash = strrchr(vocab, '/');
        int dl = slash ? (int)(slash - vocab) + 1 : 0;
        if (snprintf(sibling, sizeof sibling, "%.*stokenizer_config.json", dl, vocab) < (int)sizeof sibling &&
            strata_is_file(sibling))
            config = sibling;
    }
    char err[512];
    strata_tokenizer *t;
    if (strata_tokenizer_open(&t, vocab, config, pattern, err, sizeof err)) {
        fprintf(stderr, "strata tokenize: %s\n", err);
        return 1;
    }
    uint8_t *in;
    size_t len;
    if (read_stdin(&in, &len)) {
        fprintf(stderr, "strata tokenize: cannot read stdin\n");
        strata_tokenizer_close(t);
        return 1;
    }
    int rc = decode ? do_decode(t, in, len) : do_encode(t, in, len, special, bos);
    free(in);
    strata_tokenizer_close(t);
    return rc;
}
