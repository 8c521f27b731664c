/*
 * dense.c: the dense FFN of the first layers (docs/architecture.md, Model spec):
 *   y = W_down SiTU(W_gate x, W_up x)
 * one GLU job (gate and up rows with SiTU in place) and the down projection.
 */
#include "engine_int.h"

int dense_layer(engine *e, int64_t L, const wt *W) {
    const cfg *c = e->c;
    const int64_t Hd = c->hidden, I = c->dense_inter, T = e->T;
    mm_job j;
    mm_init(&j, T);
    mm_seg *g = mm_add(&j, &W[R_DENSE_GATE], I, Hd, e->xn, Hd, e->f.dg, I, "mlp.gate_proj");
    mm_glu(&j, g, &W[R_DENSE_UP], NULL, e->f.du, "mlp.up_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    mm_init(&j, T);
    mm_add(&j, &W[R_DENSE_DOWN], Hd, I, e->f.dg, I, e->y, Hd, "mlp.down_proj");
    if (j.bad) return efail(e, STRATA_EFORMAT, "infer: layer %lld: %s", (long long)L, j.what);
    mm_run(e, &j);
    return 0;
}
