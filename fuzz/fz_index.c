/* fz_index.c: bytes -> st_parse_index_json; every reported entry must be a
 * non-empty name and a plain shard file name. */
/* fuzz.h's opening comment holds "corpus/name/" followed by a star, which
 * -Wcomment flags (an error under make check); silence it for that include. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wcomment"
#include "fuzz.h"
#pragma GCC diagnostic pop
#include "st.h"

#include <string.h>

static int check_entry(void *ud, const char *tensor, const char *file) {
    ST_ASSERT(tensor[0] && file[0] && !strchr(file, '/'));
    (*(size_t *)ud)++;
    return 0;
}

FUZZ_ENTRY(index) {
    char err[256];
    size_t n = 0;
    if (st_parse_index_json(data, size, "fuzz.index.json", check_entry, &n, err, sizeof err))
        ST_ASSERT(strstr(err, "fuzz.index.json"));
    return 0;
}
