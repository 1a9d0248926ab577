"""Where image tokens go in the text: the chat side's half of the vision contract (what Glm4vProcessor does).

The official GLM-4.1V/4.5V chat template writes an image as `<|begin_of_image|><|image|><|end_of_image|>` and a
video as `<|begin_of_video|><|video|><|end_of_video|>`. Before the model sees the ids, each single `<|image|>` becomes
n = t * h * w / merge_size^2 copies (its row of image_grid_thw), and each `<|video|>` becomes, per frame,
`<|begin_of_image|>` + n_frame `<|image|>` + `<|end_of_image|>` + the frame's timestamp text (transformers'
Glm4vProcessor.replace_video_token; frames reuse the image token id). `expand_runs` is the one implementation of
that rule, on any tokens: `expand_placeholders` applies it to ids, glmstack.multimodal.encode.expand to the rendered
text (tests/multimodal/test_encode.py checks the result equals Glm4vProcessor's ids).

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


def expand_runs(tokens: Sequence, marks: tuple, merge_size: int, image_grid_thw=None, video_grid_thw=None,
                frame_text: Sequence[Sequence[Sequence]] | None = None) -> list[list]:
    """One list per token of `tokens`: the token itself, or, for a placeholder, its expansion. marks = (image,
    video, begin_of_image, end_of_image) in the tokens' own kind (ids or strings); the grids are (N, 3) tensors or
    arrays; frame_text[v][f]: the tokens of video v's frame f timestamp (default none).
    Raises VisionInputError when the counts of placeholders and grid rows differ."""
    image, video, begin, end = marks
    images = [] if image_grid_thw is None else image_grid_thw.tolist()
    videos = [] if video_grid_thw is None else video_grid_thw.tolist()
    out: list[list] = []
    n_img = n_vid = 0
    for tok in tokens:
        if tok == image:
            if n_img >= len(images):
                raise VisionInputError(f"more <|image|> placeholders than image_grid_thw rows ({len(images)})")
            out.append([image] * tokens_per_image(images[n_img], merge_size))
            n_img += 1
        elif tok == video:
            if n_vid >= len(videos):
                raise VisionInputError(f"more <|video|> placeholders than video_grid_thw rows ({len(videos)})")
            t, h, w = videos[n_vid]
            per_frame = [image] * tokens_per_image((1, h, w), merge_size)
            stamps = [list(frame_text[n_vid][f]) if frame_text is not None else [] for f in range(t)]
            out.append([x for stamp in stamps for x in (begin, *per_frame, end, *stamp)])
            n_vid += 1
        else:
            out.append([tok])
    if n_img != len(images) or n_vid != len(videos):
        raise VisionInputError(f"{len(images)} image / {len(videos)} video grid rows but {n_img} <|image|> / "
                               f"{n_vid} <|video|> placeholders in the text")
    return out


def expand_placeholders(ids: Sequence[int], cfg, image_grid_thw: torch.Tensor | None = None,
                        video_grid_thw: torch.Tensor | None = None,
                        frame_text: Sequence[Sequence[Sequence[int]]] | None = None) -> list[int]:
    """ids with every `<|image|>` (image_token_id) expanded to its image's run and every `<|video|>`
    (video_token_id) to its frames (`expand_runs` on ids)."""
    marks = (cfg.image_token_id, cfg.video_token_id, cfg.image_start_token_id, cfg.image_end_token_id)
    runs = expand_runs(ids, marks, cfg.vision_config.spatial_merge_size, image_grid_thw, video_grid_thw, frame_text)
    return [tok for run in runs for tok in run]
