"""Vision-language requests in the server's continuous batch (glmstack.multimodal.serving.VisionBatch): rows with
images of different sizes, a video and plain text, greedy and seeded sampling, joining and leaving a running batch,
each get exactly what GLMV.generate gives it alone; and two concurrent image requests through the server (the openai
client against uvicorn) are batched and answer as they do alone."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

from glmstack.inference.sampling import SamplingParams
from glmstack.inference.vision import generate
from glmstack.multimodal.serving import VisionEngine, VisionScheduler
from glmstack.serve.scheduler import Finished, Job, Token
from multimodal.conftest import QUESTION, square

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # serve_fixture


def chats():
    """(messages, temperature, seed): two image sizes, a video, text only; greedy and sampled."""
    image = lambda c, size: [{"type": "image", "image": square(c, size)}, {"type": "text", "text": QUESTION}]
    video = [{"type": "video", "video": [square("blue")] * 3}, {"type": "text", "text": QUESTION}]
    contents = [image("red", (40, 24)), image("blue", (24, 56)), video, QUESTION, image("red", (32, 32))]
    temps = [0.0, 1.0, 0.0, 1.0, 0.0]
    return [([{"role": "user", "content": c}], t, 100 + i) for i, (c, t) in enumerate(zip(contents, temps))]


def alone(engine: VisionEngine, messages, temperature: float, seed: int, budget: int) -> list[int]:
    enc = engine.render_prompt(messages, None, "glm-4.5", enable_thinking=False)
    return generate(engine.model, torch.tensor(enc.ids), max_new_tokens=budget, temperature=temperature, seed=seed,
                    stop_ids=engine.tokenizer.eos_ids, **enc.media.model_inputs())  # fmt: skip


@pytest.mark.parametrize("max_running", [5, 2])  # all at once; two at a time (rows leave, others join)
def test_vl_rows_in_the_continuous_batch_equal_generate_alone(vl_folder, max_running):
    check_batch_equals_alone(VisionEngine.load(vl_folder), max_running)


@pytest.mark.parametrize(("preset", "visual_expert"), [("tiny-glm4.1v", False), ("tiny-glm4.5v", True)])
def test_dense_decoder_and_visual_expert_rows_equal_generate_alone(tok, preset, visual_expert):
    """GLM-4.1V's dense decoder (interleaved M-RoPE) and CogVLM's visual expert (flat image positions), random."""
    from glmstack.model.vision import GLMV, VLConfig, token_ids
    from glmstack.multimodal.processor import VisionProcessor

    cfg = VLConfig.preset(preset, **token_ids(tok), text_config={"vocab_size": tok.vocab_size},
                          visual_expert=visual_expert)  # fmt: skip
    vc = cfg.vision_config
    proc = VisionProcessor(min_pixels=16 * 16, max_pixels=32 * 32, patch_size=vc.patch_size,
                           merge_size=vc.spatial_merge_size)  # fmt: skip
    check_batch_equals_alone(VisionEngine(GLMV(cfg).init_weights(seed=0).eval(), tok, proc, "cpu"), 3)


def check_batch_equals_alone(engine: VisionEngine, max_running: int) -> None:
    sched = VisionScheduler(engine, max_running=max_running)
    outs, done = {}, threading.Semaphore(0)
    jobs = []
    for i, (msgs, temp, seed) in enumerate(chats()):
        enc = engine.render_prompt(msgs, None, "glm-4.5", enable_thinking=False)
        outs[i] = []

        def emit(ev, i=i):
            outs[i].append(ev.id if isinstance(ev, Token) else ev)
            if isinstance(ev, Finished):
                done.release()

        jobs.append(Job(prompt_ids=enc.ids, max_new_tokens=6 + i, params=SamplingParams(temperature=temp), seed=seed,
                        emit=emit, stop_ids=frozenset(engine.tokenizer.eos_ids), media=enc.media))  # fmt: skip
    sched.submit(jobs)  # queued before the engine thread starts: the first step admits max_running of them at once
    sched.start()
    try:
        for _ in jobs:
            assert done.acquire(timeout=120)
    finally:
        sched.stop()
    for i, (msgs, temp, seed) in enumerate(chats()):
        assert outs[i][-1].reason in ("stop", "length"), outs[i][-1]
        assert outs[i][:-1] == alone(engine, msgs, temp, seed, 6 + i), i
    assert sched.stats["steps"] < sched.stats["generated_tokens"]  # decode steps served several rows at once


def test_two_concurrent_image_requests_are_batched(vl_folder):
    openai = pytest.importorskip("openai")
    from serve_fixture import RunningServer

    from glmstack.multimodal.images import to_data_url

    srv = RunningServer(str(vl_folder))
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused")

        def ask(colour: str) -> str:
            content = [{"type": "image_url", "image_url": {"url": to_data_url(square(colour))}},
                       {"type": "text", "text": QUESTION}]  # fmt: skip
            return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                                  temperature=0, max_tokens=24, extra_body={"ignore_eos": True,
                                                  "chat_template_kwargs": {"enable_thinking": False}},
                                                  ).choices[0].message.content  # fmt: skip

        single = {c: ask(c) for c in ("red", "blue")}
        before = _steps(srv.url)
        together: dict[str, str] = {}
        threads = [threading.Thread(target=lambda c=c: together.__setitem__(c, ask(c))) for c in ("red", "blue")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert together == single and "red" in single["red"] and "blue" in single["blue"]
        assert _steps(srv.url) - before < 2 * 23  # 24 tokens each: alone would take 2 x 23 decode steps
    finally:
        srv.stop()


def _steps(url: str) -> int:
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics").read().decode()
    return int(float(next(line.split()[-1] for line in text.splitlines()
                          if not line.startswith("#") and "engine_steps_total" in line)))  # fmt: skip
