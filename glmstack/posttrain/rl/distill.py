"""`glmstack distill <recipe> [--set key=value ...]`: on-policy cross-stage distillation, GLM-5's final stage.

GLM-5 §3.5 Eq. 2 (research/rl-recipe.md §1.3): after SFT → reasoning RL → agentic RL → general RL, a last stage
trains the student on its OWN samples with the advantage replaced by the teacher's opinion of each sampled token,

    Â_t = sg[log π_teacher(y_t | x, y_<t) − log π_student(y_t | x, y_<t)]        (per token, group size 1)

inside GLM-5 Eq. 1 (the clipped surrogate with IcePop; `rl.loss` / `rl.mismatch` as reasoning RL). Teachers are the
earlier stages' final checkpoints, each with the prompts of its own stage ("mixed in appropriate proportions"), so
a skill an earlier stage had and a later stage lost is pulled back where the teacher disagrees with the student.

How it runs: the RL stage (stage.py) with this data stream. Per step, `Distillation`
  1. pushes the student's weights to its rollout policy (as Rollouts: in process, or `rl.rollout_server` with
     `rl.sync_every` / `rl.tau`, posttrain/policy.py);
  2. splits `rl.samples_per_step` over the teachers by `weight` (largest remainder) and draws each teacher's
     prompts from its task (`tasks.py`) at its level, one sample per prompt (group size 1);
  3. builds the micro-batches as Rollouts does and has each teacher score its rows' sampled tokens: log-probs of
     the same (input, target) tensors the trainer sees, under the same sampling transform (logits / temperature,
     top-k, top-p), from the teacher model in process or from a teacher server (`server`: echo + logprobs
     requests, remote.ServerEngine.score; raw log-probs, so only at temperature 1 without top-k / top-p);
  4. stage.rl_loss sees `teacher_logp` in the batch and uses Eq. 2's per-token advantage against the trainer's own
     log-probs (losses.distill_advantages).
Held-out evaluation scores every teacher's task (greedy) and `distill_summary.json` has the per-task table.

Teachers (`distill.teachers`, a list of objects):
  {"model": "runs/x/sft/model" or "x/sft" (run/stage), "task": "tools", "weight": 1.0, "level": 0}
  {"server": "http://127.0.0.1:8000", "model": "<served model name>", "task": "chat"}     (a teacher server)

    glmstack distill distill_speedrun --set 'distill.teachers=[{"model": "A/model", "task": "tools"}, ...]'
    glmstack distill distill_tiny --set steps=4               # a random tiny student, the token task (smoke test)
    glmstack distill eval MODEL [MODEL ...] --tasks tools,chat --n 64   # greedy held-out score per task
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

import torch

from glmstack.config import ConfigError
from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.rollouts import Rollouts, stable_seed
from glmstack.posttrain.rl.stage import RLConfig, RLOptions
from glmstack.posttrain.rl.teachers import Teacher, load_teacher, parse_teachers, split_counts, teacher_logprobs
from glmstack.train import dist


@dataclass(kw_only=True)
class DistillOptions:
    teachers: list[dict] = field(default_factory=list)  # [{"model", "task", "weight" (1.0), "level" (0)}]
    # general RL's rules on top of the teachers: each row's advantage also gets reward_weight × (its task reward −
    # the mean of that task's rewards in the step); 0 = pure distillation (rewards watched only)
    reward_weight: float = 0.0


def distill_rl_options(**kw) -> RLOptions:
    """RLOptions as distillation uses them: one sample per prompt, no reward selection (the teacher's log-probs are
    the signal), each teacher's prompts at its own level."""
    return RLOptions(**({"curriculum": [[0, 0, 1]], "dynamic_sampling": False} | kw))


@dataclass(kw_only=True)
class DistillConfig(RLConfig):
    rl: RLOptions = field(default_factory=distill_rl_options)
    distill: DistillOptions = field(default_factory=DistillOptions)


def teachers_of(cfg: DistillConfig) -> list[Teacher]:
    return parse_teachers(cfg.distill.teachers, "distill.teachers")


class Distillation(Rollouts):
    """The distillation data stream: Rollouts' machinery, prompts from each teacher's task, teacher log-probs."""

    def __init__(self, *, model, teachers: list[tuple[Teacher, object, object]], opts, seed: int,
                 micro_batches: int, tokenizer=None, style="glm-4.5", reward_weight: float = 0.0):  # fmt: skip
        self.teachers = teachers  # (Teacher, its task, its model: a GLM in process or a remote.ServerEngine)
        self.reward_weight = reward_weight
        super().__init__(model=model, task=teachers[0][1], opts=opts, seed=seed, micro_batches=micro_batches,
                         tokenizer=tokenizer, style=style)  # fmt: skip
        self.heldouts = [task.problems(split="test", n=opts.heldout_n, seed=seed, level=t.level)
                         for t, task, _ in teachers]  # fmt: skip

    def make_step(self) -> list[dict]:
        o = self.opts
        evaluate = bool(o.eval_every and self.step % o.eval_every == 0)
        stats = {"time/sync_s": self.sync()}
        if evaluate:
            self.prepare_eval()
            scores = self.evaluate_all()
            stats |= scores | {"heldout_acc": sum(scores.values()) / len(scores)}
        counts = split_counts(o.samples_per_step, [t.weight for t, _, _ in self.teachers])
        flat, owner, rewards, task_adv = [], [], [], []
        for k, ((teacher, task, _), n) in enumerate(zip(self.teachers, counts)):
            if n == 0:
                continue
            tag = (self.step, "distill", k) + (() if dist.world() == 1 else (dist.rank(),))
            problems = task.problems(split="train", n=n, seed=stable_seed(self.seed, *tag), level=teacher.level)
            t0 = time.perf_counter()
            rows, samples = self.generate(problems, 1, self.temperature, tag)
            t1 = time.perf_counter()
            task_reward, _ = reward_lib.total(samples, [(r, 1.0) for r in task.rewards])
            stats["time/rollout_s"] = stats.get("time/rollout_s", 0.0) + t1 - t0
            stats["time/reward_s"] = stats.get("time/reward_s", 0.0) + time.perf_counter() - t1
            stats[f"reward/{teacher.label}"] = sum(task_reward) / n
            flat += [(row, 0.0, s) for row, s in zip(rows, samples)]
            task_adv += [self.reward_weight * (r - sum(task_reward) / n) for r in task_reward]
            owner += [k] * n
            rewards += task_reward
        stats |= {"reward": sum(rewards) / len(rewards), "temperature": self.temperature,
                  "response_len": sum(len(r[1]) for r, _, _ in flat) / len(flat), "weight_version": float(self.version),
                  "staleness_mean": self.staleness[0], "staleness_max": float(self.staleness[1])}  # fmt: skip
        self.history.append(stats["reward"])
        self.step += self.updates
        batch, t0 = self.batch([[s] for s in flat], 1, stats), time.perf_counter()
        self.last_rewards = rewards  # the rows' task rewards (tests, inspection)
        batch["advantages"] = torch.tensor(task_adv)  # rl_loss adds Eq. 2's per-token teacher advantage to it
        self.score(batch, owner, [r for r, _, _ in flat])  # before the split: PPO epochs shuffle the rows
        gap = float(((batch["rollout_logp"] - batch["teacher_logp"]) * batch["mask"]).sum())
        # reverse_kl: the mean per-token sample of log π_student − log π_teacher over the step
        figures = {"reverse_kl": gap / max(float(batch["mask"].sum()), 1.0), "time/teacher_s": time.perf_counter() - t0}
        return self.updates_of(batch, stats | figures)

    @torch.no_grad()
    def score(self, batch: dict, owners: list[int], rows: list[tuple]) -> None:
        """batch["teacher_logp"] (B, L): each row's teacher's log-prob of every target token, 0 off the mask.
        `rows`: the batch's (prompt, response, rollout log-probs), for a server teacher (raw log-probs: check()
        allows one only at temperature 1 without top-k / top-p, where raw = the sampling distribution)."""
        from glmstack.posttrain.rl.remote import ServerEngine

        tlp = torch.zeros_like(batch["rollout_logp"])
        for k, (_, _, teacher_model) in enumerate(self.teachers):
            rows_k = [i for i, o in enumerate(owners) if o == k]
            if not rows_k:
                continue
            if isinstance(teacher_model, ServerEngine):
                scored = teacher_model.score([rows[i][0] + rows[i][1] for i in rows_k])
                for i, lps in zip(rows_k, scored):
                    lo, n = len(rows[i][0]) - 1, len(rows[i][1])  # the response's targets start at prompt end − 1
                    tlp[i, lo : lo + n] = torch.tensor(lps[lo : lo + n], dtype=tlp.dtype)
                continue
            tlp[rows_k] = teacher_logprobs(teacher_model, batch, rows_k, self.temperature, self.opts.top_p,
                                           self.opts.top_k)  # fmt: skip
        batch["teacher_logp"] = tlp

    def evaluate_all(self, temperature: float = 0.0) -> dict[str, float]:
        """Greedy held-out score of every teacher's task: {"heldout/<task>": score}."""
        out = {}
        for (teacher, task, _), problems in zip(self.teachers, self.heldouts):
            _, samples = self.generate(problems, 1, temperature, ("heldout", teacher.label, self.step),
                                       engine=self.eval_engine)  # fmt: skip
            values, _ = reward_lib.total(samples, [(r, 1.0) for r in task.rewards])
            out[f"heldout/{teacher.label}"] = sum(values) / max(len(values), 1)
        return out

    def evaluate(self, temperature: float = 0.0) -> float:
        scores = self.evaluate_all(temperature)
        return sum(scores.values()) / len(scores)

    def heldout_scores(self, temperature: float = 0.0) -> dict[str, float]:
        return {"heldout_acc": self.evaluate(temperature)}


# ---------------------------------------------------------------------------------------------------- stage
def build(cfg: DistillConfig, model, tokenizer) -> Distillation:
    from glmstack.train.loop import device_of

    device = device_of(cfg)
    try:
        teachers = [(t, t.make_task(tokenizer, cfg.rl.chat_style, cfg.rl.thinking),
                     load_teacher(t, cfg.out_dir, device, tokenizer)) for t in teachers_of(cfg)]  # fmt: skip
        return Distillation(model=model, teachers=teachers, opts=cfg.rl, seed=cfg.seed, micro_batches=cfg.grad_accum,
                            tokenizer=tokenizer, style=cfg.rl.chat_style,
                            reward_weight=cfg.distill.reward_weight)  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"distill: {e}") from None


# rl options distillation cannot honour: (name, the value it runs with, why)
NOT_FOR_DISTILL = (
    ("curriculum", [[0, 0, 1]], ("one sample per prompt, each teacher's prompts at its own level "
                                 "(distill.teachers' `level`)")),
    ("dynamic_sampling", False, "no group rewards to select on: the teacher's log-probs are the advantage"),
    ("dynamic_temperature", False, "the temperature sweep needs a reward plateau; distillation trains on none"),
    ("rewards", [], "each teacher's task rewards it (distill.reward_weight)"),
    ("teachers", [], "distillation's teachers are distill.teachers"),
)  # fmt: skip


def check(cfg: DistillConfig) -> None:
    from glmstack.posttrain.rl.stage import check_sampling

    if not isinstance(cfg, DistillConfig):
        raise ConfigError(f"the distill stage needs a DistillConfig (got {type(cfg).__name__})")
    o = cfg.rl
    for name, value, why in NOT_FOR_DISTILL:
        if getattr(o, name) != value:
            raise ConfigError(f"rl.{name}={getattr(o, name)!r}: distillation runs with {value!r} ({why})")
    check_sampling(cfg)
    if any(t.server for t in teachers_of(cfg)) and (o.temperature != 1.0 or o.top_p < 1.0 or o.top_k):
        raise ConfigError("a teacher server reports raw log-probs: use rl.temperature=1, top_p=1, top_k=0")
    if cfg.rl.loss == "ppo":
        raise ConfigError("rl.loss=ppo learns a critic from rewards; distillation's advantage is the teacher's (grpo, "
                          "dis, cispo)")  # fmt: skip
    if cfg.rl.loss == "gspo":
        raise ConfigError("rl.loss=gspo has one advantage per sequence; distillation's is per token (grpo, dis, cispo)")
    if cfg.rl.samples_per_step % (cfg.grad_accum * o.minibatches):
        raise ConfigError(f"rl.samples_per_step={cfg.rl.samples_per_step} does not split into grad_accum="
                          f"{cfg.grad_accum} x rl.minibatches={o.minibatches} micro-batches")  # fmt: skip


def run_distill(cfg: DistillConfig, stop_at: int | None = None) -> dict:
    from glmstack.posttrain.rl.stage import run_rl
    from glmstack.train.stage import stage_dir

    result = run_rl(cfg, stop_at=stop_at, build_data=build, check_fn=check)
    if dist.rank() == 0 and "heldout" in result:
        (stage_dir(cfg) / "distill_summary.json").write_text(json.dumps(result["heldout"], indent=2) + "\n")
    return result


def heldout_score(engine, task, n: int, seed: int = 0, level: int = 0, max_new_tokens: int = 48,
                  style: str = "glm-4.5") -> float:  # fmt: skip
    """Greedy score of `n` held-out problems of an RL task at `level` for an inference.Engine (the task's rewards)."""
    problems = task.problems(split="test", n=n, seed=seed, level=level)
    res = engine.generate([p.prompt_ids for p in problems], max_new_tokens=max_new_tokens, temperature=0.0)
    samples = reward_lib.samples_of([p.meta for p in problems], res, max_new_tokens, style)
    return sum(reward_lib.total(samples, [(r, 1.0) for r in task.rewards])[0]) / n


def score_tasks(folder: str, tasks: list[str], n: int, seed: int = 0, style: str = "glm-4.5",
                max_new_tokens: int = 48) -> dict[str, float]:  # fmt: skip
    """Greedy held-out score of RL tasks for one model folder: the table before and after distillation."""
    from glmstack.inference import Engine
    from glmstack.model import load_hf
    from glmstack.posttrain.rl.tasks import make_task
    from glmstack.tokenizer import Tokenizer

    tok = Tokenizer.load(folder)
    engine = Engine(load_hf(folder, missing_mtp="drop"), tok)
    return {name: heldout_score(engine, make_task(name, tok, style), n, seed, 0, max_new_tokens, style) for name in tasks}  # fmt: skip


def eval_main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="glmstack distill eval", description=score_tasks.__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="model folders (config.json, safetensors, tokenizer.json)")
    ap.add_argument("--tasks", default="tools,chat", help="RL tasks (glmstack.posttrain.rl.tasks)")
    ap.add_argument("--n", type=int, default=64, help="held-out prompts per task")
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",")
    print("| model | " + " | ".join(tasks) + " |\n|---" * 1 + "|---" * len(tasks) + "|")
    for folder in args.models:
        scores = score_tasks(folder, tasks, args.n)
        print(f"| {folder} | " + " | ".join(f"{scores[t]:.1%}" for t in tasks) + " |", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`glmstack distill <recipe> ...` trains; `glmstack distill eval MODEL ...` scores the teachers' tasks."""
    from glmstack.stage_cli import main_for

    if argv and argv[0] == "eval":
        return eval_main(argv[1:])
    return main_for("distill", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
