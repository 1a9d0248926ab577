"""Cosine decay beats warm-up–stable–decay (WSD) at the end of pre-training (GLM-4.5 §2.4).

GLM-4.5 chose cosine over WSD because "models trained with the WSD schedule perform worse on general benchmarks
(SimpleQA, MMLU), indicating underfitting in the stable stage". Both arms: the same warm-up, peak and final lr
(10% of peak); WSD decays linearly over the last 20% of the steps (MiniCPM's shape, `schedule.wsd_decay_frac`).
Scored by the held-out loss at the end of training, the only place the two schedules are comparable.
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import val_loss

CLAIM = Claim(
    name="cosine_wsd",
    source="GLM-4.5 §2.4",
    statement="cosine decay ends pre-training at a lower loss than WSD",
    arms={
        "cosine": [Stage(name="cosine", recipe="ablate", overrides={"schedule.lr": "cosine"}, steps=300)],
        "wsd": [Stage(name="wsd", recipe="ablate", overrides={"schedule.lr": "wsd"}, steps=300)],
    },
    measure=lambda run: {"val_loss": val_loss(run)},
    checks=[Check(metric="val_loss", treatment="cosine", control="wsd", says="WSD underfits: cosine ends lower")],
    setup="ablate recipe, same warm-up (10%), peak 3e-3 and final lr (10% of peak); WSD decays over the last 20%",
    curves=["loss", "lr"],
)
