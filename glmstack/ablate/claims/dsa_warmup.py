"""DSA's warm-up recovers dense attention's loss (GLM-5 §2.1.1; DeepSeek-V3.2 §2.1.1): after the dense warm-up
of the lightning indexer (only the indexers train, on the KL to the main attention) and a short sparse adaptation,
top-k sparse attention matches the dense model's loss, and the warm-up is what makes that possible.

All arms start from one dense MLA pre-training per seed (the glm5_dsa recipe, trained once and shared), then:
  dsa         indexer warm-up (glm5_dsa midtrain) -> sparse adaptation (glm5_dsa sparse, top-k on)
  dsa_cold    sparse adaptation straight away (a random indexer picks the keys)
  dense       the sparse stage's steps and lr with attention kept dense (the reference)
Every continuation starts with a fresh optimizer (optim_state=fresh, the same lr re-warm-up), so the arms differ
only by the attention. Measured: the held-out LM loss at the end (sparse arms: with top-k selection on).
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import val_loss

SIZE = {"seq_len": 64, "micro_batch_size": 8}
PRE = Stage(name="pre", recipe="glm5_dsa", fn="pretrain", steps=150, cost=3.0,
            overrides=SIZE | {"model_overrides.index_topk": 8})
WARM = Stage(name="warmup", recipe="glm5_dsa", fn="midtrain", steps=40, cost=3.0, warmup_frac=0.0,
             overrides=SIZE, init_from="pre")
SPARSE = {"optim_state": "fresh"} | SIZE


def sparse(name: str, init_from: str, **over) -> Stage:
    return Stage(name=name, recipe="glm5_dsa", fn="sparse", steps=40, cost=3.0, warmup_frac=0.0,
                 overrides=SPARSE | over, init_from=init_from)


CLAIM = Claim(
    name="dsa_warmup",
    source="GLM-5 §2.1.1",
    statement="DSA warm-up recovers dense attention's loss",
    arms={
        "dsa": [PRE, WARM, sparse("sparse_after_warmup", "warmup")],
        "dsa_cold": [PRE, sparse("sparse_cold", "pre")],
        "dense": [PRE, sparse("dense_more", "pre", **{"model_overrides.dsa_stage": "dense"})],
    },
    measure=lambda run: {"val_loss": val_loss(run)},
    checks=[
        Check(metric="val_loss", treatment="dsa", control="dense", kind="no_worse", margin=0.02,
              says="sparse after warm-up recovers the dense loss (within 0.02)"),
        Check(metric="val_loss", treatment="dsa", control="dsa_cold", says="the warm-up is what recovers it"),
    ],
    setup="tiny GLM-5 (MLA + DSA indexer), seq 64, top-k 8 keys; dense pre-training shared by the arms of a seed",
)
