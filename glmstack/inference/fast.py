"""Decode fast path for GLM models: the same maths as `GLM.forward`, without training-only work.

Why: at decode a step processes 1..k+1 tokens per row, so the cost is per-op overhead, not FLOPs. The training
forward computes the balance loss and expert counts in every MoE layer, recomputes RoPE angles per forward, and
makes a module call per projection. Here every module's tensors are pulled into per-call "plans" (_BlockPlan), so
a step makes no module calls, and the model's own functions do the maths where that is as fast:
  - routing: moe.Router.forward; RoPE: rope.RopeTable (rope_cos_sin's angles tabulated once per generate call, bit
    for bit apply_partial_rope); attention: attention.sdpa (its one-query branch, attention.attend_one, is the
    decode kernel); above 2 tokens without oneDNN: moe.experts_grouped (sorted per-expert GEMMs; grouped_mm on GPU).
What stays here, each because the model's version is measurably slower at decode sizes (docs/inference.md):
  - _Linear: projections that read the same input as one GEMM (q/k/v; gate/up) over contiguous (D, N) copies
    kept across calls (MKL's few-row GEMMs read that layout faster), wide ones on oneDNN-prepacked copies;
  - _BlockPlan.project: one rms_norm for q-norm and k-norm and one RoPE pass over both (training norms apart);
  - _norm: RMSNorm as one fused F.rms_norm (the module is ~7 kernels; its autograd form is what training needs);
  - experts_one_token: at one token the K chosen experts from a host list (no sort, no scatter);
  - experts_dense: from 3 to 64 tokens all experts (and the shared one) in 2 oneDNN GEMMs on prepacked banks
    (4x the FLOPs, but oneDNN's AVX-512 beats MKL's per-expert few-row GEMMs; `dense_max_tokens`);
  - experts_packed: above that one GEMM pair per hit expert on per-expert prepacked weights (~2x at a prefill).
The price of the copies is memory: up to three copies of each expert bank and two of each projection, each capped
at EXPERT_COPY_MAX_BYTES / LINEAR_COPY_MAX_BYTES (above the cap: no copy, slower path). No aux loss, no expert-load
counts; the LM head runs only on the positions the caller needs; the speculative catch-up (mtp_step(last_B=))
computes K/V at every fed position but the query side, the MoE and the LM head only at the one each row drafts from.
The reference is `GLM.forward` itself: tests/parity/test_engine_fast.py checks logits (allclose) and greedy
tokens (equal) with the fast path on and off; `Engine(model, fast=False)` switches it off. MLA models
(GLM-4.7-Flash, GLM-5) run their attention modules as they are (MLA's absorbed decode, DSA) and everything else
here: 1.2x the reference forward on the tiny presets at batch 8, same tokens.

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
from glmstack.model.lora import has_lora
from glmstack.model.mla import MLAttention
from glmstack.model.moe import MoE, experts_grouped
from glmstack.model.rope import RopeTable, rope_cos_sin

HIT_LOOP_MAX_TOKENS = 2  # measured on CPU (bench/decode.py): only the chosen experts run for 1-2 tokens
# experts_dense for HIT_LOOP_MAX_TOKENS < T <= this many tokens where oneDNN runs it (CPU; else off). On MKL it lost
# at every size tried (2..40 tokens, 1.3-1.9x slower per step, docs/inference.md): it does E/K = 4x the expert FLOPs
# and MKL's few-row GEMMs are slow here; oneDNN's on prepacked banks win from ~4 to 40+ tokens and lose at 256
# (a prefill) to a GEMM pair per hit expert. Unmeasured on GPU.
DENSE_MAX_TOKENS = 64
EXPERT_COPY_MAX_BYTES = 256 * 2**20
LINEAR_COPY_MAX_BYTES = 256 * 2**20  # per fused (D, N) projection copy (see _Linear)
# outputs at least this wide run through oneDNN at 2+ rows (_Linear); measured on CPU (bench/decode.py): a win for
# N = 4096 (the LM head) and 1536 (gate/up), a loss cold for N <= 384 (q/k/v, o, experts)
ONEDNN_MIN_N = 1024
ONEDNN_MIN_ROWS = 16  # and every projection from this many rows (prefills, big verify blocks): ~2x MKL there


def supported(model) -> bool:
    """GQA models (all fast) and MLA models (GLM-4.7-Flash, GLM-5: their attention module as it is, the rest fast);
    not quantized ones (inference/quant.py: the fast path's fp weight copies would undo the quantization), nor ones
    with LoRA adapters (model/lora.py: the copies are of the base weights; the modules add the adapters)."""
    if getattr(model, "quant_scheme", None) is not None or has_lora(model):
        return False
    kinds = {type(b.self_attn) for b in list(model.layers) + [m.block for m in model.mtp]}
    return kinds in ({Attention}, {MLAttention})


class FastForward:
    def __init__(
        self, model, max_len: int, expert_cache: dict | None = None, dense_max_tokens: int | None = None,
        draft_vocab: torch.Tensor | None = None,
    ):
        """expert_cache: a dict kept by the caller across calls for the CPU weight copies (expert banks, fused
        projections);
        draft_vocab: (N,) token ids; mtp_step's logits are then over these ids only (draft_ids[j] is column j), the
        head a copy of their N rows of the LM head (a frequency-ranked draft vocabulary, FR-Spec: the drafts are
        cheaper, the verify still scores the whole vocabulary, so the output does not change);
        dense_max_tokens: run all experts densely (experts_dense) from HIT_LOOP_MAX_TOKENS + 1 up to this many tokens
        (None: DENSE_MAX_TOKENS where oneDNN runs it, else 0)."""
        self.model, cfg = model, model.cfg
        dtype, device = model.embed_tokens.weight.dtype, model.embed_tokens.weight.device
        self.mla = type(model.layers[0].self_attn) is MLAttention
        if not self.mla:
            self.rope_table = RopeTable(max_len, cfg.head_dim, cfg.rotary_dim, cfg.rope_theta, dtype, device)
        # Plans: each module's tensors pulled out once per generate call, so a step makes no module calls or
        # attribute walks (those were ~10% of a batch-1 step). They hold the parameters themselves, not copies
        # (except the CPU expert banks, see _expert_weights), so weights updated in place are seen.
        cache = {} if expert_cache is None else expert_cache
        dense = dense_max_tokens
        if dense is None:
            dense = DENSE_MAX_TOKENS if _onednn_ok(model.embed_tokens.weight) else 0
        rotate = None if self.mla else self.rope_table.rotate
        self.blocks = [_BlockPlan(b, cache, dense, rotate) for b in model.layers]
        self.mtp = [
            (
                _in_norms(m.enorm, m.hnorm),
                _Linear(cache, m.eh_proj),
                _BlockPlan(m.block, cache, dense, rotate),
                _norm(m.final_norm),
            )
            for m in model.mtp_by_depth()
        ]
        self.embed, self.norm, self.head = model.embed_tokens.weight, _norm(model.norm), _Linear(cache, model.lm_head)
        # The MTP steps' head reads the verify's oneDNN copy of the LM head even at one row: the verify (k + 1 rows,
        # oneDNN) has just pulled that copy into the cache, where MKL's (D, N) copy has been evicted by then
        self.mtp_head = _Linear(cache, model.lm_head, min_rows=1)
        self.draft_ids = draft_vocab
        if draft_vocab is not None:
            w = model.lm_head.weight
            n, D = len(draft_vocab), w.shape[1]
            key = ("draft_head", n)  # one module per size, refilled per call: the rows as they are now (RL)
            if key not in cache:
                cache[key] = torch.nn.Linear(D, n, bias=False, dtype=w.dtype, device=w.device)
            sub = cache[key]
            with torch.no_grad():
                sub.weight.copy_(w[draft_vocab.to(w.device)])
            self.mtp_head = _Linear(cache, sub, min_rows=1)

    def rope(self, position_ids_BT):
        """GQA: (cos, sin) (B, T, 1, Dh) for RopeTable.rotate. MLA: (cos, sin) (B, T, R) as GLM.forward gives its
        attention modules."""
        if self.mla:
            cfg = self.model.cfg
            return rope_cos_sin(position_ids_BT, cfg.rotary_dim, cfg.rope_theta, self.embed.dtype)
        return self.rope_table.at(position_ids_BT)

    def forward(self, input_ids_BT, position_ids_BT, cache, last_only: bool = False):
        """-> logits (B, T, V) (or (B, 1, V) with last_only), final-normed hidden (B, T, D)."""
        rope = self.rope(position_ids_BT)
        x_BTD = F.embedding(input_ids_BT, self.embed)
        for plan in self.blocks:
            x_BTD = plan(x_BTD, rope, cache)
        h_BTD = self.norm(x_BTD)
        return self.head(h_BTD[:, -1:] if last_only else h_BTD), h_BTD

    def mtp_step(self, layer: int, next_ids_BT, hidden_BTD, position_ids_BT, cache, last_B=None):
        """GLM.mtp_step on the fast blocks: -> (normed hidden (B, T, D), logits (B, T, V)).

        With last_B (B,): -> (hidden (B, D), logits (B, V)) at that position of each row only (an int: the same
        column of every row). Speculative catch-up feeds the confirmed positions but drafts from the last one: the
        others need only their K/V in the cache, so the query side, the MoE and the LM head run on one position
        (_BlockPlan.last_only)."""
        in_norms, eh_proj, block, final_norm = self.mtp[layer]
        x_BTD = eh_proj(in_norms(F.embedding(next_ids_BT, self.embed), hidden_BTD))
        if last_B is None or x_BTD.shape[1] == 1:  # one position: nothing to skip
            h_BTD = final_norm(block(x_BTD, self.rope(position_ids_BT), cache))
            h_BTD = h_BTD if last_B is None else h_BTD[:, 0]
            return h_BTD, self.mtp_head(h_BTD)
        h_BD = final_norm(block.last_only(x_BTD, last_B, self.rope(position_ids_BT), cache)[:, 0])
        return h_BD, self.mtp_head(h_BD)


def _norm(norm):
    """layers.RMSNorm as one fused call when that is exact (fp32); the module itself otherwise."""
    w, eps = norm.weight, norm.eps
    if w.dtype == torch.float32:
        return lambda x: F.rms_norm(x, w.shape, w, eps) if x.dtype == torch.float32 else norm(x)
    return norm


def _in_norms(enorm, hnorm):
    """(emb, h) -> cat([enorm(emb), hnorm(h)], -1), the MTP layer's input, as one weightless rms_norm over the pair
    times the (2, D) stack of the weights when that is exact (fp32, one eps: rms_norm(x, w) == rms_norm(x) * w bit
    for bit, as in _qk_norm); the two norms and a cat otherwise."""
    we, wh, eps = enorm.weight, hnorm.weight, enorm.eps
    e, h = _norm(enorm), _norm(hnorm)

    def apart(emb, hid):
        return torch.cat([e(emb), h(hid)], dim=-1)

    if we.dtype != torch.float32 or hnorm.eps != eps:
        return apart

    with torch.no_grad():  # rebuilt with the plan (once per generate call): always current
        w_2D = torch.stack([we, wh])

    def fused(emb, hid):
        if emb.dtype != torch.float32 or hid.dtype != torch.float32:
            return apart(emb, hid)
        return (F.rms_norm(torch.stack([emb, hid], dim=-2), we.shape, None, eps) * w_2D).flatten(-2)

    return fused


class _BlockPlan:
    """One decoder block (GQA attention, or an MLA module as it is, + dense MLP or MoE); __call__ = Block.forward.

    q, k and v are one GEMM (_Linear over the three weights), q-norm and k-norm one rms_norm over the H + G heads
    (times the (H + G, Dh) stack of their weights: rms_norm(x, w) == rms_norm(x) * w bit for bit) and RoPE one
    pass over them; the SwiGLU MLPs (dense and shared expert) one GEMM for gate and up."""

    def __init__(self, block, cache: dict, dense_max_tokens: int = 0, rotate=None):
        """rotate: RopeTable.rotate (GQA blocks)."""
        a = block.self_attn
        self.rotate = rotate
        self.ln1, self.ln2 = _norm(block.input_layernorm), _norm(block.post_attention_layernorm)
        self.mla = a if isinstance(a, MLAttention) else None  # MLA runs as its module (its absorbed decode)
        if self.mla is None:
            self.idx, self.H, self.G, self.Dh = a.layer_idx, a.n_heads, a.n_kv, a.head_dim
            self.qkv, self.wo = _Linear(cache, a.q_proj, a.k_proj, a.v_proj), _Linear(cache, a.o_proj)
            self.qkn = _qk_norm(a.q_norm, a.k_norm, self.H, self.G) if a.q_norm is not None else None
        mlp = block.mlp
        self.moe = mlp if isinstance(mlp, MoE) else None
        dense = mlp.shared_experts if self.moe is not None else mlp
        self.mlp = (_Linear(cache, dense.gate_proj, dense.up_proj), _Linear(cache, dense.down_proj)) if dense else None
        if self.moe is not None:
            self.w1, self.w2 = _expert_weights(mlp.experts, cache)
            self.dense_max = dense_max_tokens
            dense_ok = dense_max_tokens > HIT_LOOP_MAX_TOKENS and _bank_bytes(mlp.experts) <= EXPERT_COPY_MAX_BYTES
            self.dense = _dense_weights(mlp.experts, dense, cache) if dense_ok else None
            self.shared_F = dense.down_proj.weight.shape[1] if dense else 0
            packed_ok = _onednn_ok(mlp.experts.gate_up_proj) and _bank_bytes(mlp.experts) <= EXPERT_COPY_MAX_BYTES
            self.packed = _packed_experts(mlp.experts, cache) if packed_ok else None

    def __call__(self, x_BTD, rope, cache):
        x_BTD = x_BTD + self.attention(self.ln1(x_BTD), rope, cache)
        return x_BTD + self.ffn(self.ln2(x_BTD))

    def last_only(self, x_BTD, last_B, rope, cache):
        """__call__'s output at position last_B[b] of each row only -> (B, 1, D); K/V still go to the cache for
        all T positions (the caller rewinds what it does not keep). That output depends on the other positions
        only through their K/V, so it equals __call__(...)[b, last_B[b]]."""
        B, T, _ = x_BTD.shape
        if self.mla is not None:  # the whole block, then the wanted positions
            y_BTD = self(x_BTD, rope, cache)
            if isinstance(last_B, int):
                return y_BTD[:, last_B % T][:, None]
            return y_BTD[torch.arange(B, device=x_BTD.device), last_B][:, None]
        q_BTHK, k_BTGK, v_BTGK = self.project(self.ln1(x_BTD), rope)
        k_BGSK, v_BGSK = cache.update(self.idx, k_BTGK.transpose(1, 2), v_BTGK.transpose(1, 2))
        if isinstance(last_B, int) and last_B % T == T - 1:  # every row's last column: the cache's own one-query mask
            x_B1D, q_B1HK = x_BTD[:, -1:], q_BTHK[:, -1:]
            x_B1D = x_B1D + self.attend(q_B1HK, k_BGSK, v_BGSK, cache.attention_mask(self.idx, 1))
            return x_B1D + self.ffn(self.ln2(x_B1D))
        if isinstance(last_B, int):
            last_B = torch.full((B,), last_B % T, device=x_BTD.device)
        rows_B = torch.arange(B, device=x_BTD.device)
        x_B1D, q_B1HK = x_BTD[rows_B, last_B][:, None], q_BTHK[rows_B, last_B][:, None]
        # the query at cache index len - T + last_B sees the keys up to itself after the row's padding (a padding
        # query only itself), as KVCache.attention_mask
        q_pos_B1 = (cache.lengths(self.idx) - T + last_B)[:, None]
        k_pos_S = torch.arange(k_BGSK.shape[2], device=x_BTD.device)
        seen_BS = ((k_pos_S <= q_pos_B1) & (k_pos_S >= cache.start[:, None])) | (k_pos_S == q_pos_B1)
        x_B1D = x_B1D + self.attend(q_B1HK, k_BGSK, v_BGSK, seen_BS[:, None, None])
        return x_B1D + self.ffn(self.ln2(x_B1D))

    def ffn(self, h_BTD):
        if self.moe is None:
            return _swiglu(h_BTD, *self.mlp)
        B, T, D = h_BTD.shape
        if self.dense is not None and HIT_LOOP_MAX_TOKENS < B * T <= self.dense_max:  # shared expert folded in
            x_TD = h_BTD.reshape(B * T, D)
            idx_TK, w_TK = route(self.moe.gate, x_TD)
            return experts_dense(x_TD, idx_TK, w_TK, *self.dense, self.w1.shape[0], self.shared_F).view(B, T, D)
        y_BTD = moe_routed(self.moe.gate, h_BTD, self.w1, self.w2, self.packed)
        return y_BTD + _swiglu(h_BTD, *self.mlp) if self.mlp is not None else y_BTD

    def attention(self, x_BTD, rope, cache):
        if self.mla is not None:
            return self.mla(x_BTD, *rope, None, cache)
        q_BTHK, k_BTGK, v_BTGK = self.project(x_BTD, rope)
        k_BGSK, v_BGSK = cache.update(self.idx, k_BTGK.transpose(1, 2), v_BTGK.transpose(1, 2))
        return self.attend(q_BTHK, k_BGSK, v_BGSK, cache.attention_mask(self.idx, x_BTD.shape[1]))

    def project(self, x_BTD, rope):
        """-> q (B, T, H, Dh), k (B, T, G, Dh) normed and rotated, v (B, T, G, Dh): views of one GEMM's output."""
        B, T, _ = x_BTD.shape
        H, G = self.H, self.G
        qkv_BTNK = self.qkv(x_BTD).view(B, T, H + 2 * G, self.Dh)
        qk_BTNK = qkv_BTNK[:, :, : H + G]
        if self.qkn is not None:
            qk_BTNK = self.qkn(qk_BTNK)
        qk_BTNK = self.rotate(qk_BTNK, *rope)
        return qk_BTNK[:, :, :H], qk_BTNK[:, :, H:], qkv_BTNK[:, :, H + G :]

    def attend(self, q_BTHK, k_BGSK, v_BGSK, mask):
        """Attention of the (rotated) queries over the cached keys, then the output projection."""
        B, T, H, Dh = q_BTHK.shape
        o_BTHK = sdpa(q_BTHK.transpose(1, 2), k_BGSK, v_BGSK, mask).transpose(1, 2)
        return self.wo(o_BTHK.reshape(B, T, H * Dh))


def _qk_norm(q_norm, k_norm, H: int, G: int):
    """q_norm on the first H heads and k_norm on the last G of a (B, T, H + G, Dh) tensor, as one rms_norm."""
    wq, wk, eps = q_norm.weight, k_norm.weight, q_norm.eps

    def apart(x):
        return torch.cat([q_norm(x[:, :, :H]), k_norm(x[:, :, H:])], dim=2)

    if wq.dtype != torch.float32 or k_norm.eps != eps:
        return apart
    with torch.no_grad():  # H + G rows of Dh, rebuilt with the plan (once per generate call): always current
        w_NK = torch.cat([wq.expand(H, -1), wk.expand(G, -1)])
    return lambda x: F.rms_norm(x, wq.shape, None, eps) * w_NK if x.dtype == torch.float32 else apart(x)


class _Linear:
    """nn.Linear layers that read the same input as one GEMM: x -> cat([x W_1^T + b_1, x W_2^T + b_2, ...], -1).

    On CPU (copies up to LINEAR_COPY_MAX_BYTES) the weights are one contiguous (D, N) copy, x @ W_DN: MKL's small-row
    GEMMs read that layout faster than nn.Linear's (N, D), most of all when the weights come from DRAM as they do
    in a decode step (the LM head at 8 rows 447 -> 372 us, at 1 row 308 -> 162 us; bench/decode.py). Wide outputs
    (N >= ONEDNN_MIN_N: the LM head, a dense MLP's gate/up) on 2+ rows go to oneDNN on a weight prepacked for it
    (AVX-512 brgemm where MKL takes its AVX2 path on AMD: the head at 8 rows 284 -> 96 us hot, 510 -> 294 cold).
    The copies are kept in `cache` across calls and remade when a weight changes (_cached). Elsewhere: the layers'
    own weights, one F.linear each (no copy)."""

    def __init__(self, cache: dict, *layers, min_rows: int | None = None):
        """min_rows: take the oneDNN copy from this many rows (None: 2 for wide outputs, else ONEDNN_MIN_ROWS)."""
        ws, bs = [m.weight for m in layers], [m.bias for m in layers]
        self.parts, self.packed = list(zip(ws, bs)), None
        nbytes = sum(w.numel() for w in ws) * ws[0].element_size()
        same_bias = all((b is None) == (bs[0] is None) for b in bs)
        if ws[0].device.type != "cpu" or nbytes > LINEAR_COPY_MAX_BYTES or not same_bias:
            return
        tensors, ids = ws + [b for b in bs if b is not None], tuple(map(id, ws))
        self.w_DN, self.b_N = _cached(cache, ("linear", *ids), tensors, lambda: _fuse(ws, bs))
        self.parts = None
        if _onednn_ok(self.w_DN):
            pack = torch.ops.mkldnn._reorder_linear_weight
            self.packed = _cached(cache, ("onednn", *ids), tensors, lambda: pack(self.w_DN.t().contiguous(), 8))
            self.min_rows = 2 if self.w_DN.shape[1] >= ONEDNN_MIN_N else ONEDNN_MIN_ROWS
            self.min_rows = self.min_rows if min_rows is None else min_rows

    def __call__(self, x):
        if self.parts is not None:
            ys = [F.linear(x, w, b) for w, b in self.parts]
            return ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        if self.packed is not None and x.numel() >= self.min_rows * x.shape[-1]:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.b_N, "none", [], "")
        if self.b_N is None:
            return torch.matmul(x, self.w_DN)
        return torch.addmm(self.b_N, x.reshape(-1, x.shape[-1]), self.w_DN).view(*x.shape[:-1], -1)


def _onednn_ok(w) -> bool:
    """oneDNN's prepacked linear (the ops inductor's CPU freezing uses) exists in this build, for this dtype."""
    return (
        w.device.type == "cpu"
        and w.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _fuse(ws, bs):
    b_N = None if bs[0] is None else torch.cat(bs)
    return torch.cat(ws).t().contiguous(), b_N


def _cached(cache: dict, name, tensors, build):
    """build() kept in `cache` under `name` and remade when one of `tensors` changes: in place (its version counter
    moves, as under optimizer.step or load_state_dict) or replaced (another data pointer)."""
    # inference tensors (a model built or loaded under torch.inference_mode) have no version counter: only a
    # replaced tensor is seen for them
    key = tuple((t.data_ptr(), -1 if t.is_inference() else t._version) for t in tensors)
    hit = cache.get(name)
    if hit is None or hit[0] != key:
        with torch.no_grad():
            hit = cache[name] = (key, build())
    return hit[1]


def _swiglu(x, gate_up, down):
    gate, up = gate_up(x).chunk(2, dim=-1)
    return down(F.silu(gate) * up)


def _expert_weights(experts, cache: dict):
    """The banks as (E, D, 2F) and (E, F, D) for x @ w[e]. On CPU, for banks up to 256 MiB, contiguous copies
    (the grouped GEMM runs ~25% faster on them than on the transposed views, bench/decode.py), kept in `cache`
    (_cached). Elsewhere the views, which cost nothing."""
    p1, p2 = experts.gate_up_proj, experts.down_proj
    w1_EDF, w2_EFD = p1.transpose(1, 2), p2.transpose(1, 2)
    if w1_EDF.device.type != "cpu" or _bank_bytes(experts) > EXPERT_COPY_MAX_BYTES:
        return w1_EDF, w2_EFD
    return _cached(cache, id(experts), (p1, p2), lambda: (w1_EDF.contiguous(), w2_EFD.contiguous()))


def _packed_experts(experts, cache: dict):
    """Each expert's gate_up (2F, D) and down (D, F) prepacked for oneDNN (experts_packed), kept in `cache`."""
    p1, p2 = experts.gate_up_proj, experts.down_proj
    pack = torch.ops.mkldnn._reorder_linear_weight

    def build():
        return [pack(w, 64) for w in p1.unbind()], [pack(w, 64) for w in p2.unbind()]

    return _cached(cache, ("packed", id(experts)), (p1, p2), build)


def _bank_bytes(experts) -> int:
    p1, p2 = experts.gate_up_proj, experts.down_proj
    return (p1.numel() + p2.numel()) * p1.element_size()


def _dense_weights(experts, shared, cache: dict):
    """For experts_dense: gate_up as (E * 2F + 2Fs, D) and down as (D, E * F + Fs) F.linear weights, the shared
    expert's (gate, up; down) appended when there is one (`shared`: its MLP), kept in `cache` (_cached); where oneDNN
    runs, both prepacked for it."""
    p1, p2 = experts.gate_up_proj, experts.down_proj
    E, D, F_ = p2.shape
    extra = (shared.gate_proj.weight, shared.up_proj.weight, shared.down_proj.weight) if shared else ()

    def build():
        w1_ND = torch.cat([p1.reshape(-1, D), *extra[:2]])
        w2_DN = torch.cat([p2.permute(1, 0, 2).reshape(D, E * F_), *extra[2:]], dim=1)
        if not _onednn_ok(p1):
            return w1_ND, w2_DN
        pack = torch.ops.mkldnn._reorder_linear_weight
        return pack(w1_ND, 8), pack(w2_DN, 8)

    return _cached(cache, ("dense", id(experts)), (p1, p2, *extra), build)


def experts_dense(x_TD, idx_TK, w_TK, w1_ND, w2_DN, n_experts: int, shared_F: int = 0):
    """ALL experts on all tokens (w1 gate_up as (E * 2F, D), w2 down as (D, E * F): F.linear weights, or prepacked
    for oneDNN): one GEMM for gate+up, the SwiGLU weighted by the routing weights (0 where a token did not choose
    the expert), one GEMM for down — the sum over experts of w_e * down_e(h_e) is one (T, E*F) @ (E*F, D) product.
    3 kernels per layer instead of ~3E and no sort; the same weight bytes when most experts are hit, but E/K times
    the expert FLOPs. shared_F > 0: a shared expert of that width is appended to both (its gate and up rows after
    the experts' in w1, its down columns in w2) and rides in the same two GEMMs with weight 1."""
    T, E = x_TD.shape[0], n_experts
    gu_TN = _linear(x_TD, w1_ND)
    n = gu_TN.shape[1] - 2 * shared_F
    gu_TE2F = gu_TN[:, :n].view(T, E, 2, -1)
    wd_TE = torch.zeros(T, E, dtype=x_TD.dtype, device=x_TD.device).scatter_(1, idx_TK, w_TK.to(x_TD.dtype))
    h_TN = (F.silu(gu_TE2F[:, :, 0]) * gu_TE2F[:, :, 1] * wd_TE[:, :, None]).view(T, -1)
    if shared_F:
        gate_TF, up_TF = gu_TN[:, n:].chunk(2, dim=-1)
        h_TN = torch.cat([h_TN, F.silu(gate_TF) * up_TF], dim=-1)
    return _linear(h_TN, w2_DN)


def _linear(x, w):
    """F.linear, or oneDNN's linear when w is prepacked for it (_reorder_linear_weight)."""
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return F.linear(x, w)


def moe_routed(router, x_BTD, w1, w2, packed=None):
    """The routed experts (w1 (E, D, 2F), w2 (E, F, D): the x @ w[e] layout); the caller adds the shared one.
    (_BlockPlan.ffn takes experts_dense itself for HIT_LOOP_MAX_TOKENS < T <= dense_max.) packed: per-expert
    oneDNN weights (_packed_experts), used from ONEDNN_MIN_ROWS tokens; else the model's own grouped experts."""
    B, T, D = x_BTD.shape
    x_TD = x_BTD.reshape(B * T, D)
    idx_TK, w_TK = route(router, x_TD)
    N = x_TD.shape[0]
    if N == 1:
        y_TD = experts_one_token(x_TD, idx_TK, w_TK, w1, w2)
    elif packed is not None and N >= ONEDNN_MIN_ROWS:
        y_TD = experts_packed(x_TD, idx_TK, w_TK, *packed)
    else:  # moe.py's kernels, on the (E, 2F, D) / (E, D, F) views of the copies (MKL reads their x @ w[e] layout)
        y_TD = experts_grouped(x_TD, idx_TK, w_TK, w1.transpose(1, 2), w2.transpose(1, 2))
    return y_TD.view(B, T, D)


def route(router, x_TD):
    """The model's router (moe.Router.forward, called directly: no module-call overhead) -> (ids, gates) (T, K)."""
    _, idx_TK, w_TK = router.forward(x_TD)
    return idx_TK, w_TK


def experts_one_token(x_1D, idx_1K, w_1K, w1_EDF, w2_EFD):
    """Decode at batch 1: the K chosen experts straight from the host list, mixed by one (1, K) @ (K, D)."""
    outs = []
    for e in idx_1K[0].tolist():
        gate_1F, up_1F = torch.matmul(x_1D, w1_EDF[e]).chunk(2, dim=-1)
        outs.append(torch.matmul(F.silu(gate_1F) * up_1F, w2_EFD[e]))
    return torch.matmul(w_1K.to(x_1D.dtype), torch.cat(outs))


def experts_packed(x_TD, idx_TK, w_TK, w1_E, w2_E):
    """moe.experts_sorted with one oneDNN GEMM pair per hit expert on per-expert prepacked weights (w1_E[e] gate_up
    (2F, D), w2_E[e] down (D, F)): ~2x MKL's grouped GEMM at the 16+ rows per expert of a prefill."""
    K = idx_TK.shape[1]
    flat_N, order_N = idx_TK.reshape(-1).sort(stable=True)
    counts = torch.bincount(flat_N, minlength=len(w1_E)).tolist()  # host sync: free on CPU
    tok_N = order_N // K
    x_ND, wk_N1 = x_TD[tok_N], w_TK.reshape(-1)[order_N, None].to(x_TD.dtype)
    outs, s = [], 0
    for e, c in enumerate(counts):
        if c:
            gate_cF, up_cF = _linear(x_ND[s : s + c], w1_E[e]).chunk(2, dim=-1)
            outs.append(_linear(F.silu(gate_cF) * up_cF * wk_N1[s : s + c], w2_E[e]))
        s += c
    return torch.zeros_like(x_TD).index_add_(0, tok_N, torch.cat(outs))


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
