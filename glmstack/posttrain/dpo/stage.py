"""`glmstack dpo <recipe> [--set key=value ...]`: Direct Preference Optimization on preference pairs, on the one loop.

ChatGLM-RLHF (the GLM-4 report) aligned the family with PPO and DPO on human preferences, and DPO is what most
people who fine-tune a released GLM reach for first (TRL's DPOTrainer). Here it is a stage like any other:
  data       the pairs `glmstack rm` reads (files: prompt/chosen/rejected as strings or OpenAI messages, or TRL's
             conversational chosen/rejected; or the synthetic checkable set), encoded with assistant-only masks
             (data.py); a bad record is one line naming the file and line, exit code 2
  reference  the policy's step-0 weights, frozen: log-probs cached once before training (`dpo.reference=cache`)
             or computed per micro-batch under no_grad (`live`) (reference.py)
  loss       sigmoid (β, cDPO label smoothing) or IPO (loss.py, equal to TRL's: tests/parity/test_dpo_trl.py);
             logged as TRL names them: rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies,
             logps/chosen, logps/rejected
  loop       glmstack/train/loop.py (optimizer, schedule, guard, checkpoints, metrics.jsonl, resume bit for bit)
  out        <stage>/dpo_summary.json (held-out implicit-reward accuracy, and how often the policy and the
             reference give the chosen reply the higher log-prob) and <stage>/model, the HF folder SFT exports

    glmstack dpo dpo_speedrun                               # the speedrun SFT model on the synthetic pairs
    glmstack dpo dpo_speedrun --set dpo.data='["prefs.jsonl"]' --set dpo.loss_type=ipo --set dpo.beta=0.5
    glmstack dpo dpo_tiny --set init_from=FOLDER --set steps=4   # a random tiny model: a smoke test
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from glmstack.config import ConfigError
from glmstack.posttrain.dpo.data import DPOBatches, encoded_pairs
from glmstack.posttrain.dpo.loss import LOSS_TYPES, batch_logps, dpo_loss
from glmstack.posttrain.dpo.reference import build_reference, cache_reference, reference_logps
from glmstack.train import dist
from glmstack.train.config import TrainConfig

REFERENCES = ("cache", "live")


@dataclass(kw_only=True)
class DPOOptions:
    data: list[str] = field(default_factory=lambda: ["synthetic:checkable"])  # JSONL files or synthetic:<set>
    val_data: list[str] = field(default_factory=lambda: ["synthetic:checkable"])  # held-out pairs ([] = none)
    synthetic_n: int = 3000  # training pairs per synthetic set (held out: a fifth of it)
    beta: float = 0.1  # β: the implicit reward's scale (the KL constraint's inverse strength)
    label_smoothing: float = 0.0  # cDPO ε in [0, 0.5): the probability a preference label is flipped (sigmoid)
    loss_type: str = "sigmoid"  # sigmoid (DPO) | ipo
    reference: str = "cache"  # cache: reference log-probs once before training | live: per micro-batch
    sft_weight: float = 0.0  # α: + α · the chosen replies' mean token NLL (RPO; TRL loss_type ["sigmoid", "sft"])
    packing: bool = False  # pack a micro-batch's sequences into as few seq_len rows as hold them (data.pack_rows)
    chat_style: str = "glm-4.5"  # how prompt + reply are rendered
    tokenizer: str = ""  # folder with tokenizer.json; "" = init_from's


@dataclass(kw_only=True)
class DPOConfig(TrainConfig):
    dpo: DPOOptions = field(default_factory=DPOOptions)


# ---------------------------------------------------------------------------------------------------- loss
def pair_terms(model, batch: dict, reference=None):
    """-> (policy log-probs (2B,), reference log-probs (2B,), completion token counts (2B,), the model's output)."""
    out = model(batch["input_ids"], segment_ids=batch["segment_ids"], position_ids=batch.get("position_ids"))
    logps, counts = batch_logps(out.logits, batch)
    ref = batch["ref_logps"] if "ref_logps" in batch else reference_logps(reference, batch)
    return logps, ref, counts, out


def dpo_loss_fn(opts: DPOOptions, reference=None):
    """loss_fn(model, batch, values) for the loop: DPO on one micro-batch of pairs (chosen rows first)."""

    def loss_fn(model, batch: dict, values: dict):
        logps, ref, counts, out = pair_terms(model, batch, reference)
        (lc, lr), (rc, rr), (nc, nr) = logps.chunk(2), ref.chunk(2), counts.chunk(2)
        loss, metrics = dpo_loss(lc, lr, rc, rr, nc, nr, beta=opts.beta, label_smoothing=opts.label_smoothing,
                                 loss_type=opts.loss_type, sft_weight=opts.sft_weight)  # fmt: skip
        metrics["expert_load"] = out.expert_load
        return loss + out.aux_loss * values.get("aux_loss_weight", 0.0), metrics

    return loss_fn


@torch.no_grad()
def heldout_scores(model, batches: list[dict], reference=None) -> dict:
    """Over every held-out pair: implicit-reward accuracy (β·ratio_c > β·ratio_r, TRL's rewards/accuracies) and how
    often the policy and the reference give the chosen reply the higher log-prob."""
    model.eval()
    dev, wins, pol, ref_wins, n = next(model.parameters()).device, 0, 0, 0, 0
    for b in batches:
        logps, ref, _, _ = pair_terms(model, {k: v.to(dev) for k, v in b.items()}, reference)
        (lc, lr), (rc, rr) = logps.chunk(2), ref.to(dev).chunk(2)
        wins += int((lc - rc > lr - rr).sum())
        pol, ref_wins, n = pol + int((lc > lr).sum()), ref_wins + int((rc > rr).sum()), n + lc.numel()
    model.train()
    return {"heldout_reward_acc": wins / max(n, 1), "heldout_policy_prefers_chosen": pol / max(n, 1),
            "heldout_reference_prefers_chosen": ref_wins / max(n, 1), "heldout_pairs": n}  # fmt: skip


# ---------------------------------------------------------------------------------------------------- data
def load_tokenizer(cfg: DPOConfig):
    from glmstack.train.export import stage_tokenizer

    return stage_tokenizer(cfg, cfg.dpo.tokenizer, option="dpo.tokenizer")


def batches(cfg: DPOConfig, tokenizer, split: str) -> DPOBatches:
    """This rank's batches of `split` (train: shuffled per epoch; val: in order)."""
    from glmstack.posttrain.rm.stage import pad_id
    from glmstack.train.stage import stage_dir

    train = split == "train"
    entries, option = (cfg.dpo.data, "dpo.data") if train else (cfg.dpo.val_data, "dpo.val_data")
    n = cfg.dpo.synthetic_n if train else max(1, cfg.dpo.synthetic_n // 5)
    pairs = encoded_pairs(entries, stage_dir(cfg) / "data", n, cfg.seed, "train" if train else "test", tokenizer,
                          cfg.dpo.chat_style, option)  # fmt: skip
    try:
        out = DPOBatches(pairs, batch_size=cfg.micro_batch_size, seq_len=cfg.seq_len, pad_id=pad_id(tokenizer),
                         seed=cfg.seed, rank=dist.rank(), world_size=dist.world(), shuffle=train)  # fmt: skip
    except ValueError as e:
        raise ConfigError(f"{option}: {e}") from None
    out.packing = cfg.dpo.packing
    if out.dropped_long and dist.rank() == 0:
        print(f"dpo {split} data: {out.dropped_long} of {len(pairs)} pairs longer than seq_len={cfg.seq_len} dropped")
    return out


def check_vocab(data: DPOBatches, vocab_size: int) -> None:
    top = max((max(p[0] + p[1]) for p in data.pairs), default=0)
    if top >= vocab_size:
        raise ConfigError(f"token id {top} >= the model's vocab_size {vocab_size}: tokenizer and model differ")


# ---------------------------------------------------------------------------------------------------- stage
def check(cfg: DPOConfig) -> None:
    from glmstack.chat.render import get_style

    if not isinstance(cfg, DPOConfig):
        raise ConfigError(f"the dpo stage needs a DPOConfig (got {type(cfg).__name__})")
    d = cfg.dpo
    if not d.data:
        raise ConfigError("dpo.data is empty: give preference JSONL files or synthetic:checkable")
    if d.loss_type not in LOSS_TYPES:
        raise ConfigError(f"dpo.loss_type={d.loss_type!r}: expected one of {', '.join(LOSS_TYPES)}")
    if d.reference not in REFERENCES:
        raise ConfigError(f"dpo.reference={d.reference!r}: expected one of {', '.join(REFERENCES)}")
    if not d.beta > 0:
        raise ConfigError(f"dpo.beta={d.beta}: must be > 0")
    if not 0 <= d.label_smoothing < 0.5:
        raise ConfigError(f"dpo.label_smoothing={d.label_smoothing}: must lie in [0, 0.5)")
    if d.sft_weight < 0:
        raise ConfigError(f"dpo.sft_weight={d.sft_weight}: must be ≥ 0")
    if d.label_smoothing and d.loss_type != "sigmoid":
        raise ConfigError("dpo.label_smoothing is cDPO's, for loss_type=sigmoid only")
    try:
        get_style(d.chat_style)
    except ValueError as e:
        raise ConfigError(f"dpo.chat_style: {e}") from None


def run_dpo(cfg: DPOConfig, stop_at: int | None = None) -> dict:
    """Train on the one loop, then score the held-out pairs and export <stage>/model (module docstring)."""
    from glmstack.train.export import export_checkpoint
    from glmstack.train.loop import autocast_dtype, device_of, train
    from glmstack.train.stage import model_and_optimizer, stage_dir

    # ------------------------------------------------------------------ model, reference, data
    check(cfg)
    tokenizer = load_tokenizer(cfg)
    dist.init_from_env(device_of(cfg).type)
    data = batches(cfg, tokenizer, "train")  # read before a model is built: a bad record costs no allocation
    val = batches(cfg, tokenizer, "val") if cfg.dpo.val_data else None
    model, optimizer = model_and_optimizer(cfg)
    device = device_of(cfg)
    for b in filter(None, (data, val)):
        check_vocab(b, dist.unwrap(model).cfg.vocab_size)
    reference = build_reference(cfg, device)
    if cfg.dpo.reference == "cache":
        for b in filter(None, (data, val)):
            cache_reference(b, reference, device, autocast_dtype(cfg, device))
        reference = None  # freed: the batches carry its log-probs
    val_batches = val.once() if val else []
    # ------------------------------------------------------------------ train
    folder = stage_dir(cfg)
    result = train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder,
                   loss_fn=dpo_loss_fn(cfg.dpo, reference), val_batches=val_batches[: cfg.log.val_batches],
                   stop_at=stop_at)  # fmt: skip
    # ------------------------------------------------------------------ held-out scores, export
    if dist.rank() == 0 and result["stopped"] == "done":
        if val_batches:
            result |= heldout_scores(dist.unwrap(model), val_batches, reference)
        keys = ("heldout_reward_acc", "heldout_policy_prefers_chosen", "heldout_reference_prefers_chosen",
                "heldout_pairs", "loss", "step")  # fmt: skip
        (folder / "dpo_summary.json").write_text(json.dumps({k: result.get(k) for k in keys}, indent=2) + "\n")
        result["model"] = str(export_checkpoint(Path(result["checkpoint"]), folder / "model", tokenizer,
                                                cfg.dpo.chat_style))  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    """`glmstack dpo <recipe> ...` trains; `glmstack dpo eval MODEL ...` scores the preferred behaviour's rate;
    `glmstack dpo pairs MODEL ...` makes on-policy pairs from the model's own samples (pairs.py)."""
    from glmstack.stage_cli import main_for

    if argv and argv[0] == "eval":
        from glmstack.posttrain.dpo.behaviour import main as eval_main

        return eval_main(argv[1:])
    if argv and argv[0] == "pairs":
        from glmstack.posttrain.dpo.pairs import main as pairs_main

        return pairs_main(argv[1:])
    return main_for("dpo", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
