/*
 * fuzz.h: a fuzz target is `FUZZ_ENTRY(name) { ... }` in fuzz/fz_name.c. The test
 * runner replays fuzz/corpus/name/ files through it on every `make test`; built with
 * -DFUZZ_TARGET (make fuzz T=name) the same function is the libFuzzer entry.
 * A target must return 0 and never crash, leak or trip a sanitizer.
 */
#ifndef STRATA_FUZZ_H
#define STRATA_FUZZ_H
#include <stddef.h>
#include <stdint.h>
#include "base.h"

#ifdef FUZZ_TARGET
#define FUZZ_LIBFUZZER(name) \
    int fz_##name(const uint8_t *data, size_t size); \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fz_##name(data, size); }
#else
#define FUZZ_LIBFUZZER(name)
#endif
#define FUZZ_ENTRY(name) FUZZ_LIBFUZZER(name) int fz_##name(const uint8_t *data, size_t size)
#endif
