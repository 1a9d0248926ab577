"""The two tools of the synthetic SFT sets and `glmstack chat --run-tools`: a calculator and a Python interpreter.

What: `TOOLS` (OpenAI tool definitions), `FAULTS` (the failure texts agentic RL injects), `execute(name,
arguments) -> str` (the tool message content) and `validate_call(call, tools) -> str | None` (why a parsed tool
call does not satisfy its tool's JSON schema).
The python tool runs the code in glmstack.sandbox (isolated process, time and memory limits) and returns its stdout
(or its error), as GLM's agentic SFT data has the model read real tool output (GLM-4.5 §3.1). The calculator
evaluates + - * / // % ** and parentheses on numbers through the AST: no eval().
"""

from __future__ import annotations

import ast
import json
import operator

import jsonschema

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
PYTHON = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code, get what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
        },
    },
}
TOOLS = [CALCULATOR, PYTHON]
# What a tool returns when it fails instead of running: agentic RL injects these (agentic/env.py, `fault_p`) and
# the SFT recovery set (synthetic.py, tools_recovery) trains on them, so both read them here.
FAULTS = {
    "timeout": "Error: the {name} tool timed out after 10 s.",
    "error": "Error: the {name} service is temporarily unavailable. Try again.",
}

_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip


def calculate(expression: str):
    """The value of an arithmetic expression; ValueError on anything else (names, calls, huge powers)."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")

    try:
        result = value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, OverflowError, RecursionError) as e:
        raise ValueError(str(e) or type(e).__name__) from None
    return int(result) if isinstance(result, float) and result.is_integer() else result


def run_python(code: str, timeout_s: float = 5.0) -> str:
    """stdout of `code` in the sandbox, or its error's last line."""
    from glmstack.sandbox import Limits, run

    result = run(code, limits=Limits(timeout_s=timeout_s))
    if result.ok:
        return result.stdout.rstrip("\n")
    err = (result.stderr or "").strip().splitlines()
    return "Error: " + (err[-1] if err else result.flags())


def execute(name: str, arguments: dict | str) -> str:
    """Run one tool call; errors become the tool's answer (the model should read them, not crash the loop)."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    try:
        if name == "calculator":
            return str(calculate(str(args.get("expression", ""))))
        if name == "python":
            return run_python(str(args.get("code", "")))
    except ValueError as e:
        return f"Error: {e}"
    return f"Error: unknown tool {name!r}"


def validate_call(call: dict, tools) -> str | None:
    """None when an OpenAI-shape tool call names a given tool and its arguments satisfy the schema; else why not."""
    fn = call.get("function", call)
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or []}
    if fn.get("name") not in schemas:
        return f"unknown tool {fn.get('name')!r}"
    try:
        args = json.loads(fn["arguments"]) if isinstance(fn.get("arguments"), str) else fn.get("arguments") or {}
        jsonschema.validate(args, schemas[fn["name"]])
    except (ValueError, jsonschema.ValidationError) as e:
        return f"{fn['name']}: {getattr(e, 'message', str(e))[:80]}"
    return None
