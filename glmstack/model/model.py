"""GLM: the GLM-4.5 model family (arXiv 2508.06471) as one plain single-device PyTorch module.

embed -> `first_k_dense_replace` dense blocks -> MoE blocks -> RMSNorm -> LM head, plus `num_nextn_predict_layers`
MTP layers for the training loss and drafting. Computes what transformers' `Glm4MoeForCausalLM` computes
(tests/parity/test_hf_*.py). The model is built on the meta device; `init_weights` (or `hf.load_hf`) materialises it,
and the accounting methods (`num_params`, `flops_per_token`, `kv_cache_bytes_per_token`) work on meta.

    model = GLM(ModelConfig.preset("tiny")).init_weights(seed=0)
    out = model(input_ids, labels=labels)       # labels already shifted: labels[:, t] is the target of t
    out.loss.backward()

The attention of layer i comes from `make_attention(cfg, i)`, keyed on `cfg.model_type`, so GLM-4.7-Flash's MLA
and GLM-5's MLA/DSA plug in without touching the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.model.gemm import Linear
from glmstack.model.attention import Attention, segment_mask
from glmstack.model.config import ModelConfig
from glmstack.model.dsa import add_indexer_losses, apply_dsa_stage, indexer_loss
from glmstack.model.glm_options import (deepnorm_alpha, init_scale, prefix_lm_mask, rope_cos_sin_2d,
                                        shrink_embedding_grad)
from glmstack.model.layers import MLP, RMSNorm
from glmstack.model.loss import cross_entropy, linear_cross_entropy
from glmstack.model.mla import MLAttention
from glmstack.model.moe import MoE, Experts, Router
from glmstack.model.mtp import MTPLayer, mtp_targets
from glmstack.model.rope import rope_cos_sin

# model_type -> attention class (cfg, layer_idx) -> module with forward(x, cos, sin, mask, cache)
ATTENTION: dict[str, Callable[[ModelConfig, int], nn.Module]] = {
    "glm4_moe": Attention,  # GLM-4.5/4.6/4.7: GQA
    "glm4_moe_lite": partial(MLAttention, use_indexer=False),  # GLM-4.7-Flash: MLA, dense
    "glm_moe_dsa": MLAttention,  # GLM-5: MLA + DSA indexer
}


def make_attention(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    return ATTENTION[cfg.model_type](cfg, layer_idx)


@dataclass
class GLMOutput:
    """With labels and the fused LM loss, no logits were formed: `logits` runs the head on `hidden` on first read
    (under the grad mode of the forward)."""

    _logits: torch.Tensor | None = field(default=None, repr=False)  # (B, T, V); read through `logits`
    loss: torch.Tensor | None = None  # lm + mtp_weight * mean(mtp) + aux_weight * aux (with labels)
    lm_loss: torch.Tensor | None = None
    mtp_loss: list[torch.Tensor] = field(default_factory=list)  # one per MTP depth (with labels)
    aux_loss: torch.Tensor | None = None  # sequence-wise balance loss summed over the MoE layers that ran
    expert_load: torch.Tensor | None = None  # (n_moe_layers, E) routed-token counts; MTP rows last
    hidden: torch.Tensor | None = None  # (B, T, D) trunk output after the final norm (MTP depth 1 reads it)
    indexer_loss: torch.Tensor | None = None  # DSA warm-up/sparse: mean indexer KL over layers (detached, logging)
    routes: torch.Tensor | None = None  # return_routes: (B, T, n trunk MoE layers, K) the routers' own top-k
    _head: Callable | None = field(default=None, repr=False)  # h_BTD -> logits, for the lazy `logits`
    _grad: bool = field(default=True, repr=False)

    @property
    def logits(self) -> torch.Tensor:  # (B, T, V)
        if self._logits is None:
            with torch.set_grad_enabled(self._grad):
                self._logits = self._head(self.hidden)
        return self._logits


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(.)); the MLP is dense or MoE.
    With cfg.deepnorm, GLM-130B's Post-LN DeepNorm instead: x = norm(alpha * x + attn(x)), then
    norm(alpha * . + mlp(.)), alpha = (2N)^(1/2) (glm_options.py); the same two norms, so the same names."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, moe: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = make_attention(cfg, layer_idx)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.alpha = deepnorm_alpha(cfg.num_hidden_layers) if cfg.deepnorm else None

    def forward(self, x_BTD, cos, sin, mask=None, cache=None, valid_BT=None, replay_BTK=None):
        """-> (x_BTD, aux loss, expert load (E,), the router's own top-k (B, T, K)), the last three None in a dense
        block; valid_BT: False on padding (not counted); replay_BTK: routing replay's experts (MoE.forward)."""
        if self.alpha is not None:
            return self._deepnorm(x_BTD, cos, sin, mask, cache, valid_BT, replay_BTK)
        x_BTD = x_BTD + self.self_attn(self.input_layernorm(x_BTD), cos, sin, mask, cache)
        h_BTD = self.post_attention_layernorm(x_BTD)
        if isinstance(self.mlp, MoE):
            y_BTD, aux, load_E, own_BTK = self.mlp(h_BTD, valid_BT, replay_BTK)
            return x_BTD + y_BTD, aux, load_E, own_BTK
        return x_BTD + self.mlp(h_BTD), None, None, None

    def _deepnorm(self, x_BTD, cos, sin, mask, cache, valid_BT, replay_BTK):
        x_BTD = self.input_layernorm(self.alpha * x_BTD + self.self_attn(x_BTD, cos, sin, mask, cache))
        aux = load_E = own_BTK = None
        if isinstance(self.mlp, MoE):
            y_BTD, aux, load_E, own_BTK = self.mlp(x_BTD, valid_BT, replay_BTK)
        else:
            y_BTD = self.mlp(x_BTD)
        return self.post_attention_layernorm(self.alpha * x_BTD + y_BTD), aux, load_E, own_BTK


class GLM(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None, dtype: torch.dtype | None = None):
        super().__init__()
        self.cfg = cfg
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(
                Block(cfg, i, cfg.is_moe_layer(i)) for i in range(cfg.num_hidden_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            n = cfg.num_hidden_layers
            self.mtp = nn.ModuleList(
                MTPLayer(cfg, Block(cfg, n + d, moe=True)) for d in range(cfg.num_nextn_predict_layers))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        share: dict = {}  # IndexShare: "shared" layers read the top-k the last "full" layer wrote (dsa.py)
        for layer in self.layers:
            if isinstance(layer.self_attn, MLAttention):
                layer.self_attn.topk_share = share
        apply_dsa_stage(self)  # cfg.dsa_stage: which indexer mode, which parameters train (no-op without DSA)
        if dtype is not None:
            self.cast(dtype)
        if device is not None:
            self.init_weights(seed=0, device=device)

    # ---------------------------------------------------------------- dtype / init
    def cast(self, dtype: torch.dtype) -> GLM:
        """Cast to `dtype` except the router weights and balancing biases, and the DSA indexer's head weights
        (`weights_proj`, HF `_keep_in_fp32_modules`), which stay fp32 (as in HF)."""
        for module in self.modules():
            if isinstance(module, Router) or getattr(module, "keep_fp32", False):
                continue
            for name, p in module.named_parameters(recurse=False):
                p.data = p.data.to(dtype)
        return self

    def materialize(self, device) -> GLM:
        """Allocate (uninitialised) storage for a meta-built model."""
        if any(t.is_meta for t in self.state_dict().values()):
            self.to_empty(device=device)
            if self.cfg.tie_word_embeddings:
                self.lm_head.weight = self.embed_tokens.weight
        return self

    @torch.no_grad()
    def init_weights(self, seed: int = 0, device=None) -> GLM:
        """Initialise every tensor (materialising a meta model on `device`, default cpu), as HF `_init_weights`:

        - embed_tokens, lm_head, every nn.Linear weight (q/k/v/o, MLP, shared expert, eh_proj): N(0, initializer_range)
        - attention q/k/v biases: 0
        - routed expert banks gate_up_proj (E, 2F, D) and down_proj (E, D, F): N(0, initializer_range)
        - router weight (E, D), fp32: N(0, initializer_range); e_score_correction_bias (E,), fp32: 0
        - every RMSNorm gain (layers, QK-Norm, MLA q_a/kv_a, final, MTP enorm/hnorm/shared_head.norm): 1
        - DSA indexer k_norm (LayerNorm): weight 1, bias 0
        - cfg.deepnorm: v_proj, o_proj and every MLP/expert matrix N(0, (initializer_range * beta)^2),
          beta = (8N)^(-1/2) (glm_options.init_scale); the same random stream, so nothing else changes
        """
        self.materialize(device or "cpu")
        state = self.state_dict()
        for name, full in self.initial_tensors(seed, state[next(iter(state))].device):
            state[name].copy_(full)
        return self

    def initial_tensors(self, seed: int = 0, device="cpu", only: str = ""):
        """init_weights' values as a stream of (state-dict name, full tensor), one tensor alive at a time.

        Names, shapes and rules are read now, so the stream stays valid after the model is sharded: a sharded copy
        (FSDP2, expert parallel) draws the same stream on every rank and keeps its part of each tensor
        (train/dist.py: materialize), starting bit-identical to the unsharded init with no rank holding the whole
        model. `only`: just the tensors whose names start with it (a fresh MTP layer for an MTP-less checkpoint)."""
        std = self.cfg.initializer_range
        plan = []  # (name, shape, dtype, rule)
        for name, p in sorted(self.named_parameters(), key=lambda kv: kv[0]):
            if isinstance(_owner(self, name), (RMSNorm, nn.LayerNorm)) and not name.endswith(".bias"):
                rule = "ones"
            else:
                rule = "zeros" if name.endswith(".bias") else "normal"
            plan.append((name, p.shape, p.dtype, rule, init_scale(self.cfg, name)))
        plan += [(n, b.shape, b.dtype, "zeros", 1.0) for n, b in self.named_buffers() if n.endswith("e_score_correction_bias")]
        return _draw([p for p in plan if p[0].startswith(only)], std, seed, device)

    # ---------------------------------------------------------------- forward
    def forward(self, input_ids, labels=None, position_ids=None, segment_ids=None, cache=None,
                mtp_weight: float | None = None, aux_loss_weight: float | None = None,
                prefix_len=None, inputs_embeds=None, rope=None, lazy_logits: bool = False, routes=None,
                return_routes: bool = False, mtp_labels=None, mtp_detach_trunk: bool = False) -> GLMOutput:
        """prefix_len (B,): GLM blank infilling's Part A length (bidirectional), Part B causal (glm_options.py);
        with cfg.position_2d, position_ids is (B, 2, T) (text position, position inside the span).
        inputs_embeds (B, T, D) replaces the token embeddings and rope = (cos, sin) (B, T, rotary_dim) the RoPE
        angles: how the vision-language model (model/vision/) feeds image tokens and 3D RoPE; None = unchanged.
        lazy_logits: form no logits here (`out.logits` runs the head on first read): a caller that needs them for a
        long sequence runs the head on `out.hidden` in chunks instead of holding (T, V) (serve/scoring.py).
        routes (B, T, n trunk MoE layers, K) long: routing replay (R3): trunk MoE layer l routes token t to
        routes[:, t, l] (-1: its own top-k; MoE.forward); return_routes: `out.routes` = each trunk MoE router's own
        top-k, what it would have chosen (the replay's diff metric).
        mtp_labels (B, T), without `labels`: only the MTP layers' losses (out.mtp_loss) on these targets, the main
        head's loss not formed (RL trains the MTP layer on its rollouts, rl.mtp_weight); mtp_detach_trunk: the
        trunk's hidden state, the shared embedding and the shared LM head enter them detached, so the MTP loss
        trains the MTP layer only."""
        B, T = input_ids.shape
        if position_ids is None:
            offset = cache.seq_len if cache is not None else 0
            position_ids = (torch.arange(T, device=input_ids.device) + offset).expand(B, T)
        if (segment_ids is not None or prefix_len is not None) and cache is not None:
            raise ValueError("segment_ids or prefix_len with a KV cache: give the mask through cache.attention_mask instead")
        if prefix_len is not None:
            mask = prefix_lm_mask(prefix_len, T, segment_ids)
        else:
            mask = segment_mask(segment_ids) if segment_ids is not None else None
        valid_BT = segment_ids != 0 if segment_ids is not None else None  # segment 0 = padding (data contract)
        x_BTD = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        cos, sin = self._rope(position_ids, x_BTD.dtype) if rope is None else rope
        auxes, loads, own = [], [], []
        for layer in self.layers:
            replay_BTK = routes[:, :, len(own)] if routes is not None and isinstance(layer.mlp, MoE) else None
            x_BTD, aux, load_E, own_BTK = layer(x_BTD, cos, sin, mask, cache, valid_BT, replay_BTK)
            if aux is not None:
                auxes.append(aux)
                loads.append(load_E)
                own.append(own_BTK)
        h_BTD = self.norm(x_BTD)  # the LM head's input and MTP's (transformers, vLLM and Megatron all feed it)
        out = GLMOutput(hidden=h_BTD, _head=self.lm_head, _grad=torch.is_grad_enabled())
        if return_routes and own:
            out.routes = torch.stack(own, dim=2)
        if not lazy_logits and (labels is None or not self.cfg.fused_lm_loss):
            out._logits = self.lm_head(h_BTD)
        if labels is not None:
            out.lm_loss = self.lm_loss(h_BTD, labels, out._logits)
            out.mtp_loss = self._mtp_losses(input_ids, labels, h_BTD, cos, sin, mask, segment_ids, auxes, loads,
                                            valid_BT)
        elif mtp_labels is not None:
            h_in = h_BTD.detach() if mtp_detach_trunk else h_BTD
            out.mtp_loss = self._mtp_losses(input_ids, mtp_labels, h_in, cos, sin, mask, segment_ids, auxes, loads,
                                            valid_BT, detach_shared=mtp_detach_trunk)
        out.aux_loss = torch.stack(auxes).sum() if auxes else x_BTD.new_zeros((), dtype=torch.float32)
        out.expert_load = self._stack_loads(loads, x_BTD.device)
        if labels is not None:
            out.loss = self._total_loss(out, mtp_weight, aux_loss_weight)
        if self.cfg.has_dsa:  # the indexer KL's gradient joins out.loss, its value is logged apart
            out.indexer_loss = indexer_loss(self)
            out.loss = add_indexer_losses(out.loss, self)
        return out

    def _mtp_losses(self, input_ids, labels, h_BTD, cos, sin, mask, segment_ids, auxes, loads, valid_BT=None,
                    detach_shared: bool = False):
        """detach_shared: the embedding and LM head the MTP layers share with the trunk get no gradient here."""
        losses = []
        for d, layer in enumerate(self.mtp_by_depth(), start=1):
            ids_d, labels_d = mtp_targets(input_ids, labels, d, segment_ids)
            emb = self.embed(ids_d).detach() if detach_shared else self.embed(ids_d)
            h_BTD, aux, load_E = layer(emb, h_BTD, cos, sin, mask, valid_BT=valid_BT)
            auxes.append(aux)
            if d <= len(self.mtp):
                loads.append(load_E)
            else:  # a shared depth reruns the last MTP layer: its routed tokens count toward that layer's row
                loads[-1] = loads[-1] + load_E
            losses.append(self.lm_loss(h_BTD, labels_d, detach_head=detach_shared))
        return losses

    def embed(self, input_ids) -> torch.Tensor:
        """Token embeddings (B, T, D), their gradient shrunk by cfg.embedding_grad_shrink (GLM-130B; 1 = off)."""
        return shrink_embedding_grad(self.embed_tokens(input_ids), self.cfg.embedding_grad_shrink)

    def _rope(self, position_ids, dtype):
        """cos, sin (B, T, rotary_dim): 1D RoPE, or with cfg.position_2d GLM's 2D positions (B, 2, T)."""
        if self.cfg.position_2d:
            if position_ids.dim() == 2:  # plain text: span position 0
                position_ids = torch.stack((position_ids, torch.zeros_like(position_ids)), dim=1)
            return rope_cos_sin_2d(position_ids, self.cfg.rotary_dim, self.cfg.rope_theta, dtype)
        return rope_cos_sin(position_ids, self.cfg.rotary_dim, self.cfg.rope_theta, dtype)

    def lm_loss(self, h_BTD, labels_BT, logits_BTV=None, detach_head: bool = False) -> torch.Tensor:
        """Mean CE of the LM head on h_BTD: fused with the head's matmul (loss.py) or, with `cfg.fused_lm_loss`
        off, the plain reference on the logits (given or formed here). detach_head: no gradient to the head."""
        if detach_head:
            w = self.lm_head.weight.detach()
            if self.cfg.fused_lm_loss:
                return linear_cross_entropy(h_BTD, w, labels_BT)
            return cross_entropy(F.linear(h_BTD, w), labels_BT)
        if self.cfg.fused_lm_loss:
            return linear_cross_entropy(h_BTD, self.lm_head.weight, labels_BT)
        return cross_entropy(self.lm_head(h_BTD) if logits_BTV is None else logits_BTV, labels_BT)

    def mtp_step(self, depth: int, next_ids, hidden, position_ids, cache=None):
        """One MTP depth (0-based) for drafting: -> (normed hidden (B, T, D) to chain, logits (B, T, V))."""
        emb = self.embed_tokens(next_ids)
        cos, sin = rope_cos_sin(position_ids, self.cfg.rotary_dim, self.cfg.rope_theta, emb.dtype)
        h, _, _ = self.mtp_by_depth()[depth](emb, hidden, cos, sin, None, cache)
        return h, self.lm_head(h)

    def mtp_by_depth(self) -> list[MTPLayer]:
        """The MTP layer of each depth: one per layer, then the last one again (GLM-5: 1 layer, 3 shared depths)."""
        n = len(self.mtp)
        return [self.mtp[min(d, n - 1)] for d in range(self.cfg.mtp_depths)] if n else []

    def _stack_loads(self, loads, device) -> torch.Tensor:
        """(n_moe_layers, E), zeros for the MTP layers when they did not run."""
        out = torch.zeros(self.cfg.n_moe_layers, self.cfg.n_routed_experts, device=device)
        if loads:
            out[: len(loads)] = torch.stack(loads)
        return out

    def _total_loss(self, out: GLMOutput, mtp_weight, aux_weight) -> torch.Tensor:
        mtp_weight = self.cfg.mtp_loss_weight if mtp_weight is None else mtp_weight
        aux_weight = self.cfg.aux_loss_weight if aux_weight is None else aux_weight
        loss = out.lm_loss + aux_weight * out.aux_loss
        if out.mtp_loss and mtp_weight:
            loss = loss + mtp_weight * torch.stack(out.mtp_loss).mean()
        return loss

    def moe_layers(self) -> list[MoE]:
        """The MoE modules in expert_load row order (trunk, then MTP)."""
        blocks = list(self.layers) + [m.block for m in self.mtp]
        return [b.mlp for b in blocks if isinstance(b.mlp, MoE)]

    # ---------------------------------------------------------------- accounting (meta-safe)
    def num_params(self, active: bool = False, include_embeddings: bool = True, include_mtp: bool = True) -> int:
        """Parameters (tied ones once). active: routed experts count K/E of their size (per token).
        include_embeddings=False drops the embedding and the LM head (the papers' convention)."""
        k_over_e = self.cfg.num_experts_per_tok / self.cfg.n_routed_experts
        total = 0.0
        for name, p in self.named_parameters():
            if not include_embeddings and name in ("embed_tokens.weight", "lm_head.weight"):
                continue
            if not include_mtp and name.startswith("mtp."):
                continue
            n = p.numel()
            total += n * k_over_e if active and isinstance(_owner(self, name), Experts) else n
        return int(round(total))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward) per token: 6 x active matmul weights (LM head counted once per
        trunk and MTP depth, the embedding lookup not; a shared MTP layer once per depth it runs) + causal
        attention 6 * H * (d_qk + d_v)/2 * seq_len per layer (GQA: d_qk = d_v = head_dim; MLA in MHA mode, dense)."""
        cfg = self.cfg
        k_over_e = cfg.num_experts_per_tok / cfg.n_routed_experts
        last_mtp, reruns = f"mtp.{len(self.mtp) - 1}.", max(cfg.mtp_depths - len(self.mtp), 0)
        matmul = 0.0
        for n, p in self.named_parameters():
            if p.dim() < 2 or _is_embedding(n):
                continue
            size = p.numel() * (k_over_e if isinstance(_owner(self, n), Experts) else 1)
            matmul += size * (1 + reruns if n.startswith(last_mtp) else 1)
        matmul += cfg.vocab_size * cfg.hidden_size * (1 + cfg.mtp_depths)
        n_attn = cfg.num_hidden_layers + cfg.mtp_depths
        width = ((cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) / 2 if cfg.is_mla else cfg.head_dim)
        return 6.0 * matmul + 6.0 * n_attn * cfg.num_attention_heads * width * seq_len

    def kv_cache_bytes_per_token(self, dtype: torch.dtype = torch.bfloat16, include_mtp: bool = True,
                                 include_indexer: bool = True) -> int:
        """Cached values of every attention layer. GQA: K and V, 2 * kv_heads * head_dim per layer. MLA: the latent
        and the rope key, kv_lora_rank + qk_rope_head_dim per layer, plus the DSA indexer key (index_head_dim) on
        layers with their own indexer when include_indexer (DeepSeek-V3, arXiv 2412.19437 §2.1.1)."""
        cfg = self.cfg
        n = cfg.num_hidden_layers + (cfg.num_nextn_predict_layers if include_mtp else 0)
        size = torch.empty((), dtype=dtype).element_size()
        if not cfg.is_mla:
            return 2 * n * cfg.num_key_value_heads * cfg.head_dim * size
        per_layer = [a.cache_dims() for a in self.attentions()[:n]]
        return sum(k + (v if include_indexer else cfg.qk_rope_head_dim) for k, v in per_layer) * size

    def attentions(self) -> list[nn.Module]:
        """Attention modules in KV-cache layer order (trunk, then MTP)."""
        return [b.self_attn for b in list(self.layers) + [m.block for m in self.mtp]]


def _is_embedding(name: str) -> bool:
    return name in ("embed_tokens.weight", "lm_head.weight")


@torch.no_grad()
def _draw(plan, std: float, seed: int, device):
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape, dtype, rule, scale in plan:
        t = torch.empty(shape, dtype=dtype, device=device)
        if rule == "normal":
            t.normal_(0.0, std * scale, generator=gen)
        else:
            t.fill_(1.0 if rule == "ones" else 0.0)
        yield name, t


def _owner(model: nn.Module, param_name: str) -> nn.Module:
    return model.get_submodule(param_name.rpartition(".")[0])
