"""One loop for every generative task: pending samples -> generations -> scores -> the results file.

A task (humaneval.py, fim.py, bfcl.py, mathtasks.py) lists `Item`s, each with the request to send, the output
a perfect model would give (`oracle`, used by the tests' oracle endpoints) and what its scorer needs (`meta`).
`run_task` sends the items x samples not yet in the store in chunks, scores each chunk, appends the scored
records at once (so a crash keeps them, store.py) and shows a progress bar; the task then summarises every
record of the run. Sample s of item i is generated with its own seed, so a resumed run draws what the
uninterrupted one would have.

    summary = run_task(HumanEvalTask(style="chat"), client, store, n=1, temperature=0.0)
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from tqdm import tqdm


@dataclass
class Item:
    id: str
    request: dict  # see client.py
    oracle: dict  # the output a perfect model gives (client.py's output shape)
    meta: dict = field(default_factory=dict)  # what the scorer needs; "group" = the category it reports under
    text: str = ""  # the item's text for the decontamination report


def sample_seed(seed: int, item_id: str, sample: int) -> int:
    return (zlib.crc32(f"{seed}/{item_id}/{sample}".encode()) & 0x7FFFFFFF) or 1


def run_task(task, client, store, *, n: int = 1, temperature: float = 0.0, seed: int = 0, limit: int | None = None,
             chunk: int = 32, progress: bool = True) -> dict:  # fmt: skip
    """Generate and score every (item, sample) missing from `store`; return the task's summary of all records."""
    items = task.items(limit)
    todo = [(it, s) for it in items for s in range(n) if not store.has(task.name, it.id, s)]
    errors: list[str] = []
    bar = tqdm(total=len(items) * n, initial=len(items) * n - len(todo), desc=task.name, unit="sample",
               disable=not progress, dynamic_ncols=True)  # fmt: skip
    for start in range(0, len(todo), chunk):
        part = todo[start : start + chunk]
        outs = client.generate(
            [it.request for it, _ in part], temperature=temperature, max_tokens=task.max_tokens,
            seeds=[sample_seed(seed, it.id, s) for it, s in part],
        )  # fmt: skip
        ok = [(p, o) for p, o in zip(part, outs) if "error" not in o]
        errors += [f"{it.id}: {o['error']}" for (it, _), o in zip(part, outs) if "error" in o]
        scores = score_fitting(task, [it for (it, _), _ in ok], [o for _, o in ok])
        store.append([
            {"task": task.name, "id": it.id, "sample": s, "group": it.meta.get("group", task.name), **sc,
             "output": o}
            for ((it, s), o), sc in zip(ok, scores)
        ])  # fmt: skip
        bar.update(len(part))
    bar.close()
    ids = {it.id for it in items}
    summary = summarize([r for r in store.records(task.name) if r["id"] in ids and r["sample"] < n], n)
    if errors:
        summary["errors"] = {"count": len(errors), "first": errors[:3]}
    return summary


def score_fitting(task, items: list[Item], outputs: list[dict]) -> list[dict]:
    """task.score on the outputs; a prompt that did not fit the context (or that an endpoint rejected with a 400)
    fails: an irrelevance item would otherwise pass by saying nothing."""
    fits = [i for i, o in enumerate(outputs) if o.get("finish_reason") not in ("prompt_too_long", "rejected")]
    scored = task.score([items[i] for i in fits], [outputs[i] for i in fits]) if fits else []
    out = [{"passed": False, "result": o.get("rejected", "prompt longer than the model's context")} for o in outputs]
    for i, sc in zip(fits, scored):
        out[i] = sc
    return out


def summarize(records: list[dict], n: int) -> dict:
    """Per group and overall: items, samples, pass@k for k <= n (a record `passed` when its score is 1)."""
    from glmstack.eval.passk import mean_pass_at_k, reportable_ks

    by_group: dict[str, dict[str, list[bool]]] = {}
    too_long: dict[str, int] = {}  # prompts that did not fit the model's context (scored as failures)
    for r in records:
        by_group.setdefault(r["group"], {}).setdefault(r["id"], []).append(bool(r["passed"]))
        if r.get("output", {}).get("finish_reason") in ("prompt_too_long", "rejected"):
            too_long[r["group"]] = too_long.get(r["group"], 0) + 1

    def stats(per_item: dict[str, list[bool]], n_too_long: int) -> dict:
        counts = [(len(v), sum(v)) for v in per_item.values()]
        n_min = min((c[0] for c in counts), default=0)
        out = {"items": len(counts), "samples": sum(c[0] for c in counts), "complete": n_min >= n}
        out.update({f"pass@{k}": mean_pass_at_k(counts, k) for k in reportable_ks(n_min, (1, 5, 10, 100))})
        return {**out, "not_generated": n_too_long} if n_too_long else out

    everything = {f"{g}/{i}": v for g, items in by_group.items() for i, v in items.items()}
    groups = {g: stats(v, too_long.get(g, 0)) for g, v in sorted(by_group.items())}
    return {"overall": stats(everything, sum(too_long.values())), "groups": groups}
