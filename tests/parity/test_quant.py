"""INT4 / FP8 weights (inference/quant.py): the kernels == their dequantized reference, the model stays close to full
precision and decodes exactly as its own quantized forward, a released-style FP8 folder loads with its weights as
stored, and `glmstack generate --quantize` runs."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from glmstack.inference import Engine
from glmstack.inference.cli import generate_main
from glmstack.inference.quant import (
    FP8Linear,
    Int4Linear,
    QuantError,
    fp8_dequantize,
    int4_dequantize,
    int4_quantize,
    quantize_,
    weight_bytes,
)
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.model.hf import CheckpointError
from glmstack.tokenizer import Tokenizer


def tiny(seed=0):
    return GLM(ModelConfig.preset("tiny")).init_weights(seed=seed).eval()


def naive_greedy(model, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_int4_kernel_equals_dequantized_weight():
    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(96, 128, generator=g), torch.randn(96, generator=g), torch.randn(2, 3, 128, generator=g)
    q, scale, zero = int4_quantize(w, 32)
    deq = int4_dequantize(q, scale, zero)
    assert (w - deq).abs().max() <= scale.max() / 2 + 1e-6  # round to nearest of 16 levels per group
    lin = Int4Linear(w, b, group=32)
    ref = F.linear(x, deq, b)  # the kernel runs in bf16 (8 mantissa bits): ~1% of the output's range
    torch.testing.assert_close(lin(x), ref, rtol=0, atol=0.01 * ref.abs().max().item())


def test_fp8_blocks_round_trip_within_e4m3_precision():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(200, 300, generator=g) * torch.logspace(-3, 1, 300)  # scales differ across blocks
    lin = FP8Linear.from_weight(w)
    assert lin.weight.dtype == torch.float8_e4m3fn and lin.weight_scale_inv.shape == (2, 3)
    deq = fp8_dequantize(lin.weight, lin.weight_scale_inv)
    block_max = lin.weight_scale_inv.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :300] * 448
    assert ((w - deq).abs() <= w.abs() * 2**-4 + block_max * 2**-9 / 448).all()  # 3 mantissa bits; subnormals
    x = torch.randn(4, 300, generator=g)
    torch.testing.assert_close(lin(x), F.linear(x, deq))


@pytest.mark.parametrize("scheme", ["int4", "fp8"])
def test_quantized_model_is_close_and_decodes_as_its_own_forward(scheme):
    full, model = tiny(), quantize_(tiny(), scheme)
    assert weight_bytes(model) < weight_bytes(full)
    x = torch.randint(1, 512, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref, out = full(x).logits, model(x).logits
    # random Gaussian weights, 3 layers: measured 15% (int4) and 5.6% (fp8) mean deviation of the logits
    assert (out - ref).abs().mean() < {"int4": 0.25, "fp8": 0.1}[scheme] * ref.abs().mean()
    engine = Engine(model)
    assert not engine.fast  # the reference forward: the fast path's fp copies would undo the quantization
    prompts = [[5, 17, 300, 2], [11, 3]]
    res = engine.generate(prompts, 8, stop_ids=[])
    assert res.tokens == [naive_greedy(model, p, 8) for p in prompts]
    assert engine.generate(prompts, 8, stop_ids=[], speculative="mtp", draft_k=2).tokens == res.tokens


MLA_SHAPE = {"kv_lora_rank": 32, "qk_rope_head_dim": 16}  # int4: inputs a multiple of 32, outputs of 16


@pytest.mark.parametrize("preset", ["tiny-glm5", "tiny-glm47-flash"])
@pytest.mark.parametrize("scheme", ["int4", "fp8"])
def test_quantized_mla_model_is_close_and_its_absorbed_decode_equals_its_forward(preset, scheme):
    """MLA (GLM-5 with DSA, GLM-4.7-Flash): the latent projections, kv_b_proj and the indexer quantized; decoding with a
    cache takes the absorbed path, which dequantizes kv_b_proj (mla.py w_uk_uv), and equals the full recompute."""
    cfg = ModelConfig.preset(preset, **MLA_SHAPE)
    full, model = GLM(cfg).init_weights(seed=0).eval(), quantize_(GLM(cfg).init_weights(seed=0).eval(), scheme)
    kv_b = model.layers[0].self_attn.kv_b_proj
    assert isinstance(kv_b, Int4Linear if scheme == "int4" else FP8Linear)
    assert weight_bytes(model) < 0.5 * weight_bytes(full)
    x = torch.randint(1, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref, out = full(x).logits, model(x).logits
    # measured 15% / 12% (int4) and 5.6% / 3.6% (fp8) mean deviation of the logits
    assert (out - ref).abs().mean() < {"int4": 0.25, "fp8": 0.1}[scheme] * ref.abs().mean()
    prompts = [[5, 17, 300, 2], [11, 3]]
    tokens = Engine(model).generate(prompts, 8, stop_ids=[]).tokens
    if scheme == "fp8":  # fp8 dequantizes to fp32 on both paths: the same tokens
        assert tokens == [naive_greedy(model, p, 8) for p in prompts]
        return
    # int4's kernel takes bf16 activations (the plain path) where the absorbed path multiplies by the dequantized
    # weight: the two round differently, so near-ties may flip; each decoded token must be the full recompute's
    # argmax up to that rounding (1% of the logits' range)
    with torch.no_grad():
        for p, toks in zip(prompts, tokens):
            logits = model(torch.tensor([p + toks])).logits[0, len(p) - 1 : -1]
            chosen = logits.gather(-1, torch.tensor(toks)[:, None])[:, 0]
            assert (logits.max(-1).values - chosen).max() <= 0.01 * (logits.max() - logits.min())


def test_int4_refuses_an_output_width_its_kernel_cannot_pack():
    with pytest.raises(QuantError, match="output width 40 is not a multiple of 16"):
        Int4Linear(torch.randn(40, 64), None, group=32)


def write_released_fp8(model, folder, keep=()):
    """The layout of released GLM FP8 checkpoints, written here without glmstack's quantizer: every linear weight
    of the decoder blocks (but those starting with a `keep` prefix) as float8_e4m3fn with a `weight_scale_inv` per
    128 x 128 block; the rest as it is."""
    save_hf(model, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    linear = (".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
              ".self_attn.o_proj.weight", "gate_proj.weight", "up_proj.weight", "down_proj.weight",
              "q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight",
              "indexer.wq_b.weight", "indexer.wk.weight")  # MLA and DSA (GLM-4.7-Flash, GLM-5)
    for key in [k for k in tensors if k.endswith(linear) and not k.startswith(tuple(keep))]:
        w = tensors[key]
        n, k = -(-w.shape[0] // 128), -(-w.shape[1] // 128)
        scale, w8 = torch.empty(n, k), torch.empty(w.shape)
        for i in range(n):
            for j in range(k):
                blk = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
                scale[i, j] = blk.abs().max() / 448
                w8[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = blk / scale[i, j]
        tensors[key], tensors[key.replace(".weight", ".weight_scale_inv")] = w8.to(torch.float8_e4m3fn), scale
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                  "weight_block_size": [128, 128]}
    (folder / "config.json").write_text(json.dumps(cfg))


def test_released_style_fp8_folder_loads_as_stored(tmp_path):
    folder = tmp_path / "fp8"
    write_released_fp8(tiny(), folder)
    loaded = load_hf(folder)
    ours = quantize_(tiny(), "fp8")
    stored = load_file(str(folder / "model.safetensors"))
    q = loaded.layers[1].mlp.experts[3].up_proj
    assert q.weight.dtype == torch.float8_e4m3fn
    want = stored["model.layers.1.mlp.experts.3.up_proj.weight"]
    assert torch.equal(q.weight.view(torch.uint8), want.view(torch.uint8))
    x = torch.randint(1, 512, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, ours(x).logits)
    save_hf(ours, tmp_path / "again")  # an fp8-quantized model writes the same layout back
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert {k: (v.dtype, v.shape) for k, v in again.items()} == {k: (v.dtype, v.shape) for k, v in stored.items()}
    with pytest.raises(CheckpointError, match="int4"):
        save_hf(quantize_(tiny(), "int4"), tmp_path / "int4")


def test_released_style_fp8_mla_folder_loads_as_stored(tmp_path):
    """A GLM-5-style FP8 folder (MLA latents, kv_b_proj and the DSA indexer in e4m3 blocks) loads with its weights
    as stored and computes what glmstack's own FP8 quantization of the same model does."""
    cfg = ModelConfig.preset("tiny-glm5", **MLA_SHAPE)
    write_released_fp8(GLM(cfg).init_weights(seed=0), tmp_path / "fp8")
    loaded = load_hf(tmp_path / "fp8")
    assert isinstance(loaded.layers[0].self_attn.kv_b_proj, FP8Linear)
    assert isinstance(loaded.layers[0].self_attn.indexer.wk, FP8Linear)
    x = torch.randint(1, cfg.vocab_size, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, quantize_(GLM(cfg).init_weights(seed=0), "fp8")(x).logits)


def test_fp8_folder_with_bf16_layers_and_other_methods(tmp_path):
    """Layers a folder keeps unquantized (here the MTP layer, model.layers.3) load as plain layers; a quantization
    method other than block-wise fp8 is refused naming config.json."""
    write_released_fp8(tiny(), tmp_path / "mixed", keep=("model.layers.3.",))
    loaded = load_hf(tmp_path / "mixed")
    assert type(loaded.mtp[0].block.self_attn.q_proj).__name__ == "Linear"
    assert isinstance(loaded.layers[2].self_attn.q_proj, FP8Linear)
    x = torch.randint(1, 512, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, quantize_(tiny(), "fp8")(x).logits)
    cfg = json.loads((tmp_path / "mixed" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (tmp_path / "mixed" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config.json.*awq"):
        load_hf(tmp_path / "mixed")


def test_bad_scheme_and_cli_quantize(tmp_path, capsys):
    with pytest.raises(QuantError, match="int8"):
        quantize_(tiny(), "int8")
    folder = tmp_path / "ckpt"
    save_hf(tiny(), folder)
    Tokenizer.train(["hello world, the quick brown fox. " * 20], vocab_size=300).save(folder)
    assert generate_main([str(folder), "--prompt", "hello", "--max-new-tokens", "5", "--quantize", "int4"]) == 0
    model = quantize_(load_hf(folder, dtype=torch.float32), "int4")
    want = Engine(model, Tokenizer.load(folder)).generate(["hello"], 5).text[0]
    assert capsys.readouterr().out == want + "\n"
