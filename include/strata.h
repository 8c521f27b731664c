/*
 * strata.h: the public boundary of strata, an inference engine for Kimi K3.
 *
 * strata runs a mixture-of-experts model whose checkpoint is far larger than RAM:
 * routed experts stay on disk and are read on demand, the always-used trunk is
 * pinned in RAM as far as the budget allows and streamed for the rest. The RAM
 * budget changes only the speed, never an output bit.
 *
 * Error convention: fallible calls return int, STRATA_OK (0) on success or a
 * negative STRATA_E* code; detail goes to a caller buffer (char *err, size_t errlen)
 * or the object's sticky message. Library code never exits.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stddef.h>
#include <stdint.h>

#define STRATA_VERSION "0.1.0"

enum strata_err {
    STRATA_OK = 0,
    STRATA_EIO = -1,      /* read/write failed, file missing */
    STRATA_ENOMEM = -2,   /* allocation failed */
    STRATA_EFORMAT = -3,  /* malformed or inconsistent input bytes */
    STRATA_EBUDGET = -4,  /* the RAM budget does not allow it */
    STRATA_EINVAL = -5,   /* bad argument from the caller */
    STRATA_EBUSY = -6,    /* resource in use */
    STRATA_ECORRUPT = -7, /* checksum mismatch */
};

/* Short static description of a STRATA_E* code ("format error", ...). */
const char *strata_errstr(int rc);

#endif
