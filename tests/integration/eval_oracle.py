"""A tiny OpenAI-compatible test server for the eval harness: it answers each known request with the item's
oracle output (canonical solution, ground-truth calls, answer) or, with wrong=True, a wrong one.

It speaks the protocol the `openai` client uses (GET /v1/models, POST /v1/completions, POST
/v1/chat/completions with `tools`), on 127.0.0.1 in a thread, from the standard library only. `glm_text=True`
returns tool calls as GLM's raw `<tool_call>` text in `content` (what an engine without a tool parser sends),
so the harness's own parser (glmstack.chat.parse) decodes them. `fail_after=N` answers 500 from request N on.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from glmstack.chat import render


def tiny_checkpoint(folder, context: int = 2048):
    """A random tiny GLM with a BPE tokenizer trained on HumanEval (GLM-4.5 chat template), saved to `folder`;
    returns (folder, tokenizer, the HumanEval texts)."""
    import torch

    from glmstack.model import GLM, ModelConfig, save_hf
    from glmstack.sandbox.humaneval import load_problems
    from glmstack.tokenizer import Tokenizer

    texts = [p["prompt"] + p["canonical_solution"] for p in load_problems().values()]
    tok = Tokenizer.train(iter(texts * 2), vocab_size=600)
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=context)
    save_hf(GLM(cfg).init_weights(seed=0), folder)
    tok.save(folder, chat_style="glm-4.5")
    return folder, tok, texts


def request_key(body: dict) -> str:
    return json.dumps([body.get("prompt"), body.get("messages"), body.get("tools")], sort_keys=True)


def item_key(item) -> str:
    r = item.request
    if r["kind"] == "completion":
        return request_key({"prompt": r["prompt"]})
    return request_key({"messages": r["messages"], "tools": r.get("tools") or None})


def wrong_output(oracle: dict, tools) -> dict:
    if oracle["tool_calls"]:
        return {"text": "I cannot help with that.", "tool_calls": []}
    if tools:
        return {"text": "", "tool_calls": [{"name": tools[0]["function"]["name"], "arguments": {}}]}
    return {"text": "))\n", "tool_calls": []}  # a syntax error in code, no number for math


def glm_call_text(calls: list[dict], tools) -> str:
    """The assistant turn GLM's template writes for these calls (glm-4.5 style), from the generation prompt on."""
    msgs = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls
            ],
        },
    ]
    return render(msgs, tools, style="glm-4.5").rsplit("<|assistant|>", 1)[1]


class OracleServer:
    def __init__(self, items, wrong: bool = False, glm_text: bool = False, fail_after: int | None = None):
        self.table: dict[str, dict] = {}
        for it in items:  # BFCL asks a few identical requests in two categories with opposite answers: first wins
            self.table.setdefault(item_key(it), it.oracle)
        self.wrong, self.glm_text, self.fail_after = wrong, glm_text, fail_after
        self.count, self._counter, self.unknown = 0, itertools.count(), 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, body: dict) -> dict:
        oracle = self.table.get(request_key(body))
        if oracle is None:
            self.unknown += 1
            oracle = {"text": "", "tool_calls": []}
        return wrong_output(oracle, body.get("tools")) if self.wrong else oracle

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, payload: dict):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(
                    200,
                    {"object": "list", "data": [{"id": "oracle", "object": "model", "created": 0, "owned_by": "test"}]},
                )

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = next(server._counter)
                server.count = n + 1
                if server.fail_after is not None and n >= server.fail_after:
                    return self._send(500, {"error": {"message": "oracle server: failing on purpose"}})
                out = server.answer(body)
                base = {"id": f"x{n}", "created": 0, "model": body.get("model", "oracle")}
                if self.path.endswith("/completions") and "chat" not in self.path:
                    choice = {"index": 0, "text": out["text"], "finish_reason": "stop", "logprobs": None}
                    return self._send(200, {**base, "object": "text_completion", "choices": [choice]})
                msg = {"role": "assistant", "content": out["text"] or None}
                if out["tool_calls"] and server.glm_text:
                    msg["content"] = glm_call_text(out["tool_calls"], body.get("tools"))
                elif out["tool_calls"]:
                    msg["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {
                        "name": c["name"], "arguments": json.dumps(c["arguments"])}}
                        for i, c in enumerate(out["tool_calls"])]  # fmt: skip
                finish = "tool_calls" if msg.get("tool_calls") else "stop"
                choice = {"index": 0, "message": msg, "finish_reason": finish}
                self._send(200, {**base, "object": "chat.completion", "choices": [choice]})

        return Handler
