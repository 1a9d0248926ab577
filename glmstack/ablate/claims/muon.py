"""Muon beats AdamW at equal tokens (GLM-4.5 §2.4; Moonlight, arXiv 2502.16982).

Both arms train the same micro GLM on the same tokens with the same peak lr: Muon's update is scaled by
0.2·sqrt(max(A, B)) so its RMS matches AdamW's (`optim.adjust_lr=match_rms_adamw`), which is what lets the two
share one lr; embeddings, gains and the head are on AdamW in both arms (`optim.muon=false` puts everything on it).
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import val_loss

CLAIM = Claim(
    name="muon",
    source="GLM-4.5 §2.4",
    statement="Muon beats AdamW at equal tokens (RMS-matched learning rates)",
    arms={
        "muon": [Stage(name="muon", recipe="ablate", overrides={"optim.muon": True}, steps=300)],
        "adamw": [Stage(name="adamw", recipe="ablate", overrides={"optim.muon": False}, steps=300)],
    },
    measure=lambda run: {"val_loss": val_loss(run)},
    checks=[Check(metric="val_loss", treatment="muon", control="adamw", says="lower loss at equal tokens")],
    setup="ablate recipe (micro GLM-4.5 MoE), peak lr 3e-3 for both, warm-up + cosine, synthetic chain data",
)
