"""INT4 and FP8 weights for inference: `quantize_(model, "int4" | "fp8")` in place, and released FP8 checkpoints.

Why: decoding reads every active weight once per step, so weight bytes are its cost and its memory. Two formats:
  - "int4": weight-only, group-wise (GLM-130B §6 serves INT4 weight-only; it scales per row, here per group of
    `group_size` input channels, finer). Per group an fp scale and zero: w ~= (q - 8) * scale + zero, q in 0..15,
    min/max (asymmetric) as torch's tinygemm kernels take it. On CPU the GEMM is torch's own
    `torch.ops.aten._weight_int4pack_mm_for_cpu` (activations cast to bf16, its vectorised path; its fp32 path is
    ~15x slower); on CUDA `torch._weight_int4pack_mm` (written, unverified: no GPU here). ~0.53 bytes a weight.
  - "fp8": block-wise e4m3 with one fp32 scale per 128 x 128 block (DeepSeek-V3 §3.3.2; the layout of released
    GLM FP8 checkpoints: `*.weight` float8_e4m3fn + `*.weight_scale_inv` fp32 (ceil(N/128), ceil(K/128)), W = w8 *
    scale_inv per block, config.json `quantization_config` {"quant_method": "fp8", "fmt": "e4m3",
    "weight_block_size": [128, 128], "activation_scheme": "dynamic"}). torch has no block-scaled fp8 GEMM on CPU,
    so a layer dequantizes its weight per call (a storage format here: half the bytes of bf16, slower decode).
What is quantized: the decoder blocks' linear layers (q/k/v/o, dense MLP, shared expert) and the routed experts,
in the trunk and the MTP layers; embeddings, LM head, router, norms and the MTP layer's eh_proj stay as they are
(as in the released FP8 checkpoints). GQA models only (MLA's absorbed attention reads its weights directly).
A quantized model decodes through the model's own forward (Engine picks ReferenceForward: the fast path keeps fp
copies of the weights, which is what quantizing removes). `save_hf` of an fp8-quantized model writes a released-
style FP8 folder and `load_hf` of such a folder builds this model with the FP8 weights as stored.

    from glmstack.inference.quant import quantize_, weight_bytes
    quantize_(model, "int4")                       # or "fp8"; then Engine(model, tok).generate(...)
    glmstack generate CKPT --quantize int4 --prompt "..."        # also chat / serve
    python bench/quant.py --model runs/speedrun/model      # perplexity, memory, decode speed
Shape legend: N output features, K input features, E experts, F expert width, T tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmstack.errors import GlmstackError
from glmstack.model.attention import Attention
from glmstack.model.moe import MoE

SCHEMES = ("int4", "fp8")
FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite e4m3fn value
INT4_GROUP = 128
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


# ---------------------------------------------------------------- INT4 (group-wise, weight-only)
def int4_quantize(w_NK: torch.Tensor, group: int):
    """-> (q (N, K) int32 in 0..15, scale (N, K/g), zero (N, K/g)) with w ~= (q - 8) * scale + zero per group."""
    N, K = w_NK.shape
    w_NGg = w_NK.float().view(N, K // group, group)
    lo, hi = w_NGg.amin(-1), w_NGg.amax(-1)
    scale = ((hi - lo) / 15).clamp_min(1e-8)
    q = ((w_NGg - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).view(N, K)
    return q, scale, lo + 8 * scale


def int4_dequantize(q_NK, scale_NG, zero_NG, dtype=torch.float32) -> torch.Tensor:
    N, K = q_NK.shape
    G = scale_NG.shape[1]
    w = (q_NK.view(N, G, K // G).float() - 8) * scale_NG[..., None] + zero_NG[..., None]
    return w.view(N, K).to(dtype)


def int4_group_size(K: int, want: int = INT4_GROUP) -> int:
    for g in (want, 128, 64, 32):
        if g <= want and K % g == 0:
            return g
    raise QuantError(f"int4: input width {K} is not a multiple of 32 (the kernels' smallest group)")


class Int4Linear(nn.Module):
    """nn.Linear as torch's int4 weight-only GEMM: the weight packed for the device's kernel, bf16 scales/zeros."""

    def __init__(self, w_NK: torch.Tensor, bias: torch.Tensor | None, group: int):
        super().__init__()
        N, K = w_NK.shape
        self.in_features, self.out_features, self.group = K, N, int4_group_size(K, group)
        q, scale, zero = int4_quantize(w_NK, self.group)
        dev = w_NK.device
        if dev.type == "cpu":
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        elif dev.type == "cuda":  # written, unverified (no GPU in this session)
            packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
        else:
            raise QuantError(f"int4: no torch int4 kernel on {dev.type}")
        self.register_buffer("packed", packed)
        # (K/g, N, 2): [scale, zero] per group and output row, the kernels' layout
        self.register_buffer("scale_zeros", torch.stack([scale, zero], -1).transpose(0, 1).contiguous().bfloat16())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_MK = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if self.packed.device.type == "cpu":
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x_MK, self.packed, self.group, self.scale_zeros)
        else:
            y = torch.ops.aten._weight_int4pack_mm(x_MK, self.packed, self.group, self.scale_zeros)
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


# ---------------------------------------------------------------- experts and the whole model
class _Expert(nn.Module):
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


def _targets(model):
    """(module, attribute name, nn.Linear) of every linear layer to quantize, and (MoE, Experts) of every bank."""
    linears, banks = [], []
    for block in list(model.layers) + [m.block for m in model.mtp]:
        attn = block.self_attn
        if not isinstance(attn, Attention):
            raise QuantError(f"quantize_: {type(attn).__name__} (MLA) is not supported; GQA models only")
        linears += [(attn, n, getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mlp = block.mlp
        dense = mlp.shared_experts if isinstance(mlp, MoE) else mlp
        if dense is not None:
            linears += [(dense, n, getattr(dense, n)) for n in ("gate_proj", "up_proj", "down_proj")]
        if isinstance(mlp, MoE):
            banks.append(mlp)
    return linears, banks


@torch.no_grad()
def quantize_(model, scheme: str, group_size: int = INT4_GROUP):
    """Quantize `model`'s decoder weights in place to "int4" or "fp8" (module docstring); returns the model."""
    if scheme not in SCHEMES:
        raise QuantError(f"unknown quantization scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    if is_quantized(model):
        raise QuantError("the model is already quantized")
    if any(t.is_meta for t in model.state_dict().values()):
        raise QuantError("quantize_ needs a model with weights (this one is on the meta device)")

    def make(w_NK, bias=None):
        return FP8Linear.from_weight(w_NK, bias) if scheme == "fp8" else Int4Linear(w_NK, bias, group_size)

    linears, banks = _targets(model)
    for parent, name, lin in linears:
        setattr(parent, name, make(lin.weight, lin.bias))
    for moe in banks:
        gu_EFD, down_EDF = moe.experts.gate_up_proj, moe.experts.down_proj
        F_ = down_EDF.shape[2]
        moe.experts = QuantExperts(
            _Expert(make(gu[:F_]), make(gu[F_:]), make(dn)) for gu, dn in zip(gu_EFD, down_EDF)
        )
    if scheme == "fp8":  # save_hf writes it into config.json: a released-style FP8 folder
        model.cfg.hf_metadata["quantization_config"] = dict(FP8_CONFIG)
    model.quant_scheme = scheme
    return model


def fp8_skeleton_(model, names=None) -> None:
    """Swap in empty FP8 layers on a meta-built model, for load_hf to fill from a released FP8 folder. names: the
    folder's tensor names; then only the layers it stores in FP8 (those with a `weight_scale_inv`) are swapped, so
    a checkpoint that keeps some of them in bf16 (e.g. its MTP layer) loads as it is."""
    from glmstack.model.hf import _hf_prefix

    qc = model.cfg.hf_metadata.get("quantization_config") or {}
    if qc.get("quant_method") != "fp8" or list(qc.get("weight_block_size", [])) != [FP8_BLOCK, FP8_BLOCK]:
        raise QuantError(f"quantization_config {qc}: only fp8 with weight_block_size [128, 128] is supported")
    path = {id(m): p for p, m in model.named_modules()}

    def stored_fp8(module, suffix: str) -> bool:
        hf = _hf_prefix(f"{path[id(module)]}.{suffix}", model.cfg.num_hidden_layers)
        return names is None or hf in names

    linears, banks = _targets(model)
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
            _Expert(*(FP8Linear(k, n, False, "meta", dt) for k, n in ((D, F_), (D, F_), (F_, D)))) for _ in range(E)
        )
    model.quant_scheme = "fp8"


def is_quantized(model) -> bool:
    return getattr(model, "quant_scheme", None) is not None


def weight_bytes(model) -> int:
    """Bytes of every parameter and buffer (each shared tensor once): what the weights occupy in memory."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total
