"""MTP layers improve the loss per training token and give acceptance for speculative decoding (GLM-4.5 §2.1).

Arms: the ablate recipe with its MTP layer (loss weight 0.3, GLM-4.5's first value) and without one. Measured:
the held-out next-token loss (the main head only; the MTP term is not in it) at equal training tokens, and for the
MTP arm the share of one-token MTP drafts the engine accepts in greedy decoding (glmstack/inference/speculative.py:
the draft must equal the main head's argmax). On this chain every token has 4 equally likely successors, so a draft
that knew only the successor set would match ~25% of the time; the check asks for more than that.
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import mtp_acceptance, val_batches, val_loss


def measure(run) -> dict:
    out = {"val_loss": val_loss(run)}
    if run.arm == "mtp":
        model = run.model()
        prompts = [row[:8].tolist() for b in val_batches(run, model, 1) for row in b["input_ids"]]
        out["acceptance"] = mtp_acceptance(model, prompts)
    return out


CLAIM = Claim(
    name="mtp",
    source="GLM-4.5 §2.1, §4 (speculative decoding)",
    statement="MTP layers improve loss per training token and give acceptance for speculative decoding",
    arms={
        "mtp": [Stage(name="mtp", recipe="ablate", overrides={"schedule.mtp_weight": [[0, 0.3]]}, steps=300)],
        "no_mtp": [Stage(name="no_mtp", recipe="ablate", steps=300,
                         overrides={"model_overrides.num_nextn_predict_layers": 0, "schedule.mtp_weight": [[0, 0.0]]})],
    },
    measure=measure,
    checks=[
        Check(metric="val_loss", treatment="mtp", control="no_mtp", says="lower next-token loss per training token"),
        Check(metric="acceptance", treatment="mtp", kind="above", better="higher", margin=0.25,
              says="greedy drafts accepted more often than a successor-set guess (0.25)"),
    ],
    setup="ablate recipe with / without its MTP layer (weight 0.3); acceptance: 8 prompts x 24 greedy tokens, k=1",
)
