"""The speculative-acceptance monitor against injected cache corruption: catch rate and false alarms (issue 24).

    python bench/monitor_table.py --clean 200 --corrupted 100

A tiny GLM with one MTP layer is trained here (a minute on CPU) on a synthetic language whose next token depends on
the context: each sequence follows one of 8 hidden "topics" (a random permutation of the vocabulary per topic, taken
with probability 0.75, else a uniform token), so the model must read the history to predict, and its MTP layer
learns to draft. Generations then run through the server's scheduler (MTP speculation, draft_k 2, the prefix
cache on, the monitor on GLM-5's default rules: acceptance length < 1.4 or rate > 0.96 after 128 tokens). A
corrupted generation re-sends a 64-token prompt one of whose cached blocks was corrupted (PrefixCache fault_block,
default the third of the three it reuses; noise at 1x and 30x the block's own scale) on the previous request; a
clean one the same without the fault. Prints the table (caught / flagged per rule) as JSON.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch

from glmstack.inference import Engine
from glmstack.inference.prefix_cache import PrefixCache
from glmstack.inference.sampling import SamplingParams
from glmstack.model import GLM, ModelConfig
from glmstack.serve.monitor import MonitorConfig
from glmstack.serve.scheduler import Finished, Job, Scheduler

V, TOPICS, P_FOLLOW = 256, 8, 0.75


def corpus(n: int, T: int, gen: torch.Generator, perms: torch.Tensor) -> torch.Tensor:
    topic = torch.randint(TOPICS, (n,), generator=gen)
    x = torch.empty(n, T, dtype=torch.long)
    x[:, 0] = torch.randint(V, (n,), generator=gen)
    for t in range(1, T):
        follow = torch.rand(n, generator=gen) < P_FOLLOW
        x[:, t] = torch.where(follow, perms[topic, x[:, t - 1]], torch.randint(V, (n,), generator=gen))
    return x + 3  # ids 0..2 left for specials


def train(steps: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    perms = torch.stack([torch.randperm(V, generator=gen) for _ in range(TOPICS)])
    cfg = ModelConfig.preset("tiny", vocab_size=V + 3, num_hidden_layers=2, first_k_dense_replace=2,
                             num_nextn_predict_layers=1, max_position_embeddings=512)  # fmt: skip
    model = GLM(cfg).init_weights(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for step in range(steps):
        ids = corpus(16, 128, gen, perms)
        labels = torch.cat([ids[:, 1:], torch.full((16, 1), -100)], 1)  # labels are the next tokens (pre-shifted)
        loss = model(ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    return model.eval(), perms, gen


def generate(sched: Scheduler, prompt: list[int], n_new: int, seed: int) -> Job:
    done = threading.Event()
    job = Job(prompt_ids=prompt, max_new_tokens=n_new, params=SamplingParams(temperature=1.0), seed=seed,
              emit=lambda ev: done.set() if isinstance(ev, Finished) else None)  # fmt: skip
    sched.submit([job])
    done.wait(600)
    return job


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clean", type=int, default=200)
    ap.add_argument("--corrupted", type=int, default=100)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--fault-block", type=int, default=2, help="which block of the prompt's 4 is corrupted")
    ap.add_argument("--fault-scales", default="1,30", help="noise std per corrupted run, x the block's std")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    model, perms, gen = train(args.steps)
    train_s = time.time() - t0
    sched = Scheduler(Engine(model), speculative="mtp", draft_k=2, monitor=MonitorConfig(action="flag"))
    sched.start()
    scales = [float(x) for x in args.fault_scales.split(",")]
    kinds = [("clean", args.clean, None)] + [(f"corrupted x{s:g}", args.corrupted, s) for s in scales]
    rows = {kind: [] for kind, _, _ in kinds}
    try:
        for kind, n, scale in kinds:
            for i in range(n):
                sched.prefix_cache = PrefixCache(16, 2**26, fault_block=None if scale is None else args.fault_block,
                                                 fault_scale=scale or 1.0)  # fmt: skip
                prompt = corpus(1, 64, gen, perms)[0].tolist()
                generate(sched, prompt, 1, seed=i)  # fills the cache (block 0 corrupted when faulty)
                job = generate(sched, prompt, args.new_tokens, seed=10_000 + i)
                assert job.cached_tokens == 48, job.cached_tokens
                rows[kind].append(job.monitor.report())
    finally:
        sched.stop()
    table = {}
    for kind, reps in rows.items():
        flagged = [r["anomaly"] for r in reps if r["anomaly"]]
        table[kind] = {"generations": len(reps), "flagged": len(flagged),
                       "flag_rate": round(len(flagged) / max(len(reps), 1), 4),
                       "by_rule": {k: flagged.count(k) for k in set(flagged)},
                       "mean_acceptance_length": round(sum(r["acceptance_length"] for r in reps) / max(len(reps), 1), 3),
                       "mean_acceptance_rate": round(sum(r["acceptance_rate"] for r in reps) / max(len(reps), 1), 3),
                       "min_length": min((r["acceptance_length"] for r in reps), default=None),
                       "max_length": max((r["acceptance_length"] for r in reps), default=None)}  # fmt: skip
    res = {"table": table, "train_s": round(train_s, 1), "total_s": round(time.time() - t0, 1),
           "rules": "length < 1.4 or rate > 0.96 after 128 tokens; draft_k 2; temperature 1.0"}  # fmt: skip
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
