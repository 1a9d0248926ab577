"""The GPU path, checked against the CPU/fp32 references: what a user on a CUDA machine gets without code changes.

Skipped without CUDA (tests/conftest.py). Run on a GPU machine with `bash bench/device_check.sh` (these tests,
then the benchmarks with MFU), or `python -m pytest -m gpu tests/gpu -q`.
  - the model on CUDA in fp32 == on CPU (TF32 off), and == transformers on CUDA
  - torch._grouped_mm experts (sm90+, bf16) == the per-expert loop in bf16, forward and backward
  - bf16 autocast forward (flash SDPA) agrees with fp32 on most argmaxes
  - compiled blocks (train.stage.compile_blocks) == eager on CUDA
  - Engine greedy == naive recompute on CUDA; MTP speculative == greedy
  - a 3-step pretrain on CUDA (bf16 autocast, compile=auto) logs finite losses and an MFU figure
"""

import copy
import json

import pytest
import torch

from glmstack.model import GLM, ModelConfig

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 comparisons mean fp32: no TF32 matmuls."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _batch(cfg, B=2, T=64, seed=0):
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)
    return ids, labels


def test_cuda_fp32_equals_cpu():
    cpu = GLM(ModelConfig.preset("tiny-moe")).init_weights(seed=0)
    gpu = copy.deepcopy(cpu).to(CUDA)
    ids, labels = _batch(cpu.cfg)
    a, b = cpu(ids, labels=labels), gpu(ids.to(CUDA), labels=labels.to(CUDA))
    torch.testing.assert_close(b.logits.cpu(), a.logits, atol=1e-4, rtol=1e-4)
    a.loss.backward(), b.loss.backward()
    for (n, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-3, msg=n)


def test_cuda_matches_transformers(tmp_path):
    from transformers import Glm4MoeForCausalLM

    from glmstack.model import save_hf

    ours = GLM(ModelConfig.preset("tiny-moe", num_nextn_predict_layers=0)).init_weights(seed=0)
    save_hf(ours, tmp_path)
    hf = Glm4MoeForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).to(CUDA).eval()
    ids, _ = _batch(ours.cfg)
    with torch.no_grad():
        a = ours.to(CUDA)(ids.to(CUDA)).logits
        b = hf(ids.to(CUDA)).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0), reason="grouped GEMM kernel: sm90+"
)
def test_grouped_mm_equals_loop_bf16():
    from glmstack.model.moe import _grouped_mm_kernel_ok, experts_grouped_mm, experts_loop

    torch.manual_seed(0)
    T, D, F, E, K = 512, 256, 128, 16, 4
    x = torch.randn(T, D, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    w1 = (torch.randn(E, 2 * F, D, device=CUDA) / D**0.5).bfloat16().requires_grad_()
    w2 = (torch.randn(E, D, F, device=CUDA) / F**0.5).bfloat16().requires_grad_()
    idx = torch.stack([torch.randperm(E, device=CUDA)[:K] for _ in range(T)])
    w = torch.rand(T, K, device=CUDA)
    assert _grouped_mm_kernel_ok(x)
    outs, grads = [], []
    for fn in (experts_grouped_mm, experts_loop):
        y = fn(x, idx, w, w1, w2)
        g = torch.autograd.grad(y.float().square().sum(), (x, w1, w2))
        outs.append(y.float()), grads.append([t.float() for t in g])
    torch.testing.assert_close(outs[0], outs[1], atol=2e-2, rtol=2e-2)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_bf16_autocast_agrees_with_fp32():
    model = GLM(ModelConfig.preset("tiny-moe")).init_weights(seed=0).to(CUDA).eval()
    ids, _ = _batch(model.cfg)
    ids = ids.to(CUDA)
    with torch.no_grad():
        ref = model(ids).logits
        with torch.autocast("cuda", dtype=torch.bfloat16):
            low = model(ids).logits.float()
    assert (low.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    assert (low - ref).abs().max() < 0.1 * ref.abs().max()


def test_compiled_blocks_equal_eager():
    from glmstack.train.stage import compile_blocks

    eager = GLM(ModelConfig.preset("tiny-moe")).init_weights(seed=0).to(CUDA)
    compiled = copy.deepcopy(eager)
    compile_blocks(compiled)
    ids, labels = _batch(eager.cfg)
    ids, labels = ids.to(CUDA), labels.to(CUDA)
    for _ in range(2):  # the second call runs the compiled graphs
        a, b = eager(ids, labels=labels), compiled(ids, labels=labels)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-4, rtol=1e-4)
    a.loss.backward(), b.loss.backward()
    for (n, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-4, rtol=1e-2, msg=n)


def test_engine_on_cuda_equals_naive_and_speculative_equals_greedy():
    from glmstack.inference import Engine

    model = GLM(ModelConfig.preset("tiny")).init_weights(seed=0).to(CUDA).eval()
    prompt = [5, 17, 300, 2, 9, 41, 7]
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids], device=CUDA)).logits[0, -1].argmax()))
    engine = Engine(model)
    plain = engine.generate([prompt], 12, stop_ids=[]).tokens[0]
    assert plain == ids[len(prompt) :]
    spec = engine.generate([prompt], 12, stop_ids=[], speculative="mtp", draft_k=3).tokens[0]
    assert spec == plain


def test_pretrain_on_cuda_logs_mfu(tmp_path):
    from glmstack.recipes import load_config
    from glmstack.train.stage import run

    overrides = [f"out_dir={tmp_path}", "steps=3", "seq_len=128", "micro_batch_size=4", "log.progress=false",
                 "log.plots=false", "log.val_every=0", "schedule.batch_warmup_tokens=0", "device=cuda"]
    run(load_config("tiny", "pretrain", overrides))
    rows = [json.loads(r) for r in (tmp_path / "tiny" / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert any(k.startswith("mfu") for k in rows[-1]), rows[-1]
