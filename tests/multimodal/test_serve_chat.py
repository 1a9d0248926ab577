"""Images through `glmstack serve` (the official openai client against uvicorn on 127.0.0.1, OpenAI image_url parts
with data URLs) and `glmstack chat MODEL --image FILE`, on a tiny GLM-4.5V that answers a square's colour from its
pixels (tests/multimodal/conftest.py): the reply must follow the image, and equal plain greedy decoding."""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("glmstack.model.vision")  # the model half (branch vlmodel) until it is merged
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_fixture import RunningServer

from glmstack.cli import main as glmstack
from glmstack.multimodal.images import to_data_url
from glmstack.multimodal.serving import VisionEngine
from multimodal.conftest import QUESTION, square, vqa_chat


def greedy(folder, colour: str) -> str:
    """The reference: GLMV.generate (greedy) on the same prompt, decoded without the stop token."""
    eng = VisionEngine.load(folder)
    enc = eng.render_prompt(vqa_chat(colour, answer=False), None, "glm-4.5", enable_thinking=False)
    new = eng.model.generate(torch.tensor(enc.ids), max_new_tokens=16, stop_ids=eng.tokenizer.eos_ids,
                             **enc.media.model_inputs())  # fmt: skip
    return eng.tokenizer.decode([t for t in new if t not in eng.tokenizer.eos_ids])


@pytest.fixture(scope="module")
def server(vl_folder):
    srv = RunningServer(str(vl_folder))
    yield srv
    srv.stop()


def ask(client, url: str, **kw):
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                          temperature=0, max_tokens=16,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)


def test_server_answers_from_the_image(server, vl_folder):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    for colour in ("red", "blue"):
        reply = ask(client, to_data_url(square(colour))).choices[0].message.content
        assert reply == greedy(vl_folder, colour).strip() and colour in reply
    streamed = "".join(c.choices[0].delta.content or "" for c in ask(client, to_data_url(square("blue")), stream=True)
                       if c.choices)  # fmt: skip
    assert "blue" in streamed


@pytest.mark.parametrize(
    ("url", "message"),
    [("https://example.com/cat.png", "remote URLs are not fetched"),
     ("data:image/png;base64,@@@", "not valid base64"),
     ("data:image/png;base64," + base64.b64encode(b"GIF? no").decode(), "not a readable image"),
     ("cat.png", "must be a data URL")],
)  # fmt: skip
def test_server_rejects_bad_images_with_400(server, url, message):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=message):
        ask(client, url)


def test_chat_cli_with_image(vl_folder, tmp_path, monkeypatch, capsys):
    png = tmp_path / "blue.png"
    square("blue").save(png)
    monkeypatch.setattr(sys, "stdin", io.StringIO(QUESTION + "\n"))
    code = glmstack(["chat", str(vl_folder), "--image", str(png), "--temperature", "0", "--max-new-tokens", "16",
                     "--no-think"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and out.strip() == greedy(vl_folder, "blue").strip() and "blue" in out


def test_chat_cli_bad_image_is_one_line(vl_folder, tmp_path, capsys):
    assert glmstack(["chat", str(vl_folder), "--image", str(tmp_path / "missing.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such file" in err and "\n" not in err


def test_images_for_a_text_model_are_a_400():
    from glmstack.multimodal.serving import request_media
    from glmstack.serve.protocol import ApiError

    parts = [{"type": "image_url", "image_url": {"url": to_data_url(square("red"))}}, {"type": "text", "text": "?"}]
    with pytest.raises(ApiError, match="no vision encoder") as e:
        request_media([{"role": "user", "content": parts}], processor=None)
    assert e.value.status == 400
