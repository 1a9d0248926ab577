"""IcePop keeps RL stable under train/inference mismatch (GLM-5 §3.2; docs/rl.md).

`glmstack rl` with a controlled mismatch: every step's rollouts come from the weights plus 0.4·std(W) Gaussian
noise per matrix (`rl.rollout_noise`), so the rollout engine's log-probs differ from the trainer's (mean |Δlogp|
~1); plain GRPO (`rl.mismatch=none`) trains on them as if on-policy, IcePop masks tokens whose probability ratio
leaves [1/2, 2]. Task: the token task on a random micro GLM (rl_tiny). Measured: the largest and mean gradient
norm over the run (stability) and the reward over the last 20% of the steps (IcePop should not cost reward).
"""

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import tail_mean
from glmstack.recipes.ablate import MICRO

RL = {"rl.rollout_noise": 0.4, "rl.eval_every": 0, "rl.heldout_n": 8, "rl.samples_per_step": 16,
      "model_overrides": MICRO | {"num_nextn_predict_layers": 0}}


def measure(run) -> dict:
    rows = run.rows()
    norms = [r["grad_norm"] for r in rows if "grad_norm" in r]
    return {"grad_norm_max": max(norms), "grad_norm_mean": sum(norms) / len(norms),
            "reward": tail_mean(rows, "reward")}


def arm(mismatch: str) -> list[Stage]:
    return [Stage(name=mismatch, recipe="rl_tiny", fn="rl", kind="rl", steps=100, cost=6.0, warmup_frac=0.0,
                  overrides=RL | {"rl.mismatch": mismatch})]


CLAIM = Claim(
    name="icepop",
    source="GLM-5 §3.2",
    statement="IcePop keeps RL stable under train/inference mismatch",
    arms={"icepop": arm("icepop"), "grpo": arm("none")},
    measure=measure,
    checks=[
        Check(metric="grad_norm_max", treatment="icepop", control="grpo", says="no gradient blow-ups"),
        Check(metric="reward", treatment="icepop", control="grpo", kind="no_worse", margin=0.05,
              better="higher", says="without losing reward"),
    ],
    setup="rl_tiny token task on the micro GLM, 16 rollouts/step, lr 3e-3 constant, rollout noise 0.4",
    curves=["grad_norm", "reward"],
)
