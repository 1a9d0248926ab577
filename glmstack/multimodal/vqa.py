"""A synthetic visual QA set rendered with PIL: colours, shapes, counts and short text, with a held-out split.

Why: the multimodal recipe (GLM-4.1V-Thinking §4-5: alignment, SFT, RL with curriculum sampling) needs images whose
answers are known exactly, so that accuracy and the RL reward are verifiable, and the run must never download data.
Each scene is a pure function of (seed, split, index); the split is decided by a hash of the scene's description
(kind, sizes, positions, colours), so no held-out image is ever trained on.

Kinds (`KINDS`, with the curriculum level that first uses them):
  colour  level 0  one shape                    "What colour is the shape?"            -> red
  shape   level 0  one shape                    "Which shape is in the picture?"       -> triangle
  count   level 1  1-4 shapes of one colour     "How many shapes are in the picture?"  -> 3
  text    level 1  one capital letter           "What letter is written in the image?" -> K
Canvases are 48-144 px a side with any aspect ratio in between (the processor turns them into 4-16 visual tokens).
Records are direct answers (`enable_thinking: false`: the template's empty think block, then the answer); the
answer is written in GLM-4.5V's answer box, `<|begin_of_box|>red<|end_of_box|>` (arXiv 2507.01006 §5: the box
makes the answer extractable for the reward); `verify(meta, reply)` reads it back.

    glmstack vl-data --out data/vqa --n 2000        # images (PNG) + train/test JSONL in the SFT record format
    items = generate(n=8, seed=0, split="test")     # [{"image": PIL, "question", "answer", "kind", "level"}]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

from glmstack.splits import split_of

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 200, 20)}
SHAPES = ("circle", "square", "triangle")
LETTERS = "ABEHKMRSTX"
KINDS = {"colour": 0, "shape": 0, "count": 1, "text": 1}  # kind -> curriculum level
QUESTIONS = {
    "colour": "What colour is the shape?",
    "shape": "Which shape is in the picture?",
    "count": "How many shapes are in the picture?",
    "text": "What letter is written in the image?",
}
BOX_OPEN, BOX_CLOSE = "<|begin_of_box|>", "<|end_of_box|>"




# ---------------------------------------------------------------------------------------------------- scenes
def scene(rng: random.Random, kind: str) -> dict:
    """A scene description (JSON-able): canvas size, background and the things drawn."""
    w, h = rng.randrange(48, 145, 4), rng.randrange(48, 145, 4)
    bg = rng.choice([(255, 255, 255), (235, 235, 235), (250, 245, 230)])
    if kind == "text":
        size = int(min(w, h) * rng.uniform(0.6, 0.8))
        return {"kind": kind, "w": w, "h": h, "bg": bg, "letter": rng.choice(LETTERS), "size": size,
                "x": rng.randint(0, max(0, w - size)), "y": rng.randint(0, max(0, h - size))}  # fmt: skip
    n = rng.randint(1, 4) if kind == "count" else 1
    colour = rng.choice(list(COLOURS))
    shape = rng.choice(SHAPES)
    return {"kind": kind, "w": w, "h": h, "bg": bg, "colour": colour, "shape": shape,
            "boxes": _boxes(rng, w, h, n, big=n == 1)}  # fmt: skip


def _boxes(rng: random.Random, w: int, h: int, n: int, big: bool) -> list[list[int]]:
    """n non-overlapping squares (x, y, side) inside the canvas, by rejection."""
    side_max = int(min(w, h) * (0.7 if big else 0.4))
    side_min = max(10, int(min(w, h) * (0.35 if big else 0.2)))
    for _ in range(200):
        boxes = []
        for _ in range(n):
            s = rng.randint(side_min, max(side_min, side_max))
            boxes.append([rng.randint(0, w - s), rng.randint(0, h - s), s])
        if all(_apart(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]):
            return boxes
    return _grid_boxes(w, h, n)


def _apart(a, b, gap: int = 3) -> bool:
    return a[0] + a[2] + gap <= b[0] or b[0] + b[2] + gap <= a[0] or a[1] + a[2] + gap <= b[1] or b[1] + b[2] + gap <= a[1]


def _grid_boxes(w: int, h: int, n: int) -> list[list[int]]:
    s = max(6, min(w, h) // 2 - 4)
    return [[(i % 2) * (w // 2) + 2, (i // 2) * (h // 2) + 2, s] for i in range(n)]


def draw(sc: dict):
    """The scene's RGB image."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (sc["w"], sc["h"]), tuple(sc["bg"]))
    d = ImageDraw.Draw(img)
    if sc["kind"] == "text":
        font = ImageFont.load_default(size=sc["size"])  # Pillow's bundled font: the same pixels everywhere
        # bold (stroked) glyphs: the processor shrinks a canvas to ~40 px a side, where Pillow's plain strokes are
        # 1 px wide, a faint trace in a 4-pixel patch
        d.text((sc["x"], sc["y"]), sc["letter"], fill=(20, 20, 20), font=font, stroke_width=max(1, sc["size"] // 14),
               stroke_fill=(20, 20, 20))  # fmt: skip
        return img
    fill = COLOURS[sc["colour"]]
    for x, y, s in sc["boxes"]:
        if sc["shape"] == "circle":
            d.ellipse([x, y, x + s - 1, y + s - 1], fill=fill)
        elif sc["shape"] == "square":
            d.rectangle([x, y, x + s - 1, y + s - 1], fill=fill)
        else:
            d.polygon([(x + s / 2, y), (x, y + s - 1), (x + s - 1, y + s - 1)], fill=fill)
    return img


def answer_of(sc: dict) -> str:
    return {"colour": sc.get("colour"), "shape": sc.get("shape"), "count": str(len(sc.get("boxes", []))),
            "text": sc.get("letter")}[sc["kind"]]  # fmt: skip


# ---------------------------------------------------------------------------------------------------- items
def generate(n: int, seed: int = 0, split: str = "train", kinds=None, level: int | None = None) -> list[dict]:
    """`n` items of `split`: {"image", "question", "answer", "kind", "level", "scene"}, a pure function of the
    arguments. `kinds` restricts the kinds; `level` keeps the kinds of that curriculum level and below."""
    kinds = [k for k in (kinds or KINDS) if level is None or KINDS[k] <= level]
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"visual QA kinds {kinds!r}: expected some of {', '.join(KINDS)}")
    rng = random.Random(f"vqa:{seed}:{split}:{','.join(kinds)}")
    out = []
    while len(out) < n:
        sc = scene(rng, rng.choice(kinds))
        if split_of(json.dumps(sc, sort_keys=True)) != split:
            continue
        out.append({"image": draw(sc), "question": QUESTIONS[sc["kind"]], "answer": answer_of(sc),
                    "kind": sc["kind"], "level": KINDS[sc["kind"]], "scene": sc})  # fmt: skip
    return out


def boxed(answer: str) -> str:
    return f"{BOX_OPEN}{answer}{BOX_CLOSE}"


def messages(item: dict, with_answer: bool = True, image=None) -> list[dict]:
    """The item as a chat: the image then the question in the user turn, the boxed answer from the assistant."""
    user = {"role": "user", "content": [{"type": "image", "image": image if image is not None else item["image"]},
                                        {"type": "text", "text": item["question"]}]}  # fmt: skip
    return [user, {"role": "assistant", "content": boxed(item["answer"])}] if with_answer else [user]


_BOX = re.compile(re.escape(BOX_OPEN) + r"(.*?)" + re.escape(BOX_CLOSE), re.DOTALL)


def extract_answer(reply: str) -> str | None:
    """The last boxed answer of a reply (stripped), else None."""
    found = _BOX.findall(reply or "")
    return found[-1].strip() if found else None


def verify(meta: dict, reply: str) -> bool:
    """The reward: the boxed answer equals the item's answer (case-insensitive)."""
    got = extract_answer(reply)
    return got is not None and got.lower() == str(meta["answer"]).lower()


# ---------------------------------------------------------------------------------------------------- files
def write(out: Path, n: int, seed: int = 0, test_n: int | None = None) -> dict[str, Path]:
    """PNG images + `train.jsonl` / `test.jsonl` of SFT records whose image parts name the PNG files."""
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, count in (("train", n), ("test", test_n if test_n is not None else max(1, n // 10))):
        lines = []
        for i, item in enumerate(generate(count, seed, split)):
            png = out / "images" / f"{split}_{i:05d}.png"
            item["image"].save(png)
            rec = {"messages": messages(item, image=str(png.relative_to(out))), "enable_thinking": False,
                   "meta": {"answer": item["answer"], "kind": item["kind"], "level": item["level"], "split": split}}
            lines.append(json.dumps(rec, ensure_ascii=False))
        paths[split] = out / f"{split}.jsonl"
        paths[split].write_text("\n".join(lines) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="glmstack vl-data", description="write the synthetic visual QA set")
    ap.add_argument("--out", required=True, help="folder for images/ and train.jsonl / test.jsonl")
    ap.add_argument("--n", type=int, default=2000, help="training items (held-out: a tenth, or --test-n)")
    ap.add_argument("--test-n", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for split, path in write(Path(args.out), args.n, args.seed, args.test_n).items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
