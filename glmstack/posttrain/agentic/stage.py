"""`glmstack agentic-rl <recipe> [--set key=value ...]`: agentic RL on the one loop, rollouts local or on Ray.

GLM-5 §3.3 / GLM-4.5 §3.3 (research/rl-recipe.md §1.3): rollout workers play multi-turn tool episodes
(envs/, episode.py) continuously; once `groups_per_step` groups are ready the trainer takes them (runner.py);
weights go to the workers every `sync_every` updates with an optimizer reset (data.py); samples more than `tau`
versions behind are dropped; environment crashes are excluded and groups padded (groups.py); advantage = reward −
group mean; the loss is direct double-sided importance sampling (rl.losses.dis_loss via rl.stage.rl_loss).
With `agentic.teachers`, each step also trains on-policy distillation rows from earlier stages' models (GLM-5 §3.5,
rl/teachers.py): the speedrun's agentic stage keeps the reasoning-RL model's skill this way.

    glmstack agentic-rl agentic_speedrun                               # the SFT'd speedrun model, tool tasks
    glmstack agentic-rl agentic_speedrun --set runner=ray --set ray.num_cpus=2 --set agentic.tau=2
    glmstack agentic-rl agentic_speedrun --set runner=ray --set ray.address=auto   # an existing cluster
    glmstack agentic-rl agentic_speedrun --set agentic.env.fault_p=0.3  # train with injected tool failures
    glmstack agentic-rl agentic_speedrun --set 'agentic.teachers=[{"model": "runs/x/rl/model", "task": "compare"}]'
Output: <out_dir>/<run>/<stage>/metrics.jsonl, plots/agentic_*.png, agentic_summary.json, model/ (HF folder).
"""

from __future__ import annotations

import copy
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from glmstack.config import ConfigError
from glmstack.posttrain.agentic.env import EnvOptions
from glmstack.posttrain.agentic.envs import env_class
from glmstack.posttrain.agentic.episode import EpisodeOptions
from glmstack.posttrain.policy import plain_copy
from glmstack.posttrain.rl.replay import check_model
from glmstack.posttrain.rl.rollouts import stable_seed
from glmstack.posttrain.rl.stage import check_true_on_policy
from glmstack.posttrain.rl.teachers import build_mix, check_teachers
from glmstack.train import dist
from glmstack.train.config import DistConfig, TrainConfig


@dataclass(kw_only=True)
class AgenticOptions:
    envs: list[list] = field(default_factory=lambda: [["calculator", 1.0], ["python", 1.0]])  # [[name, ratio]]
    level: int = 0  # task difficulty passed to the environments
    # GLM-5's easy-to-hard curriculum: [[from_step, level], ...] (rows by increasing step; [] = `level` throughout)
    curriculum: list[list] = field(default_factory=list)
    group_size: int = 8
    groups_per_step: int = 2  # a batch = groups_per_step × group_size trajectories
    episode: EpisodeOptions = field(default_factory=EpisodeOptions)
    env: EnvOptions = field(default_factory=EnvOptions)
    # the asynchronous runner (GLM-5 §3.3)
    workers: int = 2  # rollout workers
    inflight: int = 1  # tasks queued per worker (asynchronous)
    asynchronous: bool = True  # False: generate only after the trainer's push (the synchronous baseline)
    # hand over finished groups in any order: a long episode does not hold its batch, it trains later within tau
    # (runner.py; the multi-turn form of rl.partial_rollouts, for the asynchronous Ray runner)
    partial_rollouts: bool = False
    # with partial_rollouts: outstanding groups are ceil(missing × (1 + o)) (+ the workers' queues when asynchronous),
    # so a batch is the first groups to finish and the over-sampled rest run on into later steps (APRIL's over-sampling)
    partial_oversample: float = 0.5
    # DAPO's dynamic sampling: a group whose rewards are all equal carries no gradient; set it aside and generate more
    # until the batch holds groups_per_step informative groups or dynamic_sampling_max × groups_per_step groups were
    # looked at (then the set-aside ones fill it): the trainer's pass goes to groups that move the weights
    dynamic_sampling: bool = False
    dynamic_sampling_max: float = 4.0
    sync_every: int = 1  # K: push weights every K optimizer updates
    reset_optimizer: bool = True  # reset the optimizer's state after each push
    tau: int = 1  # drop a sample when current version − its first version > tau
    # the objective (rl.stage.rl_loss reads these names)
    loss: Literal["dis", "grpo", "cispo"] = "dis"
    eps_low: float = 0.2  # DIS keeps tokens with 1 − eps_low < r < 1 + eps_high (GLM-5 gives no values)
    eps_high: float = 0.28
    reduction: Literal["sample", "token"] = "sample"
    mismatch: Literal["none", "tis", "icepop"] = "none"  # loss=grpo only
    mismatch_low: float = 0.5
    mismatch_high: float = 2.0
    entropy_coef: float = 0.0  # GLM-5's agentic RL adds a small entropy bonus
    # held-out evaluation (greedy), with and without injected tool failures
    heldout_n: int = 40
    heldout_seed: int = -1  # the held-out tasks' draw; -1: the run's seed (>= 0: the same tasks for every seed)
    eval_every: int = 10  # steps; 0 = the end only
    eval_fault_p: float = 0.5  # the "with injected failures" column
    # remote rollouts: generate on an OpenAI-compatible server (`glmstack serve`) that reads the trainer's disk
    rollout_server: str = ""  # its URL; "" = the workers' own engines
    server_model: str = "glmstack"  # the `model` field sent to it (`--served-model-name`)
    rollout_server_key: str = ""  # its --api-key; "" = $GLMSTACK_API_KEY or none (prefer the variable: see rl.)
    # where the trainer writes its weight pushes: inside the server's --weight-root; "" = a private temporary folder
    # (then the server's --weight-root must hold the system's temporary folder)
    rollout_weights_dir: str = ""
    server_lora: Literal["adapter", "merged"] = "adapter"  # a LoRA policy's pushes (rl.server_lora)
    # the workers sample with the trainer's batch-invariant ops and precision: rollout log-probs equal the
    # trainer's bit for bit (rl.true_on_policy's, docs/rl.md)
    true_on_policy: bool = False
    # on-policy distillation from earlier stages' models mixed into every step (GLM-5 §3.5; rl/teachers.py):
    # [{"model": FOLDER_OR_RUN/STAGE, "task": "compare", "weight": 1.0, "level": 0}, ...]; `teacher_samples` prompts
    # of their tasks per step, one sample each from the current weights, Eq. 2's advantage on those rows
    teachers: list[dict] = field(default_factory=list)
    teacher_samples: int = 16
    teacher_max_new_tokens: int = 16

    @property
    def temperature(self) -> float:
        return self.episode.temperature

    @property
    def top_p(self) -> float:
        return self.episode.top_p

    @property
    def top_k(self) -> int:
        return self.episode.top_k

    @property
    def routing_replay(self) -> str:
        """Routing replay (rl/replay.py; rl_loss reads it): set as agentic.episode.routing_replay."""
        return self.episode.routing_replay


@dataclass(kw_only=True)
class RayOptions:
    address: str = ""  # an existing cluster ("auto" or host:port); "" starts a local one
    num_cpus: int = 0  # of the local cluster (0: all)
    worker_threads: int = 1  # torch threads per rollout worker


@dataclass(kw_only=True)
class AgenticConfig(TrainConfig):
    dist: DistConfig = field(default_factory=lambda: DistConfig(find_unused_parameters=True))  # as RLConfig's
    runner: Literal["local", "ray"] = "local"
    ray: RayOptions = field(default_factory=RayOptions)
    agentic: AgenticOptions = field(default_factory=AgenticOptions)


# ---------------------------------------------------------------------------------------------------- tasks
def level_at(opts: AgenticOptions, task_id: int) -> int:
    """The curriculum's level for a task: the runner hands `groups_per_step` tasks to each step in id order, so task
    `task_id` trains at step ~ task_id // groups_per_step + 1 (a dropped group moves later tasks one step earlier).
    A function of the task id alone, so a task re-run on a restarted worker gets the same spec."""
    level = opts.level
    for from_step, row_level in opts.curriculum:
        if task_id // opts.groups_per_step + 1 >= int(from_step):
            level = int(row_level)
    return level


def sampler(opts: AgenticOptions, seed: int, split: str = "train"):
    """task_id -> spec: the environment by its ratio, then its task at the curriculum's level; a pure function of
    (seed, task_id). Held-out tasks (split "test") are drawn at `level`."""
    names = [n for n, _ in opts.envs]
    weights = [float(w) for _, w in opts.envs]

    def sample(task_id: int) -> dict:
        rng = random.Random(stable_seed(seed, split, task_id))
        name = rng.choices(names, weights)[0]
        level = level_at(opts, task_id) if split == "train" else opts.level
        return env_class(name).sample(rng, split, level) | {"env": name}  # by path for imported ones

    return sample


def heldout(opts: AgenticOptions, seed: int) -> list[dict]:
    sample = sampler(opts, seed, "test")
    return [sample(i) for i in range(opts.heldout_n)]


def evaluate(worker, specs: list[dict], env: EnvOptions) -> dict:
    """Greedy success on `specs` (one episode each, batched) with `worker`'s weights."""
    greedy = copy.copy(worker.opts)
    greedy.temperature, greedy.routing_replay = 0.0, "off"  # nothing trains on held-out episodes
    from glmstack.posttrain.agentic.data import retry_stats
    from glmstack.posttrain.agentic.episode import run_group

    trajs = run_group(worker.policy, worker.tokenizer, specs, greedy, env, list(range(len(specs))),
                      version=worker.current_version)  # fmt: skip
    out = {"success": sum(t.success for t in trajs) / len(trajs)} | retry_stats(trajs)
    for name in sorted({s["env"] for s in specs}):
        mine = [t for t in trajs if t.spec["env"] == name]
        out[f"success/{name}"] = sum(t.success for t in mine) / len(mine)
    return out


def held_out_eval(cfg: AgenticConfig, model, tokenizer_dir: str):
    """evaluate(state) -> {heldout_success, heldout_success_faults, per env}: the policy's whole state (the trainer's
    current weights) in an in-process worker, without and with injected tool failures (`eval_fault_p`)."""
    from glmstack.posttrain.agentic.worker import RolloutWorker

    o = cfg.agentic
    specs = heldout(o, o.heldout_seed if o.heldout_seed >= 0 else cfg.seed)
    holder: dict = {}

    def run(state: dict) -> dict:
        if "w" not in holder:
            holder["w"] = RolloutWorker(plain_copy(model, state, cpu=True), tokenizer_dir, o.episode, o.env, cfg.seed,
                                        numerics=numerics(cfg))  # fmt: skip
        w = holder["w"]
        w.set_weights(state, -1)
        # held-out episodes fail independently, and without the simulated tool latency (it changes no outcome)
        plain = {**vars(o.env), "crash_p": 0.0, "group_faults": False, "tool_latency_s": 0.0}
        clean = evaluate(w, specs, EnvOptions(**plain | {"fault_p": 0.0}))
        faults = evaluate(w, specs, EnvOptions(**plain | {"fault_p": o.eval_fault_p}))
        return {f"heldout_{k}": v for k, v in clean.items()} | {f"heldout_faults_{k}": v for k, v in faults.items()}

    return run


# ---------------------------------------------------------------------------------------------------- stage
def check(cfg: AgenticConfig) -> None:
    if not isinstance(cfg, AgenticConfig):
        raise ConfigError(f"the agentic-rl stage needs an AgenticConfig (got {type(cfg).__name__})")
    o = cfg.agentic
    if not cfg.init_from:
        raise ConfigError("init_from: agentic RL starts from a chat model folder (with tokenizer.json)")
    for name, ratio in o.envs:
        try:
            env_class(name)
        except ValueError as e:
            raise ConfigError(f"agentic.envs: {e}") from None
        if float(ratio) <= 0:
            raise ConfigError(f"agentic.envs: the ratio of {name} must be > 0")
    steps = [row[0] for row in o.curriculum if isinstance(row, list | tuple) and len(row) == 2]
    if len(steps) != len(o.curriculum) or steps != sorted(steps) or any(int(x) < 1 for x in steps):
        raise ConfigError("agentic.curriculum: rows [from_step, level] with from_step >= 1, by increasing step")
    if o.partial_oversample < 0:
        raise ConfigError(
            f"agentic.partial_oversample={o.partial_oversample}: must be >= 0 (the extra share of groups)"
        )
    if o.env.tool_latency_s < 0 or o.env.tool_latency_sigma < 0:
        raise ConfigError("agentic.env.tool_latency_s and tool_latency_sigma must be >= 0")
    if o.tau < o.sync_every - 1:
        raise ConfigError(f"agentic.tau={o.tau} < sync_every - 1 = {o.sync_every - 1}: every sample would be stale")
    if (o.groups_per_step * o.group_size + (o.teacher_samples if o.teachers else 0)) % cfg.grad_accum:
        raise ConfigError("agentic: groups_per_step × group_size (+ teacher_samples) must split into grad_accum "
                          "micro-batches")  # fmt: skip
    check_teachers(o.teachers, "agentic.teachers", o.teacher_samples, dist.world())
    if o.episode.temperature <= 0:
        raise ConfigError("agentic.episode.temperature must be > 0 (RL samples)")
    if o.rollout_server and (o.episode.temperature != 1.0 or o.episode.top_p < 1.0 or o.episode.top_k):
        raise ConfigError("agentic.rollout_server reports raw log-probs: use agentic.episode.temperature=1, top_p=1, "
                          "top_k=0")  # fmt: skip
    if min(o.workers, o.group_size, o.groups_per_step, o.sync_every, o.inflight) < 1:
        raise ConfigError("agentic: workers, group_size, groups_per_step, sync_every and inflight must be >= 1")
    if o.dynamic_sampling_max < 1:
        raise ConfigError("agentic.dynamic_sampling_max must be >= 1 (groups looked at per batch, × groups_per_step)")
    check_true_on_policy(o)
    bad = o.episode.context.check()
    if bad:
        raise ConfigError("agentic.episode.context: " + "; ".join(bad))
    if o.true_on_policy and o.episode.context.active:  # invariant.attention reads left-padding masks only
        raise ConfigError("agentic.true_on_policy with context management: the trainer's segment masks have no "
                          "batch-invariant attention yet; turn one of them off")  # fmt: skip
    if o.episode.routing_replay != "off" and o.episode.context.active:  # routes are the view's, not the trajectory's
        raise ConfigError("agentic.episode.routing_replay with context management: the engine's routes are of the "
                          "folded view, not of the trained segments; turn one of them off")  # fmt: skip


def make_pool(cfg: AgenticConfig, model, tokenizer_dir: str, state: dict):
    from glmstack.posttrain.agentic.pools import LocalPool, RayPool

    o = cfg.agentic
    args = (plain_copy(model, state, cpu=True), tokenizer_dir, o.episode, o.env, cfg.seed, o.workers, o.group_size)
    server = (o.rollout_server, o.server_model, o.rollout_server_key or None) if o.rollout_server else None
    kw = {"server": server, "weights_dir": o.rollout_weights_dir, "numerics": numerics(cfg)}
    if cfg.runner == "ray":
        return RayPool(*args, address=cfg.ray.address, num_cpus=cfg.ray.num_cpus, threads=cfg.ray.worker_threads,
                       **kw)  # fmt: skip
    return LocalPool(*args, **kw)


def numerics(cfg: AgenticConfig) -> tuple:
    """(invariant, autocast) of the rollout workers: the trainer's under agentic.true_on_policy, else the default."""
    from glmstack.posttrain.rl.stage import trainer_autocast

    return (True, trainer_autocast(cfg)) if cfg.agentic.true_on_policy else (False, None)


def build(cfg: AgenticConfig, model, optimizer, tokenizer_dir: str):
    from glmstack.posttrain.agentic.data import AgenticData
    from glmstack.posttrain.agentic.runner import Runner
    from glmstack.tokenizer import Tokenizer

    o, W = cfg.agentic, dist.world()
    check_model(o.routing_replay, dist.unwrap(model), "agentic.episode.routing_replay")
    if o.groups_per_step % W or (o.groups_per_step // W * o.group_size) % cfg.grad_accum:
        raise ConfigError(
            f"agentic.groups_per_step={o.groups_per_step} (the global batch) must split over {W} ranks, "
            f"each rank's {o.group_size}-trajectory groups into grad_accum={cfg.grad_accum} parts"
        )
    teacher_tok = Tokenizer.load(tokenizer_dir) if o.teachers else None  # the teachers' tasks render their prompts
    data = AgenticData(policy=model, optimizer=optimizer, runner=None, group_size=o.group_size,
                       micro_batches=cfg.grad_accum, sync_every=o.sync_every, temperature=o.episode.temperature,
                       reset=o.reset_optimizer, eval_every=o.eval_every,
                       evaluate=held_out_eval(cfg, model, tokenizer_dir) if o.heldout_n else None,
                       to_server=o.server_lora if o.rollout_server else "",
                       mix=build_mix(cfg, o, "agentic.teachers", teacher_tok, o.episode.chat_style))  # fmt: skip
    data.runner = Runner(make_pool(cfg, model, tokenizer_dir, data.weights()), sampler(o, cfg.seed),
                         groups_per_step=o.groups_per_step // W, group_size=o.group_size, tau=o.tau,
                         workers=o.workers, inflight=o.inflight, asynchronous=o.asynchronous, rank=dist.rank(),
                         world=W, out_of_order=o.partial_rollouts,
                         oversample=o.partial_oversample,
                         max_looked=math.ceil(o.dynamic_sampling_max * (o.groups_per_step // W)) if o.dynamic_sampling
                         else 0)  # fmt: skip
    return data


def run_agentic(cfg: AgenticConfig, stop_at: int | None = None) -> dict:
    """Model and optimiser as every stage builds them, the runner's trajectories as the data, the DIS loss; then
    the final held-out success (agentic_summary.json), plots and an HF model folder."""
    from glmstack.posttrain.rl.dashboard import bitwise_every_step, plot_dashboard
    from glmstack.posttrain.rl.stage import rl_loss
    from glmstack.train.checkpoint import resolve
    from glmstack.train.loop import train
    from glmstack.train.metrics import read_metrics
    from glmstack.train.stage import model_and_optimizer, stage_dir

    check(cfg)
    folder_in = resolve(cfg.init_from, cfg.out_dir)
    if not (folder_in / "tokenizer.json").exists():
        raise ConfigError(f"init_from: {folder_in} has no tokenizer.json (agentic RL needs a chat model folder)")
    model, optimizer = model_and_optimizer(cfg)
    data = build(cfg, model, optimizer, str(folder_in))
    folder = stage_dir(cfg)
    try:
        result = train(model=model, optimizer=optimizer, data=data, cfg=cfg, stage_dir=folder,
                       loss_fn=rl_loss(cfg.agentic), stop_at=stop_at)  # fmt: skip
    finally:
        data.runner.close()
    state = data.weights() if result["stopped"] == "done" else {}  # on every rank: gathering shards is collective
    if dist.rank() == 0 and result["stopped"] == "done":
        if data.evaluate is not None:
            result |= data.evaluate(state)
        result["accepted_trajectories"] = data.runner.trajectories  # rank 0's
        result["trained_tasks"] = [i * dist.world() + dist.rank() for i in data.runner.trained_ids]  # global ids
        result["logp_bitwise_every_step"] = bitwise_every_step(read_metrics(folder / "metrics.jsonl"))
        (folder / "agentic_summary.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        if cfg.log.plots:
            plot_dashboard(folder)
        from glmstack.train.export import export_checkpoint as export
        from glmstack.train.export import stage_tokenizer

        tok = stage_tokenizer(cfg)
        result["model"] = str(export(Path(result["checkpoint"]), folder / "model", tok, cfg.agentic.episode.chat_style))
    return result


def main(argv: list[str] | None = None) -> int:
    from glmstack.stage_cli import main_for

    return main_for("agentic-rl", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
