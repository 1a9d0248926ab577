"""Short videos through the chat format: an animated GIF gives the ids and pixels transformers' Glm4vProcessor
gives with its video processor's frame sampling and patch layout; a folder of frames, a list of frames and vLLM's
data:video/jpeg frames URL are the same clip; unsupported input is one ImageError line."""

import base64
import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from glmstack.chat.encode import encode_segments
from glmstack.multimodal.encode import encode_multimodal, split_media
from glmstack.multimodal.images import ImageError, to_data_url
from glmstack.multimodal.video import MAX_FRAMES, load_clip


def frames(n: int, size=(56, 56)) -> list:
    """n frames that differ (a bar moving right, a colour per frame), so a wrong frame choice shows."""
    out = []
    for i in range(n):
        img = Image.new("RGB", size, (17 * i % 256, 90, 255 - 13 * i % 256))
        img.paste((255, 255, 255), (3 * i % size[0], 0, 3 * i % size[0] + 6, size[1]))
        out.append(img)
    return out


def gif_bytes(clip: list, ms: int) -> bytes:
    buf = io.BytesIO()
    clip[0].save(buf, format="GIF", save_all=True, append_images=clip[1:], duration=ms, loop=0)
    return buf.getvalue()


def video_chat(video):
    return [{"role": "user", "content": [{"type": "video", "video": video}, {"type": "text", "text": "What moves?"}]}]


class ReferenceVideoProcessor:
    """transformers' Glm4vVideoProcessor without torchvision (not installed): its own sample_frames on the clip's
    VideoMetadata and its own patchify; frames arrive at the resized size (torchvision's resize is then the
    identity) and are normalised as its fused rescale + CLIP normalise."""

    merge_size = 2

    def __init__(self, fps: float, size: dict):
        self.fps, self.size = fps, size

    def __call__(self, videos, **kwargs):
        from transformers import BatchFeature
        from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
        from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor, smart_resize
        from transformers.video_utils import VideoMetadata

        hf = Glm4vVideoProcessor.__new__(Glm4vVideoProcessor)
        pixels, grids, metas = [], [], []
        for video in videos:
            meta = VideoMetadata(total_num_frames=len(video), fps=self.fps, duration=len(video) / self.fps)
            meta.frames_indices = hf.sample_frames(meta).tolist()
            x = torch.tensor(np.stack([np.asarray(video[i]) for i in meta.frames_indices])).permute(0, 3, 1, 2)
            target = smart_resize(x.shape[0], *x.shape[-2:], min_pixels=self.size.shortest_edge,
                                  max_pixels=self.size.longest_edge)  # fmt: skip
            assert target == x.shape[-2:], "the test's frames must already have the resized size"
            mean, std = torch.tensor(OPENAI_CLIP_MEAN)[:, None, None], torch.tensor(OPENAI_CLIP_STD)[:, None, None]
            x = (x.float() / 255 - mean) / std  # (F, C, H, W)
            patches, *grid = Glm4vVideoProcessor.patchify(
                hf, x[None], patch_size=14, merge_size=2, temporal_patch_size=2
            )
            pixels.append(patches[0])
            grids.append(grid)
            metas.append(meta)
        return BatchFeature({"pixel_values_videos": torch.cat(pixels), "video_grid_thw": torch.tensor(grids),
                             "video_metadata": metas})  # fmt: skip


# 10 fps (3 frames sampled, padded to 4), 4 fps, 2 fps (6 frames: smaller, to stay within max_pixels unresized)
@pytest.mark.parametrize(("n", "ms", "size"), [(15, 100, (56, 56)), (9, 250, (56, 56)), (6, 500, (56, 28))])
def test_gif_ids_and_pixels_equal_transformers_glm4v_processor(tok, tok_dir, proc, monkeypatch, n, ms, size):
    from multimodal.test_encode import hf_processor

    data = gif_bytes(frames(n, size), ms)
    decoded = [f.convert("RGB") for f in _all_frames(data)]  # what a video backend hands transformers
    msgs = video_chat(data)
    enc = encode_multimodal(tok, proc, msgs, add_generation_prompt=True)
    text = "".join(s.text for s in encode_segments(split_media(msgs)[0], add_generation_prompt=True))
    ref_proc = hf_processor(
        tok_dir, proc, monkeypatch, video_processor=ReferenceVideoProcessor(1000 / ms, proc.hf.size)
    )
    ref = ref_proc(text=[text], videos=[decoded], return_tensors="np")
    assert enc.ids == ref["input_ids"][0].tolist()
    np.testing.assert_array_equal(enc.media.video_grid_thw, ref["video_grid_thw"])
    np.testing.assert_allclose(enc.media.pixel_values_videos, ref["pixel_values_videos"], atol=1e-6)


def _all_frames(data: bytes) -> list:
    from PIL import ImageSequence

    return [f.copy() for f in ImageSequence.Iterator(Image.open(io.BytesIO(data)))]


def test_folder_list_and_vllm_frames_url_are_the_same_clip(tok, proc, tmp_path):
    clip = frames(11)  # 11 frames at 2 fps: 6 temporal patches, the last frame repeated
    for i, f in enumerate(clip):
        f.save(tmp_path / f"frame{i}.png")  # frame10 after frame9: name order is numeric
    b64 = ",".join(to_data_url(f).split(",", 1)[1] for f in clip)
    encs = [encode_multimodal(tok, proc, video_chat(v)) for v in (clip, tmp_path, f"data:video/jpeg;base64,{b64}")]
    url_part = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": f"data:video/jpeg;base64,{b64}"}},
                                             {"type": "text", "text": "What moves?"}]}]  # fmt: skip
    encs.append(encode_multimodal(tok, proc, url_part))
    for enc in encs[1:]:
        assert enc.ids == encs[0].ids
        np.testing.assert_array_equal(enc.media.pixel_values_videos, encs[0].media.pixel_values_videos)
    assert encs[0].media.video_grid_thw.tolist() == [[6, 2, 2]]  # 11 frames of 56x56: resized to 28x28 (max_pixels)
    assert encs[0].media.video_timestamps == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]]
    assert tok.decode(encs[0].ids).count("<|begin_of_image|>") == 6


def test_gif_timestamps_follow_frame_durations():
    clip = load_clip(gif_bytes(frames(12), 250))  # 3 s at 4 fps -> 6 frames at 2 fps: 0, 2, 4, ... of the 12
    assert clip.timestamps == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    expected = [f.convert("RGB") for f in _all_frames(gif_bytes(frames(12), 250))][::2]
    assert [np.asarray(f).tolist() for f in clip.frames] == [np.asarray(f).tolist() for f in expected]


@pytest.mark.parametrize(
    ("make", "message"),
    [(lambda p: "data:video/mp4;base64,AAAA", "video/mp4 cannot be decoded here"),
     (lambda p: _write(p / "clip.mp4", b"\x00\x00\x00\x18ftypmp42"), "not a readable video"),
     (lambda p: _write(p / "still.png", _png(frames(1)[0])), "a still image"),
     (lambda p: p / "missing", "no such file or folder"),
     (lambda p: (p / "empty").mkdir() or p / "empty", "holds 0 files"),
     (lambda p: _write(p / "f" / "notes.txt", b"hello").parent, "notes.txt: not a readable image"),
     (lambda p: [frames(1)[0], frames(1, (28, 28))[0]], "frames differ in size"),
     (lambda p: "data:video/jpeg;base64," + ",".join(["AAAA"] * (MAX_FRAMES + 1)), "frames \\(at most 64\\)"),
     (lambda p: gif_bytes(frames(70), 500), "35.0 s gives 70 frames"),
     (lambda p: "https://example.com/clip.gif", "remote URLs are not fetched")],
)  # fmt: skip
def test_bad_videos_are_one_clear_error(tmp_path, make, message):
    with pytest.raises(ImageError, match=message) as e:
        load_clip(make(tmp_path), what="--video")
    assert "\n" not in str(e.value) and str(e.value).startswith("--video")


def _write(path, data: bytes):
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return path


def _png(img) -> bytes:
    return base64.b64decode(to_data_url(img).split(",", 1)[1])


GIF = gif_bytes(frames(4, (28, 28)), 500)
URLS = st.one_of(
    st.text(max_size=40),
    st.builds(lambda mime, s: f"data:{mime};base64,{s}", st.sampled_from(["video/jpeg", "video/mp4", "image/gif",
              "image/png", "text/plain", "video/jpeg;x"]), st.text("AZaz09+/=,", max_size=40)),
    # a real GIF cut or with bytes changed: Pillow's decoder sees a damaged file
    st.builds(lambda cut, at, byte: GIF[:cut] if at is None else GIF[:at] + bytes([byte]) + GIF[at + 1 :],
              st.integers(0, len(GIF)), st.one_of(st.none(), st.integers(0, len(GIF) - 1)), st.integers(0, 255)),
)  # fmt: skip


@given(source=URLS)
@settings(max_examples=80, deadline=None)
def test_any_video_url_is_a_clip_or_a_400(proc, source):
    from glmstack.multimodal.serving import request_media
    from glmstack.serve.protocol import ApiError

    url = source if isinstance(source, str) else "data:image/gif;base64," + base64.b64encode(source).decode()
    msgs = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]
    try:
        _, media = request_media(msgs, proc)
    except ApiError as e:
        assert e.status == 400 and "\n" not in e.message
        return
    assert media.video_grid_thw.shape == (1, 3)
