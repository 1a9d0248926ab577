"""Decontamination report: how many items of each evaluation set share a word n-gram with the training shards.

GLM-4.5 decontaminates its training data against benchmarks (arXiv 2508.06471 §3); this reports the other side:
after training, which eval items could the model have seen? Every item's text (problem + reference, BFCL
question, math question) is cut into word 13-grams (GPT-3's contamination rule, as glmstack.data.decontam uses
to filter documents); the training shards are decoded document by document with the run's tokenizer and every
n-gram looked up. An item is "contaminated" when any of its n-grams occurs in training text.

    report = decontamination_report({"humaneval": items, ...}, "runs/data/pretrain/train", tokenizer)
"""

from __future__ import annotations

from glmstack.data.filters import words


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    ws = words(text.lower())
    return {tuple(ws[i : i + n]) for i in range(len(ws) - n + 1)}


def decontamination_report(eval_items: dict[str, list], shards_folder, tokenizer, n: int = 13,
                           max_docs: int | None = None) -> dict:  # fmt: skip
    """{task: {"items", "contaminated", "fraction", "examples"}} plus what was scanned."""
    from glmstack.data.shards import TokenShards

    owners: dict[tuple, set[tuple[str, str]]] = {}
    for task, items in eval_items.items():
        for it in items:
            for g in ngrams(it.text, n):
                owners.setdefault(g, set()).add((task, it.id))
    shards = TokenShards(shards_folder)
    hit: set[tuple[str, str]] = set()
    n_docs = shards.n_docs if max_docs is None else min(max_docs, shards.n_docs)
    for i in range(n_docs):
        for g in ngrams(tokenizer.decode(shards.doc(i).tolist()), n):
            hit |= owners.get(g, set())
    report = {"ngram": n, "shards": str(shards_folder), "docs_scanned": n_docs, "tasks": {}}
    for task, items in eval_items.items():
        ids = sorted({i for t, i in hit if t == task})
        total = len({it.id for it in items})
        report["tasks"][task] = {"items": total, "contaminated": len(ids), "fraction": len(ids) / max(total, 1),
                                 "examples": ids[:10]}  # fmt: skip
    return report
