"""Training-step throughput: glmstack's whole step vs a plain transformers + torch.optim.AdamW loop.

Ours is exactly what the loop runs per optimizer step (glmstack.train.loop._train_step): schedules, forward +
backward, global grad norm and clipping, the NaN guard, Muon + AdamW groups, the balancing bias update. The
reference is the usual minimal loop: transformers' Glm4MoeForCausalLM, loss.backward(), clip_grad_norm_,
torch.optim.AdamW. Both start from the same weights (the `tiny-moe` preset: hidden 256, 4 layers, 16 experts top-4;
no MTP layer, which transformers lacks; `--mtp` adds ours back), see the same batch, in one process; steps
alternate so load on a shared machine hits both alike, and the ratio is the median of per-pair ratios, on CPU
time (robust when the machine is shared) and wall clock. On a GPU both run under bf16 autocast. A third column runs
our same step with AdamW for every parameter (optim.muon=false), which separates Muon's Newton–Schulz cost
from the loop's own overhead.

    python bench/train_step.py                      # 8 x 256 tokens, 10 pairs after 2 warm-up pairs
    python bench/train_step.py --mtp --json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from model_throughput import build_models, keep_heap, timed
from op_profile import CpuTimer

from glmstack.optim import build_optimizer
from glmstack.train.config import TrainConfig
from glmstack.train.loop import LoopState, _train_step, autocast_dtype, pretrain_loss

MUON_BEFORE_MS = 225.0  # Muon's own time at a0f2ecc, quiet machine (docs/LOG.md, 2026-12-01): issue 13's "before"
NS_GEMMS = ("bmm", "baddbmm", "mm", "addmm")


def ours_step(model, cfg, batch, device, muon: bool = True):
    """-> (a zero-argument function running one full glmstack optimizer step, its optimizer)."""
    optimizer, _ = build_optimizer(model, dataclasses.replace(cfg.optim, muon=muon))
    state, amp = LoopState(), autocast_dtype(cfg, device)
    data = iter(lambda: batch, None)  # the same batch forever
    return (lambda: _train_step(model, optimizer, data, cfg, state, device, amp, pretrain_loss)), optimizer


def ns_gemm_ms(model, optimizer, batch, steps: int = 3) -> float:
    """CPU ms per Muon step spent in Newton–Schulz's GEMMs (aten bmm/baddbmm/mm/addmm), over `steps` extra Muon steps
    on one backward's gradients (the cost does not depend on the values)."""
    model.zero_grad(set_to_none=True)
    model(batch["input_ids"], labels=batch["labels"]).loss.backward()
    muon = optimizer.optimizers["muon"]
    muon.step()  # warm
    timer = CpuTimer()
    with timer:
        for _ in range(steps):
            muon.step()
    model.zero_grad(set_to_none=True)
    return 1e3 * sum(v for (op, _), v in timer.seconds.items() if op in NS_GEMMS) / steps


def hf_step(model, batch, device, lr: float):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()

    def step():
        with amp:
            loss = model(batch["input_ids"], labels=batch["input_ids"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    heap = keep_heap() if args.heap else False
    load_before = os.getloadavg()[0]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ours, hf = build_models("tiny-moe", None)
    if args.mtp:  # our real pre-training step: add the MTP layer transformers does not have
        from glmstack.model import GLM, ModelConfig

        ours = GLM(ModelConfig.preset("tiny-moe")).init_weights(seed=0).train()
    ours, hf = ours.to(device), hf.to(device)
    ours_adamw = copy.deepcopy(ours)
    B, T = args.batch, args.seq
    cfg = TrainConfig(model="tiny-moe", seq_len=T, micro_batch_size=B, steps=10**6)
    cfg.schedule.warmup_steps = 0
    ids = torch.randint(0, ours.cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0)).to(device)
    batch = {"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)}
    (muon_fn, muon_opt), (adamw_fn, _) = ours_step(ours, cfg, batch, device), ours_step(
        ours_adamw, cfg, batch, device, muon=False)  # the same step, AdamW only
    steps = {"glmstack": muon_fn, "glmstack-adamw": adamw_fn, "transformers": hf_step(hf, batch, device, cfg.optim.lr)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {k: [] for k in steps}
    for i in range(args.warmup + args.repeats):
        for name, fn in steps.items():
            t = timed(lambda fn=fn: (fn(), sync()))
            if i >= args.warmup:
                times[name].append(t)
    result = {"batch": B, "seq": T, "mtp": args.mtp, "device": device.type, "threads": torch.get_num_threads(),
              "allocator": "glibc heap only" if heap else "default"}
    for j, clock in enumerate(("wall", "cpu")):
        for ours_name in ("glmstack", "glmstack-adamw"):
            pairs = zip(times[ours_name], times["transformers"])
            result[f"ratio_{clock}_{ours_name}"] = round(statistics.median(b[j] / a[j] for a, b in pairs), 3)
    for name, ts in times.items():
        wall, cpu = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        result[name] = {"tok_per_s_wall": round(B * T / wall), "tok_per_s_cpu": round(B * T / cpu),
                        "page_faults": int(statistics.median(t[2] for t in ts))}
    # Muon's own time: what a step with Muon costs over the same step with AdamW everywhere (median of pairs)
    pairs = zip(times["glmstack"], times["glmstack-adamw"])
    result["muon_own_ms_cpu"] = round(1e3 * statistics.median(a[1] - b[1] for a, b in pairs), 1)
    if device.type == "cpu":  # per-op CPU timing is a CPU figure (GPU kernels run asynchronously)
        result["muon_ns_gemm_ms_cpu"] = round(ns_gemm_ms(ours, muon_opt, batch), 1)
    result["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=10, help="measured glmstack/transformers step pairs")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 = robust on a shared machine)")
    p.add_argument("--mtp", action="store_true", help="include our MTP layer (the real pre-training step)")
    p.add_argument("--heap", action="store_true", help="glibc: all allocations from the heap (no page-fault churn)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return 0
    print(
        f"tiny-moe train step, batch {r['batch']}x{r['seq']}, {r['device']}, {r['threads']} thread(s), "
        f"MTP {'on' if r['mtp'] else 'off'}, allocator {r['allocator']}, load average "
        f"{r['load_average'][0]} -> {r['load_average'][1]} (on a loaded machine only the ratios mean something)"
    )
    for side in ("glmstack", "glmstack-adamw", "transformers"):
        print(
            f"  {side:<15} {r[side]['tok_per_s_cpu']:>8} tok/s (CPU time)  {r[side]['tok_per_s_wall']:>8} tok/s (wall)"
            f"  {r[side]['page_faults']:>6} page faults/step"
        )
    for ours_name in ("glmstack", "glmstack-adamw"):
        print(
            f"  ratio {ours_name} / transformers+AdamW (median of pairs): {r['ratio_cpu_' + ours_name]}x CPU time, "
            f"{r['ratio_wall_' + ours_name]}x wall"
        )
    own = r["muon_own_ms_cpu"]
    ns = f"; of it Newton-Schulz's bf16 GEMMs {r['muon_ns_gemm_ms_cpu']} ms" if "muon_ns_gemm_ms_cpu" in r else ""
    print("issue 13 acceptance figures:")
    print(f"  (1) whole step, AdamW on both sides: {r['ratio_cpu_glmstack-adamw']}x transformers + AdamW "
          f"(CPU time; goal >= 1.5x)")
    print(f"  (2) Muon's own time per step: {own} ms CPU{ns}; vs {MUON_BEFORE_MS:.0f} ms at a0f2ecc (quiet): "
          f"{own / MUON_BEFORE_MS:.2f}x (goal <= 0.5x; compare on a quiet machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
