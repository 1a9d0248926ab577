"""The synthetic visual QA set: deterministic by seed, disjoint splits, every kind and a range of aspect ratios,
answers the verifier accepts only when boxed and right, and `glmstack vl-data` files readable as SFT records."""

import json

import numpy as np

from glmstack.cli import main as glmstack
from glmstack.multimodal import vqa
from glmstack.multimodal.data import read_multimodal


def test_deterministic_by_seed_and_splits_disjoint():
    a, b = vqa.generate(40, seed=3, split="test"), vqa.generate(40, seed=3, split="test")
    assert [x["scene"] for x in a] == [x["scene"] for x in b]
    assert all(np.array_equal(np.asarray(x["image"]), np.asarray(y["image"])) for x, y in zip(a, b))
    train = {json.dumps(x["scene"], sort_keys=True) for x in vqa.generate(400, seed=3, split="train")}
    assert not train & {json.dumps(x["scene"], sort_keys=True) for x in a}
    assert {x["kind"] for x in a} == set(vqa.KINDS)
    ratios = [x["image"].width / x["image"].height for x in vqa.generate(200, seed=0)]
    assert min(ratios) < 0.6 and max(ratios) > 1.6
    assert {x["kind"] for x in vqa.generate(50, seed=0, level=0)} == {"colour", "shape"}


def test_answers_and_verifier():
    for item in vqa.generate(40, seed=1):
        sc = item["scene"]
        if item["kind"] == "count":
            assert item["answer"] == str(len(sc["boxes"]))
        assert vqa.verify(item, "\n" + vqa.boxed(item["answer"].upper()))
        assert not vqa.verify(item, item["answer"])  # not boxed
        assert not vqa.verify(item, vqa.boxed("nothing"))


def test_vl_data_writes_sft_records(tmp_path):
    assert glmstack(["vl-data", "--out", str(tmp_path), "--n", "6", "--test-n", "3"]) == 0
    records = read_multimodal([tmp_path / "train.jsonl"], log=None)
    assert len(records) == 6 and records[0].get("enable_thinking") is False
    image = records[0]["messages"][0]["content"][0]["image"]
    assert image.startswith(str(tmp_path)) and (tmp_path / "images" / "train_00000.png").is_file()
