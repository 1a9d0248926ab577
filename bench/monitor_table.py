"""The speculative-acceptance monitor against injected cache corruption: catch rate and false alarms (issue 24).

    python bench/monitor_table.py --n 100 --faults noise:1,noise:3,noise:10,noise:30,swap --model-cache m.pt

A tiny GLM with one MTP layer is trained here (a minute on CPU) on a synthetic language whose next token depends on
the context: each sequence follows one of 8 hidden "topics" (a random permutation of the vocabulary per topic, taken
with probability 0.75, else a uniform token), so the model must read the history to predict, and its MTP layer
learns to draft. Generations then run through the server's scheduler (MTP speculation, draft_k 2, the prefix
cache on, the monitor on GLM-5's default rules: acceptance length < 1.4 or rate > 0.96 after 128 tokens, or the
--min-length / --max-rate given). Each of the n cases is one prompt and one sampling seed, run once per kind: the
cache first holds another request's 64-token prompt (another topic), then the case's prompt, whose third reused
block is the faulty one (PrefixCache fault_block): "noise:S" replaces its KV by Gaussian noise of S times the
block's scale, "swap" by the other request's block at the same depth (Z.ai's race: a request reading a block
another request wrote). A generation is affected when its tokens differ from the clean run of the same case (same
prompt, same seed). Prints per kind: flagged (false alarms for clean), affected, caught among the affected, mean
acceptance length and rate; and the best length rule for this model (threshold just below the lowest clean length,
so 0 false alarms here) with what it would catch. --out keeps every generation's tokens and per-step acceptance.
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


def corpus(n: int, T: int, gen: torch.Generator, perms: torch.Tensor, topic: torch.Tensor | None = None):
    """n sequences of T tokens, each following one topic (random unless given) -> (n, T) ids."""
    topic = torch.randint(TOPICS, (n,), generator=gen) if topic is None else topic
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


def generate(sched: Scheduler, prompt: list[int], n_new: int, seed: int) -> tuple[Job, list[int]]:
    done, out = threading.Event(), []
    emit = lambda ev: done.set() if isinstance(ev, Finished) else out.append(ev.id)  # noqa: E731
    job = Job(prompt_ids=prompt, max_new_tokens=n_new, params=SamplingParams(temperature=1.0), seed=seed, emit=emit)
    sched.submit([job])
    done.wait(600)
    return job, out


def load_or_train(steps: int, path: str | None):
    """The trained model (cached at `path` as a state dict with its topic permutations) and the training time."""
    if path and Path(path).exists():
        saved = torch.load(path, weights_only=False)  # our own file: a ModelConfig beside the tensors
        model = GLM(saved["cfg"]).init_weights(seed=0).eval()
        model.load_state_dict(saved["model"])
        return model, saved["perms"], 0.0
    t0 = time.time()
    model, perms, _ = train(steps)
    if path:
        torch.save({"cfg": model.cfg, "model": model.state_dict(), "perms": perms}, path)
    return model, perms, time.time() - t0


def run_kind(sched, fault, cases, n_new: int, block: int) -> list[dict]:
    """Each case (other, prompt, seed): cache another request's prompt, then the prompt (its 3rd reused block is
    the faulty one, inserted `block`-th), then generate from the prompt over the cached prefix."""
    mode, scale = fault if fault else ("noise", 1.0)
    recs = []
    for other, prompt, seed in cases:
        sched.prefix_cache = PrefixCache(16, 2**26, fault_block=block if fault else None, fault_mode=mode,
                                         fault_scale=scale)  # fmt: skip
        generate(sched, other, 1, seed=seed)
        generate(sched, prompt, 1, seed=seed)
        job, toks = generate(sched, prompt, n_new, seed=seed + 1)
        assert job.cached_tokens == 48, job.cached_tokens
        recs.append({**job.monitor.report(), "tokens": toks, "history": job.monitor.history})
    return recs


def summarise(recs: list[dict], clean: list[dict] | None) -> dict:
    """Flags over all generations; with `clean` (the same prompts and seeds without the fault): which generations
    the fault affected (their tokens differ), and the catch rate among those."""
    row = {"generations": len(recs), "flagged": sum(bool(r["anomaly"]) for r in recs),
           "mean_acceptance_length": round(sum(r["acceptance_length"] for r in recs) / len(recs), 3),
           "length_range": [min(r["acceptance_length"] for r in recs), max(r["acceptance_length"] for r in recs)],
           "mean_acceptance_rate": round(sum(r["acceptance_rate"] for r in recs) / len(recs), 3)}  # fmt: skip
    flagged = [r["anomaly"] for r in recs if r["anomaly"]]
    row["by_rule"] = {k: flagged.count(k) for k in sorted(set(flagged))}
    if clean is not None:
        hit = [r["tokens"] != c["tokens"] for r, c in zip(recs, clean)]
        row["affected"] = sum(hit)
        row["caught_of_affected"] = sum(bool(r["anomaly"]) for r, h in zip(recs, hit) if h)
        row["first_divergence_mean"] = round(sum(_first_diff(r["tokens"], c["tokens"]) for r, c, h in
                                                 zip(recs, clean, hit) if h) / max(sum(hit), 1), 1)  # fmt: skip
    return row


def calibrated(records: dict[str, list[dict]]) -> dict:
    """The best a length rule can do on this model: flag below the lowest clean acceptance length (0 false alarms
    on these clean generations); per fault kind, how many generations that catches."""
    t = min(r["acceptance_length"] for r in records["clean"])
    return {"min_length": t, "caught": {k: sum(r["acceptance_length"] < t for r in recs)
                                        for k, recs in records.items() if k != "clean"}}  # fmt: skip


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="generations per kind (the same prompts and seeds in each)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--faults", default="noise:1,noise:30,swap", help="fault kinds: noise:SCALE or swap")
    ap.add_argument("--min-length", type=float, default=1.4, help="the monitor's acceptance-length rule")
    ap.add_argument("--max-rate", type=float, default=0.96, help="the monitor's acceptance-rate rule")
    ap.add_argument("--model-cache", default=None, help="save the trained model here / reuse it")
    ap.add_argument("--out", default=None, help="JSON: the table and every generation's record")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    model, perms, train_s = load_or_train(args.steps, args.model_cache)
    gen = torch.Generator().manual_seed(1)  # the prompts: the same whether the model was trained or loaded
    monitor = MonitorConfig(action="flag", min_acceptance_length=args.min_length, max_acceptance_rate=args.max_rate)
    sched = Scheduler(Engine(model), speculative="mtp", draft_k=2, monitor=monitor)
    topics = torch.randint(TOPICS, (args.n,), generator=gen)
    prompts = corpus(args.n, 64, gen, perms, topics).tolist()
    others = corpus(args.n, 64, gen, perms, (topics + 1 + torch.randint(TOPICS - 1, (args.n,), generator=gen)) % TOPICS)
    cases = [(o, p, 10_000 + 2 * i) for i, (o, p) in enumerate(zip(others.tolist(), prompts))]
    faults = {"clean": None}
    for f in args.faults.split(","):
        faults[f] = ("swap", 1.0) if f == "swap" else ("noise", float(f.split(":")[1]))
    records, table = {}, {}
    sched.start()
    try:
        for kind, fault in faults.items():
            records[kind] = run_kind(sched, fault, cases, args.new_tokens, block=4 + 2)  # the other prompt's 4 first
            table[kind] = summarise(records[kind], None if fault is None else records["clean"])
            print(kind, json.dumps(table[kind]), flush=True)
    finally:
        sched.stop()
    res = {"table": table, "calibrated_length_rule": calibrated(records), "train_s": round(train_s, 1), "total_s": round(time.time() - t0, 1),
           "rules": f"length < {args.min_length} or rate > {args.max_rate} after 128 tokens; draft_k 2; temperature 1"}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({**res, "records": records}))


if __name__ == "__main__":
    main()
