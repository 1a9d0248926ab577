"""The ViT pre-training stage (multimodal/vit_pretrain.py): its image stream is deterministic, training-split only
and labelled from the scenes; on the one loop its loss falls, and the model folder it exports carries exactly the
trained ViT + adapter into the next stage."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("glmstack.model.vision")

from glmstack.cli import main as glmstack
from glmstack.multimodal import vqa
from glmstack.multimodal.vit_pretrain import ATTRIBUTES, AttributeStream, attribute_labels


def test_attribute_stream_is_deterministic_and_labelled_from_the_scene(proc):
    a, b = AttributeStream(proc, batch_size=8, seed=1), AttributeStream(proc, batch_size=8, seed=1)
    x, y = a.batch(3), b.batch(3)
    assert all(torch.equal(x[k], y[k]) for k in x)
    assert not torch.equal(x["pixel_values"][:10], a.batch(4)["pixel_values"][:10])
    for item in vqa.generate(40, seed=2):
        colour, shape, count, letter = attribute_labels(item["scene"])
        if item["kind"] == "text":
            assert ATTRIBUTES["letter"][letter] == item["answer"] and colour == shape == count == -100
        else:
            assert ATTRIBUTES["colour"][colour] == item["scene"]["colour"]
            assert ATTRIBUTES["shape"][shape] == item["scene"]["shape"]
            assert count == (int(item["answer"]) - 1 if item["kind"] == "count" else -100)


def test_vit_stage_learns_and_its_encoder_loads_bit_identically(tmp_path):
    from safetensors.torch import load_file

    from glmstack.model.vision import load_vl_hf

    args = ["vl-train", "vl_tiny", "--stage", "vit", "--set", f"out_dir={tmp_path}", "--set", "steps=40",
            "--set", "micro_batch_size=16", "--set", "vl.eval_n=16", "--set", "vl.synthetic_n=24",
            "--set", "log.every=1", "--set", "log.progress=false", "--set", "log.plots=false"]  # fmt: skip
    assert glmstack(args) == 0
    stage = tmp_path / "vl_tiny" / "vit"
    losses = [json.loads(line)["loss"] for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 40 and sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    scores = json.loads((stage / "eval.json").read_text())
    assert scores["n"] == 16 and set(scores["by_kind"]) <= set(vqa.KINDS)
    trained = load_file(str(stage / (stage / "latest").read_text().strip() / "model.safetensors"))
    exported = load_vl_hf(stage / "model", dtype=torch.float32).state_dict()
    vit = [k for k in trained if k.startswith("model.visual.")]
    assert vit and all(torch.equal(trained[k], exported[k.removeprefix("model.")]) for k in vit)
    assert not any(k.startswith("heads.") for k in exported)
