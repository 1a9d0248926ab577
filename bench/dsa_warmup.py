"""Does the DSA dense warm-up teach the indexer what the main attention looks at? Top-k recall before / after.

Runs the glm5_dsa recipe's stages on the tiny GLM-5 (glmstack/recipes/glm5_dsa.py) through the one training loop:
dense MLA pre-training, then the indexer's dense warm-up (only indexers train), then sparse adaptation, and
measures on held-out batches, per layer with an indexer, the share of the main attention's top-k keys (heads
summed) that the indexer's own top-k also picks (glmstack.model.dsa.measure_recall). A random indexer's recall
is about k / (average causal keys); the warm-up should raise it well above that.

    python bench/dsa_warmup.py                 # about a minute on a laptop CPU
    python bench/dsa_warmup.py --steps 200 60 40 --out /tmp/dsa
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from glmstack.model import load_hf
from glmstack.model.dsa import measure_recall
from glmstack.recipes import glm5_dsa
from glmstack.train import checkpoint
from glmstack.train.stage import build_data, run, stage_dir


def recall(cfg, folder, batches) -> list[float]:
    model = load_hf(folder, dtype=torch.float32)
    per_batch = [measure_recall(model, b["input_ids"], glm5_dsa.TOPK) for b in batches]
    return [sum(col) / len(col) for col in zip(*per_batch)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, nargs=3, default=[glm5_dsa.PRETRAIN_STEPS, glm5_dsa.WARMUP_STEPS,
                                                           glm5_dsa.SPARSE_STEPS], metavar=("PRE", "WARM", "SPARSE"))
    ap.add_argument("--out", default=None, help="run folder root (default: a temporary folder)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = args.out or tempfile.mkdtemp(prefix="dsa_warmup_")
    stages = [glm5_dsa.pretrain(), glm5_dsa.midtrain(), glm5_dsa.sparse()]
    for cfg, steps in zip(stages, args.steps):
        cfg.out_dir, cfg.steps, cfg.log.progress, cfg.log.plots = out, steps, False, False
    val = build_data(stages[0], vocab_size=512, split="val")
    batches = [val.batch(i) for i in range(4)]
    rows = []
    for cfg in stages:
        result = run(cfg)
        folder = checkpoint.latest(stage_dir(cfg))
        rows.append((cfg.stage, result.get("val_loss", result.get("loss")), recall(cfg, folder, batches)))
    print(f"top-k recall of the main attention by the indexer (k={glm5_dsa.TOPK}, seq 128), per layer:")
    for stage, loss, rec in rows:
        print(f"  after {stage:<11} recall {' '.join(f'{r:.3f}' for r in rec)}   mean {sum(rec) / len(rec):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
