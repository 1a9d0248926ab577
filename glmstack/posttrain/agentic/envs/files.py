"""A small file-system task: create or fix files in a sandbox directory, checked by tests run in the sandbox.

The directory is the episode's state (path -> text); `run_tests` and the final check write it into a fresh
glmstack.sandbox work dir and run the task's tests there (real files, real Python). Level 0 asks for a new file
with given content; level 1 gives a module with a bug and asks for the fix. Process reward (GLM-5's "did it run
the tests before finishing"): `test_bonus` when `run_tests` was called before the final answer.
"""

from __future__ import annotations

import random

from glmstack.posttrain.agentic.env import EnvCrash, ToolEnv, register
from glmstack.posttrain.agentic.envs.functions import function

FILE_TOOLS = [
    function("write_file", "Write text to a file (replaces it).", path={"type": "string"}, content={"type": "string"}),
    function("read_file", "Read a file.", path={"type": "string"}),
    function("list_files", "List the files."),
    function("run_tests", "Run the task's tests; prints PASS or the failure."),
]
WORDS = ["hello", "sandbox", "rocket", "garden", "planet", "silver"]
BUGS = [("add", "a - b", "a + b", "assert add(2, 3) == 5"), ("mul", "a + b", "a * b", "assert mul(4, 3) == 12"),
        ("sub", "a + b", "a - b", "assert sub(9, 4) == 5")]  # fmt: skip


@register
class FilesEnv(ToolEnv):
    name = "files"
    tools = FILE_TOOLS

    @classmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        if level == 0:
            word, name = rng.choice(WORDS), rng.choice(["note", "greet", "out", "data"]) + ".txt"
            return {"question": f"Create a file named {name} that contains exactly: {word}", "files": {},
                    "tests": f"assert open({name!r}).read().strip() == {word!r}\nprint('PASS')"}  # fmt: skip
        fn, bad, good, test = rng.choice(BUGS)
        return {"question": f"calc.py has a bug: {fn}(a, b) is wrong. Fix calc.py so that the tests pass.",
                "files": {"calc.py": f"def {fn}(a, b):\n    return {bad}\n"},
                "tests": f"from calc import {fn}\n{test}\nprint('PASS')", "fix": good}  # fmt: skip

    def setup(self, spec: dict) -> None:
        self.files = dict(spec["files"])
        self.tested_before_answer = False

    def prompt(self, spec: dict) -> list[dict]:
        return [{"role": "user", "content": spec["question"]}]

    def run_tests(self) -> str:
        from glmstack.sandbox import Limits, run

        result = run(self.spec["tests"], files=self.files, limits=Limits(timeout_s=5.0))
        if result.ok and "PASS" in result.stdout:
            return "PASS"
        if result.exit_code is None and result.flags() == "-":  # no exit status and no limit hit: it never ran
            raise EnvCrash("files: the sandbox did not run the tests")
        err = (result.stderr or "").strip().splitlines()
        return "FAIL: " + (err[-1] if err else result.flags())

    def call(self, name: str, args: dict) -> str:
        path = str(args.get("path", ""))
        if name in ("write_file", "read_file") and (not path or path.startswith("/") or ".." in path):
            return "Error: give a relative path inside the directory"
        if name == "write_file":
            self.files[path] = str(args.get("content", ""))
            return f"wrote {len(self.files[path])} characters to {path}"
        if name == "read_file":
            return self.files.get(path, f"Error: no file {path}")
        if name == "list_files":
            return "\n".join(sorted(self.files)) or "(empty)"
        self.tested_before_answer = True
        return self.run_tests()

    def success(self) -> bool:
        return self.run_tests() == "PASS"

    def process_parts(self) -> dict:
        return {"tests_run": self.opts.test_bonus if self.tested_before_answer else 0.0}
