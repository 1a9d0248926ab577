"""TrainConfig: everything one training stage (pretrain, midtrain, later SFT/RL) is configured by.

Plain `@dataclass(kw_only=True)` data; recipes (glmstack/recipes/) are Python functions returning one, and
`--set optim.lr=3e-4` overrides go through glmstack.config.apply_overrides (unknown keys list the valid ones).
The resolved config is written next to every checkpoint; resuming compares it with the new one field by field
(RESUME_MAY_CHANGE lists what may differ). `problems(cfg)` checks the values that only the run would otherwise
reject (model overrides, packing, loader options, device) when the config is built, before any model exists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from glmstack.model.lora import LoraConfig
from glmstack.model.lora import problems as lora_problems


@dataclass(kw_only=True)
class OptimConfig:
    muon: bool = True  # False = AdamW for every parameter (the baseline for ablations and bench/train_step.py)
    lr: float = 2.5e-4  # peak lr for Muon and AdamW alike (match_rms_adamw makes them share it; GLM-4.5 §2.4)
    adamw_lr: float | None = None  # separate AdamW peak lr; None = lr
    weight_decay: float = 0.1  # decoupled, Muon matrices, embeddings and the head (GLM-4.5)
    adamw_weight_decay_1d: float = 0.0  # biases and norm gains: decaying a gain towards 0 only hurts
    momentum: float = 0.95  # Muon momentum μ (Nesterov)
    nesterov: bool = True  # Nesterov momentum in Muon
    ns_steps: int = 5  # Newton–Schulz iterations (Moonlight: 10 is no better than 5)
    # Newton–Schulz precision (torch/Keller: bf16); auto = bf16 where the hardware multiplies in bf16, else
    # float32 (optim/groups.ns_dtype: on an AVX2 CPU bf16 Newton–Schulz is 10-30x slower)
    ns_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"  # Muon update scale: 0.2·sqrt(max(A,B))
    adamw_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW (β1, β2)
    adamw_eps: float = 1e-8  # AdamW ε
    lm_head: Literal["adamw", "muon"] = "adamw"  # see glmstack/optim/groups.py for why AdamW
    router: Literal["adamw", "muon"] = "muon"  # MoE router weight; Muon per GLM-4.5's wording
    muon_split: dict[str, int] = field(default_factory=dict)  # param-name suffix -> heads (GLM-5 Muon Split)
    grad_clip: float = 1.0  # max global grad norm; 0 disables


@dataclass(kw_only=True)
class ScheduleConfig:
    lr: Literal["cosine", "wsd", "constant"] = "cosine"  # shape after warm-up
    warmup_steps: int = 10  # linear lr warm-up (offset steps; a continuing stage keeps pre-training's: same curve)
    rewarmup_steps: int = 0  # lr ramp over a stage's first steps when it starts without optimizer state (0 = none)
    total_steps: int | None = None  # steps the decay spans (in offset steps); None = this stage's end
    step_offset: int = 0  # added to the stage step: mid-training continues pre-training's decay
    final_lr_frac: float = 0.1  # lr at the end / peak (GLM-4.5: 2.5e-5 / 2.5e-4)
    wsd_decay_frac: float = 0.2  # WSD: fraction of the steps spent decaying
    batch_warmup_start_tokens: int = 0  # tokens/step per rank at the start (0 = no batch-size warm-up)
    batch_warmup_tokens: int = 0  # tokens per rank consumed while the batch ramps to full (GLM-4.5: 500B)
    mtp_weight: list[list[float]] = field(default_factory=lambda: [[0, 0.3]])  # [[from_step, λ]]: GLM-4.5 0.3 then 0.1
    balance_rate: list[list[float]] = field(default_factory=lambda: [[0, 1e-3]])  # [[from_step, u]]: 1e-3 then 0
    aux_loss_weight: float = 1e-4  # sequence-wise balance loss α (GLM-4.5, DeepSeek-V3 Eq. 17)


@dataclass(kw_only=True)
class DataConfig:
    """What a training stage reads (shards are built by `glmstack data`, configured by data.PipelineConfig)."""

    kind: Literal["synthetic", "shards"] = "synthetic"  # synthetic = glmstack/train/markov_stream.py
    path: str = ""  # token shard folder (kind=shards); source weights are fixed when the shards are built
    packing: Literal["concat", "best_fit"] = "concat"  # pretrain concat, midtrain best-fit (kind=shards: documents)
    val_path: str = ""  # validation shards; "" = a held-out synthetic/shard stream
    options: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments for the loader


@dataclass(kw_only=True)
class CheckpointConfig:
    every: int = 100  # steps between checkpoints (0 = only at the end)
    keep_last: int = 3  # complete checkpoints kept; older ones are deleted
    resume: str = "auto"  # auto = from `latest` if present; never; or a step folder path


@dataclass(kw_only=True)
class LogConfig:
    every: int = 1  # steps between log lines / metrics.jsonl rows
    val_every: int = 0  # steps between validation losses (0 = never)
    val_batches: int = 4  # micro-batches per validation
    tensorboard: bool = False  # also write TensorBoard scalars
    wandb: Literal["off", "offline", "online"] = "off"  # also Weights & Biases (offline: no network; `wandb sync`)
    plots: bool = True  # PNG plots from metrics.jsonl at the end
    progress: bool = True  # tqdm bar on rank 0
    peak_flops: float = 989e12  # accelerator bf16 peak for MFU (H100 SXM dense); 0 disables MFU


@dataclass(kw_only=True)
class GuardConfig:
    spike_factor: float = 0.0  # skip a step whose loss > factor × running mean (0 = only NaN/inf skip)
    max_bad_steps: int = 5  # stop (with a checkpoint) after this many skipped steps in a row


@dataclass(kw_only=True)
class DistConfig:
    dp: Literal["auto", "none", "ddp", "fsdp"] = "auto"  # data parallel under torchrun (auto: ddp if world > 1)
    expert_parallel: bool = False  # shard routed experts over ranks, all-to-all dispatch/combine
    ep: int = 0  # expert-parallel degree: ranks per expert group (0 = all ranks); divides the number of ranks
    # DDP: let some parameters get no gradient in a step (RL's loss reads the logits only: the MTP layer is idle)
    find_unused_parameters: bool = False


@dataclass(kw_only=True)
class TrainConfig:
    run: str = "tiny"  # runs/<run>/<stage>/
    stage: str = "pretrain"  # stage folder name
    out_dir: str = "runs"  # root of run folders
    model: str = "tiny"  # ModelConfig preset name
    model_overrides: dict[str, Any] = field(default_factory=dict)  # HF-named ModelConfig fields to change
    init_from: str = ""  # HF folder (or run/stage) of the previous stage's checkpoint; "" = fresh init
    optim_state: Literal["carry", "fresh"] = "carry"  # init_from's optimizer state if params match, else rewarm-up
    # read trainer state (pickled DCP metadata) from folders outside out_dir: init_from's optimizer state, an explicit
    # ckpt.resume folder. Only for folders you trust as you trust code (train/checkpoint.py)
    trust_external_state: bool = False
    rope_theta: float = 0.0  # RoPE base for this stage (0 = keep the model's); midtrain raises it (GLM-4.5 1e4 -> 1e6)
    seq_len: int = 128  # tokens per sequence
    micro_batch_size: int = 4  # sequences per micro-batch per rank
    grad_accum: int = 1  # micro-batches per step at full batch size
    steps: int = 100  # optimizer steps in this stage
    seed: int = 0  # init, data order and every RNG
    device: str = "auto"  # auto = cuda if available, else cpu
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # autocast dtype: auto = bf16 on GPU, fp32 on CPU
    compile: Literal["auto", "on", "off"] = "auto"  # torch.compile each block's forward: auto = on GPU only
    optim: OptimConfig = field(default_factory=OptimConfig)  # optimiser
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)  # per-step tables
    data: DataConfig = field(default_factory=DataConfig)  # what to train on
    ckpt: CheckpointConfig = field(default_factory=CheckpointConfig)  # checkpoints and resume
    log: LogConfig = field(default_factory=LogConfig)  # logging, validation, plots
    guard: GuardConfig = field(default_factory=GuardConfig)  # NaN / loss-spike guard
    dist: DistConfig = field(default_factory=DistConfig)  # torchrun parallelism
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA / QLoRA on a frozen base (model/lora.py); off by default

    def __post_init__(self):
        found = problems(self)
        if found:
            from glmstack.errors import ConfigError

            raise ConfigError("; ".join(found))


# Loader arguments the stage fills itself (glmstack/train/stage.py: build_data); data.options may set the others.
STAGE_LOADER_ARGS = {"self", "data_dir", "vocab_size", "seq_len", "batch_size", "rank", "world_size", "seed", "split",
                     "shuffle", "options"}


def problems(cfg: TrainConfig) -> list[str]:
    """One message per field the run would reject later (empty when none): checked when a config is built
    (TrainConfig.__post_init__, so every --set and --print-config) and again by stage.run on a mutated recipe."""
    from glmstack.errors import ConfigError
    from glmstack.model.config import ModelConfig

    p = []
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(cfg.model_overrides) - fields)
    if unknown:
        p.append(f"model_overrides: unknown ModelConfig field(s) {', '.join(unknown)}; valid: {', '.join(sorted(fields))}")
    elif not cfg.init_from:
        try:  # a fresh model: its whole config is known now (the checkpoint's is checked when it is read)
            ModelConfig.preset(cfg.model, **cfg.model_overrides)
        except ConfigError as e:
            p.append(f"model / model_overrides: {e}")
    if cfg.data.kind == "shards" and not cfg.data.path:
        p.append("data.path: empty; data.kind=shards needs a token shard folder")
    if cfg.data.kind == "synthetic" and cfg.data.packing != "concat":
        p.append(f"data.packing={cfg.data.packing!r} needs data.kind=shards (synthetic data has no documents to pack)")
    allowed = loader_options(cfg.data.kind, cfg.data.packing)
    bad = sorted(set(cfg.data.options) - allowed)
    if bad:
        p.append(f"data.options: unknown key(s) {', '.join(bad)} for the {cfg.data.kind} loader; "
                 f"valid: {', '.join(sorted(allowed)) or 'none'}")
    p += _blank_problems(cfg.data.options.get("blank_infilling"))
    if cfg.lora.enabled:
        p += lora_problems(cfg.lora)
        if cfg.lora.base_quant and (cfg.dist.dp not in ("auto", "none", "ddp") or cfg.dist.expert_parallel):
            p.append("lora.base_quant (QLoRA): the quantized base replicates (dist.dp=ddp) but does not shard; "
                     "set dist.dp=ddp or none, without dist.expert_parallel")
    if cfg.device != "auto":
        import torch

        try:
            torch.device(cfg.device)
        except RuntimeError:
            p.append(f"device: {cfg.device!r} is not a torch device (auto, cpu, cuda, cuda:N)")
    return p


def _blank_problems(blank) -> list[str]:
    """data.options.blank_infilling must build a BlankConfig (glmstack/data/blank_infilling.py)."""
    if blank is None:
        return []
    from glmstack.data.blank_infilling import BlankConfig

    try:
        BlankConfig(**blank)
    except (TypeError, ValueError) as e:
        return [f"data.options.blank_infilling: {e}"]
    return []


def loader_options(kind: str, packing: str) -> set[str]:
    """Keyword arguments data.options may pass to the stage's loader (its constructor's, less the stage's own)."""
    import inspect

    if kind == "synthetic":
        from glmstack.train.markov_stream import SyntheticLM as loader

        classes = [loader]
    else:
        from glmstack.data import loader as mod

        cls = {"concat": mod.PretrainLoader, "best_fit": mod.PackedLoader}[packing]
        classes = [c for c in cls.__mro__ if "__init__" in vars(c) and c is not object]
    own = {name for c in classes for name in inspect.signature(c.__init__).parameters} - STAGE_LOADER_ARGS
    return own | {"blank_infilling"}  # GLM blank infilling around the loader (stage.build_data)


# Fields that may differ between the config a checkpoint was written with and the one resuming from it.
RESUME_MAY_CHANGE = (
    "steps", "ckpt.", "log.", "guard.", "device", "compile", "dist.", "data.path", "data.val_path", "optim_state",
    "trust_external_state",
    "out_dir",  # a run folder moved to another cluster or disk
)


def resume_conflicts(old: dict, new: dict) -> list[str]:
    """Dotted fields that differ between two config dicts and would make a resume silently wrong."""
    from glmstack.config import diff_fields

    return [f for f in diff_fields(old, new) if not any(f == k or f.startswith(k) for k in RESUME_MAY_CHANGE)]
