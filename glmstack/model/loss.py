"""The LM loss: token cross-entropy of the LM head, plain and fused with the head's matmul.

`cross_entropy(lm_head(h), labels)` is the plain reference: fp32 log-softmax over (N, V) logits, then NLL, then
autograd's backward through both (a second (N, V) pass, a zero-filled (N, V) NLL gradient, a third pass).
`linear_cross_entropy(h, W, labels)` computes the same loss without keeping logits (the Liger-Kernel idea,
arXiv 2410.10989): per chunk of rows it forms the logits, turns them in place into softmax - onehot (the
gradient of the mean CE with respect to the logits), and runs the two backward GEMMs of the head right away; the
autograd backward only scales the stored dh/dW by the incoming gradient. Same GEMMs, one elementwise pass
fewer and no (N, V) tensor outlives the forward. The switch is `ModelConfig.fused_lm_loss`
(tests/unit/test_model_loss.py checks both equal, loss and gradients, fp32 and bf16).

Shape legend: N tokens (B*T flattened), D hidden, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glmstack.model import gemm

CHUNK_ELEMENTS = 2**20  # fp32 logits per chunk (4 MiB: reused from the heap, no page faults; 256 rows at V=4096)
MIN_CHUNK_ROWS = 256  # but never fewer rows than this: the head's GEMMs stay large at real vocabularies (151k)


def cross_entropy(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy in fp32 over labels != -100 (labels already shifted). The reference."""
    return F.cross_entropy(logits_BTV.float().flatten(0, 1), labels_BT.flatten(), ignore_index=-100)


def linear_cross_entropy(h_BTD: torch.Tensor, w_VD: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """== cross_entropy(h_BTD @ w_VD.T, labels_BT); the head's gradients are computed in the forward when needed."""
    h_ND, labels_N = h_BTD.flatten(0, 1), labels_BT.flatten()
    if torch.is_grad_enabled() and (h_ND.requires_grad or w_VD.requires_grad):
        return _LinearCrossEntropy.apply(h_ND, w_VD, labels_N)
    with torch.no_grad():
        return _chunked(h_ND, w_VD, labels_N, grads=False)[0]


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_ND, w_VD, labels_N):
        loss, dh_ND, dw_VD = _chunked(h_ND, w_VD, labels_N, grads=True)
        ctx.save_for_backward(dh_ND, dw_VD)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        dh_ND, dw_VD = ctx.saved_tensors
        g = grad_loss.to(dh_ND.dtype)
        return dh_ND * g, dw_VD * g, None


def _chunked(h_ND, w_VD, labels_N, grads: bool):
    """-> (mean loss fp32, dh (N, D) or None, dW (V, D) or None) of the mean CE over labels != -100."""
    N, V = labels_N.shape[0], w_VD.shape[0]
    valid_N = labels_N != -100
    n_valid = valid_N.sum()
    target_N = labels_N.masked_fill(~valid_N, 0)
    # rows of the mean: 1/n_valid each for valid rows, 0 for ignored ones (0/0 guarded; the loss itself is 0/0)
    row_w_N = valid_N.float() / n_valid.clamp_min(1)
    dh_ND = torch.empty_like(h_ND) if grads else None
    dw_DV = None  # the head's gradient transposed: h^T g per chunk needs no (V, D) transpose copy per chunk
    total = h_ND.new_zeros((), dtype=torch.float32)
    step = max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // V)
    for a in range(0, N, step):
        b = min(a + step, N)
        z_nV = gemm.mm(h_ND[a:b], w_VD.t()).float()
        tgt_n, w_n = target_N[a:b], row_w_N[a:b]
        picked_n = z_nV.gather(1, tgt_n[:, None]).squeeze(1)
        m_n1 = z_nV.amax(1, keepdim=True)
        s_n1 = z_nV.sub_(m_n1).exp_().sum(1, keepdim=True)  # z is now exp(logit - max)
        lse_n = (s_n1.log() + m_n1).squeeze(1)
        total = total + ((lse_n - picked_n) * valid_N[a:b]).sum()
        if grads:  # z -> (softmax - onehot) * w_row: d(mean CE)/d(logits)
            z_nV.mul_(w_n[:, None] / s_n1)
            z_nV.scatter_add_(1, tgt_n[:, None], -w_n[:, None])
            g_nV = z_nV.to(h_ND.dtype)
            gemm.mm(g_nV, w_VD, out=dh_ND[a:b])
            dw_nDV = gemm.mm_tn(h_ND[a:b], g_nV).float()  # chunks summed in fp32
            dw_DV = dw_nDV if dw_DV is None else dw_DV.add_(dw_nDV)
    loss = total / n_valid
    return loss, dh_ND, (dw_DV.t().to(w_VD.dtype).contiguous() if grads else None)
