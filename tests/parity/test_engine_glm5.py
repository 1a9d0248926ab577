"""The engine on a tiny GLM-5 (MLA + DSA): the same KV-cache protocol carries MLA's latent and rope key.

DSA picks each query's top-k keys by indexer score, and ReLU scores tie exactly (at 0) often in a random tiny
model; torch.topk (the default, as transformers) breaks ties in a shape-dependent way, so a left-padded row can
pick other tied keys than the same row alone, and so can a speculative verify block (a longer, partly masked key
axis). `stable_ties=True` (dsa.select_topk) makes the choice
shape-independent, and then batched and speculative == naive exactly.
"""

import torch

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig

PROMPTS = [[5, 17, 300, 2, 9, 41, 7], [11, 4], [400, 3, 3, 8]]


@torch.inference_mode()
def naive(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_glm5_one_by_one_equals_naive():
    model = GLM(ModelConfig.preset("tiny-glm5")).init_weights(seed=0).eval()
    engine = Engine(model)
    assert engine.fast  # MLA: its attention module as it is, the rest on the fast path
    for p in PROMPTS:
        assert engine.generate([p], 10, stop_ids=[]).tokens[0] == naive(model, p, 10)


def test_glm5_batched_and_speculative_equal_naive_with_stable_ties():
    """Padding and speculative verify blocks change the key-axis shape the top-k sees."""
    model = GLM(ModelConfig.preset("tiny-glm5")).init_weights(seed=0).eval()
    for module in model.modules():
        if hasattr(module, "stable_ties"):
            module.stable_ties = True
    ref = [naive(model, p, 12) for p in PROMPTS]
    engine = Engine(model)
    assert engine.generate(PROMPTS, 12, stop_ids=[]).tokens == ref
    assert engine.generate(PROMPTS, 12, stop_ids=[], speculative="mtp", draft_k=2).tokens == ref
