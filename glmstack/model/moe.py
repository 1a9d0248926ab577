"""The GLM-4.5 / DeepSeek-V3 mixture of experts: sigmoid router with a balancing bias, grouped experts, shared expert.

Router (DeepSeek-V3 Eq. 12-16; transformers `Glm4MoeTopkRouter`): fp32 logits, s = sigmoid; experts are chosen on
s + e_score_correction_bias (the loss-free balancing bias, Wang et al. 2024, is used ONLY to choose), optionally
limited to the best `topk_group` of `n_group` groups (group score = sum of its top-2); gate values are the unbiased
s of the chosen experts, renormalised when `norm_topk_prob`, times `routed_scaling_factor`. Routing replay (R3,
arXiv 2510.11370; docs/rl.md): the trainer's forward may route each token to the experts the rollout engine chose
(`Router.replay`), the gates still read from the router's full scores; the engine records its routers' choices through
`Router.record` (inference/routes.py).

Experts are 3-D banks `gate_up_proj (E, 2F, D)` (gate rows first) and `down_proj (E, D, F)`, the layout transformers
keeps in memory. The fast path (`experts_grouped`) sorts the T*K (token, expert) pairs by expert and runs two
`torch._grouped_mm` calls on GPU (bf16, sm90+; `experts_grouped_mm`) or, elsewhere, one matmul per expert on
contiguous row blocks with a hand-written backward (`experts_sorted`); `experts_loop` is the plain per-expert
reference (`use_grouped_mm=False`). The per-expert blocks call torch.mm (MKL on CPU), not the oneDNN GEMMs of
model/gemm.py: a block's row count changes with the routing at every step, and oneDNN builds a new kernel for
every new shape (~0.8 ms a call here), which cost a training step ~20% (docs/training.md, Throughput). All three are checked equal in tests/unit/test_model_moe.py, forward and backward.

Also here: the sequence-wise balance loss (DeepSeek-V3 Eq. 17-20) and per-expert token counts for the trainer's
bias update. Shape legend: B batch, T tokens, D hidden, E experts, K experts per token, F expert width,
N = T*K routed pairs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model import invariant
from glmstack.model.layers import MLP


class Router(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E = cfg.n_routed_experts
        self.top_k, self.n_group, self.topk_group = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
        self.norm_topk_prob, self.scale = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(E, cfg.hidden_size, dtype=torch.float32))  # kept fp32 (HF too)
        self.register_buffer("e_score_correction_bias", torch.empty(E, dtype=torch.float32))  # trainer updates it
        # a list while the inference engine records routing (inference/routes.py): each call appends its top-k
        self.record: list | None = None

    def forward(self, x_TD: torch.Tensor):
        """-> scores_TE (fp32 sigmoid), topk_idx_TK (long), topk_w_TK (fp32 gate values)."""
        same_bits = invariant.enabled()  # the trainer's and the engine's choices bit for bit (invariant.py)
        if torch.is_autocast_enabled(x_TD.device.type):  # fp32 even under autocast (as documented)
            with torch.autocast(x_TD.device.type, enabled=False):
                scores_TE = self._scores(x_TD, same_bits)
        else:  # (no context to enter on the decode hot path)
            scores_TE = self._scores(x_TD, same_bits)
        choice_TE = scores_TE.detach() + self.e_score_correction_bias
        if self.n_group > 1:
            choice_TE = self._limit_groups(choice_TE)
        topk_idx_TK = choice_TE.topk(self.top_k, dim=-1, sorted=same_bits).indices
        if self.record is not None:
            self.record.append(topk_idx_TK)
        return scores_TE, topk_idx_TK, self.gates(scores_TE, topk_idx_TK)

    def _scores(self, x_TD: torch.Tensor, same_bits: bool) -> torch.Tensor:
        """(T, E) fp32 sigmoid router scores."""
        if same_bits:
            return invariant.sigmoid(invariant.linear(x_TD.float(), self.weight.float()))
        return F.linear(x_TD.float(), self.weight.float()).sigmoid()

    def gates(self, scores_TE: torch.Tensor, idx_TK: torch.Tensor) -> torch.Tensor:
        """Gate values (T, K) of the experts idx_TK: read from the FULL scores, renormalised, scaled. Routing replay
        (R3) calls it with recorded experts the router's own top-k may not hold: they keep their real gate and
        gradient (reading a top-k-masked copy would give them exact zeros, ISEEKYAN/Megatron-LM#79)."""
        w_TK = scores_TE.gather(1, idx_TK)
        if self.norm_topk_prob:
            w_TK = w_TK / (w_TK.sum(-1, keepdim=True) + 1e-20)
        return w_TK * self.scale

    def replay(self, scores_TE: torch.Tensor, own_TK: torch.Tensor, replay_TK: torch.Tensor):
        """Routing replay (R3, arXiv 2510.11370): the recorded experts replay_TK (T, K) in place of the router's own
        choice own_TK, a row with -1 keeping its own. -> (idx_TK, w_TK)."""
        known_T1 = (replay_TK >= 0).all(-1, keepdim=True)
        idx_TK = torch.where(known_T1, replay_TK.to(own_TK.dtype), own_TK)
        return idx_TK, self.gates(scores_TE, idx_TK)

    def _limit_groups(self, choice_TE: torch.Tensor) -> torch.Tensor:
        """Keep the experts of the topk_group best groups (group score = sum of its top-2), others -inf."""
        T, E = choice_TE.shape
        groups_TGe = choice_TE.view(T, self.n_group, E // self.n_group)
        group_score_TG = groups_TGe.topk(2, dim=-1).values.sum(-1)
        keep_TG = torch.zeros_like(group_score_TG, dtype=torch.bool)
        keep_TG.scatter_(1, group_score_TG.topk(self.topk_group, dim=-1, sorted=False).indices, True)
        return groups_TGe.masked_fill(~keep_TG[..., None], float("-inf")).view(T, E)


class Experts(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        E, D, F_ = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.n_experts, self.use_grouped_mm = E, cfg.use_grouped_mm
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * F_, D))  # per expert [gate; up] rows
        self.down_proj = nn.Parameter(torch.empty(E, D, F_))

    def banks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up (E, 2F, D), down (E, D, F)) as the forward uses them; LoRA adds its per-expert deltas here
        (model/lora.py)."""
        return self.gate_up_proj, self.down_proj

    def forward(self, x_TD, topk_idx_TK, topk_w_TK):
        fn = experts_grouped if self.use_grouped_mm and _grouped_mm_ok(x_TD) else experts_loop
        fn = invariant.experts if invariant.enabled() else fn
        return fn(x_TD, topk_idx_TK, topk_w_TK, *self.banks())


def fast_path(experts: Experts, x: torch.Tensor):
    """The fast function Experts.forward takes for this input (experts_grouped_mm / experts_sorted), or None (the
    loop)."""
    if not (experts.use_grouped_mm and _grouped_mm_ok(x)):
        return None
    return experts_grouped_mm if _grouped_mm_kernel_ok(x) else experts_sorted


def _grouped_mm_ok(x: torch.Tensor) -> bool:
    """experts_grouped runs here (it picks the kernel itself); False sends callers to the reference loop."""
    return x.device.type in ("cpu", "cuda") and x.dtype in (torch.float32, torch.bfloat16, torch.float16)


def _grouped_mm_kernel_ok(x: torch.Tensor) -> bool:
    """torch._grouped_mm's fused kernel: CUDA sm90+ in bf16. On CPU (torch 2.13) it loops over groups and its
    backward is far slower than experts_sorted (docs/model.md), so CPU takes the sorted path."""
    return (hasattr(torch, "_grouped_mm") and x.device.type == "cuda" and x.dtype == torch.bfloat16
            and torch.cuda.get_device_capability(x.device) >= (9, 0))


def experts_grouped(x_TD, topk_idx_TK, topk_w_TK, w_gate_up_EFD, w_down_EDF):
    """The fast grouped path: torch._grouped_mm where it has a kernel, else the sorted per-expert blocks."""
    fn = experts_grouped_mm if _grouped_mm_kernel_ok(x_TD) else experts_sorted
    return fn(x_TD, topk_idx_TK, topk_w_TK, w_gate_up_EFD, w_down_EDF)


def experts_grouped_mm(x_TD, topk_idx_TK, topk_w_TK, w_gate_up_EFD, w_down_EDF, lora=None):
    """Sort the (token, expert) pairs by expert, two grouped GEMMs, un-sort, weighted sum over K. No host sync.
    lora: as experts_sorted's; each adapter is two more grouped GEMMs through its rank (r a multiple of 8 in bf16,
    the kernel's 16-byte alignment)."""
    T, K = topk_idx_TK.shape
    flat_N = topk_idx_TK.reshape(-1)
    order_N = flat_N.argsort(stable=True)
    offs_E = expert_counts(flat_N, w_gate_up_EFD.shape[0]).cumsum(0).to(torch.int32)
    a_gu, b_gu, a_d, b_d = lora or (None, None, None, None)
    x_ND = x_TD[order_N // K]
    h_NF2 = _grouped_low_rank(x_ND, w_gate_up_EFD, a_gu, b_gu, offs_E)
    gate_NF, up_NF = h_NF2.chunk(2, dim=-1)
    y_ND = _grouped_low_rank(F.silu(gate_NF) * up_NF, w_down_EDF, a_d, b_d, offs_E)
    y_TKD = y_ND[order_N.argsort()].view(T, K, -1)
    return torch.bmm(topk_w_TK.to(y_TKD.dtype).unsqueeze(1), y_TKD).squeeze(1)  # (T, D)


def _grouped_mm(x_NI, w_EOI, offs_E):
    return torch._grouped_mm(x_NI, w_EOI.transpose(-2, -1), offs=offs_E)  # (N, O)


def _grouped_low_rank(x_NI, w_EOI, a_ErI, b_EOr, offs_E):
    """x W_eᵀ per expert block, + (x A_eᵀ) B_eᵀ when the bank has an adapter (B already scaled)."""
    y_NO = _grouped_mm(x_NI, w_EOI, offs_E)
    if a_ErI is None:
        return y_NO
    return y_NO + _grouped_mm(_grouped_mm(x_NI, a_ErI, offs_E), b_EOr, offs_E)


@torch.compiler.disable  # host-side counts: compiled, every new count pattern would be a recompile
def experts_sorted(x_TD, topk_idx_TK, topk_w_TK, w_gate_up_EFD, w_down_EDF, lora=None):
    """Same sort as experts_grouped_mm, then one matmul per expert on contiguous row blocks, the gate weights applied
    in sorted order and the K outputs summed by one index_add, with a hand-written backward (no zero-filled slice
    gradients, no index_put, no un-sort): the fast path where _grouped_mm has no kernel.
    lora: per-expert low-rank terms (A_gu (E, r, D), sB_gu (E, 2F, r), A_d (E, r, F), sB_d (E, D, r)), B already
    scaled, None for a bank without: each block adds (x A_eᵀ) sB_eᵀ beside its GEMM (model/lora.py), so a frozen
    bank's dense weight gradient is never formed."""
    K = topk_idx_TK.shape[1]
    flat_N = topk_idx_TK.reshape(-1)
    order_N = flat_N.argsort(stable=True)
    counts = torch.bincount(flat_N, minlength=w_gate_up_EFD.shape[0]).tolist()  # host sync: free on CPU
    return _SortedExperts.apply(x_TD, topk_w_TK, w_gate_up_EFD, w_down_EDF, order_N, counts, K,
                                *(lora or (None, None, None, None)))  # fmt: skip


class _SortedExperts(torch.autograd.Function):
    """y[t] = sum_k w[t, k] SwiGLU_{e(t,k)}(x[t]), computed over the N = T*K pairs sorted by expert. The gate weight
    scales each row's activation before the down GEMM (F wide, not D), so no (N, D) product is weighted or kept."""

    @staticmethod
    def forward(ctx, x_TD, w_TK, w_gu_EFD, w_d_EDF, order_N, counts, K, a_gu, b_gu, a_d, b_d):
        tok_N = order_N // K  # token of each sorted row
        wk_N1 = w_TK.reshape(-1).index_select(0, order_N).to(x_TD.dtype)[:, None]
        xs_ND = x_TD.index_select(0, tok_N)  # rows sorted by expert
        N, F2 = xs_ND.shape[0], w_gu_EFD.shape[1]
        h_NF2, actw_NF, ys_ND = x_TD.new_empty(N, F2), x_TD.new_empty(N, F2 // 2), x_TD.new_empty(xs_ND.shape)
        u_gu_Nr = x_TD.new_empty(N, a_gu.shape[1]) if a_gu is not None else None  # x A_eᵀ, kept for backward
        u_d_Nr = x_TD.new_empty(N, a_d.shape[1]) if a_d is not None else None
        for e, (a, b) in _blocks(counts):
            torch.mm(xs_ND[a:b], w_gu_EFD[e].t(), out=h_NF2[a:b])
            if a_gu is not None:
                h_NF2[a:b].addmm_(torch.mm(xs_ND[a:b], a_gu[e].t(), out=u_gu_Nr[a:b]), b_gu[e].t())
            torch.mul(_swiglu(h_NF2[a:b]), wk_N1[a:b], out=actw_NF[a:b])
            torch.mm(actw_NF[a:b], w_d_EDF[e].t(), out=ys_ND[a:b])
            if a_d is not None:
                ys_ND[a:b].addmm_(torch.mm(actw_NF[a:b], a_d[e].t(), out=u_d_Nr[a:b]), b_d[e].t())
        ctx.save_for_backward(xs_ND, h_NF2, actw_NF, wk_N1, w_gu_EFD, w_d_EDF, order_N, tok_N,
                              a_gu, b_gu, a_d, b_d, u_gu_Nr, u_d_Nr)  # fmt: skip
        ctx.counts, ctx.K, ctx.w_dtype = counts, K, w_TK.dtype
        return torch.zeros_like(x_TD).index_add_(0, tok_N, ys_ND)

    @staticmethod
    def backward(ctx, dy_TD):
        xs_ND, h_NF2, actw_NF, wk_N1, w_gu_EFD, w_d_EDF, order_N, tok_N, *low_rank = ctx.saved_tensors
        a_gu, b_gu, a_d, b_d, u_gu_Nr, u_d_Nr = low_rank
        d_low = [None if t is None else torch.zeros_like(t) for t in (a_gu, b_gu, a_d, b_d)]  # unchosen experts: 0
        dys_ND = dy_TD.index_select(0, tok_N)
        dxs_ND, dh_NF2 = torch.empty_like(xs_ND), torch.empty_like(h_NF2)
        dwk_N = dy_TD.new_empty(len(tok_N), dtype=torch.float32)
        # a frozen bank (LoRA on other weights, model/lora.py) needs no weight gradient: skip its GEMMs
        want_gu, want_d = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        dw_gu = torch.empty_like(w_gu_EFD) if want_gu else None
        dw_d = torch.empty_like(w_d_EDF) if want_d else None
        for e, (a, b) in _blocks(ctx.counts):
            if want_d:
                torch.mm(dys_ND[a:b].t(), actw_NF[a:b], out=dw_d[e])
            g_nF = dys_ND[a:b] @ w_d_EDF[e]  # d/d(weighted activation)
            if a_d is not None:  # the down adapter: grads of A_d, sB_d and its share of g
                dv_nr = dys_ND[a:b] @ b_d[e]
                torch.mm(dys_ND[a:b].t(), u_d_Nr[a:b], out=d_low[3][e])
                torch.mm(dv_nr.t(), actw_NF[a:b], out=d_low[2][e])
                g_nF.addmm_(dv_nr, a_d[e])
            gate, up = h_NF2[a:b].chunk(2, dim=-1)
            sig = torch.sigmoid(gate)
            silu = gate * sig
            torch.linalg.vecdot(g_nF.float(), (silu * up).float(), out=dwk_N[a:b])  # d/d gate weight
            dgate, dup = dh_NF2[a:b].chunk(2, dim=-1)
            g_nF.mul_(wk_N1[a:b])  # d/d activation
            torch.mul(g_nF, silu, out=dup)
            torch.mul(g_nF.mul_(up), silu.mul_(1 - sig).add_(sig), out=dgate)  # silu' = sig + silu (1 - sig)
            if want_gu:
                torch.mm(dh_NF2[a:b].t(), xs_ND[a:b], out=dw_gu[e])
            torch.mm(dh_NF2[a:b], w_gu_EFD[e], out=dxs_ND[a:b])
            if a_gu is not None:  # the gate_up adapter: grads of A_gu, sB_gu and its share of dx
                du_nr = dh_NF2[a:b] @ b_gu[e]
                torch.mm(dh_NF2[a:b].t(), u_gu_Nr[a:b], out=d_low[1][e])
                torch.mm(du_nr.t(), xs_ND[a:b], out=d_low[0][e])
                dxs_ND[a:b].addmm_(du_nr, a_gu[e])
        for e, n in enumerate(ctx.counts):
            for dw in (dw_gu, dw_d):
                if not n and dw is not None:  # an expert no token chose
                    dw[e].zero_()
        dx_TD = torch.zeros_like(dy_TD).index_add_(0, tok_N, dxs_ND)
        dw_TK = torch.empty_like(dwk_N).index_copy_(0, order_N, dwk_N).view(-1, ctx.K)
        return dx_TD, dw_TK.to(ctx.w_dtype), dw_gu, dw_d, None, None, None, *d_low


def _blocks(counts: list[int]):
    """(expert, (start, end)) of each non-empty expert's rows in the sorted order."""
    start = 0
    for e, n in enumerate(counts):
        if n:
            yield e, (start, start + n)
        start += n


def _swiglu(h_NF2: torch.Tensor) -> torch.Tensor:
    gate, up = h_NF2.chunk(2, dim=-1)
    return F.silu(gate) * up


def expert_counts(expert_N: torch.Tensor, n_experts: int, weight_N: torch.Tensor | None = None) -> torch.Tensor:
    """(E,) pairs per expert (only pairs whose weight_N is True, if given). Not torch.bincount: its output size
    depends on the data, which breaks a compiled graph (torch.compile) at every MoE layer; this one's is always E."""
    ones_N = torch.ones_like(expert_N) if weight_N is None else weight_N.to(expert_N.dtype)
    return expert_N.new_zeros(n_experts).scatter_add_(0, expert_N, ones_N)


@torch.compiler.disable  # data-dependent loop over experts: the reference, not a compile target
def experts_loop(x_TD, topk_idx_TK, topk_w_TK, w_gate_up_EFD, w_down_EDF):
    """The plain reference: for each expert, its tokens through its SwiGLU, weighted, added back."""
    out_TD = torch.zeros_like(x_TD)
    for e in range(w_gate_up_EFD.shape[0]):
        tok, slot = torch.where(topk_idx_TK == e)
        if tok.numel() == 0:
            continue
        gate, up = F.linear(x_TD[tok], w_gate_up_EFD[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w_down_EDF[e]) * topk_w_TK[tok, slot, None]
        out_TD = out_TD.index_add(0, tok, y.to(x_TD.dtype))
    return out_TD


class MoE(nn.Module):
    """Routed experts + shared expert: y = sum_k g_k FFN_k(x) + FFN_shared(x)."""

    def __init__(self, cfg):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(cfg)
        shared = cfg.moe_intermediate_size * cfg.n_shared_experts
        self.shared_experts = MLP(cfg.hidden_size, shared) if shared else None

    def muon_blocks(self) -> dict[str, tuple]:
        """Muon orthogonalises each expert's W_gate and W_up apart, as the dense MLP's gate_proj and up_proj (declared
        here, not on Experts, so an expert-parallel replacement of `experts` keeps the rule)."""
        if not isinstance(getattr(self.experts, "gate_up_proj", None), nn.Parameter):
            return {}  # quantized experts (QLoRA's frozen base): nothing of theirs is optimised
        F_ = self.experts.gate_up_proj.shape[1] // 2
        return {"experts.gate_up_proj": (1, (F_, F_))}

    def forward(self, x_BTD: torch.Tensor, valid_BT: torch.Tensor | None = None, replay_BTK=None):
        """-> (y_BTD, aux_loss scalar, load_E token counts, own_BTK the router's own top-k); tokens where valid_BT is
        False (padding) are routed but count in neither the aux loss nor the load that drives the balancing bias.
        replay_BTK (B, T, K) long: routing replay's recorded experts (-1: the router's own), Router.replay; the aux
        loss and the load then count the experts the tokens were routed to."""
        B, T, D = x_BTD.shape
        x_TD = x_BTD.reshape(B * T, D)
        scores_TE, own_TK, w_TK = self.gate(x_TD)
        idx_TK = own_TK
        if replay_BTK is not None:
            idx_TK, w_TK = self.gate.replay(scores_TE, own_TK, replay_BTK.reshape(B * T, -1))
        y_TD = self.experts(x_TD, idx_TK, w_TK)
        if self.shared_experts is not None:
            y_TD = y_TD + self.shared_experts(x_TD)
        valid_T = valid_BT.reshape(B * T) if valid_BT is not None else None
        load_E = expert_counts(idx_TK.reshape(-1), scores_TE.shape[1], _per_pair(valid_T, idx_TK.shape[1]))
        aux = sequence_balance_loss(scores_TE.view(B, T, -1), idx_TK.view(B, T, -1), valid_BT)
        return y_TD.view(B, T, D), aux, load_E.float(), own_TK.view(B, T, -1)


def _per_pair(valid_T: torch.Tensor | None, K: int) -> torch.Tensor | None:
    return None if valid_T is None else valid_T[:, None].expand(-1, K).reshape(-1)


def sequence_balance_loss(scores_BTE: torch.Tensor, idx_BTK: torch.Tensor, valid_BT=None) -> torch.Tensor:
    """DeepSeek-V3 Eq. 17-20 per sequence, averaged over the batch: sum_i f_i P_i (1.0 when perfectly balanced).

    f_i = E/(K T) * #tokens routed to i (no gradient), P_i = mean_t s_it / sum_j s_jt, over the T valid (non-padding)
    tokens of the sequence; a row of padding only is left out of the mean.
    """
    B, T, E = scores_BTE.shape
    K = idx_BTK.shape[-1]
    valid_BT = torch.ones(B, T, dtype=torch.bool, device=scores_BTE.device) if valid_BT is None else valid_BT
    v_BT = valid_BT.to(scores_BTE.dtype)
    n_B = v_BT.sum(1)  # valid tokens per row
    counts_BE = torch.zeros(B, E, device=scores_BTE.device).scatter_add_(
        1, idx_BTK.reshape(B, T * K), v_BT[..., None].expand(B, T, K).reshape(B, T * K))
    f_BE = counts_BE * (E / (K * n_B.clamp_min(1)[:, None]))
    p_BE = ((scores_BTE / scores_BTE.sum(-1, keepdim=True)) * v_BT[..., None]).sum(1) / n_B.clamp_min(1)[:, None]
    rows_B = (n_B > 0).to(scores_BTE.dtype)
    return ((f_BE * p_BE).sum(-1) * rows_B).sum() / rows_B.sum().clamp_min(1)
