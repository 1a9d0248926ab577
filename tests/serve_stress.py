"""Stress harness for the prefix cache under load: many concurrent clients, shared and diverging prefixes,
cancellations mid-stream, a cache budget that forces evictions; every completed greedy output must equal its
single-request, no-cache reference token for token (and a cancelled one must be a prefix of it).

Used by tests/integration/test_serve_stress.py (bounded: ~150 requests) and bench/agent_serve.py (the issue's
scale: >= 2,000 requests, 64 concurrent). The model is a random tiny GLM: greedy decoding of random weights is as
deterministic as a trained model's, and a corrupted or misplaced KV block changes its output just the same.

Workload: prompts grow like agent conversations: a request takes an earlier prompt (often a recent one) or one of a
few system prompts, appends a random "turn" of 1..24 tokens, and becomes a prompt later requests may extend, so
prompts share long prefixes and diverge at arbitrary (not block-aligned) points. With `fold_frac` a request may
instead fold an earlier prompt as agentic context management does (posttrain/agentic/context.py): a span after its
system prompt is replaced by a fixed stub, so the prompt shares only the part before the span with the cache.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import torch

from glmstack.model import GLM, ModelConfig, save_hf
from glmstack.tokenizer import Tokenizer


def build_random_checkpoint(folder, preset: str = "tiny", **overrides) -> str:
    """A random-weight tiny GLM and a small tokenizer, saved to `folder` (a second or two). Default: 2 dense layers,
    no MTP (the cheapest model whose KV path is the served one; MoE routing only costs time here)."""
    overrides = {"num_hidden_layers": 2, "first_k_dense_replace": 2, "num_nextn_predict_layers": 0,
                 "max_position_embeddings": 1024, **overrides}
    tok = Tokenizer.train(["the quick brown fox jumps over the lazy dog. " * 20, "hello world, agents " * 20],
                          vocab_size=300)  # fmt: skip
    cfg = ModelConfig.preset(preset, vocab_size=tok.vocab_size, **overrides)
    save_hf(GLM(cfg).init_weights(seed=0).eval(), folder)
    tok.save(folder, chat_style="glm-4.5")
    return str(folder)


@dataclass
class Req:
    prompt: list[int]
    max_tokens: int
    cancel_after: int | None = None  # close the stream after this many tokens
    got: list[int] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None


def workload(n: int, vocab: int, seed: int = 0, systems: int = 6, system_len: int = 48, max_prompt: int = 400,
             cancel_frac: float = 0.1, max_tokens: tuple[int, int] = (4, 12), fold_frac: float = 0.0) -> list[Req]:  # fmt: skip
    rng = random.Random(seed)
    pool = [[rng.randrange(3, vocab) for _ in range(system_len)] for _ in range(systems)]
    stub = [rng.randrange(3, vocab) for _ in range(4)] if fold_frac else []
    reqs = []
    for _ in range(n):
        r = rng.random()
        base = rng.choice(pool[-16:]) if r < 0.6 else rng.choice(pool) if r < 0.9 else rng.choice(pool[:systems])
        if fold_frac and rng.random() < fold_frac and len(base) > system_len + 8:  # a fold: a span -> the stub
            a = rng.randrange(system_len, len(base) - 4)
            base = base[:a] + stub + base[rng.randint(a + 4, len(base)) :]
        if len(base) > max_prompt - 24:
            base = pool[rng.randrange(systems)]
        prompt = base + [rng.randrange(3, vocab) for _ in range(rng.randint(1, 24))]
        pool.append(prompt)
        m = rng.randint(*max_tokens)
        cancel = rng.randint(1, m - 1) if rng.random() < cancel_frac else None
        reqs.append(Req(prompt, m, cancel))
    return reqs


async def _one(client, sem, req: Req) -> None:
    async with sem:
        try:
            stream = await client.completions.create(
                model="tiny", prompt=req.prompt, max_tokens=req.max_tokens, temperature=0, stream=True,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )  # fmt: skip
            async for chunk in stream:
                for c in chunk.choices:
                    req.got += (c.model_extra or {}).get("token_ids") or []
                    req.finish = c.finish_reason or req.finish
                if req.cancel_after is not None and len(req.got) >= req.cancel_after:
                    await stream.close()
                    req.finish = "cancelled"
                    return
        except Exception as e:  # noqa: BLE001 — reported per request, counted by the caller
            req.error = f"{type(e).__name__}: {e}"


def run_clients(url: str, reqs: list[Req], concurrency: int, time_limit: float = 600.0) -> float:
    """Send every request (at most `concurrency` at once) with the official async openai client; -> seconds."""
    import openai

    async def main():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=time_limit)
        sem = asyncio.Semaphore(concurrency)
        await asyncio.wait_for(asyncio.gather(*(_one(client, sem, r) for r in reqs)), time_limit)
        await client.close()

    t0 = time.monotonic()
    asyncio.run(main())
    return time.monotonic() - t0


def references(engine, reqs: list[Req]) -> dict[tuple, list[int]]:
    """Single-request, no-cache greedy output per distinct (prompt, max_tokens): Engine.generate, one at a time."""
    refs = {}
    for r in reqs:
        key = (tuple(r.prompt), r.max_tokens)
        if key not in refs:
            refs[key] = engine.generate([r.prompt], r.max_tokens, temperature=0, stop_ids=[]).tokens[0]
    return refs


def check(reqs: list[Req], refs: dict) -> dict:
    """Counts: completed, cancelled, errors, mismatches (a completed output != its reference, or a cancelled one
    that is not a prefix of it)."""
    out = {"requests": len(reqs), "completed": 0, "cancelled": 0, "errors": 0, "mismatches": 0, "error_kinds": {}}
    for r in reqs:
        ref = refs[(tuple(r.prompt), r.max_tokens)]
        if r.error:
            out["errors"] += 1
            kind = r.error[:120]
            out["error_kinds"][kind] = out["error_kinds"].get(kind, 0) + 1
        elif r.finish == "cancelled":
            out["cancelled"] += 1
            out["mismatches"] += r.got != ref[: len(r.got)]
        else:
            out["completed"] += 1
            out["mismatches"] += r.got != ref
    return out


def stress(ckpt: str, n: int, concurrency: int, budget_mb: float, fault_block: int | None = None, seed: int = 0,
           block: int = 16, time_limit: float = 600.0, fold_frac: float = 0.0) -> dict:  # fmt: skip
    """One server (prefix cache of budget_mb), the workload, the references; -> counts and cache figures."""
    from serve_fixture import RunningServer

    srv = RunningServer(ckpt, max_running=concurrency, max_waiting=max(256, n), prefix_cache_mb=budget_mb,
                        prefix_block=block, fault_block=fault_block)  # fmt: skip
    try:
        reqs = workload(n, srv.engine.tokenizer.vocab_size, seed=seed, fold_frac=fold_frac)
        seconds = run_clients(srv.url, reqs, concurrency, time_limit)
    finally:
        srv.stop()
    pc, st = srv.sched.prefix_cache, srv.sched.stats
    with torch.inference_mode():
        refs = references(srv.engine, reqs)
    return {**check(reqs, refs), "seconds": round(seconds, 1), "hit_rate": round(pc.hit_rate, 3),
            "evicted": pc.stats["evicted"], "prompt_tokens": st["prompt_tokens"],
            "prefill_computed": st["prefill_computed"], "generated": st["generated_tokens"]}  # fmt: skip
