"""Decode fast path for GLM-4.5 (GQA) models: the same maths as `GLM.forward`, without training-only work.

Why: at decode a step processes 1..k+1 tokens per row, so the cost is per-op overhead, not FLOPs. The training
forward computes the balance loss and expert counts in every MoE layer, recomputes RoPE angles per forward, and
on CPU `torch._grouped_mm` walks every expert even when 4 of 16 got tokens. Here:
  - every module's tensors are pulled into per-call "plans" (_BlockPlan), so a step makes no module calls;
  - RoPE cos/sin come from a table built once per generate call, applied as x cos + (x @ R) sin (R exact);
  - RMSNorm is one fused F.rms_norm (fp32), the router skips its training outputs;
  - routed experts: at one token the K chosen ones from a host list; at 2 tokens a loop over the hit experts
    (a host sync: free on CPU, cheap next to a forward on GPU); above that the grouped GEMM, on CPU over
    contiguous (E, D, 2F) / (E, F, D) copies of the banks kept across calls (see _expert_weights);
    experts_dense (all experts, 3 kernels per layer) behind `dense_max_tokens`, off: slower on CPU;
  - no aux loss, no expert-load counts; the LM head runs only on the positions the caller needs;
  - the speculative catch-up (mtp_step(last_B=)) computes K/V at every fed position but the query side, the
    MoE and the LM head only at the one position each row drafts from.
The reference is `GLM.forward` itself: tests/parity/test_engine_fast.py checks logits (allclose) and greedy
tokens (equal) with the fast path on and off; `Engine(model, fast=False)` switches it off. Models whose
attention is not the GQA `Attention` (GLM-5 MLA) use the reference forward.

    fwd = FastForward(model, max_len=4096)            # the same interface as ReferenceForward
    logits_BTV, hidden_BTD = fwd.forward(input_ids_BT, position_ids_BT, cache)
    hidden_BTD, logits_BTV = fwd.mtp_step(layer, next_ids_BT, hidden_BTD, position_ids_BT, cache)
    hidden_BD, logits_BV = fwd.mtp_step(layer, next_ids_BT, hidden_BTD, position_ids_BT, cache, last_B=last_B)
Shape legend: B batch, T tokens, D hidden, H heads, G kv heads, Dh head dim, K experts per token, F expert width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmstack.model.attention import Attention, sdpa
from glmstack.model.moe import MoE, _grouped_mm_ok
from glmstack.model.rope import rope_cos_sin

HIT_LOOP_MAX_TOKENS = 2  # measured on CPU (bench/decode.py): the hit-expert loop wins for 1-2 tokens
# experts_dense up to this many tokens: 0 = off. On CPU it lost at every size tried (2..40 tokens, 1.3-1.9x slower
# per step, docs/inference.md): these small GEMMs are FLOP-bound, and dense does E/K = 4x the expert FLOPs.
# Unmeasured on GPU, where 3 kernel launches per layer instead of ~3E should win for decode / verify blocks.
DENSE_MAX_TOKENS = 0
EXPERT_COPY_MAX_BYTES = 256 * 2**20


def supported(model) -> bool:
    blocks = list(model.layers) + [m.block for m in model.mtp]
    return all(type(b.self_attn) is Attention for b in blocks)


class FastForward:
    def __init__(self, model, max_len: int, expert_cache: dict | None = None, dense_max_tokens: int | None = None):
        """expert_cache: a dict kept by the caller across calls for the CPU expert-bank copies;
        dense_max_tokens: run all experts densely (experts_dense) up to this many tokens (None: DENSE_MAX_TOKENS)."""
        self.model, cfg = model, model.cfg
        dtype, device = model.embed_tokens.weight.dtype, model.embed_tokens.weight.device
        pos = torch.arange(max_len, device=device)[None]
        cos, sin = rope_cos_sin(pos, cfg.rotary_dim, cfg.rope_theta, dtype)  # (1, S, R): rope_cos_sin's values
        # Full head-width tables: cos 1 and sin 0 on the pass-through dims, so partial RoPE is 4 whole-tensor ops
        Dh, R = cfg.head_dim, cfg.rotary_dim
        self.cos_SK = torch.ones(max_len, Dh, dtype=dtype, device=device)
        self.sin_SK = torch.zeros(max_len, Dh, dtype=dtype, device=device)
        self.cos_SK[:, :R], self.sin_SK[:, :R] = cos[0], sin[0]
        # rotate_half on the first R dims as a signed permutation matrix (entries 0/±1: the product is exact)
        self.rot_KK = torch.zeros(Dh, Dh, dtype=dtype, device=device)
        half = torch.arange(R // 2, device=device)
        self.rot_KK[half + R // 2, half] = -1.0  # out[:R/2] = -x[R/2:R]
        self.rot_KK[half, half + R // 2] = 1.0  # out[R/2:R] = x[:R/2]
        # Plans: each module's tensors pulled out once per generate call, so a step makes no module calls or
        # attribute walks (those were ~10% of a batch-1 step). They hold the parameters themselves, not copies
        # (except the CPU expert banks, see _expert_weights), so weights updated in place are seen.
        cache = {} if expert_cache is None else expert_cache
        dense = DENSE_MAX_TOKENS if dense_max_tokens is None else dense_max_tokens
        self.blocks = [_BlockPlan(b, cache, dense) for b in model.layers]
        self.mtp = [
            (_norm(m.enorm), _norm(m.hnorm), m.eh_proj.weight, _BlockPlan(m.block, cache, dense), _norm(m.final_norm))
            for m in model.mtp_by_depth()
        ]
        self.embed, self.norm, self.head = model.embed_tokens.weight, _norm(model.norm), model.lm_head.weight

    def rope(self, position_ids_BT):
        """-> (cos, sin, rot): (B, T, 1, Dh) tables for the (B, T, H, Dh) layout, and the rotation matrix."""
        return self.cos_SK[position_ids_BT][:, :, None], self.sin_SK[position_ids_BT][:, :, None], self.rot_KK

    def forward(self, input_ids_BT, position_ids_BT, cache, last_only: bool = False):
        """-> logits (B, T, V) (or (B, 1, V) with last_only), final-normed hidden (B, T, D)."""
        rope = self.rope(position_ids_BT)
        x_BTD = F.embedding(input_ids_BT, self.embed)
        for plan in self.blocks:
            x_BTD = plan(x_BTD, rope, cache)
        h_BTD = self.norm(x_BTD)
        return F.linear(h_BTD[:, -1:] if last_only else h_BTD, self.head), h_BTD

    def mtp_step(self, layer: int, next_ids_BT, hidden_BTD, position_ids_BT, cache, last_B=None):
        """GLM.mtp_step on the fast blocks: -> (normed hidden (B, T, D), logits (B, T, V)).

        With last_B (B,): -> (hidden (B, D), logits (B, V)) at that position of each row only. Speculative catch-up
        feeds the k + 1 confirmed positions but drafts from the last one: the other positions need only their
        K/V in the cache, so the query side, the MoE and the LM head run on one position (_BlockPlan.last_only)."""
        enorm, hnorm, eh_proj, block, final_norm = self.mtp[layer]
        emb_BTD = F.embedding(next_ids_BT, self.embed)
        x_BTD = F.linear(torch.cat([enorm(emb_BTD), hnorm(hidden_BTD)], dim=-1), eh_proj)
        if last_B is None or x_BTD.shape[1] == 1:  # one position: nothing to skip
            h_BTD = final_norm(block(x_BTD, self.rope(position_ids_BT), cache))
            h_BTD = h_BTD if last_B is None else h_BTD[:, 0]
            return h_BTD, F.linear(h_BTD, self.head)
        h_BD = final_norm(block.last_only(x_BTD, last_B, self.rope(position_ids_BT), cache)[:, 0])
        return h_BD, F.linear(h_BD, self.head)


def _norm(norm):
    """layers.RMSNorm as one fused call when that is exact (fp32); the module itself otherwise."""
    w, eps = norm.weight, norm.eps
    if w.dtype == torch.float32:
        return lambda x: F.rms_norm(x, w.shape, w, eps) if x.dtype == torch.float32 else norm(x)
    return norm


class _BlockPlan:
    """One decoder block (GQA attention + dense MLP or MoE) as plain tensors; __call__ = Block.forward."""

    def __init__(self, block, expert_cache: dict, dense_max_tokens: int = 0):
        a = block.self_attn
        self.ln1, self.ln2 = _norm(block.input_layernorm), _norm(block.post_attention_layernorm)
        self.idx, self.H, self.G, self.Dh = a.layer_idx, a.n_heads, a.n_kv, a.head_dim
        self.wq, self.bq, self.wk, self.bk = a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias
        self.wv, self.bv, self.wo = a.v_proj.weight, a.v_proj.bias, a.o_proj.weight
        self.qn, self.kn = (_norm(a.q_norm), _norm(a.k_norm)) if a.q_norm is not None else (None, None)
        mlp = block.mlp
        self.moe = mlp if isinstance(mlp, MoE) else None
        dense = mlp.shared_experts if self.moe is not None else mlp
        self.mlp = (dense.gate_proj.weight, dense.up_proj.weight, dense.down_proj.weight) if dense else None
        if self.moe is not None:
            self.w1, self.w2 = _expert_weights(mlp.experts, expert_cache)
            self.dense_max = dense_max_tokens
            self.dense = _dense_weights(mlp.experts, expert_cache) if dense_max_tokens > 1 else None

    def __call__(self, x_BTD, rope, cache):
        x_BTD = x_BTD + self.attention(self.ln1(x_BTD), rope, cache)
        return x_BTD + self.ffn(self.ln2(x_BTD))

    def last_only(self, x_BTD, last_B, rope, cache):
        """__call__'s output at position last_B[b] of each row only -> (B, 1, D); K/V still go to the cache for
        all T positions (the caller rewinds what it does not keep). That output depends on the other positions
        only through their K/V, so it equals __call__(...)[b, last_B[b]]."""
        B, T, _ = x_BTD.shape
        a_BTD = self.ln1(x_BTD)
        k_BGSK, v_BGSK = self.update_kv(a_BTD, rope, cache)
        rows_B = torch.arange(B, device=x_BTD.device)
        x_B1D, a_B1D = x_BTD[rows_B, last_B][:, None], a_BTD[rows_B, last_B][:, None]
        rope_B1 = tuple(t[rows_B, last_B][:, None] for t in rope[:2]) + (rope[2],)
        # the query at cache index len - T + last_B sees the keys up to itself after the row's padding (a padding
        # query only itself), as KVCache.attention_mask
        q_pos_B1 = (cache.lengths(self.idx) - T + last_B)[:, None]
        k_pos_S = torch.arange(k_BGSK.shape[2], device=x_BTD.device)
        seen_BS = ((k_pos_S <= q_pos_B1) & (k_pos_S >= cache.start[:, None])) | (k_pos_S == q_pos_B1)
        mask_B11S = seen_BS[:, None, None]
        x_B1D = x_B1D + self.attend(a_B1D, rope_B1, k_BGSK, v_BGSK, mask_B11S)
        return x_B1D + self.ffn(self.ln2(x_B1D))

    def ffn(self, h_BTD):
        y_BTD = _swiglu(h_BTD, *self.mlp) if self.mlp is not None else 0
        if self.moe is not None:
            y_BTD = moe_routed(self.moe.gate, h_BTD, self.w1, self.w2, self.dense, self.dense_max) + y_BTD
        return y_BTD

    def attention(self, x_BTD, rope, cache):
        k_BGSK, v_BGSK = self.update_kv(x_BTD, rope, cache)
        return self.attend(x_BTD, rope, k_BGSK, v_BGSK, cache.attention_mask(self.idx, x_BTD.shape[1]))

    def update_kv(self, x_BTD, rope, cache):
        """K/V of the new positions into the cache -> all keys and values (B, G, S, Dh)."""
        B, T, _ = x_BTD.shape
        k_BTGK = F.linear(x_BTD, self.wk, self.bk).view(B, T, self.G, self.Dh)
        v_BGTK = F.linear(x_BTD, self.wv, self.bv).view(B, T, self.G, self.Dh).transpose(1, 2)
        if self.kn is not None:
            k_BTGK = self.kn(k_BTGK)
        return cache.update(self.idx, _rope(k_BTGK, *rope).transpose(1, 2), v_BGTK)

    def attend(self, x_BTD, rope, k_BGSK, v_BGSK, mask):
        """The query side: q projection, attention over the cached keys, output projection."""
        B, T, _ = x_BTD.shape
        q_BTHK = F.linear(x_BTD, self.wq, self.bq).view(B, T, self.H, self.Dh)
        if self.qn is not None:
            q_BTHK = self.qn(q_BTHK)
        o_BHTK = sdpa(_rope(q_BTHK, *rope).transpose(1, 2), k_BGSK, v_BGSK, mask)
        return F.linear(o_BHTK.transpose(1, 2).reshape(B, T, self.H * self.Dh), self.wo)


def _swiglu(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _expert_weights(experts, cache: dict):
    """The banks as (E, D, 2F) and (E, F, D) for x @ w[e]. On CPU, for banks up to 256 MiB, contiguous copies
    (the grouped GEMM runs ~25% faster on them than on the transposed views, bench/decode.py), kept in `cache`
    and remade when a bank changes: in place (the tensor's version counter moves, as under optimizer.step or
    load_state_dict) or replaced (another data pointer). Elsewhere the views, which cost nothing."""
    p1, p2 = experts.gate_up_proj, experts.down_proj
    w1_EDF, w2_EFD = p1.transpose(1, 2), p2.transpose(1, 2)
    if w1_EDF.device.type != "cpu" or (p1.numel() + p2.numel()) * p1.element_size() > EXPERT_COPY_MAX_BYTES:
        return w1_EDF, w2_EFD
    key = (p1.data_ptr(), p1._version, p2.data_ptr(), p2._version)
    hit = cache.get(id(experts))
    if hit is None or hit[0] != key:
        hit = cache[id(experts)] = (key, w1_EDF.contiguous(), w2_EFD.contiguous())
    return hit[1], hit[2]


def _dense_weights(experts, cache: dict):
    """For experts_dense: the gate_up bank itself (E, 2F, D) and down as (D, E*F), a copy kept in `cache` and
    remade when the bank changes (as _expert_weights)."""
    p1, p2 = experts.gate_up_proj, experts.down_proj
    E, D, F_ = p2.shape
    key = (p2.data_ptr(), p2._version)
    hit = cache.get(("dense", id(experts)))
    if hit is None or hit[0] != key:
        hit = cache[("dense", id(experts))] = (key, p2.permute(1, 0, 2).reshape(D, E * F_))
    return p1, hit[1]


def experts_dense(x_TD, idx_TK, w_TK, w1_EGD, w2_DN):
    """ALL experts on all tokens (w1 the bank (E, 2F, D), w2 (D, E*F)): one GEMM for gate+up, the SwiGLU
    weighted by the routing weights (0 where a token did not choose the expert), one GEMM for down — the sum
    over experts of w_e * down_e(h_e) is one (T, E*F) @ (E*F, D) product. 3 kernels per layer instead of ~3E and
    no sort; the same weight bytes when most experts are hit, but E/K times the expert FLOPs."""
    T, (E, G, D) = x_TD.shape[0], w1_EGD.shape
    gu_TE2F = F.linear(x_TD, w1_EGD.view(E * G, D)).view(T, E, 2, G // 2)
    wd_TE = torch.zeros(T, E, dtype=x_TD.dtype, device=x_TD.device).scatter_(1, idx_TK, w_TK.to(x_TD.dtype))
    h_TEF = F.silu(gu_TE2F[:, :, 0]) * gu_TE2F[:, :, 1] * wd_TE[:, :, None]
    return F.linear(h_TEF.reshape(T, -1), w2_DN)


def _rope(x_BTHK, cos_BT1K, sin_BT1K, rot_KK):
    """apply_partial_rope in (B, T, H, Dh) layout: x cos + rotate_half(x) sin on the first R dims, x elsewhere."""
    return x_BTHK * cos_BT1K + torch.matmul(x_BTHK, rot_KK) * sin_BT1K


def moe_routed(router, x_BTD, w1, w2, dense=None, dense_max: int = 0):
    """The routed experts (w1 (E, D, 2F), w2 (E, F, D): the x @ w[e] layout); the caller adds the shared one.
    dense: (gate_up bank, down (D, E*F)) for experts_dense, used for 2..dense_max tokens."""
    B, T, D = x_BTD.shape
    x_TD = x_BTD.reshape(B * T, D)
    idx_TK, w_TK = route(router, x_TD)
    if dense is not None and 1 < x_TD.shape[0] <= dense_max:
        y_TD = experts_dense(x_TD, idx_TK, w_TK, *dense)
    elif x_TD.shape[0] == 1:
        y_TD = experts_one_token(x_TD, idx_TK, w_TK, w1, w2)
    elif x_TD.shape[0] <= HIT_LOOP_MAX_TOKENS or not _grouped_mm_ok(x_TD):
        y_TD = experts_hit(x_TD, idx_TK, w_TK, w1, w2)
    else:  # many tokens hit most experts: one C++ grouped GEMM beats a Python loop over them
        y_TD = experts_grouped_t(x_TD, idx_TK, w_TK, w1, w2)
    return y_TD.view(B, T, D)


def route(router, x_TD):
    """moe.Router without the training outputs: -> (expert ids (T, K), gate values (T, K) fp32)."""
    if router.n_group > 1 or router.weight.dtype != torch.float32:
        _, idx_TK, w_TK = router(x_TD)
        return idx_TK, w_TK
    scores_TE = F.linear(x_TD.float(), router.weight).sigmoid()
    idx_TK = (scores_TE + router.e_score_correction_bias).topk(router.top_k, dim=-1, sorted=False).indices
    w_TK = scores_TE.gather(1, idx_TK)
    if router.norm_topk_prob:
        w_TK = w_TK / (w_TK.sum(-1, keepdim=True) + 1e-20)
    return idx_TK, w_TK * router.scale


def experts_one_token(x_1D, idx_1K, w_1K, w1_EDF, w2_EFD):
    """Decode at batch 1: the K chosen experts straight from the host list, mixed by one (1, K) @ (K, D)."""
    outs = []
    for e in idx_1K[0].tolist():
        gate_1F, up_1F = torch.matmul(x_1D, w1_EDF[e]).chunk(2, dim=-1)
        outs.append(torch.matmul(F.silu(gate_1F) * up_1F, w2_EFD[e]))
    return torch.matmul(w_1K.to(x_1D.dtype), torch.cat(outs))


def experts_grouped_t(x_TD, idx_TK, w_TK, w1_EDF, w2_EFD):
    """moe.experts_grouped on (E, D, 2F) / (E, F, D) banks: sort pairs by expert, two grouped GEMMs, un-sort."""
    T, K = idx_TK.shape
    flat_N = idx_TK.reshape(-1)
    order_N = flat_N.argsort(stable=True)
    offs_E = torch.bincount(flat_N, minlength=w1_EDF.shape[0]).cumsum(0).to(torch.int32)
    gate_NF, up_NF = torch._grouped_mm(x_TD[order_N // K], w1_EDF, offs=offs_E).chunk(2, dim=-1)
    y_ND = torch._grouped_mm(F.silu(gate_NF) * up_NF, w2_EFD, offs=offs_E)
    y_TKD = y_ND[order_N.argsort()].view(T, K, -1)
    return torch.bmm(w_TK.to(y_TKD.dtype).unsqueeze(1), y_TKD).squeeze(1)  # (T, D)


def experts_hit(x_TD, idx_TK, w_TK, w1_EDF, w2_EFD):
    """Only the experts that some token chose: sort the T*K pairs by expert, one SwiGLU per hit expert."""
    K = idx_TK.shape[1]
    order_N = idx_TK.reshape(-1).argsort()
    experts, counts = torch.unique_consecutive(idx_TK.reshape(-1)[order_N], return_counts=True)
    tok_N = order_N // K
    x_ND = x_TD[tok_N]
    outs, s = [], 0
    for e, c in zip(experts.tolist(), counts.tolist()):
        gate_cF, up_cF = torch.matmul(x_ND[s : s + c], w1_EDF[e]).chunk(2, dim=-1)
        outs.append(torch.matmul(F.silu(gate_cF) * up_cF, w2_EFD[e]))
        s += c
    y_ND = torch.cat(outs) * w_TK.reshape(-1)[order_N, None].to(x_TD.dtype)
    return torch.zeros_like(x_TD).index_add_(0, tok_N, y_ND)


class ReferenceForward:
    """The plain model behind the same interface (fast=False, and models the fast path does not cover)."""

    def __init__(self, model, max_len: int = 0):
        self.model = model

    def forward(self, input_ids_BT, position_ids_BT, cache, last_only: bool = False):
        out = self.model(input_ids_BT, position_ids=position_ids_BT, cache=cache)
        return (out.logits[:, -1:] if last_only else out.logits), out.hidden

    def mtp_step(self, layer: int, next_ids_BT, hidden_BTD, position_ids_BT, cache, last_B=None):
        h_BTD, logits_BTV = self.model.mtp_step(layer, next_ids_BT, hidden_BTD, position_ids_BT, cache)
        if last_B is None:
            return h_BTD, logits_BTV
        rows_B = torch.arange(h_BTD.shape[0], device=h_BTD.device)
        return h_BTD[rows_B, last_B], logits_BTV[rows_B, last_B]
