"""LoRA under two gloo processes (DDP, FSDP2, expert parallel): the same losses and adapters as one process.

The adapters shard or replicate as their base does: replicated under DDP, sharded per block by FSDP2, split by
expert (with the banks they adapt) under expert parallel. The single-process reference accumulates both ranks'
micro-batches (tests/dist/test_train_dist.py); AdamW, so no Newton–Schulz rounding enters the comparison.
"""

import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from tiny_runs import TINY, free_port

from glmstack.recipes import load_config
from glmstack.train import checkpoint
from glmstack.train.metrics import read_metrics
from glmstack.train.stage import run

pytestmark = pytest.mark.dist
LORA = TINY + ["steps=3", "ckpt.every=0", "optim.muon=false", "optim.lr=3e-3", "lora.enabled=true", "lora.r=4"]


def _worker(rank, world, port, overrides):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    run(load_config("tiny", "pretrain", overrides))
    torch.distributed.destroy_process_group()


def _result(out):
    stage = out / "tiny" / "pretrain"
    adapter = load_file(str(checkpoint.latest(stage) / "adapter_model.safetensors"))
    return [r["loss"] for r in read_metrics(stage / "metrics.jsonl")], adapter


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run(load_config("tiny", "pretrain", LORA + ["grad_accum=2", f"out_dir={out}"]))
    return _result(out)


@pytest.mark.parametrize(
    "mode",
    [["dist.dp=ddp"], ["dist.dp=fsdp"], ["dist.dp=ddp", "dist.expert_parallel=true"],
     ["dist.dp=fsdp", "dist.expert_parallel=true"]],
    ids=["ddp", "fsdp", "ep", "ep-fsdp"],
)  # fmt: skip
def test_two_ranks_match_single_process(tmp_path, reference, mode):
    mp.spawn(_worker, args=(2, free_port(), LORA + mode + [f"out_dir={tmp_path}"]), nprocs=2, join=True)
    losses, adapter = _result(tmp_path)
    ref_losses, ref_adapter = reference
    assert len(losses) == len(ref_losses) == 3
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-5 * abs(b), (losses, ref_losses)
    assert adapter.keys() == ref_adapter.keys()
    for k in adapter:  # the saved adapter is whole (gathered from shards / expert slices) and equal
        torch.testing.assert_close(adapter[k], ref_adapter[k], atol=1e-5, rtol=1e-4, msg=k)


def test_qlora_two_ranks_match_single_process(tmp_path):
    """QLoRA on an INT4 base under DDP: every rank quantizes the same base, the adapters replicate and train as one
    process does."""
    qlora = LORA + ["lora.base_quant=int4", "lora.dropout=0.0"]
    single = tmp_path / "single"
    run(load_config("tiny", "pretrain", qlora + ["grad_accum=2", f"out_dir={single}"]))
    mp.spawn(_worker, args=(2, free_port(), qlora + ["dist.dp=ddp", f"out_dir={tmp_path / 'ddp'}"]), nprocs=2,
             join=True)  # fmt: skip
    (losses, adapter), (ref_losses, ref_adapter) = _result(tmp_path / "ddp"), _result(single)
    assert len(losses) == 3
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-4 * abs(b), (losses, ref_losses)
    for k in ref_adapter:
        torch.testing.assert_close(adapter[k], ref_adapter[k], atol=1e-4, rtol=1e-3, msg=k)
    from glmstack.config import ConfigError

    with pytest.raises(ConfigError, match="does not shard"):
        load_config("tiny", "pretrain", qlora + ["dist.dp=fsdp"])
