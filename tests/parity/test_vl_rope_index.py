"""Property test: glmstack's 3D RoPE positions == transformers' Glm4vModel.get_rope_index on random layouts of text,
images of random grids and videos of random frame counts, with left padding (HF's attention_mask = our segment 0)."""

import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glmstack.model.vision import VLConfig, expand_placeholders, rope_index, token_types

transformers = pytest.importorskip("transformers")

CFG = VLConfig.preset("tiny-glm4.5v")
SIDES = st.sampled_from([2, 4, 6, 8, 10])
ITEM = st.one_of(st.tuples(st.just("text"), st.integers(1, 5)),
                 st.tuples(st.just("image"), SIDES, SIDES),
                 st.tuples(st.just("video"), st.integers(1, 3), SIDES, SIDES))
ROW = st.tuples(st.integers(0, 3), st.lists(ITEM, min_size=1, max_size=5))  # (left padding, items)


def _row(pad, items, images, videos):
    ids = [0] * pad + [7]
    for item in items:
        if item[0] == "text":
            ids += [3] * item[1]
        elif item[0] == "image":
            images.append([1, item[1], item[2]])
            ids += [CFG.image_start_token_id, CFG.image_token_id, CFG.image_end_token_id, 5]
        else:
            videos.append(list(item[1:]))
            ids += [CFG.video_start_token_id, CFG.video_token_id, CFG.video_end_token_id, 6]
    return ids


def _hf_rope_index(ids, image_grid, video_grid, mask):
    from transformers import Glm4vMoeConfig, Glm4vMoeModel

    fake = types.SimpleNamespace(config=Glm4vMoeConfig(**CFG.to_hf()),
                                 get_vision_position_ids=lambda *a, **k: Glm4vMoeModel.get_vision_position_ids(None, *a, **k))
    return Glm4vMoeModel.get_rope_index(fake, ids, token_types(ids, CFG), image_grid_thw=image_grid,
                                        video_grid_thw=video_grid, attention_mask=mask)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(ROW, min_size=1, max_size=3))
def test_rope_index_matches_transformers(rows):
    images, videos, seqs = [], [], []
    for pad, items in rows:
        first_img, first_vid = len(images), len(videos)
        raw = _row(pad, items, images, videos)
        img = torch.tensor(images[first_img:]) if len(images) > first_img else None
        vid = torch.tensor(videos[first_vid:]) if len(videos) > first_vid else None
        stamps = [[[9]] * v[0] for v in videos[first_vid:]]  # one timestamp token per frame
        seqs.append((pad, expand_placeholders(raw, CFG, img, vid, frame_text=stamps)))
    T = max(len(s) for _, s in seqs)
    ids = torch.tensor([[0] * (T - len(s)) + s for _, s in seqs])  # extra left padding up to T
    seg = torch.tensor([[0] * (T - len(s) + pad) + [1] * (len(s) - pad) for pad, s in seqs])
    image_grid = torch.tensor(images) if images else None
    video_grid = torch.tensor(videos) if videos else None
    ours, nxt = rope_index(ids, CFG, image_grid, video_grid, segment_ids_BT=seg)
    ref, deltas = _hf_rope_index(ids, image_grid, video_grid, seg != 0)
    keep = (seg != 0)[None].expand(3, -1, -1)
    assert torch.equal(ours[keep], ref[keep])
    assert torch.equal(nxt, (seg != 0).sum(1) + deltas[:, 0])  # HF: next position = tokens + rope delta
