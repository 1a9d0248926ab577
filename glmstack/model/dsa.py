"""DeepSeek Sparse Attention (DSA): the lightning indexer, top-k selection and IndexShare, as in GLM-5.

What: a small multi-head scorer (`index_n_heads` x `index_head_dim`, one key shared by its heads) rates every
earlier token s for query t,  I[t,s] = Σ_j w[t,j] · ReLU(q[t,j]·k[s] / sqrt(E)),  and the main MLA attends only
to the `index_topk` best (DeepSeek-V3.2 Eq. 1–2). Names and maths follow transformers'
`GlmMoeDsaIndexer` (interleaved RoPE on the first `qk_rope_head_dim` dims, LayerNorm'd key, no Hadamard/FP8).

Why a training mode (HF's indexer is `@torch.no_grad` and cannot learn; DeepSeek-V3.2 §2.1.1):
  * "dense"   dense MLA, indexer unused (pre-/mid-training before DSA, as GLM-5 starts from a dense checkpoint);
  * "warmup"  dense warm-up: attention stays dense, the indexer learns KL(p ‖ softmax(I)) where p is the main
              attention summed over heads and L1-normalised; the recipe freezes everything else.
  * "sparse"  sparse adaptation: top-k selection on, the same KL restricted to the selected keys, and the
              indexer's inputs detached so it learns only from its KL and the model only from the LM loss.
  * "select"  (default, also inference and GLM-5 RL) selection without any indexer loss; stage "frozen"
              (`freeze_indexers`) also turns its gradients off, as GLM-5 does in RL.
ModelConfig.dsa_stage names the stage; GLM applies it at construction (`apply_dsa_stage`).
The KL joins the model's loss through `add_indexer_losses` as coeff·(KL − KL.detach()): its value adds 0 (the
indexer's `last_loss` holds it for logging) and its gradient is scaled by whatever scales the loss in backward,
like every other loss term (gradient accumulation's weights; Megatron's indexer-loss auto-scaler multiplies by the
main loss's backward scale for the same reason). Selection is deterministic torch.topk (GLM-5 found a
non-deterministic top-k collapsed RL); `stable_ties` (default) also makes exact ties independent of shapes
(select_topk), so batched, padded and single-request decoding choose the same keys.

IndexShare (IndexCache, arXiv 2603.12201; GLM-5.2): "full" layers run their indexer and publish top-k, "shared"
layers reuse the last full layer's choice (`indexer_types` from the config, HF rule in `is_full_indexer_layer`).

Shape legend: B batch, T queries, S keys, I indexer heads, E indexer head dim, R rope dims, K top-k, Q q_lora_rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model.gemm import Linear
from glmstack.model.indexer_loss import indexer_kl, topk_recall
from glmstack.model.rope import apply_rope

MODES = ("dense", "select", "warmup", "sparse")
# training stage -> indexer mode; `frozen` and `warmup` also change which parameters train (apply_dsa_stage)
STAGES = {"dense": "dense", "warmup": "warmup", "sparse": "sparse", "select": "select", "frozen": "select"}


def is_full_indexer_layer(cfg, layer_idx: int) -> bool:
    """True when layer `layer_idx` runs its own indexer; layers beyond the list (MTP) are full."""
    types = getattr(cfg, "indexer_types", None)
    if not types or layer_idx >= len(types):
        return True
    return types[layer_idx] == "full"


def indexer_types_from_pattern(n_layers: int, freq: int = 1, offset: int = 2, pattern: str | None = None) -> list:
    """HF `GlmMoeDsaConfig` rule: an "F"/"S" pattern, else layer i is full iff max(i - offset + 1, 0) % freq == 0."""
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern]
    freq = max(freq, 1)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n_layers)]


def index_scores(q_BTIE: torch.Tensor, k_BSE: torch.Tensor, w_BTI: torch.Tensor, scale: float) -> torch.Tensor:
    """I[b,t,s] = Σ_i w[b,t,i] ReLU(q[b,t,i]·k[b,s] · scale), in >= fp32 -> (B, T, S). Same op order as HF."""
    acc = torch.promote_types(q_BTIE.dtype, torch.float32)
    scores_BTIS = F.relu(torch.matmul(q_BTIE.to(acc), k_BSE.transpose(-1, -2).to(acc).unsqueeze(1)) * scale)
    return torch.matmul(w_BTI.to(acc).unsqueeze(-2), scores_BTIS).squeeze(-2)


def select_topk(scores_BTS: torch.Tensor, mask_B1TS: torch.Tensor, k: int, stable: bool = True) -> torch.Tensor:
    """Indices (B, T, min(k, S)) of the best allowed keys, best first; masked keys score -inf.

    Both orders are deterministic run to run. stable=True (default) breaks EXACT ties (ReLU makes 0 common in tiny
    random models) in favour of the earliest key, so the choice does not depend on the key axis's length or offset:
    a left-padded row of a batch, a continuous-batching cache and a full-sequence training forward pick the same keys
    as the row decoded alone (batched == single-request generation). stable=False is plain torch.topk, what
    transformers uses (exact checkpoint parity); its order among ties depends on the row length.
    """
    scores_BTS = scores_BTS.masked_fill(~mask_B1TS, float("-inf"))
    k = min(k, scores_BTS.shape[-1])
    if not stable:
        return scores_BTS.topk(k, dim=-1).indices
    if scores_BTS.dtype == torch.float64:  # no room for the key index beside 64-bit scores: sort (O(S log S))
        return scores_BTS.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return tie_ordered_keys(scores_BTS).topk(k, dim=-1).indices


def tie_ordered_keys(scores_BTS: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered like (score, -key index): all distinct, so one topk gives the stable-sort order in O(S).

    The fp32 score's bits become an order-preserving int32 (negative floats: flip the magnitude bits; -0.0 is folded
    into +0.0 first), shifted up 32 bits; the low 32 bits rank earlier keys higher.
    """
    bits_BTS = (scores_BTS.float() + 0.0).view(torch.int32)  # + 0.0: -0.0 -> +0.0 (they tie as floats)
    ordered_BTS = torch.where(bits_BTS < 0, bits_BTS ^ 0x7FFFFFFF, bits_BTS).long()
    index_S = torch.arange(scores_BTS.shape[-1], device=scores_BTS.device)
    return ordered_BTS * 2**32 + (2**32 - 1 - index_S)


def sparse_mask(topk_BTK: torch.Tensor, mask_B1TS: torch.Tensor) -> torch.Tensor:
    """mask ∧ selected: top-k may name masked (future) keys when fewer than k are allowed; they stay masked."""
    B, T, _ = topk_BTK.shape
    S = mask_B1TS.shape[-1]
    selected_BTS = torch.zeros(B, T, S, dtype=torch.bool, device=topk_BTK.device).scatter(-1, topk_BTK.long(), True)
    return mask_B1TS & selected_BTS[:, None]


class Indexer(nn.Module):
    """The lightning indexer of one layer; `mode` selects the training stage (see module docstring)."""

    def __init__(self, cfg):
        super().__init__()
        D = cfg.hidden_size
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.rope_dim, self.topk = cfg.qk_rope_head_dim, cfg.index_topk
        self.interleave = bool(getattr(cfg, "indexer_rope_interleave", True))
        self.wq_b = Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = Linear(D, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = Linear(D, self.n_heads, bias=False)
        self.weights_proj.keep_fp32 = True  # HF keeps it fp32 (`_keep_in_fp32_modules`); GLM.cast respects this
        self.scale = self.head_dim**-0.5
        self.mode = "select"
        # select_topk: ties go to the earliest key, independent of the row's length (batched == alone); False is
        # torch.topk's order, as transformers (HF parity tests)
        self.stable_ties = True
        self.loss_coeff = 1.0  # gradient weight of the KL (MCORE dsa_indexer_loss_coeff)
        self.pending_loss: torch.Tensor | None = None
        self.last_loss: torch.Tensor | None = None  # detached, for logging
        self.recall_k = 0  # > 0: each forward measures top-k recall of the main attention (measure_recall)
        self.last_recall: float | None = None

    def _rope(self, x, cos_sin, unsqueeze: bool):
        cos, sin = cos_sin
        if unsqueeze:
            cos, sin = cos[:, :, None], sin[:, :, None]
        x_rot, x_pass = x.split([self.rope_dim, x.shape[-1] - self.rope_dim], dim=-1)
        return torch.cat([apply_rope(x_rot, cos, sin, self.interleave), x_pass], dim=-1)

    def _input(self, x):
        """Training modes detach the indexer's inputs: it learns only from its KL (DSV3.2 §2.1)."""
        return x.detach() if self.mode != "select" else x

    def keys(self, x_BTD: torch.Tensor, cos_sin) -> torch.Tensor:
        """The single shared indexer key per token, after RoPE -> (B, T, E). Cached beside MLA's latent."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.mode != "select"):
            return self._rope(self.k_norm(self.wk(self._input(x_BTD))), cos_sin, unsqueeze=False)

    def scores(self, x_BTD, q_resid_BTQ, cos_sin, k_BSE) -> torch.Tensor:
        """Index scores (B, T, S), fp32."""
        B, T, _ = x_BTD.shape
        x_BTD, q_resid_BTQ = self._input(x_BTD), self._input(q_resid_BTQ)
        q_BTIE = self._rope(self.wq_b(q_resid_BTQ).view(B, T, self.n_heads, self.head_dim), cos_sin, unsqueeze=True)
        w_BTI = self.weights_proj(x_BTD.to(self.weights_proj.weight.dtype)) * self.n_heads**-0.5
        return index_scores(q_BTIE, k_BSE, w_BTI, self.scale)

    def forward(self, x_BTD, q_resid_BTQ, cos_sin, k_BSE, mask_B1TS, teacher=None):
        """Top-k indices (B, T, K), or None in dense warm-up; in training modes also sets `pending_loss`.

        teacher(mask_B1TS) -> (B, H, T, S) detached main-attention probabilities under that mask.
        """
        self.pending_loss = self.last_loss = None
        if self.recall_k and teacher is not None:
            self._probe_recall(x_BTD, q_resid_BTQ, cos_sin, k_BSE, mask_B1TS, teacher)
        if self.mode == "dense" or (self.mode == "warmup" and not torch.is_grad_enabled()):
            return None  # dense attention (warm-up evaluation included)
        if self.mode == "select" or not torch.is_grad_enabled():
            with torch.no_grad():
                scores_BTS = self.scores(x_BTD, q_resid_BTQ, cos_sin, k_BSE)
                return select_topk(scores_BTS, mask_B1TS[:, 0], self.topk, self.stable_ties)
        scores_BTS = self.scores(x_BTD, q_resid_BTQ, cos_sin, k_BSE)
        topk_BTK = None
        loss_mask_B1TS = mask_B1TS
        if self.mode == "sparse":
            topk_BTK = select_topk(scores_BTS.detach(), mask_B1TS[:, 0], self.topk, self.stable_ties)
            loss_mask_B1TS = sparse_mask(topk_BTK, mask_B1TS)
        if teacher is not None:
            self.pending_loss = indexer_kl(teacher(loss_mask_B1TS), scores_BTS, loss_mask_B1TS)
            self.last_loss = self.pending_loss.detach()
        return topk_BTK

    @torch.no_grad()
    def _probe_recall(self, x_BTD, q_resid_BTQ, cos_sin, k_BSE, mask_B1TS, teacher) -> None:
        scores_BTS = self.scores(x_BTD, q_resid_BTQ, cos_sin, k_BSE)
        self.last_recall = topk_recall(teacher(mask_B1TS), scores_BTS, mask_B1TS, self.recall_k)


# ---------------------------------------------------------------------------------------------------- stages


def indexers(model: nn.Module) -> list[Indexer]:
    return [m for m in model.modules() if isinstance(m, Indexer)]


def set_indexer_mode(model: nn.Module, mode: str, loss_coeff: float | None = None) -> None:
    """Put every indexer of `model` in `mode` ("select", "warmup" or "sparse")."""
    if mode not in MODES:
        raise ValueError(f"indexer mode {mode!r} is not one of {MODES}")
    for ix in indexers(model):
        ix.mode = mode
        if loss_coeff is not None:
            ix.loss_coeff = loss_coeff


def apply_dsa_stage(model: nn.Module, stage: str | None = None, loss_coeff: float | None = None) -> None:
    """Put `model` in a DSA training stage (default: model.cfg.dsa_stage); a no-op for models without indexers.

    What trains: warmup = only the indexers; sparse = everything; dense / select / frozen = everything but the
    indexers (they get no gradient there, and requires_grad off keeps them out of the optimiser and DDP).
    """
    cfg = getattr(model, "cfg", None)
    stage = stage or getattr(cfg, "dsa_stage", "select")
    if loss_coeff is None:
        loss_coeff = getattr(cfg, "dsa_loss_weight", None)
    if stage not in STAGES:
        raise ValueError(f"DSA stage {stage!r} is not one of {sorted(STAGES)}")
    if not indexers(model):
        return
    set_indexer_mode(model, STAGES[stage], loss_coeff)
    if stage == "warmup":
        freeze_all_but_indexers(model)
        return
    model.requires_grad_(True)
    if stage != "sparse":
        for ix in indexers(model):
            ix.requires_grad_(False)


@torch.no_grad()
def measure_recall(model: nn.Module, input_ids: torch.Tensor, k: int) -> list[float]:
    """Per layer with an indexer: share of the main attention's top-k keys (heads summed) the indexer's top-k
    also ranks in its top-k, over query rows with more than k causal keys (dense attention's view)."""
    ixs = indexers(model)
    for ix in ixs:
        ix.recall_k, ix.last_recall = k, None
    try:
        model(input_ids)
    finally:
        for ix in ixs:
            ix.recall_k = 0
    return [ix.last_recall for ix in ixs if ix.last_recall is not None]


def freeze_all_but_indexers(model: nn.Module) -> None:
    """Dense warm-up: only the indexers train (DSV3.2 §2.1; GLM-5 App. A)."""
    for p in model.parameters():
        p.requires_grad_(False)
    for ix in indexers(model):
        ix.requires_grad_(True)


def freeze_indexers(model: nn.Module) -> None:
    """GLM-5 RL: indexers frozen, selection kept, no indexer loss."""
    set_indexer_mode(model, "select")
    for ix in indexers(model):
        ix.requires_grad_(False)


def indexer_loss(model: nn.Module) -> torch.Tensor | None:
    """Mean of the last forward's indexer KLs over layers (detached, for logging); None if none was computed."""
    losses = [ix.last_loss for ix in indexers(model) if ix.last_loss is not None]
    return torch.stack(losses).mean() if losses else None


def add_indexer_losses(loss: torch.Tensor | None, model: nn.Module) -> torch.Tensor | None:
    """loss + Σ_layers coeff·(KL − KL.detach()) over the KLs the last forward left pending (then cleared): the value
    is unchanged, the indexers' gradient is coeff·∇KL times the backward scale of `loss` ((loss·c).backward() gives
    c·coeff·∇KL). With no loss (no labels) the pending KLs are only cleared."""
    terms = []
    for ix in indexers(model):
        if ix.pending_loss is not None:
            terms.append(ix.loss_coeff * (ix.pending_loss - ix.pending_loss.detach()))
            ix.pending_loss = None
    if loss is None or not terms:
        return loss
    return loss + torch.stack(terms).sum().to(loss.dtype)
