"""Several LoRA adapters served over one base, unmerged (model/lora_multi.py, `glmstack serve BASE --lora NAME=DIR`).

A forward whose rows use the base and two adapters equals, row by row, the merged models' forwards (GQA + MoE + MTP
and MLA + DSA presets, the experts' fast and reference paths); through the server, the official `openai` client's
greedy completions for the base and two adapters, decoded in one continuous batch, equal the merged checkpoints'
own greedy outputs; the prefix cache never serves one adapter's KV to another; adapters load and unload at run time
(vLLM's routes), only from inside --weight-root.
"""

import json
import shutil
import sys
import threading
from pathlib import Path

import httpx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))
from hf_helpers import random_ids, randomise_
from serve_fixture import RunningServer

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.model.lora import LoraConfig, apply_lora, lora_names
from glmstack.model.lora_multi import MultiLoraExperts, add_adapter, use_slots
from glmstack.model.lora_peft import save_adapter
from glmstack.model.merge import merge
from glmstack.tokenizer import Tokenizer

ALL = ["attention", "mlp", "experts", "indexer", "mtp"]


def make_base(folder, preset="tiny", **over):
    cfg = ModelConfig.preset(preset, **over)
    model = GLM(cfg).init_weights(seed=0)
    randomise_(model, seed=2)
    save_hf(model, folder)
    return cfg


def make_adapter(base, folder, seed: int, r: int, targets=ALL):
    """A PEFT adapter folder with non-zero B (a trained adapter's shape, not the zero-B start)."""
    model = load_hf(base)
    apply_lora(model, LoraConfig(r=r, alpha=2 * r, targets=targets), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in lora_names(model):
            p = model.get_parameter(n)
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    save_adapter(model, folder)
    return str(folder)


@pytest.mark.parametrize("preset,grouped", [("tiny", True), ("tiny", False), ("tiny-glm5", True)])
def test_rows_of_different_adapters_in_one_forward_equal_the_merged_models(preset, grouped, tmp_path):
    cfg = make_base(tmp_path / "base", preset, use_grouped_mm=grouped)
    # different ranks and different targets: the slots are independent
    a = make_adapter(tmp_path / "base", tmp_path / "a", seed=1, r=4)
    b = make_adapter(tmp_path / "base", tmp_path / "b", seed=2, r=2, targets=["attention", "experts"])
    served = load_hf(tmp_path / "base").eval()
    add_adapter(served, 1, a)
    add_adapter(served, 2, b)
    refs = [load_hf(tmp_path / "base").eval(), merge(tmp_path / "base", a, tmp_path / "ma").eval(),
            merge(tmp_path / "base", b, tmp_path / "mb").eval()]  # fmt: skip
    ids = random_ids(cfg, B=4, T=12)
    slots = [0, 1, 2, 1]
    with torch.no_grad(), use_slots(served, slots):
        out = served(ids, labels=ids)
    with torch.no_grad():
        want = [refs[s](ids[i : i + 1], labels=ids[i : i + 1]) for i, s in enumerate(slots)]
        plain = served(ids).logits  # outside use_slots: every row is the base
    for i, w in enumerate(want):
        # fp32, merged W + BA vs x W + (x A) B: the summation order differs by CPU (2.1e-5 seen on AVX-512);
        # an adapter's logits differ from the base's by > 3
        torch.testing.assert_close(out.logits[i : i + 1], w.logits, atol=5e-5, rtol=1e-4)
    with torch.inference_mode(), use_slots(served, slots):  # decoding's mixed-expert path == the per-slot reference
        fast = served(ids).logits
        MultiLoraExperts.lora_mixed = False
        try:
            reference = served(ids).logits
        finally:
            MultiLoraExperts.lora_mixed = True
    torch.testing.assert_close(fast, reference, atol=1e-5, rtol=0)
    assert (want[1].logits - want[0].logits).abs().max() > 1e-2  # the adapters change the model
    assert (want[2].logits - want[1].logits).abs().max() > 1e-2
    torch.testing.assert_close(plain, refs[0](ids).logits, atol=1e-6, rtol=0)


def test_an_adapter_for_another_base_is_refused_and_the_model_keeps_serving(tmp_path):
    from glmstack.errors import CheckpointError

    cfg = make_base(tmp_path / "base")
    make_base(tmp_path / "other", hidden_size=48)
    bad = make_adapter(tmp_path / "other", tmp_path / "bad", seed=1, r=2)
    good = make_adapter(tmp_path / "base", tmp_path / "good", seed=1, r=2)
    served = load_hf(tmp_path / "base").eval()
    add_adapter(served, 1, good)
    ids = random_ids(cfg, B=2, T=8)
    with torch.no_grad(), use_slots(served, [1, 1]):
        before = served(ids).logits
    with pytest.raises(CheckpointError, match="does not fit"):
        add_adapter(served, 1, bad)
    with torch.no_grad(), use_slots(served, [1, 1]):
        torch.testing.assert_close(served(ids).logits, before, atol=0, rtol=0)


# ---------------------------------------------------------------- through the server
@pytest.fixture(scope="module")
def lora_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_serve")
    make_base(root / "base", max_position_embeddings=256)
    tok = Tokenizer.train(["What is 2 + 3? The answer is 5. the quick brown fox jumps over the lazy dog."] * 8,
                          vocab_size=300)  # fmt: skip
    tok.save(root / "base")
    (root / "pushes").mkdir()
    a = make_adapter(root / "base", root / "pushes" / "a", seed=1, r=4)
    b = make_adapter(root / "base", root / "pushes" / "b", seed=2, r=2, targets=["attention", "experts"])
    engines = {"tiny": Engine(load_hf(root / "base"), tok)}
    for name, folder in (("a", a), ("b", b)):
        merged = root / f"merged_{name}"
        merge(root / "base", folder, merged)
        engines[name] = Engine(load_hf(merged), tok)  # served as `glmstack serve merged` would: the fast path
    return root, engines


PROMPTS = [[5, 17, 42, 9, 101, 7, 33, 64, 12, 88, 3, 250, 19, 71, 140, 6, 29, 11], [200, 4, 77, 15, 9]]


def greedy(engine, ids, n=10):
    return engine.generate([ids], max_new_tokens=n, temperature=0.0, stop_ids=[]).tokens[0]


def test_server_answers_for_two_adapters_and_the_base_in_one_batch_as_the_merged_models(lora_folders):
    from openai import OpenAI

    root, engines = lora_folders
    server = RunningServer(str(root / "base"), lora=[f"a={root / 'pushes' / 'a'}", f"b={root / 'pushes' / 'b'}"],
                           prefix_cache_mb=64, prefix_block=4)  # fmt: skip
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none")
        assert [m.id for m in client.models.list().data] == ["tiny", "a", "b"]
        results, go = {}, threading.Barrier(6)

        def ask(model, p):
            go.wait()
            r = client.completions.create(model=model, prompt=PROMPTS[p], max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})  # fmt: skip
            results[model, p] = (r.model, r.choices[0].token_ids)

        threads = [threading.Thread(target=ask, args=(m, p)) for m in ("tiny", "a", "b") for p in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for (model, p), (echoed, toks) in results.items():
            assert echoed == model
            assert toks == greedy(engines[model], PROMPTS[p]), (model, p)
        assert len({tuple(results[m, 0][1]) for m in ("tiny", "a", "b")}) == 3  # three different models answered
        assert server.sched.stats["lora_mixed_forwards"] > 0  # rows of different adapters shared forwards
        # the prefix cache holds each model's KV apart: the same long prompt again, under every name in turn
        for model in ("a", "tiny", "b", "a"):
            r = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})  # fmt: skip
            assert r.choices[0].token_ids == greedy(engines[model], PROMPTS[0]), model
        assert server.sched.prefix_cache.stats["hit_tokens"] > 0
        with pytest.raises(Exception, match="does not exist"):
            client.completions.create(model="c", prompt=PROMPTS[1], max_tokens=2)
    finally:
        server.stop()


def test_adapters_load_and_unload_at_run_time_only_from_the_weight_root(lora_folders, tmp_path):
    root, engines = lora_folders
    outside = make_adapter(root / "base", tmp_path / "outside", seed=3, r=2)
    server = RunningServer(str(root / "base"), enable_lora=True, enable_weight_updates=True,
                           weight_root=str(root / "pushes"), max_loras=2)  # fmt: skip
    try:
        post = lambda route, body: httpx.post(server.url + route, json=body, timeout=60)
        ask = lambda model: httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": model, "prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True})  # fmt: skip
        assert ask("a").status_code == 404
        r = post("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "b"})  # b's weights under the name a
        assert r.status_code == 200 and r.json()["weight_version"] == 1
        assert ask("a").json()["choices"][0]["token_ids"] == greedy(engines["b"], PROMPTS[0])
        assert post("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "a"}).status_code == 400  # loaded
        r = post("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "a", "load_inplace": True})
        assert r.status_code == 200 and r.json()["weight_version"] == 2
        out = ask("a").json()
        assert out["choices"][0]["token_ids"] == greedy(engines["a"], PROMPTS[0])
        assert out["choices"][0]["weight_version"] == 2
        for path in (str(outside), "../outside", "/etc"):
            r = post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": path})
            assert r.status_code == 403 and "weight-root" in r.json()["error"]["message"]
        r = post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "."})  # not an adapter folder
        assert r.status_code == 400 and "not a PEFT adapter folder" in r.json()["error"]["message"]
        broken = root / "pushes" / "broken"  # a config without lora_alpha, then not JSON: one line each, a 400
        shutil.copytree(root / "pushes" / "a", broken, dirs_exist_ok=True)
        config = json.loads((broken / "adapter_config.json").read_text())
        del config["lora_alpha"]
        for text in (json.dumps(config), "{not json"):
            (broken / "adapter_config.json").write_text(text)
            r = post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "broken"})
            assert r.status_code == 400 and "adapter_config.json" in r.json()["error"]["message"]
        assert post("/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "b"}).status_code == 200
        r = post("/v1/load_lora_adapter", {"lora_name": "c", "lora_path": "b"})  # --max-loras 2: a third is refused
        assert r.status_code == 400 and "at most 2" in r.json()["error"]["message"]
        assert post("/v1/unload_lora_adapter", {"lora_name": "a"}).status_code == 200
        assert ask("a").status_code == 404
        assert ask("tiny").json()["choices"][0]["token_ids"] == greedy(engines["tiny"], PROMPTS[0])
    finally:
        server.stop()


def test_lora_refused_where_it_is_not_served(lora_folders, tmp_path):
    root, _ = lora_folders
    server = RunningServer(str(root / "base"), enable_weight_updates=True, weight_root=str(root / "pushes"))
    try:
        r = httpx.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "a"}, timeout=60)
        assert r.status_code == 400 and "--enable-lora" in r.json()["error"]["message"]
    finally:
        server.stop()
    from glmstack.cli import main

    for bad in (["--lora", "a"], ["--lora", f"a={root / 'pushes' / 'a'}", "--speculative", "mtp"],
                ["--lora", f"tiny={root / 'pushes' / 'a'}", "--served-model-name", "tiny"]):  # fmt: skip
        assert main(["serve", str(root / "base"), *bad]) == 2


def test_requests_waiting_for_an_unloaded_adapter_end_with_an_error(lora_folders):
    """Unloading an adapter ends the requests still queued for it (they must not run on the base, or on a later
    adapter: slot numbers are never reused); requests for other models stay queued."""
    from glmstack.inference.sampling import SamplingParams
    from glmstack.serve.scheduler import Finished, Job, Scheduler

    root, _ = lora_folders
    model = load_hf(root / "base").eval()
    add_adapter(model, 1, root / "pushes" / "a")
    sched = Scheduler(Engine(model, Tokenizer.load(root / "base"), fast=False))  # not started: jobs stay queued
    events = {}
    jobs = [Job(prompt_ids=[5, 6], max_new_tokens=2, params=SamplingParams(), seed=0, adapter=slot,
                emit=lambda ev, k=k: events.setdefault(k, ev)) for k, slot in enumerate([1, 0, 1])]  # fmt: skip
    sched.submit(jobs)
    sched._remove_adapter(1)
    assert list(sched.waiting) == [jobs[1]]
    assert set(events) == {0, 2} and all(isinstance(e, Finished) and e.reason == "error" for e in events.values())
    assert "unloaded" in events[0].message
