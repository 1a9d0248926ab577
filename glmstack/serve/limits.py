"""What one request may ask of the server, checked before any work is done for it (issue 34).

Why: every cost the server pays before it refuses a request is a cost an attacker gets for free. An 8 MB prompt
read, rendered and tokenised on the event loop blocked `/health` for 16 s before its 400; a multi-prompt request
whose last prompt was too long left 239 jobs queued; stop strings are scanned at every token; images are decoded
one by one with no bound on their number. So each limit is checked at the cheapest point that can see it:

    body bytes         the security middleware, before the body is read further (413)      security.py
    prompt characters  before rendering / tokenising (400), which then run in a thread      app.py
    stop strings       count and length, when the request is parsed (400)                  protocol.py
    images / frames    count before decoding, frames and pixels while decoding (400)       multimodal/serving.py

    limits = Limits(max_body_bytes=4 * 2**20)       # glmstack serve --max-body-mb 4
"""

from __future__ import annotations

from dataclasses import dataclass

from glmstack.serve.protocol import ApiError


@dataclass(kw_only=True, frozen=True)
class Limits:
    max_body_bytes: int = 4 * 2**20  # a request body; larger ones get 413 before they are read (--max-body-mb)
    # characters of prompt text (a chat's message contents, a completion's prompts) per request, before any
    # tokenising; None: 16 per token of context (a token of real text is 3-5 characters, so no prompt that fits
    # the context is refused)
    max_prompt_chars: int | None = None
    max_images: int = 16  # image parts per request (each is also bounded alone: multimodal/images.py)
    max_videos: int = 4  # video parts per request
    max_frames: int = 128  # video frames per request, all videos together, after sampling
    max_pixels: int = 128 * 2**20  # decoded pixels per request, images and frames together
    score_chunk_elems: int = 2**22  # echo + logprobs: logits formed at once (positions x vocabulary), 16 MB fp32
    max_loras: int = 8  # LoRA adapters held at once (--max-loras): /v1/load_lora_adapter refuses more

    def prompt_chars(self, context: int) -> int:
        return self.max_prompt_chars if self.max_prompt_chars is not None else 16 * context


def check_prompt_chars(n_chars: int, limit: int, param: str) -> None:
    if n_chars > limit:
        raise ApiError(400, f"{param}: {n_chars} characters of prompt text; this server takes at most {limit} per "
                       "request (glmstack serve --max-prompt-chars)", param)  # fmt: skip


def message_chars(messages: list) -> int:
    """Characters of text a chat request's messages (or tools) hold: contents, reasoning, tool-call arguments, keys
    and values of schemas; roughly what rendering them adds to the template's own text, counted without rendering."""
    total = 0
    stack = list(messages)
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            total += len(x)
        elif isinstance(x, dict):
            total += sum(len(k) for k in x if isinstance(k, str))
            stack.extend(v for k, v in x.items() if k not in ("image_url", "image", "video_url", "video"))
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def prompt_chars(prompt) -> int:
    """Characters (text prompts) or tokens (token-id prompts) of a /v1/completions prompt field."""
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) if isinstance(p, (str, list)) else 1 for p in prompt)
