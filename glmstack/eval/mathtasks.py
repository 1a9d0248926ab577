"""Math: procedural problems with exact answers, scored with math-verify (gold parsed first, then the reply).

Sources, each generated from a seed so every run asks the same questions:
  reasoning-gym  chain_sum, basic_arithmetic, products, gcd, lcm, simple_equations (its `create_dataset`;
                 question/answer pairs, answers numeric), group "rg/<task>";
  mathgen        our own word problems and equations (glmstack.data.mathgen, the generators behind the
                 pre-training math text), group "mathgen/<generator>"; the "Answer:" line is the gold.
`mathematics-dataset` (DeepMind) is not used: it needs numpy < 2 and sympy shims (research eval-and-rewards §5).
Chat prompts ask for the answer in \\boxed{}; base prompts are "Question: ...\\nAnswer:" continued to the end of
the line. A reply passes when `math_verify.verify(parse("$gold$"), parse(reply))` holds (math-verify picks
\\boxed{} first, else the last number/expression). Timeouts are off because scoring may run in a thread, where
math-verify's signal-based timeout cannot work; the answers here are short.

    glmstack eval --model CKPT --tasks math --limit 50        # 50 problems per source
"""

from __future__ import annotations

import random

from glmstack.eval.runner import Item

RG_TASKS = ("chain_sum", "basic_arithmetic", "products", "gcd", "lcm", "simple_equations")
MATHGEN = ("arithmetic", "shopping", "travel", "sharing", "percent", "linear")
CHAT_ASK = "{question}\n\nPut your final answer in \\boxed{{}}."
BASE_ASK = "Question: {question}\nAnswer:"


def reasoning_gym_problems(task: str, n: int, seed: int) -> list[tuple[str, str]]:
    import reasoning_gym

    ds = reasoning_gym.create_dataset(task, size=n, seed=seed)
    return [(ds[i]["question"], str(ds[i]["answer"])) for i in range(n)]


def mathgen_problems(name: str, n: int, seed: int) -> list[tuple[str, str]]:
    """(question, answer) from a mathgen generator: the text before "Solution:", the number after "Answer:"."""
    from glmstack.data import mathgen

    rng, out = random.Random(f"eval/{name}/{seed}"), []
    for _ in range(n):
        text = getattr(mathgen, name)(rng)
        question = text.split("\nSolution:")[0].strip()
        answer = text.rsplit("Answer:", 1)[1].strip().removeprefix("x = ")
        out.append((question, answer))
    return out


def verify(gold: str, reply: str) -> bool:
    import logging

    from math_verify import parse
    from math_verify import verify as mv_verify

    for name in ("math_verify.parser", "math_verify.grader"):  # each call warns that timeouts are off, on purpose
        logging.getLogger(name).setLevel(logging.ERROR)

    target = parse(reply, parsing_timeout=None)
    return bool(target) and mv_verify(parse(f"${gold}$", parsing_timeout=None), target, timeout_seconds=None)


class MathTask:
    name = "math"

    def __init__(self, style: str = "chat", per_source: int = 50, seed: int = 1234,
                 rg_tasks=RG_TASKS, mathgen=MATHGEN):  # fmt: skip
        if style not in ("base", "chat"):
            raise ValueError(f"math prompt style must be 'base' or 'chat', got {style!r}")
        self.style, self.per_source, self.seed = style, per_source, seed
        self.rg_tasks, self.mathgen = tuple(rg_tasks), tuple(mathgen)
        self.max_tokens = 512 if style == "chat" else 32

    def items(self, limit: int | None = None) -> list[Item]:
        n = limit or self.per_source
        sources = [(f"rg/{t}", reasoning_gym_problems(t, n, self.seed)) for t in self.rg_tasks]
        sources += [(f"mathgen/{g}", mathgen_problems(g, n, self.seed)) for g in self.mathgen]
        return [self._item(group, i, q, a) for group, problems in sources for i, (q, a) in enumerate(problems)]

    def _item(self, group: str, i: int, question: str, answer: str) -> Item:
        if self.style == "chat":
            request = {"kind": "chat", "messages": [{"role": "user", "content": CHAT_ASK.format(question=question)}]}
            oracle = f"The answer is \\boxed{{{answer}}}."
        else:
            request = {"kind": "completion", "prompt": BASE_ASK.format(question=question), "stop": ["\n"]}
            oracle = f" {answer}"
        return Item(f"{group}/{i}", request, {"text": oracle, "tool_calls": []},
                    {"group": group, "answer": answer}, text=question)  # fmt: skip

    def score(self, items: list[Item], outputs: list[dict]) -> list[dict]:
        return [{"passed": verify(it.meta["answer"], out["text"]), "gold": it.meta["answer"]}
                for it, out in zip(items, outputs)]  # fmt: skip
