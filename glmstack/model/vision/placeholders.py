"""Where image tokens go in the text: the chat side's half of the vision contract (what Glm4vProcessor does to ids).

The official GLM-4.1V/4.5V chat template writes an image as `<|begin_of_image|><|image|><|end_of_image|>` and a
video as `<|begin_of_video|><|video|><|end_of_video|>`. Before the model sees the ids, each single `<|image|>` becomes
n = t * h * w / merge_size^2 copies (its row of image_grid_thw), and each `<|video|>` becomes, per frame,
`<|begin_of_image|>` + n_frame `<|image|>` + `<|end_of_image|>` + the frame's timestamp text (transformers'
Glm4vProcessor.replace_video_token; frames reuse the image token id). `expand_placeholders` does exactly that on ids.

    ids = expand_placeholders(tokenizer.encode(prompt), cfg, batch["image_grid_thw"])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from glmstack.model.vision.mrope import VisionInputError


def tokens_per_image(grid_thw_row, merge_size: int) -> int:
    """LLM tokens of one image/video of patch grid (t, h, w): t * h * w / merge_size^2."""
    t, h, w = (int(v) for v in grid_thw_row)
    return t * h * w // merge_size**2


def expand_placeholders(ids: Sequence[int], cfg, image_grid_thw: torch.Tensor | None = None,
                        video_grid_thw: torch.Tensor | None = None,
                        frame_text: Sequence[Sequence[Sequence[int]]] | None = None) -> list[int]:
    """ids with every `<|image|>` (image_token_id) expanded to its image's run and every `<|video|>`
    (video_token_id) to its frames; frame_text[v][f]: token ids of video v's frame f timestamp (default none).
    Raises VisionInputError when the counts of placeholders and grid rows differ."""
    m = cfg.vision_config.spatial_merge_size
    images = [] if image_grid_thw is None else image_grid_thw.tolist()
    videos = [] if video_grid_thw is None else video_grid_thw.tolist()
    out: list[int] = []
    n_img = n_vid = 0
    for tok in ids:
        if tok == cfg.image_token_id:
            if n_img >= len(images):
                raise VisionInputError(f"more <|image|> placeholders than image_grid_thw rows ({len(images)})")
            out += [cfg.image_token_id] * tokens_per_image(images[n_img], m)
            n_img += 1
        elif tok == cfg.video_token_id:
            if n_vid >= len(videos):
                raise VisionInputError(f"more <|video|> placeholders than video_grid_thw rows ({len(videos)})")
            t, h, w = videos[n_vid]
            per_frame = tokens_per_image((1, h, w), m)
            for f in range(t):
                stamp = list(frame_text[n_vid][f]) if frame_text is not None else []
                out += [cfg.image_start_token_id, *[cfg.image_token_id] * per_frame, cfg.image_end_token_id, *stamp]
            n_vid += 1
        else:
            out.append(tok)
    if n_img != len(images) or n_vid != len(videos):
        raise VisionInputError(f"{len(images)} image / {len(videos)} video grid rows but {n_img} <|image|> / "
                               f"{n_vid} <|video|> placeholders in the text")
    return out
