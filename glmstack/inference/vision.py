"""Decoding a GLMV (GLM-4.5V / GLM-4.1V, glmstack.model.vision): one prompt or a batch of left-padded prompts,
with the engine's KV cache and per-row seeded sampling, and each sampled token's log-prob for RL.

    from glmstack.inference.vision import generate, generate_batch
    ids = generate(model, prompt_ids, pixel_values=pv, image_grid_thw=grid, max_new_tokens=32, stop_ids=eos)
    rows, logps = generate_batch(model, ids_BT, attention_mask=mask_BT, seeds=[...], logprobs=True, **media)

Prefill runs the full multimodal forward; each new token then sits at next_position + step on all three RoPE axes
(transformers' rope_deltas). This was GLMV.generate / generate_batch; it lives in the engine because the model must
not import the engine (the cache and the sampler are the engine's: issue 35). The served path (batched with text
requests) is multimodal/serving.py's VisionScheduler; this is the plain loop vl-rl and the VL evaluation use.
"""

from __future__ import annotations

import torch

from glmstack.inference.kv_cache import KVCache
from glmstack.inference.sampling import RowStreams, SamplingParams, filter_logits, sample
from glmstack.model.vision.mrope import VisionInputError, rope_index


@torch.no_grad()
def generate(model, input_ids, pixel_values=None, image_grid_thw=None, pixel_values_videos=None,
             video_grid_thw=None, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
             top_k: int = 0, seed: int = 0, stop_ids=()) -> list[int]:
    """Decode one prompt (input_ids (1, T) or (T,)) with a KV cache -> the new token ids (the stop id kept).
    Prefill runs the full multimodal forward; each new token then sits at next_position + step in all three
    RoPE rows (transformers' rope_deltas). Sampling is glmstack's (sampling.py, seeded per row)."""
    return generate_batch(model, input_ids.view(1, -1), pixel_values, image_grid_thw, pixel_values_videos,
                          video_grid_thw, max_new_tokens, temperature, top_p, top_k, [seed], stop_ids)[0]


@torch.no_grad()
def generate_batch(model, input_ids, pixel_values=None, image_grid_thw=None, pixel_values_videos=None,
                   video_grid_thw=None, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                   top_k: int = 0, seeds=None, stop_ids=(), attention_mask=None, logprobs: bool = False):
    """Decode B prompts at once (input_ids (B, T); prompts of different lengths LEFT-padded, with
    attention_mask (B, T) 0 on the padding) -> each row's new ids, cut after its first stop id. The images of
    all rows are concatenated in pixel_values in row order (K samples of one prompt: repeat it K times).
    Row b samples with seeds[b] (default b): its tokens do not depend on the other rows. The KV cache is
    kv_cache.KVCache (per-row left padding never attended). `logprobs`: return (ids, log-probs), each
    sampled token's log-prob under the transform it was sampled from (as inference.Engine's, for RL)."""
    B, T = input_ids.shape
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    streams = RowStreams(list(seeds) if seeds is not None else list(range(B)))
    segments = _left_padding_segments(attention_mask)
    positions, next_pos = rope_index(input_ids, model.cfg, image_grid_thw, video_grid_thw, segments,
                                     flat_images=model.cfg.visual_expert)
    start = None if segments is None else (segments == 0).sum(1)
    cache = KVCache(B, T + max_new_tokens, start=start)
    logits = model(input_ids, pixel_values=pixel_values, image_grid_thw=image_grid_thw, position_ids=positions,
                  pixel_values_videos=pixel_values_videos, video_grid_thw=video_grid_thw, cache=cache).logits
    out: list[list[int]] = [[] for _ in range(B)]
    out_lp: list[list[float]] = [[] for _ in range(B)]
    lp_params = SamplingParams(temperature=temperature if not params.greedy else 1.0, top_p=top_p, top_k=top_k)
    done = [False] * B
    for step in range(max_new_tokens):
        last_BV = logits[:, -1].float()
        tokens = sample(last_BV, params, streams.keys(step)[:, 0])  # (B,)
        lp = torch.log_softmax(filter_logits(last_BV, lp_params), -1).gather(-1, tokens[:, None])[:, 0].tolist()
        for b, t in enumerate(tokens.tolist()):
            if not done[b]:
                out[b].append(t)
                out_lp[b].append(lp[b])
                done[b] = t in stop_ids
        if all(done) or step == max_new_tokens - 1:
            break
        logits = model(tokens.view(B, 1), position_ids=(next_pos + step).view(B, 1), cache=cache).logits
    return (out, out_lp) if logprobs else out


def _left_padding_segments(attention_mask):
    """attention_mask (B, T) -> segment ids (0 = padding, 1 = the prompt), or None without padding; padding must be
    on the left (decoding appends on the right)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    seg = attention_mask.long()
    if bool((seg[:, 1:] < seg[:, :-1]).any()):
        raise VisionInputError("generate_batch needs LEFT padding: attention_mask must be 0...0 1...1 per row")
    return seg
