"""Prefix cache: the KV of prompt prefixes kept across requests, so a re-sent history is not prefilled again.

Why: coding agents re-send their whole, growing conversation every turn (Z.ai, "Scaling Pain of Coding Agent
Serving", GLM-5, 2026); without reuse each turn prefills the full history again. As in vLLM's automatic prefix
caching, the prompt is cut into fixed-size blocks of `block_size` tokens; block j is keyed by all tokens up to its
end (a chained hash of (parent key, its tokens), checked against the stored tokens, so a hash collision can never
return the wrong KV). A new request looks up its longest chain of cached blocks and prefills only the rest.

How:
  - a Block holds, per attention layer, the (k, v) slices `cache.update` wrote for its positions — whatever they
    are: GQA keys/values (H, bs, Dh), or MLA's latent (1, bs, C) and [rope key ; indexer key] (1, bs, R) — plus the
    model's final-normed hidden states (bs, D), which MTP speculation feeds its draft layer.
  - blocks are shared read-only (never written after insertion; requests copy them into their own cache rows),
    reference-counted: a running request pins the blocks it was admitted with (`acquire` / `release`), and only
    unpinned leaves (no cached child) are evicted, least recently used first, when an insertion would exceed
    `budget_bytes`. A chain is touched deepest-first so that a parent is always more recent than its children.
  - `fault_block=n` corrupts the n-th inserted block: the fault-injection switch that shows the stress harness and
    the anomaly monitor catching a corrupted cache (tests/serve_stress.py, bench/monitor_table.py). fault_mode
    "noise": keys and values replaced by Gaussian noise of `fault_scale` times their std (a large scale mimics
    reading memory that was never written); "swap": the block holds another request's KV and hidden states (a
    cached block of another chain, at the same depth when there is one), what Z.ai's races produced (a request
    reading a recycled block that another request wrote).

    pc = PrefixCache(block_size=16, budget_bytes=256 * 2**20)
    blocks = pc.match(prompt_ids)             # longest cached chain over prompt_ids[:-1] (one token always computed)
    pc.acquire(blocks); ...; pc.release(blocks)
    pc.insert(prompt_ids, n_cached, kv_of)    # kv_of(j) -> ({layer: (k, v)}, hidden) for block j
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch


class Block:
    __slots__ = ("children", "hidden", "key", "kv", "nbytes", "ns", "parent", "ref", "tokens")

    def __init__(self, key: int, tokens: tuple[int, ...], parent: Block | None, kv: dict, hidden, ns: int = 0):
        self.key, self.tokens, self.parent, self.kv, self.hidden = key, tokens, parent, kv, hidden
        self.ns = ns  # the LoRA slot whose KV this is (0: the base); chains of different slots never share blocks
        self.ref, self.children = 0, 0
        self.nbytes = sum(k.nbytes + v.nbytes for k, v in kv.values()) + (hidden.nbytes if hidden is not None else 0)


class PrefixCache:
    def __init__(
        self,
        block_size: int = 16,
        budget_bytes: int = 256 * 2**20,
        fault_block: int | None = None,
        fault_scale: float = 1.0,
        fault_mode: str = "noise",
    ):
        if block_size < 1 or budget_bytes < 0:
            raise ValueError(
                f"prefix cache: block_size must be >= 1 and budget_bytes >= 0 ({block_size}, {budget_bytes})"
            )
        self.block_size, self.budget_bytes, self.fault_block = block_size, budget_bytes, fault_block
        self.fault_scale = fault_scale  # the noise's std in units of the block's own std (at least 1)
        if fault_mode not in ("noise", "swap"):
            raise ValueError(f"prefix cache: fault_mode must be 'noise' or 'swap', got {fault_mode!r}")
        self.fault_mode = fault_mode
        self.blocks: OrderedDict[int, Block] = OrderedDict()  # key -> block, least recently used first
        self.bytes = 0
        self.stats = {"lookups": 0, "hit_tokens": 0, "lookup_tokens": 0, "inserted": 0, "evicted": 0, "skipped": 0}
        self.corrupted: Block | None = None

    # ---- lookup ----------------------------------------------------------------------------------------
    @staticmethod
    def _key(parent: Block | None, tokens: tuple[int, ...], ns: int = 0) -> int:
        root = hash(("lora", ns)) if ns else 0
        return hash((parent.key if parent is not None else root, tokens))

    def _child(self, parent: Block | None, tokens: tuple[int, ...], ns: int = 0) -> Block | None:
        b = self.blocks.get(self._key(parent, tokens, ns))
        return b if b is not None and b.parent is parent and b.tokens == tokens and b.ns == ns else None

    def match(self, ids: list[int], ns: int = 0) -> list[Block]:
        """The longest chain of cached blocks covering a prefix of ids[:-1] (the last prompt token is always
        computed: its logits give the first new token), for LoRA slot `ns` (0: the base). Touches the chain (LRU)."""
        bs, chain, parent = self.block_size, [], None
        for j in range((len(ids) - 1) // bs):
            b = self._child(parent, tuple(ids[j * bs : (j + 1) * bs]), ns)
            if b is None:
                break
            chain.append(b)
            parent = b
        self._touch(chain)
        self.stats["lookups"] += 1
        self.stats["lookup_tokens"] += len(ids)
        self.stats["hit_tokens"] += len(chain) * bs
        return chain

    def _touch(self, chain: list[Block]) -> None:
        for b in reversed(chain):  # deepest first: parents end up more recent than their children
            self.blocks.move_to_end(b.key)

    # ---- pins -----------------------------------------------------------------------------------------
    def acquire(self, chain: list[Block]) -> None:
        for b in chain:
            b.ref += 1

    def release(self, chain: list[Block]) -> None:
        for b in chain:
            if b.ref <= 0:
                raise RuntimeError("prefix cache: release of a block that is not pinned")
            b.ref -= 1

    # ---- insertion and eviction -------------------------------------------------------------------------
    def insert(self, ids: list[int], chain: list[Block], kv_of: Callable[[int], tuple[dict, torch.Tensor | None]],
               ns: int = 0):  # fmt: skip
        """Add the full blocks of ids after `chain` (its cached prefix); kv_of(j) -> ({layer: (k, v)}, hidden) of
        block j (copied here); ns: the LoRA slot that computed them. Stops at the first block that does not fit the
        budget. Returns the new chain."""
        bs, chain = self.block_size, list(chain)
        parent = chain[-1] if chain else None
        self.acquire(chain)  # the chain being extended must not be evicted to make room for its own child
        try:
            for j in range(len(chain), len(ids) // bs):
                tokens = tuple(ids[j * bs : (j + 1) * bs])
                b = self._child(parent, tokens, ns)
                if b is None:
                    kv, hidden = kv_of(j)
                    b = Block(self._key(parent, tokens, ns), tokens, parent,
                              {i: (k.clone(), v.clone()) for i, (k, v) in kv.items()},
                              None if hidden is None else hidden.clone(), ns)  # fmt: skip
                    if not self._make_room(b.nbytes):
                        self.stats["skipped"] += 1
                        break
                    self._add(b)
                b.ref += 1
                chain.append(b)
                parent = b
        finally:
            self.release(chain)
        self._touch(chain)
        return chain

    def _add(self, b: Block) -> None:
        if self.fault_block is not None and self.stats["inserted"] == self.fault_block:
            self._corrupt(b)
        self.blocks[b.key] = b
        self.bytes += b.nbytes
        self.stats["inserted"] += 1
        if b.parent is not None:
            b.parent.children += 1

    def _corrupt(self, b: Block) -> None:
        if self.fault_mode == "swap":
            donor = self._other_request_block(b)
            for i, (k, v) in b.kv.items():
                k.copy_(donor.kv[i][0])
                v.copy_(donor.kv[i][1])
            if b.hidden is not None and donor.hidden is not None:
                b.hidden.copy_(donor.hidden)
        else:
            gen = torch.Generator(device="cpu").manual_seed(1234)
            for k, v in b.kv.values():
                for t in (k, v):
                    t.copy_(torch.randn(t.shape, generator=gen).to(t) * t.float().std().clamp_min(1.0).item()
                            * self.fault_scale)  # fmt: skip
        self.corrupted = b

    def _other_request_block(self, b: Block) -> Block:
        """A cached block off b's chain, the most recent one at b's depth if any (swap fault's donor)."""
        chain, depth = set(), 0
        a = b.parent
        while a is not None:
            chain.add(a.key)
            a, depth = a.parent, depth + 1
        others = [o for o in reversed(self.blocks.values()) if o.key not in chain]
        if not others:
            raise RuntimeError("prefix cache: fault_mode 'swap' needs another request's block in the cache")
        return next((o for o in others if _depth(o) == depth), others[0])

    def _make_room(self, need: int) -> bool:
        """Evict unpinned leaves, least recently used first, until `need` more bytes fit; False if they cannot."""
        if need > self.budget_bytes:
            return False
        while self.bytes + need > self.budget_bytes:
            victim = next((b for b in self.blocks.values() if b.ref == 0 and b.children == 0), None)
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _evict(self, b: Block) -> None:
        del self.blocks[b.key]
        self.bytes -= b.nbytes
        self.stats["evicted"] += 1
        if b.parent is not None:
            b.parent.children -= 1

    def clear(self) -> None:
        """Forget every unpinned block (the weights changed, e.g. an RL update: cached KV is stale)."""
        while True:
            victim = next((b for b in self.blocks.values() if b.ref == 0 and b.children == 0), None)
            if victim is None:
                return
            self._evict(victim)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens looked up."""
        return self.stats["hit_tokens"] / max(self.stats["lookup_tokens"], 1)


def _depth(b: Block) -> int:
    n = 0
    while b.parent is not None:
        b, n = b.parent, n + 1
    return n


# ---- the prefill of a batch of prompts over their cached prefixes (serve.scheduler; speculative admission) ----
def prefill_layout(pc: PrefixCache | None, prompts: list[list[int]], device, reuse: list[bool] | None = None,
                   ns: list[int] | None = None):  # fmt: skip
    """Lay out a batch prefill that reuses each prompt's cached prefix. -> (cache, ids_NS, pos_NS, pre_N, chains).
    reuse[b] False: prompt b is computed whole (a request that wants its routed experts: the cache keeps no routes);
    ns[b]: the LoRA slot row b runs with (its own cached chains; None: all the base's).

    The layout is the engine's left-padded one (row b's tokens are the last len_b of L positions, KVCache.start
    marks the padding), except that the first Q = L - S positions come from the cache instead of being computed:
    S = max_b (len_b - cached_b) new columns are fed, so a row whose cached prefix is longer than that recomputes a
    few of its cached tokens, and pre_N[b] = max(0, len_b - S) of its tokens are copied in. The chains are pinned
    (PrefixCache.acquire): the caller releases them when the request ends."""
    from glmstack.inference.kv_cache import KVCache

    ns = ns or [0] * len(prompts)
    chains = [pc.match(p, ns[b]) if pc is not None and (reuse is None or reuse[b]) else []
              for b, p in enumerate(prompts)]  # fmt: skip
    bs = pc.block_size if pc is not None else 0
    for chain in chains:
        if pc is not None:
            pc.acquire(chain)
    lens = [len(p) for p in prompts]
    S = max(n - len(c) * bs for n, c in zip(lens, chains))
    Q = max(0, max(lens) - S)
    L, N = Q + S, len(prompts)
    pre_N = [max(0, n - S) for n in lens]
    start_N = torch.tensor([L - n for n in lens], dtype=torch.long, device=device)
    cache = KVCache(N, L, start=start_N)
    if Q:
        _copy_prefixes(cache, chains, pre_N, Q, device)
    ids_NS = torch.zeros(N, S, dtype=torch.long)
    for b, p in enumerate(prompts):
        fed = p[pre_N[b] :]
        ids_NS[b, S - len(fed) :] = torch.tensor(fed, dtype=torch.long)
    pos_NS = (torch.arange(Q, L, device=device) - start_N[:, None]).clamp_min(0)
    return cache, ids_NS.to(device), pos_NS, pre_N, chains


def _copy_prefixes(cache, chains, pre_N: list[int], Q: int, device) -> None:
    """Write each row's first pre_N[b] cached positions into cache positions [Q - pre_N[b], Q), every layer."""
    donor = next(chains[b][0] for b, n in enumerate(pre_N) if n)
    for i, (k0, v0) in donor.kv.items():
        k_NHQD = torch.zeros(len(chains), k0.shape[0], Q, k0.shape[2], dtype=k0.dtype, device=device)
        v_NHQD = torch.zeros(len(chains), v0.shape[0], Q, v0.shape[2], dtype=v0.dtype, device=device)
        for b, n in enumerate(pre_N):
            if n:
                k_NHQD[b, :, Q - n :] = torch.cat([blk.kv[i][0] for blk in chains[b]], dim=1)[:, :n]
                v_NHQD[b, :, Q - n :] = torch.cat([blk.kv[i][1] for blk in chains[b]], dim=1)[:, :n]
        cache.update(i, k_NHQD, v_NHQD)


def prefix_hidden(chain: list[Block], n: int):
    """(n, D) final-normed hidden states of the first n cached positions (MTP speculation's catch-up input)."""
    return torch.cat([blk.hidden for blk in chain], dim=0)[:n]


def store_prefixes(pc: PrefixCache, prompts: list[list[int]], chains: list[list[Block]], cache, hidden_NSD,
                   ns: list[int] | None = None) -> None:  # fmt: skip
    """After a prefill laid out by prefill_layout: add each prompt's new full blocks to the cache (ns[b]: row b's
    LoRA slot)."""
    S = hidden_NSD.shape[1]
    Q = cache.seq_len - S
    for b, p in enumerate(prompts):
        start = int(cache.start[b])

        def kv_of(j, b=b, start=start):
            lo = start + j * pc.block_size
            hi = lo + pc.block_size
            kv = {i: (k[b, :, lo:hi], v[b, :, lo:hi]) for i, (k, v) in cache.buffers().items()}
            return kv, hidden_NSD[b, lo - Q : hi - Q]

        pc.insert(p, chains[b], kv_of, ns[b] if ns else 0)
