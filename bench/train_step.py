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
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from model_throughput import build_models, timed

from glmstack.optim import build_optimizer
from glmstack.train.config import TrainConfig
from glmstack.train.loop import LoopState, _train_step, autocast_dtype, pretrain_loss


def ours_step(model, cfg, batch, device, muon: bool = True):
    """-> a zero-argument function running one full glmstack optimizer step."""
    optimizer, _ = build_optimizer(model, dataclasses.replace(cfg.optim, muon=muon))
    state, amp = LoopState(), autocast_dtype(cfg, device)
    data = iter(lambda: batch, None)  # the same batch forever
    return lambda: _train_step(model, optimizer, data, cfg, state, device, amp, pretrain_loss)


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
    steps = {
        "glmstack": ours_step(ours, cfg, batch, device),
        "glmstack-adamw": ours_step(ours_adamw, cfg, batch, device, muon=False),  # same step, AdamW only
        "transformers": hf_step(hf, batch, device, cfg.optim.lr),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = {k: [] for k in steps}
    for i in range(args.warmup + args.repeats):
        for name, fn in steps.items():
            t = timed(lambda fn=fn: (fn(), sync()))
            if i >= args.warmup:
                times[name].append(t)
    result = {"batch": B, "seq": T, "mtp": args.mtp, "device": device.type, "threads": torch.get_num_threads()}
    for j, clock in enumerate(("wall", "cpu")):
        for ours_name in ("glmstack", "glmstack-adamw"):
            pairs = zip(times[ours_name], times["transformers"])
            result[f"ratio_{clock}_{ours_name}"] = round(statistics.median(b[j] / a[j] for a, b in pairs), 3)
    for name, ts in times.items():
        wall, cpu = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        result[name] = {"tok_per_s_wall": round(B * T / wall), "tok_per_s_cpu": round(B * T / cpu)}
    # Muon's own time: what a step with Muon costs over the same step with AdamW everywhere (median of pairs)
    pairs = zip(times["glmstack"], times["glmstack-adamw"])
    result["muon_own_ms_cpu"] = round(1e3 * statistics.median(a[1] - b[1] for a, b in pairs), 1)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--repeats", type=int, default=10, help="measured glmstack/transformers step pairs")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 = robust on a shared machine)")
    p.add_argument("--mtp", action="store_true", help="include our MTP layer (the real pre-training step)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return 0
    print(
        f"tiny-moe train step, batch {r['batch']}x{r['seq']}, {r['device']}, {r['threads']} thread(s), "
        f"MTP {'on' if r['mtp'] else 'off'}"
    )
    for side in ("glmstack", "glmstack-adamw", "transformers"):
        print(
            f"  {side:<15} {r[side]['tok_per_s_cpu']:>8} tok/s (CPU time)  {r[side]['tok_per_s_wall']:>8} tok/s (wall)"
        )
    for ours_name in ("glmstack", "glmstack-adamw"):
        print(
            f"  ratio {ours_name} / transformers+AdamW (median of pairs): {r['ratio_cpu_' + ours_name]}x CPU time, "
            f"{r['ratio_wall_' + ours_name]}x wall"
        )
    print(f"  Muon's own time per step (glmstack - glmstack-adamw, CPU time): {r['muon_own_ms_cpu']} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
