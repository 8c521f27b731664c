/*
 * b_kern.c: kernel throughput against this machine's own memory bandwidth.
 *
 * 1. Read bandwidth: sum a 1 GB buffer with 1 and 2 threads (best of several).
 * 2. Decode (T = 1): bf16 matvec over a 12288 x 7168 matrix (176 MB, q/k/v-sized)
 *    and MXFP4 matvec over a stack of routed experts (w1|w3 then w2 per expert, as
 *    the MoE step runs them), for every kernel table, with 1 and 2 threads:
 *    GB/s of weights streamed and the fraction of the measured read bandwidth.
 * 3. Prefill (T = 8, 64): GFLOP/s of the same kernels as matrix-matrix products.
 * 4. In-cache compute per core (CPU time, so other processes matter less).
 *
 * The measurement is strata_bench_kernels (include/strata_bench.h, src/bench.c);
 * strata_bench_kernels_quant (src/bench_kq.c) the FP8 and INT4 part; this program
 * adds the load average before and after. usage: b_kern [--quick] [--quant]
 * (--quant: only the FP8 / INT4 part)
 *
 * `make bench-kernels` builds and runs it. Matrices are far larger than the caches,
 * so decode numbers are DRAM numbers. Other processes on the machine disturb the
 * results; every figure is the best of several repetitions.
 *
 * Reference run (2-core AMD EPYC Zen 5 VM, load average 2.5, 2026-12-02):
 *   read bandwidth 29.9 GB/s (1 thread), 58.1 GB/s (2 threads)
 *   bf16 decode, avx512vbmi: 23.1 GB/s (77%) 1 thread, 44.5 GB/s (77%) 2 threads
 *   MXFP4 decode, avx512vbmi: 17.5 GB/s (58%), 34.1 GB/s (59%): compute-bound here,
 *     in-L2 MXFP4 is ~34 G weights/s = 18 GB/s per core
 *   prefill, 2 threads: bf16 196 (T=8) / 218 (T=64) GFLOP/s, MXFP4 199 / 208
 * 2026-12-05, decode-only MXFP4 block (kern_x86.c fp4dec512) and the 4-stream
 *   prefetching probe (bw.h): read bandwidth 38.6 / 70.2 GB/s; MXFP4 decode 23.9
 *   GB/s (62%) 1 thread, 42.4 GB/s (60%) 2 threads; bf16 35.1 / 62.7 GB/s (91% /
 *   89%). With the old single-stream probe the same run read 64 GB/s and the bf16
 *   matvec beat it (112%).
 *   scalar reference: 0.5 GB/s bf16 decode, 0.6 GFLOP/s prefill
 * 2026-12-07, FP8 / INT4 (--quant), AMD EPYC VM without AVX-512, load 4.5: probe
 *   18.2 / 20.5 GB/s; AVX2 FP8 decode 7.6 GB/s (42%) 1 thread, 8.9 (43%) 2; INT4
 *   4.9 GB/s (27%) / 4.8 (23%): compute-bound (in-L2 8.5 / 9.0 G weights/s)
 */
#include <stdio.h>
#include <string.h>
#include "strata_bench.h"
#include "bw.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int quant_only = 0;
    strata_bench_kern_opts o = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) o.quick = 1;
        else if (!strcmp(argv[i], "--quant")) quant_only = 1;
    }
    char err[512];
    bw_print_load("load before");
    if ((!quant_only && strata_bench_kernels(&o, stdout, err, sizeof err)) ||
        strata_bench_kernels_quant(&o, stdout, err, sizeof err)) {
        fprintf(stderr, "b_kern: %s\n", err);
        return 1;
    }
    bw_print_load("\nload after");
    return 0;
}
