"""3D RoPE (M-RoPE, Qwen2-VL arXiv 2409.12191 §2.1; GLM-4.1V-Thinking arXiv 2507.01006 §2) for the text decoder.

Every token has three positions (time, height, width). Text tokens carry the same value in all three, so a text-only
sequence rotates exactly as 1D RoPE. The rotary frequency pairs are split into `mrope_section = (s_t, s_h, s_w)`
slots: pairs [0, s_t) turn with the time position, the next s_h with the height, the last s_w with the width.

Positions (`rope_index`, transformers' `Glm4vModel.get_rope_index`): text advances by 1 per token; an image of merged
grid (t, h, w) = (grid_t, grid_h / m, grid_w / m) placed at position p gets (p + t_i, p + h_i, p + w_i) for its
tokens in raster order, and the text after it resumes at p + max(h, w). A video is a run of frames, each its own
image group of grid (1, h, w). With `flat_images` (CogVLM, arXiv 2311.03079 §2.2), every token of an image shares
one position id p (in all three rows) and the text resumes at p + 1.

Token types (`token_types`): 1 = an `<|image|>` token outside `<|begin_of_video|>`..`<|end_of_video|>`, 2 = one
inside (video frames are written with image tokens), 0 = text; what Glm4vProcessor returns as mm_token_type_ids.
"""

from __future__ import annotations

import itertools

import torch

from glmstack.errors import GlmstackError


class VisionInputError(GlmstackError):
    """Image/video inputs that do not match the placeholder tokens of the text."""


def token_types(input_ids_BT: torch.Tensor, cfg) -> torch.Tensor:
    """(B, T) int: 0 text, 1 image token, 2 video-frame token (an image token inside a video's start/end)."""
    is_image = input_ids_BT == cfg.image_token_id
    starts = (input_ids_BT == cfg.video_start_token_id).cumsum(-1)
    ends = (input_ids_BT == cfg.video_end_token_id).cumsum(-1)
    in_video = starts > ends
    return torch.where(is_image, torch.where(in_video, 2, 1), 0).to(torch.int32)


def rope_index(input_ids_BT: torch.Tensor, cfg, image_grid_thw=None, video_grid_thw=None, segment_ids_BT=None,
               types_BT=None, flat_images: bool = False):
    """-> (position_ids (3, B, T) long, next_position (B,) long: the position of a token appended to each row).

    cfg: a VLConfig (token ids, vision_config.spatial_merge_size). Images (then videos) are consumed in order over
    the rows, left to right. With segment_ids (packed documents), positions restart at 0 in every segment; segment 0
    (padding) gets text positions."""
    m = cfg.vision_config.spatial_merge_size
    types_BT = token_types(input_ids_BT, cfg) if types_BT is None else types_BT
    grids = {1: _rows(image_grid_thw), 2: _frames(video_grid_thw)}
    B, T = input_ids_BT.shape
    out = torch.zeros(3, B, T, dtype=torch.long)
    next_pos = torch.zeros(B, dtype=torch.long)
    types_cpu = types_BT.cpu()
    segs = segment_ids_BT.cpu() if segment_ids_BT is not None else torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        for _, run in itertools.groupby(range(T), key=lambda t: int(segs[b, t])):
            run = list(run)
            a, z = run[0], run[-1] + 1
            pos, end = _positions(types_cpu[b, a:z].tolist(), grids, m, flat_images)
            out[:, b, a:z] = pos
            next_pos[b] = end
    if any(len(g) for g in grids.values()):
        raise VisionInputError(f"{sum(len(g) for g in grids.values())} image/video grid(s) left over: the text has "
                               f"fewer placeholder groups than image_grid_thw / video_grid_thw rows")
    return out.to(input_ids_BT.device), next_pos.to(input_ids_BT.device)


def _rows(grid) -> list[tuple[int, int, int]]:
    return [] if grid is None else [tuple(int(v) for v in row) for row in grid.tolist()]


def _frames(video_grid) -> list[tuple[int, int, int]]:
    """A video of grid (t, h, w) is t frame groups of grid (1, h, w) (frames are separated by timestamps)."""
    return [(1, h, w) for t, h, w in _rows(video_grid) for _ in range(t)]


def _positions(types: list[int], grids: dict, m: int, flat: bool) -> tuple[torch.Tensor, int]:
    """(3, len(types)) positions of one document, and the position after it."""
    parts, cur = [], 0
    for kind, group in itertools.groupby(types):
        n = len(list(group))
        if kind == 0:
            parts.append(torch.arange(cur, cur + n).expand(3, n))
            cur += n
            continue
        if not grids[kind]:
            raise VisionInputError(f"more {'image' if kind == 1 else 'video frame'} placeholder groups in the text "
                                   f"than rows in {'image' if kind == 1 else 'video'}_grid_thw")
        t, h, w = grids[kind].pop(0)
        gt, gh, gw = t, h // m, w // m
        if n != gt * gh * gw:
            raise VisionInputError(f"a run of {n} {'image' if kind == 1 else 'video'} tokens, but its grid "
                                   f"{[t, h, w]} needs {gt * gh * gw} (t*h*w / merge_size^2)")
        if flat:
            parts.append(torch.full((3, n), cur))
            cur += 1
            continue
        tt, hh, ww = torch.meshgrid(torch.arange(gt), torch.arange(gh), torch.arange(gw), indexing="ij")
        parts.append(torch.stack([tt, hh, ww]).reshape(3, -1) + cur)
        cur += max(gh, gw)
    if not parts:
        return torch.zeros(3, 0, dtype=torch.long), 0
    pos = torch.cat(parts, dim=1)
    return pos, int(pos.max()) + 1


def mrope_cos_sin(position_ids_3BT: torch.Tensor, rotary_dim: int, theta: float, section, dtype,
                  interleave: bool = False):
    """cos, sin (B, T, rotary_dim) for 3D positions. Half-split layout (GLM-4.5V, `apply_partial_rope`): slot i and
    i + R/2 share frequency i; interleaved (GLM-4.1V): dims 2i and 2i+1 share it. Angles in fp32, as rope_cos_sin."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=position_ids_3BT.device).float() / rotary_dim))
    freqs_3BTF = position_ids_3BT[..., None].float() * inv_freq  # (3, B, T, R/2)
    chunks = freqs_3BTF.split(list(section), dim=-1)
    freqs_BTF = torch.cat([c[i % 3] for i, c in enumerate(chunks)], dim=-1)  # slot i from row (t, h, w)[i's section]
    emb = freqs_BTF.repeat_interleave(2, dim=-1) if interleave else torch.cat((freqs_BTF, freqs_BTF), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
