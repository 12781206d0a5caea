#!/usr/bin/env python3
"""Writes the example planner profiles in this folder (python3 make_profiles.py).

The profiles are estimates, not measurements: they are what `pliant plan` and the
tests need to exercise the planner on realistic shapes. Every number comes from the
model's real sizes and a short, stated cost model below, so the files are
reproducible and the reasoning can be checked. A real job measures its own profile
(`profile: auto` in the TrainingJob).

Profile format (one microbatch of `microbatch_size` sequences):
  forward_ms / backward_ms   time of the layer on d GPUs of one node working together
                             (tensor parallel), keyed by d
  param_bytes                fp32 weights of the layer (the planner's memory model counts
                             4 x this: weights, gradients, Adam m and v)
  activation_bytes           what the layer keeps from forward for backward, per microbatch
  output_bytes               the tensor sent to the next stage (bf16 hidden states)

Cost model used for the times:
  * matmul FLOPs of a transformer block per token: forward 2 x (block params) for the
    linear layers plus 4 x seq x channels for attention (QK^T and AV); backward = 2 x
    forward.
  * achieved throughput on ONE GPU: `tflops` below (a fraction of the bf16 peak that
    small matmuls reach; A100: 312 TFLOPS peak).
  * on d GPUs of one node (Megatron-style tensor parallelism): compute / (d x eff[d])
    plus two all-reduces of the layer's output per pass (forward and backward), ring
    algorithm, 2 (d-1)/d x bytes at the intra-node bandwidth.
  * embedding: a memory-bound gather (forward) and scatter-add into the wte gradient
    (backward), estimated from the bytes touched at `hbm_GBps`.
  * head = final layernorm + LM head matmul with the tied wte (its weight bytes are in
    the embedding, its time is here) + softmax cross-entropy over the vocabulary
    (memory-bound over the logits).
Activation bytes of a block: 34 x seq x batch x channels bytes (Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", 16-bit activations,
flash attention so no seq^2 score matrices kept).
Times are rounded to 1 microsecond (0.001 ms) so the files stay readable.
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def ms(x):
    return round(x, 3)


def gpt_profile(*, model, vocab, max_seq, channels, layers, seq, micro, gpus_per_node,
                gpu_memory_bytes, intra_GBps, inter_GBps, tflops, hbm_GBps, eff):
    C, T = channels, seq * micro                        # channels, tokens per microbatch
    keys = [d for d in (1, 2, 4, 8) if d <= gpus_per_node]
    hidden_bf16 = T * C * 2                             # one hidden-state tensor, bf16

    def allreduce_ms(nbytes, d):
        if d == 1:
            return 0.0
        return 2 * (d - 1) / d * nbytes / (intra_GBps * 1e6)

    def split(compute_ms, comm_bytes):
        """forward/backward times per key for a layer with this 1-GPU compute time."""
        out = {}
        for d in keys:
            out[str(d)] = ms(compute_ms / (d * eff[d]) + allreduce_ms(comm_bytes, d))
        return out

    prof_layers = []

    # Embedding: wte + wpe, fp32. Forward reads T rows of wte and wpe and writes the
    # bf16 hidden state; backward scatter-adds into the full wte gradient (which is
    # zeroed/accumulated: read + write of the whole fp32 table).
    emb_params = (vocab + max_seq) * C
    emb_fwd = (T * C * 4 * 2 + hidden_bf16) / (hbm_GBps * 1e6)
    emb_bwd = (emb_params * 4 * 2 + hidden_bf16) / (hbm_GBps * 1e6)
    prof_layers.append({
        "name": "embedding",
        "forward_ms": {str(d): ms(emb_fwd / d + 0.01 * (d > 1)) for d in keys},
        "backward_ms": {str(d): ms(emb_bwd / d + allreduce_ms(hidden_bf16, d)) for d in keys},
        "param_bytes": emb_params * 4,
        "activation_bytes": hidden_bf16 + T * 4,         # output (for dropout) + token ids
        "output_bytes": hidden_bf16,
    })

    # Transformer blocks: ln1, attn (qkv, proj), ln2, mlp (fc 4C, proj).
    block_params = 12 * C * C + 13 * C
    block_fwd_flops = T * (2 * block_params + 4 * seq * C)
    block_fwd = block_fwd_flops / (tflops * 1e9)
    for i in range(layers):
        prof_layers.append({
            "name": "block.%d" % i,
            "forward_ms": split(block_fwd, 2 * hidden_bf16),
            "backward_ms": split(2 * block_fwd, 2 * hidden_bf16),
            "param_bytes": block_params * 4,
            "activation_bytes": 34 * T * C,
            "output_bytes": hidden_bf16,
        })

    # Head: final layernorm (2C params) + tied LM head + cross-entropy.
    head_flops = T * 2 * C * vocab
    logits_bf16 = T * vocab * 2
    head_fwd = head_flops / (tflops * 1e9) + 2 * logits_bf16 / (hbm_GBps * 1e6)
    head_bwd = 2 * head_flops / (tflops * 1e9) + 2 * logits_bf16 / (hbm_GBps * 1e6)
    prof_layers.append({
        "name": "head",
        "forward_ms": split(head_fwd, T * 4),            # vocab-parallel: all-reduce of per-token sums
        "backward_ms": split(head_bwd, hidden_bf16),
        "param_bytes": 2 * C * 4,
        "activation_bytes": logits_bf16 + 4 * hidden_bf16,  # logits + layernorm in/out
        "output_bytes": micro * 4,                        # per-sequence losses, fp32
    })

    return {
        "model": model,
        "microbatch_size": micro,
        "gpus_per_node": gpus_per_node,
        "gpu_memory_bytes": gpu_memory_bytes,
        "intra_node_GBps": intra_GBps,
        "inter_node_GBps": inter_GBps,
        "layers": prof_layers,
    }


def gpt2_124m_a100():
    # GPT-2 small (124M): 12 blocks, 768 channels, vocab 50257, context 1024.
    # Microbatch: 4 sequences x 1024 tokens. Nodes of 4 x A100-40GB (NVLink, about
    # 150 GB/s per GPU pair direction usable), 200 Gb/s InfiniBand (25 GB/s) between nodes.
    # A small model reaches about 40% of the 312 TFLOPS bf16 peak: 125 TFLOPS.
    p = gpt_profile(model="gpt2-124m", vocab=50257, max_seq=1024, channels=768, layers=12,
                    seq=1024, micro=4, gpus_per_node=4, gpu_memory_bytes=40 * 2**30,
                    intra_GBps=150.0, inter_GBps=25.0, tflops=125.0, hbm_GBps=1555.0,
                    eff={1: 1.0, 2: 0.85, 4: 0.65})
    # The brief's exact sizes: (50257 + 1024) x 768 fp32, 7,087,872 params a block.
    assert p["layers"][0]["param_bytes"] == (50257 + 1024) * 768 * 4
    assert p["layers"][1]["param_bytes"] == 7087872 * 4
    assert p["layers"][1]["output_bytes"] == 4 * 1024 * 768 * 2
    return p


def gpt3_2_7b_8gpu():
    # GPT-3 2.7B: 32 blocks, 2560 channels, 32 heads, vocab 50257, context 2048.
    # Microbatch: 2 sequences x 2048 tokens. Nodes of 8 x A100-80GB SXM (NVSwitch,
    # 300 GB/s usable), 4 x 100 Gb/s InfiniBand between nodes (50 GB/s).
    # Larger matmuls reach about 50% of peak: 155 TFLOPS.
    return gpt_profile(model="gpt3-2.7b", vocab=50257, max_seq=2048, channels=2560, layers=32,
                       seq=2048, micro=2, gpus_per_node=8, gpu_memory_bytes=80 * 10**9,
                       intra_GBps=300.0, inter_GBps=50.0, tflops=155.0, hbm_GBps=2039.0,
                       eff={1: 1.0, 2: 0.9, 4: 0.78, 8: 0.62})


def gpt3_2_7b_a40():
    # GPT-3 2.7B on Oobleck's cluster (SOSP '23 §7.1): one NVIDIA A40 a node, 40 GB as the
    # paper states it, 200 Gb/s InfiniBand between nodes (25 GB/s), TF32 (74.8 TFLOPS dense
    # peak; about half reached: 37). Microbatch 2 x 2048 tokens (its Table 1).
    return gpt_profile(model="gpt3-2.7b", vocab=50257, max_seq=2048, channels=2560, layers=32,
                       seq=2048, micro=2, gpus_per_node=1, gpu_memory_bytes=40 * 10**9,
                       intra_GBps=25.0, inter_GBps=25.0, tflops=37.0, hbm_GBps=696.0,
                       eff={1: 1.0})


def gpt2_345m_v100():
    # GPT-2 345M (24 blocks, 1024 channels) on Bamboo's spot nodes (NSDI '23 §6): EC2
    # p3.2xlarge, one V100 16 GB a node, up to 10 Gb/s between nodes (1.25 GB/s), fp16
    # (125 TFLOPS tensor peak; about 40 % reached: 50). Microbatch 4 x 1024 tokens.
    return gpt_profile(model="gpt2-345m", vocab=50257, max_seq=1024, channels=1024, layers=24,
                       seq=1024, micro=4, gpus_per_node=1, gpu_memory_bytes=16 * 10**9,
                       intra_GBps=1.25, inter_GBps=1.25, tflops=50.0, hbm_GBps=900.0,
                       eff={1: 1.0})


def tiny():
    # The gpt2-tiny preset of TRAININGJOB.md (4 blocks, 128 channels, vocab 256,
    # context 256), microbatch 4 x 256 tokens, on nodes of 2 small GPUs. Six layers:
    # small enough for exhaustive search in the tests. Its times are hand-picked round
    # numbers (not derived from a device) with tensor parallelism on 2 GPUs giving a
    # 1.6x speed-up, and gpu_memory_bytes is deliberately too small for one node to hold
    # the whole model, so that n0 = 2 and the (F+1)*n0 rules are exercised.
    C, V, S, micro = 128, 256, 256, 4
    T = S * micro
    hidden = T * C * 2
    block_params = 12 * C * C + 13 * C
    layers = [{
        "name": "embedding",
        "forward_ms": {"1": 0.2, "2": 0.15},
        "backward_ms": {"1": 0.4, "2": 0.3},
        "param_bytes": (V + S) * C * 4,
        "activation_bytes": hidden + T * 4,
        "output_bytes": hidden,
    }]
    for i, (f1, f2) in enumerate([(1.0, 0.625), (1.0, 0.625), (1.2, 0.75), (1.0, 0.625)]):
        # block.2 is made slower (as if it were placed on a throttled GPU) so that the
        # optimal cut is not simply the middle.
        layers.append({
            "name": "block.%d" % i,
            "forward_ms": {"1": f1, "2": f2},
            "backward_ms": {"1": 2 * f1, "2": 2 * f2},
            "param_bytes": block_params * 4,
            "activation_bytes": 34 * T * C,
            "output_bytes": hidden,
        })
    layers.append({
        "name": "head",
        "forward_ms": {"1": 0.5, "2": 0.3},
        "backward_ms": {"1": 1.0, "2": 0.6},
        "param_bytes": 2 * C * 4,
        "activation_bytes": T * V * 2 + 4 * hidden,
        "output_bytes": micro * 4,
    })
    return {
        "model": "gpt2-tiny",
        "microbatch_size": micro,
        "gpus_per_node": 2,
        "gpu_memory_bytes": 14 * 2**20,
        "intra_node_GBps": 10.0,
        "inter_node_GBps": 1.0,
        "layers": layers,
    }


def dumps(prof):
    """JSON with one line per top-level field and one line per layer."""
    out = ["{"]
    items = [(k, v) for k, v in prof.items() if k != "layers"]
    for k, v in items:
        out.append("  %s: %s," % (json.dumps(k), json.dumps(v)))
    out.append('  "layers": [')
    for i, layer in enumerate(prof["layers"]):
        sep = "," if i + 1 < len(prof["layers"]) else ""
        out.append("    " + json.dumps(layer) + sep)
    out.append("  ]")
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    for name, prof in (("gpt2-124m-a100.json", gpt2_124m_a100()),
                       ("gpt3-2.7b-8gpu.json", gpt3_2_7b_8gpu()),
                       ("gpt3-2.7b-a40.json", gpt3_2_7b_a40()),
                       ("gpt2-345m-v100.json", gpt2_345m_v100()),
                       ("tiny.json", tiny())):
        path = os.path.join(HERE, name)
        with open(path, "w") as f:
            f.write(dumps(prof))
        print("wrote %s (%d layers)" % (path, len(prof["layers"])))


if __name__ == "__main__":
    main()
