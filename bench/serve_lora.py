"""Serving LoRA adapters unmerged (`glmstack serve BASE --lora ...`, model/lora_multi.py): what a decode step costs.

One process, the `tiny-moe` preset (hidden 256, 4 layers, 16 routed experts top-4), random weights, two random
rank-r adapters on every weight (attention, MLPs, the routed experts per expert). Each setup decodes the same batch
of B prompts greedily through the serving scheduler's forward (`serve.scheduler._Batch`, the model's own forward:
the fast path is off with LoRA on), after a warm-up call:
  * merged   a merged model (W + s·BA folded in), LoRA off: the fast decode path a merged folder gets;
  * merged-ref  the same through the model's own forward (what LoRA serving runs), to separate the two costs;
  * base     the adapted model with every row on the base (slot 0): the cost of having LoRA on at all;
  * one      every row on adapter 1;
  * mixed    rows spread over the base and both adapters (three slots in each forward).
Setups alternate round by round; the figure is the median wall time per generated token of the batch over the
measured rounds, each setup's ratio to `merged`, and beside it the setup's first call in the process (round 0: a
user's first request, the first forwards and allocations). Also the outputs: every row of `mixed` equals the merged model of its slot, greedy.

    python bench/serve_lora.py                     # B 12, 32 new tokens, r 8, 5 rounds
    python bench/serve_lora.py --batch 24 --rank 16 --json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from glmstack.inference import Engine
from glmstack.inference.sampling import SamplingParams
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.model.lora import LoraConfig, apply_lora, lora_names, merged_state_dict
from glmstack.model.lora_multi import add_adapter
from glmstack.model.lora_peft import save_adapter
from glmstack.serve.scheduler import Job, Scheduler, Token


def adapter(base: GLM, folder: Path, rank: int, seed: int) -> GLM:
    """A copy of `base` with a random rank-`rank` adapter on every weight, saved as a PEFT folder; -> its merged twin."""
    model = copy.deepcopy(base)
    apply_lora(model, LoraConfig(r=rank, alpha=2 * rank, targets=["attention", "mlp", "experts"]), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in lora_names(model):
            p = model.get_parameter(n)
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    save_adapter(model, folder)
    merged = GLM(base.cfg)
    merged.load_state_dict(merged_state_dict(model), assign=True)
    return merged.eval()


def decode(engine, prompts, slots, new_tokens: int) -> tuple[float, list[list[int]]]:
    """Greedy decode of `prompts` as one scheduler batch (row b on LoRA slot slots[b]); -> (seconds, tokens)."""
    sched = Scheduler(engine, max_running=len(prompts))
    out = [[] for _ in prompts]
    jobs = [Job(prompt_ids=p, max_new_tokens=new_tokens, params=SamplingParams(temperature=0.0), seed=0,
                emit=lambda ev, b=b: out[b].append(ev.id) if isinstance(ev, Token) else None, adapter=s)
            for b, (p, s) in enumerate(zip(prompts, slots))]  # fmt: skip
    sched.submit(jobs)
    t0 = time.perf_counter()
    sched.start()
    while any(len(o) < new_tokens for o in out):
        time.sleep(0.001)
    dt = time.perf_counter() - t0
    sched.stop()
    return dt, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny-moe", num_nextn_predict_layers=0)
    base = GLM(cfg).init_weights(seed=0).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, cfg.vocab_size, (8 + b % 5,), generator=gen).tolist() for b in range(args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        merged = [base] + [adapter(base, tmp / f"a{k}", args.rank, seed=k) for k in (1, 2)]
        save_hf(base, tmp / "base")
        served = load_hf(tmp / "base").eval()
        for k in (1, 2):
            add_adapter(served, k, tmp / f"a{k}")
        lora_engine = Engine(served, fast=False)
        setups = {"merged": (Engine(merged[1]), [0] * args.batch),
                  "merged-ref": (Engine(merged[1], fast=False), [0] * args.batch), "base": (lora_engine, [0] * args.batch),
                  "one": (lora_engine, [1] * args.batch), "mixed": (lora_engine, [b % 3 for b in range(args.batch)])}
        times, first = {k: [] for k in setups}, {}
        outputs = {}
        for rnd in range(args.rounds + 1):
            for name, (engine, slots) in setups.items():
                dt, out = decode(engine, prompts, slots, args.new_tokens)
                if rnd:
                    times[name].append(dt / (args.batch * args.new_tokens))
                else:  # round 0: each setup's first call in this process (first forwards, allocations)
                    first[name] = dt / (args.batch * args.new_tokens)
                outputs[name] = out
        refs = [[Engine(merged[s]).generate([p], args.new_tokens, stop_ids=[]).tokens[0]]
                for p, s in zip(prompts, [b % 3 for b in range(args.batch)])]
        equal = all(outputs["mixed"][b] == refs[b][0] for b in range(args.batch))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"per_token_ms": {k: 1e3 * v for k, v in med.items()},
              "first_call_per_token_ms": {k: 1e3 * v for k, v in first.items()},
              "ratio_to_merged": {k: v / med["merged"] for k, v in med.items()},
              "mixed_equals_merged_greedy": equal, "batch": args.batch, "new_tokens": args.new_tokens,
              "rank": args.rank, "threads": torch.get_num_threads()}  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"tiny-moe, batch {args.batch}, {args.new_tokens} new tokens, adapters r {args.rank}, "
              f"{torch.get_num_threads()} threads, median of {args.rounds} rounds")  # fmt: skip
        for k in setups:
            print(f"  {k:10s} {1e3 * med[k]:7.3f} ms / token   {med[k] / med['merged']:5.2f}x merged   "
                  f"first call {1e3 * first[k]:7.3f} ms / token")  # fmt: skip
        print(f"  mixed rows equal their merged models' greedy outputs: {equal}")
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
