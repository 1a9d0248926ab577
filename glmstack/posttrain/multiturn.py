"""Multi-turn rollouts in GLM's chat format: generate, parse, run the tool calls, generate again.

What: `rollout(engine, items, style, ...) -> [Conversation]` for items {"messages", "tools", "enable_thinking"}. Each
round renders every unfinished conversation with the generation prompt, generates the batch with the inference
engine, parses each completion (glmstack.chat.parse) into an assistant message and, when it calls tools, runs them
(glmstack.posttrain.tools: the python tool in the sandbox) and appends the results; a trajectory ends at an
answer without tool calls, at a truncated completion, or after `max_rounds` assistant turns.

`turn_checks(text, finish, message, thinking)` is the format check shared by evaluation and rejection sampling:
well formed = ended by a stop token, nothing left of the markup in reasoning or content; thinking obeyed = reasoning
present exactly when the switch is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glmstack.chat import parse, render
from glmstack.posttrain.tools import execute

MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>", "<|", "<tool_response>")


@dataclass
class Conversation:
    item: dict  # the prompt item
    messages: list[dict] = field(default_factory=list)  # new turns: assistant messages and tool results
    texts: list[str] = field(default_factory=list)  # raw completion of each assistant turn
    finish: list[str] = field(default_factory=list)  # "stop" | "length" per assistant turn

    @property
    def replies(self) -> list[dict]:
        return [m for m in self.messages if m["role"] == "assistant"]

    @property
    def tool_calls(self) -> list[dict]:
        return [c for m in self.replies for c in m.get("tool_calls") or []]

    @property
    def final(self) -> dict:
        return self.replies[-1] if self.replies else {"role": "assistant", "content": None}

    def conversation(self) -> dict:
        """The whole conversation as an SFT record (prompt + generated turns)."""
        it = self.item
        return {"messages": list(it["messages"]) + self.messages, "tools": it.get("tools"),
                "enable_thinking": it.get("enable_thinking", True)} | ({"meta": it["meta"]} if "meta" in it else {})  # fmt: skip


def turn_checks(text: str, finish: str, message: dict, thinking: bool) -> dict[str, bool]:
    reasoning, content = message.get("reasoning_content") or "", message.get("content") or ""
    well_formed = finish == "stop" and not any(t in reasoning or t in content for t in MARKUP)
    well_formed = well_formed and bool(content or message.get("tool_calls"))
    obeyed = bool(reasoning.strip()) if thinking else (not reasoning and "<think>" not in text)
    return {"well_formed": well_formed, "thinking_obeyed": obeyed}


def rollout(engine, items: list[dict], style: str, *, max_new_tokens: int = 128, max_rounds: int = 3,
            temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 32) -> list[Conversation]:  # fmt: skip
    trajs = [Conversation(item) for item in items]
    live = list(range(len(trajs)))
    for round_ in range(max_rounds):
        live = [i for i in live if _fits(engine, _prompt(trajs[i], style))]  # a full context ends the conversation
        if not live:
            break
        prompts = [_prompt(trajs[i], style) for i in live]
        texts, finishes = [], []
        for s in range(0, len(prompts), batch_size):
            res = engine.generate(prompts[s : s + batch_size], max_new_tokens=max_new_tokens, temperature=temperature,
                                  top_p=top_p, seeds=[seed + 1000 * round_ + live[s + j] for j in
                                                      range(len(prompts[s : s + batch_size]))])  # fmt: skip
            texts += res.text
            finishes += res.finish_reason
        nxt = []
        for i, text, finish in zip(live, texts, finishes):
            t = trajs[i]
            thinking = t.item.get("enable_thinking", True)
            msg = parse(text, t.item.get("tools"), style=style, in_reasoning=_in_reasoning(style, thinking))
            calls = msg.pop("tool_calls")
            if calls:
                msg["tool_calls"] = calls
            t.messages.append(msg)
            t.texts.append(text)
            t.finish.append(finish)
            if calls and finish == "stop":
                for c in calls:
                    t.messages.append({"role": "tool", "content": execute(c["function"]["name"],
                                                                          c["function"]["arguments"])})  # fmt: skip
                nxt.append(i)
        live = nxt
    return trajs


def _fits(engine, prompt: str) -> bool:
    """Room to generate after `prompt` (a long tool result can fill a small model's context: that conversation
    ends there and is scored as it stands, instead of failing the whole batch)."""
    return len(engine.tokenizer.encode(prompt)) < engine.cfg.max_position_embeddings


def _prompt(t: Conversation, style: str) -> str:
    it = t.item
    return render(list(it["messages"]) + t.messages, it.get("tools"), style=style,
                  enable_thinking=it.get("enable_thinking", True), add_generation_prompt=True)  # fmt: skip


def _in_reasoning(style: str, thinking: bool) -> bool:
    """A 4.7-style prompt pre-fills `<think>` only when thinking is on; a 4.5-style model writes it itself."""
    return style == "glm-4.7" and thinking
