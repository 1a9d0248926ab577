"""`glmstack vl-train <recipe> --stage vit|align|sft`: vision-language training stages on the one loop.

GLM-4.1V-Thinking (arXiv 2507.01006 §4-5) trains its ViT + MLP adapter + language model in stages; at the tiny
scale here a stage differs only by which parameters train (`vl.train`) and its schedule:
  vit    the ViT + adapter alone, on attribute heads instead of chats (multimodal/vit_pretrain.py: a ViTConfig)
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
    glmstack vl-train vl_tiny --stage sft --set steps=100 --stop-at 50     # then the same with --resume auto
    glmstack sft vl_tiny --print-config                                    # any stage command runs a VL config
The command is glmstack/stage_cli.py's, as every training stage's (--resume, --stop-at, --print-config). One process:
multi-rank VL training is not built, and a torchrun launch is refused (stage_setup.single_process).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from glmstack.config import ConfigError

# the config and the shared stage pieces live in their own modules (vit_pretrain.py and evaluate.py use them too);
# VLOptions and export stay importable from here (multimodal/rl.py, tests)
from glmstack.multimodal.config import SYNTHETIC_VQA, VLOptions, VLTrainConfig, stage_dir  # noqa: F401
from glmstack.multimodal.stage_setup import (
    build_model,
    data_files,
    export,
    freeze,
    load_tokenizer,
    processor_for,
    single_process,
)


# ---------------------------------------------------------------------------------------------------- data
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
    single_process(cfg)
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
    from glmstack.stage_cli import main_for

    return main_for("vl-train", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
