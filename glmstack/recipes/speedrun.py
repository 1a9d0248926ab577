"""`glmstack speedrun`: the whole GLM-4.5 recipe at tiny scale on a laptop CPU, ending in a report.

    glmstack speedrun [--out runs/speedrun] [--minutes 15] [--seed 0]

Stages, each announced by a banner and showing its own progress bar:

    data       the data pipeline over the embedded corpus (Python stdlib source + docs): filter, dedup, splits
    tokenizer  a byte-level BPE tokenizer trained on it, with GLM's special tokens
    pretrain   a tiny GLM-4.5-architecture MoE with an MTP layer: Muon, loss-free expert balancing
    midtrain   longer context with a larger RoPE base, repo-level code with FIM, best-fit packing
    evaluate   samples, loss by token position, MTP speculative decoding statistics
    report     report.md + plots/*.png in the run folder

The time budget picks a row of `SIZES` (model width/depth, steps, sequence lengths); nothing is measured at
run time, so one seed gives the same numbers on any machine. Each finished stage leaves `<out>/<stage>/DONE.json`;
after Ctrl-C a re-run skips finished stages and the trainer resumes from the stage's `latest` checkpoint.
`GLMSTACK_SPEEDRUN_STOP_AFTER=<stage>` exits (code 75) right after that stage, for tests of exactly this.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STOP_ENV = "GLMSTACK_SPEEDRUN_STOP_AFTER"
STOPPED_EXIT = 75  # EX_TEMPFAIL: stopped on purpose, re-run to continue


@dataclass(frozen=True, kw_only=True)
class Size:
    """One row of the budget table: what fits in `minutes` of a 2-core laptop CPU (shared machines run slower)."""

    minutes: float  # the smallest --minutes this row is used for
    hidden_size: int  # model width
    num_hidden_layers: int  # transformer blocks (the first is dense, the rest MoE)
    n_routed_experts: int  # routed experts per MoE layer (top-2 routed + 1 shared)
    vocab_size: int  # BPE vocabulary
    corpus_mb: float  # megabytes of the embedded corpus to run through the pipeline
    pretrain_steps: int  # optimizer steps of pre-training
    midtrain_steps: int  # optimizer steps of mid-training
    seq_len: int  # pre-training context
    mid_seq_len: int  # mid-training context (RoPE base raised with it)
    batch_size: int  # sequences per step


# minutes -> size: a small table, not a formula, so every row can be checked by running it (docs/speedrun.md)
SIZES = (
    Size(minutes=0, hidden_size=64, num_hidden_layers=2, n_routed_experts=4, vocab_size=512, corpus_mb=0.5,
         pretrain_steps=30, midtrain_steps=10, seq_len=64, mid_seq_len=128, batch_size=8),
    Size(minutes=5, hidden_size=96, num_hidden_layers=3, n_routed_experts=8, vocab_size=1024, corpus_mb=2,
         pretrain_steps=200, midtrain_steps=60, seq_len=128, mid_seq_len=256, batch_size=8),
    Size(minutes=15, hidden_size=128, num_hidden_layers=4, n_routed_experts=8, vocab_size=2048, corpus_mb=4,
         pretrain_steps=500, midtrain_steps=150, seq_len=128, mid_seq_len=256, batch_size=8),
    Size(minutes=60, hidden_size=256, num_hidden_layers=6, n_routed_experts=16, vocab_size=4096, corpus_mb=16,
         pretrain_steps=1500, midtrain_steps=400, seq_len=256, mid_seq_len=512, batch_size=16),
)


def size_for(minutes: float) -> Size:
    """The largest row whose `minutes` fits in the budget."""
    return [s for s in SIZES if s.minutes <= minutes][-1]


class StopRequested(Exception):
    """Raised after the stage named in $GLMSTACK_SPEEDRUN_STOP_AFTER."""


@dataclass
class Run:
    """What every stage sees: the run folder, the seed and the size row."""

    out: Path
    seed: int
    minutes: float
    size: Size

    def stage_dir(self, stage: str) -> Path:
        return self.out / stage

    def result(self, stage: str) -> dict:
        """The DONE.json of a finished stage (what it handed on)."""
        return json.loads((self.stage_dir(stage) / "DONE.json").read_text())


def banner(i: int, n: int, stage: str, what: str) -> None:
    line = f"[{i}/{n}] {stage}: {what}"
    print(f"\n{'=' * len(line)}\n{line}\n{'=' * len(line)}", flush=True)


def run_stages(run: Run, stages) -> dict[str, dict]:
    """Run each (name, description, fn) whose DONE.json is missing; fn(run) returns the dict DONE.json keeps."""
    results, stop_after = {}, os.environ.get(STOP_ENV, "")
    for i, (name, what, fn) in enumerate(stages, 1):
        done = run.stage_dir(name) / "DONE.json"
        if done.exists():
            results[name] = json.loads(done.read_text())
            print(f"[{i}/{len(stages)}] {name}: done already ({done}), skipped", flush=True)
        else:
            banner(i, len(stages), name, what)
            run.stage_dir(name).mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            result = dict(fn(run) or {})
            result["seconds"] = round(time.perf_counter() - t0, 2)
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps(result, indent=2) + "\n")
            os.replace(tmp, done)  # the marker appears only once the stage's outputs are all written
            results[name] = result
        if name == stop_after:
            raise StopRequested(name)
    return results


def _check_same_run(run: Run) -> None:
    """A re-run into one folder must use the same budget and seed, or its stages would not fit together."""
    path = run.out / "speedrun.json"
    want = {"minutes": run.minutes, "seed": run.seed, "size": asdict(run.size)}
    if path.exists():
        have = json.loads(path.read_text())
        if have != want:
            raise SystemExit(f"{run.out} holds a speedrun with {have['minutes']} minutes and seed {have['seed']}; "
                             f"continue it with those, or pick another --out")
    else:
        run.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(want, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- the stages

STAGES: list = []  # (name, description, fn(run) -> dict); filled in as the parts land


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmstack speedrun", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[3:]))
    p.add_argument("--out", default="runs/speedrun", help="run folder (re-running into it continues)")
    p.add_argument("--minutes", type=float, default=15, help="time budget; picks the model size and steps")
    p.add_argument("--seed", type=int, default=0, help="one seed gives the same figures")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(out=Path(args.out), seed=args.seed, minutes=args.minutes, size=size_for(args.minutes))
    _check_same_run(run)
    print(f"glmstack speedrun -> {run.out}  (budget {run.minutes:g} min, seed {run.seed}; size {run.size})", flush=True)
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
