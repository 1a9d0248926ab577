"""Held-out accuracy of a vision-language model on visual QA records: greedy answers checked by the verifier.

Each held-out record's user turn (image + question) is rendered with the generation prompt (thinking off, as the
records were trained), the model decodes greedily (GLMV.generate: prefill with the pixels, then the KV cache), the
reply's boxed answer is compared with the record's `meta.answer` (glmstack.multimodal.vqa.verify). Scores come back
overall, per question kind, with the first samples (image path, question, answer, reply) for the report.

    scores = evaluate_model(model, tok, processor, heldout_items(cfg), "glm-4.5")
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

from glmstack.inference.vision import generate as vl_generate
from glmstack.multimodal.encode import encode_multimodal, image_source


def read_items(path: Path, n: int | None = None) -> list[dict]:
    """Raw held-out records (with `meta`) of one JSONL file, image paths resolved against its folder."""
    from glmstack.multimodal.data import resolve_images

    items = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            items.append(rec | {"messages": resolve_images(rec["messages"], Path(path).parent)})
        if n is not None and len(items) >= n:
            break
    return items


def heldout_items(cfg) -> list[dict]:
    from glmstack.multimodal.config import vqa_folder

    return read_items(vqa_folder(cfg) / "test.jsonl", cfg.vl.eval_n)


def prompt_of(item: dict) -> list[dict]:
    """The conversation up to the assistant's answer."""
    msgs = item["messages"]
    return msgs[: max(i for i, m in enumerate(msgs) if m["role"] == "user") + 1]


@torch.no_grad()
def answer(model, tokenizer, processor, messages, style: str = "glm-4.5", max_new_tokens: int = 12,
           temperature: float = 0.0, seed: int = 0, enable_thinking: bool = False) -> tuple[str, list[int]]:  # fmt: skip
    """(reply text without its stop token, the new token ids) for one conversation with images."""
    enc = encode_multimodal(tokenizer, processor, messages, style=style, enable_thinking=enable_thinking,
                            add_generation_prompt=True)  # fmt: skip
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in enc.media.model_inputs().items()}
    new = vl_generate(model, torch.tensor(enc.ids, device=device), max_new_tokens=max_new_tokens,
                      temperature=temperature, seed=seed, stop_ids=tokenizer.eos_ids, **inputs)  # fmt: skip
    text_ids = new[:-1] if new and new[-1] in tokenizer.eos_ids else new
    return tokenizer.decode(text_ids), new


def evaluate_model(model, tokenizer, processor, items: list[dict], style: str = "glm-4.5",
                   max_new_tokens: int = 12, samples: int = 8) -> dict:  # fmt: skip
    from glmstack.multimodal.vqa import verify

    was_training = model.training
    model.eval()
    right, total, shown = defaultdict(int), defaultdict(int), []
    for item in items:
        meta = item["meta"]
        reply, _ = answer(model, tokenizer, processor, prompt_of(item), style, max_new_tokens,
                          enable_thinking=item.get("enable_thinking", False))  # fmt: skip
        ok = verify(meta, reply)
        right[meta["kind"]] += ok
        total[meta["kind"]] += 1
        if len(shown) < samples:
            parts = prompt_of(item)[-1]["content"]
            image = next((image_source(p) for p in parts if isinstance(p, dict) and p.get("type") == "image"), None)
            question = " ".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")
            shown.append({"image": str(image), "question": question, "answer": meta["answer"], "reply": reply,
                          "correct": ok})  # fmt: skip
    model.train(was_training)
    n = sum(total.values())
    return {"accuracy": sum(right.values()) / max(n, 1), "n": n,
            "by_kind": {k: right[k] / total[k] for k in sorted(total)}, "samples": shown}  # fmt: skip
