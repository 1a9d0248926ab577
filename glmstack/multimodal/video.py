"""Short videos from users: a folder of frames, an animated GIF / WebP / PNG, or vLLM's frames data URL.

Why these inputs: GLM-4.1V / GLM-4.5V (arXiv 2507.01006) read a video as frames sampled at 2 per second, each pair of
frames one temporal patch tagged with its timestamp. Decoding MP4 / WebM needs a video library (PyAV, decord, or
ffmpeg), none of which is installed here and none of which glmstack downloads; Pillow decodes animated images with
their frame durations, and a folder of frames (what `ffmpeg -vf fps=2` writes) or vLLM's
`data:video/jpeg;base64,<frame>,<frame>,...` URL carries the frames themselves. Anything else is one `ImageError`
line saying what to send instead.

How the frames are chosen: a clip given as frames (a list, a folder, vLLM's URL) is taken as already sampled at
2 fps (`VIDEO_FPS`): frame i sits at i / 2 s. An animated image is sampled by transformers' own rule
(`Glm4vVideoProcessor.sample_frames` on its `VideoMetadata`: floor(duration * 2) frames at ceil(i * fps / 2), an odd
count padding with the last), its timestamps `VideoMetadata.timestamps` (frame index / native fps); the native fps
is frames / total duration (a frame without a duration shows for 100 ms, as browsers do).

    clip = load_clip("frames/")                          # PNG/JPEG/... files in name order (frame2 before frame10)
    clip = load_clip("spin.gif")                         # sampled at 2 fps from its frame durations
    clip = load_clip("data:video/jpeg;base64,/9j/...,/9j/...")   # vLLM's video_url frames form
    clip.frames, clip.timestamps                         # RGB PIL frames of one size, seconds per frame
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

from glmstack.multimodal.images import ImageError, _checked, _is_url, data_url_bytes, load_image

VIDEO_FPS = 2.0  # GLM-4.1V's sampling rate: frames given as frames are taken as sampled at it
MAX_FRAMES = 64  # after sampling: 32 s at 2 fps ("short video")
MAX_SOURCE_FRAMES = 4096  # frames of an animated file read to find its durations
MAX_SOURCE_PIXELS = 2**30  # frames x width x height of an animated file (each frame is decoded while seeking)
DEFAULT_FRAME_MS = 100
VIDEO_DECODERS_MISSING = ("no video decoder is installed (glmstack reads animated GIF / WebP / PNG with Pillow); send "
                          "the frames instead: a folder of images, or data:video/jpeg;base64,<frame>,<frame>,...")  # fmt: skip


@dataclass
class Clip:
    """A short video: frames (RGB PIL images of one size) and the time of each in seconds."""

    frames: list
    timestamps: list[float]


def load_clip(source, *, what: str = "video", fps: float = VIDEO_FPS) -> Clip:
    """A Clip from a list of frames, a folder of frames, an animated image (path, bytes or data URL), vLLM's
    `data:video/jpeg;base64,` frames URL, or a Clip; ImageError (one line naming `what`) otherwise."""
    if isinstance(source, Clip):
        return source
    if isinstance(source, (list, tuple)):
        return _frames_clip([load_image(f, what=f"{what} frame {i}") for i, f in enumerate(source)], what, fps)
    if isinstance(source, (bytes, bytearray)):
        return _animated(bytes(source), what)
    if isinstance(source, Path) or (isinstance(source, str) and not _is_url(source)):
        return _from_path(Path(source), what, fps)
    if isinstance(source, str) and source.startswith("data:"):
        return _from_data_url(source, what, fps)
    if isinstance(source, str):
        raise ImageError(f"{what}: remote URLs are not fetched ({source[:60]!r}); send the video as a data URL")
    raise ImageError(f"{what}: expected frames, a folder, an animated image or a data URL, got {type(source).__name__}")


def _from_path(path: Path, what: str, fps: float) -> Clip:
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")), key=_natural)
        if not files or len(files) > MAX_FRAMES:
            raise ImageError(f"{what}: {path}: the folder holds {len(files)} files (expected 1 to {MAX_FRAMES} frames)")
        return _frames_clip([load_image(f, what=f"{what} frame {f}") for f in files], f"{what} {path}", fps)
    if not path.is_file():
        raise ImageError(f"{what}: {path}: no such file or folder")
    return _animated(path.read_bytes(), f"{what} {path}")


def _from_data_url(url: str, what: str, fps: float) -> Clip:
    head, _, payload = url.partition(",")
    mime = head[5:].removesuffix(";base64").lower()
    if mime == "video/jpeg":  # vLLM: comma-separated base64 frames
        parts = payload.split(",")
        if len(parts) > MAX_FRAMES:
            raise ImageError(f"{what}: {len(parts)} frames (at most {MAX_FRAMES})")
        frames = [load_image(f"data:image/jpeg;base64,{p}", what=f"{what} frame {i}") for i, p in enumerate(parts)]
        return _frames_clip(frames, what, fps)
    if mime.startswith("video/"):
        raise ImageError(f"{what}: {mime} cannot be decoded here: {VIDEO_DECODERS_MISSING}")
    return _animated(data_url_bytes(url, what), what)


def _frames_clip(frames: list, what: str, fps: float) -> Clip:
    if not frames or len(frames) > MAX_FRAMES:
        raise ImageError(f"{what}: {len(frames)} frames (expected 1 to {MAX_FRAMES})")
    if len({f.size for f in frames}) > 1:
        raise ImageError(f"{what}: frames differ in size ({sorted({f.size for f in frames})})")
    return Clip(frames, [i / fps for i in range(len(frames))])


def _animated(data: bytes, what: str) -> Clip:
    """An animated GIF / WebP / PNG sampled at VIDEO_FPS by transformers' rule (the module docstring)."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError):
        raise ImageError(f"{what}: not a readable video: {VIDEO_DECODERS_MISSING}") from None
    _checked(img, what)
    n = _decoded(what, lambda: int(getattr(img, "n_frames", 1)))  # GIF: counts the frames by seeking through them
    if n < 2:
        raise ImageError(f"{what}: a still image (1 frame), not a video; give it as an image")
    if n > MAX_SOURCE_FRAMES or n * img.width * img.height > MAX_SOURCE_PIXELS:
        raise ImageError(f"{what}: {n} frames of {img.width}x{img.height} is too long for a short video")
    seconds = sum(_decoded(what, lambda: [_frame_ms(img, i) for i in range(n)])) / 1000
    indices, stamps = sample_frames(n, n / seconds, seconds)
    if len(indices) > MAX_FRAMES:
        raise ImageError(f"{what}: {seconds:.1f} s gives {len(indices)} frames at {VIDEO_FPS:g} fps (at most "
                         f"{MAX_FRAMES})")  # fmt: skip
    return Clip(_decoded(what, lambda: [_frame(img, i) for i in indices]), stamps)


def sample_frames(n: int, fps: float, seconds: float) -> tuple[list[int], list[float]]:
    """(frame indices, their timestamps) of a clip of n frames at `fps` lasting `seconds`: transformers'
    Glm4vVideoProcessor.sample_frames at VIDEO_FPS, and VideoMetadata.timestamps. The processor's constructor
    needs torchvision (not installed); sample_frames reads only its class attributes (fps, max_duration)."""
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor
    from transformers.video_utils import VideoMetadata

    meta = VideoMetadata(total_num_frames=n, fps=fps, duration=seconds)
    meta.frames_indices = Glm4vVideoProcessor.__new__(Glm4vVideoProcessor).sample_frames(meta, fps=VIDEO_FPS).tolist()
    return meta.frames_indices, meta.timestamps


def _decoded(what: str, read):
    """read() with Pillow's errors on a truncated or corrupt file as one ImageError line (its plugins raise many
    kinds on damaged input: OSError, SyntaxError, IndexError, struct.error, ...)."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001 — see the docstring
        raise ImageError(f"{what}: not a readable animated image ({type(e).__name__}: {str(e)[:80]})") from None


def _frame_ms(img, i: int) -> float:
    img.seek(i)
    return float(img.info.get("duration") or DEFAULT_FRAME_MS)


def _frame(img, i: int):
    img.seek(i)
    return img.convert("RGB")


def _natural(path: Path):
    """frame2.png before frame10.png."""
    return [int(s) if s.isdigit() else s.lower() for s in re.split(r"(\d+)", path.name)]
