"""Conversations with images and short videos -> token ids, loss mask and pixels, in GLM's chat format.

What: `encode_multimodal(tokenizer, processor, messages, ...) -> Encoded(ids, loss_mask, media)`. An image part of a
user turn renders as the GLM-4.1V / GLM-4.5V templates' `<|begin_of_image|><|image|><|end_of_image|>` at its place
in the content, and its single `<|image|>` becomes one `<|image|>` per visual token: grid_t·grid_h·grid_w /
merge_size² (what the adapter outputs for it). A video renders as `<|begin_of_video|><|video|><|end_of_video|>` and
its `<|video|>` becomes, per temporal patch, `<|begin_of_image|>` + its `<|image|>` tokens + `<|end_of_image|>` +
the patch's timestamp in whole seconds, as transformers' Glm4vProcessor writes it
(tests/multimodal/test_encode.py compares the ids with Glm4vProcessor's).

Why here and not in the chat renderer: the text templates (GLM-4.5/4.6/4.7) drop image parts, and
glmstack.chat.render equals them exactly; so the vision parts are turned into text parts holding the placeholder
first, and the same renderer (segments that know whether they are trained) does the rest. Placeholders sit inside
user turns, which are context, so the loss mask never trains an image token (flags only change at special tokens,
so the expansion cannot move a mask boundary).

Accepted parts: `{"type": "image", "image": <path | bytes | data URL | PIL image>}` (also `"url"` / `"path"`
keys), OpenAI's `{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`, and
`{"type": "video", "video": [frame, frame, ...]}`.

    enc = encode_multimodal(tok, VisionProcessor(), [{"role": "user", "content": [
        {"type": "image", "image": "cat.png"}, {"type": "text", "text": "What colour is the cat?"}]}],
        add_generation_prompt=True)
    enc.ids, enc.loss_mask, enc.media.model_inputs()      # -> pixel_values, image_grid_thw
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from glmstack.chat.encode import encode_segments, tokenize_segments
from glmstack.chat.render import Segment
from glmstack.multimodal.images import ImageError, load_image, load_video
from glmstack.multimodal.processor import Media

IMAGE_PLACEHOLDER = "<|begin_of_image|><|image|><|end_of_image|>"
VIDEO_PLACEHOLDER = "<|begin_of_video|><|video|><|end_of_video|>"
IMAGE_TOKEN, VIDEO_TOKEN = "<|image|>", "<|video|>"
_PLACEHOLDER = re.compile(r"(<\|image\|>|<\|video\|>)")


@dataclass
class Encoded:
    ids: list[int]
    loss_mask: list[int]
    media: Media


def media_kind(item) -> str | None:
    """"image" / "video" for a vision content part, else None (the template's test: `item.type == 'image' or
    'image' in item`, plus OpenAI's image_url parts)."""
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    if kind == "video" or (kind is None and "video" in item):
        return "video"
    if kind in ("image", "image_url") or (kind is None and ("image" in item or "image_url" in item)):
        return "image"
    return None


def image_source(item: Mapping):
    """The image of a part: `image`, `url`, `path`, or OpenAI's `image_url` (a string or {"url": ...})."""
    for key in ("image", "url", "path"):
        if item.get(key) is not None:
            return item[key]
    url = item.get("image_url")
    return url.get("url") if isinstance(url, Mapping) else url


def split_media(messages) -> tuple[list[dict], list, list]:
    """(messages whose vision parts are placeholder text parts, image sources, video frame lists), in prompt order."""
    images, videos, out = [], [], []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, (list, tuple)) or not any(media_kind(p) for p in content):
            out.append(m)
            continue
        if m.get("role") != "user":
            raise ImageError(f"message {i}: images and videos are allowed in user turns only (role {m.get('role')!r})")
        parts = []
        for j, p in enumerate(content):
            kind = media_kind(p)
            if kind == "image":
                src = image_source(p)
                if src is None:
                    raise ImageError(f"message {i} part {j}: an image part without an image")
                images.append(src)
                parts.append({"type": "text", "text": IMAGE_PLACEHOLDER})
            elif kind == "video":
                videos.append(p.get("video"))
                parts.append({"type": "text", "text": VIDEO_PLACEHOLDER})
            else:
                parts.append(p)
        out.append({**m, "content": parts})
    return out, images, videos


def expand(segments: list[Segment], media: Media, processor) -> list[Segment]:
    """Each `<|image|>` / `<|video|>` placeholder replaced by its visual tokens, left to right in one pass (a
    video's expansion holds `<|image|>` tokens that must not be expanded again)."""
    todo = {IMAGE_TOKEN: [IMAGE_TOKEN * processor.image_tokens(g) for g in media.image_grid_thw],
            VIDEO_TOKEN: [_video_tokens(processor, g, ts) for g, ts in zip(media.video_grid_thw,
                                                                         media.video_timestamps)]}  # fmt: skip
    out = []
    for s in segments:
        pieces = _PLACEHOLDER.split(s.text)  # text, token, text, token, ..., text
        for k in range(1, len(pieces), 2):
            if not todo[pieces[k]]:
                kind = "image" if pieces[k] == IMAGE_TOKEN else "video"
                raise ImageError(f"the prompt has more {pieces[k]} placeholders than {kind}s given")
            pieces[k] = todo[pieces[k]].pop(0)
        out.append(Segment("".join(pieces), s.trained))
    if todo[IMAGE_TOKEN] or todo[VIDEO_TOKEN]:
        raise ImageError(f"{len(todo[IMAGE_TOKEN])} image(s) and {len(todo[VIDEO_TOKEN])} video(s) have no "
                         "placeholder in the prompt")  # fmt: skip
    return out


def _video_tokens(processor, grid_thw, timestamps) -> str:
    t, h, w = (int(x) for x in grid_thw)
    per_frame = IMAGE_TOKEN * processor.image_tokens((1, h, w))
    return "".join(f"<|begin_of_image|>{per_frame}<|end_of_image|>{int(ts)}" for ts in timestamps[:t])


def encode_multimodal(tokenizer, processor, messages, tools=None, style="glm-4.5", enable_thinking=True,
                      clear_thinking=True, add_generation_prompt=False, close_last_turn=True,
                      fps: float | None = None) -> Encoded:  # fmt: skip
    """(ids, loss mask, pixels) of a conversation with images / videos (see the module docstring)."""
    plain, images, videos = split_media(messages)
    images = [load_image(src, what=f"image {k}") for k, src in enumerate(images)]
    videos = [load_video(v, what=f"video {k}") for k, v in enumerate(videos)]
    media = processor(images, videos, **({"fps": fps} if fps else {}))
    segments = encode_segments(plain, tools, style, enable_thinking, clear_thinking, add_generation_prompt,
                               close_last_turn)  # fmt: skip
    ids, mask = tokenize_segments(tokenizer, expand(segments, media, processor))
    return Encoded(ids, mask, media)
