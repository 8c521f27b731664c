/*
 * grammar_api.c: strata_grammar_* (include/strata.h "structured output"): JSON
 * schemas compiled by jschema.c into the byte grammars of jgram.c.
 */
#include <string.h>
#include "base.h"
#include "jgram.h"
#include "jschema.h"
#include "chat.h"
#include "jsonx.h"
#include "strata.h"
#include "tok.h"
#include "toolgram.h"

int strata_grammar_json_schema(strata_grammar **out, const char *schema, size_t len, char *err, size_t errlen) {
    *out = NULL;
    json_t *j = NULL;
    /* a boolean schema (jansson's loader takes objects and arrays only) */
    size_t a = 0, b = len;
    while (a < b && strchr(" \t\r\n", schema[a])) a++;
    while (b > a && strchr(" \t\r\n", schema[b - 1])) b--;
    if (b - a == 4 && !memcmp(schema + a, "true", 4)) j = json_true();
    else if (b - a == 5 && !memcmp(schema + a, "false", 5)) j = json_false();
    int rc = j ? 0 : jsonx_parse(&j, (const uint8_t *)schema, len, "json schema", err, errlen);
    if (rc) return rc == STRATA_EFORMAT ? STRATA_EINVAL : rc;
    rc = jschema_compile(out, j, err, errlen);
    json_decref(j);
    return rc;
}

int strata_grammar_json_schema_tree(strata_grammar **out, const struct json_t *schema, char *err, size_t errlen) {
    *out = NULL;
    if (!schema) return base_fail(err, errlen, STRATA_EINVAL, "json schema: none given");
    return jschema_compile(out, schema, err, errlen);
}

int strata_grammar_json_object(strata_grammar **out, char *err, size_t errlen) { return jschema_json_object(out, err, errlen); }

void strata_grammar_free(strata_grammar *g) { jgram_free(g); }

int strata_grammar_check(const strata_grammar *g, const void *bytes, size_t n) { return jgram_check(g, bytes, n); }

/* A control marker's special id in the tokenizer, or -1 (it is then text). */
static int32_t marker_special(void *ud, const char *m, size_t n) {
    char buf[128];
    if (n >= sizeof buf) return -1;
    memcpy(buf, m, n);
    buf[n] = 0;
    return tok_special_id((const tok *)ud, buf);
}

int strata_grammar_tools(strata_grammar **out, const strata_tokenizer *t, const strata_chat_tools *tools, size_t calls_before,
                         char *err, size_t errlen) {
    *out = NULL;
    chat_ids ci;
    int rc = chat_ids_init(&ci, (const tok *)t, err, errlen);
    if (rc) return rc;
    return tools_grammar(out, ci.fmt, (const chat_tools *)tools, calls_before, marker_special, (void *)t, err, errlen);
}
