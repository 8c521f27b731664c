#!/usr/bin/python3
"""k3ref.py: independent float64 reference of the Kimi K3 forward pass.

Written from the spec only (docs in /work/shared/spec: MODEL.md, seed-engine.md 1-2,
family-math.md 4-5, 8.3, 11-12); it shares no code with the C engine. Everything is
float64 NumPy; speed is not a goal, clarity and independence are.

Contents, in reading order:
  1. config.json reader (nested released shape and flat shape)
  2. MXFP4 expert decoding
  3. weight binding with shape checks
  4. building blocks: RMSNorm, SiTU, AttnRes
  5. KDA layer (gate, conv and norm plumbing around the shared state kernels)
  6. Gated MLA (expanded and absorbed/latent-cache forms)
  7. Stable LatentMoE and the dense MLP
  8. decoder with Block Attention Residuals
  9. CLI
The safetensors reader, the expert cache, sigmoid/SiLU/L2 norm, the KDA state
kernels (recurrent and chunked WY/UT, shared with Kimi Linear), session state, the
greedy loop and the CLI plumbing are refcommon.py's.

CLI:
  /usr/bin/python3 tests/reference/k3ref.py MODEL_DIR --ids 1,2,3 [--gen N]
      [--print-ids] [--dump-logits FILE] [--full-recompute] [--stop-eos]
      [--force-ids 4,5,...] [--kda recurrent|chunked] [--chunk 64]
      [--mla absorbed|expanded]
"""

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import refcommon  # noqa: E402
from refcommon import (RefError, Config, is_number, open_checkpoint,  # noqa: E402
                       ExpertCache, Lazy, LM_HEAD_KEEP, LM_HEAD_CHUNK, sigmoid, l2norm,
                       short_conv, kda_recurrent, kda_chunked, kda_mla_state, token_ids,
                       tracer, generate, common_args, tail_args, check_args, run_cli)

# ============================================================================
# 1. config.json
# ============================================================================

# (field, [json keys: primary then aliases], kind, default or None if required)
# kind: 'int', 'float', 'bool', 'list'. KDA fields are resolved from
# linear_attn_config first (seed-engine 1.2 "weakness worth fixing").
_KDA_FIELDS = {'kda_heads', 'kda_head_dim', 'conv_k', 'gate_lb', 'full_attn'}
_CONFIG_FIELDS = [
    ('hidden', ['hidden_size'], 'int', None),
    ('n_layers', ['num_hidden_layers'], 'int', None),
    ('vocab', ['vocab_size'], 'int', None),
    ('rms_eps', ['rms_norm_eps'], 'float', None),
    ('kda_heads', ['num_heads', 'kda_num_heads'], 'int', None),
    ('kda_head_dim', ['head_dim', 'kda_head_dim'], 'int', None),
    ('conv_k', ['short_conv_kernel_size'], 'int', None),
    ('gate_lb', ['gate_lower_bound'], 'float', None),
    ('n_heads', ['num_attention_heads'], 'int', None),
    ('q_lora', ['q_lora_rank'], 'int', None),
    ('kv_lora', ['kv_lora_rank'], 'int', None),
    ('qk_nope', ['qk_nope_head_dim'], 'int', None),
    ('qk_rope', ['qk_rope_head_dim'], 'int', None),
    ('v_head', ['v_head_dim'], 'int', None),
    ('mla_out_gate', ['mla_use_output_gate'], 'bool', True),
    ('n_experts', ['num_experts'], 'int', None),
    ('topk', ['num_experts_per_token'], 'int', None),
    ('n_shared', ['num_shared_experts'], 'int', None),
    ('latent', ['routed_expert_hidden_size'], 'int', None),
    ('moe_inter', ['moe_intermediate_size'], 'int', None),
    ('routed_scale', ['routed_scaling_factor'], 'float', None),
    ('moe_renorm', ['moe_renormalize'], 'bool', True),
    ('latent_norm', ['latent_moe_use_norm'], 'bool', True),
    ('first_dense', ['first_k_dense_replace'], 'int', None),
    ('dense_inter', ['intermediate_size'], 'int', None),
    ('attn_res_block', ['attn_res_block_size'], 'int', None),
    ('situ_b1', ['activation_situ_beta', 'situ_beta'], 'float', None),
    ('situ_b2', ['activation_situ_linear_beta', 'situ_linear_beta'], 'float', None),
    ('full_attn', ['full_attn_layers'], 'list', None),
]


def parse_config(obj):
    """Builds a Config from a parsed config.json (nested or flat). Raises RefError
    listing every missing or malformed required key."""
    if not isinstance(obj, dict):
        raise RefError('config.json: top level is not an object')
    text = obj.get('text_config')
    text = text if isinstance(text, dict) else None
    lin = None
    for holder in (text, obj):
        if holder is not None and isinstance(holder.get('linear_attn_config'), dict):
            lin = holder['linear_attn_config']
            break
    generic_scopes = [s for s in (text, lin, obj) if s is not None]
    kda_scopes = [s for s in (lin, text, obj) if s is not None]

    cfg = Config()
    problems = []
    for field, keys, kind, default in _CONFIG_FIELDS:
        scopes = kda_scopes if field in _KDA_FIELDS else generic_scopes
        found = None
        for scope in scopes:
            for key in keys:
                if key in scope:
                    found = (key, scope[key])
                    break
            if found is not None:
                break
        if found is None:
            if default is None:
                problems.append('missing %s' % keys[0])
            else:
                setattr(cfg, field, default)
            continue
        key, val = found
        if kind == 'int':
            if not is_number(val) or float(val) != int(val):
                problems.append('%s is not an integer: %r' % (key, val))
                continue
            val = int(val)
        elif kind == 'float':
            if not is_number(val):
                problems.append('%s is not a number: %r' % (key, val))
                continue
            val = float(val)
        elif kind == 'bool':
            if not isinstance(val, bool):
                problems.append('%s is not a boolean: %r' % (key, val))
                continue
        elif kind == 'list':
            if (not isinstance(val, list) or not val
                    or not all(is_number(x) and float(x) == int(x) for x in val)):
                problems.append('%s is not a non-empty integer array' % key)
                continue
            val = [int(x) for x in val]
        setattr(cfg, field, val)
    if problems:
        raise RefError('config.json: ' + '; '.join(problems))

    # Index base of the layer list: one-based unless a config says otherwise
    # (family-math 12.2: kda_layer_index_base).
    base = 1
    for scope in kda_scopes:
        if 'kda_layer_index_base' in scope:
            base = int(scope['kda_layer_index_base'])
            break
    # eos: int or list, optional.
    eos = None
    for scope in generic_scopes:
        if 'eos_token_id' in scope:
            eos = scope['eos_token_id']
            break
    if eos is None:
        cfg.eos_ids = []
    elif isinstance(eos, list):
        cfg.eos_ids = [int(x) for x in eos]
    else:
        cfg.eos_ids = [int(eos)]

    # Structural checks (seed-engine 1.2).
    bad = []
    if cfg.n_layers <= 0 or cfg.hidden <= 0 or cfg.vocab <= 0:
        bad.append('non-positive layers/hidden/vocab')
    mla = set()
    for x in cfg.full_attn:
        if not (base <= x < base + cfg.n_layers):
            bad.append('full_attn_layers entry %d outside %d..%d' % (x, base, base + cfg.n_layers - 1))
        mla.add(x - base)
    if len(mla) >= cfg.n_layers:
        bad.append('no KDA layer left')
    if cfg.topk < 1 or cfg.topk > cfg.n_experts:
        bad.append('num_experts_per_token %d outside 1..%d' % (cfg.topk, cfg.n_experts))
    if cfg.attn_res_block <= 0:
        bad.append('attn_res_block_size <= 0')
    if cfg.conv_k < 1:
        bad.append('short_conv_kernel_size < 1')
    if bad:
        raise RefError('config.json: ' + '; '.join(bad))
    cfg.mla_layers = sorted(mla)
    cfg.is_mla = [L in mla for L in range(cfg.n_layers)]
    cfg.is_dense = [L < cfg.first_dense for L in range(cfg.n_layers)]
    return cfg


def load_config(model_dir):
    """K3 Config of a model directory (eos ids from config and tokenizer_config)."""
    return refcommon.load_config(model_dir, parse_config)


# ============================================================================
# 2. MXFP4 (OCP MX FP4: E2M1 codes, E8M0 scale per 32 inputs)
# ============================================================================

MXFP4_GROUP = 32
# Magnitudes of codes 0..7; bit 3 is the sign (code 8 is -0).
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)
# Per byte: (element 2i from the LOW nibble, element 2i+1 from the HIGH nibble).
E2M1_BYTE = np.stack([E2M1[np.arange(256) & 0x0F], E2M1[np.arange(256) >> 4]], axis=1)


def mxfp4_groups(cols):
    """Scale bytes per row: one per 32 inputs, the last group may be partial."""
    return (cols + MXFP4_GROUP - 1) // MXFP4_GROUP


def mxfp4_decode(packed, scale, name='?'):
    """packed: uint8 [rows, cols/2] (LOW nibble = even element); scale: uint8
    [rows, ceil(cols/32)] (E8M0, element i uses scale i // 32). Returns float64
    [rows, cols] (exact values). Scale 255 (NaN in the MX spec) is a checkpoint
    defect: raise naming the tensor."""
    packed = np.asarray(packed, dtype=np.uint8)
    scale = np.asarray(scale, dtype=np.uint8)
    rows, half = packed.shape
    cols = 2 * half
    if scale.shape != (rows, mxfp4_groups(cols)):
        raise RefError('%s: packed %s and scale %s do not describe MXFP4 with group %d'
                       % (name, packed.shape, scale.shape, MXFP4_GROUP))
    bad = np.argwhere(scale == 255)
    if len(bad):
        r, g = bad[0]
        raise RefError('%s: E8M0 scale 255 (NaN) at row %d group %d (%d such groups)'
                       % (name, r, g, len(bad)))
    vals = E2M1_BYTE[packed].reshape(rows, cols)                # (low, high) per byte
    mult = np.ldexp(1.0, scale.astype(np.int64) - 127)          # exact powers of two
    return vals * np.repeat(mult, MXFP4_GROUP, axis=1)[:, :cols]


# ============================================================================
# 3. Weights
# ============================================================================

EXPERT_CACHE_BYTES = int(os.environ.get('K3REF_EXPERT_CACHE_MB', '1024')) << 20
PFX = 'language_model.model.'
LM_HEAD = 'language_model.lm_head.weight'


class Weights:
    """Binds and shape-checks every tensor the forward pass uses, as float64."""

    def __init__(self, cfg, tensors):
        self.cfg, self.t = cfg, tensors
        self.used = set()
        self.cache = ExpertCache(EXPERT_CACHE_BYTES)
        c = cfg
        d = c.hidden
        self.embed_t = self.table(PFX + 'embed_tokens.weight', (c.vocab, d))
        self.lm_head_t = self.table(LM_HEAD, (c.vocab, d))
        small = c.vocab * d <= LM_HEAD_KEEP
        self.lm_head = self.lm_head_t.as_f64() if small else None
        self.norm = self.vec(PFX + 'norm.weight', d)
        self.f_out = (self.vec(PFX + 'output_attn_res_norm.weight', d)
                      * self.vec(PFX + 'output_attn_res_proj.weight', d))
        self.layers = [self.bind_layer(L) for L in range(c.n_layers)]
        unused = sorted(set(tensors) - self.used)
        if unused:
            sys.stderr.write('k3ref: warning: %d tensors not used, e.g. %s\n' % (len(unused), unused[0]))

    def get(self, name):
        t = self.t.get(name)
        if t is None:
            raise RefError('missing tensor %s' % name)
        self.used.add(name)
        return t

    def table(self, name, shape):
        """A [vocab, d] float tensor kept in its stored dtype (rows widened on use)."""
        t = self.get(name)
        if tuple(t.shape) != tuple(shape):
            raise RefError('%s: shape %s, expected %s' % (name, t.shape, tuple(shape)))
        t._typed()
        return t

    def embed(self, ids):
        return self.embed_t.rows_f64(np.asarray(ids))

    def logits(self, x):
        """lm_head x for rows of x; row-chunked for big vocabularies."""
        if self.lm_head is not None:
            return linear(x, self.lm_head)
        V = self.cfg.vocab
        out = np.empty((x.shape[0], V))
        step = max(1, LM_HEAD_CHUNK // self.cfg.hidden)
        for r0 in range(0, V, step):
            out[:, r0:r0 + step] = linear(x, self.lm_head_t.rows_f64(slice(r0, r0 + step)))
        return out

    def mat(self, name, shape):
        a = self.get(name).as_f64()
        if a.shape != tuple(shape):
            raise RefError('%s: shape %s, expected %s' % (name, a.shape, tuple(shape)))
        return a

    def vec(self, name, n, allow_longer=False):
        """Vectors may be stored [n] or [1, n]; A_log may be longer (use the first n)."""
        t = self.get(name)
        a = t.as_f64()
        if a.ndim == 2 and a.shape[0] == 1:
            a = a[0]
        if a.ndim != 1 or (a.shape[0] != n and not (allow_longer and a.shape[0] > n)):
            raise RefError('%s: shape %s, expected [%d] or [1, %d]' % (name, t.shape, n, n))
        return a[:n].copy()

    def conv(self, name, p, k):
        t = self.get(name)
        a = t.as_f64()
        if a.shape == (p, 1, k):
            a = a[:, 0, :]
        if a.shape != (p, k):
            raise RefError('%s: shape %s, expected [%d, 1, %d]' % (name, t.shape, p, k))
        return a

    def expert(self, pre, rows, cols):
        """One expert matrix [rows, cols]: MXFP4 (weight_packed + weight_scale) or plain.
        Shapes, dtypes and scale bytes are checked now; the float64 matrix is built
        on first use (returns a zero-argument function)."""
        if pre + '.weight_packed' in self.t:
            tp, ts = self.get(pre + '.weight_packed'), self.get(pre + '.weight_scale')
            if cols % 2 or tp.shape != (rows, cols // 2) or ts.shape != (rows, mxfp4_groups(cols)):
                raise RefError('%s: packed %s / scale %s, expected [%d, %d] / [%d, %d] (even width)'
                               % (pre, tp.shape, ts.shape, rows, cols // 2, rows,
                                  mxfp4_groups(cols)))
            if tp.dtype != 'U8':
                raise RefError('%s.weight_packed: dtype %s, expected U8' % (pre, tp.dtype))
            scale = ts.as_u8()
            if np.any(scale == 255):
                mxfp4_decode(tp.as_u8(), scale, pre)          # raises, naming the tensor
            return Lazy(self.cache, pre, lambda: mxfp4_decode(tp.as_u8(), scale, pre))
        t = self.get(pre + '.weight')
        if t.shape != (rows, cols):
            raise RefError('%s.weight: shape %s, expected %s' % (pre, t.shape, (rows, cols)))
        t._typed()
        return Lazy(self.cache, pre, t.as_f64)

    def bind_layer(self, L):
        c = self.cfg
        d = c.hidden
        p = '%slayers.%d.' % (PFX, L)
        w = {'kind': 'mla' if c.is_mla[L] else 'kda', 'dense': c.is_dense[L]}
        w['in_norm'] = self.vec(p + 'input_layernorm.weight', d)
        w['post_norm'] = self.vec(p + 'post_attention_layernorm.weight', d)
        w['f_attn'] = (self.vec(p + 'self_attention_res_norm.weight', d)
                       * self.vec(p + 'self_attention_res_proj.weight', d))
        w['f_mlp'] = (self.vec(p + 'mlp_res_norm.weight', d)
                      * self.vec(p + 'mlp_res_proj.weight', d))
        a = p + 'self_attn.'
        if w['kind'] == 'kda':
            H, D = c.kda_heads, c.kda_head_dim
            P = H * D
            for s in ('q', 'k', 'v', 'g'):
                w[s] = self.mat(a + s + '_proj.weight', (P, d))
            for s in ('q', 'k', 'v'):
                w[s + '_conv'] = self.conv(a + s + '_conv1d.weight', P, c.conv_k)
            w['o'] = self.mat(a + 'o_proj.weight', (d, P))
            fa = self.get(a + 'f_a_proj.weight').as_f64()
            if fa.ndim != 2 or fa.shape[1] != d:
                raise RefError('%sf_a_proj.weight: shape %s, expected [r, %d]' % (a, fa.shape, d))
            w['f_a'] = fa
            w['f_b'] = self.mat(a + 'f_b_proj.weight', (P, fa.shape[0]))
            w['b'] = self.mat(a + 'b_proj.weight', (H, d))
            w['A_log'] = self.vec(a + 'A_log', H, allow_longer=True)
            w['dt_bias'] = self.vec(a + 'dt_bias', P)
            w['o_norm'] = self.vec(a + 'o_norm.weight', D)
        else:
            H = c.n_heads
            qd = c.qk_nope + c.qk_rope
            w['q_a'] = self.mat(a + 'q_a_proj.weight', (c.q_lora, d))
            w['q_a_norm'] = self.vec(a + 'q_a_layernorm.weight', c.q_lora)
            w['q_b'] = self.mat(a + 'q_b_proj.weight', (H * qd, c.q_lora))
            w['kv_a'] = self.mat(a + 'kv_a_proj_with_mqa.weight', (c.kv_lora + c.qk_rope, d))
            w['kv_a_norm'] = self.vec(a + 'kv_a_layernorm.weight', c.kv_lora)
            w['kv_b'] = self.mat(a + 'kv_b_proj.weight', (H * (c.qk_nope + c.v_head), c.kv_lora))
            w['o'] = self.mat(a + 'o_proj.weight', (d, H * c.v_head))
            if c.mla_out_gate:
                w['g'] = self.mat(a + 'g_proj.weight', (H * c.v_head, d))
        if w['dense']:
            m = p + 'mlp.'
            w['mlp_gate'] = self.mat(m + 'gate_proj.weight', (c.dense_inter, d))
            w['mlp_up'] = self.mat(m + 'up_proj.weight', (c.dense_inter, d))
            w['mlp_down'] = self.mat(m + 'down_proj.weight', (d, c.dense_inter))
        else:
            m = p + 'block_sparse_moe.'
            E, lat, I = c.n_experts, c.latent, c.moe_inter
            w['router'] = self.mat(m + 'gate.weight', (E, d))
            w['router_bias'] = self.vec(m + 'gate.e_score_correction_bias', E)
            w['lat_down'] = self.mat(m + 'routed_expert_down_proj.weight', (lat, d))
            w['lat_up'] = self.mat(m + 'routed_expert_up_proj.weight', (d, lat))
            if c.latent_norm:
                w['lat_norm'] = self.vec(m + 'routed_expert_norm.weight', lat)
            if c.n_shared > 0:
                S = c.n_shared * I
                w['sh_gate'] = self.mat(m + 'shared_experts.gate_proj.weight', (S, d))
                w['sh_up'] = self.mat(m + 'shared_experts.up_proj.weight', (S, d))
                w['sh_down'] = self.mat(m + 'shared_experts.down_proj.weight', (d, S))
            w['w1'] = [self.expert('%sexperts.%d.w1' % (m, e), I, lat) for e in range(E)]
            w['w3'] = [self.expert('%sexperts.%d.w3' % (m, e), I, lat) for e in range(E)]
            w['w2'] = [self.expert('%sexperts.%d.w2' % (m, e), lat, I) for e in range(E)]
        return w


# ============================================================================
# 4. Building blocks (x: [..., n] float64)
# ============================================================================

# Diagnostic only (--sim-f32): round every matmul and norm output to float32, to
# measure how much a model amplifies float32 activation rounding. Never the reference.
SIM_F32 = False


def _f32(y):
    return y.astype(np.float32).astype(np.float64) if SIM_F32 else y


def linear(x, W):
    """y = W x for each row of x; W is [out, in]."""
    return _f32(x @ W.T)


def rmsnorm(x, w, eps):
    """w * x / sqrt(mean(x^2) + eps) over the last axis."""
    return _f32(w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)))


def situ(g, u, b1, b2):
    """SiTU-GLU: b1 tanh(g/b1) sigmoid(g) * b2 tanh(u/b2); sigmoid sees the uncapped g."""
    return (b1 * np.tanh(g / b1) * sigmoid(g)) * (b2 * np.tanh(u / b2))


def attn_res(sources, f, eps):
    """Block AttnRes. sources: list of [T, d] (raw values); f: [d] folded query.
    score_s = sum_i (s_i / rms(s)) f_i; p = softmax over sources; out = sum_s p_s s."""
    S = np.stack(sources)                                          # [m, T, d]
    keys = S / np.sqrt(np.mean(S * S, axis=-1, keepdims=True) + eps)
    score = keys @ f                                               # [m, T]
    score = score - score.max(axis=0, keepdims=True)
    p = np.exp(score)
    p = p / p.sum(axis=0, keepdims=True)
    return np.einsum('mt,mtd->td', p, S)


# ============================================================================
# 5. KDA
# ============================================================================

def kda_layer(cfg, w, x, st, mode, chunk):
    """x: [T, d] normalised input; st: {'conv_q','conv_k','conv_v','S'} updated.
    mode: 'recurrent' or 'chunked'. Returns [T, d]."""
    T = x.shape[0]
    H, D = cfg.kda_heads, cfg.kda_head_dim
    qkv = {}
    for s in ('q', 'k', 'v'):
        y, st['conv_' + s] = short_conv(linear(x, w[s]), w[s + '_conv'], st['conv_' + s])
        qkv[s] = y.reshape(T, H, D)
    q = l2norm(qkv['q']) * (1.0 / math.sqrt(D))
    k = l2norm(qkv['k'])
    v = qkv['v']
    beta = sigmoid(linear(x, w['b']))                              # [T, H]
    z = linear(linear(x, w['f_a']), w['f_b']).reshape(T, H, D)
    gate_in = np.exp(w['A_log'])[None, :, None] * (z + w['dt_bias'].reshape(H, D))
    g = cfg.gate_lb * sigmoid(gate_in)                             # log-decay in (lb, 0)
    if mode == 'recurrent':
        o = kda_recurrent(q, k, v, g, beta, st['S'])
    else:
        o = kda_chunked(q, k, v, g, beta, st['S'], chunk)
    o = rmsnorm(o, w['o_norm'], cfg.rms_eps)                        # per head, then gate
    o = o.reshape(T, H * D) * sigmoid(linear(x, w['g']))
    return linear(o, w['o'])


# ============================================================================
# 6. Gated MLA (NoPE)
# ============================================================================

def mla_layer(cfg, w, x, st, mode):
    """x: [T, d]; st: {'lat': [n, kv_lora], 'rope': [n, qk_rope]} latent cache of the
    positions before x, extended in place. mode 'absorbed' (attention over the
    latent cache, W_kvb folded into query and output) or 'expanded' (per-head K/V
    rebuilt from the latent cache). Returns [T, d]."""
    T = x.shape[0]
    H, dn, dr, dv, r = cfg.n_heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head, cfg.kv_lora
    q = linear(rmsnorm(linear(x, w['q_a']), w['q_a_norm'], cfg.rms_eps), w['q_b'])
    q = q.reshape(T, H, dn + dr)
    q_nope, q_rope = q[:, :, :dn], q[:, :, dn:]
    c = linear(x, w['kv_a'])
    lat = rmsnorm(c[:, :r], w['kv_a_norm'], cfg.rms_eps)           # latent only is normed
    rope = c[:, r:]                                                # shared, never rotated
    st['lat'] = np.concatenate([st['lat'], lat], axis=0)
    st['rope'] = np.concatenate([st['rope'], rope], axis=0)
    n = st['lat'].shape[0]
    start = n - T                                                  # position of x[0]
    scale = 1.0 / math.sqrt(dn + dr)
    kvb = w['kv_b'].reshape(H, dn + dv, r)
    W_uk, W_uv = kvb[:, :dn, :], kvb[:, dn:, :]                    # [H, dn, r], [H, dv, r]
    rope_score = np.einsum('thr,sr->ths', q_rope, st['rope'])      # [T, H, n]
    if mode == 'absorbed':
        q_lat = np.einsum('thn,hnr->thr', q_nope, W_uk)            # [T, H, r]
        score = np.einsum('thr,sr->ths', q_lat, st['lat']) + rope_score
    else:
        kv = linear(st['lat'], w['kv_b']).reshape(n, H, dn + dv)
        k_nope, v_all = kv[:, :, :dn], kv[:, :, dn:]
        score = np.einsum('thn,shn->ths', q_nope, k_nope) + rope_score
    score = score * scale
    pos = start + np.arange(T)
    causal = np.arange(n)[None, :] <= pos[:, None]                  # [T, n]
    score = np.where(causal[:, None, :], score, -np.inf)
    score = score - score.max(axis=-1, keepdims=True)
    p = np.exp(score)
    p = p / p.sum(axis=-1, keepdims=True)
    if mode == 'absorbed':
        o_lat = np.einsum('ths,sr->thr', p, st['lat'])              # [T, H, r]
        o = np.einsum('thr,hvr->thv', o_lat, W_uv)
    else:
        o = np.einsum('ths,shv->thv', p, v_all)
    o = o.reshape(T, H * dv)
    if cfg.mla_out_gate:
        o = sigmoid(linear(x, w['g'])) * o
    return linear(o, w['o'])


# ============================================================================
# 7. Stable LatentMoE and dense MLP
# ============================================================================

def route(cfg, w, x):
    """Returns (idx [T, k] in selection order, weights [T, k])."""
    s = sigmoid(linear(x, w['router']))                            # [T, E] unbiased
    sel = s + w['router_bias']
    # Stable sort of the negated score: descending, ties to the lowest index,
    # identical to repeated-max selection.
    idx = np.argsort(-sel, axis=1, kind='stable')[:, :cfg.topk]
    wts = np.take_along_axis(s, idx, axis=1)
    if cfg.moe_renorm and cfg.topk > 1:
        wts = wts / (wts.sum(axis=1, keepdims=True) + 1e-20)
    return idx, wts * cfg.routed_scale


def moe_layer(cfg, w, x):
    T = x.shape[0]
    b1, b2 = cfg.situ_b1, cfg.situ_b2
    idx, wts = route(cfg, w, x)
    z = linear(x, w['lat_down'])                                   # [T, latent]
    outs = np.zeros((T, cfg.topk, cfg.latent))
    for e in np.unique(idx):
        tt, jj = np.nonzero(idx == e)
        zz = z[tt]
        a = situ(linear(zz, w['w1'][e]()), linear(zz, w['w3'][e]()), b1, b2)
        outs[tt, jj] = linear(a, w['w2'][e]())
    u = np.zeros((T, cfg.latent))
    for j in range(cfg.topk):                                      # top-k order
        u += wts[:, j:j + 1] * outs[:, j]
    if cfg.latent_norm:
        u = rmsnorm(u, w['lat_norm'], cfg.rms_eps)                  # on the aggregate
    y = linear(u, w['lat_up'])
    if cfg.n_shared > 0:
        y = y + linear(situ(linear(x, w['sh_gate']), linear(x, w['sh_up']), b1, b2), w['sh_down'])
    return y


def dense_mlp(cfg, w, x):
    a = situ(linear(x, w['mlp_gate']), linear(x, w['mlp_up']), cfg.situ_b1, cfg.situ_b2)
    return linear(a, w['mlp_down'])


# ============================================================================
# 8. Decoder
# ============================================================================

class Model:
    def __init__(self, model_dir):
        self.dir = model_dir
        self.cfg = load_config(model_dir)
        self.w = Weights(self.cfg, open_checkpoint(model_dir))

    def new_state(self):
        return kda_mla_state(self.cfg)

    def forward(self, ids, state, kda='chunked', chunk=64, mla='absorbed', all_logits=False,
                trace=None):
        """Runs the tokens ids (continuing state). Returns logits [vocab] of the last
        position, or [T, vocab] if all_logits. If trace is a dict, it receives the
        intermediates (each [T, ...]): 'embed', and per layer L 'L.attn_in' (h after
        the attention AttnRes), 'L.attn_out', 'L.mlp_in' (h after the MLP AttnRes),
        'L.mlp_out', 'L.out' (P), then 'final_h' and 'logits'."""
        note = tracer(trace)
        c, W = self.cfg, self.w
        ids = token_ids(ids, c.vocab)
        eps = c.rms_eps
        P = W.embed(ids)                                            # [T, d]
        note('embed', P)
        blocks = []
        for L in range(c.n_layers):
            w = W.layers[L]
            h = attn_res(blocks + [P], w['f_attn'], eps) if blocks else P      # steps 1-2
            if L % c.attn_res_block == 0:                                      # step 3
                blocks.append(P)
                P = None
            xin = rmsnorm(h, w['in_norm'], eps)                                # step 4
            if w['kind'] == 'kda':
                a = kda_layer(c, w, xin, state[L], kda, chunk)
            else:
                a = mla_layer(c, w, xin, state[L], mla)
            P = a if P is None else P + a                                      # step 5
            note('%d.attn_in' % L, h)
            note('%d.attn_out' % L, a)
            h = attn_res(blocks + [P], w['f_mlp'], eps)                         # step 6
            xm = rmsnorm(h, w['post_norm'], eps)                               # step 7
            m = dense_mlp(c, w, xm) if w['dense'] else moe_layer(c, w, xm)
            P = P + m                                                          # step 8
            note('%d.mlp_in' % L, h)
            note('%d.mlp_out' % L, m)
            note('%d.out' % L, P)
        h = attn_res(blocks + [P], W.f_out, eps)
        note('final_h', h)
        if not all_logits and trace is None:
            h = h[-1:]
        logits = W.logits(rmsnorm(h, W.norm, eps))
        note('logits', logits)
        if trace is not None and not all_logits:
            logits = logits[-1:]
        return logits if all_logits else logits[0]


# ============================================================================
# 9. CLI
# ============================================================================

def main(argv=None):
    ap = argparse.ArgumentParser(description='float64 reference of Kimi K3 (greedy decode)')
    common_args(ap)
    ap.add_argument('--kda', choices=['chunked', 'recurrent'], default='chunked',
                    help='KDA prefill form (default chunked)')
    ap.add_argument('--chunk', type=int, default=64, help='KDA chunk size (default 64)')
    ap.add_argument('--mla', choices=['absorbed', 'expanded'], default='absorbed',
                    help='MLA attention form in incremental mode (default absorbed)')
    ap.add_argument('--sim-f32', action='store_true',
                    help='DIAGNOSTIC, not the reference: round matmul/norm outputs to float32')
    tail_args(ap)
    a = ap.parse_args(argv)
    check_args(ap, a)
    global SIM_F32
    SIM_F32 = a.sim_f32
    return run_cli(a, 'k3ref', lambda: Model(a.model_dir),
                   lambda m: generate(m, a.ids, a.gen, full_recompute=a.full_recompute,
                                      stop_eos=a.stop_eos, force=a.force_ids,
                                      kda=a.kda, chunk=a.chunk, mla=a.mla),
                   dict(kda='recurrent', mla='expanded'))


if __name__ == '__main__':
    sys.exit(main())
