"""Session affinity: one OpenAI-compatible front over several engine processes, by consistent hashing.

Why: the prefix cache (inference/prefix_cache.py) lives in one engine process; an agent's conversation (or an RL
rollout) re-sends its growing history every turn, so every turn must reach the engine that holds that history's KV.
A hash ring (Karger et al. 1997; as in SGLang's cache-aware router) maps a session key to a replica; when a replica
dies only its keys move, to the next replica on the ring, and the others keep their caches.

How: `glmstack serve CKPT --replicas 2` starts each replica as its own `glmstack serve` process on a private port
and this router on --port. The session key of a request is, in order: the body field `conversation_id` or
`rollout_id` (removed before forwarding, replicas reject unknown fields), OpenAI's `user`, else a hash of the
start of the conversation (first 2 messages / the first 256 prompt tokens or characters), which a re-sent history
keeps. Requests and streams are relayed as they are; the reply carries `x-glmstack-replica`. A replica that cannot
be reached is marked down and its in-flight requests end with a clear 502 error (an SSE error event when the stream
had started); later requests go to the next live replica. GET /metrics: per-replica requests and failures, and
the replicas' prefix-cache hit rate (scraped from their /metrics).

    glmstack serve CKPT --replicas 2 --port 8000
    client.chat.completions.create(..., extra_body={"conversation_id": "agent-42"})
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import re

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

VNODES = 64  # virtual nodes per replica: keys spread evenly, a dead replica's keys spread over the others


def _h(s: str) -> int:
    return int.from_bytes(hashlib.sha1(s.encode()).digest()[:8], "big")


class Ring:
    def __init__(self, replicas: list[str]):
        self.replicas = list(replicas)
        self.down: set[str] = set()
        self.points = sorted((_h(f"{r}#{i}"), r) for r in replicas for i in range(VNODES))
        self.keys = [p for p, _ in self.points]

    def pick(self, key: str) -> str | None:
        """The first live replica clockwise from the key's point; None when all are down."""
        i = bisect.bisect(self.keys, _h(key))
        for j in range(len(self.points)):
            r = self.points[(i + j) % len(self.points)][1]
            if r not in self.down:
                return r
        return None


def session_key(body: dict) -> str:
    for field in ("conversation_id", "rollout_id", "user"):
        if body.get(field):
            return f"{field}:{body[field]}"
    if "messages" in body:
        return "messages:" + json.dumps(body["messages"][:2], sort_keys=True)
    prompt = body.get("prompt")
    return "prompt:" + json.dumps(prompt[:256] if isinstance(prompt, (str, list)) else prompt)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "replica_error", "param": None, "code": status}},
                        status_code=status)  # fmt: skip


def create_router(replicas: list[str], api_key: str | None = None, bind_host: str = "127.0.0.1",
                  allowed_hosts: list[str] | None = None, max_body_bytes: int = 4 << 20) -> FastAPI:  # fmt: skip
    """replicas: base URLs (http://127.0.0.1:PORT) of running `glmstack serve` processes. The router checks callers
    as a server does (security.Guard) and calls the replicas with the same API key."""
    from glmstack.serve.security import Guard

    auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), headers=auth)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await client.aclose()

    app = FastAPI(title="glmstack router", lifespan=lifespan)
    app.add_middleware(Guard, api_key=api_key, bind_host=bind_host, allowed_hosts=allowed_hosts,
                       max_body_bytes=max_body_bytes)  # fmt: skip
    ring = Ring(replicas)
    counts = {r: {"requests": 0, "failed": 0} for r in replicas}
    app.state.ring, app.state.counts = ring, counts

    def down(r: str) -> None:
        ring.down.add(r)
        counts[r]["failed"] += 1

    async def relay(request: Request, path: str):
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        key = session_key(body)
        for field in ("conversation_id", "rollout_id"):
            body.pop(field, None)
        r = ring.pick(key)
        if r is None:
            return _error(503, "no engine replica is alive")
        counts[r]["requests"] += 1
        try:
            req = client.build_request("POST", r + path, json=body)
            resp = await client.send(req, stream=True)
        except httpx.TransportError as e:
            down(r)
            return _error(502, f"engine replica {r} is unreachable ({type(e).__name__}); the request was lost, retry")
        headers = {"content-type": resp.headers.get("content-type", "application/json"), "x-glmstack-replica": r}
        if not headers["content-type"].startswith("text/event-stream"):
            try:
                content = await resp.aread()
            except httpx.TransportError as e:
                down(r)
                return _error(502, f"engine replica {r} failed mid-request ({type(e).__name__}); retry")
            finally:
                await resp.aclose()
            return Response(content, status_code=resp.status_code, headers=headers)

        async def stream():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            except httpx.TransportError as e:
                down(r)
                err = {"error": {"message": f"engine replica {r} failed mid-stream ({type(e).__name__}); retry",
                                 "type": "replica_error", "param": None, "code": 502}}  # fmt: skip
                yield f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
            finally:
                await resp.aclose()

        return StreamingResponse(stream(), status_code=resp.status_code, headers=headers)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await relay(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await relay(request, "/v1/completions")

    @app.get("/v1/models")
    async def models():
        for r in ring.replicas:
            if r not in ring.down:
                try:
                    resp = await client.get(r + "/v1/models")
                    return Response(resp.content, status_code=resp.status_code, media_type="application/json")
                except httpx.TransportError:
                    down(r)
        return _error(503, "no engine replica is alive")

    @app.get("/health")
    async def health():
        alive = [r for r in ring.replicas if r not in ring.down]
        body = {"status": "ok" if alive else "down", "replicas": {r: r not in ring.down for r in ring.replicas}}
        return JSONResponse(body, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def metrics():
        lines, hit, query = [], 0.0, 0.0
        for r in ring.replicas:
            lab = f'{{replica="{r}"}}'
            lines += [f"glmstack:router_requests_total{lab} {counts[r]['requests']}",
                      f"glmstack:router_failures_total{lab} {counts[r]['failed']}",
                      f"glmstack:router_replica_up{lab} {int(r not in ring.down)}"]  # fmt: skip
            if r in ring.down:
                continue
            try:
                text = (await client.get(r + "/metrics")).text
            except httpx.TransportError:
                down(r)
                continue
            h, q = _metric(text, "prefix_cache_hit_tokens_total"), _metric(text, "prefix_cache_query_tokens_total")
            hit, query = hit + h, query + q
            lines.append(f"glmstack:prefix_cache_hit_rate{lab} {h / max(q, 1):.4f}")
        lines.append(f"glmstack:prefix_cache_hit_rate {hit / max(query, 1):.4f}")
        return PlainTextResponse("\n".join(lines) + "\n")

    return app


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^glmstack:{name} ([0-9.eE+-]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def launch_replicas(argv: list[str], n: int, host: str = "127.0.0.1") -> tuple[list, list[str]]:
    """Start n `glmstack serve` processes (argv: the serve arguments without --replicas/--port/--host) on free
    loopback ports; -> (processes, base URLs) once each answers /health (a process that exits is an error)."""
    import socket
    import subprocess
    import sys
    import time

    procs, urls = [], []
    for _ in range(n):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "glmstack.serve.cli", *argv, "--host", host, "--port", str(port)]
        procs.append(subprocess.Popen(cmd))
        urls.append(f"http://{host}:{port}")
    deadline = time.monotonic() + 600
    for p, u in zip(procs, urls):
        while True:
            if p.poll() is not None:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"engine replica {u} exited with code {p.returncode} while starting")
            try:
                if httpx.get(u + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"engine replica {u} did not start")
            time.sleep(0.2)
    return procs, urls
