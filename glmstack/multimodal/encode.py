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
`{"type": "video", "video": [frame, frame, ...] | folder | animated GIF/WebP/PNG | data URL}` and vLLM's
`{"type": "video_url", "video_url": {"url": "data:video/jpeg;base64,<frame>,<frame>,..."}}` (glmstack.multimodal.video;
frames given as frames are taken at 2 fps, or `fps`).

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
from glmstack.model.vision.mrope import VisionInputError
from glmstack.model.vision.placeholders import expand_runs
from glmstack.multimodal.images import ImageError, load_image
from glmstack.multimodal.processor import Media
from glmstack.multimodal.video import load_clip

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
    """ "image" / "video" for a vision content part, else None (the template's test: `item.type == 'image' or
    'image' in item`, plus OpenAI's image_url parts)."""
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    if kind in ("video", "video_url") or (kind is None and ("video" in item or "video_url" in item)):
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


def video_source(item: Mapping):
    """The video of a part: `video` (frames, a folder, a file, a data URL) or vLLM's `video_url` ({"url": ...})."""
    if item.get("video") is not None:
        return item["video"]
    url = item.get("video_url")
    return url.get("url") if isinstance(url, Mapping) else url


def split_media(messages) -> tuple[list[dict], list, list]:
    """(messages whose vision parts are placeholder text parts, image sources, video sources), in prompt order."""
    images, videos, out = [], [], []
    kinds = {"image": (image_source, images, IMAGE_PLACEHOLDER, "an image"),
             "video": (video_source, videos, VIDEO_PLACEHOLDER, "a video")}  # fmt: skip
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
            if kind is None:
                parts.append(p)
                continue
            source, found, placeholder, what = kinds[kind]
            if (src := source(p)) is None:
                raise ImageError(f"message {i} part {j}: {what} part without {what}")
            found.append(src)
            parts.append({"type": "text", "text": placeholder})
        out.append({**m, "content": parts})
    return out, images, videos


def expand(segments: list[Segment], media: Media, processor) -> list[Segment]:
    """Each `<|image|>` / `<|video|>` placeholder replaced by its visual tokens, left to right in one pass
    (glmstack.model.vision.placeholders.expand_runs on the text split at the placeholders)."""
    pieces = [_PLACEHOLDER.split(s.text) for s in segments]  # per segment: text, token, text, ..., text
    stamps = [[[str(int(ts))] for ts in video] for video in media.video_timestamps]
    marks = (IMAGE_TOKEN, VIDEO_TOKEN, "<|begin_of_image|>", "<|end_of_image|>")
    try:
        runs = iter(expand_runs([p for ps in pieces for p in ps], marks, processor.merge_size, media.image_grid_thw,
                                media.video_grid_thw, stamps))  # fmt: skip
    except VisionInputError as e:
        raise ImageError(str(e)) from None
    return [Segment("".join("".join(next(runs)) for _ in ps), s.trained) for s, ps in zip(segments, pieces)]


def encode_multimodal(tokenizer, processor, messages, tools=None, style="glm-4.5", enable_thinking=True,
                      clear_thinking=True, add_generation_prompt=False, close_last_turn=True,
                      fps: float | None = None) -> Encoded:  # fmt: skip
    """(ids, loss mask, pixels) of a conversation with images / videos (see the module docstring)."""
    plain, images, videos = split_media(messages)
    images = [load_image(src, what=f"image {k}") for k, src in enumerate(images)]
    videos = [load_clip(v, what=f"video {k}", **({"fps": fps} if fps else {})) for k, v in enumerate(videos)]
    media = processor(images, videos)
    segments = encode_segments(plain, tools, style, enable_thinking, clear_thinking, add_generation_prompt,
                               close_last_turn)  # fmt: skip
    ids, mask = tokenize_segments(tokenizer, expand(segments, media, processor))
    return Encoded(ids, mask, media)
