"""Vision-language requests through the server's scheduler: continuous batching vs one request at a time.

The same N image requests (one image each, mixed sizes, greedy, a fixed number of new tokens) go through
`VisionScheduler` with `--max-running N` (every request in one running batch) and with 1 (one at a time: what the
server did for VL checkpoints before VisionBatch), alternating so load on a shared machine hits both alike. The
model is a random GLM-4.5V-shaped GLMV (vl_forward.py's config: ViT 4 x 256, the `tiny-moe` decoder), fp32 CPU.
Prints generated tokens/s of each and the median ratio of wall and of process CPU time per pair.

    python bench/vl_serve_batch.py                       # 8 requests x 32 tokens, 3 pairs after 1 warm-up pair
    python bench/vl_serve_batch.py --requests 4 --tokens 16 --pairs 2
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vl_forward import SIZES, config

from glmstack.inference.sampling import SamplingParams
from glmstack.model.vision import GLMV, token_ids
from glmstack.multimodal.processor import VisionProcessor
from glmstack.multimodal.serving import VisionEngine, VisionScheduler
from glmstack.serve.scheduler import Finished, Job
from glmstack.tokenizer import Tokenizer


def engine() -> VisionEngine:
    with tempfile.TemporaryDirectory() as d:
        Tokenizer.train(["What is in the picture? A red square, a blue circle."] * 50, vocab_size=400).save(
            d, chat_style="glm-4.5"
        )
        tok = Tokenizer.load(d)
    cfg = dataclasses.replace(config(), **token_ids(tok))  # the tokenizer's vision token ids (vocab 400 < 4096)
    vc = cfg.vision_config
    proc = VisionProcessor(min_pixels=56 * 56, max_pixels=168 * 168, patch_size=vc.patch_size,
                           merge_size=vc.spatial_merge_size)  # fmt: skip
    return VisionEngine(GLMV(cfg).init_weights(seed=0).eval(), tok, proc, "cpu")


def jobs(eng: VisionEngine, n: int, tokens: int, done: threading.Semaphore) -> list[Job]:
    out = []
    for i in range(n):
        img = Image.new("RGB", SIZES[i % len(SIZES)], (40 * i % 256, 120, 200))
        msgs = [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": "What?"}]}]
        enc = eng.render_prompt(msgs, None, "glm-4.5", enable_thinking=False)
        emit = lambda ev: done.release() if isinstance(ev, Finished) else None
        out.append(Job(prompt_ids=enc.ids, max_new_tokens=tokens, params=SamplingParams(temperature=0.0), seed=i,
                       emit=emit, media=enc.media))  # fmt: skip
    return out


def run(eng: VisionEngine, n: int, tokens: int, max_running: int) -> tuple[float, float]:
    """(wall s, process CPU s) to serve the n requests."""
    done = threading.Semaphore(0)
    batch = jobs(eng, n, tokens, done)
    sched = VisionScheduler(eng, max_running=max_running)
    t0, c0 = time.perf_counter(), time.process_time()
    sched.submit(batch)
    sched.start()
    for _ in batch:
        done.acquire()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    sched.stop()
    return wall, cpu


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    eng = engine()
    total = args.requests * args.tokens
    ratios_wall, ratios_cpu, res = [], [], {"batched": [], "serial": []}
    for k in range(args.warmup + args.pairs):
        b = run(eng, args.requests, args.tokens, args.requests)
        s = run(eng, args.requests, args.tokens, 1)
        if k >= args.warmup:
            res["batched"].append(b)
            res["serial"].append(s)
            ratios_wall.append(s[0] / b[0])
            ratios_cpu.append(s[1] / b[1])
    for name, runs in res.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{name:8s} {total} tokens: {total / wall:8.1f} tok/s wall ({wall:.2f} s), {total / cpu:8.1f} tok/s CPU")
    print(f"batched / one at a time: {statistics.median(ratios_wall):.2f}x wall, {statistics.median(ratios_cpu):.2f}x "
          f"CPU throughput ({args.requests} requests x {args.tokens} tokens, {args.threads} thread)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
