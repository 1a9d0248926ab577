"""`glmstack rm <recipe> [--set key=value ...]`: train a Bradley–Terry reward model on preference pairs, on the one loop.

GLM-4.5 §3.4 / GLM-5 §3.4 (research/post-training-recipe.md §4): general RL scores open-ended replies with outcome
reward models trained on preferences. The model (model.py) is the backbone of `init_from` (an SFT model's trunk;
its LM head and MTP layers are not read) + a scalar head; the loss is Bradley–Terry's

    loss = −mean log σ(r(x, y_chosen) − r(x, y_rejected) − margin)

on micro-batches of pairs (data.py), trained by glmstack/train/loop.py like every stage (optimizer, schedule, guard,
checkpoints, metrics.jsonl, resume). At the end: held-out pairwise accuracy (overall and per `kind` when the records
carry one) in <stage>/rm_summary.json, and <stage>/model, an HF folder transformers reads as a sequence classifier
(model.py). `glmstack rl` scores with it through the `rm:<folder>` reward (glmstack.posttrain.rl.rewards).

    glmstack rm rm_speedrun                                  # the SFT model's trunk on the synthetic checkable set
    glmstack rm rm_speedrun --set rm.data='["prefs.jsonl"]' --set rm.val_data='["prefs_test.jsonl"]'
    glmstack rm rm_tiny --set steps=4                         # random tiny backbone: a smoke test
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from glmstack.config import ConfigError
from glmstack.train import dist
from glmstack.train.config import TrainConfig


@dataclass(kw_only=True)
class RMOptions:
    data: list[str] = field(default_factory=lambda: ["synthetic:checkable"])  # JSONL files or synthetic:<set>
    val_data: list[str] = field(default_factory=lambda: ["synthetic:checkable"])  # held-out pairs ([] = none)
    synthetic_n: int = 3000  # training pairs per synthetic set (held out: a fifth of it)
    margin: float = 0.0  # Bradley–Terry with a margin (Llama 2's RM loss); 0 = plain BT
    chat_style: str = "glm-4.5"  # how prompt + reply are rendered
    tokenizer: str = ""  # folder with tokenizer.json; "" = init_from's


@dataclass(kw_only=True)
class RMConfig(TrainConfig):
    rm: RMOptions = field(default_factory=RMOptions)


# ---------------------------------------------------------------------------------------------------- loss
def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: float = 0.0):
    """−mean log σ(r_c − r_r − margin) over pairs `(B,)`; -> (loss, accuracy = fraction with r_c > r_r)."""
    diff = r_chosen - r_rejected
    return -F.logsigmoid(diff - margin).mean(), (diff > 0).float().mean()


def rm_loss(opts: RMOptions):
    """loss_fn(model, batch, values) for the loop: BT on one micro-batch of pairs (chosen rows first)."""

    def loss_fn(model, batch: dict, values: dict):
        r_2B, out = model(batch["input_ids"], batch["last"], segment_ids=batch["segment_ids"])
        r_c, r_r = r_2B.chunk(2)
        loss, acc = bradley_terry_loss(r_c, r_r, opts.margin)
        aux = out.aux_loss * values.get("aux_loss_weight", 0.0)
        metrics = {"accuracy": acc, "margin": (r_c - r_r).mean().detach(), "reward_mean": r_2B.mean().detach(),
                   "expert_load": out.expert_load}  # fmt: skip
        return loss + aux, metrics

    return loss_fn


@torch.no_grad()
def pair_accuracy(model, batches) -> tuple[float, int]:
    """Fraction of pairs whose chosen reply scores higher, over all batches; -> (accuracy, pairs)."""
    model.eval()
    right, n, dev = 0, 0, next(model.parameters()).device
    for b in batches:
        b = {k: v.to(dev) for k, v in b.items()}
        r_c, r_r = model(b["input_ids"], b["last"], segment_ids=b["segment_ids"])[0].chunk(2)
        right, n = right + int((r_c > r_r).sum()), n + r_c.numel()
    model.train()
    return right / max(n, 1), n


# ---------------------------------------------------------------------------------------------------- model
def build_reward_model(cfg: RMConfig, device: torch.device):
    """The RM as train.stage.build_model makes a stage's GLM: on meta, parallelised, then filled from init_from's
    trunk (+ a fresh head, or an RM folder's own) or from the seeded init."""
    import dataclasses

    from glmstack.model import ModelConfig
    from glmstack.posttrain.rm.model import ARCHITECTURE, RewardModel, score_tensor, trunk_tensors
    from glmstack.train.checkpoint import resolve
    from glmstack.train.stage import compile_blocks

    if cfg.init_from:
        folder = resolve(cfg.init_from, cfg.out_dir)
        saved = ModelConfig.from_hf(folder)
        rm = RewardModel(dataclasses.replace(saved, **cfg.model_overrides))
        is_rm = ARCHITECTURE in saved.hf_metadata.get("architectures", [])
        head = score_tensor(folder) if is_rm else rm.fresh_head(cfg.seed)
        tensors = itertools.chain(trunk_tensors(rm, folder), [("score.weight", head)])
    else:
        rm = RewardModel(ModelConfig.preset(cfg.model, **cfg.model_overrides))
        tensors = rm.initial_tensors(cfg.seed, device=device)
    if cfg.lora.enabled:  # adapters on the trunk (frozen); the score head trains in full (PEFT's modules_to_save)
        from glmstack.model import lora
        from glmstack.train.lora import base_reference

        lora.apply_lora(rm.model, cfg.lora, seed=cfg.seed)
        rm.model.lora_base = base_reference(cfg)
        adapters = ((f"model.{n}", t) for n, t in lora.initial_tensors(rm.model, cfg.seed))
        tensors = itertools.chain(tensors, adapters)
    fill = lambda m: dist.materialize(m, device, tensors)
    model = dist.parallelize(rm, cfg.dist.dp, cfg.dist.expert_parallel, fill=fill, ep=cfg.dist.ep)
    if cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda"):
        compile_blocks(dist.unwrap(model))
    return model


# ---------------------------------------------------------------------------------------------------- data
def load_tokenizer(cfg: RMConfig):
    from glmstack.train.export import stage_tokenizer

    return stage_tokenizer(cfg, cfg.rm.tokenizer, option="rm.tokenizer")


def pad_id(tokenizer) -> int:
    """<|endoftext|>: never inside a rendered conversation, so transformers' last-non-pad pooling finds the end."""
    return tokenizer.token_id("<|endoftext|>")


def encoded_pairs(cfg: RMConfig, tokenizer, split: str) -> tuple[list, list[str]]:
    """-> ([(chosen ids, rejected ids)], each pair's kind ("" when the record has none))."""
    from glmstack.posttrain.rm.data import data_files, encode_pair, read_pairs
    from glmstack.train.stage import stage_dir

    entries = cfg.rm.data if split == "train" else cfg.rm.val_data
    n = cfg.rm.synthetic_n if split == "train" else max(1, cfg.rm.synthetic_n // 5)
    paths = data_files(entries, stage_dir(cfg) / "data", n, cfg.seed, "train" if split == "train" else "test")
    pairs, kinds = [], []
    for path in paths:
        pairs += [encode_pair(tokenizer, p, cfg.rm.chat_style) for p in read_pairs(path)]
        kinds += [json.loads(line).get("kind", "") for line in path.read_text().splitlines() if line.strip()]
    return pairs, kinds


def batches_of(cfg: RMConfig, pairs, tokenizer, shuffle: bool):
    from glmstack.posttrain.rm.data import PreferenceBatches

    try:
        return PreferenceBatches(pairs, batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, pad_id=pad_id(tokenizer),
                                 seed=cfg.seed, rank=dist.rank(), world_size=dist.world(), shuffle=shuffle)  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"rm data: {e}") from None


def heldout(cfg: RMConfig, pairs, kinds: list[str], tokenizer):
    """Every held-out pair once, in order, as micro-batches; -> [(kind, batch)] (kind "" = mixed)."""
    from glmstack.posttrain.rm.data import pad_rows

    out, B, pid = [], cfg.micro_batch_size, pad_id(tokenizer)
    for kind in sorted(set(kinds)):
        rows = [p for p, k in zip(pairs, kinds) if k == kind and max(map(len, p)) <= cfg.seq_len]
        for i in range(0, len(rows), B):
            chunk = rows[i : i + B]
            out.append((kind, pad_rows([c for c, _ in chunk] + [r for _, r in chunk], cfg.seq_len, pid)))
    return out


def round_robin(val: list[tuple[str, dict]]) -> list[dict]:
    """Held-out batches alternating over kinds, so the loop's first `log.val_batches` cover every kind."""
    by_kind: dict[str, list[dict]] = {}
    for kind, batch in val:
        by_kind.setdefault(kind, []).append(batch)
    return [b for group in itertools.zip_longest(*by_kind.values()) for b in group if b is not None]


# ---------------------------------------------------------------------------------------------------- stage
def check(cfg: RMConfig) -> None:
    if not isinstance(cfg, RMConfig):
        raise ConfigError(f"the rm stage needs an RMConfig (got {type(cfg).__name__})")
    if not cfg.rm.data:
        raise ConfigError("rm.data is empty: give preference JSONL files or synthetic:checkable")
    if cfg.lora.enabled and cfg.lora.base_quant:
        raise ConfigError("lora.base_quant: the rm stage trains LoRA over a full-precision trunk (no QLoRA)")


def run_rm(cfg: RMConfig, stop_at: int | None = None) -> dict:
    """Train on the one loop, then score the held-out pairs and export <stage>/model (module docstring)."""
    from glmstack.model.lora import has_lora
    from glmstack.optim import build_optimizer
    from glmstack.posttrain.rm.model import merged_rm, save_rm, save_rm_adapter
    from glmstack.train.loop import device_of, train
    from glmstack.train.stage import check_inputs, seed_everything, stage_dir

    check(cfg)
    check_inputs(cfg)
    tokenizer = load_tokenizer(cfg)
    device = device_of(cfg)
    dist.init_from_env(device.type)
    seed_everything(cfg.seed)
    model = build_reward_model(cfg, device)
    optimizer, _ = build_optimizer(dist.unwrap(model), cfg.optim)
    train_pairs, _ = encoded_pairs(cfg, tokenizer, "train")
    data = batches_of(cfg, train_pairs, tokenizer, shuffle=True)
    val_pairs, kinds = encoded_pairs(cfg, tokenizer, "val") if cfg.rm.val_data else ([], [])
    val = heldout(cfg, val_pairs, kinds, tokenizer)
    folder = stage_dir(cfg)
    result = train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder, loss_fn=rm_loss(cfg.rm),
                   val_batches=round_robin(val)[: cfg.log.val_batches], stop_at=stop_at)  # fmt: skip
    if dist.rank() == 0 and result["stopped"] == "done":
        inner = dist.unwrap(model)
        if val:
            result["heldout_acc"], result["heldout_pairs"] = pair_accuracy(inner, (b for _, b in val))
            result["heldout_acc_by_kind"] = {k: pair_accuracy(inner, (b for kk, b in val if kk == k))[0]
                                             for k in sorted(set(kinds)) if k}  # fmt: skip
        summary = {k: result.get(k) for k in ("heldout_acc", "heldout_pairs", "heldout_acc_by_kind", "loss", "step")}
        (folder / "rm_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        style = {"pad_token_id": pad_id(tokenizer), "chat_style": cfg.rm.chat_style}
        if has_lora(inner):  # the adapter (PEFT, SEQ_CLS) beside the merged reward model every scorer reads
            result["adapter"] = str(save_rm_adapter(inner, folder / "adapter", tokenizer))
        result["model"] = str(save_rm(merged_rm(inner) if has_lora(inner) else inner, folder / "model", tokenizer,
                                      **style))  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    from glmstack.stage_cli import main_for

    return main_for("rm", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
