/*
 * gen_tok_hf.c: a DeepSeek-V3-style Hugging Face tokenizer.json (and its
 * tokenizer_config.json) for generated models and the tests: byte-level BPE
 * with merges derived from the ranks gen_tokenizer_ranks trains on the embedded
 * corpus, DeepSeek's three Isolated Split regexes (family-formats.md 2.2), and
 * DeepSeek's special tokens.
 *
 * Id layout: 0 <｜begin▁of▁sentence｜>, 1 <｜end▁of▁sentence｜>, 2 <｜▁pad▁｜>,
 * then the BPE tokens (the 256 bytes first), then the 17 tokens <think> ..
 * <｜tool▁sep｜> in DeepSeek's order. A vocab_size of DeepSeek's 129,280 or more
 * gives DeepSeek's own ids (BPE up to 127,999, <｜place▁holder▁no▁N｜> 128000..
 * 128797, <think> 128798 .. <｜tool▁sep｜> 128814); a smaller one puts the block
 * 8 ids below vocab_size. The ids above the block are unused, as DeepSeek pads
 * 128,815 tokens to 129,280 embedding rows.
 *
 * The chat_template strings are strata's own transcriptions of the published
 * templates' behaviour (DeepSeek-V3, R1, V3.1 as family-formats.md 2.2 and the
 * comment of each describe it), not copies.
 */
#include "gen.h"

#include <stdio.h>
#include <string.h>
#include "base.h"

#define DS_FULL_VOCAB 129280

static const char *const k_top[] = {
    "<think>", "</think>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>",
    "<|EOT|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>"};
#define N_TOP 17

/* The pieces every DeepSeek template shares: the defaults, the system messages
 * joined by a blank line after BOS, the user turns. */
#define DS_TMPL_GENPROMPT_DEFAULT \
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
#define DS_TMPL_SYSTEM_USER                                                                \
    "{% set ns = namespace(system='', first=true) %}"                                      \
    "{% for m in messages %}{% if m['role'] == 'system' %}"                                \
    "{% if ns.first %}{% set ns.system = m['content'] %}{% set ns.first = false %}"        \
    "{% else %}{% set ns.system = ns.system + '\\n\\n' + m['content'] %}{% endif %}"       \
    "{% endif %}{% endfor %}"                                                              \
    "{{ bos_token }}{{ ns.system }}"                                                       \
    "{% for m in messages %}"                                                              \
    "{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
/* R1 and V3.1: an assistant turn keeps only the text after its last </think>. */
#define DS_TMPL_ASSISTANT_AFTER_THINK                                                      \
    "{% elif m['role'] == 'assistant' %}{% set c = m['content'] %}"                        \
    "{% if '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"

/* DeepSeek-V3: user and assistant turns; the generation prompt opens the
 * assistant turn. */
static const char k_tmpl_v3[] =
    DS_TMPL_GENPROMPT_DEFAULT DS_TMPL_SYSTEM_USER
    "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}";

/* DeepSeek-R1: as V3, earlier assistant turns keep only the text after their
 * last </think> (the reasoning is dropped), and the prompt opens the reasoning. */
static const char k_tmpl_r1[] =
    DS_TMPL_GENPROMPT_DEFAULT DS_TMPL_SYSTEM_USER DS_TMPL_ASSISTANT_AFTER_THINK
    "{{ '<｜Assistant｜>' + c + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}";

/* DeepSeek-V3.1 hybrid thinking: history assistant turns are rendered with
 * thinking closed (</think> then the answer); the prompt opens <think> when
 * the thinking kwarg is true, else closes it at once. */
static const char k_tmpl_v31[] =
    DS_TMPL_GENPROMPT_DEFAULT
    "{% if not thinking is defined %}{% set thinking = false %}{% endif %}"
    DS_TMPL_SYSTEM_USER DS_TMPL_ASSISTANT_AFTER_THINK
    "{{ '<｜Assistant｜></think>' + c + '<｜end▁of▁sentence｜>' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{% if thinking %}{{ '<｜Assistant｜><think>' }}"
    "{% else %}{{ '<｜Assistant｜></think>' }}{% endif %}{% endif %}";

const char *gen_ds_chat_template(int variant) {
    return variant == GEN_DS_R1 ? k_tmpl_r1 : variant == GEN_DS_V31 ? k_tmpl_v31 : k_tmpl_v3;
}

/* JSON string of s (n bytes of UTF-8) with the escapes JSON needs. */
static void put_json_str(sbuf *b, const char *s, size_t n) {
    sbuf_printf(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') sbuf_printf(b, "\\%c", c);
        else if (c < 0x20) sbuf_printf(b, "\\u%04x", c);
        else sbuf_printf(b, "%c", c);
    }
    sbuf_printf(b, "\"");
}

size_t gen_bytelevel_char(int b, char *out) {
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    unsigned cp = (unsigned)b;
    if (!printable) {
        cp = 256;
        for (int i = 0; i < b; i++) cp += !((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174);
    }
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static void put_bytelevel(sbuf *b, const uint8_t *p, size_t n) {
    char tmp[2 * 256 + 2];
    size_t o = 0;
    sbuf tb = {0};
    for (size_t i = 0; i < n; i++) {
        if (o + 2 > sizeof tmp) { sbuf_printf(&tb, "%.*s", (int)o, tmp); o = 0; }
        o += gen_bytelevel_char(p[i], tmp + o);
    }
    if (o) sbuf_printf(&tb, "%.*s", (int)o, tmp);
    put_json_str(b, tb.s ? tb.s : "", tb.len);
    sbuf_free(&tb);
}

/* The trained ranks and a bytes -> rank table over them. */
typedef struct { const uint8_t *bytes; const uint64_t *offs; int64_t n; int64_t *slot; size_t mask; } ranks;

static uint64_t rk_hash(const uint8_t *p, size_t n) { return base_fnv1a(p, n, BASE_FNV_INIT); }

static int ranks_index(ranks *r) {
    size_t cap = 16;
    while (cap < (size_t)r->n * 2) cap *= 2;
    r->slot = base_alloc(cap * sizeof *r->slot, MEM_TOK);
    if (!r->slot) return STRATA_ENOMEM;
    r->mask = cap - 1;
    for (size_t i = 0; i < cap; i++) r->slot[i] = -1;
    for (int64_t i = 0; i < r->n; i++) {
        size_t h = (size_t)rk_hash(r->bytes + r->offs[i], (size_t)(r->offs[i + 1] - r->offs[i])) & r->mask;
        while (r->slot[h] >= 0) h = (h + 1) & r->mask;
        r->slot[h] = i;
    }
    return STRATA_OK;
}

/* Rank of bytes p[0..n) if it is below `below`, else -1. */
static int64_t rank_of(const ranks *r, const uint8_t *p, size_t n, int64_t below) {
    for (size_t h = (size_t)rk_hash(p, n) & r->mask; r->slot[h] >= 0; h = (h + 1) & r->mask) {
        int64_t i = r->slot[h];
        if (r->offs[i + 1] - r->offs[i] == n && !memcmp(r->bytes + r->offs[i], p, n)) return i < below ? i : -1;
    }
    return -1;
}

/* The merge that makes rank i: the split whose halves both rank below i, the
 * higher half ranking lowest (what rank-BPE would have merged last). */
static int merge_of(const ranks *r, int64_t i, int64_t *a, int64_t *b) {
    const uint8_t *p = r->bytes + r->offs[i];
    size_t n = (size_t)(r->offs[i + 1] - r->offs[i]);
    int64_t best = -1;
    for (size_t k = 1; k < n; k++) {
        int64_t x = rank_of(r, p, k, i), y = x < 0 ? -1 : rank_of(r, p + k, n - k, i);
        if (x < 0 || y < 0) continue;
        int64_t m = x > y ? x : y;
        if (best < 0 || m < best) { best = m; *a = x; *b = y; }
    }
    return best >= 0;
}

int gen_tok_write_hf(const char *dir, int64_t vocab_size, int variant, char *err, size_t errlen) {
    int full = vocab_size >= DS_FULL_VOCAB;
    int64_t top = full ? 128798 : vocab_size - 8 - N_TOP;
    int64_t n_ranks = full ? 128000 - 3 : top - 3;
    if (n_ranks < 256)
        return base_fail(err, errlen, STRATA_EINVAL, "gen: a DeepSeek tokenizer needs a vocab_size of at least %d",
                         256 + 3 + N_TOP + 8);
    uint8_t *bytes = NULL;
    uint64_t *offs = NULL;
    int rc = gen_tokenizer_ranks(n_ranks, &bytes, &offs, err, errlen);
    if (rc) return rc;
    ranks r = {bytes, offs, n_ranks, NULL, 0};
    if (ranks_index(&r)) {
        base_free(bytes);
        base_free(offs);
        return base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    }
    sbuf b = {0};
    sbuf_printf(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    const char *low[] = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"};
    for (int64_t id = 0; id < top + N_TOP; id++) {
        char ph[64];
        const char *name = id < 3 ? low[id] : id >= top ? k_top[id - top] : NULL;
        if (!name && full && id >= 128000) snprintf(ph, sizeof ph, "<｜place▁holder▁no▁%lld｜>", (long long)(id - 128000));
        if (!name && full && id >= 128000) name = ph;
        if (!name) continue;
        /* <think> and </think> are not special in R1's and V3.1's tokenizers:
         * they match in any text. */
        int special = strcmp(name, "<think>") && strcmp(name, "</think>");
        sbuf_printf(&b, "%s\n    {\"id\": %lld, \"content\": ", id ? "," : "", (long long)id);
        put_json_str(&b, name, strlen(name));
        sbuf_printf(&b, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": true, "
                        "\"special\": %s}", special ? "true" : "false");
    }
    sbuf_printf(&b, "\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n");
    static const char *const k_split[] = {
        "\\\\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+|"
        " ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|\\\\s+"};
    for (int i = 0; i < 3; i++)
        sbuf_printf(&b, "    {\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", "
                        "\"invert\": false},\n", k_split[i]);
    sbuf_printf(&b, "    {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
                    "\"use_regex\": false}\n  ]},\n");
    sbuf_printf(&b, "  \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                    "{\"id\": \"<｜begin▁of▁sentence｜>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
                    "\"type_id\": 0}}], \"pair\": [{\"SpecialToken\": {\"id\": \"<｜begin▁of▁sentence｜>\", "
                    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": "
                    "\"<｜begin▁of▁sentence｜>\", \"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
                    "\"special_tokens\": {\"<｜begin▁of▁sentence｜>\": {\"id\": \"<｜begin▁of▁sentence｜>\", "
                    "\"ids\": [0], \"tokens\": [\"<｜begin▁of▁sentence｜>\"]}}},\n");
    sbuf_printf(&b, "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
                    "\"use_regex\": true},\n");
    sbuf_printf(&b, "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
                    "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false, "
                    "\"byte_fallback\": false, \"ignore_merges\": false,\n    \"vocab\": {");
    for (int64_t i = 0; i < n_ranks; i++) {
        sbuf_printf(&b, "%s", i ? ", " : "");
        put_bytelevel(&b, bytes + offs[i], (size_t)(offs[i + 1] - offs[i]));
        sbuf_printf(&b, ": %lld", (long long)i + 3);
    }
    sbuf_printf(&b, "},\n    \"merges\": [");
    int first = 1;
    for (int64_t i = 256; i < n_ranks; i++) {
        int64_t x, y;
        if (!merge_of(&r, i, &x, &y)) continue; /* unreachable by merges, as real vocabularies have some */
        sbuf_printf(&b, "%s[", first ? "" : ", ");
        put_bytelevel(&b, bytes + offs[x], (size_t)(offs[x + 1] - offs[x]));
        sbuf_printf(&b, ", ");
        put_bytelevel(&b, bytes + offs[y], (size_t)(offs[y + 1] - offs[y]));
        sbuf_printf(&b, "]");
        first = 0;
    }
    sbuf_printf(&b, "]\n  }\n}\n");
    base_free(bytes);
    base_free(offs);
    base_free(r.slot);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen) : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    if (rc) return rc;
    sbuf_printf(&b, "{\n  \"add_bos_token\": true,\n  \"add_eos_token\": false,\n"
                    "  \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<｜begin▁of▁sentence｜>\", "
                    "\"lstrip\": false, \"normalized\": true, \"rstrip\": false, \"single_word\": false},\n"
                    "  \"eos_token\": {\"__type\": \"AddedToken\", \"content\": \"<｜end▁of▁sentence｜>\", "
                    "\"lstrip\": false, \"normalized\": true, \"rstrip\": false, \"single_word\": false},\n"
                    "  \"pad_token\": null,\n  \"legacy\": true,\n  \"model_max_length\": 131072,\n"
                    "  \"tokenizer_class\": \"LlamaTokenizerFast\",\n  \"unk_token\": null,\n"
                    "  \"use_default_system_prompt\": false,\n  \"chat_template\": ");
    const char *tm = gen_ds_chat_template(variant);
    put_json_str(&b, tm, strlen(tm));
    sbuf_printf(&b, "\n}\n");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    rc = b.s ? base_write_file_atomic(path, b.s, b.len, err, errlen) : base_fail(err, errlen, STRATA_ENOMEM, "gen: out of memory");
    sbuf_free(&b);
    return rc;
}
