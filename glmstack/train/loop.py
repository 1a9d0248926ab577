"""The ONE training loop: every stage (pretrain, midtrain, SFT, RL) runs `train(...)` with its own data, loss
function and schedule tables (one loop, as OLMo-core's one trainer, so a fix reaches every stage).

Per optimizer step:
  schedules (pure in the step) -> lr, MTP weight, balancing rate, micro-batches to accumulate
  -> forward/backward per micro-batch, each weighted by its share of the step's loss tokens (labels != -100,
     all ranks): the step's loss and gradient are the whole batch's (bf16 autocast on GPU, fp32 on CPU; DDP syncs
     only the last one)
  -> global grad norm + clipping -> NaN / loss-spike guard (skip, count, stop with a checkpoint after N in a row)
  -> optimizer step -> loss-free balancing bias update from the step's global expert load
  -> validation every `log.val_every` -> one log line + metrics.jsonl row every `log.every` steps and on every
     validated step -> checkpoint every `ckpt.every`.
Resume (`ckpt.resume=auto`) restores model, optimizer, RNGs, data position and loop counters from `latest`, so
N steps + resume + N steps equals 2N steps bit for bit (tests/integration/test_resume.py), also on another layout
or number of ranks (DCP, checkpoint.py; `grad_accum` may change when grad_accum x ranks, the global batch, stays). A new stage with `init_from`
carries that checkpoint's optimizer state when its parameters match (`optim_state=carry`; GLM-4.5 runs pre- and
mid-training as one run), else starts fresh and re-warms the lr up over `schedule.rewarmup_steps`; the stage
log says which.

    result = train(model=model, optimizer=opt, data=loader, cfg=train_cfg, stage_dir="runs/tiny/pretrain")
    # loss_fn(model, batch, values) -> (loss, metrics); values = this step's schedule values
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from glmstack.config import ConfigError, to_dict, write_json
from glmstack.model.lora import has_lora
from glmstack.optim import schedules
from glmstack.train import balance, checkpoint, dist
from glmstack.train.config import TrainConfig, resume_conflicts
from glmstack.train.metrics import Metrics, format_line, plot

# batch keys a vision-language model (glmstack.model.vision GLMV) takes besides the text model's, as transformers names them
VISION_INPUTS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
LossFn = Callable[[torch.nn.Module, dict, dict], tuple[torch.Tensor, dict]]


@dataclass
class LoopState:
    """Counters a checkpoint carries besides model, optimizer, RNG and data position."""

    step: int = 0  # optimizer steps done (including skipped ones)
    tokens: int = 0  # training tokens consumed, all ranks
    skipped: int = 0  # steps skipped by the guard, in total
    bad_in_row: int = 0  # consecutive skipped steps
    loss_ema: float | None = None  # running mean loss for the spike guard
    rewarm: bool = False  # the stage began without init_from's optimizer state: the lr re-warms up


def pretrain_loss(model, batch: dict, values: dict) -> tuple[torch.Tensor, dict]:
    """Default loss: next-token CE + MTP (weight scheduled) + sequence-wise aux balance loss (model's out.loss)."""
    out = model(
        batch["input_ids"],
        labels=batch["labels"],
        position_ids=batch.get("position_ids"),
        segment_ids=batch.get("segment_ids"),
        mtp_weight=values["mtp_weight"],
        aux_loss_weight=values["aux_loss_weight"],
        **({"prefix_len": batch["prefix_len"]} if "prefix_len" in batch else {}),  # GLM blank infilling's Part A
        **{k: batch[k] for k in VISION_INPUTS if k in batch},  # a vision-language model's pixels (multimodal/)
    )
    metrics = {"lm_loss": out.lm_loss.detach()}
    if getattr(out, "mtp_loss", None):
        metrics["mtp_loss"] = torch.stack(out.mtp_loss).mean().detach()
    if getattr(out, "aux_loss", None) is not None:
        metrics["aux_loss"] = out.aux_loss.detach()
    if getattr(out, "indexer_loss", None) is not None:  # GLM-5 DSA warm-up / sparse stages
        metrics["indexer_loss"] = out.indexer_loss
    if getattr(out, "expert_load", None) is not None:
        metrics["expert_load"] = out.expert_load.detach()
    return out.loss, metrics


# ---------------------------------------------------------------------------------------------------- helpers


def device_of(cfg: TrainConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPU by default; fp32 (no autocast) on CPU so CPU runs are exact and repeatable."""
    if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def _set_lr(optimizer, lr_mult: float) -> float:
    for g in optimizer.param_groups:
        g["lr"] = g["initial_lr"] * lr_mult
    return optimizer.param_groups[0]["lr"]


def _is_bad(loss: float, grad_norm: float, state: LoopState, spike_factor: float) -> bool:
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        return True
    return spike_factor > 0 and state.loss_ema is not None and loss > spike_factor * state.loss_ema


def _emit(line: str, bar) -> None:
    if bar is not None:
        bar.write(line)
    else:
        print(line, flush=True)


# ---------------------------------------------------------------------------------------------------- one step


def loss_tokens(batch: dict) -> int:
    """Tokens a micro-batch's loss averages over: its labels != -100 (all its tokens when it has no labels), or the
    items it says it averages over (`loss_count`: DPO's pairs, whose packed rows vary in number)."""
    if "loss_count" in batch:
        return int(batch["loss_count"])
    labels = batch.get("labels")
    return int((labels != -100).sum()) if labels is not None else int(batch["input_ids"].numel())


def _micro_batches(model, data_iter, n: int, device, amp, loss_fn, values) -> tuple[float, dict, int]:
    """Forward/backward `n` micro-batches; -> (token-weighted loss, weighted metrics (expert_load summed), tokens).

    Each micro-batch's mean loss is weighted by its share of the step's loss tokens over all ranks, so the step's
    gradient and loss equal those of the whole batch at once, however padding and -100 labels fall (a mean of
    micro-batch means would weight a sparse row more). Losses and metrics stay on the device until all
    micro-batches are queued: one host sync per step.
    """
    batches = [next(data_iter) for _ in range(n)]
    counts = [loss_tokens(b) for b in batches]
    total = dist.sum_over_ranks(float(sum(counts)))
    weights = [c * dist.world() / total if total > 0 else 1 / n for c in counts]  # DDP averages over ranks
    sums, tokens = {}, 0
    for i, (batch, w) in enumerate(zip(batches, weights)):
        batch = _to_device(batch, device)
        sync = contextlib.nullcontext() if i == n - 1 or not hasattr(model, "no_sync") else model.no_sync()
        amp_ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
        with sync:  # DDP: skip the gradient all-reduce on all but the last micro-batch
            with amp_ctx:
                loss, metrics = loss_fn(model, batch, values)
            (loss * w).backward()
        tokens += int(batch["input_ids"].numel()) if "input_ids" in batch else counts[i]  # e.g. images' labels
        for k, v in ({"loss": loss} | metrics).items():
            v = v.detach() if torch.is_tensor(v) else torch.tensor(float(v))
            v = v if k == "expert_load" else v.double() * w
            sums[k] = sums[k] + v if k in sums else v
    out = {k: v if k == "expert_load" else float(v) for k, v in sums.items()}
    return out.pop("loss"), out, tokens


def _train_step(model, optimizer, data_iter, cfg: TrainConfig, state: LoopState, device, amp, loss_fn) -> dict:
    """One optimizer step (or a guarded skip); returns the row to log."""
    values = schedules.values_at(state.step, cfg.schedule, stage_steps=cfg.steps, rewarmup=state.rewarm)
    values["aux_loss_weight"] = cfg.schedule.aux_loss_weight
    accum = schedules.accum_steps(
        state.tokens // dist.world(),
        cfg.schedule,
        tokens_per_micro=cfg.micro_batch_size * cfg.seq_len,
        full_accum=cfg.grad_accum,
    )
    lr = _set_lr(optimizer, values["lr_mult"])
    loss, metrics, tokens = _micro_batches(model, data_iter, accum, device, amp, loss_fn, values)
    load = metrics.pop("expert_load", None)
    metrics = dist.means_over_ranks({"loss": loss} | metrics)  # every rank decides the guard on the same loss
    loss = metrics.pop("loss")
    dist.reduce_expert_grads(model)
    grad_norm = dist.clip_grad_norm_(model, cfg.optim.grad_clip)
    row = {"loss": loss, "lr": lr, "grad_norm": grad_norm, "accum": accum, "mtp_weight": values["mtp_weight"]}
    row |= metrics
    state.tokens += tokens * dist.world()
    state.step += 1
    if _is_bad(loss, grad_norm, state, cfg.guard.spike_factor):
        optimizer.zero_grad(set_to_none=True)
        state.skipped, state.bad_in_row = state.skipped + 1, state.bad_in_row + 1
        return row | {"skipped": 1}
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state.bad_in_row = 0
    state.loss_ema = loss if state.loss_ema is None else 0.95 * state.loss_ema + 0.05 * loss
    if load is not None:
        load = balance.global_load(load)
        if not has_lora(dist.unwrap(model)):  # LoRA: the base, balancing biases included, stays as it was
            balance.update_biases(dist.unwrap(model), load, values["balance_rate"])
        row |= balance.load_metrics(load)
    return row


@torch.no_grad()
def validate(model, batches: list[dict], device, amp, loss_fn, values: dict) -> float:
    """Mean LM loss over fixed validation batches, averaged over ranks."""
    if not batches:
        return float("nan")
    model.eval()
    total = 0.0
    for batch in batches:
        amp_ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
        with amp_ctx:
            loss, metrics = loss_fn(model, _to_device(batch, device), values)
        total += float(metrics.get("lm_loss", loss))
    model.train()
    return dist.mean_over_ranks(total / len(batches))


# ---------------------------------------------------------------------------------------------------- resume


def _resume(stage_dir: Path, cfg: TrainConfig, model, optimizer, data) -> LoopState:
    """Load `latest` (or an explicit folder) if asked; refuse a config that would silently change the run."""
    if cfg.ckpt.resume == "never":
        return _start(cfg, model, optimizer)
    folder = checkpoint.latest(stage_dir) if cfg.ckpt.resume == "auto" else checkpoint.check_resumable(cfg.ckpt.resume)
    if folder is None:
        return _start(cfg, model, optimizer)
    if not (cfg.trust_external_state or checkpoint.inside(folder, cfg.out_dir)):
        raise ConfigError(f"ckpt.resume={str(folder)!r} is outside out_dir={cfg.out_dir!r}: its trainer state "
                          "includes pickles, read only from a run's own folders (or set trust_external_state=true)")
    old = json.loads((folder / "trainer_state" / "train_config.json").read_text())
    conflicts = resume_conflicts(old, to_dict(cfg))
    if "grad_accum" in conflicts and _saved_world(folder) * old["grad_accum"] == dist.world() * cfg.grad_accum:
        conflicts.remove("grad_accum")  # the same global batch on another number of ranks (elastic resume)
    if conflicts:
        raise ConfigError(
            f"cannot resume from {folder}: the config differs in {', '.join(conflicts)} "
            f"(start a new run, or set ckpt.resume=never)"
        )
    saved = checkpoint.load(folder, model=model, optimizer=optimizer, data=data)
    if dist.rank() == 0:
        print(f"resuming from {folder} (step {saved['loop']['step']})", flush=True)
    for (_, buf), value in zip(balance.bias_buffers(dist.unwrap(model)), saved.get("balance_biases", [])):
        buf.copy_(value)
    return LoopState(**saved["loop"])


def _saved_world(folder: Path) -> int:
    """The number of ranks that wrote `folder` (state.pt says; older checkpoints: one RNG file per rank)."""
    saved = checkpoint.load_pt(folder / "trainer_state" / "state.pt")
    return int(saved.get("world") or len(list((folder / "trainer_state").glob("rank_*.pt"))))


def _start(cfg: TrainConfig, model, optimizer) -> LoopState:
    """A new stage: carry init_from's optimizer state when its parameters match (cfg.optim_state=carry), else
    start fresh and re-warm the lr up over schedule.rewarmup_steps. Says which in the stage log."""
    if not cfg.init_from:
        return LoopState()
    folder = checkpoint.resolve(cfg.init_from, cfg.out_dir)
    if cfg.optim_state == "fresh":
        why = "optim_state=fresh"
    elif not (cfg.trust_external_state or checkpoint.inside(folder, cfg.out_dir)):
        # its DCP metadata is a pickle: a downloaded folder could run code when read (checkpoint.py)
        why = f"init_from is outside out_dir={cfg.out_dir}: its trainer state is read only with trust_external_state=true"
    else:
        why = _carry_optimizer(folder, model, optimizer)
    if dist.rank() == 0:
        ramp = f", lr re-warm-up over {cfg.schedule.rewarmup_steps} steps" if cfg.schedule.rewarmup_steps else ""
        said = f"carried from {folder}" if why is None else f"fresh ({why}){ramp}"
        print(f"optimizer state: {said}", flush=True)
    return LoopState(rewarm=why is not None)


def _carry_optimizer(folder: Path, model, optimizer) -> str | None:
    """Load `folder`'s optimizer state if it was written for the same parameters in the same groups; None if
    carried, else why not. This stage's hyper-parameters (lr, decay, ...) stay: only the state moves."""
    state_file = folder / "trainer_state" / "state.pt"
    saved_names = checkpoint.load_pt(state_file).get("optim_params") if state_file.exists() else None
    if saved_names is None:
        return "the checkpoint has no optimizer state"
    if saved_names != checkpoint.optimizer_param_names(model, optimizer):
        return "the trained parameters or their optimizer groups differ from the checkpoint's"
    settings = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    problem = checkpoint.load_optimizer(folder, model, optimizer)
    for group, kept in zip(optimizer.param_groups, settings):
        group.update(kept)
    return problem


def _save(stage_dir, cfg, model, optimizer, data, state: LoopState) -> Path:
    biases = [b.detach().cpu().clone() for _, b in balance.bias_buffers(dist.unwrap(model))]
    return checkpoint.save(
        stage_dir,
        state.step,
        model=model,
        optimizer=optimizer,
        data=data,
        config=to_dict(cfg),
        state={
            "loop": dataclasses.asdict(state),
            "balance_biases": biases,
            "optim_params": checkpoint.optimizer_param_names(model, optimizer),
        },
        keep_last=cfg.ckpt.keep_last,
    )


# ---------------------------------------------------------------------------------------------------- the loop


def train(
    *,
    model,
    optimizer,
    data,
    cfg: TrainConfig,
    stage_dir: str | Path,
    loss_fn: LossFn = pretrain_loss,
    val_batches: list[dict] | None = None,
    stop_at: int | None = None,
) -> dict:
    """Run to `cfg.steps` optimizer steps (resuming if a checkpoint exists); returns a summary dict.

    `stop_at` ends this process early at that step with a checkpoint (a time/step budget: the schedules still
    span cfg.steps, so a later resume continues the same run).
    """
    stage_dir = Path(stage_dir)
    device, rank0 = device_of(cfg), dist.rank() == 0
    amp = autocast_dtype(cfg, device)
    if rank0:
        for leftover in checkpoint.clean_partial(stage_dir):
            print(f"removed {leftover}, the partial checkpoint of an interrupted save", flush=True)
    state = _resume(stage_dir, cfg, model, optimizer, data)
    metrics = Metrics(stage_dir, enabled=rank0, tensorboard=cfg.log.tensorboard, wandb=cfg.log.wandb,
                      name=f"{cfg.run}/{cfg.stage}", config=to_dict(cfg))
    metrics.truncate_after(state.step)
    if rank0:
        stage_dir.mkdir(parents=True, exist_ok=True)
        write_json(cfg, stage_dir / "config.json")
    flops = _flops_per_token(model, cfg, device)
    bar = _progress(cfg, state, rank0)
    data_iter, t_start, start_step = iter(data), time.perf_counter(), state.step
    end = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
    result = {"stopped": "done" if end == cfg.steps else "stop_at", "val_loss": None, "loss": None}
    while state.step < end:
        t0 = time.perf_counter()
        tokens_before = state.tokens
        row = _train_step(model, optimizer, data_iter, cfg, state, device, amp, loss_fn)
        dt = time.perf_counter() - t0
        row["tok_per_s"] = (state.tokens - tokens_before) / dt
        if flops and cfg.log.peak_flops:
            row["mfu"] = row["tok_per_s"] * flops / (cfg.log.peak_flops * dist.world())
        if cfg.log.val_every and (state.step % cfg.log.val_every == 0 or state.step == cfg.steps):
            row["val_loss"] = result["val_loss"] = validate(
                model, val_batches or [], device, amp, loss_fn, _val_values(cfg, state.step)
            )
        result["loss"] = row["loss"]
        _report(metrics, bar, cfg, state, row, (time.perf_counter() - t_start) / (state.step - start_step))
        if state.bad_in_row >= cfg.guard.max_bad_steps:
            _emit(f"stopping: {state.bad_in_row} bad steps in a row (NaN/inf or loss spike)", bar)
            result["stopped"] = "bad_steps"
            break
        if cfg.ckpt.every and state.step % cfg.ckpt.every == 0 and state.step < end:
            _save(stage_dir, cfg, model, optimizer, data, state)
    if bar is not None:
        bar.close()
    result["checkpoint"] = str(_save(stage_dir, cfg, model, optimizer, data, state))
    metrics.close()
    if rank0 and cfg.log.plots:
        plot(stage_dir)
    return result | {"step": state.step, "tokens": state.tokens, "skipped": state.skipped}


def _val_values(cfg: TrainConfig, step: int) -> dict:
    values = schedules.values_at(max(0, step - 1), cfg.schedule, stage_steps=cfg.steps)  # lr is not used
    return values | {"aux_loss_weight": cfg.schedule.aux_loss_weight}


def _flops_per_token(model, cfg: TrainConfig, device) -> float:
    """Training FLOPs per token from the model's own accounting (MFU is reported on GPU only)."""
    inner = dist.unwrap(model)
    if device.type != "cuda" or not hasattr(inner, "flops_per_token"):
        return 0.0
    return float(inner.flops_per_token(cfg.seq_len))


def _progress(cfg: TrainConfig, state: LoopState, rank0: bool):
    if not (rank0 and cfg.log.progress):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=state.step, unit="step", dynamic_ncols=True, leave=False)


def _report(metrics: Metrics, bar, cfg: TrainConfig, state: LoopState, row: dict, sec_per_step: float) -> None:
    if bar is not None:
        bar.update(1)
        extra = {"mfu": f"{row['mfu']:.1%}"} if "mfu" in row else {}
        bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tok_per_s']:,.0f}", **extra, refresh=False)
    # a validation step always gets its row, or a val_every that is not a multiple of log.every would lose it
    if state.step % cfg.log.every == 0 or state.step == cfg.steps or "val_loss" in row:
        metrics.log(state.step, row | {"tokens": state.tokens, "skipped_total": state.skipped})
        if dist.rank() == 0:
            _emit(format_line(state.step, cfg.steps, row, eta_s=sec_per_step * (cfg.steps - state.step)), bar)
