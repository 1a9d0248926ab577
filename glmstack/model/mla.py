"""Multi-head Latent Attention (MLA), the attention of GLM-5 (and DeepSeek-V2/V3, GLM-4.7-Flash).

What: queries go through a low-rank latent (`q_a_proj` -> RMSNorm -> `q_b_proj`); keys and values are compressed
into one latent c_kv of `kv_lora_rank` dims plus a single decoupled RoPE key k_r shared by all heads
(`kv_a_proj_with_mqa`), and decompressed per head by `kv_b_proj`. Only [c_kv ; k_r] (512 + 64 dims for GLM-5) is
cached, so a token costs 576 elements per layer instead of 2048 for GLM-4.5's GQA-8 (8 heads x 128 x k, v).

Why two paths (DeepSeek-V2, arXiv 2405.04434 §2.1; DeepSeek-V3.2 App. A):
  * plain ("MHA mode", the reference, used for training and prefill): decompress K and V for every head;
  * absorbed ("MQA mode", the fast decode path): fold W_UK into the query and W_UV into the output, so attention
    runs directly over the cached latent as MQA with one 576-dim key and one 512-dim value shared by all heads;
    with DSA, decoding attends only to the gathered top-k latents (`attend_sparse`).
  `MLAttention.absorb` / `sparse_gather` / `sdpa` switch the fast paths off; tests/unit/test_mla.py proves each
  equals its reference (forward and backward).

GLM-4.7-Flash (`glm4_moe_lite`) is this MLA alone. GLM-5 adds DSA sparse attention: an optional
`glmstack.model.dsa.Indexer` picks, per query, the top-k keys the attention may look at (see dsa.py for the
indexer, its training stages and IndexShare). Without a query latent (`q_lora_rank` None, which HF's
`Glm4MoeLiteAttention` allows) the query is one `q_proj`, as in DeepSeek-V2-Lite.

Names are Hugging Face's (`Glm4MoeLiteAttention`, `GlmMoeDsaAttention`), so the checkpoint adapter is a flat
map; RoPE is interleaved (pairs (2i, 2i+1)) as in GLM-4.7-Flash and GLM-5, with the HF output layout
[rotated evens | rotated odds] (a permutation applied to both q and k, so every dot product is that of the textbook
interleaved RoPE).

Shape legend: B batch, T new tokens (queries), S all keys (cached + new), H heads, D hidden, Q q_lora_rank,
C kv_lora_rank (latent), N qk_nope_head_dim, R qk_rope_head_dim, V v_head_dim, K top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model.attention import causal_mask
from glmstack.model.dsa import Indexer, is_full_indexer_layer, sparse_mask
from glmstack.model.gemm import Linear
from glmstack.model.layers import RMSNorm
from glmstack.model.rope import apply_rope

# ---------------------------------------------------------------------------------------------------- attention


def eager_attention(q_BHTd, k_BHSd, v_BHSv, mask_B1TS, scale: float) -> torch.Tensor:
    """softmax(q kᵀ · scale, masked) v in at least fp32, masked logits at finfo.min (HF eager) -> (B, H, T, v)."""
    acc = torch.promote_types(q_BHTd.dtype, torch.float32)
    logits_BHTS = torch.matmul(q_BHTd.to(acc), k_BHSd.to(acc).transpose(-1, -2)) * scale
    logits_BHTS = logits_BHTS.masked_fill(~mask_B1TS, torch.finfo(acc).min)
    probs_BHTS = logits_BHTS.softmax(-1)
    return torch.matmul(probs_BHTS, v_BHSv.to(acc)).to(q_BHTd.dtype)


# ---------------------------------------------------------------------------------------------------- MLA


class MLAttention(nn.Module):
    """MLA with an optional DSA indexer; `forward(x, cos, sin, mask=None, cache=None)` like `Attention`.

    cos/sin: (B, T, R) as `glmstack.model.rope.rope_cos_sin(position_ids, qk_rope_head_dim, theta, dtype)` gives
    them (both halves equal; the first half holds one angle per rotated pair).

    cfg: any object with the HF `glm_moe_dsa` / `glm4_moe_lite` field names (ModelConfig, or transformers' configs).
    `use_indexer` adds DSA (default: ModelConfig.has_dsa, else when cfg has `index_topk`); `indexer_types` decides
    IndexShare (dsa.py).
    """

    def __init__(self, cfg, layer_idx: int, use_indexer: bool | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads = cfg.num_attention_heads
        self.q_lora_rank, self.kv_lora_rank = cfg.q_lora_rank, cfg.kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.qk_dim = self.nope_dim + self.rope_dim
        self.scale = self.qk_dim**-0.5  # GLM-5 uses default RoPE: no YaRN mscale
        self.interleave = bool(getattr(cfg, "rope_interleave", True))
        self.absorb = True  # decode with a cache uses the absorbed (MQA) path; False forces the plain reference
        self.sparse_gather = True  # absorbed + DSA: attend over gathered top-k latents; False: the top-k as a mask
        self.sdpa = True  # plain path without a cache uses F.scaled_dot_product_attention; False: eager reference
        bias = bool(getattr(cfg, "attention_bias", False))
        D, H = cfg.hidden_size, self.n_heads
        if self.q_lora_rank is None:  # no query latent: one full-rank projection, never biased (as HF)
            self.q_proj = Linear(D, H * self.qk_dim, bias=False)
        else:
            self.q_a_proj = Linear(D, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, 1e-6)  # eps 1e-6, not rms_norm_eps (as HF)
            self.q_b_proj = Linear(self.q_lora_rank, H * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(D, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, 1e-6)
        self.kv_b_proj = Linear(self.kv_lora_rank, H * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = Linear(H * self.v_dim, D, bias=bias)
        if use_indexer is None:
            use_indexer = getattr(cfg, "has_dsa", getattr(cfg, "index_topk", None) is not None)
        if use_indexer and self.q_lora_rank is None:
            raise ValueError("the DSA indexer reads the query latent: it needs q_lora_rank")
        self.dsa = use_indexer
        full = is_full_indexer_layer(cfg, layer_idx)
        self.indexer = Indexer(cfg) if use_indexer and full else None
        self.topk_share: dict | None = None  # IndexShare: a dict shared by the model's layers (see dsa.py)

    # ------------------------------------------------------------------ projections

    def project(self, x_BTD, cos_BTR, sin_BTR):
        """Queries (nope, rope) per head, the new latent c_kv and rope key, and q_resid for the indexer (None
        without a query latent)."""
        B, T, _ = x_BTD.shape
        cos_BTr, sin_BTr = cos_BTR[..., : self.rope_dim // 2], sin_BTR[..., : self.rope_dim // 2]
        if self.q_lora_rank is None:
            q_resid_BTQ, q_BTX = None, self.q_proj(x_BTD)
        else:
            q_resid_BTQ = self.q_a_layernorm(self.q_a_proj(x_BTD))
            q_BTX = self.q_b_proj(q_resid_BTQ)
        q_BHTd = q_BTX.view(B, T, self.n_heads, self.qk_dim).transpose(1, 2)
        q_nope_BHTN, q_rope_BHTR = q_BHTd.split([self.nope_dim, self.rope_dim], dim=-1)
        q_rope_BHTR = apply_rope(q_rope_BHTR, cos_BTr[:, None], sin_BTr[:, None], self.interleave)
        ckv_BTc, k_rope_BTR = self.kv_a_proj_with_mqa(x_BTD).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        ckv_B1TC = self.kv_a_layernorm(ckv_BTc)[:, None]
        k_rope_B1TR = apply_rope(k_rope_BTR, cos_BTr, sin_BTr, self.interleave)[:, None]
        return q_nope_BHTN, q_rope_BHTR, ckv_B1TC, k_rope_B1TR, q_resid_BTQ, (cos_BTr, sin_BTr)

    def w_uk_uv(self, dtype: torch.dtype | None = None):
        """kv_b_proj split per head: W_UK (H, N, C) and W_UV (H, V, C); a quantized kv_b_proj (INT4 / FP8,
        inference/quant.py) dequantized to `dtype` (the activations')."""
        kv_b = self.kv_b_proj
        w = kv_b.dequantize(dtype or torch.float32) if hasattr(kv_b, "dequantize") else kv_b.weight
        w_HXC = w.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        return w_HXC.split([self.nope_dim, self.v_dim], dim=1)

    # ------------------------------------------------------------------ attention: plain (reference), absorbed, sparse

    def attend_plain(self, q_nope_BHTN, q_rope_BHTR, ckv_B1SC, k_rope_B1SR, mask_B1TS, sdpa: bool = False):
        """MHA mode: decompress every head's key and value from the latent.

        sdpa=False is the reference (eager softmax in fp32, as HF eager); sdpa=True runs
        F.scaled_dot_product_attention (flash / memory-efficient kernels, no (B, H, T, S) logits kept for backward).
        SDPA turns a row with no allowed key into NaN, so it is only used without a cache (training, prefill),
        where every query sees at least itself.
        """
        B, _, S, _ = ckv_B1SC.shape
        kv_BSHX = self.kv_b_proj(ckv_B1SC[:, 0]).view(B, S, self.n_heads, self.nope_dim + self.v_dim)
        k_nope_BHSN, v_BHSV = kv_BSHX.transpose(1, 2).split([self.nope_dim, self.v_dim], dim=-1)
        k_BHSd = torch.cat([k_nope_BHSN, k_rope_B1SR.expand(-1, self.n_heads, -1, -1)], dim=-1)
        q_BHTd = torch.cat([q_nope_BHTN, q_rope_BHTR], dim=-1)
        if sdpa:
            return F.scaled_dot_product_attention(q_BHTd, k_BHSd, v_BHSV, attn_mask=mask_B1TS, scale=self.scale)
        return eager_attention(q_BHTd, k_BHSd, v_BHSV, mask_B1TS, self.scale)

    def attend_absorbed(self, q_nope_BHTN, q_rope_BHTR, ckv_B1SC, k_rope_B1SR, mask_B1TS):
        """MQA mode: qᵀk = (W_UKᵀ q_nope)ᵀ c_kv + q_ropeᵀ k_rope; o = W_UV (Σ p c_kv). Equal to attend_plain."""
        w_uk_HNC, w_uv_HVC = self.w_uk_uv(q_nope_BHTN.dtype)
        q_lat_BHTC = torch.einsum("bhtn,hnc->bhtc", q_nope_BHTN, w_uk_HNC)
        q_BHTd = torch.cat([q_lat_BHTC, q_rope_BHTR], dim=-1)
        k_B1Sd = torch.cat([ckv_B1SC, k_rope_B1SR], dim=-1)
        o_lat_BHTC = eager_attention(q_BHTd, k_B1Sd, ckv_B1SC, mask_B1TS, self.scale)
        return torch.einsum("bhtc,hvc->bhtv", o_lat_BHTC, w_uv_HVC)

    def attend_sparse(self, q_nope_BHTN, q_rope_BHTR, ckv_B1SC, k_rope_B1SR, topk_BTK, mask_B1TS):
        """DSA in MQA mode over the K selected latents only (gathered per query), O(T·K) instead of O(T·S).

        Equal to attend_absorbed under sparse_mask(topk, mask) for every row with an allowed key.
        """
        w_uk_HNC, w_uv_HVC = self.w_uk_uv(q_nope_BHTN.dtype)
        q_lat_BHTC = torch.einsum("bhtn,hnc->bhtc", q_nope_BHTN, w_uk_HNC)
        acc = torch.promote_types(q_lat_BHTC.dtype, torch.float32)
        q_BTHd = torch.cat([q_lat_BHTC, q_rope_BHTR], dim=-1).transpose(1, 2).to(acc)
        kv_BSd = torch.cat([ckv_B1SC, k_rope_B1SR], dim=-1)[:, 0].to(acc)
        B, T, K = topk_BTK.shape
        idx_BTK = topk_BTK.long()
        kv_BTKd = kv_BSd.gather(1, idx_BTK.reshape(B, T * K, 1).expand(-1, -1, kv_BSd.shape[-1])).view(B, T, K, -1)
        keep_BTK = mask_B1TS[:, 0].expand(B, T, -1).gather(-1, idx_BTK)  # top-k may name masked (future) keys
        logits_BTHK = torch.matmul(q_BTHd, kv_BTKd.transpose(-1, -2)) * self.scale
        probs_BTHK = logits_BTHK.masked_fill(~keep_BTK[:, :, None], torch.finfo(acc).min).softmax(-1)
        o_lat_BTHC = torch.matmul(probs_BTHK, kv_BTKd[..., : self.kv_lora_rank]).to(q_lat_BHTC.dtype)
        return torch.einsum("bthc,hvc->bhtv", o_lat_BTHC, w_uv_HVC)

    # ------------------------------------------------------------------ forward

    def forward(self, x_BTD, cos_BTR, sin_BTR, mask_B1TS=None, cache=None):
        """x (B, T, D) -> (B, T, D). mask: bool (B, 1, T, S), True = attend (None: causal, aligned to the end)."""
        B, T, _ = x_BTD.shape
        q_nope, q_rope, ckv_B1TC, k_rope_B1TR, q_resid_BTQ, cos_sin = self.project(x_BTD, cos_BTR, sin_BTR)
        idx_k_B1TE = self.indexer.keys(x_BTD, cos_sin)[:, None] if self.indexer is not None else None
        ckv_B1SC, k_rope_B1SR, idx_k_B1SE = self._cache_update(cache, ckv_B1TC, k_rope_B1TR, idx_k_B1TE)
        S = ckv_B1SC.shape[2]
        if cache is not None:
            cache_mask = cache.attention_mask(self.layer_idx, T)
            mask_B1TS = cache_mask if cache_mask is not None else mask_B1TS
        if mask_B1TS is None:
            mask_B1TS = causal_mask(T, S, x_BTD.device)
        main_qk = (q_nope, q_rope, ckv_B1SC, k_rope_B1SR)
        topk_BTK = self._dsa_topk(x_BTD, q_resid_BTQ, cos_sin, idx_k_B1SE, mask_B1TS, main_qk)
        use_absorbed = self.absorb and cache is not None
        if topk_BTK is not None and use_absorbed and self.sparse_gather and topk_BTK.shape[-1] < S:
            o_BHTV = self.attend_sparse(*main_qk, topk_BTK, mask_B1TS)
        else:
            attn_mask_B1TS = mask_B1TS if topk_BTK is None else sparse_mask(topk_BTK, mask_B1TS)
            if use_absorbed:
                o_BHTV = self.attend_absorbed(*main_qk, attn_mask_B1TS)
            else:
                o_BHTV = self.attend_plain(*main_qk, attn_mask_B1TS, sdpa=self.sdpa and cache is None)
        return self.o_proj(o_BHTV.transpose(1, 2).reshape(B, T, -1))

    def _cache_update(self, cache, ckv_B1TC, k_rope_B1TR, idx_k_B1TE):
        """The cache holds the latent as `k` and [rope key ; indexer key] as `v` (one update call per layer)."""
        if cache is None:
            return ckv_B1TC, k_rope_B1TR, idx_k_B1TE
        extra = k_rope_B1TR if idx_k_B1TE is None else torch.cat([k_rope_B1TR, idx_k_B1TE.to(k_rope_B1TR.dtype)], -1)
        ckv_B1SC, extra_B1Sx = cache.update(self.layer_idx, ckv_B1TC, extra)
        k_rope_B1SR = extra_B1Sx[..., : self.rope_dim]
        idx_k_B1SE = extra_B1Sx[..., self.rope_dim :] if idx_k_B1TE is not None else None
        return ckv_B1SC, k_rope_B1SR, idx_k_B1SE

    def _dsa_topk(self, x_BTD, q_resid_BTQ, cos_sin, idx_k_B1SE, mask_B1TS, main_qk):
        """Top-k key indices (B, T, K) from this layer's indexer or the shared one; None = dense attention."""
        if not self.dsa:
            return None
        if self.indexer is not None:
            topk_BTK = self.indexer(x_BTD, q_resid_BTQ, cos_sin, idx_k_B1SE[:, 0], mask_B1TS, self._teacher(main_qk))
            if self.topk_share is not None:
                self.topk_share["topk"] = topk_BTK
        else:
            if self.topk_share is None or "topk" not in self.topk_share:
                raise ValueError(f"layer {self.layer_idx} shares top-k indices but no full layer ran before it")
            topk_BTK = self.topk_share["topk"]
        return topk_BTK  # None in dense stages

    def _teacher(self, main_qk):
        """A closure giving the main attention's per-head probabilities (detached) for the indexer loss."""

        def probs(mask_B1TS):
            q_nope, q_rope, ckv_B1SC, k_rope_B1SR = (t.detach() for t in main_qk)
            with torch.no_grad():
                w_uk_HNC, _ = self.w_uk_uv(q_nope.dtype)
                q_lat_BHTC = torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk_HNC.detach())
                logits_BHTS = (
                    torch.matmul(q_lat_BHTC.float(), ckv_B1SC.float().transpose(-1, -2))
                    + torch.matmul(q_rope.float(), k_rope_B1SR.float().transpose(-1, -2))
                ) * self.scale
                return logits_BHTS.masked_fill(~mask_B1TS, float("-inf")).softmax(-1).nan_to_num(0.0)

        return probs

    def muon_blocks(self) -> dict[str, tuple]:
        """Muon blocks (glmstack.optim: one per matrix the papers name): [W^DKV; W^KR] of kv_a_proj_with_mqa apart,
        and GLM-5's Muon Split (arXiv 2602.15763 §2.1) of the up-projections per head: [W^UQ; W^QR] of q_b_proj and
        [W^UK; W^UV] of kv_b_proj, so heads update at their own scale. OptimConfig.muon_split overrides (0 = off)."""
        q_up = "q_proj.weight" if self.q_lora_rank is None else "q_b_proj.weight"
        return {
            q_up: (self.n_heads, (self.nope_dim, self.rope_dim)),
            "kv_b_proj.weight": (self.n_heads, (self.nope_dim, self.v_dim)),
            "kv_a_proj_with_mqa.weight": (1, (self.kv_lora_rank, self.rope_dim)),
        }

    def cache_dims(self) -> tuple[int, int]:
        """(k, v) widths this layer stores through `cache.update` with H_kv = 1: latent, [rope key ; indexer key]."""
        return self.kv_lora_rank, self.rope_dim + (self.indexer.head_dim if self.indexer is not None else 0)
