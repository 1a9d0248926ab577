"""LoRA adapters in and out in PEFT's format: `adapter_config.json` + `adapter_model.safetensors`.

What: `save_adapter(model, folder, base)` writes what `peft.PeftModel.from_pretrained` loads onto transformers'
Glm4MoeForCausalLM / Glm4MoeLiteForCausalLM / GlmMoeDsaForCausalLM; `load_adapter(model, folder)` puts an adapter
written by PEFT (or by us) on a glmstack GLM. tests/parity/test_lora_peft.py checks both directions' logits.

PEFT's layout (peft 0.21, tuners/lora/layer.py; docs ../shared/research/wave3-facts.md §2), names after HF's
(`base_model.model.` + the checkpoint name of the module, model/hf.py):
  * a Linear: `<module>.lora_A.weight` (r, I), `<module>.lora_B.weight` (O, r), as ours;
  * a routed expert bank (E, O, I), targeted through `target_parameters`: `lora_A.weight` (E·r, I) read as
    (E, r, I), expert slowest; `lora_B.weight` (O, r·E) read as (O, r, E), expert FASTEST (the classic bug is to read
    it expert-slowest). With both banks adapted PEFT nests its wrappers in parameter order: gate_up_proj's pair is
    `experts.base_layer.lora_*`, down_proj's `experts.lora_*`;
  * dense and shared-expert MLP weights also go through `target_parameters` (`...mlp.gate_proj.weight`): with
    transformers 5, PEFT re-routes any `target_modules` entry named gate_proj / up_proj / down_proj to the routed
    experts' fused banks (its v4 -> v5 MoE conversion for glm4_moe, glm4_moe_lite and glm_moe_dsa), so an MLP named
    there would be silently dropped. As a 2-D parameter target the keys are the Linear's.
  * quantized experts (QLoRA: one Linear per expert) are written as the bank layout too: gate and up fuse into one
    gate_up pair of rank 2r (A stacked, B block-diagonal), carried by `rank_pattern` / `alpha_pattern`.
Names are exact module paths, so PEFT adapts exactly the layers we did. Scaling s = lora_alpha / r (rsLoRA:
/ sqrt(r)); `rank_pattern` / `alpha_pattern` carry per-module exceptions. PEFT refuses dropout on parameter targets,
so a config with any is written with lora_dropout 0 (dropout is a training-time choice; the weights are the same).

    save_adapter(model, "out/adapter", base="zai-org/GLM-4.5-Air")
    model = load_hf(base); load_adapter(model, "out/adapter")
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from glmstack.errors import CheckpointError
from glmstack.model import lora
from glmstack.model.hf import _hf_prefix

CONFIG_NAME, WEIGHTS_NAME = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
MLP_LEAVES = ("gate_proj", "up_proj", "down_proj")  # PEFT re-routes these target_modules names (docstring)
EXPERT_LINEAR = re.compile(r"(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)")  # a quantized expert's Linear


# ---------------------------------------------------------------- names
def hf_module_names(model) -> dict[str, str]:
    """Our module name -> HF module path, for every module an adapter may sit on (Linear-like and expert banks); a
    vision-language GLMV's as transformers' Glm4v(Moe)ForConditionalGeneration names them (model/vision/hf.py)."""
    if hasattr(model, "visual") and hasattr(model, "language_model"):
        return _vl_module_names(model)
    n = model.cfg.num_hidden_layers
    out = {}
    for name, m in model.named_modules():
        if hasattr(m, "in_features") or any(isinstance(getattr(m, b, None), torch.nn.Parameter) for b in lora.BANKS):
            out[name] = name if name == "lm_head" else _hf_prefix(f"{name}.x", n).rsplit(".", 1)[0]
    return out


def _vl_module_names(model) -> dict[str, str]:
    """visual.X -> model.visual.X; language_model.X -> model.language_model.<X's text-model path> (lm_head stays)."""
    lm, adaptable = model.language_model, lambda m: hasattr(m, "in_features") or any(
        isinstance(getattr(m, b, None), torch.nn.Parameter) for b in lora.BANKS)  # fmt: skip
    if hasattr(lm, "mtp"):  # a GLM (glm4v_moe's text model): its own map
        text = hf_module_names(lm)
    else:  # the dense GLM-4 decoder (glm4v): model.<name>
        text = {n: n if n == "lm_head" else f"model.{n}" for n, m in lm.named_modules() if adaptable(m)}
    out = {f"language_model.{n}": hf if hf == "lm_head" else "model.language_model." + hf.removeprefix("model.")
           for n, hf in text.items()}  # fmt: skip
    out |= {n: f"model.{n}" for n, m in model.visual.named_modules(prefix="visual") if adaptable(m)}
    return out


def _bank_keys(hf_path: str, banks: list[str]) -> dict[str, str]:
    """bank -> PEFT module path of its pair: nested in parameter order when both banks are adapted."""
    if len(banks) == 2:
        return {"gate_up_proj": f"{hf_path}.base_layer", "down_proj": hf_path}
    return {banks[0]: hf_path}


# ---------------------------------------------------------------- save
def adapter_tensors(model, state: dict | None = None):
    """-> (PEFT key -> tensor, HF target path -> (r, scaling), target_modules, target_parameters). `state`: a full
    (gathered) state dict to read the adapters from instead of the model's own (FSDP2, expert parallel)."""
    state = model.state_dict() if state is None else state
    names = hf_module_names(model)
    tensors, ranks, modules, params = {}, {}, [], []
    per_expert: dict[str, dict] = {}  # quantized experts' Linears (QLoRA), written as PEFT's banks below
    for name, m in lora.adapted_modules(model):
        hf, at = names.get(name), lambda suffix, name=name: state[f"{name}.{suffix}"].detach()
        expert = EXPERT_LINEAR.fullmatch(name)
        if expert:
            owner, e, proj = expert.groups()
            per_expert.setdefault(owner, {})[int(e), proj] = (at("lora_A"), at("lora_B"), m.lora_scaling)
            continue
        if isinstance(m, lora.LoraLinear):
            A_rI, B_Or = at("lora_A"), at("lora_B")
            tensors[f"{PREFIX}{hf}.lora_A.weight"], tensors[f"{PREFIX}{hf}.lora_B.weight"] = A_rI, B_Or
            ranks[hf] = (A_rI.shape[0], m.lora_scaling)
            if hf.rsplit(".", 1)[-1] in MLP_LEAVES:
                params.append(f"{hf}.weight")  # a 2-D parameter target (module docstring)
            else:
                modules.append(hf)
            continue
        banks = {b: (at(f"lora_A.{b}"), at(f"lora_B.{b}"), m.lora_scaling[b]) for b in lora.BANKS if b in m.lora_A}
        _write_banks(hf, banks, tensors, ranks, params)
    for owner, pairs in per_expert.items():
        _write_banks(_hf_prefix(f"{owner}.x", model.cfg.num_hidden_layers).rsplit(".", 1)[0],
                     stack_expert_pairs(pairs), tensors, ranks, params)  # fmt: skip
    return tensors, ranks, modules, params


def stack_expert_pairs(pairs: dict) -> dict[str, tuple]:
    """Per-expert Linear adapters {(e, proj): (A (r, I), B (O, r), s)} -> bank -> (A (E, r', I), B (E, O, r'), s).
    gate and up fuse into gate_up as one pair of rank 2r: A = [A_gate; A_up], B = diag(B_gate, B_up), so
    B A = [B_gate A_gate; B_up A_up] (what PEFT's own v4 -> v5 conversion does, rank and alpha doubled)."""
    E = 1 + max(e for e, _ in pairs)
    out = {}
    if all((e, p) in pairs for e in range(E) for p in ("gate_proj", "up_proj")):
        A, B = [], []
        for e in range(E):
            (Ag, Bg, s), (Au, Bu, _) = pairs[e, "gate_proj"], pairs[e, "up_proj"]
            A.append(torch.cat([Ag, Au]))
            B.append(torch.block_diag(Bg, Bu))
        out["gate_up_proj"] = (torch.stack(A), torch.stack(B), s)
    if all((e, "down_proj") in pairs for e in range(E)):
        out["down_proj"] = (torch.stack([pairs[e, "down_proj"][0] for e in range(E)]),
                            torch.stack([pairs[e, "down_proj"][1] for e in range(E)]), pairs[0, "down_proj"][2])  # fmt: skip
    if not out or len(out) * (2 if "gate_up_proj" in out else 1) < len({p for _, p in pairs}):
        raise CheckpointError(
            "save_adapter: quantized experts adapted on only some experts or on gate_proj without "
            "up_proj; PEFT's expert layout needs every expert and gate with up"
        )
    return out


def _write_banks(hf: str, banks: dict, tensors: dict, ranks: dict, params: list) -> None:
    for bank, path in _bank_keys(hf, list(banks)).items():
        A_ErI, B_EOr, s = banks[bank]
        E, r, _ = A_ErI.shape
        tensors[f"{PREFIX}{path}.lora_A.weight"] = A_ErI.reshape(E * r, -1)  # (E·r, I), expert slowest
        tensors[f"{PREFIX}{path}.lora_B.weight"] = B_EOr.permute(1, 2, 0).reshape(B_EOr.shape[1], r * E)  # (O, r·E)
        ranks[f"{hf}.{bank}"] = (r, s)
        params.append(f"{hf}.{bank}")


def save_adapter(model, folder: str | os.PathLike, base: str = "", state: dict | None = None) -> Path:
    """Write `model`'s adapters as a PEFT folder (tensors as they are held, contiguous); -> the folder. `state`: as
    in adapter_tensors."""
    return write_adapter(folder, *adapter_files(model, base, state))


def write_adapter(folder: str | os.PathLike, tensors: dict, config: dict) -> Path:
    """A PEFT folder from adapter_files' (tensors, config)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(folder / WEIGHTS_NAME))
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return folder


def adapter_files(model, base: str = "", state: dict | None = None) -> tuple[dict, dict]:
    """(PEFT key -> tensor, adapter_config.json's dict) of `model`'s adapters: a PEFT folder's contents."""
    cfg = getattr(model, "lora_config", None) or lora.LoraConfig()
    tensors, ranks, modules, params = adapter_tensors(model, state)
    if not tensors:
        raise CheckpointError("save_adapter: the model has no LoRA adapters (apply_lora or load_adapter first)")
    r, alpha, rank_pattern, alpha_pattern = _patterns(ranks, cfg.use_rslora)
    config = {
        "peft_type": "LORA", "base_model_name_or_path": base or getattr(model, "lora_base", "") or None,
        "r": r, "lora_alpha": alpha, "use_rslora": cfg.use_rslora,
        "lora_dropout": 0.0 if params else cfg.dropout, "bias": "none", "fan_in_fan_out": False,
        "target_modules": sorted(modules) or None, "target_parameters": sorted(params) or None,
        "rank_pattern": rank_pattern, "alpha_pattern": alpha_pattern, "init_lora_weights": True,
        "inference_mode": True, "task_type": "CAUSAL_LM", "use_dora": False, "modules_to_save": None,
        "glmstack_dropout": cfg.dropout,
    }  # fmt: skip
    return tensors, config


def _patterns(ranks: dict[str, tuple[int, float]], rslora: bool):
    """The most common (r, alpha) as the default, the others as exact-path patterns."""
    alpha_of = lambda r, s: round(s * (math.sqrt(r) if rslora else r), 6)
    pairs = {p: (r, alpha_of(r, s)) for p, (r, s) in ranks.items()}
    values = list(pairs.values())
    r, alpha = max(set(values), key=values.count)
    rank_pattern = {re.escape(p): v[0] for p, v in pairs.items() if v[0] != r}
    alpha_pattern = {re.escape(p): v[1] for p, v in pairs.items() if v[1] != alpha}
    return r, alpha, rank_pattern, alpha_pattern


# ---------------------------------------------------------------- load
def read_adapter(folder: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    folder = Path(folder)
    cfg_path, w_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    missing = [p.name for p in (cfg_path, w_path) if not p.is_file()]
    if missing:
        raise CheckpointError(f"{folder}: not a PEFT adapter folder (missing {', '.join(missing)})")
    try:
        config = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({e})") from None
    lacking = [k for k in ("r", "lora_alpha") if not isinstance(config, dict) or k not in config]
    if lacking:
        raise CheckpointError(f"{cfg_path}: no {' or '.join(lacking)} (a LoRA adapter config names both)")
    bad = [f"{k}={config.get(k)!r}" for k, ok in (("peft_type", "LORA"), ("use_dora", False), ("fan_in_fan_out", False))
           if config.get(k, ok) != ok]  # fmt: skip
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        bad.append("bias terms")
    if bad:
        raise CheckpointError(f"{folder}: only plain LoRA adapters load here (found {', '.join(bad)})")
    with safe_open(str(w_path), "pt") as f:
        tensors = {k.removeprefix(PREFIX): f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    return config, tensors


def load_adapter(model, folder: str | os.PathLike, trainable: bool = False) -> list[str]:
    """Put the adapter in `folder` on `model` (base frozen); -> our names of the adapter parameters. A key that names
    no module of this model or has the wrong shape -> one CheckpointError listing all of them."""
    config, tensors = read_adapter(folder)
    plan = plan_adapter(model, config, tensors, folder)
    model.requires_grad_(False)
    for ours, kind, A, B, s in plan:
        _install(model, ours, kind, A, B, s, float(config.get("glmstack_dropout", config.get("lora_dropout") or 0.0)))
    model.lora_config = lora.LoraConfig(enabled=True, r=int(config["r"]), alpha=float(config["lora_alpha"]),
                                        use_rslora=bool(config.get("use_rslora")), targets=["*"])  # fmt: skip
    model.lora_base = config.get("base_model_name_or_path") or ""
    names = lora.lora_names(model)
    for n in names:
        model.get_parameter(n).requires_grad_(trainable)
    return names


def plan_adapter(model, config: dict, tensors: dict, folder) -> list[tuple]:
    """[(our module name, 'linear' | bank, A, B, scaling)] for an adapter read by read_adapter; a key that names no
    module of this model or has the wrong shape -> one CheckpointError listing all of them."""
    plan, errors = _plan(model, config, tensors)
    if errors:
        raise CheckpointError(
            f"{folder}: this adapter does not fit the model (an adapter for another base?):\n  "
            + "\n  ".join(errors[:20])
            + (f"\n  ... {len(errors) - 20} more" if len(errors) > 20 else "")
        )
    return plan


def _plan(model, config: dict, tensors: dict):
    """-> ([(our module name, 'linear' | bank, A, B, scaling)], errors)."""
    by_hf = {hf: ours for ours, hf in hf_module_names(model).items()}
    pairs: dict[str, dict] = {}
    errors = []
    for key, t in tensors.items():
        m = re.fullmatch(r"(.+)\.lora_([AB])\.weight", key)
        if not m:
            errors.append(f"{key}: not a LoRA A/B weight")
            continue
        pairs.setdefault(m.group(1), {})[m.group(2)] = t
    plan = []
    for path, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            errors.append(f"{path}: lora_A and lora_B must both be present")
            continue
        owner = path.removesuffix(".base_layer")
        ours = by_hf.get(owner)
        if ours is None:
            errors.append(f"{PREFIX}{path}: no such module in this {model.cfg.model_type} model")
            continue
        module = model.get_submodule(ours)
        bank = _bank_of(config, owner, path, pairs) if not hasattr(module, "in_features") else None
        entry = _entry(model, ours, module, bank, owner, ab["A"], ab["B"], config, errors)
        if entry:
            plan.append(entry)
    return plan, errors


def _bank_of(config: dict, owner: str, path: str, pairs: dict) -> str:
    """Which bank a pair adapts: by nesting when both are adapted, else the one target_parameters names."""
    if path.endswith(".base_layer") or f"{owner}.base_layer" in pairs:
        return "gate_up_proj" if path.endswith(".base_layer") else "down_proj"
    named = [b for b in lora.BANKS for p in config.get("target_parameters") or [] if f"{owner}.{b}".endswith(p)]
    return named[0] if named else "gate_up_proj"


def _entry(model, ours, module, bank, hf_path, A, B, config, errors):
    if bank is None:  # a Linear
        r = A.shape[0]
        want = ((r, module.in_features), (module.out_features, r))
        target = hf_path
    else:
        E, O, I = getattr(module, bank).shape
        r = A.shape[0] // E
        want = ((E * r, I), (O, r * E))
        target = f"{hf_path}.{bank}"
        if A.shape[0] % E == 0 and tuple(A.shape) == want[0] and tuple(B.shape) == want[1]:
            A = A.reshape(E, r, I)
            B = B.reshape(O, r, E).permute(2, 0, 1)  # (E, O, r)
    if bank is None and (tuple(A.shape), tuple(B.shape)) != want or bank and A.dim() != 3:
        errors.append(
            f"{PREFIX}{target}: lora_A {tuple(A.shape)}, lora_B {tuple(B.shape)}; this model needs "
            f"{want[0]} and {want[1]} for some rank r"
        )
        return None
    alpha = _pattern_value(config.get("alpha_pattern") or {}, target, config["lora_alpha"])
    scaling = float(alpha) / (math.sqrt(r) if config.get("use_rslora") else r)
    return ours, bank or "linear", A, B, scaling


def _pattern_value(patterns: dict, path: str, default):
    for key, value in patterns.items():  # PEFT's rule (utils/other.py get_pattern_key): a suffix match
        if re.match(rf"(.*\.)?({key})$", path):
            return value
    return default


@torch.no_grad()
def _install(model, ours: str, kind: str, A, B, scaling: float, dropout: float) -> None:
    module = model.get_submodule(ours)
    if kind == "linear":
        lora.add_linear_adapter(module, A.shape[0], scaling, dropout)
        module.lora_A.copy_(A)
        module.lora_B.copy_(B)
        lora._plain_mla_if_kv_b(model, ours)
    else:
        lora.add_bank_adapter(module, kind, A.shape[1], scaling)
        module.lora_A[kind].copy_(A)
        module.lora_B[kind].copy_(B)
