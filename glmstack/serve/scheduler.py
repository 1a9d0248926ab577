"""Continuous batching over the inference engine: requests join and leave the running batch between decode steps.

Why: a server's requests arrive one by one and end at very different lengths; running them one after another
wastes the batch dimension (decoding 16 rows costs little more than 1 on a memory-bound step), and batching them
statically makes every new request wait for the slowest one. As in vLLM / Orca (Yu et al., OSDI 2022, iteration-
level scheduling), the scheduler admits waiting requests between two decode steps and drops finished ones.

How: one engine thread owns the model. Each iteration it (1) drops rows that finished, were cancelled (the client
disconnected) or ran past their deadline (`KVCache.keep_rows`), (2) prefills the newly admitted prompts as one
left-padded batch and appends their rows to the running KV cache (`KVCache.append_rows`: rows stay right-aligned,
each row masks its own padding, so a row computes what it would alone), (3) samples one token per row — each row with
its own sampling parameters and its own counter-based random stream (sampling.RowStreams keyed by the row's seed
and its own step, so a request's output does not depend on who shares its batch, exactly as in Engine.generate),
(4) runs one batched decode forward. When the cache's end is reached, the positions that no row attends any more
are reclaimed (`KVCache.drop_front`). The waiting queue is bounded: `submit` raises QueueFull (the server's 429).
Per-token results (id, raw log-prob, top alternatives) go to each request's `emit` callback from the engine
thread; the server hands them to its event loop. A job with `return_routes` also collects, at every forward it is in,
the experts each trunk MoE layer routed its tokens to (inference/routes.py; `routed_experts(job)` when it ends).

With `speculative="mtp"` requests run one at a time through Engine.stream (MTP speculation is a batch-1 win and its
loop rewinds rows by different amounts, which this cache re-batching does not support).

    sched = Scheduler(engine, max_running=16, max_waiting=64)
    sched.start()
    sched.submit(Job(prompt_ids=ids, max_new_tokens=32, params=SamplingParams(temperature=0), seed=0,
                     emit=lambda event: ...))      # events: Token(...), then Finished(reason)
    sched.stop()
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from glmstack.inference.fast import FastForward, ReferenceForward
from glmstack.inference.kv_cache import KVCache
from glmstack.inference.prefix_cache import PrefixCache, prefill_layout, store_prefixes
from glmstack.inference.prefix_spec import speculative_stream
from glmstack.inference.routes import RouteRecorder
from glmstack.inference.sampling import RowStreams, SamplingParams, sample
from glmstack.model.lora_multi import add_adapter, remove_adapter, use_slots
from glmstack.serve.monitor import AcceptanceMonitor, MonitorConfig
from glmstack.serve.scoring import score_prompt


class QueueFull(RuntimeError):
    """The waiting queue is at its bound: try again later (HTTP 429)."""


@dataclass
class Token:
    id: int
    logprob: float  # raw log-probability (before temperature / top-k / top-p), vLLM's default "raw_logprobs"
    top: list[tuple[int, float]]  # the `top_logprobs` most likely (id, log-prob), best first; [] when not asked


@dataclass
class Finished:
    reason: str  # "stop" (a stop id), "length" (token budget), "abort" (cancelled / time limit), "error"
    message: str = ""


@dataclass(kw_only=True, eq=False)
class Job:
    """One sequence to generate (a request with n choices submits n jobs)."""

    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    seed: int
    emit: Callable[[Token | Finished], None]
    stop_ids: frozenset[int] = frozenset()
    top_logprobs: int = 0  # alternatives per token (0: only the chosen token's log-prob)
    deadline: float | None = None  # time.monotonic() after which the job is aborted
    cancelled: bool = False  # set from any thread (client gone, stop string matched): dropped at the next step
    # scheduler state
    submitted: float = field(default_factory=time.monotonic)
    n_out: int = 0
    out_ids: list[int] = field(default_factory=list)  # the generated ids (a finished row's completion is cached)
    streams: RowStreams | None = None
    end: Finished | None = None
    prefix: list = field(default_factory=list)  # the prefix-cache blocks this job was admitted with (pinned)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    monitor: AcceptanceMonitor | None = None  # speculative path: its acceptance statistics
    media: object = None  # a vision-language request's pixels (glmstack.multimodal.serving.VisionBatch reads them)
    # echo + logprobs: emit the prompt's PromptScores (scoring.py) when admitted, before the first token; scored
    # here, not beside the batch, so scoring holds a running slot like any generation (issue 34)
    score_prompt: bool = False
    weight_version: str | int | None = None  # of the weights it was admitted with (an update waits for running rows)
    # return_routed_experts: record the experts each trunk MoE layer routed every token to (routing replay); its
    # prompt is then prefilled whole (the prefix cache keeps no routes)
    return_routes: bool = False
    routes: list = field(default_factory=list)  # (T, L, K) int16 pieces, prompt first: routed_experts(job)
    adapter: int = 0  # the LoRA slot it runs with (model/lora_multi.py; 0: the base), chosen by the request's model


class Scheduler:
    def __init__(self, engine, max_running: int = 16, max_waiting: int = 256, speculative: str | None = None,
                 draft_k: int = 2, prefix_cache: PrefixCache | None = None,
                 monitor: MonitorConfig | None = None, cache_completions: bool = True):  # fmt: skip
        self.engine, self.model = engine, engine.model
        self.ctx = engine.cfg.max_position_embeddings
        self.max_running, self.max_waiting = max_running, max_waiting
        self.speculative, self.draft_k = speculative, draft_k
        self.serial = speculative is not None  # one job at a time through _run_one (MTP)
        self.prefix_cache = prefix_cache  # None: every prompt is prefilled in full
        # a finished row's prompt + completion go into the prefix cache (continuous batching only): the next turn of
        # its conversation re-sends them; False keeps prompts only
        self.cache_completions = cache_completions
        self.monitor = monitor or MonitorConfig()  # speculative path: acceptance-statistics rules
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.stats = {"generated_tokens": 0, "prompt_tokens": 0, "finished": 0, "steps": 0, "aborted": 0,
                      "ttft_sum": 0.0, "ttft_count": 0, "busy_s": 0.0, "reclaimed": 0,
                      "prefill_computed": 0, "spec_steps": 0, "spec_emitted": 0, "lora_mixed_forwards": 0,
                      "anomalies": {"corrupted-context": 0, "degenerate-repetition": 0}}  # fmt: skip
        self.recent: deque[tuple[float, int]] = deque(maxlen=256)  # (time, tokens) per step: tokens/s gauge
        self.weight_version: str | int = "default"  # SGLang's name; set by update_weights (an RL trainer's push)
        self._updates: deque[tuple[Callable[[], None], str | int, threading.Event, list]] = deque()
        self.score_chunk_elems = 2**22  # echo + logprobs: logits formed at once (positions x vocabulary)

    # ---------------------------------------------------------------- public
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="glmstack-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def submit(self, jobs: list[Job]) -> None:
        """Queue jobs (all or none); QueueFull when the waiting queue would exceed its bound."""
        with self._wake:
            if len(self.waiting) + len(jobs) > self.max_waiting:
                raise QueueFull(f"the server's queue is full ({self.max_waiting} waiting requests); retry later")
            self.waiting.extend(jobs)
            self._wake.notify()

    def update_weights(self, state: dict, version: str | int) -> None:
        """Load `state` (the served model's parameter names and shapes) between engine steps; blocks until done.
        Admission pauses while running rows finish, so every request is generated by one weight version; the
        prefix cache is emptied (its KV came from the old weights). An RL trainer's weight push (issue 18)."""
        have = self.model.state_dict()
        for name, t in state.items():
            if name not in have or tuple(have[name].shape) != tuple(t.shape):
                raise ValueError(f"weights: {name} {tuple(t.shape)} does not match the served model")
        if missing := sorted(set(have) - set(state)):
            raise ValueError(f"weights: {len(missing)} tensors missing, e.g. {missing[0]}")
        self._between_steps(lambda: self.model.load_state_dict(state), version)  # in place (fast.py remakes copies)

    def update_adapter(self, slot: int, folder: str | None, version: str | int) -> None:
        """Put the PEFT adapter in `folder` under LoRA slot `slot` (None: remove the slot's adapter), between engine
        steps as update_weights does; the other slots and the base are untouched (an RL trainer's adapter push)."""
        if self.engine.fast:
            raise ValueError("LoRA adapters need a server started with --enable-lora (or --lora)")
        if folder is None:
            self._between_steps(lambda: self._remove_adapter(slot), version)
        else:
            self._between_steps(lambda: add_adapter(self.model, slot, folder), version)

    def _remove_adapter(self, slot: int) -> None:
        """Drop the slot's adapter; requests still waiting for it end with an error instead of meeting the base."""
        remove_adapter(self.model, slot)
        with self._wake:
            gone = [job for job in self.waiting if job.adapter == slot]
            self.waiting = deque(job for job in self.waiting if job.adapter != slot)
        for job in gone:
            job.emit(Finished("error", "the LoRA adapter this request named was unloaded"))

    def _between_steps(self, change: Callable[[], None], version: str | int) -> None:
        """Run `change` on the engine thread once no row is running; blocks until done, raises what it raised."""
        done, error = threading.Event(), []
        with self._wake:
            self._updates.append((change, version, done, error))
            self._wake.notify()
        done.wait()
        if error:
            raise error[0]

    def _apply_update(self, change: Callable[[], None], version: str | int, done: threading.Event, error: list) -> None:
        try:
            with torch.no_grad():
                change()
            getattr(self.engine, "_expert_cache", {}).clear()  # the fast path's weight copies, remade on next use
            if self.prefix_cache is not None:
                self.prefix_cache.clear()  # nothing is pinned: no row is running
            self.weight_version = version
        except Exception as e:  # noqa: BLE001 — reported to the caller, the server keeps serving
            error.append(e)
        done.set()

    def tokens_per_s(self, window: float = 10.0) -> float:
        now = time.monotonic()
        pts = [(t, n) for t, n in list(self.recent) if now - t <= window]
        if len(pts) < 2:
            return 0.0
        return sum(n for _, n in pts[1:]) / max(pts[-1][0] - pts[0][0], 1e-9)

    # ---------------------------------------------------------------- the engine thread
    def _new_batch(self) -> _Batch:
        return _Batch(self)

    def _loop(self) -> None:
        batch = self._new_batch()
        while True:
            with self._wake:
                while not self._stop and not self.waiting and not batch.jobs and not self._updates:
                    self._wake.wait()
                if self._stop:
                    break
                update = self._updates.popleft() if self._updates and not batch.jobs else None
                room = 0 if update or self._updates else (1 if self.serial else self.max_running) - len(batch.jobs)
                new = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
            if update is not None:
                self._apply_update(*update)
                batch = _Batch(self)  # a fresh fast-path plan: the old one holds copies of the old weights
                continue
            self.running = batch.jobs + new
            t0 = time.monotonic()
            new = [job for job in new if self._score(job)]
            try:
                if self.serial:
                    if new:
                        self._run_one(new[0])
                else:
                    batch.step(new)
            except Exception as e:  # noqa: BLE001 — a failing step must not kill the server: end its jobs
                for job in dict.fromkeys(batch.jobs + new):
                    self._unpin(job)
                    job.emit(Finished("error", f"{type(e).__name__}: {e}"))
                batch = self._new_batch()
            self.stats["busy_s"] += time.monotonic() - t0
            self.running = list(batch.jobs)
        for job in batch.jobs + list(self.waiting):
            job.emit(Finished("abort", "server shutting down"))
        for *_, done, error in self._updates:
            error.append(RuntimeError("the server is shutting down"))
            done.set()

    def _score(self, job: Job) -> bool:
        """Echo + logprobs: the prompt's log-probs before the job joins the batch; False (the job ended with an
        error) when scoring failed, which leaves the running rows alone."""
        if not job.score_prompt or job.cancelled:
            return True
        try:
            with use_slots(self.model, [job.adapter]):
                job.emit(score_prompt(self.model, job.prompt_ids, job.top_logprobs, self.score_chunk_elems))
            return True
        except Exception as e:  # noqa: BLE001 — e.g. out of memory on a long prompt: this request fails, not the batch
            self._finish(job, Finished("error", f"scoring the prompt: {type(e).__name__}: {e}"))
            return False

    def _run_one(self, job: Job) -> None:
        self._run_speculative(job)

    def _run_speculative(self, job: Job) -> None:
        p = job.params
        self.stats["prompt_tokens"] += len(job.prompt_ids)
        mon = job.monitor = AcceptanceMonitor(self.monitor, self.draft_k)
        if self.prefix_cache is not None:
            info: dict = {}
            steps = speculative_stream(self.engine, self.prefix_cache, job.prompt_ids, job.max_new_tokens, p,
                                       job.seed, sorted(job.stop_ids), self.draft_k, info)  # fmt: skip
        else:
            kw = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "seeds": [job.seed],
                  "stop_ids": sorted(job.stop_ids), "speculative": self.speculative, "draft_k": self.draft_k}  # fmt: skip
            steps = (d.ids for d in self.engine.stream(job.prompt_ids, job.max_new_tokens, **kw) if d.ids)
        last, first = None, True
        for ids in steps:
            if job.cancelled or _late(job):
                steps.close()
                return self._finish(job, Finished("abort", _abort_message(job)))
            if first:
                job.cached_tokens = info.get("cached_tokens", 0) if self.prefix_cache is not None else 0
                self.stats["prefill_computed"] += len(job.prompt_ids) - job.cached_tokens
            if not first and mon.step(len(ids)):  # the first list is the prefill's token, not a verify step
                self.stats["anomalies"][mon.anomaly] += 1
                if self.monitor.action == "abort":
                    steps.close()
                    for t in ids:
                        self._token(job, Token(t, float("nan"), []))
                    return self._finish(job, Finished("abort", f"speculative anomaly: {mon.anomaly}"))
            first = False
            for t in ids:
                self._token(job, Token(t, float("nan"), []))
                last = t
        self._finish(job, Finished("stop" if last in job.stop_ids else "length"))

    def _token(self, job: Job, tok: Token) -> None:
        if job.n_out == 0:
            self.stats["ttft_sum"] += time.monotonic() - job.submitted
            self.stats["ttft_count"] += 1
        job.n_out += 1
        job.out_ids.append(tok.id)
        self.stats["generated_tokens"] += 1
        job.emit(tok)

    def _unpin(self, job: Job) -> None:
        if self.prefix_cache is not None and job.prefix:
            self.prefix_cache.release(job.prefix)
        job.prefix = []

    def _finish(self, job: Job, fin: Finished) -> None:
        self._unpin(job)
        if job.monitor is not None:
            self.stats["spec_steps"] += job.monitor.steps
            self.stats["spec_emitted"] += job.monitor.emitted
        self.stats["finished"] += 1
        self.stats["aborted"] += fin.reason == "abort"
        job.emit(fin)


def routed_experts(job: Job) -> torch.Tensor:
    """A finished job's routes, (prompt + generated - 1, L, K) int16: vLLM's `routed_experts` rows (the last generated
    token is never fed; a row cancelled after being fed one more is cut to the same length)."""
    routes = torch.cat(job.routes) if job.routes else torch.zeros(0, 0, 0, dtype=torch.int16)
    return routes[: len(job.prompt_ids) + job.n_out - 1]


def _late(job: Job) -> bool:
    return job.deadline is not None and time.monotonic() > job.deadline


def _abort_message(job: Job) -> str:
    return "cancelled" if job.cancelled else "the request's time limit was reached"


class _Batch:
    """The running rows: their KV cache, last token, next position, and one forward per step."""

    def __init__(self, sched: Scheduler):
        self.sched, self.engine = sched, sched.engine
        self.jobs: list[Job] = []
        self.cache: KVCache | None = None
        self.logits_BV: torch.Tensor | None = None  # the logits each row samples its next token from
        self.pos_B1: torch.Tensor | None = None  # the position of each row's next token
        # the cap of the running cache: a row's length never exceeds the context, and after a join a row may sit
        # behind another's longer history (its start moves right), so at most two contexts
        self.max_len = 2 * sched.ctx + 1
        eng = self.engine
        self.run = (
            FastForward(eng.model, sched.ctx + 1, eng._expert_cache, eng.dense_max_tokens)
            if eng.fast
            else ReferenceForward(eng.model)
        )
        self.device = eng.device
        self.recorder: RouteRecorder | None = None  # made when a job first asks for its routed experts

    @torch.inference_mode()
    def step(self, new: list[Job]) -> None:
        self._drop_finished()
        if new:
            self._admit(new)
        if not self.jobs:
            return
        toks_B = self._sample()
        keep = self._drop_finished()
        if not self.jobs:
            return
        if keep is not None:
            toks_B = toks_B[keep]
        if self.cache.seq_len + 1 > self.cache.max_len:
            self.sched.stats["reclaimed"] += self.cache.drop_front()
        self.logits_BV = self._forward(self.jobs, toks_B[:, None], self.pos_B1, self.cache)[0][:, -1]
        self.pos_B1 = self.pos_B1 + 1
        self.sched.stats["steps"] += 1

    def _forward(self, jobs: list[Job], ids_NT, pos_NT, cache, fed: list[int] | None = None):
        """run.forward (last position's logits); the jobs that asked for their routes get this forward's, the last
        fed[j] (default 1) positions of row j (inference/routes.py). Row j runs with its job's LoRA slot."""
        slots = [job.adapter for job in jobs]
        self.sched.stats["lora_mixed_forwards"] += len(set(slots)) > 1
        with use_slots(self.engine.model, slots if any(slots) else None):
            return self._routed_forward(jobs, ids_NT, pos_NT, cache, fed)

    def _routed_forward(self, jobs: list[Job], ids_NT, pos_NT, cache, fed: list[int] | None):
        if not any(job.return_routes for job in jobs):
            return self.run.forward(ids_NT, pos_NT, cache, last_only=True)
        self.recorder = self.recorder or RouteRecorder(self.engine.model)
        with self.recorder:
            out = self.run.forward(ids_NT, pos_NT, cache, last_only=True)
            idx_NTLK = self.recorder.pop(len(jobs)).cpu()
        T = ids_NT.shape[1]
        for j, job in enumerate(jobs):
            if job.return_routes:
                job.routes.append(idx_NTLK[j, T - (fed[j] if fed else 1) :])
        return out

    # ---- admission: prefill the new prompts as one left-padded batch, then join the running cache ----------
    def _prefill(self, new: list[Job]) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
        """(the new rows' left-padded KV cache, their last logits (N, V), the position of their next token (N, 1))."""
        pc = self.sched.prefix_cache
        prompts = [job.prompt_ids for job in new]
        ns = [job.adapter for job in new]
        cache, ids_NS, pos_NS, pre_N, chains = prefill_layout(pc, prompts, self.device,
                                                              [not job.return_routes for job in new], ns)  # fmt: skip
        for job, chain in zip(new, chains):
            job.prefix = chain
        fed = [len(p) - pre for p, pre in zip(prompts, pre_N)]  # the positions each row computes
        logits_NV, hidden_NSD = self._forward(new, ids_NS, pos_NS, cache, fed)
        if pc is not None:
            store_prefixes(pc, prompts, chains, cache, hidden_NSD, ns)
        for job, pre in zip(new, pre_N):
            job.cached_tokens = pre
            self.sched.stats["prefill_computed"] += len(job.prompt_ids) - pre
        return cache, logits_NV[:, -1], pos_NS[:, -1:] + 1

    def _admit(self, new: list[Job]) -> None:
        cache, logits_NV, next_N1 = self._prefill(new)
        P = cache.seq_len
        for job in new:
            job.weight_version = self.sched.weight_version
            self.sched.stats["prompt_tokens"] += len(job.prompt_ids)
            if not job.params.greedy:
                job.streams = RowStreams([job.seed], 1, self.device)
        if self.cache is None or not self.jobs:
            self.cache = KVCache(0, 0)
            self.logits_BV, self.pos_B1 = logits_NV[:0], next_N1[:0]
        self.jobs += new
        # room for the longest remaining generation: the buffers are rebuilt at every join anyway, so they are sized
        # to what the running rows can still use, not to the context (64 rows x 2 contexts was GBs per join)
        remaining = max(job.max_new_tokens - job.n_out for job in self.jobs)
        need = max(self.cache.seq_len - (int(self.cache.start.min()) if self.cache.batch_size else 0), P)
        self.sched.stats["reclaimed"] += self.cache.append_rows(cache, min(need + remaining + 1, self.max_len))

        self.logits_BV = torch.cat([self.logits_BV, logits_NV])
        self.pos_B1 = torch.cat([self.pos_B1, next_N1])

    # ---- sampling: per row its own parameters, stream and step ---------------------------------------------
    def _sample(self) -> torch.Tensor:
        logits_BV = self.logits_BV
        toks_B = torch.empty(len(self.jobs), dtype=torch.long, device=self.device)
        groups: dict[SamplingParams, list[int]] = {}
        for b, job in enumerate(self.jobs):
            groups.setdefault(job.params, []).append(b)
        for params, rows in groups.items():
            idx = torch.tensor(rows, device=self.device)
            keys = None
            if not params.greedy:
                keys = torch.cat([self.jobs[b].streams.keys(self.jobs[b].n_out)[:, 0] for b in rows])
            toks_B[idx] = sample(logits_BV[idx], params, keys)
        want_lp = max(job.top_logprobs for job in self.jobs)
        logp_BV = torch.log_softmax(logits_BV.float(), dim=-1)
        chosen_B = logp_BV.gather(1, toks_B[:, None])[:, 0].tolist()
        top = torch.topk(logp_BV, want_lp, dim=-1) if want_lp else None
        top_ids, top_vals = (top.indices.tolist(), top.values.tolist()) if top is not None else (None, None)
        ids = toks_B.tolist()
        for b, job in enumerate(self.jobs):
            alts = list(zip(top_ids[b], top_vals[b]))[: job.top_logprobs] if top is not None else []
            self.sched._token(job, Token(ids[b], chosen_B[b], alts))
            if ids[b] in job.stop_ids:
                job.end = Finished("stop")
            elif job.n_out >= job.max_new_tokens:
                job.end = Finished("length")
        self.sched.recent.append((time.monotonic(), len(ids)))
        return toks_B

    def _store_completion(self, b: int, job: Job) -> None:
        """Row b's full blocks of prompt + generated tokens into the prefix cache, from the row's own KV (positions
        [start, seq_len): every token it has fed, i.e. all but a last sampled one). As vLLM caches generated blocks:
        a conversation's next turn re-sends this completion, and with preserved thinking (or inside a tool loop) its
        prompt extends this row token for token (docs/serve.md, Thinking modes). Blocks stored here carry no hidden
        states: only the speculative path reads those, and it never shares a cache with this batch."""
        pc = self.sched.prefix_cache
        if pc is None or not self.sched.cache_completions:
            return
        start, bs = int(self.cache.start[b]), pc.block_size
        ids = (job.prompt_ids + job.out_ids)[: self.cache.seq_len - start]

        def kv_of(j):
            lo, hi = start + j * bs, start + (j + 1) * bs
            return {i: (k[b, :, lo:hi], v[b, :, lo:hi]) for i, (k, v) in self.cache.buffers().items()}, None

        pc.insert(ids, job.prefix, kv_of, job.adapter)

    def _drop_finished(self) -> torch.Tensor | None:
        """Rows that ended (stop id, budget, cancel, deadline) leave the batch, freeing their slot at once.
        Returns the kept rows' indices, or None when every row stays."""
        keep = []
        for b, job in enumerate(self.jobs):
            if job.end is None and (job.cancelled or _late(job)):
                job.end = Finished("abort", _abort_message(job))
            if job.end is None:
                keep.append(b)
            else:
                self._store_completion(b, job)
                self.sched._finish(job, job.end)
        if len(keep) == len(self.jobs):
            return None
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.cache.keep_rows(idx)
        self.logits_BV, self.pos_B1 = self.logits_BV[idx], self.pos_B1[idx]
        self.jobs = [self.jobs[b] for b in keep]
        return idx
