"""On-policy preference pairs: a model's own samples on an RL task, judged by the task's verifier.

Why: DPO moves the likelihood ratio of the two replies it is given; when neither is the model's own kind of reply
(the synthetic sets' raw JSON, for a model SFT taught GLM's tool-call format), the ratio moves and the greedy output
does not (docs/dpo.md). Pairs made from the model's own samples — a right and a wrong reply to one prompt, as iterative
and on-policy DPO build them (and as a reward model's data can be) — prefer a behaviour the model already produces
sometimes, so DPO can make it the greedy one. The preferred behaviour is then the task's own metric: held-out accuracy.

Per prompt: `samples` replies at `temperature`, scored by the task's reward (glmstack.posttrain.rl.rewards); a prompt
whose replies include a right one (reward 1) and a wrong one (reward 0) gives one pair: a random right reply over a
random wrong one (seeded). Prompts come from the task's own train / held-out split (a hash of the problem), so the
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


def build_pairs(engine, task, problems, *, samples: int, temperature: float, seed: int, max_new_tokens: int,
                batch: int = 64) -> tuple[list[dict], dict]:  # fmt: skip
    """(pair records, stats) from `samples` sampled replies per problem, judged by the task's own reward."""
    from glmstack.chat import parse
    from glmstack.posttrain.rl import rewards as reward_lib

    rng, per_batch = random.Random(seed), max(1, batch // samples)
    records, n_right, n_all = [], 0, 0
    for start in range(0, len(problems), per_batch):
        chunk = problems[start : start + per_batch]
        prompts = [p.prompt_ids for p in chunk for _ in range(samples)]
        seeds = [seed * 1_000_003 + (start * samples + i) for i in range(len(prompts))]
        res = engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, seeds=seeds)
        done = [reward_lib.Sample(meta=chunk[i // samples].meta, tokens=t, text=x, finish=f,
                                  max_new_tokens=max_new_tokens, style=task.style)
                for i, (t, x, f) in enumerate(zip(res.tokens, res.text, res.finish_reason))]  # fmt: skip
        scores, _ = reward_lib.total(done, [(r, 1.0) for r in task.rewards])
        for j, prob in enumerate(chunk):
            group = list(zip(done[j * samples : (j + 1) * samples], scores[j * samples : (j + 1) * samples]))
            replies = [(parse(s.text, None, style=task.style).get("content") or "").strip() for s, _ in group]
            right = sorted({r for r, (s, v) in zip(replies, group) if v >= 1.0 and s.finish == "stop" and r})
            wrong = sorted({r for r, (s, v) in zip(replies, group) if v <= 0.0 and r} - set(right))
            n_right, n_all = n_right + sum(v >= 1.0 for _, v in group), n_all + len(group)
            if right and wrong:
                records.append({"prompt": prob.meta["question"], "chosen": rng.choice(right),
                                "rejected": rng.choice(wrong)})  # fmt: skip
    stats = {"prompts": len(problems), "pairs": len(records), "sampled_accuracy": n_right / max(n_all, 1)}
    return records, stats


def write_pairs(folder: str, out: str, *, task_name: str, level: int, n: int, test_n: int, samples: int,
                temperature: float, seed: int, max_new_tokens: int) -> dict:  # fmt: skip
    """Pairs for `n` train-split and `test_n` held-out prompts of the task -> OUT/train.jsonl, OUT/test.jsonl."""
    import json

    from glmstack.inference import Engine
    from glmstack.model import load_hf
    from glmstack.posttrain.rl.tasks import make_task
    from glmstack.posttrain.sft_data import write_jsonl
    from glmstack.tokenizer import Tokenizer

    tok = Tokenizer.load(folder)
    task = make_task(task_name, tok)
    if not hasattr(task, "style") or not task.rewards:
        raise SystemExit(f"glmstack dpo pairs: task {task_name!r} is not a chat task with a verifier")
    engine = Engine(load_hf(folder, missing_mtp="drop"), tok)
    report = {"model": folder, "task": task_name, "level": level, "samples": samples, "temperature": temperature,
              "seed": seed}  # fmt: skip
    for split, count in (("train", n), ("test", test_n)):
        problems = task.problems(split=split, n=count, seed=seed, level=level)
        records, stats = build_pairs(engine, task, problems, samples=samples, temperature=temperature,
                                     seed=seed + (split == "test"), max_new_tokens=max_new_tokens)  # fmt: skip
        write_jsonl(records, Path(out) / f"{split}.jsonl")
        report[split] = stats
        print(f"{split}: {stats['pairs']} pairs from {stats['prompts']} prompts (sampled accuracy "
              f"{stats['sampled_accuracy']:.3f}) -> {Path(out) / f'{split}.jsonl'}", flush=True)  # fmt: skip
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
    ap.add_argument("--out", required=True, help="folder for train.jsonl, test.jsonl and pairs.json")
    a = ap.parse_args(argv)
    if a.samples < 2 or a.n < 1 or a.test_n < 0 or a.temperature <= 0:
        ap.error("--samples must be ≥ 2, --n ≥ 1, --test-n ≥ 0 and --temperature > 0")
    write_pairs(a.model, a.out, task_name=a.task, level=a.level, n=a.n, test_n=a.test_n, samples=a.samples,
                temperature=a.temperature, seed=a.seed, max_new_tokens=a.max_new_tokens)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
