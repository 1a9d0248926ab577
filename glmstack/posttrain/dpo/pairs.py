"""On-policy preference pairs: a model's own samples on an RL task, judged by the task's verifier.

Why: DPO moves the likelihood ratio of the two replies it is given; when neither is the model's own kind of reply
(the synthetic sets' raw JSON, for a model SFT taught GLM's tool-call format), the ratio moves and the greedy output
does not (docs/dpo.md). Pairs made from the model's own samples — a right and a wrong reply to one prompt, as iterative
and on-policy DPO build them (and as a reward model's data can be) — prefer a behaviour the model already produces
sometimes, so DPO can make it the greedy one. The preferred behaviour is then the task's own metric: held-out accuracy.

Per prompt: `samples` replies at `temperature`, scored by the task's reward (glmstack.posttrain.rl.rewards; `--reward`
for another, e.g. `rm:FOLDER`); a prompt whose non-empty replies score differently gives one pair: a random
best-scoring reply over a random worst-scoring one (seeded; for a 0/1 verifier, right over wrong). Prompts come from the task's own train / held-out split (a hash of the problem), so the
held-out file shares no prompt with the training file.

    glmstack dpo pairs runs/speedrun/sft/model --task compare --level 3 --n 1500 --out runs/prefs
    # -> runs/prefs/train.jsonl, runs/prefs/test.jsonl: {"prompt", "chosen", "rejected"} strings (rm's and dpo's reader)
    glmstack dpo dpo_speedrun --set dpo.data='["runs/prefs/train.jsonl"]' --set dpo.val_data='["runs/prefs/test.jsonl"]'
    glmstack dpo eval runs/speedrun/sft/model runs/speedrun/dpo/model --task compare --level 3
"""

from __future__ import annotations

import random
import sys
from pathlib import Path


def pick_pair(replies: list[str], scores: list[float], rng: random.Random) -> tuple[str, str] | None:
    """(chosen, rejected) of one prompt's sampled replies: a random best-scoring reply over a random worst-scoring
    one (for a 0/1 verifier: right over wrong); None when every non-empty reply scores the same."""
    scored = {}
    for reply, score in zip(replies, scores):
        if reply:  # an empty reply teaches nothing about the answer
            scored.setdefault(reply, score)
    if len(set(scored.values())) < 2:
        return None
    best, worst = max(scored.values()), min(scored.values())
    chosen = rng.choice(sorted(r for r, v in scored.items() if v == best))
    return chosen, rng.choice(sorted(r for r, v in scored.items() if v == worst))


def build_pairs(engine, task, problems, *, rewards: list[tuple[str, float]], samples: int, temperature: float,
                seed: int, max_new_tokens: int, batch: int = 64) -> tuple[list[dict], dict]:  # fmt: skip
    """(pair records, stats) from `samples` sampled replies per problem, scored by `rewards` ([(name, weight)])."""
    from glmstack.chat import parse
    from glmstack.posttrain.rl import rewards as reward_lib

    rng, per_batch = random.Random(seed), max(1, batch // samples)
    records, total = [], 0.0
    for start in range(0, len(problems), per_batch):
        chunk = problems[start : start + per_batch]
        prompts = [p.prompt_ids for p in chunk for _ in range(samples)]
        seeds = [seed * 1_000_003 + start * samples + i for i in range(len(prompts))]
        res = engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=seeds)
        done = reward_lib.samples_of([p.meta for p in chunk for _ in range(samples)], res, max_new_tokens, task.style)
        scores, _ = reward_lib.total(done, rewards)
        replies = [(parse(s.text, None, style=task.style).get("content") or "").strip() for s in done]
        total += sum(scores)
        for j, prob in enumerate(chunk):
            pair = pick_pair(replies[j * samples : (j + 1) * samples], scores[j * samples : (j + 1) * samples], rng)
            if pair is not None:
                records.append({"prompt": prob.meta["question"], "chosen": pair[0], "rejected": pair[1]})
    stats = {"prompts": len(problems), "pairs": len(records),
             "sampled_reward": total / max(len(problems) * samples, 1)}  # fmt: skip
    return records, stats


def write_pairs(folder: str, out: str, *, task_name: str, level: int, n: int, test_n: int, samples: int,
                temperature: float, seed: int, max_new_tokens: int, rewards: list[str] | None = None) -> dict:  # fmt: skip
    """Pairs for `n` train-split and `test_n` held-out prompts of the task -> OUT/train.jsonl, OUT/test.jsonl."""
    import json

    from glmstack.inference import Engine
    from glmstack.model import load_hf
    from glmstack.posttrain.rl import rewards as reward_lib
    from glmstack.posttrain.rl.tasks import make_task
    from glmstack.posttrain.sft_data import write_jsonl
    from glmstack.tokenizer import Tokenizer

    tok = Tokenizer.load(folder)
    try:
        task = make_task(task_name, tok)
    except ValueError as e:
        raise SystemExit(f"glmstack dpo pairs: {e}") from None
    if not hasattr(task, "style") or not task.rewards:
        raise SystemExit(f"glmstack dpo pairs: task {task_name!r} is not a chat task with a verifier")
    weights = [(r, 1.0) for r in rewards or task.rewards]
    try:
        for name, _ in weights:
            reward_lib.get(name)  # an unknown reward stops here, before any sampling
    except ValueError as e:
        raise SystemExit(f"glmstack dpo pairs: {e}") from None
    engine = Engine(load_hf(folder, missing_mtp="drop"), tok)
    report = {"model": folder, "task": task_name, "level": level, "samples": samples, "temperature": temperature,
              "seed": seed, "rewards": weights}  # fmt: skip
    for split, count in (("train", n), ("test", test_n)):
        problems = task.problems(split=split, n=count, seed=seed, level=level)
        records, stats = build_pairs(engine, task, problems, rewards=weights, samples=samples, temperature=temperature,
                                     seed=seed + (split == "test"), max_new_tokens=max_new_tokens)  # fmt: skip
        write_jsonl(records, Path(out) / f"{split}.jsonl")
        report[split] = stats
        print(f"{split}: {stats['pairs']} pairs from {stats['prompts']} prompts (mean sampled reward "
              f"{stats['sampled_reward']:.3f}) -> {Path(out) / f'{split}.jsonl'}", flush=True)  # fmt: skip
    (Path(out) / "pairs.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="glmstack dpo pairs", description=__doc__.splitlines()[0])
    ap.add_argument("model", help="model folder (config.json, safetensors, tokenizer.json)")
    ap.add_argument("--task", default="compare", help="an RL chat task with a verifier (glmstack.posttrain.rl.tasks)")
    ap.add_argument("--level", type=int, default=3, help="the task's difficulty level")
    ap.add_argument("--n", type=int, default=1500, help="train-split prompts sampled")
    ap.add_argument("--test-n", type=int, default=400, help="held-out prompts sampled")
    ap.add_argument("--samples", type=int, default=8, help="replies sampled per prompt")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reward", action="append", help="score replies by this reward instead of the task's own "
                    "(repeatable, summed; e.g. rm:FOLDER, format)")  # fmt: skip
    ap.add_argument("--out", required=True, help="folder for train.jsonl, test.jsonl and pairs.json")
    a = ap.parse_args(argv)
    if a.samples < 2 or a.n < 1 or a.test_n < 0 or a.temperature <= 0:
        ap.error("--samples must be ≥ 2, --n ≥ 1, --test-n ≥ 0 and --temperature > 0")
    write_pairs(a.model, a.out, task_name=a.task, level=a.level, n=a.n, test_n=a.test_n, samples=a.samples,
                temperature=a.temperature, seed=a.seed, max_new_tokens=a.max_new_tokens, rewards=a.reward)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
