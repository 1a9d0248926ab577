"""The inference engine: batched prefill + decode over a preallocated KV cache, sampling, per-row stop.

Why: RL rollouts, evaluation, the server and `glmstack chat` all generate through this one engine, so it must be
exact (token for token equal to a naive full-recompute loop, tests/parity/test_engine.py) and fast (no per-step
allocation, no torch.cat, one forward per step; bench/decode.py measures it against transformers' generate()).
MTP speculative decoding (speculative.py) plugs into the same loop.

How: prompts of different lengths are LEFT-padded into one (B, P) batch; `KVCache.start` masks the padding and
positions restart at 0 after it, so every row computes exactly what it would alone. Sampling draws each row's
noise from its own counter-based stream (sampling.RowStreams; row b's seed is seeds[b], else seed + b), so a row's
sampled output depends only on its prompt, its seed and the sampling parameters — batched == one by one for
sampling too. Each step yields the new tokens of every row; `Rows` cuts them at the row's stop id or token budget.

    engine = Engine(model, tokenizer)
    res = engine.generate(["Hello"], max_new_tokens=32, temperature=0.7, top_p=0.9, seed=0)
    res.tokens[0], res.text[0], res.stats                 # stats: tokens/s, accepted length with speculative="mtp"
    engine.generate(["a", "b"], 32, temperature=0.7, seeds=[3, 9])  # row 1 == engine.generate(["b"], 32, ..., seeds=[9])
    engine.generate(ids, 32, temperature=0.7, logprobs=True).logprobs  # RL: each sampled token's log-prob
    engine.generate(ids, 32, return_routes=True).routes    # routing replay: each row's experts (inference/routes.py)
    for delta in engine.stream("Hello", max_new_tokens=32): print(delta.text, end="")
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from glmstack.inference.fast import FastForward, ReferenceForward, supported
from glmstack.inference.kv_cache import KVCache
from glmstack.inference.routes import RouteRecorder
from glmstack.inference.sampling import RowStreams, SamplingParams, filter_logits, row_seeds, sample
from glmstack.inference.speculative import lanes, mtp_decode


@dataclass(kw_only=True)
class Request:
    """What to generate: the options of Engine.generate / Engine.stream."""

    max_new_tokens: int  # new tokens per row at most (the context may cap it)
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # 0 = off
    seed: int | None = None  # row b samples with seed + b (None: a random base seed; see sampling.row_seeds)
    seeds: Sequence[int] | None = None  # or one seed per prompt (not with seed)
    stop_ids: Sequence[int] | None = None  # None: tokenizer.eos_ids, else the config's eos_token_id
    speculative: str | None = None  # "mtp": MTP speculative decoding
    draft_k: int = 2  # draft tokens per verify step
    logprobs: bool = False  # also return each sampled token's log-prob under the sampling transform (RL rollouts)
    return_routes: bool = False  # also return each row's routed experts (routing replay, inference/routes.py)
    budgets: Sequence[int] | None = None  # per-row new-token budgets (each <= max_new_tokens); None: max_new_tokens
    # called with each row's finish reason (None while it runs) after every step; True ends the generation, the
    # unfinished rows with finish "abort" and the tokens they have (partial rollouts, rl.partial_rollouts)
    stop_when: Callable[[list], bool] | None = None


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per row, the stop token included when one ended the row
    text: list[str] | None  # decoded new tokens without the stop token (when the engine has a tokenizer)
    finish_reason: list[str]  # "stop" or "length" per row
    stats: dict = field(default_factory=dict)
    seeds: list[int] | None = None  # each row's seed: seeds=[...] reproduces a row on its own
    # logprobs=True: log π(token) per new token under the transform it was sampled from (logits / temperature over
    # the top-k / top-p nucleus; greedy: temperature 1), as RL's ratios need (rl.losses.token_logprobs)
    logprobs: list[list[float]] | None = None
    # the weight version each row was generated with, where the engine reports one (a rollout server does)
    weight_versions: list[int | None] | None = None
    # return_routes=True: per row, the experts every trunk MoE layer routed each token to, int16 (prompt + new - 1,
    # n trunk MoE layers, K); position t = the row's token t, prompt first (inference/routes.py; docs/CONTRACTS.md)
    routes: list | None = None


@dataclass
class Delta:
    ids: list[int]  # tokens emitted by this step (several per step with speculative decoding)
    text: str | None  # the text they completed (held back while a UTF-8 character is unfinished)


class Rows:
    """Per-row output, token budget, stop handling and seed, shared by the plain and the speculative loops."""

    def __init__(self, batch_size: int, max_new_tokens: int, stop_ids: Sequence[int], seeds: list[int],
                 budgets: Sequence[int] | None = None, stop_when=None):  # fmt: skip
        self.batch_size, self.budget, self.stop = batch_size, max_new_tokens, set(stop_ids)
        self.budgets = [min(int(n), max_new_tokens) for n in budgets] if budgets else [max_new_tokens] * batch_size
        self.stop_when = stop_when
        self.seeds = seeds
        self.out: list[list[int]] = [[] for _ in range(batch_size)]
        self.finish: list[str | None] = [None] * batch_size
        self.logprobs: list[list[float]] | None = None  # filled by push(..., logprobs=) when asked
        self.recorder: RouteRecorder | None = None  # return_routes: the forwards' routing record

    @property
    def all_done(self) -> bool:
        return all(f is not None for f in self.finish)

    def stopped(self) -> bool:
        """Every row done, or the caller's stop_when says so: then the unfinished rows end with finish "abort"."""
        if self.all_done:
            return True
        if self.stop_when is None or not self.stop_when(list(self.finish)):
            return False
        self.finish = [f or "abort" for f in self.finish]
        return True

    def active(self, b: int) -> bool:
        return self.finish[b] is None

    def push(self, new: list[list[int]], logprobs: list[list[float]] | None = None) -> list[list[int]]:
        """Append each row's candidate tokens up to its first stop id / the budget; return what was kept.
        `logprobs` (same layout as `new`): the kept tokens' log-probs go to self.logprobs."""
        if logprobs is not None and self.logprobs is None:
            self.logprobs = [[] for _ in range(self.batch_size)]
        kept = []
        for b, toks in enumerate(new):
            row, take = self.out[b], []
            for t in toks if self.finish[b] is None else ():
                take.append(t)
                if t in self.stop:
                    self.finish[b] = "stop"
                    break
                if len(row) + len(take) >= self.budgets[b]:
                    self.finish[b] = "length"
                    break
            row.extend(take)
            kept.append(take)
            if logprobs is not None:
                self.logprobs[b].extend(logprobs[b][: len(take)])
        return kept


class Engine:
    def __init__(self, model, tokenizer=None, fast: bool = True):
        """fast=False runs the model's own forward (the reference the fast path is tested against)."""
        self.model, self.tokenizer = model.eval(), tokenizer
        self.cfg = model.cfg
        self.device = next(model.parameters()).device
        self.fast = fast and supported(model)
        self._expert_cache: dict = {}  # fast path: CPU expert-bank copies, remade when the weights change
        # fast path: all experts densely on blocks of up to this many tokens (None: fast.DENSE_MAX_TOKENS, 64, where
        # oneDNN runs it on CPU; 0 elsewhere)
        self.dense_max_tokens: int | None = None
        # generate() reads new tokens back to the host every `sync_every` steps (stop checks); on a GPU that
        # read is a sync that stalls the launch queue, on a CPU it is free. stream() always reads every step.
        self.sync_every = 8 if self.device.type == "cuda" else 1
        # plain decoding drops finished rows from the batch once a quarter of it has finished (copies the cache)
        self.compact = True
        # fast path, speculative="mtp": draft over these token ids only (e.g. speculative.frequent_tokens of the
        # training data): a smaller draft head, the same output (the verify scores the whole vocabulary)
        self.draft_vocab: torch.Tensor | None = None

    # ---------------------------------------------------------------- public API
    def generate(self, prompts, max_new_tokens: int = 64, **options) -> GenerationResult:
        """Generate for a batch: prompts are strings (needs a tokenizer) or token-id lists (or one of either).

        options (see Request): temperature, top_p, top_k, seed or seeds, stop_ids, speculative ("mtp"), draft_k,
        logprobs, return_routes (each row's routed experts, inference/routes.py).
        Row b's sampled tokens depend only on its prompt, its seed (seeds[b], else seed + b) and the options.
        """
        req = Request(max_new_tokens=max_new_tokens, **options)
        stats: dict = {}
        rows_out: list[Rows] = []
        t0 = time.perf_counter()
        for step, _ in enumerate(self._run(prompts, req, stats, rows_out, self.sync_every)):
            if step == 0:
                stats["first_token_s"] = time.perf_counter() - t0
        rows = rows_out[0]
        text = [self._decode(r) for r in rows.out] if self.tokenizer is not None else None
        routes = rows.recorder.take([len(r) for r in rows.out]) if rows.recorder is not None else None
        return GenerationResult(tokens=rows.out, text=text, finish_reason=rows.finish, stats=stats, seeds=rows.seeds,
                                logprobs=rows.logprobs if req.logprobs else None, routes=routes)

    def stream(self, prompt, max_new_tokens: int = 256, stats: dict | None = None, **options) -> Iterator[Delta]:
        """One prompt; yields a Delta per decoding step (text deltas when the engine has a tokenizer)."""
        req = Request(max_new_tokens=max_new_tokens, **options)
        if req.return_routes:
            raise ValueError("return_routes: a stream yields tokens only; ask generate() for the routes")
        ids: list[int] = []
        shown = full = ""
        for new in self._run([prompt], req, {} if stats is None else stats, []):
            ids.extend(new[0])
            text = None
            if self.tokenizer is not None:
                full = self._decode(ids)
                if full.endswith("\ufffd"):  # byte-level BPE: half a UTF-8 character so far
                    text = ""
                else:
                    text, shown = full[len(shown) :], full
            if new[0]:
                yield Delta(ids=new[0], text=text)
        if full != shown:  # the stream ended on an unfinished character: show what decode gives
            yield Delta(ids=[], text=full[len(shown) :])

    # ---------------------------------------------------------------- the loop
    def _run(
        self, prompts, req: Request, stats: dict, rows_out: list, sync_every: int = 1
    ) -> Iterator[list[list[int]]]:
        params = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
        speculative, draft_k = req.speculative, req.draft_k
        if speculative not in (None, "mtp"):
            raise ValueError(f"speculative must be None or 'mtp', got {speculative!r}")
        if speculative and draft_k < 1:
            raise ValueError(f"draft_k must be >= 1, got {draft_k}")
        if speculative and req.logprobs:
            raise ValueError("logprobs=True is not supported with speculative decoding")
        if speculative and req.return_routes:
            raise ValueError("return_routes=True is not supported with speculative decoding (its verify steps route "
                             "draft tokens that are then rejected): decode without speculative")
        ids_BP, start_B = self._prepare(prompts)
        B, P = ids_BP.shape
        budget = self._budget(P, req.max_new_tokens)
        rows = Rows(B, budget, self._stop_ids(req.stop_ids), row_seeds(req.seed, req.seeds, B), req.budgets,
                    req.stop_when)  # fmt: skip
        if rows.budgets and min(rows.budgets) <= 0:
            raise ValueError("budgets: every row needs at least one new token")
        rows_out.append(rows)
        rows.recorder = RouteRecorder(self.model) if req.return_routes else None
        # greedy draws nothing: no streams, no hashing
        n_lanes = lanes(draft_k) if speculative else 1
        streams = None if params.greedy else RowStreams(rows.seeds, n_lanes, self.device)
        # speculative: the verify block (k + 1) and the MTP layers' drafted positions (< k) on top of the budget
        slack = 2 * draft_k + 2 if speculative else 1
        cache = KVCache(B, P + budget + slack, start=start_B.to(self.device))
        max_len = P + budget + slack
        run = (
            FastForward(self.model, max_len, self._expert_cache, self.dense_max_tokens, self._draft_vocab(speculative))
            if self.fast
            else ReferenceForward(self.model)
        )
        t0 = time.perf_counter()
        with torch.inference_mode(), rows.recorder or contextlib.nullcontext():
            if speculative is None:
                yield from self._plain(run, ids_BP, start_B, cache, rows, params, streams, stats, sync_every,
                                       req.logprobs)
            else:
                yield from mtp_decode(run, self.cfg, ids_BP, start_B, cache, rows, params, streams, draft_k, stats)
        total, n_new = time.perf_counter() - t0, sum(len(r) for r in rows.out)
        stats.update(new_tokens=n_new, total_s=total, tokens_per_s=n_new / max(total, 1e-9))

    def _draft_vocab(self, speculative):
        if self.draft_vocab is None or not speculative:
            return None
        ids = torch.as_tensor(self.draft_vocab, dtype=torch.long, device=self.device).unique()
        if ids.numel() == 0 or ids.min() < 0 or ids.max() >= self.cfg.vocab_size:
            raise ValueError(f"draft_vocab: token ids must be in [0, {self.cfg.vocab_size}) and not empty")
        return ids

    def _plain(
        self, run, ids_BP, start_B, cache, rows, params, streams, stats, sync_every, logprobs=False
    ) -> Iterator[list[list[int]]]:
        P = ids_BP.shape[1]
        pos_BT = (torch.arange(P, device=self.device) - start_B[:, None]).clamp_min(0)
        t0 = time.perf_counter()
        logits_BV = run.forward(ids_BP, pos_BT, cache, last_only=True)[0][:, -1]
        if rows.recorder is not None:
            rows.recorder.add(range(ids_BP.shape[0]), start_B)
        stats["prefill_s"] = time.perf_counter() - t0
        pos_B1 = pos_BT[:, -1:] + 1
        alive = list(range(ids_BP.shape[0]))  # original row of each batch row (finished rows get dropped)
        steps, t0, pending, pending_lp, compactions = 0, time.perf_counter(), [], [], 0
        slots = 0  # row-steps decoded, finished rows still in the batch included (idle = 1 - new tokens / slots)
        lp_params = SamplingParams(top_p=params.top_p, top_k=params.top_k,
                                   temperature=params.temperature if not params.greedy else 1.0)  # fmt: skip
        for step in range(rows.budget):  # every row is done after `budget` tokens at the latest
            slots += len(alive)
            tok_B = sample(logits_BV, params, None if streams is None else streams.keys(step)[:, 0])
            pending.append(tok_B)
            if logprobs:
                logp_BV = torch.log_softmax(filter_logits(logits_BV, lp_params), dim=-1)
                pending_lp.append(logp_BV.gather(-1, tok_B[:, None])[:, 0])
            last = step == rows.budget - 1
            if len(pending) == sync_every or last:
                new = [[] for _ in range(rows.batch_size)]
                new_lp = [[] for _ in range(rows.batch_size)] if logprobs else None
                for j, toks in enumerate(torch.stack(pending, 1).tolist()):
                    new[alive[j]] = toks
                if logprobs:
                    for j, lps in enumerate(torch.stack(pending_lp, 1).tolist()):
                        new_lp[alive[j]] = lps
                yield rows.push(new, new_lp)  # finished rows' extra tokens are dropped
                pending, pending_lp = [], []
                if rows.stopped():
                    break
                keep = [j for j, b in enumerate(alive) if rows.active(b)]
                if self.compact and len(alive) - len(keep) >= max(1, len(alive) // 4):
                    # RL rollouts end at very different lengths: stop paying for the finished rows
                    idx = torch.tensor(keep, device=self.device)
                    cache.keep_rows(idx)
                    if streams is not None:
                        streams.keep_rows(idx)
                    tok_B, pos_B1, alive = tok_B[idx], pos_B1[idx], [alive[j] for j in keep]
                    compactions += 1
            if last:
                break
            logits_BV = run.forward(tok_B[:, None], pos_B1, cache, last_only=True)[0][:, -1]
            if rows.recorder is not None:
                rows.recorder.add(alive)
            pos_B1 = pos_B1 + 1
            steps += 1
        stats.update(decode_s=time.perf_counter() - t0, decode_steps=steps, compactions=compactions, row_slots=slots)

    # ---------------------------------------------------------------- helpers
    def _prepare(self, prompts) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise and LEFT-pad -> ids (B, P) long, start (B,) = number of pad positions per row."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("no prompts given")
        seqs = [self._encode(p) for p in prompts]
        if any(len(s) == 0 for s in seqs):
            raise ValueError("empty prompt: give at least one token")
        P = max(map(len, seqs))
        ids = torch.zeros(len(seqs), P, dtype=torch.long)
        start = torch.tensor([P - len(s) for s in seqs], dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, P - len(s) :] = torch.tensor(s, dtype=torch.long)
        if int(ids.max()) >= self.cfg.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"token id out of range for vocab_size {self.cfg.vocab_size}")
        return ids.to(self.device), start.to(self.device)

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need Engine(model, tokenizer)")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def _decode(self, ids: list[int]) -> str:
        stop = set(self._stop_ids(None))
        return self.tokenizer.decode([t for t in ids if t not in stop])

    def _budget(self, prompt_len: int, max_new_tokens: int) -> int:
        """New-token budget; the context length caps it. Bad requests fail here with a clear message."""
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {max_new_tokens}")
        ctx = self.cfg.max_position_embeddings
        if prompt_len >= ctx:
            raise ValueError(
                f"prompt has {prompt_len} tokens; the model's context is {ctx} "
                f"(max_position_embeddings), leaving no room to generate"
            )
        return min(max_new_tokens, ctx - prompt_len)

    def _stop_ids(self, stop_ids) -> list[int]:
        if stop_ids is not None:
            return list(stop_ids)
        if self.tokenizer is not None:
            return list(self.tokenizer.eos_ids)
        eos = self.cfg.hf_metadata.get("eos_token_id")
        return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
