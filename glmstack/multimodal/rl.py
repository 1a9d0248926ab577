"""`glmstack vl-rl <recipe>`: RL with curriculum sampling (RLCS) for a vision-language model, on the one loop.

GLM-4.1V-Thinking (arXiv 2507.01006 §5) follows SFT with RL on verifiable multimodal problems whose difficulty is
tracked and sampled by curriculum (RLCS). Here that is glmstack.posttrain.rl (GRPO with clip-higher and IcePop,
dynamic sampling, the curriculum table `rl.curriculum = [[from_step, level, group_size(, hard_k)], ...]`, the
dashboard) with three things of its own:
  task      `VisualQA`: the PIL visual QA set (multimodal.vqa) at a curriculum level (0: colours and shapes; 1: also
            counts and letters); a row with `hard_k` keeps only groups whose first hard_k samples all failed and a
            later one succeeded (pass@k of the current policy: the difficulty-graded sampling of RLCS)
  reward    `vqa`: 1 if the boxed answer (`<|begin_of_box|>...<|end_of_box|>`) is the item's answer
  rollouts  posttrain/rl's `Rollouts`, with the policy (posttrain/policy.py's EnginePolicy over the GLMV)
            decoding the step's prompts together with their pixels (inference.vision.generate_batch, left padding,
            KV cache, per-row seeds) from an in-process copy of the weights (in `rl.rollout_dtype`, perturbed by
            `rl.rollout_noise`); the rollout log-probs are the sampler's own, taken as it sampled (never
            re-scored), so IcePop / TIS see the real mismatch; each micro-batch carries its rows' pixels to the
            loss (posttrain/rl/stage.rl_loss passes them to the model). No server rollouts (`rl.rollout_server`
            is refused: the server takes token ids only).
At the end: the held-out accuracy on the run's visual QA test file (the same table as the SFT stages), the
dashboard plots, and the model folder.

    glmstack vl-rl vl_tiny                        # from runs/vl_tiny/sft/model
    glmstack vl-rl vl_tiny --set steps=10 --set rl.samples_per_step=32
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import torch

from glmstack.config import ConfigError
from glmstack.multimodal.stage import VLOptions
from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.rollouts import Rollouts
from glmstack.posttrain.rl.stage import RLConfig
from glmstack.posttrain.rl.tasks import Problem


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


# ---------------------------------------------------------------------------------------------------- stage
@dataclass(kw_only=True)
class VLRLConfig(RLConfig):
    vl: VLOptions = field(default_factory=VLOptions)


def check(cfg: VLRLConfig) -> None:
    """posttrain/rl's checks, plus what vl-rl adds: a model to start from and one optimizer step per batch."""
    from glmstack.posttrain.rl.stage import check as check_rl

    if not isinstance(cfg, VLRLConfig):
        raise ConfigError(f"vl-rl needs a VLRLConfig (got {type(cfg).__name__})")
    if not cfg.init_from:
        raise ConfigError("init_from is required: the vision-language model folder to train (e.g. vl_tiny/sft/model)")
    if cfg.rl.ppo_epochs * cfg.rl.minibatches != 1:
        raise ConfigError(
            "rl.ppo_epochs / rl.minibatches: vl-rl takes one optimizer step per rollout batch (on-policy)"
        )
    if cfg.rl.task != VisualQA.name:
        raise ConfigError(
            f"rl.task={cfg.rl.task!r}: vl-rl trains on its visual QA task only (rl.task={VisualQA.name!r})"
        )
    if cfg.rl.loss == "ppo":
        raise ConfigError("rl.loss=ppo: vl-rl has no value head (PPO with a critic is text RL only: glmstack rl)")
    if cfg.rl.rollout_server:
        raise ConfigError("rl.rollout_server: vl-rl rolls out in process only (its prompts carry pixels); unset it")
    if cfg.rl.routing_replay != "off":
        raise ConfigError("rl.routing_replay: the vision-language engine (inference/vision.py) records no routes; "
                          "leave it off for vl-rl")  # fmt: skip
    # rl.task names posttrain/rl's text tasks; vl-rl's task is VisualQA, so check the rest with the default task
    check_rl(dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, task=type(cfg.rl)().task)))


def run_vl_rl(cfg: VLRLConfig, stop_at: int | None = None) -> dict:
    """The policy from init_from, VisualQA rollouts as the data, posttrain/rl's loss on the one loop; then the
    held-out table, the dashboard and the model folder."""
    from glmstack.model.vision import load_vl_hf
    from glmstack.multimodal.processor import VisionProcessor
    from glmstack.multimodal.stage import finish, stage_dir
    from glmstack.multimodal.stage_setup import adapt, data_parallel
    from glmstack.optim import build_optimizer
    from glmstack.posttrain.rl.stage import rl_loss
    from glmstack.train import dist
    from glmstack.train.checkpoint import resolve
    from glmstack.train.export import stage_tokenizer
    from glmstack.train.loop import device_of, train
    from glmstack.train.stage import seed_everything

    check(cfg)
    data_parallel(cfg, device_of(cfg))
    seed_everything(cfg.seed)
    source = resolve(cfg.init_from, cfg.out_dir)
    model = adapt(load_vl_hf(source, dtype=torch.float32, device=device_of(cfg)), cfg)  # lora.* (stage_setup)
    tokenizer, processor = stage_tokenizer(cfg), VisionProcessor.load(source)
    optimizer, _ = build_optimizer(model, cfg.optim)
    model = dist.parallelize(model, cfg.dist.dp, find_unused=cfg.dist.find_unused_parameters)  # DDP under torchrun
    task = VisualQA(tokenizer, processor, cfg.vl.chat_style)
    data = Rollouts(model=model, task=task, opts=cfg.rl, seed=cfg.seed, micro_batches=cfg.grad_accum,
                    tokenizer=tokenizer, style=cfg.vl.chat_style)  # fmt: skip
    folder = stage_dir(cfg)
    result = train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder, loss_fn=rl_loss(cfg.rl),
                   stop_at=stop_at)  # fmt: skip
    result = finish(cfg, result, dist.unwrap(model), tokenizer, processor, folder)
    if result["stopped"] == "done" and cfg.log.plots and dist.rank() == 0:
        from glmstack.posttrain.rl.dashboard import plot_dashboard

        plot_dashboard(folder)
    return result


def main(argv: list[str] | None = None) -> int:
    from glmstack.stage_cli import main_for

    return main_for("vl-rl", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
