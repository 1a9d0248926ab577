"""glmstack GLMV == transformers Glm4vMoeForConditionalGeneration / Glm4vForConditionalGeneration.

Random tiny configs (vl_helpers.VL_CASES), every tensor random; images of several sizes and aspect ratios through
transformers' Glm4vImageProcessorPil; logits <= 1e-4 in both load directions (we load the folder transformers
saved; transformers loads the folder we saved), the loss, and a short video.
"""

import pytest
import torch

from glmstack.model.vision import load_vl_hf, save_vl_hf, token_types

from hf_helpers import shifted_labels
from vl_helpers import IMAGE_SIZES, VL_CASES, hf_logits, hf_vl_model, image_batch, vl_config

pytest.importorskip("transformers")
pytest.importorskip("PIL")

ROWS = [[IMAGE_SIZES[0], IMAGE_SIZES[1]], [IMAGE_SIZES[2]], [IMAGE_SIZES[3], IMAGE_SIZES[4]]]


@pytest.mark.parametrize("case", list(VL_CASES))
def test_hf_to_glmstack_logits_and_loss(case, tmp_path):
    cfg = vl_config(case)
    hf = hf_vl_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = load_vl_hf(tmp_path, dtype=torch.float32)
    ids, pv, grid = image_batch(cfg, ROWS)
    assert len({tuple(g) for g in grid.tolist()}) == len(grid)  # several sizes and aspect ratios
    ref = hf_logits(hf, cfg, ids, pixel_values=pv, image_grid_thw=grid)
    with torch.no_grad():
        out = ours(ids, labels=shifted_labels(ids), pixel_values=pv, image_grid_thw=grid)
        ref_loss = hf(input_ids=ids, labels=ids, pixel_values=pv, image_grid_thw=grid,
                      mm_token_type_ids=token_types(ids, cfg)).loss
    torch.testing.assert_close(out.logits, ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(out.lm_loss, ref_loss, atol=1e-5, rtol=0)
    text_only = ids[:, :5]  # no image: the plain text path matches too
    torch.testing.assert_close(ours(text_only).logits, hf_logits(hf, cfg, text_only), atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["moe_groups_tied", "dense"])
def test_glmstack_to_hf_logits(case, tmp_path):
    cfg = vl_config(case)
    hf_vl_model(cfg).save_pretrained(tmp_path / "src")
    ours = load_vl_hf(tmp_path / "src", dtype=torch.float32)
    save_vl_hf(ours, tmp_path / "ours")
    cls = type(hf_vl_model(cfg))
    hf = cls.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    ids, pv, grid = image_batch(cfg, [[IMAGE_SIZES[1], IMAGE_SIZES[3]]], seed=3)
    with torch.no_grad():
        a = ours(ids, pixel_values=pv, image_grid_thw=grid).logits
    torch.testing.assert_close(a, hf_logits(hf, cfg, ids, pixel_values=pv, image_grid_thw=grid), atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["moe", "dense"])
def test_video_matches_hf(case, tmp_path):
    """A two-frame-patch video of 2 x (1, 4, 6) frames: frames written with image tokens inside the video markers."""
    cfg = vl_config(case)
    hf = hf_vl_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = load_vl_hf(tmp_path, dtype=torch.float32)
    grid = torch.tensor([[2, 4, 6]])
    pixels = torch.randn(2 * 4 * 6, cfg.vision_config.patch_dim, generator=torch.Generator().manual_seed(0))
    per_frame = [cfg.image_start_token_id] + [cfg.image_token_id] * 6 + [cfg.image_end_token_id, 17]
    ids = torch.tensor([[5, 6, cfg.video_start_token_id, *per_frame, *per_frame, cfg.video_end_token_id, 7, 8]])
    with torch.no_grad():
        a = ours(ids, pixel_values_videos=pixels, video_grid_thw=grid).logits
    b = hf_logits(hf, cfg, ids, pixel_values_videos=pixels, video_grid_thw=grid)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", ["moe", "dense"])
def test_gradients_match_hf(case, tmp_path):
    """Backward of the LM loss with images: every ViT, merger and decoder gradient equals transformers'."""
    cfg = vl_config(case)
    hf = hf_vl_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = load_vl_hf(tmp_path, dtype=torch.float32)
    ids, pv, grid = image_batch(cfg, [[IMAGE_SIZES[0], IMAGE_SIZES[4]]], seed=5)
    hf(input_ids=ids, labels=ids, pixel_values=pv, image_grid_thw=grid,
       mm_token_type_ids=token_types(ids, cfg)).loss.backward()
    ours(ids, labels=shifted_labels(ids), pixel_values=pv, image_grid_thw=grid).lm_loss.backward()
    for name, p in ours.named_parameters():
        hf_name = "lm_head.weight" if name == "language_model.lm_head.weight" else "model." + name
        torch.testing.assert_close(p.grad, hf.get_parameter(hf_name).grad, atol=1e-5, rtol=1e-4, msg=name)


def test_left_padded_batch_with_attention_mask(tmp_path):
    """A processor-style batch (input_ids, attention_mask with left padding, pixel_values, image_grid_thw,
    mm_token_type_ids): every real token's logits match transformers'."""
    cfg = vl_config("moe")
    hf = hf_vl_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = load_vl_hf(tmp_path, dtype=torch.float32)
    ids, pv, grid = image_batch(cfg, [[IMAGE_SIZES[1]], [IMAGE_SIZES[4]]], seed=7)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding: row 0's first 4 tokens (text) are padding
    ids[0, :4] = 0
    batch = dict(input_ids=ids, attention_mask=mask, pixel_values=pv, image_grid_thw=grid,
                 mm_token_type_ids=token_types(ids, cfg))
    with torch.no_grad():
        a, b = ours(**batch).logits, hf(**batch).logits
    keep = mask.bool()
    torch.testing.assert_close(a[keep], b[keep], atol=1e-4, rtol=0)
