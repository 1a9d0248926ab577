"""LoRA on the vision-language models (glm4v_moe / glm4v) == PEFT's on transformers' Glm4v(Moe)ForConditionalGeneration.

A random tiny GLMV saved as an HF folder; adapters with non-zero B on the language model (attention, MLPs, the routed
experts per expert) and the ViT (attention, MLPs) written by `save_adapter` under transformers' module names
(`model.language_model.*`, `model.visual.*`); `peft.PeftModel.from_pretrained` on transformers' model of the folder
gives our logits on rows with images of several sizes; and `load_adapter` reads the folder back onto a fresh GLMV.
"""

import pytest
import torch
from vl_helpers import IMAGE_SIZES, hf_logits, image_batch, vl_config

from glmstack.model.lora import LoraConfig, apply_lora, lora_names
from glmstack.model.lora_peft import load_adapter, save_adapter
from glmstack.model.vision import GLMV, load_vl_hf, save_vl_hf

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("PIL")

HF_CLASS = {"glm4v_moe": "Glm4vMoeForConditionalGeneration", "glm4v": "Glm4vForConditionalGeneration"}


@pytest.mark.parametrize("case", ["moe", "dense"])
def test_vl_adapter_loads_in_peft_and_back(case, tmp_path):
    from hf_helpers import randomise_

    cfg = vl_config(case)
    ours = GLMV(cfg).init_weights(seed=3)
    randomise_(ours, seed=4)
    save_vl_hf(ours, tmp_path / "base")
    apply_lora(ours, LoraConfig(r=4, alpha=8, targets=["attention", "mlp", "experts", "visual.blocks.*.attn.*"]))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n in lora_names(ours):
            p = ours.get_parameter(n)
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    assert any(n.startswith("visual.") for n in lora_names(ours))
    save_adapter(ours, tmp_path / "adapter", base=str(tmp_path / "base"))
    hf = getattr(transformers, HF_CLASS[cfg.model_type]).from_pretrained(tmp_path / "base", dtype=torch.float32)
    ids, pv, grid = image_batch(cfg, [[IMAGE_SIZES[0], IMAGE_SIZES[1]], [IMAGE_SIZES[2]]])
    base = hf_logits(hf.eval(), cfg, ids, pixel_values=pv, image_grid_thw=grid)
    pm = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    theirs = hf_logits(pm, cfg, ids, pixel_values=pv, image_grid_thw=grid)
    with torch.no_grad():
        mine = ours.eval()(ids, pixel_values=pv, image_grid_thw=grid).logits
    assert (theirs - base).abs().max() > 1e-2  # the adapter changed transformers' model
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=0)
    again = load_vl_hf(tmp_path / "base", dtype=torch.float32)
    load_adapter(again, tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(ids, pixel_values=pv, image_grid_thw=grid).logits, mine, atol=1e-5,
                                   rtol=0)  # fmt: skip
