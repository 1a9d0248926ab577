"""Sandboxed execution of model-written Python for code RL rewards, HumanEval and the agentic Python tool.

    from glmstack.sandbox import run, run_batch, run_tests
    run("print(1 + 1)").stdout                        # '2\\n'
    run_tests(program, tests, "entry_point").passed  # graded by the verifier: tests here, the program sandboxed
    run_batch(["print(1)", "while True: pass"], concurrency=2)   # warm sandboxes per worker when root + bwrap

See docs/sandbox.md for the isolation layers per host and `glmstack sandbox --help` to try a snippet.
"""

from glmstack.sandbox.humaneval import run_tests
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.pool import Job, run_batch
from glmstack.sandbox.run import Result, run
from glmstack.sandbox.verifier import Check, Verdict, check_files, verify, verify_batch
from glmstack.sandbox.warm import WarmSandbox

__all__ = ["Check", "Job", "Limits", "Result", "Verdict", "WarmSandbox", "check_files", "run", "run_batch", "run_tests",
           "verify", "verify_batch"]  # fmt: skip
