"""`glmstack vl-train vl_tiny --stage vit`: pre-train the ViT (+ adapter) on the generated images before any chat.

Why: GLM-4.1V-Thinking (arXiv 2507.01006 §4) starts from a pre-trained vision encoder; the tiny recipe's ViT is
random, and trained only through the decoder's answers it learns colours at once but shapes, counts and letters
slowly (docs/multimodal.md). Here the encoder first learns the scene attributes directly: small classification
heads read the mean of each image's adapter outputs (the visual tokens the decoder will see) and predict the
scene's colour, shape, number of shapes and letter (cross-entropy, attributes a scene does not have are ignored).
No decoder runs, so a step costs a ViT forward/backward only; the heads are dropped at export.

The stage runs on the one loop (train/loop.py) with a `VisionPretrainer` (the GLMV + heads; only `visual.*` and
the heads train) and an `AttributeStream` (batch i = the training-split scenes of seed (seed, i), like VQAStream).
Its model folder (the GLMV with the pre-trained ViT, the fresh decoder, tokenizer, processor) is what the align
stage starts from; eval.json scores the heads on the held-out images, per question kind.

    glmstack vl-train vl_tiny --stage vit
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from glmstack.data.position import GlobalBatchPosition

CENTRE_POS_WEIGHT = 4.0  # a shape's centre is in 1-4 of an image's 24-32 visual tokens
# attribute -> its classes (the answers of the VQA kind of the same name; "letter" answers "text")
ATTRIBUTES = {"colour": ("red", "green", "blue", "yellow"), "shape": ("circle", "square", "triangle"),
              "count": ("1", "2", "3", "4"), "letter": tuple("ABEHKMRSTX")}  # fmt: skip


def attribute_labels(sc: dict) -> list[int]:
    """One class index per attribute (ATTRIBUTES order) for a scene, -100 where the scene has no such attribute."""
    from glmstack.multimodal.vqa import LETTERS

    assert tuple(LETTERS) == ATTRIBUTES["letter"], "vqa.LETTERS and the letter head disagree"
    if sc["kind"] == "text":
        return [-100, -100, -100, ATTRIBUTES["letter"].index(sc["letter"])]
    # counts only on count scenes: the others always hold one shape, and "1" would swamp the head's classes
    count = len(sc["boxes"]) - 1 if sc["kind"] == "count" else -100
    return [ATTRIBUTES["colour"].index(sc["colour"]), ATTRIBUTES["shape"].index(sc["shape"]), count, -100]


def centre_labels(sc: dict, grid_thw, merge: int) -> list[float]:
    """Per visual token of the scene's image (raster order over the merged grid): 1.0 where a shape's centre
    falls, else 0.0 (letters have none)."""
    _, gh, gw = (int(v) for v in grid_thw)
    rows, cols = gh // merge, gw // merge
    out = [0.0] * (rows * cols)
    for x, y, side in sc.get("boxes", []):
        r = min(rows - 1, int((y + side / 2) * rows / sc["h"]))
        c = min(cols - 1, int((x + side / 2) * cols / sc["w"]))
        out[r * cols + c] = 1.0
    return out


def attribute_batch(items: list[dict], processor) -> dict[str, torch.Tensor]:
    """{"labels": (B, 4) long, "centres": (M,) float over all visual tokens, "pixel_values", "image_grid_thw"} of
    vqa.generate items."""
    media = processor(images=[it["image"] for it in items])
    labels = torch.tensor([attribute_labels(it["scene"]) for it in items], dtype=torch.long)
    centres = [
        v for it, g in zip(items, media.image_grid_thw) for v in centre_labels(it["scene"], g, processor.merge_size)
    ]
    return {"labels": labels, "centres": torch.tensor(centres)} | media.model_inputs()


class AttributeStream(GlobalBatchPosition):
    """Endless batches of training-split scenes (all kinds) with their attribute labels; batch i is a pure function
    of (seed, i) (exact resume from one integer)."""

    def __init__(self, processor, *, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1):
        self.processor, self.batch_size, self.seed = processor, batch_size, seed
        self.rank, self.world_size, self.position = rank, world_size, 0

    def batch(self, index: int) -> dict[str, torch.Tensor]:
        from glmstack.multimodal.vqa import generate

        seed = 7_000_003 + self.seed * 1_000_003 + index * self.world_size + self.rank  # apart from VQAStream's
        return attribute_batch(generate(self.batch_size, seed=seed, split="train"), self.processor)


class VisionPretrainer(nn.Module):
    """A GLMV whose ViT + adapter feed per-attribute heads (Linear, GELU, Linear) on each image's mean visual
    token. Only `model.visual` and the heads are used (the decoder is carried along for the export)."""

    def __init__(self, model, seed: int = 0):
        super().__init__()
        self.model = model
        d = model.cfg.vision_config.out_hidden_size
        gen = torch.Generator().manual_seed(seed + 17)
        self.heads = nn.ModuleDict({a: nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, len(c)))
                                    for a, c in ATTRIBUTES.items()})  # fmt: skip
        with torch.no_grad():
            for p in self.heads.parameters():
                if p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)
                else:
                    p.zero_()
        self.centre = nn.Linear(d, 1)  # per visual token: does a shape's centre fall in it?
        with torch.no_grad():
            self.centre.weight.copy_(torch.randn(self.centre.weight.shape, generator=gen) * d**-0.5)
            self.centre.bias.zero_()
        self.heads.to(next(model.parameters()).device)
        self.centre.to(next(model.parameters()).device)

    def forward(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
        """-> attribute -> logits (B, classes), and "centre" -> (M,) logits per visual token."""
        feats_MD = self.model.visual(pixel_values, image_grid_thw)  # merged visual tokens of all images
        m2 = self.model.cfg.vision_config.spatial_merge_size**2
        lengths = (image_grid_thw.prod(-1) // m2).tolist()
        pooled_BD = torch.stack([f.mean(0) for f in feats_MD.split(lengths)])
        return {a: head(pooled_BD) for a, head in self.heads.items()} | {"centre": self.centre(feats_MD)[:, 0]}


def attribute_loss(model, batch: dict, values: dict) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over the labelled (image, attribute) pairs; per-attribute losses as metrics."""
    logits = model(batch["pixel_values"], batch["image_grid_thw"])
    labels_BA = batch["labels"]
    losses, metrics = [], {}
    centre = nn.functional.binary_cross_entropy_with_logits(logits.pop("centre"), batch["centres"],
                                                             pos_weight=torch.tensor(CENTRE_POS_WEIGHT))  # fmt: skip
    metrics["centre_loss"] = centre.detach()
    for i, (a, lg) in enumerate(logits.items()):
        y = labels_BA[:, i]
        if (y != -100).any():
            ce = nn.functional.cross_entropy(lg, y, ignore_index=-100, reduction="sum")
            losses.append(ce)
            metrics[f"{a}_loss"] = (ce / (y != -100).sum()).detach()
    loss = torch.stack(losses).sum() / (labels_BA != -100).sum() + centre
    return loss, metrics


@torch.no_grad()
def evaluate_heads(pretrainer: VisionPretrainer, processor, n: int, seed: int = 0) -> dict:
    """Held-out accuracy of the heads, per VQA kind (the attribute that kind asks about), as multimodal.evaluate."""
    from glmstack.multimodal.vqa import generate

    items = generate(n, seed=seed, split="test")
    right: dict[str, int] = {}
    total: dict[str, int] = {}
    was = pretrainer.training
    pretrainer.eval()
    for i in range(0, len(items), 64):
        chunk = items[i : i + 64]
        b = attribute_batch(chunk, processor)
        device = next(pretrainer.parameters()).device
        logits = pretrainer(b["pixel_values"].to(device), b["image_grid_thw"].to(device))
        logits.pop("centre")
        for it, labels in zip(range(len(chunk)), b["labels"].tolist()):
            kind = chunk[it]["kind"]
            a = {"text": "letter"}.get(kind, kind)
            j = list(ATTRIBUTES).index(a)
            ok = int(logits[a][it].argmax()) == labels[j]
            right[kind] = right.get(kind, 0) + ok
            total[kind] = total.get(kind, 0) + 1
    pretrainer.train(was)
    return {"accuracy": sum(right.values()) / max(1, len(items)), "n": len(items),
            "by_kind": {k: right[k] / total[k] for k in sorted(total)}, "samples": [],
            "what": "attribute heads on held-out images (not the chat model)"}  # fmt: skip


def run_vit(cfg, stop_at: int | None = None) -> dict:
    """The stage: build the GLMV as the first chat stage would (tokenizer trained on the set's texts), train the
    ViT + adapter + heads on the one loop, export the GLMV's folder, score the heads."""
    from glmstack.errors import ConfigError
    from glmstack.multimodal import stage_setup as setup
    from glmstack.multimodal.config import stage_dir
    from glmstack.multimodal.data import read_multimodal
    from glmstack.optim import build_optimizer
    from glmstack.train.loop import device_of, train
    from glmstack.train.stage import seed_everything

    setup.data_parallel(cfg, device_of(cfg), allowed=False)
    if cfg.lora.enabled:
        raise ConfigError("lora.enabled: the vit stage pre-trains the encoder and its attribute heads in full; LoRA "
                          "is for the align / sft / rl stages")  # fmt: skip
    folder = stage_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    records = read_multimodal(setup.data_files(cfg), log=print)
    tokenizer = setup.load_tokenizer(cfg, records)
    model = setup.build_model(cfg, tokenizer, device_of(cfg))
    setup.freeze(model, "vision")
    pretrainer = VisionPretrainer(model, seed=cfg.seed)
    trainable = sum(p.numel() for p in pretrainer.parameters() if p.requires_grad)
    print(f"{cfg.stage}: {trainable:,} parameters train (the ViT, the adapter, the attribute heads)", flush=True)
    processor = setup.processor_for(cfg, model)
    data = AttributeStream(processor, batch_size=cfg.micro_batch_size, seed=cfg.seed)
    optimizer, _ = build_optimizer(pretrainer, cfg.optim)
    result = train(model=pretrainer, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder,
                   loss_fn=attribute_loss, stop_at=stop_at)  # fmt: skip
    if result["stopped"] != "done":
        return result
    model.requires_grad_(True)
    result["model"] = str(setup.export(model, tokenizer, processor, folder / "model", cfg.vl.chat_style))
    if cfg.vl.eval_n:
        scores = evaluate_heads(pretrainer, processor, cfg.vl.eval_n, seed=cfg.seed)
        Path(folder / "eval.json").write_text(json.dumps(scores, indent=2) + "\n")
        result["heldout_acc"] = scores["accuracy"]
    return result
