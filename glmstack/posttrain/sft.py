"""`glmstack sft <recipe> [--set key=value ...]`: supervised fine-tuning in GLM's chat format on the one loop.

GLM-4.5 §3.1 / GLM-5 §3: cold-start SFT per expert, then an overall SFT on a balanced mix of full-reasoning and
no-thinking conversations with XML tool calls; erroneous turns stay in context but out of the loss. Here that is
data + a loss over the shared stage code (glmstack/train/stage.py) and the one loop (glmstack/train/loop.py):
  data   conversation files (glmstack.posttrain.sft_data: OpenAI messages / ShareGPT, JSONL / Parquet / folders)
         and the synthetic sets ("synthetic:arithmetic", ...: glmstack.posttrain.synthetic, written to
         <stage>/data/ first), encoded by glmstack.chat.encode in `sft.chat_style`, packed best-fit with document
         masks and reshuffled per epoch (glmstack.posttrain.packed)
  loss   next-token CE + MTP (weight `schedule.mtp_weight`) on exactly the tokens chat.encode marks as trained
  init   `init_from`: an HF folder or run/stage (required); the tokenizer comes from there unless `sft.tokenizer`
  out    <out_dir>/<run>/sft/model/: the final weights + tokenizer.json + a tokenizer_config.json whose
         chat_template is the official template of `sft.chat_style`, so transformers' apply_chat_template and
         glmstack.chat render the same ids (tests/integration/test_sft.py)

    glmstack sft sft_speedrun                          # the speedrun model on the synthetic sets
    glmstack sft sft_speedrun --set steps=50 --set sft.data='["my_chats.jsonl"]'
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from glmstack.config import ConfigError
from glmstack.train import dist
from glmstack.train.config import TrainConfig
from glmstack.train.export import export_checkpoint as export
from glmstack.train.loop import pretrain_loss

SYNTHETIC = "synthetic:"


@dataclass(kw_only=True)
class SFTOptions:
    data: list[str] = field(default_factory=list)  # files/folders, or "synthetic:<set>" (arithmetic, tools, chat)
    val_data: list[str] = field(default_factory=list)  # same, for the validation loss; "" = none
    synthetic_n: int = 2000  # records per synthetic set (train); a tenth of it for validation
    chat_style: str = "glm-4.5"  # glm-4.5 (GLM-4.5/4.6 template) or glm-4.7 (GLM-4.7/5)
    # GLM-5's thinking modes (glmstack.chat.modes): "interleaved" (one example per user turn, earlier reasoning
    # cleared), "preserved" (whole conversations with every turn's reasoning; glm-4.7 only), "turn" (thinking
    # switched per user turn); synthetic sets are generated in the mode. "" = each record's own switches.
    thinking_mode: str = ""
    tokenizer: str = ""  # folder with tokenizer.json; "" = the init_from checkpoint's
    pack_buffer: int = 16384  # conversations packed together (best-fit within the buffer)
    shuffle: bool = True  # reshuffle conversations (and rows) every epoch


@dataclass(kw_only=True)
class SFTConfig(TrainConfig):
    sft: SFTOptions = field(default_factory=SFTOptions)


def sft_loss(model, batch: dict, values: dict):
    """The pre-training objective on SFT labels (-100 outside the trained tokens): chat.encode's mask decides."""
    loss, metrics = pretrain_loss(model, batch, values)
    metrics["trained_frac"] = (batch["labels"] != -100).float().mean().detach()
    return loss, metrics


# ---------------------------------------------------------------------------------------------------- data
def data_files(entries: list[str], out: Path, n: int, seed: int, split: str, generate=None,
               thinking_mode: str = "") -> list[Path]:  # fmt: skip
    """Paths for the entries; synthetic sets are generated into `out` once (the files are the record).
    `generate(name, n, seed, split) -> records`: synthetic.generate (SFT sets, in `thinking_mode`) unless given
    (rm's preference sets)."""
    from glmstack.posttrain.sft_data import write_jsonl
    from glmstack.posttrain.synthetic import generate as sft_sets
    from glmstack.posttrain.synthetic import set_file

    if generate is None:
        generate = lambda name, n, seed, split: sft_sets(name, n, seed, split, thinking_mode)
    paths = []
    for e in entries:
        if not e.startswith(SYNTHETIC):
            paths.append(Path(e))
            continue
        name = e[len(SYNTHETIC) :]
        path = out / set_file(name, split, thinking_mode)
        if not path.exists() and dist.rank() == 0:
            try:
                write_jsonl(generate(name, n, seed, split), path)
            except ValueError as err:
                raise ConfigError(f"sft.data: {err}") from None
        dist.barrier()
        paths.append(path)
    return paths


def load_tokenizer(cfg: SFTConfig):
    from glmstack.train.export import stage_tokenizer

    return stage_tokenizer(cfg, cfg.sft.tokenizer, option="sft.tokenizer")


def encoded(cfg: SFTConfig, tokenizer, split: str) -> list[tuple[list[int], list[int]]]:
    from glmstack.chat.modes import check_mode
    from glmstack.chat.render import get_style
    from glmstack.posttrain.sft_data import encode_examples, read_conversations
    from glmstack.train.stage import stage_dir

    style, mode = cfg.sft.chat_style, cfg.sft.thinking_mode
    try:
        get_style(style)
    except ValueError as e:
        raise ConfigError(f"sft.chat_style: {e}") from None
    try:
        if mode:
            check_mode(mode, style)
    except ValueError as e:
        raise ConfigError(f"sft.thinking_mode: {e}") from None
    entries = cfg.sft.data if split == "train" else cfg.sft.val_data
    n = cfg.sft.synthetic_n if split == "train" else max(1, cfg.sft.synthetic_n // 10)
    paths = data_files(entries, stage_dir(cfg) / "data", n, cfg.seed, "train" if split == "train" else "test",
                       thinking_mode=mode)  # fmt: skip
    log = print if dist.rank() == 0 else None
    records, report = read_conversations(paths, log=log)
    if log:
        print(f"sft {split} data: {report.summary()}", flush=True)
    try:
        return [ex for r in records for ex in encode_examples(tokenizer, r, style, mode)]
    except ValueError as e:  # a record asking for preserved thinking in the glm-4.5 style
        raise ConfigError(f"sft {split} data: {e}") from None


def data_builder(tokenizer):
    """`build(cfg, vocab, split)` for glmstack.train.stage.run: packed SFT batches of this rank."""
    from glmstack.posttrain.packed import PackedSFT

    def build(cfg: SFTConfig, vocab_size: int, split: str = "train"):
        if split != "train" and not cfg.sft.val_data:
            return []  # no validation batches: the loop logs val_loss as nan
        examples = encoded(cfg, tokenizer, split)
        bad = [i for ids, _ in examples for i in ids if i >= vocab_size][:1]
        if bad:
            raise ConfigError(f"token id {bad[0]} >= the model's vocab_size {vocab_size}: tokenizer and model differ")
        try:
            data = PackedSFT(examples, seq_len=cfg.seq_len, batch_size=cfg.micro_batch_size, seed=cfg.seed,
                             rank=dist.rank(), world_size=dist.world(), buffer=cfg.sft.pack_buffer,
                             shuffle=cfg.sft.shuffle and split == "train")  # fmt: skip
        except ValueError as e:
            raise ConfigError(f"sft {split} data: {e}") from None
        if data.dropped_long and dist.rank() == 0:
            print(f"sft {split} data: {data.dropped_long} conversations longer than seq_len={cfg.seq_len} dropped")
        return data

    return build


# ---------------------------------------------------------------------------------------------------- stage
def check(cfg: SFTConfig) -> None:
    if not isinstance(cfg, SFTConfig):
        raise ConfigError(f"the sft stage needs an SFTConfig (got {type(cfg).__name__})")
    if not cfg.init_from:
        raise ConfigError("init_from is required: the HF folder or run/stage of the model to fine-tune")
    if not cfg.sft.data:
        raise ConfigError("sft.data is empty: give files/folders or synthetic:<set>")


def run_sft(cfg: SFTConfig, stop_at: int | None = None) -> dict:
    """Train, then export <stage>/model (weights + tokenizer + chat template)."""
    from glmstack.train.stage import run, stage_dir

    check(cfg)
    tokenizer = load_tokenizer(cfg)
    result = run(cfg, loss_fn=sft_loss, stop_at=stop_at, build=data_builder(tokenizer))
    if dist.rank() == 0 and result["stopped"] == "done":
        result["model"] = str(export(Path(result["checkpoint"]), stage_dir(cfg) / "model", tokenizer,
                                     cfg.sft.chat_style))  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    from glmstack.stage_cli import main_for

    return main_for("sft", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
