"""Partial rollouts (`rl.partial_rollouts`): over-sample the prompts, stop generating once the batch's groups are
complete, keep the unfinished samples and continue them first at the next step.

Why: a rollout batch waits for its longest samples, and while the last few rows decode most of the engine's batch
is finished rows (`rollout_idle_frac`). APRIL (slime's `--over-sampling-batch-size` with aborts) over-samples
groups, aborts the stragglers once enough groups are done and resumes them next step from where they stopped.

How, per step (in process or on a rollout server, each rank for its share; `Rollouts.make_step` calls
`partial_step`):
  1. pending groups whose first tokens are more than `rl.tau` steps old are dropped (staleness bound);
  2. fresh groups are drawn so that ceil(n · (1 + rl.partial_oversample)) are in flight;
  3. one engine call decodes every unfinished row — a resumed row continues from its prompt + its tokens so far
     with the rest of its budget — and stops (`Request.stop_when`) as soon as n groups are complete (on a server,
     rl/remote.py streams the rows and closes the streams still open);
  4. the first n complete groups (pending ones first, so the oldest) are trained; the rest wait, their tokens,
     sampler log-probs and per-token weight versions kept. A resumed sample's rollout log-probs are each segment's
     sampler's, so the loss's per-token correction (IcePop / TIS, against the trainer's π_old) treats each segment
     by the weights that sampled it; `Sample.versions` lists them.
With rl.partial_oversample = 0 nothing is ever aborted (the stop fires only when every group is complete) and the
run is the plain path's bit for bit (tests/posttrain/test_rl_partial.py).
"""

from __future__ import annotations

import math
import time

from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.tasks import Problem
from glmstack.train import dist


def new_group(problem: Problem, seeds: list[int], uid: int, version: int) -> dict:
    """A group in flight, as plain data (it travels in the checkpoint's data state); `seeds`: its rows' first
    segments' (the plain path's seeds for the same rows, so that nothing aborted is the plain path exactly)."""
    return {"uid": uid, "prompt": list(problem.prompt_ids), "meta": problem.meta, "first_version": version,
            "rows": [{"tokens": [], "logprobs": [], "versions": [], "finish": None, "seed": s} for s in seeds]}


def complete(group: dict) -> bool:
    return all(r["finish"] is not None for r in group["rows"])


def partial_step(ro, n_groups: int, group_size: int, level: int, stable_seed) -> tuple[list, dict]:
    """One step's groups for `Rollouts.make_step` (module docstring): -> (this rank's groups as make_step's `kept`,
    stats). n_groups: the global batch's; each rank completes its share from its own pending groups and a slice of
    one global draw (row seeds by global row, as the plain path's), so ranks train disjoint prompts.
    stable_seed: rollouts.stable_seed (every seed a pure function of its parts)."""
    o, t0 = ro.opts, time.perf_counter()
    W, rank = dist.world(), dist.rank()
    n_groups //= W
    fresh_from = [g for g in ro.pending if ro.step - g["first_version"] <= o.tau]
    dropped = len(ro.pending) - len(fresh_from)
    per_rank = math.ceil(n_groups * (1 + o.partial_oversample))  # groups in flight on each rank
    want = per_rank - len(fresh_from)
    first = rank * per_rank  # this rank's slice of the global draw
    problems = ro.task.problems(split="train", n=per_rank * W, seed=stable_seed(ro.seed, ro.step, 0),
                                level=level)[first : first + want] if want > 0 else []  # fmt: skip
    seeds = [[stable_seed(ro.seed, (ro.step, 0), (first + i) * group_size + j) for j in range(group_size)]
             for i in range(len(problems))]  # fmt: skip
    groups = fresh_from + [new_group(p, s, (ro.next_uid + i) * W + rank, ro.version)
                           for i, (p, s) in enumerate(zip(problems, seeds))]  # fmt: skip
    ro.next_uid += len(problems)
    todo = [(g, j, r) for g in groups for j, r in enumerate(g["rows"]) if r["finish"] is None]
    stats = {"partial/dropped_groups": float(dropped), "partial/resumed_rows": float(sum(bool(r["tokens"])
             for _, _, r in todo)), "rollout_idle_frac": 0.0, "partial/aborted_rows": 0.0}  # fmt: skip
    if todo:
        res = generate(ro, groups, todo, n_groups, group_size, stable_seed)
        if "row_slots" in res.stats:  # the in-process engine's (a server's idle time is its own)
            stats["rollout_idle_frac"] = 1.0 - res.stats["new_tokens"] / max(res.stats["row_slots"], 1)
        stats["partial/aborted_rows"] = float(sum(f == "abort" for f in res.finish_reason))
        stats["new_tokens"] = float(res.stats["new_tokens"])
    done = [g for g in groups if complete(g)][:n_groups]
    ro.pending = [g for g in groups if not any(g is d for d in done)]
    stats["partial/pending_groups"] = float(len(ro.pending))
    t1 = time.perf_counter()
    kept = [score(ro, g) for g in done]
    stats |= {"time/rollout_s": t1 - t0, "time/reward_s": time.perf_counter() - t1,
              "rollout_samples_per_s": len(done) * group_size / max(t1 - t0, 1e-9)}  # fmt: skip
    return kept, stats


def generate(ro, groups: list[dict], todo: list, n_groups: int, group_size: int, stable_seed):
    """One engine call over every unfinished row; stops when n_groups groups are complete."""
    o = ro.opts
    done_rows = {id(g): sum(r["finish"] is not None for r in g["rows"]) for g in groups}
    owner = [id(g) for g, _, _ in todo]

    def stop_when(finish: list) -> bool:
        finished = dict(done_rows)
        for gid, f in zip(owner, finish):
            finished[gid] += f is not None
        return sum(n == group_size for n in finished.values()) >= n_groups

    prompts = [g["prompt"] + r["tokens"] for g, _, r in todo]
    budgets = [o.max_new_tokens - len(r["tokens"]) for _, _, r in todo]
    seeds = [stable_seed(ro.seed, "partial", g["uid"], j, len(r["tokens"])) if r["tokens"] else r["seed"]
             for g, j, r in todo]  # fmt: skip
    res = ro.engine.generate(prompts, o.max_new_tokens, temperature=ro.temperature, top_p=o.top_p, top_k=o.top_k,
                             seeds=seeds, logprobs=True, stop_ids=ro._stop_ids(), budgets=budgets,
                             stop_when=stop_when)  # fmt: skip
    ro.check_versions(res.weight_versions)
    for k, (_, _, r) in enumerate(todo):
        r["tokens"] += res.tokens[k]
        r["logprobs"] += res.logprobs[k]
        r["versions"] += [res.weight_versions[k]] * len(res.tokens[k])
        r["finish"] = None if res.finish_reason[k] == "abort" else res.finish_reason[k]
    return res


def score(ro, group: dict) -> list:
    """A complete group as make_step's kept groups hold it: [(row, reward, reward sample)], row = (prompt, tokens,
    log-probs, routes (None), versions)."""
    o, out = ro.opts, []
    samples = []
    for r in group["rows"]:
        toks = r["tokens"]
        text = ""
        if ro.tokenizer is not None:
            stop = set(ro.tokenizer.eos_ids)
            text = ro.tokenizer.decode(toks[:-1] if toks and toks[-1] in stop else toks)
        samples.append(reward_lib.Sample(meta=group["meta"], tokens=toks, text=text, finish=r["finish"],
                                         max_new_tokens=o.max_new_tokens, style=ro.style))  # fmt: skip
    rew, _ = reward_lib.total(samples, ro.weights)
    for r, reward, s in zip(group["rows"], rew, samples):
        versions = sorted(set(r["versions"]))
        out.append(((group["prompt"], r["tokens"], r["logprobs"], None, versions), reward, s))
    return out
