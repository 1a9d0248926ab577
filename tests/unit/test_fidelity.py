"""Recipe fidelity (issue 25): the training details a forward-parity test cannot see, one test each.
docs/training.md's "Fidelity" table maps each test to the paper's rule."""

import pytest
import torch

from glmstack.config import ConfigError
from glmstack.model import GLM, ModelConfig
from glmstack.optim.schedules import accum_steps, values_at
from glmstack.recipes import load_config, names, recipe_function
from glmstack.train.config import ScheduleConfig
from glmstack.train.loop import _micro_batches, pretrain_loss
from glmstack.train.stage import run

FAST = ["micro_batch_size=2", "seq_len=16", "log.progress=false", "log.plots=false", "log.val_every=0",
        "ckpt.every=0", "schedule.batch_warmup_tokens=0"]


def _lr(cfg, step: int) -> float:
    return cfg.optim.lr * values_at(step, cfg.schedule, stage_steps=cfg.steps)["lr_mult"]


def _continuing_recipes() -> dict:
    """recipe -> (pretrain cfg, midtrain cfg) for every recipe whose mid-training continues its pre-training curve."""
    out = {}
    for name in names():
        try:
            pre, mid = recipe_function(name, "pretrain")(), recipe_function(name, "midtrain")()
        except ConfigError:  # a recipe without both stages
            continue
        if mid.schedule.step_offset:
            out[name] = (pre, mid)
    return out


def test_lr_is_one_curve_across_pretrain_and_midtrain_for_every_recipe():
    recipes = _continuing_recipes()
    assert {"tiny", "speedrun", "glm45_air_8xh100"} <= set(recipes)  # glm5_dsa's later stages have GLM-5's own lr
    for name, (pre, mid) in recipes.items():
        assert mid.schedule.step_offset == pre.steps and mid.optim.lr == pre.optim.lr, name
        for s in (0, 1, mid.steps // 2, mid.steps - 1):  # pre-training's curve, extended, is mid-training's
            assert _lr(mid, s) == pytest.approx(_lr(pre, pre.steps + s), rel=1e-12), (name, s)


def test_optimizer_state_carried_across_stages_or_lr_rewarmed(tmp_path, capsys):
    run(load_config("tiny", "pretrain", FAST + [f"out_dir={tmp_path}", "steps=2"]))
    pre_steps = _adamw_steps(tmp_path / "tiny/pretrain/step_0000002", tmp_path / "pre.pt")
    capsys.readouterr()
    run(load_config("tiny", "midtrain", FAST + [f"out_dir={tmp_path}", "steps=1"]))
    assert "optimizer state: carried from" in capsys.readouterr().out
    mid_steps = _adamw_steps(tmp_path / "tiny/midtrain/step_0000001", tmp_path / "mid.pt")
    assert mid_steps.keys() == pre_steps.keys() and pre_steps
    assert all(mid_steps[k] == pre_steps[k] + 1 for k in pre_steps)  # AdamW continues (one run), not at step 1
    cfg = load_config("tiny", "midtrain", FAST + [f"out_dir={tmp_path}", "steps=1", "run=tiny", "stage=fresh",
                                                  "optim_state=fresh", "log.every=1"])
    run(cfg)
    out = capsys.readouterr().out
    assert "optimizer state: fresh (optim_state=fresh), lr re-warm-up over 10 steps" in out
    lr_logged = float(out.split("| lr ")[1].split()[0])
    assert lr_logged == pytest.approx(_lr(cfg, 0) / cfg.schedule.rewarmup_steps, rel=1e-2)


def _adamw_steps(step_folder, scratch) -> dict[str, float]:
    """AdamW's step count per parameter in a checkpoint's optimizer state (trainer_state/dcp, read whole)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(step_folder / "trainer_state" / "dcp", scratch)
    state = torch.load(scratch, weights_only=False)
    return {k: float(v) for k, v in state.items() if k.startswith("optim/adamw/") and k.endswith("/step")}


def _tiny(**kw) -> GLM:
    return GLM(ModelConfig.preset("tiny", num_nextn_predict_layers=0, **kw)).init_weights(seed=0).train()


def _batches(vocab: int, n: int, B: int = 2, T: int = 16, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, vocab, (B, T + 1), generator=g)
        out.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:].clone()})
    return out


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_lm_loss_under_accumulation_equals_whole_batch():
    model = _tiny()
    a, b = _batches(model.cfg.vocab_size, 2)
    b["labels"][0, 4:] = -100  # micro-batches with different numbers of loss tokens (padding, masked prompts)
    lm_only = lambda m, batch, values: (m(batch["input_ids"], labels=batch["labels"]).lm_loss, {})
    loss, _, _ = _micro_batches(model, iter([a, b]), 2, torch.device("cpu"), None, lm_only, {})
    accumulated = _grads(model)
    model.zero_grad(set_to_none=True)
    whole = model(torch.cat([a["input_ids"], b["input_ids"]]), labels=torch.cat([a["labels"], b["labels"]])).lm_loss
    whole.backward()
    assert loss == pytest.approx(whole.item(), rel=1e-6)
    for name, g in _grads(model).items():
        torch.testing.assert_close(accumulated[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_indexer_gradient_under_accumulation_is_the_micro_batch_mean():
    model = GLM(ModelConfig.preset("tiny-glm5", num_hidden_layers=2, dsa_stage="warmup")).init_weights(seed=0)
    batches = _batches(model.cfg.vocab_size, 2, T=24)
    values = {"mtp_weight": 0.0, "aux_loss_weight": 0.0}
    _micro_batches(model, iter(batches), 2, torch.device("cpu"), None, pretrain_loss, values)
    accumulated = _grads(model)
    assert accumulated and all(".indexer." in n for n in accumulated)  # the warm-up trains only the indexers
    singles = []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        pretrain_loss(model, batch, values)[0].backward()
        singles.append(_grads(model))
    for name, g in accumulated.items():
        torch.testing.assert_close(g, (singles[0][name] + singles[1][name]) / 2, msg=name)


def test_sparse_dsa_stage_balancing_rate_follows_midtraining():
    sparse = recipe_function("glm5_dsa_sparse", "midtrain")()
    for recipe in ("tiny", "glm45_air_8xh100"):  # GLM-4.5's mid-training: bias rate 0 (after the first 15T tokens)
        mid = recipe_function(recipe, "midtrain")()
        assert values_at(0, mid.schedule, stage_steps=mid.steps)["balance_rate"] == 0.0
    assert all(values_at(s, sparse.schedule, stage_steps=sparse.steps)["balance_rate"] == 0.0
               for s in range(sparse.steps))


def test_padding_counts_in_neither_expert_load_nor_aux_loss():
    model = _tiny()
    (batch,) = _batches(model.cfg.vocab_size, 1)
    segments = torch.ones_like(batch["input_ids"])
    segments[1, 10:] = 0  # row 1: 10 tokens, then padding (segment 0, the data contract)
    with torch.no_grad():
        padded = model(batch["input_ids"], segment_ids=segments)
        row0 = model(batch["input_ids"][:1])
        row1 = model(batch["input_ids"][1:, :10])
    torch.testing.assert_close(padded.expert_load, row0.expert_load + row1.expert_load)
    torch.testing.assert_close(padded.aux_loss, (row0.aux_loss + row1.aux_loss) / 2)


def _tokens_when_ramp_ends(sched: ScheduleConfig, tokens_per_micro: int, full_accum: int) -> int:
    consumed = 0
    while (accum := accum_steps(consumed, sched, tokens_per_micro=tokens_per_micro, full_accum=full_accum)) < full_accum:
        consumed += accum * tokens_per_micro
    return consumed


def test_batch_warmup_ramps_over_tokens():
    sched = ScheduleConfig(batch_warmup_start_tokens=16 * 64, batch_warmup_tokens=500 * 64 * 64)
    end = _tokens_when_ramp_ends(sched, tokens_per_micro=64, full_accum=64)
    assert end == pytest.approx(sched.batch_warmup_tokens, rel=0.02)  # a ramp over steps ended at ~62% of it
    air = recipe_function("glm45_air_8xh100", "pretrain")()
    tokens_per_micro, total = air.micro_batch_size * air.seq_len, air.steps * air.micro_batch_size * air.seq_len
    end = _tokens_when_ramp_ends(air.schedule, tokens_per_micro, air.grad_accum)
    # GLM-4.5: 500B of 23T tokens (the last half micro-batch of the ramp rounds up to the full batch early: 4%)
    assert end / (total * air.grad_accum) == pytest.approx(500 / 23_000, rel=0.05)
