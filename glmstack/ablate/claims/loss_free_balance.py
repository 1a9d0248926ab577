"""Loss-free balancing balances the experts at least as well as an auxiliary loss, without hurting the loss
(GLM-4.5 §2.1 / §2.4, DeepSeek-V3's auxiliary-loss-free strategy, arXiv 2408.15664).

Arms: the bias update (u = 1e-3 per step, no balance loss) against a conventional auxiliary balance loss
(α = 1e-2, no bias update). Measured: max/mean expert load (the worst MoE layer, averaged over the last 20% of the
steps; 1.0 = perfectly even) and the held-out loss. Both checks are non-inferiority checks: "at least as well"
within 0.05 of max/mean, "without hurting" within 0.01 nats.
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import tail_mean, val_loss


def measure(run) -> dict:
    rows = run.rows()
    layers = sorted({k for r in rows for k in r if k.startswith("moe/max_over_mean/")})
    return {"max_over_mean": max(tail_mean(rows, k) for k in layers), "val_loss": val_loss(run)}


CLAIM = Claim(
    name="loss_free_balance",
    source="GLM-4.5 §2.1, §2.4",
    statement="loss-free balancing balances experts at least as well as an auxiliary loss without hurting the loss",
    arms={
        "loss_free": [Stage(name="loss_free", recipe="ablate", steps=300,
                            overrides={"schedule.balance_rate": [[0, 1e-3]], "schedule.aux_loss_weight": 0.0})],
        "aux_loss": [Stage(name="aux_loss", recipe="ablate", steps=300,
                           overrides={"schedule.balance_rate": [[0, 0.0]], "schedule.aux_loss_weight": 1e-2})],
    },
    measure=measure,
    checks=[
        Check(metric="max_over_mean", treatment="loss_free", control="aux_loss", kind="no_worse", margin=0.05,
              says="balances at least as well"),
        Check(metric="val_loss", treatment="loss_free", control="aux_loss", kind="no_worse", margin=0.01,
              says="without hurting the loss"),
    ],
    setup="ablate recipe (8 experts, top-2); bias rate 1e-3 vs sequence-wise aux loss alpha 1e-2",
    curves=["loss", "moe/max_over_mean/0"],
)
