"""Who is optimised by what: every parameter goes to exactly one of Muon or AdamW, decided in one place.

GLM-4.5 (arXiv 2508.06471 §2.4) uses Muon "for all parameters except word embedding, bias, and weights for
RMSNorm". Two matrices are left open by that sentence and are options here (OptimConfig.lm_head / .router):

- lm_head: default **AdamW**. The paper's text would put it on Muon, but Keller Jordan, Moonlight and nanochat all
  keep the output head on Adam: its rows are per-token classifiers, not a hidden linear map whose singular
  directions should be equalised, and Muon on the head is reported unstable at small scale. Set `muon` to follow
  the literal text.
- router (`mlp.gate.weight`, (E, D)): default **Muon**, as the paper's wording says; it is a hidden matrix.
  Its balancing bias `e_score_correction_bias` is a buffer moved by glmstack.train.balance, never by an optimiser.

3-D expert banks (E, out, in) go to Muon and are orthogonalised per expert. Which blocks NS sees follows one rule
(docs/training.md, Muon blocks): one block per matrix the papers name. Modules declare how their fused parameters
cut back into those (`muon_blocks()`: routed experts' gate_up, MLA's kv_a / q_b / kv_b, the last two per head as
GLM-5's Muon Split); OptimConfig.muon_split overrides per param-name suffix (0 = whole matrix, H = H heads).

    opt, groups = build_optimizer(model, OptimConfig())   # groups: name -> "muon" | "adamw"
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from glmstack.optim.muon import Muon


def _embedding_names(model: nn.Module) -> set[str]:
    return {
        f"{m_name}.{p_name}".lstrip(".")
        for m_name, m in model.named_modules()
        if isinstance(m, nn.Embedding)
        for p_name, _ in m.named_parameters(recurse=False)
    }


def classify(name: str, p: torch.Tensor, *, lm_head: str, router: str, embeddings: set[str]) -> str:
    """'muon' or 'adamw' for one parameter; the whole policy of this module is these lines."""
    if p.ndim < 2:  # biases, RMSNorm gains, other vectors (GLM-4.5 §2.4)
        return "adamw"
    if name in embeddings or "embed_tokens" in name:  # word embedding (also an MTP layer's, if it has one)
        return "adamw"
    # score: a reward model's head; value_head: a PPO critic's (posttrain/rl/ppo.py), also an output head
    if name.endswith(("lm_head.weight", "shared_head.head.weight", "score.weight", "value_head.weight")):
        return lm_head
    if name.endswith(".gate.weight"):  # MoE router (E, D); dense MLPs use gate_proj, so no clash
        return router
    if p.ndim > 3:  # a ViT's conv kernels: the patch embedding is an input layer (Muon's authors keep those on AdamW)
        return "adamw"
    if p.ndim in (2, 3):  # hidden matrices and (E, out, in) expert banks
        return "muon"
    raise ValueError(f"no optimiser rule for {name} of shape {tuple(p.shape)}")


def assign_groups(model: nn.Module, *, lm_head: str = "adamw", router: str = "muon") -> dict[str, str]:
    """name -> 'muon' | 'adamw' for every trainable parameter; asserts each lands in exactly one group.

    Works on the meta device (only names and shapes are read), so it can be checked for the full-size presets.
    """
    embeddings = _embedding_names(model)
    out: dict[str, str] = {}
    seen: dict[int, str] = {}
    for name, p in model.named_parameters():  # tied parameters appear once (named_parameters dedupes)
        if not p.requires_grad:
            continue
        assert id(p) not in seen, f"{name} is the same tensor as {seen[id(p)]}"
        seen[id(p)] = name
        out[name] = classify(name, p, lm_head=lm_head, router=router, embeddings=embeddings)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == set(seen), "a trainable parameter is in no optimiser group"
    assert set(out.values()) <= {"muon", "adamw"}, f"unknown group in {set(out.values())}"
    return out


def default_muon_blocks(model: nn.Module) -> dict[str, tuple]:
    """The Muon blocks modules declare (`muon_blocks()`: param-name suffix -> (heads, rows per head's pieces)):
    routed experts cut gate_up into gate and up, MLA its fused projections into the paper's matrices, per head."""
    out: dict[str, tuple] = {}
    for m in model.modules():
        if hasattr(m, "muon_blocks"):
            out.update(m.muon_blocks())
    return out


def blocks_for(name: str, p: torch.Tensor, declared: dict[str, tuple], muon_split: dict[str, int]) -> tuple | None:
    """The `blocks` spec of one Muon parameter: the declared one, unless OptimConfig.muon_split names it
    (0 = the whole matrix, the pre-GLM-5 baseline; H = H equal row blocks unless the declaration has H heads)."""
    def match(table):
        hits = [v for suffix, v in table.items() if name.endswith(suffix)]
        assert len(hits) <= 1, f"{name} matches several Muon block entries"
        return hits[0] if hits else None

    spec, heads = match(declared), match(muon_split)
    if heads is None:
        return spec
    if heads == 0:
        return None
    if spec and spec[0] == heads:
        return spec
    return (heads, (p.shape[-2] // heads,))


class Optimizers:
    """Muon + AdamW stepped together; one state_dict and one list of param_groups for the schedules."""

    def __init__(self, **optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {k: opt.state_dict() for k, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        assert set(state) == set(self.optimizers), f"optimizer state has {set(state)}, expected {set(self.optimizers)}"
        for k, opt in self.optimizers.items():
            opt.load_state_dict(state[k])


def _fastest_adamw(groups: list[dict]) -> dict:
    """torch's fused AdamW (one kernel over all tensors, CPU and CUDA) where it takes these parameters; foreach
    for sharded ones (DTensors), whose fused support varies by torch version; the per-tensor loop for a mix of
    sharded and plain ones (FSDP2 shards beside expert-parallel LoRA adapters), which foreach refuses."""
    params = [p for g in groups for p in g["params"]]
    sharded = [hasattr(p, "full_tensor") for p in params]
    if any(sharded):
        return {"foreach": all(sharded)}
    return {"fused": True}


def build_optimizer(model: nn.Module, cfg) -> tuple[Optimizers, dict[str, str]]:
    """Muon and AdamW over `model` per `cfg` (an OptimConfig); every group remembers its peak lr as initial_lr."""
    groups = assign_groups(model, lm_head=cfg.lm_head, router=cfg.router)
    if not cfg.muon:  # the all-AdamW baseline
        groups = {name: "adamw" for name in groups}
    params = dict(model.named_parameters())
    declared = default_muon_blocks(model)
    muon_groups: dict[tuple | None, list] = defaultdict(list)
    adam_decay, adam_no_decay = [], []
    for name, kind in groups.items():
        p = params[name]
        if kind == "muon":
            muon_groups[blocks_for(name, p, declared, cfg.muon_split)].append(p)
        elif p.ndim >= 2:
            adam_decay.append(p)
        else:
            adam_no_decay.append(p)
    opts = {}
    if muon_groups:
        opts["muon"] = Muon(
            [{"params": ps, "blocks": spec} for spec, ps in muon_groups.items()],
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            momentum=cfg.momentum,
            nesterov=cfg.nesterov,
            ns_steps=cfg.ns_steps,
            adjust_lr_fn=cfg.adjust_lr,
            ns_dtype=ns_dtype(cfg.ns_dtype, next(iter(muon_groups.values()))[0].device),
        )
    adam_groups = [
        {"params": adam_decay, "weight_decay": cfg.weight_decay},
        {"params": adam_no_decay, "weight_decay": cfg.adamw_weight_decay_1d},
    ]
    adam_groups = [g for g in adam_groups if g["params"]]
    if adam_groups:
        lr = cfg.adamw_lr if cfg.adamw_lr is not None else cfg.lr
        opts["adamw"] = torch.optim.AdamW(
            adam_groups, lr=lr, betas=tuple(cfg.adamw_betas), eps=cfg.adamw_eps, **_fastest_adamw(adam_groups)
        )
    opt = Optimizers(**opts)
    for g in opt.param_groups:
        g["initial_lr"] = g["lr"]
    return opt, groups


def ns_dtype(name: str, device: torch.device) -> torch.dtype:
    """Newton–Schulz precision: `auto` is bf16 (torch's and Keller Jordan's choice) where matrix products run in bf16
    natively — CUDA, CPUs with AVX512-BF16 or AMX — and float32 elsewhere: on an AVX2 CPU bf16 products are
    emulated, 10-30x slower than float32 (measured, docs/training.md), and Muon then dominates the step."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if device.type == "cpu" and _cpu_has_bf16() else torch.float32


def _cpu_has_bf16() -> bool:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False  # not Linux: float32 is the safe side (never slow, more exact)
    return "avx512_bf16" in flags or "amx_bf16" in flags
