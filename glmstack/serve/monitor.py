"""Speculative-acceptance anomaly monitor: per-request MTP acceptance length and rate, and rules that flag or abort.

Why: Z.ai's GLM-5 serving post-mortem ("Scaling Pain of Coding Agent Serving", 2026) traced garbled output and
repetition under agentic load to KV-cache reuse races, and caught them with speculative-decoding statistics: the
MTP drafts stay good only while the target model's context is sound. An acceptance length below 1.4 over more than
128 generated tokens meant a corrupted context; an acceptance rate above 0.96 meant degenerate repetition (the
model copying itself, which the drafts predict perfectly). They now abort such generations online; so can we.

How: the scheduler feeds one verify step at a time (`step(n_emitted)`: the tokens it emitted, accepted drafts + 1);
acceptance length = mean tokens per verify step (tau), acceptance rate = accepted drafts / drafted tokens. Once
more than `min_tokens` tokens were generated, each step checks the rules; the first hit is the request's anomaly.
With action "abort" the scheduler ends the request (finish_reason "abort", the rule in the message); with "flag"
it only reports it (the response's `speculative` field and glmstack:speculative_anomalies_total in /metrics).

    glmstack serve CKPT --speculative mtp --monitor abort --monitor-min-length 1.4 --monitor-max-rate 0.96
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, frozen=True)
class MonitorConfig:
    min_acceptance_length: float = 1.4  # below: "corrupted-context"
    max_acceptance_rate: float = 0.96  # above: "degenerate-repetition"
    min_tokens: int = 128  # the rules apply once more tokens than this were generated
    action: str = "flag"  # "flag" | "abort" | "off"

    def __post_init__(self):
        if self.action not in ("flag", "abort", "off"):
            raise ValueError(f"monitor action must be 'flag', 'abort' or 'off', got {self.action!r}")


class AcceptanceMonitor:
    """One request's acceptance statistics (draft_k drafts per verify step)."""

    def __init__(self, cfg: MonitorConfig, draft_k: int):
        self.cfg, self.k = cfg, draft_k
        self.steps = self.emitted = 0
        self.anomaly: str | None = None
        self.history: list[int] = []  # tokens emitted per verify step (bench/monitor_table.py studies them)

    def step(self, n_emitted: int) -> str | None:
        """Record one verify step; -> the anomaly when this step raised one (at most once per request)."""
        self.steps += 1
        self.emitted += n_emitted
        self.history.append(n_emitted)
        if self.anomaly is not None or self.cfg.action == "off" or self.emitted <= self.cfg.min_tokens:
            return None
        if self.length < self.cfg.min_acceptance_length:
            self.anomaly = "corrupted-context"
        elif self.rate > self.cfg.max_acceptance_rate:
            self.anomaly = "degenerate-repetition"
        return self.anomaly

    @property
    def length(self) -> float:
        return self.emitted / max(self.steps, 1)

    @property
    def rate(self) -> float:
        return (self.emitted - self.steps) / max(self.steps * self.k, 1)

    def report(self) -> dict:
        return {"verify_steps": self.steps, "acceptance_length": round(self.length, 4),
                "acceptance_rate": round(self.rate, 4), "anomaly": self.anomaly}  # fmt: skip
