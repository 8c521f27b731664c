#!/usr/bin/python3
"""klref.py: independent float64 reference of Kimi Linear (KimiLinearForCausalLM,
model_type kimi_linear), e.g. moonshotai/Kimi-Linear-48B-A3B-Instruct.

Written from the published math (/work/shared/spec/family-math.md 1-7 and 12,
family-formats.md 0 C2/C3/C7 and 3.1); it shares no code with the C engine. The
safetensors reader and the KDA recurrence/chunk kernels come from refcommon.py
(shared by the references, same independence rule); everything Kimi-Linear-specific is here.
Everything is float64 NumPy: no bf16 rounding of activations, exact widening of
stored weights.

Contents, in reading order:
  1. config.json (flat, linear_attn_config, 1-based layer lists)
  2. weight binding (model./lm_head. names, dtypes from the header)
  3. KDA layer (separate q/k/v convs + SiLU, L2 norm, softplus gate, gated o_norm)
  4. MLA layer (direct q_proj, NoPE, expanded and absorbed forms)
  5. MoE (sigmoid router, biased selection, unbiased or HF weights) and dense MLP
  6. decoder, session state, greedy decode
  7. CLI

CLI:
  /usr/bin/python3 tests/reference/klref.py MODEL_DIR --ids 1,2,3 [--gen N]
      [--print-ids] [--dump-logits FILE] [--force-ids 4,5,...]
      [--router unbiased|hf] [--full-recompute] [--kv-norm-eps X|config]
      [--kda chunked|recurrent] [--chunk 64] [--mla absorbed|expanded] [--stop-eos]
      [--dump-layers FILE.npz]
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Shared with the other references (refcommon.py): config/shard reading, bounded
# expert cache, and the KDA recurrence (family-math 4.4) and chunked WY/UT form
# (4.5), which are the same maths for K3 and Kimi Linear (only the gate and the
# conv/norm plumbing differ), and the per-sequence KDA/MLA state, a forward pass's
# token check and trace.
import refcommon  # noqa: E402
from refcommon import (RefError, open_checkpoint, Lazy, short_conv,  # noqa: E402
                       kda_recurrent, kda_chunked, sigmoid, silu, l2norm, Config,
                       DecoderWeights, read_fields, generate, common_args, tail_args,
                       argmax_first, check_args, check_eps_arg, run_cli, kda_mla_state,
                       token_ids, tracer)
from refcommon import is_number as _is_num  # noqa: E402


# ============================================================================
# 1. config.json
# ============================================================================

# kv_a_layernorm epsilon (family-math 5 and 12.4): the released modeling_kimi.py
# builds kv_a_layernorm with KimiRMSNorm's class default 1e-6 (Moonshot's own code,
# the Hugging Face oracle), not with rms_norm_eps (1e-5, what vLLM passes). The
# engine made the same choice (src/format/arch_kimi_linear.c). --kv-norm-eps config
# uses rms_norm_eps instead; --kv-norm-eps X any value.
KV_NORM_EPS = 1e-6


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


# (attribute, key, kind, default; None = required). Top-level keys of the flat config.
_FIELDS = [
    ('hidden', 'hidden_size', 'int', None),
    ('n_layers', 'num_hidden_layers', 'int', None),
    ('vocab', 'vocab_size', 'int', None),
    ('rms_eps', 'rms_norm_eps', 'float', None),
    ('n_heads', 'num_attention_heads', 'int', None),
    ('kv_lora', 'kv_lora_rank', 'int', None),
    ('qk_nope', 'qk_nope_head_dim', 'int', None),
    ('qk_rope', 'qk_rope_head_dim', 'int', None),
    ('v_head', 'v_head_dim', 'int', None),
    ('n_experts', 'num_experts', 'int', None),
    ('topk', 'num_experts_per_token', 'int', None),
    ('n_shared', 'num_shared_experts', 'int', 0),
    ('moe_inter', 'moe_intermediate_size', 'int', None),
    ('routed_scale', 'routed_scaling_factor', 'float', 1.0),
    ('moe_renorm', 'moe_renormalize', 'bool', True),
    ('first_dense', 'first_k_dense_replace', 'int', 0),
    ('moe_freq', 'moe_layer_freq', 'int', 1),
    ('dense_inter', 'intermediate_size', 'int', None),
    ('n_group', 'num_expert_group', 'int', 1),
    ('topk_group', 'topk_group', 'int', 1),
    ('tie_embed', 'tie_word_embeddings', 'bool', False),
]
# Keys of linear_attn_config.
_LIN_FIELDS = [
    ('kda_heads', 'num_heads', 'int', None),
    ('kda_head_dim', 'head_dim', 'int', None),
    ('conv_k', 'short_conv_kernel_size', 'int', None),
]


def _int_list(v):
    return (isinstance(v, list) and all(_is_num(x) and float(x) == int(x) for x in v))


def parse_config(obj):
    """Config of a parsed Kimi Linear config.json. Raises RefError listing every
    missing or malformed key."""
    if not isinstance(obj, dict):
        raise RefError('config.json: top level is not an object')
    cfg = Config()
    problems = []
    mt = obj.get('model_type')
    if mt is not None and mt != 'kimi_linear':
        problems.append('model_type is %r, expected "kimi_linear"' % (mt,))
    read_fields(obj, _FIELDS, '', cfg, problems)
    lin = obj.get('linear_attn_config')
    if not isinstance(lin, dict):
        problems.append('missing linear_attn_config (object)')
        lin = {}
    read_fields(lin, _LIN_FIELDS, 'linear_attn_config.', cfg, problems)
    lists = {}
    for key in ('kda_layers', 'full_attn_layers'):
        v = lin.get(key)
        if v is None:
            continue
        if not _int_list(v):
            problems.append('linear_attn_config.%s is not an integer array' % key)
        else:
            lists[key] = [int(x) for x in v]
    if not lists and lin:
        problems.append('linear_attn_config has neither kda_layers nor full_attn_layers')
    # Features this reference (and the published model) do not have: refuse them
    # instead of computing something else.
    if obj.get('q_lora_rank') is not None:
        problems.append('q_lora_rank is %r: only the direct q_proj (null) is implemented'
                        % (obj.get('q_lora_rank'),))
    if obj.get('mla_use_nope', True) is not True:
        problems.append('mla_use_nope is not true: MLA with RoPE is not implemented')
    act = obj.get('hidden_act', 'silu')
    if act != 'silu':
        problems.append('hidden_act %r: only "silu" is implemented' % (act,))
    ract = obj.get('moe_router_activation_func', 'sigmoid')
    if ract != 'sigmoid':
        problems.append('moe_router_activation_func %r: only "sigmoid" is implemented' % (ract,))
    if problems:
        raise RefError('config.json: ' + '; '.join(problems))

    base = lin.get('kda_layer_index_base', 1)        # family-math 12.2
    if not _is_int(base):
        raise RefError('config.json: kda_layer_index_base is not an integer: %r' % (base,))
    L = cfg.n_layers
    bad = []
    if L <= 0 or cfg.hidden <= 0 or cfg.vocab <= 0:
        bad.append('non-positive layers/hidden/vocab')
    sets = {}
    for key, vals in lists.items():
        s = set()
        for x in vals:
            if not (base <= x < base + L):
                bad.append('linear_attn_config.%s entry %d outside %d..%d'
                           % (key, x, base, base + L - 1))
            elif x - base in s:
                bad.append('linear_attn_config.%s repeats %d' % (key, x))
            s.add(x - base)
        sets[key] = s
    kda = sets.get('kda_layers')
    mla = sets.get('full_attn_layers')
    if kda is None:
        kda = set(range(L)) - mla
    if mla is None:
        mla = set(range(L)) - kda
    if kda & mla:
        bad.append('layers %s are in both kda_layers and full_attn_layers'
                   % sorted(x + base for x in kda & mla))
    if (kda | mla) != set(range(L)):
        bad.append('layers %s are in neither kda_layers nor full_attn_layers'
                   % sorted(x + base for x in set(range(L)) - (kda | mla)))
    if not (1 <= cfg.topk <= cfg.n_experts):
        bad.append('num_experts_per_token %d outside 1..%d' % (cfg.topk, cfg.n_experts))
    if cfg.conv_k < 1:
        bad.append('short_conv_kernel_size < 1')
    if cfg.moe_freq < 1:
        bad.append('moe_layer_freq < 1')
    if cfg.n_group < 1 or cfg.n_experts % cfg.n_group:
        bad.append('num_expert_group %d does not divide num_experts %d'
                   % (cfg.n_group, cfg.n_experts))
    elif cfg.topk_group < cfg.n_group:
        # family-math 6: the group stage is a no-op for Kimi Linear (1 / 1).
        bad.append('num_expert_group %d with topk_group %d: group-limited routing is '
                   'not implemented' % (cfg.n_group, cfg.topk_group))
    if bad:
        raise RefError('config.json: ' + '; '.join(bad))
    cfg.is_mla = [x in mla for x in range(L)]
    # HF KimiDecoderLayer: MoE iff num_experts set, l >= first_k_dense_replace and
    # l % moe_layer_freq == 0; dense SwiGLU otherwise.
    cfg.is_dense = [not (x >= cfg.first_dense and x % cfg.moe_freq == 0) for x in range(L)]
    eos = obj.get('eos_token_id')
    cfg.eos_ids = ([] if eos is None else [int(x) for x in eos] if isinstance(eos, list)
                   else [int(eos)])
    cfg.kv_eps = KV_NORM_EPS          # kv_a_layernorm eps; --kv-norm-eps overrides
    return cfg


def load_config(model_dir):
    return refcommon.load_config(model_dir, parse_config)


# ============================================================================
# 2. Weights (family-formats 3.1 names; dtype of every tensor from the header)
# ============================================================================

EXPERT_CACHE_BYTES = int(os.environ.get('KLREF_EXPERT_CACHE_MB', '1024')) << 20
class Weights(DecoderWeights):
    """Binds and shape-checks every tensor the forward pass uses, as float64."""

    def __init__(self, cfg, tensors):
        super().__init__(cfg, tensors, '', 'klref', EXPERT_CACHE_BYTES)

    def mat(self, name, shape):
        a = self.get(name).as_f64()
        if a.shape != tuple(shape):
            raise RefError('%s: shape %s, expected %s' % (name, a.shape, tuple(shape)))
        return a

    def conv(self, name, p, k):
        t = self.get(name)
        a = t.as_f64()
        if a.shape == (p, 1, k):
            a = a[:, 0, :]
        if a.shape != (p, k):
            raise RefError('%s: shape %s, expected [%d, 1, %d]' % (name, list(t.shape), p, k))
        return a

    def expert(self, name, rows, cols):
        """One expert matrix, widened on first use through the bounded cache."""
        t = self.get(name)
        if tuple(t.shape) != (rows, cols):
            raise RefError('%s: shape %s, expected %s' % (name, t.shape, (rows, cols)))
        t._typed()
        return Lazy(self.cache, name, t.as_f64)

    def bind_layer(self, L):
        c, d = self.cfg, self.cfg.hidden
        p = 'model.layers.%d.' % L
        w = {'kind': 'mla' if c.is_mla[L] else 'kda', 'dense': c.is_dense[L]}
        w['in_norm'] = self.vec(p + 'input_layernorm.weight', d)
        w['post_norm'] = self.vec(p + 'post_attention_layernorm.weight', d)
        a = p + 'self_attn.'
        if w['kind'] == 'kda':
            H, D = c.kda_heads, c.kda_head_dim
            P = H * D
            for s in 'qkv':
                w[s] = self.mat(a + s + '_proj.weight', (P, d))
                w[s + '_conv'] = self.conv(a + s + '_conv1d.weight', P, c.conv_k)
            for s in 'fg':
                lo = self.get(a + s + '_a_proj.weight').as_f64()
                if lo.ndim != 2 or lo.shape[1] != d:
                    raise RefError('%s%s_a_proj.weight: shape %s, expected [r, %d]'
                                   % (a, s, list(lo.shape), d))
                self.used.add(a + s + '_a_proj.weight')
                w[s + '_a'] = lo
                w[s + '_b'] = self.mat(a + s + '_b_proj.weight', (P, lo.shape[0]))
            w['b'] = self.mat(a + 'b_proj.weight', (H, d))
            w['A_log'] = self.vec(a + 'A_log', H)              # one per head, fp32 in the release
            w['dt_bias'] = self.vec(a + 'dt_bias', P)          # per (head, channel)
            w['o_norm'] = self.vec(a + 'o_norm.weight', D)     # shared by all heads
            w['o'] = self.mat(a + 'o_proj.weight', (d, P))
        else:
            H, dn, dr, dv, r = c.n_heads, c.qk_nope, c.qk_rope, c.v_head, c.kv_lora
            w['q'] = self.mat(a + 'q_proj.weight', (H * (dn + dr), d))
            w['kv_a'] = self.mat(a + 'kv_a_proj_with_mqa.weight', (r + dr, d))
            w['kv_a_norm'] = self.vec(a + 'kv_a_layernorm.weight', r)
            w['kv_b'] = self.mat(a + 'kv_b_proj.weight', (H * (dn + dv), r))
            w['o'] = self.mat(a + 'o_proj.weight', (d, H * dv))
        if w['dense']:
            m, I = p + 'mlp.', c.dense_inter
            w['mlp_gate'] = self.mat(m + 'gate_proj.weight', (I, d))
            w['mlp_up'] = self.mat(m + 'up_proj.weight', (I, d))
            w['mlp_down'] = self.mat(m + 'down_proj.weight', (d, I))
        else:
            m = p + 'block_sparse_moe.'
            E, I = c.n_experts, c.moe_inter
            w['router'] = self.mat(m + 'gate.weight', (E, d))
            w['router_bias'] = self.vec(m + 'gate.e_score_correction_bias', E)
            if c.n_shared > 0:
                S = c.n_shared * I
                w['sh_gate'] = self.mat(m + 'shared_experts.gate_proj.weight', (S, d))
                w['sh_up'] = self.mat(m + 'shared_experts.up_proj.weight', (S, d))
                w['sh_down'] = self.mat(m + 'shared_experts.down_proj.weight', (d, S))
            e = m + 'experts.%d.'
            w['w1'] = [self.expert(e % i + 'w1.weight', I, d) for i in range(E)]   # gate
            w['w3'] = [self.expert(e % i + 'w3.weight', I, d) for i in range(E)]   # up
            w['w2'] = [self.expert(e % i + 'w2.weight', d, I) for i in range(E)]   # down
        return w


# ============================================================================
# Building blocks (float64; x is [..., n])
# ============================================================================

def linear(x, W):
    """y = W x per row of x; W is [out, in]."""
    return x @ W.T


def rmsnorm(x, w, eps):
    """w * x / sqrt(mean(x^2) + eps) over the last axis."""
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def softplus(x):
    """log(1 + e^x), and x itself where x > 20 (PyTorch's threshold, family-math 1)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def swiglu(x, gate, up, down):
    return linear(silu(linear(x, gate)) * linear(x, up), down)


# ============================================================================
# 3. KDA (family-math 4)
# ============================================================================

def kda_gate(cfg, w, x):
    """Per-channel log-decay g [T, H, D] = -exp(A_log[h]) * softplus(f_b(f_a x) + dt_bias)
    (4.3; no lower bound) and beta [T, H] = sigmoid(b_proj x)."""
    T, H, D = x.shape[0], cfg.kda_heads, cfg.kda_head_dim
    u = linear(linear(x, w['f_a']), w['f_b']).reshape(T, H, D) + w['dt_bias'].reshape(H, D)
    g = -np.exp(w['A_log'])[None, :, None] * softplus(u)
    beta = sigmoid(linear(x, w['b']))
    return g, beta


def kda_layer(cfg, w, x, st, mode='chunked', chunk=64):
    """x: [T, d] (input RMSNorm applied); st: {'conv_q','conv_k','conv_v': [W-1, P]
    pre-conv inputs, 'S': [H, D, D]} updated in place. Returns [T, d]."""
    T, H, D = x.shape[0], cfg.kda_heads, cfg.kda_head_dim
    qkv = {}
    for s in 'qkv':
        # 4.1: each stream its own causal depthwise conv, then SiLU.
        y, st['conv_' + s] = short_conv(linear(x, w[s]), w[s + '_conv'], st['conv_' + s])
        qkv[s] = y.reshape(T, H, D)
    q = l2norm(qkv['q']) * (1.0 / math.sqrt(D))     # 4.2: scale after the L2 norm
    k = l2norm(qkv['k'])
    v = qkv['v']
    g, beta = kda_gate(cfg, w, x)
    if mode == 'recurrent':
        o = kda_recurrent(q, k, v, g, beta, st['S'])
    else:
        o = kda_chunked(q, k, v, g, beta, st['S'], chunk)
    # 4.6: per-head RMSNorm (eps rms_norm_eps, weight shared by heads) * sigmoid gate.
    o = rmsnorm(o, w['o_norm'], cfg.rms_eps).reshape(T, H * D)
    o = o * sigmoid(linear(linear(x, w['g_a']), w['g_b']))
    return linear(o, w['o'])


# ============================================================================
# 4. MLA (family-math 5: direct q_proj, NoPE, no output gate)
# ============================================================================

def mla_layer(cfg, w, x, st, mode='absorbed'):
    """x: [T, d]; st: {'lat': [n, kv_lora], 'rope': [n, qk_rope]} latent cache of the
    earlier positions, extended in place. mode 'absorbed' (attention over the latent
    cache with W_UK folded into the query and W_UV applied after) or 'expanded'
    (per-head K and V rebuilt from the cache). Returns [T, d]."""
    T = x.shape[0]
    H, dn, dr, dv, r = cfg.n_heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head, cfg.kv_lora
    q = linear(x, w['q']).reshape(T, H, dn + dr)
    q_nope, q_rope = q[:, :, :dn], q[:, :, dn:]
    kv = linear(x, w['kv_a'])
    st['lat'] = np.concatenate([st['lat'], rmsnorm(kv[:, :r], w['kv_a_norm'], cfg.kv_eps)])
    st['rope'] = np.concatenate([st['rope'], kv[:, r:]])   # not normed, not rotated, shared
    n = st['lat'].shape[0]
    kvb = w['kv_b'].reshape(H, dn + dv, r)                  # head-major, nope rows first
    W_uk, W_uv = kvb[:, :dn, :], kvb[:, dn:, :]
    score = np.einsum('thr,sr->ths', q_rope, st['rope'])    # the rope slice still scores
    if mode == 'absorbed':
        score = score + np.einsum('thr,sr->ths', np.einsum('thn,hnr->thr', q_nope, W_uk),
                                  st['lat'])
    else:
        kvx = linear(st['lat'], w['kv_b']).reshape(n, H, dn + dv)
        score = score + np.einsum('thn,shn->ths', q_nope, kvx[:, :, :dn])
    score = score * (1.0 / math.sqrt(dn + dr))
    causal = np.arange(n)[None, :] <= (n - T + np.arange(T))[:, None]
    score = np.where(causal[:, None, :], score, -np.inf)
    p = np.exp(score - score.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    if mode == 'absorbed':
        o = np.einsum('thr,hvr->thv', np.einsum('ths,sr->thr', p, st['lat']), W_uv)
    else:
        o = np.einsum('ths,shv->thv', p, kvx[:, :, dn:])
    return linear(o.reshape(T, H * dv), w['o'])


# ============================================================================
# 5. MoE (family-math 6, family-formats C3) and the dense MLP
# ============================================================================

ROUTERS = ('unbiased', 'hf')


def route(cfg, w, x, router='unbiased'):
    """Returns (idx [T, k] in selection order, weights [T, k]).
    Selection: top-k of sigmoid(logits) + e_score_correction_bias, ties to the lowest
    expert id. Weights: the unbiased sigmoid ('unbiased': vLLM, llama.cpp, K3), or
    the biased score ('hf': the released modeling_kimi.py, whose in-place bias add
    aliases the scores). Renormalised (+1e-20) when moe_renormalize and k > 1, then
    times routed_scaling_factor."""
    s = sigmoid(linear(x, w['router']))
    b = s + w['router_bias']
    idx = np.argsort(-b, axis=1, kind='stable')[:, :cfg.topk]
    wts = np.take_along_axis(b if router == 'hf' else s, idx, axis=1)
    if cfg.moe_renorm and cfg.topk > 1:
        wts = wts / (wts.sum(axis=1, keepdims=True) + 1e-20)
    return idx, wts * cfg.routed_scale


def moe_layer(cfg, w, x, router='unbiased'):
    T, d = x.shape
    idx, wts = route(cfg, w, x, router)
    outs = np.zeros((T, cfg.topk, d))
    for e in np.unique(idx):
        tt, jj = np.nonzero(idx == e)
        outs[tt, jj] = swiglu(x[tt], w['w1'][e](), w['w3'][e](), w['w2'][e]())
    y = np.zeros((T, d))
    for j in range(cfg.topk):                                  # top-k order
        y += wts[:, j:j + 1] * outs[:, j]
    if cfg.n_shared > 0:                                       # added unscaled
        y = y + swiglu(x, w['sh_gate'], w['sh_up'], w['sh_down'])
    return y


# ============================================================================
# 6. Decoder, session, greedy decode (family-math 7)
# ============================================================================

class Model:
    def __init__(self, model_dir, router='unbiased', kv_eps=None):
        if router not in ROUTERS:
            raise RefError('router %r, expected one of %s' % (router, ', '.join(ROUTERS)))
        self.dir = model_dir
        self.cfg = load_config(model_dir)
        if kv_eps == 'config':
            self.cfg.kv_eps = self.cfg.rms_eps
        elif kv_eps is not None:
            self.cfg.kv_eps = float(kv_eps)
        self.router = router
        self.w = Weights(self.cfg, open_checkpoint(model_dir))

    def new_state(self):
        """Per sequence: KDA conv histories (pre-conv inputs) and S, MLA latent cache."""
        return kda_mla_state(self.cfg)

    def forward(self, ids, state, kda='chunked', chunk=64, mla='absorbed', all_logits=False,
                trace=None):
        """Runs ids after state (updated). Returns the last position's logits [vocab],
        or [T, vocab] with all_logits. Plain pre-norm residual:
        h += Mixer(RMSNorm(h)); h += FFN(RMSNorm(h)); logits = lm_head RMSNorm(h).
        If trace is a dict it receives float64 intermediates, each [T, ...]: 'embed';
        per layer L 'L.attn_out', 'L.mlp_in' (h after the mixer), 'L.mlp_out', 'L.out'
        (h after the layer); 'logits' (all positions)."""
        note = tracer(trace)
        c, W = self.cfg, self.w
        ids = token_ids(ids, c.vocab)
        h = W.embed(ids)
        note('embed', h)
        for L in range(c.n_layers):
            w = W.layers[L]
            x = rmsnorm(h, w['in_norm'], c.rms_eps)
            if w['kind'] == 'kda':
                a = kda_layer(c, w, x, state[L], kda, chunk)
            else:
                a = mla_layer(c, w, x, state[L], mla)
            h = h + a
            note('%d.attn_out' % L, a)
            note('%d.mlp_in' % L, h)
            x = rmsnorm(h, w['post_norm'], c.rms_eps)
            if w['dense']:
                m = swiglu(x, w['mlp_gate'], w['mlp_up'], w['mlp_down'])
            else:
                m = moe_layer(c, w, x, self.router)
            h = h + m
            note('%d.mlp_out' % L, m)
            note('%d.out' % L, h)
        if not all_logits and trace is None:
            h = h[-1:]
        logits = W.logits(rmsnorm(h, W.norm, c.rms_eps))
        note('logits', logits)
        if all_logits:
            return logits
        return logits[-1]


# ============================================================================
# 7. CLI
# ============================================================================

def main(argv=None):
    ap = argparse.ArgumentParser(description='float64 reference of Kimi Linear (greedy decode)')
    common_args(ap)
    ap.add_argument('--router', choices=ROUTERS, default='unbiased',
                    help='routing weights: unbiased sigmoid (default; vLLM/llama.cpp) or hf '
                         '(biased, as the released modeling_kimi.py)')
    ap.add_argument('--kv-norm-eps', default=None, metavar='X|config',
                    help='kv_a_layernorm epsilon (default 1e-6 as modeling_kimi.py; '
                         'config = rms_norm_eps, as vLLM)')
    ap.add_argument('--kda', choices=['chunked', 'recurrent'], default='chunked',
                    help='KDA prefill form (default chunked)')
    ap.add_argument('--chunk', type=int, default=64, help='KDA chunk size (default 64)')
    ap.add_argument('--mla', choices=['absorbed', 'expanded'], default='absorbed',
                    help='MLA form in incremental mode (default absorbed)')
    tail_args(ap)
    a = ap.parse_args(argv)
    check_args(ap, a)
    check_eps_arg(ap, a.kv_norm_eps, '--kv-norm-eps')
    return run_cli(a, 'klref', lambda: Model(a.model_dir, router=a.router, kv_eps=a.kv_norm_eps),
                   lambda m: generate(m, a.ids, a.gen, full_recompute=a.full_recompute,
                                      stop_eos=a.stop_eos, force=a.force_ids,
                                      kda=a.kda, chunk=a.chunk, mla=a.mla),
                   dict(kda='recurrent', mla='expanded'), ', router %s' % a.router)


if __name__ == '__main__':
    sys.exit(main())
