"""`glm4v_moe` / `glm4v` checkpoints in and out, with the tensor names transformers writes for
Glm4vMoeForConditionalGeneration / Glm4vForConditionalGeneration (and zai-org releases):

    model.visual.<ViT name>               <- our visual.<name>
    model.language_model.<text name>      <- our language_model.<name> (the text model's own map, model/hf.py:
                                             per-expert tensors, MTP layer at layers.{num_hidden_layers + d})
    lm_head.weight                        <- our language_model.lm_head.weight (absent when tied)

Strict and streamed as model/hf.py (one CheckpointError naming every missing / unexpected / mis-shaped tensor,
checked from the headers before any allocation; atomic, sharded writes). A `visual_expert` model also stores its
expert copies (`...q_proj.visual.weight`, glmstack-only names); loading a plain checkpoint with
`visual_expert=True` initialises the experts from the language model's weights (CogVLM), with a warning.

    model = load_vl_hf("GLM-4.5V/", dtype=torch.bfloat16)
    save_vl_hf(model, "out/")
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from glmstack.model.hf import (DTYPES, _optional_entries, _packed_entries, _raise_if, _read, _shapes, _warn,
                               checkpoint_files, hf_entries, match_names, write_checkpoint)
from glmstack.model.model import GLM
from glmstack.model.vision.config import VLConfig
from glmstack.model.vision.model import GLMV
from glmstack.model.vision.visual_expert import copy_language_into_experts, expert_names

_LM, _VIS = "model.language_model.", "model.visual."


def _rehome(name: str) -> str:
    """The text model's HF name (model.X / lm_head.weight) inside the VL checkpoint."""
    return name if name == "lm_head.weight" else _LM + name.removeprefix("model.")


def vl_entries(model: GLMV) -> dict[str, tuple[str, tuple]]:
    """HF tensor name -> (our state_dict name, index into it)."""
    lm = model.language_model
    if isinstance(lm, GLM):
        text = hf_entries(lm)
    else:
        tied = lm.cfg.tie_word_embeddings
        text = {("lm_head.weight" if n == "lm_head.weight" else "model." + n): (n, ())
                for n in lm.state_dict() if not (tied and n == "lm_head.weight")}
    out = {_rehome(k): ("language_model." + ours, idx) for k, (ours, idx) in text.items()}
    out.update({_VIS + n: ("visual." + n, ()) for n in model.visual.state_dict()})
    return out


def _optional_and_packed(model: GLMV) -> tuple[dict, dict]:
    lm = model.language_model
    if isinstance(lm, GLM):
        optional, packed = _optional_entries(lm), _packed_entries(lm)
    else:
        optional = {"lm_head.weight": "embed_tokens.weight"} if lm.cfg.tie_word_embeddings else {}
        packed = {}
    return ({_rehome(k): "language_model." + v for k, v in optional.items()},
            {_rehome(k): "language_model." + v for k, v in packed.items()})


def load_vl_hf(folder: str | os.PathLike, dtype: torch.dtype | None = None, device="cpu", **overrides) -> GLMV:
    """Read a glm4v_moe / glm4v checkpoint into GLMV; dtype None = config.json's (else fp32). overrides: VLConfig
    fields (text_config= / vision_config= dicts for theirs), e.g. visual_expert=True."""
    folder = Path(folder)
    cfg = VLConfig.from_hf(folder, **overrides)
    if dtype is None:
        dtype = DTYPES.get(cfg.hf_metadata.get("dtype") or cfg.hf_metadata.get("torch_dtype"), torch.float32)
    model = GLMV(cfg, dtype=dtype)
    tensors = checkpoint_state(model, folder)  # checked here, before anything is allocated
    model.materialize(device)
    state = model.state_dict()
    for name, full in tensors:
        state[name].copy_(full)
    if cfg.visual_expert and not any(".visual." in k and not k.startswith(_VIS) for k in checkpoint_files(folder)):
        copy_language_into_experts(model.language_model)
    return model


def checkpoint_state(model: GLMV, folder: str | os.PathLike):
    """The checkpoint in `folder` as a stream of (our state-dict name, full tensor) for the (meta) `model`, checked
    first (one CheckpointError naming every problem). Missing visual-expert tensors are allowed (warned): the caller
    copies the language model into the experts."""
    folder = Path(folder)
    files = checkpoint_files(folder)
    entries = vl_entries(model)
    optional, packed = _optional_and_packed(model)
    plan, missing, unexpected, bad_shape = match_names(entries, optional, packed, model.state_dict(), _shapes(files))
    if missing and model.cfg.visual_expert and all(expert_names([entries[k][0]]) for k in missing):
        _warn(f"{folder} has no visual-expert weights: the experts start as copies of the language model's")
        missing = []
    _raise_if(missing, unexpected, bad_shape)
    by_ours: dict[str, list] = {}
    for key, (ours, idx) in plan.items():
        by_ours.setdefault(ours, []).append((key, idx))
    state = model.state_dict()
    return _read([(ours, state[ours].shape, state[ours].dtype, by_ours[ours]) for ours in sorted(by_ours)], files)


@torch.no_grad()
def save_vl_hf(model: GLMV, folder: str | os.PathLike, dtype: torch.dtype | None = None,
               max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write config.json + safetensors as transformers does for this model type; returns the folder."""
    dtype = dtype or model.language_model.embed_tokens.weight.dtype
    return write_checkpoint(Path(folder), model.state_dict(), vl_entries(model), model.cfg.to_hf(), dtype,
                            max_shard_bytes)
