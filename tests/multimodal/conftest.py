"""Fixtures of the multimodal tests: a small trained tokenizer (saved, so transformers can read it) and the tiny
recipe's image processor."""

import pytest

from glmstack.multimodal.processor import VisionProcessor
from glmstack.tokenizer import Tokenizer

TEXTS = ["What colour is the shape? red green blue yellow. How many shapes are in the picture? 1 2 3 4.",
         "Which shape is in the picture? circle square triangle. What letter is written in the image? A B E H K"]


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vtok")
    Tokenizer.train(TEXTS * 20, vocab_size=320).save(folder, chat_style="glm-4.5")
    return folder


@pytest.fixture(scope="session")
def tok(tok_dir):
    return Tokenizer.load(tok_dir)


@pytest.fixture(scope="session")
def proc():
    return VisionProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)


QUESTION = "What colour is the shape?"
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220)}


def square(colour: str, size=(40, 24)):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (255, 255, 255))
    ImageDraw.Draw(img).rectangle([4, 4, size[0] - 5, size[1] - 5], fill=COLOURS[colour])
    return img


def vqa_chat(colour: str, answer: bool = True):
    user = {"role": "user", "content": [{"type": "image", "image": square(colour)}, {"type": "text", "text": QUESTION}]}
    return [user, {"role": "assistant", "content": f"It is {colour}."}] if answer else [user]


@pytest.fixture(scope="session")
def vl_folder(tmp_path_factory, tok):
    """A tiny GLM-4.5V over-fitted (seconds) to answer the colour of a square from its pixels alone: the same
    question for a red and a blue image, so the right answer proves the image reached the model. Exported as
    `glmstack vl-train` exports (HF weights, tokenizer + template, preprocessor_config.json)."""
    import torch
    from glmstack.model.vision import GLMV, VLConfig, token_ids

    from glmstack.multimodal.data import collate
    from glmstack.multimodal.encode import encode_multimodal
    from glmstack.multimodal.stage import export

    cfg = VLConfig.preset("tiny-glm4.5v", **token_ids(tok), text_config={"vocab_size": tok.vocab_size})
    model = GLMV(cfg).init_weights(seed=0)
    vc = cfg.vision_config
    proc = VisionProcessor(min_pixels=16 * 16, max_pixels=32 * 32, patch_size=vc.patch_size,
                           merge_size=vc.spatial_merge_size)  # fmt: skip
    batch = collate([encode_multimodal(tok, proc, vqa_chat(c), enable_thinking=False) for c in COLOURS])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for _ in range(120):
        loss = model(batch["input_ids"], labels=batch["labels"], pixel_values=batch["pixel_values"],
                     image_grid_thw=batch["image_grid_thw"]).loss  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
    folder = tmp_path_factory.mktemp("vl") / "tiny-vl"
    return export(model.eval(), tok, proc, folder, "glm-4.5")
