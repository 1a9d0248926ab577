"""Loss-free balancing on vs off: the tiny MoE trained 300 steps on CPU, max/mean expert load per run.

Same seed, data and everything else; the only difference is the bias update rate u (1e-3 vs 0). The sequence-wise
aux loss (α = 1e-4) is on in both runs, as in GLM-4.5. Prints a table (docs/training.md quotes it); the per-step
curves are in <out>/{on,off}/pretrain/metrics.jsonl and plots/.

    python bench/balance.py --steps 300 --out /tmp/balance
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from glmstack.recipes import load_config
from glmstack.train.stage import run


def one(out: Path, name: str, steps: int, rate: float) -> list[dict]:
    cfg = load_config(
        "tiny",
        "pretrain",
        [
            f"out_dir={out}",
            f"run={name}",
            f"steps={steps}",
            f"schedule.balance_rate=[[0, {rate}]]",
            f"schedule.total_steps={steps}",
            "schedule.mtp_weight=[[0, 0.3]]",
            "schedule.batch_warmup_tokens=0",
            "ckpt.every=0",
            "log.val_every=0",
            "log.progress=false",
            "ckpt.resume=never",
        ],
    )
    run(cfg)
    return [json.loads(line) for line in (out / name / "pretrain" / "metrics.jsonl").read_text().splitlines()]


def summary(rows: list[dict], last: int = 50) -> dict:
    tail = rows[-last:]
    mean = lambda k: sum(r[k] for r in tail) / len(tail)
    layers = sorted(k for k in rows[-1] if k.startswith("moe/max_over_mean/"))
    return {
        "final max/mean (worst layer)": rows[-1]["moe/max_over_mean"],
        f"mean of last {last} steps": mean("moe/max_over_mean"),
        "final per layer": [round(rows[-1][k], 3) for k in layers],
        "final loss": rows[-1]["loss"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--out", default="/tmp/glmstack-balance")
    args = p.parse_args()
    out = Path(args.out)
    results = {name: summary(one(out, name, args.steps, rate)) for name, rate in (("on", 1e-3), ("off", 0.0))}
    print(f"\nloss-free balancing, tiny MoE, {args.steps} steps (max/mean expert load; 1.0 = perfectly even)")
    for name, r in results.items():
        print(
            f"  bias updates {name:>3}: "
            + ", ".join(f"{k} {v if isinstance(v, list) else round(v, 3)}" for k, v in r.items())
        )


if __name__ == "__main__":
    main()
