"""Token ids and loss mask of a conversation in GLM's chat format (the SFT/RL input).

What: `encode(tokenizer, messages, tools, style, ...) -> (ids, loss_mask)`; `loss_mask[t]` is 1 where token t is
something the model generates (see glmstack.chat.render for which) and 0 for context.

How: the render's segments are merged into runs of equal `trained` flag and each run is encoded on its own, so
the mask aligns to token boundaries by construction. Every flag change happens at a special token (a role token,
`<think>`, `</think>`, `<|endoftext|>`), and special tokens are split points for the BPE, so the ids equal
`tokenizer.encode(render(...))` exactly (tests/unit/test_chat_encode.py checks it).

A conversation ending in an assistant turn gets a trained `<|endoftext|>` after it (`close_last_turn`), as
PrimeIntellect's GLM-5 renderer does, so the model learns to stop there too.
"""

from __future__ import annotations

from glmstack.chat.render import Segment, render_segments
from glmstack.chat.schema import trains

END_OF_TEXT = "<|endoftext|>"


def encode(tokenizer, messages, tools=None, style="glm-4.5", enable_thinking=True, clear_thinking=True,
           add_generation_prompt=False, close_last_turn=True) -> tuple[list[int], list[int]]:  # fmt: skip
    """(ids, loss_mask) with `len(ids) == len(loss_mask)`; mask values are 0/1 ints."""
    segments = encode_segments(messages, tools, style, enable_thinking, clear_thinking, add_generation_prompt,
                               close_last_turn)  # fmt: skip
    return tokenize_segments(tokenizer, segments)


def tokenize_segments(tokenizer, segments: list[Segment]) -> tuple[list[int], list[int]]:
    """(ids, loss_mask) of rendered segments: runs of equal flag encoded on their own (glmstack.multimodal expands
    image placeholders in the segments first, then comes here)."""
    runs = _merge(segments)
    texts = [r.text for r in runs]
    pieces = tokenizer.encode_batch(texts) if hasattr(tokenizer, "encode_batch") else map(tokenizer.encode, texts)
    ids: list[int] = []
    mask: list[int] = []
    for run, piece in zip(runs, pieces):
        ids += piece
        mask += [int(run.trained)] * len(piece)
    return ids, mask


def encode_segments(messages, tools=None, style="glm-4.5", enable_thinking=True, clear_thinking=True,
                    add_generation_prompt=False, close_last_turn=True) -> list[Segment]:  # fmt: skip
    """The render's segments plus the closing `<|endoftext|>` when the conversation ends in an assistant turn."""
    segments = render_segments(messages, tools, style, enable_thinking, clear_thinking, add_generation_prompt)
    last = messages[-1] if messages else None
    if close_last_turn and not add_generation_prompt and last is not None and last.get("role") == "assistant":
        segments.append(Segment(END_OF_TEXT, trained=trains(last)))
    return segments


def _merge(segments: list[Segment]) -> list[Segment]:
    """Adjacent segments with the same flag become one, so the BPE sees the same spans as on the whole text."""
    runs: list[Segment] = []
    for s in segments:
        if runs and runs[-1].trained == s.trained:
            runs[-1] = Segment(runs[-1].text + s.text, s.trained)
        else:
            runs.append(s)
    return runs
