"""The environment interface of agentic RL, and what every tool environment shares.

    env = make_env("calculator", EnvOptions(fault_p=0.2), seed=7)   # glmstack.posttrain.agentic.envs
    messages, tools = env.reset(spec)               # spec: a JSON dict from env.sample(rng, split)
    step = env.step(assistant_message)              # -> Step(messages=[tool or user messages], done)
    reward = env.reward()                           # -> Reward(value, success, parts)

Why one small interface: GLM-5's rollout orchestrator treats every task as a service with its own rollout and reward
logic over one message-list format (§3.3); the episode runner (episode.py) only ever calls reset/step/reward, so a
new environment is a subclass with `sample`, `prompt`, `call` and `success`.

What `ToolEnv` adds, from GLM-4.5 §3.3 / GLM-5 §3.3 (research/rl-recipe.md §1.3):
  malformed call      a call that fails to parse or does not match its tool's JSON schema ends the episode, reward 0
  fault injection     with probability `fault_p` a call times out or returns an error message instead of running
  efficiency penalty  `call_penalty` per call beyond `free_calls`; reaching `max_tool_calls` ends the episode
                      (an endless tool loop) with no outcome reward and `loop_penalty` more
  process rewards     (`process_rewards`) `recover_bonus` when a call succeeded after an error and the task was
                      solved; `test_bonus` when the environment's tests were run before the final answer
  tool latency        (`tool_latency_s`) each call waits a log-normal time first (median `tool_latency_s`, shape
                      `tool_latency_sigma`), as remote tools (search APIs, sandboxes) do: the long tail of episode
                      times that asynchronous and partial rollouts exist for (bench/agentic_partial.py)
  environment crash   `EnvCrash` from a tool (or `crash_p`, to exercise the rule) marks the sample `env_error`:
                      excluded from training (groups.py), never scored as the model's failure.
"""

from __future__ import annotations

import abc
import json
import math
import random
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import ClassVar

from glmstack.posttrain.tools import FAULTS, validate_call
from glmstack.splits import split_of


class EnvCrash(RuntimeError):
    """The environment itself failed (not the model): the sample is excluded, not scored 0."""


@dataclass(kw_only=True)
class EnvOptions:
    fault_p: float = 0.0  # probability a tool call fails (timeout or error message) instead of running
    crash_p: float = 0.0  # probability a tool call crashes the environment (exercises the exclusion rule)
    # the episodes of a group draw the same faults (the k-th call of each fails alike): the group mean is then a
    # baseline for the same failures, so a failure the model did not choose does not set its advantage's sign
    group_faults: bool = False
    max_tool_calls: int = 4  # reaching it ends the episode as an endless tool loop
    free_calls: int = 2  # calls beyond this cost call_penalty each
    call_penalty: float = 0.05
    loop_penalty: float = 0.2  # extra penalty when max_tool_calls ended the episode
    process_rewards: bool = False  # GLM-5's process rewards (below)
    recover_bonus: float = 0.1  # a call succeeded after an error, and the task was solved
    test_bonus: float = 0.1  # ran the tests before answering (environments with tests)
    tool_latency_s: float = 0.0  # median seconds a tool call waits before it runs (0: none); log-normal
    tool_latency_sigma: float = 1.0  # the log-normal's shape: 1 puts the 99th percentile at ~10x the median


@dataclass
class Step:
    messages: list[dict]  # tool results (or the next user turn) to append; [] when done
    done: bool


@dataclass
class Reward:
    value: float  # what the advantage is computed from
    success: bool  # the task's outcome check alone (held-out success)
    parts: dict = field(default_factory=dict)  # outcome, penalty, process bonuses




class Env(abc.ABC):
    """reset(spec) -> (messages, tools); step(assistant message) -> Step; reward() -> Reward; `status` says how
    the episode ended: running | done | malformed | loop | truncated | env_error."""

    name = "env"

    def __init__(self, opts: EnvOptions | None = None, seed: int = 0):
        self.opts = opts or EnvOptions()
        self.rng = random.Random(seed)  # fault and crash draws: a pure function of the episode's seed
        self.latency_rng = random.Random(seed ^ 0x7A7E)  # its own stream: latency leaves the fault draws as they were
        self.status = "running"

    @classmethod
    def sample(cls, rng: random.Random, split: str, level: int = 0) -> dict:
        """A task spec (a JSON-able dict) of `split`, drawn with `rng`: held-out specs never train."""
        for _ in range(10_000):
            spec = cls.make_spec(rng, level)
            if split_of(cls.split_key(spec)) == split:
                return spec | {"env": cls.name}
        raise ValueError(f"environment {cls.name}: no {split} task found")

    @classmethod
    def split_key(cls, spec: dict) -> str:
        """The text a spec's split is hashed from (glmstack.splits): the whole spec, unless an environment shares its
        tasks with another set and must share that set's held-out items too."""
        return json.dumps(spec, sort_keys=True)

    @classmethod
    @abc.abstractmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        """One task spec."""

    @abc.abstractmethod
    def reset(self, spec: dict) -> tuple[list[dict], list[dict]]:
        """Start an episode: (prompt messages, tools)."""

    @abc.abstractmethod
    def step(self, message: dict) -> Step:
        """React to one assistant message (parsed: content, reasoning_content, tool_calls)."""

    @abc.abstractmethod
    def reward(self) -> Reward:
        """The episode's reward (call when it is over)."""

    def abort(self, status: str) -> None:
        """The episode ended outside the environment (truncated, malformed markup)."""
        self.status = status


class ToolEnv(Env):
    """Calls tools until the model answers without a call; subclasses define the task (see the module docstring)."""

    tools: ClassVar[list[dict]] = []

    def reset(self, spec: dict) -> tuple[list[dict], list[dict]]:
        self.spec, self.status = spec, "running"
        self.calls: list[tuple[str, dict, bool]] = []  # (name, arguments, the call succeeded)
        self.final: dict | None = None
        self.setup(spec)
        return self.prompt(spec), self.tools

    def setup(self, spec: dict) -> None:
        """Per-episode state (files, accounts, ...)."""

    def prompt(self, spec: dict) -> list[dict]:
        """The opening messages: by default the spec's question as one user turn."""
        return [{"role": "user", "content": spec["question"]}]

    @abc.abstractmethod
    def call(self, name: str, args: dict) -> str:
        """Run one tool call; return its text ("Error: ..." for a failed call); raise EnvCrash if broken."""

    @abc.abstractmethod
    def success(self) -> bool:
        """Whether the episode solved the task (after the final answer)."""

    def answer(self, message: dict) -> Step:
        """A reply without tool calls: the episode ends (multi-turn environments may continue with a user turn)."""
        self.final, self.status = message, "done"
        return Step([], True)

    def process_parts(self) -> dict:
        """Environment-specific process rewards (e.g. tests run before answering)."""
        return {}

    def step(self, message: dict) -> Step:
        calls = message.get("tool_calls") or []
        if not calls:
            return self.answer(message)
        if any(validate_call(c, self.tools) is not None for c in calls):
            self.status = "malformed"
            return Step([], True)
        out = []
        for c in calls:
            if len(self.calls) >= self.opts.max_tool_calls:
                self.status = "loop"
                return Step([], True)
            name, args = c["function"]["name"], json.loads(c["function"]["arguments"])
            out.append({"role": "tool", "content": self._run(name, args)})
        return Step(out, False)

    def _run(self, name: str, args: dict) -> str:
        o = self.opts
        if o.tool_latency_s > 0:
            time.sleep(self.latency_rng.lognormvariate(math.log(o.tool_latency_s), o.tool_latency_sigma))
        if self.rng.random() < self.opts.crash_p:
            self.status = "env_error"
            raise EnvCrash(f"{self.name}: injected environment crash")
        if self.rng.random() < self.opts.fault_p:
            kind = self.rng.choice(sorted(FAULTS))
            self.calls.append((name, args, False))
            return FAULTS[kind].format(name=name)
        text = self.call(name, args)
        self.calls.append((name, args, not text.startswith("Error")))
        return text

    def reward(self) -> Reward:
        o = self.opts
        if self.status in ("malformed", "env_error"):
            return Reward(0.0, False, {"outcome": 0.0})
        solved = self.status == "done" and self.success()
        penalty = o.call_penalty * max(0, len(self.calls) - o.free_calls)
        penalty += o.loop_penalty if self.status == "loop" else 0.0
        parts = {"outcome": float(solved), "penalty": -penalty}
        if o.process_rewards:
            oks = [ok for _, _, ok in self.calls]
            recovered = solved and any(not a and b for a, b in pairwise(oks))
            parts["recover"] = o.recover_bonus if recovered else 0.0
            parts |= self.process_parts()
        return Reward(sum(parts.values()), solved, parts)

    def called(self, name: str) -> list[dict]:
        return [args for n, args, _ in self.calls if n == name]


ENVS: dict[str, type[Env]] = {}


def register(cls: type[Env]) -> type[Env]:
    ENVS[cls.name] = cls
    return cls
