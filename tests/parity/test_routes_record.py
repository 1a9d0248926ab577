"""The engine's routing record (inference/routes.py) == the routing of a plain full forward over prompt + response,
per row of a left-padded batch, on the fast path and on the reference path (routing replay, docs/rl.md)."""

import pytest
import torch

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig

STOP = [175, 342, 396, 333, 104]  # tokens this model emits early in some rows (checked below): rows end apart


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.preset("tiny", num_hidden_layers=4, n_routed_experts=16, num_experts_per_tok=4)
    return GLM(cfg).init_weights(seed=0).eval()


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_routes_equal_a_full_forward(model, fast, temperature):
    prompts = [[5, 9, 17, 3, 44, 8, 100], [3, 4], [7, 200, 31, 9]]  # different lengths: rows 1 and 2 left-padded
    engine = Engine(model, fast=fast)
    engine.sync_every = 3  # finished rows keep decoding until a sync: their extra steps must not leak in
    res = engine.generate(
        prompts, max_new_tokens=9, temperature=temperature, seeds=[1, 2, 3], stop_ids=STOP, return_routes=True
    )
    assert len({len(t) for t in res.tokens}) > 1 and res.stats["compactions"] >= 1  # rows ended and left the batch
    L = sum(model.cfg.is_moe_layer(i) for i in range(model.cfg.num_hidden_layers))
    assert len(res.routes) == len(prompts)
    for prompt, toks, routes in zip(prompts, res.tokens, res.routes):
        seq = torch.tensor([prompt + toks])
        assert routes.dtype == torch.int16 and routes.shape == (seq.shape[1] - 1, L, 4)  # vLLM's seq_len - 1
        with torch.no_grad():
            want = model(seq[:, :-1], return_routes=True).routes[0]
        assert torch.equal(routes.long().sort(-1).values, want.sort(-1).values)
