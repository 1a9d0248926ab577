"""Block-wise FP8 weights as the model stores them: the format of released GLM FP8 checkpoints, and the
scaffolding every quantized format shares (per-expert banks, the list of layers a format replaces).

Why here and not in glmstack.inference: `load_hf` builds this model from a released FP8 folder, so the format is
part of the model's checkpoint IO; inference/quant.py adds INT4 and `quantize_` on top and re-exports these names.
(With the format in inference/quant.py, model/hf.py and quant.py imported each other: issue 35.)

FP8 layout (DeepSeek-V3 §3.3.2): `*.weight` float8_e4m3fn + `*.weight_scale_inv` fp32 (ceil(N/128), ceil(K/128)),
W = w8 * scale_inv per 128 x 128 block; config.json `quantization_config` = FP8_CONFIG.
Shape legend: N output features, K input features, E experts, F expert width, T tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.errors import GlmstackError
from glmstack.model.attention import Attention
from glmstack.model.moe import MoE

FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite e4m3fn value
FP8_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


class QuantError(GlmstackError):
    """A model or scheme quantize_ cannot handle; the message says which (`glmstack` prints it as one line)."""


# ---------------------------------------------------------------- FP8 (block-wise e4m3)
def fp8_quantize(w_NK: torch.Tensor, block: int = FP8_BLOCK):
    """-> (w8 (N, K) float8_e4m3fn, scale_inv (ceil(N/b), ceil(K/b)) fp32) with w ~= w8 * scale_inv per block."""
    N, K = w_NK.shape
    n, k = -(-N // block), -(-K // block)
    padded = F.pad(w_NK.float(), (0, k * block - K, 0, n * block - N))
    blocks = padded.view(n, block, k, block)
    scale_nk = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)
    w8 = (blocks / scale_nk[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view(n * block, k * block)[:N, :K]
    return w8.to(torch.float8_e4m3fn).contiguous(), scale_nk


def fp8_dequantize(w8_NK: torch.Tensor, scale_nk: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    N, K = w8_NK.shape
    s_NK = scale_nk.repeat_interleave(FP8_BLOCK, 0)[:N].repeat_interleave(FP8_BLOCK, 1)[:, :K]
    return (w8_NK.float() * s_NK).to(dtype)


class FP8Linear(nn.Module):
    """nn.Linear with an e4m3 weight and block scales, under the released checkpoints' names."""

    def __init__(self, in_features: int, out_features: int, bias: bool, device=None, bias_dtype=torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        n, k = -(-out_features // FP8_BLOCK), -(-in_features // FP8_BLOCK)
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn, device=device))
        self.register_buffer("weight_scale_inv", torch.empty(n, k, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=bias_dtype, device=device), False) if bias else None

    @classmethod
    @torch.no_grad()
    def from_weight(cls, w_NK: torch.Tensor, bias: torch.Tensor | None = None) -> FP8Linear:
        out = cls(w_NK.shape[1], w_NK.shape[0], bias is not None, w_NK.device, w_NK.dtype)
        out.weight, out.weight_scale_inv = fp8_quantize(w_NK)
        if bias is not None:
            out.bias.copy_(bias)
        return out

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return fp8_dequantize(self.weight, self.weight_scale_inv, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantize(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


# ---------------------------------------------------------------- experts and the layers a format replaces
class QuantExpert(nn.Module):
    """One routed expert's SwiGLU with quantized linear layers (the released checkpoints' per-expert names)."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def forward(self, x_TD):
        return self.down_proj(F.silu(self.gate_proj(x_TD)) * self.up_proj(x_TD))


class QuantExperts(nn.ModuleList):
    """moe.Experts as one quantized SwiGLU per expert (`experts.{e}.gate_proj`, as the released checkpoints name
    them); forward runs only the experts some token chose, in experts_sorted's order."""

    def forward(self, x_TD, topk_idx_TK, topk_w_TK):
        K = topk_idx_TK.shape[1]
        flat_N = topk_idx_TK.reshape(-1)
        order_N = flat_N.argsort(stable=True)
        counts = torch.bincount(flat_N, minlength=len(self)).tolist()  # host sync: free on CPU
        tok_N = order_N // K
        x_ND, wk_N1 = x_TD[tok_N], topk_w_TK.reshape(-1)[order_N, None]
        outs, s = [], 0
        for e, c in enumerate(counts):
            if c:
                outs.append(self[e](x_ND[s : s + c]) * wk_N1[s : s + c].to(x_TD.dtype))
            s += c
        return torch.zeros_like(x_TD).index_add_(0, tok_N, torch.cat(outs))


GQA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
# MLA (GLM-4.7-Flash, GLM-5): q_proj without a query latent, else q_a / q_b; the absorbed decode reads kv_b_proj's
# weight itself and dequantizes it (mla.py: w_uk_uv)
MLA_LINEARS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


def quant_targets(model):
    """(module, attribute name, nn.Linear) of every linear layer to quantize, and (MoE, Experts) of every bank."""
    linears, banks = [], []
    for block in list(model.layers) + [m.block for m in model.mtp]:
        attn = block.self_attn
        names = GQA_LINEARS if isinstance(attn, Attention) else MLA_LINEARS
        linears += [(attn, n, getattr(attn, n)) for n in names if hasattr(attn, n)]
        if getattr(attn, "indexer", None) is not None:  # DSA: the indexer's projections (weights_proj stays fp32)
            linears += [(attn.indexer, n, getattr(attn.indexer, n)) for n in ("wq_b", "wk")]
        mlp = block.mlp
        dense = mlp.shared_experts if isinstance(mlp, MoE) else mlp
        if dense is not None:
            linears += [(dense, n, getattr(dense, n)) for n in ("gate_proj", "up_proj", "down_proj")]
        if isinstance(mlp, MoE):
            banks.append(mlp)
    return linears, banks


def fp8_skeleton_(model, stored=None) -> None:
    """Swap in empty FP8 layers on a meta-built model, for load_hf to fill from a released FP8 folder. stored: a
    predicate on our tensor names (e.g. "layers.3.self_attn.q_proj.weight_scale_inv"), True when the folder holds
    that tensor (load_hf maps the names to the folder's); then only the layers it stores in FP8 are swapped, so a
    checkpoint that keeps some of them in bf16 (e.g. its MTP layer) loads as it is. None: every layer."""
    qc = model.cfg.hf_metadata.get("quantization_config") or {}
    if qc.get("quant_method") != "fp8" or list(qc.get("weight_block_size", [])) != [FP8_BLOCK, FP8_BLOCK]:
        raise QuantError(f"quantization_config {qc}: only fp8 with weight_block_size [128, 128] is supported")
    path = {id(m): p for p, m in model.named_modules()}

    def stored_fp8(module, suffix: str) -> bool:
        return stored is None or stored(f"{path[id(module)]}.{suffix}")

    linears, banks = quant_targets(model)
    for parent, name, lin in linears:
        if stored_fp8(lin, "weight_scale_inv"):
            dt = lin.weight.dtype
            setattr(parent, name, FP8Linear(lin.in_features, lin.out_features, lin.bias is not None, "meta", dt))
    for moe in banks:
        if not stored_fp8(moe.experts, "0.gate_proj.weight_scale_inv"):
            continue
        E, D, F_ = moe.experts.down_proj.shape
        dt = moe.experts.down_proj.dtype
        moe.experts = QuantExperts(
            QuantExpert(*(FP8Linear(k, n, False, "meta", dt) for k, n in ((D, F_), (D, F_), (F_, D)))) for _ in range(E)
        )
    model.quant_scheme = "fp8"
