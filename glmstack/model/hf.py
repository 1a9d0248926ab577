"""Hugging Face checkpoints in and out: `config.json` + safetensors in the layout zai-org releases (`glm4_moe`; the
MLA models `glm4_moe_lite` and `glm_moe_dsa` use the same map, their attention names being transformers' too).

The map is flat (zai-org's released names): `model.` + our name for the trunk, per-expert tensors
`mlp.experts.{e}.{gate,up,down}_proj.weight` <-> slices of our 3-D banks, and MTP layer d stored as decoder layer
`model.layers.{num_hidden_layers + d}` (`enorm`, `hnorm`, `eh_proj`, `shared_head.norm` + a full MoE block). The MTP
layer's `embed_tokens` / `shared_head.head` copies may be absent (GLM-4.6, GLM-5): they are tied to the main
embedding / LM head, the ONLY implicit tie. transformers' packed banks (`mlp.experts.gate_up_proj`) load too.
Router weights and balancing biases stay fp32. One exception to strictness: transformers' `save_pretrained` drops
the MTP layer but keeps `num_nextn_predict_layers: 1`; `load_hf(..., missing_mtp="drop")` (generate, chat) loads such
a folder without MTP and `checkpoint_tensors(..., missing_mtp="init")` (a stage's init_from) initialises the MTP
layer afresh, each with a one-line warning.

Loading is strict (missing, unexpected or mis-shaped tensors, or a truncated file -> one CheckpointError naming them
and the file, checked from the headers before any allocation) and streams: the model is built on meta, materialised once, and each tensor is
read with `safe_open` and copied into place, so peak memory is about the model's size. Saving writes a temp
folder, shards above `max_shard_bytes` (with `model.safetensors.index.json`), then renames it into place.

    model = load_hf("ckpt/", dtype=torch.bfloat16, device="cuda")
    save_hf(model, "out/", dtype=torch.bfloat16, max_shard_bytes=5 * 2**30)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from glmstack.errors import CheckpointError
from glmstack.model.config import ModelConfig
from glmstack.model.model import GLM
from glmstack.model.quantized import QuantError, fp8_skeleton_

INDEX_NAME = "model.safetensors.index.json"
# dtype names as config.json (`dtype` / `torch_dtype`) and the CLIs' --dtype spell them
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_EXPERT_PROJ = ("gate_proj", "up_proj", "down_proj")


# ---------------------------------------------------------------- the name map
def hf_entries(model: GLM) -> dict[str, tuple[str, tuple]]:
    """HF tensor name -> (our state_dict name, index into our tensor: () whole, (e,) or (e, slice))."""
    cfg, out = model.cfg, {}
    for name in model.state_dict():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name.startswith("value_head."):  # a PPO critic's head (posttrain/rl/ppo.py): resumed from trainer_state
            continue
        hf = _hf_prefix(name, cfg.num_hidden_layers)
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            out.update(_expert_entries(name, hf, cfg))
        else:
            out[hf] = (name, ())
    return out


def _hf_prefix(name: str, n_layers: int) -> str:
    """Our name -> HF name (expert banks get their per-expert suffix later)."""
    if name == "lm_head.weight":
        return name
    if not name.startswith("mtp."):
        return "model." + name
    _, d, rest = name.split(".", 2)
    rest = rest.replace("block.", "", 1).replace("final_norm.", "shared_head.norm.", 1)
    return f"model.layers.{n_layers + int(d)}.{rest}"


def _expert_entries(name: str, hf: str, cfg: ModelConfig) -> dict:
    base, f = hf.rsplit(".", 1)[0], cfg.moe_intermediate_size  # "....mlp.experts"
    out = {}
    for e in range(cfg.n_routed_experts):
        if name.endswith("gate_up_proj"):
            out[f"{base}.{e}.gate_proj.weight"] = (name, (e, slice(0, f)))
            out[f"{base}.{e}.up_proj.weight"] = (name, (e, slice(f, 2 * f)))
        else:
            out[f"{base}.{e}.down_proj.weight"] = (name, (e,))
    return out


def _optional_entries(model: GLM) -> dict[str, str]:
    """HF names that may appear but carry no new tensor: MTP copies of embedding/head, a tied lm_head."""
    n, out = model.cfg.num_hidden_layers, {}
    for d in range(model.cfg.num_nextn_predict_layers):
        out[f"model.layers.{n + d}.embed_tokens.weight"] = "embed_tokens.weight"
        out[f"model.layers.{n + d}.shared_head.head.weight"] = "lm_head.weight"
    if model.cfg.tie_word_embeddings:
        out["lm_head.weight"] = "embed_tokens.weight"
    return out


def _packed_entries(model: GLM) -> dict[str, str]:
    """transformers' in-memory expert banks (`...mlp.experts.gate_up_proj`), accepted in place of per-expert names."""
    n = model.cfg.num_hidden_layers
    return {_hf_prefix(k, n): k for k in model.state_dict() if k.endswith(("experts.gate_up_proj", "experts.down_proj"))}


# ---------------------------------------------------------------- load
def checkpoint_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the index when sharded."""
    if (folder / INDEX_NAME).exists():
        try:
            weight_map = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{folder / INDEX_NAME}: not a safetensors index ({e!r})") from None
        missing = sorted({v for v in weight_map.values() if not (folder / v).is_file()})
        if missing:
            raise CheckpointError(f"{folder / INDEX_NAME} names shard(s) that do not exist: {', '.join(missing)}")
        return {k: folder / v for k, v in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors files")
    out = {}
    for path in files:
        with open_safetensors(path) as f:
            out.update({k: path for k in f.keys()})
    return out


@contextlib.contextmanager
def open_safetensors(path: Path):
    """safe_open, with a truncated or corrupt file reported by name (safetensors' own error names no file)."""
    try:
        handle = safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({e}); re-download or re-save it") from None
    with handle as f:
        yield f


def mtp_missing(folder: str | os.PathLike, cfg: ModelConfig) -> bool:
    """True when config.json promises MTP layers but no MTP tensor is stored (what transformers writes)."""
    if not cfg.num_nextn_predict_layers:
        return False
    prefix = f"model.layers.{cfg.num_hidden_layers}."
    return not any(k.startswith(prefix) for k in checkpoint_files(Path(folder)))


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def load_hf(folder: str | os.PathLike, dtype: torch.dtype | None = None, device="cpu", *, missing_mtp: str = "error",
            **overrides) -> GLM:
    """Read an HF checkpoint into GLM; dtype None = the dtype in config.json (else fp32). overrides: cfg fields.
    missing_mtp="drop": a checkpoint without its MTP layer loads without MTP (warned), for decoding."""
    folder = Path(folder)
    cfg = ModelConfig.from_hf(folder, **overrides)
    if missing_mtp == "drop" and mtp_missing(folder, cfg):
        _warn(f"{folder} has no MTP layer although config.json says num_nextn_predict_layers="
              f"{cfg.num_nextn_predict_layers} (e.g. written by transformers): loaded without MTP, so no MTP "
              f"speculative decoding")
        cfg = ModelConfig.from_hf(folder, **{**overrides, "num_nextn_predict_layers": 0, "num_mtp_depths": 0})
    if dtype is None:
        dtype = DTYPES.get(cfg.hf_metadata.get("dtype") or cfg.hf_metadata.get("torch_dtype"), torch.float32)
    model = GLM(cfg, dtype=dtype)
    if cfg.hf_metadata.get("quantization_config"):  # a released-style FP8 folder: keep the weights as stored
        names, n_layers = set(checkpoint_files(folder)), cfg.num_hidden_layers
        try:
            fp8_skeleton_(model, lambda ours: _hf_prefix(ours, n_layers) in names)
        except QuantError as e:
            raise CheckpointError(f"{folder / 'config.json'}: {e}") from None
    tensors = checkpoint_tensors(model, folder)  # checked here, before anything is allocated
    model.materialize(device)
    state = model.state_dict()
    for name, full in tensors:
        state[name].copy_(full)
    return model


def checkpoint_tensors(model: GLM, folder: str | os.PathLike, *, missing_mtp: str = "error", seed: int = 0,
                       keep=None):
    """The checkpoint in `folder` as a stream of (our state-dict name, full tensor in the model's dtype), for the
    (meta) `model` its config describes. Checked now (one CheckpointError naming every problem); the stream then
    reads one of our tensors at a time (a bank gathers its experts' slices), so a sharded model can keep its part
    of each (train/dist.py: materialize) and no process holds the whole checkpoint.
    missing_mtp="init": a checkpoint without its MTP layer gets a freshly initialised one (`seed`), warned.
    keep(hf_name) -> bool: read only those tensors (a reward model takes a causal LM's trunk, posttrain/rm)."""
    files = {k: p for k, p in checkpoint_files(Path(folder)).items() if keep is None or keep(k)}
    fresh = None
    if missing_mtp == "init" and len(model.mtp) and mtp_missing(folder, model.cfg):
        _warn(f"{folder} has no MTP layer (e.g. written by transformers): training starts from a freshly "
              f"initialised MTP layer")
        fresh = model.initial_tensors(seed=seed, only="mtp.")
    plan = _check(model, files, allow_missing_mtp=fresh is not None)
    state = model.state_dict()
    by_ours: dict[str, list] = {}
    for key, (ours, idx) in plan.items():
        by_ours.setdefault(ours, []).append((key, idx))
    targets = [(ours, state[ours].shape, state[ours].dtype, by_ours[ours]) for ours in sorted(by_ours)]
    return _read(targets, files) if fresh is None else itertools.chain(_read(targets, files), fresh)


@torch.no_grad()
def _read(targets, files: dict[str, Path]):
    with contextlib.ExitStack() as stack:
        handles: dict[Path, object] = {}
        for ours, shape, dtype, pieces in targets:
            full = torch.empty(shape, dtype=dtype)
            for key, idx in pieces:
                path = files[key]
                if path not in handles:
                    handles[path] = stack.enter_context(open_safetensors(path))
                try:
                    full[idx].copy_(handles[path].get_tensor(key))
                except SafetensorError as e:
                    raise CheckpointError(f"{path}: cannot read {key} ({e}); the file is corrupt") from None
            yield ours, full


def _check(model: GLM, files: dict[str, Path], allow_missing_mtp: bool = False) -> dict[str, tuple[str, tuple]]:
    """Match checkpoint names/shapes to the model from the headers only; raise one error listing every problem."""
    entries = hf_entries(model)
    plan, missing, unexpected, bad_shape = match_names(entries, _optional_entries(model), _packed_entries(model),
                                                       model.state_dict(), _shapes(files))
    hint = ""
    mtp_prefixes = tuple(f"model.layers.{model.cfg.num_hidden_layers + d}." for d in range(len(model.mtp)))
    if missing and mtp_prefixes and all(k.startswith(mtp_prefixes) for k in missing):
        if allow_missing_mtp:
            missing = []
        hint = " (no MTP layer in the checkpoint, e.g. written by transformers: load with num_nextn_predict_layers=0)"
    _raise_if(missing, unexpected, bad_shape, hint)
    return plan


def match_names(entries: dict, optional: dict, packed: dict, state: dict, shapes: dict):
    """Checkpoint tensor names/shapes against a model's name map -> (plan: HF name -> (ours, index), missing,
    unexpected, mis-shaped). entries: HF name -> (ours, index); optional: HF names that may appear but add no
    tensor (-> the ours they copy); packed: alternative HF names of whole tensors."""
    plan, bad_shape, unexpected = {}, [], []
    for key, shape in shapes.items():
        if key in entries:
            ours, idx = entries[key]
            want = tuple(state[ours][idx].shape)
        elif key in packed:
            ours, idx = packed[key], ()
            want = tuple(state[ours].shape)
        elif key in optional:
            ours, idx, want = None, (), tuple(state[optional[key]].shape)
        else:
            unexpected.append(key)
            continue
        if shape != want:
            bad_shape.append(f"{key} {list(shape)} (expected {list(want)})")
        elif ours is not None:
            plan[key] = (ours, idx)
    filled = {ours for ours, idx in plan.values() if idx == ()}
    present = set(shapes)  # a mis-shaped tensor is reported as such, not also as missing
    missing = [k for k, (ours, _) in entries.items() if k not in present and ours not in filled]
    return plan, missing, unexpected, bad_shape


def _shapes(files: dict[str, Path]) -> dict[str, tuple]:
    by_file: dict[Path, list[str]] = {}
    for k, p in files.items():
        by_file.setdefault(p, []).append(k)
    shapes = {}
    for path, keys in by_file.items():
        with open_safetensors(path) as f:
            shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in keys})
    return shapes


def _raise_if(missing: list[str], unexpected: list[str], bad_shape: list[str], hint: str = "") -> None:
    def show(items):
        items = sorted(items)
        return ", ".join(items[:20]) + (f" ... (+{len(items) - 20} more)" if len(items) > 20 else "")

    parts = [f"{label} ({len(items)}): {show(items)}" for label, items in
             (("missing", missing), ("unexpected", unexpected), ("mis-shaped", bad_shape)) if items]
    if parts:
        raise CheckpointError("checkpoint does not match the config: " + "; ".join(parts) + hint)


# ---------------------------------------------------------------- save
@torch.no_grad()
def save_hf(model: GLM, folder: str | os.PathLike, dtype: torch.dtype | None = None,
            max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write config.json + safetensors (sharded above max_shard_bytes) atomically; returns the folder."""
    folder = Path(folder)
    if getattr(model, "quant_scheme", None) == "int4":
        raise CheckpointError("save_hf: int4 weights have no checkpoint format here (fp8 has: the released one)")
    dtype = dtype or model.embed_tokens.weight.dtype
    return write_checkpoint(folder, model.state_dict(), hf_entries(model), model.cfg.to_hf(), dtype, max_shard_bytes)


def write_checkpoint(folder: Path, state: dict, entries: dict, hf_cfg: dict, dtype: torch.dtype,
                     max_shard_bytes: int) -> Path:
    """config.json + the `entries` (HF name -> (our state name, index)) of `state` as safetensors, sharded above
    max_shard_bytes, written to a temp folder renamed into place."""
    shards = _plan_shards(entries, state, dtype, max_shard_bytes)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    names = _shard_names(len(shards))
    for name, keys in zip(names, shards):
        tensors = {k: _hf_tensor(state, *entries[k], dtype) for k in keys}
        save_file(tensors, str(tmp / name), metadata={"format": "pt"})
    if len(shards) > 1:
        total = sum(_nbytes(state, *entries[k], dtype) for k in entries)
        index = {"metadata": {"total_size": total}, "weight_map": {k: n for n, ks in zip(names, shards) for k in ks}}
        (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    hf_cfg.pop("torch_dtype", None)
    hf_cfg["dtype"] = str(dtype).removeprefix("torch.")
    (tmp / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    _replace_dir(tmp, folder)
    return folder


def _hf_tensor(state, ours: str, idx: tuple, dtype) -> torch.Tensor:
    t = state[ours][idx]
    if _keep_as_is(t, ours):
        return t.to("cpu").contiguous()
    keep_fp32 = _keep_fp32(ours)
    return t.to("cpu", torch.float32 if keep_fp32 else dtype).contiguous()


def _keep_as_is(t: torch.Tensor, ours: str) -> bool:
    """FP8 weights and their block scales (model/quantized.py) are written in their own dtypes."""
    return t.dtype == torch.float8_e4m3fn or ours.endswith("weight_scale_inv")


def _keep_fp32(ours: str) -> bool:
    """Router weights, balancing biases and the DSA indexer's head weights are stored fp32 (as HF does)."""
    router = ours.endswith(("gate.weight", "e_score_correction_bias")) and ".gate." in ours  # also mlp.visual.gate
    return router or ours.endswith("indexer.weights_proj.weight")


def _nbytes(state, ours: str, idx: tuple, dtype) -> int:
    t = state[ours][idx]
    if _keep_as_is(t, ours):
        return t.numel() * t.element_size()
    keep_fp32 = _keep_fp32(ours)
    return t.numel() * (4 if keep_fp32 else torch.empty((), dtype=dtype).element_size())


def _plan_shards(entries, state, dtype, max_bytes: int) -> list[list[str]]:
    shards, size = [[]], 0
    for k in entries:
        n = _nbytes(state, *entries[k], dtype)
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(k)
        size += n
    return shards


def _shard_names(n: int) -> list[str]:
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def _replace_dir(tmp: Path, folder: Path) -> None:
    """Rename tmp into place; an existing folder is moved aside first and removed after."""
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
