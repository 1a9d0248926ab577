"""Rollouts from an OpenAI-compatible server (ours: `glmstack serve`; vLLM and SGLang speak the same fields).

Tokens in, tokens out: each row is one /v1/completions request whose prompt is the token ids, with `seed` (the
row's seed: our server samples row `seed` exactly as Engine.generate's row with that seed), `return_token_ids`
and `logprobs=1`; the response's `token_ids` and `token_logprobs` are used as they are, never re-tokenised. Rows
go out concurrently, so the server's continuous batching serves them together.

Servers report raw log-probs (before temperature / top-k / top-p; vLLM's default, ours too), which are the sampling
distribution's only at temperature 1 without top-k / top-p; other settings are refused rather than silently
compared against the wrong distribution. There is no weight push over the OpenAI API itself: posttrain/policy.py's
ServerPolicy (this client + a push) sends the trainer's weights through our server's and SGLang's POST
/update_weights_from_disk. Each response's `weight_version` (our server reports the version of the weights that
generated it) is kept per row, so staleness is the sampler's, not the trainer's belief. `score` asks a server for
the log-probs of given tokens (a distillation teacher). With `return_routes` each request asks for
`return_routed_experts` (SGLang's name) and the choice's `routed_experts` (int16 (seq_len - 1, MoE layers, K) as
base64: docs/CONTRACTS.md) becomes the row's routes, for routing replay (rl/replay.py).

A server started with `--api-key` wants `Authorization: Bearer KEY` on every call: give `api_key` (the configs'
`rl.rollout_server_key` / `agentic.rollout_server_key`) or set GLMSTACK_API_KEY, which the server reads too.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from glmstack.inference.engine import GenerationResult

API_KEY_ENV = "GLMSTACK_API_KEY"  # as glmstack.serve.cli's


class ServerEngine:
    def __init__(self, url: str, model: str, tokenizer=None, concurrency: int = 16, api_key: str | None = None):
        from openai import OpenAI

        self.url = url.rstrip("/")
        self.api_key = api_key or os.environ.get(API_KEY_ENV) or None
        self.client = OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "none")
        self.model, self.tokenizer, self.concurrency = model, tokenizer, concurrency
        self._cfg = None

    @property
    def cfg(self) -> SimpleNamespace:
        """What callers read from an engine's model config: the served context (/v1/models' max_model_len)."""
        if self._cfg is None:
            card = next(m for m in self.client.models.list().data if m.id == self.model)
            self._cfg = SimpleNamespace(max_position_embeddings=int(card.model_extra["max_model_len"]))
        return self._cfg

    def generate(self, prompts, max_new_tokens: int, *, temperature: float, top_p: float = 1.0, top_k: int = 0,
                 seeds, logprobs: bool = True, stop_ids=None, return_routes: bool = False, budgets=None,
                 stop_when=None) -> GenerationResult:  # fmt: skip
        """Engine.generate's contract over HTTP: `budgets` per-row max_tokens; `stop_when(finish)` (finish: each
        row's reason, None while it runs) is asked whenever a row ends, and True aborts the rest, which come back
        with the tokens they had, finish "abort" (partial rollouts: the rows are streamed, and closing a stream
        cancels its job on the server)."""
        if temperature not in (0.0, 1.0) or top_p < 1.0 or top_k:
            raise ValueError("server rollouts report raw log-probs: use rl.temperature=1, top_p=1, top_k=0")
        if stop_when is not None and return_routes:
            raise ValueError("routing replay records whole responses: not with aborted (partial) rollouts")
        budgets = [int(b) for b in budgets] if budgets else [max_new_tokens] * len(prompts)
        extra = {"return_token_ids": True} | ({"stop_token_ids": list(stop_ids)} if stop_ids else {})
        extra |= {"return_routed_experts": True} if return_routes else {}

        def one(i):
            r = self.client.completions.create(model=self.model, prompt=list(prompts[i]), max_tokens=budgets[i],
                                               temperature=temperature, seed=int(seeds[i]), logprobs=1,
                                               extra_body=extra)  # fmt: skip
            c = r.choices[0]
            ids = list(c.model_extra.get("token_ids") or c.token_ids)
            more = c.model_extra or {}
            routes = _routes(more, len(prompts[i]) + len(ids) - 1) if return_routes else None
            return ids, list(c.logprobs.token_logprobs), c.finish_reason, more.get("weight_version"), routes

        if stop_when is not None:
            rows = self._streamed(prompts, budgets, temperature, seeds, extra, stop_when)
        else:
            with ThreadPoolExecutor(self.concurrency) as pool:
                rows = list(pool.map(one, range(len(prompts))))
        tokens = [r[0] for r in rows]
        text = None
        if self.tokenizer is not None:
            eos = set(self.tokenizer.eos_ids)
            text = [self.tokenizer.decode([t for t in ids if t not in eos]) for ids in tokens]
        return GenerationResult(tokens=tokens, text=text, finish_reason=[r[2] for r in rows],
                                logprobs=[r[1] for r in rows] if logprobs else None, seeds=list(seeds),
                                weight_versions=[r[3] for r in rows],
                                routes=[r[4] for r in rows] if return_routes else None,
                                stats={"new_tokens": sum(map(len, tokens))})  # fmt: skip

    def _streamed(self, prompts, budgets, temperature, seeds, extra, stop_when) -> list[tuple]:
        """Every row as a streamed request; once stop_when says so, the running streams are closed and the rows not
        yet sent are not sent. -> rows as generate's `one` gives them (no routes)."""
        rows = [{"ids": [], "lps": [], "finish": None, "version": None} for _ in prompts]
        abort, lock, stop = threading.Event(), threading.Lock(), set(extra.get("stop_token_ids", []))

        def one(i):
            row = rows[i]
            if not abort.is_set():
                stream = self.client.completions.create(model=self.model, prompt=list(prompts[i]), stream=True,
                                                        max_tokens=budgets[i], temperature=temperature,
                                                        seed=int(seeds[i]), logprobs=1, extra_body=extra)  # fmt: skip
                with stream:  # leaving it closes the connection: the server cancels the job at its next step
                    for chunk in stream:
                        _take(row, chunk)
                        if abort.is_set() or row["finish"] is not None:
                            break
            with lock:  # a stream closed after its last token but before its finish chunk still ended there
                ended = row["ids"] and row["ids"][-1] in stop or len(row["ids"]) >= budgets[i]
                row["finish"] = row["finish"] or (
                    ("stop" if row["ids"][-1] in stop else "length") if ended else "abort"
                )
                if not abort.is_set() and stop_when([r["finish"] for r in rows]):
                    abort.set()

        with ThreadPoolExecutor(self.concurrency) as pool:
            list(pool.map(one, range(len(prompts))))
        return [(r["ids"], r["lps"], r["finish"], r["version"], None) for r in rows]

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Raw log π(tokens[t] | tokens[:t]) for t >= 1 of each sequence: one echo + logprobs request each (the
        prompt log-probs of OpenAI's legacy API and vLLM), for a distillation teacher (distill.py)."""

        def one(ids):
            r = self.client.completions.create(model=self.model, prompt=list(ids), max_tokens=1, temperature=0.0,
                                               echo=True, logprobs=0)  # fmt: skip
            return list(r.choices[0].logprobs.token_logprobs[1 : len(ids)])

        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(one, sequences))


def _take(row: dict, chunk) -> None:
    """One streamed completion chunk into its row: token ids, their log-probs, the weight version, the finish."""
    if not chunk.choices:
        return
    c = chunk.choices[0]
    more = c.model_extra or {}
    ids = more.get("token_ids") or []
    row["ids"] += ids
    if ids:
        row["lps"] += list(c.logprobs.token_logprobs)
    row["version"] = more.get("weight_version", row["version"])
    row["finish"] = c.finish_reason or None


def _routes(choice: dict, n: int):
    """A choice's `routed_experts` (the server's int16 (seq_len - 1, L, K), inference/routes.encode_routes)."""
    from glmstack.inference.routes import decode_routes

    if "routed_experts" not in choice:
        raise ValueError("the rollout server returned no routed_experts: routing replay needs a server that records "
                         "them (glmstack serve)")  # fmt: skip
    routes = decode_routes(choice["routed_experts"])
    if routes.shape[0] != n:
        raise ValueError(f"routed_experts has {routes.shape[0]} positions, expected {n} (prompt + completion - 1)")
    return routes
