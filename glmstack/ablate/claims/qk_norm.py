"""QK-Norm stabilises the attention logits (GLM-4.5 §2.1: "we incorporate QK-Norm to stabilize the range of
attention logits").

Both arms train at 10x the ablate recipe's lr without gradient clipping, where instabilities show at this size;
measured: the largest pre-softmax attention logit |q·k|/sqrt(d) of any head on held-out batches after training
(glmstack/ablate/measure.py records it around the model's own attention call), the number of loss spikes (a step
whose loss exceeds the running mean by 20%), and the held-out loss.
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import max_attention_logit, spikes, val_batches, val_loss

HIGH_LR = {"optim.lr": 3e-2, "optim.grad_clip": 0.0}


def measure(run) -> dict:
    model = run.model()
    return {"max_logit": max_attention_logit(model, val_batches(run, model, 4)), "spikes": spikes(run.rows()),
            "val_loss": val_loss(run)}


CLAIM = Claim(
    name="qk_norm",
    source="GLM-4.5 §2.1",
    statement="QK-Norm stabilises attention logits (max logit, loss spikes at a high learning rate)",
    arms={
        "qk_norm": [Stage(name="qk_norm", recipe="ablate", overrides={**HIGH_LR, "model_overrides.use_qk_norm": True},
                          steps=300)],
        "no_qk_norm": [Stage(name="no_qk_norm", recipe="ablate",
                             overrides={**HIGH_LR, "model_overrides.use_qk_norm": False}, steps=300)],
    },
    measure=measure,
    checks=[
        Check(metric="max_logit", treatment="qk_norm", control="no_qk_norm", says="bounded attention logits"),
        Check(metric="spikes", treatment="qk_norm", control="no_qk_norm", says="fewer loss spikes"),
    ],
    setup="ablate recipe at lr 3e-2 (10x), no gradient clipping",
    curves=["loss", "grad_norm"],
)
