"""The decode spellings of RoPE and attention (rope.RopeTable, attention.attend_one) == the training ones."""

import pytest
import torch
import torch.nn.functional as F

from glmstack.model.attention import attend_one, sdpa
from glmstack.model.rope import RopeTable, apply_partial_rope, rope_cos_sin


@pytest.mark.parametrize("head_dim, rotary_dim", [(32, 16), (16, 16)])  # partial (GLM-4.5) and full rotation
def test_rope_table_is_apply_partial_rope_bit_for_bit(head_dim, rotary_dim):
    g = torch.Generator().manual_seed(0)
    x_BTHK = torch.randn(2, 5, 3, head_dim, generator=g) * 10
    pos_BT = torch.tensor([[0, 1, 2, 3, 4], [7, 100, 101, 999, 3]])
    table = RopeTable(1000, head_dim, rotary_dim, 10000.0, torch.float32, "cpu")
    got = table.rotate(x_BTHK, *table.at(pos_BT))
    cos, sin = rope_cos_sin(pos_BT, rotary_dim, 10000.0, torch.float32)
    want = apply_partial_rope(x_BTHK.transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.equal(got, want)


@pytest.mark.parametrize("masked", [False, True])
def test_one_query_attention_equals_sdpa_kernel(masked):
    g = torch.Generator().manual_seed(1)
    B, H, G, S, Dh = 3, 8, 2, 11, 16
    q, k, v = torch.randn(B, H, 1, Dh, generator=g), torch.randn(B, G, S, Dh, generator=g), torch.randn(B, G, S, Dh)
    mask = (torch.rand(B, 1, 1, S, generator=g) > 0.3) | (torch.arange(S) == S - 1) if masked else None
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(attend_one(q[:, :, 0], k, v, mask)[:, :, None], want)
    torch.testing.assert_close(sdpa(q, k, v, mask), want)  # sdpa's one-query branch on CPU
