#!/usr/bin/python3
"""make_tiny.py: writes a tiny Kimi-K3-format model directory with random weights,
for the reference's own self-tests (independent of the C generator).

Released format: nested config.json (text_config + text_config.linear_attn_config,
one-based full_attn_layers), two safetensors shards + model.safetensors.index.json,
MXFP4 routed experts (weight_packed / weight_scale), a dense first layer, KDA and
MLA layers with the last two MLA, and at least two AttnRes blocks.

  /usr/bin/python3 tests/reference/make_tiny.py OUT_DIR [--seed N] [--layers 7]
      [--block 3] [--plain-experts] [--flat-config]
"""

import argparse
import json
import os
import sys

import numpy as np

PFX = 'language_model.model.'


def f64_to_bf16_bits(a):
    """float -> bf16 bit patterns, round to nearest even (finite inputs)."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


# Shapes other than the default: text_config overrides.
SHAPES = {
    'tiny': {},
    # The seed engine's weightless oracle shape (seed-engine 6.2): 13 layers, map
    # KKKMKKKMKKKMM, AttnRes boundaries 0,3,6,9,12; moe_inter 48 gives w2 a partial
    # MXFP4 scale group.
    'seed13': {'num_hidden_layers': 13, 'hidden_size': 128, 'vocab_size': 256,
               'q_lora_rank': 64, 'kv_lora_rank': 32, 'qk_nope_head_dim': 24,
               'qk_rope_head_dim': 8, 'v_head_dim': 16, 'num_experts_per_token': 2,
               'num_shared_experts': 2, 'routed_expert_hidden_size': 64,
               'moe_intermediate_size': 48, 'routed_scaling_factor': 1.0,
               'bos_token_id': 250, 'eos_token_id': 251},
    # A medium model for timing (~100 MB): 12 layers, hidden 512, vocab 32768.
    'medium': {'num_hidden_layers': 12, 'hidden_size': 512, 'vocab_size': 32768,
               'num_attention_heads': 8, 'q_lora_rank': 128, 'kv_lora_rank': 64,
               'qk_nope_head_dim': 32, 'qk_rope_head_dim': 16, 'v_head_dim': 32,
               'num_experts': 32, 'num_experts_per_token': 4, 'num_shared_experts': 1,
               'routed_expert_hidden_size': 256, 'moe_intermediate_size': 128,
               'intermediate_size': 1024, 'attn_res_block_size': 4,
               'bos_token_id': 32000, 'eos_token_id': 32001},
    # Top-1 routing (no renormalisation), no shared experts, no latent norm, no MLA
    # output gate, two dense layers, conv width 1.
    'variant': {'num_experts_per_token': 1, 'num_shared_experts': 0,
                'latent_moe_use_norm': False, 'mla_use_output_gate': False,
                'first_k_dense_replace': 2, 'moe_renormalize': False},
}


def tiny_config(layers=7, block=3, shape='tiny'):
    """Hyper-parameters of the tiny model (text_config keys)."""
    layers = SHAPES[shape].get('num_hidden_layers', layers)
    # MLA layers (0-based): every fourth layer plus the final two.
    mla0 = sorted({L for L in range(3, layers, 4)} | {layers - 2, layers - 1})
    tc = {
        'model_type': 'kimi_k3_text',
        'vocab_size': 320,
        'hidden_size': 64,
        'num_hidden_layers': layers,
        'rms_norm_eps': 1e-5,
        'tie_word_embeddings': False,
        'num_attention_heads': 4,
        'q_lora_rank': 24,
        'kv_lora_rank': 20,
        'qk_nope_head_dim': 12,
        'qk_rope_head_dim': 8,
        'v_head_dim': 10,
        'mla_use_nope': True,
        'mla_use_output_gate': True,
        'num_experts': 8,
        'num_experts_per_token': 3,
        'num_shared_experts': 1,
        'routed_expert_hidden_size': 32,
        'moe_intermediate_size': 64,
        'routed_scaling_factor': 1.5,
        'moe_renormalize': True,
        'latent_moe_use_norm': True,
        'moe_router_activation_func': 'sigmoid',
        'num_expert_group': 1,
        'topk_group': 1,
        'first_k_dense_replace': 1,
        'intermediate_size': 96,
        'attn_res_block_size': block,
        'activation_situ_beta': 4.0,
        'activation_situ_linear_beta': 25.0,
        'bos_token_id': 300,
        'eos_token_id': [301, 302],
        'head_dim': 999,          # a generic key that must NOT shadow the KDA head_dim
        'linear_attn_config': {
            'num_heads': 4,
            'head_dim': 16,
            'short_conv_kernel_size': 4,
            'gate_lower_bound': -5.0,
            'full_attn_layers': [L + 1 for L in mla0],
            'kda_layers': [L + 1 for L in range(layers) if L not in mla0],
        },
    }
    tc.update(SHAPES[shape])
    if shape == 'medium':
        tc['linear_attn_config'].update({'num_heads': 8, 'head_dim': 64})
    if shape == 'variant':
        tc['linear_attn_config']['short_conv_kernel_size'] = 1
    return tc


class Writer:
    def __init__(self, rng):
        self.rng = rng
        self.tensors = {}          # name -> (dtype string, shape, bytes)

    def add(self, name, arr, dtype):
        arr = np.asarray(arr)
        if dtype == 'BF16':
            raw = f64_to_bf16_bits(arr).astype('<u2').tobytes()
        elif dtype == 'F32':
            raw = arr.astype('<f4').tobytes()
        elif dtype == 'F16':
            raw = arr.astype('<f2').tobytes()
        elif dtype == 'U8':
            raw = arr.astype(np.uint8).tobytes()
        else:
            raise ValueError(dtype)
        self.tensors[name] = (dtype, list(arr.shape), raw)

    def mat(self, name, rows, cols, dtype='BF16', gain=1.0):
        self.add(name, self.rng.standard_normal((rows, cols)) * gain / np.sqrt(cols), dtype)

    def vec(self, name, n, lo, hi, dtype='F32', shape=None):
        a = self.rng.uniform(lo, hi, n)
        self.add(name, a.reshape(shape) if shape else a, dtype)

    def mxfp4(self, pre, rows, cols):
        """Random E2M1 codes and E8M0 scales around 2^-3 (|w| ~ 1/sqrt(cols))."""
        codes = self.rng.integers(0, 16, (rows, cols)).astype(np.uint8)
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
        scale = self.rng.integers(121, 125, (rows, (cols + 31) // 32)).astype(np.uint8)
        self.add(pre + '.weight_packed', packed, 'U8')
        self.add(pre + '.weight_scale', scale, 'U8')

    def save(self, out_dir, n_shards=2):
        """Writes the shards (tensors in name order, split by count) and the index."""
        names = sorted(self.tensors)
        per = (len(names) + n_shards - 1) // n_shards
        wm = {}
        for s in range(n_shards):
            part = names[s * per:(s + 1) * per]
            fname = 'model-%05d-of-%05d.safetensors' % (s + 1, n_shards)
            header, blobs, off = {'__metadata__': {'format': 'pt'}}, [], 0
            for n in part:
                dt, shape, raw = self.tensors[n]
                header[n] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(raw)]}
                blobs.append(raw)
                off += len(raw)
                wm[n] = fname
            hj = json.dumps(header, separators=(',', ':')).encode()
            hj += b' ' * ((8 - len(hj) % 8) % 8)
            with open(os.path.join(out_dir, fname), 'wb') as f:
                f.write(len(hj).to_bytes(8, 'little'))
                f.write(hj)
                for b in blobs:
                    f.write(b)
        with open(os.path.join(out_dir, 'model.safetensors.index.json'), 'w') as f:
            json.dump({'metadata': {}, 'weight_map': wm}, f, indent=1, sort_keys=True)


def make_ties(W, tc):
    """Exact ties everywhere a tie rule matters: router rows (and biases) of experts
    2j+1 copy those of 2j, so top-k meets equal scores (lowest index must win), and
    lm_head rows 2i+1 copy 2i, so every greedy argmax is a tie (the even id must win)."""
    for name in list(W.tensors):
        if name.endswith('block_sparse_moe.gate.weight') or name == 'language_model.lm_head.weight':
            dt, shape, raw = W.tensors[name]
            a = np.frombuffer(raw, dtype='<u2' if dt == 'BF16' else '<f4').reshape(shape).copy()
            a[1::2] = a[0:a.shape[0] - a.shape[0] % 2:2][:a[1::2].shape[0]]
            W.tensors[name] = (dt, shape, a.tobytes())
        if name.endswith('gate.e_score_correction_bias'):
            dt, shape, raw = W.tensors[name]
            a = np.frombuffer(raw, dtype='<f4').copy()
            a[1::2] = a[0::2][:a[1::2].shape[0]]
            W.tensors[name] = (dt, shape, a.tobytes())


def make_tiny(out_dir, seed=1234, layers=7, block=3, plain_experts=False, flat=False,
              shape='tiny', ties=False):
    os.makedirs(out_dir, exist_ok=True)
    tc = tiny_config(layers, block, shape)
    layers = tc['num_hidden_layers']
    lin = tc['linear_attn_config']
    rng = np.random.default_rng(seed)
    W = Writer(rng)
    d, V = tc['hidden_size'], tc['vocab_size']
    mla0 = {x - 1 for x in lin['full_attn_layers']}
    W.mat(PFX + 'embed_tokens.weight', V, d, gain=np.sqrt(d))
    W.mat('language_model.lm_head.weight', V, d, gain=2.0)
    W.vec(PFX + 'norm.weight', d, 0.8, 1.2)
    W.vec(PFX + 'output_attn_res_norm.weight', d, 0.5, 1.5, dtype='BF16')
    W.vec(PFX + 'output_attn_res_proj.weight', d, -0.3, 0.3, dtype='BF16', shape=(1, d))
    for L in range(layers):
        p = '%slayers.%d.' % (PFX, L)
        W.vec(p + 'input_layernorm.weight', d, 0.8, 1.2, dtype='BF16')
        W.vec(p + 'post_attention_layernorm.weight', d, 0.8, 1.2)
        W.vec(p + 'self_attention_res_norm.weight', d, 0.5, 1.5)
        W.vec(p + 'self_attention_res_proj.weight', d, -0.3, 0.3, shape=(1, d))
        W.vec(p + 'mlp_res_norm.weight', d, 0.5, 1.5, dtype='F16')
        W.vec(p + 'mlp_res_proj.weight', d, -0.3, 0.3, dtype='BF16', shape=(1, d))
        a = p + 'self_attn.'
        if L in mla0:
            H = tc['num_attention_heads']
            dn, dr, dv = tc['qk_nope_head_dim'], tc['qk_rope_head_dim'], tc['v_head_dim']
            ql, kl = tc['q_lora_rank'], tc['kv_lora_rank']
            W.mat(a + 'q_a_proj.weight', ql, d)
            W.vec(a + 'q_a_layernorm.weight', ql, 0.8, 1.2)
            W.mat(a + 'q_b_proj.weight', H * (dn + dr), ql, gain=2.0)
            W.mat(a + 'kv_a_proj_with_mqa.weight', kl + dr, d, gain=2.0)
            W.vec(a + 'kv_a_layernorm.weight', kl, 0.8, 1.2, dtype='BF16')
            W.mat(a + 'kv_b_proj.weight', H * (dn + dv), kl, gain=2.0)
            W.mat(a + 'o_proj.weight', d, H * dv)
            if tc['mla_use_output_gate']:
                W.mat(a + 'g_proj.weight', H * dv, d, gain=2.0)
        else:
            H, D, K = lin['num_heads'], lin['head_dim'], lin['short_conv_kernel_size']
            P = H * D
            for s in 'qkvg':
                W.mat(a + s + '_proj.weight', P, d)
            for s in 'qkv':
                W.add(a + s + '_conv1d.weight', rng.uniform(-0.6, 0.9, (P, 1, K)), 'F32')
            W.mat(a + 'o_proj.weight', d, P)
            # Low-rank decay pair of rank head_dim (128 in K3, as the engine assumes).
            W.mat(a + 'f_a_proj.weight', D, d)
            W.mat(a + 'f_b_proj.weight', P, D, gain=2.0)
            W.mat(a + 'b_proj.weight', H, d, gain=2.0)
            # A_log stored with max(H, D) entries (padding past H), as in the release.
            W.vec(a + 'A_log', max(H, D), -1.0, 1.0)
            W.vec(a + 'dt_bias', P, -1.0, 1.0)
            W.vec(a + 'o_norm.weight', D, 0.8, 1.2)
        if L < tc['first_k_dense_replace']:
            I = tc['intermediate_size']
            W.mat(p + 'mlp.gate_proj.weight', I, d, gain=2.0)
            W.mat(p + 'mlp.up_proj.weight', I, d, gain=2.0)
            W.mat(p + 'mlp.down_proj.weight', d, I)
        else:
            m = p + 'block_sparse_moe.'
            E, lat, I = tc['num_experts'], tc['routed_expert_hidden_size'], tc['moe_intermediate_size']
            S = tc['num_shared_experts'] * I
            W.mat(m + 'gate.weight', E, d, gain=2.0)
            W.vec(m + 'gate.e_score_correction_bias', E, -0.1, 0.1)
            W.mat(m + 'routed_expert_down_proj.weight', lat, d)
            W.mat(m + 'routed_expert_up_proj.weight', d, lat)
            if tc['latent_moe_use_norm']:
                W.vec(m + 'routed_expert_norm.weight', lat, 0.8, 1.2)
            if S > 0:
                W.mat(m + 'shared_experts.gate_proj.weight', S, d, gain=2.0)
                W.mat(m + 'shared_experts.up_proj.weight', S, d, gain=2.0)
                W.mat(m + 'shared_experts.down_proj.weight', d, S)
            for e in range(E):
                for nm, r, c in (('w1', I, lat), ('w2', lat, I), ('w3', I, lat)):
                    pre = '%sexperts.%d.%s' % (m, e, nm)
                    if plain_experts:
                        W.mat(pre + '.weight', r, c, gain=2.0)
                    else:
                        W.mxfp4(pre, r, c)
    if ties:
        make_ties(W, tc)
    W.save(out_dir)
    if flat:
        cfg = dict(tc)
        cfg.pop('linear_attn_config')
        cfg.pop('head_dim')
        cfg.update({'kda_num_heads': lin['num_heads'], 'kda_head_dim': lin['head_dim'],
                    'short_conv_kernel_size': lin['short_conv_kernel_size'],
                    'gate_lower_bound': lin['gate_lower_bound'],
                    'full_attn_layers': lin['full_attn_layers']})
        cfg['situ_beta'] = cfg.pop('activation_situ_beta')
        cfg['eos_token_id'] = 301
    else:
        cfg = {'architectures': ['KimiK3ForConditionalGeneration'], 'model_type': 'kimi_k3',
               'text_config': tc,
               'quantization_config': {'format': 'mxfp4', 'group_size': 32,
                                       'scale_format': 'e8m0'}}
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=1)
    return out_dir


def main():
    ap = argparse.ArgumentParser(description='write a tiny K3-format model with random weights')
    ap.add_argument('out_dir')
    ap.add_argument('--seed', type=int, default=1234)
    ap.add_argument('--layers', type=int, default=7)
    ap.add_argument('--block', type=int, default=3, help='attn_res_block_size')
    ap.add_argument('--plain-experts', action='store_true', help='bf16 experts instead of MXFP4')
    ap.add_argument('--flat-config', action='store_true', help='flat config.json (fixture shape)')
    ap.add_argument('--shape', choices=sorted(SHAPES), default='tiny')
    ap.add_argument('--ties', action='store_true',
                    help='duplicate router rows (pairs of experts) and lm_head rows (pairs of ids)')
    a = ap.parse_args()
    make_tiny(a.out_dir, a.seed, a.layers, a.block, a.plain_experts, a.flat_config, a.shape,
              a.ties)
    print(a.out_dir)
    return 0


if __name__ == '__main__':
    sys.exit(main())
