"""`glmstack data <recipe>`: build token shards from a recipe (or a JSON config) with progress and a summary.

    glmstack data tiny --out runs/data-tiny                       # ~0.2 MB embedded corpus, seconds
    glmstack data default --out runs/data --workers 2              # ~4 MB embedded corpus
    glmstack data my.json --out runs/data --tokenizer runs/tok --set corpus.size_mb=8 --set dedup=false
    glmstack data default --print-config                           # the resolved config as JSON

Without --tokenizer a byte-level BPE (--vocab-size) is trained on the train split first and saved with the data.
Reruns with the same config and tokenizer are no-ops; an interrupted build resumes from its last finished unit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from glmstack.config import ConfigError, apply_overrides, from_dict, to_json
from glmstack.data.executor import DataTaskError
from glmstack.data.pipeline import PipelineConfig, build_dataset, with_seed
from glmstack.data.sources import CorruptSourceError, EmptyInputError


def load_recipe(name: str) -> PipelineConfig:
    """A JSON config file, or the `data()` stage of `glmstack.recipes.<name>` (chosen like `glmstack pretrain`)."""
    if name.endswith(".json"):
        return load_json_config(Path(name))
    from glmstack.recipes import recipe_function

    cfg = recipe_function(name, "data")()
    if not isinstance(cfg, PipelineConfig):
        raise ConfigError(f"recipe {name}.data() returned {type(cfg).__name__}, expected PipelineConfig")
    return cfg


def load_json_config(path: Path) -> PipelineConfig:
    """A PipelineConfig from a JSON file; a missing file, bad JSON or a bad field is a ConfigError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such data config file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f"line {e.lineno} column {e.colno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise ConfigError(f"{path}: not valid JSON ({where})") from None
    try:
        return from_dict(PipelineConfig, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def train_tokenizer(cfg: PipelineConfig, vocab_size: int, max_mb: float = 20.0):
    """A BPE trained on up to `max_mb` of the train split of the configured sources."""
    from glmstack.data.pipeline import _iter_sources
    from glmstack.tokenizer import Tokenizer

    def texts():
        used = 0
        for doc in _iter_sources(cfg, {}, {}):
            if doc.meta["split"] == "train":
                yield doc.text
                used += len(doc.text)
                if used > max_mb * 1e6:
                    return

    return Tokenizer.train(texts(), vocab_size)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="glmstack data",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("recipe", help="a recipe with a data() stage (default, tiny, speedrun) or a JSON config file")
    p.add_argument("--out", default="runs/data", help="output folder (train/, eval/, tokenizer/, summary.json)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder; trained on the data when absent")
    p.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size when training a tokenizer")
    p.add_argument("--workers", type=int, default=None, help="parallel workers (sets executor=processes if local)")
    p.add_argument("--executor", default=None, help="local | processes | slurm | ray | datatrove-local")
    p.add_argument("--seed", type=int, default=None, help="sets every component seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, repeatable")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars or summary table")
    return p


def resolve(args) -> PipelineConfig:
    cfg = load_recipe(args.recipe)
    if args.seed is not None:
        cfg = with_seed(cfg, args.seed)
    sets = list(args.set)
    if args.workers is not None:
        sets.append(f"workers={args.workers}")
        if args.executor is None and args.workers > 1 and cfg.executor == "local":
            sets.append("executor=processes")
    if args.executor is not None:
        sets.append(f"executor={args.executor}")
    if args.no_progress:
        sets.append("progress=false")
    return apply_overrides(cfg, sets)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = resolve(args)
    except ConfigError as e:
        print(f"glmstack data: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(to_json(cfg))
        return 0
    from glmstack.tokenizer import Tokenizer

    try:
        tok = Tokenizer.load(args.tokenizer) if args.tokenizer else train_tokenizer(cfg, args.vocab_size)
        build_dataset(cfg, tok, args.out)
    except (EmptyInputError, CorruptSourceError, DataTaskError) as e:
        print(f"glmstack data: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}/train and {args.out}/eval")
    return 0
