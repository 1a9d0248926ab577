"""A small file-system task: create or fix files in a directory, graded by the verifier (glmstack.sandbox.verifier).

The directory is the episode's state (path -> text). Level 0 asks for a new file with given content: the
trusted check reads the file the model left (`check_files`; none of its text runs). Level 1 gives a module with a
bug and asks for the fix: the files go into a fresh sandbox work dir, the model's module is imported there, and
the task's asserts run in the grader, calling its function over the verifier's pipe. Nothing the model's code
prints or exits with reaches the verdict. Process reward (GLM-5's "did it run
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
    function("run_tests", "Run the task's tests; reports whether they pass, or the failure."),
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
                    "tests": f"assert files[{name!r}].strip() == {word!r}"}  # fmt: skip
        fn, bad, good, test = rng.choice(BUGS)
        return {"question": f"calc.py has a bug: {fn}(a, b) is wrong. Fix calc.py so that the tests pass.",
                "files": {"calc.py": f"def {fn}(a, b):\n    return {bad}\n"},
                "program": f"from calc import {fn}\n", "entry_point": fn, "tests": test, "fix": good}  # fmt: skip

    def setup(self, spec: dict) -> None:
        self.files = dict(spec["files"])
        self.tested_before_answer = False

    def run_tests(self) -> str:
        from glmstack.sandbox import Limits
        from glmstack.sandbox.verifier import Check, check_files, verify

        spec = self.spec
        if "program" not in spec:
            v = check_files(self.files, spec["tests"])
        else:
            check = Check(program=spec["program"], tests=spec["tests"], entry_point=spec["entry_point"],
                          files=self.files, limits=Limits(timeout_s=5.0))  # fmt: skip
            try:
                v = verify(check)
            except (OSError, RuntimeError) as e:  # the sandbox could not start: not the model's failure
                raise EnvCrash(f"files: the sandbox did not run the tests: {e}") from e
        return "PASS" if v.passed else f"FAIL: {v.reason}: {v.detail}"

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
