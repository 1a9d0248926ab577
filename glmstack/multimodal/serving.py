"""Vision-language checkpoints behind `glmstack chat --image/--video` and `glmstack serve`: loading, a streaming
decoder with raw log-probs, the server's continuous batch for them, and image / video content parts from requests.

What:
  `is_vl_checkpoint(folder)`      config.json says glm4v_moe / glm4v
  `VisionEngine.load(folder)`     tokenizer + GLMV (glmstack.model.vision.load_vl_hf) + image processor, with the
                                  attributes the server reads from a text Engine (tokenizer, cfg, model, device)
  `decode(engine, ids, media, params, seed, stop_ids, max_new_tokens)`  one sequence, token by token (the chat
                                  CLI): (id, raw log-prob, log-softmax row); the prefill runs the full multimodal
                                  forward, then each token sits at next_position + step in all three RoPE rows
                                  (GLMV.generate's rule)
  `VisionScheduler`               the server's Scheduler (serve/scheduler.py: continuous batching) with `VisionBatch`:
                                  a joining row's prefill is the multimodal forward with its own pixels and 3D
                                  positions; the batch keeps each row's next position apart from the cache length,
                                  so decoding after an image is the text model's batched 1D step
  `request_media(messages, proc)` OpenAI `image_url` parts (data URLs only) and vLLM's `video_url` parts (a data URL:
                                  data:video/jpeg;base64,<frame>,<frame>,... or an animated GIF / WebP / PNG) ->
                                  placeholder text + pixels, or an ApiError 400 naming the part (remote URL, a path,
                                  bad base64, not an image, an undecodable video such as MP4, a text model)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from glmstack.inference.sampling import RowStreams, SamplingParams, sample
from glmstack.multimodal.images import ImageError, load_image
from glmstack.multimodal.video import load_clip
from glmstack.serve.scheduler import Job, Scheduler, _Batch


def is_vl_checkpoint(folder) -> bool:
    from glmstack.model.vision.config import VL_MODEL_TYPES

    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text()).get("model_type") in VL_MODEL_TYPES
    except (OSError, ValueError):
        return False


class VisionEngine:
    """What the chat CLI and the server need of a vision-language checkpoint."""

    fast = False  # the scheduler's batch runner (never stepped for VL jobs) then wraps the plain model

    def __init__(self, model, tokenizer, processor, device):
        self.model, self.tokenizer, self.processor, self.device = model, tokenizer, processor, torch.device(device)
        self.cfg = model.cfg.text_config  # max_position_embeddings, like a text Engine's cfg

    @classmethod
    def load(cls, folder, dtype=None, device="cpu") -> VisionEngine:
        from glmstack.model.vision import load_vl_hf
        from glmstack.multimodal.processor import VisionProcessor
        from glmstack.tokenizer import Tokenizer

        tokenizer, processor = Tokenizer.load(folder), VisionProcessor.load(folder)  # small files first
        return cls(load_vl_hf(folder, dtype=dtype, device=device).eval(), tokenizer, processor, device)

    def render_prompt(self, messages, tools, style: str, enable_thinking: bool = True, clear_thinking: bool = True):
        """The conversation with the generation prompt -> Encoded (ids + pixels): what `stream` takes."""
        from glmstack.multimodal.encode import encode_multimodal

        return encode_multimodal(self.tokenizer, self.processor, messages, tools, style=style,
                                 enable_thinking=enable_thinking, clear_thinking=clear_thinking,
                                 add_generation_prompt=True)  # fmt: skip

    def stream(self, prompt, max_new_tokens: int = 256, stats: dict | None = None, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None, speculative=None, **_unused):  # fmt: skip
        """Engine.stream's shape for an Encoded prompt: a Delta per token (the stop token's text not shown)."""
        from glmstack.inference.engine import Delta

        if speculative:
            raise ValueError("speculative decoding is for text models (a vision-language checkpoint decodes plainly)")
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
        ids, shown, stop = [], "", set(self.tokenizer.eos_ids)
        seed = seed if seed is not None else int(torch.randint(0, 2**31, ()).item())
        for tok, _, _ in decode(self, prompt.ids, prompt.media, params, seed, stop, max_new_tokens):
            if tok in stop:
                break
            ids.append(tok)
            full = self.tokenizer.decode(ids)
            if not full.endswith("\ufffd"):  # byte-level BPE: wait for the rest of a UTF-8 character
                yield Delta(ids=[tok], text=full[len(shown) :])
                shown = full
        if stats is not None:
            stats["new_tokens"] = len(ids)


@torch.inference_mode()
def decode(engine: VisionEngine, ids: list[int], media, params: SamplingParams, seed: int, stop_ids,
           max_new_tokens: int):  # fmt: skip
    """Yield (token id, raw log-prob, log-softmax row (V,)) until a stop id (yielded) or the budget."""
    from glmstack.model.attention import SimpleKVCache
    from glmstack.model.vision import rope_index, token_types

    model, dev = engine.model, engine.device
    ids_1T = torch.tensor(ids, device=dev).view(1, -1)
    inputs = {k: v.to(dev) for k, v in media.model_inputs().items()} if media is not None else {}
    _, next_pos = rope_index(ids_1T, model.cfg, inputs.get("image_grid_thw"), inputs.get("video_grid_thw"),
                             types_BT=token_types(ids_1T, model.cfg), flat_images=model.cfg.visual_expert)  # fmt: skip
    cache = SimpleKVCache()
    logits = model(ids_1T, cache=cache, **inputs).logits[:, -1].float()
    streams = RowStreams([seed], 1, dev) if not params.greedy else None
    for step in range(max_new_tokens):
        keys = streams.keys(step)[:, 0] if streams is not None else None
        token = sample(logits, params, keys)  # (1,)
        logp_V = torch.log_softmax(logits[0], dim=-1)
        tok = int(token)
        yield tok, float(logp_V[tok]), logp_V
        if tok in stop_ids:
            return
        pos = (next_pos.to(dev) + step).view(1, 1)
        logits = model(token.view(1, 1), position_ids=pos, cache=cache).logits[:, -1].float()


class VisionBatch(_Batch):
    """The scheduler's running batch for a VisionEngine: a new row's prefill is the full multimodal forward (its
    pixels through the ViT, 3D RoPE positions), its next token sits at the next_position rope_index gives (the same
    on all three axes, so decoding is the text model's 1D step: GLMV.generate's rule). Rows are left-padded as
    inference.vision.generate_batch lays them out, so each computes what it would alone."""

    @torch.inference_mode()
    def _prefill(self, new: list[Job]):
        from glmstack.inference.kv_cache import KVCache
        from glmstack.model.vision import rope_index
        from glmstack.multimodal.processor import Media

        model, dev = self.engine.model, self.device
        lens = [len(job.prompt_ids) for job in new]
        L = max(lens)
        ids_NL = torch.zeros(len(new), L, dtype=torch.long)
        for b, job in enumerate(new):
            ids_NL[b, L - lens[b] :] = torch.tensor(job.prompt_ids)
        start_N = torch.tensor([L - n for n in lens])
        segments = (torch.arange(L)[None] >= start_N[:, None]).long() if L > min(lens) else None  # 0: padding
        media = Media.concat([job.media for job in new if job.media is not None]).model_inputs()
        pos_3NL, next_N = rope_index(ids_NL, model.cfg, media.get("image_grid_thw"), media.get("video_grid_thw"),
                                     segments, flat_images=model.cfg.visual_expert)  # fmt: skip
        cache = KVCache(len(new), L, start=start_N.to(dev))
        inputs = {k: v.to(dev) for k, v in media.items()}
        logits_NV = model(ids_NL.to(dev), position_ids=pos_3NL.to(dev), cache=cache, **inputs).logits[:, -1]
        self.sched.stats["prefill_computed"] += sum(lens)
        return cache, logits_NV, next_N.view(-1, 1).to(dev)


class VisionScheduler(Scheduler):
    """Serves a VisionEngine with continuous batching (VisionBatch); jobs carry their pixels in `job.media`."""

    def __init__(self, engine: VisionEngine, max_running: int = 16, max_waiting: int = 256):
        super().__init__(engine, max_running=max_running, max_waiting=max_waiting)

    def _new_batch(self) -> VisionBatch:
        return VisionBatch(self)


def has_media(messages) -> bool:
    from glmstack.multimodal.encode import media_kind

    return any(isinstance(m, dict) and isinstance(m.get("content"), list) and any(media_kind(p) for p in m["content"])
               for m in messages)  # fmt: skip


def request_media(messages, processor, limits=None):
    """(messages with placeholder text parts, Media) for a chat request; ApiError 400 on any bad image part, or
    when the request's images, videos, frames or pixels together pass `limits` (glmstack.serve.limits.Limits):
    counts are checked before decoding, frames and pixels after each part, so an oversized request stops early."""
    from glmstack.multimodal.encode import split_media
    from glmstack.serve.limits import Limits
    from glmstack.serve.protocol import ApiError

    limits = limits or Limits()
    if processor is None:
        raise ApiError(400, "messages: this model has no vision encoder; image and video parts need a "
                       "vision-language checkpoint (glm4v_moe / glm4v)", "messages")  # fmt: skip
    try:
        plain, images, videos = split_media(messages)
        if len(images) > limits.max_images or len(videos) > limits.max_videos:
            raise ImageError(f"{len(images)} images and {len(videos)} videos; a request may hold at most "
                             f"{limits.max_images} images and {limits.max_videos} videos")  # fmt: skip
        budget = _MediaBudget(limits)
        images = [budget.image(load_image(_url(src), what=f"image {k}")) for k, src in enumerate(images)]
        videos = [budget.clip(load_clip(_video_url(v), what=f"video {k}")) for k, v in enumerate(videos)]
        return plain, processor(images, videos)
    except ImageError as e:
        raise ApiError(400, f"messages: {e}", "messages") from None


class _MediaBudget:
    """Frames and pixels a request has decoded so far, against its limits."""

    def __init__(self, limits):
        self.limits, self.frames, self.pixels = limits, 0, 0

    def image(self, img):
        self._add(img.size[0] * img.size[1])
        return img

    def clip(self, clip):
        self.frames += len(clip.frames)
        if self.frames > self.limits.max_frames:
            raise ImageError(f"the videos hold {self.frames}+ frames; a request may hold at most "
                             f"{self.limits.max_frames}")  # fmt: skip
        self._add(sum(f.size[0] * f.size[1] for f in clip.frames))
        return clip

    def _add(self, pixels: int) -> None:
        self.pixels += pixels
        if self.pixels > self.limits.max_pixels:
            raise ImageError(f"the images and frames hold {self.pixels}+ pixels; a request may hold at most "
                             f"{self.limits.max_pixels}")  # fmt: skip


def _url(src, kind: str = "an image", example: str = "data:image/png;base64,..."):
    """An OpenAI image_url part carries a URL string; a local path is not accepted from a remote client."""
    if isinstance(src, str) and not src.startswith("data:"):
        if src.startswith(("http://", "https://")):
            raise ImageError(f"remote URLs are not fetched ({src[:60]!r}); send {kind} as a data URL ({example})")
        raise ImageError(f"{kind} must be a data URL ({example}), got {src[:40]!r}")
    if not isinstance(src, str):
        raise ImageError(f"{kind} must be a data URL string, got {type(src).__name__}")
    return src


def _video_url(src):
    """A video from a client: one data URL (vLLM's data:video/jpeg;base64,<frame>,<frame>,... or an animated
    GIF / WebP / PNG) or a list of image data URLs (its frames); never a server path or a remote URL."""
    if isinstance(src, (list, tuple)):
        return [_url(f, "a video frame") for f in src]
    return _url(src, "a video", "data:video/jpeg;base64,<frame>,<frame>,... or data:image/gif;base64,...")


def expand_prompt(text: str, media, processor) -> str:
    """The rendered prompt with each image / video placeholder expanded to its visual tokens."""
    from glmstack.chat.render import Segment
    from glmstack.multimodal.encode import expand

    return expand([Segment(text)], media, processor)[0].text
