"""INT4 / FP8 weights (glmstack.inference.quant) against full precision: perplexity on held-out text, weight memory,
decode speed, in one process.

The model (default: the speedrun's, runs/speedrun/model from `glmstack speedrun --out runs/speedrun`) is loaded in
fp32 and copied per variant:
  fp32 fast   the engine's fast path (the default for an unquantized model)
  fp32 ref    the model's own forward, the path quantized models decode through (so the kernels compare alike)
  int4        quantize_(model, "int4"): group-wise, torch's int4 weight-only GEMM (bf16 activations)
  fp8         quantize_(model, "fp8"): 128 x 128 e4m3 blocks, dequantized per call on CPU
Perplexity: exp(mean next-token loss) over `--windows` held-out windows of `--seq` tokens (the eval split of the
token shards, never trained on). Decode: batch 1, a 32-token held-out prompt, `--new-tokens` greedy tokens,
variants interleaved `--repeats` times, medians; "same tokens" = greedy tokens equal to fp32's, position by position.

    python bench/quant.py [--model DIR] [--data DIR] [--threads 1] [--out quant.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time

import numpy as np
import torch

from glmstack.data.shards import TokenShards
from glmstack.inference import Engine
from glmstack.inference.quant import quantize_, weight_bytes
from glmstack.model import load_hf


def held_out(folder: str, length: int, n: int) -> torch.Tensor:
    """Up to n non-overlapping (length)-token windows from the held-out shards' token stream (N, length)."""
    shards = TokenShards(folder)
    stream = shards.span(0, min(shards.n_tokens, n * length))
    windows = [stream[s : s + length] for s in range(0, len(stream) - length + 1, length)]
    return torch.tensor(np.stack(windows), dtype=torch.long)


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch: int = 8) -> float:
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        x = windows[i : i + batch]
        logits = model(x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum")
        total, count = total + loss.item(), count + x[:, 1:].numel()
    return math.exp(total / count)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/speedrun/model", help="checkpoint folder (make speedrun writes this one)")
    ap.add_argument("--data", default="runs/speedrun/data/pretrain/eval", help="held-out token shards")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--seq", type=int, default=129, help="tokens per window (seq - 1 predictions)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the table as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = load_hf(args.model, dtype=torch.float32).eval()
    windows = held_out(args.data, args.seq, args.windows)
    variants = {"fp32 fast": (base, True), "fp32 ref": (base, False)}
    for scheme in ("int4", "fp8"):
        variants[scheme] = (quantize_(copy.deepcopy(base), scheme), False)
    engines = {name: Engine(m, fast=fast) for name, (m, fast) in variants.items()}
    prompt = [windows[0, :32].tolist()]
    want = engines["fp32 fast"].generate(prompt, args.new_tokens, stop_ids=[]).tokens[0]
    times: dict[str, list] = {name: [] for name in engines}
    for e in engines.values():
        e.generate(prompt, 8, stop_ids=[])  # warm-up
    for _ in range(args.repeats):
        for name, e in engines.items():
            t = time.perf_counter()
            got = e.generate(prompt, args.new_tokens, stop_ids=[]).tokens[0]
            times[name].append(time.perf_counter() - t)
            variants[name] += (sum(a == b for a, b in zip(got, want)) / len(want),) if len(variants[name]) == 2 else ()
    ppl0 = perplexity(base, windows)
    rows = []
    for name, (model, _, same) in variants.items():
        ppl = ppl0 if name.startswith("fp32") else perplexity(model, windows)
        rows.append({
            "weights": name, "perplexity": ppl, "ppl_change_pct": 100 * (ppl / ppl0 - 1),
            "weight_mib": weight_bytes(model) / 2**20,
            "ms_per_token": 1e3 * statistics.median(times[name]) / args.new_tokens,
            "same_tokens": same,
        })
    print(f"model {args.model}, held-out {len(windows)} x {args.seq} tokens from {args.data}, {args.threads} thread(s)")
    print("| weights | perplexity | change | weight MiB | decode ms/token (batch 1) | greedy tokens = fp32 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['weights']} | {r['perplexity']:.3f} | {r['ppl_change_pct']:+.2f}% | {r['weight_mib']:.2f} | "
              f"{r['ms_per_token']:.2f} | {100 * r['same_tokens']:.0f}% |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
