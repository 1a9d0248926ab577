"""Images and short videos through `glmstack serve` (the official openai client against uvicorn on 127.0.0.1, OpenAI
image_url parts with data URLs, vLLM's video_url parts) and `glmstack chat MODEL --image FILE / --video PATH`, on a
tiny GLM-4.5V that answers a square's colour from its pixels (tests/multimodal/conftest.py): the reply must follow
the image, and equal plain greedy decoding of the same conversation."""

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
from glmstack.inference.vision import generate
from glmstack.multimodal.images import to_data_url
from glmstack.multimodal.serving import VisionEngine
from multimodal.conftest import QUESTION, square, vqa_chat


def greedy(folder, colour_or_messages) -> str:
    """The reference: GLMV.generate (greedy) on the same prompt (a colour's VQA chat, or messages), decoded without
    the stop token."""
    eng = VisionEngine.load(folder)
    msgs = vqa_chat(colour_or_messages, answer=False) if isinstance(colour_or_messages, str) else colour_or_messages
    enc = eng.render_prompt(msgs, None, "glm-4.5", enable_thinking=False)
    new = generate(eng.model, torch.tensor(enc.ids), max_new_tokens=16, stop_ids=eng.tokenizer.eos_ids,
                   **enc.media.model_inputs())  # fmt: skip
    return eng.tokenizer.decode([t for t in new if t not in eng.tokenizer.eos_ids])


@pytest.fixture(scope="module")
def server(vl_folder):
    srv = RunningServer(str(vl_folder))
    yield srv
    srv.stop()


def ask(client, url: str, kind: str = "image_url", **kw):
    content = [{"type": kind, kind: {"url": url}}, {"type": "text", "text": QUESTION}]
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                          temperature=0, max_tokens=16,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **kw)


def clip(colour: str, n: int = 4) -> list:
    """n frames of a square (a pixel differs per frame, so an animated GIF keeps them all)."""
    out = [square(colour) for _ in range(n)]
    for i, f in enumerate(out):
        f.putpixel((0, i), (0, 0, 0))
    return out


def video_url(colour: str, form: str) -> str:
    """vLLM's frames URL (data:video/jpeg;base64,<frame>,<frame>,...; here PNG frames) or an animated GIF."""
    if form == "frames":
        return "data:video/jpeg;base64," + ",".join(to_data_url(f).split(",", 1)[1] for f in clip(colour))
    buf = io.BytesIO()
    frames = clip(colour)
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=500, loop=0)
    return "data:image/gif;base64," + base64.b64encode(buf.getvalue()).decode()


def video_chat(url: str):
    content = [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    return [{"role": "user", "content": content}]


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


@pytest.mark.parametrize("form", ["frames", "gif"])
def test_server_video_url_parts(server, vl_folder, form):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    for colour in ("red", "blue"):
        url = video_url(colour, form)
        reply = ask(client, url, kind="video_url").choices[0].message.content
        # trained on images only, the model still reads a still clip's colour: the frames reached the ViT
        assert reply == greedy(vl_folder, video_chat(url)).strip() and colour in reply


@pytest.mark.parametrize(
    ("url", "message"),
    [("data:video/mp4;base64,AAAA", "video/mp4 cannot be decoded here"),
     ("https://example.com/clip.mp4", "remote URLs are not fetched"),
     ("frames/", "a video must be a data URL"),
     ("data:video/jpeg;base64,@@@", "not valid base64"),
     ("data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode(), "not a readable video")],
)  # fmt: skip
def test_server_rejects_bad_videos_with_400(server, url, message):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=message):
        ask(client, url, kind="video_url")


@pytest.mark.parametrize("how", ["--video", "/video"])
def test_chat_cli_with_video(vl_folder, tmp_path, monkeypatch, capsys, how):
    for i, f in enumerate(clip("red")):
        f.save(tmp_path / f"{i}.png")
    lines = (f"/video {tmp_path}\n" if how == "/video" else "") + QUESTION + "\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    flag = ["--video", str(tmp_path)] if how == "--video" else []
    code = glmstack(["chat", str(vl_folder), *flag, "--temperature", "0", "--max-new-tokens", "16", "--no-think"])
    out = capsys.readouterr().out
    msgs = [{"role": "user", "content": [{"type": "video", "video": tmp_path}, {"type": "text", "text": QUESTION}]}]
    assert code == 0 and out.strip() == greedy(vl_folder, msgs).strip()


@pytest.mark.parametrize(("name", "message"), [("clip.mp4", "not a readable video"), ("none", "no such file")])
def test_chat_cli_bad_video_is_one_line(vl_folder, tmp_path, capsys, name, message):
    if name.endswith(".mp4"):
        (tmp_path / name).write_bytes(b"\x00\x00\x00\x18ftypmp42")
    assert glmstack(["chat", str(vl_folder), "--video", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


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
