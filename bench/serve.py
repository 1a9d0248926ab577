"""Serving throughput with continuous batching, and robustness under concurrent load with malformed requests.

Starts the real `glmstack serve` CLI (subprocess, 127.0.0.1) on the `tiny-moe` bench model (random weights, a
tokenizer trained here) and drives it with the official `openai` client (AsyncOpenAI):

Part 1 (throughput): C = 1, 4, 16, 64 concurrent streaming chat clients, each asking for N tokens (ignore_eos, so
every stream generates exactly N). Generated tokens/s = all completion tokens / wall time of the round. Rounds run
--repeats times, alternating ascending and descending C, so machine load hits every C alike; the median is kept.
The ratio against C = 1 is the continuous-batching gain (one forward per step serves every running request). The
server runs with --threads 1 by default: on a shared, overloaded machine two torch threads waiting on each other's
barriers made single runs up to 15x slower at random, which drowned the comparison (use --threads 0 for torch's
default on a quiet machine).

Part 2 (robustness): 64 concurrent streaming clients while 100 malformed requests (bad JSON, wrong types, unknown
model, n / max_tokens out of range, unknown fields, a prompt longer than the context) arrive interleaved. Checks: the
server stays up, every stream ends with a finish_reason and N tokens, every malformed request gets its expected
4xx in OpenAI's error shape.

    python bench/serve.py                        # ~4 minutes on a busy 2-core machine
    python bench/serve.py --tokens 64 --out /tmp/serve-bench   # also writes results.json + throughput.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

MALFORMED = [  # (body, expected status)
    ("{not json", 400),
    ('{"model": "bench", "messages": "hi"}', 422),
    ('{"model": "bench", "messages": [{"role": "user", "content": "a"}], "temperature": "hot"}', 422),
    ('{"model": "nope", "messages": [{"role": "user", "content": "a"}]}', 404),
    ('{"model": "bench", "messages": [{"role": "user", "content": "a"}], "n": 0}', 422),
    ('{"model": "bench", "messages": [{"role": "user", "content": "a"}], "max_tokens": 1000000}', 400),
    ('{"model": "bench", "messages": [{"role": "user", "content": "a"}], "max_token": 5}', 422),
    ('{"model": "bench", "messages": [{"role": "wizard", "content": "a"}]}', 400),
    ('{"model": "bench", "messages": [{"role": "user", "content": "' + "a " * 5000 + '"}]}', 400),
    ("[1, 2]", 400),
]


def build_model(folder: Path) -> None:
    from glmstack.model import GLM, ModelConfig, save_hf
    from glmstack.tokenizer import Tokenizer

    texts = ["the quick brown fox jumps over the lazy dog. " * 50, "def f(x):\n    return x + 1\n" * 50]
    save_hf(GLM(ModelConfig.preset("tiny-moe", max_position_embeddings=4096)).init_weights(seed=0), folder)
    Tokenizer.train(texts, vocab_size=512).save(folder)


def start_server(folder: Path, port: int, max_running: int, threads: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "glmstack.cli", "serve", str(folder), "--port", str(port), "--served-model-name",
           "bench", "--max-running", str(max_running), "--max-waiting", "512", "--dtype", "float32"]  # fmt: skip
    if threads:
        cmd += ["--threads", str(threads)]
    log = open(folder.parent / "server.log", "w")  # noqa: SIM115 — lives as long as the server
    proc = subprocess.Popen(cmd, stderr=log, stdout=log, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited: {(folder.parent / 'server.log').read_text()}") from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up")


async def one_stream(client, i: int, tokens: int) -> dict:
    stream = await client.chat.completions.create(
        model="bench", messages=[{"role": "user", "content": f"request {i}: tell me about foxes"}], stream=True,
        max_tokens=tokens, temperature=0.8, seed=i, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    finish, usage = None, None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
        if chunk.usage:
            usage = chunk.usage
    return {"finish": finish, "tokens": usage.completion_tokens if usage else 0}


def engine_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics") as r:
        lines = r.read().decode().splitlines()
    return {ln.split()[0]: float(ln.split()[1]) for ln in lines if ln.startswith("glmstack:engine_")}


async def round_(client, url: str, concurrency: int, tokens: int) -> dict:
    before = engine_counters(url)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one_stream(client, i, tokens) for i in range(concurrency)))
    wall = time.perf_counter() - t0
    after = engine_counters(url)
    generated = sum(r["tokens"] for r in results)
    busy = after["glmstack:engine_busy_seconds_total"] - before["glmstack:engine_busy_seconds_total"]
    steps = after["glmstack:engine_steps_total"] - before["glmstack:engine_steps_total"]
    # where the time goes: the engine thread's stepping vs the rest (HTTP, SSE, the clients, other processes)
    return {"concurrency": concurrency, "wall_s": wall, "tokens": generated, "tokens_per_s": generated / wall,
            "engine_busy_s": busy, "ms_per_step": 1000 * busy / max(steps, 1),
            "all_complete": all(r["finish"] == "length" and r["tokens"] == tokens for r in results)}  # fmt: skip


def post_raw(url: str, body: str) -> tuple[int, dict | None]:
    req = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, None
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except json.JSONDecodeError:
            return e.code, None


async def robustness(client, url: str, streams: int, n_bad: int, tokens: int) -> dict:
    loop = asyncio.get_running_loop()

    async def bad(k: int):
        await asyncio.sleep(0.02 * k)  # spread over the streams' lifetime
        body, want = MALFORMED[k % len(MALFORMED)]
        code, payload = await loop.run_in_executor(None, post_raw, url + "/v1/chat/completions", body)
        shape = payload is not None and set(payload.get("error", {})) >= {"message", "type", "param", "code"}
        return code == want and shape

    stream_tasks = [one_stream(client, 1000 + i, tokens) for i in range(streams)]
    results = await asyncio.gather(*stream_tasks, *(bad(k) for k in range(n_bad)))
    streamed, answered = results[:streams], results[streams:]
    return {
        "streams": streams,
        "streams_complete": sum(r["finish"] == "length" and r["tokens"] == tokens for r in streamed),
        "malformed": n_bad,
        "malformed_right_4xx": sum(answered),
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["concurrency"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(xs, [r["tokens_per_s"] for r in rows], "o-", label="measured")
    ax.plot(xs, [rows[0]["tokens_per_s"] * x for x in xs], ":", color="gray", label="linear in C")
    ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="generated tokens/s",
           title="glmstack serve, tiny-moe, CPU")  # fmt: skip
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def main_async(args, url: str) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=900)
    await round_(client, url, 2, 4)  # warm-up: first forwards build the fast path's caches
    levels = [1, 4, 16, 64]
    runs: dict[int, list[dict]] = {c: [] for c in levels}
    for rep in range(args.repeats):
        for c in levels if rep % 2 == 0 else levels[::-1]:
            r = await round_(client, url, c, args.tokens)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
            runs[c].append(r)
    rows = []
    for c in levels:
        tps = sorted(r["tokens_per_s"] for r in runs[c])
        rows.append({"concurrency": c, "tokens_per_s": statistics.median(tps), "runs_tokens_per_s": tps,
                     "engine_busy_share": statistics.median(r["engine_busy_s"] / r["wall_s"] for r in runs[c]),
                     "ms_per_step": statistics.median(r["ms_per_step"] for r in runs[c]),
                     "all_complete": all(r["all_complete"] for r in runs[c])})  # fmt: skip
    robust = await robustness(client, url, 64, 100, args.tokens)
    return {"throughput": rows, "speedup_16_vs_1": rows[2]["tokens_per_s"] / rows[0]["tokens_per_s"],
            "speedup_64_vs_1": rows[3]["tokens_per_s"] / rows[0]["tokens_per_s"], "robustness": robust}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds per concurrency level (median kept)")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads (0: torch's default)")
    ap.add_argument("--out", default=None, help="folder for results.json and throughput.png")
    args = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        build_model(Path(tmp) / "bench")
        proc = start_server(Path(tmp) / "bench", port, args.max_running, args.threads)
        try:
            url = f"http://127.0.0.1:{port}"
            res = asyncio.run(main_async(args, url))
            res["server_alive"] = proc.poll() is None
            with urllib.request.urlopen(url + "/health") as r:
                res["health_after"] = json.loads(r.read())["status"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    res["load_average"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
        plot(res["throughput"], out / "throughput.png")
        print(f"wrote {out / 'results.json'} and {out / 'throughput.png'}")
    rb = res["robustness"]
    ok = (
        res["server_alive"] and rb["streams_complete"] == rb["streams"] and rb["malformed_right_4xx"] == rb["malformed"]
    )
    print(f"tokens/s at 16 streams / 1 stream: {res['speedup_16_vs_1']:.2f}x; robustness {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
