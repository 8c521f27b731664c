/*
 * oai.c: usage and logprobs JSON (see oai.h).
 */
#include "oai.h"

#include <math.h>
#include <string.h>
#include <time.h>

json_t *oai_usage(job *const *jobs, int n) {
    int64_t gen = 0, reasoning = 0;
    for (int k = 0; k < n; k++) {
        gen += jobs[k]->n_gen;
        reasoning += jobs[k]->n_reasoning;
    }
    const job *j = jobs[0];
    return json_pack("{s:I,s:I,s:I,s:{s:I},s:{s:I}}", "prompt_tokens", (json_int_t)j->n_prompt, "completion_tokens", (json_int_t)gen,
                     "total_tokens", (json_int_t)(j->n_prompt + gen), "prompt_tokens_details", "cached_tokens", (json_int_t)j->n_cached,
                     "completion_tokens_details", "reasoning_tokens", (json_int_t)reasoning);
}

/* A token's text (UTF-8 cleaned) and its raw bytes. */
static json_t *token_text(const strata_tokenizer *tk, int32_t id, json_t **bytes, size_t *len) {
    size_t n = 0;
    const uint8_t *p = strata_tokenizer_token_bytes(tk, id, &n);
    if (!p) n = 0;
    req_buf b = {0};
    req_buf_add_utf8(&b, (const char *)p, n);
    json_t *s = json_stringn(b.p ? b.p : "", b.n);
    req_buf_free(&b);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer(p[i]));
    }
    if (len) *len = n;
    return s;
}

/* JSON has no -inf: a masked-out token's log-probability is OpenAI's floor. */
static json_t *lp_num(double lp) { return json_real(isfinite(lp) ? lp : -9999.0); }

json_t *oai_logprobs(const strata_tokenizer *tk, int kind, const lp_ent *e, size_t n, size_t *text_off) {
    if (kind == REQ_CHAT) {
        json_t *content = json_array();
        for (size_t i = 0; i < n; i++) {
            json_t *bytes, *top = json_array();
            json_t *tok = token_text(tk, e[i].id, &bytes, NULL);
            for (int k = 0; k < e[i].n_top; k++) {
                json_t *tb, *tt = token_text(tk, e[i].top_ids[k], &tb, NULL);
                json_array_append_new(top, json_pack("{s:o,s:o,s:o}", "token", tt, "logprob", lp_num(e[i].top_lp[k]), "bytes", tb));
            }
            json_array_append_new(content, json_pack("{s:o,s:o,s:o,s:o}", "token", tok, "logprob", lp_num(e[i].lp), "bytes", bytes,
                                                     "top_logprobs", top));
        }
        return json_pack("{s:o,s:n}", "content", content, "refusal");
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (size_t i = 0; i < n; i++) {
        size_t len;
        json_array_append_new(toks, token_text(tk, e[i].id, NULL, &len));
        json_array_append_new(lps, lp_num(e[i].lp));
        json_t *top = json_object();
        for (int k = 0; k < e[i].n_top; k++) {
            json_t *tt = token_text(tk, e[i].top_ids[k], NULL, NULL);
            if (!json_object_get(top, json_string_value(tt))) json_object_set_new(top, json_string_value(tt), lp_num(e[i].top_lp[k]));
            json_decref(tt);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)*text_off));
        *text_off += len;
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops, "text_offset", offs);
}

json_t *oai_answer(const strata_tokenizer *tk, int kind, job *const *jobs, int n, const char *id, const char *model, const char *fp,
                   uint64_t seed) {
    json_t *choices = json_array();
    for (int k = 0; k < n; k++) {
        const job *j = jobs[k];
        size_t off = 0;
        json_t *lp = j->go.logprobs ? oai_logprobs(tk, kind, j->lp, j->n_lp, &off) : json_null(), *choice;
        if (kind == REQ_CHAT) {
            json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", j->content.p ? j->content.p : "", j->content.n);
            if (j->n_calls) {
                json_t *a = json_array();
                for (size_t i = 0; i < j->n_calls; i++) {
                    char cid[64];
                    snprintf(cid, sizeof cid, "%s_%zu", j->call_id, i);
                    json_array_append_new(a, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", cid, "type", "function", "function",
                                                       "name", j->call_name[i], "arguments", j->call_args[i]));
                }
                json_object_set_new(msg, "tool_calls", a);
                if (!j->content.n) json_object_set_new(msg, "content", json_null());
            }
            if (j->thinking)
                json_object_set_new(msg, "reasoning_content", json_stringn(j->reasoning.p ? j->reasoning.p : "", j->reasoning.n));
            choice = json_pack("{s:i,s:o,s:o,s:s}", "index", k, "message", msg, "logprobs", lp, "finish_reason", j->finish_reason);
        } else {
            choice = json_pack("{s:s%,s:i,s:o,s:s}", "text", j->content.p ? j->content.p : "", j->content.n, "index", k,
                               "logprobs", lp, "finish_reason", j->finish_reason);
        }
        json_array_append_new(choices, choice);
    }
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:I,s:o,s:o}", "id", id, "object", kind == REQ_CHAT ? "chat.completion" : "text_completion",
                     "created", (json_int_t)time(NULL), "model", model, "system_fingerprint", fp, "seed", (json_int_t)seed,
                     "choices", choices, "usage", oai_usage(jobs, n));
}
