#!/usr/bin/python3
"""selftest.py: internal equivalences of the float64 reference (k3ref.py and the
refcommon.py pieces it uses).

  /usr/bin/python3 tests/reference/selftest.py [--model DIR ...] [-v]

Without --model it writes its own tiny models (make_tiny.py) into a temp dir.
Every check prints its measured max difference and its bound; exit 1 on failure.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import k3ref as R          # noqa: E402
import refcommon as C      # noqa: E402
import make_tiny as MT     # noqa: E402
from refcheck import FAILS, check, check_true, maxabs  # noqa: E402


# ---------------------------------------------------------------------------- KDA

def random_kda(rng, T, H, D, lb=-5.0):
    q = C.l2norm(rng.standard_normal((T, H, D))) / np.sqrt(D)
    k = C.l2norm(rng.standard_normal((T, H, D)))
    v = rng.standard_normal((T, H, D)) * 2.0
    g = lb * C.sigmoid(rng.standard_normal((T, H, D)) * 2.0)
    beta = C.sigmoid(rng.standard_normal((T, H)))
    S0 = rng.standard_normal((H, D, D))
    return q, k, v, g, beta, S0


def test_kda_forms():
    rng = np.random.default_rng(7)
    H, D = 3, 8
    worst_o = worst_s = 0.0
    for T in (1, 2, 5, 17, 63, 64, 65, 128, 130, 200):
        for chunk in (64, 16, 7):
            q, k, v, g, beta, S0 = random_kda(rng, T, H, D)
            Sa, Sb = S0.copy(), S0.copy()
            oa = C.kda_recurrent(q, k, v, g, beta, Sa)
            ob = C.kda_chunked(q, k, v, g, beta, Sb, chunk)
            worst_o = max(worst_o, maxabs(oa, ob) / max(1.0, np.max(np.abs(oa))))
            worst_s = max(worst_s, maxabs(Sa, Sb) / max(1.0, np.max(np.abs(Sa))))
    check('KDA chunked == recurrent: outputs (T 1..200, chunk 64/16/7)', worst_o, 1e-12)
    check('KDA chunked == recurrent: final state', worst_s, 1e-12)
    # Strong decay over a full 64-chunk (g near the -5 bound: exp(-320) inside).
    q, k, v, g, beta, S0 = random_kda(rng, 150, H, D)
    g = np.full_like(g, -4.999)
    Sa, Sb = S0.copy(), S0.copy()
    d = maxabs(C.kda_recurrent(q, k, v, g, beta, Sa), C.kda_chunked(q, k, v, g, beta, Sb, 64))
    check('KDA chunked == recurrent at g = -4.999 (no overflow)', max(d, maxabs(Sa, Sb)), 1e-12)
    # Recurrent vs the closed matrix form S_t = (I - b k k^T) diag(a) S + b k v^T.
    q, k, v, g, beta, S0 = random_kda(rng, 9, H, D)
    S = S0.copy()
    o = C.kda_recurrent(q, k, v, g, beta, S)
    worst = 0.0
    Sm = S0.copy()
    for t in range(9):
        for h in range(H):
            A = np.eye(D) - beta[t, h] * np.outer(k[t, h], k[t, h])
            Sm[h] = A @ np.diag(np.exp(g[t, h])) @ Sm[h] + beta[t, h] * np.outer(k[t, h], v[t, h])
            worst = max(worst, maxabs(Sm[h].T @ q[t, h], o[t, h]))
    check('KDA recurrent == closed form (I - bkk^T) diag(a) S + bkv^T', max(worst, maxabs(Sm, S)), 1e-13)


def test_short_conv():
    rng = np.random.default_rng(3)
    P, K, T = 5, 4, 9
    w = rng.standard_normal((P, K))
    x = rng.standard_normal((T, P))
    y, hist = C.short_conv(x, w, np.zeros((K - 1, P)))
    # Direct definition: y_t = silu(sum_j w[:, j] x_{t-(K-1)+j}), zero before t = 0.
    ref = np.zeros((T, P))
    for t in range(T):
        for j in range(K):
            s = t - (K - 1) + j
            if s >= 0:
                ref[t] += w[:, j] * x[s]
    ref = ref / (1 + np.exp(-ref))
    # Split in two calls carrying the history.
    y1, h1 = C.short_conv(x[:4], w, np.zeros((K - 1, P)))
    y2, h2 = C.short_conv(x[4:], w, h1)
    check('short conv: direct definition, taps oldest..newest', maxabs(y, ref), 1e-15)
    check('short conv: split with carried history', max(maxabs(np.concatenate([y1, y2]), y),
                                                        maxabs(h2, hist)), 0.0)
    check_true('short conv: history holds the last K-1 inputs', np.array_equal(hist, x[-3:]))


# ---------------------------------------------------------------------------- small pieces

def test_pieces():
    # bf16 decode of known bit patterns.
    bits = np.array([0x3F80, 0xC000, 0x3F81, 0x0000, 0x8000, 0x7F7F, 0x0001], dtype=np.uint16)
    want = [1.0, -2.0, 1.0078125, 0.0, -0.0, 3.3895313892515355e38, 9.183549615799121e-41]
    check('bf16 -> f64 known patterns', maxabs(C.bf16_bits_to_f64(bits) / np.array(
        [1, 1, 1, 1, 1, 1e38, 1e-41]), np.array(want) / np.array([1, 1, 1, 1, 1, 1e38, 1e-41])), 1e-15)
    # MXFP4 hand example. Row 0: bytes 0x21, 0xF8, then zeros; scale 128 (x2).
    # Byte 0x21: low nibble 1 -> element 0 = 0.5, high nibble 2 -> element 1 = 1.0.
    # Byte 0xF8: low 8 -> element 2 = -0, high 15 -> element 3 = -6.
    packed = np.zeros((2, 16), np.uint8)
    packed[0, 0], packed[0, 1] = 0x21, 0xF8
    packed[1, 15] = 0x7A          # element 30 = code 10 = -1.0, element 31 = code 7 = 6.0
    scale = np.array([[128], [125]], np.uint8)
    m = R.mxfp4_decode(packed, scale, 't')
    want = np.zeros((2, 32))
    want[0, :4] = [1.0, 2.0, -0.0, -12.0]
    want[1, 30:] = [-0.25, 1.5]
    check('MXFP4 nibble order: low nibble = even element (hand example)', maxabs(m, want), 0.0)
    check_true('MXFP4 code 8 decodes to -0.0', np.signbit(m[0, 2]) and m[0, 2] == 0)
    # Partial last group: 40 inputs -> scales for elements 0..31 and 32..39.
    p40 = np.full((1, 20), 0x22, np.uint8)                     # every element 1.0
    m40 = R.mxfp4_decode(p40, np.array([[127, 130]], np.uint8), 't40')
    check('MXFP4 partial last group (40 inputs, 2 scales)',
          maxabs(m40, np.r_[np.ones(32), 8 * np.ones(8)][None]), 0.0)
    try:
        R.mxfp4_decode(packed, np.array([[128], [255]], np.uint8), 'layers.1.experts.3.w2')
        check_true('MXFP4 scale 255 raises naming the tensor', False)
    except C.RefError as e:
        check_true('MXFP4 scale 255 raises naming the tensor', 'layers.1.experts.3.w2' in str(e),
                   str(e)[:60])
    # SiTU at a hand-computed point; bound |y| <= b1*b2.
    g, u = np.array([2.0, -30.0, 1e4]), np.array([10.0, 3.0, 1e4])
    want = np.array([4 * np.tanh(0.5) / (1 + np.exp(-2.0)) * 25 * np.tanh(0.4),
                     4 * np.tanh(-7.5) / (1 + np.exp(30.0)) * 25 * np.tanh(0.12),
                     100.0])
    check('SiTU hand values (uncapped sigmoid, cap 100)', maxabs(R.situ(g, u, 4.0, 25.0), want), 1e-12)
    # RMSNorm / L2 norm definitions.
    x = np.array([[3.0, 4.0]])
    check('RMSNorm w*x/sqrt(mean(x^2)+eps)', maxabs(R.rmsnorm(x, np.array([1.0, 2.0]), 1e-5),
                                                      x * [1, 2] / np.sqrt(12.5 + 1e-5)), 1e-15)
    check('L2 norm x/sqrt(sum(x^2)+1e-6)', maxabs(C.l2norm(x), x / np.sqrt(25 + 1e-6)), 1e-15)
    # AttnRes: one source is the identity; equal keys average the raw values.
    rng = np.random.default_rng(5)
    s = rng.standard_normal((3, 6))
    f = rng.standard_normal(6)
    check('AttnRes with one source returns it', maxabs(R.attn_res([s], f, 1e-5), s), 1e-15)
    check('AttnRes of scaled copies: keys normalised, values raw',
          maxabs(R.attn_res([s, 3 * s], f, 0.0), 2 * s), 1e-14)
    # Router: ties go to the lowest index; bias selects, unbiased scores weigh.
    cfg = C.Config()
    cfg.topk, cfg.moe_renorm, cfg.routed_scale = 3, True, 2.0
    w = {'router': np.zeros((6, 4)), 'router_bias': np.zeros(6)}
    idx, wts = R.route(cfg, w, np.ones((1, 4)))
    check_true('router ties -> lowest indices 0,1,2', list(idx[0]) == [0, 1, 2], str(idx[0]))
    w['router_bias'] = np.array([0, 0, 0, 0, 0.5, 0.5])
    w['router'] = np.zeros((6, 4))
    w['router'][5] = 1.0          # expert 5: higher unbiased score
    idx, wts = R.route(cfg, w, np.ones((1, 4)))
    s5 = 1 / (1 + np.exp(-4.0))
    check_true('router: biased selection order 5,4,0', list(idx[0]) == [5, 4, 0], str(idx[0]))
    check('router weights from unbiased scores, renormalised, x scale',
          maxabs(wts[0], 2.0 * np.array([s5, 0.5, 0.5]) / (s5 + 1.0 + 1e-20)), 1e-15)
    cfg.topk = 1
    idx, wts = R.route(cfg, w, np.ones((1, 4)))
    check('router top-1 weight is not renormalised', maxabs(wts[0], [2.0 * s5]), 1e-15)


# ---------------------------------------------------------------------------- config

def test_config(tmp):
    nested = os.path.join(tmp, 'cfg_nested')
    flat = os.path.join(tmp, 'cfg_flat')
    MT.make_tiny(nested, seed=1)
    MT.make_tiny(flat, seed=1, flat=True)
    a, b = R.load_config(nested), R.load_config(flat)
    keys = [f for f, _, _, _ in R._CONFIG_FIELDS] + ['mla_layers', 'is_dense']
    diff = [k for k in keys if getattr(a, k) != getattr(b, k)]
    check_true('config: nested and flat shapes agree', not diff, ','.join(diff))
    check_true('config: KDA head_dim from linear_attn_config (not text_config)',
               a.kda_head_dim == 16, str(a.kda_head_dim))
    check_true('config: full_attn_layers one-based -> last two layers MLA',
               a.is_mla[-1] and a.is_mla[-2] and not a.is_mla[0], str(a.mla_layers))
    check_true('config: eos list and int', a.eos_ids == [301, 302] and b.eos_ids == [301])
    with open(os.path.join(nested, 'config.json')) as f:
        obj = json.load(f)
    del obj['text_config']['hidden_size']
    del obj['text_config']['linear_attn_config']['gate_lower_bound']
    try:
        R.parse_config(obj)
        check_true('config: missing keys all reported', False)
    except C.RefError as e:
        check_true('config: missing keys all reported',
                   'hidden_size' in str(e) and 'gate_lower_bound' in str(e), str(e)[:70])
    with open(os.path.join(nested, 'config.json')) as f:
        obj = json.load(f)
    obj['text_config']['linear_attn_config']['full_attn_layers'] = [0, 7]
    try:
        R.parse_config(obj)
        check_true('config: 0 in one-based full_attn_layers refused', False)
    except C.RefError:
        check_true('config: 0 in one-based full_attn_layers refused', True)


def test_k3_config():
    """The released K3 config (spec folder) gives MODEL.md's layer map."""
    path = '/work/shared/spec/k3-config.json'
    if not os.path.exists(path):
        print('skip K3 config (no %s)' % path)
        return
    with open(path) as f:
        c = R.parse_config(json.load(f))
    want = list(range(3, 91, 4)) + [91, 92]
    check_true('K3 config: 69 KDA + 24 MLA, MLA at 3,7,...,87,91,92, dense only layer 0',
               c.mla_layers == want and len(want) == 24 and sum(c.is_dense) == 1 and c.is_dense[0]
               and (c.kda_heads, c.kda_head_dim, c.n_heads, c.kv_lora, c.latent, c.topk)
               == (96, 128, 96, 512, 3584, 16),
               '%d MLA' % len(c.mla_layers))


def test_scale255(tmp):
    """A scale byte of 255 inside a real shard is reported with the tensor name."""
    d = os.path.join(tmp, 'bad255')
    MT.make_tiny(d, seed=2)
    name = 'language_model.model.layers.2.block_sparse_moe.experts.5.w3.weight_scale'
    with open(os.path.join(d, 'model.safetensors.index.json')) as f:
        shard = json.load(f)['weight_map'][name]
    path = os.path.join(d, shard)
    with open(path, 'r+b') as f:
        n = int.from_bytes(f.read(8), 'little')
        hdr = json.loads(f.read(n))
        off = 8 + n + hdr[name]['data_offsets'][0] + 7
        f.seek(off)
        f.write(b'\xff')
    try:
        R.Model(d)
        check_true('scale 255 in a shard: load refused naming the tensor', False)
    except C.RefError as e:
        check_true('scale 255 in a shard: load refused naming the tensor',
                   'experts.5.w3' in str(e), str(e)[:60])


def test_plain_vs_mxfp4(tmp):
    """Experts stored as MXFP4 or as the same values in BF16 'weight' give equal logits
    (MXFP4 values have <= 2 mantissa bits, so bf16 holds them exactly)."""
    src = os.path.join(tmp, 'mx')
    MT.make_tiny(src, seed=11)
    m1 = R.Model(src)
    dst = os.path.join(tmp, 'plain')
    rng = np.random.default_rng(0)
    W = MT.Writer(rng)
    for name, t in C.open_checkpoint(src).items():
        if name.endswith('.weight_scale'):
            continue
        if name.endswith('.weight_packed'):
            pre = name[:-len('.weight_packed')]
            sc = C.open_checkpoint(src)[pre + '.weight_scale'].as_u8()
            W.add(pre + '.weight', R.mxfp4_decode(t.as_u8(), sc, pre), 'BF16')
        elif t.dtype == 'U8':
            W.add(name, t.as_u8(), 'U8')
        else:
            W.add(name, t.as_f64(), t.dtype)
    os.makedirs(dst, exist_ok=True)
    W.save(dst, n_shards=3)
    shutil.copy(os.path.join(src, 'config.json'), dst)
    m2 = R.Model(dst)
    ids = [5, 9, 1, 77, 200, 3, 3, 3, 18]
    l1 = m1.forward(ids, m1.new_state(), all_logits=True)
    l2 = m2.forward(ids, m2.new_state(), all_logits=True)
    check('experts MXFP4 == same values as BF16 weight (3 shards)', maxabs(l1, l2), 0.0)


# ---------------------------------------------------------------------------- naive oracle

def naive_logits(m, ids):
    """A second forward, written separately from k3ref's math: token by token, head by
    head, expert by expert, with explicit loops and only 1-D numpy vector ops, straight
    from MODEL.md. Shares only the weight binding. Returns logits [T, vocab]."""
    c, W = m.cfg, m.w
    eps = c.rms_eps

    def sig(x):
        return 1.0 / (1.0 + np.exp(-x))

    def rms(x, w):
        return w * x / np.sqrt(np.dot(x, x) / len(x) + eps)

    def situ(g, u):
        return c.situ_b1 * np.tanh(g / c.situ_b1) * sig(g) * c.situ_b2 * np.tanh(u / c.situ_b2)

    def ares(srcs, f):
        sc = [np.dot(s / np.sqrt(np.dot(s, s) / len(s) + eps), f) for s in srcs]
        mx = max(sc)
        e = [np.exp(x - mx) for x in sc]
        tot = sum(e)
        out = np.zeros_like(srcs[0])
        for wi, s in zip(e, srcs):
            out = out + (wi / tot) * s
        return out

    H, D, K = c.kda_heads, c.kda_head_dim, c.conv_k
    hist = {L: {s: [np.zeros(H * D) for _ in range(K - 1)] for s in 'qkv'}
            for L in range(c.n_layers) if not c.is_mla[L]}
    S = {L: [np.zeros((D, D)) for _ in range(H)] for L in hist}
    cache = {L: [] for L in range(c.n_layers) if c.is_mla[L]}       # (k_nope[h], v[h], rope)
    rows = []
    for tok in ids:
        P = W.embed([tok])[0].copy()
        B = []
        for L in range(c.n_layers):
            w = W.layers[L]
            h = ares(B + [P], w['f_attn']) if B else P
            if L % c.attn_res_block == 0:
                B.append(P)
                P = None
            x = rms(h, w['in_norm'])
            if not c.is_mla[L]:
                act = {}
                for sname in 'qkv':
                    a = w[sname] @ x
                    win = hist[L][sname] + [a]                       # oldest .. newest
                    y = np.zeros(H * D)
                    for j in range(K):
                        y = y + w[sname + '_conv'][:, j] * win[j]
                    hist[L][sname] = win[1:]
                    act[sname] = y * sig(y)
                beta = sig(w['b'] @ x)
                zz = w['f_b'] @ (w['f_a'] @ x)
                gate = sig(w['g'] @ x)
                o_all = np.zeros(H * D)
                for hh in range(H):
                    sl = slice(hh * D, (hh + 1) * D)
                    q = act['q'][sl] / np.sqrt(np.dot(act['q'][sl], act['q'][sl]) + 1e-6) / np.sqrt(D)
                    k = act['k'][sl] / np.sqrt(np.dot(act['k'][sl], act['k'][sl]) + 1e-6)
                    v = act['v'][sl]
                    alpha = np.exp(c.gate_lb * sig(np.exp(w['A_log'][hh]) * (zz[sl] + w['dt_bias'][sl])))
                    St = S[L][hh]
                    for i in range(D):
                        St[i, :] = St[i, :] * alpha[i]
                    u = np.zeros(D)
                    for i in range(D):
                        u = u + St[i, :] * k[i]
                    for i in range(D):
                        St[i, :] = St[i, :] + k[i] * beta[hh] * (v - u)
                    o = np.zeros(D)
                    for i in range(D):
                        o = o + St[i, :] * q[i]
                    o_all[sl] = rms(o, w['o_norm']) * gate[sl]
                a_out = w['o'] @ o_all
            else:
                Hm, dn, dr, dv, r = c.n_heads, c.qk_nope, c.qk_rope, c.v_head, c.kv_lora
                q = w['q_b'] @ rms(w['q_a'] @ x, w['q_a_norm'])
                kv_a = w['kv_a'] @ x
                lat = rms(kv_a[:r], w['kv_a_norm'])
                rope = kv_a[r:]
                kv = w['kv_b'] @ lat
                step = dn + dv
                kn = [kv[hh * step:hh * step + dn] for hh in range(Hm)]
                vv = [kv[hh * step + dn:(hh + 1) * step] for hh in range(Hm)]
                cache[L].append((kn, vv, rope))
                o_all = np.zeros(Hm * dv)
                for hh in range(Hm):
                    qh = q[hh * (dn + dr):(hh + 1) * (dn + dr)]
                    sc = [(np.dot(qh[:dn], e[0][hh]) + np.dot(qh[dn:], e[2])) / np.sqrt(dn + dr)
                          for e in cache[L]]
                    mx = max(sc)
                    pe = [np.exp(x_ - mx) for x_ in sc]
                    tot = sum(pe)
                    oh = np.zeros(dv)
                    for pi, e in zip(pe, cache[L]):
                        oh = oh + (pi / tot) * e[1][hh]
                    o_all[hh * dv:(hh + 1) * dv] = oh
                if c.mla_out_gate:
                    o_all = sig(w['g'] @ x) * o_all
                a_out = w['o'] @ o_all
            P = a_out if P is None else P + a_out
            h = ares(B + [P], w['f_mlp'])
            x = rms(h, w['post_norm'])
            if c.is_dense[L]:
                mo = w['mlp_down'] @ situ(w['mlp_gate'] @ x, w['mlp_up'] @ x)
            else:
                s_ = sig(w['router'] @ x)
                biased = list(s_ + w['router_bias'])
                chosen = []
                for _ in range(c.topk):                                # repeated max, lowest index
                    best = None
                    for e in range(c.n_experts):
                        if e not in chosen and (best is None or biased[e] > biased[best]):
                            best = e
                    chosen.append(best)
                wts = [s_[e] for e in chosen]
                if c.moe_renorm and c.topk > 1:
                    tot = sum(wts) + 1e-20
                    wts = [x_ / tot for x_ in wts]
                wts = [x_ * c.routed_scale for x_ in wts]
                z = w['lat_down'] @ x
                u = np.zeros(c.latent)
                for e, we in zip(chosen, wts):
                    u = u + we * (w['w2'][e]() @ situ(w['w1'][e]() @ z, w['w3'][e]() @ z))
                if c.latent_norm:
                    u = rms(u, w['lat_norm'])
                mo = w['lat_up'] @ u
                if c.n_shared > 0:
                    mo = mo + w['sh_down'] @ situ(w['sh_gate'] @ x, w['sh_up'] @ x)
            P = P + mo
        h = ares(B + [P], W.f_out)
        rows.append(W.logits(rms(h, W.norm)[None])[0])
    return np.stack(rows)


# ---------------------------------------------------------------------------- model level

def test_model(d, label, prompt, n_gen):
    m = R.Model(d)
    c = m.cfg
    ref_all = m.forward(prompt, m.new_state(), kda='recurrent', mla='expanded', all_logits=True)
    scale = max(1.0, np.max(np.abs(ref_all)))
    check('%s: naive loop forward (separate code) == k3ref prefill' % label,
          maxabs(naive_logits(m, prompt), ref_all) / scale, 1e-11)
    for kda, chunk, mla in (('chunked', 64, 'absorbed'), ('chunked', 3, 'absorbed'),
                            ('recurrent', 64, 'absorbed'), ('chunked', 5, 'expanded')):
        got = m.forward(prompt, m.new_state(), kda=kda, chunk=chunk, mla=mla, all_logits=True)
        check('%s: prefill %s/%d/%s == recurrent/expanded' % (label, kda, chunk, mla),
              maxabs(got, ref_all) / scale, 1e-12)
    # Row-chunked lm_head (used for big vocabularies) == whole matrix.
    full, keep = m.w.lm_head, R.LM_HEAD_CHUNK
    m.w.lm_head, R.LM_HEAD_CHUNK = None, 7 * c.hidden          # 7-row chunks, ragged tail
    chunked = m.forward(prompt, m.new_state(), kda='recurrent', mla='expanded', all_logits=True)
    m.w.lm_head, R.LM_HEAD_CHUNK = full, keep
    check('%s: row-chunked lm_head == whole lm_head' % label, maxabs(chunked, ref_all) / scale, 1e-14)
    # Token-by-token decode reproduces every prefill position.
    st = m.new_state()
    rows = [m.forward([t], st, kda='recurrent', mla='absorbed') for t in prompt]
    check('%s: per-token decode == prefill logits at every position' % label,
          maxabs(np.stack(rows), ref_all) / scale, 1e-12)
    # Split prefill (carried conv history, KDA state, MLA cache).
    st = m.new_state()
    cut = max(1, len(prompt) // 2 - 1)
    m.forward(prompt[:cut], st)
    tail = m.forward(prompt[cut:], st, all_logits=True)
    check('%s: prefill split at %d == one prefill' % (label, cut),
          maxabs(tail, ref_all[cut:]) / scale, 1e-12)
    # Incremental greedy decode == full recompute oracle.
    ids_i, log_i = C.generate(m, prompt, n_gen)
    ids_f, log_f = C.generate(m, prompt, n_gen, full_recompute=True)
    check('%s: prefill+decode == full recompute, %d steps (abs logits)' % (label, n_gen),
          maxabs(log_i, log_f), 1e-10)
    check_true('%s: greedy ids equal (incremental vs full recompute)' % label, ids_i == ids_f,
               ','.join(map(str, ids_i[:12])) + '...')
    # Teacher forcing along our own ids reproduces the same logits.
    ids_t, log_t = C.generate(m, prompt, n_gen, force=ids_i)
    check('%s: forced along own ids == free run' % label, maxabs(log_t, log_i), 0.0)
    check_true('%s: logits finite, not degenerate' % label,
               bool(np.all(np.isfinite(log_i))) and float(np.std(log_i)) > 1e-3,
               'std %.3f vocab %d layers %d' % (float(np.std(log_i)), c.vocab, c.n_layers))


def main():
    ap = argparse.ArgumentParser(description='self-tests of the float64 reference')
    ap.add_argument('--model', action='append', default=[],
                    help='also run the model-level checks on this model dir (repeatable)')
    ap.add_argument('--gen', type=int, default=24)
    ap.add_argument('--keep', action='store_true', help='keep the temp dir')
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix='k3ref-selftest-')
    try:
        test_pieces()
        test_short_conv()
        test_kda_forms()
        test_config(tmp)
        test_k3_config()
        test_scale255(tmp)
        test_plain_vs_mxfp4(tmp)
        prompt = [1, 17, 42, 9, 250, 3, 3, 88, 130, 7, 64, 201]
        d = MT.make_tiny(os.path.join(tmp, 'tiny'), seed=1234)
        test_model(d, 'make_tiny', prompt, a.gen)
        m = R.Model(d)
        long = [int(x) for x in np.random.default_rng(1).integers(0, m.cfg.vocab, 150)]
        a1 = m.forward(long, m.new_state(), kda='chunked', chunk=64, all_logits=True)
        a2 = m.forward(long, m.new_state(), kda='recurrent', mla='expanded', all_logits=True)
        check('make_tiny: 150-token prefill, chunk 64 (3 chunks) == recurrent/expanded',
              maxabs(a1, a2) / np.max(np.abs(a2)), 1e-12)
        d = MT.make_tiny(os.path.join(tmp, 'tiny9'), seed=99, layers=9, block=2, plain_experts=True)
        test_model(d, 'make_tiny 9L/block2/bf16 experts', prompt[:7], a.gen)
        d = MT.make_tiny(os.path.join(tmp, 'seed13'), seed=13, shape='seed13')
        test_model(d, 'make_tiny seed13 shape', prompt[:9], a.gen)
        d = MT.make_tiny(os.path.join(tmp, 'variant'), seed=5, shape='variant')
        test_model(d, 'make_tiny variant (top-1, conv 1, no gates/norm)', prompt[:6], a.gen)
        d = MT.make_tiny(os.path.join(tmp, 'ties'), seed=5, ties=True)
        m = R.Model(d)
        ids_t, _ = C.generate(m, prompt, a.gen)
        check_true('ties model: every greedy pick is the lower (even) id of a tied pair',
                   all(i % 2 == 0 for i in ids_t), ','.join(map(str, ids_t[:10])) + '...')
        test_model(d, 'make_tiny ties', prompt, 8)
        for md in a.model:
            vocab = R.load_config(md).vocab
            test_model(md, os.path.basename(md.rstrip('/')), [x % vocab for x in prompt], a.gen)
    finally:
        if a.keep:
            print('kept', tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print('%d failure(s)' % len(FAILS) if FAILS else 'all self-tests passed')
    return 1 if FAILS else 0


if __name__ == '__main__':
    sys.exit(main())
