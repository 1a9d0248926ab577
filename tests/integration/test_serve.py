"""`glmstack serve` on loopback, driven by the official `openai` client (and raw HTTP for malformed requests).

The model is a tiny GLM over-fitted in the fixture to two conversations (tests/serve_fixture.py), so greedy
decoding writes reasoning, an answer, and two tool calls: the server's parsing is exercised on real model output.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

openai = pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_fixture import HELLO, ROME_Q, STYLE, TOOLS, WEATHER_Q, RunningServer, build_checkpoint

from glmstack.chat import render
from glmstack.inference import Engine
from glmstack.model import load_hf
from glmstack.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # ~25 s to train the fixture model on a loaded 2-core machine


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def server(ckpt):
    srv = RunningServer(ckpt)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _post(server, path: str, body: str) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_chat_plain_and_streamed_equal_generate(server, client, ckpt):
    """temperature 0: streamed text == whole text == Engine.generate on the rendered prompt; reasoning split off."""
    msgs = HELLO[:1]
    whole = client.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=60,
                                           extra_body={"return_token_ids": True})  # fmt: skip
    msg = whole.choices[0].message
    assert msg.content == "Hello! How can I help you?"
    assert msg.reasoning_content == "The user greets me."
    assert whole.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=60,
                                                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert (content, reasoning) == (msg.content, msg.reasoning_content)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # really streamed
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # the reference: the engine alone on the same prompt
    engine = Engine(load_hf(ckpt, dtype=torch.float32), Tokenizer.load(ckpt))
    prompt = render(msgs, style=STYLE, add_generation_prompt=True)
    ref = engine.generate([prompt], 60, temperature=0)
    assert whole.model_extra["prompt_token_ids"] == engine.tokenizer.encode(prompt)
    assert whole.choices[0].model_extra["token_ids"] == ref.tokens[0]
    assert ref.text[0] == "\n<think>The user greets me.</think>\nHello! How can I help you?"


def test_streamed_tool_calls_parse(client):
    """Two calls in one turn, streamed: argument deltas assemble into JSON; the SDK's stream helper parses them."""
    args = {"model": "tiny", "messages": [WEATHER_Q], "tools": TOOLS, "temperature": 0, "max_tokens": 100}
    whole = client.chat.completions.create(**args)
    calls = whole.choices[0].message.tool_calls
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris", "days": 2},
                                                                  {"city": "Lyon", "days": 3}]  # fmt: skip
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.reasoning_content == "I need the tool."
    with client.chat.completions.stream(**args) as stream:
        arg_deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    assert len(arg_deltas) >= 4
    streamed = final.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Lyon", "days": 3})]  # fmt: skip
    assert final.choices[0].finish_reason == "tool_calls"
    for stream in (False, True):  # parallel_tool_calls=false keeps the first call only (as vLLM)
        r = client.chat.completions.create(**args, parallel_tool_calls=False, stream=stream)
        calls = r.choices[0].message.tool_calls if not stream else [
            tc for c in r if c.choices for tc in c.choices[0].delta.tool_calls or [] if tc.id]  # fmt: skip
        assert len(calls) == 1 and calls[0].function.name == "get_weather"


def test_tool_choice_modes(client, server):
    """none hides the tools and parses no call; a named function / required pre-fill the call's opening."""
    base = {
        "model": "tiny",
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": 60,
        "extra_body": {"return_token_ids": True},
    }
    none = client.chat.completions.create(messages=[WEATHER_Q], tool_choice="none", **base)
    assert not none.choices[0].message.tool_calls
    assert "get_weather" not in server.engine.tokenizer.decode(none.model_extra["prompt_token_ids"])
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        r = client.chat.completions.create(messages=[ROME_Q], tool_choice=choice, **base)
        prompt = server.engine.tokenizer.decode(r.model_extra["prompt_token_ids"])
        assert prompt.endswith("<tool_call>get_weather" if choice == named else "<tool_call>")
        call = r.choices[0].message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Rome"})
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(messages=[WEATHER_Q], tool_choice={"type": "function", "function": {
            "name": "nope"}}, **base)  # fmt: skip


def test_logprobs_n_seed_stop_and_thinking_off(client, server):
    r = client.chat.completions.create(model="tiny", messages=HELLO[:1], temperature=0, max_tokens=40,
                                       logprobs=True, top_logprobs=3)  # fmt: skip
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens and all(len(e.top_logprobs) == 3 for e in lp)
    assert all(e.logprob <= 0 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in lp)
    assert all(e.token == e.top_logprobs[0].token for e in lp)  # greedy picks the most likely token
    sampled = {"model": "tiny", "messages": HELLO[:1], "temperature": 1.5, "top_p": 0.9, "max_tokens": 12, "n": 3, "seed": 7,
                   "extra_body": {"top_k": 20}}  # fmt: skip
    a, b = client.chat.completions.create(**sampled), client.chat.completions.create(**sampled)
    texts = [c.message.content or c.message.reasoning_content or "" for c in a.choices]
    assert len(a.choices) == 3 and texts == [c.message.content or c.message.reasoning_content or "" for c in b.choices]
    chunks = client.chat.completions.create(model="tiny", messages=HELLO[:1], temperature=0, max_tokens=60, n=2,
                                            stream=True)  # fmt: skip
    per_choice = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            per_choice[ch.index] += ch.delta.content or ""
    assert per_choice == {0: "Hello! How can I help you?", 1: "Hello! How can I help you?"}
    stopped = client.chat.completions.create(model="tiny", messages=HELLO[:1], temperature=0, max_tokens=40,
                                             stop=["help"])  # fmt: skip
    assert stopped.choices[0].message.content == "Hello! How can I" and stopped.choices[0].finish_reason == "stop"
    short = client.chat.completions.create(model="tiny", messages=HELLO[:1], temperature=0, max_completion_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    off = client.chat.completions.create(model="tiny", messages=HELLO[:1], temperature=0, max_tokens=2, extra_body={
        "chat_template_kwargs": {"enable_thinking": False}, "return_token_ids": True})  # fmt: skip
    prompt = server.engine.tokenizer.decode(off.model_extra["prompt_token_ids"])
    assert prompt.endswith("hello/nothink<|assistant|>\n<think></think>")  # GLM-4.5's thinking-off prompt


def test_completions_tokens_in_and_out(client, ckpt):
    ids = Tokenizer.load(ckpt).encode("the quick brown")
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0, logprobs=2,
                                  extra_body={"return_token_ids": True})  # fmt: skip
    choice = r.choices[0]
    assert choice.model_extra["prompt_token_ids"] == ids and len(choice.model_extra["token_ids"]) == 6
    assert len(choice.logprobs.tokens) == 6 and len(choice.logprobs.top_logprobs[0]) == 2
    streamed = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text
    two = client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=2, n=2, temperature=0)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]


MALFORMED = [  # (body, status, param)
    ("{not json", 400, None),
    ('{"model": "tiny", "messages": "hi"}', 422, "messages"),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "a"}], "temperature": "hot"}', 422, "temperature"),
    ('{"model": "nope", "messages": [{"role": "user", "content": "a"}]}', 404, "model"),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "a"}], "n": 0}', 422, "n"),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "a"}], "max_tokens": 100000}', 400, "max_tokens"),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "a"}], "max_token": 5}', 422, "max_token"),
    ('{"model": "tiny", "messages": [{"role": "wizard", "content": "a"}]}', 400, "messages"),
    ('{"model": "tiny", "messages": [{"role": "user", "content": "' + "a " * 1500 + '"}]}', 400, "messages"),
    # the fixture model is dense: no MoE layer to report (routing replay, docs/serve.md)
    ('{"model": "tiny", "messages": [{"role": "user", "content": "a"}], "return_routed_experts": true}', 400,
     "return_routed_experts"),
]


@pytest.mark.parametrize("body,status,param", MALFORMED)
def test_malformed_requests_get_openai_errors(server, body, status, param):
    code, payload = _post(server, "/v1/chat/completions", body)
    assert code == status and set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["param"] == param and payload["error"]["message"]


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with urllib.request.urlopen(server.url + "/health") as r:
        assert json.loads(r.read()) == {"status": "ok"}
    with urllib.request.urlopen(server.url + "/metrics") as r:
        text = r.read().decode()
    for name in ("num_requests_waiting", "num_requests_running", "generation_tokens_per_second",
                 "time_to_first_token_seconds_count", "generation_tokens_total"):  # fmt: skip
        assert f"glmstack:{name} " in text


def test_disconnect_frees_slot_and_queue_bound(ckpt):
    """A client that leaves mid-stream is dropped from the batch; a full queue answers 429."""
    srv = RunningServer(ckpt, max_running=1, max_waiting=1)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        for _ in range(3):  # on a busy machine the 900-token stream may finish before the filler arrives: retry
            stream = client.chat.completions.create(model="tiny", messages=HELLO[:1], max_tokens=900,
                                                    temperature=1.0, stream=True, extra_body={"ignore_eos": True})  # fmt: skip
            next(iter(stream))
            filler = threading.Thread(target=lambda: client.completions.create(
                model="tiny", prompt="a", max_tokens=900, extra_body={"ignore_eos": True}))  # fmt: skip
            filler.start()  # waits in the queue behind the running stream
            deadline = time.monotonic() + 30
            while not srv.sched.waiting and srv.sched.running and time.monotonic() < deadline:
                time.sleep(0.02)
            if srv.sched.waiting:
                break
            stream.close()
            filler.join(timeout=60)
        assert srv.sched.waiting, "the running stream finished before the second request was queued, 3 times"
        with pytest.raises(openai.RateLimitError, match="queue is full"):
            client.completions.create(model="tiny", prompt="a", max_tokens=2)
        stream.close()  # disconnect: the running job is cancelled, the queued one gets the slot
        while srv.sched.stats["aborted"] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert srv.sched.stats["aborted"] >= 1
        while srv.sched.waiting and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not srv.sched.waiting  # the queued request is running now
        # cut the filler short: a time limit of 0 aborts it at the next step
        for job in srv.sched.running:
            job.deadline = 0.0
        filler.join(timeout=30)
        assert not filler.is_alive()
    finally:
        srv.stop()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (make install)")
def test_web_chat_page_in_headless_chromium(server):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_function("document.getElementById('model').textContent.includes('tiny')")
            page.fill("#temperature", "0")
            page.fill("#input", "hello")
            page.press("#input", "Enter")
            page.wait_for_function("document.getElementById('status').textContent === 'done'", timeout=60_000)
            assert page.inner_text(".assistant .content") == "Hello! How can I help you?"
            thinking = page.locator(".assistant details.thinking").first
            assert thinking.is_visible() and thinking.get_attribute("open") is None  # shown, collapsed
            assert page.locator(".assistant .reasoning").first.text_content() == "The user greets me."
            # a tool call, shown as name(arguments)
            page.click("#reset")
            page.click("text=tools (OpenAI JSON list, optional)")
            page.fill("#tools", json.dumps(TOOLS))
            page.fill("#input", WEATHER_Q["content"])
            page.press("#input", "Enter")
            page.wait_for_function("document.getElementById('status').textContent === 'done'", timeout=60_000)
            calls = page.locator(".tool-call").all_inner_texts()
            assert calls == ['tool call: get_weather({"city": "Paris", "days": 2})',
                             'tool call: get_weather({"city": "Lyon", "days": 3})']  # fmt: skip
        finally:
            browser.close()


def test_quantized_int4_server_answers(ckpt):
    """--quantize int4 (glmstack.inference.quant) serves through the same scheduler: the trained answer survives."""
    srv = RunningServer(ckpt, quantize="int4")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(model="tiny", messages=HELLO[:1], temperature=0, max_tokens=60)
        assert r.choices[0].message.content == "Hello! How can I help you?"
    finally:
        srv.stop()
