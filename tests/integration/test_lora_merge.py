"""`glmstack merge BASE ADAPTER --out DIR`: the merged checkpoint equals the unmerged model within 1e-5, also when
transformers reads it; adapters from a LoRA stage and from PEFT both merge; a mismatched adapter is refused."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))
from hf_helpers import random_ids, randomise_

from glmstack.cli import main
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.model.lora import LoraConfig, apply_lora, lora_names, merged_state_dict
from glmstack.model.lora_peft import save_adapter

ALL = ["attention", "mlp", "experts", "indexer", "mtp"]


@pytest.mark.parametrize("preset", ["tiny", "tiny-glm5"])
def test_merged_checkpoint_equals_unmerged(preset, tmp_path, capsys):
    cfg = ModelConfig.preset(preset)
    model = GLM(cfg).init_weights(seed=0)
    randomise_(model, seed=2)
    save_hf(model, tmp_path / "base")
    apply_lora(model, LoraConfig(r=4, alpha=4, targets=ALL))
    with torch.no_grad():
        for n in lora_names(model):
            model.get_parameter(n).normal_(0, 0.1)
    save_adapter(model, tmp_path / "adapter")
    assert main(["merge", str(tmp_path / "base"), str(tmp_path / "adapter"), "--out", str(tmp_path / "m")]) == 0
    assert "wrote" in capsys.readouterr().out
    merged = load_hf(tmp_path / "m")
    ids = random_ids(cfg)
    with torch.no_grad():
        a, b = model.eval()(ids, labels=ids), merged.eval()(ids, labels=ids)
        base = load_hf(tmp_path / "base")(ids).logits
    assert (a.logits - base).abs().max() > 1e-2
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.mtp_loss[0], a.mtp_loss[0], atol=1e-5, rtol=0)  # the MTP layer merged too


def test_merged_folder_carries_the_tokenizer(tmp_path):
    """A stage writes its tokenizer next to its adapter; the merged folder gets it, so it serves and evaluates as is."""
    from glmstack.tokenizer import Tokenizer

    cfg = ModelConfig.preset("tiny")
    model = GLM(cfg).init_weights(seed=0)
    save_hf(model, tmp_path / "base")
    apply_lora(model, LoraConfig(r=2, alpha=2, targets=["attention"]))
    save_adapter(model, tmp_path / "adapter")
    tok = Tokenizer.train(["What is 2 + 3? The answer is 5."] * 4, vocab_size=300)
    tok.save(tmp_path / "adapter")
    assert main(["merge", str(tmp_path / "base"), str(tmp_path / "adapter"), "--out", str(tmp_path / "m")]) == 0
    assert Tokenizer.load(tmp_path / "m").encode("The answer is 5.") == tok.encode("The answer is 5.")


def test_merged_folder_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = ModelConfig.preset("tiny", num_nextn_predict_layers=0)
    model = GLM(cfg).init_weights(seed=0)
    save_hf(model, tmp_path / "base")
    apply_lora(model, LoraConfig(r=2))
    with torch.no_grad():
        for n in lora_names(model):
            model.get_parameter(n).normal_(0, 0.1)
    save_adapter(model, tmp_path / "adapter")
    main(["merge", str(tmp_path / "base"), str(tmp_path / "adapter"), "--out", str(tmp_path / "m")])
    hf = transformers.Glm4MoeForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    ids = random_ids(cfg)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model.eval()(ids).logits, atol=1e-5, rtol=0)


def test_merge_refuses_an_adapter_for_another_base(tmp_path, capsys):
    save_hf(GLM(ModelConfig.preset("tiny")).init_weights(seed=0), tmp_path / "base")
    other = GLM(ModelConfig.preset("tiny", hidden_size=96)).init_weights(seed=0)
    apply_lora(other, LoraConfig(r=2))
    save_adapter(other, tmp_path / "adapter")
    assert main(["merge", str(tmp_path / "base"), str(tmp_path / "adapter"), "--out", str(tmp_path / "m")]) != 0
    assert "does not fit the model" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_engine_decodes_an_adapted_model_as_its_merged_twin():
    """The inference engine runs a model with adapters through its modules (its fast path copies base weights only):
    greedy tokens equal the merged model's, which the fast path runs."""
    from glmstack.inference import Engine

    cfg = ModelConfig.preset("tiny")
    model = GLM(cfg).init_weights(seed=0)
    apply_lora(model, LoraConfig(r=4, alpha=8, targets=ALL))
    with torch.no_grad():
        for n in lora_names(model):
            model.get_parameter(n).normal_(0, 0.2)
    merged = GLM(cfg)
    merged.load_state_dict(merged_state_dict(model), assign=True)
    prompts = [[5, 9, 11, 3], [7, 1]]
    ours = Engine(model.eval()).generate(prompts, max_new_tokens=12, temperature=0.0)
    want = Engine(merged.eval()).generate(prompts, max_new_tokens=12, temperature=0.0)
    base = Engine(GLM(cfg).init_weights(seed=0).eval()).generate(prompts, max_new_tokens=12, temperature=0.0)
    assert ours.tokens == want.tokens != base.tokens
