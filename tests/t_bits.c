/*
 * t_bits.c: ids and logits bits of every tiny preset equal the hashes recorded
 * before the source tree was reorganised (tests/bits/expected.txt, written by
 * tests/bits/hash.sh from the tree at 731ec43). A refactor that changes one bit
 * of any preset's output fails here. `make test-bits` adds the demo model.
 */
#include <stdlib.h>
#include <string.h>
#include "test.h"

TEST(bits_recorded) {
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "bash tests/bits/hash.sh %s %s/bits tiny tiny-odd tiny-blocks tiny-shards tiny-mixed tiny-bf16experts",
             t_strata(), t_tmpdir);
    int rc = t_run(cmd, &out);
    CHECK_MSG(rc == 0, "hash.sh failed: %s", out ? out : "");
    uint8_t *want = NULL;
    size_t n = 0;
    CHECK(base_read_file("tests/bits/expected.txt", 1 << 20, &want, &n, NULL, 0) == 0);
    if (!out || !want) { base_free(out); base_free(want); return; }
    int lines = 0;
    for (char *l = out, *e; *l; l = e + 1) {
        e = strchr(l, '\n');
        if (!e) break;
        *e = 0;
        lines++;
        /* each printed line must appear as a whole line of expected.txt */
        size_t k = strlen(l);
        const char *w = (const char *)want, *hit = NULL;
        for (const char *p = w; (p = strstr(p, l)); p++)
            if ((p == w || p[-1] == '\n') && (p[k] == '\n' || p[k] == 0)) { hit = p; break; }
        CHECK_MSG(hit != NULL, "output bits changed: '%s' is not in tests/bits/expected.txt", l);
    }
    CHECK_MSG(lines == 18, "expected 18 lines (6 presets x 3 modes), got %d", lines);
    base_free(out);
    base_free(want);
}
