"""Multi-rank RL (issue 35): two gloo processes on CPU give the single-process run with the same global batch,
for reasoning RL (`glmstack rl`) and agentic RL (`glmstack agentic-rl`, synchronous runner).

`rl.samples_per_step` is the global batch: each rank takes its contiguous share of the step's groups (the prompts
one process would draw, the seeds of their global row indices), syncs the whole policy into its own rollout engine
(gathered from FSDP2 shards), and pads to one length over all ranks, so the loop weights every micro-batch alike.
The single-process reference accumulates the two ranks' micro-batches (grad_accum doubled): same rows, same
order; with dynamic sampling every round is one global draw split over the ranks, and the kept groups the first
informative ones in global order, as one process keeps them (rollouts.py's docstring). Agentic: `groups_per_step`
is global, rank r runs tasks r, r + 2, ... (runner.py), so the two ranks' groups are the single run's two groups.
"""

import json
import os

import pytest
import torch.multiprocessing as mp
from tiny_runs import free_port

from glmstack.cli import main as glmstack

pytestmark = pytest.mark.dist
BASE = ["steps=3", "rl.samples_per_step=16", "rl.dynamic_sampling=false", "rl.eval_every=0", "rl.heldout_n=4",
        "log.plots=false", "schedule.warmup_steps=0", "optim.ns_dtype=float32"]  # fmt: skip


def _worker(rank, world, port, overrides, command=("rl", "rl_tiny")):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))  # fmt: skip
    import torch

    torch.set_num_threads(1)
    assert glmstack([*command, *_sets(overrides)]) == 0
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def _same_weights(a, b, stage="rl", atol=1e-5):
    """The final checkpoints' tensors (step folders' model.safetensors) agree within atol. Muon's Newton-Schulz runs
    in fp32 here (BASE): in bf16 it turns the two runs' last-bit gradient differences (an all-reduce against an
    accumulation) into 1e-3 weight differences; AdamW's early steps are ~lr * sign(g), so an entry whose gradient is
    at rounding level can still move by a few 1e-6 (measured over 3 steps at lr 3e-3: lm_head 1.5e-6, embedding rows
7.1e-6 with dynamic sampling; every Muon / norm tensor <= 1.2e-7)."""
    from safetensors.torch import load_file

    def last(out):  # a LoRA run's checkpoint is a PEFT adapter folder
        step = max((out / "tiny" / stage).glob("step_*"))
        return load_file(str(next(p for p in (step / "model.safetensors", step / "adapter_model.safetensors")
                                  if p.exists())))  # fmt: skip

    wa, wb = last(a), last(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k].float() - wb[k].float()).abs().max() <= atol, k


def _rows(out_dir, stage="rl"):
    rows = (out_dir / "tiny" / stage / "metrics.jsonl").read_text().splitlines()
    return [json.loads(r) for r in rows]


DYNAMIC = ["rl.dynamic_sampling=true", "rl.oversample_rounds=2", "rl.curriculum=[[0, 0, 4]]"]


LORA = ["lora.enabled=true", "optim.muon=false", "optim.lr=1e-3"]  # issue 37: the rollout copy carries the adapters


def one_and_two_ranks(tmp_path, dp: str, extra: list[str]):
    """`glmstack rl rl_tiny` in one process (grad_accum 2) and on two gloo ranks (grad_accum 1): their out_dirs."""
    single = tmp_path / "single"
    assert glmstack(["rl", "rl_tiny", *_sets([*BASE, *extra, "grad_accum=2", f"out_dir={single}"])]) == 0
    two = tmp_path / "two"
    mp.spawn(_worker, args=(2, free_port(), [*BASE, *extra, "grad_accum=1", f"dist.dp={dp}", f"out_dir={two}"]),
             nprocs=2, join=True)  # fmt: skip
    return single, two


PARTIAL = ["rl.partial_rollouts=true", "rl.tau=1"]  # issue 41: each rank completes its share of the groups


@pytest.mark.parametrize(("dp", "extra"), [("ddp", []), ("fsdp", []), ("ddp", DYNAMIC), ("fsdp", LORA),
                                           ("ddp", [*PARTIAL, "rl.partial_oversample=0"])])  # fmt: skip
def test_two_ranks_equal_one_process_with_the_global_batch(tmp_path, dp, extra):
    single, two = one_and_two_ranks(tmp_path, dp, extra)
    ref, got = _rows(single), _rows(two)
    if extra and extra[0] == DYNAMIC[0]:  # refills ran and kept what one process keeps
        assert any(r["zero_var_frac"] > 0 for r in ref)
        assert [r["kept_informative"] for r in got] == [r["kept_informative"] for r in ref]
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [1, 2, 3]
    for a, b in zip(got, ref):
        assert abs(a["loss"] - b["loss"]) <= 1e-6, (dp, got, ref)  # on-policy GRPO: the loss is −mean(A) ≈ 0
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * b["grad_norm"], (dp, got, ref)
    _same_weights(single, two)
    s1 = json.loads((single / "tiny" / "rl" / "rl_summary.json").read_text())
    s2 = json.loads((two / "tiny" / "rl" / "rl_summary.json").read_text())
    assert s1["heldout_end"] == s2["heldout_end"] and s1["means"]["reward"] == pytest.approx(s2["means"]["reward"])


def test_partial_rollouts_on_two_ranks_keep_disjoint_groups(tmp_path):
    """Over-sampled partial rollouts on 2 ranks: each rank keeps its own groups in flight (drawn from its own slices
    of each step's global draw, saved with its data state) and the run trains its global batch every step."""
    import torch

    out = tmp_path / "two"
    overrides = [*BASE, *PARTIAL, "rl.partial_oversample=1.0", "rl.max_new_tokens=12", "grad_accum=1",
                 "dist.dp=ddp", f"out_dir={out}"]  # fmt: skip
    mp.spawn(_worker, args=(2, free_port(), overrides), nprocs=2, join=True)
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]
    state = max((out / "tiny" / "rl").glob("step_*")) / "trainer_state"
    pending = [torch.load(state / f"rank_{r:05d}.pt", weights_only=False)["data"]["pending"] for r in (0, 1)]
    uids = [{g["uid"] % 2 for g in p} for p in pending]
    assert pending[0] and pending[1] and uids == [{0}, {1}]  # rank r's groups (uid = k * 2 + r): its own slices


@pytest.mark.parametrize("true_on_policy", [False, True])
def test_agentic_two_ranks_train_disjoint_tasks_equal_to_one_process(tmp_path, true_on_policy):
    """Each group's episodes decode in the same batch shapes on one rank as in one process, and a 2-rank all-reduce
    of two micro-batches' gradients adds the same two numbers the accumulation adds (then halves: exact), so the
    updated weights agree within 1e-6 (bitwise on the CPUs tried), with and without the batch-invariant sampler."""
    from tests.posttrain.base import make_base

    base = make_base(tmp_path / "base")
    common = [
        f"init_from={base}",
        'agentic.envs=[["calculator", 1.0]]',
        "agentic.asynchronous=false",
        "agentic.groups_per_step=2",
        "steps=2",
        "dist.dp=ddp",
        "optim.ns_dtype=float32",
        "agentic.entropy_coef=0.01",
        f"agentic.true_on_policy={str(true_on_policy).lower()}",
    ]  # a gradient from every token even where all rewards are equal
    single = tmp_path / "single"
    assert glmstack(["agentic-rl", "agentic_tiny", *_sets([*common, "grad_accum=2", f"out_dir={single}"])]) == 0
    two = tmp_path / "two"
    mp.spawn(_worker, args=(2, free_port(), [*common, "grad_accum=1", f"out_dir={two}"], ("agentic-rl", "agentic_tiny")),
             nprocs=2, join=True)  # fmt: skip
    ref, got = _rows(single, "agentic"), _rows(two, "agentic")
    assert [r["step"] for r in got] == [r["step"] for r in ref] == [1, 2]
    for a, b in zip(got, ref):
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * b["grad_norm"], (got, ref)
        assert abs(a["loss"] - b["loss"]) <= 1e-6, (got, ref)
        assert a["reward"] == pytest.approx(b["reward"]) and b["grad_norm"] > 0, (got, ref)
    _same_weights(single, two, "agentic", atol=1e-6)
    summary = {k: json.loads((d / "tiny" / "agentic" / "agentic_summary.json").read_text()) for k, d in
               (("single", single), ("two", two))}  # fmt: skip
    assert summary["single"]["trained_tasks"] == [0, 1, 2, 3]
    assert summary["two"]["trained_tasks"] == [0, 2]  # rank 0's; rank 1 trained 1 and 3 (same losses as one run)
    assert summary["two"]["accepted_trajectories"] == summary["single"]["accepted_trajectories"] // 2


@pytest.mark.parametrize("dp", ["ddp", "fsdp"])
def test_true_on_policy_two_ranks_equal_one_process_within_1e6(tmp_path, dp):
    """With rl.true_on_policy the sampler is batch-invariant: a rank's half of the rollouts has the log-probs the
    single process gives the same rows, so what is left between the runs is the all-reduce against the
    accumulation."""
    single, two = one_and_two_ranks(tmp_path, dp, ["rl.true_on_policy=true"])
    ref, got = _rows(single), _rows(two)
    assert [(r["loss"], r["logp_diff_frac"]) for r in got] == [(r["loss"], r["logp_diff_frac"]) for r in ref]
    from safetensors.torch import load_file

    wa, wb = (load_file(str(max((d / "tiny" / "rl").glob("step_*")) / "model.safetensors")) for d in (single, two))
    worst = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    print(f"max |w_single - w_two| = {worst:.3g}")
    assert worst <= 1e-6
