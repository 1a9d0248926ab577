"""A short probe of what lets the tiny recipe's from-scratch ViT learn: SFT on some visual QA kinds, held-out
accuracy every few steps.

Why: the tiny multimodal recipe (glmstack/recipes/vl_tiny.py) learns colours at once but shapes, counts and letters
slowly; a full `glmstack vl-recipe vl_tiny` run is many CPU-minutes, so configurations (patch size, ViT depth,
lr, a higher ViT lr) are compared here first on one kind (shape) in under a minute of CPU each.
The model, tokenizer, processor, chats and optimiser are the recipe's own (vl_tiny.sft(), fresh init, no
alignment stage); the loop is a plain SFT loop (cosine lr after a linear warm-up, grad clip 1) rather than
train/loop.py, so that nothing but the probed setting differs between runs. Accuracy is teacher-forced: a held-out
chat counts as right when every trained token of its boxed answer is the argmax (what greedy decoding would write).

    python bench/vl_probe.py --kinds shape --steps 300                          # the recipe's settings
    python bench/vl_probe.py --kinds shape --steps 300 --vision '{"patch_size": 8}'
    python bench/vl_probe.py --kinds colour,shape,count,text --steps 1500 --eval-every 250 --n-eval 200
    python bench/vl_probe.py --kinds colour,shape,count,text --init runs/vl_tiny/vit/model     # after the vit stage
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def split_vit_lr(optimizer, model, mult: float) -> None:
    """Scale the lr of the ViT's own parameters (not the adapter) by `mult`, in every optimiser group."""
    vit = {id(p) for n, p in model.named_parameters()
           if n.startswith("visual.") and not n.startswith(("visual.merger", "visual.downsample"))}  # fmt: skip
    for opt in optimizer.optimizers.values():
        groups = []
        for g in opt.param_groups:
            for ps, m in (
                ([p for p in g["params"] if id(p) in vit], mult),
                ([p for p in g["params"] if id(p) not in vit], 1),
            ):
                if ps:
                    groups.append({**g, "params": ps, "lr": g["lr"] * m, "initial_lr": g["initial_lr"] * m})
        opt.param_groups = groups


def set_lr(optimizer, step: int, steps: int) -> None:
    """A linear warm-up over min(20, steps/10) steps, then a cosine down to a tenth of the peak."""
    warm = max(1, min(20, steps // 10))
    frac = (step + 1) / warm if step < warm else 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / (steps - warm)))
    for g in optimizer.param_groups:
        g["lr"] = g["initial_lr"] * frac


def main() -> None:
    from glmstack.chat.schema import visible_text
    from glmstack.multimodal import stage, vqa
    from glmstack.multimodal.data import collate
    from glmstack.multimodal.encode import encode_multimodal
    from glmstack.optim import build_optimizer
    from glmstack.recipes.vl_tiny import VISION, sft
    from glmstack.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="shape", help="comma-separated visual QA kinds")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=None, help="peak lr (default: the recipe's SFT lr)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vision", default="{}", help="JSON overrides of the recipe's vision_config")
    ap.add_argument("--vit-lr-mult", type=float, default=1.0, help="lr multiplier of the ViT (not the adapter)")
    ap.add_argument("--adamw", action="store_true", help="AdamW for everything instead of Muon + AdamW")
    ap.add_argument("--init", default="", help="start from this model folder (e.g. the vit stage's) and its tokenizer")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--n-eval", type=int, default=120)
    args = ap.parse_args()

    torch.manual_seed(0)
    kinds = args.kinds.split(",")
    cfg = sft()
    cfg.init_from = args.init
    cfg.vl.model_overrides = {"vision_config": {**VISION, **json.loads(args.vision)}}
    cfg.optim.lr = args.lr or cfg.optim.lr
    cfg.optim.muon = not args.adamw
    texts = [visible_text(m.get("content")) for it in vqa.generate(200, seed=0) for m in vqa.messages(it)]
    tok = Tokenizer.load(args.init) if args.init else Tokenizer.train(texts * 4, vocab_size=cfg.vl.tokenizer_vocab)
    model = stage.build_model(cfg, tok, torch.device("cpu"))
    proc = stage.processor_for(cfg, model)
    optimizer, _ = build_optimizer(model, cfg.optim)
    if args.vit_lr_mult != 1.0:
        split_vit_lr(optimizer, model, args.vit_lr_mult)

    def batch(items):
        return collate([encode_multimodal(tok, proc, vqa.messages(it), style=cfg.vl.chat_style, enable_thinking=False)
                        for it in items])  # fmt: skip

    test = vqa.generate(args.n_eval, seed=0, split="test", kinds=kinds)
    test_batches = [batch(test[i : i + 40]) for i in range(0, len(test), 40)]

    @torch.no_grad()
    def accuracy() -> dict[str, float]:
        model.eval()
        right: dict[str, list[bool]] = {}
        for b, items in zip(test_batches, (test[i : i + 40] for i in range(0, len(test), 40))):
            logits = model(b["input_ids"], pixel_values=b["pixel_values"], image_grid_thw=b["image_grid_thw"]).logits
            ok_B = ((logits.argmax(-1) == b["labels"]) | (b["labels"] == -100)).all(-1)
            for it, ok in zip(items, ok_B.tolist()):
                right.setdefault(it["kind"], []).append(ok)
        model.train()
        return {"all": sum(map(sum, right.values())) / len(test)} | {
            k: sum(v) / len(v) for k, v in sorted(right.items())
        }

    print(f"{vars(args)} params {model.num_params():,}", flush=True)
    cpu0 = time.process_time()
    for step in range(args.steps):
        set_lr(optimizer, step, args.steps)
        b = batch(vqa.generate(args.batch, seed=1000 + step, split="train", kinds=kinds))
        logits = model(b["input_ids"], pixel_values=b["pixel_values"], image_grid_thw=b["image_grid_thw"]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            acc = " ".join(f"{k} {v:.0%}" for k, v in accuracy().items())
            print(f"step {step + 1}: loss {loss.item():.3f}, held-out {acc}, {time.process_time() - cpu0:.0f} s CPU",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
