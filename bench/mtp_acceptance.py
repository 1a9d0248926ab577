"""MTP speculative decoding's acceptance length for model folders, on held-out prompts of an RL task.

Why: RL moves the trunk, and an MTP layer left as it was drafts for the old trunk (sglang#34495, verl#6947);
`rl.mtp_weight` trains it on the rollouts (docs/rl.md). The RL dashboard tracks the acceptance length on 32 held-out
prompts at each evaluation; this measures it on more prompts and several tasks for finished runs' models, greedy,
k drafts per verify step, and checks that the speculative output equals plain greedy decoding.

    python bench/mtp_acceptance.py runs/speedrun/sft/model runs/speedrun/rl/model --tasks compare,chat --n 200
"""

from __future__ import annotations

import argparse

import torch

from glmstack.inference import Engine
from glmstack.model.hf import load_hf
from glmstack.posttrain.rl.tasks import make_task
from glmstack.tokenizer import Tokenizer


def acceptance(folder: str, task: str, level: int, n: int, k: int, max_new: int) -> tuple[float, float]:
    model, tok = load_hf(folder, dtype=torch.float32).eval(), Tokenizer.load(folder)
    prompts = [p.prompt_ids for p in make_task(task, tok).problems(split="test", n=n, seed=0, level=level)]
    engine = Engine(model, tok)
    plain = engine.generate(prompts, max_new, temperature=0.0)
    spec = engine.generate(prompts, max_new, temperature=0.0, speculative="mtp", draft_k=k)
    same = sum(a == b for a, b in zip(plain.tokens, spec.tokens)) / len(prompts)
    return spec.stats["mean_accepted_length"], same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tasks", default="compare:3,chat:0", help="task:level, comma-separated")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tasks = [(t.split(":")[0], int(t.split(":")[1]) if ":" in t else 0) for t in args.tasks.split(",")]
    print("| model | " + " | ".join(f"{t} accepted length (spec == greedy)" for t, _ in tasks) + " |")
    print("|---|" + "---|" * len(tasks))
    for folder in args.models:
        cells = [acceptance(folder, t, lv, args.n, args.k, args.max_new_tokens) for t, lv in tasks]
        print(f"| {folder} | " + " | ".join(f"{a:.3f} ({s:.2f})" for a, s in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
