"""GLM-5's three thinking modes, as conversations laid out for the official templates' two switches.

What the GLM-5 report (arXiv 2602.15763; research/wave3-facts.md §6) names, and how the templates express it:
  interleaved  the model thinks before every response and every tool call. The templates keep the reasoning of
               the assistant turns after the last user message (the current tool loop) and drop it from earlier
               turns: `clear_thinking` true, the GLM-4.7/5 template's default (the only behaviour of GLM-4.5/4.6's).
  preserved    earlier turns keep their reasoning: `clear_thinking=False` (GLM-4.7/5 only; the GLM-4.6 template has
               no such switch). Each turn's prompt is then the previous prompt + the model's completion + the new
               messages, token for token: a coding agent keeps its thinking, and token-in-token-out RL and the
               server's prefix cache see one growing sequence (verl#6854: cleared thinking breaks that).
  turn         thinking is switched per request by `enable_thinking`. GLM-4.7/5 pre-fill `<think>` (on) or `</think>`
               (off) in the generation prompt; GLM-4.5/4.6 write nothing when on, and when off append `/nothink` to
               every user turn and pre-fill `\\n<think></think>`. Neither template has a per-message switch: in the
               history a turn without reasoning is rendered the same either way.
That is all the templates support (two kwargs); these modes are layouts over them, never a third template.

SFT examples per mode (`examples(messages, mode, style)`; glmstack.chat.encode gives each its ids and mask):
  interleaved  one example per user turn: the conversation up to the next user message, the earlier turns as
               context (`train: False`; their reasoning is cleared, as at inference). Trained: the turn's assistant
               messages — reasoning and `</think>`, content, tool calls, the token ending each message.
  preserved    one example for the whole conversation, rendered with `clear_thinking=False`: every assistant
               message trained, reasoning included. A later turn sees the earlier reasoning as context, which is
               exactly its inference-time prompt, so one pass trains every turn in its own context.
  turn         as interleaved, each example with `enable_thinking` = whether its turn thinks (an assistant message
               of it carries reasoning): a thinking turn is trained as above; in a non-thinking turn the empty
               think block is the generation prompt's pre-fill (context) and content + calls are trained.
A conversation in one user turn gives the same single example in all three modes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from glmstack.chat.encode import encode
from glmstack.chat.render import get_style, reasoning_and_content
from glmstack.chat.schema import check_messages, trains

MODES = ("interleaved", "preserved", "turn")


@dataclass(frozen=True)
class Example:
    """One training sequence: messages (context turns marked `train: False`) and the template switches."""

    messages: list[dict]
    enable_thinking: bool = True
    clear_thinking: bool = True

    def options(self) -> dict:
        return {"enable_thinking": self.enable_thinking, "clear_thinking": self.clear_thinking}


def check_mode(mode: str, style: str) -> None:
    """ValueError for an unknown mode or style, or preserved thinking in a template without `clear_thinking`."""
    st = get_style(style)
    if mode not in MODES:
        raise ValueError(f"unknown thinking mode {mode!r} (expected one of {', '.join(MODES)})")
    if mode == "preserved" and not st.has_clear_thinking:
        raise ValueError(f"preserved thinking needs the glm-4.7 template (clear_thinking); {style}'s has none")


def template_kwargs(mode: str, enable_thinking: bool = True) -> dict:
    """The official templates' kwargs (a request's `chat_template_kwargs`) for a prompt in `mode`."""
    return {"enable_thinking": enable_thinking, "clear_thinking": mode != "preserved"}


def thinks(messages) -> bool:
    """Whether an assistant message among `messages` carries reasoning (what makes a turn a thinking turn)."""
    return any(m.get("role") == "assistant" and reasoning_and_content(m)[0].strip() for m in messages)


def user_turns(messages) -> list[tuple[int, int]]:
    """[start, end) of each user turn: a user message, the system messages right before it, and what follows up to
    the next turn; the first turn starts at the conversation's start."""
    cuts = []
    for i in [i for i, m in enumerate(messages) if m.get("role") == "user"][1:]:
        while messages[i - 1].get("role") == "system":  # stops at the first turn's user message at the latest
            i -= 1
        cuts.append(i)
    return list(zip([0, *cuts], [*cuts, len(messages)]))


def examples(messages, mode: str, style: str, enable_thinking: bool = True) -> list[Example]:
    """The SFT examples of one conversation in `mode` (module docstring); turns with nothing to train are skipped.
    `enable_thinking` is the conversation's switch in interleaved and preserved mode; turn mode reads it per turn."""
    check_mode(mode, style)
    messages = list(check_messages(messages))
    if mode == "preserved":
        return [Example(messages, enable_thinking, clear_thinking=False)]
    out = []
    for start, end in user_turns(messages):
        turn = messages[start:end]
        if not any(m["role"] == "assistant" and trains(m) for m in turn):
            continue
        history = [_context(m) for m in messages[:start]]
        out.append(Example(history + turn, thinks(turn) if mode == "turn" else enable_thinking))
    return out


def encode_mode(tokenizer, messages, tools=None, style="glm-4.7", mode="interleaved",
                enable_thinking=True) -> list[tuple[list[int], list[int]]]:  # fmt: skip
    """(ids, loss_mask) of each example of the conversation in `mode`."""
    return [encode(tokenizer, ex.messages, tools, style, **ex.options())
            for ex in examples(messages, mode, style, enable_thinking)]  # fmt: skip


def _context(m: Mapping) -> Mapping:
    """An earlier turn's message as context: assistant messages out of the loss."""
    return {**m, "train": False} if m.get("role") == "assistant" else m
