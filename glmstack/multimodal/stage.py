"""`glmstack vl-train <recipe> --stage vit|align|sft`: vision-language training stages on the one loop.

GLM-4.1V-Thinking (arXiv 2507.01006 §4-5) trains its ViT + MLP adapter + language model in stages; at the tiny
scale here a stage differs only by which parameters train (`vl.train`) and its schedule:
  vit    the ViT + adapter alone, on attribute heads instead of chats (multimodal/vit_pretrain.py; run from main())
  align  `vl.train=adapter`: only the adapter (the ViT's 2x2 merge conv + the MLP merger) learns to map image
         features into the frozen decoder's embedding space (LLaVA-style alignment)
  sft    `vl.train=all`: everything, on the same chats (the answer in GLM-4.5V's answer box)
Per stage:
  data   records with image parts (glmstack.multimodal.data: files, or "synthetic:vqa" = the PIL visual QA set of
         glmstack.multimodal.vqa, written once under <out_dir>/<run>/data/vqa), encoded in `vl.chat_style` with the
         image placeholders expanded (multimodal.encode), one conversation per row
  loss   glmstack.posttrain.sft.sft_loss (next-token CE on the assistant's tokens; image tokens never trained), the
         batch's pixels passed to the model (train/loop.py VISION_INPUTS)
  model  `init_from` (a GLMV HF folder: glmstack.model.vision.load_vl_hf), else `vl.model_preset` with its token ids
         and vocabulary from the tokenizer (`vl.tokenizer`; the tiny recipe trains one on the set's texts)
  out    <out_dir>/<run>/<stage>/model/: HF weights (save_vl_hf) + tokenizer + chat template +
         preprocessor_config.json, and eval.json: held-out accuracy (multimodal.evaluate)

    glmstack vl-train vl_tiny --stage align
    glmstack vl-train vl_tiny --stage sft --set steps=100
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from glmstack.config import ConfigError
from glmstack.train.config import TrainConfig

SYNTHETIC_VQA = "synthetic:vqa"
ADAPTER = ("visual.downsample.", "visual.merger.")  # GLM-4.1V's MLP adapter: the 2x2 merge and the merger MLP


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


# ---------------------------------------------------------------------------------------------------- pieces
def stage_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.out_dir) / cfg.run / cfg.stage


def vqa_folder(cfg: TrainConfig) -> Path:
    return Path(cfg.out_dir) / cfg.run / "data" / "vqa"


def data_files(cfg: VLTrainConfig) -> list[Path]:
    """The record files; synthetic:vqa is written once per run (every stage of the run reads the same files)."""
    from glmstack.multimodal import vqa

    paths = []
    for entry in cfg.vl.data:
        if entry != SYNTHETIC_VQA:
            paths.append(Path(entry))
            continue
        folder = vqa_folder(cfg)
        if not (folder / "train.jsonl").exists():
            vqa.write(folder, cfg.vl.synthetic_n, seed=cfg.seed, test_n=max(cfg.vl.eval_n, 1))
        paths.append(folder / "train.jsonl")
    return paths


def load_tokenizer(cfg: VLTrainConfig, records: list[dict]):
    """`vl.tokenizer`, else init_from's, else a BPE trained on the records' texts (saved in the stage folder)."""
    from glmstack.tokenizer import Tokenizer
    from glmstack.train.checkpoint import resolve

    if cfg.vl.tokenizer or cfg.init_from:
        folder = Path(cfg.vl.tokenizer) if cfg.vl.tokenizer else resolve(cfg.init_from, cfg.out_dir)
        if not (folder / "tokenizer.json").exists():
            raise ConfigError(f"no tokenizer.json in {folder} (set vl.tokenizer=FOLDER)")
        return Tokenizer.load(folder)
    from glmstack.chat.schema import visible_text

    texts = [visible_text(m.get("content")) for r in records for m in r["messages"]]
    tok = Tokenizer.train(texts * 4, vocab_size=cfg.vl.tokenizer_vocab)
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
        return load_vl_hf(resolve(cfg.init_from, cfg.out_dir), dtype=torch.float32, device=device)
    overrides = dict(cfg.vl.model_overrides)
    text = {"vocab_size": tokenizer.vocab_size, **overrides.pop("text_config", {})}
    try:
        vl_cfg = VLConfig.preset(cfg.vl.model_preset, **token_ids(tokenizer), text_config=text, **overrides)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"vl.model_preset / vl.model_overrides: {e}") from None
    return GLMV(vl_cfg).init_weights(seed=cfg.seed, device=device)


def freeze(model, train: str) -> int:
    """requires_grad per `vl.train`; returns the number of trainable parameters."""
    def learns(name: str) -> bool:
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
    the chat template, preprocessor_config.json; written beside, then renamed into place."""
    import shutil

    from glmstack.chat.render import official_template
    from glmstack.model.vision import save_vl_hf

    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_vl_hf(model, tmp)
    tokenizer.save(tmp, chat_style=chat_style)
    config_path = tmp / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = official_template(chat_style)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    processor.save(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def build_data(cfg: VLTrainConfig, tokenizer, processor, records: list[dict]):
    """`synthetic:vqa` alone: the endless stream (a fresh image every row); otherwise the records, encoded."""
    from glmstack.multimodal.data import VisionSFT, VQAStream, encode_records

    if cfg.vl.data == [SYNTHETIC_VQA] and cfg.vl.stream:
        return VQAStream(tokenizer, processor, batch_size=cfg.micro_batch_size, seed=cfg.seed,
                         style=cfg.vl.chat_style)  # fmt: skip
    examples = encode_records(tokenizer, processor, records, cfg.vl.chat_style)
    try:
        return VisionSFT(examples, batch_size=cfg.micro_batch_size, seed=cfg.seed, max_len=cfg.seq_len)
    except ValueError as e:
        raise ConfigError(f"{cfg.stage} data: {e}") from None


# ---------------------------------------------------------------------------------------------------- stage
def run_vl(cfg: VLTrainConfig, stop_at: int | None = None) -> dict:
    """Train one stage, export its model folder, score the held-out set."""
    from glmstack.multimodal.data import read_multimodal
    from glmstack.optim import build_optimizer
    from glmstack.posttrain.sft import sft_loss
    from glmstack.train.loop import device_of, train
    from glmstack.train.stage import seed_everything

    if not isinstance(cfg, VLTrainConfig):
        raise ConfigError(f"a vision-language stage needs a VLTrainConfig (got {type(cfg).__name__})")
    folder = stage_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    records = read_multimodal(data_files(cfg), log=print)
    tokenizer = load_tokenizer(cfg, records)
    device = device_of(cfg)
    model = build_model(cfg, tokenizer, device)
    trainable = freeze(model, cfg.vl.train)
    print(f"{cfg.stage}: {trainable:,} of {model.num_params():,} parameters train (vl.train={cfg.vl.train})", flush=True)
    processor = processor_for(cfg, model)
    data = build_data(cfg, tokenizer, processor, records)
    optimizer, _ = build_optimizer(model, cfg.optim)
    result = train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder, loss_fn=sft_loss,
                   stop_at=stop_at)  # fmt: skip
    return finish(cfg, result, model, tokenizer, processor, folder)


def finish(cfg, result: dict, model, tokenizer, processor, folder: Path) -> dict:
    """After a finished run (vl stages and vl-rl): export the model folder, score the held-out set (eval.json)."""
    if result["stopped"] != "done":
        return result
    result["model"] = str(export(model, tokenizer, processor, folder / "model", cfg.vl.chat_style))
    if cfg.vl.eval_n:
        from glmstack.multimodal.evaluate import evaluate_model, heldout_items

        scores = evaluate_model(model, tokenizer, processor, heldout_items(cfg), cfg.vl.chat_style,
                                max_new_tokens=cfg.vl.max_new_tokens)  # fmt: skip
        (folder / "eval.json").write_text(json.dumps(scores, indent=2) + "\n")
        result["heldout_acc"] = scores["accuracy"]
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    from glmstack.config import apply_overrides
    from glmstack.errors import GlmstackError, one_line
    from glmstack.recipes import recipe_function

    ap = argparse.ArgumentParser(prog="glmstack vl-train", description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="recipe module under glmstack/recipes (e.g. vl_tiny)")
    ap.add_argument("--stage", default="sft", help="the recipe's stage function: vit, align, sft")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    try:
        cfg = apply_overrides(recipe_function(args.recipe, args.stage)(), args.overrides)
        if args.stage == "vit":
            from glmstack.multimodal.vit_pretrain import run_vit

            result = run_vit(cfg)
        else:
            result = run_vl(cfg)
    except GlmstackError as e:
        print(one_line("glmstack vl-train", e), file=sys.stderr, flush=True)
        return 2
    print(f"{args.stage} finished: {result}", flush=True)
    return 0 if result["stopped"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
