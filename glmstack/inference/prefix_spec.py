"""MTP speculative decoding of one prompt over its cached prefix (the server's `--speculative mtp` path).

Why: the prefix cache (prefix_cache.py) must serve the speculative path too, both for the speed-up and because the
anomaly monitor (serve/monitor.py) watches exactly this path's acceptance statistics for corrupted cached context.
How: speculative.mtp_decode runs unchanged over a forward wrapper (_PrefixRun) whose first call, the prefill, copies
the cached positions' KV into the main layers, computes only the rest, stores the new full blocks, and returns the
final-normed hidden states of ALL prompt positions (the cached ones from the blocks): the MTP layers' catch-up
feeds every prompt position, so their own caches are rebuilt from those hidden states (one layer, cheap).

    for ids in speculative_stream(engine, pc, prompt_ids, 64, SamplingParams(temperature=0), seed=0, stop_ids=[2]):
        ...   # the first list: the prefill's token; then one list per verify step (accepted drafts + 1)
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from glmstack.inference.engine import Rows
from glmstack.inference.fast import FastForward, ReferenceForward
from glmstack.inference.kv_cache import KVCache
from glmstack.inference.prefix_cache import PrefixCache, prefix_hidden
from glmstack.inference.sampling import RowStreams
from glmstack.inference.speculative import lanes, mtp_decode


class _PrefixRun:
    def __init__(self, run, pc: PrefixCache, prompt: list[int], chain: list):
        self.run, self.pc, self.prompt, self.chain = run, pc, prompt, chain
        self.cached = len(chain) * pc.block_size
        self.prefilled = False

    def __getattr__(self, name):  # mtp_step, draft_ids: the wrapped forward's
        return getattr(self.run, name)

    def forward(self, ids_BP, pos_BP, cache, last_only: bool = False):
        if self.prefilled:
            return self.run.forward(ids_BP, pos_BP, cache, last_only)
        self.prefilled, n = True, self.cached
        if n:
            for i in self.chain[0].kv:
                cache.update(i, *(torch.cat([b.kv[i][j] for b in self.chain], 1)[None] for j in (0, 1)))
        logits, hidden_BSD = self.run.forward(ids_BP[:, n:], pos_BP[:, n:], cache, last_only)
        bs = self.pc.block_size

        def kv_of(j):
            lo, hi = j * bs, (j + 1) * bs
            return {i: (k[0, :, lo:hi], v[0, :, lo:hi]) for i, (k, v) in cache.buffers().items()}, hidden_BSD[
                0, lo - n : hi - n
            ]

        self.pc.insert(self.prompt, self.chain, kv_of)
        if n:
            hidden_BSD = torch.cat([prefix_hidden(self.chain, n)[None].to(hidden_BSD), hidden_BSD], 1)
        return logits, hidden_BSD


def speculative_stream(engine, pc: PrefixCache, prompt: list[int], max_new_tokens: int, params, seed: int,
                       stop_ids, draft_k: int = 2, stats: dict | None = None) -> Iterator[list[int]]:  # fmt: skip
    """Engine.stream(prompt, speculative="mtp") for one prompt, with its cached prefix reused; yields id lists.
    The prefix blocks stay pinned while it runs."""
    budget = engine._budget(len(prompt), max_new_tokens)
    rows = Rows(1, budget, list(stop_ids), [seed])
    streams = None if params.greedy else RowStreams([seed], lanes(draft_k), engine.device)
    max_len = len(prompt) + budget + 2 * draft_k + 2
    run = (
        FastForward(engine.model, max_len, engine._expert_cache, engine.dense_max_tokens, engine._draft_vocab("mtp"))
        if engine.fast
        else ReferenceForward(engine.model)
    )
    chain = pc.match(prompt)
    pc.acquire(chain)
    try:
        ids_BP = torch.tensor([prompt], dtype=torch.long, device=engine.device)
        start_B = torch.zeros(1, dtype=torch.long, device=engine.device)
        cache = KVCache(1, max_len, start=start_B)
        wrapped = _PrefixRun(run, pc, prompt, chain)
        if stats is not None:
            stats["cached_tokens"] = wrapped.cached
        with torch.inference_mode():
            for new in mtp_decode(wrapped, engine.cfg, ids_BP, start_B, cache, rows, params, streams, draft_k, {}):
                yield new[0]
    finally:
        pc.release(chain)
