"""RL rewards: plain callables registered by name, each scoring a batch of completed rollouts -> floats.

Why batches: the code reward runs unit tests in the sandbox, many at once (glmstack.sandbox.run_batch), so a rollout
batch is scored in one parallel call instead of one program after another. The others are cheap per sample.

  arithmetic  1 if the parsed final reply's last integer is the answer (glmstack.posttrain.synthetic.verify)
  math        1 if `math-verify` (PyPI) finds the reply's answer equal to meta["answer"] (LaTeX, fractions, ...)
  code        1 if the reply's Python (a ```python block, else the whole content) passes meta["tests"]: the program
              runs in the sandbox, the tests call meta["entry_point"] from the grader (glmstack.sandbox.verifier);
              `code.stats` has the share of each failure reason (reward/code_fail/<reason>)
  format      1 if the completion ended at a stop token, its thinking block is closed and every tool call parses
              (GLM-4.5 §3.3: a malformed tool call gets 0), else 0
  overlong    DAPO's soft overlong punishment: 0 up to max_new_tokens − overlong_cache, then a linear ramp to −1 at
              max_new_tokens (arXiv 2503.14476), added to the task reward
  tool_call   1 if the first tool call names meta["tool"], its arguments validate against the tool's schema and the call
              does the task's work: the calculator's value from the task's operands, the python program's output
  chat_fact   1 if the reply contains meta["answer"] (the SFT chat set's verifier)
  reasoning_gym  the reasoning-gym dataset's own scorer (0..1) on the reply's answer ("The answer is X." -> X)
  toy         1 if the first response token's id ≡ meta["answer"] (mod 4) (the token task of tasks.py)
  rm:<folder> a reward model's score; judge:<url>[|model] a generative judge's 0-10 grade / 10 (judges.py)

The stage's reward is Σ weight · reward over `rl.rewards` ([[name, weight], ...]; default: the task's own reward).

    register("my_reward")(lambda samples: [1.0 if s.text.strip() else 0.0 for s in samples])
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Sample:
    """One completed rollout as the rewards see it: tokens in, tokens out, the text decoded once from them."""

    meta: dict  # the problem's (answer, tests, ...)
    tokens: list[int]  # the response tokens, the stop token included when one ended it
    text: str  # decoded response (stop token dropped); "" without a tokenizer
    finish: str  # "stop" | "length"
    max_new_tokens: int
    style: str = "glm-4.5"
    extra: dict = field(default_factory=dict)


RewardFn = Callable[[list[Sample]], list[float]]
REWARDS: dict[str, RewardFn] = {}
OVERLONG_CACHE = 16  # tokens of DAPO's soft punishment ramp (L_cache), scaled down from 4096


def register(name: str):
    def add(fn: RewardFn) -> RewardFn:
        REWARDS[name] = fn
        return fn

    return add


# reward families "family:argument": a reward model folder, a judge endpoint (judges.py), built once per name
FAMILIES = {"rm": "glmstack.posttrain.rl.judges:reward_model", "judge": "glmstack.posttrain.rl.judges:judge"}


def get(name: str) -> RewardFn:
    family, _, arg = name.partition(":")
    if name not in REWARDS and arg and family in FAMILIES:
        import importlib

        module, fn = FAMILIES[family].split(":")
        REWARDS[name] = getattr(importlib.import_module(module), fn)(arg)
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r} (registered: {', '.join(sorted(REWARDS))}; "
                         f"families: {', '.join(f + ':ARG' for f in FAMILIES)})")  # fmt: skip
    return REWARDS[name]


def total(samples: list[Sample], weights: list[tuple[str, float]]) -> tuple[list[float], dict[str, float]]:
    """Σ weight · reward per sample, and each reward's mean (for the dashboard)."""
    out, means = [0.0] * len(samples), {}
    for name, w in weights:
        fn = get(name)
        values = fn(samples)
        means[f"reward/{name}"] = sum(values) / max(len(values), 1)
        means |= getattr(fn, "stats", {})  # e.g. a judge's unparsed-reply fraction
        out = [o + w * v for o, v in zip(out, values)]
    return out, means


def samples_of(metas: list[dict], res, max_new_tokens: int, style: str = "glm-4.5") -> list[Sample]:
    """An engine result's rows as the rewards' Samples, row i answering metas[i] (text "" without a tokenizer)."""
    texts = res.text if res.text is not None else [""] * len(res.tokens)
    return [Sample(meta=m, tokens=t, text=x, finish=f, max_new_tokens=max_new_tokens, style=style)
            for m, t, x, f in zip(metas, res.tokens, texts, res.finish_reason)]  # fmt: skip


def _message(s: Sample) -> dict:
    from glmstack.chat import parse

    return parse(s.text, None, style=s.style, in_reasoning=False)


@register("arithmetic")
def arithmetic(samples: list[Sample]) -> list[float]:
    from glmstack.posttrain.synthetic import verify

    return [float(verify({"set": "arithmetic", "answer": s.meta["answer"]}, _message(s))) for s in samples]


@register("math")
def math_answer(samples: list[Sample]) -> list[float]:
    from math_verify import parse as mv_parse
    from math_verify import verify as mv_verify

    out = []
    for s in samples:
        content = _message(s).get("content") or ""
        gold, pred = mv_parse(str(s.meta["answer"])), mv_parse(content)
        out.append(float(bool(gold) and bool(pred) and mv_verify(gold, pred)))
    return out


_CODE_BLOCK = re.compile(r"```(?:python)?\n(.*?)```", re.DOTALL)


def code_of(content: str) -> str:
    m = _CODE_BLOCK.search(content)
    return m.group(1) if m else content


@register("code")
def code(samples: list[Sample]) -> list[float]:
    from glmstack.sandbox import Limits
    from glmstack.sandbox.verifier import REASONS, Check, verify_batch

    limits = Limits(timeout_s=5.0, memory_mb=256, max_output_bytes=1 << 14)
    checks = [Check(program=code_of(_message(s).get("content") or ""), tests=s.meta["tests"],
                    entry_point=s.meta.get("entry_point", "f"), limits=limits) for s in samples]  # fmt: skip
    verdicts = verify_batch(checks)
    n = max(len(verdicts), 1)
    code.stats = {f"reward/code_fail/{r}": sum(v.reason == r for v in verdicts) / n for r in REASONS[1:]}
    return [float(v.passed) for v in verdicts]


@register("format")
def format_ok(samples: list[Sample]) -> list[float]:
    from glmstack.posttrain.multiturn import MARKUP

    out = []
    for s in samples:
        msg = _message(s)
        text = (msg.get("reasoning_content") or "") + (msg.get("content") or "")
        closed = s.text.count("<think>") <= s.text.count("</think>")
        calls_ok = s.text.count("<tool_call>") == len(msg.get("tool_calls") or [])
        out.append(float(s.finish == "stop" and closed and calls_ok and not any(t in text for t in MARKUP)))
    return out


@register("overlong")
def overlong(samples: list[Sample]) -> list[float]:
    out = []
    for s in samples:
        n, cache = len(s.tokens), min(OVERLONG_CACHE, s.max_new_tokens)
        free = s.max_new_tokens - cache
        out.append(0.0 if n <= free else -1.0 if s.finish == "length" else (free - n) / cache)
    return out


@register("tool_call")
def tool_call(samples: list[Sample]) -> list[float]:
    """1 if the first call names meta["tool"], validates against its schema and does the task's work (`right_call`);
    a valid call with miscopied operands is a wrong call."""
    import json

    from glmstack.chat import parse
    from glmstack.posttrain.tools import TOOLS, validate_call

    out = []
    for s in samples:
        calls = parse(s.text, TOOLS, style=s.style, in_reasoning=False).get("tool_calls") or []
        first = calls[0]["function"] if calls else {}
        ok = first.get("name") == s.meta["tool"] and validate_call(calls[0], TOOLS) is None
        args = first.get("arguments") if ok else None
        args = json.loads(args) if isinstance(args, str) else args
        out.append(float(ok and right_call(s.meta["tool"], args, s.meta["arguments"])))
    return out


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_REFERENCE: dict[str, str] = {}  # reference call -> its result (the reference programs are deterministic)


def right_call(tool: str, args: dict, reference: dict) -> bool:
    """Whether a schema-valid call computes what the task's reference call computes: for the calculator the same
    value from the same operands (reordering allowed; the answer typed in as a number is not a calculation), for
    python the same output, both programs run in the sandbox."""
    from glmstack.posttrain.tools import execute

    if args == reference:
        return True
    if tool == "calculator":
        expr, ref = str(args.get("expression", "")), str(reference["expression"])
        if sorted(_NUMBER.findall(expr)) != sorted(_NUMBER.findall(ref)):
            return False
    key = f"{tool}\0{sorted(reference.items())}"
    if key not in _REFERENCE:
        _REFERENCE[key] = execute(tool, reference)
    got = execute(tool, args)
    return not got.startswith("Error") and got == _REFERENCE[key]


@register("tool_answer")
def tool_answer(samples: list[Sample]) -> list[float]:
    """The tool's result (meta["answer"]) in the reply's content."""
    return [float(s.meta["answer"] in (_message(s).get("content") or "")) for s in samples]


@register("chat_fact")
def chat_fact(samples: list[Sample]) -> list[float]:
    from glmstack.posttrain.synthetic import verify

    return [float(verify({"set": "chat", "answer": s.meta["answer"]}, _message(s))) for s in samples]


_ANSWER_IS = re.compile(r"answer is:?\s*(.+?)\.?\s*$", re.DOTALL | re.IGNORECASE)


@register("reasoning_gym")
def reasoning_gym(samples: list[Sample]) -> list[float]:
    from reasoning_gym import get_score_answer_fn

    out = []
    for s in samples:
        content = (_message(s).get("content") or "").strip()
        m = _ANSWER_IS.search(content)
        entry = s.meta["entry"]
        score = get_score_answer_fn(entry["metadata"]["source_dataset"])
        out.append(float(score(answer=m.group(1) if m else content, entry=entry)))
    return out


@register("toy")
def toy(samples: list[Sample]) -> list[float]:
    return [float(bool(s.tokens) and s.tokens[0] % 4 == s.meta["answer"]) for s in samples]
