#!/usr/bin/env python3
"""Parity fixtures from Hugging Face `transformers` itself.

For each case below this builds a tiny random model of one MoE family with `transformers`,
writes it with `save_pretrained` (in the case's dtype), keeps the MoE block of layer 0 from the
saved `model.safetensors` (under its saved names, e.g. `model.layers.0.mlp.experts.3.up_proj.weight`)
and the saved `config.json` as they are, runs that MoE block in float32 on random tokens, and
writes what it computed:

    tests/fixtures/hf/<case>/weights.safetensors   layer-0 MoE tensors, as save_pretrained wrote them
    tests/fixtures/hf/<case>/config.json           as save_pretrained wrote it (every key)
    tests/fixtures/hf/<case>/x.safetensors         x [tokens, hidden] f32
    tests/fixtures/hf/<case>/expected.safetensors  output [tokens, hidden] f32,
                                                   topk_indices [tokens, k] (int64),
                                                   topk_weights [tokens, k] f32

A bf16 or f16 case runs the block on the saved (rounded) weights widened to float32, which is
what moeflow sees. The quantised cases write the experts as the published checkpoints hold
them (gpt-oss's MXFP4 `*_blocks` / `*_scales`; Qwen3-FP8's e4m3 `weight` with
`weight_scale_inv` tiles) and run the block transformers builds when it reads them back
(`Mxfp4Config(dequantize=True)`, `FineGrainedFP8Config(dequantize=True)`; the FP8 one needs
`accelerate`). Expert ids are listed in moeflow's slot order (descending selection value,
lower index first on ties): transformers' own order is not specified (`sorted=False` in the
DeepSeek routers), the set is.

Run by hand (tests/parity.rs reads the committed output; CI does not run this):

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install -r tools/hf_fixtures.requirements.txt
    /tmp/hf/bin/python tools/hf_fixtures.py [case ...]   # every case, or the named ones

(The CUDA wheels torch pulls in are not used; the script runs on the CPU.)
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"

# Small but not trivial: H and F not multiples of the GEMM tile, E a few groups wide.
H, F, E = 40, 24, 16

COMMON = dict(
    vocab_size=32,
    hidden_size=H,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

# (case name, config class, model class, family-specific config, dtype, tokens, block path)
CASES = [
    ("mixtral_f32_t37", "MixtralConfig", "MixtralForCausalLM",
     dict(intermediate_size=F, num_local_experts=E, num_experts_per_tok=2), torch.float32, 37),
    ("mixtral_bf16_t301", "MixtralConfig", "MixtralForCausalLM",
     dict(intermediate_size=F, num_local_experts=E, num_experts_per_tok=4), torch.bfloat16, 301),
    ("qwen2_moe_f32_t37", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, shared_expert_intermediate_size=56,
          num_experts=E, num_experts_per_tok=4, norm_topk_prob=False), torch.float32, 37),
    ("qwen2_moe_bf16_t5_norm", "Qwen2MoeConfig", "Qwen2MoeForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, shared_expert_intermediate_size=56,
          num_experts=E, num_experts_per_tok=4, norm_topk_prob=True), torch.bfloat16, 5),
    ("qwen3_moe_f16_t37_norm", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=8,
          norm_topk_prob=True, head_dim=20), torch.float16, 37),
    ("qwen3_moe_f32_t301", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=2,
          norm_topk_prob=False, head_dim=20), torch.float32, 301),
    ("olmoe_bf16_t37", "OlmoeConfig", "OlmoeForCausalLM",
     dict(intermediate_size=F, num_experts=E, num_experts_per_tok=4, norm_topk_prob=False),
     torch.bfloat16, 37),
    ("olmoe_f32_t5_norm", "OlmoeConfig", "OlmoeForCausalLM",
     dict(intermediate_size=F, num_experts=E, num_experts_per_tok=3, norm_topk_prob=True),
     torch.float32, 5),
    ("deepseek_v3_f32_t37", "DeepseekV3Config", "DeepseekV3ForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, n_routed_experts=E, num_experts_per_tok=4,
          n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
          first_k_dense_replace=0, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
          qk_nope_head_dim=4, v_head_dim=4), torch.float32, 37),
    ("deepseek_v3_bf16_t301", "DeepseekV3Config", "DeepseekV3ForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, n_routed_experts=E, num_experts_per_tok=6,
          n_group=8, topk_group=3, norm_topk_prob=False, routed_scaling_factor=1.5, n_shared_experts=2,
          first_k_dense_replace=0, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
          qk_nope_head_dim=4, v_head_dim=4), torch.bfloat16, 301),
    ("deepseek_v3_f16_t5_nogroups", "DeepseekV3Config", "DeepseekV3ForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, n_routed_experts=E, num_experts_per_tok=2,
          n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, n_shared_experts=1,
          first_k_dense_replace=0, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4,
          qk_nope_head_dim=4, v_head_dim=4), torch.float16, 5),
    ("deepseek_v2_f32_t37", "DeepseekV2Config", "DeepseekV2ForCausalLM",
     dict(intermediate_size=F, moe_intermediate_size=F, n_routed_experts=E, num_experts_per_tok=3,
          topk_method="greedy", routed_scaling_factor=16.0, n_shared_experts=2, first_k_dense_replace=0,
          kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4),
     torch.float32, 37),
    ("gpt_oss_bf16_t301", "GptOssConfig", "GptOssForCausalLM",
     dict(intermediate_size=F, num_local_experts=E, num_experts_per_tok=2, head_dim=20), torch.bfloat16, 301),
]

# Checkpoints as they ship quantised, read back by transformers' own integration (dequantised
# on the CPU): (case, config class, model class, family config, format, tokens).
# - gpt-oss with MXFP4 experts (`*_blocks`, `*_scales`); K runs along blocks of 32, so H and F
#   are multiples of 32.
# - Qwen3-MoE with FP8 e4m3 experts and 128 x 128 `weight_scale_inv` tiles (Qwen3-FP8's
#   layout); H = 256 is two tiles wide (transformers wants whole tiles or one per side).
QUANTISED_CASES = [
    ("gpt_oss_mxfp4_t37", "GptOssConfig", "GptOssForCausalLM",
     dict(hidden_size=64, intermediate_size=32, num_local_experts=E, num_experts_per_tok=4, head_dim=32),
     "mxfp4", 37),
    ("qwen3_moe_fp8_t37", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
     dict(hidden_size=256, intermediate_size=F, moe_intermediate_size=F, num_experts=E, num_experts_per_tok=4,
          norm_topk_prob=True, head_dim=32), "fp8", 37),
]

FP4_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def moe_block(model):
    layer = model.model.layers[0]
    return layer.mlp


def order(indices, values):
    """Each row's ids sorted by descending value, lower id first on ties."""
    out = []
    for ids, vals in zip(indices.tolist(), values.tolist()):
        out.append(sorted(ids, key=lambda e: (-vals[e], e)))
    return torch.tensor(out, dtype=torch.int64)


def route(block, family, x):
    """(ids in moeflow's slot order, their weights) from transformers' own router."""
    logits, weights, ids = (block.router if family == "gpt_oss" else block.gate)(x)
    if family == "deepseek_v3":
        scores = logits.float().sigmoid() + block.gate.e_score_correction_bias
        ordered = order(ids, scores)
    else:
        ordered = order(ids, logits.float())
    # Weights follow their ids into the new order.
    w = torch.stack([
        torch.tensor([wrow[idrow.index(e)] for e in orow])
        for wrow, idrow, orow in zip(weights.float().tolist(), ids.tolist(), ordered.tolist())
    ])
    return ordered, w.float()


def build(name, config_cls, model_cls, extra, dtype, tokens, seed):
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**COMMON, **extra)
    model = getattr(transformers, model_cls)(config).float().eval()
    family = config.model_type
    with torch.no_grad():
        # Random, not initial, values everywhere in the block (biases included).
        for p in moe_block(model).parameters():
            p.normal_(0.0, 0.3)
        if family == "deepseek_v3":
            moe_block(model).gate.e_score_correction_bias.normal_(0.0, 0.05)
    out_dir = ROOT / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.to(dtype).save_pretrained(tmp)
        shutil.copy(Path(tmp) / "config.json", out_dir / "config.json")
        kept = {}
        with safe_open(Path(tmp) / "model.safetensors", "pt") as f:
            for key in f.keys():
                if key.startswith("model.layers.0.mlp.") or key.startswith("model.layers.0.block_sparse_moe."):
                    kept[key] = f.get_tensor(key)
        save_file(kept, out_dir / "weights.safetensors")
        # The reference runs on exactly the saved values, widened to float32.
        reloaded = getattr(transformers, model_cls).from_pretrained(tmp, dtype=torch.float32).eval()
    block = moe_block(reloaded)
    x = torch.randn(tokens, H, generator=torch.Generator().manual_seed(seed + 1)) * 1.5
    k = run_block(out_dir, block, family, x)
    print(f"{name}: {family} {str(dtype).removeprefix('torch.')} tokens={tokens} k={k}")


def run_block(out_dir, block, family, x):
    """Runs the MoE block on `x` in float32; writes x and what it computed."""
    with torch.no_grad():
        y = block(x.unsqueeze(0))
        y = (y[0] if isinstance(y, tuple) else y).squeeze(0).float()
        ids, w = route(block, family, x)
    save_file({"x": x.contiguous()}, out_dir / "x.safetensors")
    save_file(
        {"output": y.contiguous(), "topk_indices": ids.contiguous(), "topk_weights": w.contiguous()},
        out_dir / "expected.safetensors",
    )
    return ids.shape[1]


def mxfp4_pack(w):
    """`w` [..., K] (K a multiple of 32) as gpt-oss's MXFP4: blocks [..., K/32, 16] u8 (byte j:
    value 2j low nibble, 2j + 1 high) and E8M0 scales [..., K/32] u8, each block's scale putting
    its largest magnitude in [4, 8), each value the nearest FP4 code."""
    table = torch.tensor(FP4_E2M1)
    blocks = w.float().reshape(*w.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.zeros_like(amax)).clamp(-127, 127)
    codes = (blocks / torch.exp2(e)[..., None]).unsqueeze(-1).sub(table).abs().argmin(-1).to(torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), (e + 127).to(torch.uint8).contiguous()


def fp8_pack(w, tile=128):
    """`w` [n, k] as FP8 e4m3 with one f32 `scale_inv` per `tile` x `tile` block (`amax / 448`,
    1 for an all-zero block): (weight, scale_inv [ceil(n / tile), ceil(k / tile)])."""
    n, k = w.shape
    scales = torch.ones((n + tile - 1) // tile, (k + tile - 1) // tile)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            amax = w[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile].abs().max()
            if amax > 0:
                scales[i, j] = amax / 448.0
    full = scales.repeat_interleave(tile, 0)[:n].repeat_interleave(tile, 1)[:, :k]
    return (w.float() / full).to(torch.float8_e4m3fn).contiguous(), scales.float().contiguous()


def quantise_mxfp4(tensors, model, config):
    """gpt-oss's fused experts as MXFP4 blocks and scales, in place; the quantization_config."""
    experts = moe_block(model).experts
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}.mlp.experts."
        # In x out as the module holds them; the checkpoint holds out x in.
        for proj, param in [("gate_up_proj", experts.gate_up_proj), ("down_proj", experts.down_proj)]:
            tensors.pop(p + proj)
            tensors[p + proj + "_blocks"], tensors[p + proj + "_scales"] = mxfp4_pack(
                param.detach().transpose(1, 2))
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    return quant, transformers.Mxfp4Config(dequantize=True)


def quantise_fp8(tensors, model, config):
    """Every routed expert's projections as FP8 with their scales, in place (the rest as
    saved); the quantization_config."""
    for key in [k for k in tensors if ".mlp.experts." in k and k.endswith("_proj.weight")]:
        tensors[key], tensors[key.replace(".weight", ".weight_scale_inv")] = fp8_pack(tensors[key])
    keep = [f"model.layers.{i}.{m}" for i in range(config.num_hidden_layers)
            for m in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate"]]
    quant = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128], "modules_to_not_convert": keep + ["lm_head"]}
    return quant, transformers.FineGrainedFP8Config(dequantize=True)


QUANTISERS = {"mxfp4": quantise_mxfp4, "fp8": quantise_fp8}


def build_quantised(name, config_cls, model_cls, extra, fmt, tokens, seed):
    """A model whose experts are written quantised as the published checkpoints hold them,
    loaded back by transformers (dequantised), its block run in float32."""
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**{**COMMON, **extra})
    model = getattr(transformers, model_cls)(config).float().eval()
    with torch.no_grad():
        for p in moe_block(model).parameters():
            p.normal_(0.0, 0.3)
    out_dir = ROOT / name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors = {}
        with safe_open(Path(tmp) / "model.safetensors", "pt") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
        quant, load_config = QUANTISERS[fmt](tensors, model, config)
        save_file(tensors, Path(tmp) / "model.safetensors", metadata={"format": "pt"})
        cfg = json.loads((Path(tmp) / "config.json").read_text())
        cfg["quantization_config"] = quant
        (Path(tmp) / "config.json").write_text(json.dumps(cfg, indent=2))
        shutil.copy(Path(tmp) / "config.json", out_dir / "config.json")
        kept = {k: v for k, v in tensors.items() if k.startswith("model.layers.0.mlp.")}
        save_file(kept, out_dir / "weights.safetensors")
        reloaded = getattr(transformers, model_cls).from_pretrained(
            tmp, quantization_config=load_config, dtype=torch.float32).float().eval()
    block = moe_block(reloaded)
    x = torch.randn(tokens, extra["hidden_size"], generator=torch.Generator().manual_seed(seed + 1)) * 1.5
    k = run_block(out_dir, block, config.model_type, x)
    print(f"{name}: {config.model_type} {fmt} tokens={tokens} k={k}")


def main():
    """Builds every case, or only those named on the command line (each keeps its seed)."""
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)
    only = set(sys.argv[1:])
    for seed, case in enumerate(CASES):
        if not only or case[0] in only:
            build(*case, seed=100 + seed)
    for seed, case in enumerate(QUANTISED_CASES):
        if not only or case[0] in only:
            build_quantised(*case, seed=200 + seed)
    (ROOT / "VERSIONS.json").write_text(
        json.dumps({"torch": torch.__version__, "transformers": transformers.__version__}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
