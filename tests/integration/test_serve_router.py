"""Two engine processes behind one router (`glmstack serve --replicas 2`, glmstack/serve/router.py): conversations
stick to their engine so its prefix cache is reused (hit rate reported); a replica killed mid-stream ends only
its in-flight request, with a clear error, and the server keeps answering from the other one."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_fixture import free_port
from serve_stress import build_random_checkpoint

from glmstack.serve.router import Ring, create_router, launch_replicas

pytestmark = [pytest.mark.slow, pytest.mark.dist]  # two engine processes (~10 s to start on a loaded machine)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import httpx
    import uvicorn

    ckpt = build_random_checkpoint(tmp_path_factory.mktemp("router") / "tiny")
    procs, urls = launch_replicas([ckpt, "--threads", "1", "--device", "cpu", "--prefix-cache-mb", "16"], 2)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_router(urls), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    yield url, procs, urls, httpx
    server.should_exit = True
    thread.join(timeout=10)
    for p in procs:
        p.kill()
        p.wait()


def _turn(client, conv: str, prompt: list[int], max_tokens: int = 4):
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
        extra_body={"conversation_id": conv, "return_token_ids": True, "ignore_eos": True})  # fmt: skip
    return raw.headers["x-glmstack-replica"], raw.parse().choices[0].model_extra["token_ids"]


def _ids_on_both(urls: list[str], per_replica: int) -> list[str]:
    """Conversation ids that the ring spreads over every replica: the ports are random, so fixed ids could all hash
    to one engine (CI saw it) and "both engines served" would fail by chance."""
    ring, chosen = Ring(urls), {u: [] for u in urls}
    for i in range(1000):
        u = ring.pick(f"conversation_id:agent-{i}")
        if len(chosen[u]) < per_replica:
            chosen[u].append(f"agent-{i}")
    return sorted((c for cs in chosen.values() for c in cs), key=lambda c: int(c.split("-")[1]))


def test_affinity_hit_rate_and_a_killed_replica(cluster):
    url, procs, urls, httpx = cluster
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    convs = {c: [3 + i] * 40 for i, c in enumerate(_ids_on_both(urls, per_replica=3))}
    where: dict[str, set[str]] = {c: set() for c in convs}
    for _turn_no in range(3):
        for c, prompt in convs.items():
            replica, out = _turn(client, c, prompt)
            where[c].add(replica)
            convs[c] = prompt + out + [5, 6, 7]
    assert all(len(s) == 1 for s in where.values())  # each conversation stayed on one engine
    assert {next(iter(s)) for s in where.values()} == set(urls)  # and both engines served
    metrics = httpx.get(url + "/metrics").text
    rate = float(metrics.split("glmstack:prefix_cache_hit_rate ")[1].split()[0])
    assert rate > 0.4, metrics  # turns 2 and 3 re-send the history: most of it comes from the cache

    # kill the engine of the first conversation while it streams: that request ends with a clear error
    victim_conv = next(iter(convs))
    victim = next(iter(where[victim_conv]))
    survivor_conv = next(c for c, s in where.items() if victim not in s)
    stream = client.completions.create(model="tiny", prompt=convs[victim_conv], max_tokens=500, temperature=0,
                                       stream=True, extra_body={"conversation_id": victim_conv, "ignore_eos": True})  # fmt: skip
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for i, _chunk in enumerate(stream):
            if i == 1:
                procs[urls.index(victim)].kill()
    assert httpx.get(url + "/health").status_code == 200
    assert _turn(client, survivor_conv, convs[survivor_conv])[0] != victim  # the other engine still serves
    assert _turn(client, victim_conv, convs[victim_conv])[0] != victim  # the dead one's sessions moved over
