"""`glmstack vl-rl <recipe>`: RL with curriculum sampling (RLCS) for a vision-language model, on the one loop.

GLM-4.1V-Thinking (arXiv 2507.01006 §5) follows SFT with RL on verifiable multimodal problems whose difficulty is
tracked and sampled by curriculum (RLCS). Here that is glmstack.posttrain.rl (GRPO with clip-higher and IcePop,
dynamic sampling, the curriculum table `rl.curriculum = [[from_step, level, group_size(, hard_k)], ...]`, the
dashboard) with three things of its own:
  task      `VisualQA`: the PIL visual QA set (multimodal.vqa) at a curriculum level (0: colours and shapes; 1: also
            counts and letters); a row with `hard_k` keeps only groups whose first hard_k samples all failed and a
            later one succeeded (pass@k of the current policy: the difficulty-graded sampling of RLCS)
  reward    `vqa`: 1 if the boxed answer (`<|begin_of_box|>...<|end_of_box|>`) is the item's answer
  rollouts  `VisionRollouts`: each prompt decodes with its pixels (GLMV.generate, KV cache, per-row seeds) from an
            in-process copy of the weights synced every step; rollout log-probs are then scored by that copy in one
            batched forward over the sampled tokens (the sampler's own transform), and each micro-batch carries its
            rows' pixels to the loss (posttrain/rl/stage.rl_loss passes the vision inputs to the model)
At the end: the held-out accuracy on the run's visual QA test file (the same table as the SFT stages), the
dashboard plots, and the model folder.

    glmstack vl-rl vl_tiny                        # from runs/vl_tiny/sft/model
    glmstack vl-rl vl_tiny --set steps=10 --set rl.samples_per_step=32
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import dataclass, field

import torch

from glmstack.config import ConfigError
from glmstack.multimodal.stage import VLOptions
from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.losses import token_logprobs
from glmstack.posttrain.rl.rollouts import Rollouts, check_divisible, stage_at
from glmstack.posttrain.rl.stage import RLConfig
from glmstack.posttrain.rl.tasks import Problem
from glmstack.train import dist


@reward_lib.register("vqa")
def vqa_reward(samples: list[reward_lib.Sample]) -> list[float]:
    from glmstack.multimodal.vqa import verify

    return [float(verify(s.meta, s.text)) for s in samples]


class VisualQA:
    """The visual QA set as an RL task: problems carry their pixels (`meta["media"]`) beside the prompt ids."""

    name = "vqa"
    rewards = ("vqa",)

    def __init__(self, tokenizer, processor, style: str = "glm-4.5"):
        self.tokenizer, self.processor, self.style = tokenizer, processor, style

    def problems(self, *, split: str, n: int, seed: int, level: int = 0) -> list[Problem]:
        from glmstack.multimodal.encode import encode_multimodal
        from glmstack.multimodal.vqa import generate, messages

        out = []
        for item in generate(n, seed, split, level=level):
            enc = encode_multimodal(self.tokenizer, self.processor, messages(item, with_answer=False),
                                    style=self.style, enable_thinking=False, add_generation_prompt=True)  # fmt: skip
            meta = {"answer": item["answer"], "kind": item["kind"], "level": level, "task": self.name,
                    "media": enc.media}  # fmt: skip
            out.append(Problem(enc.ids, meta))
        return out


class VisionRollouts(Rollouts):
    """Rollouts whose prompts carry images (see the module docstring); everything else is posttrain/rl's."""

    def sync(self, perturb: bool = True) -> float:
        t0 = time.perf_counter()
        policy = dist.unwrap(self.policy)
        if self.engine is None:
            self.engine = copy.deepcopy(policy).to(getattr(torch, self.opts.rollout_dtype)).eval()
        with torch.no_grad():
            self.engine.load_state_dict(policy.state_dict())
        return time.perf_counter() - t0

    def generate(self, problems, group_size: int, temperature: float, tag):
        from glmstack.posttrain.rl.rollouts import stable_seed

        o, model = self.opts, self.engine
        device = next(model.parameters()).device
        rows, samples = [], []
        for i in range(len(problems) * group_size):
            p = problems[i // group_size]
            inputs = {k: v.to(device) for k, v in p.meta["media"].model_inputs().items()}
            toks = model.generate(torch.tensor(p.prompt_ids, device=device), max_new_tokens=o.max_new_tokens,
                                  temperature=temperature, top_p=o.top_p, top_k=o.top_k,
                                  seed=stable_seed(self.seed, tag, i), stop_ids=self.tokenizer.eos_ids,
                                  **inputs)  # fmt: skip
            stopped = bool(toks) and toks[-1] in self.tokenizer.eos_ids
            text = self.tokenizer.decode(toks[:-1] if stopped else toks)
            rows.append((p.prompt_ids, toks, None))
            samples.append(reward_lib.Sample(meta=p.meta, tokens=toks, text=text, finish="stop" if stopped else "length",
                                             max_new_tokens=o.max_new_tokens, style=self.style))  # fmt: skip
        logps = self.rollout_logprobs(problems, group_size, rows, temperature)
        return [(pr, t, lp) for (pr, t, _), lp in zip(rows, logps)], samples

    @torch.no_grad()
    def rollout_logprobs(self, problems, group_size: int, rows, temperature: float) -> list[list[float]]:
        """log π_rollout of each sampled token under the sampling transform, one batched forward of the copy."""
        batch = self.batch_of([(pr, t) for pr, t, _ in rows], [problems[i // group_size] for i in range(len(rows))])
        logits = self.engine(batch["input_ids"], **batch["media"]).logits.float()
        logp = token_logprobs(logits, batch["targets"], temperature, self.opts.top_p, self.opts.top_k)
        return [logp[i, len(pr) - 1 : len(pr) - 1 + len(t)].tolist() for i, (pr, t, _) in enumerate(rows)]

    @staticmethod
    def batch_of(pairs, problems) -> dict:
        from glmstack.multimodal.processor import Media

        L = max(len(p) + len(t) for p, t in pairs) - 1
        ids, tgt = torch.zeros(len(pairs), L, dtype=torch.long), torch.zeros(len(pairs), L, dtype=torch.long)
        for i, (p, t) in enumerate(pairs):
            seq = p + t
            ids[i, : len(seq) - 1], tgt[i, : len(seq) - 1] = torch.tensor(seq[:-1]), torch.tensor(seq[1:])
        media = Media.concat([pb.meta["media"] for pb in problems]).model_inputs()
        return {"input_ids": ids, "targets": tgt, "media": media}

    def batch(self, groups: list, group: int, stats: dict) -> dict:
        """posttrain/rl's rollout batch plus each row's index, so its micro-batches can collect their rows' pixels."""
        self.media = [s.meta["media"] for g in groups for _, _, s in g]
        return super().batch(groups, group, stats) | {"row": torch.arange(len(self.media))}

    def updates_of(self, batch: dict, stats: dict) -> list[dict]:
        """posttrain/rl's micro-batches, each with the pixels of its rows (in row order)."""
        from glmstack.multimodal.processor import Media

        out = super().updates_of(batch, stats)
        for mb in out:
            mb.update(Media.concat([self.media[r] for r in mb.pop("row").tolist()]).model_inputs())
        return out


# ---------------------------------------------------------------------------------------------------- stage
@dataclass(kw_only=True)
class VLRLConfig(RLConfig):
    vl: VLOptions = field(default_factory=VLOptions)


def check(cfg: VLRLConfig) -> None:
    if not isinstance(cfg, VLRLConfig):
        raise ConfigError(f"vl-rl needs a VLRLConfig (got {type(cfg).__name__})")
    if not cfg.init_from:
        raise ConfigError("init_from is required: the vision-language model folder to train (e.g. vl_tiny/sft/model)")
    o = cfg.rl
    if o.ppo_epochs * o.minibatches != 1:
        raise ConfigError("rl.ppo_epochs / rl.minibatches: vl-rl takes one optimizer step per rollout batch (on-policy)")
    if o.temperature <= 0:
        raise ConfigError("rl.temperature must be > 0 (RL samples; the trainer divides its logits by it)")
    if not o.curriculum or any(len(r) not in (3, 4) for r in o.curriculum):
        raise ConfigError("rl.curriculum: give rows [from_step, level, group_size] or [..., hard_k]")
    for _, _, group, hard_k in (stage_at(o.curriculum, r[0]) for r in o.curriculum):
        if hard_k >= group:
            raise ConfigError(f"rl.curriculum: hard_k={hard_k} must be below the group size {group}")
        problem = check_divisible(o.samples_per_step, int(group), cfg.grad_accum)
        if problem:
            raise ConfigError(problem)


def run_vl_rl(cfg: VLRLConfig, stop_at: int | None = None) -> dict:
    """The policy from init_from, VisualQA rollouts as the data, posttrain/rl's loss on the one loop; then the
    held-out table, the dashboard and the model folder."""
    from glmstack.model.vision import load_vl_hf
    from glmstack.multimodal.processor import VisionProcessor
    from glmstack.multimodal.stage import export, stage_dir
    from glmstack.optim import build_optimizer
    from glmstack.posttrain.rl.stage import rl_loss
    from glmstack.tokenizer import Tokenizer
    from glmstack.train.checkpoint import resolve
    from glmstack.train.loop import device_of, train
    from glmstack.train.stage import seed_everything

    check(cfg)
    seed_everything(cfg.seed)
    source = resolve(cfg.init_from, cfg.out_dir)
    model = load_vl_hf(source, dtype=torch.float32, device=device_of(cfg))
    tokenizer, processor = Tokenizer.load(source), VisionProcessor.load(source)
    optimizer, _ = build_optimizer(model, cfg.optim)
    task = VisualQA(tokenizer, processor, cfg.vl.chat_style)
    data = VisionRollouts(model=model, task=task, opts=cfg.rl, seed=cfg.seed, micro_batches=cfg.grad_accum,
                          tokenizer=tokenizer, style=cfg.vl.chat_style)  # fmt: skip
    folder = stage_dir(cfg)
    result = train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder, loss_fn=rl_loss(cfg.rl),
                   stop_at=stop_at)  # fmt: skip
    if result["stopped"] != "done":
        return result
    result["model"] = str(export(model, tokenizer, processor, folder / "model", cfg.vl.chat_style))
    if cfg.vl.eval_n:
        from glmstack.multimodal.evaluate import evaluate_model, heldout_items

        scores = evaluate_model(model, tokenizer, processor, heldout_items(cfg), cfg.vl.chat_style,
                                max_new_tokens=cfg.vl.max_new_tokens)  # fmt: skip
        (folder / "eval.json").write_text(json.dumps(scores, indent=2) + "\n")
        result["heldout_acc"] = scores["accuracy"]
    if cfg.log.plots:
        from glmstack.posttrain.rl.dashboard import plot_dashboard

        plot_dashboard(folder)
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    from glmstack.config import apply_overrides
    from glmstack.errors import GlmstackError, one_line
    from glmstack.recipes import recipe_function

    ap = argparse.ArgumentParser(prog="glmstack vl-rl", description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help="recipe module under glmstack/recipes (e.g. vl_tiny)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    try:
        result = run_vl_rl(apply_overrides(recipe_function(args.recipe, "rl")(), args.overrides))
    except GlmstackError as e:
        print(one_line("glmstack vl-rl", e), file=sys.stderr, flush=True)
        return 2
    print(f"rl finished: {result}", flush=True)
    return 0 if result["stopped"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
