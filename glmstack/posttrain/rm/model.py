"""A Bradley–Terry reward model: our GLM backbone + a scalar `score` head read at the last token, as an HF folder.

Why this layout: GLM-4.5 §3.4 / GLM-5 §3.4 train outcome reward models for general RL; the open ecosystem's reward
models are `*ForSequenceClassification` checkpoints with one label (transformers, TRL's RewardTrainer), so ours is
saved the same way and any tool that reads those reads ours. transformers has no `Glm4MoeForSequenceClassification`
class (5.x ships ForCausalLM only for glm4_moe); its generic `GenericForSequenceClassification` + the glm4_moe
backbone is exactly what such a class would be (transformers builds every *ForSequenceClassification of recent
models that way), and tests/parity/test_rm_hf.py checks our scores against it.

The folder (`save_rm` / `load_rm`):
  config.json        the backbone's glm4_moe config, `num_nextn_predict_layers: 0` (no MTP, no LM head),
                     `architectures: ["Glm4MoeForSequenceClassification"]`, `id2label: {"0": "LABEL_0"}` (one
                     label), `pad_token_id` (the pooling rule below needs it)
  *.safetensors      the backbone as save_hf names it (`model.*`, sharded the same way) + `score.weight` (1, D),
                     fp32, in the last file (and in the index when sharded)
  tokenizer files    when a tokenizer is given

Score = score(h_last), h = the backbone's hidden state after the final norm at the sequence's last non-pad token
(transformers' rule: the rightmost position whose id is not pad_token_id), shape (B,).

    rm = RewardModel.fresh(cfg)                         # or load_rm("runs/rm/model")
    r_B = rm(input_ids_BT, last_B)                      # (B,) scalar rewards
    save_rm(rm, "runs/rm/model", tokenizer, pad_token_id=tok.token_id("<|endoftext|>"))
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from glmstack.errors import CheckpointError
from glmstack.model import GLM, ModelConfig, save_hf
from glmstack.model.hf import INDEX_NAME, checkpoint_files, checkpoint_tensors
from glmstack.model.layers import Linear

ARCHITECTURE = "Glm4MoeForSequenceClassification"


def backbone_config(cfg: ModelConfig) -> ModelConfig:
    """The reward model's trunk config: the same transformer without MTP (the head reads the trunk only)."""
    return dataclasses.replace(cfg, num_nextn_predict_layers=0, num_mtp_depths=0)


class RewardModel(nn.Module):
    """`model` (a GLM whose LM head is removed) + `score` (D -> 1, no bias): state-dict names are transformers'."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.model = GLM(backbone_config(cfg))  # built on meta (GLM builds there); materialise before use
        self.model.lm_head = nn.Identity()  # the trunk's output is all the head reads: no (B, T, V) logits
        with torch.device("meta"):
            self.score = Linear(cfg.hidden_size, 1, bias=False)
        self.cfg = self.model.cfg

    def forward(self, input_ids, last, segment_ids=None):
        """input_ids (B, T), last (B,) index of each row's last token -> (rewards (B,), the backbone's output)."""
        out = self.model(input_ids, segment_ids=segment_ids)
        h_BD = out.hidden[torch.arange(input_ids.shape[0], device=input_ids.device), last]
        return self.score(h_BD).squeeze(-1).float(), out

    def materialize(self, device) -> RewardModel:
        self.model.materialize(device)
        if self.score.weight.is_meta:
            self.score.to_empty(device=device)
        return self

    def initial_tensors(self, seed: int = 0, device="cpu"):
        """The backbone's seeded init (GLM.initial_tensors) + the head N(0, initializer_range), as transformers'
        _init_weights draws a new Linear; names prefixed like the state dict."""
        for name, t in self.model.initial_tensors(seed=seed, device=device):
            yield f"model.{name}", t
        yield "score.weight", self.fresh_head(seed).to(device)

    def fresh_head(self, seed: int = 0) -> torch.Tensor:
        """A new score head (1, D), N(0, initializer_range), from its own seeded stream."""
        g = torch.Generator(device="cpu").manual_seed(seed + 1)
        return torch.randn(tuple(self.score.weight.shape), generator=g) * self.cfg.initializer_range


def is_trunk_key(key: str, cfg: ModelConfig) -> bool:
    """An HF tensor of the trunk: not the LM head, not an MTP layer (stored as layer num_hidden_layers + d),
    not the score head."""
    mtp = key.startswith("model.layers.") and int(key.split(".")[2]) >= cfg.num_hidden_layers
    return not mtp and key not in ("lm_head.weight", "score.weight")


def trunk_tensors(rm: RewardModel, folder: str | os.PathLike):
    """A causal LM's or reward model's HF folder as a stream of (our RM state-dict name, tensor) for the trunk
    only: what a reward model starts from (GLM-4.5: the RM is initialised from the SFT model)."""
    stream = checkpoint_tensors(rm.model, folder, keep=lambda k: is_trunk_key(k, rm.cfg))
    return ((f"model.{name}", t) for name, t in stream)


def score_tensor(folder: str | os.PathLike) -> torch.Tensor:
    from glmstack.model.hf import open_safetensors

    path = checkpoint_files(Path(folder)).get("score.weight")
    if path is None:
        raise CheckpointError(f"{folder}: no score.weight (not a reward model folder written by `glmstack rm`)")
    with open_safetensors(path) as f:
        return f.get_tensor("score.weight")


def _add_score(folder: Path, score: torch.Tensor) -> None:
    """Put score.weight into the last safetensors file save_hf wrote (one shard's memory at most) and into the
    index when there is one: transformers reads a lone model.safetensors and ignores other files."""
    index_path = folder / INDEX_NAME
    last = max(folder.glob("*.safetensors"))
    tensors = load_file(str(last))
    tensors["score.weight"] = score
    save_file(tensors, str(last), metadata={"format": "pt"})
    if index_path.exists():
        index = json.loads(index_path.read_text())
        index["weight_map"]["score.weight"] = last.name
        index["metadata"]["total_size"] += score.numel() * score.element_size()
        index_path.write_text(json.dumps(index, indent=2) + "\n")


def load_rm(folder: str | os.PathLike, device="cpu", dtype: torch.dtype = torch.float32) -> RewardModel:
    """A reward-model folder (`save_rm`) -> RewardModel in eval mode; strict like load_hf."""
    folder = Path(folder)
    cfg = ModelConfig.from_hf(folder)
    if ARCHITECTURE not in cfg.hf_metadata.get("architectures", []):
        raise CheckpointError(f"{folder / 'config.json'}: architectures is not [{ARCHITECTURE!r}]: not a reward model")
    rm = RewardModel(cfg)
    state = rm.materialize(device).state_dict()
    for name, t in trunk_tensors(rm, folder):
        state[name].copy_(t)
    score = score_tensor(folder)
    if score.shape != rm.score.weight.shape:
        raise CheckpointError(f"{folder}: score.weight {list(score.shape)}, expected "
                              f"{list(rm.score.weight.shape)}")  # fmt: skip
    state["score.weight"].copy_(score)
    return rm.to(dtype).eval()


@torch.no_grad()
def merged_rm(rm: RewardModel) -> RewardModel:
    """A plain RewardModel (on CPU) equal to `rm` with its trunk's LoRA adapters folded in (W + s·BA)."""
    from glmstack.model.lora import merged_state_dict

    plain = RewardModel(rm.cfg).materialize("cpu")
    plain.load_state_dict({k: v.cpu() for k, v in merged_state_dict(rm).items()})
    return plain.eval()


def save_rm_adapter(rm: RewardModel, folder: str | os.PathLike, tokenizer=None) -> Path:
    """`rm`'s trunk adapters + its score head as a PEFT folder of a sequence classifier (task_type SEQ_CLS, the head
    in `modules_to_save`, stored as base_model.model.score.weight): PEFT loads it onto transformers'
    Glm4MoeForSequenceClassification of the base (tests/parity/test_rm_hf.py)."""
    from glmstack.model.lora_peft import PREFIX, adapter_files, write_adapter

    tensors, config = adapter_files(rm.model, base=getattr(rm.model, "lora_base", ""))
    tensors[f"{PREFIX}score.weight"] = rm.score.weight.detach().float()
    config |= {"task_type": "SEQ_CLS", "modules_to_save": ["score"]}
    folder = write_adapter(folder, tensors, config)
    if tokenizer is not None:
        tokenizer.save(folder)
    return folder


@torch.no_grad()
def save_rm(rm: RewardModel, folder: str | os.PathLike, tokenizer=None, *, pad_token_id: int,
            chat_style: str = "glm-4.5") -> Path:  # fmt: skip
    """Write the folder described in the module docstring, atomically (a temp folder renamed into place)."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.rm-tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_hf(rm.model, tmp)
    _add_score(tmp, rm.score.weight.detach().float().cpu().contiguous())
    config = json.loads((tmp / "config.json").read_text())
    config |= {"architectures": [ARCHITECTURE], "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
               "pad_token_id": int(pad_token_id)}  # fmt: skip
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(tmp, chat_style=chat_style)
    old = folder.with_name(f".{folder.name}.rm-old-{os.getpid()}")
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder
