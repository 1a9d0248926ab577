"""The frozen reference of DPO and its completion log-probs: computed on the fly per micro-batch, or once for every
pair before training and cached in the batches.

Why both: the on-the-fly reference costs one more forward per micro-batch and a second model in memory for the
whole run; the cache (TRL's `precompute_ref_log_probs`) costs one pass over the pairs at the start and then
nothing. The reference is the policy's step-0 weights (init_from's, or the seeded init), rebuilt from them on
every start, so a resumed run caches the same values it began with.

    reference = build_reference(cfg, device)              # frozen, eval mode
    cache_reference(batches, reference, device, amp)      # batches.ref = (pairs, 2)
    ref_2B = reference_logps(reference, batch)            # (2B,) on the fly
"""

from __future__ import annotations

import contextlib

import torch

from glmstack.posttrain.dpo.loss import batch_logps


def build_reference(cfg, device: torch.device):
    """The stage's starting model, frozen: eval mode (no dropout), no parameter needs a gradient."""
    from glmstack.train.stage import initial_model

    model = initial_model(cfg, device).eval()
    model.requires_grad_(False)
    return model


@torch.no_grad()
def reference_logps(reference, batch: dict) -> torch.Tensor:
    """The reference's completion log-probs of a batch's rows -> (2B,) float32."""
    out = reference(batch["input_ids"], segment_ids=batch["segment_ids"], position_ids=batch.get("position_ids"))
    return batch_logps(out.logits, batch)[0]


def cache_reference(batches, reference, device: torch.device, amp: torch.dtype | None) -> None:
    """Fill `batches.ref` (pairs, 2) with the reference's (chosen, rejected) log-probs of every pair, in order,
    under the loop's precision (bf16 autocast on GPU)."""
    rows = []
    for batch in batches.once():
        batch = {k: v.to(device) for k, v in batch.items()}
        ctx = torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()
        with ctx:
            chosen, rejected = reference_logps(reference, batch).chunk(2)
        rows.append(torch.stack([chosen, rejected], dim=1).cpu())  # (b, 2)
    batches.ref = torch.cat(rows)
