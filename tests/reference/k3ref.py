#!/usr/bin/python3
"""k3ref.py: independent float64 reference of the Kimi K3 forward pass.

Written from the spec only (docs in /work/shared/spec: MODEL.md, seed-engine.md 1-2,
family-math.md 4-5, 8.3, 11-12); it shares no code with the C engine. Everything is
float64 NumPy; speed is not a goal, clarity and independence are.

Contents, in reading order:
  1. config.json reader (nested released shape and flat shape)
  2. safetensors reader (header parsed by hand, numpy memmap; F32/F16/BF16/F64/U8)
  3. MXFP4 expert decoding
  4. weight binding with shape checks
  5. building blocks: RMSNorm, L2 norm, SiTU, AttnRes
  6. KDA (short conv, gate, recurrent and chunked WY/UT forms)
  7. Gated MLA (expanded and absorbed/latent-cache forms)
  8. Stable LatentMoE and the dense MLP
  9. decoder with Block Attention Residuals, session state, greedy decode
 10. CLI

CLI:
  /usr/bin/python3 tests/reference/k3ref.py MODEL_DIR --ids 1,2,3 [--gen N]
      [--print-ids] [--dump-logits FILE] [--full-recompute] [--stop-eos]
      [--force-ids 4,5,...] [--kda recurrent|chunked] [--chunk 64]
      [--mla absorbed|expanded]
"""

import argparse
import json
import math
import os
import sys
import time
from collections import OrderedDict

import numpy as np


class RefError(Exception):
    """A defect of the model directory (config, shards, tensors)."""


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


class Config:
    """Model hyper-parameters; attribute names are the 'field' column above."""

    def __repr__(self):
        return 'Config(%s)' % ', '.join('%s=%r' % kv for kv in sorted(vars(self).items()))


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_fields(scope, fields, where, cfg, problems):
    """Sets cfg.ATTR from scope[KEY] for each (ATTR, KEY, kind, default) of fields
    (kind int, float or bool; default None = required). An absent or null key takes
    the default; every problem is appended (prefixed with where) so that all of them
    are reported together. Used by the other references' flat configs."""
    for attr, key, kind, default in fields:
        v = scope.get(key)
        if v is None:
            if default is None:
                problems.append('missing %s%s' % (where, key))
            else:
                setattr(cfg, attr, default)
            continue
        if kind == 'int' and not (_is_number(v) and float(v) == int(v)):
            problems.append('%s%s is not an integer: %r' % (where, key, v))
        elif kind == 'float' and not _is_number(v):
            problems.append('%s%s is not a number: %r' % (where, key, v))
        elif kind == 'bool' and not isinstance(v, bool):
            problems.append('%s%s is not a boolean: %r' % (where, key, v))
        else:
            setattr(cfg, attr, int(v) if kind == 'int' else float(v) if kind == 'float' else v)


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
            if not _is_number(val) or float(val) != int(val):
                problems.append('%s is not an integer: %r' % (key, val))
                continue
            val = int(val)
        elif kind == 'float':
            if not _is_number(val):
                problems.append('%s is not a number: %r' % (key, val))
                continue
            val = float(val)
        elif kind == 'bool':
            if not isinstance(val, bool):
                problems.append('%s is not a boolean: %r' % (key, val))
                continue
        elif kind == 'list':
            if (not isinstance(val, list) or not val
                    or not all(_is_number(x) and float(x) == int(x) for x in val)):
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


def tokenizer_eos_ids(model_dir):
    """Id of tokenizer_config.json's eos_token (a string or {content: ...}) looked up
    in its added_tokens_decoder; [] when absent or unresolvable."""
    path = os.path.join(model_dir, 'tokenizer_config.json')
    try:
        with open(path, 'rb') as f:
            tc = json.loads(f.read().decode('utf-8'))
        eos = tc.get('eos_token')
        if isinstance(eos, dict):
            eos = eos.get('content')
        return sorted(int(k) for k, v in tc.get('added_tokens_decoder', {}).items()
                      if isinstance(v, dict) and eos is not None and v.get('content') == eos)
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def load_config(model_dir, parse=None):
    """Config of a model directory (parse: the architecture's config parser, K3's by
    default); eos_ids = config eos ids plus tokenizer_config's."""
    parse = parse or parse_config
    path = os.path.join(model_dir, 'config.json')
    try:
        with open(path, 'rb') as f:
            obj = json.loads(f.read().decode('utf-8'))
    except OSError as e:
        raise RefError('%s: %s' % (path, e))
    except ValueError as e:
        raise RefError('%s: invalid JSON: %s' % (path, e))
    cfg = parse(obj)
    cfg.eos_ids = sorted(set(cfg.eos_ids) | set(tokenizer_eos_ids(model_dir)))
    return cfg


# ============================================================================
# 2. safetensors
# ============================================================================

# F8_E4M3, I32 and I64 are read only by the DeepSeek-V3 reference (dsref.py: FP8
# block weights, INT4 pack-quantized words and weight_shape); K3 refuses them at use.
_DTYPE_SIZE = {'F64': 8, 'F32': 4, 'F16': 2, 'BF16': 2, 'U8': 1, 'I8': 1,
               'F8_E4M3': 1, 'I32': 4, 'I64': 8}


def bf16_bits_to_f64(u16):
    """bf16 bit patterns (uint16 array) -> float64: bits << 16 viewed as float32."""
    u32 = np.asarray(u16, dtype=np.uint32) << np.uint32(16)
    return u32.view(np.float32).astype(np.float64)


class Tensor:
    """One tensor of one shard: name, dtype string, shape, raw bytes (memmap slice)."""

    def __init__(self, name, dtype, shape, raw, where):
        self.name, self.dtype, self.shape, self.raw, self.where = name, dtype, shape, raw, where

    def _typed(self):
        """The raw bytes viewed as the stored element type, shaped."""
        view = {'F64': '<f8', 'F32': '<f4', 'F16': '<f2', 'BF16': '<u2'}.get(self.dtype)
        if view is None:
            raise RefError('%s: dtype %s where a float tensor is expected' % (self.name, self.dtype))
        return self.raw.view(view).reshape(self.shape)

    @staticmethod
    def _widen(a, dtype):
        return bf16_bits_to_f64(a) if dtype == 'BF16' else a.astype(np.float64)

    def as_f64(self):
        """Floating tensors -> float64 array of self.shape (exact widening)."""
        return self._widen(self._typed(), self.dtype)

    def rows_f64(self, sel):
        """Rows sel (index array or slice) of a 2-D float tensor, as float64."""
        return self._widen(np.asarray(self._typed()[sel]), self.dtype)

    def view(self, np_dtype):
        """The raw bytes as np_dtype (e.g. '<i4'), shaped; no dtype check."""
        return self.raw.view(np_dtype).reshape(self.shape)

    def as_u8(self):
        if self.dtype != 'U8':
            raise RefError('%s: dtype %s where U8 is expected' % (self.name, self.dtype))
        return np.array(self.raw, dtype=np.uint8).reshape(self.shape)


def read_safetensors(path):
    """Parses one shard; returns {name: Tensor}. Offsets are checked against the file."""
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(8)
        if len(head) != 8:
            raise RefError('%s: shorter than 8 bytes' % path)
        n = int.from_bytes(head, 'little')
        if n > size - 8:
            raise RefError('%s: header length %d past end of file (%d bytes)' % (path, n, size))
        try:
            header = json.loads(f.read(n).decode('utf-8'))
        except ValueError as e:
            raise RefError('%s: bad JSON header: %s' % (path, e))
    base = 8 + n
    mm = np.memmap(path, dtype=np.uint8, mode='r') if size > 0 else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        try:
            dtype = info['dtype']
            shape = [int(x) for x in info['shape']]
            b, e = (int(x) for x in info['data_offsets'])
        except (KeyError, TypeError, ValueError):
            raise RefError('%s: malformed entry for %s' % (path, name))
        if dtype not in _DTYPE_SIZE:
            raise RefError('%s: %s has unsupported dtype %s' % (path, name, dtype))
        count = 1
        for s in shape:
            if s < 0:
                raise RefError('%s: %s has a negative dimension' % (path, name))
            count *= s
        if not (0 <= b <= e and base + e <= size):
            raise RefError('%s: %s data_offsets [%d,%d) outside the file' % (path, name, b, e))
        if e - b != count * _DTYPE_SIZE[dtype]:
            raise RefError('%s: %s has %d bytes for shape %s %s' % (path, name, e - b, shape, dtype))
        out[name] = Tensor(name, dtype, tuple(shape), mm[base + b:base + e], path)
    return out


def open_checkpoint(model_dir):
    """All tensors of a model directory: via model.safetensors.index.json when present,
    else every *.safetensors in lexical order. Returns {name: Tensor}."""
    index = os.path.join(model_dir, 'model.safetensors.index.json')
    if os.path.exists(index):
        with open(index, 'rb') as f:
            try:
                wm = json.loads(f.read().decode('utf-8'))['weight_map']
            except (ValueError, KeyError) as e:
                raise RefError('%s: %s' % (index, e))
        shards = sorted(set(wm.values()))
    else:
        wm = None
        shards = sorted(x for x in os.listdir(model_dir) if x.endswith('.safetensors'))
    if not shards:
        raise RefError('%s: no safetensors shards' % model_dir)
    tensors = {}
    for shard in shards:
        for name, t in read_safetensors(os.path.join(model_dir, shard)).items():
            if name in tensors:
                raise RefError('tensor %s appears in %s and %s' % (name, tensors[name].where, t.where))
            if wm is not None and wm.get(name) != shard:
                raise RefError('tensor %s is in %s but the index says %s' % (name, shard, wm.get(name)))
            tensors[name] = t
    if wm is not None:
        missing = [n for n in wm if n not in tensors]
        if missing:
            raise RefError('index names %d tensors not found in shards, e.g. %s' % (len(missing), missing[0]))
    return tensors


# ============================================================================
# 3. MXFP4 (OCP MX FP4: E2M1 codes, E8M0 scale per 32 inputs)
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
# 4. Weights
# ============================================================================

class _ExpertCache:
    """LRU of decoded (float64) expert matrices, bounded in bytes: decoding every
    expert of even a demo-sized model would take tens of GB."""

    def __init__(self, budget):
        self.budget, self.used, self.items = budget, 0, OrderedDict()

    def get(self, key, fn):
        a = self.items.get(key)
        if a is not None:
            self.items.move_to_end(key)
            return a
        a = fn()
        self.items[key] = a
        self.used += a.nbytes
        while self.used > self.budget and len(self.items) > 1:
            _, old = self.items.popitem(last=False)
            self.used -= old.nbytes
        return a


EXPERT_CACHE_BYTES = int(os.environ.get('K3REF_EXPERT_CACHE_MB', '1024')) << 20


class _Lazy:
    """An expert matrix decoded on call, through its model's bounded cache."""

    def __init__(self, cache, key, fn):
        self.cache, self.key, self.fn = cache, key, fn

    def __call__(self):
        return self.cache.get(self.key, self.fn)


LM_HEAD_KEEP = 1 << 26       # lm_head widened once and kept up to this many elements (512 MB)
LM_HEAD_CHUNK = 1 << 22      # else: elements widened at a time, per call
PFX = 'language_model.model.'
LM_HEAD = 'language_model.lm_head.weight'


class Weights:
    """Binds and shape-checks every tensor the forward pass uses, as float64."""

    def __init__(self, cfg, tensors):
        self.cfg, self.t = cfg, tensors
        self.used = set()
        self.cache = _ExpertCache(EXPERT_CACHE_BYTES)
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
            return _Lazy(self.cache, pre, lambda: mxfp4_decode(tp.as_u8(), scale, pre))
        t = self.get(pre + '.weight')
        if t.shape != (rows, cols):
            raise RefError('%s.weight: shape %s, expected %s' % (pre, t.shape, (rows, cols)))
        t._typed()
        return _Lazy(self.cache, pre, t.as_f64)

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


class DecoderWeights:
    """The trunk of the other references' Weights (klref, dsref): embedding and
    lm_head tables kept in their stored dtype (rows widened on use), the final norm,
    a bounded expert cache and a warning for tensors nothing read. A subclass
    supplies bind_layer(L) and may set skip(name) for tensors it never reads."""

    def __init__(self, cfg, tensors, prefix, tag, cache_bytes):
        self.cfg, self.t = cfg, tensors
        self.used = set()
        self.cache = _ExpertCache(cache_bytes)
        c, d, p = cfg, cfg.hidden, prefix
        self.embed_t = self.table(p + 'model.embed_tokens.weight')
        if c.tie_embed and p + 'lm_head.weight' not in tensors:
            self.lm_head_t = self.embed_t
        else:
            self.lm_head_t = self.table(p + 'lm_head.weight')
        self.lm_head = self.lm_head_t.as_f64() if c.vocab * d <= LM_HEAD_KEEP else None
        self.norm = self.vec(p + 'model.norm.weight', d)
        self.layers = [self.bind_layer(L) for L in range(c.n_layers)]
        unused = sorted(n for n in set(tensors) - self.used if not self.skip(n))
        if unused:
            sys.stderr.write('%s: warning: %d tensors not used, e.g. %s\n'
                             % (tag, len(unused), unused[0]))

    def skip(self, name):
        return False

    def get(self, name):
        t = self.t.get(name)
        if t is None:
            raise RefError('missing tensor %s' % name)
        self.used.add(name)
        return t

    def table(self, name):
        t = self.get(name)
        want = (self.cfg.vocab, self.cfg.hidden)
        if tuple(t.shape) != want:
            raise RefError('%s: shape %s, expected %s' % (name, list(t.shape), list(want)))
        t._typed()                                  # a float dtype
        return t

    def embed(self, ids):
        return self.embed_t.rows_f64(np.asarray(ids))

    def logits(self, x):
        if self.lm_head is not None:
            return x @ self.lm_head.T
        V = self.cfg.vocab
        out = np.empty((x.shape[0], V))
        step = max(1, LM_HEAD_CHUNK // self.cfg.hidden)
        for r0 in range(0, V, step):
            out[:, r0:r0 + step] = x @ self.lm_head_t.rows_f64(slice(r0, r0 + step)).T
        return out

    def vec(self, name, n):
        """A vector of n values; any shape with n elements whose other dimensions are
        1 ([n], [1, n], A_log's [1, 1, H, 1]); any float dtype."""
        t = self.get(name)
        if int(np.prod(t.shape)) != n or sum(1 for s in t.shape if s != 1) > 1:
            raise RefError('%s: shape %s, expected %d values' % (name, list(t.shape), n))
        return t.as_f64().reshape(n).copy()


# ============================================================================
# 5. Building blocks (x: [..., n] float64)
# ============================================================================

# Diagnostic only (--sim-f32): round every matmul and norm output to float32, to
# measure how much a model amplifies float32 activation rounding. Never the reference.
SIM_F32 = False


def _f32(y):
    return y.astype(np.float32).astype(np.float64) if SIM_F32 else y


def linear(x, W):
    """y = W x for each row of x; W is [out, in]."""
    return _f32(x @ W.T)


def sigmoid(x):
    # Both branches are safe from overflow.
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def silu(x):
    return x * sigmoid(x)


def rmsnorm(x, w, eps):
    """w * x / sqrt(mean(x^2) + eps) over the last axis."""
    return _f32(w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)))


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (sum, not mean)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


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
# 6. KDA
# ============================================================================

def short_conv(x, w, hist):
    """Causal depthwise conv + SiLU. x: [T, P] new pre-conv inputs; w: [P, K] taps
    oldest..newest (w[:, K-1] multiplies the current input); hist: [K-1, P] the
    previous K-1 inputs (oldest first, zeros at sequence start).
    Returns (SiLU(conv) [T, P], new hist [K-1, P])."""
    T = x.shape[0]
    K = w.shape[1]
    full = np.concatenate([hist, x], axis=0)                       # [K-1+T, P]
    y = np.zeros_like(x)
    for j in range(K):
        y += w[:, j] * full[j:j + T]
    return silu(y), full[T:].copy()


def kda_recurrent(q, k, v, g, beta, S):
    """Plain recurrent form, token by token. q, k: [T, H, D] (normalised, q scaled);
    v: [T, H, Dv]; g: [T, H, D] log-decay (<= 0); beta: [T, H]; S: [H, D, Dv]
    (row = key channel), updated in place. Returns o [T, H, Dv]."""
    T = q.shape[0]
    o = np.empty(v.shape)
    for t in range(T):
        S *= np.exp(g[t])[:, :, None]                              # S = diag(alpha) S
        u = np.einsum('hkv,hk->hv', S, k[t])                       # u = S^T k
        S += np.einsum('hk,hv->hkv', k[t], beta[t][:, None] * (v[t] - u))
        o[t] = np.einsum('hkv,hk->hv', S, q[t])                    # read after the write
    return o


def kda_chunked(q, k, v, g, beta, S, chunk=64):
    """Chunked WY/UT form (family-math 4.5), same contract as kda_recurrent.
    Every exp() takes a non-positive argument (pairwise differences of the
    chunk-local cumulative decay), so nothing overflows."""
    T, H, D = q.shape
    o = np.empty(v.shape)
    for c0 in range(0, T, chunk):
        n = min(chunk, T - c0)
        Q = q[c0:c0 + n].transpose(1, 0, 2)                         # [H, n, D]
        Kc = k[c0:c0 + n].transpose(1, 0, 2)
        V = v[c0:c0 + n].transpose(1, 0, 2)                         # [H, n, Dv]
        B = beta[c0:c0 + n].T                                       # [H, n]
        G = np.cumsum(g[c0:c0 + n].transpose(1, 0, 2), axis=1)      # [H, n, D] inclusive
        diff = G[:, :, None, :] - G[:, None, :, :]                  # [H, i, j, D] = G_i - G_j
        lower_strict = np.tril(np.ones((n, n), dtype=bool), -1)
        lower = np.tril(np.ones((n, n), dtype=bool), 0)
        decay = np.exp(np.where(lower[None, :, :, None], diff, -np.inf))  # 0 above diagonal
        # L[i,j] = beta_i sum_c k_i k_j exp(G_i - G_j), j < i.
        Lm = np.einsum('hic,hjc,hijc->hij', Kc, Kc, decay) * B[:, :, None]
        Lm = np.where(lower_strict[None], Lm, 0.0)
        # Tinv = (I + L)^{-1} by forward substitution, row by row.
        Tinv = np.zeros((H, n, n))
        for i in range(n):
            row = np.zeros((H, n))
            row[:, i] = 1.0
            if i > 0:
                row -= np.einsum('hm,hmj->hj', Lm[:, i, :i], Tinv[:, :i, :])
            Tinv[:, i, :] = row
        eG = np.exp(G)                                              # <= 1
        Wm = np.einsum('hij,hjc->hic', Tinv, B[:, :, None] * eG * Kc)   # [H, n, D]
        U = np.einsum('hij,hjv->hiv', Tinv, B[:, :, None] * V)         # [H, n, Dv]
        Vnew = U - np.einsum('hic,hcv->hiv', Wm, S)
        Aqk = np.einsum('hic,hjc,hijc->hij', Q, Kc, decay)          # j <= i (decay is 0 above)
        O = np.einsum('hic,hcv->hiv', eG * Q, S) + np.einsum('hij,hjv->hiv', Aqk, Vnew)
        o[c0:c0 + n] = O.transpose(1, 0, 2)
        tail = np.exp(G[:, n - 1:n, :] - G)                         # [H, n, D] exp(G_last - G_j)
        S *= eG[:, n - 1, :, None]
        S += np.einsum('hjc,hjv->hcv', tail * Kc, Vnew)
    return o


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
# 7. Gated MLA (NoPE)
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
# 8. Stable LatentMoE and dense MLP
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
# 9. Decoder, session, greedy decode
# ============================================================================

def kda_mla_state(c):
    """Per-sequence state of a KDA/MLA hybrid (K3, and Kimi Linear in klref): per
    layer the KDA conv histories (pre-conv inputs) and recurrent S, or the MLA
    latent cache."""
    st = []
    for L in range(c.n_layers):
        if c.is_mla[L]:
            st.append({'lat': np.zeros((0, c.kv_lora)), 'rope': np.zeros((0, c.qk_rope))})
        else:
            P = c.kda_heads * c.kda_head_dim
            z = np.zeros((c.conv_k - 1, P))
            st.append({'conv_q': z.copy(), 'conv_k': z.copy(), 'conv_v': z.copy(),
                       'S': np.zeros((c.kda_heads, c.kda_head_dim, c.kda_head_dim))})
    return st


def token_ids(ids, vocab):
    """A forward pass's tokens as int64; RefError when empty or outside the vocabulary."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        raise RefError('empty token list')
    if ids.min() < 0 or ids.max() >= vocab:
        raise RefError('token id outside 0..%d' % (vocab - 1))
    return ids


def tracer(trace):
    """A forward pass's note(key, val): a float64 copy into trace (a dict), or nothing
    when trace is None."""
    def note(key, val):
        if trace is not None:
            trace[key] = np.array(val)
    return note


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


def argmax_first(v):
    """Greedy pick: the first (lowest) id among equal maxima."""
    return int(np.argmax(v))


def greedy_decode(model, prompt, n_gen, full_kw, prefill_kw, step_kw, stop_eos=False,
                  force=None):
    """The greedy loop every reference shares; model.forward takes the keyword sets.
    Returns (generated ids, logits [steps, vocab]); step 0 is the logits after the
    prompt. full_kw: every step reruns the whole sequence from a fresh state (the
    oracle); else prefill_kw for the prompt, then step_kw per token on the carried
    state. force: ids fed back instead of the argmax (teacher forcing along another
    run's trajectory); the returned ids stay the argmax picks."""
    ids, rows, seq, state = [], [], list(prompt), None
    for step in range(n_gen):
        if full_kw is not None:
            logits = model.forward(seq, model.new_state(), **full_kw)
        elif step == 0:
            state = model.new_state()
            logits = model.forward(seq, state, **prefill_kw)
        else:
            logits = model.forward(seq[-1:], state, **step_kw)
        rows.append(logits)
        nxt = argmax_first(logits)
        ids.append(nxt)
        seq.append(force[step] if force is not None and step < len(force) else nxt)
        if stop_eos and nxt in model.cfg.eos_ids:
            break
    return ids, (np.stack(rows) if rows else np.zeros((0, model.cfg.vocab)))


def generate(model, prompt, n_gen, full_recompute=False, stop_eos=False, force=None,
             kda='chunked', chunk=64, mla='absorbed'):
    """Greedy decode (K3 and Kimi Linear: KDA + MLA). Incremental mode: one prefill
    (KDA chunked by default, MLA over the latent cache) then one token per step
    carrying KDA conv+S and the MLA latent cache. Full recompute: every step reruns
    the whole sequence with the plain recurrent KDA and the expanded MLA."""
    full = dict(kda='recurrent', mla='expanded') if full_recompute else None
    return greedy_decode(model, prompt, n_gen, full, dict(kda=kda, chunk=chunk, mla=mla),
                         dict(kda='recurrent', mla=mla), stop_eos, force)


# ============================================================================
# 10. CLI
# ============================================================================

def parse_ids(s):
    s = s.strip()
    if not s:
        return []
    try:
        return [int(x) for x in s.replace(' ', '').split(',') if x != '']
    except ValueError:
        raise argparse.ArgumentTypeError('expected comma-separated integers: %r' % s)


def common_args(ap):
    """The arguments every reference CLI takes first (k3ref, klref, dsref)."""
    ap.add_argument('model_dir')
    ap.add_argument('--ids', type=parse_ids, required=True, help='prompt ids, e.g. 1,2,3')
    ap.add_argument('--gen', type=int, default=1, help='tokens to generate (default 1)')
    ap.add_argument('--print-ids', action='store_true', help='print generated ids on stdout')
    ap.add_argument('--dump-logits', metavar='FILE', help='float32 LE logits, steps x vocab')
    ap.add_argument('--full-recompute', action='store_true',
                    help='oracle: rerun the whole sequence every step (recurrent KDA, expanded MLA)')
    ap.add_argument('--stop-eos', action='store_true', help='stop after an eos id')
    ap.add_argument('--force-ids', type=parse_ids, default=None,
                    help='feed these ids instead of the argmax (teacher forcing)')


def write_outputs(a, ids, logits):
    """--dump-logits (float32 LE, steps x vocab) and --print-ids, as strata run writes them."""
    if a.dump_logits:
        with open(a.dump_logits, 'wb') as f:
            f.write(np.ascontiguousarray(logits, dtype='<f4').tobytes())
    if a.print_ids:
        sys.stdout.write(','.join(str(i) for i in ids) + '\n')


def tail_args(ap):
    """The arguments every reference CLI takes last."""
    ap.add_argument('--dump-layers', metavar='FILE.npz',
                    help='float64 intermediates of the prompt prefill (see Model.forward)')
    ap.add_argument('--temp', type=float, default=0.0, help='only 0 (greedy) is supported')
    ap.add_argument('--quiet', action='store_true')


def check_args(ap, a):
    """Usage errors common to every reference CLI (exit 2 through ap.error)."""
    if a.temp != 0.0:
        ap.error('only --temp 0 (greedy) is supported')
    if hasattr(a, 'chunk'):
        if a.gen < 0 or a.chunk < 1:
            ap.error('--gen must be >= 0 and --chunk >= 1')
    elif a.gen < 0:
        ap.error('--gen must be >= 0')
    if not a.ids:
        ap.error('--ids is empty')


def check_eps_arg(ap, value, flag):
    """An epsilon option: absent, 'config' or a positive finite number."""
    if value is None or value == 'config':
        return
    try:
        eps = float(value)
    except ValueError:
        eps = float('nan')
    if not (eps > 0 and math.isfinite(eps)):
        ap.error('%s must be a positive number or "config"' % flag)


def run_cli(a, tag, load, decode, trace_kw, note=''):
    """Loads the model, decodes, writes --dump-layers / --dump-logits / --print-ids
    and the timing line; a RefError is one 'TAG: message' line and exit 1."""
    try:
        t0 = time.time()
        model = load()
        t1 = time.time()
        ids, logits = decode(model)
        t2 = time.time()
        if a.dump_layers:
            tr = {}
            model.forward(a.ids, model.new_state(), trace=tr, **trace_kw)
            np.savez(a.dump_layers, **tr)
    except RefError as e:
        sys.stderr.write('%s: %s\n' % (tag, e))
        return 1
    write_outputs(a, ids, logits)
    if not a.quiet:
        sys.stderr.write('%s: load %.2fs, %d steps in %.2fs (%s%s)\n'
                         % (tag, t1 - t0, len(ids), t2 - t1,
                            'full recompute' if a.full_recompute else 'incremental', note))
    return 0


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
