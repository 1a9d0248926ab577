"""Checkpoints in run folders: an HF model folder + trainer_state/, written atomically, resumed exactly.

    runs/<run>/<stage>/step_0000200/
        config.json, model.safetensors     the model as save_hf writes it (transformers can load it)
        trainer_state/state.pt             step, counters, balancing biases, guard state, world size
        trainer_state/dcp/                 model + optimizer state, one file per rank (resharding.py: DCP, loads
                                           into any layout and world size)
        trainer_state/rank_00000.pt        every RNG of that rank and the data position (in global samples)
        trainer_state/train_config.json    the resolved TrainConfig (resume compares it field by field)
    runs/<run>/<stage>/latest              "step_0000200": the newest COMPLETE checkpoint

A checkpoint is written to `.tmp_step_...` and renamed into place only when every file is there; `latest` is
then replaced with os.replace. A process killed at any point leaves `latest` naming a complete checkpoint.

What must be trusted (issue 34): the .pt files hold only tensors and plain Python values (RNG states as lists and
tensors) and are read with `torch.load(weights_only=True)`, which builds no other objects. DCP's `.metadata` (and
any non-tensor value it stores) is a pickle that torch reads with pickle itself: reading it runs whatever a forged
file says. So DCP state is read only from a run's own folders (`inside(folder, out_dir)`); carrying optimizer state
from anywhere else takes `trust_external_state=true` (train/loop.py). The model folder itself is safetensors + JSON.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from glmstack.atomic import write_atomic
from glmstack.config import ConfigError, write_json
from glmstack.errors import CheckpointError
from glmstack.train import dist, resharding

LATEST = "latest"


def step_name(step: int) -> str:
    return f"step_{step:07d}"


def latest(stage_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    path = Path(stage_dir) / LATEST
    if not path.exists():
        return None
    folder = Path(stage_dir) / path.read_text().strip()
    if not folder.is_dir():
        raise CheckpointError(f"{path} names {folder.name!r}, which does not exist: restore that folder, or delete "
                              f"{path} to start the stage afresh")
    return folder


def resolve(ref: str, out_dir: str) -> Path:
    """A previous stage's checkpoint (`init_from`): an HF folder, a stage folder (its `latest`), or 'run/stage'."""
    for cand in (Path(ref), Path(out_dir) / ref):
        if (cand / "config.json").exists() and any(cand.glob("*.safetensors")):
            return cand
        if (cand / LATEST).exists():
            return _not_an_adapter(ref, latest(cand))
        if (cand / "adapter_config.json").exists():
            _not_an_adapter(ref, cand)
    raise ConfigError(f"init_from={ref!r}: no HF checkpoint folder, stage folder or run/stage under {out_dir}")


def _not_an_adapter(ref: str, folder: Path) -> Path:
    """A LoRA stage's checkpoint holds only the adapter: a later stage starts from the merged model."""
    if (folder / "adapter_config.json").exists() and not (folder / "config.json").exists():
        raise ConfigError(f"init_from={ref!r}: {folder} is a LoRA adapter, not a model; fold it into its base first "
                          f"(glmstack merge BASE {folder} --out DIR) and start from DIR")
    return folder


def check_resumable(folder: str | Path) -> Path:
    """`folder` if it is a checkpoint a run can resume from (trainer_state/ beside the model), else CheckpointError."""
    folder = Path(folder)
    if not (folder / "trainer_state" / "train_config.json").is_file():
        raise CheckpointError(f"ckpt.resume={str(folder)!r}: no {folder / 'trainer_state' / 'train_config.json'}; "
                              f"resume takes a step folder a stage wrote (runs/<run>/<stage>/step_N), or auto / never")
    return folder


def clean_partial(stage_dir: str | Path) -> list[Path]:
    """Delete what a kill during a save left behind (`.tmp_step_N`, save_hf's `..tmp_step_N.tmp-<pid>`, a re-save's
    `.old_step_N`): at real size a partial copy of the weights each. Rank 0 calls it when a stage starts."""
    stage_dir = Path(stage_dir)
    leftovers = [p for pattern in (".tmp_step_*", "..tmp_step_*", ".old_step_*") for p in stage_dir.glob(pattern)]
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


def rng_state() -> dict:
    """Every RNG's state in types `torch.load(weights_only=True)` reads: numpy's key array becomes a list."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (kind, keys.tolist(), pos, has_gauss, gauss),
             "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model(model: torch.nn.Module, folder: Path) -> None:
    """HF-format folder via save_hf for a GLM; a plain model.safetensors for other modules (tests)."""
    state = dist.full_state_dict(model)  # collective under FSDP/EP: every rank calls it
    if dist.rank() != 0:
        return
    inner = dist.unwrap(model)
    try:
        from glmstack.model import GLM, save_hf
        from glmstack.model.lora import has_lora
        from glmstack.model.lora_peft import save_adapter
    except ImportError:
        GLM = None
    if GLM is not None and (isinstance(inner, GLM) or _is_vl(inner)) and has_lora(inner):  # the adapter + its base
        save_adapter(inner, folder, base=getattr(inner, "lora_base", ""), state=state)
    elif GLM is not None and isinstance(inner, GLM):
        save_hf(dist.plain_copy(inner, state), folder)
    elif _is_vl(inner):  # a vision-language model (single device): its glm4v_moe / glm4v folder
        from glmstack.model.vision import save_vl_hf

        save_vl_hf(inner, folder)
    else:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))


def load_model(model: torch.nn.Module, folder: Path) -> None:
    """Load weights (and balancing buffers) from a checkpoint folder into `model`, whatever its wrapping. A GLM's
    tensors stream in one at a time and each rank keeps its part (no rank holds the whole checkpoint)."""
    inner = dist.unwrap(model)
    try:
        from glmstack.model import GLM
        from glmstack.model.hf import checkpoint_tensors
    except ImportError:
        GLM = None
    if GLM is not None and isinstance(inner, GLM):
        dist.load_full_tensors(model, checkpoint_tensors(GLM(inner.cfg), folder))  # shapes from a meta twin
    elif _is_vl(inner):
        from glmstack.model.vision import GLMV
        from glmstack.model.vision.hf import checkpoint_state

        dist.load_full_tensors(model, checkpoint_state(GLMV(inner.cfg), folder))
    else:
        from safetensors.torch import load_file

        dist.load_full_state_dict(model, load_file(str(folder / "model.safetensors")))


def _is_vl(model: torch.nn.Module) -> bool:
    try:
        from glmstack.model.vision import GLMV
    except ImportError:
        return False
    return isinstance(model, GLMV)


def save(
    stage_dir: str | Path, step: int, *, model, optimizer, state: dict, data, config: dict, keep_last: int
) -> Path:
    """Write step_<step>/ atomically, point `latest` at it, delete all but the newest `keep_last`."""
    stage_dir = Path(stage_dir)
    final, tmp = stage_dir / step_name(step), stage_dir / f".tmp_{step_name(step)}"
    if dist.rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a previous crash's leftovers
    save_model(model, tmp)  # save_hf writes the whole folder (it replaces it), so it goes first
    ts = tmp / "trainer_state"
    if dist.rank() == 0:
        (ts / resharding.FOLDER).mkdir(parents=True)
    dist.barrier()
    rank_state = {"rng": rng_state(), "data": data.state_dict() if hasattr(data, "state_dict") else None}
    torch.save(plain(rank_state), ts / f"rank_{dist.rank():05d}.pt")
    resharding.save(tmp, model, optimizer)  # collective: each rank writes its chunks
    if dist.rank() == 0:
        torch.save(plain(state | {"world": dist.world()}), ts / "state.pt")
        write_json(config, ts / "train_config.json")
    dist.barrier()
    if dist.rank() == 0:
        _commit(stage_dir, tmp, final)
        _prune(stage_dir, keep_last)
    dist.barrier()
    return final


def _commit(stage_dir: Path, tmp: Path, final: Path) -> None:
    # tests/integration/test_resume_kill.py SIGKILLs the process inside this window (GLMSTACK_CKPT_PAUSE=step:seconds)
    pause_step, _, pause_s = os.environ.get("GLMSTACK_CKPT_PAUSE", "").partition(":")
    if pause_step and final.name == step_name(int(pause_step)):
        time.sleep(float(pause_s))
    if final.exists():  # re-saving a step (after a resume): move the old copy aside first
        old = final.with_name(f".old_{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        shutil.rmtree(old)
    _fsync_tree(tmp)
    tmp.rename(final)
    write_atomic(stage_dir / LATEST, final.name + "\n")


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _prune(stage_dir: Path, keep_last: int) -> None:
    steps = sorted(p for p in stage_dir.glob("step_*") if p.is_dir())
    for old in steps[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def load(folder: str | Path, *, model, optimizer, data) -> dict:
    """Restore model, optimizer, RNGs and data position from `folder`; returns the trainer state dict."""
    folder = Path(folder)
    ts = folder / "trainer_state"
    if resharding.exists(folder):  # the weights too: the resume format is exact whatever the HF export's dtype
        resharding.load(folder, model, optimizer)
    else:
        load_model(model, folder)
        problem = load_optimizer(folder, model, optimizer)
        if problem:
            raise ValueError(f"{folder}: {problem}")
    rank_file = ts / f"rank_{dist.rank():05d}.pt"
    rank_state = load_pt(rank_file if rank_file.exists() else ts / "rank_00000.pt")
    set_rng_state(rank_state["rng"])
    if rank_state["data"] is not None and hasattr(data, "load_state_dict"):
        try:
            data.load_state_dict(rank_state["data"])
        except ValueError as e:  # a position this number of ranks cannot continue evenly
            raise CheckpointError(f"{folder}: {e}") from None
    return load_pt(ts / "state.pt")


def plain(obj):
    """`obj` with numpy values as Python / torch ones, so that `torch.load(weights_only=True)` reads it back."""
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.copy())
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def load_pt(path: Path):
    """A trainer-state .pt file: tensors and plain values only (weights_only=True runs no pickled code)."""
    import pickle

    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: holds Python objects beyond tensors and plain values, which are not loaded "
                              f"(a file written by another program, or by glmstack before issue 34): {e}") from None


def inside(folder: str | Path, root: str | Path) -> bool:
    """`folder` lies in `root` (links followed): a run's own folder, whose pickled DCP state may be read."""
    return Path(folder).resolve().is_relative_to(Path(root).resolve())


def load_optimizer(folder: Path, model, optimizer) -> str | None:
    """Load `folder`'s optimizer state into `optimizer`; None on success, else why it cannot be loaded."""
    ts = folder / "trainer_state"
    if resharding.exists(folder):
        resharding.load(folder, model=model, optimizer=optimizer, weights=False)
        return None
    saved_world = len(list(ts.glob("rank_*.pt")))  # checkpoints written before DCP: the same layout only
    saved_sharded = (ts / "optimizer_00000.pt").exists()
    if not saved_sharded and not (ts / "optimizer.pt").exists():
        return "it has no optimizer state (not a glmstack training checkpoint)"
    if dist.optimizer_is_sharded(model) != saved_sharded or (saved_sharded and saved_world != dist.world()):
        return (
            f"it was written by {saved_world} rank(s) with {'sharded' if saved_sharded else 'replicated'} optimizer "
            f"state; load it with the same dist.dp / dist.expert_parallel layout and number of ranks"
        )
    opt_path = ts / (f"optimizer_{dist.rank():05d}.pt" if saved_sharded else "optimizer.pt")
    optimizer.load_state_dict(load_pt(opt_path))
    return None


def optimizer_param_names(model, optimizer) -> list[list[str]]:
    """Parameter names of every optimizer group, in state-dict order: what must match to carry optimizer state."""
    names = {id(p): n for n, p in dist.unwrap(model).named_parameters()}
    return [[names.get(id(p), "?") for p in g["params"]] for g in optimizer.param_groups]
