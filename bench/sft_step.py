"""SFT step throughput vs pre-training step throughput at the same model size and sequence length.

Both sides run the loop's own optimizer step (glmstack.train.loop._train_step: schedules, forward + backward,
clipping, guard, Muon, balancing update) on copies of one model. Pre-training gets a fixed batch of B x T tokens
(no data cost); SFT draws real batches from glmstack.posttrain.packed.PackedSFT over the synthetic sets (chat.encode
masks, best-fit packing, segment ids and per-conversation positions, so attention takes the document-mask path),
so the SFT side pays its data cost and the pre-training side pays none. Steps alternate in one process so the load
of a shared machine hits both alike; the ratio is the median of per-pair ratios, on CPU time and on wall clock.

    python bench/sft_step.py                                  # the speedrun size (hidden 128, 4 layers), 8 x 512
    python bench/sft_step.py --model runs/speedrun/model --json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from model_throughput import timed

from glmstack.model import load_hf
from glmstack.optim import build_optimizer
from glmstack.posttrain.packed import PackedSFT
from glmstack.posttrain.sft import sft_loss
from glmstack.posttrain.sft_data import encode_record
from glmstack.posttrain.synthetic import SETS, generate
from glmstack.train.config import TrainConfig
from glmstack.train.loop import LoopState, _train_step, pretrain_loss

SPEEDRUN_15 = {"hidden_size": 128, "num_hidden_layers": 4, "n_routed_experts": 8, "vocab_size": 2048}  # 15-min row


def model_and_tokenizer(folder: str | None):
    from glmstack.tokenizer import Tokenizer

    if folder:
        return load_hf(folder).train(), Tokenizer.load(folder)
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from tests.posttrain.base import make_base

    tmp = Path("/tmp/glmstack-bench-sft-base")
    if not (tmp / "config.json").exists():
        make_base(tmp, **SPEEDRUN_15)
    return load_hf(tmp).train(), Tokenizer.load(tmp)


def step_fn(model, cfg, data, loss_fn):
    optimizer, _ = build_optimizer(model, cfg.optim)
    state, it = LoopState(), iter(data)
    return lambda: _train_step(model, optimizer, it, cfg, state, torch.device("cpu"), None, loss_fn)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    model, tok = model_and_tokenizer(args.model)
    B, T = args.batch, args.seq
    cfg = TrainConfig(seq_len=T, micro_batch_size=B, steps=10**6)
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=0, aux_loss_weight=0.0)
    examples = [encode_record(tok, r, "glm-4.5") for s in SETS for r in generate(s, 300)]
    sft_data = PackedSFT(examples, seq_len=T, batch_size=B)
    ids = torch.randint(0, model.cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    pre_batch = {"input_ids": ids, "labels": torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)}
    steps = {
        "pretrain": step_fn(model, cfg, iter(lambda: pre_batch, None), pretrain_loss),
        "sft": step_fn(copy.deepcopy(model), cfg, sft_data, sft_loss),
    }
    times = {k: [] for k in steps}
    for i in range(args.warmup + args.repeats):
        for name, fn in steps.items():
            t = timed(fn)
            if i >= args.warmup:
                times[name].append(t)
    fill = sum(len(i) for i, _ in sft_data.examples) / (len(sft_data.epoch_rows(0)) * T)
    result = {"batch": B, "seq": T, "threads": torch.get_num_threads(), "hidden": model.cfg.hidden_size,
              "layers": model.cfg.num_hidden_layers, "sft_row_fill": round(fill, 3)}  # fmt: skip
    for j, clock in enumerate(("wall", "cpu")):
        pairs = zip(times["sft"], times["pretrain"])
        result[f"ratio_{clock}"] = round(statistics.median(p[j] / s[j] for s, p in pairs), 3)
    for name, ts in times.items():
        wall, cpu = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        result[name] = {"tok_per_s_wall": round(B * T / wall), "tok_per_s_cpu": round(B * T / cpu)}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF model folder with tokenizer (default: a random speedrun-size one)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--repeats", type=int, default=8, help="measured pre-training/SFT step pairs")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run(args)
    if args.json:
        print(json.dumps(r))
        return 0
    print(
        f"train step, hidden {r['hidden']} x {r['layers']} layers, batch {r['batch']}x{r['seq']}, {r['threads']} thread(s)"
    )
    for side in ("pretrain", "sft"):
        print(f"  {side:<9} {r[side]['tok_per_s_cpu']:>7} tok/s (CPU time) {r[side]['tok_per_s_wall']:>7} tok/s (wall)")
    print(
        f"  SFT / pre-training tokens/s (median of pairs): {r['ratio_cpu']}x CPU time, {r['ratio_wall']}x wall;"
        f" SFT rows {r['sft_row_fill']:.0%} full"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
