"""Our DPO objective equals TRL's on the same batch and reference log-probs: loss, its gradient w.r.t. the policy's
per-token log-probs, and the reported metrics (rewards/*, logps/*), within 1e-5, for sigmoid, IPO and cDPO.

TRL's loss lives inside `DPOTrainer._compute_loss` (trl 1.16: no standalone `dpo_loss` any more), which runs the
model and reads a few trainer attributes. It is called here as an unbound method on a stand-in `self` carrying only
those attributes and a stand-in model whose fused LM head "returns" the test's per-token log-probs (zero outside the
completion, as TRL's head returns for labels -100). The reference log-probs go in as TRL's precomputed ones.

cDPO: trl 1.16's "sigmoid" no longer reads label_smoothing; its losses are linear in the per-pair terms, so cDPO
(1−ε)·S + ε·S' (S = −log σ(βΔ), S' = −log σ(−βΔ)) is TRL's own "sigmoid" and "robust" (R = ((1−ε)S − εS')/(1−2ε))
combined with loss_weights [2(1−ε), −(1−2ε)]: 2(1−ε)S − (1−ε)S + εS' = (1−ε)S + εS'.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from glmstack.posttrain.dpo.loss import completion_logps, completion_sums, dpo_loss

trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")
B, T, V = 4, 12, 11  # pairs, tokens, vocabulary
METRICS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")  # fmt: skip


def make_batch(seed: int) -> dict:
    """2B rows (chosen then rejected): a prompt of 2-5 tokens, a completion after it, then padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (2 * B, T), generator=g)
    mask, attn = torch.zeros(2 * B, T, dtype=torch.long), torch.zeros(2 * B, T, dtype=torch.long)
    for i in range(2 * B):
        p = int(torch.randint(2, 6, (1,), generator=g))
        c = int(torch.randint(1, T - p + 1, (1,), generator=g))
        mask[i, p : p + c], attn[i, : p + c] = 1, 1
    token_logps = -torch.rand(2 * B, T - 1, generator=g) * 4  # (2B, T-1) any log-probs ≤ 0
    ref = -torch.rand(2 * B, generator=g) * 12 - 4  # (2B,) reference sequence log-probs
    return {"ids": ids, "mask": mask, "attn": attn, "token_logps": token_logps, "ref": ref}


class StandInModel:
    """What _compute_loss reads of a model's output: per-token log-probs (fused head), entropy, mean logits, top-1."""

    training = True

    def __init__(self, token_logps: torch.Tensor, shift_mask: torch.Tensor):
        self.token_logps, self.shift_mask = token_logps, shift_mask

    def __call__(self, **kwargs):
        zeros = torch.zeros_like(self.token_logps)
        return SimpleNamespace(log_probs=self.token_logps * self.shift_mask, entropy=zeros, mean_logits=zeros,
                               is_top1=zeros.bool())  # fmt: skip


def trl_side(b: dict, beta: float, loss_types: list[str], weights: list[float], eps: float):
    """-> (TRL's loss, its gradient w.r.t. the per-token log-probs, its metrics)."""
    token_logps = b["token_logps"].clone().requires_grad_()
    model = StandInModel(token_logps, b["mask"][:, 1:].float())
    self = SimpleNamespace(
        model=model, accelerator=SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x,
                                                 gather_for_metrics=lambda x: x),
        aux_loss_enabled=False, use_weighting=False, precompute_ref_logps=True, ld_alpha=None, f_divergence_type="reverse_kl",
        loss_types=loss_types, loss_weights=weights, beta=beta, label_smoothing=eps,
        _metrics=defaultdict(lambda: defaultdict(list)), _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    inputs = {"input_ids": b["ids"], "attention_mask": b["attn"], "completion_mask": b["mask"],
              "ref_chosen_logps": b["ref"][:B], "ref_rejected_logps": b["ref"][B:]}  # fmt: skip
    loss = trl_dpo.DPOTrainer._compute_loss(self, model, inputs, return_outputs=False)
    loss.backward()
    return loss.detach(), token_logps.grad, {k: self._metrics["train"][k][-1] for k in METRICS}


def our_side(b: dict, beta: float, loss_type: str, eps: float, sft: float = 0.0):
    token_logps = b["token_logps"].clone().requires_grad_()
    logps, counts = completion_sums(token_logps, b["mask"])
    (lc, lr), (rc, rr), (nc, nr) = logps.chunk(2), b["ref"].chunk(2), counts.chunk(2)
    loss, metrics = dpo_loss(lc, lr, rc, rr, nc, nr, beta=beta, label_smoothing=eps, loss_type=loss_type,
                             sft_weight=sft)  # fmt: skip
    loss.backward()
    return loss.detach(), token_logps.grad, {k: float(metrics[k]) for k in METRICS}


CASES = [  # (ours: loss_type, ε), (TRL: loss types, weights), β
    (("sigmoid", 0.0), (["sigmoid"], [1.0]), 0.1),
    (("sigmoid", 0.0), (["sigmoid"], [1.0]), 1.0),
    (("ipo", 0.0), (["ipo"], [1.0]), 0.1),
    (("ipo", 0.0), (["ipo"], [1.0]), 0.5),
    (("sigmoid", 0.1), (["sigmoid", "robust"], [2 * 0.9, -0.8]), 0.1),
    (("sigmoid", 0.3), (["sigmoid", "robust"], [2 * 0.7, -0.4]), 0.5),
    (("sigmoid", 0.0, 1.0), (["sigmoid", "sft"], [1.0, 1.0]), 0.1),  # RPO: DPO + α · NLL of the chosen replies
    (("sigmoid", 0.0, 0.2), (["sigmoid", "sft"], [1.0, 0.2]), 0.5),
]


@pytest.mark.parametrize(("ours", "theirs", "beta"), CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_dpo_loss_gradient_and_metrics_equal_trl(ours, theirs, beta, seed):
    b = make_batch(seed)
    loss, grad, metrics = our_side(b, beta, *ours)
    t_loss, t_grad, t_metrics = trl_side(b, beta, *theirs, eps=ours[1])
    torch.testing.assert_close(loss, t_loss, atol=1e-5, rtol=1e-5)
    assert grad.abs().max() > 0  # the comparison below is of a gradient that exists
    torch.testing.assert_close(grad, t_grad, atol=1e-5, rtol=1e-5)
    for k in METRICS:
        assert metrics[k] == pytest.approx(t_metrics[k], abs=1e-5), k


def test_completion_logps_equal_trl_selective_log_softmax():
    """Our log-probs from logits score token t+1 at position t over the completion only, as TRL's do."""
    from trl.trainer.utils import selective_log_softmax

    b = make_batch(2)
    logits = torch.randn(2 * B, T, V, generator=torch.Generator().manual_seed(3))
    ours, counts = completion_logps(logits, b["ids"], b["mask"])
    theirs = (selective_log_softmax(logits[:, :-1], b["ids"][:, 1:]) * b["mask"][:, 1:]).sum(-1)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(counts, b["mask"].sum(-1).float())  # masks start after the first token
