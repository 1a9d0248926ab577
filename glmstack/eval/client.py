"""Where generations come from: a checkpoint in this process, or any OpenAI-compatible endpoint.

Every task asks for generations with one request shape and reads one output shape, so a score does not depend
on where the model runs (at temperature 0 the two must agree; tests/integration/test_eval_serve.py):
    request  {"kind": "completion", "prompt": str, "stop": [str]}          base-model prompts, FIM
             {"kind": "chat", "messages": [...], "tools": [...] | None}   chat prompts, tool calling
    output   {"text": str, "tool_calls": [{"name": str, "arguments": dict}], "finish_reason": str}
`LocalClient` renders chat requests in GLM's format (glmstack.chat.render), generates with the inference
engine in batches and parses the reply with glmstack.chat.parse. `EndpointClient` sends the same requests
through the official `openai` client (chat completions with `tools`, completions for raw prompts), several at
once; a reply whose content still holds GLM `<tool_call>` text is parsed with our parser too.

    client = LocalClient.from_checkpoint("runs/sft/final")
    client = EndpointClient("http://127.0.0.1:8000/v1", model="glm", concurrency=8)
    outs = client.generate(requests, temperature=0.0, max_tokens=256, seeds=[0, 1, ...])
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor


class GenerationError(RuntimeError):
    """An endpoint kept failing on a request (after the client's retries)."""


def cut_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """`text` up to the first occurrence of any stop string (engines that ignore `stop` get it applied here)."""
    cut = min((i for i in (text.find(s) for s in stop or ()) if i >= 0), default=len(text))
    return text[:cut]


def output(text: str, tool_calls=(), finish_reason: str = "stop") -> dict:
    return {"text": text, "tool_calls": list(tool_calls), "finish_reason": finish_reason}


def message_calls(message: dict) -> list[dict]:
    """OpenAI-shape tool calls of a parsed/returned message -> [{"name", "arguments": dict}]."""
    calls = []
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function", tc)
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                args = {"__unparsable__": args}
        calls.append({"name": fn.get("name", ""), "arguments": args})
    return calls


# ---------------------------------------------------------------- in process
class LocalClient:
    """A glmstack Engine: chat requests rendered in GLM's chat format, replies parsed by our parser."""

    def __init__(self, engine, style: str = "glm-4.5", enable_thinking: bool = False, batch_size: int = 8):
        self.engine, self.style, self.enable_thinking, self.batch_size = engine, style, enable_thinking, batch_size
        self.name = "local"

    @classmethod
    def from_checkpoint(cls, path: str, device: str = "cpu", style: str = "auto", **kw) -> LocalClient:
        from glmstack.inference import Engine
        from glmstack.model import load_hf
        from glmstack.tokenizer import Tokenizer

        engine = Engine(load_hf(path, device=device), Tokenizer.load(path))
        client = cls(engine, style=_checkpoint_style(engine) if style == "auto" else style, **kw)
        client.name = str(path)
        return client

    def prompt_text(self, request: dict) -> str:
        if request["kind"] == "completion":
            return request["prompt"]
        from glmstack.chat import render

        return render(
            request["messages"], request.get("tools"), style=self.style,
            enable_thinking=self.enable_thinking, add_generation_prompt=True,
        )  # fmt: skip

    def generate(self, requests: list[dict], *, temperature: float, max_tokens: int, seeds: list[int]) -> list[dict]:
        """Batches of `batch_size`; a prompt that leaves no room in the context gets an empty reply (finish_reason
        "prompt_too_long", scored as a failure), and one that leaves less than `max_tokens` runs alone, because the
        engine's budget is per batch and a server's is per request (the two must agree at temperature 0)."""
        ctx = self.engine.cfg.max_position_embeddings
        prompts = [self.engine.tokenizer.encode(self.prompt_text(r)) for r in requests]
        outs: list[dict | None] = [None] * len(requests)
        batched, alone = [], []
        for i, ids in enumerate(prompts):
            if len(ids) >= ctx:
                outs[i] = output("", finish_reason="prompt_too_long")
            else:
                (batched if len(ids) + max_tokens <= ctx else alone).append(i)
        groups = [batched[s : s + self.batch_size] for s in range(0, len(batched), self.batch_size)]
        for group in groups + [[i] for i in alone]:
            res = self.engine.generate(
                [prompts[i] for i in group], max_new_tokens=max_tokens, temperature=temperature,
                seeds=[seeds[i] for i in group],
            )  # fmt: skip
            for i, text, finish in zip(group, res.text, res.finish_reason):
                outs[i] = self._output(requests[i], text, finish)
        return outs

    def _output(self, request: dict, text: str, finish: str) -> dict:
        if request["kind"] == "completion":
            return output(cut_at_stop(text, request.get("stop")), finish_reason=finish)
        from glmstack.chat import parse

        msg = parse(text, request.get("tools"), style=self.style, in_reasoning=self.enable_thinking)
        return output(msg["content"] or "", message_calls(msg), finish)


def _checkpoint_style(engine) -> str:
    """The checkpoint's own chat template decides (GLM-4.7/5's has clear_thinking), else glm-4.5."""
    template = (getattr(engine.tokenizer, "_config", None) or {}).get("chat_template") or ""
    return "glm-4.7" if "clear_thinking" in template else "glm-4.5"


# ---------------------------------------------------------------- over HTTP
_ROOM = (
    re.compile(r"leaving (\d+)"),  # glmstack serve: "... the prompt has P tokens and the context is C, leaving R"
    re.compile(r"maximum context length is (\d+) tokens.*?\((\d+) in the messages", re.DOTALL),  # vLLM / OpenAI
)


def context_room(message: str) -> int | None:
    """New tokens a server says still fit after the prompt, from its max_tokens error message (None: not that)."""
    if m := _ROOM[0].search(message):
        return int(m.group(1))
    if m := _ROOM[1].search(message):
        return int(m.group(1)) - int(m.group(2))
    return None


class EndpointClient:
    """An OpenAI-compatible server (`glmstack serve`, vLLM, SGLang, ...), `concurrency` requests in flight."""

    def __init__(self, base_url: str, model: str | None = None, concurrency: int = 8, api_key: str = "EMPTY",
                 timeout_s: float = 600.0, style: str = "glm-4.5", enable_thinking: bool | None = False):  # fmt: skip
        """enable_thinking: sent as `chat_template_kwargs` (glmstack serve, vLLM, SGLang); None sends nothing
        (for APIs that reject unknown fields)."""
        import openai

        self.api = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=3)
        self.model = model or self._first_model()
        self.concurrency, self.style, self.enable_thinking = concurrency, style, enable_thinking
        self.name = f"{base_url} ({self.model})"

    def _first_model(self) -> str:
        try:
            return self.api.models.list().data[0].id
        except Exception as e:
            raise GenerationError(f"could not list the endpoint's models ({e}); pass --api-model NAME") from e

    def generate(self, requests: list[dict], *, temperature: float, max_tokens: int, seeds: list[int]) -> list[dict]:
        import openai

        def one(args):
            request, seed = args
            try:
                return self._one(request, temperature, max_tokens, seed)
            except openai.BadRequestError as e:  # the server refuses this request (e.g. longer than its context):
                return output("", finish_reason="rejected") | {"rejected": str(e)[:300]}  # asking again won't help
            except Exception as e:  # noqa: BLE001 - reported per request, the run goes on and resumes later
                return {"error": f"{type(e).__name__}: {e}"}

        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(one, zip(requests, seeds)))

    def _one(self, request: dict, temperature: float, max_tokens: int, seed: int) -> dict:
        """One request; a server that refuses `max_tokens` beyond the room its context leaves (as OpenAI's API,
        vLLM and glmstack serve do) is asked again for that room, which is what the in-process engine generates."""
        import openai

        try:
            return self._send(request, temperature, max_tokens, seed)
        except openai.BadRequestError as e:
            room = context_room(str(e))
            if room is None or not 0 < room < max_tokens:
                raise
            return self._send(request, temperature, room, seed)

    def _send(self, request: dict, temperature: float, max_tokens: int, seed: int) -> dict:
        common = {"model": self.model, "temperature": temperature, "max_tokens": max_tokens, "seed": seed}
        if request["kind"] == "completion":
            stop = list(request.get("stop") or [])[:4] or None  # the OpenAI API takes at most 4
            choice = self.api.completions.create(prompt=request["prompt"], stop=stop, **common).choices[0]
            return output(cut_at_stop(choice.text, request.get("stop")), finish_reason=choice.finish_reason)
        extra = {"tools": request["tools"]} if request.get("tools") else {}
        if self.enable_thinking is not None:
            extra["extra_body"] = {"chat_template_kwargs": {"enable_thinking": self.enable_thinking}}
        choice = self.api.chat.completions.create(messages=request["messages"], **extra, **common).choices[0]
        msg = choice.message.model_dump()
        content = msg.get("content") or ""
        calls = message_calls(msg)
        if not calls and "<tool_call>" in content:  # an endpoint that returns GLM's raw text: our parser
            from glmstack.chat import parse

            parsed = parse(content, request.get("tools"), style=self.style, in_reasoning=bool(self.enable_thinking))
            content, calls = parsed["content"] or "", message_calls(parsed)
        return output(content, calls, choice.finish_reason or "stop")
