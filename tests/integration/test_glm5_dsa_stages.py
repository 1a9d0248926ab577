"""The glm5_dsa recipe's stages through the one training loop: dense pre-training, the indexer's dense warm-up
(only indexer tensors move), sparse adaptation (everything moves, the KL is logged), RL's frozen indexer."""

import dataclasses

import torch

from glmstack.model import load_hf
from glmstack.recipes import glm5_dsa
from glmstack.train import checkpoint
from glmstack.train.stage import run, stage_dir


def tiny(cfg, tmp_path, steps):
    cfg.out_dir, cfg.steps, cfg.seq_len, cfg.micro_batch_size = str(tmp_path), steps, 32, 2
    cfg.log = dataclasses.replace(cfg.log, progress=False, plots=False)
    cfg.schedule = dataclasses.replace(cfg.schedule, warmup_steps=0)
    return cfg


def weights(cfg):
    return load_hf(checkpoint.latest(stage_dir(cfg)), dtype=torch.float32).state_dict()


def moved(a, b):
    return {k for k in a if not torch.equal(a[k], b[k])}


def test_dsa_stages(tmp_path):
    pre = tiny(glm5_dsa.pretrain(), tmp_path, 2)
    run(pre)
    w_pre = weights(pre)

    warm = tiny(glm5_dsa.midtrain(), tmp_path, 2)
    result = run(warm)
    w_warm = weights(warm)
    changed = moved(w_pre, w_warm)
    assert changed and all(".indexer." in k for k in changed), sorted(changed)[:5]
    assert any(k.startswith("mtp.") for k in changed)  # the MTP layer's indexer warms up too
    rows = (tmp_path / "glm5_dsa" / "dsa_warmup" / "metrics.jsonl").read_text()
    assert '"indexer_loss"' in rows, result

    sparse = tiny(glm5_dsa.sparse(), tmp_path, 2)
    run(sparse)
    changed = moved(w_warm, weights(sparse))
    assert any(".indexer." in k for k in changed) and any(".q_b_proj." in k for k in changed)

    rl = tiny(glm5_dsa.sparse(), tmp_path, 2)
    rl.stage, rl.init_from, rl.model_overrides = "rl_like", "glm5_dsa/dsa_sparse", dict(glm5_dsa.RL_OVERRIDES)
    run(rl)
    changed = moved(weights(sparse), weights(rl))
    assert changed and not any(".indexer." in k for k in changed)
