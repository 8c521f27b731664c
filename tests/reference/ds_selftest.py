#!/usr/bin/python3
"""ds_selftest.py: internal equivalences of the DeepSeek-V3 / Kimi K2 reference
(dsref.py) and checks of the independent checkpoint writer (make_deepseek.py).

  /usr/bin/python3 tests/reference/ds_selftest.py [--model DIR ...]

Without --model it writes its own tiny models into a temp dir. Every check prints
its measured value and bound; exit 1 on failure. Run by `make reference-selftest`.
"""

import json
import math
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dsref as R               # noqa: E402
import make_deepseek as MK      # noqa: E402
from refcommon import read_safetensors  # noqa: E402
from refcheck import (check, check_true, maxabs, rel, raises,  # noqa: E402
                      check_script, selftest_main)


# ---------------------------------------------------------------------------
# Weight formats
# ---------------------------------------------------------------------------

def test_fp8():
    T = R.FP8_E4M3FN
    hand = {0x38: 1.0, 0x40: 2.0, 0x3C: 1.5, 0x01: 2.0 ** -9, 0x07: 7 * 2.0 ** -9,
            0x08: 2.0 ** -6, 0x7E: 448.0, 0xFE: -448.0, 0x80: -0.0, 0xB8: -1.0, 0x30: 0.5}
    check('FP8 e4m3fn hand values (1, 2, 1.5, subnormals, 448, -0, -1, 0.5)',
          max(abs(T[k] - v) for k, v in hand.items()), 0)
    check_true('FP8 0x7F and 0xFF are NaN, no other code is',
               np.isnan(T[0x7F]) and np.isnan(T[0xFF]) and int(np.isnan(T).sum()) == 2)
    # Every finite code survives the writer's encoder (written separately).
    codes = np.array([c for c in range(256) if not np.isnan(T[c]) and c != 0x80], dtype=np.uint8)
    check('writer e4m3 encoder round-trips every finite code', maxabs(MK.to_e4m3(T[codes]), codes), 0)
    # Block scales, edge blocks, multiplied: all codes 1.0, distinct scale per block.
    M, N = 130, 260
    sc = np.array([[2.0, 3.0, 5.0], [7.0, 11.0, 13.0]])
    W = R.fp8_decode(np.full((M, N), 0x38, np.uint8), sc, 't')
    want = np.empty((M, N))
    for m in range(M):
        for n in range(N):
            want[m, n] = sc[m // 128][n // 128]
    check('FP8 [130, 260] scale grid [2, 3]: W = code * scale[m//128, n//128]', maxabs(W, want), 0)
    ok, msg = raises(lambda: R.fp8_decode(np.full((M, N), 0x38, np.uint8), sc[:, :2], 'x.weight'),
                     'x.weight_scale_inv', '[2, 3]')
    check_true('FP8 wrong scale grid refused naming the tensor', ok, msg)
    bad = np.full((4, 4), 0x38, np.uint8)
    bad[2, 3] = 0x7F
    ok, msg = raises(lambda: R.fp8_decode(bad, np.ones((1, 1)), 'y.weight'), 'y.weight', 'NaN')
    check_true('FP8 NaN code refused naming the tensor', ok, msg)


def pack_int4_slow(q):
    """q int [M, N] in -8..7 -> int32 words, one element at a time (independent of
    both the writer's and the reference's vector code)."""
    M, N = q.shape
    out = np.zeros((M, -(-N // 8)), dtype=np.int64)
    for m in range(M):
        for n in range(N):
            out[m, n // 8] |= (int(q[m, n]) + 8) << (4 * (n % 8))
    return out.astype(np.uint32).view(np.int32)


def test_int4():
    w = np.array([[0x76543210, np.uint32(0xFEDCBA98).view(np.int32)]], dtype=np.int64).astype(np.int32)
    d = R.int4_decode(w, np.ones((1, 1)), (1, 16))
    check('INT4 low nibble first, q = nibble - 8 (0x76543210, 0xFEDCBA98)',
          maxabs(d[0], np.arange(-8, 8)), 0)
    rng = np.random.default_rng(5)
    q = rng.integers(-8, 8, size=(6, 96))
    sbits = MK.to_bf16_bits(rng.uniform(0.01, 0.2, size=(6, 3)))
    s = R.bf16_bits_to_f64(sbits)
    got = R.int4_decode(pack_int4_slow(q), s, (6, 96))
    want = np.array([[q[m, n] * s[m, n // 32] for n in range(96)] for m in range(6)])
    check('INT4 random q packed element by element: W = q * scale[n // 32]', maxabs(got, want), 0)
    words, sb = MK.quant_int4(want, rng)
    back = R.int4_decode(words, R.bf16_bits_to_f64(sb), (6, 96))
    check_true('writer INT4 packing decodes to values on its own scale grid',
               bool(np.all(np.abs(back) <= 8 * R.bf16_bits_to_f64(sb).max() + 1e-12)) and
               rel(back, want) < 0.2, 'rel %.2e' % rel(back, want))
    # compressed-tensors dequantize rounds q*scale to bf16: 7 * (1 + 2^-7) = 7.0546875
    # has 10 significant bits; bf16 keeps 8 -> 7.0625 (round up).
    w7 = pack_int4_slow(np.full((1, 8), 7))
    sc = np.array([[1.0 + 2.0 ** -7]])
    check('INT4 --int4 bf16: 7 * 1.0078125 -> 7.0625; exact mode 7.0546875',
          abs(R.int4_decode(w7, sc, (1, 8), bf16_round=True)[0, 0] - 7.0625)
          + abs(R.int4_decode(w7, sc, (1, 8))[0, 0] - 7.0546875), 0)


# ---------------------------------------------------------------------------
# Router, RoPE, config
# ---------------------------------------------------------------------------

def route_case(s_logit, bias, G, tg, k, mask='inf', norm=True, rho=1.0):
    c = R.Config()
    E = len(bias)
    c.n_experts, c.n_group, c.topk_group, c.topk, c.norm_topk, c.routed_scale = E, G, tg, k, norm, rho
    w = {'router': np.eye(E), 'router_bias': np.asarray(bias, float)}
    return R.route(c, w, np.asarray(s_logit, float)[None, :], mask)


def test_router():
    logit = lambda p: math.log(p / (1 - p))     # noqa: E731
    # 8 experts, 4 groups of 2. Group 0 holds the single best expert (0.95) but a
    # weak partner (0.05): sum 1.00. Groups 1 (0.6+0.6) and 2 (0.55+0.5) win.
    s = [0.95, 0.05, 0.6, 0.6, 0.55, 0.5, 0.3, 0.2]
    idx, wts = route_case([logit(p) for p in s], [0] * 8, 4, 2, 3)
    check_true('group score = sum of top-2: the best single expert\'s group is dropped',
               idx[0].tolist() == [2, 3, 4], str(idx[0].tolist()))
    check('weights = s / (sum + 1e-20) of the chosen', maxabs(wts[0], np.array([0.6, 0.6, 0.55]) / 1.75), 1e-15)
    idx, _ = route_case([logit(p) for p in s], [0] * 8, 4, 4, 3)
    check_true('topk_group == n_group: plain top-k', idx[0].tolist() == [0, 2, 3], str(idx[0].tolist()))
    # Bias for selection only: a bias lifts expert 7 into the top-3; its weight stays s.
    b = [0, 0, 0, 0, 0, 0, 0, 0.5]
    idx, wts = route_case([logit(p) for p in s], b, 1, 1, 3, norm=False, rho=2.0)
    check_true('bias selects, weight = unbiased s * rho', idx[0].tolist() == [0, 7, 2]
               and maxabs(wts[0], 2 * np.array([0.95, 0.2, 0.6])) < 1e-15, str(idx[0].tolist()))
    # Ties: equal group scores keep the lower group, equal experts the lower id.
    idx, _ = route_case([0.0] * 8, [0] * 8, 4, 2, 3)
    check_true('ties: lower groups, then lower expert ids', idx[0].tolist() == [0, 1, 2], str(idx[0].tolist()))
    # Negative biased scores in kept groups: -inf and 0.0 masking differ.
    b = [-1, -1, -1, -1, -0.9, -0.9, -2, -2]
    i_inf, _ = route_case([0.0] * 8, b, 4, 1, 2, 'inf')
    i_zero, _ = route_case([0.0] * 8, b, 4, 1, 2, 'zero')
    check_true('--group-mask zero (HF) differs from -inf only with negative kept scores',
               i_inf[0].tolist() == [4, 5] and i_zero[0].tolist() == [0, 1],
               '%s vs %s' % (i_inf[0].tolist(), i_zero[0].tolist()))


def cfg_with(**kw):
    c = R.Config()
    c.qk_rope, c.qk_nope, c.rope_theta, c.yarn = 64, 128, 1e4, None
    for k, v in kw.items():
        setattr(c, k, v)
    return c


def test_rope():
    # family-math 8.2: low/high and softmax scales of the real configs.
    for label, theta, f, bf, want_lh, want_s in [
            ('DeepSeek-V3', 1e4, 40.0, 32.0, (10, 23), 0.1352338),
            ('K2-Instruct', 5e4, 32.0, 1.0, (19, 20), 0.1308608),
            ('K2.5', 5e4, 64.0, 32.0, (8, 20), 0.1446796)]:
        y = {'factor': f, 'original_max_position_embeddings': 4096.0, 'beta_fast': bf,
             'beta_slow': 1.0, 'mscale': 1.0, 'mscale_all_dim': 1.0}
        c = cfg_with(rope_theta=theta, yarn=y)
        lh = R.yarn_low_high(64, theta, f, 4096, bf, 1.0)
        check_true('%s YaRN correction range %s' % (label, want_lh), lh == want_lh, str(lh))
        check('%s softmax scale 192^-1/2 m^2 = %.7f' % (label, want_s),
              abs(R.softmax_scale(c) - want_s), 5e-8)
        # Frequencies against a direct per-element formula.
        inv, att = R.rope_inv_freq(c)
        lo, hi = want_lh
        if lo == hi:
            hi += 0.001
        direct = []
        for i in range(32):
            base = theta ** (-(2.0 * i) / 64)
            r = min(max((i - lo) / (hi - lo), 0.0), 1.0)
            direct.append(base * (1 - r) + base / f * r)
        check('%s inv_freq vs direct formula (i <= low unscaled, >= high / f)' % label,
              rel(inv, np.array(direct)), 1e-15)
        check_true('%s cos/sin factor mscale/mscale_all_dim = 1' % label, att == 1.0)
    y = {'factor': 40.0, 'original_max_position_embeddings': 4096.0, 'beta_fast': 32.0,
         'beta_slow': 1.0, 'mscale': 0.707, 'mscale_all_dim': 0.0}
    c = cfg_with(yarn=y)
    _, att = R.rope_inv_freq(c)
    check('mscale_all_dim 0: no softmax m^2, cos/sin times 0.1*0.707*ln40+1',
          abs(att - (0.1 * 0.707 * math.log(40) + 1)) + abs(R.softmax_scale(c) - 192 ** -0.5), 1e-15)
    # Interleaved pairs vs the HF permuted rotate-half: same dot products.
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((5, 64)), rng.standard_normal((5, 64))
    cos, sin = R.rope_cos_sin(cfg_with(yarn=None), np.array([0, 1, 7, 100, 4095]))
    a = np.sum(R.rope_interleaved(q, cos, sin) * R.rope_interleaved(k, cos, sin), axis=1)
    b = np.sum(R.rope_hf(q, cos, sin) * R.rope_hf(k, cos, sin), axis=1)
    check('RoPE interleaved vs HF permuted form: q.k equal', rel(a, b), 1e-14)
    x = np.zeros((1, 64))
    x[0, 0] = 1.0
    cs, sn = R.rope_cos_sin(cfg_with(), np.array([3]))
    y2 = R.rope_interleaved(x, cs, sn)
    check('RoPE pair 0 = (x0, x1) rotated by 3 rad (adjacent elements)',
          abs(y2[0, 0] - math.cos(3)) + abs(y2[0, 1] - math.sin(3)) + abs(y2[0, 2:]).sum(), 1e-15)
    # Relative position: q.k after RoPE depends on positions only through their difference.
    c0 = cfg_with()
    d1 = np.sum(R.rope_interleaved(q[:1], *R.rope_cos_sin(c0, [5])) *
                R.rope_interleaved(k[:1], *R.rope_cos_sin(c0, [2])))
    d2 = np.sum(R.rope_interleaved(q[:1], *R.rope_cos_sin(c0, [105])) *
                R.rope_interleaved(k[:1], *R.rope_cos_sin(c0, [102])))
    check('RoPE q.k depends on the position difference only', abs(d1 - d2), 1e-12)


def test_config(tmp):
    a = MK.DEFAULTS
    base = MK.text_config(MK.argparse.Namespace(**dict(a, layout='k2-int4', n_group=1, topk_group=1,
                                                       dense_layers=1)), 512, (256, 257, 511))
    c = R.parse_config(json.loads(json.dumps(base)))
    check_true('flat kimi_k2 config parses (prefix "", 1 dense layer)',
               c.prefix == '' and c.is_dense == [True, False, False, False])
    wrap = {'model_type': 'kimi_k25', 'text_config': base}
    cw = R.parse_config(wrap)
    check_true('kimi_k25 wrapper: text_config, language_model. prefix, same values',
               cw.prefix == 'language_model.' and cw.hidden == c.hidden and cw.yarn == c.yarn)
    rp = dict(base)
    rp.pop('rope_scaling')
    rp['rope_parameters'] = dict(base['rope_scaling'], rope_type='yarn', rope_theta=5e4)
    check_true('rope_parameters (newer transformers export) == rope_scaling',
               R.parse_config(rp).yarn == c.yarn)
    for label, patch, words in [
            ('model_type other than deepseek_v3/kimi_k2', {'model_type': 'kimi_linear'}, ['model_type']),
            ('DeepSeek-V3.2 sparse attention', {'index_topk': 2048}, ['V3.2']),
            ('rope_scaling type linear', {'rope_scaling': {'type': 'linear', 'factor': 2}}, ['yarn']),
            ('scoring_func softmax', {'scoring_func': 'softmax'}, ['scoring_func']),
            ('topk_group > n_group', {'n_group': 2, 'topk_group': 3}, ['topk_group']),
            ('missing keys listed together', {'hidden_size': None, 'kv_lora_rank': None},
             ['hidden_size', 'kv_lora_rank'])]:
        bad = dict(base, **patch)
        ok, msg = raises(lambda: R.parse_config(bad), *words)
        check_true('config refused: ' + label, ok, msg)


# ---------------------------------------------------------------------------
# Writer layout and model-level equivalences
# ---------------------------------------------------------------------------

def header_offset(path, name):
    with open(path, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        return json.loads(f.read(n))[name]['data_offsets'][0]


def test_writer(tmp):
    dirs = {}
    for i, lay in enumerate(MK.LAYOUTS):
        d = os.path.join(tmp, lay)
        MK.make_deepseek(d, layout=lay, seed=40 + i)
        dirs[lay] = d
    d = dirs['dsv3-fp8']
    idx = json.load(open(os.path.join(d, 'model.safetensors.index.json')))
    shards = sorted(set(idx['weight_map'].values()))
    ts = {}
    for s in shards:
        ts.update(read_safetensors(os.path.join(d, s)))
    total = sum(t.raw.size for t in ts.values())
    check_true('dsv3-fp8: 3 shards, index total_size = the tensor bytes',
               len(shards) == 3 and idx['metadata']['total_size'] == total)
    qb = ts['model.layers.0.self_attn.q_b_proj.weight_scale_inv']
    dn = ts['model.layers.0.mlp.gate_proj.weight_scale_inv']
    check_true('FP8 scale grids ceil(M/128) x ceil(N/128) (q_b [192,96] -> [2,1], gate [320,160] -> [3,2])',
               qb.shape == (2, 1) and dn.shape == (3, 2) and qb.dtype == 'F32')
    check_true('dsv3-fp8: router gate BF16, bias F32, norms F32, embed/lm_head BF16',
               ts['model.layers.2.mlp.gate.weight'].dtype == 'BF16'
               and ts['model.layers.2.mlp.gate.e_score_correction_bias'].dtype == 'F32'
               and ts['model.layers.0.input_layernorm.weight'].dtype == 'F32'
               and ts['lm_head.weight'].dtype == 'BF16')
    mtp = [n for n in ts if n.startswith('model.layers.4.')]
    check_true('dsv3-fp8: MTP layer 4 present with embed/head copies',
               'model.layers.4.embed_tokens.weight' in ts and
               'model.layers.4.shared_head.head.weight' in ts and len(mtp) > 20)
    # An expert's six tensors are not one byte run.
    e = 'model.layers.2.mlp.experts.3.'
    offs = []
    for p in ('gate_proj.', 'up_proj.', 'down_proj.'):
        for suf in ('weight', 'weight_scale_inv'):
            t = ts[e + p + suf]
            offs.append((os.path.basename(t.where), header_offset(t.where, e + p + suf)))
    span = max(o for _, o in offs) - min(o for _, o in offs)
    check_true('FP8 expert tensors interleaved (6 tensors span more than their bytes)',
               len(set(w for w, _ in offs)) > 1 or span > 3 * 96 * 160 + 3 * 8, 'span %d' % span)
    d = dirs['k25-int4']
    cfg = json.load(open(os.path.join(d, 'config.json')))
    idx = json.load(open(os.path.join(d, 'model.safetensors.index.json')))['weight_map']
    check_true('k25-int4: kimi_k25 wrapper, language_model. names, vision tensors, INT4 experts',
               cfg['model_type'] == 'kimi_k25' and cfg['text_config']['model_type'] == 'kimi_k2'
               and 'language_model.lm_head.weight' in idx and any(n.startswith('vision_tower.') for n in idx)
               and 'language_model.model.layers.1.mlp.experts.0.down_proj.weight_packed' in idx)
    ts = {}
    for s in set(idx.values()):
        ts.update(read_safetensors(os.path.join(d, s)))
    p = 'language_model.model.layers.1.mlp.experts.0.down_proj.'
    check_true('INT4 down_proj [160, 96]: packed I32 [160,12], scale BF16 [160,3], shape I32 [2]',
               ts[p + 'weight_packed'].shape == (160, 12) and ts[p + 'weight_packed'].dtype == 'I32'
               and ts[p + 'weight_scale'].shape == (160, 3) and ts[p + 'weight_shape'].dtype == 'I32'
               and ts[p + 'weight_shape'].view('<i4').tolist() == [160, 96]
               and ts['language_model.model.layers.1.mlp.shared_experts.up_proj.weight'].dtype == 'BF16')
    return dirs


def test_model(d, label, prompt, n_gen):
    err = os.path.join(os.path.dirname(d), 'stderr.txt')
    old = os.dup(2)
    with open(err, 'w') as f:
        os.dup2(f.fileno(), 2)
        try:
            m = R.Model(d)
        finally:
            os.dup2(old, 2)
            os.close(old)
    check_true('%s: loads with no unused-tensor warning (MTP, vision skipped)' % label,
               'warning' not in open(err).read(), open(err).read().strip()[:60])
    a = m.forward(prompt, m.new_state(), mla='absorbed', all_logits=True)
    b = m.forward(prompt, m.new_state(), mla='expanded', all_logits=True)
    check('%s: prefill absorbed vs expanded (HF RoPE form), all positions' % label, rel(a, b), 1e-12)
    st = m.new_state()
    tok = np.stack([m.forward([t], st) for t in prompt])
    check('%s: token-by-token decode == prefill at every position' % label, rel(tok, a), 1e-12)
    st = m.new_state()
    m.forward(prompt[:5], st)
    sp = m.forward(prompt[5:], st, all_logits=True)
    check('%s: split prefill (5 + rest) == one pass' % label, rel(sp, a[5:]), 1e-12)
    ids_i, lg_i = R.generate(m, prompt, n_gen)
    ids_f, lg_f = R.generate(m, prompt, n_gen, full_recompute=True)
    check_true('%s: incremental and full-recompute ids equal' % label, ids_i == ids_f,
               ','.join(map(str, ids_i)))
    check('%s: incremental vs full recompute logits (absolute)' % label, maxabs(lg_i, lg_f), 1e-10)
    check_true('%s: greedy text not degenerate (>= 4 distinct of %d)' % (label, n_gen),
               len(set(ids_i)) >= 4, str(ids_i))
    ids_t, lg_t = R.generate(m, prompt, n_gen, force=ids_i)
    check('%s: teacher forcing along its own ids' % label, maxabs(lg_t, lg_i), 0)
    return a


def test_formats_agree(tmp, dirs):
    """The k2-fp8 checkpoint against a copy whose FP8 weights are rewritten as F32
    from the reference's own decode (scales dropped): the same model up to f32
    rounding of each decoded weight, so the FP8 path binds every tensor right."""
    d = dirs['k2-fp8']
    m = R.Model(d)
    out = os.path.join(tmp, 'k2-f32copy')
    os.makedirs(out, exist_ok=True)
    W = MK.Writer(np.random.default_rng(0))
    for n in sorted(m.w.t):
        t = m.w.t[n]
        if n.endswith('weight_scale_inv'):
            continue
        if t.dtype == 'F8_E4M3':
            pre = n[:-len('weight')]
            W.raw(n, 'F32', m.w._bind(pre, *t.shape)().astype('<f4'))
        else:
            W.raw(n, t.dtype, np.asarray(t.raw).view({'BF16': '<u2', 'F32': '<f4'}[t.dtype]).reshape(t.shape))
    W.save(out, 2)
    shutil.copyfile(os.path.join(d, 'config.json'), os.path.join(out, 'config.json'))
    p = [5, 6, 7, 300, 2]
    a = m.forward(p, m.new_state(), all_logits=True)
    m2 = R.Model(out)
    b = m2.forward(p, m2.new_state(), all_logits=True)
    # FP8 value x f32 scale has <= 28 significant bits: the f32 copy rounds it.
    check('k2-fp8 vs an F32 checkpoint of its decoded weights (f32 rounding)', rel(a, b), 1e-6)


FAKE_ENGINE = """#!/usr/bin/python3
# Stand-in for `strata` in ds_selftest: lists a deepseek preset (unless FAKE_NO_ARCH),
# names fp8/int4 in gen-model --help (unless FAKE_NO_FMT), and answers `run MODEL ...`
# with dsref itself; FAKE_PERTURB adds to every 7th logit.
import os, sys
sys.path.insert(0, %r)
import dsref
from refcheck import fake_run
a = sys.argv[1:]
if a[:2] == ['gen-model', '--list-presets']:
    print('tiny\\n' + ('' if os.environ.get('FAKE_NO_ARCH') else 'deepseek-v3-tiny'))
    sys.exit(0)
if a[:2] == ['gen-model', '--help']:
    print('' if os.environ.get('FAKE_NO_FMT') else '--weights fp8|int4')
    sys.exit(0)
sys.exit(fake_run(dsref.main, a[1:]))
"""


def test_ds_check(tmp, d):
    check_script(tmp, FAKE_ENGINE, 'ds_check.sh', d, [
        ('PASS when engine == reference', {}, ['--gen', '5'], 0, 'PASS'),
        ('PASS with a long prompt', {}, ['--long', '--gen', '2'], 0, 'PASS'),
        ('FAIL on a 1e-2 logit error', {'FAKE_PERTURB': '0.01'}, ['--gen', '3'], 1, 'FAIL'),
        ('FAIL when the reference runs another eps', {}, ['--gen', '5', '--ref-args',
                                                          '--lora-norm-eps 0.5'], 1, 'FAIL'),
        ('SKIP (77) without a deepseek preset', {'FAKE_NO_ARCH': '1'}, [], 77, 'SKIP'),
        ('SKIP (77) when gen-model names no fp8', {'FAKE_NO_FMT': '1'}, [], 77, 'FP8')])


def run_all(tmp, models):
    test_fp8()
    test_int4()
    test_router()
    test_rope()
    test_config(tmp)
    dirs = test_writer(tmp)
    prompt = [1, 17, 42, 9, 250, 3, 88, 130, 7, 300, 11]
    for lay in ('dsv3-fp8', 'k2-int4', 'k25-int4'):
        test_model(dirs[lay], lay, prompt, 12)
    test_formats_agree(tmp, dirs)
    test_ds_check(tmp, dirs['dsv3-fp8'])
    for md in models:
        test_model(md, os.path.basename(md.rstrip('/')), prompt, 8)


def main():
    return selftest_main('ds_selftest', 'dsref-selftest-', 'self-tests of the DeepSeek-V3 reference', run_all)


if __name__ == '__main__':
    sys.exit(main())
