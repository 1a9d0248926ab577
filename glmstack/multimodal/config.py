"""The configuration of the vision-language stages (`VLTrainConfig` = TrainConfig + `vl`) and where a run's
stages and data live. The leaf every VL module reads (stage.py, vit_pretrain.py, evaluate.py, rl.py, recipes); with
it in stage.py, stage.py and evaluate.py / vit_pretrain.py imported each other (issue 35).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from glmstack.train.config import TrainConfig

SYNTHETIC_VQA = "synthetic:vqa"


@dataclass(kw_only=True)
class VLOptions:
    data: list[str] = field(default_factory=lambda: [SYNTHETIC_VQA])  # record files/folders or synthetic:vqa
    synthetic_n: int = 500  # synthetic:vqa items written to files (the tokenizer's texts; the stream's are fresh)
    stream: bool = True  # data == [synthetic:vqa]: train on the endless stream (multimodal.data.VQAStream)
    eval_n: int = 200  # held-out items scored at the end (greedy); 0 = no evaluation
    train: Literal["all", "adapter", "vision", "language"] = "all"  # which parameters learn (see module docstring)
    model_preset: str = "tiny-glm4.5v"  # glmstack.model.vision preset when init_from is empty
    model_overrides: dict[str, Any] = field(default_factory=dict)  # VLConfig overrides (nested text/vision_config)
    tokenizer: str = ""  # folder with tokenizer.json; "" = init_from's, or one trained on the data's texts
    tokenizer_vocab: int = 512  # vocabulary of that trained tokenizer
    chat_style: str = "glm-4.5"  # glm-4.5 (GLM-4.5V's template) or glm-4.7
    min_pixels: int = 32 * 32  # image processor bounds on resized pixels per image (smart_resize)
    max_pixels: int = 64 * 64
    max_new_tokens: int = 12  # evaluation response budget


@dataclass(kw_only=True)
class VLTrainConfig(TrainConfig):
    vl: VLOptions = field(default_factory=VLOptions)


@dataclass(kw_only=True)
class ViTConfig(VLTrainConfig):
    """The ViT stage (multimodal/vit_pretrain.py): the ViT + adapter on attribute heads, no chats yet."""


def stage_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.out_dir) / cfg.run / cfg.stage


def vqa_folder(cfg: TrainConfig) -> Path:
    return Path(cfg.out_dir) / cfg.run / "data" / "vqa"
