"""GLM: the output contract, packed documents, KV cache, init, and meta-device accounting of the released sizes."""

import pytest
import torch

from glmstack.model import GLM, ModelConfig, SimpleKVCache


@pytest.fixture(scope="module")
def tiny():
    return GLM(ModelConfig.preset("tiny")).init_weights(seed=0).eval()


def _ids(T=16, B=2, V=512, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def test_released_sizes_counted_on_meta():
    """arXiv 2508.06471: GLM-4.5 355B total / 32B active, Air 106B / 12B (MTP counted; embeddings and head not)."""
    for name, total, active in [("glm-4.5", 355e9, 32e9), ("glm-4.5-air", 106e9, 12e9)]:
        model = GLM(ModelConfig.preset(name))
        assert all(p.is_meta for p in model.parameters())
        assert model.num_params(include_embeddings=False) == pytest.approx(total, rel=0.025)
        assert model.num_params(active=True, include_embeddings=False) == pytest.approx(active, rel=0.045)
        assert model.flops_per_token(4096) > 6 * active
    big = GLM(ModelConfig.preset("glm-4.5"))
    assert big.kv_cache_bytes_per_token(torch.bfloat16, include_mtp=False) == 2 * 92 * 8 * 128 * 2


def test_output_contract(tiny):
    ids = _ids()
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)
    out = tiny(ids, labels=labels)
    cfg = tiny.cfg
    assert out.logits.shape == (2, 16, cfg.vocab_size) and out.hidden.shape == (2, 16, cfg.hidden_size)
    assert len(out.mtp_loss) == cfg.num_nextn_predict_layers
    assert out.expert_load.shape == (cfg.n_moe_layers, cfg.n_routed_experts)
    assert out.expert_load.sum() == 2 * 16 * cfg.num_experts_per_tok * cfg.n_moe_layers
    want = out.lm_loss + 0.3 * torch.stack(out.mtp_loss).mean() + 1e-4 * out.aux_loss
    torch.testing.assert_close(out.loss, want)
    torch.testing.assert_close(tiny(ids, labels=labels, mtp_weight=0, aux_loss_weight=0).loss, out.lm_loss)
    assert tiny(ids).loss is None and tiny(ids).expert_load[-1].sum() == 0  # MTP runs only with labels


def test_segments_do_not_attend_across(tiny):
    a, b = _ids(T=10, B=1, seed=1), _ids(T=6, B=1, seed=2)
    packed = torch.cat([a, b], 1)
    seg = torch.tensor([[0] * 10 + [1] * 6])
    pos = torch.cat([torch.arange(10), torch.arange(6)])[None]
    with torch.no_grad():
        out = tiny(packed, segment_ids=seg, position_ids=pos).logits
        torch.testing.assert_close(out[:, :10], tiny(a).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(out[:, 10:], tiny(b).logits, atol=1e-5, rtol=0)


def test_kv_cache_decode_equals_full_forward(tiny):
    ids = _ids(T=12)
    with torch.no_grad():
        full = tiny(ids).logits
        cache = SimpleKVCache()
        steps = [tiny(ids[:, :5], cache=cache).logits]
        steps += [tiny(ids[:, 5:8], cache=cache).logits]  # a multi-token chunk after a prefix
        steps += [tiny(ids[:, t:t + 1], cache=cache).logits for t in range(8, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    assert cache.seq_len == 12


def test_init_is_deterministic_and_follows_docstring():
    a = GLM(ModelConfig.preset("tiny")).init_weights(seed=3)
    b = GLM(ModelConfig.preset("tiny")).init_weights(seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert torch.equal(a.norm.weight, torch.ones_like(a.norm.weight))
    assert a.layers[1].mlp.gate.e_score_correction_bias.abs().sum() == 0
    assert a.layers[0].self_attn.q_proj.bias.abs().sum() == 0
    assert abs(a.layers[1].mlp.experts.gate_up_proj.std().item() - 0.02) < 2e-3


def test_bf16_keeps_router_fp32_and_runs():
    model = GLM(ModelConfig.preset("tiny"), dtype=torch.bfloat16).init_weights(seed=0)
    assert model.layers[1].mlp.gate.weight.dtype == torch.float32
    assert model.layers[1].mlp.experts.down_proj.dtype == torch.bfloat16
    ids = _ids()
    out = model(ids, labels=ids)
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    out.loss.backward()


def test_tied_embeddings_share_storage():
    model = GLM(ModelConfig.preset("tiny", tie_word_embeddings=True)).init_weights(seed=0)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.num_params() == GLM(ModelConfig.preset("tiny")).num_params() - 512 * 64


def test_mtp_targets_shift_and_respect_segments():
    from glmstack.model.mtp import mtp_targets

    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    labels = torch.tensor([[11, 12, 13, -100, 15, -100]])
    seg = torch.tensor([[0, 0, 0, 0, 1, 1]])
    next_ids, next_labels = mtp_targets(ids, labels, 1, seg)
    assert next_ids.tolist() == [[11, 12, 13, 14, 15, 0]]
    assert next_labels.tolist() == [[12, 13, -100, -100, -100, -100]]  # t=3 would read document 1's label


def test_cli_lists_convert():
    from glmstack.cli import main

    with pytest.raises(SystemExit) as e:
        main(["convert", "--help"])
    assert e.value.code == 0
