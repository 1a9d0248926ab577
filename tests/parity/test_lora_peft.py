"""LoRA adapters == PEFT's, both directions, on transformers' GLM models (issue 37's parity acceptance).

glmstack -> PEFT: a random base saved as an HF folder, adapters on every weight (attention, MLA's projections, dense
and shared-expert MLPs, per-expert adapters on the routed banks, the DSA indexer) with non-zero B, written by
`save_adapter`; `peft.PeftModel.from_pretrained` on transformers' model of that folder gives the same logits.
PEFT -> glmstack: an adapter PEFT makes (`init_lora_weights=False`, experts through `target_parameters`) on a random
transformers model, loaded by `load_adapter` onto our model of the same base: the same logits.
Tiny random configs of glm4_moe, glm4_moe_lite and glm_moe_dsa (IndexShare on); MTP off (transformers has none).
"""

import pytest
import torch
from hf_helpers import hf_model, random_ids, randomise_

from glmstack.errors import CheckpointError
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.model.lora import LoraConfig, apply_lora, lora_names
from glmstack.model.lora_peft import load_adapter, read_adapter, save_adapter

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

CASES = {
    "glm4_moe": ("tiny", {}),
    "glm4_moe_lite": ("tiny-glm47-flash", {}),
    "glm_moe_dsa": ("tiny-glm5", {"index_topk": 6, "num_hidden_layers": 4,
                                  "indexer_types": ["full", "shared", "full", "shared"]}),
}  # fmt: skip
HF_CLASS = {"glm4_moe": "Glm4MoeForCausalLM", "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
            "glm_moe_dsa": "GlmMoeDsaForCausalLM"}  # fmt: skip
ATTN = {
    "glm4_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "glm4_moe_lite": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"],
    "glm_moe_dsa": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "wq_b", "wk"],
}


def tiny(kind):
    preset, extra = CASES[kind]
    return ModelConfig.preset(preset, **extra, num_nextn_predict_layers=0, num_mtp_depths=0)


def hf_tie_order(model):
    """DSA top-k ties in torch.topk's order, as transformers (see test_glm5_hf.py)."""
    for attn in model.attentions():
        if getattr(attn, "indexer", None) is not None:
            attn.indexer.stable_ties = False
    return model


@torch.no_grad()
def train_like(model, seed=5):
    """Non-zero adapters, as after training."""
    g = torch.Generator().manual_seed(seed)
    for n in lora_names(model):
        p = model.get_parameter(n)
        p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize("kind", list(CASES))
def test_glmstack_adapter_loads_in_peft(kind, tmp_path):
    cfg = tiny(kind)
    ours = GLM(cfg).init_weights(seed=3)
    randomise_(ours, seed=4)
    save_hf(ours, tmp_path / "base")
    targets = ["attention", "mlp", "experts"] + (["indexer"] if kind == "glm_moe_dsa" else [])
    apply_lora(ours, LoraConfig(r=4, alpha=8, use_rslora=kind == "glm4_moe_lite", targets=targets))
    train_like(ours)
    save_adapter(ours, tmp_path / "adapter", base=str(tmp_path / "base"))
    hf_tie_order(ours).eval()
    hf = getattr(transformers, HF_CLASS[kind]).from_pretrained(tmp_path / "base", dtype=torch.float32).eval()
    ids = random_ids(cfg, seed=1)
    with torch.no_grad():
        base = hf(ids).logits
        pm = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
        a, b = ours(ids).logits, pm(ids).logits
    assert (b - base).abs().max() > 1e-2  # the adapter changed transformers' model
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", list(CASES))
def test_peft_adapter_loads_in_glmstack(kind, tmp_path):
    cfg = tiny(kind)
    hf = hf_model(cfg)
    hf.save_pretrained(tmp_path / "base")
    mlp = [f"{p}.{n}.weight" for p in ("mlp", "shared_experts") for n in ("gate_proj", "up_proj", "down_proj")]
    config = peft.LoraConfig(
        r=4,
        lora_alpha=12,
        init_lora_weights=False,
        target_modules=ATTN[kind],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj", *mlp],
    )
    pm = peft.get_peft_model(hf, config).eval()
    pm.save_pretrained(tmp_path / "adapter")
    ours = hf_tie_order(load_hf(tmp_path / "base", dtype=torch.float32))
    names = load_adapter(ours, tmp_path / "adapter")
    assert any("experts.lora_A.down_proj" in n for n in names) and any("shared_experts" in n for n in names)
    ids = random_ids(cfg, seed=2)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids).logits, pm(ids).logits, atol=1e-4, rtol=0)


def test_one_bank_only_and_round_trip(tmp_path):
    """Only down_proj adapted (PEFT's un-nested key), and glmstack -> disk -> glmstack is exact."""
    cfg = tiny("glm4_moe")
    ours = GLM(cfg).init_weights(seed=0)
    apply_lora(ours, LoraConfig(r=2, targets=["*mlp.experts.down_proj", "*.q_proj"]))
    train_like(ours)
    save_adapter(ours, tmp_path / "a")
    config, tensors = read_adapter(tmp_path / "a")
    assert config["target_parameters"] == [f"model.layers.{i}.mlp.experts.down_proj" for i in (1, 2)]
    assert "model.layers.1.mlp.experts.lora_B.weight" in tensors
    again = GLM(cfg).init_weights(seed=0)
    load_adapter(again, tmp_path / "a")
    ids = random_ids(cfg)
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, ours(ids).logits, atol=0, rtol=0)


def test_adapter_for_another_base_is_refused(tmp_path):
    small = GLM(tiny("glm4_moe")).init_weights(seed=0)
    apply_lora(small, LoraConfig(r=2))
    save_adapter(small, tmp_path / "a")
    other = GLM(ModelConfig.preset("tiny", hidden_size=96, num_nextn_predict_layers=0)).init_weights(seed=0)
    with pytest.raises(CheckpointError, match="does not fit the model"):
        load_adapter(other, tmp_path / "a")
    lite = GLM(tiny("glm4_moe_lite")).init_weights(seed=0)
    with pytest.raises(CheckpointError, match="no such module"):
        load_adapter(lite, tmp_path / "a")


def test_qlora_expert_adapter_loads_in_peft(tmp_path):
    """Adapters trained on an INT4 base's per-expert Linears, written as banks with rank_pattern (gate_up at 2r),
    load in PEFT onto the unquantized base as glmstack loads them."""
    from glmstack.inference.quant import quantize_

    cfg = tiny("glm4_moe")
    base = GLM(cfg).init_weights(seed=3)
    save_hf(base, tmp_path / "base")
    q = quantize_(GLM(cfg).init_weights(seed=3), "int4")
    apply_lora(q, LoraConfig(r=2, alpha=4, targets=["experts", "attention"]))
    train_like(q)
    save_adapter(q, tmp_path / "adapter")
    load_adapter(base, tmp_path / "adapter")
    hf = transformers.Glm4MoeForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).eval()
    pm = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    ids = random_ids(cfg, seed=4)
    with torch.no_grad():
        torch.testing.assert_close(base.eval()(ids).logits, pm(ids).logits, atol=1e-4, rtol=0)
