"""`glmstack speedrun`: the whole GLM-4.5 recipe at tiny scale on a laptop CPU, ending in a report.

    glmstack speedrun [--out runs/speedrun] [--minutes 20] [--seed 0]

Stages, each announced by a banner and showing its own progress bar:

    tokenizer  a byte-level BPE with GLM's special tokens, trained on the embedded corpus (Python stdlib + docs)
    data       the data pipeline, twice: the pre-training mix and a code-heavy mid-training mix (repo-level
               documents, FIM): filters, dedup, quality buckets -> token shards with held-out splits
    pretrain   a tiny GLM-4.5-architecture MoE with an MTP layer: Muon, loss-free expert balancing
    midtrain   twice the context with RoPE base 1e4 -> 1e6, best-fit packing, the cosine continued
    sft        GLM's chat format: hybrid thinking + XML tool calls on the synthetic sets (glmstack sft)
    rl         reasoning RL (GRPO + IcePop) on the procedural compare task (glmstack rl rl_speedrun)
    agentic    agentic RL: calculator and python tool episodes (DIS, GLM-5 §3.3) with on-policy distillation from the
               reasoning-RL model on its own task mixed into every step (GLM-5 §3.5)
    general    general RL: each task's rules plus distillation from every earlier stage's model on its own prompts
               (reasoning RL: compare, agentic RL: tool calls, SFT: chat); its model is the final model
    evaluate   loss by token position, code samples, MTP speculative decoding statistics; <out>/model/ = the
               final chat model (weights, tokenizer, chat template) for `glmstack serve` / `glmstack chat`
    card       the report card, one column per stage's model: perplexity, tool task success, reasoning task accuracy,
               arithmetic accuracy, thinking switch, tool-call validity, well-formed turns, HumanEval pass@1, BFCL
               simple; sample conversations with a whole tool round trip
    report     report.md + plots/*.png + summary.json in the run folder

The time budget picks a row of `SIZES` (model width/depth, steps, sequence lengths); nothing is measured at run
time, so one seed gives the same figures run after run. Each finished stage leaves `<out>/<stage>/DONE.json`;
after Ctrl-C a re-run skips finished stages and the trainer resumes from the stage's `latest` checkpoint.
`GLMSTACK_SPEEDRUN_STOP_AFTER=<stage>` exits (code 75) right after that stage. See docs/speedrun.md.

Where things are: the stage configs are a recipe (glmstack/recipes/speedrun.py); run.py runs stages with their
markers; evaluate.py and summary.py are the last two stages.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from tqdm import tqdm

from glmstack.recipes.speedrun import MIDTRAIN_SHARES, corpus_config, midtrain, pretrain, size_for
from glmstack.recipes.speedrun import data as data_recipe
from glmstack.speedrun.card import stage_card
from glmstack.speedrun.evaluate import stage_evaluate
from glmstack.speedrun.posttrain import stage_agentic, stage_general, stage_rl, stage_sft
from glmstack.speedrun.run import STOP_ENV, Run, StopRequested, check_same_run, run_stages
from glmstack.speedrun.summary import stage_report
from glmstack.speedrun.threads import set_threads

STOPPED_EXIT = 75  # EX_TEMPFAIL: stopped on purpose, re-run to continue
__all__ = ["STAGES", "STOPPED_EXIT", "STOP_ENV", "Run", "StopRequested", "main", "run_stages"]


def stage_tokenizer(run: Run) -> dict:
    """Byte-level BPE trained on the train split of the embedded corpus (the eval split stays unseen)."""
    from glmstack.data.corpus import corpus_docs
    from glmstack.tokenizer import Tokenizer

    texts = (d.text for d in tqdm(corpus_docs(corpus_config(run.minutes, run.seed), split="train"), desc="corpus", unit="doc"))
    tok = Tokenizer.train(texts, vocab_size=run.size.vocab_size)
    tok.save(run.stage_dir("tokenizer"))
    return {"vocab_size": tok.vocab_size}


def stage_data(run: Run) -> dict:
    """The data pipeline, twice: the pre-training mixture, and a code-heavy one (repo-level documents, FIM) for
    mid-training. Filters, dedup (exact, MinHash, SemDeDup), quality buckets, token shards."""
    from glmstack.data.pipeline import build_dataset, with_seed

    out, tok = {}, run.tokenizer()
    for stage, shares in (("pretrain", None), ("midtrain", MIDTRAIN_SHARES)):
        cfg = with_seed(dataclasses.replace(data_recipe(), corpus=corpus_config(run.minutes, run.seed, shares)), run.seed)
        print(f"-- {stage} data", flush=True)
        summary = build_dataset(cfg, tok, run.stage_dir("data") / stage)
        out[stage] = {"train_tokens": _split_tokens(summary, "train"), "eval_tokens": _split_tokens(summary, "eval"),
                      "docs_read": summary["steps"][0][1], "docs_kept": summary["steps"][-1][2],
                      "steps": summary["steps"]}
    return out


def stage_train(stage: str):
    """Pre-training or mid-training through the one training loop (resumes from the stage's `latest`)."""

    def fn(run: Run) -> dict:
        from glmstack.train import stage as train_stage

        recipe = pretrain if stage == "pretrain" else midtrain
        cfg = recipe(run.minutes, str(run.out), run.seed, run.tokenizer().vocab_size)
        result = train_stage.run(cfg)
        if result["stopped"] != "done":
            raise RuntimeError(f"{stage} stopped early: {result['stopped']} (see {run.stage_dir(stage)})")
        return {k: result[k] for k in ("step", "tokens", "val_loss", "loss", "checkpoint")}

    return fn


def _split_tokens(summary: dict, split: str) -> int:
    return sum(s["tokens"] for s in summary["splits"][split]["shards"])


STAGES = [  # (name, banner text, fn(run) -> dict kept in <out>/<name>/DONE.json)
    ("tokenizer", "byte-level BPE on the embedded corpus", stage_tokenizer),
    ("data", "pipeline: filter, dedup, quality buckets, repo-level code -> token shards (FIM: loaders)", stage_data),
    ("pretrain", "GLM-4.5 MoE + MTP, Muon, loss-free balancing", stage_train("pretrain")),
    ("midtrain", "2x context, RoPE base 1e4 -> 1e6, best-fit packing", stage_train("midtrain")),
    ("sft", "chat format: hybrid thinking + tool calls on the synthetic sets", stage_sft),
    ("rl", "reasoning RL: GRPO + IcePop on the procedural compare task", stage_rl),
    ("agentic", "agentic RL: tool episodes + distillation from the reasoning-RL model", stage_agentic),
    ("general", "general RL: rules + distillation from every earlier stage's model", stage_general),
    ("evaluate", "samples, loss by position, MTP speculative decoding; the final model", stage_evaluate),
    ("card", "report card: every stage's model on the same held-out items", stage_card),
    ("report", "report.md + plots", stage_report),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmstack speedrun", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[3:]))
    p.add_argument("--out", default="runs/speedrun", help="run folder (re-running into it continues)")
    p.add_argument("--minutes", type=float, default=20, help="time budget; picks the model size and steps")
    p.add_argument("--seed", type=int, default=0, help="one seed gives the same figures")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(out=Path(args.out), seed=args.seed, minutes=args.minutes, size=size_for(args.minutes))
    threads = set_threads(check_same_run(run))
    print(f"glmstack speedrun -> {run.out}  (budget {run.minutes:g} min, seed {run.seed}, {threads} CPU threads; "
          f"size {run.size})", flush=True)
    t0 = time.perf_counter()
    try:
        run_stages(run, STAGES)
    except StopRequested as e:
        print(f"\nstopped after stage {e} (${STOP_ENV}); run the same command again to continue", flush=True)
        return STOPPED_EXIT
    except KeyboardInterrupt:
        print("\ninterrupted; run the same command again to continue from the last finished stage/checkpoint",
              file=sys.stderr, flush=True)
        return 130
    print(f"\nspeedrun finished in {time.perf_counter() - t0:.0f} s: {run.out / 'report.md'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
