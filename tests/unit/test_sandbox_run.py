"""The sandbox's run(): results, stdin/files/argv, limits and flags, in the strongest mode this host has."""

import os

import pytest

from glmstack.sandbox import Limits, run, uids
from glmstack.sandbox.limits import Limits as L2

SHORT = Limits(timeout_s=5.0, memory_mb=512)


def test_hello_world_and_flags():
    r = run("print('hi')", limits=SHORT)
    assert r.ok and r.stdout == "hi\n" and r.stderr == "" and r.exit_code == 0
    assert not (r.timed_out or r.oom or r.output_truncated)
    assert 0 < r.duration_s < 5 and r.flags() == "-"
    assert {"process", "rlimits", "clean-env"} <= set(r.layers)


def test_stdin_files_and_argv_reach_the_program():
    code = "import sys; print(input(), open('data/in.txt').read(), open('b.bin','rb').read(), sys.argv[1:])"
    r = run(code, stdin="line", files={"data/in.txt": "text", "b.bin": b"\x00\x01"}, argv=("x", "y"), limits=SHORT)
    assert r.ok, r.stderr
    assert r.stdout == "line text b'\\x00\\x01' ['x', 'y']\n"


def test_work_dir_starts_empty_and_is_the_cwd():
    r = run("import os; print(sorted(os.listdir('.')), os.path.abspath('.') == os.getcwd())", limits=SHORT)
    assert r.stdout == "[] True\n"


def test_exit_codes_and_tracebacks():
    assert run("import sys; sys.exit(3)", limits=SHORT).exit_code == 3
    r = run("def f():\n    raise ValueError('boom')\nf()", limits=SHORT)
    assert r.exit_code == 1 and not r.ok
    assert 'File "main.py", line 2, in f' in r.stderr and "ValueError: boom" in r.stderr
    assert "sandbox" not in r.stderr.split("Traceback")[1].split("main.py")[0]  # no boot.py frames


def test_main_guard_and_syntax_error():
    assert run("if __name__ == '__main__':\n    print('main')", limits=SHORT).stdout == "main\n"
    r = run("def (:", limits=SHORT)
    assert r.exit_code == 1 and "SyntaxError" in r.stderr


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("GLMSTACK_UNIT_SECRET", "hunter2")
    r = run("import os; print(sorted(os.environ))", limits=SHORT)
    assert "GLMSTACK_UNIT_SECRET" not in r.stdout and "hunter2" not in r.stdout
    assert "PATH" in r.stdout


def test_timeout_flag():
    r = run("while True: pass", timeout_s=0.5)
    assert r.timed_out and not r.ok and r.exit_code == -9 and 0.5 <= r.duration_s < 3


def test_memory_limit_flags_oom():
    r = run("x = bytearray(2 * 2**30)", limits=SHORT)
    assert r.oom and not r.ok and "MemoryError" in r.stderr


def test_output_limit_truncates_and_kills():
    r = run("while True: print('x' * 1000)", max_output_bytes=10_000, limits=SHORT)
    assert r.output_truncated and not r.ok and len(r.stdout) == 10_000


def test_limits_replace_ignores_none():
    lim = L2(timeout_s=3).replace(timeout_s=None, memory_mb=100)
    assert lim.timeout_s == 3 and lim.memory_mb == 100
    rl = lim.rlimits()
    assert rl["RLIMIT_AS"] == 100 << 20 and rl["RLIMIT_CPU"] == 5 and rl["RLIMIT_CORE"] == 0


def test_bad_mode_is_an_error():
    with pytest.raises(ValueError):
        run("pass", mode="docker")


@pytest.mark.skipif(os.geteuid() != 0, reason="a dedicated uid needs root")
def test_runs_as_its_own_unprivileged_uid_and_leaves_nothing():
    r = run("import os; print(os.getuid(), os.getgid(), os.getgroups())", limits=SHORT)
    assert r.uid is not None and r.uid >= uids.UID_BASE and "uid" in r.layers
    assert r.stdout == f"{r.uid} {r.uid} []\n"
    assert uids.uid_pids(r.uid) == []


def test_exit_quit_and_multiprocessing_work():
    assert run("exit(3)", limits=SHORT).exit_code == 3
    assert run("quit()", limits=SHORT).exit_code == 0
    code = "import multiprocessing as mp\nif __name__ == '__main__':\n    with mp.Pool(2) as p:\n        print(p.map(abs, [-1, -2]))"
    r = run(code, limits=SHORT)
    assert r.ok and r.stdout == "[1, 2]\n", r.stderr


def test_death_by_signal_is_a_negative_exit_code():
    assert run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", limits=SHORT).exit_code == -11
