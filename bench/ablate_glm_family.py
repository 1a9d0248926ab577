"""Ablations of issue 21 on a micro GLM, every arm trained by the one training loop (glmstack/train/loop.py).

  blank   GLM blank infilling (glm2021's objective mix) vs plain causal LM, same architecture (2D RoPE, no MTP):
          infill_nll = mean NLL of held-out [MASK] span tokens but a document's first (blank: Part B, both-side
          context; causal: the same tokens under left-to-right LM, left context only);  l2r_nll = mean NLL of a document's second half given
          its first half (blank: [gMASK] format; causal: plain LM).
  stab    Pre-LN vs DeepNorm vs embedding-gradient shrink (a = 0.1) at a high AdamW lr: final loss, spikes (steps
          whose loss exceeds the running mean (EMA 0.9) by > 20%), max grad norm.

    python bench/ablate_glm_family.py blank --seeds 0 1 2 --steps 120
    python bench/ablate_glm_family.py stab --seeds 0 1 2 --steps 120 --lr 3e-2

Prints one JSON row per run and a markdown table of means +- std over seeds. CPU, fp32.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import tempfile
import time

import numpy as np
import torch

from glmstack.data.blank_infilling import BlankConfig, build_sample, gmask_span, mask_spans
from glmstack.optim import build_optimizer
from glmstack.recipes.glm2021 import blank_options
from glmstack.train.config import TrainConfig
from glmstack.train.loop import train
from glmstack.train.stage import build_data, build_model, seed_everything
from glmstack.train.synthetic import SyntheticLM

MICRO = {"vocab_size": 133, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "first_k_dense_replace": 2, "num_nextn_predict_layers": 0, "position_2d": True,
         "partial_rotary_factor": 1.0}


def config(seed: int, steps: int, lr: float, out: str, *, blank: bool, overrides: dict, muon: bool,
           clip: float = 1.0) -> TrainConfig:
    cfg = TrainConfig(run=f"s{seed}", stage="arm", out_dir=out, model="tiny", seq_len=32, micro_batch_size=8,
                      steps=steps, seed=seed, device="cpu", model_overrides={**MICRO, **overrides})
    cfg.optim.lr, cfg.optim.muon, cfg.optim.grad_clip = lr, muon, clip
    cfg.schedule.warmup_steps, cfg.schedule.total_steps = 10, steps
    cfg.schedule.mtp_weight = [[0, 0.0]]
    cfg.data.options = blank_options(seed=seed) if blank else {"reserved_ids": 5}
    cfg.ckpt.every, cfg.log.progress, cfg.log.plots = steps, False, False
    return cfg


def run_arm(cfg: TrainConfig):
    seed_everything(cfg.seed)
    model = build_model(cfg, torch.device("cpu"))
    opt, _ = build_optimizer(model, cfg.optim)
    with contextlib.redirect_stdout(io.StringIO()):
        train(model=model, optimizer=opt, data=build_data(cfg, MICRO["vocab_size"]), cfg=cfg,
              stage_dir=f"{cfg.out_dir}/{cfg.run}/{cfg.stage}")
    rows = [json.loads(line) for line in open(f"{cfg.out_dir}/{cfg.run}/{cfg.stage}/metrics.jsonl")]
    return model.eval(), rows


def heldout_docs(seed: int, n_docs: int = 32, length: int = 24) -> np.ndarray:
    """Validation-stream documents of the Markov chain the arm trained on (the chain is seeded by the run seed)."""
    val = SyntheticLM(vocab_size=MICRO["vocab_size"], seq_len=length - 1, batch_size=n_docs, seed=seed, split="val",
                      reserved_ids=5)
    b = val.batch(0)
    return torch.cat([b["input_ids"], b["labels"][:, -1:]], 1).numpy()


def nll(model, ids, labels, pos=None, prefix_len=None) -> tuple[float, int]:
    """Summed NLL over labels != -100, and their count, for one row."""
    kw = {"position_ids": torch.tensor([pos])} if pos is not None else {}
    if prefix_len is not None:
        kw["prefix_len"] = torch.tensor([prefix_len])
    with torch.no_grad():
        logits = model(torch.tensor([ids]), **kw).logits[0]
    lab = torch.tensor(labels)
    keep = lab != -100
    return float(torch.nn.functional.cross_entropy(logits[keep], lab[keep], reduction="sum")), int(keep.sum())


def evaluate(model, blank: bool, seed: int) -> dict:
    ids = BlankConfig().special_ids(MICRO["vocab_size"])
    docs, tot = heldout_docs(seed), {"infill": [0.0, 0], "l2r": [0.0, 0]}
    for i, doc in enumerate(docs):
        rng = np.random.default_rng([1234, i])
        tasks = {"infill": mask_spans(len(doc), rng), "l2r": [(len(doc) // 2, len(doc))]}
        for name, spans in tasks.items():
            mask_id = ids["gmask"] if name == "l2r" else ids["mask"]
            s = build_sample(doc, spans, mask_id, ids["sop"], ids["eop"], shuffle=False)
            if blank:  # score the span tokens only (not <eop>), and not a document's first token (as causal)
                labels = [t if t != ids["eop"] else -100 for t in s["labels"].tolist()]
                if spans[0][0] == 0:  # Part B in document order: the first span's first target
                    labels[s["prefix_len"]] = -100
                got = nll(model, s["input_ids"].tolist(), labels, s["position_ids"].tolist(), s["prefix_len"])
            else:  # causal LM on the original document, scored on the same tokens
                labels = [-100] * (len(doc) - 1)
                for a, e in spans:
                    for t in range(max(a, 1), e):
                        labels[t - 1] = int(doc[t])
                got = nll(model, doc[:-1].tolist(), labels)
            tot[name][0] += got[0]
            tot[name][1] += got[1]
    return {f"{k}_nll": v[0] / v[1] for k, v in tot.items()}


def spikes(rows) -> dict:
    ema, n, gmax = None, 0, 0.0
    for r in rows:
        loss = r["loss"]
        if ema is not None and (not np.isfinite(loss) or loss > 1.2 * ema):
            n += 1
        ema = loss if ema is None else 0.9 * ema + 0.1 * loss if np.isfinite(loss) else ema
        gmax = max(gmax, r.get("grad_norm", 0.0))
    return {"final_loss": rows[-1]["loss"], "spikes": n, "max_grad_norm": gmax}


def table(results: dict[str, list[dict]]) -> str:
    keys = list(next(iter(results.values()))[0])
    lines = ["| arm | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for arm, runs in results.items():
        cells = []
        for k in keys:
            vals = [r[k] for r in runs]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cells.append(f"{statistics.mean(vals):.3f} ± {sd:.3f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("which", choices=["blank", "stab"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--lr", type=float, default=3e-2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--clip", type=float, default=1.0, help="stab: grad-norm clip (0 = off)")
    p.add_argument("--arms", nargs="+", default=None, help="run only these arms (names as printed)")
    args = p.parse_args()
    torch.set_num_threads(1)
    MICRO["num_hidden_layers"] = MICRO["first_k_dense_replace"] = args.layers
    if args.which == "blank":
        arms = {"blank infilling": (True, {}), "causal LM": (False, {})}
    else:
        arms = {"Pre-LN": (False, {}), "DeepNorm": (False, {"deepnorm": True}),
                "shrink a=0.1": (False, {"embedding_grad_shrink": 0.1})}
    arms = {a: v for a, v in arms.items() if args.arms is None or a in args.arms}
    results: dict[str, list[dict]] = {a: [] for a in arms}
    for seed in args.seeds:  # arms interleaved per seed: load drift hits them alike
        for arm, (blank, over) in arms.items():
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as out:
                lr = args.lr if args.which == "stab" else 3e-3
                cfg = config(seed, args.steps, lr, out, blank=blank, overrides=over, muon=args.which == "blank",
                             clip=args.clip if args.which == "stab" else 1.0)
                model, rows = run_arm(cfg)
            row = evaluate(model, blank, seed) if args.which == "blank" else spikes(rows)
            if args.which == "blank":
                row["train_loss"] = rows[-1]["loss"]
            results[arm].append(row)
            print(json.dumps({"arm": arm, "seed": seed, **row, "sec": round(time.perf_counter() - t0, 1)}),
                  flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
