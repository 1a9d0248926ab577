"""Batch-invariant forward ops: a token's numbers do not depend on which other tokens share the call.

Why: RL's importance ratios compare the rollout engine's log-probs with the trainer's. The engine decodes one token
per row against a KV cache, a few rows at a time; the trainer runs whole sequences, many rows at once. In plain
PyTorch the two disagree in the last bits: a CPU GEMM picks its kernel (and so its summation order) by the row
count (MKL's fp32 `mm` gives row 0 of a (5, K) input other bits than row 0 of a (2, K) one), attention sums over
as many keys as the call holds, and a few elementwise kernels (fp32 sigmoid / SiLU) take a scalar path for a
tensor's tail. In a MoE those last bits flip router choices. Inside `batch_invariant()` the model's forward runs
these ops instead, so a token's log-prob is the same bits in the engine's decode and in the trainer's forward
(`rl.true_on_policy`, docs/rl.md); the backward is the plain one (gradients need not be invariant).

How, per op:
  - linear / bmm: rows padded to blocks of BLOCK_ROWS and one fixed-shape GEMM per block, so every row of every
    call goes through the same kernel in the same place (tests/unit/test_invariant.py checks row position and
    count, fp32 and bf16);
  - attention: keys in chunks of KEY_CHUNK counted from the row's first attended key (its sequence position 0),
    an online softmax over chunks in that order; chunks past a query's last key are exact no-ops (x * 1 + 0), so
    a query sees the same sums whether the call holds 1 or 4096 keys;
  - sigmoid / SiLU as 1 / (1 + exp(-x)): exp, +, / are position-independent; top-k sorted.
Under CPU autocast the GEMMs run in the autocast dtype, as F.linear would. The GPU path is the same code, written
and unverified (no CUDA run yet): cuBLAS picks kernels by shape too, and fixed-shape blocks are the same cure.

    with batch_invariant():
        logits = model(ids).logits          # == the engine's decode of the same tokens, bit for bit
"""

from __future__ import annotations

import contextlib
import threading

import torch

BLOCK_ROWS = 32  # rows per GEMM call; a multiple of every CPU GEMM micro-tile height seen (4, 6, 8, 16)
KEY_CHUNK = 32  # keys per attention block

_state = threading.local()


def enabled() -> bool:
    return getattr(_state, "on", False)


@contextlib.contextmanager
def batch_invariant(on: bool = True):
    """Run the model's forward with the invariant ops (nested calls restore the outer setting)."""
    before = enabled()
    _state.on = on
    try:
        yield
    finally:
        _state.on = before


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dev = tensors[0].device.type
    if torch.is_autocast_enabled(dev) and all(t.is_floating_point() for t in tensors):
        return torch.get_autocast_dtype(dev)
    return tensors[0].dtype


def _pad_rows(x_MK: torch.Tensor) -> torch.Tensor:
    pad = -x_MK.shape[-2] % BLOCK_ROWS
    return torch.nn.functional.pad(x_MK, (0, 0, 0, pad)) if pad else x_MK


def mm(a_MK: torch.Tensor, b_KN: torch.Tensor) -> torch.Tensor:
    """a @ b, each BLOCK_ROWS rows of a by their own GEMM of one fixed shape. No autograd of its own."""
    M = a_MK.shape[0]
    a = _pad_rows(a_MK).contiguous()
    out = a.new_empty(a.shape[0], b_KN.shape[1])
    for i in range(0, a.shape[0], BLOCK_ROWS):
        torch.mm(a[i : i + BLOCK_ROWS], b_KN, out=out[i : i + BLOCK_ROWS])
    return out[:M]


def bmm(a_NMK: torch.Tensor, b_NKP: torch.Tensor) -> torch.Tensor:
    """Batched a @ b, blocked over a's rows as `mm` (attention's scores and values); autograd through torch.bmm."""
    M = a_NMK.shape[1]
    a = _pad_rows(a_NMK)
    blocks = [torch.bmm(a[:, i : i + BLOCK_ROWS], b_NKP) for i in range(0, a.shape[1], BLOCK_ROWS)]
    return torch.cat(blocks, 1)[:, :M]


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        x_MK = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x_MK, w)
        ctx.x_shape, ctx.has_bias = x.shape, b is not None
        y_MN = mm(x_MK, w.t())
        if b is not None:
            y_MN = y_MN + b
        return y_MN.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x_MK, w = ctx.saved_tensors
        dy_MN = dy.reshape(-1, dy.shape[-1])
        dx = (dy_MN @ w).view(ctx.x_shape) if ctx.needs_input_grad[0] else None
        dw = dy_MN.t() @ x_MK if ctx.needs_input_grad[1] else None
        db = dy_MN.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b), row-invariant forward; under autocast in its dtype (gradients flow to the fp32 weights
    through the casts)."""
    dtype = _compute_dtype(x, w)
    with torch.autocast(x.device.type, enabled=False):
        return _Linear.apply(x.to(dtype), w.to(dtype), None if b is None else b.to(dtype))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * sigmoid(x)


def attention(q_BHTK, k_BGSK, v_BGSK, mask=None):
    """softmax(q kᵀ / sqrt(Dh)) v with GQA, each query's keys summed in its own sequence order (module docstring).
    mask: None (causal, the queries the last T of S positions) or bool (B, 1, T, S), True = attend; each row's
    attended keys must be a run [first, query] with `first` the same for the row's queries (left padding, one
    sequence per row) — a padding query (one that sees only itself) gets a finite, meaningless output."""
    B, H, T, Dh = q_BHTK.shape
    G, S = k_BGSK.shape[1], k_BGSK.shape[2]
    h = H // G
    dev = q_BHTK.device
    if mask is None:
        first_B = torch.zeros(B, dtype=torch.long, device=dev)
        pos_BT = (torch.arange(T, device=dev) + (S - T)).expand(B, T)
        key_ok_BS = torch.ones(B, S, dtype=torch.bool, device=dev)
    else:
        key_ok_BS = mask[:, 0, -1]  # the row's last query (a real token) sees every real key before it
        first_B = key_ok_BS.to(torch.int8).argmax(-1)
        seen_BT = mask[:, 0].sum(-1)
        pos_BT = (seen_BT - 1).clamp_min(0)  # keys seen - 1 = the query's sequence position
        first_BT = mask[:, 0].to(torch.int8).argmax(-1)
        if bool(((first_BT != first_B[:, None]) & (seen_BT > 1)).any()):
            raise ValueError("batch-invariant attention: a row's queries must share their first key (one sequence "
                             "per row, left-padded or not); packed segments are not supported")  # fmt: skip
    n_keys = int(pos_BT.max()) + 1
    S_al = -(-n_keys // KEY_CHUNK) * KEY_CHUNK
    idx_BS = first_B[:, None] + torch.arange(S_al, device=dev)  # aligned key i of row b = cache key first_b + i
    ok_BS = (idx_BS < S) & key_ok_BS.gather(1, idx_BS.clamp_max(S - 1))
    idx_BS = idx_BS.clamp_max(S - 1)

    def aligned(x_BGSK):  # (B, G, S_al, Dh), zero where there is no key (so 0-weight x garbage never makes NaN)
        x = x_BGSK.gather(2, idx_BS[:, None, :, None].expand(B, G, S_al, Dh))
        return x.masked_fill(~ok_BS[:, None, :, None], 0)

    k_NSK, v_NSK = aligned(k_BGSK).reshape(B * G, S_al, Dh), aligned(v_BGSK).reshape(B * G, S_al, Dh)
    q_NMK = (q_BHTK * Dh**-0.5).reshape(B * G, h * T, Dh)  # GQA: the h heads of a group as rows
    pos_NM = pos_BT[:, None, None, :].expand(B, G, h, T).reshape(B * G, h * T)
    m_NM = q_NMK.new_full(pos_NM.shape, float("-inf"), dtype=torch.float32)
    l_NM = torch.zeros_like(m_NM)
    acc_NMK = torch.zeros(B * G, h * T, Dh, dtype=torch.float32, device=dev)
    for c in range(0, S_al, KEY_CHUNK):
        s_NMC = bmm(q_NMK, k_NSK[:, c : c + KEY_CHUNK].transpose(1, 2)).float()
        seen_NMC = torch.arange(c, c + KEY_CHUNK, device=dev)[None, None] <= pos_NM[..., None]
        s_NMC = s_NMC.masked_fill(~seen_NMC, float("-inf"))
        m_new = torch.maximum(m_NM, s_NMC.amax(-1))
        p_NMC = torch.exp(s_NMC - m_new[..., None])
        corr = torch.exp(m_NM - m_new)
        l_NM = l_NM * corr + p_NMC.sum(-1)
        pv_NMK = bmm(p_NMC.to(v_NSK.dtype), v_NSK[:, c : c + KEY_CHUNK]).float()
        acc_NMK = acc_NMK * corr[..., None] + pv_NMK
        m_NM = m_new
    out = (acc_NMK / l_NM[..., None]).to(q_BHTK.dtype)
    return out.view(B, G, h, T, Dh).reshape(B, H, T, Dh)


def experts(x_TD, topk_idx_TK, topk_w_TK, w_gate_up_EFD, w_down_EDF):
    """The routed experts (moe.experts_loop's maths) with row-invariant GEMMs and activation: a token's K outputs
    are added in expert order whatever else was routed."""
    out_TD = torch.zeros_like(x_TD)
    for e in range(w_gate_up_EFD.shape[0]):
        tok, slot = torch.where(topk_idx_TK == e)
        if tok.numel() == 0:
            continue
        gate, up = linear(x_TD[tok], w_gate_up_EFD[e]).chunk(2, dim=-1)
        y = linear(silu(gate) * up, w_down_EDF[e]) * topk_w_TK[tok, slot, None]
        out_TD = out_TD.index_add(0, tok, y.to(x_TD.dtype))
    return out_TD
