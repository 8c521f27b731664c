/*
 * cfg_priv.h: what cfg.c (the config.json reader, the K3 preset, the census)
 * and cfg_check.c (the structural validation every config passes) share. Only
 * the cfg module includes it; it includes no header of the module, so cfg.h's
 * type is named by its typedef again.
 */
#ifndef STRATA_CFG_PRIV_H
#define STRATA_CFG_PRIV_H

#include <stdarg.h>
#include <stdint.h>
#include "arch.h"
#include "base.h"

/* Field ids (enum cfg_fid, arch.h), so validation can skip checks on fields that failed to parse. */
#define HAVE(m, f) (((m) >> (f)) & 1u)
#define ALL_FIELDS ((UINT64_C(1) << F_COUNT) - 1)

/* JSON name of a field id (cfg.c's key table), for validation messages. */
const char *cfg_field_name(int id);
/* Every structural check of c (cfg_check.c), one problem line each into pb,
 * skipping checks on fields not in have (they failed to parse). */
void cfg_check_all(const cfg *c, uint64_t have, const char *what, sbuf *pb);
/* One problem line "what: message" into pb (the message cut at 511 bytes), as
 * the reader's and the validation's messages are written. */
void cfg_problem_va(sbuf *pb, const char *what, const char *fmt, va_list ap) ST_PRINTF(3, 0);
/* The problems of pb into err (cut at a line when they do not fit); frees pb;
 * returns STRATA_EFORMAT. */
int cfg_flush_problems(sbuf *pb, char *err, size_t errlen);

#endif
