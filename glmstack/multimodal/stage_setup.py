"""What every vision-language stage does around the loop (vl-train's align and sft stages in stage.py, the ViT
stage in vit_pretrain.py, vl-rl): its data files, tokenizer, model, processor, which parameters learn, and the model
folder it exports. The VL counterpart of glmstack/train/stage.py; with these in stage.py, stage.py and
vit_pretrain.py imported each other (issue 35).
"""

from __future__ import annotations

from pathlib import Path

import torch

from glmstack.config import ConfigError
from glmstack.multimodal.config import SYNTHETIC_VQA, VLTrainConfig, stage_dir, vqa_folder
from glmstack.train import dist

ADAPTER = ("visual.downsample.", "visual.merger.")  # GLM-4.1V's MLP adapter: the 2x2 merge and the merger MLP


def data_parallel(cfg: VLTrainConfig, device, allowed: bool = True) -> None:
    """Join the process group under torchrun; VL stages parallelise by DDP only (FSDP2 / expert parallel shard
    the text GLM's blocks, not a GLMV's), and the vit stage (`allowed=False`) runs in one process."""
    from glmstack.train import dist

    dist.init_from_env(device.type)
    if not dist.is_dist():
        return
    if not allowed:
        raise ConfigError(f"{cfg.stage}: the ViT stage runs in one process; launch it without torchrun")
    if cfg.dist.dp not in ("auto", "ddp") or cfg.dist.expert_parallel:
        raise ConfigError(f"{cfg.stage}: vision-language stages run data-parallel with DDP (dist.dp=ddp or auto, no "
                          "expert parallel)")  # fmt: skip


def data_files(cfg: VLTrainConfig) -> list[Path]:
    """The record files; synthetic:vqa is written once per run (every stage of the run reads the same files)."""
    from glmstack.multimodal import vqa

    paths = []
    for entry in cfg.vl.data:
        if entry != SYNTHETIC_VQA:
            paths.append(Path(entry))
            continue
        folder = vqa_folder(cfg)
        if dist.rank() == 0 and not (folder / "train.jsonl").exists():
            vqa.write(folder, cfg.vl.synthetic_n, seed=cfg.seed, test_n=max(cfg.vl.eval_n, 1))
        dist.barrier()  # the other ranks read what rank 0 wrote
        paths.append(folder / "train.jsonl")
    return paths


def load_tokenizer(cfg: VLTrainConfig, records: list[dict]):
    """`vl.tokenizer`, else init_from's (train/export.py's stage_tokenizer), else a BPE trained on the records'
    texts (saved in the stage folder)."""
    from glmstack.tokenizer import Tokenizer
    from glmstack.train.export import stage_tokenizer

    if cfg.vl.tokenizer or cfg.init_from:
        return stage_tokenizer(cfg, cfg.vl.tokenizer, option="vl.tokenizer")
    from glmstack.chat.schema import visible_text

    texts = [visible_text(m.get("content")) for r in records for m in r["messages"]]
    tok = Tokenizer.train(texts * 4, vocab_size=cfg.vl.tokenizer_vocab)  # the same on every rank (same records)
    if dist.rank() == 0:
        tok.save(stage_dir(cfg) / "tokenizer", chat_style=cfg.vl.chat_style)
    return tok


def processor_for(cfg: VLTrainConfig, model):
    from glmstack.multimodal.processor import VisionProcessor

    vc = model.cfg.vision_config
    return VisionProcessor(min_pixels=cfg.vl.min_pixels, max_pixels=cfg.vl.max_pixels, patch_size=vc.patch_size,
                           temporal_patch_size=vc.temporal_patch_size, merge_size=vc.spatial_merge_size)  # fmt: skip


def build_model(cfg: VLTrainConfig, tokenizer, device: torch.device):
    """init_from's GLMV, or a fresh seeded one from the preset whose vocabulary and vision token ids are the
    tokenizer's."""
    from glmstack.model.vision import GLMV, VLConfig, load_vl_hf, token_ids
    from glmstack.train.checkpoint import resolve

    if cfg.init_from:
        model = load_vl_hf(resolve(cfg.init_from, cfg.out_dir), dtype=torch.float32, device=device)
    else:
        overrides = dict(cfg.vl.model_overrides)
        text = {"vocab_size": tokenizer.vocab_size, **overrides.pop("text_config", {})}
        try:
            vl_cfg = VLConfig.preset(cfg.vl.model_preset, **token_ids(tokenizer), text_config=text, **overrides)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"vl.model_preset / vl.model_overrides: {e}") from None
        model = GLMV(vl_cfg).init_weights(seed=cfg.seed, device=device)
    return adapt(model, cfg)


def adapt(model, cfg):
    """lora.enabled: adapters on lora.targets inside the part vl.train names (everything else frozen), as every
    VL stage and VL RL build their model; -> the model."""
    if not cfg.lora.enabled:
        return model
    from glmstack.model.lora import apply_lora
    from glmstack.train.lora import base_reference

    if cfg.lora.base_quant:
        raise ConfigError("lora.base_quant: the vision-language stages train LoRA over a full-precision base")
    apply_lora(model, cfg.lora, seed=cfg.seed, within=PARTS[cfg.vl.train])
    model.lora_base = base_reference(cfg)
    return model


PARTS = {"all": ("",), "language": ("language_model.",), "vision": ("visual.",), "adapter": ADAPTER}


def freeze(model, train: str) -> int:
    """requires_grad per `vl.train` (a LoRA model: its adapters, already placed by it); returns the number of
    trainable parameters."""
    from glmstack.model.lora import has_lora

    def learns(name: str) -> bool:
        if has_lora(model):
            return ".lora_A" in name or ".lora_B" in name
        if train == "adapter":
            return name.startswith(ADAPTER)
        if train == "vision":
            return name.startswith("visual.")
        if train == "language":
            return name.startswith("language_model.")
        return True

    for name, p in model.named_parameters():
        p.requires_grad_(learns(name))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def export(model, tokenizer, processor, folder: Path, chat_style: str) -> Path:
    """The model folder a later stage, `glmstack chat --image` and `glmstack serve` read: HF weights, tokenizer with
    the chat template, preprocessor_config.json (train/export.py's one export); a LoRA model's: its PEFT adapter
    folder naming its base (transformers' Glm4v(Moe)ForConditionalGeneration module names), with the same files."""
    from glmstack.model.lora import has_lora
    from glmstack.model.lora_peft import save_adapter
    from glmstack.model.vision import save_vl_hf
    from glmstack.train.export import export_folder

    def write(tmp: Path) -> None:
        if has_lora(model):
            save_adapter(model, tmp, base=getattr(model, "lora_base", ""))
        else:
            save_vl_hf(model, tmp)
        processor.save(tmp)

    return export_folder(folder, tokenizer, chat_style, write)
