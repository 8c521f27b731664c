#!/usr/bin/python3
"""kl_selftest.py: internal equivalences of the Kimi Linear reference (klref.py) and
checks of the independent checkpoint writer (make_kimi_linear.py).

  /usr/bin/python3 tests/reference/kl_selftest.py [--model DIR ...]

Without --model it writes its own tiny models into a temp dir. Every check prints
its measured value and bound; exit 1 on failure. Run by `make reference-selftest`.
"""

import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import klref as R               # noqa: E402
import make_kimi_linear as MK   # noqa: E402
from refcommon import read_safetensors  # noqa: E402
from refcheck import (check, check_true, maxabs, rel, check_script,  # noqa: E402
                      selftest_main)


def first_layer(m, kind):
    return next(L for L in range(m.cfg.n_layers) if m.w.layers[L]['kind'] == kind)


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

def test_pieces():
    x = np.array([-40.0, -1.0, 0.0, 1.0, 19.9, 20.0, 20.1, 50.0])
    want = [math.log1p(math.exp(v)) if v <= 20 else v for v in x]
    check('softplus = log1p(exp), identity above 20', maxabs(R.softplus(x), want), 1e-15)
    check('softplus(20.1) is exactly 20.1 (threshold)', abs(R.softplus(np.array([20.1]))[0] - 20.1), 0)
    v = np.array([[3.0, 4.0]])
    check('l2 norm: eps 1e-6 inside sqrt of the sum', maxabs(R.l2norm(v), v / math.sqrt(25 + 1e-6)), 1e-16)
    # Router: selection by biased score, weights unbiased or biased.
    cfg = R.Config()
    cfg.topk, cfg.moe_renorm, cfg.routed_scale = 2, True, 2.0
    logits = np.array([[2.0, 1.0, 0.0, -1.0]])
    w = {'router': np.eye(4), 'router_bias': np.array([0.0, 0.0, 0.3, 0.0])}
    s = 1 / (1 + np.exp(-logits[0]))
    idx, wu = R.route(cfg, w, logits, 'unbiased')
    _, wh = R.route(cfg, w, logits, 'hf')
    check_true('bias moves selection (expert 2 beats expert 1)', list(idx[0]) == [0, 2], str(idx[0]))
    check('unbiased weights = s / sum(s) * rho', maxabs(wu[0], 2 * s[[0, 2]] / (s[0] + s[2] + 1e-20)), 1e-15)
    b = s + w['router_bias']
    check('hf weights = (s + bias) / sum * rho', maxabs(wh[0], 2 * b[[0, 2]] / (b[0] + b[2] + 1e-20)), 1e-15)
    check_true('router conventions differ where the bias is selected', maxabs(wu, wh) > 1e-3)
    w0 = dict(w, router_bias=np.zeros(4))
    check('router conventions agree with a zero bias',
          maxabs(R.route(cfg, w0, logits, 'unbiased')[1], R.route(cfg, w0, logits, 'hf')[1]), 0)
    tie = {'router': np.eye(4), 'router_bias': np.array([0.0, 0.1, 0.0, 0.1])}
    idx, _ = R.route(cfg, tie, np.array([[1.0, 0.9, 1.0, 0.9]]), 'unbiased')
    check_true('top-k ties go to the lowest expert id', list(idx[0]) == [1, 3],
               str(idx[0]))
    cfg.topk = 1
    _, w1 = R.route(cfg, w, logits, 'unbiased')
    check('top-1 weight is not renormalised', abs(w1[0, 0] - 2 * s[0]), 1e-15)
    check_true('greedy argmax ties to the lowest id', R.argmax_first(np.array([1.0, 3.0, 3.0])) == 1)


# ---------------------------------------------------------------------------
# Config and writer
# ---------------------------------------------------------------------------

def test_config(tmp):
    released = os.path.join('/work/shared/spec/family-configs', 'kimi-linear-48b-a3b-instruct.config.json')
    obj = json.loads(json.dumps(MK.RELEASED))
    c = R.parse_config(obj)
    mla = [L for L in range(c.n_layers) if c.is_mla[L]]
    check_true('released config: MLA layers (0-based) 3,7,11,15,19,23,26', mla == [3, 7, 11, 15, 19, 23, 26],
               str(mla))
    check_true('released config: layer 0 dense, 1..26 MoE', c.is_dense == [True] + [False] * 26)
    check_true('kv_a_layernorm eps defaults to 1e-6 (modeling_kimi.py)', c.kv_eps == 1e-6)
    if os.path.exists(released):
        with open(released) as f:
            check_true('writer template == the released config.json', json.load(f) == MK.RELEASED)
    b0 = json.loads(json.dumps(obj))
    lin = b0['linear_attn_config']
    lin['kda_layer_index_base'] = 0
    lin['kda_layers'] = [x - 1 for x in lin['kda_layers']]
    lin['full_attn_layers'] = [x - 1 for x in lin['full_attn_layers']]
    check_true('kda_layer_index_base 0 gives the same schedule', R.parse_config(b0).is_mla == c.is_mla)

    def refused(mut, words):
        o = json.loads(json.dumps(obj))
        mut(o)
        try:
            R.parse_config(o)
        except R.RefError as e:
            return all(w in str(e) for w in words), str(e)
        return False, 'accepted'
    for label, mut, words in [
        ('missing keys reported together', lambda o: (o.pop('hidden_size'), o.pop('kv_lora_rank')),
         ['hidden_size', 'kv_lora_rank']),
        ('layer in both lists refused', lambda o: o['linear_attn_config']['kda_layers'].append(4),
         ['both']),
        ('layer in neither list refused', lambda o: o['linear_attn_config']['kda_layers'].remove(1),
         ['neither']),
        ('0 in a 1-based list refused', lambda o: o['linear_attn_config']['kda_layers'].__setitem__(0, 0),
         ['outside']),
        ('q_lora_rank set refused', lambda o: o.__setitem__('q_lora_rank', 64), ['q_lora_rank']),
        ('mla_use_nope false refused', lambda o: o.__setitem__('mla_use_nope', False), ['mla_use_nope']),
        ('other model_type refused', lambda o: o.__setitem__('model_type', 'kimi_k3'), ['model_type']),
    ]:
        ok, msg = refused(mut, words)
        check_true('config: ' + label, ok, msg[:60])


def test_writer(tmp):
    d = MK.make_kimi_linear(os.path.join(tmp, 'w'), seed=3, layers=5, shards=4)
    f = MK.make_kimi_linear(os.path.join(tmp, 'wf'), seed=3, layers=5, shards=4, vec_dtype='f32')
    with open(os.path.join(d, 'config.json')) as fh:
        cfg = json.load(fh)
    check_true('config keys == released keys', set(cfg) == set(MK.RELEASED)
               and set(cfg['linear_attn_config']) == set(MK.RELEASED['linear_attn_config']))
    check_true('schedule KKKMM (MLA every 4th and last), 1-based lists',
               cfg['linear_attn_config']['full_attn_layers'] == [4, 5]
               and cfg['linear_attn_config']['kda_layers'] == [1, 2, 3])
    names = sorted(x for x in os.listdir(d) if x.endswith('.safetensors'))
    check_true('shards model-0000N-of-00004', names == ['model-%05d-of-00004.safetensors' % i
                                                       for i in range(1, 5)], str(names))
    with open(os.path.join(d, 'model.safetensors.index.json')) as fh:
        idx = json.load(fh)
    tens = {}
    for n in names:
        tens.update(read_safetensors(os.path.join(d, n)))
    total = sum(t.raw.size for t in tens.values())
    check_true('index total_size and weight_map match the shards',
               idx['metadata']['total_size'] == total and set(idx['weight_map']) == set(tens))
    check_true('embed in the first shard, lm_head in the last',
               idx['weight_map']['model.embed_tokens.weight'] == names[0]
               and idx['weight_map']['lm_head.weight'] == names[-1])

    def dt(ts, n):
        return ts[n].dtype
    p = 'model.layers.1.'
    want = {p + 'self_attn.A_log': ('F32', (1, 1, 4, 1)), p + 'self_attn.dt_bias': ('F32', (64,)),
            p + 'self_attn.q_conv1d.weight': ('BF16', (64, 1, 4)),
            p + 'self_attn.o_norm.weight': ('BF16', (16,)),
            p + 'block_sparse_moe.gate.e_score_correction_bias': ('BF16', (8,)),
            p + 'block_sparse_moe.experts.7.w2.weight': ('BF16', (64, 32)),
            'model.layers.3.self_attn.kv_a_layernorm.weight': ('BF16', (32,)),
            'model.norm.weight': ('BF16', (64,))}
    bad = [n for n, (t, s) in want.items() if (tens[n].dtype, tuple(tens[n].shape)) != (t, s)]
    check_true('released dtypes/shapes (A_log, dt_bias F32; rest BF16)', not bad, str(bad[:2]))
    ftens = {}
    for n in names:
        ftens.update(read_safetensors(os.path.join(f, n)))
    check_true('--vec-dtype f32: bias and norms F32, A_log/dt_bias F32, matrices BF16',
               dt(ftens, p + 'block_sparse_moe.gate.e_score_correction_bias') == 'F32'
               and dt(ftens, 'model.norm.weight') == 'F32' and dt(ftens, p + 'self_attn.o_norm.weight') == 'F32'
               and dt(ftens, p + 'self_attn.A_log') == 'F32' and dt(ftens, p + 'self_attn.q_proj.weight') == 'BF16')
    return d, f


# ---------------------------------------------------------------------------
# Layer forms
# ---------------------------------------------------------------------------

def random_kda_state(rng, c):
    P = c.kda_heads * c.kda_head_dim
    return {'conv_q': rng.standard_normal((c.conv_k - 1, P)),
            'conv_k': rng.standard_normal((c.conv_k - 1, P)),
            'conv_v': rng.standard_normal((c.conv_k - 1, P)),
            'S': rng.standard_normal((c.kda_heads, c.kda_head_dim, c.kda_head_dim)) * 0.3}


def copy_state(st):
    return {k: np.array(v) for k, v in st.items()}


def test_kda_forms(m, label):
    c = m.cfg
    w = m.w.layers[first_layer(m, 'kda')]
    rng = np.random.default_rng(5)
    worst_o = worst_s = worst_split = 0.0
    for T in (1, 2, 5, 17, 63, 64, 65, 130):
        x = rng.standard_normal((T, c.hidden))
        st0 = random_kda_state(rng, c)
        s_r = copy_state(st0)
        o_r = R.kda_layer(c, w, x, s_r, 'recurrent')
        for chunk in (64, 16, 5):
            s_c = copy_state(st0)
            o_c = R.kda_layer(c, w, x, s_c, 'chunked', chunk)
            worst_o = max(worst_o, rel(o_c, o_r))
            worst_s = max(worst_s, rel(s_c['S'], s_r['S']))
        if T > 2:
            s_p = copy_state(st0)
            a = R.kda_layer(c, w, x[:T // 2], s_p, 'chunked', 7)
            b = R.kda_layer(c, w, x[T // 2:], s_p, 'chunked', 7)
            worst_split = max(worst_split, rel(np.concatenate([a, b]), o_r),
                              rel(s_p['conv_k'], s_r['conv_k']))
    check(label + ': KDA layer chunked (64/16/5) == recurrent, outputs', worst_o, 1e-12)
    check(label + ': KDA layer chunked == recurrent, final S', worst_s, 1e-12)
    check(label + ': KDA split prefill (carried conv + S) == one pass', worst_split, 1e-12)


def naive_kda_gate(c, w, x):
    """Scalar loops of family-math 4.3 for one token."""
    H, D = c.kda_heads, c.kda_head_dim
    lo = [sum(w['f_a'][r, i] * x[i] for i in range(len(x))) for r in range(w['f_a'].shape[0])]
    g = np.zeros((H, D))
    for h in range(H):
        for ch in range(D):
            j = h * D + ch
            u = sum(w['f_b'][j, r] * lo[r] for r in range(len(lo))) + w['dt_bias'][j]
            sp = u if u > 20 else math.log1p(math.exp(u))
            g[h, ch] = -math.exp(w['A_log'][h]) * sp
    beta = [1 / (1 + math.exp(-sum(w['b'][h, i] * x[i] for i in range(len(x))))) for h in range(H)]
    return g, np.array(beta)


def test_gate(m, label):
    c = m.cfg
    w = m.w.layers[first_layer(m, 'kda')]
    x = np.random.default_rng(9).standard_normal((1, c.hidden)) * 3
    g, beta = R.kda_gate(c, w, x)
    gn, bn = naive_kda_gate(c, w, x[0])
    check(label + ': KDA gate == scalar -exp(A_log)*softplus(f_b f_a x + dt_bias)',
          max(maxabs(g[0], gn), maxabs(beta[0], bn)), 1e-13)


def test_mla_forms(m, label):
    c = m.cfg
    w = m.w.layers[first_layer(m, 'mla')]
    rng = np.random.default_rng(6)
    worst = 0.0
    for n0, T in ((0, 1), (0, 9), (5, 1), (7, 6)):
        st = {'lat': rng.standard_normal((n0, c.kv_lora)), 'rope': rng.standard_normal((n0, c.qk_rope))}
        x = rng.standard_normal((T, c.hidden))
        a = R.mla_layer(c, w, x, copy_state(st), 'absorbed')
        b = R.mla_layer(c, w, x, copy_state(st), 'expanded')
        worst = max(worst, rel(a, b))
    check(label + ': MLA absorbed == expanded (empty and filled cache)', worst, 1e-12)


# ---------------------------------------------------------------------------
# Naive model forward, written separately from family-math 4-7: token by token,
# head by head, expert by expert; shares only the weight binding with klref.
# ---------------------------------------------------------------------------

def naive_logits(m, ids, router='unbiased'):
    c, W = m.cfg, m.w

    def sig(v):
        return 1.0 / (1.0 + np.exp(-v))

    def rms(v, wt, eps):
        return wt * v / math.sqrt(float(np.dot(v, v)) / len(v) + eps)

    def mlp(v, g, u, dn):
        a = g @ v
        return dn @ ((a * sig(a)) * (u @ v))
    H, D, Wc = c.kda_heads, c.kda_head_dim, c.conv_k
    hs = [W.embed([t])[0] for t in ids]
    out = []
    for L in range(c.n_layers):
        w = W.layers[L]
        xs = [rms(h, w['in_norm'], c.rms_eps) for h in hs]
        att = []
        if w['kind'] == 'kda':
            pre = {s: [w[s] @ x for x in xs] for s in 'qkv'}
            S = [np.zeros((D, D)) for _ in range(H)]
            for t, x in enumerate(xs):
                cur = {}
                for s in 'qkv':
                    z = np.zeros(H * D)
                    for j in range(Wc):                      # tap Wc-1 = current token
                        tau = t - (Wc - 1) + j
                        if tau >= 0:
                            z += w[s + '_conv'][:, j] * pre[s][tau]
                    cur[s] = z * sig(z)
                f = w['f_b'] @ (w['f_a'] @ x)
                gate = sig(w['g_b'] @ (w['g_a'] @ x))
                beta = sig(w['b'] @ x)
                y = np.zeros(H * D)
                for h in range(H):
                    sl = slice(h * D, (h + 1) * D)
                    q = cur['q'][sl] / math.sqrt(float(np.dot(cur['q'][sl], cur['q'][sl])) + 1e-6) / math.sqrt(D)
                    k = cur['k'][sl] / math.sqrt(float(np.dot(cur['k'][sl], cur['k'][sl])) + 1e-6)
                    v = cur['v'][sl]
                    u = f[sl] + w['dt_bias'][sl]
                    sp = np.array([ui if ui > 20 else math.log1p(math.exp(ui)) for ui in u])
                    alpha = np.exp(-math.exp(w['A_log'][h]) * sp)
                    Sd = alpha[:, None] * S[h]
                    S[h] = Sd + beta[h] * np.outer(k, v - Sd.T @ k)
                    o = S[h].T @ q
                    y[sl] = rms(o, w['o_norm'], c.rms_eps) * gate[sl]
                att.append(w['o'] @ y)
        else:
            dn, dr, dv, r = c.qk_nope, c.qk_rope, c.v_head, c.kv_lora
            K, V = [], []
            for t, x in enumerate(xs):
                kv = w['kv_a'] @ x
                lat = rms(kv[:r], w['kv_a_norm'], c.kv_eps)
                kvb = w['kv_b'] @ lat
                K.append([np.concatenate([kvb[h * (dn + dv):h * (dn + dv) + dn], kv[r:]]) for h in range(c.n_heads)])
                V.append([kvb[h * (dn + dv) + dn:(h + 1) * (dn + dv)] for h in range(c.n_heads)])
                q = w['q'] @ x
                o = []
                for h in range(c.n_heads):
                    qh = q[h * (dn + dr):(h + 1) * (dn + dr)]
                    sc = np.array([np.dot(qh, K[tau][h]) / math.sqrt(dn + dr) for tau in range(t + 1)])
                    p = np.exp(sc - sc.max())
                    p /= p.sum()
                    o.append(sum(p[tau] * V[tau][h] for tau in range(t + 1)))
                att.append(w['o'] @ np.concatenate(o))
        hs = [h + a for h, a in zip(hs, att)]
        new = []
        for h in hs:
            x = rms(h, w['post_norm'], c.rms_eps)
            if w['dense']:
                y = mlp(x, w['mlp_gate'], w['mlp_up'], w['mlp_down'])
            else:
                s = sig(w['router'] @ x)
                biased = s + w['router_bias']
                chosen = []
                for _ in range(c.topk):                      # repeated max, lowest id on ties
                    best = None
                    for e in range(c.n_experts):
                        if e not in chosen and (best is None or biased[e] > biased[best]):
                            best = e
                    chosen.append(best)
                wt = np.array([(biased if router == 'hf' else s)[e] for e in chosen])
                if c.moe_renorm and c.topk > 1:
                    wt = wt / (wt.sum() + 1e-20)
                wt = wt * c.routed_scale
                y = np.zeros(c.hidden)
                for e, we in zip(chosen, wt):
                    y += we * mlp(x, w['w1'][e](), w['w3'][e](), w['w2'][e]())
                if c.n_shared:
                    y += mlp(x, w['sh_gate'], w['sh_up'], w['sh_down'])
            new.append(h + y)
        hs = new
    for h in hs:
        out.append(W.logits(rms(h, W.norm, c.rms_eps)[None, :])[0])
    return np.array(out)


# ---------------------------------------------------------------------------
# Model level
# ---------------------------------------------------------------------------

def test_model(d, label, prompt, n_gen):
    for router in R.ROUTERS:
        m = R.Model(d, router=router)
        v = m.cfg.vocab
        p = [t % v for t in prompt]
        lab = '%s [%s]' % (label, router)
        full = m.forward(p, m.new_state(), kda='recurrent', mla='expanded', all_logits=True)
        if router == 'unbiased':
            test_kda_forms(m, label)
            test_gate(m, label)
            test_mla_forms(m, label)
        check(lab + ': naive loop forward == klref prefill (all positions)',
              rel(naive_logits(m, p, router), full), 1e-11)
        worst = 0.0
        for kda, chunk in (('chunked', 64), ('chunked', 3), ('chunked', 5)):
            for mla in ('absorbed', 'expanded'):
                worst = max(worst, rel(m.forward(p, m.new_state(), kda=kda, chunk=chunk, mla=mla,
                                                 all_logits=True), full))
        check(lab + ': prefill chunked(64,3,5) x absorbed/expanded', worst, 1e-12)
        st = m.new_state()
        tok = np.stack([m.forward([t], st, kda='recurrent') for t in p])
        check(lab + ': token-by-token decode == prefill logits', rel(tok, full), 1e-12)
        ids_i, lg_i = R.generate(m, p, n_gen)
        ids_f, lg_f = R.generate(m, p, n_gen, full_recompute=True)
        check(lab + ': %d-step incremental vs full recompute (abs)' % n_gen, maxabs(lg_i, lg_f), 1e-10)
        check_true(lab + ': identical greedy ids', ids_i == ids_f)
        check_true(lab + ': greedy text not degenerate (>= 4 distinct ids)', len(set(ids_i)) >= 4,
                   str(ids_i[:12]))
        ids_t, lg_t = R.generate(m, p, n_gen, force=ids_i)
        check(lab + ': teacher forcing along own ids', maxabs(lg_t, lg_i), 0)


def test_router_models(d, dz):
    """Released-style biases: the two conventions give different text; all-zero
    biases: identical logits."""
    p = [1, 17, 42, 9, 250, 3, 88, 130]
    a = R.generate(R.Model(d, 'unbiased'), p, 12)
    b = R.generate(R.Model(d, 'hf'), p, 12)
    check_true('router hf vs unbiased: different logits and ids where the bias matters',
               rel(b[1], a[1]) > 1e-3 and a[0] != b[0], 'rel %.2e' % rel(b[1], a[1]))
    a = R.generate(R.Model(dz, 'unbiased'), p, 6)
    b = R.generate(R.Model(dz, 'hf'), p, 6)
    check('router hf == unbiased with a zero bias', maxabs(a[1], b[1]), 0)


def zero_biases(src, dst):
    """Copy of src with every e_score_correction_bias overwritten by zeros in place."""
    shutil.copytree(src, dst)
    for fn in os.listdir(dst):
        if not fn.endswith('.safetensors'):
            continue
        with open(os.path.join(dst, fn), 'r+b') as f:
            n = int.from_bytes(f.read(8), 'little')
            header = json.loads(f.read(n).decode())
            for name, info in header.items():
                if name.endswith('e_score_correction_bias'):
                    b, e = info['data_offsets']
                    f.seek(8 + n + b)
                    f.write(b'\0' * (e - b))


def test_eps_and_dtypes(d, f):
    p = [3, 1, 4, 1, 5, 9, 2, 6]
    a = R.Model(d).forward(p, R.Model(d).new_state())
    m5 = R.Model(d, kv_eps='config')
    b = m5.forward(p, m5.new_state())
    m6 = R.Model(d, kv_eps=1e-6)
    c6 = m6.forward(p, m6.new_state())
    check_true('--kv-norm-eps config (1e-5) changes the logits; 1e-6 is the default',
               maxabs(a, b) > 0 and maxabs(a, c6) == 0, '%.2e' % maxabs(a, b))
    mf = R.Model(f)
    c = mf.forward(p, mf.new_state())
    check_true('f32-vector checkpoint loads and runs (same seed, close logits)',
               bool(np.all(np.isfinite(c))) and rel(c, a) < 0.05, 'rel %.2e' % rel(c, a))


FAKE_ENGINE = """#!/usr/bin/python3
# Stand-in for `strata` in kl_selftest: answers `run --help` (with --router unless
# FAKE_NO_ROUTER) and `run MODEL ...` with klref itself; FAKE_PERTURB adds to every
# 7th logit, FAKE_ROUTER overrides the routing the engine was asked for.
import os, sys
sys.path.insert(0, %r)
import klref
from refcheck import fake_opt, fake_run
a = sys.argv[1:]
if a[:2] == ['run', '--help']:
    print('' if os.environ.get('FAKE_NO_ROUTER') else '  --router unbiased|hf')
    sys.exit(0)
a = a[1:]
router = os.environ.get('FAKE_ROUTER') or fake_opt(a, '--router', 'unbiased')
sys.exit(fake_run(klref.main, a, ['--router', router]))
"""


def test_kl_check(tmp, d):
    """kl_check.sh against a stand-in engine: PASS, FAIL on a logit error or a
    different router, SKIP (77) when the engine has no --router."""
    check_script(tmp, FAKE_ENGINE, 'kl_check.sh', d, [
        ('PASS when engine == reference', {}, ['--gen', '6'], 0, 'PASS'),
        ('PASS with --router hf and a long prompt', {}, ['--router', 'hf', '--long', '--gen', '3'], 0, 'PASS'),
        ('FAIL on a 1e-2 logit error', {'FAKE_PERTURB': '0.01'}, ['--gen', '4'], 1, 'FAIL'),
        ('FAIL when the engine routes the other way', {'FAKE_ROUTER': 'hf'}, ['--gen', '6'], 1, 'ids=differ'),
        ('SKIP (77) without --router in run --help', {'FAKE_NO_ROUTER': '1'}, [], 77, 'SKIP')])


def run_all(tmp, models):
    test_pieces()
    test_config(tmp)
    d, f = test_writer(tmp)
    prompt = [1, 17, 42, 9, 250, 3, 88, 130, 7, 300, 11]
    test_model(d, 'kl-5l', prompt, 16)
    d2 = MK.make_kimi_linear(os.path.join(tmp, 'b'), seed=11, layers=6, schedule='KMKKMM',
                             dense_layers=2, conv=2, topk=3, experts=6, shared=0,
                             no_renorm=True, shards=2, index_base=0, vec_dtype='f32')
    test_model(d2, 'kl-6l-variant', prompt, 10)
    zero_biases(d, os.path.join(tmp, 'z'))
    test_router_models(d, os.path.join(tmp, 'z'))
    test_eps_and_dtypes(d, f)
    test_kl_check(tmp, d)
    for md in models:
        test_model(md, os.path.basename(md.rstrip('/')), prompt, 8)


def main():
    return selftest_main('kl_selftest', 'klref-selftest-', 'self-tests of the Kimi Linear reference', run_all)


if __name__ == '__main__':
    sys.exit(main())
