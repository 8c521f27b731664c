#!/usr/bin/python3
"""make_kimi_linear.py: writes a tiny Kimi Linear checkpoint in the PUBLISHED layout
(moonshotai/Kimi-Linear-48B-A3B-Instruct: family-formats 3.1, family-math 2-3) with
random but numerically alive weights. Independent of the C engine and of
`strata gen-model`: it is how the engine meets a checkpoint it did not write.

Layout written:
- config.json: flat, the same keys as the released file (architectures, auto_map,
  model_type kimi_linear, dtype, linear_attn_config with 1-based kda_layers /
  full_attn_layers, ...), sizes replaced; sorted keys, indent 2 (transformers export).
- model-0000N-of-0000M.safetensors shards, tensors assigned in the model's state_dict
  order (embed first, lm_head last), split by bytes; inside a shard the data is
  ordered as the safetensors writer orders it (wider dtype first, then name, so
  experts.10 comes before experts.2 and F32 vectors before BF16 matrices);
  model.safetensors.index.json with metadata.total_size and the weight_map.
- Real names and dtypes: bf16 everywhere except A_log [1,1,H,1] and dt_bias [P]
  (F32); e_score_correction_bias and the RMSNorm weights bf16 by default
  (--vec-dtype f32 stores them F32, as other releases do).

  /usr/bin/python3 tests/reference/make_kimi_linear.py OUT_DIR [--seed N]
      [--hidden 64] [--layers 4] [--schedule KKKM] [--dense-layers 1]
      [--experts 8] [--topk 2] [--vocab 512] [--shards 3] [--vec-dtype bf16|f32]
      [--heads 4] [--kda-head-dim 16] [--conv 4] [--kv-lora 32] [--qk-nope 16]
      [--qk-rope 8] [--v-head 16] [--moe-inter 32] [--inter 128] [--shared 1]
      [--scale 2.446] [--no-renorm] [--index-base 1]
"""

import argparse
import json
import os
import sys

import numpy as np

# The released config.json (transformers 4.57.1 export), sizes replaced below.
RELEASED = {
    "architectures": ["KimiLinearForCausalLM"],
    "auto_map": {
        "AutoConfig": "configuration_kimi.KimiLinearConfig",
        "AutoModel": "modeling_kimi.KimiLinearModel",
        "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM",
    },
    "bos_token_id": 163584, "dtype": "bfloat16", "eos_token_id": 163586,
    "first_k_dense_replace": 1, "head_dim": 72, "hidden_act": "silu", "hidden_size": 2304,
    "initializer_range": 0.02, "intermediate_size": 9216, "kv_lora_rank": 512,
    "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
                           "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18,
                                          19, 21, 22, 23, 25, 26],
                           "num_heads": 32, "short_conv_kernel_size": 4},
    "mla_use_nope": True, "model_max_length": 1048576, "model_type": "kimi_linear",
    "moe_intermediate_size": 1024, "moe_layer_freq": 1, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "num_attention_heads": 32, "num_expert_group": 1,
    "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 27,
    "num_key_value_heads": 32, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
    "pad_token_id": 163839, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "routed_scaling_factor": 2.446, "tie_word_embeddings": False,
    "topk_group": 1, "transformers_version": "4.57.1", "use_cache": True,
    "use_grouped_topk": True, "v_head_dim": 128, "vocab_size": 163840,
}

_ITEMSIZE = {'BF16': 2, 'F32': 4}
_RANK = {'BF16': 1, 'F32': 2}       # safetensors orders wider dtypes first


def bf16_bits(a):
    """float -> bf16 bit patterns, round to nearest even (finite inputs)."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype('<u2')


def default_schedule(layers):
    """The released pattern: MLA on every fourth layer and on the last one."""
    return ''.join('M' if (L + 1) % 4 == 0 or L == layers - 1 else 'K' for L in range(layers))


class Writer:
    def __init__(self, rng):
        self.rng = rng
        self.order = []               # state_dict order
        self.t = {}                   # name -> (dtype, shape, bytes)

    def add(self, name, arr, dtype):
        arr = np.asarray(arr, dtype=np.float64)
        raw = bf16_bits(arr).tobytes() if dtype == 'BF16' else arr.astype('<f4').tobytes()
        self.order.append(name)
        self.t[name] = (dtype, list(arr.shape), raw)

    def mat(self, name, rows, cols, gain=1.0):
        self.add(name, self.rng.standard_normal((rows, cols)) * gain / np.sqrt(cols), 'BF16')

    def uni(self, name, shape, lo, hi, dtype):
        self.add(name, self.rng.uniform(lo, hi, shape), dtype)

    def save(self, out_dir, n_shards):
        total = sum(len(self.t[n][2]) for n in self.order)
        n_shards = max(1, min(n_shards, len(self.order)))
        # Contiguous runs of the state_dict order, cut at ~total/n_shards bytes.
        groups, cur, acc = [], [], 0
        for i, n in enumerate(self.order):
            cur.append(n)
            acc += len(self.t[n][2])
            left_names = len(self.order) - i - 1
            left_groups = n_shards - len(groups) - 1
            if left_groups > 0 and (acc >= total * (len(groups) + 1) / n_shards
                                    or left_names == left_groups):
                groups.append(cur)
                cur = []
        groups.append(cur)
        while len(groups) < n_shards:          # cannot happen with the rule above
            groups.append([])
        wm = {}
        for s, names in enumerate(groups):
            fname = 'model-%05d-of-%05d.safetensors' % (s + 1, n_shards)
            names = sorted(names, key=lambda n: (-_RANK[self.t[n][0]], n))
            header, off = {'__metadata__': {'format': 'pt'}}, 0
            for n in names:
                dt, shape, raw = self.t[n]
                header[n] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(raw)]}
                off += len(raw)
                wm[n] = fname
            hj = json.dumps(header, separators=(',', ':')).encode()
            hj += b' ' * ((8 - len(hj) % 8) % 8)
            with open(os.path.join(out_dir, fname), 'wb') as f:
                f.write(len(hj).to_bytes(8, 'little'))
                f.write(hj)
                for n in names:
                    f.write(self.t[n][2])
        with open(os.path.join(out_dir, 'model.safetensors.index.json'), 'w') as f:
            json.dump({'metadata': {'total_size': total},
                       'weight_map': {k: wm[k] for k in sorted(wm)}}, f, indent=2)


def make_config(a):
    L = a.layers
    sched = a.schedule or default_schedule(L)
    if len(sched) != L or set(sched) - set('KM'):
        raise ValueError('--schedule needs %d letters K (KDA) or M (MLA), got %r' % (L, sched))
    if 'K' not in sched:
        raise ValueError('--schedule has no KDA layer')
    base = a.index_base
    cfg = json.loads(json.dumps(RELEASED))
    V = a.vocab
    cfg.update({
        'hidden_size': a.hidden, 'num_hidden_layers': L, 'vocab_size': V,
        'num_attention_heads': a.heads, 'num_key_value_heads': a.heads,
        'head_dim': a.hidden // a.heads,
        'kv_lora_rank': a.kv_lora, 'qk_nope_head_dim': a.qk_nope, 'qk_rope_head_dim': a.qk_rope,
        'v_head_dim': a.v_head, 'num_experts': a.experts, 'num_experts_per_token': a.topk,
        'num_shared_experts': a.shared, 'moe_intermediate_size': a.moe_inter,
        'intermediate_size': a.inter, 'first_k_dense_replace': a.dense_layers,
        'routed_scaling_factor': a.scale, 'moe_renormalize': not a.no_renorm,
        # Special ids at the released offsets from the end of the vocabulary.
        'bos_token_id': max(0, V - 256), 'eos_token_id': max(0, V - 254), 'pad_token_id': V - 1,
    })
    lin = cfg['linear_attn_config']
    lin.update({'num_heads': a.heads, 'head_dim': a.kda_head_dim,
                'short_conv_kernel_size': a.conv,
                'kda_layers': [x + base for x in range(L) if sched[x] == 'K'],
                'full_attn_layers': [x + base for x in range(L) if sched[x] == 'M']})
    if base != 1:
        lin['kda_layer_index_base'] = base
    return cfg, sched


def make_kimi_linear(out_dir, **kw):
    """Writes the model; kw are main()'s options (argparse names). Returns out_dir."""
    a = argparse.Namespace(**dict(DEFAULTS, **kw))
    cfg, sched = make_config(a)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    W = Writer(rng)
    vdt = 'F32' if a.vec_dtype == 'f32' else 'BF16'
    d, V, L = a.hidden, a.vocab, a.layers
    H, D, K = a.heads, a.kda_head_dim, a.conv
    P = H * D
    W.mat('model.embed_tokens.weight', V, d, gain=np.sqrt(d))
    for l in range(L):
        p = 'model.layers.%d.' % l
        s = p + 'self_attn.'
        if sched[l] == 'K':
            W.uni(s + 'A_log', (1, 1, H, 1), -1.0, 1.0, 'F32')
            W.uni(s + 'dt_bias', (P,), -1.0, 1.0, 'F32')
            W.mat(s + 'b_proj.weight', H, d, gain=2.0)
            for x in 'qkv':
                W.uni(s + x + '_conv1d.weight', (P, 1, K), -0.6, 0.9, 'BF16')
            W.mat(s + 'f_a_proj.weight', D, d)                 # rank = head_dim, as released
            W.mat(s + 'f_b_proj.weight', P, D, gain=2.0)
            W.mat(s + 'g_a_proj.weight', D, d)
            W.mat(s + 'g_b_proj.weight', P, D, gain=2.0)
            W.mat(s + 'k_proj.weight', P, d)
            W.uni(s + 'o_norm.weight', (D,), 0.8, 1.2, vdt)
            W.mat(s + 'o_proj.weight', d, P)
            W.mat(s + 'q_proj.weight', P, d)
            W.mat(s + 'v_proj.weight', P, d)
        else:
            W.uni(s + 'kv_a_layernorm.weight', (a.kv_lora,), 0.8, 1.2, vdt)
            W.mat(s + 'kv_a_proj_with_mqa.weight', a.kv_lora + a.qk_rope, d, gain=2.0)
            W.mat(s + 'kv_b_proj.weight', H * (a.qk_nope + a.v_head), a.kv_lora, gain=2.0)
            W.mat(s + 'o_proj.weight', d, H * a.v_head)
            W.mat(s + 'q_proj.weight', H * (a.qk_nope + a.qk_rope), d, gain=2.0)
        if l < a.dense_layers:
            W.mat(p + 'mlp.gate_proj.weight', a.inter, d, gain=2.0)
            W.mat(p + 'mlp.up_proj.weight', a.inter, d, gain=2.0)
            W.mat(p + 'mlp.down_proj.weight', d, a.inter)
        else:
            m = p + 'block_sparse_moe.'
            I = a.moe_inter
            for e in range(a.experts):
                W.mat(m + 'experts.%d.w1.weight' % e, I, d, gain=2.0)
                W.mat(m + 'experts.%d.w2.weight' % e, d, I)
                W.mat(m + 'experts.%d.w3.weight' % e, I, d, gain=2.0)
            W.mat(m + 'gate.weight', a.experts, d, gain=2.0)
            # Positive biases: selection moves, and the HF (biased) weights stay positive.
            W.uni(m + 'gate.e_score_correction_bias', (a.experts,), 0.0, 0.4, vdt)
            if a.shared > 0:
                S = a.shared * I
                W.mat(m + 'shared_experts.down_proj.weight', d, S)
                W.mat(m + 'shared_experts.gate_proj.weight', S, d, gain=2.0)
                W.mat(m + 'shared_experts.up_proj.weight', S, d, gain=2.0)
        W.uni(p + 'input_layernorm.weight', (d,), 0.8, 1.2, vdt)
        W.uni(p + 'post_attention_layernorm.weight', (d,), 0.8, 1.2, vdt)
    W.uni('model.norm.weight', (d,), 0.8, 1.2, vdt)
    W.mat('lm_head.weight', V, d, gain=2.0)
    W.save(out_dir, a.shards)
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write('\n')
    return out_dir


DEFAULTS = dict(seed=1, hidden=64, layers=4, schedule=None, dense_layers=1, experts=8, topk=2,
                vocab=512, shards=3, vec_dtype='bf16', heads=4, kda_head_dim=16, conv=4,
                kv_lora=32, qk_nope=16, qk_rope=8, v_head=16, moe_inter=32, inter=128,
                shared=1, scale=2.446, no_renorm=False, index_base=1)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description='write a tiny Kimi Linear checkpoint in the published layout')
    ap.add_argument('out_dir')
    D = DEFAULTS
    ap.add_argument('--seed', type=int, default=D['seed'])
    ap.add_argument('--hidden', type=int, default=D['hidden'])
    ap.add_argument('--layers', type=int, default=D['layers'])
    ap.add_argument('--schedule', default=None,
                    help='one letter per layer, K = KDA, M = MLA (default: MLA every 4th '
                         'layer and the last, as released)')
    ap.add_argument('--dense-layers', type=int, default=D['dense_layers'],
                    help='first_k_dense_replace (default 1)')
    ap.add_argument('--experts', type=int, default=D['experts'])
    ap.add_argument('--topk', type=int, default=D['topk'])
    ap.add_argument('--vocab', type=int, default=D['vocab'])
    ap.add_argument('--shards', type=int, default=D['shards'])
    ap.add_argument('--vec-dtype', choices=['bf16', 'f32'], default=D['vec_dtype'],
                    help='dtype of e_score_correction_bias and the RMSNorm weights '
                         '(A_log and dt_bias are always F32)')
    ap.add_argument('--heads', type=int, default=D['heads'], help='KDA and MLA heads')
    ap.add_argument('--kda-head-dim', type=int, default=D['kda_head_dim'])
    ap.add_argument('--conv', type=int, default=D['conv'], help='short_conv_kernel_size')
    ap.add_argument('--kv-lora', type=int, default=D['kv_lora'])
    ap.add_argument('--qk-nope', type=int, default=D['qk_nope'])
    ap.add_argument('--qk-rope', type=int, default=D['qk_rope'])
    ap.add_argument('--v-head', type=int, default=D['v_head'])
    ap.add_argument('--moe-inter', type=int, default=D['moe_inter'])
    ap.add_argument('--inter', type=int, default=D['inter'], help='dense intermediate_size')
    ap.add_argument('--shared', type=int, default=D['shared'], help='num_shared_experts')
    ap.add_argument('--scale', type=float, default=D['scale'], help='routed_scaling_factor')
    ap.add_argument('--no-renorm', action='store_true', help='moe_renormalize false')
    ap.add_argument('--index-base', type=int, choices=[0, 1], default=D['index_base'],
                    help='layer lists base; 0 also writes kda_layer_index_base 0')
    a = ap.parse_args(argv)
    for k in ('hidden', 'layers', 'experts', 'topk', 'vocab', 'shards', 'heads', 'kda_head_dim',
              'conv', 'kv_lora', 'qk_nope', 'v_head', 'moe_inter', 'inter'):
        if getattr(a, k) < 1:
            ap.error('--%s must be >= 1' % k.replace('_', '-'))
    if a.qk_rope < 0 or a.shared < 0 or a.dense_layers < 0 or a.topk > a.experts:
        ap.error('need --qk-rope >= 0, --shared >= 0, --dense-layers >= 0, --topk <= --experts')
    kw = vars(a)
    out = kw.pop('out_dir')
    try:
        make_kimi_linear(out, **kw)
    except ValueError as e:
        ap.error(str(e))
    print(out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
