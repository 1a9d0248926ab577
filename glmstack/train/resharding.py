"""The resume format of every layout: model and optimizer state through torch.distributed.checkpoint (DCP).

Why: a run trained on W ranks must resume on W' ranks, or move between FSDP2, DDP, one process and another
expert-parallel degree (issue 27; torchtitan and Megatron resume across world sizes through DCP). DCP stores each
tensor by its name and global shape together with which rank held which chunk, and a load reads, for every
tensor of the *new* layout, the chunks it overlaps. So the state only has to be named by layout-free keys and
described by its global shape:
  - model: the unwrapped model's state dict (FSDP2 parameters are DTensors already; DDP's `module.` prefix is
    gone); an expert-parallel bank, a plain tensor holding experts [e0, e0 + E/W), becomes a DTensor sharded over
    its expert dimension (`_global`), so it is saved as the whole bank and re-cut for any EP degree;
  - optimizer: `optim/<muon|adamw>/<parameter name>/<state key>` (Muon's momentum, AdamW's moments and step),
    each tensor in its parameter's layout, EP banks made global in the same way.
Each rank writes its own chunks in parallel (`trainer_state/dcp/__<rank>_0.distcp`, rank 0 the `.metadata`);
replicated tensors are written once. Loading copies in place into the model's and optimizer's tensors; an
optimizer that has not stepped yet gets its state allocated first by one step at lr 0 with zero gradients.

    save(folder, model, optimizer)                 # collective: every rank calls it
    load(folder, model, optimizer)                 # any layout, any world size (weights=False: optimizer only)
The HF folder beside it stays the interchange format (transformers, serving, init_from).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch

from glmstack.train import dist

FOLDER = "dcp"


def exists(folder: Path) -> bool:
    return (Path(folder) / "trainer_state" / FOLDER / ".metadata").is_file()


def save(folder: Path, model, optimizer) -> None:
    """Write model + optimizer state under folder/trainer_state/dcp (collective; every rank writes its chunks)."""
    import torch.distributed.checkpoint as dcp

    state = model_state(model) | optimizer_state(model, optimizer)
    writer = dcp.FileSystemWriter(
        str(Path(folder) / "trainer_state" / FOLDER), single_file_per_rank=True, sync_files=True, thread_count=1
    )
    with _single_process_quiet():
        dcp.save(state, storage_writer=writer)


def load(folder: Path, model, optimizer=None, *, weights: bool = True) -> None:
    """Read the model's weights (unless weights=False) and the optimizer's state (if given) from
    folder/trainer_state/dcp into them, in this rank's layout."""
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(Path(folder) / "trainer_state" / FOLDER))
    state = {}
    if weights:
        state |= model_state(model)
    if optimizer is not None:
        allocate_optimizer_state(model, optimizer)
        _drop_unsaved(model, optimizer, set(reader.read_metadata().state_dict_metadata))
        state |= optimizer_state(model, optimizer)
    with _single_process_quiet():
        dcp.load(state, storage_reader=reader)
    _copy_back(model, optimizer, state)


# ---------------------------------------------------------------- layout-free state dicts


def model_state(model) -> dict:
    """name -> tensor sharing storage with the model (a DCP load writes straight into the parameters)."""
    inner = dist.unwrap(model)
    ep = _ep_meshes(inner)
    return {name: _global(t, ep[name]) if name in ep else t for name, t in inner.state_dict().items()}


def optimizer_state(model, optimizer) -> dict:
    """optim/<kind>/<param name>/<key> -> state tensor (or Python value) for every parameter with state."""
    inner = dist.unwrap(model)
    names, meshes = {id(p): n for n, p in inner.named_parameters()}, _ep_meshes(inner)
    out = {}
    for kind, opt in _parts(optimizer):
        for group in opt.param_groups:
            for p in group["params"]:
                name = names[id(p)]
                for key, value in opt.state.get(p, {}).items():
                    ep = name in meshes and torch.is_tensor(value) and value.shape == p.shape
                    out[f"optim/{kind}/{name}/{key}"] = _global(value, meshes[name]) if ep else value
    return out


def allocate_optimizer_state(model, optimizer) -> None:
    """Give every parameter its optimizer state (values are overwritten by the load): one step at lr 0 with zero
    gradients, collective like any step. Parameters do not move: each update and decay term is scaled by lr."""
    params = [p for _, opt in _parts(optimizer) for g in opt.param_groups for p in g["params"]]
    if all(p in opt.state for _, opt in _parts(optimizer) for g in opt.param_groups for p in g["params"]):
        return
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr


def _drop_unsaved(model, optimizer, saved: set[str]) -> None:
    """Forget the allocated state of parameters that had none when saved (never had a gradient): they must start
    from no state, as they would have in the saved run."""
    names = {id(p): n for n, p in dist.unwrap(model).named_parameters()}
    for kind, opt in _parts(optimizer):
        for p in [p for g in opt.param_groups for p in g["params"]]:
            if p in opt.state and not any(f"optim/{kind}/{names[id(p)]}/{k}" in saved for k in opt.state[p]):
                del opt.state[p]


def _copy_back(model, optimizer, state: dict) -> None:
    """DCP loads tensors in place but returns non-tensor values (a Python step count) in `state`: put them back."""
    if optimizer is None:
        return
    names = {id(p): n for n, p in dist.unwrap(model).named_parameters()}
    for kind, opt in _parts(optimizer):
        for p in [p for g in opt.param_groups for p in g["params"]]:
            for key, value in opt.state.get(p, {}).items():
                if not torch.is_tensor(value):
                    opt.state[p][key] = state[f"optim/{kind}/{names[id(p)]}/{key}"]


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns that it assumes one process when there is no process group: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _parts(optimizer) -> list[tuple[str, torch.optim.Optimizer]]:
    return list(getattr(optimizer, "optimizers", {"opt": optimizer}).items())


def _ep_meshes(inner) -> dict:
    """Expert-parallel bank name -> its (replica, ep) device mesh."""
    from glmstack.train.expert_parallel import _ep_modules, bank_params

    return {f"{name}.{p}": m.mesh for name, m in _ep_modules(inner) for p in bank_params(m)}


def _global(local: torch.Tensor, mesh):
    """This rank's expert slice (E/W, ...) as a view of the whole bank (E, ...): sharded over the expert group,
    repeated over the replica group (saved once), no copy."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    shape = (local.shape[0] * mesh["ep"].size(), *local.shape[1:])
    return DTensor.from_local(
        local.detach(),
        mesh,
        [Replicate(), Shard(0)],
        run_check=False,
        shape=torch.Size(shape),
        stride=torch.empty(shape, device="meta").stride(),
    )
