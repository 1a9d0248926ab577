"""Teachers of on-policy cross-stage distillation (GLM-5 §3.5, Eq. 2), for the distill stage and for any RL stage that
mixes teacher rows into its own batches (agentic RL's `agentic.teachers`: the speedrun's agentic stage keeps the
reasoning-RL model's skill while it learns tools).

A teacher is an earlier stage's model with the prompts of its own stage:
  {"model": "runs/x/rl/model" or "x/rl" (run/stage), "task": "compare", "weight": 1.0, "level": 0, "thinking": True}
  {"server": "http://127.0.0.1:8000", "model": "<served model name>", "task": "chat"}   (distill stage only)

`TeacherMix` adds `n` rows per step to another stage's batch (reasoning RL's `rl.teachers`, agentic RL's
`agentic.teachers`): prompts drawn from the teachers' tasks (split by
`weight`), one sample each from the student's current weights (an in-process copy pushed with the stage's own
pushes), each row's sampled tokens scored by its teacher under the same sampling transform. The batch then carries
`teacher_logp` (B, L) and `teacher_rows` (B,) bool; rl.stage.rl_loss adds Eq. 2's per-token advantage
sg[log π_teacher − log π_student] on those rows and keeps the stage's own advantage on the others.

    mix = TeacherMix(load_teachers(entries, "agentic.teachers", out_dir, device, tok), tok, n=16, ...)
    mix.push(state, step); samples, owners, stats = mix.samples(step)      # Samples for sample.collate
    mix.score(batch, first_row, owners)                                    # after collate
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glmstack.config import ConfigError
from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.losses import token_logprobs

TEACHER_KEYS = {"model": str, "task": str, "weight": (int, float), "level": int, "server": str, "thinking": bool}


@dataclass
class Teacher:
    model: str
    task: str
    weight: float = 1.0
    level: int = 0
    server: str = ""  # an OpenAI-compatible server's URL: `model` is then the served model's name
    # enable_thinking of the task's prompts; None: the stage's own (rl.thinking; off where a stage has none). A
    # hybrid-thinking model has two answer paths; distilling only one lets a stage break the other (docs/speedrun.md)
    thinking: bool | None = None

    @property
    def label(self) -> str:
        """The task's name in metrics, with the thinking mode where the entry sets one."""
        return self.task + {None: "", True: ":think", False: ":nothink"}[self.thinking]

    def make_task(self, tokenizer, style: str, default_thinking: bool = False):
        from glmstack.posttrain.rl.tasks import make_task

        return make_task(self.task, tokenizer, style, default_thinking if self.thinking is None else self.thinking)


def parse_teachers(entries: list, where: str) -> list[Teacher]:
    """Validated teachers (one ConfigError naming the entry and key)."""
    from glmstack.posttrain.rl.tasks import TASKS

    if not entries:
        raise ConfigError(f'{where} is empty: give [{{"model": FOLDER_OR_RUN/STAGE, "task": NAME}}, ...]')
    out = []
    for i, t in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(t, dict):
            raise ConfigError(f"{at}: must be an object with keys {', '.join(TEACHER_KEYS)}")
        bad = sorted(set(t) - set(TEACHER_KEYS))
        missing = [k for k in ("model", "task") if k not in t]
        if bad or missing:
            raise ConfigError(f"{at}: unknown key(s) {bad}" if bad else f"{at}: missing {', '.join(missing)}")
        wrong = [k for k, v in t.items() if not isinstance(v, TEACHER_KEYS[k])]
        if wrong:
            raise ConfigError(f"{at}: wrong type for {', '.join(wrong)}")
        if t["task"] not in TASKS:
            raise ConfigError(f"{at}: unknown task {t['task']!r} (expected one of {', '.join(TASKS)})")
        if t.get("weight", 1.0) <= 0:
            raise ConfigError(f"{at}: weight must be > 0")
        out.append(Teacher(**t))
    return out


def load_teacher(t: Teacher, out_dir: str, device, tokenizer, where: str = "distill.teachers"):
    """A GLM in process from a folder or run/stage name, or the client of a teacher server."""
    from glmstack.model import load_hf
    from glmstack.posttrain.rl.remote import ServerEngine
    from glmstack.train.checkpoint import resolve

    if t.server:
        return ServerEngine(t.server, t.model, tokenizer)
    try:
        folder = resolve(t.model, out_dir)
    except ConfigError:
        raise ConfigError(f"{where}: model {t.model!r} is no HF folder, stage folder or run/stage under "
                          f"{out_dir}") from None  # fmt: skip
    model = load_hf(folder, dtype=torch.float32, device=device, missing_mtp="drop")
    return model.eval().requires_grad_(False)


def split_counts(total: int, weights: list[float]) -> list[int]:
    """`total` samples over teachers in proportion to `weights`, largest remainder (sums to `total` exactly)."""
    shares = [total * w / sum(weights) for w in weights]
    counts = [int(s) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: counts[i] - shares[i])[: total - sum(counts)]:
        counts[i] += 1
    return counts


@torch.no_grad()
def teacher_logprobs(model, batch: dict, rows: list[int], temperature: float, top_p: float = 1.0,
                     top_k: int = 0) -> torch.Tensor:  # fmt: skip
    """(len(rows), L): an in-process teacher's log-prob of each row's targets under the sampling transform, 0 off
    the mask."""
    dev = next(model.parameters()).device  # the batch is on the CPU until the loop moves it
    logits = model(batch["input_ids"][rows].to(dev)).logits.float()
    lp = token_logprobs(logits, batch["targets"][rows].to(dev), temperature, top_p, top_k).cpu()
    return torch.where(batch["mask"][rows] > 0, lp, torch.zeros_like(lp))


class TeacherMix:
    """Cross-stage distillation rows for another RL stage's batches (see the module docstring)."""

    def __init__(self, teachers: list[tuple[Teacher, object, object]], tokenizer, *, n: int, max_new_tokens: int,
                 temperature: float, seed: int, top_p: float = 1.0, top_k: int = 0):  # fmt: skip
        self.teachers = teachers  # (Teacher, its task, its in-process model)
        self.tokenizer, self.n, self.max_new_tokens = tokenizer, n, max_new_tokens
        self.temperature, self.seed, self.top_p, self.top_k = temperature, seed, top_p, top_k
        self.policy = None  # an EnginePolicy over a copy of the student, made at the first push (or the stage's own)

    def push(self, model, state: dict, version: int) -> None:
        """The student's weights (the stage pushes them to its own sampler at the same time)."""
        from glmstack.posttrain.policy import EnginePolicy, plain_copy

        if self.policy is None:
            self.policy = EnginePolicy(plain_copy(model, state, cpu=True), self.tokenizer)
        self.policy.push(state, version)

    def samples(self, step: int, policy=None):
        """(Samples, the teacher index of each, stats): `n` prompts from the teachers' tasks, one sample each, from
        `policy` (a stage's own rollout policy holding the student's current weights) or the mix's pushed copy."""
        from glmstack.posttrain.rl.rollouts import stable_seed
        from glmstack.posttrain.sample import Sample

        counts = split_counts(self.n, [t.weight for t, _, _ in self.teachers])
        out, owners, stats = [], [], {}
        for k, ((teacher, task, _), n) in enumerate(zip(self.teachers, counts)):
            if n == 0:
                continue
            problems = task.problems(split="train", n=n, seed=stable_seed(self.seed, step, "mix", k), level=teacher.level)  # fmt: skip
            prompts = [p.prompt_ids for p in problems]
            res = (policy or self.policy).generate(prompts, self.max_new_tokens, temperature=self.temperature,
                                                   top_p=self.top_p, top_k=self.top_k,
                                                   seeds=[stable_seed(self.seed, step, "mix", k, i) for i in range(n)])  # fmt: skip
            scored = reward_lib.samples_of([p.meta for p in problems], res, self.max_new_tokens)
            values, _ = reward_lib.total(scored, [(r, 1.0) for r in task.rewards])  # watched, not trained on
            stats[f"teacher_reward/{teacher.label}"] = sum(values) / n
            out += [Sample.single_turn(p, t, lp, versions=[step]) for p, t, lp in zip(prompts, res.tokens, res.logprobs)]  # fmt: skip
            owners += [k] * n
        return out, owners, stats

    def score(self, batch: dict, first_row: int, owners: list[int]) -> dict:
        """Sets batch["teacher_logp"] and batch["teacher_rows"] for rows first_row.. (the mix's, in `owners`
        order); returns the step's reverse KL, mean over the mix's tokens of log π_student − log π_teacher."""
        B = batch["input_ids"].shape[0]
        tlp, rows = torch.zeros_like(batch["rollout_logp"]), torch.zeros(B, dtype=torch.bool)
        for k, (_, _, model) in enumerate(self.teachers):
            idx = [first_row + i for i, o in enumerate(owners) if o == k]
            if idx:
                tlp[idx] = teacher_logprobs(model, batch, idx, self.temperature, self.top_p, self.top_k)
                rows[idx] = True
        batch["teacher_logp"], batch["teacher_rows"] = tlp, rows
        m = batch["mask"][rows]
        gap = float(((batch["rollout_logp"][rows] - tlp[rows]) * m).sum())
        return {"teacher_reverse_kl": gap / max(float(m.sum()), 1.0)}


def build_mix(cfg, opts, where: str, tokenizer, style: str) -> TeacherMix | None:
    """The TeacherMix of a stage's `teachers` option (`opts`: rl's or agentic's options, which both carry teachers,
    teacher_samples, teacher_max_new_tokens and the sampling transform; in-process teachers), or None when it names
    none. Each rank samples its share of `teacher_samples` with its own seed."""
    from glmstack.posttrain.rl.rollouts import stable_seed
    from glmstack.train import dist
    from glmstack.train.loop import device_of

    if not opts.teachers:
        return None
    thinking = getattr(opts, "thinking", False)  # rl's option; agentic's episodes carry theirs in opts.episode
    teachers = [(t, t.make_task(tokenizer, style, thinking), load_teacher(t, cfg.out_dir, device_of(cfg), tokenizer, where))
                for t in parse_teachers(opts.teachers, where)]  # fmt: skip
    return TeacherMix(teachers, tokenizer, n=opts.teacher_samples // dist.world(),
                      max_new_tokens=opts.teacher_max_new_tokens, temperature=opts.temperature,
                      seed=stable_seed(cfg.seed, "teachers", dist.rank()), top_p=opts.top_p, top_k=opts.top_k)  # fmt: skip


def check_teachers(entries: list, where: str, n: int, parts: int) -> None:
    """ConfigError unless `entries` are valid in-process teachers and `n` rows split into `parts` (ranks × ...)."""
    if not entries:
        return
    parse_teachers(entries, where)
    if any(t.get("server") for t in entries):
        raise ConfigError(f"{where}: in-process teachers only (a model folder or run/stage)")
    if n < 1 or n % parts:
        raise ConfigError(f"{where}: teacher_samples={n} must be >= 1 and split into {parts} parts")
