"""`glmstack speedrun`: the whole GLM-4.5 recipe at tiny scale on a laptop CPU, ending in a report.

    glmstack speedrun [--out runs/speedrun] [--minutes 15] [--seed 0]

Stages, each announced by a banner and showing its own progress bar:

    tokenizer  a byte-level BPE with GLM's special tokens, trained on the embedded corpus (Python stdlib + docs)
    data       the data pipeline, twice: the pre-training mix and a code-heavy mid-training mix (repo-level
               documents, FIM): filters, dedup, quality buckets -> token shards with held-out splits
    pretrain   a tiny GLM-4.5-architecture MoE with an MTP layer: Muon, loss-free expert balancing
    midtrain   twice the context with RoPE base 1e4 -> 1e6, best-fit packing, the cosine continued
    evaluate   loss by token position, code samples, MTP speculative decoding statistics; <out>/model/
    report     report.md + plots/*.png + summary.json in the run folder

The time budget picks a row of `SIZES` (model width/depth, steps, sequence lengths); nothing is measured at run
time, so one seed gives the same figures run after run. Each finished stage leaves `<out>/<stage>/DONE.json`;
after Ctrl-C a re-run skips finished stages and the trainer resumes from the stage's `latest` checkpoint.
`GLMSTACK_SPEEDRUN_STOP_AFTER=<stage>` exits (code 75) right after that stage. See docs/speedrun.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from glmstack.atomic import write_atomic

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
         pretrain_steps=500, midtrain_steps=120, seq_len=128, mid_seq_len=256, batch_size=8),
    Size(minutes=15, hidden_size=128, num_hidden_layers=4, n_routed_experts=8, vocab_size=2048, corpus_mb=4,
         pretrain_steps=1000, midtrain_steps=300, seq_len=128, mid_seq_len=256, batch_size=8),
    Size(minutes=60, hidden_size=192, num_hidden_layers=5, n_routed_experts=16, vocab_size=4096, corpus_mb=12,
         pretrain_steps=1000, midtrain_steps=300, seq_len=256, mid_seq_len=512, batch_size=8),
)  # measured on a shared 2-core machine: docs/speedrun.md; the 60-minute row is an estimate


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
            write_atomic(done, json.dumps(result, indent=2) + "\n")  # the marker appears only once the stage's outputs are all written
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
            raise SystemExit(f"{run.out} holds a speedrun with --minutes {have['minutes']:g} --seed {have['seed']} "
                             f"(size {have['size']}); continue it with those, or pick another --out")
    else:
        run.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(want, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- recipes
# `glmstack pretrain speedrun` / `glmstack midtrain speedrun` run these too (with the default budget and folder).


def model_overrides(size: Size, vocab_size: int) -> dict:
    """HF-named fields changed on the `tiny` preset: GLM-4.5's shape (dense first layer, top-2 of E routed
    experts + 1 shared, QK-Norm, partial RoPE, one MTP layer) at the row's width and depth."""
    d = size.hidden_size
    return {"vocab_size": vocab_size, "hidden_size": d, "num_hidden_layers": size.num_hidden_layers,
            "n_routed_experts": size.n_routed_experts, "intermediate_size": 3 * d, "moe_intermediate_size": d // 2,
            "num_attention_heads": d // 32, "num_key_value_heads": max(1, d // 64), "head_dim": 32,
            "max_position_embeddings": size.mid_seq_len}


def _val_every(steps: int, log_every: int, n: int) -> int:
    """About `n` validations per stage, on logged steps (val points share the training curves' step grid)."""
    return log_every * max(1, round(steps / n / log_every))


def pretrain(minutes: float = 15, out: str = "runs/speedrun", seed: int = 0, vocab_size: int | None = None):
    """Pre-training: Muon, warm-up + cosine spanning both stages, MTP weight 0.3, balancing bias rate 1e-3."""
    from glmstack.train.config import TrainConfig

    size, out = size_for(minutes), Path(out)
    total = size.pretrain_steps + size.midtrain_steps
    cfg = TrainConfig(run=out.name, stage="pretrain", out_dir=str(out.parent), model="tiny",
                      model_overrides=model_overrides(size, vocab_size or size.vocab_size), seed=seed,
                      seq_len=size.seq_len, micro_batch_size=size.batch_size, steps=size.pretrain_steps,
                      rope_theta=1e4, device="cpu")
    cfg.optim.lr = 3e-3  # toy scale tolerates a larger lr than GLM-4.5's 2.5e-4
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=max(5, size.pretrain_steps // 20),
                                       total_steps=total, mtp_weight=[[0, 0.3]], balance_rate=[[0, 1e-3]])
    cfg.data = dataclasses.replace(cfg.data, kind="shards", path=str(out / "data" / "pretrain" / "train"),
                                   val_path=str(out / "data" / "pretrain" / "eval"), packing="concat")
    cfg.ckpt.every, cfg.ckpt.keep_last = max(10, size.pretrain_steps // 5), 1
    cfg.log.every, cfg.log.val_batches = max(1, size.pretrain_steps // 50), 4  # ~50 log lines a stage
    cfg.log.val_every = _val_every(size.pretrain_steps, cfg.log.every, 10)
    return cfg


def midtrain(minutes: float = 15, out: str = "runs/speedrun", seed: int = 0, vocab_size: int | None = None):
    """Mid-training: twice the context with RoPE base 1e4 -> 1e6, best-fit packing, repo-level code with FIM,
    the same cosine continued to 10% (step_offset), MTP weight 0.1, balancing rate 0 (GLM-4.5 §2.4)."""
    size, out = size_for(minutes), Path(out)
    cfg = pretrain(minutes, str(out), seed, vocab_size)
    cfg.stage, cfg.steps, cfg.init_from = "midtrain", size.midtrain_steps, str(out / "pretrain")
    cfg.seq_len, cfg.micro_batch_size, cfg.rope_theta = size.mid_seq_len, size.batch_size // 2, 1e6
    cfg.data = dataclasses.replace(cfg.data, packing="best_fit", path=str(out / "data" / "midtrain" / "train"),
                                   val_path=str(out / "data" / "midtrain" / "eval"))
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=0, step_offset=size.pretrain_steps,
                                       mtp_weight=[[0, 0.1]], balance_rate=[[0, 0.0]])
    cfg.ckpt.every = max(10, size.midtrain_steps // 3)
    cfg.log.every = max(1, size.midtrain_steps // 50)
    cfg.log.val_every = _val_every(size.midtrain_steps, cfg.log.every, 8)
    return cfg


# ---------------------------------------------------------------------------------------------- the stages


def stage_tokenizer(run: Run) -> dict:
    """Byte-level BPE trained on the train split of the embedded corpus (the eval split stays unseen)."""
    from glmstack.data.corpus import corpus_docs
    from glmstack.tokenizer import Tokenizer

    texts = (d.text for d in tqdm(corpus_docs(_corpus_cfg(run), split="train"), desc="corpus", unit="doc"))
    tok = Tokenizer.train(texts, vocab_size=run.size.vocab_size)
    tok.save(run.stage_dir("tokenizer"))
    return {"vocab_size": tok.vocab_size}


def stage_data(run: Run) -> dict:
    """The data pipeline, twice: the pre-training mixture, and a code-heavy one (repo-level documents, FIM) for
    mid-training. Filters, dedup (exact, MinHash, SemDeDup), quality buckets, token shards."""
    from glmstack.data.cli import recipe_speedrun
    from glmstack.data.pipeline import build_dataset, with_seed

    out, tok = {}, _tokenizer(run)
    for stage, shares in (("pretrain", None), ("midtrain", MIDTRAIN_SHARES)):
        cfg = with_seed(dataclasses.replace(recipe_speedrun(), corpus=_corpus_cfg(run, shares)), run.seed)
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
        cfg = recipe(run.minutes, str(run.out), run.seed, _tokenizer(run).vocab_size)
        result = train_stage.run(cfg)
        if result["stopped"] != "done":
            raise RuntimeError(f"{stage} stopped early: {result['stopped']} (see {run.stage_dir(stage)})")
        return {k: result[k] for k in ("step", "tokens", "val_loss", "loss", "checkpoint")}

    return fn


def stage_evaluate(run: Run) -> dict:
    """Loss by position before/after mid-training, code samples, MTP speculative decoding statistics."""
    import torch

    from glmstack.eval import loss_by_position
    from glmstack.inference import Engine
    from glmstack.model import save_hf

    tok, models = _tokenizer(run), {s: _load(run, s) for s in ("pretrain", "midtrain")}
    seqs = held_out_windows(run.stage_dir("data") / "midtrain" / "eval", run.size.mid_seq_len + 1, n=EVAL_WINDOWS)
    nll = {s: loss_by_position(m, seqs).tolist() for s, m in tqdm(models.items(), desc="loss by position")}
    engine = Engine(models["midtrain"], tok)
    samples = engine.generate(SAMPLE_PROMPTS, max_new_tokens=SAMPLE_TOKENS, temperature=0.7, top_p=0.95,
                              seed=run.seed)
    prompts = [w[:SPEC_PROMPT_TOKENS].tolist() for w in seqs[:SPEC_PROMPTS]]
    save_hf(models["midtrain"], run.out / "model")  # the final model as one HF folder, with its tokenizer:
    tok.save(run.out / "model")  # `glmstack generate runs/speedrun/model --prompt "def " --speculative mtp`
    return {
        "perplexity_by_position": nll,
        "samples": [{"model": "mid-trained", "prompt": p, "completion": c} for p, c in zip(SAMPLE_PROMPTS, samples.text)],
        "speculative": speculative_stats(engine, prompts),
        "params": {"total": models["midtrain"].num_params(), "active": models["midtrain"].num_params(active=True)},
        "threads": torch.get_num_threads(),
    }


def stage_report(run: Run) -> dict:
    from glmstack.report import write_report

    summary = build_summary(run)
    (run.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return {"report": str(write_report(run.out, summary))}


# ---------------------------------------------------------------------------------------------- helpers
EVAL_WINDOWS = 64  # held-out windows for loss by position
SAMPLE_PROMPTS = ["import os\n\n\ndef ", "class Stack:\n    def __init__(self", "    for i in range("]
SAMPLE_TOKENS = 80  # new tokens per sample
SPEC_PROMPTS, SPEC_PROMPT_TOKENS, SPEC_TOKENS, DRAFT_K = 8, 24, 48, 3  # MTP speculative decoding measurement


# mid-training corpus: mostly code, a quarter of it whole standard-library packages as repo-level documents
MIDTRAIN_SHARES = {"stdlib-repos": 0.45, "stdlib-code": 0.3, "docstrings": 0.1, "pydoc": 0.05, "math": 0.1}


def _corpus_cfg(run: Run, shares: dict | None = None):
    from glmstack.data.corpus import CorpusConfig

    cfg = CorpusConfig(size_mb=run.size.corpus_mb, seed=run.seed)
    return dataclasses.replace(cfg, shares=shares) if shares else cfg


def _tokenizer(run: Run):
    from glmstack.tokenizer import Tokenizer

    return Tokenizer.load(run.stage_dir("tokenizer"))


def _split_tokens(summary: dict, split: str) -> int:
    return sum(s["tokens"] for s in summary["splits"][split]["shards"])


def _load(run: Run, stage: str):
    """The stage's newest complete checkpoint as a GLM in fp32."""
    import torch

    from glmstack.model import load_hf
    from glmstack.train.checkpoint import latest

    return load_hf(latest(run.stage_dir(stage)), dtype=torch.float32).eval()


def held_out_windows(folder: Path, length: int, n: int):
    """Up to `n` non-overlapping windows of `length` tokens from inside held-out documents (N, length)."""
    import torch

    from glmstack.data.shards import TokenShards

    shards, windows = TokenShards(folder), []
    for i in range(shards.n_docs):
        doc = shards.doc(i)
        windows += [doc[s : s + length] for s in range(0, len(doc) - length + 1, length)]
        if len(windows) >= n:
            break
    if not windows:  # documents all shorter than a window: cut the concatenated stream instead
        stream = shards.span(0, min(shards.n_tokens, n * length))
        windows = [stream[s : s + length] for s in range(0, len(stream) - length + 1, length)]
    return torch.tensor(np.stack(windows[:n]), dtype=torch.long)


def speculative_stats(engine, prompts: list[list[int]]) -> dict:
    """Greedy MTP speculative decoding (k = DRAFT_K) on held-out code prompts, checked against plain greedy."""
    plain = engine.generate(prompts, max_new_tokens=SPEC_TOKENS, temperature=0.0)
    spec = engine.generate(prompts, max_new_tokens=SPEC_TOKENS, temperature=0.0, speculative="mtp", draft_k=DRAFT_K)
    per_depth = [round(p, 6) for p in spec.stats["acceptance_per_depth"]]
    return {"draft_k": DRAFT_K, "mean_accepted": spec.stats["mean_accepted_length"], "acceptance_per_depth": per_depth,
            "histogram": accepted_histogram(per_depth), "equals_greedy": spec.tokens == plain.tokens,
            "verify_steps": spec.stats["verify_steps"], "tokens_per_s_plain": plain.stats["tokens_per_s"],
            "tokens_per_s_mtp": spec.stats["tokens_per_s"]}


def accepted_histogram(acceptance_per_depth: list[float]) -> dict[int, float]:
    """P(tokens per verify step = j) from P(drafts accepted >= j) per depth j = 1..k."""
    ge = [1.0] + list(acceptance_per_depth) + [0.0]
    return {j + 1: round(ge[j] - ge[j + 1], 6) for j in range(len(ge) - 1)}


def _val_losses(run: Run, stage: str) -> list[float]:
    from glmstack.train.metrics import read_metrics

    return [r["val_loss"] for r in read_metrics(run.stage_dir(stage) / "metrics.jsonl") if "val_loss" in r]


def _last_imbalance(run: Run, stage: str) -> float:
    from glmstack.report import imbalance
    from glmstack.train.metrics import read_metrics

    values = [imbalance(r) for r in read_metrics(run.stage_dir(stage) / "metrics.jsonl")]
    values = [v for v in values if v is not None][-10:]
    return sum(values) / len(values) if values else float("nan")


def _sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def build_summary(run: Run) -> dict:
    """Everything report.md shows; `figures` are deterministic for one seed, `timings` are wall-clock."""
    res = {name: run.result(name) for name, _, _ in STAGES if name != "report"}
    ev, size, split = res["evaluate"], run.size, run.size.seq_len - 1
    fig = {"model parameters": ev["params"]["total"], "active parameters per token": ev["params"]["active"],
           "vocabulary": res["tokenizer"]["vocab_size"]}
    for stage, d in ((k, v) for k, v in res["data"].items() if isinstance(v, dict)):
        fig |= {f"{stage} data: documents read": d["docs_read"], f"{stage} data: documents kept": d["docs_kept"],
                f"{stage} data: train tokens": d["train_tokens"], f"{stage} data: held-out tokens": d["eval_tokens"]}
    for stage in ("pretrain", "midtrain"):
        val = _val_losses(run, stage)
        fig |= {f"{stage} steps": res[stage]["step"], f"{stage} tokens": res[stage]["tokens"],
                f"{stage} val loss, first": _sig(val[0]) if val else float("nan"),
                f"{stage} val loss, last": _sig(val[-1]) if val else float("nan"),
                f"{stage} expert load max/mean, last 10 steps": _sig(_last_imbalance(run, stage))}
    for stage, nll in ev["perplexity_by_position"].items():
        fig[f"{stage}: held-out loss, positions < {size.seq_len}"] = _sig(float(np.mean(nll[:split])))
        fig[f"{stage}: held-out loss, positions {size.seq_len}-{size.mid_seq_len}"] = _sig(float(np.mean(nll[split:])))
    spec = ev["speculative"]
    fig["MTP mean accepted length"] = _sig(spec["mean_accepted"])
    fig |= {f"MTP acceptance at depth {j + 1}": p for j, p in enumerate(spec["acceptance_per_depth"])}
    fig["speculative output == greedy"] = spec["equals_greedy"]
    timings = {name: r["seconds"] for name, r in res.items()}
    return {
        "title": f"glmstack speedrun: {run.minutes:g}-minute budget, seed {run.seed}",
        "intro": INTRO.format(threads=ev["threads"], **asdict(size)),
        "figures": fig, "timings": timings, "samples": ev["samples"],
        "data_steps": {k: v["steps"] for k, v in res["data"].items() if isinstance(v, dict)},
        "perplexity_by_position": {"pre-trained (context " + str(size.seq_len) + ")": ev["perplexity_by_position"]["pretrain"],
                                   "mid-trained (context " + str(size.mid_seq_len) + ")": ev["perplexity_by_position"]["midtrain"]},
        "position_marks": [[size.seq_len, "pre-training context"]],
        "speculative": spec, "config": {"size": asdict(size), "seed": run.seed, "minutes": run.minutes},
    }


INTRO = ("The GLM-4.5 recipe at toy scale: a {num_hidden_layers}-layer MoE of width {hidden_size} "
         "({n_routed_experts} routed experts, top-2, 1 shared, one MTP layer) pre-trained for {pretrain_steps} steps "
         "at context {seq_len} and mid-trained for {midtrain_steps} steps at context {mid_seq_len} on the embedded "
         "corpus ({corpus_mb} MB of Python standard library source, docs and generated math), on {threads} CPU "
         "thread(s). Rerun with `glmstack speedrun`; redraw with `python -m glmstack.report <run folder>`.")


STAGES = [  # (name, banner text, fn(run) -> dict kept in <out>/<name>/DONE.json)
    ("tokenizer", "byte-level BPE on the embedded corpus", stage_tokenizer),
    ("data", "pipeline: filter, dedup, quality buckets, FIM, repo-level code -> token shards", stage_data),
    ("pretrain", "GLM-4.5 MoE + MTP, Muon, loss-free balancing", stage_train("pretrain")),
    ("midtrain", "2x context, RoPE base 1e4 -> 1e6, best-fit packing", stage_train("midtrain")),
    ("evaluate", "samples, loss by position, MTP speculative decoding", stage_evaluate),
    ("report", "report.md + plots", stage_report),
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="glmstack speedrun", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[3:]))
    p.add_argument("--out", default="runs/speedrun", help="run folder (re-running into it continues)")
    p.add_argument("--minutes", type=float, default=15, help="time budget; picks the model size and steps")
    p.add_argument("--seed", type=int, default=0, help="one seed gives the same figures")
    return p.parse_args(argv)


def set_threads() -> int:
    """Half the cores, at most 4, unless OMP_NUM_THREADS says otherwise: a tiny model gains little from more,
    and on a busy machine extra spinning threads make each step many times slower (measured: 2 threads on a
    loaded 2-core box ran 10x slower than 1)."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, min(4, (os.cpu_count() or 2) // 2)))
    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_threads()
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
