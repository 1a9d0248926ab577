"""HF checkpoints: strict loading (one error naming every bad tensor), tied MTP copies, sharding, convert CLI."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.model.convert import main as convert_main, parse_size
from glmstack.model.hf import CheckpointError, hf_entries


@pytest.fixture()
def ckpt(tmp_path):
    model = GLM(ModelConfig.preset("tiny")).init_weights(seed=0)
    return model, save_hf(model, tmp_path / "ckpt")


def _edit(folder, fn):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_names_follow_the_release_layout(ckpt):
    model, folder = ckpt
    names = set(hf_entries(model))
    assert "model.layers.1.mlp.experts.7.gate_proj.weight" in names
    assert "model.layers.3.shared_head.norm.weight" in names  # MTP at index num_hidden_layers
    assert "model.layers.3.mlp.gate.e_score_correction_bias" in names
    assert load_file(folder / "model.safetensors")["model.layers.1.mlp.gate.weight"].dtype == torch.float32


def test_round_trip_with_mtp_is_exact(ckpt):
    model, folder = ckpt
    back = load_hf(folder)
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name


def test_missing_unexpected_misshaped_in_one_error(ckpt):
    _, folder = ckpt

    def damage(t):
        del t["model.layers.1.mlp.experts.3.up_proj.weight"]
        t["model.layers.9.self_attn.q_proj.weight"] = torch.zeros(1)
        t["model.norm.weight"] = torch.zeros(65)

    _edit(folder, damage)
    with pytest.raises(CheckpointError) as e:
        load_hf(folder)
    msg = str(e.value)
    assert "missing (1): model.layers.1.mlp.experts.3.up_proj.weight" in msg
    assert "unexpected (1): model.layers.9.self_attn.q_proj.weight" in msg
    assert "mis-shaped (1): model.norm.weight [65] (expected [64])" in msg


def test_mtp_copies_of_embedding_and_head_are_optional_and_tied(ckpt):
    model, folder = ckpt

    def add_copies(t):  # GLM-4.5 ships them, GLM-4.6 does not
        t["model.layers.3.embed_tokens.weight"] = t["model.embed_tokens.weight"].clone()
        t["model.layers.3.shared_head.head.weight"] = t["lm_head.weight"].clone()

    _edit(folder, add_copies)
    back = load_hf(folder)
    ids = torch.randint(0, 512, (1, 8))
    torch.testing.assert_close(back(ids, labels=ids).loss, model(ids, labels=ids).loss)


def test_bad_config_json_is_a_config_error(ckpt):
    _, folder = ckpt
    cfg = json.loads((folder / "config.json").read_text())
    cfg["n_shared_expert"] = 1
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="n_shared_expert"):
        load_hf(folder)


def test_save_replaces_atomically_and_shards(ckpt, tmp_path):
    model, folder = ckpt
    (folder / "stale.txt").write_text("old")
    save_hf(model, folder, max_shard_bytes=100_000)
    files = sorted(p.name for p in folder.iterdir())
    assert "stale.txt" not in files and "model.safetensors.index.json" in files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(hf_entries(model))


def test_convert_cli(ckpt, tmp_path, capsys):
    model, folder = ckpt
    assert convert_main([str(folder), str(tmp_path / "bf16"), "--dtype", "bf16", "--max-shard-size", "50KB"]) == 0
    back = load_hf(tmp_path / "bf16")
    assert back.embed_tokens.weight.dtype == torch.bfloat16
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert len(list((tmp_path / "bf16").glob("*.safetensors"))) > 1
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2MiB") == 2 * 2**20
    with pytest.raises(SystemExit):
        convert_main(["--help"])
    assert "--max-shard-size" in capsys.readouterr().out


def test_checkpoint_without_mtp_hints_at_the_override(tmp_path):
    model = GLM(ModelConfig.preset("tiny", num_nextn_predict_layers=0)).init_weights(seed=0)
    folder = save_hf(model, tmp_path / "no_mtp")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 1  # what transformers' save_pretrained writes: config says 1, no tensors
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="num_nextn_predict_layers=0"):
        load_hf(folder)
    assert len(load_hf(folder, num_nextn_predict_layers=0).mtp) == 0
