"""The speedrun's state and stage runner: a run folder, its seed and size row, and stages that each leave a
`DONE.json` marker (written atomically, last), so an interrupted run continues from the first unfinished stage.

    results = run_stages(Run(out=Path("runs/speedrun"), seed=0, minutes=20, size=size_for(20)), STAGES)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from glmstack.atomic import write_atomic
from glmstack.recipes.speedrun import Size
from glmstack.speedrun.threads import start_threads

STOP_ENV = "GLMSTACK_SPEEDRUN_STOP_AFTER"


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

    def tokenizer(self):
        """The tokenizer the `tokenizer` stage trained."""
        from glmstack.tokenizer import Tokenizer

        return Tokenizer.load(self.stage_dir("tokenizer"))


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
            # the marker appears only once the stage's outputs are all written
            write_atomic(done, json.dumps(result, indent=2) + "\n")
            results[name] = result
        if name == stop_after:
            raise StopRequested(name)
    return results


def check_same_run(run: Run) -> int:
    """A re-run into one folder must use the same budget and seed, or its stages would not fit together. Returns the
    CPU threads the run trains on: chosen when it started (threads.py) and kept in speedrun.json, since the figures
    depend on it."""
    path = run.out / "speedrun.json"
    want = {"minutes": run.minutes, "seed": run.seed, "size": asdict(run.size)}
    if path.exists():
        have = json.loads(path.read_text())
        if {k: have.get(k) for k in want} != want:
            raise SystemExit(f"{run.out} holds a speedrun with --minutes {have['minutes']:g} --seed {have['seed']} "
                             f"(size {have['size']}); continue it with those, or pick another --out")
        if isinstance(have.get("threads"), int) and have["threads"] > 0 and "OMP_NUM_THREADS" not in os.environ:
            return have["threads"]  # anything else there is chosen again and rewritten
    threads = start_threads()  # OMP_NUM_THREADS, or the idle cores now (refused before anything is written)
    run.out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(want | {"threads": threads}, indent=2) + "\n")
    return threads
