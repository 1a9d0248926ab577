"""The OpenAI-compatible HTTP API on FastAPI: chat and text completions (whole or streamed), models, health, metrics.

What: `create_app(engine, model_name, style, scheduler) -> FastAPI` with
  POST /v1/chat/completions   GLM chat format in (glmstack.chat.render), reasoning / content / tool calls out
                              (glmstack.chat.parse, or StreamParser deltas when streamed)
  POST /v1/completions        raw text or token-id prompts (the RL trainer's "tokens in, tokens out")
  GET  /v1/models, /health, /metrics (Prometheus text), and / (the web chat page, chat_page.html)
  POST /v1/load_lora_adapter, /v1/unload_lora_adapter   LoRA adapters served beside the base, unmerged (vLLM's
                              routes; `glmstack serve BASE --lora NAME=DIR`): a request's `model` picks one
Shapes follow research/serving-protocol.md: SSE frames `data: {...}` ending `data: [DONE]`, errors
`{"error": {"message", "type", "param", "code"}}`, vLLM's names for token ids (`prompt_token_ids`, `token_ids`
with `return_token_ids: true`).

How: every choice of every request becomes one scheduler Job (continuous batching, scheduler.py); the engine
thread's events reach the handler through an asyncio queue. Leaving a stream (client gone) or matching a stop
string cancels the job, which frees its batch row at the next step. Every request error is an ApiError answered in
OpenAI's shape; anything unexpected answers 500 (a request id; the exception goes to the log) and the server keeps
serving.

Before any work (issue 34): the Guard middleware (security.py: key, Host, Origin, JSON-only POSTs, body size) runs
first; a request is then validated whole (prompt characters, stop strings, every prompt's length and budget) before
its jobs are queued, all at once; large bodies, renders, tokenisations and image decoding run in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError

from glmstack.chat import StreamParser, parse
from glmstack.inference.routes import encode_routes, trunk_routers
from glmstack.inference.sampling import SamplingParams
from glmstack.serve.limits import Limits, check_prompt_chars, message_chars, prompt_chars
from glmstack.serve.metrics import prometheus_text
from glmstack.serve.outputs import ChoiceOutput
from glmstack.serve.prompt import chat_prompt
from glmstack.serve.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    LoadLoraRequest,
    UnloadLoraRequest,
    WeightsRequest,
    validation_message,
)
from glmstack.serve.scheduler import Finished, Job, QueueFull, Scheduler, Token, routed_experts
from glmstack.serve.scoring import PromptScores
from glmstack.serve.security import Guard

log = logging.getLogger("glmstack.serve")
# bodies and prompt texts up to these sizes are parsed / rendered / tokenised on the event loop (well under a
# millisecond: a thread hop costs more); larger ones in a thread, so they cannot stall other requests or /health
INLINE_JSON_BYTES = 64 * 1024
INLINE_CHARS = 16 * 1024


class Server:
    """What the routes share: the engine's tokenizer and context, the scheduler, the request time limit, the limits,
    and where weight pushes may be read from (None: weight updates are off)."""

    def __init__(self, engine, model_name: str, style: str, scheduler: Scheduler, time_limit_s: float = 600.0,
                 limits: Limits | None = None, weight_root: str | None = None, adapters: dict | None = None):  # fmt: skip
        self.tok, self.ctx = engine.tokenizer, engine.cfg.max_position_embeddings
        self.processor = getattr(engine, "processor", None)  # a vision-language checkpoint's (multimodal/serving.py)
        self.model_name, self.style, self.sched, self.time_limit_s = model_name, style, scheduler, time_limit_s
        self.limits = limits or Limits()
        self.weight_root = Path(weight_root).resolve() if weight_root else None
        self.sched.score_chunk_elems = self.limits.score_chunk_elems
        self.created = int(time.time())
        self.counts = {"requests": 0, "rejected_429": 0, "errors_4xx": 0}
        # LoRA adapters served beside the base (None: LoRA is off): name -> (slot, folder); a request picks one by
        # its `model` field, as in vLLM (model/lora_multi.py). Slot numbers are never reused (a request queued for
        # an unloaded adapter must not meet its successor); loads and unloads run one at a time
        self.adapters: dict[str, tuple[int, str]] | None = adapters
        self.next_slot = 1 + max([0, *(slot for slot, _ in (adapters or {}).values())])
        self.lora_lock = asyncio.Lock()

    # ---- request -> jobs -----------------------------------------------------------------------------------
    async def body(self, request: Request, model_cls, named: bool = True):
        raw = await request.body()  # at most Limits.max_body_bytes: the Guard middleware refused larger ones
        req = _parse(raw, model_cls) if len(raw) <= INLINE_JSON_BYTES else await asyncio.to_thread(_parse, raw, model_cls)
        if not named:  # not an OpenAI request (no model field)
            return req
        self.slot_of(req.model)
        req.unsupported()
        return req

    def slot_of(self, name: str) -> int:
        """The LoRA slot a request's `model` names (0: the base); 404 for a name this server does not serve."""
        if name == self.model_name:
            return 0
        if self.adapters and name in self.adapters:
            return self.adapters[name][0]
        served = ", ".join(repr(n) for n in [self.model_name, *(self.adapters or {})])
        raise ApiError(404, f"model {name!r} does not exist; this server serves {served}", "model")

    def has_media(self, req) -> bool:
        from glmstack.multimodal.serving import has_media

        return has_media(req.messages)

    def media(self, req):
        """A chat request's images (OpenAI image_url data URLs): its messages get the GLM-4.5V placeholders, the
        pixels come back; None when it has none. A text model, a remote URL or a bad image is a 400."""
        from glmstack.multimodal.serving import has_media, request_media

        if not has_media(req.messages):
            return None
        req.messages, media = request_media(req.messages, self.processor, self.limits)
        return media

    def expand(self, text: str, media) -> str:
        from glmstack.multimodal.images import ImageError
        from glmstack.multimodal.serving import expand_prompt

        try:
            return expand_prompt(text, media, self.processor)
        except ImageError as e:
            raise ApiError(400, f"messages: {e}", "messages") from None

    def budget(self, prompt_len: int, asked: int | None, param: str, prompt_param: str) -> int:
        """New tokens for a prompt: `asked` (the field `param`), else the rest of the context."""
        room = self.ctx - prompt_len
        if room <= 0:
            raise ApiError(400, f"the prompt has {prompt_len} tokens; the model's context is {self.ctx}", prompt_param)
        if asked is not None and asked > room:
            raise ApiError(400, f"{param} = {asked} is too large: the prompt has {prompt_len} tokens and the "
                           f"context is {self.ctx}, leaving {room}", param)  # fmt: skip
        return asked if asked is not None else room

    def jobs(self, req, prompt_ids: list[int], max_new: int, top_logprobs: int, logprobs: bool, media=None,
             score_prompt: bool = False):
        """n jobs (choice j samples with seed + j, as Engine.generate's row j) sharing one event queue; not yet
        submitted (`submit`), so a request is validated whole before any of its work is queued."""
        if logprobs and self.sched.speculative:
            raise ApiError(400, "logprobs are not available with --speculative mtp (verify steps keep no per-token "
                           "distribution); restart the server without it", "logprobs")  # fmt: skip
        if req.return_routed_experts:
            self.check_routes()
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        params = SamplingParams(temperature=req.temperature, top_p=req.top_p, top_k=max(req.top_k, 0))
        seed = req.seed if req.seed is not None else secrets.randbits(62)
        stop_ids = set(req.stop_token_ids or []) | (set() if req.ignore_eos else set(self.tok.eos_ids))
        deadline = time.monotonic() + self.time_limit_s
        jobs = []
        for j in range(req.n):

            def emit(ev, j=j):
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, (j, ev))
                except RuntimeError:  # the event loop is closed (server shutting down): nobody is listening
                    pass

            jobs.append(Job(prompt_ids=prompt_ids, max_new_tokens=max_new, params=params, seed=seed + j, emit=emit,
                            stop_ids=frozenset(stop_ids), top_logprobs=top_logprobs, deadline=deadline,
                            media=media, score_prompt=score_prompt and j == 0,
                            return_routes=req.return_routed_experts, adapter=self.slot_of(req.model)))  # fmt: skip
        return jobs, queue

    def check_routes(self) -> None:
        """return_routed_experts needs plain decoding of a text MoE model."""
        why = ("--speculative mtp (its verify steps route draft tokens that are then rejected)" if self.sched.speculative
               else "a vision-language model" if self.processor is not None
               else "a model without MoE layers" if not trunk_routers(self.sched.model) else None)  # fmt: skip
        if why:
            raise ApiError(400, f"return_routed_experts is not available with {why}", "return_routed_experts")

    def submit(self, jobs: list[Job]) -> None:
        """Queue all of a request's jobs at once (all or none)."""
        try:
            self.sched.submit(jobs)
        except QueueFull as e:
            self.counts["rejected_429"] += 1
            raise ApiError(429, str(e)) from None

    def weights_path(self, model_path: str, param: str = "model_path") -> Path:
        """`model_path` resolved (links followed) inside the allowed root; the same refusal whether or not the
        path exists outside it, so the route does not tell a client which server files exist."""
        if self.weight_root is None:
            raise ApiError(403, "weight updates are off: start the server with --enable-weight-updates "
                           "--weight-root DIR", param)  # fmt: skip
        path = (self.weight_root / model_path).resolve()
        if not path.is_relative_to(self.weight_root):
            raise ApiError(403, f"{param}: weights are read only from inside the server's --weight-root",
                           param)  # fmt: skip
        return path

    def next_version(self, asked):
        v = self.sched.weight_version
        return asked if asked is not None else (v + 1 if isinstance(v, int) else 1)

    async def load_adapter(self, req: LoadLoraRequest) -> dict:
        if self.adapters is None:
            raise ApiError(400, "LoRA is off: start the server with --enable-lora (or --lora NAME=DIR)", "lora_name")
        async with self.lora_lock:
            return await self._load_adapter(req)

    async def _load_adapter(self, req: LoadLoraRequest) -> dict:
        if req.lora_name == self.model_name:
            raise ApiError(400, f"lora_name {req.lora_name!r} is the base model's name", "lora_name")
        if req.lora_name in self.adapters and not req.load_inplace:
            raise ApiError(400, f"the adapter {req.lora_name!r} is already loaded (load_inplace: true replaces it)",
                           "lora_name")  # fmt: skip
        path = self.weights_path(req.lora_path, "lora_path")
        if req.lora_name not in self.adapters and len(self.adapters) >= self.limits.max_loras:
            raise ApiError(400, f"this server holds at most {self.limits.max_loras} LoRA adapters (--max-loras); "
                           "unload one first", "lora_name")  # fmt: skip
        slot = self.adapters[req.lora_name][0] if req.lora_name in self.adapters else self.next_slot
        version = self.next_version(req.weight_version)
        try:
            await asyncio.to_thread(self.sched.update_adapter, slot, str(path), version)
        except (OSError, ValueError) as e:  # CheckpointError / ConfigError are ValueErrors: the adapter did not fit
            raise ApiError(400, f"lora_path: {e}", "lora_path") from None
        self.adapters[req.lora_name] = (slot, req.lora_path)
        self.next_slot = max(self.next_slot, slot + 1)
        return {"success": True, "message": f"loaded LoRA adapter {req.lora_name!r}", "weight_version": version}

    async def unload_adapter(self, req: UnloadLoraRequest) -> dict:
        async with self.lora_lock:
            if not self.adapters or req.lora_name not in self.adapters:
                raise ApiError(404, f"no LoRA adapter named {req.lora_name!r} is loaded", "lora_name")
            slot, _ = self.adapters.pop(req.lora_name)  # new requests for it are refused from here on
            await asyncio.to_thread(self.sched.update_adapter, slot, None, self.sched.weight_version)
        return {"success": True, "message": f"unloaded LoRA adapter {req.lora_name!r}"}

    def chat_prompt_ids(self, req, media):
        """(ChatPrompt, token ids): rendering and tokenising, run in a thread by the route."""
        cp = chat_prompt(req, self.style)
        return cp, self.tok.encode(cp.text if media is None else self.expand(cp.text, media))


async def events(queue: asyncio.Queue, outs: list[ChoiceOutput], jobs: list[Job]):
    """(choice, token or Finished, new text) until every choice has finished; a stop string cancels its job."""
    left = len(jobs)
    while left:
        j, ev = await queue.get()
        out = outs[j]
        if isinstance(ev, PromptScores):  # echo + logprobs: choice 0 scores the prompt for all n choices
            for o in outs:
                o.prompt_scores = ev
            continue
        if out.finish is not None:
            continue
        if isinstance(ev, Token):
            text = out.add(ev)
            if out.stop_hit is not None:
                jobs[j].cancelled = True
            yield j, ev, text
        else:
            left -= 1
            yield j, ev, out.close(ev)


def create_app(engine, model_name: str, style: str, scheduler: Scheduler, time_limit_s: float = 600.0, *,
               limits: Limits | None = None, api_key: str | None = None, bind_host: str = "127.0.0.1",
               allowed_hosts: list[str] | None = None, weight_root: str | None = None,
               adapters: dict | None = None) -> FastAPI:  # fmt: skip
    """The app behind the Guard middleware (security.py). `weight_root`: the folder weight pushes may be read from;
    None turns POST /update_weights_from_disk and /v1/load_lora_adapter off. `adapters`: {name: (slot, folder)} of
    the LoRA adapters loaded on the model (None: LoRA off)."""
    srv = Server(engine, model_name, style, scheduler, time_limit_s, limits, weight_root, adapters)
    app = FastAPI(title="glmstack serve", docs_url=None, redoc_url=None)
    app.state.server = srv
    app.add_middleware(Guard, api_key=api_key, bind_host=bind_host, allowed_hosts=allowed_hosts,
                       max_body_bytes=srv.limits.max_body_bytes)  # fmt: skip

    @app.exception_handler(ApiError)
    async def _api_error(_request, e: ApiError):
        srv.counts["errors_4xx"] += e.status < 500
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        return JSONResponse(internal_error(e, request.url.path).body(), status_code=500)

    @app.get("/health")
    async def health():
        alive = srv.sched._thread is not None and srv.sched._thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "dead"}, status_code=200 if alive else 503)

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": srv.created, "owned_by": "glmstack",
                "max_model_len": srv.ctx}  # fmt: skip
        loras = [{**card, "id": name, "parent": model_name, "root": path}
                 for name, (_, path) in (srv.adapters or {}).items()]  # fmt: skip
        return {"object": "list", "data": [card, *loras]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus_text(srv), media_type="text/plain; version=0.0.4")

    @app.get("/")
    async def page():
        return HTMLResponse(resources.files("glmstack.serve").joinpath("chat_page.html").read_text())

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request):
        req = await srv.body(request, WeightsRequest, named=False)
        path = srv.weights_path(req.model_path)
        version = srv.next_version(req.weight_version)
        try:
            state = await asyncio.to_thread(read_weights, path)
            await asyncio.to_thread(srv.sched.update_weights, state, version)
        except (OSError, ValueError) as e:
            raise ApiError(400, f"model_path: {e}", "model_path") from None
        return {"success": True, "message": f"loaded {req.model_path}", "weight_version": version}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request):
        return await srv.load_adapter(await srv.body(request, LoadLoraRequest, named=False))

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request):
        return await srv.unload_adapter(await srv.body(request, UnloadLoraRequest, named=False))

    @app.get("/get_weight_version")
    async def weight_version():
        return {"weight_version": srv.sched.weight_version}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        srv.counts["requests"] += 1
        req = await srv.body(request, ChatRequest)
        n_chars = message_chars(req.messages) + message_chars(req.tools or [])  # both are rendered into the prompt
        check_prompt_chars(n_chars, srv.limits.prompt_chars(srv.ctx), "messages")
        stops = req.stops()
        # decoding images, rendering and tokenising cost time in the request's size: large ones off the event loop
        media = await asyncio.to_thread(srv.media, req) if srv.has_media(req) else None  # placeholders + pixels
        if media is None and n_chars <= INLINE_CHARS:
            cp, prompt_ids = srv.chat_prompt_ids(req, None)
        else:
            cp, prompt_ids = await asyncio.to_thread(srv.chat_prompt_ids, req, media)
        asked = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        max_new = srv.budget(len(prompt_ids), asked, param, "messages")
        k = (req.top_logprobs or 0) if req.logprobs else 0
        jobs, queue = srv.jobs(req, prompt_ids, max_new, k, req.logprobs, media)
        outs = [ChoiceOutput(srv.tok, stops, jobs[0].stop_ids) for _ in jobs]
        srv.submit(jobs)
        rid = "chatcmpl-" + secrets.token_hex(12)
        if req.stream:
            gen = stream_chat(srv, req, cp, prompt_ids, jobs, queue, outs, rid)
            return StreamingResponse(_cancelling(gen, jobs), media_type="text/event-stream")
        return await _whole(request, jobs, _whole_chat(srv, req, cp, prompt_ids, jobs, queue, outs, rid))

    @app.post("/v1/completions")
    async def completions(request: Request):
        srv.counts["requests"] += 1
        req = await srv.body(request, CompletionRequest)
        n_chars = prompt_chars(req.prompt)
        check_prompt_chars(n_chars, srv.limits.prompt_chars(srv.ctx), "prompt")
        stops = req.stops()
        if n_chars <= INLINE_CHARS:
            prompts = _prompts(req.prompt, srv.tok)
        else:
            prompts = await asyncio.to_thread(_prompts, req.prompt, srv.tok)
        if len(prompts) != 1 and req.stream:
            raise ApiError(400, "prompt: streaming takes one prompt", "prompt")
        # every prompt is checked before any job is queued: a bad last prompt leaves nothing running
        budgets = [srv.budget(len(ids), req.max_tokens, "max_tokens", "prompt") for ids in prompts]
        scored = req.echo and req.logprobs is not None
        runs = []
        for ids, max_new in zip(prompts, budgets):
            jobs, queue = srv.jobs(req, ids, max_new, req.logprobs or 0, req.logprobs is not None, score_prompt=scored)
            runs.append((ids, jobs, queue, [ChoiceOutput(srv.tok, stops, jobs[0].stop_ids) for _ in jobs]))
        all_jobs = [j for run in runs for j in run[1]]
        srv.submit(all_jobs)
        rid = "cmpl-" + secrets.token_hex(12)
        if req.stream:
            ids, jobs, queue, outs = runs[0]
            gen = stream_completion(srv, req, ids, jobs, queue, outs, rid)
            return StreamingResponse(_cancelling(gen, jobs), media_type="text/event-stream")
        return await _whole(request, all_jobs, _whole_completion(srv, req, runs, rid))

    return app


def internal_error(e: BaseException, where: str) -> ApiError:
    """A 500 that names a request id, never the exception: its text can hold paths, tensor shapes or a client's
    input; the detail goes to the server log under the same id."""
    rid = secrets.token_hex(8)
    log.error("internal error %s in %s: %s: %s", rid, where, type(e).__name__, e, exc_info=e)
    return ApiError(500, f"internal error (request id {rid}); the detail is in the server log")


def _parse(raw: bytes, model_cls):
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        message, param = validation_message(e.errors())
        raise ApiError(422, message, param) from None


# ---------------------------------------------------------------- whole answers
async def _whole(request: Request, jobs: list[Job], answer):
    """Await the answer; a client that leaves meanwhile cancels its jobs."""
    task = asyncio.ensure_future(answer)
    try:
        while not task.done():
            await asyncio.wait([task], timeout=0.5)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                break
        return JSONResponse(await task)
    finally:
        for job in jobs:
            job.cancelled = True  # no-op for finished jobs


def _usage(prompt_len: int, outs: list[ChoiceOutput], jobs: list[Job] = ()) -> dict:
    done = sum(len(o.ids) for o in outs)
    usage = {"prompt_tokens": prompt_len, "completion_tokens": done, "total_tokens": prompt_len + done}
    if jobs:  # as OpenAI / vLLM: prompt tokens served from the prefix cache
        usage["prompt_tokens_details"] = {"cached_tokens": max(j.cached_tokens for j in jobs)}
    return usage


def _spec(job: Job) -> dict:
    """A finished choice's own fields: `weight_version`, the version of the weights that generated it (SGLang's
    name; an RL trainer records the sampler's version, not its belief), `speculative`: acceptance length / rate and
    the monitor's verdict (MTP serving only), and with return_routed_experts `routed_experts`: {"shape": [seq_len -
    1, MoE layers, top_k], "dtype": "int16", "data": base64 little-endian} (inference/routes.encode_routes)."""
    return {"weight_version": job.weight_version} | (
        {"speculative": job.monitor.report()} if job.monitor is not None else {}) | (
        {"routed_experts": encode_routes(routed_experts(job))} if job.return_routes else {})


def _error_finish(outs: list[ChoiceOutput]) -> None:
    for o in outs:
        if o.finish == "error":
            raise RuntimeError(f"generation failed: {o.error}")


async def _whole_chat(srv, req, cp, prompt_ids, jobs, queue, outs, rid) -> dict:
    async for _ in events(queue, outs, jobs):
        pass
    _error_finish(outs)
    choices = []
    for j, out in enumerate(outs):
        msg = parse(cp.prefill + out.text, cp.tools, srv.style, in_reasoning=cp.in_reasoning, calls=cp.parse_calls)
        if not req.include_reasoning:
            msg["reasoning_content"] = None
        if not req.parallel_tool_calls:  # as vLLM: only the first call
            msg["tool_calls"] = msg["tool_calls"][:1]
        if not msg["tool_calls"]:
            del msg["tool_calls"]
        reason = "tool_calls" if msg.get("tool_calls") and out.finish == "stop" else out.finish
        choice = {"index": j, "message": msg, "finish_reason": reason,
                  "logprobs": out.chat_logprobs(out.tokens) if req.logprobs else None}  # fmt: skip
        if req.return_token_ids:
            choice["token_ids"] = out.ids
        choices.append(choice | _spec(jobs[j]))
    body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": req.model,
            "choices": choices, "usage": _usage(len(prompt_ids), outs, jobs)}  # fmt: skip
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    return body


async def _whole_completion(srv, req, runs, rid) -> dict:
    choices, n_prompt, all_outs = [], 0, []
    for p, (ids, jobs, queue, outs) in enumerate(runs):
        async for _ in events(queue, outs, jobs):
            pass
        _error_finish(outs)
        n_prompt += len(ids)
        all_outs += outs
        head = srv.tok.decode(ids) if req.echo else ""
        for j, out in enumerate(outs):
            logprobs = out.completion_logprobs(out.tokens, len(head)) if req.logprobs is not None else None
            if req.echo and logprobs is not None:  # the prompt's tokens first, as OpenAI's legacy API and vLLM
                logprobs = out.echo_logprobs(ids, logprobs)
            choice = {"index": p * req.n + j, "text": head + out.text, "finish_reason": out.finish,
                      "logprobs": logprobs}  # fmt: skip
            if req.return_token_ids:
                choice |= {"prompt_token_ids": ids, "token_ids": out.ids}
            choices.append(choice | _spec(jobs[j]))
    usage = _usage(n_prompt, all_outs, [j for _, jobs, _, _ in runs for j in jobs])
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": req.model,
            "choices": choices, "usage": usage}  # fmt: skip


def _prompts(prompt, tok) -> list[list[int]]:
    if isinstance(prompt, str):
        prompts = [tok.encode(prompt)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    elif prompt and all(isinstance(p, str) for p in prompt):
        prompts = [tok.encode(p) for p in prompt]
    else:
        prompts = [list(p) for p in prompt]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ApiError(400, "prompt: give at least one token", "prompt")
    if any(not 0 <= t < tok.vocab_size for p in prompts for t in p):
        raise ApiError(400, f"prompt: token ids must be in [0, {tok.vocab_size})", "prompt")
    return prompts


# ---------------------------------------------------------------- streams
def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _cancelling(gen, jobs: list[Job]):
    """The SSE body; when the client leaves (the generator is closed), its jobs are cancelled."""
    try:
        async for frame in gen:
            yield frame
    except Exception as e:  # noqa: BLE001 — headers are sent: report in-stream (as vLLM), then end it
        yield _sse(internal_error(e, "stream").body())
        yield "data: [DONE]\n\n"
    finally:
        for job in jobs:
            job.cancelled = True


async def stream_chat(srv, req, cp, prompt_ids, jobs, queue, outs, rid):
    head = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": req.model}

    def chunk(j, delta, finish=None, logprobs=None, token_ids=None, **top):
        choice = {"index": j, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:
            choice |= _spec(jobs[j])
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return _sse({**head, **top, "choices": [choice], "usage": None})

    parsers = []
    for j in range(len(jobs)):
        extra = {"prompt_token_ids": prompt_ids} if req.return_token_ids and j == 0 else {}
        yield chunk(j, {"role": "assistant", "content": ""}, **extra)
        parser = StreamParser(cp.tools, srv.style, in_reasoning=cp.in_reasoning, calls=cp.parse_calls)
        parser.feed(cp.prefill)  # a forced "<tool_call>name" opens the call: nothing to show yet
        parsers.append(parser)
    sent_calls = [False] * len(jobs)
    async for j, ev, text in events(queue, outs, jobs):
        finished = isinstance(ev, Finished)
        if finished and outs[j].finish == "error":
            yield _sse(internal_error(RuntimeError(f"generation failed: {outs[j].error}"), "stream").body())
            break
        deltas = parsers[j].feed(text) if text else []
        if finished:
            deltas += parsers[j].finish()
        if not req.include_reasoning:
            deltas = [d for d in deltas if "reasoning_content" not in d]
        if not req.parallel_tool_calls:
            deltas = [d for d in deltas if all(tc["index"] == 0 for tc in d.get("tool_calls", ()))]
        sent_calls[j] |= any("tool_calls" in d for d in deltas)
        per_token = {}
        if isinstance(ev, Token):
            if req.logprobs:
                per_token["logprobs"] = outs[j].chat_logprobs([ev])
            if req.return_token_ids:
                per_token["token_ids"] = [ev.id]
        if per_token and not deltas:
            deltas = [{}]
        for i, d in enumerate(deltas):
            yield chunk(j, d, **(per_token if i == 0 else {}))
        if finished:
            reason = "tool_calls" if sent_calls[j] and outs[j].finish == "stop" else outs[j].finish
            yield chunk(j, {}, reason)
    if req.stream_options and req.stream_options.include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(len(prompt_ids), outs, jobs)})
    yield "data: [DONE]\n\n"


async def stream_completion(srv, req, prompt_ids, jobs, queue, outs, rid):
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": req.model}
    first = [True] * len(jobs)
    async for j, ev, text in events(queue, outs, jobs):
        finished = isinstance(ev, Finished)
        if finished and outs[j].finish == "error":
            yield _sse(internal_error(RuntimeError(f"generation failed: {outs[j].error}"), "stream").body())
            break
        choice = {"index": j, "text": text, "logprobs": None, "finish_reason": outs[j].finish if finished else None}
        if finished:
            choice |= _spec(jobs[j])
        if isinstance(ev, Token):
            if req.logprobs is not None:
                choice["logprobs"] = outs[j].completion_logprobs([ev], outs[j].shown - len(text))
            if req.return_token_ids:
                choice["token_ids"] = [ev.id]
        if req.return_token_ids and first[j]:  # and the version it runs on: a client that aborts it knows it
            choice |= {"prompt_token_ids": prompt_ids, "weight_version": jobs[j].weight_version}
        first[j] = False
        yield _sse({**head, "choices": [choice]})
    if req.stream_options and req.stream_options.include_usage:
        yield _sse({**head, "choices": [], "usage": _usage(len(prompt_ids), outs, jobs)})
    yield "data: [DONE]\n\n"


def read_weights(path: str) -> dict:
    """A state dict from an HF folder (read as `glmstack.model.load_hf` does) or a .safetensors file."""
    from pathlib import Path

    from safetensors.torch import load_file

    from glmstack.model.hf import load_hf

    p = Path(path)
    if p.is_dir():
        return load_hf(p).state_dict()
    if not p.is_file():
        raise FileNotFoundError(f"no such file or folder: {path}")
    return load_file(p)
