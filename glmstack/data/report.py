"""What a build did: documents in/out per step, why documents were removed, tokens per quality level and source.

`Summary` is filled by the pipeline stages, written to summary.json (and its mixture part to mixture.json, the
"mixture manifest": per source and level the epoch multiplier, documents and tokens before and after copies),
and printed as a table at the end of `glmstack data`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

FILTER_ORDER = ["boilerplate", "length", "symbols", "repetition", "code", "decontamination"]
DROP_ORDER = ["exact", "minhash", "semdedup", "quality: level epochs 0", "quality: fractional draw"]


@dataclass
class Summary:
    sources: dict = field(default_factory=dict)  # name -> SourceStats as dict
    filter_removed: Counter = field(default_factory=Counter)
    filter_reasons: Counter = field(default_factory=Counter)
    boilerplate_lines: int = 0
    drops: Counter = field(default_factory=Counter)  # step -> documents
    drops_by_source: dict = field(default_factory=lambda: defaultdict(Counter))
    tokens: dict = field(
        default_factory=lambda: defaultdict(lambda: {"docs": 0, "unique_tokens": 0, "tokens": 0, "copies": 0})
    )
    splits: dict = field(default_factory=dict)
    quality: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)  # sharded stage -> tasks, docs in/out, seconds, peak MB per task

    def add_filter_report(self, rep: dict) -> None:
        self.filter_removed.update(rep["removed"])
        self.filter_reasons.update(rep["reasons"])
        self.boilerplate_lines += rep["boilerplate_lines"]
        for source, n in rep["by_source"].items():
            self.drops_by_source[source]["filters"] += n

    def count_drop(self, why: str, row: dict) -> None:
        self.drops[why] += 1
        self.drops_by_source[row["source"]][why] += 1

    def count_tokens(self, row: dict, ntok: int) -> None:
        key = f"{row['split']}|{row['source']}|{row['level'] if row['level'] is not None else '-'}"
        t = self.tokens[key]
        t["docs"] += 1
        t["unique_tokens"] += ntok
        t["tokens"] += ntok * row["copies"]
        t["copies"] += row["copies"]

    def steps(self) -> list[tuple[str, int, int]]:
        """(step, docs in, docs out) in pipeline order."""
        n = sum(s["docs"] for s in self.sources.values())
        out = [("read", n, n)]
        for name in FILTER_ORDER + sorted(set(self.filter_removed) - set(FILTER_ORDER)):
            out.append((f"filter: {name}", n, n - self.filter_removed.get(name, 0)))
            n = out[-1][2]
        for name in DROP_ORDER + sorted(set(self.drops) - set(DROP_ORDER)):
            out.append((name, n, n - self.drops.get(name, 0)))
            n = out[-1][2]
        return out

    def mixture(self, mixture_cfg) -> dict:
        return {
            "epochs_by_level": mixture_cfg.epochs_by_level,
            "source_epochs": mixture_cfg.source_epochs,
            "unscored_epochs": mixture_cfg.unscored_epochs,
            "n_buckets": mixture_cfg.n_buckets,
            "seed": mixture_cfg.seed,
            "by_split_source_level": dict(sorted(self.tokens.items())),
        }

    def to_dict(self, mixture_cfg) -> dict:
        return {
            "sources": self.sources,
            "steps": [list(s) for s in self.steps()],
            "filter_reasons": dict(self.filter_reasons.most_common()),
            "boilerplate_lines_removed": self.boilerplate_lines,
            "drops_by_source": {k: dict(v) for k, v in self.drops_by_source.items()},
            "quality_model": self.quality,
            "splits": self.splits,
            "stages": self.stages,
            "mixture": self.mixture(mixture_cfg),
        }

    def table(self) -> str:
        lines = [f"{'step':<28}{'docs in':>10}{'docs out':>10}{'removed':>10}"]
        lines += [f"{s:<28}{a:>10}{b:>10}{a - b:>10}" for s, a, b in self.steps()]
        errors = sum(s["n_errors"] for s in self.sources.values())
        replaced = sum(s["utf8_replaced"] for s in self.sources.values())
        lines.append(f"input errors: {errors} bad records, {replaced} documents with invalid UTF-8 (replaced)")
        for s in self.sources.values():
            lines += [f"  {e}" for e in s["errors"][:5]]
        lines.append("")
        if self.stages:
            lines.append(f"{'stage':<28}{'tasks':>7}{'docs in':>10}{'docs out':>10}{'seconds':>9}{'peak MB/task':>14}")
            for name, st in self.stages.items():
                label = f"{name} ({st['embedder']})" if "embedder" in st else name
                lines.append(
                    f"{label:<28}{st['tasks']:>7}{st['docs_in']:>10}{st['docs_out']:>10}{st['seconds']:>9.2f}"
                    f"{st['peak_mb_per_task']:>14.0f}"
                )
            lines.append("")
        lines.append(f"{'split|source|level':<34}{'docs':>8}{'copies':>8}{'unique tok':>12}{'tokens':>12}")
        for key, t in sorted(self.tokens.items()):
            lines.append(f"{key:<34}{t['docs']:>8}{t['copies']:>8}{t['unique_tokens']:>12}{t['tokens']:>12}")
        for split, meta in self.splits.items():
            toks = sum(s["tokens"] for s in meta["shards"])
            lines.append(
                f"{split}: {sum(s['docs'] for s in meta['shards'])} documents, {toks} tokens, "
                f"{len(meta['shards'])} shard(s)"
            )
        return "\n".join(lines)
