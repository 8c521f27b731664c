#!/usr/bin/python3
"""make_deepseek.py: writes tiny DeepSeek-V3 / Kimi K2 checkpoints in the PUBLISHED
layouts (family-formats.md 1, 3.2-3.3, 4; family-math.md 8-10), independently of the
engine and of `strata gen-model`.

  /usr/bin/python3 tests/reference/make_deepseek.py OUT_DIR --layout L [--seed N]
      [--shards 3] [--norm-dtype bf16|f32] [--tok-from DIR] [--shape-i64]
      [--hidden 160] [--layers 4] [--experts 16] [--topk 4] [--vocab 512]

Layouts:
  dsv3-fp8  DeepSeek-V3/R1 config.json (model_type deepseek_v3, quantization_config
            fp8 e4m3 128x128, n_group 4 / topk_group 2, 2 dense layers), every linear
            except embed/lm_head/router gate FP8 e4m3fn with an F32 weight_scale_inv
            [ceil(M/128), ceil(N/128)]; norms F32 (--norm-dtype bf16: BF16); an MTP
            layer (model.layers.<L>: enorm, hnorm, eh_proj, shared_head, its own
            embed_tokens and head copies and a full decoder layer), never to be read.
  k2-fp8    Kimi-K2-Instruct: model_type kimi_k2, FP8 linears, BF16 norms, F32
            e_score_correction_bias, n_group 1, 1 dense layer, YaRN factor 32 beta 1/1.
  k2-int4   Kimi-K2-Thinking: routed experts INT4 compressed-tensors pack-quantized
            (weight_packed I32 [M, N/8], weight_scale BF16 [M, N/32], weight_shape I32
            [2]), everything else BF16; quantization_config as the released fragment.
  k25-int4  Kimi K2.5: kimi_k25 wrapper (text_config kimi_k2, YaRN factor 64 beta
            32/1), tensors under language_model., plus vision_tower/mm_projector tensors.
  bf16      DeepSeek-V3 config without quantization_config, every tensor BF16.

Shapes are small but not multiples of 128 (hidden 160, q_b rows 192, dense 320) so
FP8 edge blocks occur. Shards are cut in state_dict order; inside a shard the data is
ordered as the safetensors writer does (wider dtypes first, then by name), so an
expert's tensors are not contiguous (FP8 scales and INT4 words ahead of the
BF16/F8 data, `experts.10` before `experts.2`). Values: embedding rows ~N(0,1),
matrices ~N(0, 1/in), norms 1 + N(0, 0.1^2), router biases in [0, 0.4); FP8 and INT4
are quantised from those values with random (non power-of-two) scales.
--tok-from DIR copies the tokenizer files of a model directory (e.g. one strata
gen-model wrote) and takes vocab_size and the special ids from its config.json.
"""

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np

LAYOUTS = ('dsv3-fp8', 'k2-fp8', 'k2-int4', 'k25-int4', 'bf16')


# ----------------------------------------------------------------------------
# Encoders (written for this writer; the reference decodes independently)
# ----------------------------------------------------------------------------

def to_bf16_bits(a):
    """float -> bf16 bit patterns (round to nearest even via float32)."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _e4m3_positive():
    """(values, codes) of the non-negative finite e4m3fn codes 0x00..0x7E, ascending."""
    vals = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        vals.append(math.ldexp(m, -9) if e == 0 else math.ldexp(8 + m, e - 10))
    return np.array(vals), np.arange(0x7F, dtype=np.uint8)


E4M3_VALS, E4M3_CODES = _e4m3_positive()


def to_e4m3(a):
    """Nearest e4m3fn code of each value (|a| <= 448)."""
    mag = np.abs(a)
    hi = np.clip(np.searchsorted(E4M3_VALS, mag), 1, len(E4M3_VALS) - 1)
    lo = hi - 1
    pick = np.where(mag - E4M3_VALS[lo] <= E4M3_VALS[hi] - mag, lo, hi)
    return (E4M3_CODES[pick] | np.where(a < 0, 0x80, 0).astype(np.uint8)).astype(np.uint8)


def quant_fp8(w, rng):
    """w [M, N] -> (e4m3 codes [M, N], f32 scale [ceil(M/128), ceil(N/128)]): per block
    scale = amax/448 times a random factor in [1, 1.3) (so scales are not powers of two
    and not all codes reach 448)."""
    M, N = w.shape
    gm, gn = -(-M // 128), -(-N // 128)
    sc = np.zeros((gm, gn), dtype=np.float32)
    codes = np.zeros((M, N), dtype=np.uint8)
    for i in range(gm):
        for j in range(gn):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = np.float32(max(np.abs(blk).max(), 1e-8) / 448.0 * rng.uniform(1.0, 1.3))
            sc[i, j] = s
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = to_e4m3(blk / float(s))
    return codes, sc


def quant_int4(w, rng):
    """w [M, N] (N % 32 == 0) -> (int32 words [M, N/8], bf16 scale bits [M, N/32])."""
    M, N = w.shape
    g = w.reshape(M, N // 32, 32)
    scale = np.abs(g).max(axis=2) / 7.0 * rng.uniform(1.0, 1.2, size=(M, N // 32))
    sbits = to_bf16_bits(np.maximum(scale, 1e-8))
    s = (sbits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    q = np.clip(np.rint(g / s[:, :, None]), -8, 7).astype(np.int64).reshape(M, N)
    nib = (q + 8).reshape(M, N // 8, 8)
    words = np.zeros((M, N // 8), dtype=np.uint64)
    for i in range(8):
        words |= nib[:, :, i].astype(np.uint64) << np.uint64(4 * i)
    return words.astype(np.uint32).view(np.int32), sbits


# ----------------------------------------------------------------------------
# Tensor collection and shard writing
# ----------------------------------------------------------------------------

_SIZE = {'F32': 4, 'I32': 4, 'I64': 8, 'BF16': 2, 'F8_E4M3': 1}


class Writer:
    def __init__(self, rng, prefix=''):
        self.rng, self.prefix, self.items = rng, prefix, []   # (name, dtype, shape, bytes)

    def raw(self, name, dtype, arr):
        arr = np.ascontiguousarray(arr)
        self.items.append((name, dtype, list(arr.shape), arr.tobytes()))

    def float(self, name, a, dtype='BF16'):
        if dtype == 'BF16':
            self.raw(name, 'BF16', to_bf16_bits(a))
        else:
            self.raw(name, 'F32', np.asarray(a, dtype='<f4'))

    def gauss(self, rows, cols, gain=1.0):
        return self.rng.standard_normal((rows, cols)) * (gain / math.sqrt(cols))

    def linear(self, pre, rows, cols, fmt, gain=1.0):
        """Linear `pre` ([rows, cols]) as bf16, fp8 (+weight_scale_inv) or int4."""
        w = self.gauss(rows, cols, gain)
        if fmt == 'fp8':
            codes, sc = quant_fp8(w, self.rng)
            self.raw(pre + 'weight', 'F8_E4M3', codes)
            self.raw(pre + 'weight_scale_inv', 'F32', sc.astype('<f4'))
        elif fmt in ('int4', 'int4-i64'):
            words, sbits = quant_int4(w, self.rng)
            self.raw(pre + 'weight_packed', 'I32', words.astype('<i4'))
            self.raw(pre + 'weight_scale', 'BF16', sbits)
            if fmt == 'int4':
                self.raw(pre + 'weight_shape', 'I32', np.array([rows, cols], dtype='<i4'))
            else:
                self.raw(pre + 'weight_shape', 'I64', np.array([rows, cols], dtype='<i8'))
        else:
            self.float(pre + 'weight', w)

    def save(self, out_dir, n_shards):
        total = sum(len(b) for _, _, _, b in self.items)
        n_shards = max(1, min(n_shards, len(self.items)))
        target = total / n_shards
        shards, cur, acc = [], [], 0
        for it in self.items:                       # state_dict order, cut by size
            cur.append(it)
            acc += len(it[3])
            if acc >= target * (len(shards) + 1) and len(shards) < n_shards - 1:
                shards.append(cur)
                cur = []
        if cur:
            shards.append(cur)
        wm = {}
        for k, items in enumerate(shards):
            fname = 'model-%05d-of-%05d.safetensors' % (k + 1, len(shards))
            # Data order of the safetensors writer: wider dtypes first, then by name.
            items = sorted(items, key=lambda it: (-_SIZE[it[1]], it[0]))
            header, off = {}, 0
            for name, dtype, shape, b in items:
                header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [off, off + len(b)]}
                off += len(b)
                wm[name] = fname
            header['__metadata__'] = {'format': 'pt'}
            hj = json.dumps(header, separators=(',', ':')).encode()
            hj += b' ' * (-len(hj) % 8)
            with open(os.path.join(out_dir, fname), 'wb') as f:
                f.write(len(hj).to_bytes(8, 'little'))
                f.write(hj)
                for it in items:
                    f.write(it[3])
        with open(os.path.join(out_dir, 'model.safetensors.index.json'), 'w') as f:
            json.dump({'metadata': {'total_size': total}, 'weight_map': dict(sorted(wm.items()))},
                      f, indent=2)
            f.write('\n')
        return len(shards), total


# ----------------------------------------------------------------------------
# Config and tensors per layout
# ----------------------------------------------------------------------------

FP8_QCFG = {'activation_scheme': 'dynamic', 'fmt': 'e4m3', 'quant_method': 'fp8',
            'weight_block_size': [128, 128]}
INT4_QCFG = {
    'config_groups': {'group_0': {
        'input_activations': None, 'output_activations': None, 'targets': ['Linear'],
        'weights': {'actorder': None, 'block_structure': None, 'dynamic': False,
                    'group_size': 32, 'num_bits': 4, 'observer': 'minmax',
                    'observer_kwargs': {}, 'strategy': 'group', 'symmetric': True,
                    'type': 'int'}}},
    'format': 'pack-quantized',
    'ignore': ['lm_head', 're:.*self_attn.*', 're:.*shared_experts.*',
               're:.*mlp\\.(gate|up|gate_up|down)_proj.*'],
    'kv_cache_scheme': None, 'quant_method': 'compressed-tensors',
    'quantization_status': 'compressed'}
AUTO_MAP = {'AutoConfig': 'configuration_deepseek.DeepseekV3Config',
            'AutoModel': 'modeling_deepseek.DeepseekV3Model',
            'AutoModelForCausalLM': 'modeling_deepseek.DeepseekV3ForCausalLM'}


def text_config(a, V, special):
    ds = a.layout in ('dsv3-fp8', 'bf16')
    rope = {'dsv3-fp8': (1e4, 40.0, 32, 1), 'bf16': (1e4, 40.0, 32, 1),
            'k2-fp8': (5e4, 32.0, 1.0, 1.0), 'k2-int4': (5e4, 64.0, 1.0, 1.0),
            'k25-int4': (5e4, 64.0, 32.0, 1.0)}[a.layout]
    c = {
        'architectures': ['DeepseekV3ForCausalLM'], 'attention_bias': False,
        'attention_dropout': 0.0, 'auto_map': AUTO_MAP,
        'bos_token_id': special[0], 'eos_token_id': special[1],
        'first_k_dense_replace': a.dense_layers, 'hidden_act': 'silu',
        'hidden_size': a.hidden, 'initializer_range': 0.02,
        'intermediate_size': a.inter, 'kv_lora_rank': a.kv_lora,
        'max_position_embeddings': 163840 if ds else 262144 if 'int4' in a.layout else 131072,
        'model_type': 'deepseek_v3' if ds else 'kimi_k2',
        'moe_intermediate_size': a.moe_inter, 'moe_layer_freq': 1,
        'n_group': a.n_group, 'n_routed_experts': a.experts, 'n_shared_experts': 1,
        'norm_topk_prob': True, 'num_attention_heads': a.heads, 'num_experts_per_tok': a.topk,
        'num_hidden_layers': a.layers, 'num_key_value_heads': a.heads,
        'num_nextn_predict_layers': 1 if a.layout == 'dsv3-fp8' or a.mtp else 0,
        'q_lora_rank': a.q_lora, 'qk_nope_head_dim': a.qk_nope, 'qk_rope_head_dim': a.qk_rope,
        'rms_norm_eps': 1e-5 if a.layout == 'k25-int4' else 1e-6,
        'rope_scaling': {'beta_fast': rope[2], 'beta_slow': rope[3], 'factor': rope[1],
                         'mscale': 1.0, 'mscale_all_dim': 1.0,
                         'original_max_position_embeddings': 4096, 'type': 'yarn'},
        'rope_theta': rope[0], 'routed_scaling_factor': 2.5 if ds else 2.827,
        'scoring_func': 'sigmoid', 'tie_word_embeddings': False, 'topk_group': a.topk_group,
        'topk_method': 'noaux_tc', 'torch_dtype': 'bfloat16',
        'transformers_version': '4.46.3' if ds else '4.48.3', 'use_cache': True,
        'v_head_dim': a.v_head, 'vocab_size': V}
    if special[2] is not None:
        c['pad_token_id'] = special[2]
    if a.layout in ('dsv3-fp8', 'k2-fp8'):
        c['quantization_config'] = FP8_QCFG
    if a.layout == 'k2-int4':
        c['quantization_config'] = INT4_QCFG
    if not ds:
        c.update({'aux_loss_alpha': 0.001, 'pretraining_tp': 1, 'seq_aux': True})
    else:
        c['ep_size'] = 1
    return c


def full_config(a, V, special):
    tc = text_config(a, V, special)
    if a.layout != 'k25-int4':
        return tc
    q = json.loads(json.dumps(INT4_QCFG))
    q['ignore'] += ['re:.*vision_tower.*', 're:.*mm_projector.*']
    tc['quantization_config'] = q
    return {
        'architectures': ['KimiK25ForConditionalGeneration'],
        'auto_map': {'AutoConfig': 'configuration_kimi_k25.KimiK25Config',
                     'AutoModel': 'modeling_kimi_k25.KimiK25ForConditionalGeneration',
                     'AutoModelForCausalLM': 'modeling_kimi_k25.KimiK25ForConditionalGeneration'},
        'bos_token_id': special[0], 'dtype': 'bfloat16', 'eos_token_id': special[1],
        'ignore_index': -100, 'media_placeholder_token_id': max(0, V - 4),
        'model_type': 'kimi_k25', 'pad_token_id': special[2] if special[2] is not None else V - 1,
        'quantization_config': q, 'text_config': tc, 'tie_word_embeddings': False,
        'transformers_version': '4.57.1', 'use_unified_vision_chunk': True,
        'video_placeholder': '<|kimi_k25_video_placeholder|>',
        'vision_config': {'hidden_size': 32, 'num_hidden_layers': 1, 'patch_size': 14,
                          'model_type': 'moonvit'}}


def layer_tensors(W, a, p, L, dense, norm_dt):
    """One decoder layer's tensors under prefix p ('...model.layers.L.')."""
    lin = 'fp8' if 'fp8' in a.layout else 'bf16'
    d, H = a.hidden, a.heads
    W.float(p + 'input_layernorm.weight', 1 + 0.1 * W.rng.standard_normal(d), norm_dt)
    s = p + 'self_attn.'
    W.linear(s + 'q_a_proj.', a.q_lora, d, lin)
    W.float(s + 'q_a_layernorm.weight', 1 + 0.1 * W.rng.standard_normal(a.q_lora), norm_dt)
    W.linear(s + 'q_b_proj.', H * (a.qk_nope + a.qk_rope), a.q_lora, lin)
    W.linear(s + 'kv_a_proj_with_mqa.', a.kv_lora + a.qk_rope, d, lin)
    W.float(s + 'kv_a_layernorm.weight', 1 + 0.1 * W.rng.standard_normal(a.kv_lora), norm_dt)
    W.linear(s + 'kv_b_proj.', H * (a.qk_nope + a.v_head), a.kv_lora, lin)
    W.linear(s + 'o_proj.', d, H * a.v_head, lin)
    W.float(p + 'post_attention_layernorm.weight', 1 + 0.1 * W.rng.standard_normal(d), norm_dt)
    m = p + 'mlp.'
    if dense:
        W.linear(m + 'gate_proj.', a.inter, d, lin)
        W.linear(m + 'up_proj.', a.inter, d, lin)
        W.linear(m + 'down_proj.', d, a.inter, lin)
        return
    E, I = a.experts, a.moe_inter
    exp = lin if 'int4' not in a.layout else ('int4-i64' if a.shape_i64 else 'int4')
    W.float(m + 'gate.weight', W.gauss(E, d, gain=2.0))           # router: never quantised
    W.float(m + 'gate.e_score_correction_bias', W.rng.uniform(0.0, 0.4, E), 'F32')
    for e in range(E):
        x = m + 'experts.%d.' % e
        W.linear(x + 'gate_proj.', I, d, exp)
        W.linear(x + 'up_proj.', I, d, exp)
        W.linear(x + 'down_proj.', d, I, exp)
    W.linear(m + 'shared_experts.gate_proj.', I, d, lin)
    W.linear(m + 'shared_experts.up_proj.', I, d, lin)
    W.linear(m + 'shared_experts.down_proj.', d, I, lin)


def read_tok_dir(tok_dir):
    """(vocab, (bos, eos, pad)) from a model directory's config.json."""
    with open(os.path.join(tok_dir, 'config.json')) as f:
        c = json.load(f)
    t = c.get('text_config') if isinstance(c.get('text_config'), dict) else c
    g = lambda k: t.get(k, c.get(k))                            # noqa: E731
    eos = g('eos_token_id')
    return int(g('vocab_size')), (g('bos_token_id'), eos[0] if isinstance(eos, list) else eos,
                                  g('pad_token_id'))


def make_deepseek(out_dir, **kw):
    a = argparse.Namespace(**dict(DEFAULTS, **kw))
    if a.layout not in LAYOUTS:
        raise SystemExit('make_deepseek: --layout must be one of %s' % ', '.join(LAYOUTS))
    ds = a.layout in ('dsv3-fp8', 'bf16')
    if a.n_group is None:
        a.n_group, a.topk_group = (4, 2) if ds else (1, 1)
    if a.dense_layers is None:
        a.dense_layers = 2 if ds else 1
    if a.norm_dtype is None:
        a.norm_dtype = 'f32' if a.layout == 'dsv3-fp8' else 'bf16'
    if 'int4' in a.layout and (a.hidden % 32 or a.moe_inter % 32):
        raise SystemExit('make_deepseek: INT4 experts need hidden and moe-inter multiples of 32')
    V, special = a.vocab, ((0, 1, None) if ds else (a.vocab - 256, a.vocab - 255, a.vocab - 1))
    if a.tok_from:
        V, special = read_tok_dir(a.tok_from)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    pre = 'language_model.' if a.layout == 'k25-int4' else ''
    W = Writer(rng)
    norm_dt = 'F32' if a.norm_dtype == 'f32' else 'BF16'
    d = a.hidden
    W.float(pre + 'model.embed_tokens.weight', rng.standard_normal((V, d)))
    for L in range(a.layers):
        layer_tensors(W, a, '%smodel.layers.%d.' % (pre, L), L, L < a.dense_layers, norm_dt)
    if a.layout == 'dsv3-fp8' or a.mtp:      # the MTP layer: read only by --draft mtp
        p = pre + 'model.layers.%d.' % a.layers
        W.float(p + 'embed_tokens.weight', rng.standard_normal((V, d)))
        W.float(p + 'enorm.weight', np.ones(d), norm_dt)
        W.float(p + 'hnorm.weight', np.ones(d), norm_dt)
        W.float(p + 'eh_proj.weight', W.gauss(d, 2 * d))
        layer_tensors(W, a, p, a.layers, False, norm_dt)
        W.float(p + 'shared_head.norm.weight', np.ones(d), norm_dt)
        W.float(p + 'shared_head.head.weight', W.gauss(V, d))
    W.float(pre + 'model.norm.weight', 1 + 0.1 * rng.standard_normal(d), norm_dt)
    W.float(pre + 'lm_head.weight', W.gauss(V, d, gain=4.0))
    if a.layout == 'k25-int4':
        W.float('mm_projector.proj.0.weight', W.gauss(d, 64))
        W.float('vision_tower.encoder.blocks.0.mlp.fc0.weight', W.gauss(32, 32))
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(full_config(a, V, special), f, indent=2, sort_keys=True)
        f.write('\n')
    n, total = W.save(out_dir, a.shards)
    if a.tok_from:
        for fn in sorted(os.listdir(a.tok_from)):
            if fn != 'config.json' and not fn.startswith('model') and \
                    os.path.isfile(os.path.join(a.tok_from, fn)):
                shutil.copyfile(os.path.join(a.tok_from, fn), os.path.join(out_dir, fn))
    return out_dir, n, total


DEFAULTS = dict(layout='dsv3-fp8', seed=0, shards=3, norm_dtype=None, tok_from=None,
                shape_i64=False, hidden=160, layers=4, dense_layers=None, experts=16,
                topk=4, n_group=None, topk_group=None, mtp=False, vocab=512, heads=4, q_lora=96,
                kv_lora=64, qk_nope=32, qk_rope=16, v_head=32, inter=320, moe_inter=96)


def main(argv=None):
    D = DEFAULTS
    ap = argparse.ArgumentParser(description='tiny DeepSeek-V3 / Kimi K2 checkpoints in '
                                 'the published layouts')
    ap.add_argument('out_dir')
    ap.add_argument('--layout', choices=LAYOUTS, required=True)
    ap.add_argument('--seed', type=int, default=D['seed'])
    ap.add_argument('--shards', type=int, default=D['shards'])
    ap.add_argument('--norm-dtype', choices=['bf16', 'f32'], default=None,
                    help='RMSNorm weight dtype (default: f32 for dsv3-fp8, else bf16)')
    ap.add_argument('--tok-from', default=None, metavar='DIR',
                    help='copy tokenizer files (and vocab/special ids) from this model dir')
    ap.add_argument('--shape-i64', action='store_true', help='INT4 weight_shape as I64')
    for k in ('hidden', 'layers', 'experts', 'topk', 'vocab', 'heads', 'q_lora', 'kv_lora',
              'qk_nope', 'qk_rope', 'v_head', 'inter', 'moe_inter'):
        ap.add_argument('--' + k.replace('_', '-'), type=int, default=D[k])
    ap.add_argument('--dense-layers', type=int, default=None)
    ap.add_argument('--n-group', type=int, default=None)
    ap.add_argument('--topk-group', type=int, default=None)
    ap.add_argument('--mtp', action='store_true', help='an MTP layer in any layout (dsv3-fp8 has one always)')
    a = ap.parse_args(argv)
    if (a.n_group is None) != (a.topk_group is None):
        ap.error('--n-group and --topk-group go together')
    out, n, total = make_deepseek(a.out_dir, **{k: v for k, v in vars(a).items() if k != 'out_dir'})
    print('wrote %s: layout %s, %d shards, %d bytes' % (out, a.layout, n, total))
    return 0


if __name__ == '__main__':
    sys.exit(main())
