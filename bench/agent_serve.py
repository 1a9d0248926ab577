"""Agentic serving benchmarks (issue 24): the prefix-cache stress run at scale, and a 10-turn agent conversation
re-sent each turn with the cache on and off in the same process.

    python bench/agent_serve.py stress --requests 2000 --concurrency 64 --budget-mb 1   # 0 mismatches expected
    python bench/agent_serve.py stress --requests 300 --concurrency 64 --fault-block 0  # mismatches expected
    python bench/agent_serve.py turns --turns 10

stress: a loopback server with a small prefix cache (evictions), many concurrent streaming clients with shared and
diverging prefixes and cancellations (tests/serve_stress.py); every output is compared with single-request,
no-cache Engine.generate. turns: two servers (cache on, cache off) on the same checkpoint, the conversation's turns
alternate between them; reports prefill tokens computed, time to first token, and whether the outputs are equal.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def turns(ckpt: str, n_turns: int, system_tokens: int, user_tokens: int, reply_tokens: int) -> dict:
    """The same agent conversation against a cache-on and a cache-off server, turn by turn (alternating first)."""
    import random

    import openai
    from serve_fixture import RunningServer

    servers = {"cache": RunningServer(ckpt, prefix_cache_mb=256, prefix_block=16),
               "no_cache": RunningServer(ckpt, prefix_cache_mb=0)}  # fmt: skip
    rng = random.Random(0)
    vocab = servers["cache"].engine.tokenizer.vocab_size
    prompt = [rng.randrange(3, vocab) for _ in range(system_tokens + user_tokens)]
    ttft = {k: [] for k in servers}
    equal = True
    try:
        clients = {k: openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=600)
                   for k, s in servers.items()}  # fmt: skip
        for t in range(n_turns):
            replies = {}
            for name in list(servers) if t % 2 == 0 else list(servers)[::-1]:
                t0, first, got = time.perf_counter(), None, []
                stream = clients[name].completions.create(
                    model="tiny", prompt=prompt, max_tokens=reply_tokens, temperature=0, stream=True,
                    extra_body={"return_token_ids": True, "ignore_eos": True})  # fmt: skip
                for chunk in stream:
                    for c in chunk.choices:
                        ids = (c.model_extra or {}).get("token_ids") or []
                        if ids and first is None:
                            first = time.perf_counter() - t0
                        got += ids
                ttft[name].append(first)
                replies[name] = got
            equal &= replies["cache"] == replies["no_cache"]
            prompt = prompt + replies["no_cache"] + [rng.randrange(3, vocab) for _ in range(user_tokens)]
    finally:
        for s in servers.values():
            s.stop()
    computed = {k: s.sched.stats["prefill_computed"] for k, s in servers.items()}
    prompt_tokens = servers["no_cache"].sched.stats["prompt_tokens"]
    mean = {k: sum(v) / len(v) for k, v in ttft.items()}
    late = {k: sum(v[1:]) / max(len(v) - 1, 1) for k, v in ttft.items()}  # turns 2..n (turn 1 has nothing cached)
    return {
        "turns": n_turns, "prompt_tokens_total": prompt_tokens, "prefill_computed": computed,
        "prefill_reduction": round(1 - computed["cache"] / computed["no_cache"], 3),
        "ttft_s_per_turn": {k: [round(x, 4) for x in v] for k, v in ttft.items()},
        "ttft_mean_s": {k: round(v, 4) for k, v in mean.items()},
        "ttft_ratio_no_cache_over_cache_turns_2_on": round(late["no_cache"] / late["cache"], 2),
        "outputs_identical": equal,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stress")
    s.add_argument("--requests", type=int, default=2000)
    s.add_argument("--concurrency", type=int, default=64)
    s.add_argument("--budget-mb", type=float, default=1.0)
    s.add_argument("--fault-block", type=int, default=None)
    s.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("turns")
    t.add_argument("--turns", type=int, default=10)
    t.add_argument("--system-tokens", type=int, default=400)
    t.add_argument("--user-tokens", type=int, default=24)
    t.add_argument("--reply-tokens", type=int, default=24)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--hidden", type=int, default=256, help="model width (heads of 32, 2 kv heads): prefill-bound")
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from serve_stress import build_random_checkpoint, stress

    res = {}
    with tempfile.TemporaryDirectory() as d:
        if args.cmd == "stress":
            ckpt = build_random_checkpoint(Path(d) / "tiny")
            res = stress(ckpt, args.requests, args.concurrency, args.budget_mb, args.fault_block, args.seed)
        else:
            h = args.hidden
            ckpt = build_random_checkpoint(Path(d) / "tiny", num_hidden_layers=args.layers,
                                           first_k_dense_replace=args.layers, hidden_size=h, intermediate_size=3 * h,
                                           num_attention_heads=h // 32, num_key_value_heads=2, head_dim=32)  # fmt: skip
            res["model"] = f"{args.layers} dense layers, hidden {h}"
            res = turns(ckpt, args.turns, args.system_tokens, args.user_tokens, args.reply_tokens) | res
    res["load_avg_1min"] = round(__import__("os").getloadavg()[0], 1)
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
