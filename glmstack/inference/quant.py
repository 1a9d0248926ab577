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
    The FP8 format itself is the model's (glmstack/model/quantized.py: load_hf reads released FP8 folders).
What is quantized: the decoder blocks' linear layers (q/k/v/o, dense MLP, shared expert) and the routed experts,
in the trunk and the MTP layers; embeddings, LM head, router, norms and the MTP layer's eh_proj stay as they are
(as in the released FP8 checkpoints). MLA models (GLM-4.7-Flash, GLM-5) quantize their q / kv latent projections,
kv_b_proj and o_proj, and DSA's indexer its wq_b and wk (weights_proj stays fp32); the absorbed decode dequantizes
kv_b_proj at each call (model/mla.py: w_uk_uv).
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
from torch import nn

# the FP8 format is the model's (released checkpoints are stored in it; model/hf.py loads them), so it lives in
# glmstack.model.quantized; these names stay importable from here
from glmstack.model.quantized import (  # noqa: F401
    FP8_BLOCK,
    FP8_CONFIG,
    FP8_MAX,
    FP8Linear,
    QuantError,
    QuantExpert,
    QuantExperts,
    fp8_dequantize,
    fp8_quantize,
    fp8_skeleton_,
    quant_targets,
)

SCHEMES = ("int4", "fp8")
INT4_GROUP = 128


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
        if N % 16:
            raise QuantError(f"int4: output width {N} is not a multiple of 16 (the kernels' packing)")
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

    def _mm(self, x_MK: torch.Tensor) -> torch.Tensor:
        """x (M, K) bf16 @ W.T -> (M, N) bf16 through the device's int4 kernel."""
        if self.packed.device.type == "cpu":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x_MK, self.packed, self.group, self.scale_zeros)
        return torch.ops.aten._weight_int4pack_mm(x_MK, self.packed, self.group, self.scale_zeros)

    def dequantize(self, dtype=torch.bfloat16) -> torch.Tensor:
        """W (N, K) as the kernel sees it: the kernel applied to the identity (the packed layout is the kernel's)."""
        eye_KK = torch.eye(self.in_features, dtype=torch.bfloat16, device=self.packed.device)
        return self._mm(eye_KK).t().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_MK = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = _Int4MM.apply(x_MK, self) if x.requires_grad else self._mm(x_MK)
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


class _Int4MM(torch.autograd.Function):
    """The int4 GEMM with a backward for its input (the kernels have none): QLoRA trains adapters below a frozen INT4
    layer, so gradients must pass through it. dx = dy W, W dequantized for the backward only and dropped after."""

    @staticmethod
    def forward(ctx, x_MK, layer):
        ctx.layer = layer
        return layer._mm(x_MK)

    @staticmethod
    def backward(ctx, dy_MN):
        return dy_MN.to(torch.bfloat16) @ ctx.layer.dequantize(), None


# ---------------------------------------------------------------- the whole model
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

    linears, banks = quant_targets(model)
    for parent, name, lin in linears:
        setattr(parent, name, make(lin.weight, lin.bias))
    for moe in banks:
        gu_EFD, down_EDF = moe.experts.gate_up_proj, moe.experts.down_proj
        F_ = down_EDF.shape[2]
        moe.experts = QuantExperts(
            QuantExpert(make(gu[:F_]), make(gu[F_:]), make(dn)) for gu, dn in zip(gu_EFD, down_EDF)
        )
    if scheme == "fp8":  # save_hf writes it into config.json: a released-style FP8 folder
        model.cfg.hf_metadata["quantization_config"] = dict(FP8_CONFIG)
    model.quant_scheme = scheme
    return model


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
