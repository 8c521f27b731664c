"""refcommon.py: what the float64 references share (k3ref.py, klref.py, dsref.py).

Architecture-neutral plumbing, written from the spec like the references themselves
and sharing no code with the C engine:
  1. config.json reading helpers (the field table reader, tokenizer eos ids)
  2. safetensors reader (header parsed by hand, numpy memmap) and dtype decoding
  3. the bounded LRU of decoded expert matrices and the decoder trunk's weights
  4. elementwise helpers (overflow-safe sigmoid, SiLU, L2 norm)
  5. the KDA state kernels, identical maths for K3 and Kimi Linear (family-math
     4.4 recurrent, 4.5 chunked WY/UT) and the short causal conv
  6. per-sequence KDA/MLA state, a forward pass's token check and trace, the
     greedy loop
  7. the CLI plumbing every reference shares (arguments, outputs, exit codes)
No model maths of one architecture lives here; each reference imports by name.
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
# 1. config.json helpers
# ============================================================================

class Config:
    """Model hyper-parameters; attribute names are each reference's field names."""

    def __repr__(self):
        return 'Config(%s)' % ', '.join('%s=%r' % kv for kv in sorted(vars(self).items()))


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_fields(scope, fields, where, cfg, problems):
    """Sets cfg.ATTR from scope[KEY] for each (ATTR, KEY, kind, default) of fields
    (kind int, float or bool; default None = required). An absent or null key takes
    the default; every problem is appended (prefixed with where) so that all of them
    are reported together. Used by klref's and dsref's flat configs."""
    for attr, key, kind, default in fields:
        v = scope.get(key)
        if v is None:
            if default is None:
                problems.append('missing %s%s' % (where, key))
            else:
                setattr(cfg, attr, default)
            continue
        if kind == 'int' and not (is_number(v) and float(v) == int(v)):
            problems.append('%s%s is not an integer: %r' % (where, key, v))
        elif kind == 'float' and not is_number(v):
            problems.append('%s%s is not a number: %r' % (where, key, v))
        elif kind == 'bool' and not isinstance(v, bool):
            problems.append('%s%s is not a boolean: %r' % (where, key, v))
        else:
            setattr(cfg, attr, int(v) if kind == 'int' else float(v) if kind == 'float' else v)


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


def load_config(model_dir, parse):
    """Config of a model directory (parse: the architecture's config parser, from the
    parsed config.json); eos_ids = config eos ids plus tokenizer_config's."""
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
# 3. Expert cache, decoder trunk
# ============================================================================

class ExpertCache:
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


class Lazy:
    """An expert matrix decoded on call, through its model's bounded cache."""

    def __init__(self, cache, key, fn):
        self.cache, self.key, self.fn = cache, key, fn

    def __call__(self):
        return self.cache.get(self.key, self.fn)


LM_HEAD_KEEP = 1 << 26       # lm_head widened once and kept up to this many elements (512 MB)
LM_HEAD_CHUNK = 1 << 22      # else: elements widened at a time, per call


class DecoderWeights:
    """The trunk of klref's and dsref's weights (k3ref binds its own): embedding and
    lm_head tables kept in their stored dtype (rows widened on use), the final norm,
    a bounded expert cache and a warning for tensors nothing read. A subclass
    supplies bind_layer(L) and may set skip(name) for tensors it never reads."""

    def __init__(self, cfg, tensors, prefix, tag, cache_bytes):
        self.cfg, self.t = cfg, tensors
        self.used = set()
        self.cache = ExpertCache(cache_bytes)
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
# 4. Elementwise (x: [..., n] float64)
# ============================================================================

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


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (sum, not mean)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


# ============================================================================
# 5. KDA state kernels (K3 and Kimi Linear)
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


# ============================================================================
# 6. Session state, token check, trace, greedy decode
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
# 7. CLI plumbing
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
