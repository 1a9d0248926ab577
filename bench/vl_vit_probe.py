"""A short probe of the ViT pre-training stage (glmstack/multimodal/vit_pretrain.py): the attribute heads' held-out
accuracy per question kind after a few hundred steps, for a few ViT / image-size / lr settings, without the loop's
checkpoints (a plain loop: vl_probe.py's lr schedule, grad clip 1, Muon + AdamW as the recipe).

    python bench/vl_vit_probe.py --steps 300                                  # the recipe's vit stage settings
    python bench/vl_vit_probe.py --steps 300 --vision '{"depth": 4}' --max-pixels 8192
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    from vl_probe import set_lr  # bench/ is the script's folder

    from glmstack.chat.schema import visible_text
    from glmstack.multimodal import stage, vqa
    from glmstack.multimodal.vit_pretrain import AttributeStream, VisionPretrainer, attribute_loss, evaluate_heads
    from glmstack.optim import build_optimizer
    from glmstack.recipes.vl_tiny import VISION, vit
    from glmstack.tokenizer import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--vision", default="{}", help="JSON overrides of the recipe's vision_config")
    ap.add_argument("--max-pixels", type=int, default=None, help="the processor's max_pixels (t=2 frames count)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--n-eval", type=int, default=200)
    args = ap.parse_args()

    torch.manual_seed(0)
    cfg = vit()
    cfg.vl.model_overrides = {"vision_config": {**VISION, **json.loads(args.vision)}}
    cfg.optim.lr = args.lr or cfg.optim.lr
    cfg.vl.max_pixels = args.max_pixels or cfg.vl.max_pixels
    batch = args.batch or cfg.micro_batch_size
    texts = [visible_text(m.get("content")) for it in vqa.generate(200, seed=0) for m in vqa.messages(it)]
    tok = Tokenizer.train(texts * 4, vocab_size=cfg.vl.tokenizer_vocab)
    model = stage.build_model(cfg, tok, torch.device("cpu"))
    stage.freeze(model, "vision")
    pre = VisionPretrainer(model)
    proc = stage.processor_for(cfg, model)
    data = AttributeStream(proc, batch_size=batch)
    optimizer, _ = build_optimizer(pre, cfg.optim)
    print(f"{vars(args)} batch {batch} lr {cfg.optim.lr}", flush=True)
    cpu0 = time.process_time()
    for step in range(args.steps):
        set_lr(optimizer, step, args.steps)
        loss, _ = attribute_loss(pre, data.batch(step), {})
        loss.backward()
        torch.nn.utils.clip_grad_norm_(pre.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            ev = evaluate_heads(pre, proc, args.n_eval)
            acc = " ".join(f"{k} {v:.0%}" for k, v in ev["by_kind"].items())
            print(
                f"step {step + 1}: loss {loss.item():.3f}, held-out {ev['accuracy']:.1%} ({acc}), "
                f"{time.process_time() - cpu0:.0f} s CPU",
                flush=True,
            )


if __name__ == "__main__":
    main()
