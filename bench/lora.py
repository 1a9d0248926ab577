"""LoRA vs full fine-tuning vs QLoRA (INT4 base) on the same tiny MoE, one process: what each step costs.

Three setups of the `tiny-moe` preset (hidden 256, 4 layers, 16 routed experts top-4; MTP off), the same weights,
the same batch, the same optimizer (AdamW: docs/lora.md says why for adapters), each step the loop's whole step
(glmstack.train.loop._train_step):
  * full  every parameter trains (the reference);
  * lora  base frozen, adapters of rank r on every weight (attention, MLPs, per-expert on the routed banks);
  * qlora the same adapters on a base quantized to INT4 (glmstack.inference.quant; the input gradient through the
          frozen INT4 layers dequantizes their weight for the backward, inference/quant.py).
Steps alternate full / lora / qlora so a shared machine's load hits all alike; step time is the median CPU time (per
thread) and wall clock of the measured rounds, and the first step's wall clock (fresh process: gradient and optimizer
state allocation, first-call overheads) is reported beside it; ratios are to full from the same run. Memory per step, computed (not an allocator reading,
which CPU torch does not keep): weights + gradients + optimizer state + the activations autograd saves for backward
(each storage once); on CUDA also torch.cuda.max_memory_allocated.

    python bench/lora.py                    # 4 x 256 tokens, r 8, 8 measured rounds after 2 warm-up rounds
    python bench/lora.py --rank 16 --json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from glmstack.model import GLM, ModelConfig
from glmstack.model.lora import LoraConfig, apply_lora
from glmstack.optim import build_optimizer
from glmstack.train.config import OptimConfig, TrainConfig
from glmstack.train.loop import LoopState, _train_step, pretrain_loss


def setup(kind: str, base: GLM, rank: int, batch: dict):
    """-> (model, optimizer, one-step function) for 'full', 'lora' or 'qlora'."""
    model = copy.deepcopy(base)
    if kind == "qlora":
        from glmstack.inference.quant import quantize_

        quantize_(model, "int4")
    if kind != "full":
        apply_lora(model, LoraConfig(r=rank, alpha=2 * rank), seed=0)
    cfg = TrainConfig(model="tiny-moe", optim=OptimConfig(muon=False, lr=1e-3), seq_len=batch["input_ids"].shape[1])
    cfg = dataclasses.replace(cfg, lora=LoraConfig(enabled=kind != "full"))
    optimizer, _ = build_optimizer(model, cfg.optim)
    state, data = LoopState(), iter(lambda: batch, None)
    return model, optimizer, lambda: _train_step(model, optimizer, data, cfg, state, torch.device("cpu"), None,
                                                 pretrain_loss)  # fmt: skip


def nbytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is not None and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizer) -> int:
    parts = getattr(optimizer, "optimizers", {"opt": optimizer}).values()
    return nbytes(v for opt in parts for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def saved_activation_bytes(model, batch) -> int:
    """Bytes autograd keeps for backward in one forward (each storage once; weights excluded)."""
    weights = {p.data_ptr() for p in model.parameters()} | {b.data_ptr() for b in model.buffers()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(batch["input_ids"], labels=batch["labels"]).loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(seen.values())


def measure(args) -> dict:
    torch.manual_seed(0)
    base = GLM(ModelConfig.preset("tiny-moe", num_nextn_predict_layers=0)).init_weights(seed=0)
    ids = torch.randint(0, base.cfg.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)}
    kinds = ["full", "lora", "qlora"]
    runs = {k: setup(k, base, args.rank, batch) for k in kinds}
    times, first = {k: [] for k in kinds}, {}
    for i in range(args.warmup + args.rounds):
        for k in kinds:
            w, c = time.perf_counter(), time.process_time()
            runs[k][2]()
            if i == 0:  # what a user meets first: the step that allocates gradients and optimizer state
                first[k] = time.perf_counter() - w
            if i >= args.warmup:
                times[k].append((time.perf_counter() - w, (time.process_time() - c) / torch.get_num_threads()))
    out = {"preset": "tiny-moe", "tokens_per_step": args.batch * args.seq, "rank": args.rank,
           "threads": torch.get_num_threads()}  # fmt: skip
    for k in kinds:
        model, optimizer, _ = runs[k]
        trainable = [p for p in model.parameters() if p.requires_grad]
        weights = nbytes(list(model.parameters()) + list(model.buffers()))
        grads, opt = nbytes(p for p in trainable), optimizer_state_bytes(optimizer)
        out[k] = {
            "trainable_params": sum(p.numel() for p in trainable),
            "step_ms_cpu": round(1e3 * statistics.median(t[1] for t in times[k]), 1),
            "step_ms_wall": round(1e3 * statistics.median(t[0] for t in times[k]), 1),
            "first_step_ms_wall": round(1e3 * first[k], 1),
            "weights_MB": round(weights / 1e6, 2), "grads_MB": round(grads / 1e6, 2),
            "optimizer_state_MB": round(opt / 1e6, 3),
            "activations_MB": round(saved_activation_bytes(model, batch) / 1e6, 2),
        }  # fmt: skip
        out[k]["step_memory_MB"] = round(sum(out[k][f] for f in ("weights_MB", "grads_MB", "optimizer_state_MB",
                                                                   "activations_MB")), 2)  # fmt: skip
    for k in ("lora", "qlora"):
        f, o = out["full"], out[k]
        o["ratio_to_full"] = {
            "trainable_params": round(o["trainable_params"] / f["trainable_params"], 4),
            "step_time_cpu": round(o["step_ms_cpu"] / f["step_ms_cpu"], 3),
            "first_step_wall": round(o["first_step_ms_wall"] / f["first_step_ms_wall"], 3),
            "optimizer_state": round(o["optimizer_state_MB"] / f["optimizer_state_MB"], 4),
            "step_memory": round(o["step_memory_MB"] / f["step_memory_MB"], 3),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rank", type=int, default=8)  # LoraConfig.r's default
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out = measure(args)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"tiny-moe, {out['tokens_per_step']} tokens/step, LoRA rank {out['rank']}, {out['threads']} threads")
    cols = ("trainable_params", "first_step_ms_wall", "step_ms_cpu", "step_ms_wall", "optimizer_state_MB", "weights_MB", "activations_MB",
            "step_memory_MB")  # fmt: skip
    print(f"{'':6}" + "".join(f"{c:>20}" for c in cols))
    for k in ("full", "lora", "qlora"):
        print(f"{k:6}" + "".join(f"{out[k][c]:>20}" for c in cols))
    for k in ("lora", "qlora"):
        print(f"{k} / full: {out[k]['ratio_to_full']}")


if __name__ == "__main__":
    main()
