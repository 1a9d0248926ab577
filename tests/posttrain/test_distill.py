"""On-policy cross-stage distillation (GLM-5 Eq. 2): the advantage's sign and zero by hand, teacher == student gives
exactly no gradient through the real data stream and loss, and `glmstack distill` runs end to end on the one loop."""

from __future__ import annotations

import json

import pytest
import torch

from glmstack.cli import main as cli
from glmstack.model import load_hf, save_hf
from glmstack.posttrain.rl.distill import Distillation, Teacher, split_counts
from glmstack.posttrain.rl.losses import distill_advantages, policy_loss, token_logprobs
from glmstack.posttrain.rl.stage import RLOptions, rl_loss
from glmstack.posttrain.rl.tasks import make_task


def test_distill_advantage_sign_and_zero():
    logits = torch.randn(1, 3, 11, generator=torch.Generator().manual_seed(0), requires_grad=True)
    tokens, mask = torch.tensor([[4, 7, 2]]), torch.ones(1, 3)
    logp = token_logprobs(logits, tokens)
    teacher = logp.detach() + torch.tensor([[1.0, -1.0, 0.0]])  # likelier / less likely / the same for the teacher
    adv = distill_advantages(teacher, logp)
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, 0.0]]))
    assert not adv.requires_grad and distill_advantages(logp.detach(), logp).abs().max() == 0
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, reduction="token")
    loss.backward()
    with torch.no_grad():
        after = token_logprobs(logits - 0.5 * logits.grad, tokens)
    up, down, same = (after - logp.detach())[0]
    assert up > 0 and down < 0 and same == 0  # the student moves toward the teacher, token by token


def test_split_counts_follow_the_weights():
    assert split_counts(16, [1.0, 1.0]) == [8, 8]
    assert split_counts(10, [3.0, 1.0]) == [8, 2] and sum(split_counts(7, [1, 1, 1])) == 7


def test_teacher_equal_to_student_gives_zero_loss_and_gradient(base_dir, tok):
    student, teacher = load_hf(str(base_dir)), load_hf(str(base_dir)).eval()
    opts = RLOptions(task="toy", samples_per_step=8, curriculum=[[0, 0, 1]], max_new_tokens=4, heldout_n=4,
                     eval_every=0, dynamic_sampling=False)  # fmt: skip
    data = Distillation(model=student, teachers=[(Teacher(model="x", task="toy"), make_task("toy"), teacher)],
                        opts=opts, seed=0, micro_batches=1, tokenizer=tok)  # fmt: skip
    batch = data.make_step()[0]
    assert batch["mask"].sum() > 0 and batch["stats"]["reverse_kl"] == pytest.approx(0.0, abs=1e-5)
    loss, _ = rl_loss(opts)(student, batch, {})
    loss.backward()
    assert loss.item() == 0.0
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in student.parameters())


def test_distill_end_to_end(base_dir, tmp_path, capsys):
    teacher = load_hf(str(base_dir))
    with torch.no_grad():  # a different policy: the embedding rows reshuffled
        teacher.embed_tokens.weight.copy_(teacher.embed_tokens.weight.roll(1, dims=0))
    save_hf(teacher, tmp_path / "earlier" / "rl")  # named as run/stage under out_dir
    teachers = json.dumps([{"model": "earlier/rl", "task": "toy", "weight": 1.0}])
    args = ["distill", "distill_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}",
            "--set", f"distill.teachers={teachers}", "--set", "steps=4", "--set", "rl.eval_every=2",
            "--set", "log.plots=false"]  # fmt: skip
    assert cli(args) == 0
    stage = tmp_path / "tiny" / "distill"
    assert set(json.loads((stage / "distill_summary.json").read_text())) == {"heldout/toy"}
    rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and "heldout/toy" in rows[0] and "heldout/toy" in rows[2]
    assert all(abs(r["reverse_kl"]) > 1e-3 for r in rows)  # a different teacher: log-probs disagree
    assert (stage / "model" / "config.json").exists()
    assert cli(["distill", "eval", str(stage / "model"), "--tasks", "toy", "--n", "4"]) == 0
    assert f"| {stage / 'model'} |" in capsys.readouterr().out


def test_distill_bad_teacher_is_one_line(base_dir, tmp_path, capsys):
    args = ["distill", "distill_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}",
            "--set", 'distill.teachers=[{"model": "x", "task": "nope"}]']  # fmt: skip
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert "distill.teachers[0]: unknown task 'nope'" in err and len(err.splitlines()) == 1
    args[-1] = 'distill.teachers=[{"model": "no/such", "task": "toy"}]'
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert "distill.teachers: model 'no/such' is no HF folder" in err and len(err.splitlines()) == 1


def test_server_teacher_equals_in_process_teacher(base_dir, tok):
    """Teacher log-probs over HTTP (our server's echo + logprobs, the official openai client) equal the in-process
    teacher's, row for row, on the same student rollouts."""
    from glmstack.posttrain.rl.remote import ServerEngine
    from tests.serve_fixture import RunningServer

    opts = RLOptions(task="arithmetic", samples_per_step=4, curriculum=[[0, 0, 1]], max_new_tokens=6, heldout_n=2,
                     eval_every=0, dynamic_sampling=False)  # fmt: skip
    teacher_folder = str(base_dir)
    server = RunningServer(teacher_folder)
    try:
        steps = []
        for teacher in (load_hf(teacher_folder).eval(), ServerEngine(server.url, "tiny", tok)):
            data = Distillation(model=load_hf(str(base_dir)), opts=opts, seed=0, micro_batches=1, tokenizer=tok,
                                teachers=[(Teacher(model="t", task="arithmetic"), make_task("arithmetic", tok),
                                           teacher)])  # fmt: skip
            steps.append(data.make_step()[0])
    finally:
        server.stop()
    local, served = steps
    assert torch.equal(local["input_ids"], served["input_ids"]) and local["mask"].sum() > 0
    torch.testing.assert_close(served["teacher_logp"], local["teacher_logp"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("setting,message", [
    ("rl.curriculum=[[0, 0, 8]]", "rl.curriculum=[[0, 0, 8]]: distillation runs with [[0, 0, 1]]"),
    ("rl.dynamic_sampling=true", "rl.dynamic_sampling=True: distillation runs with False"),
    ('rl.rewards=[["format", 1.0]]', "rl.rewards=[['format', 1.0]]: distillation runs with []"),
])  # fmt: skip
def test_distill_refuses_rl_options_it_would_ignore(base_dir, tmp_path, capsys, setting, message):
    args = ["distill", "distill_tiny", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}",
            "--set", f'distill.teachers=[{{"model": "{base_dir}", "task": "toy"}}]', "--set", setting]  # fmt: skip
    assert cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_distill_needs_no_group_size_divisibility(base_dir, tmp_path):
    """Its group is 1: 6 samples over 2 micro-batches is fine (reasoning RL's group of 8 would refuse it)."""
    from glmstack.config import apply_overrides
    from glmstack.posttrain.rl.distill import check
    from glmstack.recipes.distill_tiny import distill

    cfg = apply_overrides(distill(), [f"init_from={base_dir}", "rl.samples_per_step=6", "grad_accum=2",
                                      f'distill.teachers=[{{"model": "{base_dir}", "task": "toy"}}]'])  # fmt: skip
    check(cfg)


def test_distill_student_on_a_rollout_server_trains_the_served_policy(base_dir, tmp_path):
    """`glmstack rl distill_tiny --set rl.rollout_server=URL`: the student samples on a server that gets its weights
    before every step (posttrain/policy.py), so the run's updates equal the in-process run's and the server ends
    on the exported student's weights (version = steps)."""
    from tests.serve_fixture import rl_here_and_on_server

    teachers = json.dumps([{"model": str(base_dir), "task": "toy"}])
    common = ["--set", f"init_from={base_dir}", "--set", "steps=3", "--set", "rl.eval_every=0", "--set",
              "rl.heldout_n=2", "--set", "log.plots=false", "--set", f"distill.teachers={teachers}", "--set",
              "schedule.warmup_steps=0", "--set", "rl.entropy_coef=0.01"]  # fmt: skip
    rows, version, _ = rl_here_and_on_server("distill_tiny", "distill", base_dir, tmp_path, common)
    assert len(rows["remote"]) == 3 and version == 3
    for a, b in zip(rows["local"], rows["remote"]):
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * a["grad_norm"] and b["staleness_max"] == 0.0
