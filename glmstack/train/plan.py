"""`glmstack plan`: trainable parameters and per-GPU memory of fine-tuning a GLM model — LoRA, QLoRA or full — on one
node, computed from this code's own shapes (not measured on a GPU: none was available when it was written).

Why: whether LoRA SFT of GLM-4.5-Air fits one 8×H100 node at 32K context is the first question people ask, and the
answer depends on things the config file does not say (which weights get adapters, how experts are sharded, what
the trainer keeps for backward). Every term below is computed, and labelled so:
  parameters     the model built on the meta device, LoRA applied exactly as training applies it (model/lora.py):
                 total and trainable counts, no memory allocated
  weights        total × bytes of the base dtype (bf16 2, fp8 1, int4 0.5 + a bf16 scale per group of 128) / G:
                 FSDP2 shards dense weights and expert parallelism the routed experts over the G GPUs
  trainable      trainable × 16 bytes / G for LoRA (fp32 adapter, gradient, AdamW's two moments); full fine-tuning
                 is fp32 weights + gradients + Muon momentum = 12 bytes a parameter / G (the weights term then 0)
  gather         FSDP2 unshards one layer's non-expert weights for its forward / backward and prefetches the next:
                 2 × the largest layer's non-expert parameters × the base bytes
  activations    what autograd saves for backward, per sequence of T tokens: measured by counting the storages saved
                 (torch.autograd.graph.saved_tensors_hooks) in a forward of this model's real layers — a dense layer
                 and a MoE layer at the model's hidden sizes, 8 routed experts (the saved activations depend on the
                 top-k, not on the expert count), a 256-token vocabulary — at T = 32, 64, 128, fitted as c + a·T + b·T² per
                 layer kind (dense, MoE, MTP with its loss) and scaled to the model's depth. glmstack has no activation
                 checkpointing, so every layer's activations are alive at the backward's start. Measured on the
                 CPU path in bf16: the reference attention keeps its T×T scores (b), which a GPU's fused attention
                 does not; both parts are printed
  reserve        3 GB for the CUDA context, NCCL buffers and allocator fragmentation (an assumption)

    glmstack plan                                              # LoRA r 16 SFT of the three models, 8 GPUs, 8K context
    glmstack plan glm-4.5-air --seq-len 32768 --lora-r 64 --base int4
    glmstack plan glm-5 --full --json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

GPUS = {"H100": 80e9, "H200": 141e9}  # bytes of memory per GPU (80 GB, 141 GB)
BASE_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 128}
RESERVE = 3e9
DEFAULT_MODELS = ("glm-4.5-air", "glm-4.7-flash", "glm-5")


def parameter_counts(cfg, lora_r: int, targets: list[str]) -> dict:
    """-> total and trainable parameters (trainable = all when lora_r is 0) and the largest layer's non-expert count."""
    from glmstack.model import GLM
    from glmstack.model.lora import LoraConfig, apply_lora

    with torch.device("meta"):
        model = GLM(cfg, dtype=torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    if lora_r:
        apply_lora(model, LoraConfig(enabled=True, r=lora_r, alpha=2 * lora_r, targets=targets), seed=0)
    trainable = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and (lora_r == 0 or "lora_" in n))
    layer_dense = max(sum(p.numel() for n, p in layer.named_parameters() if ".experts." not in f".{n}" and "lora_" not in n)
                      for layer in model.layers)  # fmt: skip
    return {"total": total, "trainable": trainable, "largest_layer_non_expert": layer_dense}


def random_model(cfg):
    """`cfg`'s model in bf16 on the CPU with small random weights (the saved activations do not depend on them)."""
    from glmstack.model import GLM

    model = GLM(cfg, dtype=torch.bfloat16).materialize("cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.02, 0.02)
    return model


def saved_bytes(model, tokens: int) -> int:
    """Bytes autograd saves for backward in one forward of `tokens` tokens (each storage once, parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    ids = torch.randint(0, model.cfg.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids, labels=ids)
    return sum(seen.values())


def activation_fit(cfg) -> dict[str, tuple[float, float, float]]:
    """(c, a, b) with saved bytes = c + a·T + b·T² for "dense" (a dense layer, with the embedding and loss), "moe" (a MoE
    layer) and "mtp" (an MTP layer with its loss), from forwards of cuts of `cfg` (1 layer, 2 layers, 2 layers + MTP)
    at T = 32, 64 and 128 (module docstring)."""
    import dataclasses

    cut = {"first_k_dense_replace": 1, "num_nextn_predict_layers": 0, "vocab_size": 256,
           "n_routed_experts": min(cfg.n_routed_experts, max(8, cfg.num_experts_per_tok))}  # fmt: skip
    if cfg.n_group > 1:
        cut |= {"n_group": 1, "topk_group": 1}
    lengths = (32, 64, 128)
    meas = {}
    for layers, mtp in ((1, 0), (2, 0), (2, 1)):
        depths = {"num_nextn_predict_layers": mtp, "num_mtp_depths": cfg.num_mtp_depths if mtp else 0}
        model = random_model(dataclasses.replace(cfg, num_hidden_layers=layers, **cut | depths))
        meas[layers, mtp] = [saved_bytes(model, t) for t in lengths]
        del model  # one cut alive at a time: a GLM-5 layer is ~0.5 B parameters

    def fit(ys: list[float]) -> tuple[float, float, float]:
        """(c, a, b) with y = c + aT + bT² through the three lengths' points."""
        x = torch.tensor([[1.0, t, t * t] for t in lengths], dtype=torch.float64)
        return tuple(torch.linalg.solve(x, torch.tensor(ys, dtype=torch.float64)).tolist())

    moe = [b - a for a, b in zip(meas[1, 0], meas[2, 0])]
    mtp = [b - a for a, b in zip(meas[2, 0], meas[2, 1])] if cfg.num_nextn_predict_layers else [0.0] * 3
    return {"dense": fit(meas[1, 0]), "moe": fit(moe), "mtp": fit(mtp)}


def activation_bytes(cfg, fit: dict, tokens: int) -> tuple[float, float]:
    """(constant + linear part, quadratic part) of the saved activations of one sequence of `tokens` through the whole model."""
    counts = {"dense": cfg.first_k_dense_replace, "moe": cfg.num_hidden_layers - cfg.first_k_dense_replace,
              "mtp": cfg.num_nextn_predict_layers}  # fmt: skip
    lin = sum(n * (fit[k][0] + fit[k][1] * tokens) for k, n in counts.items())
    quad = sum(n * fit[k][2] * tokens**2 for k, n in counts.items())
    return lin, quad


def plan(name: str, *, gpus: int, seq_len: int, micro_batch: int, lora_r: int, targets: list[str], base: str,
         fit: dict | None = None) -> dict:  # fmt: skip
    """Every term of the module docstring for one model, in bytes per GPU, and whether it fits each GPU kind."""
    from glmstack.model import ModelConfig

    cfg = ModelConfig.preset(name)
    n = parameter_counts(cfg, lora_r, targets)
    fit = fit or activation_fit(cfg)
    lin, quad = activation_bytes(cfg, fit, seq_len)
    full = lora_r == 0
    terms = {"weights": 0.0 if full else n["total"] * BASE_BYTES[base] / gpus,
             "trainable": n["trainable"] * (12 if full else 16) / gpus,
             "gather": 2 * n["largest_layer_non_expert"] * (2 if full else BASE_BYTES[base]),
             "activations_linear": micro_batch * lin, "activations_quadratic": micro_batch * quad,
             "reserve": RESERVE}  # fmt: skip
    total = sum(terms.values())
    return {"model": name, "mode": "full" if full else f"lora r{lora_r}" + ("" if base == "bf16" else f" {base}"),
            "gpus": gpus, "seq_len": seq_len, "micro_batch": micro_batch, "total_params": n["total"],
            "trainable_params": n["trainable"], "bytes": terms, "total_bytes": total,
            "fits": {k: total <= v for k, v in GPUS.items()},
            "fits_fused_attention": {k: total - terms["activations_quadratic"] <= v for k, v in GPUS.items()}}  # fmt: skip


def table(rows: list[dict]) -> str:
    def gb(x: float) -> str:
        return f"{x / 1e9:.1f}"

    head = ("| model | mode | trainable params | weights | trainable state | FSDP gather | activations (c + a·T / b·T²) "
            "| total GB / GPU | fits H100 80 GB | fits H200 141 GB |\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    out = [head]
    for r in rows:
        b = r["bytes"]
        fits = [("yes" if r["fits"][k] else ("with fused attention" if r["fits_fused_attention"][k] else "no"))
                for k in GPUS]  # fmt: skip
        out.append(f"| {r['model']} | {r['mode']} | {r['trainable_params'] / 1e6:,.0f} M of {r['total_params'] / 1e9:.1f} B "
                   f"| {gb(b['weights'])} | {gb(b['trainable'])} | {gb(b['gather'])} "
                   f"| {gb(b['activations_linear'])} / {gb(b['activations_quadratic'])} | {gb(r['total_bytes'])} "
                   f"| {fits[0]} | {fits[1]} |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from glmstack.model.lora import TARGET_ALIASES

    ap = argparse.ArgumentParser(prog="glmstack plan", description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS), help="model presets (glmstack.model.config)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the node (FSDP2 + expert parallel over all)")
    ap.add_argument("--seq-len", type=int, default=8192, help="tokens per sequence")
    ap.add_argument("--micro-batch", type=int, default=1, help="sequences per GPU per micro-batch")
    ap.add_argument("--lora-r", type=int, default=16, help="LoRA rank")
    ap.add_argument(
        "--targets", default="attention,mlp,experts,mtp", help=f"LoRA targets ({', '.join(TARGET_ALIASES)})"
    )
    ap.add_argument("--base", default="bf16", choices=sorted(BASE_BYTES), help="the frozen base's dtype (QLoRA: int4)")
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument("--json", action="store_true", help="one JSON object per model")
    a = ap.parse_args(argv)
    if a.gpus < 1 or a.seq_len < 1 or a.micro_batch < 1 or (a.lora_r < 1 and not a.full):
        ap.error("--gpus, --seq-len, --micro-batch and --lora-r must be >= 1")
    if a.full and a.base != "bf16":
        ap.error("--full trains every weight in fp32 + bf16 autocast: --base applies to LoRA only")
    rows = []
    for name in a.models:
        rows.append(plan(name, gpus=a.gpus, seq_len=a.seq_len, micro_batch=a.micro_batch,
                         lora_r=0 if a.full else a.lora_r, targets=a.targets.split(","), base=a.base))  # fmt: skip
        if a.json:
            print(json.dumps(rows[-1]), flush=True)
    if not a.json:
        print(f"Computed (not measured on a GPU): {a.gpus} GPUs, {a.seq_len} tokens × {a.micro_batch} per GPU, "
              "no activation checkpointing; activations measured on this code's CPU path (c + a·T, and b·T² the "
              "reference attention's scores, absent with fused attention); bytes in GB (1e9).")  # fmt: skip
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
