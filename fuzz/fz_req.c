/*
 * fz_req.c: `strata serve` request bodies -> request_parse. The first byte picks
 * the endpoint (chat, completions, tokenize, detokenize), the rest is the body.
 * A refusal must say why with a 4xx/5xx status; an accepted request must hold
 * what the engine relies on. The same bytes go through the UTF-8 cleaner, whose
 * output must be valid UTF-8.
 */
#include <string.h>
#include "fuzz.h"
#include "serve/request.h"

FUZZ_ENTRY(req) {
    if (size < 1 || size > (1 << 20)) return 0;
    const int kind = 1 + data[0] % 4;
    request r;
    req_error e;
    if (request_parse(&r, kind, data + 1, size - 1, &e)) {
        ST_ASSERT(e.message[0] != 0 && e.status >= 400 && e.status < 600);
    } else {
        ST_ASSERT(r.n_stop <= REQ_MAX_STOP && r.go.top_p > 0 && r.go.top_p <= 1 && r.go.temp >= 0 && r.go.top_k >= 0);
        for (int i = 0; i < r.n_stop; i++) ST_ASSERT(r.stop_len[i] >= 1 && r.stop_len[i] <= REQ_MAX_STOP_BYTES);
        if (kind == REQ_CHAT) {
            ST_ASSERT(r.n_msgs >= 1);
            for (size_t i = 0; i < r.n_msgs; i++) ST_ASSERT(r.msgs[i].content && r.msgs[i].role >= 0 && r.msgs[i].role <= STRATA_CHAT_TOOL);
        }
        for (size_t i = 0; i < r.n_ids; i++) ST_ASSERT(r.ids[i] >= 0);
    }
    request_free(&r);
    req_buf b = {0};
    req_buf_add_utf8(&b, (const char *)data, size);
    ST_ASSERT(b.oom || req_utf8_valid_prefix(b.p ? b.p : "", b.n) == b.n);
    req_buf_free(&b);
    return 0;
}
