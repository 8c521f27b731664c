#!/usr/bin/python3
"""dsref.py: independent float64 reference of the DeepSeek-V3 architecture
(DeepseekV3ForCausalLM; model_type deepseek_v3 and kimi_k2, and Kimi K2.5's
kimi_k25 wrapper with text_config and language_model. tensor prefixes): DeepSeek-V3,
R1, V3.1, Kimi K2-Instruct, K2-Thinking, K2.5, K2.6.

Written from the published math (/work/shared/spec/family-math.md 1, 6-10, 12-13 and
family-formats.md 0-1, 3-6); it shares no code with the C engine. The safetensors
reader, the bounded expert cache and the CLI plumbing come from refcommon.py (shared
by the references, same independence rule); everything DeepSeek-specific is here, including
the FP8 and INT4 weight decoding. Everything is float64 NumPy: stored weights are
decoded exactly (FP8 value x f32 block scale and INT4 value x bf16 group scale are
exact in float64), activations are never rounded.

Contents, in reading order:
  1. config.json (flat DeepSeek/K2 keys; the kimi_k25 wrapper; YaRN rope_scaling)
  2. weight decoding: FP8 e4m3fn with 128x128 weight_scale_inv blocks, INT4
     compressed-tensors pack-quantized, bf16/f16/f32
  3. weight binding (MTP layers and vision tensors are never read)
  4. YaRN RoPE tables and the two pair conventions
  5. MLA with q-LoRA (absorbed latent cache and the expanded oracle)
  6. MoE (sigmoid router, group-limited selection) and the dense MLP
  7. decoder, session state, greedy decode
  8. CLI

CLI:
  /usr/bin/python3 tests/reference/dsref.py MODEL_DIR --ids 1,2,3 [--gen N]
      [--print-ids] [--dump-logits FILE] [--force-ids 4,5,...] [--full-recompute]
      [--mla absorbed|expanded] [--lora-norm-eps X|config] [--int4 exact|bf16]
      [--group-mask inf|zero] [--stop-eos] [--quiet]
"""

import argparse
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Shared with the other references (refcommon.py): config-file reading (+ tokenizer
# eos ids), the safetensors reader, the bounded LRU of widened expert matrices, the
# common CLI, the overflow-safe sigmoid, and a forward pass's token check and trace.
import refcommon  # noqa: E402
from refcommon import (RefError, open_checkpoint, Lazy, bf16_bits_to_f64,  # noqa: E402
                       Config, DecoderWeights, read_fields, argmax_first, greedy_decode,
                       common_args, tail_args, check_args, check_eps_arg, run_cli,
                       sigmoid, token_ids, tracer)
from refcommon import is_number as _is_num  # noqa: E402


# ============================================================================
# 1. config.json
# ============================================================================

# q_a_layernorm / kv_a_layernorm epsilon (family-math 8.3, 12.4): modeling_deepseek.py
# (the Hugging Face remote code every DeepSeek-V3/K2 repository ships) builds both with
# DeepseekV3RMSNorm's class default 1e-6, not rms_norm_eps; DeepSeek's own reference
# also uses 1e-6. vLLM passes rms_norm_eps (equal for DSV3/K2-Instruct, 1e-5 for
# K2.5). --lora-norm-eps config uses rms_norm_eps, --lora-norm-eps X any value.
LORA_NORM_EPS = 1e-6

MODEL_TYPES = ('deepseek_v3', 'kimi_k2')


# (attribute, key, kind, default; None = required).
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
    ('n_experts', 'n_routed_experts', 'int', None),
    ('topk', 'num_experts_per_tok', 'int', None),
    ('n_shared', 'n_shared_experts', 'int', 0),
    ('moe_inter', 'moe_intermediate_size', 'int', None),
    ('dense_inter', 'intermediate_size', 'int', None),
    ('routed_scale', 'routed_scaling_factor', 'float', 1.0),
    ('norm_topk', 'norm_topk_prob', 'bool', False),     # configuration_deepseek.py default
    ('first_dense', 'first_k_dense_replace', 'int', 0),
    ('moe_freq', 'moe_layer_freq', 'int', 1),
    ('n_group', 'n_group', 'int', 1),
    ('topk_group', 'topk_group', 'int', 1),
    ('rope_theta', 'rope_theta', 'float', 10000.0),
    ('tie_embed', 'tie_word_embeddings', 'bool', False),
    ('n_mtp', 'num_nextn_predict_layers', 'int', 0),
]


def yarn_get_mscale(factor, m):
    """family-math 8.2: 0.1 m ln(factor) + 1, and 1 when factor <= 1."""
    return 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0


def _parse_rope(scope, cfg, problems):
    """rope_scaling (HF config) or rope_parameters (newer transformers exports):
    None = plain RoPE; 'yarn' with factor, original_max_position_embeddings,
    beta_fast (32), beta_slow (1), mscale (1), mscale_all_dim (0)."""
    rs = scope.get('rope_scaling')
    if rs is None:
        rp = scope.get('rope_parameters')
        if isinstance(rp, dict) and rp.get('rope_type', rp.get('type')) not in (None, 'default'):
            rs = rp
    cfg.yarn = None
    if rs is None:
        return
    if not isinstance(rs, dict):
        problems.append('rope_scaling is not an object')
        return
    kind = rs.get('type', rs.get('rope_type'))
    if kind != 'yarn':
        problems.append('rope_scaling type %r: only "yarn" is implemented' % (kind,))
        return
    y = {}
    for key, default in (('factor', None), ('original_max_position_embeddings', None),
                         ('beta_fast', 32.0), ('beta_slow', 1.0), ('mscale', 1.0),
                         ('mscale_all_dim', 0.0)):
        v = rs.get(key, default)
        if not _is_num(v):
            problems.append('rope_scaling.%s is %s' % (key, 'missing' if v is None
                                                        else 'not a number: %r' % (v,)))
            continue
        y[key] = float(v)
    if len(y) == 6:
        if y['factor'] <= 0 or y['original_max_position_embeddings'] <= 0:
            problems.append('rope_scaling: factor and original_max_position_embeddings '
                            'must be positive')
        cfg.yarn = y


def parse_config(obj):
    """Config of a parsed config.json (flat DeepSeek/K2, or the kimi_k25 wrapper whose
    text_config holds the text model and whose tensors live under language_model.).
    Raises RefError listing every missing, malformed or unimplemented key."""
    if not isinstance(obj, dict):
        raise RefError('config.json: top level is not an object')
    cfg = Config()
    problems = []
    scope, cfg.prefix = obj, ''
    if obj.get('model_type') == 'kimi_k25' or isinstance(obj.get('text_config'), dict):
        scope = obj.get('text_config')
        if not isinstance(scope, dict):
            raise RefError('config.json: model_type kimi_k25 without a text_config object')
        cfg.prefix = 'language_model.'
    mt = scope.get('model_type')
    archs = scope.get('architectures') or obj.get('architectures') or []
    if mt is not None and mt not in MODEL_TYPES:
        problems.append('%smodel_type is %r, expected one of %s'
                        % ('text_config.' if cfg.prefix else '', mt, ', '.join(MODEL_TYPES)))
    if any('V32' in str(a) for a in archs) or 'index_topk' in scope:
        problems.append('DeepSeek-V3.2 sparse attention (index_topk, DeepseekV32ForCausalLM) '
                        'is not implemented')
    read_fields(scope, _FIELDS, '', cfg, problems)
    ql = scope.get('q_lora_rank')
    if ql is not None and not (_is_num(ql) and float(ql) == int(ql) and ql > 0):
        problems.append('q_lora_rank is not a positive integer or null: %r' % (ql,))
    cfg.q_lora = int(ql) if ql is not None else None
    for key, want in (('hidden_act', 'silu'), ('scoring_func', 'sigmoid'),
                      ('topk_method', 'noaux_tc')):
        v = scope.get(key, want)
        if v != want:
            problems.append('%s %r: only "%s" is implemented' % (key, v, want))
    if scope.get('attention_bias', False) is not False:
        problems.append('attention_bias is not false: biased projections are not implemented')
    _parse_rope(scope, cfg, problems)
    if problems:
        raise RefError('config.json: ' + '; '.join(problems))
    bad = []
    if min(cfg.n_layers, cfg.hidden, cfg.vocab, cfg.n_heads) <= 0:
        bad.append('non-positive layers/hidden/vocab/heads')
    if cfg.qk_rope % 2:
        bad.append('qk_rope_head_dim %d is odd' % cfg.qk_rope)
    if not (1 <= cfg.topk <= cfg.n_experts):
        bad.append('num_experts_per_tok %d outside 1..%d' % (cfg.topk, cfg.n_experts))
    if cfg.moe_freq < 1:
        bad.append('moe_layer_freq < 1')
    if cfg.n_group < 1 or cfg.n_experts % cfg.n_group:
        bad.append('n_group %d does not divide n_routed_experts %d' % (cfg.n_group, cfg.n_experts))
    elif not (1 <= cfg.topk_group <= cfg.n_group):
        bad.append('topk_group %d outside 1..n_group %d' % (cfg.topk_group, cfg.n_group))
    elif cfg.n_group > 1 and cfg.n_experts // cfg.n_group < 2:
        bad.append('n_group %d leaves fewer than 2 experts per group (a group scores its '
                   'top 2)' % cfg.n_group)
    elif cfg.topk > cfg.topk_group * (cfg.n_experts // cfg.n_group):
        bad.append('num_experts_per_tok %d exceeds the experts in %d kept groups'
                   % (cfg.topk, cfg.topk_group))
    if bad:
        raise RefError('config.json: ' + '; '.join(bad))
    # HF DeepseekV3DecoderLayer: MoE iff n_routed_experts, l >= first_k_dense_replace
    # and l % moe_layer_freq == 0; dense SwiGLU (intermediate_size) otherwise.
    cfg.is_dense = [not (L >= cfg.first_dense and L % cfg.moe_freq == 0)
                    for L in range(cfg.n_layers)]
    eos = scope.get('eos_token_id', obj.get('eos_token_id'))
    cfg.eos_ids = ([] if eos is None else [int(x) for x in eos] if isinstance(eos, list)
                   else [int(eos)])
    cfg.lora_eps = LORA_NORM_EPS
    cfg.softmax_scale = softmax_scale(cfg)
    return cfg


def softmax_scale(cfg):
    """(qk_nope + qk_rope)^-1/2, times m^2 with m = yarn_get_mscale(factor,
    mscale_all_dim) when YaRN names a non-zero mscale_all_dim (always on, as HF and
    vLLM; DeepSeek's reference applies it only past original_seq_len)."""
    s = (cfg.qk_nope + cfg.qk_rope) ** -0.5
    y = cfg.yarn
    if y is not None and y['mscale_all_dim']:
        m = yarn_get_mscale(y['factor'], y['mscale_all_dim'])
        s = s * m * m
    return s


def load_config(model_dir):
    return refcommon.load_config(model_dir, parse_config)


# ============================================================================
# 2. Weight decoding (family-math 9, 10; family-formats 4)
# ============================================================================

FP8_BLOCK = 128
INT4_GROUP = 32


def _fp8_e4m3fn_table():
    """float64 value of each e4m3fn byte: sign, 4 exponent bits (bias 7), 3 mantissa
    bits; exponent 0 is subnormal (m/8 * 2^-6); 0x7F and 0xFF are NaN; no infinity."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e = (b >> 3) & 0xF
    m = (b & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.ldexp(1.0, e - 7))
    val = sign * mag
    val[(b & 0x7F) == 0x7F] = np.nan
    return val


FP8_E4M3FN = _fp8_e4m3fn_table()


def fp8_decode(codes, scale_inv, name='?'):
    """codes: uint8 [M, N] e4m3fn; scale_inv: float64 [ceil(M/128), ceil(N/128)],
    MULTIPLIED despite its name; edge blocks cover the remainder. Returns [M, N]."""
    codes = np.asarray(codes, dtype=np.uint8)
    M, N = codes.shape
    want = (-(-M // FP8_BLOCK), -(-N // FP8_BLOCK))
    if scale_inv.shape != want:
        raise RefError('%s_scale_inv: shape %s, expected %s for a [%d, %d] FP8 weight '
                       '(128x128 blocks)' % (name, list(scale_inv.shape), list(want), M, N))
    vals = FP8_E4M3FN[codes]
    if np.isnan(vals).any():
        r, c = np.argwhere(np.isnan(vals))[0]
        raise RefError('%s: FP8 NaN code at [%d, %d]' % (name, r, c))
    if not np.isfinite(scale_inv).all():
        raise RefError('%s_scale_inv: non-finite scale' % name)
    full = np.repeat(np.repeat(scale_inv, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:M, :N]
    return vals * full


def int4_decode(packed, scale, shape, name='?', bf16_round=False):
    """compressed-tensors pack-quantized: packed int32 [M, ceil(N/8)], element n of a
    row in word n // 8 at bits 4(n % 8)..+3 (lowest nibble = lowest n), q = nibble - 8;
    scale float64 [M, ceil(N/32)] (bf16 in the file); shape = (M, N). Returns
    q * scale[:, n // 32] as float64 [M, N] (exact); bf16_round rounds each product to
    bf16 as compressed-tensors' dequantize does (q cast to bf16, bf16 multiply)."""
    M, N = shape
    words = np.asarray(packed).astype(np.int64) & 0xFFFFFFFF
    if words.shape != (M, -(-N // 8)):
        raise RefError('%s.weight_packed: shape %s, expected [%d, %d] for weight_shape [%d, %d]'
                       % (name, list(words.shape), M, -(-N // 8), M, N))
    if scale.shape != (M, -(-N // INT4_GROUP)):
        raise RefError('%s.weight_scale: shape %s, expected [%d, %d] (one per %d inputs)'
                       % (name, list(scale.shape), M, -(-N // INT4_GROUP), INT4_GROUP))
    shifts = 4 * np.arange(8, dtype=np.int64)
    q = ((words[:, :, None] >> shifts) & 0xF).reshape(M, -1)[:, :N] - 8
    w = q.astype(np.float64) * np.repeat(scale, INT4_GROUP, axis=1)[:, :N]
    if bf16_round:
        w = round_bf16(w)
    return w


def round_bf16(x):
    """Round float64 values to bfloat16 (nearest, ties to even), returned as float64.
    Used only by --int4 bf16. Exact for these products: q*scale has at most 11
    significant bits, so rounding through float32 first changes nothing."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return bf16_bits_to_f64(u.astype(np.uint16))


# ============================================================================
# 3. Weights
# ============================================================================

EXPERT_CACHE_BYTES = int(os.environ.get('DSREF_EXPERT_CACHE_MB', '1024')) << 20
# Tensors this model never reads: the wrapper's vision side (family-formats 3.3).
_SKIP = re.compile(r'^(vision_tower|mm_projector|multi_modal_projector)\.')


class Weights(DecoderWeights):
    """Binds and shape-checks every tensor the forward pass uses, decoded to float64.
    A linear `P` is `P.weight` in a float dtype, `P.weight` F8_E4M3 with
    `P.weight_scale_inv` F32, or `P.weight_packed` I32 + `P.weight_scale` BF16 +
    `P.weight_shape` I32/I64 (any linear may take any form)."""

    def __init__(self, cfg, tensors, int4_bf16=False):
        self.int4_bf16 = int4_bf16
        # MTP layers (model.layers.N.* with N >= num_hidden_layers, family-math 8.1 and
        # family-formats C6) and vision tensors are skipped without a word.
        self._mtp = re.compile(r'^%smodel\.layers\.(\d+)\.' % re.escape(cfg.prefix))
        super().__init__(cfg, tensors, cfg.prefix, 'dsref', EXPERT_CACHE_BYTES)

    def skip(self, name):
        m = self._mtp.match(name)
        return bool(_SKIP.match(name)) or (m is not None and int(m.group(1)) >= self.cfg.n_layers)

    def _bind(self, pre, rows, cols):
        """Checks linear `pre` (names, dtypes, shapes; see the class comment) and
        returns a function that decodes it to a [rows, cols] float64 matrix."""
        t = self.t
        if pre + 'weight' in t:
            w = self.get(pre + 'weight')
            if tuple(w.shape) != (rows, cols):
                raise RefError('%sweight: shape %s, expected [%d, %d]'
                               % (pre, list(w.shape), rows, cols))
            if w.dtype == 'F8_E4M3':
                s = self.get(pre + 'weight_scale_inv')
                if s.dtype != 'F32':
                    raise RefError('%sweight_scale_inv: dtype %s, expected F32' % (pre, s.dtype))
                return lambda: fp8_decode(w.view('u1'), s.as_f64(), pre + 'weight')
            if pre + 'weight_scale_inv' in t:
                raise RefError('%sweight_scale_inv next to a %s weight (FP8 expected)'
                               % (pre, w.dtype))
            w._typed()                              # a float dtype, else RefError
            return w.as_f64
        if pre + 'weight_packed' in t:
            pk, sc, sh = (self.get(pre + k) for k in ('weight_packed', 'weight_scale',
                                                       'weight_shape'))
            if pk.dtype != 'I32':
                raise RefError('%sweight_packed: dtype %s, expected I32' % (pre, pk.dtype))
            if sc.dtype != 'BF16':
                raise RefError('%sweight_scale: dtype %s, expected BF16' % (pre, sc.dtype))
            if sh.dtype not in ('I32', 'I64') or tuple(sh.shape) != (2,):
                raise RefError('%sweight_shape: %s %s, expected I32 or I64 [2]'
                               % (pre, sh.dtype, list(sh.shape)))
            shape = tuple(int(x) for x in sh.view('<i4' if sh.dtype == 'I32' else '<i8'))
            if shape != (rows, cols):
                raise RefError('%sweight_shape: %s, expected [%d, %d]' % (pre, list(shape), rows, cols))
            if tuple(pk.shape) != (rows, -(-cols // 8)) or tuple(sc.shape) != (rows, -(-cols // INT4_GROUP)):
                raise RefError('%sweight_packed %s / weight_scale %s do not describe [%d, %d] '
                               'with %d values per word and a scale per %d'
                               % (pre, list(pk.shape), list(sc.shape), rows, cols, 8, INT4_GROUP))
            return lambda: int4_decode(pk.view('<i4'), sc.as_f64(), shape, pre[:-1], self.int4_bf16)
        raise RefError('missing tensor %sweight (or %sweight_packed)' % (pre, pre))

    def mat(self, pre, rows, cols):
        return self._bind(pre, rows, cols)()

    def expert(self, pre, rows, cols):
        """One expert matrix, decoded on use through the bounded cache."""
        return Lazy(self.cache, pre, self._bind(pre, rows, cols))

    def bind_layer(self, L):
        c, d = self.cfg, self.cfg.hidden
        p = '%smodel.layers.%d.' % (c.prefix, L)
        w = {'dense': c.is_dense[L]}
        w['in_norm'] = self.vec(p + 'input_layernorm.weight', d)
        w['post_norm'] = self.vec(p + 'post_attention_layernorm.weight', d)
        a = p + 'self_attn.'
        H, dn, dr, dv, r = c.n_heads, c.qk_nope, c.qk_rope, c.v_head, c.kv_lora
        if c.q_lora is not None:
            w['q_a'] = self.mat(a + 'q_a_proj.', c.q_lora, d)
            w['q_a_norm'] = self.vec(a + 'q_a_layernorm.weight', c.q_lora)
            w['q_b'] = self.mat(a + 'q_b_proj.', H * (dn + dr), c.q_lora)
        else:
            w['q'] = self.mat(a + 'q_proj.', H * (dn + dr), d)
        w['kv_a'] = self.mat(a + 'kv_a_proj_with_mqa.', r + dr, d)
        w['kv_a_norm'] = self.vec(a + 'kv_a_layernorm.weight', r)
        w['kv_b'] = self.mat(a + 'kv_b_proj.', H * (dn + dv), r)
        w['o'] = self.mat(a + 'o_proj.', d, H * dv)
        m = p + 'mlp.'
        if w['dense']:
            I = c.dense_inter
            w['mlp'] = (self.mat(m + 'gate_proj.', I, d), self.mat(m + 'up_proj.', I, d),
                        self.mat(m + 'down_proj.', d, I))
            return w
        E, I = c.n_experts, c.moe_inter
        router = self.get(m + 'gate.weight')        # stays a float tensor in every release
        if tuple(router.shape) != (E, d):
            raise RefError('%sgate.weight: shape %s, expected [%d, %d]' % (m, list(router.shape), E, d))
        w['router'] = router.as_f64()
        w['router_bias'] = self.vec(m + 'gate.e_score_correction_bias', E)
        if c.n_shared > 0:
            S = c.n_shared * I
            w['shared'] = (self.mat(m + 'shared_experts.gate_proj.', S, d),
                           self.mat(m + 'shared_experts.up_proj.', S, d),
                           self.mat(m + 'shared_experts.down_proj.', d, S))
        e = m + 'experts.%d.'
        w['experts'] = [(self.expert(e % i + 'gate_proj.', I, d),
                         self.expert(e % i + 'up_proj.', I, d),
                         self.expert(e % i + 'down_proj.', d, I)) for i in range(E)]
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


def swiglu(x, gate, up, down):
    """down(silu(gate x) * up x) (family-math 1)."""
    g = linear(x, gate)
    return linear(g * sigmoid(g) * linear(x, up), down)


# ============================================================================
# 4. RoPE with YaRN (family-math 8.2)
# ============================================================================

def yarn_low_high(dim, theta, factor, orig, beta_fast, beta_slow):
    """The correction range: frequency indices below `low` keep their frequency,
    above `high` are divided by factor, linear ramp between."""
    def corr_dim(n_rot):
        return dim * math.log(orig / (n_rot * 2.0 * math.pi)) / (2.0 * math.log(theta))
    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    return low, high


def rope_inv_freq(cfg):
    """inv_freq [dr/2] (float64) and the cos/sin factor (family-math 8.2)."""
    dr, theta = cfg.qk_rope, cfg.rope_theta
    extra = theta ** (-np.arange(0, dr, 2, dtype=np.float64) / dr)
    y = cfg.yarn
    if y is None:
        return extra, 1.0
    low, high = yarn_low_high(dr, theta, y['factor'], y['original_max_position_embeddings'],
                              y['beta_fast'], y['beta_slow'])
    if low == high:
        high += 0.001                      # as the published code: avoids 0/0
    ramp = np.clip((np.arange(dr // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv = extra * (1.0 - ramp) + (extra / y['factor']) * ramp
    att = yarn_get_mscale(y['factor'], y['mscale']) / yarn_get_mscale(y['factor'], y['mscale_all_dim'])
    return inv, att


def rope_cos_sin(cfg, pos):
    """cos, sin [T, dr/2] at absolute 0-based positions pos, times the YaRN factor."""
    inv, att = rope_inv_freq(cfg)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang) * att, np.sin(ang) * att


def rope_interleaved(x, cos, sin):
    """x [T, ..., dr]: pair i = (x[2i], x[2i+1]) rotated by angle i (DeepSeek, vLLM
    is_neox_style=False; the layout the published checkpoints are trained with)."""
    sh = (x.shape[0],) + (1,) * (x.ndim - 2) + (cos.shape[1],)
    c, s = cos.reshape(sh), sin.reshape(sh)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def rope_hf(x, cos, sin):
    """Hugging Face modeling_deepseek.py form: permute to [evens | odds], then
    rotate-half with cos/sin repeated over both halves. Same dot products as
    rope_interleaved (the oracle uses this one so the two conventions check each other)."""
    sh = (x.shape[0],) + (1,) * (x.ndim - 2) + (2 * cos.shape[1],)
    c = np.concatenate([cos, cos], axis=1).reshape(sh)
    s = np.concatenate([sin, sin], axis=1).reshape(sh)
    xp = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    half = xp.shape[-1] // 2
    rot = np.concatenate([-xp[..., half:], xp[..., :half]], axis=-1)
    return xp * c + rot * s


# ============================================================================
# 5. MLA with q-LoRA (family-math 8.3)
# ============================================================================

def mla_layer(cfg, w, x, st, mode='absorbed'):
    """x: [T, d] (input RMSNorm applied); st: {'lat': [n, kv_lora], 'kr': [n, qk_rope]}
    latent cache of the earlier positions (n = their count = the first new position),
    extended in place. 'absorbed': attention over the latent cache with W_UK folded
    into the query and W_UV applied after, RoPE by interleaved pairs. 'expanded' (the
    oracle): per-head K = [W_UK c | kr] and V = W_UV c rebuilt from the cache, full
    192-wide dot products, RoPE in the HF permuted form. Returns [T, d]."""
    T = x.shape[0]
    H, dn, dr, dv, r = cfg.n_heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head, cfg.kv_lora
    n0 = st['lat'].shape[0]
    cos, sin = rope_cos_sin(cfg, np.arange(n0, n0 + T))
    rope = rope_interleaved if mode == 'absorbed' else rope_hf
    if 'q_a' in w:
        cq = rmsnorm(linear(x, w['q_a']), w['q_a_norm'], cfg.lora_eps)
        q = linear(cq, w['q_b']).reshape(T, H, dn + dr)
    else:
        q = linear(x, w['q']).reshape(T, H, dn + dr)
    q_nope, q_rope = q[:, :, :dn], rope(q[:, :, dn:], cos, sin)
    kv = linear(x, w['kv_a'])
    st['lat'] = np.concatenate([st['lat'], rmsnorm(kv[:, :r], w['kv_a_norm'], cfg.lora_eps)])
    st['kr'] = np.concatenate([st['kr'], rope(kv[:, r:], cos, sin)])  # shared by all heads
    n = n0 + T
    kvb = w['kv_b'].reshape(H, dn + dv, r)                  # head-major, nope rows first
    if mode == 'absorbed':
        q_lat = np.einsum('thn,hnr->thr', q_nope, kvb[:, :dn, :])
        score = (np.einsum('thr,sr->ths', q_lat, st['lat'])
                 + np.einsum('thr,sr->ths', q_rope, st['kr']))
    else:
        kvx = linear(st['lat'], w['kv_b']).reshape(n, H, dn + dv)
        K = np.concatenate([kvx[:, :, :dn], np.broadcast_to(st['kr'][:, None, :], (n, H, dr))],
                           axis=-1)
        Q = np.concatenate([q_nope, q_rope], axis=-1)
        score = np.einsum('thk,shk->ths', Q, K)
    score = score * cfg.softmax_scale
    causal = np.arange(n)[None, :] <= (n0 + np.arange(T))[:, None]
    score = np.where(causal[:, None, :], score, -np.inf)
    p = np.exp(score - score.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    if mode == 'absorbed':
        o = np.einsum('thr,hvr->thv', np.einsum('ths,sr->thr', p, st['lat']), kvb[:, dn:, :])
    else:
        o = np.einsum('ths,shv->thv', p, kvx[:, :, dn:])
    return linear(o.reshape(T, H * dv), w['o'])


# ============================================================================
# 6. MoE (family-math 6) and the dense MLP
# ============================================================================

GROUP_MASKS = ('inf', 'zero')


def route(cfg, w, x, group_mask='inf'):
    """Returns (idx [T, k] in selection order, weights [T, k]).
    s = sigmoid(router x) (float64); b = s + e_score_correction_bias, for selection
    only. With n_group > 1: a group's score is the sum of its two largest b; the
    topk_group best groups are kept (ties to the lower group); the others' b are
    masked to -inf ('inf', DeepSeek's reference and vLLM) or 0.0 ('zero', HF
    modeling_deepseek.py; the same unless a kept b is negative). Then the top-k of
    the masked b (ties to the lowest expert id). Weights: the unbiased s of the
    chosen, renormalised (sum + 1e-20) when norm_topk_prob and k > 1, times
    routed_scaling_factor."""
    s = sigmoid(linear(x, w['router']))
    b = s + w['router_bias']
    T, E, G = b.shape[0], cfg.n_experts, cfg.n_group
    if G > 1 and cfg.topk_group < G:
        bg = b.reshape(T, G, E // G)
        top2 = -np.sort(-bg, axis=2)[:, :, :2]
        gscore = top2.sum(axis=2)
        keep = np.argsort(-gscore, axis=1, kind='stable')[:, :cfg.topk_group]
        gmask = np.zeros((T, G), dtype=bool)
        np.put_along_axis(gmask, keep, True, axis=1)
        emask = np.repeat(gmask, E // G, axis=1)
        b = np.where(emask, b, -np.inf if group_mask == 'inf' else 0.0)
    idx = np.argsort(-b, axis=1, kind='stable')[:, :cfg.topk]
    wts = np.take_along_axis(s, idx, axis=1)
    if cfg.norm_topk and cfg.topk > 1:
        wts = wts / (wts.sum(axis=1, keepdims=True) + 1e-20)
    return idx, wts * cfg.routed_scale


def moe_layer(cfg, w, x, group_mask='inf'):
    T, d = x.shape
    idx, wts = route(cfg, w, x, group_mask)
    outs = np.zeros((T, cfg.topk, d))
    for e in np.unique(idx):
        tt, jj = np.nonzero(idx == e)
        g, u, dn = w['experts'][e]
        outs[tt, jj] = swiglu(x[tt], g(), u(), dn())
    y = np.zeros((T, d))
    for j in range(cfg.topk):                                  # top-k order
        y += wts[:, j:j + 1] * outs[:, j]
    if 'shared' in w:                                          # added unscaled
        y = y + swiglu(x, *w['shared'])
    return y


# ============================================================================
# 7. Decoder, session, greedy decode (family-math 7)
# ============================================================================

class Model:
    def __init__(self, model_dir, lora_eps=None, int4='exact', group_mask='inf'):
        if group_mask not in GROUP_MASKS:
            raise RefError('group mask %r, expected one of %s' % (group_mask, ', '.join(GROUP_MASKS)))
        if int4 not in ('exact', 'bf16'):
            raise RefError('int4 %r, expected exact or bf16' % (int4,))
        self.dir = model_dir
        self.cfg = load_config(model_dir)
        if lora_eps == 'config':
            self.cfg.lora_eps = self.cfg.rms_eps
        elif lora_eps is not None:
            self.cfg.lora_eps = float(lora_eps)
        self.group_mask = group_mask
        self.w = Weights(self.cfg, open_checkpoint(model_dir), int4_bf16=(int4 == 'bf16'))

    def new_state(self):
        """Per sequence: the MLA latent cache (normed latent + rotated rope key) per layer."""
        c = self.cfg
        return [{'lat': np.zeros((0, c.kv_lora)), 'kr': np.zeros((0, c.qk_rope))}
                for _ in range(c.n_layers)]

    def forward(self, ids, state, mla='absorbed', all_logits=False, trace=None):
        """Runs ids after state (updated; positions continue from the cache length).
        Returns the last position's logits [vocab], or [T, vocab] with all_logits.
        Plain pre-norm residual: h += MLA(RMSNorm(h)); h += FFN(RMSNorm(h));
        logits = lm_head RMSNorm(h). trace (a dict) receives float64 intermediates
        [T, ...]: 'embed'; per layer L 'L.attn_out', 'L.mlp_out', 'L.out'; 'logits'."""
        note = tracer(trace)
        c, W = self.cfg, self.w
        ids = token_ids(ids, c.vocab)
        h = W.embed(ids)
        note('embed', h)
        for L in range(c.n_layers):
            w = W.layers[L]
            a = mla_layer(c, w, rmsnorm(h, w['in_norm'], c.rms_eps), state[L], mla)
            h = h + a
            x = rmsnorm(h, w['post_norm'], c.rms_eps)
            m = swiglu(x, *w['mlp']) if w['dense'] else moe_layer(c, w, x, self.group_mask)
            h = h + m
            note('%d.attn_out' % L, a)
            note('%d.mlp_out' % L, m)
            note('%d.out' % L, h)
        if not all_logits and trace is None:
            h = h[-1:]
        logits = W.logits(rmsnorm(h, W.norm, c.rms_eps))
        note('logits', logits)
        return logits if all_logits else logits[-1]


def generate(model, prompt, n_gen, full_recompute=False, stop_eos=False, force=None,
             mla='absorbed'):
    """Greedy decode (refcommon.greedy_decode). Incremental: one prefill, then one token
    per step over the carried latent cache. Full recompute (the oracle): every step
    reruns the whole sequence from a fresh state with the expanded MLA."""
    full = dict(mla='expanded') if full_recompute else None
    return greedy_decode(model, prompt, n_gen, full, dict(mla=mla), dict(mla=mla),
                         stop_eos, force)


# ============================================================================
# 8. CLI
# ============================================================================

def main(argv=None):
    ap = argparse.ArgumentParser(description='float64 reference of DeepSeek-V3 / Kimi K2 '
                                 '(greedy decode)')
    common_args(ap)
    ap.add_argument('--mla', choices=['absorbed', 'expanded'], default='absorbed',
                    help='MLA form in incremental mode (default absorbed)')
    ap.add_argument('--lora-norm-eps', default=None, metavar='X|config',
                    help='q_a/kv_a_layernorm epsilon (default 1e-6 as modeling_deepseek.py; '
                         'config = rms_norm_eps, as vLLM)')
    ap.add_argument('--int4', choices=['exact', 'bf16'], default='exact',
                    help='INT4 dequantisation: exact q*scale (default) or rounded to bf16 '
                         '(compressed-tensors dequantize)')
    ap.add_argument('--group-mask', choices=GROUP_MASKS, default='inf',
                    help='value of experts in dropped groups: -inf (default; DeepSeek '
                         'reference, vLLM) or 0.0 (HF modeling_deepseek.py)')
    tail_args(ap)
    a = ap.parse_args(argv)
    check_args(ap, a)
    check_eps_arg(ap, a.lora_norm_eps, '--lora-norm-eps')
    return run_cli(a, 'dsref', lambda: Model(a.model_dir, lora_eps=a.lora_norm_eps, int4=a.int4,
                                             group_mask=a.group_mask),
                   lambda m: generate(m, a.ids, a.gen, full_recompute=a.full_recompute,
                                      stop_eos=a.stop_eos, force=a.force_ids, mla=a.mla),
                   dict(mla='expanded'))


if __name__ == '__main__':
    sys.exit(main())
