"""LoRA (Hu et al. 2021, arXiv 2106.09685) on every GLM weight, applied from outside the model by module name.

What: `apply_lora(model, LoraConfig(...))` freezes the model and gives each targeted weight W (out, in) a trainable
low-rank pair, W_eff = W + s · B A with A (r, in), B (out, r), s = alpha / r (rsLoRA: alpha / sqrt(r), Kalajdzievski
2023). Targets are glob patterns over glmstack's module names, or aliases (TARGET_ALIASES): GQA q/k/v/o, MLA's
q_a/q_b/kv_a/kv_b/o, dense and shared-expert MLPs, the routed expert banks, the DSA indexer, the MTP projection.

Why per-expert adapters on the grouped banks: the banks gate_up_proj (E, 2F, D) and down_proj (E, D, F) are
parameters of one module, not E nn.Linear layers, which is where other stacks silently leave experts frozen or share
one adapter across a layer's experts (docs/lora.md). Here every expert e has its own pair A_e (r, in), B_e (out, r),
held batched as A (E, r, in), B (E, out, r). Reference path: the deltas of all experts are one bmm, added to the banks
that the unchanged expert kernels (moe.py) run on, so the grouped GEMM, the loop and expert parallel keep working. Fast
paths (where the base runs experts_sorted or experts_grouped_mm): the low-rank terms run inside them, so neither the
dense delta nor the frozen bank's weight gradient is formed (`LoraExperts.lora_fast`; tests check them equal).

How: a targeted module's class is swapped for a subclass that adds the low-rank term (the same trick FSDP2's
fully_shard uses), so the base weights keep their state-dict names (`layers.0.self_attn.q_proj.weight`) and HF
checkpoints still load; the adapters appear beside them as `...q_proj.lora_A` / `...q_proj.lora_B` and, for a bank,
`...mlp.experts.lora_A.gate_up_proj`. Any Linear-like base works (nn.Linear, FP8Linear, Int4Linear: QLoRA).
Layouts on disk are PEFT's (model/lora_peft.py).

    model = GLM(cfg).init_weights()
    apply_lora(model, LoraConfig(r=8, alpha=16), seed=0)   # base frozen; only lora_* parameters train
    state = merged_state_dict(model)                        # W + s·BA folded in, adapters dropped (RL, merge)

Shape legend: E experts, O out features, I in features, r rank.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.errors import ConfigError
from glmstack.model import moe

# alias -> glob patterns over module names (experts: the bank parameter's name)
TARGET_ALIASES: dict[str, list[str]] = {
    "attention": [f"*self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj",
                                               "kv_a_proj_with_mqa", "kv_b_proj")],
    "mlp": [f"*mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
    + [f"*mlp.shared_experts.{n}" for n in ("gate_proj", "up_proj", "down_proj")],
    # the banks, or one Linear per expert where the experts are quantized (QLoRA: inference/quant.py QuantExperts)
    "experts": ["*mlp.experts.gate_up_proj", "*mlp.experts.down_proj"]
    + [f"*mlp.experts.*.{n}" for n in ("gate_proj", "up_proj", "down_proj")],
    "indexer": [f"*self_attn.indexer.{n}" for n in ("wq_b", "wk", "weights_proj")],
    "mtp": ["mtp.*.eh_proj"],
}  # fmt: skip
BANKS = ("gate_up_proj", "down_proj")


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA on a training stage (`--set lora.enabled=true lora.r=16`); disabled by default."""

    enabled: bool = False  # off: full fine-tuning
    r: int = 8  # rank of every adapter
    alpha: float = 16.0  # scale numerator: s = alpha / r (alpha / sqrt(r) with use_rslora)
    dropout: float = 0.0  # dropout on the adapter's input (Linear targets; the expert banks take none, as PEFT)
    use_rslora: bool = False  # rank-stabilised scaling alpha / sqrt(r) (Kalajdzievski 2023)
    # aliases (TARGET_ALIASES) or glob patterns over module names, e.g. "layers.1*.self_attn.q_proj"
    targets: list[str] = field(default_factory=lambda: ["attention", "mlp", "experts", "mtp"])
    # QLoRA: hold the frozen base quantized ("int4" / "fp8", glmstack.inference.quant); "" keeps its dtype
    base_quant: str = ""

    @property
    def scaling(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def problems(cfg: LoraConfig) -> list[str]:
    """What is wrong with a LoraConfig (empty when nothing)."""
    out = []
    if cfg.r < 1:
        out.append(f"lora.r={cfg.r}: must be >= 1")
    if not 0.0 <= cfg.dropout < 1.0:
        out.append(f"lora.dropout={cfg.dropout}: must be in [0, 1)")
    if cfg.base_quant not in ("", "int4", "fp8"):
        out.append(f"lora.base_quant={cfg.base_quant!r}: choose '', 'int4' or 'fp8'")
    if not cfg.targets:
        out.append("lora.targets is empty: name aliases (" + ", ".join(TARGET_ALIASES) + ") or glob patterns")
    return out


# ---------------------------------------------------------------- the adapted modules
class LoraLinear(nn.Module):
    """Mixin put in front of a Linear-like class: y = base(x) + s · B A dropout(x)."""

    lora_A: nn.Parameter  # (r, I)
    lora_B: nn.Parameter  # (O, r)
    lora_scaling: float
    lora_dropout: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        h = F.dropout(x, self.lora_dropout, self.training) if self.lora_dropout else x
        h = F.linear(F.linear(h.to(self.lora_A.dtype), self.lora_A), self.lora_B)  # (..., O) through (..., r)
        return y + (h * self.lora_scaling).to(y.dtype)

    def lora_delta(self) -> torch.Tensor:
        """s · B A (O, I): what merging adds to the weight."""
        return (self.lora_B @ self.lora_A) * self.lora_scaling


class LoraExperts(nn.Module):
    """Mixin put in front of an expert bank module (moe.Experts, ExpertParallel): `banks()` returns W + s · B A per
    expert, computed for all experts at once (one bmm per bank)."""

    lora_A: nn.ParameterDict  # bank name -> (E, r, I)
    lora_B: nn.ParameterDict  # bank name -> (E, O, r)
    lora_scaling: dict  # bank name -> s

    lora_fast = True  # False: always the reference (W + s·BA into the base kernels)

    def banks(self):
        return tuple(w + self.lora_delta(n).to(w.dtype) if n in self.lora_A else w
                     for n, w in zip(BANKS, super().banks()))  # fmt: skip

    def forward(self, x_TD, topk_idx_TK, topk_w_TK):
        """Where the base would run a fast path (experts_sorted on CPU, experts_grouped_mm on GPU): the low-rank
        terms inside it, no dense delta and no bank weight gradient; elsewhere (the loop, expert parallel) the
        reference through banks()."""
        fn = moe.fast_path(self, x_TD) if self.lora_fast and isinstance(self, moe.Experts) else None
        if fn is None:
            return super().forward(x_TD, topk_idx_TK, topk_w_TK)
        return fn(x_TD, topk_idx_TK, topk_w_TK, self.gate_up_proj, self.down_proj, lora=self.lora_operands(x_TD.dtype))

    def lora_operands(self, dtype) -> tuple:
        """(A_gu, s·B_gu, A_d, s·B_d), None for a bank without an adapter (experts_sorted's `lora`)."""
        out = []
        for bank in BANKS:
            if bank in self.lora_A:
                out += [self.lora_A[bank].to(dtype), (self.lora_B[bank] * self.lora_scaling[bank]).to(dtype)]
            else:
                out += [None, None]
        return tuple(out)

    def lora_delta(self, bank: str) -> torch.Tensor:
        """s · B_e A_e for every expert e: (E, O, I)."""
        return torch.bmm(self.lora_B[bank], self.lora_A[bank]) * self.lora_scaling[bank]


_SWAPPED: dict[tuple[type, type], type] = {}


def _swap_class(module: nn.Module, mixin: type) -> None:
    """Make `module` an instance of (mixin, its class) in place; the subclass is made once per base class."""
    base = type(module)
    if issubclass(base, mixin):
        return
    if (base, mixin) not in _SWAPPED:
        _SWAPPED[base, mixin] = type(f"Lora{base.__name__}", (mixin, base), {"__module__": __name__})
    module.__class__ = _SWAPPED[base, mixin]


def _new(shape, like: torch.Tensor, dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device=like.device, dtype=dtype))


def add_linear_adapter(module: nn.Module, r: int, scaling: float, dropout: float = 0.0, dtype=None) -> None:
    """Give a Linear-like module (in_features, out_features, forward(x)) an adapter pair, uninitialised."""
    like = _base_tensor(module)
    dtype = dtype or (like.dtype if like.is_floating_point() else torch.float32)
    _swap_class(module, LoraLinear)
    module.lora_A = _new((r, module.in_features), like, dtype)
    module.lora_B = _new((module.out_features, r), like, dtype)
    module.lora_scaling, module.lora_dropout = float(scaling), float(dropout)


def add_bank_adapter(module: nn.Module, bank: str, r: int, scaling: float, dtype=None) -> None:
    """Give one expert bank (E, O, I) of `module` per-expert adapters A (E, r, I), B (E, O, r), uninitialised."""
    w = getattr(module, bank)
    E, O, I = w.shape
    if not isinstance(module, LoraExperts):
        _swap_class(module, LoraExperts)
        module.lora_A, module.lora_B, module.lora_scaling = nn.ParameterDict(), nn.ParameterDict(), {}
    dtype = dtype or w.dtype
    module.lora_A[bank] = _new((E, r, I), w, dtype)
    module.lora_B[bank] = _new((E, O, r), w, dtype)
    module.lora_scaling[bank] = float(scaling)


def _base_tensor(module: nn.Module) -> torch.Tensor:
    for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
        return t
    raise ConfigError(f"{type(module).__name__}: no weight to adapt")


# ---------------------------------------------------------------- applying to a model
def expand_targets(targets: list[str]) -> list[str]:
    out = []
    for t in targets:
        out += TARGET_ALIASES.get(t, [t])
    return out


def find_targets(model: nn.Module, targets: list[str], within: tuple[str, ...] = ("",)) -> tuple[list[str], list[str]]:
    """(Linear-like module names, expert bank parameter names) matched by the patterns, under the name prefixes
    `within` (a VL stage's `vl.train` part); an error if none match."""
    patterns = expand_targets(targets)
    hit = lambda name: name.startswith(within) and any(fnmatch.fnmatchcase(name, p) for p in patterns)
    linears, banks = [], []
    for name, m in model.named_modules():
        if hasattr(m, "in_features") and hasattr(m, "out_features") and hit(name):
            linears.append(name)
        for b in BANKS:
            if isinstance(getattr(m, b, None), nn.Parameter) and getattr(m, b).dim() == 3 and hit(f"{name}.{b}"):
                banks.append(f"{name}.{b}")
    if not linears and not banks:
        where = f" under {', '.join(within)}" if within != ("",) else ""
        raise ConfigError(
            f"lora.targets {targets} match no weight of this model{where} "
            f"(aliases: {', '.join(TARGET_ALIASES)}; or glob patterns over module names)"
        )
    return linears, banks


def apply_lora(model: nn.Module, cfg: LoraConfig, seed: int = 0, within: tuple[str, ...] = ("",)) -> list[str]:
    """Freeze `model` and add adapters on cfg.targets (under the module-name prefixes `within`); returns the adapter
    parameter names. On meta the adapters stay unallocated (fill them from `initial_tensors`); otherwise they are
    initialised here from `seed`."""
    found = problems(cfg)
    if found:
        raise ConfigError("; ".join(found))
    linears, banks = find_targets(model, cfg.targets, within)
    model.requires_grad_(False)
    for name in linears:
        add_linear_adapter(model.get_submodule(name), cfg.r, cfg.scaling, cfg.dropout)
        _plain_mla_if_kv_b(model, name)
    for name in banks:
        owner, bank = name.rsplit(".", 1)
        add_bank_adapter(model.get_submodule(owner), bank, cfg.r, cfg.scaling)
    model.lora_config = cfg
    names = lora_names(model)
    if not any(p.is_meta for p in model.parameters()):
        init_adapters_(model, seed)
    return names


def _plain_mla_if_kv_b(model: nn.Module, name: str) -> None:
    """MLA's absorbed decode path reads kv_b_proj.weight itself (W_UK, W_UV folded into q and o): with an adapter on
    kv_b_proj it would miss the delta, so that layer decodes on the plain path, which calls the module."""
    if name.endswith(".kv_b_proj"):
        model.get_submodule(name.rsplit(".", 1)[0]).absorb = False


def is_lora_name(name: str) -> bool:
    return ".lora_A" in name or ".lora_B" in name


def lora_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters() if is_lora_name(n)]


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(m, (LoraLinear, LoraExperts)) for m in model.modules())


def initial_tensors(model: nn.Module, seed: int = 0, device="cpu"):
    """(name, tensor) of every adapter as PEFT initialises them: A ~ U(-1/sqrt(I), 1/sqrt(I)) (kaiming_uniform with
    a = sqrt(5)), B = 0, so the adapted model starts equal to its base. One seeded stream in name order, so every
    rank of a sharded model draws the same values (train/dist.py: materialize). Names and shapes are read now, before
    expert parallel splits the banks, so the stream holds whole adapters whatever happens to the model after."""
    plan = [(n, p.shape, p.dtype) for n, p in sorted(model.named_parameters(), key=lambda kv: kv[0]) if is_lora_name(n)]
    return _draw(plan, seed, device)


def _draw(plan, seed: int, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape, dtype in plan:
        t = torch.zeros(shape, dtype=dtype, device=device)
        if ".lora_A" in name:
            bound = 1.0 / math.sqrt(shape[-1])
            t.uniform_(-bound, bound, generator=gen)
        yield name, t


@torch.no_grad()
def init_adapters_(model: nn.Module, seed: int = 0) -> None:
    params = dict(model.named_parameters())
    for name, t in initial_tensors(model, seed, device=next(iter(params.values())).device):
        params[name].copy_(t)
        params[name].requires_grad_(True)


def mark_trainable_(model: nn.Module) -> None:
    """Adapters train, everything else is frozen (after to_empty, which makes new Parameters)."""
    for name, p in model.named_parameters():
        p.requires_grad_(is_lora_name(name))


# ---------------------------------------------------------------- merging
def adapted_modules(model: nn.Module):
    """(module name, module) of every adapted module."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (LoraLinear, LoraExperts))]


def merged_state_dict(model: nn.Module, state: dict | None = None) -> dict[str, torch.Tensor]:
    """The base's state dict with every adapter folded in (W + s·BA) and the lora_* entries dropped: what RL's
    rollout engine or `glmstack merge` needs. `state`: a full (gathered) state dict of `model` to merge instead of
    model.state_dict() (FSDP2 / expert parallel: dist.full_state_dict)."""
    state = dict(model.state_dict() if state is None else state)
    for name, m in adapted_modules(model):
        prefix = f"{name}." if name else ""
        if isinstance(m, LoraLinear):
            if f"{prefix}weight" not in state or not state[f"{prefix}weight"].is_floating_point():
                raise ConfigError(
                    f"{name}: merging needs a floating-point base weight (a quantized base: dequantize "
                    f"the checkpoint first)"
                )
            pairs = [("weight", m.lora_scaling, "lora_A", "lora_B")]
        else:
            pairs = [(b, m.lora_scaling[b], f"lora_A.{b}", f"lora_B.{b}") for b in m.lora_A]
        for w, s, a, b in pairs:
            W = state[prefix + w]
            delta = torch.matmul(state[prefix + b].to(W.device).float(), state[prefix + a].to(W.device).float()) * s
            state[prefix + w] = (W.float() + delta).to(W.dtype)
    return {k: v for k, v in state.items() if not is_lora_name(k)}


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if is_lora_name(k)}
