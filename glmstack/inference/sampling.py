"""Token sampling: temperature, top-k, top-p (nucleus), greedy, batched, with one random stream per row.

Why: the engine, MTP speculative decoding and RL rollouts must agree on ONE definition of "the sampling
distribution" — speculative rejection sampling only preserves the output distribution if the draft
distribution q and the target distribution p come from the same transform (Leviathan et al. 2023).
So `probs()` is the single place that turns logits into the distribution we sample from; `sample()` and
the speculative acceptance rule both call it.

Order of the transforms follows transformers' generate(): temperature, then top-k, then top-p. Temperature
0 means greedy (argmax), which is what `probs()` returns as a one-hot so the rejection rule degenerates to
exact match.

Reproducibility per row: RL rollouts and evaluation need row b's sampled output to depend only on its prompt,
its seed and the sampling parameters, not on the other rows of its batch. So every draw has a key from
`RowStreams`, a counter-based generator (the idea of Philox / JAX's PRNG keys) where the key of draw `lane` at
step t of the row with seed s is a hash of (s, t, lane): no state shared between rows, and dropping finished rows
(Engine.compact) just drops their keys. A token is drawn by the exponential race (Gumbel-max: argmax p_i / E_i,
the E_i iid exponentials hashed from the key and the token id), not by the inverse CDF of one uniform: there every
token's interval moves when any token before it in the vocabulary changes probability, so the ~1e-6 float noise
between a batched and a one-row forward flipped 1 draw in 20k on the bench model (docs/inference.md, Seeds), and
more with a larger vocabulary; in the race a draw flips only when the top two scores are that close.
`row_seeds` is the rule that gives each row its seed (docs/inference.md, "Seeds").

    from glmstack.inference.sampling import RowStreams, SamplingParams, row_seeds, sample
    streams = RowStreams(row_seeds(seed=0, seeds=None, n=B))
    next_ids = sample(logits_BV, SamplingParams(temperature=0.7, top_p=0.9), streams.keys(step)[:, 0])  # (B,)
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch

M32, M64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


@dataclass(kw_only=True, frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy (argmax)
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1.0 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p on (..., V) logits; removed tokens get -inf. Float32 out."""
    x = logits.float() / params.temperature
    V = x.shape[-1]
    if 0 < params.top_k < V:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]  # (..., 1)
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        p_sorted = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(p_sorted, dim=-1) - p_sorted  # mass of strictly more likely tokens
        # Same rule as transformers' TopPLogitsWarper: drop a token once the ones above it reach top_p;
        # the most likely token always stays.
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution we sample from, (..., V) float32; one-hot on the argmax when greedy."""
    if params.greedy:
        idx = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, idx, 1.0)
    return torch.softmax(filter_logits(logits, params), dim=-1)


Noise = torch.Tensor | torch.Generator | None  # per-draw keys (RowStreams.keys), or a generator to draw from


def uniform_of(key: torch.Tensor) -> torch.Tensor:
    """Keys (32-bit values held in int64) -> uniforms in (0, 1), float32 (the top 24 bits, centred: never 0 or 1)."""
    return ((key >> 8).float() + 0.5) * 2.0**-24


@functools.lru_cache(maxsize=8)
def _token_salt(V: int, device: str) -> torch.Tensor:
    """(V,) distinct 32-bit values, one per token id (odd multiplier: a bijection mod 2^32)."""
    return (torch.arange(V, device=device) * 0x9E3779B1) & M32


def exponentials(shape: Sequence[int], noise: Noise, device) -> torch.Tensor:
    """(..., V) iid standard exponentials: hashed from per-draw keys (...) and the token id, or drawn from a
    generator (None: torch's global one)."""
    if isinstance(noise, torch.Tensor):
        return -torch.log(uniform_of(_mix32(_token_salt(shape[-1], str(device)) ^ noise[..., None])))
    return torch.empty(tuple(shape), device=device).exponential_(generator=noise)


def sample_from_probs(p: torch.Tensor, noise: Noise = None) -> torch.Tensor:
    """One draw per row of (..., V) probabilities -> (...) long by the exponential race: argmax p_i / E_i wins with
    probability p_i / sum(p) (what torch.multinomial does for one sample); tokens of probability 0 never win."""
    return (p.float() / exponentials(p.shape, noise, p.device)).argmax(-1)


def sample(logits: torch.Tensor, params: SamplingParams, noise: Noise = None) -> torch.Tensor:
    """Next token per row of (..., V) logits -> (...) long. Greedy skips the softmax and the noise entirely."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample_from_probs(probs(logits, params), noise)


# ---------------------------------------------------------------- per-row random streams
def row_seeds(seed: int | None, seeds: Sequence[int] | None, n: int) -> list[int]:
    """The seed of each of n rows: seeds[b] when given (one per row), else seed + b; neither: a random base seed.

    seed + b makes a row reproducible on its own: row b of generate(prompts, seed=s) is generate([prompts[b]],
    seed=s + b) (or seeds=[s + b]). The random base comes from `secrets`, so torch's global RNG is left alone.
    """
    if seeds is not None:
        if seed is not None:
            raise ValueError("give seed (row b gets seed + b) or seeds (one per prompt), not both")
        if len(seeds) != n:
            raise ValueError(f"seeds has {len(seeds)} entries for {n} prompts; give one per prompt")
        return [int(s) for s in seeds]
    base = secrets.randbits(63) if seed is None else int(seed)
    return [base + b for b in range(n)]


def _splitmix64(s: int) -> int:
    """Seed -> 64-bit key (Steele et al. 2014's finaliser, a bijection): nearby seeds get unrelated keys."""
    z = (s + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of 32-bit values held in int64 (xorshift-multiply as Wellons' lowbias32; both multipliers are
    below 2^31, so the int64 products of 32-bit values never overflow and right shifts stay logical)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & M32
    return x ^ (x >> 16)


class RowStreams:
    """One random stream per row: keys(step) -> (B, lanes) draw keys (32-bit values in int64), a pure function
    of (the row's seed, step, lane).

    Counter-based: the key of draw `lane` at `step` for the row whose seed hashes to k is hash(k, step * lanes +
    lane), three rounds of `_mix32` keyed by k's two halves (for one seed, distinct counters give distinct keys).
    A key becomes a uniform (`uniform_of`) or V exponentials (`exponentials`). A row's draws therefore do not depend
    on which rows share its batch, on dropped rows or on the order of the calls. Steps are hashed `block` at a time
    (a few dozen tensor ops per block, none per step).
    """

    def __init__(self, seeds: Sequence[int], lanes: int = 1, device=None, block: int = 64):
        keys = [_splitmix64(int(s) & M64) for s in seeds]
        self.lo_B1 = torch.tensor([k & M32 for k in keys], dtype=torch.long, device=device)[:, None]
        self.hi_B1 = torch.tensor([k >> 32 for k in keys], dtype=torch.long, device=device)[:, None]
        self.lanes, self.block = lanes, block
        self._first, self._keys_BSL = -1, None  # the hashed block: steps [_first, _first + block)

    def keys(self, step: int) -> torch.Tensor:
        """The draw keys of `step`, (B, lanes)."""
        first = step - step % self.block
        if first != self._first:
            self._keys_BSL, self._first = self._hash(first), first
        return self._keys_BSL[:, step - first]

    def keep_rows(self, idx: torch.Tensor) -> None:
        """Keep rows idx (in this order), as KVCache.keep_rows; their streams are unchanged."""
        self.lo_B1, self.hi_B1 = self.lo_B1[idx], self.hi_B1[idx]
        if self._keys_BSL is not None:
            self._keys_BSL = self._keys_BSL[idx]

    def _hash(self, first: int) -> torch.Tensor:
        L, S, dev = self.lanes, self.block, self.lo_B1.device
        x = torch.arange(first * L, (first + S) * L, device=dev)[None] & M32  # (1, S*L) counters
        for key_B1 in (self.lo_B1, self.hi_B1, self.lo_B1):
            x = _mix32(x ^ key_B1)
        return x.view(-1, S, L)
