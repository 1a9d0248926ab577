"""The one verifier of model-written code: its verdict is decided outside the process that runs the code.

    from glmstack.sandbox.verifier import Check, verify, verify_batch, check_files
    v = verify(Check(program=prompt + completion, tests=problem["test"], entry_point="add", prompt=prompt))
    v.passed, v.reason, v.detail          # reason: passed | wrong_value | raised | not_plain_value | timeout | ...
    verify_batch([Check(...), ...], concurrency=2)          # warm sandboxes per worker where available
    check_files({"note.txt": "hello"}, "assert files['note.txt'].strip() == 'hello'")   # nothing of the model runs

Why (issue 33): RL optimises against its verifier. When the tests ran in the candidate's own process, a policy
could pass them without solving anything: an object equal to everything, a forged proof read from its own
memory, a printed marker and an early exit, `sys.settrace` jumping over the asserts, patched builtins. So:

- the candidate (untrusted) runs in the sandbox as a *callee*: its program runs as `__main__`, then it answers
  calls (boot.py's `_serve_calls`), one function name and plain arguments in, a plain value out (plain.py);
- the tests (trusted: the dataset's or the task's) run here, in the grader, with a proxy in place of the
  candidate's function. Each call crosses the pipe (calls.py); what comes back is parsed from bytes into None,
  bool, int, float, str, list, tuple, dict, set, frozenset, or refused (`not_plain_value`). Comparisons,
  asserts, helpers such as HumanEval's `poly` (from the trusted `prompt`, never the candidate's redefinition):
  all here, where the candidate cannot reach. There is no secret anywhere: nothing the candidate prints, exits
  with or writes can turn into a pass, and a failure it provokes once (timeout, non-plain value) stays a
  failure even if the tests catch it.

The tests see the usual semantics: `check(candidate)` (HumanEval) or top-level asserts naming the entry point
(RL tasks); exceptions the candidate raises reach the tests as the builtin exception of the same name (else
`CandidateError`); a float tolerance check works on the returned float. What differs from running in one
process: arguments are copies (a test cannot observe the candidate mutating them), and the `random` module the
tests import is their own, seeded per check (the grader's global RNG is never touched, and verdicts repeat).
The tests are trusted code and run in this process: never pass tests written by the model.
"""

from __future__ import annotations

import builtins
import functools
import marshal
import random
import traceback
import types
from dataclasses import dataclass, field
from typing import Any

from glmstack.sandbox import calls
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.plain import NotPlain, decode
from glmstack.sandbox.pool import Job, run_batch
from glmstack.sandbox.run import Result, run

REASONS = ("passed", "wrong_value", "raised", "not_plain_value", "missing_function", "syntax_error", "crashed",
           "timeout", "oom", "output_truncated", "test_error")  # fmt: skip
DEFAULT_LIMITS = Limits(timeout_s=10.0, memory_mb=1024, max_output_bytes=1 << 16)
TEST_SEED = 0  # the tests' own `random` module starts here for every check


@dataclass(kw_only=True)
class Check:
    """One candidate against one set of tests."""

    program: str  # the candidate's code (untrusted): runs in the sandbox, defines the function under test
    tests: str  # trusted: top-level asserts calling `entry_point`, and/or `def check(candidate)`, then called
    entry_point: str  # the function the tests call (a name the program defines or imports)
    prompt: str = ""  # trusted code run here before the tests: the task's helpers (HumanEval's `poly`, ...)
    files: dict[str, str | bytes] = field(default_factory=dict)  # written into the candidate's work dir first
    limits: Limits | None = None  # None: DEFAULT_LIMITS (or the batch's)


@dataclass(kw_only=True)
class Verdict:
    """Whether the candidate passed, and why not (`reason`, one of REASONS; `detail` for a person)."""

    passed: bool
    reason: str
    detail: str = ""
    calls: int = 0  # calls the tests made
    stdout: str = ""  # the candidate's output, for people; never read for the verdict
    stderr: str = ""
    duration_s: float = 0.0


class CandidateError(Exception):
    """The candidate raised an exception that is not a builtin one (its type name and message)."""


class _Stop(BaseException):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


# Builtin exceptions the tests may see by their own class. Not the iteration protocol's: a StopIteration from
# the candidate inside a test's `map(...)` would end the iteration early and let `all(...)` pass.
_EXCEPTIONS = {n: e for n, e in vars(builtins).items() if isinstance(e, type) and issubclass(e, Exception)
               and not issubclass(e, (StopIteration, StopAsyncIteration))}  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _compiled(source: str, name: str) -> types.CodeType:
    return compile(source, name, "exec")


def _private_random(seed: int) -> types.ModuleType:
    """A `random` module of the tests' own: the module's functions bound to a fresh Random(seed)."""
    rng, mod = random.Random(seed), types.ModuleType("random")
    for name in random.__all__:
        value = getattr(random, name)
        mod.__dict__[name] = getattr(rng, name) if getattr(value, "__self__", None) is random._inst else value
    return mod


def _test_builtins(seed: int) -> dict:
    own = _private_random(seed)

    def imp(name, globals=None, locals=None, fromlist=(), level=0):
        return own if name == "random" and level == 0 else builtins.__import__(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": imp}


class _Candidate:
    """What the tests call in place of the candidate's function: a call over the pipe, plain values back."""

    def __init__(self, grader: _Grader, pipe: calls.CallPipe, name: str):
        self._grader, self._pipe, self._name = grader, pipe, name

    def __call__(self, *args, **kwargs):
        g = self._grader
        if g.failure is not None:  # once failed, always failed: the tests may have caught the first one
            raise g.failure
        try:
            request = (self._name, args, kwargs)
            marshal.dumps(request, 4)
        except ValueError as e:
            raise g.fail("test_error", f"the tests passed an argument that cannot be sent: {e}") from None
        g.calls += 1
        try:
            kind, body = self._pipe.call(*request)
        except calls.TimedOut:
            raise g.fail("timeout", f"no reply to call {g.calls} in time") from None
        except calls.ReplyTooLarge as e:
            raise g.fail("not_plain_value", str(e)) from None
        except calls.Gone:
            raise g.fail("crashed", f"the program ended during call {g.calls}") from None
        return self._answer(kind, body)

    def _answer(self, kind: bytes, body: bytes) -> Any:
        g = self._grader
        try:
            if kind == b"V":
                return decode(body)
            if kind == b"E":
                name, message = decode(body)
        except (NotPlain, TypeError, ValueError) as e:  # ValueError: not a [name, message] pair
            raise g.fail("not_plain_value", str(e)) from None
        if kind == b"E":
            raised = _EXCEPTIONS.get(name, CandidateError)
            exc = raised(str(message)) if raised is not CandidateError else CandidateError(f"{name}: {message}")
            g.raised.add(id(exc))
            raise exc
        if kind == b"N":
            raise g.fail("not_plain_value", _text(body))
        if kind == b"M":
            raise g.fail("missing_function", f"the program defines no function {self._name!r}")
        raise g.fail("crashed", f"a reply of unknown kind {kind!r}")


class _Grader:
    """The driver of one check (run in this process while the candidate serves calls) and its verdict."""

    def __init__(self, check: Check):
        self.check, self.calls = check, 0
        self.failure: _Stop | None = None
        self.raised: set[int] = set()  # ids of exceptions made from the candidate's replies
        self.outcome: tuple[str, str] | None = None

    def fail(self, reason: str, detail: str = "") -> _Stop:
        if self.failure is None:
            self.failure = _Stop(reason, detail)
        return self.failure

    def __call__(self, pipe: calls.CallPipe) -> None:
        try:
            self._ready(pipe)
            self._run_tests(pipe)
            self.outcome = self.failure and (self.failure.reason, self.failure.detail) or ("passed", "")
        except _Stop as e:
            self.outcome = (e.reason, e.detail)
        except AssertionError as e:
            why = self.failure and (self.failure.reason, self.failure.detail)
            self.outcome = why or (("raised", _one_line(e)) if id(e) in self.raised else self._assertion(e))
        except Exception as e:  # noqa: BLE001 -- the tests' own error, or the candidate's exception uncaught
            why = self.failure and (self.failure.reason, self.failure.detail)
            # after a call, an error in the tests' code is theirs choking on the value (None where a list was due)
            own = "raised" if id(e) in self.raised else "wrong_value" if self.calls else "test_error"
            self.outcome = why or (own, _one_line(e))
        if self.outcome[0] == "passed" and self.calls == 0:
            self.outcome = ("test_error", "the tests never called the candidate")

    def _ready(self, pipe: calls.CallPipe) -> None:
        try:
            kind, _ = pipe.reply()
        except calls.TimedOut:
            raise _Stop("timeout", "the program did not finish loading in time") from None
        except (calls.Gone, calls.ReplyTooLarge):
            raise _Stop("crashed", "the program ended before the tests started") from None
        if kind != b"R":
            raise _Stop("crashed", "the program broke the call protocol")

    def _run_tests(self, pipe: calls.CallPipe) -> None:
        c = self.check
        ns = {"__name__": "__check__", "__builtins__": _test_builtins(TEST_SEED)}
        if c.prompt:
            exec(_compiled(c.prompt, "<prompt>"), ns)  # noqa: S102 -- trusted: the task's own helpers
        proxy = _Candidate(self, pipe, c.entry_point)
        ns[c.entry_point] = proxy
        exec(_compiled(c.tests, "<tests>"), ns)  # noqa: S102 -- trusted: the task's tests
        if callable(ns.get("check")):
            ns["check"](proxy)

    def _assertion(self, e: AssertionError) -> tuple[str, str]:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == "<tests>"]
        line = frames[-1].lineno if frames else None
        text = self.check.tests.splitlines()[line - 1].strip() if line else ""
        detail = f"line {line}: {text}" if line else "assertion failed"
        return "wrong_value", (detail + (f" ({e})" if str(e) else ""))[:300]

    def verdict(self, r: Result) -> Verdict:
        reason, detail = self.outcome or ("crashed", "the grader did not run")
        if reason in ("crashed", "timeout"):  # the sandbox knows better why the program ended
            reason, detail = _ended(r, reason, detail)
        elif reason == "raised" and detail.startswith("MemoryError"):  # at the address-space limit
            reason = "oom"
        return Verdict(passed=reason == "passed", reason=reason, detail=detail, calls=self.calls, stdout=r.stdout,
                       stderr=r.stderr, duration_s=r.duration_s)  # fmt: skip


def _text(body: bytes) -> str:
    """The candidate's description of a failure (wire text of a str, or anything: it is only shown)."""
    try:
        value = decode(body)
    except NotPlain:
        value = body.decode("ascii", "replace")
    return str(value)[:300]


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def _ended(r: Result, reason: str, detail: str) -> tuple[str, str]:
    """A refined reason for a candidate that went away, from the sandbox's result (its stderr is the candidate's
    own words, so it only picks between failure labels)."""
    if r.oom:
        return "oom", "out of memory"
    if r.output_truncated:
        return "output_truncated", "printed more than the output limit"
    if r.timed_out:
        return "timeout", f"ran past {r.duration_s:.1f} s"
    last = (r.stderr or "").strip().splitlines()[-1:] or [""]
    if reason == "crashed" and last[0].startswith(("SyntaxError", "IndentationError", "TabError")):
        return "syntax_error", last[0][:300]
    return reason, (f"{detail}: {last[0]}" if last[0] else f"{detail} (exit {r.exit_code})")[:300]


def verify(check: Check, *, mode: str = "auto", box=None) -> Verdict:
    """Run one check: the candidate in a fresh sandbox (or `box`, a WarmSandbox), the tests here."""
    grader = _Grader(check)
    limits = check.limits or DEFAULT_LIMITS
    if box is not None:
        r = box.run(check.program, files=check.files, limits=limits, driver=grader)
    else:
        r = run(check.program, files=check.files, limits=limits, mode=mode, driver=grader)
    return grader.verdict(r)


def verify_batch(
    checks: list[Check], *, concurrency: int | None = None, limits: Limits | None = None, mode: str = "auto",
    warm: bool | None = None, on_result=None,
) -> list[Verdict]:  # fmt: skip
    """Every check, `concurrency` at once (warm sandboxes per worker where available, as run_batch);
    `on_result(index, verdict)` as each finishes."""
    graders = [_Grader(c) for c in checks]
    jobs = [Job(code=c.program, files=c.files, limits=c.limits, driver=g) for c, g in zip(checks, graders)]
    done = None if on_result is None else (lambda i, r: on_result(i, graders[i].verdict(r)))
    results = run_batch(jobs, concurrency=concurrency, limits=limits or DEFAULT_LIMITS, mode=mode, warm=warm,
                        on_result=done)  # fmt: skip
    return [g.verdict(r) for g, r in zip(graders, results)]


def check_files(files: dict[str, str], tests: str) -> Verdict:
    """Tasks graded on the files a candidate left: trusted `tests` read them from a read-only `files` mapping,
    here; none of the candidate's code runs (its files are data)."""
    ns = {
        "__name__": "__check__",
        "__builtins__": _test_builtins(TEST_SEED),
        "files": types.MappingProxyType(dict(files)),
    }
    try:
        exec(_compiled(tests, "<tests>"), ns)  # noqa: S102 -- trusted: the task's tests
    except AssertionError as e:
        line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == "<tests>"), 0)
        return Verdict(passed=False, reason="wrong_value", detail=tests.splitlines()[line - 1].strip() if line else "")
    except Exception as e:  # noqa: BLE001 -- e.g. KeyError: the file is missing
        return Verdict(passed=False, reason="test_error" if not isinstance(e, KeyError) else "wrong_value",
                       detail=_one_line(e))  # fmt: skip
    return Verdict(passed=True, reason="passed")
