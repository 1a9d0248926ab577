"""Score a chat model folder on an environment's held-out tasks without training: the start-point check before an
agentic RL run (is the task in the band where RL can show?) and the retry check after recovery SFT.

    python -m glmstack.posttrain.agentic.probe runs/r20/sft/model --env calculator --level 1
    python -m glmstack.posttrain.agentic.probe MODEL --env calculator --fault-p 0.5 --temperature 1
    python -m glmstack.posttrain.agentic.probe MODEL --env search --level 1 --max-turns 6 --keep-last 1  # context

Prints success over `--n` held-out tasks (drawn as the stage draws them with `heldout_seed`; the count of distinct
tasks says how coarse the figure is) and, with injected failures, `retry_frac`: of the episodes with a failed call,
the share that called again. One episode per task, greedy unless `--temperature` > 0 (then seeded per episode).
`--group G` plays G episodes of each task (at a temperature > 0) and adds `mixed_groups`, the share of tasks whose
episodes disagree — the groups that carry an RL gradient (agentic.dynamic_sampling keeps only those) — and
`pass_at_group`, the share solved at least once.
Context management (agentic/context.py): `--keep-last`, `--token-budget`, `--budget-action`; the output then adds
`truncated_frac` (episodes that ran out of context) and `folds` (folds per episode).
"""

from __future__ import annotations

import argparse
import json
import sys


def probe(model_dir: str, env: str, level: int = 0, n: int = 128, seed: int = 0, fault_p: float = 0.0,
          temperature: float = 0.0, max_turns: int = 3, context=None, max_calls: int = 4, group: int = 1) -> dict:  # fmt: skip
    """{success, distinct, retry_frac (when a call failed)} of `model_dir` on `n` held-out tasks of `env` (+
    mixed_groups, pass_at_group with `group` > 1 episodes a task)."""
    from glmstack.model.hf import load_hf
    from glmstack.posttrain.agentic.data import retry_stats
    from glmstack.posttrain.agentic.env import EnvOptions
    from glmstack.posttrain.agentic.episode import EpisodeOptions, run_group
    from glmstack.posttrain.agentic.stage import AgenticOptions, heldout
    from glmstack.posttrain.agentic.worker import RolloutWorker

    o = AgenticOptions(envs=[[env, 1.0]], level=level, heldout_n=n)
    episode = EpisodeOptions(max_turns=max_turns, max_new_tokens=40)  # the agentic recipes' episodes
    if context is not None:
        episode.context = context
    specs = [spec for spec in heldout(o, seed) for _ in range(group)]
    worker = RolloutWorker(load_hf(model_dir), model_dir, episode, EnvOptions(), seed)
    worker.set_weights(None, 0)
    run = EpisodeOptions(**{**vars(episode), "temperature": temperature})
    env = EnvOptions(fault_p=fault_p, max_tool_calls=max_calls, free_calls=max_calls)
    trajs = run_group(worker.policy, worker.tokenizer, specs, run, env, list(range(len(specs))), version=lambda: 0)
    n, distinct = len(trajs), len({json.dumps(s, sort_keys=True) for s in specs})
    groups = [{t.success for t in trajs[i : i + group]} for i in range(0, n, group)]
    spread = {"mixed_groups": sum(len(g) == 2 for g in groups) / len(groups),
              "pass_at_group": sum(True in g for g in groups) / len(groups)} if group > 1 else {}  # fmt: skip
    return spread | {"success": sum(t.success for t in trajs) / n, "distinct": distinct,
            "truncated_frac": sum(t.status == "truncated" for t in trajs) / n,
            "folds": sum(len(t.view.folds) for t in trajs) / n} | retry_stats(trajs)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m glmstack.posttrain.agentic.probe", description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a chat model folder (with tokenizer.json)")
    ap.add_argument("--env", default="calculator")
    ap.add_argument("--level", type=int, default=0)
    ap.add_argument("--n", type=int, default=128, help="held-out tasks")
    ap.add_argument("--seed", type=int, default=0, help="the held-out draw (the stage's agentic.heldout_seed)")
    ap.add_argument("--fault-p", type=float, default=0.0, help="probability a tool call fails")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--max-turns", type=int, default=3, help="assistant turns per episode (agentic_recovery: 4)")
    ap.add_argument("--max-calls", type=int, default=4, help="tool calls before an episode counts as a loop")
    ap.add_argument("--keep-last", type=int, default=0, help="keep the k latest tool results (0 = all)")
    ap.add_argument("--token-budget", type=int, default=0, help="fold the oldest tool turns past this (0 = off)")
    ap.add_argument("--group", type=int, default=1, help="episodes per task (with --temperature > 0)")
    ap.add_argument("--budget-action", default="stub", choices=("stub", "discard", "summarize"))
    a = ap.parse_args(argv)
    from glmstack.posttrain.agentic.context import ContextOptions

    if a.group < 1:
        print(f"probe: --group {a.group}: must be >= 1 (episodes per task)", file=sys.stderr)
        return 2
    if a.group > 1 and a.temperature <= 0:
        print("probe: --group > 1 needs --temperature > 0 (greedy episodes of a task are all alike)", file=sys.stderr)
        return 2
    context = ContextOptions(keep_last_tool_results=a.keep_last, token_budget=a.token_budget,
                             budget_action=a.budget_action)  # fmt: skip
    try:
        out = probe(a.model, a.env, a.level, a.n, a.seed, a.fault_p, a.temperature, a.max_turns, context,
                    a.max_calls, a.group)  # fmt: skip
    except (OSError, ValueError) as e:
        print(f"probe: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
