"""GLM-130B's stabilisers at a learning rate where the Pre-LN baseline spikes: DeepNorm and the embedding-gradient
shrink (arXiv 2210.02414 §2.3; issue 21). Moved here from bench/ablate_glm_family.py.

Arms: the ablate recipe's micro model as 4 dense layers, AdamW at lr 0.3, no gradient clipping, 10% warm-up then
cosine, no MTP; Pre-LN (the default), DeepNorm (`model_overrides.deepnorm`: Post-LN with alpha residual scaling and
beta init), embedding-gradient shrink alpha = 0.1. Measured: loss spikes (a step whose loss exceeds the running
mean by 20%), the largest gradient norm, and the final training loss. GLM-130B's claim is about 70-layer bf16 models;
a 4-layer fp32 model does not have their instabilities, so this says whether the options act at this scale.
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import spikes

BASE = {"optim.muon": False, "optim.lr": 0.3, "optim.grad_clip": 0.0, "schedule.mtp_weight": [[0, 0.0]],
        "model_overrides.num_hidden_layers": 4, "model_overrides.first_k_dense_replace": 4,
        "model_overrides.num_nextn_predict_layers": 0}


def measure(run) -> dict:
    rows = run.rows()
    return {"spikes": spikes(rows), "max_grad_norm": max(r["grad_norm"] for r in rows), "final_loss": rows[-1]["loss"]}


def arm(name: str, **over) -> list[Stage]:
    return [Stage(name=name, recipe="ablate", overrides=BASE | over, steps=100, cost=1.5)]


CLAIM = Claim(
    name="stabilisers",
    source="GLM-130B §2.3",
    statement="DeepNorm and the embedding-gradient shrink stabilise training at a high learning rate",
    arms={"pre_ln": arm("pre_ln"), "deepnorm": arm("deepnorm", **{"model_overrides.deepnorm": True}),
          "shrink": arm("shrink", **{"model_overrides.embedding_grad_shrink": 0.1})},
    measure=measure,
    default=False,  # GLM (2021) / GLM-130B, not the GLM-4.5 / GLM-5 set: run when named
    checks=[Check(metric="spikes", treatment="deepnorm", control="pre_ln", says="DeepNorm: fewer loss spikes"),
            Check(metric="spikes", treatment="shrink", control="pre_ln", says="shrink: fewer loss spikes")],
    setup="micro model as 4 dense layers, AdamW lr 0.3, no clipping, no MTP",
    curves=["loss", "grad_norm"],
)
