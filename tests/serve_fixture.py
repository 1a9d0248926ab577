"""A tiny GLM trained (in seconds) to answer two conversations, and a uvicorn server around it, for the serve tests.

A random model never writes `<think>` or `<tool_call>`, so to see reasoning and tool calls come back through the
server the tests over-fit a tiny model on two conversations in GLM's chat format (glmstack.chat.encode's loss
mask): "hello" -> reasoning + an answer; a weather question with tools -> reasoning + two tool calls; "Rome?" ->
a call without reasoning (the shape a forced tool_choice pre-fills). Greedy
decoding then reproduces them. The tokenizer is trained on the same texts.
"""

from __future__ import annotations

import socket
import threading
import time

import torch

from glmstack.chat import encode, render
from glmstack.model import GLM, ModelConfig, save_hf
from glmstack.tokenizer import Tokenizer

STYLE = "glm-4.5"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}}]  # fmt: skip
HELLO = [{"role": "user", "content": "hello"},
         {"role": "assistant", "reasoning_content": "The user greets me.", "content": "Hello! How can I help you?"}]  # fmt: skip
WEATHER_Q = {"role": "user", "content": "Weather in Paris and Lyon?"}
WEATHER = [WEATHER_Q, {"role": "assistant", "reasoning_content": "I need the tool.", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon", "days": 3}}}]}]  # fmt: skip
ROME_Q = {"role": "user", "content": "Rome?"}  # answered without reasoning: what a forced tool_choice prompt ends in
ROME = [ROME_Q, {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]}]  # fmt: skip
CONVERSATIONS = [(HELLO, None), (WEATHER, TOOLS), (ROME, TOOLS)]


def build_checkpoint(folder, steps: int = 600, layers: int = 2, until_loss: float = 2e-3,
                     conversations=CONVERSATIONS, style: str = STYLE, clear_thinking: bool = True) -> str:  # fmt: skip
    """Train the tokenizer and over-fit the tiny model on `conversations` ((messages, tools) pairs, rendered in
    `style` with `clear_thinking`) until the loss is below `until_loss`, at most `steps` steps (a fixed count left
    one CPU model's run short of reproducing the tool calls); save both, the tokenizer with `style`'s template."""
    texts = [render(m, t, style=style, clear_thinking=clear_thinking) for m, t in conversations]
    tok = Tokenizer.train(texts * 20 + ["the quick brown fox jumps over the lazy dog. " * 20], vocab_size=400)
    # dense layers and no MTP: trains ~3x faster than the MoE preset; the server path is the same
    cfg = ModelConfig.preset(
        "tiny",
        num_hidden_layers=layers,
        first_k_dense_replace=layers,
        num_nextn_predict_layers=0,
        vocab_size=512,
        max_position_embeddings=1024,
    )
    model = GLM(cfg).init_weights(seed=0)
    rows = [encode(tok, m, t, style=style, clear_thinking=clear_thinking) for m, t in conversations]
    T = max(len(ids) for ids, _ in rows)
    ids_BT = torch.zeros(len(rows), T, dtype=torch.long)
    labels_BT = torch.full((len(rows), T), -100, dtype=torch.long)
    for b, (ids, mask) in enumerate(rows):
        ids_BT[b, : len(ids)] = torch.tensor(ids)
        targets = [t if m else -100 for t, m in zip(ids[1:], mask[1:])]
        labels_BT[b, : len(targets)] = torch.tensor(targets)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        loss = model(ids_BT, labels=labels_BT).loss
        if loss.item() < until_loss:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_hf(model.eval(), folder)
    tok.save(folder, chat_style=style)
    return str(folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningServer:
    """`glmstack serve`'s app on uvicorn in a thread (127.0.0.1, a free port); `.url`, `.stop()`."""

    def __init__(self, checkpoint: str, **options):
        import argparse

        import uvicorn

        from glmstack.serve.cli import build

        args = argparse.Namespace(checkpoint=checkpoint, speculative="none", draft=2, quantize=None, max_running=16,
                                  max_waiting=256, time_limit=600.0, dtype="float32", device="cpu", style="auto",
                                  served_model_name="tiny")  # fmt: skip
        for k, v in options.items():
            setattr(args, k, v)
        self.app, self.sched = build(args)
        self.engine = self.sched.engine
        self.sched.start()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sched.stop()


def rl_here_and_on_server(recipe: str, stage: str, base_dir, tmp_path, common: list[str], while_up=None,
                          served_as: str = "tiny", **server_options):  # fmt: skip
    """`glmstack rl <recipe>` twice: rollouts in process (out_dir tmp_path/local), then on a RunningServer of
    `base_dir` that takes the trainer's weight pushes (tmp_path/remote), the rollouts asking for model `served_as`.
    -> (metrics rows {"local", "remote"}, the server's weight version at the end, `while_up(server)`'s result, taken
    before the server stops)."""
    import json

    import httpx

    from glmstack.cli import main as glmstack

    pushes = tmp_path / "pushes"
    pushes.mkdir()
    server = RunningServer(str(base_dir), enable_weight_updates=True, weight_root=str(pushes), **server_options)
    try:
        assert glmstack(["rl", recipe, *common, "--set", f"out_dir={tmp_path / 'local'}"]) == 0
        assert glmstack(["rl", recipe, *common, "--set", f"out_dir={tmp_path / 'remote'}", "--set",
                         f"rl.rollout_server={server.url}", "--set", f"rl.server_model={served_as}", "--set",
                         f"rl.rollout_weights_dir={pushes}"]) == 0  # fmt: skip
        version = httpx.get(server.url + "/get_weight_version").json()["weight_version"]
        seen = while_up(server) if while_up else None
    finally:
        server.stop()
    rows = {k: [json.loads(x) for x in (tmp_path / k / "tiny" / stage / "metrics.jsonl").read_text().splitlines()]
            for k in ("local", "remote")}  # fmt: skip
    return rows, version, seen
