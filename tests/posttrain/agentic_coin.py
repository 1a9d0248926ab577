"""A one-turn environment whose reward is a coin flip drawn from the episode's seed, whatever the model says.

Why: a random tiny model never solves the real environments, so every reward is 0 and every advantage vanishes;
with this one a group gets mixed rewards (non-zero advantages, a non-zero DIS gradient) that are a pure function of
(run seed, task id, index in the group) — the same in every runner. The tests load it by import path:

    cfg.agentic.envs = [["tests.posttrain.agentic_coin:CoinEnv", 1.0]]
"""

from __future__ import annotations

import random

from glmstack.posttrain.agentic.env import Env, Reward, Step


class CoinEnv(Env):
    name = "coin"

    @classmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        return {"n": rng.randrange(10_000)}

    def reset(self, spec: dict) -> tuple[list[dict], list[dict]]:
        self.status, self.heads = "running", self.rng.random() < 0.5
        return [{"role": "user", "content": f"Say something about the number {spec['n']}."}], []

    def step(self, message: dict) -> Step:
        self.status = "done"
        return Step([], True)

    def reward(self) -> Reward:
        return Reward(float(self.heads), self.heads, {"coin": float(self.heads)})


class SlowCoinEnv(CoinEnv):
    """CoinEnv whose episodes of every third spec take 1.5 s (a long tail of episode lengths)."""

    name = "slow_coin"

    def step(self, message: dict) -> Step:
        import time

        if self.spec_n % 3 == 0:
            time.sleep(1.5)
        return super().step(message)

    def reset(self, spec: dict) -> tuple[list[dict], list[dict]]:
        self.spec_n = spec["n"]
        return super().reset(spec)
