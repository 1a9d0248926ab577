"""Pixels for the vision encoder: transformers' GLM-4.1V/4.5V image processor, plus short videos from frames.

What: `VisionProcessor` turns images into `pixel_values (N_patches, C·T·P·P)` + `image_grid_thw (n_images, 3)` and
videos (Clips from glmstack.multimodal.video, or lists of frames) into `pixel_values_videos` + `video_grid_thw` (and
each temporal patch's timestamp), and says how many `<|image|>` tokens each one becomes in the prompt
(`grid_t·grid_h·grid_w / merge_size²`: the adapter merges 2x2 patches into one token).

Why reuse: the resizing rule (`smart_resize`: both sides multiples of patch·merge = 28, the pixel count kept within
[min_pixels, max_pixels], any aspect ratio up to 200:1) and the patch layout must be exactly what the released
checkpoints saw; `transformers.Glm4vImageProcessorPil` is that code (its torchvision twin is not installed here).
Images are two-frame clips to the 3D patch embedding (temporal_patch_size 2: the frame is repeated). Videos use the
same resize and normalisation per frame; consecutive frames pair into one temporal patch (an odd count repeats the
last frame) in the layout of transformers' Glm4vVideoProcessor, which needs torchvision, so a video's frames are
resized with PIL's bicubic rather than torchvision's (a few grey levels apart; the token counts are identical).

    proc = VisionProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)   # the tiny recipe's sizes
    media = proc([img1, img2], videos=[[f0, f1, f2, f3], load_clip("spin.gif")])   # frames at 2 fps, or a Clip
    proc.image_tokens(media.image_grid_thw[0])                                # 4 .. 16 tokens here
    proc.save(folder) ; VisionProcessor.load(folder)                          # preprocessor_config.json (HF)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from glmstack.multimodal.images import ImageError
from glmstack.multimodal.video import VIDEO_FPS, Clip, load_clip

CONFIG_NAME = "preprocessor_config.json"


@dataclass
class Media:
    """The processed images and videos of one conversation (or a batch of them), in prompt order."""

    pixel_values: np.ndarray | None = None  # (N_patches, C·T·P·P) float32
    image_grid_thw: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))  # (n_images, 3)
    pixel_values_videos: np.ndarray | None = None
    video_grid_thw: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))  # (n_videos, 3)
    video_timestamps: list[list[float]] = field(default_factory=list)  # per video, per temporal patch (seconds)

    def __bool__(self) -> bool:
        return len(self.image_grid_thw) + len(self.video_grid_thw) > 0

    def model_inputs(self) -> dict:
        """The keyword arguments of the multimodal model's forward (torch tensors; absent kinds left out)."""
        import torch

        out = {}
        if len(self.image_grid_thw):
            out["pixel_values"] = torch.from_numpy(self.pixel_values)
            out["image_grid_thw"] = torch.from_numpy(self.image_grid_thw)
        if len(self.video_grid_thw):
            out["pixel_values_videos"] = torch.from_numpy(self.pixel_values_videos)
            out["video_grid_thw"] = torch.from_numpy(self.video_grid_thw)
        return out

    @staticmethod
    def concat(items: list[Media]) -> Media:
        """Several conversations' media as one batch (images in row order, then prompt order)."""
        def cat(arrays, empty):
            arrays = [a for a in arrays if a is not None and len(a)]
            return np.concatenate(arrays) if arrays else empty

        return Media(pixel_values=cat([m.pixel_values for m in items], None),
                     image_grid_thw=cat([m.image_grid_thw for m in items], np.zeros((0, 3), np.int64)),
                     pixel_values_videos=cat([m.pixel_values_videos for m in items], None),
                     video_grid_thw=cat([m.video_grid_thw for m in items], np.zeros((0, 3), np.int64)),
                     video_timestamps=[t for m in items for t in m.video_timestamps])  # fmt: skip


class VisionProcessor:
    """transformers' Glm4vImageProcessorPil with glmstack's defaults and errors (see the module docstring)."""

    def __init__(self, *, min_pixels: int = 112 * 112, max_pixels: int = 28 * 28 * 15000, patch_size: int = 14,
                 temporal_patch_size: int = 2, merge_size: int = 2, hf=None):  # fmt: skip
        from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

        self.hf = hf or Glm4vImageProcessorPil(size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
                                               patch_size=patch_size, temporal_patch_size=temporal_patch_size,
                                               merge_size=merge_size)  # fmt: skip

    # ------------------------------------------------------------------ sizes
    @property
    def merge_size(self) -> int:
        return int(self.hf.merge_size)

    @property
    def patch_size(self) -> int:
        return int(self.hf.patch_size)

    @property
    def temporal_patch_size(self) -> int:
        return int(self.hf.temporal_patch_size)

    def image_tokens(self, grid_thw) -> int:
        """`<|image|>` tokens of one image (or of one temporal patch of a video: pass (1, h, w))."""
        from glmstack.model.vision.placeholders import tokens_per_image

        return tokens_per_image(grid_thw, self.merge_size)

    def resized(self, height: int, width: int, num_frames: int = 2) -> tuple[int, int]:
        from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize

        size = self.hf.size
        factor = self.patch_size * self.merge_size
        return smart_resize(num_frames=max(num_frames, self.temporal_patch_size), height=height, width=width,
                            temporal_factor=self.temporal_patch_size, factor=factor,
                            min_pixels=size.shortest_edge, max_pixels=size.longest_edge)  # fmt: skip

    # ------------------------------------------------------------------ pixels
    def __call__(self, images=(), videos=(), fps: float = VIDEO_FPS) -> Media:
        """images: PIL images; videos: Clips (glmstack.multimodal.video) or lists of frames sampled at `fps`."""
        media = Media()
        if images:
            media.pixel_values, media.image_grid_thw = self.images(list(images))
        if videos:
            parts = [self.video(load_clip(v, what=f"video {k}", fps=fps)) for k, v in enumerate(videos)]
            media.pixel_values_videos = np.concatenate([p for p, _, _ in parts])
            media.video_grid_thw = np.array([g for _, g, _ in parts], np.int64)
            media.video_timestamps = [ts for _, _, ts in parts]
        return media

    def images(self, images: list, **kw) -> tuple[np.ndarray, np.ndarray]:
        for i, img in enumerate(images):
            self._check_aspect(img, f"image {i}")
        out = self.hf(images=images, return_tensors="np", **kw)
        return out["pixel_values"].astype(np.float32), out["image_grid_thw"].astype(np.int64)

    def video(self, clip: Clip) -> tuple[np.ndarray, list[int], list[float]]:
        """(patches (T'·h·w, C·T·P·P), [T', h, w], the timestamp of each temporal patch) of one clip."""
        from PIL import Image

        frames = clip.frames
        self._check_aspect(frames[0], "video")
        h, w = self.resized(frames[0].height, frames[0].width, num_frames=len(frames))
        resized = [f.resize((w, h), Image.Resampling.BICUBIC) for f in frames]
        pix, grid = self.images(resized, do_resize=False)  # each frame normalised and patchified at exactly (h, w)
        tp, n = self.temporal_patch_size, int(grid[0, 1] * grid[0, 2])
        per_frame = pix.reshape(len(frames), n, 3, tp, self.patch_size, self.patch_size)[:, :, :, 0]  # (F, N, C, P, P)
        if len(frames) % tp:
            per_frame = np.concatenate([per_frame, per_frame[-1:].repeat(tp - len(frames) % tp, 0)])
        groups = per_frame.reshape(-1, tp, n, 3, self.patch_size, self.patch_size)  # (T', tp, N, C, P, P)
        patches = groups.transpose(0, 2, 3, 1, 4, 5).reshape(groups.shape[0] * n, -1)  # (T'·N, C·tp·P·P)
        stamps = clip.timestamps[::tp][: groups.shape[0]]  # Glm4vProcessor.replace_video_token: timestamps[::2]
        return np.ascontiguousarray(patches), [groups.shape[0], int(grid[0, 1]), int(grid[0, 2])], stamps

    def _check_aspect(self, img, what: str) -> None:
        w, h = img.size
        if max(w, h) / min(w, h) > 200:
            raise ImageError(f"{what}: aspect ratio {w}x{h} is beyond 200:1 (GLM-4.1V's limit)")

    # ------------------------------------------------------------------ files
    def save(self, folder) -> None:
        """preprocessor_config.json in transformers' format (AutoImageProcessor reads it)."""
        self.hf.save_pretrained(str(folder))

    @classmethod
    def load(cls, folder) -> VisionProcessor:
        from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

        path = Path(folder) / CONFIG_NAME
        if not path.is_file():
            raise ImageError(f"{path}: no image processor config (a multimodal checkpoint has one)")
        try:
            json.loads(path.read_text())
            return cls(hf=Glm4vImageProcessorPil.from_pretrained(str(folder)))
        except (ValueError, TypeError, OSError) as e:
            raise ImageError(f"{path}: unreadable image processor config ({e})") from None
