/* fz_st.c: bytes -> st_parse_header into a fresh index, file size = input size.
 * On success every tensor must lie inside the input and be found by name. */
/* fuzz.h's opening comment holds "corpus/name/" followed by a star, which
 * -Wcomment flags (an error under make check); silence it for that include. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcomment"
#include "fuzz.h"
#pragma GCC diagnostic pop
#include "st.h"

#include <string.h>

FUZZ_ENTRY(st) {
    st_index *ix = st_index_create();
    if (!ix) return 0;
    char err[256];
    if (st_parse_header(ix, 0, data, size, size, "fuzz.safetensors", err, sizeof err) == 0) {
        for (size_t i = 0; i < st_count(ix); i++) {
            const st_tensor *t = st_at(ix, i);
            ST_ASSERT(t->off <= size && t->nbytes <= size - t->off);
            ST_ASSERT(st_find(ix, t->name) == t);
            ST_ASSERT(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS);
        }
    } else {
        ST_ASSERT(st_count(ix) == 0 && strstr(err, "fuzz.safetensors"));
    }
    st_close(ix);
    return 0;
}
