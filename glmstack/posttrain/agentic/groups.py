"""What happens to a finished group before training: GLM-5's failure rules, the staleness drop and advantages.

GLM-5 §3.3 (research/rl-recipe.md §1.3):
  staleness       a sample whose first weight version w0 is more than `tau` behind the trainer's current version
                  w' (w' − w0 > tau) is dropped
  env failures    samples that failed because the environment crashed are excluded; when more than half of the
                  group survives, it is padded back to its size by repeating survivors, else the group is dropped
  advantage       reward − group mean (no std division; Dr.GRPO / GLM-4.5's agentic objective)
A malformed call already carries reward 0 (env.py): it is the model's failure and stays in the group.

    kept, why = settle(group, group_size=8, current=12, tau=2)   # kept: list or None; why: counts for the dashboard
    adv = advantages([t.reward for t in kept], group_size=8)
"""

from __future__ import annotations

import torch

from glmstack.posttrain.agentic.trajectory import Trajectory
from glmstack.posttrain.rl.losses import group_advantages


def is_stale(t: Trajectory, current: int, tau: int) -> bool:
    return current - t.first_version > tau


def settle(group: list[Trajectory], group_size: int, current: int, tau: int) -> tuple[list[Trajectory] | None, dict]:
    """The group as trained (padded to `group_size`), or None when it is dropped; plus what was removed."""
    stale = [t for t in group if is_stale(t, current, tau)]
    crashed = [t for t in group if t.status == "env_error" and not is_stale(t, current, tau)]
    valid = [t for t in group if t.status != "env_error" and not is_stale(t, current, tau)]
    why = {"stale": len(stale), "env_error": len(crashed), "padded": 0, "dropped_groups": 0}
    if len(valid) * 2 <= group_size:
        why["dropped_groups"] = 1
        return None, why
    padded = valid + [valid[k % len(valid)] for k in range(group_size - len(valid))]
    why["padded"] = group_size - len(valid)
    return padded, why


def advantages(rewards: list[float], group_size: int) -> torch.Tensor:
    """reward − group mean, `[N]` for consecutive groups of `group_size` (GLM-5 agentic RL: no std)."""
    return group_advantages(torch.tensor(rewards, dtype=torch.float32), group_size, std_normalize=False)
