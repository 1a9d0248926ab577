"""The cost model of MTP speculative decoding: what one draft-verify round costs next to a plain decode step, and
the speed-up that bounds.

One round (glmstack.inference.speculative) runs k MTP steps (the catch-up on the confirmed positions, then k - 1
recursive drafts) and one main-model forward over k + 1 positions (the verify), and emits the mean accepted
length tau tokens. A plain step emits one token per main-model forward over one position. So

    speed-up <= tau * t_plain / (t_verify(k + 1) + k * t_mtp)

It is a bound, not a prediction: it leaves out the catch-up's extra positions and the cache rewinds, which only
cost more. Where a forward costs in proportion to the positions it reads (a tiny model on a CPU), t_verify(k + 1)
is near (k + 1) * t_plain and no tau <= k + 1 pays for the drafts; where a forward costs the same for 1 or k + 1
positions (a large model, memory-bound), the bound approaches tau.

    phases = phase_costs(engine, ids_BT, ks=(3,))      # ms per phase at the batch of ids_BT
    speedup_bound(phases, k=3, accepted=1.8)
"""

from __future__ import annotations

import statistics
import time

import torch

from glmstack.inference.fast import FastForward, ReferenceForward
from glmstack.inference.kv_cache import KVCache


@torch.inference_mode()
def phase_costs(engine, ids_BT: torch.Tensor, ks=(3,), repeats: int = 20) -> dict[str, float]:
    """Milliseconds (medians of `repeats` rounds) of the phases of a round at the batch of `ids_BT`, after a prompt
    of its first T - max(ks) - 1 tokens, through the forward the engine uses (fast path, expert cache, draft
    vocabulary): "plain" (one position per row), "verify_{k+1}" per k, "mtp_step" (one position, MTP layer 0).
    Each round runs the phases one after the other and rewinds each, so, as in the decode loop, no phase finds
    its weights left in cache by itself."""
    model, (B, T) = engine.model, ids_BT.shape
    P = T - max(ks) - 1
    if P < 1:
        raise ValueError(f"ids_BT has {T} tokens; phase_costs needs more than max(ks) + 1 = {max(ks) + 1}")
    run = _forward(engine, T + 8)
    cache, ids = KVCache(B, T + 8), ids_BT.to(engine.device)
    pos = torch.arange(T, device=ids.device)[None].expand(B, T)
    n = model.cfg.num_hidden_layers
    _, h = run.forward(ids[:, :P], pos[:, :P], cache)
    run.mtp_step(0, ids[:, 1 : P + 1], h, pos[:, :P], cache)
    main_layers = range(n)
    phases = {"plain": (lambda: run.forward(ids[:, P : P + 1], pos[:, P : P + 1], cache, last_only=True), 1,
                        main_layers)}  # fmt: skip
    for k in ks:
        block = (ids[:, P : P + k + 1], pos[:, P : P + k + 1])
        phases[f"verify_{k + 1}"] = (lambda block=block: run.forward(*block, cache), k + 1, main_layers)
    phases["mtp_step"] = (lambda: run.mtp_step(0, ids[:, P + 1 : P + 2], h[:, -1:], pos[:, P : P + 1], cache), 1,
                          [n])  # fmt: skip
    times = {name: [] for name in phases}
    for _ in range(repeats):  # interleaved, so that load on a shared machine hits every phase alike
        for name, (fn, drop, layers) in phases.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
            cache.rewind(drop, layers=layers)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def _forward(engine, max_len: int):
    if not engine.fast:
        return ReferenceForward(engine.model)
    return FastForward(engine.model, max_len, engine._expert_cache, engine.dense_max_tokens,
                       engine._draft_vocab("mtp"))  # fmt: skip


def speedup_bound(phases: dict[str, float], k: int, accepted: float) -> float:
    """Speed-up at most: accepted tokens per round x plain step / (verify of k + 1 positions + k MTP steps)."""
    return accepted * phases["plain"] / round_cost(phases, k)


def round_cost(phases: dict[str, float], k: int) -> float:
    """Milliseconds of one draft-verify round without its bookkeeping: the verify and the k MTP steps."""
    return phases[f"verify_{k + 1}"] + k * phases["mtp_step"]
