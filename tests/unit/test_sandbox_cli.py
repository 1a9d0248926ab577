"""`glmstack sandbox`: -c, a file, stdin, --json and --info, with the exit code telling ok from not."""

import io
import json

import pytest

from glmstack.sandbox.cli import main


def test_dash_c_prints_output_and_summary(capsys):
    assert main(["-c", "print(6 * 7)"]) == 0
    out, err = capsys.readouterr()
    assert out == "42\n" and "[sandbox] exit=0 flags=-" in err


def test_file_with_stdin_text(tmp_path, capsys):
    prog = tmp_path / "p.py"
    prog.write_text("print(input().upper())")
    assert main([str(prog), "--stdin-text", "abc"]) == 0
    assert capsys.readouterr().out == "ABC\n"


def test_program_from_stdin_times_out(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("while True: pass"))
    assert main(["-", "--timeout", "0.5"]) == 1
    assert "flags=timed_out" in capsys.readouterr().err


def test_json_and_info(capsys):
    assert main(["-c", "import sys; sys.exit(2)", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["exit_code"] == 2
    assert main(["--info"]) == 0
    assert "mode:" in capsys.readouterr().out


def test_tests_flag_grades_through_the_verifier(tmp_path, capsys):
    tests = tmp_path / "t.py"
    tests.write_text("assert add(2, 3) == 5\n")
    wrong = tmp_path / "w.py"
    wrong.write_text("def add(a, b):\n    print('PASS')\n    return a - b\nraise SystemExit(0)\n")
    assert main([str(wrong), "--tests", str(tests), "--entry-point", "add"]) == 1
    assert "[verdict] crashed" in capsys.readouterr().err  # it exits before serving a call: no marker helps
    right = tmp_path / "r.py"
    right.write_text("def add(a, b):\n    return a + b\n")
    assert main([str(right), "--tests", str(tests), "--entry-point", "add", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert (v["passed"], v["reason"], v["calls"]) == (True, "passed", 1)


def test_sandbox_cli_names_a_missing_tests_file(tmp_path, capsys):
    with pytest.raises(SystemExit, match="cannot read .*nope.py"):
        main(["-c", "def f(x): return x", "--tests", str(tmp_path / "nope.py"), "--entry-point", "f"])
