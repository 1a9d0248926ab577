"""A stage's model built sharded from meta (train/stage.py: build_model) is the unsharded model, bit for bit, and
no rank holds more than its part of it.

Two gloo processes build the `tiny` pretrain model under FSDP2, expert parallel + DDP and expert parallel + FSDP2,
from the seeded init and from an HF checkpoint (`init_from`); rank 0 gathers the full state and compares it with
`GLM.init_weights` / `load_hf` in one process (torch.equal), and each rank reports how many elements it holds.
"""

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, overrides, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from glmstack.recipes import load_config
    from glmstack.train import dist
    from glmstack.train.stage import build_model

    dist.init_from_env("cpu")
    model = build_model(load_config("tiny", "pretrain", overrides), torch.device("cpu"))
    held = sum(t.to_local().numel() if hasattr(t, "to_local") else t.numel() for t in dist.unwrap(model).parameters())
    state = dist.full_state_dict(model)
    if rank == 0:
        torch.save(state, out / "state.pt")
    (out / f"held_{rank}.json").write_text(json.dumps(held))
    dist.barrier()  # a rank leaving while the other still talks aborts gloo
    torch.distributed.destroy_process_group()


def _build_sharded(tmp_path, overrides):
    mp.spawn(_worker, args=(_free_port(), overrides, tmp_path), nprocs=2, join=True)
    held = [json.loads((tmp_path / f"held_{r}.json").read_text()) for r in range(2)]
    return torch.load(tmp_path / "state.pt"), held


MODES = {
    "fsdp": ["dist.dp=fsdp"],
    "ep-ddp": ["dist.dp=ddp", "dist.expert_parallel=true"],
    "ep-fsdp": ["dist.dp=fsdp", "dist.expert_parallel=true"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_sharded_init_is_the_unsharded_init(tmp_path, mode):
    from glmstack.model import GLM, ModelConfig
    from glmstack.recipes import load_config

    cfg = load_config("tiny", "pretrain", MODES[mode])
    reference = GLM(ModelConfig.preset(cfg.model, **cfg.model_overrides)).init_weights(seed=cfg.seed)
    state, held = _build_sharded(tmp_path, MODES[mode])
    expected = reference.state_dict()
    assert set(state) == set(expected)
    assert [k for k in expected if not torch.equal(state[k], expected[k])] == []
    total = sum(p.numel() for p in reference.parameters())
    experts = sum(p.numel() for n, p in reference.named_parameters() if ".experts." in n)
    # FSDP2 shards every tensor over the 2 ranks; expert parallel alone splits only the expert banks
    share = total - experts / 2 if mode == "ep-ddp" else total / 2
    for h in held:
        assert abs(h - share) <= 0.01 * total, (mode, held, share, total)


def test_sharded_load_is_load_hf(tmp_path):
    """init_from an HF folder under expert parallel + FSDP2 gives load_hf's tensors."""
    from glmstack.model import GLM, ModelConfig, load_hf, save_hf
    from glmstack.recipes import load_config

    cfg = load_config("tiny", "pretrain", [])
    source = GLM(ModelConfig.preset(cfg.model, **cfg.model_overrides)).init_weights(seed=123)
    save_hf(source, tmp_path / "ckpt", dtype=torch.bfloat16)  # bf16 on disk, fp32 in training: converted on load
    overrides = MODES["ep-fsdp"] + [f"init_from={tmp_path / 'ckpt'}", "rope_theta=100000"]
    state, held = _build_sharded(tmp_path, overrides)
    expected = load_hf(tmp_path / "ckpt", dtype=torch.float32).state_dict()
    assert [k for k in expected if not torch.equal(state[k], expected[k])] == []
    total = sum(p.numel() for p in source.parameters())
    assert all(abs(h - total / 2) <= 0.01 * total for h in held), (held, total)
