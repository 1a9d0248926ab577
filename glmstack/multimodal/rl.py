"""`glmstack vl-rl <recipe>`: RL with curriculum sampling (RLCS) for a vision-language model, on the one loop.

GLM-4.1V-Thinking (arXiv 2507.01006 §5) follows SFT with RL on verifiable multimodal problems whose difficulty is
tracked and sampled by curriculum (RLCS). Here that is glmstack.posttrain.rl (GRPO with clip-higher and IcePop,
dynamic sampling, the curriculum table `rl.curriculum = [[from_step, level, group_size(, hard_k)], ...]`, the
dashboard) with three things of its own:
  task      `VisualQA`: the PIL visual QA set (multimodal.vqa) at a curriculum level (0: colours and shapes; 1: also
            counts and letters); a row with `hard_k` keeps only groups whose first hard_k samples all failed and a
            later one succeeded (pass@k of the current policy: the difficulty-graded sampling of RLCS)
  reward    `vqa`: 1 if the boxed answer (`<|begin_of_box|>...<|end_of_box|>`) is the item's answer
  rollouts  `VisionRollouts`: the step's prompts decode together with their pixels (inference.vision.generate_batch, left
            padding, KV cache, per-row seeds) from an in-process copy of the weights synced every step (in
            `rl.rollout_dtype`, perturbed by `rl.rollout_noise` as posttrain/rl's); the rollout log-probs are the
            sampler's own, taken as it sampled (never re-scored), so IcePop / TIS see the real mismatch; each
            micro-batch carries its rows' pixels to the loss (posttrain/rl/stage.rl_loss passes them to the model).
            No server rollouts (`rl.rollout_server` is refused).
At the end: the held-out accuracy on the run's visual QA test file (the same table as the SFT stages), the
dashboard plots, and the model folder.

    glmstack vl-rl vl_tiny                        # from runs/vl_tiny/sft/model
    glmstack vl-rl vl_tiny --set steps=10 --set rl.samples_per_step=32
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from dataclasses import dataclass, field

import torch

from glmstack.config import ConfigError
from glmstack.multimodal.stage import VLOptions
from glmstack.posttrain.rl import rewards as reward_lib
from glmstack.posttrain.rl.rollouts import Rollouts
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

    DECODE_ROWS = 32  # rows decoded together (their KV caches and pixels at once)

    def sync(self, perturb: bool = True, force: bool = False) -> float:
        t0 = time.perf_counter()
        state = self.full_state()
        if self.engine is None:
            self.engine = copy.deepcopy(dist.unwrap(self.policy)).to(getattr(torch, self.opts.rollout_dtype)).eval()
        with torch.no_grad():
            self.engine.load_state_dict(state)
        if perturb:
            self.perturb(self.engine)
        self.version = self.step
        return time.perf_counter() - t0

    def prepare_eval(self) -> None:
        """Held-out questions on the trainer's weights: the in-process copy itself when it holds them unperturbed,
        else a fresh copy (rl.rollout_noise)."""
        if not self.opts.rollout_noise:
            self.eval_engine = self.engine
            return
        if self.eval_engine is None:
            self.eval_engine = copy.deepcopy(self.engine)
        with torch.no_grad():
            self.eval_engine.load_state_dict(self.full_state())

    def generate(self, problems, group_size: int, temperature: float, tag, first_row: int = 0, engine=None):
        from glmstack.posttrain.rl.rollouts import stable_seed

        o, eos = self.opts, self.tokenizer.eos_ids
        rows_of = [problems[i // group_size] for i in range(len(problems) * group_size)]
        seeds = [stable_seed(self.seed, tag, first_row + i) for i in range(len(rows_of))]
        tokens, logps = [], []
        for k in range(0, len(rows_of), self.DECODE_ROWS):
            t, lp = self._decode(rows_of[k : k + self.DECODE_ROWS], seeds[k : k + self.DECODE_ROWS], temperature,
                                 engine or self.engine)  # fmt: skip
            tokens, logps = tokens + t, logps + lp
        rows, samples = [], []
        for p, toks, lps in zip(rows_of, tokens, logps):
            stopped = bool(toks) and toks[-1] in eos
            rows.append((p.prompt_ids, toks, lps))
            samples.append(reward_lib.Sample(meta=p.meta, tokens=toks, text=self.tokenizer.decode(toks[:-1] if stopped
                                             else toks), finish="stop" if stopped else "length",
                                             max_new_tokens=o.max_new_tokens, style=self.style))  # fmt: skip
        self.staleness = (0.0, 0)  # synced every step, in process
        return rows, samples

    def _decode(self, problems, seeds, temperature: float, engine):
        """One batch of rows through inference.vision's generate_batch: prompts left-padded, images in row order."""
        from glmstack.inference.vision import generate_batch
        from glmstack.multimodal.processor import Media

        o = self.opts
        device = next(engine.parameters()).device
        T = max(len(p.prompt_ids) for p in problems)
        ids, mask = torch.zeros(len(problems), T, dtype=torch.long), torch.zeros(len(problems), T, dtype=torch.long)
        for b, p in enumerate(problems):
            ids[b, T - len(p.prompt_ids) :], mask[b, T - len(p.prompt_ids) :] = torch.tensor(p.prompt_ids), 1
        media = {k: v.to(device) for k, v in Media.concat([p.meta["media"] for p in problems]).model_inputs().items()}
        return generate_batch(engine, ids.to(device), **media, max_new_tokens=o.max_new_tokens,
                              temperature=temperature, top_p=o.top_p, top_k=o.top_k, seeds=seeds,
                              stop_ids=self.tokenizer.eos_ids, attention_mask=mask.to(device),
                              logprobs=True)  # fmt: skip

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
    if cfg.rl.rollout_server:
        raise ConfigError("rl.rollout_server: vl-rl rolls out in process only (its prompts carry pixels); unset it")
    if cfg.rl.sync_every != 1:
        raise ConfigError("rl.sync_every: vl-rl syncs its in-process copy every step (1)")
    # rl.task names posttrain/rl's text tasks; vl-rl's task is VisualQA, so check the rest with the default task
    check_rl(dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, task=type(cfg.rl)().task)))


def run_vl_rl(cfg: VLRLConfig, stop_at: int | None = None) -> dict:
    """The policy from init_from, VisualQA rollouts as the data, posttrain/rl's loss on the one loop; then the
    held-out table, the dashboard and the model folder."""
    from glmstack.model.vision import load_vl_hf
    from glmstack.multimodal.processor import VisionProcessor
    from glmstack.multimodal.stage import finish, stage_dir
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
    result = finish(cfg, result, model, tokenizer, processor, folder)
    if result["stopped"] == "done" and cfg.log.plots:
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
