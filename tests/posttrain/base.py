"""A tiny base model folder for the SFT tests: a BPE tokenizer with GLM's special tokens trained on the synthetic
sets' text, and a seeded random tiny GLM of the tokenizer's vocabulary, saved as an HF folder."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from glmstack.chat import render
from glmstack.model import GLM, ModelConfig, save_hf
from glmstack.posttrain.synthetic import SETS, generate
from glmstack.tokenizer import Tokenizer


def make_base(folder: Path, vocab_size: int = 512, **model_overrides) -> Path:
    texts = [render(r["messages"], r["tools"]) for s in SETS for r in generate(s, 60)]
    tok = Tokenizer.train(texts, vocab_size=vocab_size)
    cfg = dataclasses.replace(ModelConfig.preset("tiny"), vocab_size=vocab_size, **model_overrides)
    model = GLM(cfg, dtype=torch.float32)
    model.materialize("cpu")
    with torch.no_grad():
        for name, t in model.initial_tensors(seed=0, device="cpu"):
            model.state_dict()[name].copy_(t)
    save_hf(model, folder)
    tok.save(folder)
    return folder
