"""The calculator and python environments: the SFT tool set's tasks (glmstack.posttrain.synthetic.tool_item) as
environments, so the SFT'd model starts with a success rate RL can move (docs/sft.md: ~20% held out).

Success is the SFT set's verifier: the right tool was called and the true result is in the final answer. The
python tool runs in glmstack.sandbox; the expected output of a reference program is what the sandbox printed.
"""

from __future__ import annotations

import abc
import random

from glmstack.posttrain.agentic.env import EnvCrash, ToolEnv, register
from glmstack.posttrain.synthetic import tool_item
from glmstack.posttrain.tools import CALCULATOR, PYTHON, TOOLS, calculate, run_python

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

    @classmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        while True:
            question, tool, args, _ = tool_item(rng)
            if tool == cls.tool:
                return {"question": question, "args": args}

    def prompt(self, spec: dict) -> list[dict]:
        return [{"role": "user", "content": spec["question"]}]

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


@register
class CalculatorEnv(_SftToolEnv):
    name, tool = "calculator", "calculator"

    def answer_text(self) -> str:
        return str(calculate(self.spec["args"]["expression"]))


@register
class PythonEnv(_SftToolEnv):
    name, tool = "python", "python"

    def answer_text(self) -> str:
        return expected_output(self.spec["args"]["code"])


__all__ = ["CALCULATOR", "PYTHON", "CalculatorEnv", "PythonEnv"]
