"""GLM-5's thinking modes through `glmstack serve` (official `openai` client, uvicorn on loopback) and `glmstack chat`.

The model: a tiny GLM over-fitted (tests/serve_fixture.py) on one GLM-4.7-style agent conversation rendered with
preserved thinking: three user turns, tool calls between them, reasoning before every call and answer (interleaved),
and a last turn answered with thinking off (turn-level). Greedy decoding then replays it, so the client appends what
the server really generated. With `chat_template_kwargs: {"clear_thinking": false}` each request's prompt ids
start with the previous request's prompt + completion ids, and the prefix cache serves all of them but the last
sampled token (never fed), in blocks; with the templates' default the reuse stops where the first reasoning block
of the finished turn was dropped.
"""

from __future__ import annotations

import io
import json
import sys
from itertools import pairwise
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_fixture import RunningServer, build_checkpoint

pytestmark = pytest.mark.slow  # ~30 s to train the fixture model on a loaded 2-core machine

BS = 4  # prefix-cache block: small, so the bounds below are tight
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}}]  # fmt: skip


def weather(days):
    return {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": days}}}


# (user text, thinking, the assistant messages and tool results that follow)
TURNS = [
    ("Plan a day in Paris.", True, [
        {"role": "assistant", "reasoning_content": "Ask the weather first.", "content": "", "tool_calls": [weather(1)]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "reasoning_content": "Sunny, so walk.", "content": "Walk along the Seine."}]),
    ("And tomorrow?", True, [
        {"role": "assistant", "reasoning_content": "Check tomorrow.", "content": "", "tool_calls": [weather(2)]},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "reasoning_content": "Rain, so indoors.", "content": "Visit the Louvre."}]),
    ("Thanks!", False, [{"role": "assistant", "content": "You are welcome."}]),
]  # fmt: skip
CONVERSATION = [m for text, _, msgs in TURNS for m in [{"role": "user", "content": text}, *msgs]]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("thinking") / "tiny", steps=800,
                            conversations=[(CONVERSATION, TOOLS)], style="glm-4.7", clear_thinking=False)  # fmt: skip


@pytest.fixture(scope="module")
def server(ckpt):
    srv = RunningServer(ckpt, prefix_cache_mb=16, prefix_block=BS)
    yield srv
    srv.stop()


def hit_tokens(server) -> int:
    import httpx

    text = httpx.get(server.url + "/metrics").text
    return int(float(text.split("\nglmstack:prefix_cache_hit_tokens_total ")[1].split()[0]))


def play(server, clear: bool, requests: int | None = None) -> list[dict]:
    """The conversation as an agent client runs it: per assistant message one request, the reply appended as the
    server returned it (reasoning included), the scripted tool results in between."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    history, out = [], []
    for text, thinking, msgs in TURNS:
        history.append({"role": "user", "content": text})
        for want in msgs:
            if want["role"] == "tool":
                history.append(want)
                continue
            if requests is not None and len(out) == requests:
                return out
            before = hit_tokens(server)
            r = client.chat.completions.create(
                model="tiny", messages=history, tools=TOOLS, temperature=0, max_tokens=40,
                extra_body={"return_token_ids": True,
                            "chat_template_kwargs": {"clear_thinking": clear, "enable_thinking": thinking}})  # fmt: skip
            msg = r.choices[0].message
            reply = {"role": "assistant", "content": msg.content or "",
                     "reasoning_content": getattr(msg, "reasoning_content", None)}  # fmt: skip
            if msg.tool_calls:
                reply["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": c.function.arguments}} for c in msg.tool_calls]  # fmt: skip
            history.append({k: v for k, v in reply.items() if v is not None})
            out.append({"prompt": r.model_extra["prompt_token_ids"], "completion": r.choices[0].model_extra["token_ids"],
                        "cached": r.usage.prompt_tokens_details.cached_tokens, "hits": hit_tokens(server) - before,
                        "reply": reply, "want": want})  # fmt: skip
    return out


def test_preserved_thinking_reuses_each_whole_previous_turn(server):
    server.sched.prefix_cache.clear()
    turns = play(server, clear=False)
    assert len(turns) == 5
    for t in turns:  # the model replays the conversation: reasoning, answers, tool calls, thinking switched off
        want = t["want"]
        assert t["reply"]["content"] == want["content"]
        assert t["reply"]["reasoning_content"] == want.get("reasoning_content")
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in t["reply"].get("tool_calls", [])
        ]
        assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in want.get("tool_calls", [])]
    for prev, t in pairwise(turns):
        seen = prev["prompt"] + prev["completion"]
        assert t["prompt"][: len(seen)] == seen  # the prompt extends the last prompt + completion, token for token
        assert t["cached"] >= (len(seen) - 1) // BS * BS  # all of it from the cache but the last sampled token
        assert t["hits"] == t["cached"]  # /metrics says the same


def test_cleared_thinking_stops_reuse_at_the_first_dropped_reasoning_block(server, ckpt):
    from glmstack.tokenizer import Tokenizer

    tok = Tokenizer.load(ckpt)
    server.sched.prefix_cache.clear()
    turns = play(server, clear=True, requests=3)  # turn 1 (a call, then the answer), then turn 2's first request
    first, second, third = turns
    seen = first["prompt"] + first["completion"]
    assert second["prompt"][: len(seen)] == seen and second["cached"] >= (len(seen) - 1) // BS * BS  # same turn
    # the next user turn: turn 1's reasoning is dropped, so the prompt differs where its first <think> was
    d = len(first["prompt"]) - 1
    assert first["prompt"][d] == tok.token_id("<think>") and third["prompt"][d] == tok.token_id("</think>")
    assert third["prompt"][:d] == first["prompt"][:d]
    assert third["cached"] == d // BS * BS == third["hits"]  # reuse stops at the dropped block's start


def test_chat_command_keeps_or_drops_reasoning(ckpt, tmp_path, monkeypatch, capsys):
    """`glmstack chat --keep-thinking`: the second prompt is the first prompt + the reply as generated; without it
    the reply's reasoning is gone; `/think off` switches thinking off for the next turn (prompt ends `</think>`)."""
    from glmstack.inference.cli import chat_main
    from glmstack.inference.engine import Engine

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    seen = []
    stream = Engine.stream

    def spy(self, prompt, *args, **kwargs):
        seen.append([prompt, ""])
        for delta in stream(self, prompt, *args, **kwargs):
            seen[-1][1] += delta.text
            yield delta

    monkeypatch.setattr(Engine, "stream", spy)
    lines = "Plan a day in Paris.\nAnd tomorrow?\n/think off\nThanks!\n"
    for keep in (True, False):
        seen.clear()
        monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
        flags = ["--keep-thinking"] if keep else []
        assert chat_main([ckpt, "--tools", str(tools), "--temperature", "0", "--max-new-tokens", "40", *flags]) == 0
        (p1, r1), (p2, _), (p3, _) = seen
        assert r1.startswith("Ask the weather first.</think><tool_call>get_weather")
        if keep:
            assert p2 == p1 + r1 + "<|user|>And tomorrow?<|assistant|><think>"
        else:
            assert "Ask the weather first." not in p2 and p2.endswith("<|user|>And tomorrow?<|assistant|><think>")
        assert p3.endswith("<|user|>Thanks!<|assistant|></think>")
    capsys.readouterr()
