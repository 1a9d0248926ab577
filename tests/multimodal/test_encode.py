"""Images and videos through the chat format: ids equal transformers' Glm4vProcessor, masks never train image
tokens, the video patch layout equals Glm4vVideoProcessor.patchify, bad images are one ImageError line."""

import numpy as np
import pytest
import torch
from PIL import Image

from glmstack.chat import encode
from glmstack.chat.encode import encode_segments
from glmstack.multimodal.encode import encode_multimodal, split_media
from glmstack.multimodal.images import ImageError, load_image, to_data_url
from glmstack.multimodal.video import load_clip

RED = Image.new("RGB", (100, 60), (255, 0, 0))
TALL = Image.new("RGB", (30, 200), (0, 0, 255))


def chat(*parts, answer="red"):
    return [{"role": "user", "content": list(parts)}, {"role": "assistant", "content": answer}]


def hf_processor(tok_dir, proc, monkeypatch, video_processor=None):
    from transformers import AutoTokenizer
    from transformers.processing_utils import ProcessorMixin

    # Glm4vProcessor checks its video processor's class through torchvision's registry; torchvision is not
    # installed (test_video.py's reference video processor stands in for it), so that check (only) is skipped.
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
    from transformers.models.glm4v.processing_glm4v import Glm4vProcessor

    return Glm4vProcessor(image_processor=proc.hf, tokenizer=AutoTokenizer.from_pretrained(tok_dir),
                          video_processor=video_processor)  # fmt: skip


@pytest.mark.parametrize("sizes", [[(100, 60)], [(100, 60), (30, 200)], [(28, 28), (144, 48), (57, 91)]])
def test_ids_and_pixels_equal_transformers_glm4v_processor(tok, tok_dir, proc, monkeypatch, sizes):
    images = [Image.new("RGB", s, (40 * i, 200, 90)) for i, s in enumerate(sizes)]
    parts = [{"type": "image", "image": im} for im in images[:1]] + [{"type": "text", "text": "What colour?"}]
    parts += [{"type": "image", "image": im} for im in images[1:]]
    msgs = chat(*parts)
    enc = encode_multimodal(tok, proc, msgs)
    text = "".join(s.text for s in encode_segments(split_media(msgs)[0]))
    ref = hf_processor(tok_dir, proc, monkeypatch)(text=[text], images=images, return_tensors="np")
    assert enc.ids == ref["input_ids"][0].tolist()
    np.testing.assert_array_equal(enc.media.pixel_values, ref["pixel_values"])
    np.testing.assert_array_equal(enc.media.image_grid_thw, ref["image_grid_thw"])


def test_image_tokens_are_context_and_text_mask_unchanged(tok, proc):
    msgs = chat({"type": "image", "image": RED}, {"type": "text", "text": "What colour?"})
    enc = encode_multimodal(tok, proc, msgs)
    image_id = tok.token_id("<|image|>")
    n_image = proc.image_tokens(enc.media.image_grid_thw[0])
    assert enc.ids.count(image_id) == n_image == 8  # 100x60 -> 112x56 pixels -> 8x4 patches -> 4x2 tokens
    assert all(m == 0 for i, m in zip(enc.ids, enc.loss_mask) if i == image_id)
    # the trained tokens are exactly those of the same chat without the image
    _, text_mask = encode(tok, chat({"type": "text", "text": "What colour?"}))
    trained = [i for i, m in zip(enc.ids, enc.loss_mask) if m]
    assert trained == [i for i, m in zip(*encode(tok, chat({"type": "text", "text": "What colour?"}))) if m]
    assert sum(text_mask) == sum(enc.loss_mask)


def test_openai_image_url_parts_and_rendered_placement(tok, proc):
    url = to_data_url(RED)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Look: "},
                                         {"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": " colour?"}]}]  # fmt: skip
    enc = encode_multimodal(tok, proc, msgs, add_generation_prompt=True)
    text = tok.decode(enc.ids)
    assert text == ("[gMASK]<sop><|user|>\nLook: <|begin_of_image|>" + "<|image|>" * 8 + "<|end_of_image|> colour?"
                    "<|assistant|>")  # fmt: skip
    assert enc.media.model_inputs()["pixel_values"].shape == (32, 3 * 2 * 14 * 14)


def test_video_frames_expand_per_temporal_patch(tok, proc):
    frames = [Image.new("RGB", (90, 60), (30 * i, 0, 0)) for i in range(5)]  # odd: the last frame repeats
    msgs = chat({"type": "video", "video": frames}, {"type": "text", "text": "What happens?"})
    enc = encode_multimodal(tok, proc, msgs)
    t, h, w = enc.media.video_grid_thw[0].tolist()
    assert t == 3 and enc.media.pixel_values_videos.shape == (t * h * w, 3 * 2 * 14 * 14)
    per = h * w // 4
    frame = lambda s: "<|begin_of_image|>" + "<|image|>" * per + f"<|end_of_image|>{s}"
    assert "<|begin_of_video|>" + frame(0) + frame(1) + frame(2) + "<|end_of_video|>" in tok.decode(enc.ids)


def test_video_patch_layout_equals_transformers_patchify(proc):
    from transformers.models.glm4v.video_processing_glm4v import Glm4vVideoProcessor

    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 255, (28, 56, 3), dtype=np.uint8)) for _ in range(4)]  # kept at this size
    patches, grid, stamps = proc.video(load_clip(frames))  # taken at 2 fps
    norm, _ = proc.images(frames, do_resize=False)  # per-frame normalised pixels, as (N, C, T, P, P) copies
    per_frame = torch.from_numpy(norm.reshape(4, -1, 3, 2, 14, 14)[:, :, :, 0])  # (F, N, C, P, P)
    # back to (1, F, C, H, W) images in raster order of merge blocks, then transformers' patchify
    gh, gw = grid[1], grid[2]
    x = per_frame.reshape(4, gh // 2, gw // 2, 2, 2, 3, 14, 14).permute(0, 5, 1, 3, 6, 2, 4, 7)
    video = x.reshape(1, 4, 3, gh * 14, gw * 14)
    ref, *ref_grid = Glm4vVideoProcessor.patchify(None, video, patch_size=14, merge_size=2, temporal_patch_size=2)
    assert list(ref_grid) == grid and stamps == [0.0, 1.0]
    np.testing.assert_array_equal(patches, ref[0].numpy())


@pytest.mark.parametrize(
    ("source", "message"),
    [("missing.png", "no such file"), ("https://example.com/a.png", "remote URLs are not fetched"),
     ("data:image/png;base64,!!!", "not valid base64"), ("data:text/plain;base64,aGk=", "not an image"),
     (b"not an image", "not a readable image")],
)  # fmt: skip
def test_bad_images_are_one_clear_error(source, message):
    with pytest.raises(ImageError, match=message):
        load_image(source)


def test_images_outside_user_turns_and_placeholder_mismatch_are_errors(tok, proc):
    bad = [{"role": "system", "content": [{"type": "image", "image": RED}]}]
    with pytest.raises(ImageError, match="user turns only"):
        encode_multimodal(tok, proc, bad)
    with pytest.raises(ImageError, match="more <\\|image\\|> placeholders"):
        encode_multimodal(tok, proc, chat({"type": "text", "text": "typed <|image|> by hand"}))
