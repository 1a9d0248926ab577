"""Rejection sampling into a new SFT file: sample k responses per prompt, keep the verified ones (GLM-4.5 §3.1).

What: `rejection_sample(engine, items, style, cfg) -> (records, report)`. Filters, in GLM-4.5's order
(research/post-training-recipe.md §3): truncated -> repetitive -> format-invalid (not well formed, thinking switch
disobeyed, a tool call failing its JSON schema) -> wrong (the item's verifier: answer correct, tool calls made and
the final state correct) -> duplicates. Then prompt selection: prompts the model solves on fewer than
`hard_below` of their samples get `hard_k` more samples (response scaling for hard prompts); after filtering,
the `drop_shortest` fraction of prompts with the shortest kept responses is dropped (easy prompts; GLM-4.5: half).
Every kept conversation (prompt + sampled turns, tool results included) is an SFT record with its `meta`.

    glmstack rejection-sample runs/speedrun/sft/model --sets arithmetic,tools --n 200 --k 4 --out rs.jsonl
    # writes rs.jsonl and rs.report.json, prints the report
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from glmstack.posttrain.multiturn import Conversation, rollout, turn_checks
from glmstack.posttrain.synthetic import SETS, generate, verify
from glmstack.posttrain.tools import validate_call

DROPS = ("truncated", "repetitive", "format", "wrong", "duplicate", "easy_prompt")


@dataclass(kw_only=True)
class RejectionConfig:
    k: int = 4  # samples per prompt
    hard_k: int = 4  # extra samples for prompts solved on fewer than hard_below of the first k
    hard_below: float = 0.5
    drop_shortest: float = 0.5  # fraction of prompts (shortest kept responses) dropped; GLM-4.5: half
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 128
    max_rounds: int = 3  # assistant turns per trajectory (tool use needs two)
    seed: int = 0


def repetitive(text: str, n: int = 4, max_share: float = 0.5, min_repeats: int = 3) -> bool:
    """True when one word n-gram occurs at least `min_repeats` times and covers more than `max_share` of the
    n-grams (a loop). A sentence said twice (reasoning, then the answer) is not a loop."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return False
    count = Counter(grams).most_common(1)[0][1]
    return count >= min_repeats and count * n / len(grams) > max_share


def why_rejected(t: Conversation) -> str | None:
    """The first filter a trajectory fails, or None when it is kept."""
    if any(f != "stop" for f in t.finish) or not t.replies or t.replies[-1].get("tool_calls"):
        return "truncated"
    if any(repetitive(x) for x in t.texts):
        return "repetitive"
    thinking = t.item.get("enable_thinking", True)
    for text, finish, msg in zip(t.texts, t.finish, t.replies):
        c = turn_checks(text, finish, msg, thinking)
        if not (c["well_formed"] and c["thinking_obeyed"]):
            return "format"
    if any(validate_call(c, t.item.get("tools")) is not None for c in t.tool_calls):
        return "format"
    if not verify(t.item["meta"], t.final, t.tool_calls):
        return "wrong"
    return None


def _key(item: dict) -> str:
    return json.dumps([item["messages"], item.get("enable_thinking", True)], sort_keys=True)


def rejection_sample(engine, items: list[dict], style: str, cfg: RejectionConfig) -> tuple[list[dict], dict]:
    kw = {"max_new_tokens": cfg.max_new_tokens, "max_rounds": cfg.max_rounds, "temperature": cfg.temperature,
          "top_p": cfg.top_p}  # fmt: skip
    trajs = rollout(engine, [it for it in items for _ in range(cfg.k)], style, seed=cfg.seed, **kw)
    by_prompt: dict[str, list[Conversation]] = {}
    for t in trajs:
        by_prompt.setdefault(_key(t.item), []).append(t)
    hard = [
        ts[0].item for ts in by_prompt.values() if sum(why_rejected(t) is None for t in ts) < cfg.hard_below * cfg.k
    ]
    if hard and cfg.hard_k:
        for t in rollout(engine, [it for it in hard for _ in range(cfg.hard_k)], style, seed=cfg.seed + 7919, **kw):
            by_prompt[_key(t.item)].append(t)
    drops: Counter = Counter()
    kept: dict[str, list[Conversation]] = {}
    for key, ts in by_prompt.items():
        seen = set()
        for t in ts:
            reason = why_rejected(t)
            text = json.dumps(t.messages, sort_keys=True)
            if reason is None and text in seen:
                reason = "duplicate"
            seen.add(text)
            if reason:
                drops[reason] += 1
            else:
                kept.setdefault(key, []).append(t)
    # prompt selection: the prompts with the shortest kept responses are the easy ones
    length = {k: sum(len(x) for t in ts for x in t.texts) / len(ts) for k, ts in kept.items()}
    n_drop = int(len(kept) * cfg.drop_shortest)
    for key in sorted(kept, key=lambda k: (length[k], k))[:n_drop]:
        drops["easy_prompt"] += len(kept.pop(key))
    records = [t.conversation() for ts in kept.values() for t in ts]
    report = {
        "prompts": len(items), "hard_prompts": len(hard), "samples": sum(len(ts) for ts in by_prompt.values()),
        "kept": len(records), "kept_prompts": len(kept), "dropped": {d: drops.get(d, 0) for d in DROPS},
        "config": asdict(cfg),
    }  # fmt: skip
    return records, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="glmstack rejection-sample", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="model folder (config.json, safetensors, tokenizer.json)")
    ap.add_argument("--out", required=True, help="SFT JSONL to write (the report goes next to it)")
    ap.add_argument("--sets", default=",".join(SETS), help="synthetic sets whose TRAIN prompts are sampled")
    ap.add_argument("--n", type=int, default=100, help="prompts per set")
    ap.add_argument("--style", default="glm-4.5")
    for f, default in asdict(RejectionConfig()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(default), default=default)
    args = ap.parse_args(argv)
    from glmstack.posttrain.evaluate import items_of, load_engine
    from glmstack.posttrain.sft_data import write_jsonl

    if not (Path(args.checkpoint) / "config.json").exists():
        print(f"glmstack rejection-sample: {args.checkpoint}: not a model folder (no config.json)", file=sys.stderr)
        return 2
    cfg = RejectionConfig(**{f: getattr(args, f) for f in asdict(RejectionConfig())})
    try:
        items = [it for s in args.sets.split(",") for it in items_of(generate(s, args.n, args.seed, "train"))]
    except ValueError as e:
        print(f"glmstack rejection-sample: {e}", file=sys.stderr)
        return 2
    records, report = rejection_sample(load_engine(args.checkpoint), items, args.style, cfg)
    out = write_jsonl(records, args.out)
    out.with_suffix(".report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
