/*
 * gen_tok.c: the generated model's tokenizer: the embedded training corpus, the
 * byte-level BPE trainer (gen_tokenizer_ranks), the special-token names and
 * layout, and the two files written from them (tiktoken.model,
 * tokenizer_config.json). Deterministic: no seed, the same ranks for a vocab size.
 */
#include "gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "gen_priv.h"

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

/* The embedded corpus as one buffer of *tn bytes; NULL when out of
 * memory. The corpus is stored in paragraphs (C99 caps string literals at 4095). */
static uint8_t *corpus_text(size_t *tn_out) {
    size_t tn = 0;
    for (int i = 0; k_corpus[i]; i++) tn += strlen(k_corpus[i]);
    uint8_t *text = base_alloc(tn + 1, MEM_TOK);
    if (!text) return NULL;
    tn = 0;
    for (int i = 0; k_corpus[i]; i++) { memcpy(text + tn, k_corpus[i], strlen(k_corpus[i])); tn += strlen(k_corpus[i]); }
    *tn_out = tn;
    return text;
}

/* An empty table for n_ranks tokens holding the 256 single bytes; 0 on success. */
static int toktab_init(toktab *t, int64_t n_ranks) {
    t->cap = n_ranks;
    t->hcap = 1;
    while (t->hcap < (size_t)n_ranks * 2) t->hcap <<= 1;
    t->offs = base_calloc((size_t)n_ranks + 1, sizeof *t->offs, MEM_TOK);
    t->hash = base_alloc(t->hcap * sizeof *t->hash, MEM_TOK);
    if (!t->offs || !t->hash) return -1;
    memset(t->hash, 0xFF, t->hcap * sizeof *t->hash);
    for (int c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        if (toktab_add(t, &b, 1)) return -1;
    }
    return 0;
}

/* Stage 1's input: the distinct pieces of text (tn bytes, n_pieces pieces) as
 * words of single-byte symbols with their counts, found by linear probing on
 * (hash, bytes); piece_word[p] is the word of piece p. 0 on success. */
static int collect_pieces(const uint8_t *text, size_t tn, size_t n_pieces, words *ws, int64_t *piece_word) {
    size_t wcap = 1;
    while (wcap < n_pieces * 2) wcap <<= 1;
    int64_t *wh = base_alloc(wcap * sizeof *wh, MEM_TOK);
    int64_t *wpos = base_alloc(n_pieces * sizeof *wpos, MEM_TOK);
    if (!wh || !wpos) { base_free(wh); base_free(wpos); return -1; }
    memset(wh, 0xFF, wcap * sizeof *wh);
    size_t p = 0, used = 0;
    for (size_t i = 0; i < tn; p++) {
        size_t len = piece_len(text, i, tn);
        size_t m = wcap - 1, h = (size_t)tok_hash(text + i, len) & m;
        for (;; h = (h + 1) & m) {
            int64_t w = wh[h];
            if (w < 0) {
                w = ws->n++;
                wh[h] = w;
                wpos[w] = (int64_t)i;
                ws->woff[w] = (int64_t)used;
                ws->wlen[w] = (int64_t)len;
                ws->wfreq[w] = 0;
                for (size_t k = 0; k < len; k++) ws->sym[used++] = text[i + k];
            }
            if (ws->wlen[w] == (int64_t)len && !memcmp(text + wpos[w], text + i, len)) {
                ws->wfreq[w]++;
                piece_word[p] = w;
                break;
            }
        }
        i += len;
    }
    base_free(wh);
    base_free(wpos);
    return 0;
}

/* Stage 2: merges across piece boundaries within a line (phrases such as
 * " of the"), for pairs seen at least twice. The pieces' current symbols are
 * concatenated in corpus order. 0 on success. */
static int merge_lines(toktab *t, const words *ws, const int64_t *piece_word, size_t n_pieces, size_t tn,
                       pairmap *pm, int64_t n_ranks) {
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
            const int32_t *s = ws->sym + ws->woff[w];
            int nl = 0;
            for (int64_t k = 0; k < ws->wlen[w]; k++) {
                lw.sym[used++] = s[k];
                lw.wlen[lw.n]++;
                size_t id = (size_t)s[k];
                if (memchr(t->bytes + t->offs[id], '\n', toklen(t, (int64_t)id))) nl = 1;
            }
            if (nl || p + 1 == n_pieces) {
                lw.n++;
                lw.woff[lw.n] = used;
                lw.wfreq[lw.n] = 1;
            }
        }
        ok = !bpe_merge(t, &lw, pm, n_ranks, 2);
    }
    base_free(lw.sym);
    base_free(lw.woff);
    base_free(lw.wlen);
    base_free(lw.wfreq);
    return ok ? 0 : -1;
}

/* Stage 3, when the corpus is exhausted (large vocabularies): pseudo-words,
 * deterministic concatenations of a word-like token (letters, optional
 * leading space) and a letters-only one, at most 14 bytes, so every rank is
 * still a merge of two lower ranks and decoded text still looks like text.
 * 0 on success. */
static int pseudo_words(toktab *t, int64_t n_ranks) {
    rng r = {0x746f6b656e697a65ull, 0};
    uint8_t tmp[32];
    int64_t tries = 0, n_word = 0, n_tail = 0;
    int32_t *word = base_alloc((size_t)n_ranks * sizeof *word, MEM_TOK);
    int32_t *tail = base_alloc((size_t)n_ranks * sizeof *tail, MEM_TOK);
    int rc = -1;
    if (!word || !tail) goto out;
    for (int64_t id = 0; id < t->n; id++) {
        const uint8_t *b = t->bytes + t->offs[id];
        size_t l = toklen(t, id), k = b[0] == ' ' ? 1 : 0;
        int letters = l > k;
        for (size_t q = k; q < l; q++) letters &= (unsigned)((b[q] | 32) - 'a') < 26u;
        if (letters) word[n_word++] = (int32_t)id;
        if (letters && !k) tail[n_tail++] = (int32_t)id;
    }
    while (t->n < n_ranks) {
        int64_t a, b;
        if (++tries > n_ranks * 1000) goto out;
        if (n_word > 16 && n_tail > 16 && tries < n_ranks * 100) {
            a = word[rng_below(&r, (uint64_t)n_word)];
            b = tail[rng_below(&r, (uint64_t)n_tail)];
        } else { /* degenerate corpus: any two printable tokens */
            a = 32 + (int64_t)rng_below(&r, (uint64_t)(t->n - 32));
            b = 32 + (int64_t)rng_below(&r, (uint64_t)(t->n - 32));
            if ((a < 256 && a >= 0x7F) || (b < 256 && b >= 0x7F)) continue;
        }
        size_t la = toklen(t, a), lb = toklen(t, b);
        if (la + lb > 14) continue;
        memcpy(tmp, t->bytes + t->offs[a], la);
        memcpy(tmp + la, t->bytes + t->offs[b], lb);
        if (toktab_find(t, tmp, la + lb) >= 0) continue;
        if (toktab_add(t, tmp, la + lb)) goto out;
    }
    rc = 0;
out:
    base_free(word);
    base_free(tail);
    return rc;
}

int gen_tokenizer_ranks(int64_t n_ranks, uint8_t **bytes_out, uint64_t **offs_out, char *err, size_t errlen) {
    *bytes_out = NULL;
    *offs_out = NULL;
    if (n_ranks < 256 || n_ranks > (1ll << 30))
        return base_fail(err, errlen, STRATA_EINVAL, "gen: %lld BPE ranks: need 256 .. 2^30", (long long)n_ranks);
    size_t tn = 0;
    uint8_t *text = corpus_text(&tn);
    if (!text) return base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    toktab t = {0};
    words ws = {0};
    pairmap pm = {0};
    int64_t *piece_word = NULL;
    int rc = STRATA_ENOMEM;
    if (toktab_init(&t, n_ranks)) goto fail;

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
    if (collect_pieces(text, tn, n_pieces, &ws, piece_word)) goto fail;
    if (bpe_merge(&t, &ws, &pm, n_ranks, 1)) goto fail;
    if (t.n < n_ranks && merge_lines(&t, &ws, piece_word, n_pieces, tn, &pm, n_ranks)) goto fail;
    if (pseudo_words(&t, n_ranks)) goto fail;
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

/* K2-Thinking adds <think> and </think> to the K2 specials; their ids in the
 * release are not documented (family-formats.md 2.1), so they take two of the
 * reserved slots after K2.5's media placeholder (+21). */
#define K2_THINK_AT 22

static const char *special_name(const cfg *c, const gen_opts *o, int64_t i, char *buf, size_t n) {
    if (o->tok == GEN_TOK_K2_THINKING && (i == K2_THINK_AT || i == K2_THINK_AT + 1)) {
        snprintf(buf, n, "%s", i == K2_THINK_AT ? "<think>" : "</think>");
        return buf;
    }
    return c->arch == ARCH_KIMI_LINEAR || o->tok == GEN_TOK_K2 || o->tok == GEN_TOK_K2_THINKING ? kl_special_name(i, buf, n)
                                                                                                 : gen_special_name(i, buf, n);
}

/* strata's transcription of K2-Thinking's chat_template (family-formats.md 2.1,
 * not a copy): the default system prompt when none is given, history assistant
 * turns with their reasoning dropped (<think></think>), the turns after the last
 * user message keep theirs, and the prompt ends at <|im_middle|>: the model opens
 * <think> itself. Plain K2's is the same without the think parts. */
/* the part both share: the default system prompt and the history */
#define K2_THINKING_HISTORY                                                                                              \
    "{% if messages[0]['role'] != 'system' %}<|im_system|>system<|im_middle|>"                                           \
    "You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{% endif %}"                                         \
    "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"                          \
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"                                                        \
    "{% for m in messages %}{% if m['role'] == 'system' %}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>" \
    "{% elif m['role'] == 'user' %}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"                            \
    "{% elif m['role'] == 'assistant' %}<|im_assistant|>assistant<|im_middle|>"                                          \
    "{% if loop.index0 > ns.last_user %}<think>{{ m.get('reasoning_content', '') }}</think>{% else %}<think></think>{% endif %}" \
    "{{ m['content'] }}<|im_end|>{% endif %}{% endfor %}"
static const char k_k2_thinking_template[] =
    K2_THINKING_HISTORY "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}";
/* K2.5's: K2-Thinking's history; its generation prompt opens <think>, or
 * closes it at once when the caller passes thinking=false (family-formats.md 2.1). */
static const char k_k25_template[] =
    K2_THINKING_HISTORY "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% if thinking is defined and thinking is false %}<think></think>{% else %}<think>{% endif %}{% endif %}";
static const char k_k2_template[] =
    "{% if messages[0]['role'] != 'system' %}<|im_system|>system<|im_middle|>"
    "You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}<|im_system|>system<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% elif m['role'] == 'user' %}<|im_user|>user<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% elif m['role'] == 'assistant' %}<|im_assistant|>assistant<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}";

/* A JSON string literal of s (quotes, backslashes and newlines escaped). */
static void put_json_text(sbuf *b, const char *s) {
    sbuf_printf(b, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') sbuf_printf(b, "\\%c", *s);
        else if (*s == '\n') sbuf_printf(b, "\\n");
        else sbuf_printf(b, "%c", *s);
    }
    sbuf_printf(b, "\"");
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
int gen_write_tokenizer(const char *dir, const cfg *c, const gen_opts *o, int64_t n_ranks, char *err, size_t errlen) {
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
                    id == n_ranks ? "" : ",", (long long)id, special_name(c, o, id - n_ranks, name, sizeof name));
    const int k2 = c->arch == ARCH_KIMI_LINEAR || o->tok == GEN_TOK_K2 || o->tok == GEN_TOK_K2_THINKING;
    if (k2)
        sbuf_printf(&b, "\n  },\n  \"additional_special_tokens\": [\"<|im_end|>\", \"<|im_user|>\", \"<|im_assistant|>\", "
                        "\"<|im_system|>\", \"<|im_middle|>\"],\n");
    else
        sbuf_printf(&b, "\n  },\n  \"additional_special_tokens\": [\"<|end_of_msg|>\", \"<|open|>\", \"<|close|>\", \"<|sep|>\"],\n");
    sbuf_printf(&b, "  \"bos_token\": \"[BOS]\",\n  \"eos_token\": \"[EOS]\",\n");
    sbuf_printf(&b, "  \"pad_token\": \"%s\",\n", special_name(c, o, c->vocab - 1 - n_ranks, name, sizeof name));
    if (o->tok == GEN_TOK_K2 || o->tok == GEN_TOK_K2_THINKING) {
        sbuf_printf(&b, "  \"chat_template\": ");
        put_json_text(&b, o->tok == GEN_TOK_K2 ? k_k2_template
                          : c->arch == ARCH_KIMI_K25 ? k_k25_template : k_k2_thinking_template);
        sbuf_printf(&b, ",\n");
    }
    sbuf_printf(&b, "  \"unk_token\": null,\n  \"clean_up_tokenization_spaces\": false,\n");
    sbuf_printf(&b, "  \"model_max_length\": %lld,\n  \"tokenizer_class\": \"TikTokenTokenizer\"\n}\n", (long long)c->max_ctx);
    if (snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= (int)sizeof path)
        b.len = 0, base_free(b.s), b.s = NULL;
    rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen)
             : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    return rc;
}
