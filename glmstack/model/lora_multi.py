"""Several LoRA adapters over one base at once, chosen per batch row: `glmstack serve BASE --lora a=DIR --lora b=DIR`.

What: `add_adapter(model, slot, folder)` puts a PEFT adapter folder (model/lora_peft.py: written by a glmstack LoRA
stage or by PEFT) on the served model under a slot number; slot 0 is the base itself. Before a forward,
`use_slots(model, rows)` says which slot each of the batch's N rows uses; rows of different adapters and of the
base then run in one forward, unmerged, as vLLM serves LoRA adapters (Punica / S-LoRA's multi-adapter batching).
`remove_adapter` / a second `add_adapter` on a slot replace one adapter without touching the others (RL's
adapter-only weight pushes).

Why unmerged: merging (W + s·BA) makes one copy of the base per adapter; here the base is stored once and each
adapter costs its low-rank pairs. The result equals the merged model's up to rounding (tests/integration/
test_serve_lora.py: greedy outputs equal token for token).

How: every module some adapter targets gets a mixin (the class swap model/lora.py uses, so the base keeps its
state-dict names and a full-weight push still loads) that holds, per slot, its (A, s·B) pairs as plain tensors (not
parameters: nothing trains here). A Linear adds, for each slot present in the batch, that slot's low-rank term on
its rows' tokens. An expert bank runs, for each slot present, the experts on that slot's tokens with that slot's
adapters (the low-rank terms inside moe's fast path where it runs, else W + s·BA into the reference loop). The
loops are over the slots present in a batch (a few), never over rows or experts.

    add_adapter(model, 1, "runs/lora/sft/model")
    with use_slots(model, [0, 1, 1]):                  # row 0: the base; rows 1, 2: the adapter
        logits = model(ids_3T).logits

Shape legend: N rows, T tokens (X: all tokens of the batch, rows outermost), E experts, O out, I in, r rank.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.errors import ConfigError
from glmstack.model import lora, moe
from glmstack.model.lora_peft import plan_adapter, read_adapter


class Slots:
    """The batch's per-row slot numbers, shared by every adapted module of a model (None: every row is the base),
    and per token count the (slot, token indices) groups, made once per forward rather than once per module (no
    host sync inside the layers)."""

    def __init__(self):
        self.rows: list[int] | None = None
        self.cache: dict = {}

    def set(self, rows: list[int] | None) -> None:
        self.rows, self.cache = (rows if rows and any(rows) else None), {}

    def groups(self, x: torch.Tensor) -> list[tuple[int, torch.Tensor]] | None:
        """[(slot, token indices)] over the tokens of x (..., I), whose leading dims flatten rows-outermost as the
        model's modules see them ((N, T, I) or (N·T, I)); None when the batch is all base."""
        if self.rows is None:
            return None
        N, X = len(self.rows), x.numel() // x.shape[-1]
        if X % N:
            raise ValueError(f"LoRA slots: {N} rows do not divide this input's {X} tokens")
        key = (X, x.device)
        if key not in self.cache:
            slots_X = torch.tensor(self.rows, device=x.device).repeat_interleave(X // N)
            self.cache[key] = [(s, (slots_X == s).nonzero()[:, 0]) for s in sorted(set(self.rows))]
        return self.cache[key]


class MultiLoraLinear(nn.Module):
    """Mixin before a Linear-like class: y = base(x) + for each row, its slot's s · B A x."""

    lora_slots: Slots
    lora_stack: dict  # slot -> (A (r, I), sB (O, r))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        groups = self.lora_slots.groups(x)
        if groups is None or not self.lora_stack:
            return y
        if len(groups) == 1:  # one slot for the whole batch: no gather / scatter
            pair = self.lora_stack.get(groups[0][0])
            return y if pair is None else y + F.linear(F.linear(x.to(pair[0].dtype), pair[0]), pair[1]).to(y.dtype)
        x_XI, y_XO = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]).clone()
        for s, idx in groups:
            if s in self.lora_stack:
                A, sB = self.lora_stack[s]
                h = F.linear(F.linear(x_XI[idx].to(A.dtype), A), sB)  # (n, O) through (n, r)
                y_XO[idx] += h.to(y_XO.dtype)
        return y_XO.view(y.shape)


class MultiLoraExperts(nn.Module):
    """Mixin before an expert bank module (moe.Experts): each slot's tokens through the experts with its adapters."""

    lora_slots: Slots
    lora_stack: dict  # slot -> {bank: (A (E, r, I), sB (E, O, r))}
    lora_mixed = True  # False: a batch of several slots always takes the reference (one expert pass per slot)

    def forward(self, x_TD, topk_idx_TK, topk_w_TK):
        groups = self.lora_slots.groups(x_TD)
        if groups is None or not self.lora_stack:
            return super().forward(x_TD, topk_idx_TK, topk_w_TK)
        if len(groups) == 1:
            return self._slot_forward(groups[0][0], x_TD, topk_idx_TK, topk_w_TK)
        if self.lora_mixed and x_TD.device.type == "cpu" and not torch.is_grad_enabled():
            return self._mixed_forward(groups, x_TD, topk_idx_TK, topk_w_TK)
        y_TD = None
        for s, idx in groups:
            part = self._slot_forward(s, x_TD[idx], topk_idx_TK[idx], topk_w_TK[idx])
            y_TD = y_TD if y_TD is not None else part.new_empty(x_TD.shape[0], part.shape[-1])
            y_TD[idx] = part
        return y_TD

    def _mixed_forward(self, groups, x_TD, idx_TK, w_TK):
        """Decoding on CPU (no autograd): the (token, expert) pairs sorted by expert, then slot; per expert one GEMM
        pair over all its rows, the base's, and each slot's low-rank terms on its own rows. Equal to the per-slot
        reference (tests/integration/test_serve_lora.py), with one expert pass instead of one per slot."""
        T, K = idx_TK.shape
        slot_T = torch.zeros(T, dtype=torch.long)
        for s, idx in groups:
            slot_T[idx] = s
        S, E = int(slot_T.max()) + 1, self.gate_up_proj.shape[0]
        key_N = idx_TK.reshape(-1) * S + slot_T.repeat_interleave(K)
        order_N = key_N.argsort(stable=True)
        tok_N = order_N // K
        xs_ND = x_TD.index_select(0, tok_N)
        wk_N1 = w_TK.reshape(-1).index_select(0, order_N).to(x_TD.dtype)[:, None]
        counts = torch.bincount(key_N, minlength=E * S).view(E, S).tolist()
        ys_ND, start = torch.empty_like(xs_ND), 0
        for e in range(E):
            n = sum(counts[e])
            if not n:
                continue
            rows = slice(start, start + n)
            h_NF2 = self._low_rank(xs_ND[rows] @ self.gate_up_proj[e].t(), xs_ND[rows], "gate_up_proj", e, counts[e])
            act_NF = moe._swiglu(h_NF2) * wk_N1[rows]
            ys_ND[rows] = self._low_rank(act_NF @ self.down_proj[e].t(), act_NF, "down_proj", e, counts[e])
            start += n
        return torch.zeros_like(x_TD).index_add_(0, tok_N, ys_ND)

    def _low_rank(self, y_NO, x_NI, bank: str, e: int, per_slot: list[int]):
        """y += each slot's (x A_eᵀ) sB_eᵀ on its rows (the rows come slot after slot)."""
        start = 0
        for s, n in enumerate(per_slot):
            pair = self.lora_stack.get(s, {}).get(bank) if n else None
            if pair is not None:
                A, sB = (t[e].to(x_NI.dtype) for t in pair)
                y_NO[start : start + n] += (x_NI[start : start + n] @ A.t()) @ sB.t()
            start += n
        return y_NO

    def _slot_forward(self, s: int, x_TD, idx_TK, w_TK):
        pairs = self.lora_stack.get(s)
        if not pairs:
            return super().forward(x_TD, idx_TK, w_TK)
        fn = moe.fast_path(self, x_TD)
        if fn is not None:
            ops = []
            for bank in lora.BANKS:
                A, sB = pairs.get(bank, (None, None))
                ops += [None, None] if A is None else [A.to(x_TD.dtype), sB.to(x_TD.dtype)]
            return fn(x_TD, idx_TK, w_TK, self.gate_up_proj, self.down_proj, lora=tuple(ops))
        banks = []
        for bank, w in zip(lora.BANKS, self.banks()):
            A, sB = pairs.get(bank, (None, None))
            banks.append(w if A is None else w + torch.bmm(sB, A).to(w.dtype))  # (E, O, I)
        return moe.experts_loop(x_TD, idx_TK, w_TK, *banks)


# ---------------------------------------------------------------- adding, removing, choosing
def slots_of(model: nn.Module) -> Slots:
    if not hasattr(model, "lora_slots"):
        model.lora_slots = Slots()
    return model.lora_slots


def add_adapter(model: nn.Module, slot: int, folder: str | os.PathLike) -> None:
    """Put the PEFT adapter in `folder` on `model` under `slot` (>= 1), replacing what the slot held. A folder that
    does not fit this base: one CheckpointError naming every mismatch, and the model is left as it was."""
    if slot < 1:
        raise ConfigError(f"LoRA slot {slot}: slot 0 is the base model")
    if lora.has_lora(model):
        raise ConfigError("this model already carries trainable LoRA adapters (model/lora.py); serve its base")
    config, tensors = read_adapter(folder)
    plan = plan_adapter(model, config, tensors, folder)
    remove_adapter(model, slot)
    slots = slots_of(model)
    for ours, kind, A, B, scaling in plan:
        module = model.get_submodule(ours)
        mixin = MultiLoraLinear if kind == "linear" else MultiLoraExperts
        if not isinstance(module, mixin):
            lora._swap_class(module, mixin)
            module.lora_slots, module.lora_stack = slots, {}
        dev = next(module.parameters()).device
        A, sB = A.to(dev, torch.float32), B.to(dev, torch.float32) * scaling  # scaled in fp32, once
        if kind == "linear":
            module.lora_stack[slot] = (A, sB)
            lora._plain_mla_if_kv_b(model, ours)
        else:
            module.lora_stack.setdefault(slot, {})[kind] = (A, sB)


def remove_adapter(model: nn.Module, slot: int) -> None:
    for m in model.modules():
        if isinstance(m, (MultiLoraLinear, MultiLoraExperts)):
            m.lora_stack.pop(slot, None)


@contextlib.contextmanager
def use_slots(model: nn.Module, rows: list[int] | None):
    """Within the block, row b of a forward runs with slot rows[b]'s adapters (0: the base)."""
    slots = slots_of(model)
    before = slots.rows
    slots.set(None if rows is None else [int(r) for r in rows])
    try:
        yield
    finally:
        slots.set(before)
