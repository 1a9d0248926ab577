"""What every training stage does around the loop: model, data, optimiser, from a resolved TrainConfig.

pretrain.py and midtrain.py are thin: they name their stage and (midtrain) what it changes; SFT and RL reuse
`build_model` / `run` with their own data and loss functions. The config comes from the command side (a recipe +
`--set` overrides: glmstack.recipes.load_config, run by glmstack/stage_cli.py), never from here: training code does
not import the recipes (issue 35). Reads top to bottom:

    cfg = load_config("tiny", "pretrain", ["optim.lr=3e-4"])     # from glmstack.recipes
    result = run(cfg)                                            # model -> parallelize -> optimiser -> train
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import numpy as np
import torch

from glmstack.config import ConfigError, diff_fields
from glmstack.model.config import TRAINING_FIELDS
from glmstack.optim import build_optimizer
from glmstack.train import checkpoint, dist
from glmstack.train import lora as lora_stage
from glmstack.train.config import TrainConfig, problems
from glmstack.train.loop import device_of, pretrain_loss, train
from glmstack.train.markov_stream import SyntheticLM

# ModelConfig fields a later stage may change on loaded weights: the RoPE base and context length (GLM-4.5
# mid-training) and the model's training-only fields (MTP/aux weights, GLM-5's DSA stage, ...); any other
# difference would not match the checkpoint's tensors.
STAGE_MAY_CHANGE = ("rope_theta", "max_position_embeddings", *TRAINING_FIELDS)
resolve_checkpoint = checkpoint.resolve  # init_from -> checkpoint folder (posttrain/sft.py imports this name)


def stage_dir(cfg: TrainConfig) -> Path:
    return Path(cfg.out_dir) / cfg.run / cfg.stage


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(cfg: TrainConfig, device: torch.device):
    """The stage's model, parallelised and filled: a fresh GLM from the preset (seeded init) or the previous stage's
    checkpoint, stage RoPE base applied. It is built on meta, parallelised there (dist.parallelize: expert
    parallel, DDP or FSDP2), then materialised on `device` from a stream of full tensors of which each rank keeps
    its part (dist.materialize), so no rank ever holds the whole model: what lets a GLM-4.5-Air recipe start."""
    model, tensors = _meta_model(cfg, device)
    if cfg.lora.enabled and cfg.lora.base_quant:  # filled and quantized whole on every rank, replicated by DDP
        model = lora_stage.qlora_model(model, tensors, cfg, device)
        return dist.parallelize(model, cfg.dist.dp, find_unused=cfg.dist.find_unused_parameters)
    if cfg.lora.enabled:
        tensors = lora_stage.adapt(model, tensors, cfg)
    fill = lambda m: dist.materialize(m, device, tensors)
    model = dist.parallelize(model, cfg.dist.dp, cfg.dist.expert_parallel, fill=fill, ep=cfg.dist.ep,
                             find_unused=cfg.dist.find_unused_parameters)  # fmt: skip
    if cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda"):
        compile_blocks(dist.unwrap(model))
    return model


def initial_model(cfg: TrainConfig, device: torch.device):
    """The stage's starting model (init_from's weights or the seeded init) on `device`, not parallelised and not
    compiled: the frozen reference of a preference stage (posttrain/dpo) is what the policy was at step 0."""
    model, tensors = _meta_model(cfg, device)
    dist.materialize(model, device, tensors)
    return model


def compile_blocks(model) -> None:
    """torch.compile each decoder block's (and MTP layer's) forward, in place: state-dict names do not change and
    FSDP2's per-block hooks stay outside the compiled code. Per block rather than the whole model because the
    blocks repeat (one compiled graph serves them all once dynamo has seen it) and the experts' token counts
    break graphs at block boundaries anyway. Off on CPU by default: no gain measured there (docs/model.md)."""
    for block in dist.blocks(model):
        block.forward = torch.compile(block.forward)


def _meta_model(cfg: TrainConfig, device: torch.device):
    """-> (the stage's GLM on meta, its initial tensors: the seeded init or the checkpoint's, streamed)."""
    from glmstack.model import GLM, ModelConfig
    from glmstack.model.hf import checkpoint_tensors

    overrides = dict(cfg.model_overrides)
    if cfg.rope_theta:
        overrides["rope_theta"] = cfg.rope_theta
    if not cfg.init_from:
        model = GLM(ModelConfig.preset(cfg.model, **overrides))
        return model, model.initial_tensors(seed=cfg.seed, device=device)
    folder = checkpoint.resolve(cfg.init_from, cfg.out_dir)
    saved = ModelConfig.from_hf(folder)
    new_cfg = dataclasses.replace(saved, **overrides)  # e.g. mid-training's RoPE base change: same weights
    changed = [f for f in diff_fields(saved, new_cfg) if f not in STAGE_MAY_CHANGE]
    if changed:
        raise ConfigError(
            f"init_from={cfg.init_from!r}: the checkpoint's weights fix {', '.join(changed)}; "
            f"a stage may change only {', '.join(STAGE_MAY_CHANGE)}"
        )
    model = GLM(new_cfg, dtype=torch.float32)  # applies GLM-5's DSA stage (which indexer mode, what trains)
    return model, checkpoint_tensors(model, folder, missing_mtp="init", seed=cfg.seed)


def build_data(cfg: TrainConfig, vocab_size: int, split: str = "train"):
    """The stage's loader per the data-batches contract (rank-aware, resumable)."""
    options = dict(cfg.data.options)
    blank = options.pop("blank_infilling", None)
    loader = _base_loader(cfg, vocab_size, split, options)
    if blank is None:
        return loader
    from glmstack.data.blank_infilling import BlankConfig, BlankInfilling

    return BlankInfilling(loader, BlankConfig(**blank), vocab_size=vocab_size, seq_len=cfg.seq_len)


def _base_loader(cfg: TrainConfig, vocab_size: int, split: str, options: dict):
    kw = {"seq_len": cfg.seq_len, "batch_size": cfg.micro_batch_size, "rank": dist.rank(), "world_size": dist.world()}
    if cfg.data.kind == "synthetic":
        return SyntheticLM(vocab_size=vocab_size, seed=cfg.seed, split=split, **kw, **options)
    try:
        from glmstack.data.loader import build_loader
    except ImportError as e:
        raise ConfigError("data.kind=shards needs glmstack.data.loader.build_loader") from e
    path = cfg.data.val_path if split == "val" and cfg.data.val_path else cfg.data.path
    return build_loader(
        path=path,
        packing=cfg.data.packing,
        seed=cfg.seed,
        split=split,
        **kw,
        **options,
    )


def check_inputs(cfg: TrainConfig) -> None:
    """What the run would otherwise find late, checked before a model is allocated: the config's values (a recipe
    may have mutated it after it was built), the resume folder, and that the token shards' vocabulary fits the
    model's embedding (past it: an index error on CPU, a device assert on CUDA)."""
    from glmstack.model import ModelConfig

    found = problems(cfg)
    if found:
        raise ConfigError("; ".join(found))
    if cfg.ckpt.resume not in ("auto", "never"):
        checkpoint.check_resumable(cfg.ckpt.resume)
    if cfg.data.kind != "shards":
        return
    if cfg.init_from:
        model_cfg = ModelConfig.from_hf(checkpoint.resolve(cfg.init_from, cfg.out_dir))
    else:
        model_cfg = ModelConfig.preset(cfg.model, **cfg.model_overrides)
    for path in dict.fromkeys(p for p in (cfg.data.path, cfg.data.val_path) if p):
        index = Path(path) / "index.json"
        if not index.is_file():
            raise ConfigError(f"data.path: {index} not found (build the token shards first: glmstack data ...)")
        try:
            shard_vocab = int(json.loads(index.read_text())["vocab_size"])
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{index}: unreadable shard index ({e!r})") from None
        if shard_vocab > model_cfg.vocab_size:
            raise ConfigError(
                f"{index}: the shards' tokenizer has {shard_vocab} ids but the model's vocab_size is "
                f"{model_cfg.vocab_size}; set model_overrides.vocab_size >= {shard_vocab} or use matching shards"
            )


def model_and_optimizer(cfg: TrainConfig):
    """Inputs checked, process group, seeds, then the stage's model and optimiser -> (model, optimizer)."""
    check_inputs(cfg)
    device = device_of(cfg)
    dist.init_from_env(device.type)
    seed_everything(cfg.seed)
    model = build_model(cfg, device)
    optimizer, _ = build_optimizer(dist.unwrap(model), cfg.optim)
    return model, optimizer


def run(cfg: TrainConfig, *, loss_fn=pretrain_loss, stop_at: int | None = None, build=build_data) -> dict:
    """Build everything for `cfg` and run the loop; returns the loop's summary. `build(cfg, vocab, split)` makes
    the data (SFT passes its packed conversations; RL, whose data needs the model, calls model_and_optimizer)."""
    # ------------------------------------------------------------------ model, parallelism, optimiser
    model, optimizer = model_and_optimizer(cfg)
    # ------------------------------------------------------------------ data
    vocab = dist.unwrap(model).cfg.vocab_size
    data = build(cfg, vocab)
    val_batches = []
    if cfg.log.val_every:
        val_batches = list(itertools.islice(iter(build(cfg, vocab, split="val")), cfg.log.val_batches))
    # ------------------------------------------------------------------ train
    return train(
        model=model,
        optimizer=optimizer,
        data=data,
        cfg=cfg,
        stage_dir=stage_dir(cfg),
        loss_fn=loss_fn,
        val_batches=val_batches,
        stop_at=stop_at,
    )
