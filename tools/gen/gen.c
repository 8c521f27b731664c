/*
 * gen.c: `strata gen-model`: K3-format checkpoints with random, numerically alive
 * weights, streamed to disk at any size (see gen.h for the guarantees).
 *
 * Pipeline: two generator threads fill a ring of 16 MB buffers (any buffer can
 * be generated from the plan alone) while the calling thread keeps up to eight
 * O_DIRECT writes in flight through io_uring into preallocated shard files, so
 * generation and I/O overlap and memory stays at a few buffers whatever the
 * model size. Every value is a pure function of (seed, tensor name, element
 * index) through a counter-based RNG (splitmix64 of seed + i * golden), so bytes
 * never depend on buffer sizes or thread timing.
 *
 * Not here: the tensor list (schema.c), config JSON (cfg.c), safetensors header
 * syntax (stw.c), presets (preset.c).
 */
#include "gen.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <liburing.h>
#include "base.h"
#include "num.h"
#include "schema.h"
#include "stw.h"
#include "vfs.h"

/* ========================================================================= RNG */

#define GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The i-th random word of stream `seed` (random access, no state). */
static inline uint64_t rnd_at(uint64_t seed, uint64_t i) { return mix64(seed + (i + 1) * GOLDEN); }

/* Approximately standard normal from one word: Irwin-Hall of four 16-bit uniforms,
 * rescaled to unit variance (tails end at +-3.46; the gains below widen on purpose
 * where large values are wanted). */
static inline float normal_of(uint64_t r) {
    uint32_t s = (uint32_t)(r & 0xFFFF) + (uint32_t)((r >> 16) & 0xFFFF) +
                 (uint32_t)((r >> 32) & 0xFFFF) + (uint32_t)(r >> 48);
    return ((float)s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

/* Normal of element e of stream s, two elements per random word: Irwin-Hall of
 * four 8-bit uniforms (plenty for bf16's 8-bit mantissa), halving the hashing
 * cost of the trunk. The cached word makes consecutive calls cheap. */
typedef struct { uint64_t s, idx, r; } nrm;
static inline float nrm_at(nrm *g, uint64_t e) {
    uint64_t k = e >> 1;
    if (k != g->idx) { g->idx = k; g->r = rnd_at(g->s, k); }
    uint32_t w = (uint32_t)(g->r >> (32 * (e & 1)));
    uint32_t sum = (w & 255u) + ((w >> 8) & 255u) + ((w >> 16) & 255u) + (w >> 24);
    return (((float)sum + 2.0f) * (1.0f / 256.0f) - 2.0f) * 1.7320508f;
}

static inline double unif_of(uint64_t r) { return (double)(r >> 11) * (1.0 / 9007199254740992.0); }

/* Sequential generator for the tokenizer and shuffles. */
typedef struct { uint64_t s, i; } rng;
static uint64_t rng_next(rng *r) { return rnd_at(r->s, r->i++); }
static uint64_t rng_below(rng *r, uint64_t n) { return n ? rng_next(r) % n : 0; }

/* ============================================================ tokenizer corpus */

/* The text the generated tokenizers are trained on (written for strata: English
 * prose, code, data and punctuation, a few non-ASCII words), so the merges look
 * like those of a real byte-level BPE. */
static const char *const k_corpus[] = {
"The capital of France is Paris. The capital of Japan is Tokyo, and the capital of\n"
"Italy is Rome. Hello, world! How are you today? I'm fine, thanks; and you?\n"
"Once upon a time, in a small village near the river, there lived an old baker\n"
"who woke up every morning before the sun. He made bread, cakes and cookies for\n"
"everyone in the village, and the children would wait at his door to smell the\n"
"first loaves coming out of the oven. \"Good morning!\" he would say, smiling.\n"
"The weather was cold in the winter and warm in the summer, but the bakery was\n"
"always warm. People said it was the heart of the village, and they were right.\n"
"\n",
"A mixture-of-experts model routes each token to a small number of experts. Only\n"
"the selected experts are computed, so the model can be very large while the cost\n"
"of one token stays small. The router computes a score for every expert, adds a\n"
"bias that balances the load, and keeps the top sixteen. Weights are stored on disk\n"
"and read when they are needed; the memory budget decides how many stay in RAM.\n"
"Attention lets every position look at the previous positions. Linear attention\n"
"keeps a fixed-size state instead of a cache that grows with the context length.\n"
"\n",
"Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 24 32 42 64 100 128 256 512 1000 1024 2048\n"
"4096 8192 2026 1999 3.14159 2.71828 1e-5 0.001 -1 +7 50% $19.99 12:30 2024-08-07\n"
"Prices went up by 3.5 percent in 2023, then down by 1.2 percent in the first half\n"
"of 2024. The report has 93 layers, 896 experts and 7168 hidden units per token.\n"
"\n",
"int main(int argc, char **argv) {\n"
"    if (argc < 2) {\n"
"        fprintf(stderr, \"usage: %s FILE\\n\", argv[0]);\n"
"        return 2;\n"
"    }\n"
"    for (int i = 0; i < argc; i++) printf(\"%d: %s\\n\", i, argv[i]);\n"
"    const char *name = argv[1];\n"
"    size_t len = strlen(name);\n"
"    return len > 0 ? 0 : 1;\n"
"}\n"
"\n",
"static int sum_array(const int *a, size_t n) {\n"
"    int s = 0;\n"
"    for (size_t i = 0; i < n; i++) s += a[i];\n"
"    return s;\n"
"}\n"
"\n",
"def fibonacci(n):\n"
"    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
"    a, b = 0, 1\n"
"    for _ in range(n):\n"
"        a, b = b, a + b\n"
"    return a\n"
"\n",
"class Tokenizer:\n"
"    def __init__(self, vocab, merges=None):\n"
"        self.vocab = vocab\n"
"        self.merges = merges or []\n"
"\n",
"    def encode(self, text):\n"
"        return [self.vocab[piece] for piece in text.split()]\n"
"\n",
"if __name__ == \"__main__\":\n"
"    print(fibonacci(10))\n"
"    print(\"Hello, world!\")\n"
"\n",
"{\"name\": \"strata\", \"version\": \"0.1.0\", \"layers\": 93, \"experts\": [1, 2, 3],\n"
" \"enabled\": true, \"ratio\": 0.75, \"tags\": [\"moe\", \"inference\", \"c11\"], \"owner\": null}\n"
"<html><head><title>Example page</title></head><body><p>Hello!</p></body></html>\n"
"SELECT id, name, price FROM products WHERE price > 10 ORDER BY name LIMIT 20;\n"
"$ make test && ./build/test_runner --list | grep gen\n"
"git commit -m \"Fix the off-by-one error in the parser\"\n"
"\n",
"Questions and answers. What is the largest planet in the solar system? Jupiter is\n"
"the largest planet. Why is the sky blue? Because air scatters blue light more than\n"
"red light. Who wrote the play Hamlet? William Shakespeare wrote it around 1600.\n"
"How many days are there in a week? There are seven days in a week, and there are\n"
"twelve months in a year. Which ocean is the deepest? The Pacific Ocean is.\n"
"\n",
"She opened the window and looked outside. The street was quiet, the shops were\n"
"closed, and a cat was sleeping on the steps of the library. It had been raining\n"
"all night, and the air smelled of wet leaves. \"We should go,\" said her brother.\n"
"\"Not yet,\" she answered. \"Let's wait until the rain stops.\" They waited, and the\n"
"clouds slowly moved away; by noon the sun was shining over the hills again.\n"
"\n",
"Instructions: preheat the oven to 180 degrees. Mix the flour, the sugar and the\n"
"butter in a large bowl; add two eggs and a cup of milk, then stir until smooth.\n"
"Pour the batter into the pan and bake for 35 minutes. Let it cool before serving.\n"
"\n",
"Science: water boils at 100 degrees Celsius at sea level. Light travels at about\n"
"300,000 kilometres per second. The human heart beats roughly 100,000 times a day.\n"
"Energy can neither be created nor destroyed; it only changes from one form to\n"
"another. Plants use sunlight, water and carbon dioxide to make sugar and oxygen.\n"
"\n",
"History: the printing press changed how information travelled. Books became\n"
"cheaper, more people learned to read, and ideas spread faster than ever before.\n"
"Later, the telegraph, the telephone and the internet each made the world smaller.\n"
"\n",
"Punctuation and symbols: a, b; c: d! e? f... (g) [h] {i} <j> 'k' \"l\" -m- _n_ *o*\n"
"#p @q &r |s ~t ^u =v +w /x \\y %z -> => <= >= != == && || :: ++ -- += -= ** //\n"
"Emails like alice@example.com and URLs like https://example.org/path?q=1&r=2 are\n"
"common in text, as are paths such as /usr/local/bin and C:\\Users\\Public.\n"
"\n",
"Unicode: caf\xc3\xa9, na\xc3\xafve, r\xc3\xa9sum\xc3\xa9, \xc3\xbc" "ber, "
"\xe6\x9d\xb1\xe4\xba\xac, \xe4\xb8\xad\xe6\x96\x87, \xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2"
"\xd0\xb5\xd1\x82, \xf0\x9f\x99\x82.\n"
"Thank you for reading. Please let me know if you have any questions, and have a\n"
"wonderful day! The end.\n",
    NULL};

/* ================================================================ BPE trainer */

/* Token table: bytes of token i are bytes[offs[i] .. offs[i+1]); a hash set over
 * the byte strings keeps every token unique, as tiktoken requires. */
typedef struct {
    uint8_t *bytes;
    uint64_t *offs;
    int64_t n, cap;
    size_t nbytes, bcap;
    int32_t *hash; /* open addressing, -1 = empty; capacity hcap (power of 2) */
    size_t hcap;
} toktab;

static uint64_t tok_hash(const uint8_t *p, size_t n) { return base_fnv1a(p, n, BASE_FNV_INIT); }

static int64_t toktab_find(const toktab *t, const uint8_t *p, size_t n) {
    size_t m = t->hcap - 1;
    for (size_t h = (size_t)tok_hash(p, n) & m;; h = (h + 1) & m) {
        int32_t id = t->hash[h];
        if (id < 0) return -1;
        size_t len = (size_t)(t->offs[id + 1] - t->offs[id]);
        if (len == n && !memcmp(t->bytes + t->offs[id], p, n)) return id;
    }
}

/* Appends a token known to be new; 0 on success. */
static int toktab_add(toktab *t, const uint8_t *p, size_t n) {
    if (t->n >= t->cap) return -1;
    if (t->nbytes + n > t->bcap) {
        size_t cap = t->bcap * 2 > t->nbytes + n ? t->bcap * 2 : t->nbytes + n + 4096;
        uint8_t *b = base_realloc(t->bytes, cap, MEM_TOK);
        if (!b) return -1;
        t->bytes = b;
        t->bcap = cap;
    }
    memcpy(t->bytes + t->nbytes, p, n);
    t->nbytes += n;
    t->offs[t->n + 1] = t->nbytes;
    size_t m = t->hcap - 1, h = (size_t)tok_hash(p, n) & m;
    while (t->hash[h] >= 0) h = (h + 1) & m;
    t->hash[h] = (int32_t)t->n;
    t->n++;
    return 0;
}

static size_t toklen(const toktab *t, int64_t id) { return (size_t)(t->offs[id + 1] - t->offs[id]); }

/* Pre-tokenizer: an ASCII approximation of the Kimi split regex (docs/architecture.md,
 * Tokenizer and chat template),
 * bytes >= 0x80 counted as letters. Returns the length of the piece at s[i]. */
static int is_let(unsigned c) { return (c | 32) - 'a' < 26 || c >= 0x80; }
static int is_dig(unsigned c) { return c - '0' < 10; }
static int is_sp(unsigned c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int is_nl(unsigned c) { return c == '\n' || c == '\r'; }

static size_t piece_len(const uint8_t *s, size_t i, size_t n) {
    size_t j, k = i;
    unsigned c = s[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+('s|'t|'re|'ve|'m|'ll|'d)? */
    if (!is_let(c) && !is_dig(c) && !is_nl(c) && k + 1 < n && is_let(s[k + 1])) k++;
    if (is_let(s[k])) {
        for (j = k; j < n && is_let(s[j]); j++) {}
        if (j + 1 < n && s[j] == '\'') {
            unsigned a = s[j + 1] | 32, b = j + 2 < n ? (s[j + 2] | 32) : 0;
            if (a == 's' || a == 't' || a == 'm' || a == 'd') j += 2;
            else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) j += 3;
        }
        return j - i;
    }
    if (is_dig(c)) { /* \p{N}{1,3} */
        for (j = i; j < n && j - i < 3 && is_dig(s[j]); j++) {}
        return j - i;
    }
    /* ' '?[^\s\p{L}\p{N}]+[\r\n]* */
    k = i;
    if (c == ' ' && k + 1 < n && !is_sp(s[k + 1]) && !is_let(s[k + 1]) && !is_dig(s[k + 1])) k++;
    if (!is_sp(s[k]) && !is_let(s[k]) && !is_dig(s[k])) {
        for (j = k; j < n && !is_sp(s[j]) && !is_let(s[j]) && !is_dig(s[j]); j++) {}
        while (j < n && is_nl(s[j])) j++;
        return j - i;
    }
    /* \s*[\r\n]+ | \s+(?!\S) | \s+ */
    for (j = i; j < n && is_sp(s[j]); j++) {}
    size_t last_nl = 0;
    for (k = i; k < j; k++) if (is_nl(s[k])) last_nl = k + 1;
    if (last_nl) return last_nl - i;
    if (j < n && j - i > 1) return j - i - 1;
    return j - i;
}

/* Words being merged: symbols of word w are sym[woff[w] .. woff[w] + wlen[w]). */
typedef struct {
    int32_t *sym;
    int64_t *woff, *wlen, *wfreq;
    int64_t n;
} words;

/* Pair counts: open addressing keyed by (a << 32 | b), slots valid when stamp
 * matches the current round, so clearing costs nothing. */
typedef struct {
    uint64_t *key;
    int64_t *cnt;
    uint32_t *stamp;
    size_t cap;
    uint32_t round;
} pairmap;

static void pair_add(pairmap *pm, uint64_t key, int64_t f) {
    size_t m = pm->cap - 1;
    for (size_t h = (size_t)mix64(key) & m;; h = (h + 1) & m) {
        if (pm->stamp[h] != pm->round) { pm->stamp[h] = pm->round; pm->key[h] = key; pm->cnt[h] = f; return; }
        if (pm->key[h] == key) { pm->cnt[h] += f; return; }
    }
}

/* Runs merges over ws until the table has `want` tokens or no pair occurs at least
 * min_count times. Most frequent pair first, ties to the smallest (a, b). */
static int bpe_merge(toktab *t, words *ws, pairmap *pm, int64_t want, int64_t min_count) {
    uint8_t tmp[4096];
    while (t->n < want) {
        pm->round++;
        for (int64_t w = 0; w < ws->n; w++) {
            const int32_t *s = ws->sym + ws->woff[w];
            for (int64_t i = 0; i + 1 < ws->wlen[w]; i++)
                pair_add(pm, (uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1], ws->wfreq[w]);
        }
        uint64_t best = 0;
        int64_t bc = 0;
        for (size_t h = 0; h < pm->cap; h++) {
            if (pm->stamp[h] != pm->round) continue;
            if (pm->cnt[h] > bc || (pm->cnt[h] == bc && pm->key[h] < best)) { bc = pm->cnt[h]; best = pm->key[h]; }
        }
        if (bc < min_count || bc == 0) break;
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xFFFFFFFFu);
        size_t la = toklen(t, a), lb = toklen(t, b);
        if (la + lb > sizeof tmp) return -1;
        memcpy(tmp, t->bytes + t->offs[a], la);
        memcpy(tmp + la, t->bytes + t->offs[b], lb);
        int64_t id = toktab_find(t, tmp, la + lb);
        if (id < 0) {
            id = t->n;
            if (toktab_add(t, tmp, la + lb)) return -1;
        }
        for (int64_t w = 0; w < ws->n; w++) {
            int32_t *s = ws->sym + ws->woff[w];
            int64_t o = 0;
            for (int64_t i = 0; i < ws->wlen[w]; i++) {
                if (i + 1 < ws->wlen[w] && s[i] == a && s[i + 1] == b) { s[o++] = (int32_t)id; i++; }
                else s[o++] = s[i];
            }
            ws->wlen[w] = o;
        }
    }
    return 0;
}

int gen_tokenizer_ranks(int64_t n_ranks, uint8_t **bytes_out, uint64_t **offs_out, char *err, size_t errlen) {
    *bytes_out = NULL;
    *offs_out = NULL;
    if (n_ranks < 256 || n_ranks > (1ll << 30))
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %lld BPE ranks: need 256 .. 2^30", (long long)n_ranks);
    /* the corpus is stored in paragraphs (C99 caps string literals at 4095) */
    size_t tn = 0;
    for (int i = 0; k_corpus[i]; i++) tn += strlen(k_corpus[i]);
    uint8_t *text = base_alloc(tn + 1, MEM_TOK);
    if (!text) return base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    tn = 0;
    for (int i = 0; k_corpus[i]; i++) { memcpy(text + tn, k_corpus[i], strlen(k_corpus[i])); tn += strlen(k_corpus[i]); }
    toktab t = {0};
    words ws = {0};
    pairmap pm = {0};
    int64_t *piece_word = NULL;
    int rc = STRATA_ENOMEM;
    t.cap = n_ranks;
    t.hcap = 1;
    while (t.hcap < (size_t)n_ranks * 2) t.hcap <<= 1;
    t.offs = base_calloc((size_t)n_ranks + 1, sizeof *t.offs, MEM_TOK);
    t.hash = base_alloc(t.hcap * sizeof *t.hash, MEM_TOK);
    if (!t.offs || !t.hash) goto fail;
    memset(t.hash, 0xFF, t.hcap * sizeof *t.hash);
    for (int c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        if (toktab_add(&t, &b, 1)) goto fail;
    }

    /* Stage 1: merges inside pre-tokenized pieces (distinct pieces with counts),
     * down to count 1 so every piece of the corpus ends up as one token. */
    size_t n_pieces = 0;
    for (size_t i = 0; i < tn; i += piece_len(text, i, tn)) n_pieces++;
    ws.sym = base_alloc((tn + 1) * sizeof *ws.sym, MEM_TOK);
    ws.woff = base_alloc(n_pieces * sizeof(int64_t), MEM_TOK);
    ws.wlen = base_alloc(n_pieces * sizeof(int64_t), MEM_TOK);
    ws.wfreq = base_alloc(n_pieces * sizeof(int64_t), MEM_TOK);
    piece_word = base_alloc(n_pieces * sizeof *piece_word, MEM_TOK);
    pm.cap = 1;
    while (pm.cap < tn * 2) pm.cap <<= 1;
    pm.key = base_alloc(pm.cap * sizeof *pm.key, MEM_TOK);
    pm.cnt = base_alloc(pm.cap * sizeof *pm.cnt, MEM_TOK);
    pm.stamp = base_calloc(pm.cap, sizeof *pm.stamp, MEM_TOK);
    if (!ws.sym || !ws.woff || !ws.wlen || !ws.wfreq || !piece_word || !pm.key || !pm.cnt || !pm.stamp) goto fail;
    {
        /* distinct pieces by linear probing on (hash, bytes) */
        size_t wcap = 1;
        while (wcap < n_pieces * 2) wcap <<= 1;
        int64_t *wh = base_alloc(wcap * sizeof *wh, MEM_TOK);
        int64_t *wpos = base_alloc(n_pieces * sizeof *wpos, MEM_TOK);
        if (!wh || !wpos) { base_free(wh); base_free(wpos); goto fail; }
        memset(wh, 0xFF, wcap * sizeof *wh);
        size_t p = 0, used = 0;
        for (size_t i = 0; i < tn; p++) {
            size_t len = piece_len(text, i, tn);
            size_t m = wcap - 1, h = (size_t)tok_hash(text + i, len) & m;
            for (;; h = (h + 1) & m) {
                int64_t w = wh[h];
                if (w < 0) {
                    w = ws.n++;
                    wh[h] = w;
                    wpos[w] = (int64_t)i;
                    ws.woff[w] = (int64_t)used;
                    ws.wlen[w] = (int64_t)len;
                    ws.wfreq[w] = 0;
                    for (size_t k = 0; k < len; k++) ws.sym[used++] = text[i + k];
                }
                if (ws.wlen[w] == (int64_t)len && !memcmp(text + wpos[w], text + i, len)) {
                    ws.wfreq[w]++;
                    piece_word[p] = w;
                    break;
                }
            }
            i += len;
        }
        base_free(wh);
        base_free(wpos);
    }
    if (bpe_merge(&t, &ws, &pm, n_ranks, 1)) goto fail;

    /* Stage 2: merges across piece boundaries within a line (phrases such as
     * " of the"), for pairs seen at least twice. The pieces' current symbols are
     * concatenated in corpus order. */
    if (t.n < n_ranks) {
        words lw = {0};
        lw.sym = base_alloc((tn + 1) * sizeof *lw.sym, MEM_TOK);
        lw.woff = base_alloc((n_pieces + 1) * sizeof(int64_t), MEM_TOK);
        lw.wlen = base_calloc(n_pieces + 1, sizeof(int64_t), MEM_TOK);
        lw.wfreq = base_alloc((n_pieces + 1) * sizeof(int64_t), MEM_TOK);
        int ok = lw.sym && lw.woff && lw.wlen && lw.wfreq;
        if (ok) {
            int64_t used = 0;
            lw.woff[0] = 0;
            lw.wfreq[0] = 1;
            for (size_t p = 0; p < n_pieces; p++) {
                int64_t w = piece_word[p];
                const int32_t *s = ws.sym + ws.woff[w];
                int nl = 0;
                for (int64_t k = 0; k < ws.wlen[w]; k++) {
                    lw.sym[used++] = s[k];
                    lw.wlen[lw.n]++;
                    size_t id = (size_t)s[k];
                    if (memchr(t.bytes + t.offs[id], '\n', toklen(&t, (int64_t)id))) nl = 1;
                }
                if (nl || p + 1 == n_pieces) {
                    lw.n++;
                    lw.woff[lw.n] = used;
                    lw.wfreq[lw.n] = 1;
                }
            }
            ok = !bpe_merge(&t, &lw, &pm, n_ranks, 2);
        }
        base_free(lw.sym);
        base_free(lw.woff);
        base_free(lw.wlen);
        base_free(lw.wfreq);
        if (!ok) goto fail;
    }

    /* Stage 3, when the corpus is exhausted (large vocabularies): pseudo-words,
     * deterministic concatenations of a word-like token (letters, optional
     * leading space) and a letters-only one, at most 14 bytes, so every rank is
     * still a merge of two lower ranks and decoded text still looks like text. */
    {
        rng r = {0x746f6b656e697a65ull, 0};
        uint8_t tmp[32];
        int64_t tries = 0, n_word = 0, n_tail = 0;
        int32_t *word = base_alloc((size_t)n_ranks * sizeof *word, MEM_TOK);
        int32_t *tail = base_alloc((size_t)n_ranks * sizeof *tail, MEM_TOK);
        if (!word || !tail) { base_free(word); base_free(tail); goto fail; }
        for (int64_t id = 0; id < t.n; id++) {
            const uint8_t *b = t.bytes + t.offs[id];
            size_t l = toklen(&t, id), k = b[0] == ' ' ? 1 : 0;
            int letters = l > k;
            for (size_t q = k; q < l; q++) letters &= (unsigned)((b[q] | 32) - 'a') < 26u;
            if (letters) word[n_word++] = (int32_t)id;
            if (letters && !k) tail[n_tail++] = (int32_t)id;
        }
        while (t.n < n_ranks) {
            int64_t a, b;
            if (++tries > n_ranks * 1000) { base_free(word); base_free(tail); goto fail; }
            if (n_word > 16 && n_tail > 16 && tries < n_ranks * 100) {
                a = word[rng_below(&r, (uint64_t)n_word)];
                b = tail[rng_below(&r, (uint64_t)n_tail)];
            } else { /* degenerate corpus: any two printable tokens */
                a = 32 + (int64_t)rng_below(&r, (uint64_t)(t.n - 32));
                b = 32 + (int64_t)rng_below(&r, (uint64_t)(t.n - 32));
                if ((a < 256 && a >= 0x7F) || (b < 256 && b >= 0x7F)) continue;
            }
            size_t la = toklen(&t, a), lb = toklen(&t, b);
            if (la + lb > 14) continue;
            memcpy(tmp, t.bytes + t.offs[a], la);
            memcpy(tmp + la, t.bytes + t.offs[b], lb);
            if (toktab_find(&t, tmp, la + lb) >= 0) continue;
            if (toktab_add(&t, tmp, la + lb)) { base_free(word); base_free(tail); goto fail; }
        }
        base_free(word);
        base_free(tail);
    }
    *bytes_out = t.bytes;
    *offs_out = t.offs;
    t.bytes = NULL;
    t.offs = NULL;
    rc = STRATA_OK;
fail:
    if (rc) base_fail(err, errlen, rc, "gen: tokenizer training failed (out of memory)");
    base_free(t.bytes);
    base_free(t.offs);
    base_free(t.hash);
    base_free(ws.sym);
    base_free(ws.woff);
    base_free(ws.wlen);
    base_free(ws.wfreq);
    base_free(piece_word);
    base_free(text);
    base_free(pm.key);
    base_free(pm.cnt);
    base_free(pm.stamp);
    return rc;
}

/* Kimi Linear's specials (the K2 tokenizer: family-formats.md 2.1), ids from the
 * first special: [BOS] +0, [EOS] +1, <|im_end|> +2, <|im_user|> +3,
 * <|im_assistant|> +4, <|im_system|> +10, <|im_middle|> +17. */
static const char *kl_special_name(int64_t i, char *buf, size_t n) {
    static const char *k_named[18] = {"[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", NULL,
                                      "<|start_header_id|>", "<|end_header_id|>", NULL, "[EOT]", "<|im_system|>",
                                      "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                                      "<|tool_call_argument_begin|>", "<|tool_call_end|>", NULL, "<|im_middle|>"};
    if (i >= 0 && i < 18 && k_named[i]) snprintf(buf, n, "%s", k_named[i]);
    else snprintf(buf, n, "<|reserved_token_%lld|>", (long long)i);
    return buf;
}

static const char *special_name(const cfg *c, int64_t i, char *buf, size_t n) {
    return c->arch == ARCH_KIMI_LINEAR ? kl_special_name(i, buf, n) : gen_special_name(i, buf, n);
}

const char *gen_special_name(int64_t i, char *buf, size_t n) {
    static const char *k_named[] = {"[BOS]", "[EOS]", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"};
    if (i >= 0 && i < 6) snprintf(buf, n, "%s", k_named[i]);
    else snprintf(buf, n, "<|reserved_token_%lld|>", (long long)i);
    return buf;
}

int64_t gen_n_reserved(const cfg *c, const gen_opts *o) {
    if (o && o->n_reserved > 0) return o->n_reserved;
    return c->vocab >= 256 + 256 + 256 ? 256 : 16;
}

/* ============================================================ small text files */

static const char k_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void put_b64(sbuf *b, const uint8_t *p, size_t n) {
    char out[64];
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[k++] = k_b64[(v >> 18) & 63];
        out[k++] = k_b64[(v >> 12) & 63];
        out[k++] = i + 1 < n ? k_b64[(v >> 6) & 63] : '=';
        out[k++] = i + 2 < n ? k_b64[v & 63] : '=';
        if (k > sizeof out - 4) { sbuf_printf(b, "%.*s", (int)k, out); k = 0; }
    }
    if (k) sbuf_printf(b, "%.*s", (int)k, out);
}

/* tiktoken.model and tokenizer_config.json into dir. */
static int write_tokenizer(const char *dir, const cfg *c, int64_t n_ranks, char *err, size_t errlen) {
    uint8_t *bytes = NULL;
    uint64_t *offs = NULL;
    sbuf b = {0};
    char path[4200], name[64];
    int rc = gen_tokenizer_ranks(n_ranks, &bytes, &offs, err, errlen);
    if (rc) return rc;
    for (int64_t i = 0; i < n_ranks; i++) {
        put_b64(&b, bytes + offs[i], (size_t)(offs[i + 1] - offs[i]));
        sbuf_printf(&b, " %lld\n", (long long)i);
    }
    if (snprintf(path, sizeof path, "%s/tiktoken.model", dir) >= (int)sizeof path)
        b.len = 0, base_free(b.s), b.s = NULL;
    rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen)
             : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    base_free(bytes);
    base_free(offs);
    if (rc) return rc;

    /* Specials: ids n_ranks .. vocab-1 in the K3 order, then reserved names. */
    sbuf_printf(&b, "{\n  \"added_tokens_decoder\": {");
    for (int64_t id = n_ranks; id < c->vocab; id++)
        sbuf_printf(&b, "%s\n    \"%lld\": {\"content\": \"%s\", \"lstrip\": false, \"normalized\": false, "
                        "\"rstrip\": false, \"single_word\": false, \"special\": true}",
                    id == n_ranks ? "" : ",", (long long)id, special_name(c, id - n_ranks, name, sizeof name));
    if (c->arch == ARCH_KIMI_LINEAR)
        sbuf_printf(&b, "\n  },\n  \"additional_special_tokens\": [\"<|im_end|>\", \"<|im_user|>\", \"<|im_assistant|>\", "
                        "\"<|im_system|>\", \"<|im_middle|>\"],\n");
    else
        sbuf_printf(&b, "\n  },\n  \"additional_special_tokens\": [\"<|end_of_msg|>\", \"<|open|>\", \"<|close|>\", \"<|sep|>\"],\n");
    sbuf_printf(&b, "  \"bos_token\": \"[BOS]\",\n  \"eos_token\": \"[EOS]\",\n");
    sbuf_printf(&b, "  \"pad_token\": \"%s\",\n", special_name(c, c->vocab - 1 - n_ranks, name, sizeof name));
    sbuf_printf(&b, "  \"unk_token\": null,\n  \"clean_up_tokenization_spaces\": false,\n");
    sbuf_printf(&b, "  \"model_max_length\": %lld,\n  \"tokenizer_class\": \"TikTokenTokenizer\"\n}\n", (long long)c->max_ctx);
    if (snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= (int)sizeof path)
        b.len = 0, base_free(b.s), b.s = NULL;
    rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen)
             : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    return rc;
}

/* config.json: cfg_to_json's released shape, plus max_position_embeddings (which
 * cfg_to_json omits at its default) and a root "strata_generator" record. */
static int write_config(const char *dir, const cfg *c, const gen_opts *o, char *err, size_t errlen) {
    char *js = cfg_to_json(c);
    if (!js) return base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf b = {0};
    const char *tc = strstr(js, "\"text_config\": {\n");
    const char *root = strchr(js, '{');
    if (root && !tc) { /* a flat config (Kimi Linear): the record after the root brace, keys as published */
        sbuf_printf(&b, "{\n  \"strata_generator\": {\"tool\": \"strata gen-model\", \"version\": \"%s\", "
                        "\"preset\": \"%s\", \"seed\": %llu, \"sparse\": %s, \"experts\": \"bf16\", \"trunk_dtype\": \"%s\"},%s",
                    STRATA_VERSION, o->preset ? o->preset : "", (unsigned long long)o->seed, o->sparse ? "true" : "false",
                    o->trunk_dtype == GEN_TRUNK_MIXED ? "mixed" : o->trunk_dtype == GEN_TRUNK_F32 ? "f32" : "bf16", root + 1);
        base_free(js);
        char fp[4200];
        int frc = snprintf(fp, sizeof fp, "%s/config.json", dir) >= (int)sizeof fp
                      ? base_fail(err, errlen, STRATA_EINVAL, "gen: path too long")
                      : b.s ? base_write_file_atomic(fp, b.s, b.len, err, errlen)
                            : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
        sbuf_free(&b);
        return frc;
    }
    if (!tc || !root) { base_free(js); return base_fail(err, errlen, STRATA_EFORMAT, "gen: unexpected cfg_to_json output"); }
    sbuf_printf(&b, "%.*s\n  \"strata_generator\": {\"tool\": \"strata gen-model\", \"version\": \"%s\", "
                    "\"preset\": \"%s\", \"seed\": %llu, \"sparse\": %s, \"experts\": \"%s\", \"trunk_dtype\": \"%s\"},",
                (int)(root - js + 1), js, STRATA_VERSION, o->preset ? o->preset : "", (unsigned long long)o->seed,
                o->sparse ? "true" : "false", o->experts_bf16 ? "bf16" : "mxfp4",
                o->trunk_dtype == GEN_TRUNK_MIXED ? "mixed" : o->trunk_dtype == GEN_TRUNK_F32 ? "f32" : "bf16");
    const char *after_tc = tc + strlen("\"text_config\": {\n");
    sbuf_printf(&b, "%.*s", (int)(after_tc - root - 1), root + 1);
    if (!strstr(js, "\"max_position_embeddings\""))
        sbuf_printf(&b, "    \"max_position_embeddings\": %lld,\n", (long long)c->max_ctx);
    sbuf_printf(&b, "%s", after_tc);
    base_free(js);
    char path[4200];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        b.len = 0, base_free(b.s), b.s = NULL;
    int rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen)
                 : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    return rc;
}

/* ======================================================================= plan */

/* One tensor as it will be written. */
typedef struct gitem {
    uint64_t name_off;  /* into plan.names */
    uint64_t nbytes;
    uint64_t off;       /* data offset inside its shard */
    uint64_t seed;      /* value stream of this tensor */
    int64_t shape[4];
    int32_t layer, expert, shard;
    int16_t role;
    int8_t cls, kind, ndim, dtype;
    int8_t unit;        /* first tensor of a placement unit (never split across shards) */
} gitem;

typedef struct plan {
    const cfg *c;
    const gen_opts *o;
    gitem *it;
    size_t n, cap;
    char *names;
    size_t nlen, ncap;
    uint64_t n_trunk;         /* trunk tensors seen, for the mixed-dtype rotation */
    int n_shards;
    uint64_t *shard_data;     /* data bytes of each shard */
    size_t *shard_first;      /* first item of each shard; [n_shards] = n */
    int oom;
} plan;

static void plan_free(plan *p) {
    base_free(p->it);
    base_free(p->names);
    base_free(p->shard_data);
    base_free(p->shard_first);
    memset(p, 0, sizeof *p);
}

static const char *item_name(const plan *p, const gitem *t) { return p->names + t->name_off; }

static int plan_add(void *ud, const tspec *ts) {
    plan *p = ud;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 1024;
        gitem *it = base_realloc(p->it, cap * sizeof *it, MEM_MISC);
        if (!it) { p->oom = 1; return -1; }
        p->it = it;
        p->cap = cap;
    }
    size_t nl = strlen(ts->name) + 1;
    if (p->nlen + nl > p->ncap) {
        size_t cap = p->ncap ? p->ncap * 2 : 65536;
        char *nm = base_realloc(p->names, cap, MEM_MISC);
        if (!nm) { p->oom = 1; return -1; }
        p->names = nm;
        p->ncap = cap;
    }
    gitem *t = &p->it[p->n++];
    memset(t, 0, sizeof *t);
    memcpy(p->names + p->nlen, ts->name, nl);
    t->name_off = p->nlen;
    p->nlen += nl;
    t->role = (int16_t)ts->role;
    t->cls = (int8_t)ts->cls;
    t->kind = (int8_t)ts->kind;
    t->ndim = (int8_t)ts->ndim;
    t->layer = (int32_t)ts->layer;
    t->expert = (int32_t)ts->expert;
    for (int d = 0; d < 4; d++) t->shape[d] = ts->shape[d];
    if (ts->kind == TK_PACKED || ts->kind == TK_SCALE) t->dtype = DT_U8;
    else if (ts->pub_dtype) t->dtype = (int8_t)(ts->pub_dtype - 1); /* as the architecture publishes it */
    else if (ts->cls == TC_EXPERT) t->dtype = DT_BF16;
    else if (p->o->trunk_dtype == GEN_TRUNK_MIXED) {
        static const int8_t k_rot[3] = {DT_BF16, DT_F32, DT_F16};
        t->dtype = k_rot[p->n_trunk++ % 3];
    } else t->dtype = p->o->trunk_dtype == GEN_TRUNK_F32 ? DT_F32 : DT_BF16;
    t->nbytes = (uint64_t)ts->numel * stw_dtype_size(t->dtype);
    t->seed = mix64(p->o->seed * GOLDEN ^ base_fnv1a(ts->name, nl - 1, BASE_FNV_INIT));
    return 0;
}

/* Deterministic permutation of 0..n-1 for layer L that is never the identity
 * (n >= 2): the real checkpoint does not store experts in id order either. */
static void expert_order(uint64_t seed, int64_t L, int64_t n, int32_t *perm) {
    rng r = {mix64(seed ^ 0x6578706572747321ull ^ (uint64_t)L * GOLDEN), 0};
    for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
        int32_t x = perm[i]; perm[i] = perm[j]; perm[j] = x;
    }
    if (n >= 2 && perm[0] == 0 && perm[1] == 1) { perm[0] = 1; perm[1] = 0; }
}

static int same_unit(const gitem *a, const gitem *b) {
    int ca = a->cls == TC_LM_HEAD ? TC_FINAL : a->cls, cb = b->cls == TC_LM_HEAD ? TC_FINAL : b->cls;
    return ca == cb && a->layer == b->layer && a->expert == b->expert;
}

/* Builds the tensor list in file order and assigns shards. */
static int plan_build(plan *p, const cfg *c, const gen_opts *o, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    p->c = c;
    p->o = o;
    int32_t *perm = NULL;
    gitem *tmp = NULL;
    if (schema_walk(c, o->experts_bf16, plan_add, p) || p->oom) goto oom;
    /* Shuffle each layer's experts as whole runs of tensors. */
    const int per = o->experts_bf16 ? 3 : 6;
    perm = base_alloc((size_t)(c->n_experts > 0 ? c->n_experts : 1) * sizeof *perm, MEM_MISC);
    tmp = base_alloc((size_t)(c->n_experts > 0 ? c->n_experts : 1) * per * sizeof *tmp, MEM_MISC);
    if (!perm || !tmp) goto oom;
    for (size_t i = 0; i < p->n;) {
        if (p->it[i].cls != TC_EXPERT) { i++; continue; }
        int64_t L = p->it[i].layer, ne = c->n_experts;
        ST_ASSERT(i + (size_t)(ne * per) <= p->n && p->it[i].expert == 0);
        expert_order(o->seed, L, ne, perm);
        for (int64_t k = 0; k < ne; k++)
            memcpy(tmp + k * per, p->it + i + (size_t)perm[k] * per, per * sizeof *tmp);
        memcpy(p->it + i, tmp, (size_t)(ne * per) * sizeof *tmp);
        i += (size_t)(ne * per);
    }
    base_free(perm);
    base_free(tmp);
    perm = NULL;
    tmp = NULL;

    /* Shards: whole units, a new shard when the next unit would overflow. */
    uint64_t limit = o->shard_bytes ? o->shard_bytes : GEN_DEFAULT_SHARD, cur = 0;
    int shard = 0;
    for (size_t i = 0; i < p->n;) {
        size_t j = i + 1;
        uint64_t ub = p->it[i].nbytes;
        while (j < p->n && same_unit(&p->it[j], &p->it[i])) ub += p->it[j++].nbytes;
        if (cur > 0 && cur + ub > limit) { shard++; cur = 0; }
        p->it[i].unit = 1;
        for (size_t k = i; k < j; k++) {
            p->it[k].shard = shard;
            p->it[k].off = cur;
            cur += p->it[k].nbytes;
        }
        i = j;
    }
    p->n_shards = shard + 1;
    p->shard_data = base_calloc((size_t)p->n_shards, sizeof *p->shard_data, MEM_MISC);
    p->shard_first = base_calloc((size_t)p->n_shards + 1, sizeof *p->shard_first, MEM_MISC);
    if (!p->shard_data || !p->shard_first) goto oom;
    for (size_t i = p->n; i-- > 0;) {
        p->shard_first[p->it[i].shard] = i;
        p->shard_data[p->it[i].shard] += p->it[i].nbytes;
    }
    p->shard_first[p->n_shards] = p->n;
    return STRATA_OK;
oom:
    base_free(perm);
    base_free(tmp);
    plan_free(p);
    return base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory planning the tensor list");
}

/* ===================================================================== values */

/* Row r of a tensor is "big" (1 in `every`) by a hash, not by position, so big
 * rows are spread and differ per tensor. */
static int big_row(uint64_t seed, uint64_t r, int every) {
    return every > 0 && rnd_at(seed ^ 0xB16B16B16B16B16Bull, r) % (uint64_t)every == 0;
}

/* Matrix recipe: std = gain / sqrt(cols); every `every`-th row (by hash) gets
 * `big` times that. The large rows make SiTU's caps engage (|gate| > 4,
 * |up| > 25 happen), the rest keep activations of order one layer after layer.
 * The projections back into the residual stream (attention and MLP outputs) have
 * half the gain of the others: the smaller the branches are beside the embedding
 * source, the less each layer grows a relative perturbation. With full gain (and
 * the sharper AttnRes below) the 13-layer tiny-blocks model turned a 1e-7 relative
 * change of one early matmul into 1.4e-3 of the logits, so no float32 engine could
 * meet the 1e-4 conformance target against the float64 reference; halving took
 * its worst prompt from 3.7e-4 to 3.8e-5. Caps, routing and decays are untouched. */
static void mat_recipe(int role, float *gain, int *every, float *big) {
    *gain = 1.0f; *every = 0; *big = 1.0f;
    switch (role) {
    case R_DENSE_GATE: case R_MOE_SH_GATE: *every = 16; *big = 4.0f; break;
    case R_DENSE_UP: case R_MOE_SH_UP: *every = 16; *big = 20.0f; break;
    case R_DENSE_DOWN: case R_MOE_SH_DOWN: *gain = 0.25f; break;
    case R_KDA_O: case R_MLA_O: case R_MOE_LAT_UP: *gain = 0.5f; break;
    case R_EXP_W1: *gain = 3.0f; *every = 16; *big = 2.0f; break;
    case R_EXP_W3: *gain = 3.0f; *every = 16; *big = 8.0f; break;
    case R_EXP_W2: *gain = 0.5f; break;
    case R_KDA_B: *gain = 2.0f; break;   /* betas spread over (0, 1) */
    case R_MLA_QB: *gain = 1.5f; break;  /* sharper attention */
    default: break;
    }
}

/* Float values of elements e0 .. e0+n-1 of tensor t. */
static void gen_floats(const gitem *t, const cfg *c, uint64_t e0, float *out, size_t n) {
    const uint64_t s = t->seed;
    nrm ng = {s, UINT64_MAX, 0};
    const int64_t cols = t->ndim >= 2 ? t->shape[1] : t->shape[0];
    switch (t->role) {
    case R_IN_NORM: case R_POST_NORM: case R_FINAL_NORM: case R_MLA_QA_NORM: case R_MLA_KVA_NORM:
    case R_KDA_ONORM: case R_MOE_LAT_NORM:
        /* RMSNorm weights around 1 */
        for (size_t i = 0; i < n; i++) out[i] = 1.0f + 0.15f * nrm_at(&ng, e0 + i);
        return;
    case R_ATTN_RES_NORM: case R_MLP_RES_NORM: case R_OUT_RES_NORM:
        for (size_t i = 0; i < n; i++) out[i] = 1.0f + 0.3f * nrm_at(&ng, e0 + i);
        return;
    case R_ATTN_RES_PROJ: case R_MLP_RES_PROJ: case R_OUT_RES_PROJ: {
        /* AttnRes score = sum_i (s_i / rms(s)) f_i: with f of norm 1 the scores of
         * unrelated sources have a std of 1, so the softmax is far from uniform
         * (tiny-blocks, 16 steps: mean max weight 0.72 / 0.63 / 0.49 over 2 / 3 / 5
         * sources, the smallest 1/2 .. 1/4 of uniform). Not sharper: the softmax's
         * slope multiplies every relative perturbation of the sources, twice per
         * layer. At norm 3 the 13-layer tiny-blocks model amplified float32 rounding
         * so much that 4 of 12 prompts had logits off the float64 reference by
         * 1e-4 .. 3.4e-4 (any float32 engine would); at norm 1 its worst is 8e-5 (median 7e-6),
         * and a 28-layer variant's worst of 8 prompts 4e-5 (2e-4 at norm 1.5). */
        float sd = 1.0f / sqrtf((float)c->hidden);
        for (size_t i = 0; i < n; i++) out[i] = sd * nrm_at(&ng, e0 + i);
        return;
    }
    case R_KDA_ALOG:
        /* per head linspace(-1, 1.5): decay speeds differ across heads; padding 0 */
        for (size_t i = 0; i < n; i++) {
            uint64_t h = e0 + i;
            out[i] = h >= (uint64_t)c->kda_heads ? 0.0f
                   : c->kda_heads == 1 ? 0.25f : -1.0f + 2.5f * (float)h / (float)(c->kda_heads - 1);
        }
        return;
    case R_KDA_DTBIAS:
        /* head offset linspace(-3, 0.5) plus channel noise: alpha = exp(g) spreads
         * from fast decay to nearly 1 */
        for (size_t i = 0; i < n; i++) {
            uint64_t h = (e0 + i) / (uint64_t)c->kda_head_dim;
            float off = c->kda_heads == 1 ? -1.0f : -3.0f + 3.5f * (float)h / (float)(c->kda_heads - 1);
            out[i] = off + 0.5f * nrm_at(&ng, e0 + i);
        }
        return;
    case R_MOE_BIAS:
        /* comparable to the spread of sigmoid scores (~0.2), so it changes top-k */
        for (size_t i = 0; i < n; i++) out[i] = 0.2f * nrm_at(&ng, e0 + i);
        return;
    case R_KDA_QCONV: case R_KDA_KCONV: case R_KDA_VCONV: {
        /* (P, 1, k): the newest tap dominates, older taps mix in */
        const uint64_t k = (uint64_t)t->shape[2];
        for (size_t i = 0; i < n; i++) {
            float z = nrm_at(&ng, e0 + i);
            out[i] = (e0 + i) % k == k - 1 ? 0.9f + 0.2f * z : 0.3f * z;
        }
        return;
    }
    case R_EMBED:
        for (size_t i = 0; i < n; i++) out[i] = nrm_at(&ng, e0 + i);
        return;
    case R_LM_HEAD: {
        /* logits of std ~2.5 with per-token gains 0.6..1.4: a clear top token */
        float sd = 2.5f / sqrtf((float)cols);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = (e0 + i) / (uint64_t)cols;
            float g = 0.6f + 0.8f * (float)unif_of(rnd_at(s ^ 0x4C4D48454144ull, r));
            out[i] = sd * g * nrm_at(&ng, e0 + i);
        }
        return;
    }
    default: {
        float gain, big;
        int every;
        mat_recipe(t->role, &gain, &every, &big);
        float sd = gain / sqrtf((float)cols);
        uint64_t r = (e0) / (uint64_t)cols, left = (uint64_t)cols - e0 % (uint64_t)cols;
        float rs = big_row(s, r, every) ? sd * big : sd;
        for (size_t i = 0; i < n; i++) {
            if (!left) { r++; left = (uint64_t)cols; rs = big_row(s, r, every) ? sd * big : sd; }
            out[i] = rs * nrm_at(&ng, e0 + i);
            left--;
        }
        return;
    }
    }
}

/* E8M0 scales of elements e0 .. e0+n-1 of a scale tensor: 127 - log2(sqrt(cols))
 * so a row of random E2M1 codes (rms ~2.9) gives outputs of order 3, varied by
 * -1..+1 per group (2 random bits each, 32 per word); big rows of w1 (+1) and
 * w3 (+3) push gate and up past the SiTU caps. */
static void gen_scales(const gitem *t, uint64_t e0, uint8_t *out, size_t n) {
    const uint64_t per_row = (uint64_t)t->shape[1];
    const int64_t cols = t->shape[1] * MXFP4_GROUP;
    int base = 127 - (int)lround(log2(sqrt((double)cols)));
    if (t->role == R_EXP_W2S) base -= 1;
    const int bump = t->role == R_EXP_W1S ? 1 : t->role == R_EXP_W3S ? 3 : 0;
    /* base is ~100..127 for any real width; the clamp only guards absurd ones */
    if (base < 2) base = 2;
    if (base > 250) base = 250;
    size_t i = 0;
    while (i < n) {
        uint64_t e = e0 + i, row = e / per_row;
        int rb = bump && big_row(t->seed, row, 16) ? base + bump : base;
        const uint8_t add[4] = {(uint8_t)(rb - 1), (uint8_t)rb, (uint8_t)rb, (uint8_t)(rb + 1)};
        /* to the end of this row, one random word per 32 scales */
        size_t end = i + (size_t)(per_row - e % per_row);
        if (end > n) end = n;
        while (i < end) {
            e = e0 + i;
            uint64_t w = rnd_at(t->seed, e / 32) >> (2 * (e % 32));
            size_t k = 32 - (size_t)(e % 32);
            if (k > end - i) k = end - i;
            for (size_t q = 0; q < k; q++, w >>= 2) out[i + q] = add[w & 3];
            i += k;
        }
    }
}

/* Writes the bytes of tensor t from element pos into dst (at most `space` bytes,
 * whole elements only). Returns the number of elements written. */
static size_t gen_fill(const gitem *t, const cfg *c, uint64_t pos, uint8_t *dst, size_t space, float *tmp, size_t tmpn) {
    size_t es = stw_dtype_size(t->dtype);
    uint64_t numel = t->nbytes / es;
    size_t n = space / es;
    if (n > numel - pos) n = (size_t)(numel - pos);
    if (t->kind == TK_PACKED) {
        /* uniform random E2M1 nibbles, 8 bytes per random word */
        size_t i = 0;
        while (i < n && (pos + i) % 8) { dst[i] = (uint8_t)(rnd_at(t->seed, (pos + i) / 8) >> (8 * ((pos + i) % 8))); i++; }
        for (; i + 8 <= n; i += 8) {
            uint64_t w = rnd_at(t->seed, (pos + i) / 8);
            memcpy(dst + i, &w, 8);
        }
        for (; i < n; i++) dst[i] = (uint8_t)(rnd_at(t->seed, (pos + i) / 8) >> (8 * ((pos + i) % 8)));
        return n;
    }
    if (t->kind == TK_SCALE) {
        gen_scales(t, pos, dst, n);
        return n;
    }
    for (size_t done = 0; done < n;) {
        size_t k = n - done < tmpn ? n - done : tmpn;
        gen_floats(t, c, pos + done, tmp, k);
        uint8_t *d = dst + done * es;
        if (t->dtype == DT_F32) memcpy(d, tmp, k * 4);
        else if (t->dtype == DT_BF16)
            /* RNE on the bits, inlined (generated values are finite, so none of
             * num_f32_to_bf16's NaN care is needed; it was 10% of the run) */
            for (size_t i = 0; i < k; i++) {
                uint32_t u;
                memcpy(&u, &tmp[i], 4);
                uint16_t h = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
                memcpy(d + 2 * i, &h, 2);
            }
        else
            for (size_t i = 0; i < k; i++) { uint16_t h = num_f32_to_f16(tmp[i]); memcpy(d + 2 * i, &h, 2); }
        done += k;
    }
    return n;
}

/* =================================================================== pipeline */

/* The data of shard s is cut into buffers of GEN_BUF_BYTES (the last one of a
 * shard shorter); buffer j can be generated from nothing but (plan, j), so
 * GEN_NPROD threads fill them in any order while the writer keeps up to GEN_QD
 * O_DIRECT writes in flight through io_uring and releases slots in order.
 * Memory: GEN_NBUF x 16 MB whatever the model size. */
#define GEN_NBUF 12
#define GEN_NPROD 2
#define GEN_QD 8
#define GEN_BUF_BYTES (16u << 20) /* fewer wake-ups: on a loaded 2-core box each costs ms */

typedef struct gpipe {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint8_t *buf[GEN_NBUF];
    uint64_t ready[GEN_NBUF];   /* buffer number the slot holds (UINT64_MAX: none) */
    uint64_t written[GEN_NBUF]; /* buffer number whose write completed */
    uint64_t released;          /* buffers below this are on disk: their slots are free */
    uint64_t n_bufs;
    uint64_t *shard_buf0;       /* first buffer of each shard; [n_shards] = n_bufs */
    int stop;                   /* writer failed: producers quit */
    int next_id;                /* producer numbering */
    const plan *p;
} gpipe;

/* Shard and byte range of buffer j. */
static void buf_range(const gpipe *g, uint64_t j, int *shard, uint64_t *off, size_t *len) {
    int lo = 0, hi = g->p->n_shards;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (g->shard_buf0[mid] <= j) lo = mid; else hi = mid;
    }
    *shard = lo;
    *off = (j - g->shard_buf0[lo]) * GEN_BUF_BYTES;
    uint64_t left = g->p->shard_data[lo] - *off;
    *len = left < GEN_BUF_BYTES ? (size_t)left : GEN_BUF_BYTES;
}

/* Generates bytes [off, off+len) of shard s's data into dst. Elements cut by the
 * buffer edges are generated whole and only their part is copied. */
static void fill_buffer(const plan *p, int s, uint64_t off, size_t len, uint8_t *dst, float *tmp, size_t tmpn) {
    size_t lo = p->shard_first[s], hi = p->shard_first[s + 1];
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (p->it[mid].off <= off) lo = mid; else hi = mid;
    }
    size_t i = lo, used = 0;
    while (used < len) {
        const gitem *t = &p->it[i];
        size_t es = stw_dtype_size(t->dtype);
        uint64_t b = off + used - t->off;
        if (b >= t->nbytes) { i++; continue; }
        size_t room = len - used;
        if (b % es || room < es) {
            uint8_t el[8];
            gen_fill(t, p->c, b / es, el, es, tmp, tmpn);
            size_t from = (size_t)(b % es), k = es - from;
            if (k > room) k = room;
            memcpy(dst + used, el + from, k);
            used += k;
            continue;
        }
        uint64_t item_left = t->nbytes - b;
        size_t space = room < item_left ? room : (size_t)item_left;
        used += gen_fill(t, p->c, b / es, dst + used, space, tmp, tmpn) * es;
    }
}

static void *producer_main(void *arg) {
    gpipe *g = arg;
    float tmp[2048];
    pthread_mutex_lock(&g->mu);
    int id = g->next_id++;
    pthread_mutex_unlock(&g->mu);
    for (uint64_t j = (uint64_t)id; j < g->n_bufs; j += GEN_NPROD) {
        pthread_mutex_lock(&g->mu);
        while (!g->stop && j >= g->released + GEN_NBUF) pthread_cond_wait(&g->cv, &g->mu);
        int stop = g->stop;
        pthread_mutex_unlock(&g->mu);
        if (stop) break;
        int s;
        uint64_t off;
        size_t len;
        buf_range(g, j, &s, &off, &len);
        fill_buffer(g->p, s, off, len, g->buf[j % GEN_NBUF], tmp, sizeof tmp / sizeof *tmp);
        pthread_mutex_lock(&g->mu);
        g->ready[j % GEN_NBUF] = j;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
    return NULL;
}

/* -1 with errno set on failure */
static int pwrite_all(int fd, const uint8_t *p, size_t n, uint64_t off) {
    int e = vfs_pwrite_full(fd, p, n, off);
    if (e) errno = e;
    return e ? -1 : 0;
}

/* Write queue: io_uring when available, else synchronous pwrite (same results,
 * queue depth 1). Completions carry the buffer number. */
typedef struct wq {
    struct io_uring ring;
    int uring;
    int inflight;
    uint64_t sync_done[GEN_QD];  /* sync mode: completed but not reaped */
    int sync_res[GEN_QD];
    int n_sync;
} wq;

typedef struct wjob { const uint8_t *p; size_t len; uint64_t off; int fd; } wjob;

static int wq_submit(wq *q, uint64_t j, const wjob *w) {
    if (q->uring) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
        if (!sqe) return -1;
        io_uring_prep_write(sqe, w->fd, w->p, (unsigned)w->len, w->off);
        io_uring_sqe_set_data64(sqe, j);
        if (io_uring_submit(&q->ring) < 1) return -1;
    } else {
        q->sync_done[q->n_sync] = j;
        q->sync_res[q->n_sync++] = pwrite_all(w->fd, w->p, w->len, w->off) ? -errno : (int)w->len;
    }
    q->inflight++;
    return 0;
}

/* Waits for one completion: its buffer number and result (bytes or -errno). */
static void wq_reap(wq *q, uint64_t *j, int *res) {
    if (q->uring) {
        struct io_uring_cqe *cqe;
        int rc;
        while ((rc = io_uring_wait_cqe(&q->ring, &cqe)) == -EINTR) {}
        if (rc < 0) { *j = UINT64_MAX; *res = rc; q->inflight--; return; }
        *j = io_uring_cqe_get_data64(cqe);
        *res = vfs_cqe(cqe->res, UINT64_MAX, 1);
        io_uring_cqe_seen(&q->ring, cqe);
    } else {
        *j = q->sync_done[0];
        *res = q->sync_res[0];
        q->n_sync--;
        memmove(q->sync_done, q->sync_done + 1, (size_t)q->n_sync * sizeof *q->sync_done);
        memmove(q->sync_res, q->sync_res + 1, (size_t)q->n_sync * sizeof *q->sync_res);
    }
    q->inflight--;
}

/* What the writer needs to retire a completed buffer. All writes in flight
 * belong to the current shard (the writer drains at shard ends). */
typedef struct wctx {
    gpipe *g;
    wq *q;
    const gen_opts *o;
    int fd;
    uint64_t hlen;           /* header bytes of the current shard */
    const char *path;
    uint64_t done_bytes, total_bytes, abort_after;
    double t0;
} wctx;

/* Buffer j (len bytes) is on disk: free its slot in order, report progress. */
static int buffer_done(wctx *w, uint64_t j, size_t len) {
    gpipe *g = w->g;
    w->done_bytes += len;
    pthread_mutex_lock(&g->mu);
    g->written[j % GEN_NBUF] = j;
    while (g->released < g->n_bufs && g->written[g->released % GEN_NBUF] == g->released) g->released++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (w->o->progress) w->o->progress(w->o->progress_ud, w->done_bytes, w->total_bytes, base_now() - w->t0);
    /* test hook: die mid-way like a kill -9 would */
    if (w->abort_after && w->done_bytes >= w->abort_after) _exit(99);
    return STRATA_OK;
}

/* Waits for one write to complete (finishing a short write synchronously). */
static int reap_one(wctx *w, gen_stats *st, char *err, size_t errlen) {
    uint64_t j;
    int res, s;
    uint64_t off;
    size_t len;
    double t = base_now();
    wq_reap(w->q, &j, &res);
    if (j == UINT64_MAX || res < 0)
        return base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", w->path, strerror(res < 0 ? -res : EIO));
    buf_range(w->g, j, &s, &off, &len);
    if ((size_t)res < len && pwrite_all(w->fd, w->g->buf[j % GEN_NBUF] + res, len - (size_t)res, w->hlen + off + (uint64_t)res))
        return base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", w->path, strerror(errno));
    st->io_secs += base_now() - t;
    return buffer_done(w, j, len);
}

/* ============================================================ directory dance */

/* Removes OUT.partial-<pid>[...] siblings whose process is gone. */
static void clean_stale(const char *parent, const char *base) {
    DIR *d = opendir(parent);
    if (!d) return;
    char pfx[512];
    if (snprintf(pfx, sizeof pfx, "%s.partial-", base) >= (int)sizeof pfx) { closedir(d); return; }
    size_t pl = strlen(pfx);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, pfx, pl)) continue;
        char *end;
        long pid = strtol(de->d_name + pl, &end, 10);
        if (end == de->d_name + pl || pid <= 0) continue;
        if (pid != (long)getpid() && kill((pid_t)pid, 0) == 0) continue; /* still running */
        if (pid != (long)getpid() && errno != ESRCH) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", parent, de->d_name);
        LOGI("gen: removing stale partial model %s", path);
        base_rm_rf(path);
    }
    closedir(d);
}

static int fsync_dir(const char *path) {
    int fd = vfs_open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return -1;
    int rc = vfs_fsync(fd), e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* Whether a directory entry is one the generator (or `strata pack` beside it)
 * writes into a model directory. */
static int is_model_file(const char *n) {
    size_t l = strlen(n);
    return !strcmp(n, "config.json") || !strcmp(n, "model.safetensors.index.json") || !strcmp(n, "tiktoken.model") ||
           !strcmp(n, "tokenizer_config.json") || (n[0] != '.' && l > 12 && !strcmp(n + l - 12, ".safetensors"));
}

/* What --force may replace: only a model an earlier gen-model wrote. That is a
 * directory (not a symlink) whose config.json carries the generator's
 * "strata_generator" record (written since the generator's first version) and
 * which holds nothing but the generator's files and a strata.pack/ of pack files.
 * Anything else (user files, a downloaded model, a regular file, a FIFO, a
 * device, a symlink) is refused, naming what is in the way. */
static int check_replaceable(const char *out, char *err, size_t errlen) {
    struct stat st;
    if (lstat(out, &st)) return errno == ENOENT ? STRATA_OK : base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", out, strerror(errno));
    const char *refuse = "; --force replaces only a model directory written by strata gen-model";
    if (S_ISLNK(st.st_mode)) return base_fail(err, errlen, STRATA_EINVAL, "gen: %s is a symbolic link, not replaced%s", out, refuse);
    if (!S_ISDIR(st.st_mode))
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s is %s, not replaced%s", out,
                         S_ISREG(st.st_mode) ? "a regular file" : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a directory", refuse);
    char path[8400];
    DIR *d = opendir(out);
    if (!d) return base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", out, strerror(errno));
    struct dirent *de;
    int rc = STRATA_OK;
    while (!rc && (de = readdir(d))) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", out, n);
        if (lstat(path, &st)) { rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", path, strerror(errno)); break; }
        if (S_ISREG(st.st_mode) && is_model_file(n)) continue;
        if (!strcmp(n, "strata.pack") && S_ISDIR(st.st_mode)) {
            /* the pack writer keeps its directory to the pack's own files */
            DIR *pd = opendir(path);
            struct dirent *pe;
            while (pd && (pe = readdir(pd))) {
                const char *m = pe->d_name;
                if (!strcmp(m, ".") || !strcmp(m, "..") || !strncmp(m, "trunk.bin", 9) || !strncmp(m, "manifest.json", 13) ||
                    !strcmp(m, ".strata-pack.lock"))
                    continue;
                rc = base_fail(err, errlen, STRATA_EINVAL, "gen: %s holds %s/%s, which gen-model and pack do not write; "
                               "not replaced%s", out, path, m, refuse);
                break;
            }
            if (pd) closedir(pd);
            else rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", path, strerror(errno));
            continue;
        }
        rc = base_fail(err, errlen, STRATA_EINVAL, "gen: %s holds %s, which gen-model does not write; not replaced%s", out,
                       path, refuse);
    }
    closedir(d);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/config.json", out);
    uint8_t *cj = NULL;
    size_t cl = 0;
    if (lstat(path, &st) || !S_ISREG(st.st_mode) || base_read_file(path, 1u << 24, &cj, &cl, NULL, 0) ||
        !strstr((const char *)cj, "\"strata_generator\"")) {
        base_free(cj);
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s is not a model written by strata gen-model (%s has no "
                         "\"strata_generator\" record), not replaced%s", out, path, refuse);
    }
    base_free(cj);
    return STRATA_OK;
}

/* Puts the finished tmp directory at out: an atomic exchange when out exists
 * (so out is never missing), a plain rename otherwise. */
static int publish(const char *tmp, const char *out, const char *parent, char *err, size_t errlen) {
    struct stat st;
    if (lstat(out, &st) == 0) {
        if (vfs_rename_exchange(tmp, out) == 0) {
            base_rm_rf(tmp); /* now holds the old model */
        } else {
            /* Filesystems without RENAME_EXCHANGE: move the old one aside under a
             * .partial name (a crash here leaves it to the stale cleanup). */
            char old[8200];
            snprintf(old, sizeof old, "%s-old", tmp);
            if (vfs_rename(out, old))
                return base_fail(err, errlen, STRATA_EIO, "%s: cannot move the old model aside: %s", out, strerror(errno));
            if (vfs_rename(tmp, out)) {
                int e = errno;
                /* put the old model back: out must not end up missing */
                if (vfs_rename(old, out))
                    return base_fail(err, errlen, STRATA_EIO, "%s: rename: %s; the old model is at %s", out, strerror(e), old);
                return base_fail(err, errlen, STRATA_EIO, "%s: rename: %s", out, strerror(e));
            }
            base_rm_rf(old);
        }
    } else if (vfs_rename(tmp, out)) {
        return base_fail(err, errlen, STRATA_EIO, "%s: rename: %s", out, strerror(errno));
    }
    /* The model is in place; only the rename's durability is in doubt. */
    if (fsync_dir(parent)) LOGW("gen: fsync %s: %s (%s is complete; a crash now could undo its rename)", parent, strerror(errno), out);
    return STRATA_OK;
}

/* ======================================================================== API */

static int check_cfg(const cfg *c, const gen_opts *o, char *err, size_t errlen) {
    int rc = cfg_validate(c, "gen-model config", err, errlen);
    if (rc) return rc;
    if (!o->experts_bf16 && (c->latent % MXFP4_GROUP || c->moe_inter % MXFP4_GROUP))
        return base_fail(err, errlen, STRATA_EINVAL,
                         "gen: MXFP4 experts need routed_expert_hidden_size (%lld) and moe_intermediate_size (%lld) "
                         "to be multiples of %d", (long long)c->latent, (long long)c->moe_inter, MXFP4_GROUP);
    int64_t res = gen_n_reserved(c, o);
    if (res < 6 || c->vocab - res < 256)
        return base_fail(err, errlen, STRATA_EINVAL,
                         "gen: vocab_size %lld with %lld reserved specials leaves %lld BPE ranks; need >= 256 ranks and >= 6 specials",
                         (long long)c->vocab, (long long)res, (long long)(c->vocab - res));
    return STRATA_OK;
}

/* The config as written: special ids from the tokenizer layout, mxfp4 flag. */
static void final_cfg(cfg *w, const cfg *c, const gen_opts *o) {
    *w = *c;
    int64_t ranks = c->vocab - gen_n_reserved(c, o);
    w->bos_id = ranks;
    w->n_eos = 2;
    w->eos_ids[0] = ranks + 1;
    w->eos_ids[1] = ranks + 2;
    w->pad_id = c->vocab - 1;
    if (c->arch == ARCH_KIMI_LINEAR) { /* eos_token_id <|im_end|> (ranks + 2), one id as published */
        w->n_eos = 1;
        w->eos_ids[0] = ranks + 2;
    }
    w->mxfp4_experts = !o->experts_bf16;
    if (w->max_ctx <= 0) w->max_ctx = CFG_DEFAULT_CTX;
}

static void shard_name(char *buf, size_t n, int i, int n_shards) {
    snprintf(buf, n, "model-%05d-of-%05d.safetensors", i + 1, n_shards);
}

/* Header bytes of shard s (built to know its length); caller base_free()s. */
static uint8_t *shard_header(const plan *p, int s, size_t *hlen, char *err, size_t errlen) {
    size_t a = p->shard_first[s], b = p->shard_first[s + 1];
    stw_entry *e = base_alloc((b - a ? b - a : 1) * sizeof *e, MEM_MISC);
    if (!e) { base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory"); return NULL; }
    for (size_t i = a; i < b; i++) {
        const gitem *t = &p->it[i];
        stw_entry *x = &e[i - a];
        x->name = item_name(p, t);
        x->dtype = t->dtype;
        x->ndim = t->ndim;
        for (int d = 0; d < 4; d++) x->shape[d] = t->shape[d];
        x->nbytes = t->nbytes;
    }
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->o->seed);
    const char *meta[] = {"format", "pt", "strata_generator", "strata gen-model " STRATA_VERSION,
                          "strata_seed", seed, "strata_preset", p->o->preset ? p->o->preset : "",
                          "strata_sparse", "true"};
    uint64_t dbytes;
    uint8_t *h = stw_header(e, b - a, meta, p->o->sparse ? 5 : 4, 4096, hlen, &dbytes, err, errlen);
    base_free(e);
    return h;
}

static int write_index(const char *dir, const plan *p, char *err, size_t errlen) {
    sbuf b = {0};
    uint64_t total = 0;
    for (int s = 0; s < p->n_shards; s++) total += p->shard_data[s];
    sbuf_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu%s\n  },\n  \"weight_map\": {",
                (unsigned long long)total, p->o->sparse ? ",\n    \"strata_sparse\": \"true\"" : "");
    char sn[64];
    for (size_t i = 0; i < p->n; i++) {
        shard_name(sn, sizeof sn, p->it[i].shard, p->n_shards);
        sbuf_printf(&b, "%s\n    \"%s\": \"%s\"", i ? "," : "", item_name(p, &p->it[i]), sn);
    }
    sbuf_printf(&b, "\n  }\n}\n");
    char path[4200];
    if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= (int)sizeof path)
        b.len = 0, base_free(b.s), b.s = NULL;
    int rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen)
                 : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    return rc;
}

int gen_model_sizes(const cfg *c, const gen_opts *o, gen_sizes *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int rc = check_cfg(c, o, err, errlen);
    if (rc) return rc;
    plan p;
    rc = plan_build(&p, c, o, err, errlen);
    if (rc) return rc;
    for (size_t i = 0; i < p.n; i++) {
        const gitem *t = &p.it[i];
        out->total += t->nbytes;
        if (t->cls == TC_EXPERT) out->experts += t->nbytes;
        else if (t->role == R_EMBED || t->role == R_LM_HEAD) out->embed += t->nbytes;
        else out->trunk += t->nbytes;
    }
    /* one expert: the bytes of expert 0 of the first MoE layer */
    if (c->first_dense < c->n_layers) {
        uint64_t eb = 0;
        for (size_t i = 0; i < p.n; i++)
            if (p.it[i].cls == TC_EXPERT && p.it[i].layer == c->first_dense && p.it[i].expert == 0) eb += p.it[i].nbytes;
        out->expert_bytes = eb;
    }
    out->n_tensors = p.n;
    out->n_shards = p.n_shards;
    plan_free(&p);
    return STRATA_OK;
}

int gen_model(const char *out_dir, const cfg *c_in, const gen_opts *o, gen_stats *st, char *err, size_t errlen) {
    double t0 = base_now();
    gen_stats stats = {0};
    cfg c;
    plan p = {0};
    gpipe g = {0};
    wq q = {0};
    int rc, n_threads = 0, have_sync = 0;
    pthread_t th[GEN_NPROD];
    stw_file f = {.fd = -1};
    uint8_t *hdr = NULL;
    int *shard_fds = NULL; /* finished shards awaiting the final fsync */
    char out[4096], parent[4096], base[1024], tmp[4200], lock_path[4200];
    int lock_fd = -1;

    final_cfg(&c, c_in, o);
    if ((rc = check_cfg(&c, o, err, errlen))) return rc;

    /* OUT, its parent and base name (trailing slashes ignored). */
    size_t ol = strlen(out_dir);
    while (ol > 1 && out_dir[ol - 1] == '/') ol--;
    if (ol == 0 || ol >= sizeof out) return base_fail(err, errlen, STRATA_EINVAL, "gen: bad output path");
    memcpy(out, out_dir, ol);
    out[ol] = 0;
    const char *sl = strrchr(out, '/');
    if (sl) {
        snprintf(parent, sizeof parent, "%.*s", (int)(sl == out ? 1 : sl - out), out);
        if (snprintf(base, sizeof base, "%s", sl + 1) >= (int)sizeof base)
            return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: name too long", out);
    } else {
        snprintf(parent, sizeof parent, ".");
        if (snprintf(base, sizeof base, "%s", out) >= (int)sizeof base)
            return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: name too long", out);
    }
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: not a usable directory name", out_dir);
    /* Like mkdir -p for the parents: only OUT itself is built crash-safely. */
    if (!base_is_dir(parent) && (rc = base_mkdir_p(parent, err, errlen))) return rc;
    /* One writer of OUT at a time: two gen-model OUT at once both reported success
     * and the later silently replaced the earlier. The lock also keeps a second
     * writer's clean_stale away from our partial directory. */
    if (snprintf(lock_path, sizeof lock_path, "%s/.%s.strata-lock", parent, base) >= (int)sizeof lock_path)
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %s: path too long", out);
    if ((lock_fd = base_lock(lock_path, out, err, errlen)) < 0) return lock_fd;
    clean_stale(parent, base);
    struct stat sst;
    if (lstat(out, &sst) == 0 && !o->force) {
        rc = base_fail(err, errlen, STRATA_EINVAL, "gen: %s exists (use --force to replace it)", out);
        goto done;
    }
    if (o->force && (rc = check_replaceable(out, err, errlen))) goto done;

    if ((rc = plan_build(&p, &c, o, err, errlen))) goto done;
    uint64_t data_total = 0;
    for (int s = 0; s < p.n_shards; s++) data_total += p.shard_data[s];

    /* Free space: data (unless sparse) + headers/index/tokenizer (~1 KB per
     * tensor is generous) + 64 MB slack. */
    struct statvfs vfs;
    uint64_t need = (o->sparse ? 0 : data_total) + p.n * 1024 + (64u << 20);
    if (statvfs(parent, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        if (need > avail) {
            char a[32], b[32];
            rc = base_fail(err, errlen, STRATA_EIO, "gen: the model needs %s but %s has only %s free%s",
                           base_fmt_bytes(need, a, sizeof a), parent, base_fmt_bytes(avail, b, sizeof b),
                           o->sparse ? "" : " (--sparse writes headers and holes only)");
            goto done;
        }
    }

    if (snprintf(tmp, sizeof tmp, "%s/%s.partial-%d", parent, base, (int)getpid()) >= (int)sizeof tmp) {
        rc = base_fail(err, errlen, STRATA_EINVAL, "gen: %s: path too long", out);
        goto done;
    }
    base_rm_rf(tmp);
    if (mkdir(tmp, 0755)) { rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: %s", tmp, strerror(errno)); goto done; }

    int64_t n_ranks = c.vocab - gen_n_reserved(&c, o);
    if ((rc = write_config(tmp, &c, o, err, errlen))) goto fail;
    if ((rc = write_tokenizer(tmp, &c, n_ranks, err, errlen))) goto fail;
    if ((rc = write_index(tmp, &p, err, errlen))) goto fail;

    stats.prep_secs = base_now() - t0;
    /* Test hook (see gen.h): die mid-way like a kill -9 would. */
    uint64_t abort_after = 0;
    const char *ab = getenv("STRATA_GEN_ABORT_AFTER_BYTES");
    if (ab && *ab) abort_after = strtoull(ab, NULL, 10);

    if (!o->sparse) {
        if (pthread_mutex_init(&g.mu, NULL) || pthread_cond_init(&g.cv, NULL)) {
            rc = base_fail(err, errlen, STRATA_ENOMEM, "gen: cannot create a mutex");
            goto fail;
        }
        have_sync = 1;
        g.p = &p;
        g.shard_buf0 = base_alloc(((size_t)p.n_shards + 1) * sizeof *g.shard_buf0, MEM_MISC);
        if (!g.shard_buf0) { rc = base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory"); goto fail; }
        for (int s = 0; s < p.n_shards; s++) {
            g.shard_buf0[s] = g.n_bufs;
            g.n_bufs += (p.shard_data[s] + GEN_BUF_BYTES - 1) / GEN_BUF_BYTES;
        }
        g.shard_buf0[p.n_shards] = g.n_bufs;
        for (int k = 0; k < GEN_NBUF; k++) {
            g.ready[k] = g.written[k] = UINT64_MAX;
            if (!(g.buf[k] = base_alloc_aligned(GEN_BUF_BYTES, STW_DIRECT_ALIGN, MEM_IO))) {
                rc = base_fail(err, errlen, STRATA_ENOMEM, "gen: cannot allocate write buffers");
                goto fail;
            }
        }
        for (int k = 0; k < GEN_NPROD; k++) {
            if (pthread_create(&th[k], NULL, producer_main, &g)) {
                rc = base_fail(err, errlen, STRATA_ENOMEM, "gen: cannot start a generator thread");
                goto fail;
            }
            n_threads++;
        }
        /* STRATA_GEN_NO_URING (tests): the synchronous fallback path */
        const char *nu = getenv("STRATA_GEN_NO_URING");
        q.uring = !(nu && *nu) && io_uring_queue_init(GEN_QD * 2, &q.ring, 0) == 0;
    }

    wctx wc = {&g, &q, o, -1, 0, NULL, 0, data_total, abort_after, t0};
    if (p.n_shards <= 256) {
        shard_fds = base_alloc((size_t)p.n_shards * sizeof *shard_fds, MEM_MISC);
        for (int s = 0; shard_fds && s < p.n_shards; s++) shard_fds[s] = -1;
    }
    for (int s = 0; s < p.n_shards; s++) {
        char sn[64], path[4300];
        size_t hlen;
        shard_name(sn, sizeof sn, s, p.n_shards);
        snprintf(path, sizeof path, "%s/%s", tmp, sn);
        if (!(hdr = shard_header(&p, s, &hlen, err, errlen))) { rc = STRATA_ENOMEM; goto fail; }
        if ((rc = stw_file_create(&f, path, err, errlen))) goto fail;
        if ((rc = stw_file_write(&f, hdr, hlen, err, errlen))) goto fail;
        base_free(hdr);
        hdr = NULL;
        stats.total_bytes += hlen;
        /* Data bypasses the page cache: on the busy 2-core test machine buffered
         * writes ran at ~90 MB/s with writeback where O_DIRECT wrote ~600 MB/s (dd). */
        if (!o->sparse) {
            /* Preallocating makes every data write non-extending: ext4 serialises
             * O_DIRECT writes past EOF, which defeats the queue depth. Also
             * fails early when the disk is full. Unsupported -> plain writes. */
            int fe = vfs_fallocate(f.fd, hlen + p.shard_data[s]) ? errno : 0;
            if (fe == ENOSPC) {
                rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: no space left on the device", path);
                goto fail;
            }
            stw_file_direct(&f, 1);
        }
        wc.fd = f.fd;
        wc.hlen = hlen;
        wc.path = path;
        for (uint64_t j = o->sparse ? 0 : g.shard_buf0[s]; !o->sparse && j < g.shard_buf0[s + 1]; j++) {
            int bs;
            uint64_t boff;
            size_t blen;
            buf_range(&g, j, &bs, &boff, &blen);
            /* Wait for buffer j; reap completions meanwhile: writes finish out of
             * order, and the producers need the in-order release to move on. */
            for (;;) {
                double tw = base_now();
                pthread_mutex_lock(&g.mu);
                while (g.ready[j % GEN_NBUF] != j && !q.inflight) pthread_cond_wait(&g.cv, &g.mu);
                int rdy = g.ready[j % GEN_NBUF] == j;
                pthread_mutex_unlock(&g.mu);
                stats.gen_wait_secs += base_now() - tw;
                if (rdy) break;
                if ((rc = reap_one(&wc, &stats, err, errlen))) goto fail;
            }
            /* the short last buffer of a shard cannot go O_DIRECT: drain, then
             * write it through the page cache */
            int tail = blen % STW_DIRECT_ALIGN != 0 || !f.direct;
            while (q.inflight && (tail || q.inflight >= GEN_QD))
                if ((rc = reap_one(&wc, &stats, err, errlen))) goto fail;
            wjob w = {g.buf[j % GEN_NBUF], blen, hlen + boff, f.fd};
            double tw = base_now();
            if (tail) {
                /* aligned part still direct, only the last < 4 KB through the cache */
                size_t al = f.direct ? blen - blen % STW_DIRECT_ALIGN : 0;
                if (al && pwrite_all(f.fd, w.p, al, w.off)) {
                    rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", path, strerror(errno));
                    goto fail;
                }
                if (f.direct) stw_file_direct(&f, 0);
                if (pwrite_all(f.fd, w.p + al, w.len - al, w.off + al)) {
                    rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: write failed: %s", path, strerror(errno));
                    goto fail;
                }
                stats.io_secs += base_now() - tw;
                if ((rc = buffer_done(&wc, j, blen))) goto fail;
            } else {
                if (wq_submit(&q, j, &w)) {
                    rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: cannot queue a write", path);
                    goto fail;
                }
                stats.io_secs += base_now() - tw;
            }
        }
        while (q.inflight)
            if ((rc = reap_one(&wc, &stats, err, errlen))) goto fail;
        double tf = base_now();
        if (shard_fds) {
            /* fsync later, all at once: on ext4 each fsync is a journal commit
             * (~0.6 s here), and one commit covers every shard */
            if (o->sparse && vfs_ftruncate(f.fd, hlen + p.shard_data[s])) {
                rc = base_fail(err, errlen, STRATA_EIO, "gen: %s: cannot extend: %s", path, strerror(errno));
                goto fail;
            }
            shard_fds[s] = f.fd;
            f.fd = -1;
        } else if ((rc = stw_file_finish(&f, hlen + p.shard_data[s], err, errlen))) {
            goto fail;
        }
        stats.sync_secs += base_now() - tf;
        stats.total_bytes += p.shard_data[s];
    }
    for (; n_threads > 0; n_threads--) pthread_join(th[n_threads - 1], NULL);
    if (o->progress) o->progress(o->progress_ud, data_total, data_total, base_now() - t0);
    double tpub = base_now();
    for (int s = 0; shard_fds && s < p.n_shards; s++) {
        int e = vfs_fsync(shard_fds[s]) ? errno : 0;
        close(shard_fds[s]);
        shard_fds[s] = -1;
        if (e) {
            char sn[64];
            shard_name(sn, sizeof sn, s, p.n_shards);
            rc = base_fail(err, errlen, STRATA_EIO, "gen: %s/%s: fsync: %s", tmp, sn, strerror(e));
            goto fail;
        }
    }
    if (fsync_dir(tmp)) { rc = base_fail(err, errlen, STRATA_EIO, "gen: fsync %s: %s", tmp, strerror(errno)); goto fail; }
    if (!o->force && lstat(out, &sst) == 0) { /* made by something that ignores the lock */
        rc = base_fail(err, errlen, STRATA_EINVAL, "gen: %s appeared while generating; not replaced (use --force)", out);
        goto fail;
    }
    if (o->force && (rc = check_replaceable(out, err, errlen))) goto fail; /* again: it may have changed meanwhile */
    if ((rc = publish(tmp, out, parent, err, errlen))) goto fail;

    stats.data_bytes = data_total;
    stats.n_tensors = p.n;
    stats.n_shards = p.n_shards;
    stats.secs = base_now() - t0;
    stats.sync_secs += stats.secs - (tpub - t0);
    stats.mb_per_s = stats.secs > 0 ? (double)stats.total_bytes / stats.secs / 1e6 : 0;
    if (st) *st = stats;
    rc = STRATA_OK;
    goto done;
fail:
    while (q.inflight) { uint64_t dj; int res; wq_reap(&q, &dj, &res); }
    if (f.fd >= 0) stw_file_abort(&f);
    base_rm_rf(tmp);
done:
    if (n_threads) {
        pthread_mutex_lock(&g.mu);
        g.stop = 1;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
        for (; n_threads > 0; n_threads--) pthread_join(th[n_threads - 1], NULL);
    }
    if (q.uring) {
        /* in-flight writes target buffers freed below: wait for them first */
        while (q.inflight) { uint64_t dj; int res; wq_reap(&q, &dj, &res); }
        io_uring_queue_exit(&q.ring);
    }
    base_free(g.shard_buf0);
    for (int s = 0; shard_fds && s < p.n_shards; s++)
        if (shard_fds[s] >= 0) close(shard_fds[s]);
    base_free(shard_fds);
    if (have_sync) {
        pthread_mutex_destroy(&g.mu);
        pthread_cond_destroy(&g.cv);
    }
    for (int k = 0; k < GEN_NBUF; k++) base_free(g.buf[k]);
    base_free(hdr);
    plan_free(&p);
    base_unlock(lock_path, lock_fd);
    return rc;
}
