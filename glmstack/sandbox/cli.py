"""`glmstack sandbox`: run a snippet in the sandbox and print its output and result flags.

    glmstack sandbox -c 'print(sum(range(10)))'
    glmstack sandbox script.py --stdin-text 'abc' --timeout 2 --memory-mb 256
    echo 'while True: pass' | glmstack sandbox - --timeout 1      # prints: ... flags=timed_out
    glmstack sandbox --info                                         # which isolation mode and layers apply here

The program's stdout and stderr are printed as they were captured, then one summary line on stderr. The exit
code is 0 when the program exited 0 within every limit, 1 otherwise (`--json` prints the whole result).
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
