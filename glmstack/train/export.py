"""The one model-folder export and the one tokenizer lookup every stage uses (sft, rl, agentic, distill, rm, VL).

A finished stage writes `<stage>/model/`: what a later stage's `init_from`, `glmstack chat`, `glmstack serve` and
transformers read. Weights (the checkpoint's HF files, or a writer's: a VL model's safetensors + its
preprocessor_config.json), the tokenizer with the chat style's official template, written beside and renamed into
place so a crash never leaves half a folder. A stage's tokenizer is its explicit option (`sft.tokenizer`,
`rm.tokenizer`, `vl.tokenizer`) or its init_from folder's.

    export_checkpoint(Path("runs/x/sft/step_0000100"), Path("runs/x/sft/model"), tokenizer, "glm-4.5")
    tok = stage_tokenizer(cfg, cfg.sft.tokenizer, option="sft.tokenizer")
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from glmstack.config import ConfigError


def export_folder(folder: Path, tokenizer, chat_style: str, write_weights) -> Path:
    """`write_weights(tmp)` fills a fresh folder beside `folder`; then the tokenizer and `chat_style`'s official
    template (the tokenizer's own may be another style's) go in, and it is renamed into place."""
    from glmstack.chat.render import official_template

    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_weights(tmp)
    tokenizer.save(tmp, chat_style=chat_style)
    config_path = tmp / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = official_template(chat_style)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def export_checkpoint(checkpoint: Path, folder: Path, tokenizer, chat_style: str) -> Path:
    """A text stage's model folder: the checkpoint's HF files (config.json + safetensors) + the tokenizer."""

    def copy(tmp: Path) -> None:
        for f in Path(checkpoint).iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)

    return export_folder(folder, tokenizer, chat_style, copy)


def stage_tokenizer(cfg, explicit: str = "", option: str = "", required: bool = True):
    """`explicit` (a stage's tokenizer option, named `option` in errors), else the init_from folder's tokenizer;
    None when there is none and the stage can do without (RL's token task)."""
    from glmstack.tokenizer import Tokenizer
    from glmstack.train.checkpoint import resolve

    folder = Path(explicit) if explicit else resolve(cfg.init_from, cfg.out_dir) if cfg.init_from else None
    if folder is not None and (folder / "tokenizer.json").exists():
        return Tokenizer.load(folder)
    if not required:
        return None
    hint = f" (set {option}=FOLDER)" if option else " (init_from must be a model folder with one)"
    raise ConfigError(f"no tokenizer.json in {folder or 'init_from (unset)'}{hint}")
