"""posttrain.multiturn.rollout (the report card's and sft-eval's tool conversations): a conversation whose context is
full ends there and is scored as it stands; the rest of the batch goes on (it used to fail the whole card)."""

from __future__ import annotations

import torch

from glmstack.inference import Engine
from glmstack.model import load_hf
from glmstack.posttrain.multiturn import rollout


def test_a_full_context_ends_only_that_conversation(base_dir, tok):
    engine = Engine(load_hf(str(base_dir), dtype=torch.float32), tok)
    ctx = engine.cfg.max_position_embeddings
    long = {"messages": [{"role": "user", "content": "word " * ctx}], "enable_thinking": False}
    short = {"messages": [{"role": "user", "content": "hi"}], "enable_thinking": False}
    trajs = rollout(engine, [short, long], "glm-4.5", max_new_tokens=4)
    assert len(trajs[0].texts) == 1 and trajs[1].texts == [] and trajs[1].messages == []
