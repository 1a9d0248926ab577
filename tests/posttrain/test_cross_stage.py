"""Cross-stage distillation inside another RL stage (rl/teachers.py): agentic RL with `agentic.teachers` trains its
episodes on their group advantage and the teachers' rows on GLM-5 Eq. 2's per-token advantage, scored by the
teacher on exactly the tokens the trainer sees; a teacher equal to the student adds no gradient; the stage runs
end to end over several steps through the CLI; the distill stage's `reward_weight` (general RL's rules) adds
reward − task mean to each row's advantage."""

from __future__ import annotations

import json

import pytest
import torch

from glmstack.cli import main as cli
from glmstack.model import load_hf, save_hf
from glmstack.posttrain.agentic.groups import advantages
from glmstack.posttrain.agentic.stage import build
from glmstack.posttrain.rl.distill import Distillation, Teacher
from glmstack.posttrain.rl.losses import token_logprobs
from glmstack.posttrain.rl.stage import RLOptions, rl_loss
from glmstack.posttrain.rl.tasks import make_task
from glmstack.recipes.agentic_tiny import agentic as tiny
from glmstack.train.stage import model_and_optimizer


def _teacher(base_dir, where):
    """A policy unlike the student: the base with its embedding rows rolled, saved as an HF folder."""
    model = load_hf(str(base_dir))
    with torch.no_grad():
        model.embed_tokens.weight.copy_(model.embed_tokens.weight.roll(1, dims=0))
    save_hf(model, where)
    return load_hf(str(where)).eval()


def _cfg(tmp_path, base_dir, teacher: str):
    cfg = tiny()
    cfg.out_dir, cfg.init_from = str(tmp_path), str(base_dir)
    cfg.agentic.envs = [["roles", 1.0]]
    cfg.agentic.teachers, cfg.agentic.teacher_samples, cfg.agentic.teacher_max_new_tokens = (
        [{"model": teacher, "task": "toy"}], 4, 4)  # fmt: skip
    return cfg


def _agentic_step(cfg, base_dir):
    """(model, data stream, the micro-batches of one agentic step) for `cfg`."""
    model, optimizer = model_and_optimizer(cfg)
    data = build(cfg, model, optimizer, str(base_dir))
    try:
        return model, data, data.make_step()
    finally:
        data.runner.close()


def test_teacher_rows_carry_the_teachers_logprobs_and_episodes_keep_theirs(tmp_path, base_dir):
    teacher = _teacher(base_dir, tmp_path / "earlier" / "rl")
    cfg = _cfg(tmp_path, base_dir, "earlier/rl")
    _model, data, micro = _agentic_step(cfg, base_dir)
    batch = {k: torch.cat([m[k] for m in micro]) for k in ("input_ids", "targets", "mask", "advantages",
                                                            "teacher_logp", "teacher_rows")}  # fmt: skip
    flat = [t for g in data.last_groups for t in g]
    n = len(flat)
    assert batch["teacher_rows"].tolist() == [False] * n + [True] * 4
    torch.testing.assert_close(batch["advantages"][:n], advantages([t.reward for t in flat], 4))
    assert batch["advantages"][n:].abs().sum() == 0  # the teachers' rows: Eq. 2 only
    with torch.no_grad():
        want = token_logprobs(teacher(batch["input_ids"][n:]).logits, batch["targets"][n:], 1.0)
    m = batch["mask"][n:] > 0
    assert m.sum() > 0 and batch["teacher_logp"][:n].abs().sum() == 0
    torch.testing.assert_close(batch["teacher_logp"][n:][m], want[m])
    assert micro[0]["stats"]["teacher_reverse_kl"] != 0.0 and "teacher_reward/toy" in micro[0]["stats"]


def test_a_teacher_equal_to_the_student_adds_no_gradient(tmp_path, base_dir):
    """Same step, same episodes: the mixed batch's gradient equals the episodes' alone when the teacher is the
    student (Eq. 2's advantage is exactly 0 there, and the rows only add to the sample-mean's count)."""
    save_hf(load_hf(str(base_dir)), tmp_path / "same" / "rl")
    cfg = _cfg(tmp_path, base_dir, "same/rl")
    model, _data, micro = _agentic_step(cfg, base_dir)
    batch = {k: torch.cat([m[k] for m in micro]) for k in micro[0] if k not in ("temperature", "stats")}
    batch |= {"temperature": micro[0]["temperature"], "stats": {}}
    rows = batch["teacher_rows"]
    assert micro[0]["stats"]["teacher_reverse_kl"] == pytest.approx(0.0, abs=1e-5)
    loss_fn = rl_loss(cfg.agentic)
    model.zero_grad()
    loss_fn(model, batch, {})[0].backward()
    mixed = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    episodes = {k: (v[~rows] if torch.is_tensor(v) and v.shape[:1] == rows.shape else v) for k, v in batch.items()}
    episodes.pop("teacher_logp"), episodes.pop("teacher_rows")
    (loss_fn(model, episodes, {})[0] * (~rows).sum() / len(rows)).backward()  # sample mean over fewer rows
    alone = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for a, b in zip(mixed, alone):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_agentic_with_a_teacher_end_to_end(tmp_path, base_dir):
    _teacher(base_dir, tmp_path / "earlier" / "rl")
    teachers = json.dumps([{"model": "earlier/rl", "task": "toy"}])
    args = ["agentic-rl", "agentic_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}",
            "--set", f"agentic.teachers={teachers}", "--set", "agentic.teacher_samples=4", "--set", "steps=3",
            "--set", 'agentic.envs=[["roles", 1.0]]']  # fmt: skip
    assert cli(args) == 0
    rows = [json.loads(x) for x in (tmp_path / "tiny" / "agentic" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(abs(r["teacher_reverse_kl"]) > 1e-3 and "teacher_reward/toy" in r for r in rows)
    assert (tmp_path / "tiny" / "agentic" / "model" / "config.json").exists()


def test_bad_agentic_teacher_is_one_line(base_dir, tmp_path, capsys):
    args = ["agentic-rl", "agentic_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}",
            "--set", 'agentic.teachers=[{"model": "x", "task": "nope"}]']  # fmt: skip
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert "agentic.teachers[0]: unknown task 'nope'" in err and len(err.splitlines()) == 1
    args[-1] = 'agentic.teachers=[{"model": "no/such", "task": "toy"}]'
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert "agentic.teachers: model 'no/such' is no HF folder" in err and len(err.splitlines()) == 1


def test_distill_reward_weight_adds_reward_minus_task_mean(base_dir, tok):
    student, teacher = load_hf(str(base_dir)), load_hf(str(base_dir)).eval()
    opts = RLOptions(task="toy", samples_per_step=8, curriculum=[[0, 0, 1]], max_new_tokens=4, heldout_n=4,
                     eval_every=0, dynamic_sampling=False, temperature=2.0)  # fmt: skip
    data = Distillation(model=student, teachers=[(Teacher(model="x", task="toy"), make_task("toy"), teacher)],
                        opts=opts, seed=0, micro_batches=1, tokenizer=tok, reward_weight=0.5)  # fmt: skip
    batch = data.make_step()[0]
    rewards = torch.tensor(data.last_rewards)
    assert rewards.min() < rewards.max()  # a mixed batch: the advantages are not all 0
    torch.testing.assert_close(batch["advantages"], 0.5 * (rewards - rewards.mean()))


def _rl_args(tmp_path, base_dir, teachers: str, *more: str) -> list[str]:
    return ["rl", "rl_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}", "--set",
            f"rl.teachers={teachers}", "--set", "rl.teacher_samples=4", "--set", "rl.teacher_max_new_tokens=4",
            "--set", "log.plots=false", *more]  # fmt: skip


def test_reasoning_rl_batch_has_the_groups_then_the_teachers_rows(tmp_path, base_dir, tok):
    """rl.teachers: the rollout batch keeps its groups' advantages (reward − group mean) and appends the teachers'
    rows, sampled by the rollout policy and scored by the teacher on the trainer's own tensors."""
    from glmstack.posttrain.rl.stage import build as build_rl
    from glmstack.recipes.rl_tiny import rl as rl_tiny

    teacher = _teacher(base_dir, tmp_path / "earlier" / "rl")
    cfg = rl_tiny()
    cfg.out_dir, cfg.init_from, cfg.rl.eval_every = str(tmp_path), str(base_dir), 0
    cfg.rl.teachers, cfg.rl.teacher_samples, cfg.rl.teacher_max_new_tokens = [{"model": "earlier/rl", "task": "toy"}], 4, 4
    model = load_hf(str(base_dir))
    data = build_rl(cfg, model, tok)
    micro = data.make_step()
    batch = {k: torch.cat([m[k] for m in micro]) for k in ("input_ids", "targets", "mask", "advantages",
                                                            "teacher_logp", "teacher_rows", "rollout_logp")}  # fmt: skip
    n = cfg.rl.samples_per_step
    assert batch["teacher_rows"].tolist() == [False] * n + [True] * 4
    assert batch["advantages"][n:].abs().sum() == 0 and batch["advantages"][:n].view(-1, 4).sum(1).abs().max() < 1e-6
    with torch.no_grad():
        want = token_logprobs(teacher(batch["input_ids"][n:]).logits, batch["targets"][n:], 1.0)
    m = batch["mask"][n:] > 0
    assert m.sum() > 0
    torch.testing.assert_close(batch["teacher_logp"][n:][m], want[m])
    with torch.no_grad():  # the rows were sampled by the policy itself: their rollout log-probs are the student's
        own = token_logprobs(model(batch["input_ids"][n:]).logits, batch["targets"][n:], 1.0)
    torch.testing.assert_close(batch["rollout_logp"][n:][m], own[m], atol=1e-4, rtol=0)


def test_a_teachers_thinking_key_sets_the_mode_of_its_prompts(tmp_path, base_dir, tok):
    """A hybrid-thinking model answers on two paths; `thinking` picks the one a teacher's prompts open (True: the
    assistant turn left open for reasoning; unset: the stage's own mode, off here: an empty think block), and the
    two show apart in the metrics."""
    from glmstack.posttrain.rl.stage import build as build_rl
    from glmstack.recipes.rl_tiny import rl as rl_tiny

    _teacher(base_dir, tmp_path / "earlier" / "rl")
    cfg = rl_tiny()
    cfg.out_dir, cfg.init_from, cfg.rl.eval_every = str(tmp_path), str(base_dir), 0
    cfg.rl.teachers = [{"model": "earlier/rl", "task": "tool_answer", "thinking": True},
                       {"model": "earlier/rl", "task": "tool_answer"}]  # fmt: skip
    cfg.rl.teacher_samples, cfg.rl.teacher_max_new_tokens = 4, 4
    micro = build_rl(cfg, load_hf(str(base_dir)), tok).make_step()
    rows = [(m["input_ids"][i], m["mask"][i]) for m in micro for i in range(len(m["mask"])) if m["teacher_rows"][i]]
    prompts = [tok.decode(ids[: int(mask.nonzero()[0]) + 1].tolist()) for ids, mask in rows]  # up to the first trained target
    assert len(prompts) == 4  # two per teacher, in the teachers' order
    assert all(p.endswith("</tool_response><|assistant|>") for p in prompts[:2])
    assert all(p.endswith("</tool_response><|assistant|>\n<think></think>") for p in prompts[2:])
    assert {"teacher_reward/tool_answer:think", "teacher_reward/tool_answer"} <= set(micro[0]["stats"])


@pytest.mark.slow
def test_reasoning_rl_with_a_teacher_end_to_end(tmp_path, base_dir):
    _teacher(base_dir, tmp_path / "earlier" / "rl")
    teachers = json.dumps([{"model": "earlier/rl", "task": "toy"}])
    assert cli(_rl_args(tmp_path, base_dir, teachers, "--set", "steps=3", "--set", "rl.eval_every=0")) == 0
    rows = [json.loads(x) for x in (tmp_path / "tiny" / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all("teacher_reward/toy" in r for r in rows)
    kl = [r["teacher_reverse_kl"] for r in rows]
    assert kl[0] > 1e-3 and kl[-1] < kl[0] / 10  # the student is pulled onto the teacher on the teacher's task


def test_reasoning_rl_teachers_bad_input_is_one_line(tmp_path, base_dir, capsys):
    teachers = json.dumps([{"model": "earlier/rl", "task": "toy"}])
    assert cli(_rl_args(tmp_path, base_dir, teachers, "--set", "rl.teacher_samples=3")) == 2
    err = capsys.readouterr().err.strip()
    assert "rl.teachers: teacher_samples=3 must be >= 1 and split into 2 parts" in err and len(err.splitlines()) == 1
    assert cli(_rl_args(tmp_path, base_dir, teachers, "--set", "rl.routing_replay=record")) == 2
    assert "no recorded routes" in capsys.readouterr().err
    teachers = json.dumps([{"model": "earlier/rl", "task": "toy", "thinking": "yes"}])
    assert cli(_rl_args(tmp_path, base_dir, teachers)) == 2
    assert "rl.teachers[0]: wrong type for thinking" in capsys.readouterr().err
