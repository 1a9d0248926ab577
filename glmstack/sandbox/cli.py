"""`glmstack sandbox`: run a snippet in the sandbox and print its output and result flags.

    glmstack sandbox -c 'print(sum(range(10)))'
    glmstack sandbox script.py --stdin-text 'abc' --timeout 2 --memory-mb 256
    echo 'while True: pass' | glmstack sandbox - --timeout 1      # prints: ... flags=timed_out
    glmstack sandbox --info                                         # which isolation mode and layers apply here
    glmstack sandbox solution.py --tests tests.py --entry-point add # grade: the verifier's verdict (verifier.py)

The program's stdout and stderr are printed as they were captured, then one summary line on stderr. The exit
code is 0 when the program exited 0 within every limit, 1 otherwise (`--json` prints the whole result). With
`--tests` the program is graded instead: it runs in the sandbox, the tests (trusted: asserts calling the entry
point, or `def check(candidate)`) run here and call it; the line says passed or the reason it failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from glmstack.sandbox import isolation
from glmstack.sandbox.limits import Limits
from glmstack.sandbox.run import run
from glmstack.sandbox.warm import warm_available


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="glmstack sandbox", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("file", nargs="?", help="Python file to run; '-' reads the program from stdin")
    src.add_argument("-c", dest="code", help="program text")
    src.add_argument("--info", action="store_true", help="print the isolation mode and layers, run nothing")
    ap.add_argument("--stdin-text", default=None, help="text given to the program on stdin")
    ap.add_argument("--stdin-file", default=None, help="file given to the program on stdin")
    d = Limits()
    ap.add_argument("--timeout", type=float, default=d.timeout_s, help="wall-clock seconds")
    ap.add_argument("--memory-mb", type=int, default=d.memory_mb, help="address space per process")
    ap.add_argument("--max-output", type=int, default=d.max_output_bytes, help="bytes of stdout/stderr each")
    ap.add_argument("--max-processes", type=int, default=d.max_processes, help="processes + threads")
    ap.add_argument("--mode", default="auto", choices=("auto", *isolation.MODES), help="isolation mode")
    ap.add_argument("--json", action="store_true", help="print the result as JSON instead")
    ap.add_argument("--tests", default=None, help="grade the program: a file of trusted tests (asserts or check())")
    ap.add_argument("--entry-point", default=None, help="with --tests: the function the tests call")
    ap.add_argument("--prompt", default=None, help="with --tests: a file of trusted helpers the tests use")
    return ap


def _info(mode: str) -> int:
    chosen = isolation.resolve(mode)
    print(f"mode: {chosen}  (available: {', '.join(m for m in isolation.MODES if isolation.available(m))})")
    print(f"layers: {', '.join(run('pass', mode=chosen).layers)}")  # as a real run reports them
    print(f"interpreter: {isolation.interpreter(chosen)}")
    print(f"warm sandboxes (run_batch): {'yes' if warm_available() and chosen == 'bwrap' else 'no'}")
    return 0


def _program(args) -> str:
    if args.code is not None:
        return args.code
    if args.file in (None, "-"):
        return sys.stdin.read()
    with open(args.file) as f:
        return f.read()


def _read(path: str | None) -> str:
    if path is None:
        return ""
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise SystemExit(f"glmstack sandbox: cannot read {path}: {e.strerror}") from None


def _grade(args, limits: Limits) -> int:
    from glmstack.sandbox.verifier import Check, verify

    if not args.entry_point:
        raise SystemExit("glmstack sandbox: --tests needs --entry-point (the function the tests call)")
    check = Check(program=_program(args), tests=_read(args.tests), entry_point=args.entry_point,
                  prompt=_read(args.prompt), limits=limits)  # fmt: skip
    v = verify(check, mode=args.mode)
    if args.json:
        print(json.dumps(dataclasses.asdict(v), indent=1))
    else:
        sys.stdout.write(v.stdout)
        sys.stderr.write(v.stderr)
        print(f"[verdict] {v.reason}{': ' + v.detail if v.detail else ''} calls={v.calls} "
              f"duration={v.duration_s:.3f}s", file=sys.stderr)  # fmt: skip
    return 0 if v.passed else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.info:
        return _info(args.mode)
    stdin = args.stdin_text
    if args.stdin_file:
        with open(args.stdin_file, "rb") as f:
            stdin = f.read()
    limits = Limits(
        timeout_s=args.timeout,
        memory_mb=args.memory_mb,
        max_output_bytes=args.max_output,
        max_processes=args.max_processes,
    )
    if args.tests is not None:
        return _grade(args, limits)
    r = run(_program(args), stdin=stdin, limits=limits, mode=args.mode)
    if args.json:
        print(json.dumps(dataclasses.asdict(r), indent=1))
    else:
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        print(
            f"[sandbox] exit={r.exit_code} flags={r.flags()} duration={r.duration_s:.3f}s mode={r.mode} "
            f"layers={','.join(r.layers)}",
            file=sys.stderr,
        )
    return 0 if r.ok else 1
