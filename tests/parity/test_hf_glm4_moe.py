"""glmstack GLM == transformers Glm4MoeForCausalLM: logits, loss and gradients, checkpoints both directions.

Six random tiny configs (tests/parity/hf_helpers.py CASES); every tensor randomised, the balancing bias included.
"""

import pytest
import torch

from glmstack.model import load_hf, save_hf

from hf_helpers import CASES, hf_model, shifted_labels, tiny_config

pytest.importorskip("transformers")


def _ids(cfg, B=2, T=24, seed=0):
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_glmstack_logits_loss_grads(case, tmp_path):
    cfg = tiny_config(case, num_nextn_predict_layers=0)  # HF's main model has no MTP layer to save
    hf = hf_model(cfg)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=torch.float32)
    ids = _ids(cfg)

    ref = hf(ids, labels=ids)
    out = ours(ids, labels=shifted_labels(ids))
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-4, rtol=0)
    assert torch.equal(out.logits.argmax(-1), ref.logits.argmax(-1))
    torch.testing.assert_close(out.lm_loss, ref.loss, atol=1e-5, rtol=0)

    ref.loss.backward()
    out.lm_loss.backward()
    for name, p in ours.named_parameters():
        hf_name = name if name == "lm_head.weight" else "model." + name
        torch.testing.assert_close(p.grad, hf.get_parameter(hf_name).grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("case", ["base", "groups_no_norm_topk", "tied"])
def test_glmstack_to_hf_logits(case, tmp_path):
    from transformers import Glm4MoeForCausalLM

    cfg = tiny_config(case, num_nextn_predict_layers=0)
    ours = load_hf(_save_hf_model(cfg, tmp_path / "src"), dtype=torch.float32)
    save_hf(ours, tmp_path / "ours")
    hf = Glm4MoeForCausalLM.from_pretrained(tmp_path / "ours", dtype=torch.float32).eval()
    ids = _ids(cfg, seed=1)
    with torch.no_grad():
        a, b = ours(ids).logits, hf(ids).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_round_trip_bf16_sharded_keeps_router_fp32(tmp_path):
    cfg = tiny_config("base", num_nextn_predict_layers=0)
    ours = load_hf(_save_hf_model(cfg, tmp_path / "src"), dtype=torch.float32)
    save_hf(ours, tmp_path / "bf16", dtype=torch.bfloat16, max_shard_bytes=40_000)
    assert (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    back = load_hf(tmp_path / "bf16")
    assert back.embed_tokens.weight.dtype == torch.bfloat16
    router = back.layers[1].mlp.gate
    assert router.weight.dtype == router.e_score_correction_bias.dtype == torch.float32
    torch.testing.assert_close(router.e_score_correction_bias, ours.layers[1].mlp.gate.e_score_correction_bias)
    for (n, a), b in zip(ours.state_dict().items(), back.state_dict().values()):
        torch.testing.assert_close(a.to(b.dtype), b, atol=0, rtol=0, msg=n)


def _save_hf_model(cfg, folder):
    hf_model(cfg).save_pretrained(folder)
    return folder
