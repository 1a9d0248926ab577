"""The calculator and python environments: the SFT tool set's tasks (glmstack.posttrain.synthetic.tool_item) as
environments, so the SFT'd model starts with a success rate RL can move (docs/sft.md: ~20% held out).

Levels (`agentic.level`, the curriculum's rows): 0 = the SFT set's tasks; python level 1 = the same five kinds of
program over wider ranges and twice the words (sums to 40, factorials to 15, squares to 9; 20 words SFT never used),
a larger task space where longer outputs must be copied (the easy-to-hard curriculum's harder level).

Success is the SFT set's verifier: the right tool was called and the true result is in the final answer. The
python tool runs in glmstack.sandbox; the expected output of a reference program is what the sandbox printed.
"""

from __future__ import annotations

import abc
import random

from glmstack.posttrain.agentic.env import EnvCrash, ToolEnv, register
from glmstack.posttrain.synthetic import WORDS, tool_item
from glmstack.posttrain.tools import CALCULATOR, PYTHON, TOOLS, calculate, run_python

NEW_WORDS = ["apple", "orange", "river", "mountain", "castle", "forest", "dragon", "summer", "winter", "coffee",
             "pencil", "bridge", "candle", "mirror", "button", "jungle", "rabbit", "tomato", "violin", "yellow"]  # fmt: skip
_OUTPUTS: dict[str, str] = {}  # reference program -> what the sandbox printed (deterministic programs)


def expected_output(code: str) -> str:
    if code not in _OUTPUTS:
        out = run_python(code)
        if out.startswith("Error"):
            raise EnvCrash(f"python: the reference program failed in the sandbox: {out}")
        _OUTPUTS[code] = out
    return _OUTPUTS[code]


class _SftToolEnv(ToolEnv):
    tool = ""
    tools = TOOLS  # both tools, as in SFT: choosing the right one is part of the task
    wide: staticmethod  # level >= 1's task generator

    @classmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        if level >= 1:
            return cls.wide(rng)
        while True:
            question, tool, args, _ = tool_item(rng)
            if tool == cls.tool:
                return {"question": question, "args": args}

    @classmethod
    def split_key(cls, spec: dict) -> str:
        """The question, as the SFT tools set keys its records: a prompt the card holds out never trains here."""
        return spec["question"]

    def call(self, name: str, args: dict) -> str:
        if name == "calculator":
            try:
                return str(calculate(str(args.get("expression", ""))))
            except ValueError as e:
                return f"Error: {e}"
        return run_python(str(args.get("code", "")))

    @abc.abstractmethod
    def answer_text(self) -> str:
        """The text the final answer must contain: the true result of the task's call."""

    def success(self) -> bool:
        content = (self.final or {}).get("content") or ""
        return bool(self.called(self.tool)) and self.answer_text() in content


def wide_calculator_task(rng: random.Random) -> dict:
    """Calculator level 1: the SFT templates (synthetic.tool_item) with a three-digit first operand, so the
    expression and a five- or six-digit result must be copied."""
    a, b, c = rng.randint(101, 999), rng.randint(11, 99), rng.randint(2, 9)
    expr = rng.choice([f"{a} * {b}", f"{a} * {b} + {c}", f"({a} + {b}) * {c}", f"{a * c} / {c}"])
    question = rng.choice(["Use the calculator to compute {e}.", "Please calculate {e}.", "What is {e}?"])
    return {"question": question.format(e=expr), "args": {"expression": expr}}


@register
class CalculatorEnv(_SftToolEnv):
    name, tool = "calculator", "calculator"
    wide = staticmethod(wide_calculator_task)

    def answer_text(self) -> str:
        return str(calculate(self.spec["args"]["expression"]))


def wide_python_task(rng: random.Random) -> dict:
    """Python level 1: the SFT templates (synthetic.tool_item) over wider ranges and more words."""
    word, kind = rng.choice(WORDS + NEW_WORDS), rng.choice(["sum", "reverse", "vowels", "square", "factorial"])
    n = {"sum": rng.randint(3, 40), "square": rng.randint(2, 9), "factorial": rng.randint(3, 15)}.get(kind, 0)
    question, code = {
        "sum": (f"Use Python to add up the numbers from 1 to {n}.", f"print(sum(range(1, {n} + 1)))"),
        "reverse": (f"Use Python to reverse the word '{word}'.", f"print('{word}'[::-1])"),
        "vowels": (f"Use Python to count the vowels in '{word}'.", f"print(sum(c in 'aeiou' for c in '{word}'))"),
        "square": (f"Use Python to list the squares of 1 to {n}.", f"print([i * i for i in range(1, {n} + 1)])"),
        "factorial": (f"Use Python to compute the factorial of {n}.", f"import math\nprint(math.factorial({n}))"),
    }[kind]  # fmt: skip
    return {"question": question, "args": {"code": code}}


@register
class PythonEnv(_SftToolEnv):
    name, tool = "python", "python"
    wide = staticmethod(wide_python_task)

    def answer_text(self) -> str:
        return expected_output(self.spec["args"]["code"])


__all__ = ["CALCULATOR", "PYTHON", "CalculatorEnv", "PythonEnv"]
