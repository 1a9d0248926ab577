"""Vision-language training step (forward + backward) of glmstack's GLMV vs transformers' Glm4vMoeForConditionalGeneration.

Same weights (transformers saves, glmstack loads), a small GLM-4.5V-shaped config (ViT 4 x 256 wide, patch 14,
decoder = the `tiny-moe` text preset with 3D RoPE), a batch of images of mixed sizes through transformers'
Glm4vImageProcessorPil and their placeholder runs in the text, fp32 CPU, one process. Steps alternate glmstack /
transformers so load on a shared machine hits both alike; the ratio printed is the median of per-pair ratios of
process CPU time (robust to descheduling on a busy machine) and of wall time.

    python bench/vl_forward.py                    # 4 images per row, batch 2, 8 pairs after 2 warm-up pairs
    python bench/vl_forward.py --pairs 4 --images 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "parity"))

from glmstack.model.vision import VLConfig, load_vl_hf, token_types  # noqa: E402
from vl_helpers import hf_vl_model, image_batch, processor  # noqa: E402

SIZES = [(112, 84), (56, 168), (140, 112), (84, 84)]


def config() -> VLConfig:
    text = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
                num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                n_routed_experts=16, num_experts_per_tok=4)
    vision = dict(depth=4, hidden_size=256, num_heads=4, patch_size=14, image_size=112, out_hidden_size=256,
                  intermediate_size=512)
    return VLConfig.preset("tiny-glm4.5v", text_config=text, vision_config=vision, mrope_section=[2, 3, 3])


def step(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--images", type=int, default=4, help="images per row (batch of 2 rows)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = config()
    hf = hf_vl_model(cfg).train()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = load_vl_hf(d, dtype=torch.float32).train()
    rows = [[SIZES[(r + i) % len(SIZES)] for i in range(args.images)] for r in range(2)]
    ids, pv, grid = image_batch(cfg, rows, proc=processor(cfg, min_side=56, max_side=168))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    types = token_types(ids, cfg)

    def run_ours():
        ours.zero_grad(set_to_none=True)
        ours(ids, labels=labels, pixel_values=pv, image_grid_thw=grid).lm_loss.backward()

    def run_hf():
        hf.zero_grad(set_to_none=True)
        hf(input_ids=ids, labels=ids, pixel_values=pv, image_grid_thw=grid, mm_token_type_ids=types).loss.backward()

    for _ in range(args.warmup):
        step(run_ours), step(run_hf)
    wall, cpu = [], []
    for _ in range(args.pairs):
        (wo, co), (wh, ch) = step(run_ours), step(run_hf)
        wall.append(wh / wo)
        cpu.append(ch / co)
        print(f"glmstack {co * 1e3:7.1f} ms cpu   transformers {ch * 1e3:7.1f} ms cpu", flush=True)
    print(f"tokens {ids.numel()} (image tokens {int((types != 0).sum())}, patches {pv.shape[0]}), "
          f"{args.threads} thread(s)")
    print(f"speed-up glmstack vs transformers (median of {args.pairs} pairs): cpu {statistics.median(cpu):.3f}x  "
          f"wall {statistics.median(wall):.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
