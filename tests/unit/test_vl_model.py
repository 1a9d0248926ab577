"""GLMV on its own: the text path is the text model's bit for bit, CogVLM's visual expert leaves text-only inputs
bit-identical, 3D positions (packing, CogVLM's flat images), KV-cached decoding = full recompute, placeholders,
configs and presets, checkpoint round trips and their errors."""

import pytest
import torch

from glmstack.errors import CheckpointError, ConfigError
from glmstack.inference.vision import generate, generate_batch
from glmstack.model import GLM
from glmstack.model.vision import (GLMV, VLConfig, VisionInputError, expand_placeholders, load_vl_hf, rope_index,
                                   save_vl_hf)


def _model(preset="tiny-glm4.5v", seed=0, **over):
    return GLMV(VLConfig.preset(preset, **over)).init_weights(seed=seed)


def _image_prompt(cfg, grid, text=(5, 9, 3)):
    """text, one image of patch grid `grid` with its markers, text -> (ids (1, T), pixels, image_grid_thw)."""
    g = torch.tensor([grid])
    ids = expand_placeholders([*text, cfg.image_start_token_id, cfg.image_token_id, cfg.image_end_token_id, 11, 12],
                              cfg, g)
    pixels = torch.randn(int(g.prod()), cfg.vision_config.patch_dim, generator=torch.Generator().manual_seed(1))
    return torch.tensor([ids]), pixels, g


def test_text_only_is_the_text_model_bit_for_bit():
    vl = _model()
    text = GLM(vl.cfg.text_config)
    text.materialize("cpu")
    text.load_state_dict({k.removeprefix("language_model."): v for k, v in vl.state_dict().items()
                          if k.startswith("language_model.")})
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(vl(ids).logits, text(ids).logits)


@pytest.mark.parametrize("preset", ["tiny-glm4.5v", "tiny-glm4.1v"])
def test_visual_expert_text_only_bit_identical(preset):
    base = _model(preset)
    expert = GLMV(VLConfig.preset(preset, visual_expert=True))
    expert.materialize("cpu")
    missing, unexpected = expert.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and missing and all(".visual." in k for k in missing)
    with torch.no_grad():  # experts differ from the language model: only image tokens could see them
        for name, p in expert.named_parameters():
            if ".visual." in name and not name.startswith("visual."):
                p.normal_(0, 0.05)
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(expert(ids).logits, base(ids).logits)
        # with an image, the (changed) expert weights are used by the image tokens
        pid, pixels, grid = _image_prompt(base.cfg, (1, 4, 4))
        a = expert(pid, pixel_values=pixels, image_grid_thw=grid).logits
        flat, _ = rope_index(pid, base.cfg, grid, flat_images=True)
        b = base(pid, pixel_values=pixels, image_grid_thw=grid, position_ids=flat).logits
        assert not torch.allclose(a, b)


def test_visual_expert_initialised_from_language_model():
    """Experts copied from the language model compute exactly the model without them (CogVLM positions)."""
    expert, base = _model(visual_expert=True), _model()  # the same seed: the same language model and ViT
    shared = base.state_dict()
    assert all(torch.equal(t, shared[n]) for n, t in expert.state_dict().items() if n in shared)
    pid, pixels, grid = _image_prompt(base.cfg, (1, 4, 6))
    flat, _ = rope_index(pid, base.cfg, grid, flat_images=True)
    assert flat[0, 0, 3:3 + 1 + 6].tolist() == [3, 4, 4, 4, 4, 4, 4]  # begin_of_image, then one id for the image
    with torch.no_grad():
        a = expert(pid, pixel_values=pixels, image_grid_thw=grid).logits
        b = base(pid, pixel_values=pixels, image_grid_thw=grid, position_ids=flat).logits
    assert torch.equal(a, b)


def test_rope_index_3d_positions_and_packing():
    cfg = VLConfig.preset("tiny-glm4.5v")
    ids, _, grid = _image_prompt(cfg, (1, 4, 6))  # 2 x 3 merged tokens
    pos, nxt = rope_index(ids, cfg, grid)
    img = slice(4, 10)
    assert pos[0, 0, img].tolist() == [4] * 6
    assert pos[1, 0, img].tolist() == [4, 4, 4, 5, 5, 5] and pos[2, 0, img].tolist() == [4, 5, 6, 4, 5, 6]
    assert pos[:, 0, 10].tolist() == [7, 7, 7]  # end_of_image resumes at 4 + max(2, 3)
    assert int(nxt) == int(pos.max()) + 1
    packed = torch.cat([ids, ids], dim=1)
    seg = torch.tensor([[1] * ids.shape[1] + [2] * ids.shape[1]])
    ppos, _ = rope_index(packed, cfg, torch.cat([grid, grid]), segment_ids_BT=seg)
    assert torch.equal(ppos[:, :, ids.shape[1]:], pos)  # the second document starts again at 0


@pytest.mark.parametrize("preset", ["tiny-glm4.5v", "tiny-glm4.1v"])
def test_generate_equals_full_recompute(preset):
    model = _model(preset, seed=2)
    ids, pixels, grid = _image_prompt(model.cfg, (1, 4, 4))
    got = generate(model, ids, pixel_values=pixels, image_grid_thw=grid, max_new_tokens=6)
    seq = ids
    with torch.no_grad():
        for _ in range(6):
            nxt = model(seq, pixel_values=pixels, image_grid_thw=grid).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    assert got == seq[0, ids.shape[1]:].tolist()


def test_placeholder_and_feature_count_errors():
    model = _model()
    cfg = model.cfg
    ids, pixels, grid = _image_prompt(cfg, (1, 4, 4))
    with pytest.raises(VisionInputError, match="placeholders"):
        expand_placeholders([cfg.image_token_id, cfg.image_token_id], cfg, grid)
    with pytest.raises(VisionInputError, match="3 placeholder tokens in the text, 4 tokens"):
        model(ids[:, :-4], pixel_values=pixels, image_grid_thw=grid)  # a run cut short
    with pytest.raises(VisionInputError, match="need"):
        model(ids, pixel_values=pixels, image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 4]]))
    with pytest.raises(VisionInputError, match="multiples of spatial_merge_size"):
        model(ids, pixel_values=pixels, image_grid_thw=torch.tensor([[1, 4, 3]]))


def test_config_round_trip_and_errors():
    for name in ("tiny-glm4.5v", "tiny-glm4.1v", "glm-4.5v", "glm-4.1v-9b"):
        cfg = VLConfig.preset(name)
        back = VLConfig.from_hf(cfg.to_hf())
        assert back.to_hf() == cfg.to_hf() and back.text_config == cfg.text_config
    with pytest.raises(ConfigError, match="vision_config.patch_sise"):
        VLConfig.preset("tiny-glm4.5v", vision_config={"patch_sise": 3})
    with pytest.raises(ConfigError, match="mrope_section"):
        VLConfig.preset("tiny-glm4.5v", mrope_section=[2, 2, 2])
    with pytest.raises(ConfigError, match="model_type"):
        VLConfig.from_hf({"model_type": "glm4_moe", "text_config": {}, "vision_config": {}})


def test_released_parameter_counts():
    """GLM-4.5V: the released safetensors hold 107,710,933,120 values (parameters + 45 x 128 balancing biases)."""
    m = GLMV(VLConfig.preset("glm-4.5v"))
    buffers = sum(b.numel() for _, b in m.named_buffers())
    assert m.num_params() + buffers == 107_710_933_120
    assert m.num_params("visual") == 858_681_856
    assert GLMV(VLConfig.preset("glm-4.1v-9b")).num_params() == 10_292_777_472  # "10.3B" on its model card


def test_checkpoint_round_trip_bf16_and_strictness(tmp_path):
    model = _model(visual_expert=True)
    save_vl_hf(model, tmp_path / "a", dtype=torch.bfloat16)
    back = load_vl_hf(tmp_path / "a")
    assert back.cfg.visual_expert and back.language_model.embed_tokens.weight.dtype == torch.bfloat16
    router = back.language_model.layers[1].mlp.gate
    assert router.weight.dtype == torch.float32
    for (n, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        torch.testing.assert_close(a.to(b.dtype), b, atol=0, rtol=0, msg=n)
    ids, pixels, grid = _image_prompt(model.cfg, (1, 4, 6))
    with torch.no_grad():  # a bf16 model runs images end to end (fp32 pixels are cast by the ViT)
        low = back(ids, pixel_values=pixels, image_grid_thw=grid).logits
        full = model(ids, pixel_values=pixels, image_grid_thw=grid).logits
    assert low.dtype == torch.bfloat16 and (low.float() - full).abs().max() < 0.05
    plain = _model()
    save_vl_hf(plain, tmp_path / "plain")
    grown = load_vl_hf(tmp_path / "plain", visual_expert=True)  # experts start as copies (warned)
    assert torch.equal(grown.language_model.layers[0].self_attn.q_proj.visual.weight,
                       plain.language_model.layers[0].self_attn.q_proj.weight)
    (tmp_path / "plain" / "config.json").write_text(
        (tmp_path / "plain" / "config.json").read_text().replace('"depth": 2', '"depth": 3'))
    with pytest.raises(CheckpointError, match="missing"):
        load_vl_hf(tmp_path / "plain")


def test_training_checkpoint_is_an_hf_folder(tmp_path):
    """glmstack/train/checkpoint.py writes a GLMV as its glm4v_moe folder and reads it back; optimiser groups
    cover every ViT tensor (conv kernels on AdamW)."""
    from glmstack.optim.groups import assign_groups
    from glmstack.train.checkpoint import load_model, save_model

    model = _model(visual_expert=True)
    groups = assign_groups(model)
    assert groups["visual.patch_embed.proj.weight"] == "adamw" and groups["visual.blocks.0.attn.qkv.weight"] == "muon"
    save_model(model, tmp_path / "ckpt")
    assert VLConfig.from_hf(tmp_path / "ckpt").visual_expert
    other = _model(seed=5, visual_expert=True)
    load_model(other, tmp_path / "ckpt")
    for (n, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), n


def test_convert_command_handles_vl_folders(tmp_path, capsys):
    from glmstack.model.convert import main

    model = _model("tiny-glm4.1v")
    save_vl_hf(model, tmp_path / "src")
    assert main([str(tmp_path / "src"), str(tmp_path / "dst"), "--dtype", "bf16", "--max-shard-size", "100KB"]) == 0
    assert "bfloat16" in capsys.readouterr().out
    assert (tmp_path / "dst" / "model.safetensors.index.json").exists()
    back = load_vl_hf(tmp_path / "dst")
    assert back.cfg.model_type == "glm4v" and back.visual.patch_embed.proj.weight.dtype == torch.bfloat16


def test_generate_batch_rows_are_independent():
    """K sampled rows of one prompt at once: row b's tokens are what generate(seed=seeds[b]) gives alone."""
    model = _model(seed=3)
    ids, pixels, grid = _image_prompt(model.cfg, (1, 4, 4))
    rows = generate_batch(model, ids.expand(3, -1), pixel_values=pixels.repeat(3, 1), image_grid_thw=grid.repeat(3, 1),
                                max_new_tokens=5, temperature=1.0, seeds=[7, 8, 9])
    alone = [generate(model, ids, pixel_values=pixels, image_grid_thw=grid, max_new_tokens=5, temperature=1.0,
                            seed=s) for s in (7, 8, 9)]
    assert rows == alone and len({tuple(r) for r in rows}) > 1


def test_mtp_layer_round_trip(tmp_path):
    """A GLM-4.5V-style model trained with an MTP layer keeps it through save/load (transformers ignores it)."""
    model = _model(text_config={"num_nextn_predict_layers": 1})
    save_vl_hf(model, tmp_path / "m")
    back = load_vl_hf(tmp_path / "m")
    assert len(back.language_model.mtp) == 1
    for (n, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), n
    with pytest.raises(ConfigError, match="QK-Norm"):
        VLConfig.preset("tiny-glm4.5v", text_config={"use_qk_norm": True})


@pytest.mark.parametrize("preset", ["tiny-glm4.5v", "tiny-glm4.1v"])
def test_one_optimizer_step_on_an_image_batch(preset):
    """glmstack's Muon + AdamW groups cover every GLMV tensor (fused qkv / gate_up split into their matrices) and
    one step on an image batch lowers the loss."""
    from glmstack.optim.groups import build_optimizer
    from glmstack.train.config import OptimConfig

    model = _model(preset, visual_expert=True)
    opt, _ = build_optimizer(model, OptimConfig(lr=0.02))
    ids, pixels, grid = _image_prompt(model.cfg, (1, 4, 6))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = model(ids, labels=labels, pixel_values=pixels, image_grid_thw=grid).loss
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[1] < losses[0]
    assert model.visual.patch_embed.proj.weight.grad is not None


def test_released_style_config_json_parses():
    """GLM-4.5V's config.json as released (transformers 4.5x layout: rope_scaling + flat rope keys in text_config,
    torch_dtype, vision model_type glm4v_moe) reads as the glm-4.5v preset."""
    released = {
        "architectures": ["Glm4vMoeForConditionalGeneration"], "model_type": "glm4v_moe", "torch_dtype": "bfloat16",
        "transformers_version": "4.55.0.dev0", "tie_word_embeddings": False, "image_token_id": 151363,
        "video_token_id": 151364, "image_start_token_id": 151339, "image_end_token_id": 151340,
        "video_start_token_id": 151341, "video_end_token_id": 151342,
        "text_config": {
            "model_type": "glm4v_moe_text", "pad_token_id": 151329, "vocab_size": 151552,
            "eos_token_id": [151329, 151336, 151338], "attention_bias": True, "attention_dropout": 0.0,
            "first_k_dense_replace": 1, "hidden_act": "silu", "head_dim": 128, "hidden_size": 4096,
            "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 65536,
            "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
            "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46,
            "num_key_value_heads": 8, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "default", "mrope_section": [8, 12, 12]}, "rope_theta": 10000.0,
            "routed_scaling_factor": 1.0, "topk_group": 1, "use_cache": True, "use_qk_norm": False,
            "image_token_id": 151363},
        "vision_config": {
            "attention_bias": False, "attention_dropout": 0.0, "depth": 24, "hidden_act": "silu", "hidden_size": 1536,
            "image_size": 336, "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 10944,
            "model_type": "glm4v_moe", "num_heads": 12, "out_hidden_size": 4096, "patch_size": 14,
            "rms_norm_eps": 1e-05, "spatial_merge_size": 2, "temporal_patch_size": 2},
    }
    cfg, preset = VLConfig.from_hf(released), VLConfig.preset("glm-4.5v")
    assert cfg.vision_config == preset.vision_config and cfg.mrope_section == [8, 12, 12]
    strip = lambda t: {k: v for k, v in vars(t).items() if k != "hf_metadata"}
    assert strip(cfg.text_config) == strip(preset.text_config)


@pytest.mark.parametrize("preset", ["tiny-glm4.5v", "tiny-glm4.1v"])
def test_generate_batch_left_padded_prompts(preset):
    """Prompts of different lengths (one with an image, one text only) left-padded in one batch: each row decodes
    as it does alone."""
    model = _model(preset, seed=4)
    cfg = model.cfg
    img_ids, pixels, grid = _image_prompt(cfg, (1, 4, 6))
    text_ids = torch.tensor([[8, 9, 10, 11]])
    T = img_ids.shape[1]
    ids = torch.cat([img_ids, torch.cat([torch.zeros(1, T - 4, dtype=torch.long), text_ids], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :T - 4] = 0
    rows = generate_batch(model, ids, pixel_values=pixels, image_grid_thw=grid, attention_mask=mask, max_new_tokens=5)
    assert rows[0] == generate(model, img_ids, pixel_values=pixels, image_grid_thw=grid, max_new_tokens=5)
    assert rows[1] == generate(model, text_ids, max_new_tokens=5)
    with pytest.raises(VisionInputError, match="LEFT padding"):
        generate_batch(model, ids, pixel_values=pixels, image_grid_thw=grid, attention_mask=mask.flip(1))
