"""The reward-model folder `glmstack rm` writes is a transformers sequence classifier: scores equal ours.

transformers 5 has no Glm4MoeForSequenceClassification; it builds every recent model's one as
`GenericForSequenceClassification` + the model's PreTrainedModel, which is what this test declares. Pooling is
transformers' (the rightmost non-pad token, from config.json's pad_token_id), so right-padded rows of different
lengths check it too; a sharded save (index + several files) must load the same.
"""

from __future__ import annotations

import pytest
import torch

from glmstack.posttrain.rm.model import RewardModel, load_rm, save_rm
from tests.parity.hf_helpers import tiny_config

PAD = 0


def hf_classifier_cls():
    from transformers.modeling_layers import GenericForSequenceClassification
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoePreTrainedModel

    class Glm4MoeForSequenceClassification(GenericForSequenceClassification, Glm4MoePreTrainedModel):
        pass

    return Glm4MoeForSequenceClassification


@torch.no_grad()
def random_rm(case: str) -> RewardModel:
    rm = RewardModel(tiny_config(case)).materialize("cpu")
    state, g = rm.state_dict(), torch.Generator().manual_seed(0)
    for name, t in rm.initial_tensors(seed=3):
        state[name].copy_(t)
    for name, p in rm.named_parameters():  # norms 1 and biases 0 at init would hide a mis-mapped one
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return rm.eval()


@pytest.mark.parametrize("case,shard_bytes", [("base", None), ("groups_no_norm_topk", 20_000)])
def test_transformers_scores_equal_ours(case, shard_bytes, tmp_path, monkeypatch):
    rm = random_rm(case)
    if shard_bytes:  # force save_hf to shard: the score must land in the index too
        from glmstack.model import hf

        save = hf.save_hf
        monkeypatch.setattr("glmstack.posttrain.rm.model.save_hf",
                            lambda m, f, **kw: save(m, f, max_shard_bytes=shard_bytes))  # fmt: skip
    folder = save_rm(rm, tmp_path / "rm", pad_token_id=PAD)
    assert shard_bytes is None or (folder / "model.safetensors.index.json").exists()
    lens = [12, 7, 4]
    ids = torch.randint(1, rm.cfg.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    for i, n in enumerate(lens):
        ids[i, n:] = PAD
    last = torch.tensor(lens) - 1
    hf_model = hf_classifier_cls().from_pretrained(str(folder)).eval()
    with torch.no_grad():
        ours = rm(ids, last, segment_ids=(ids != PAD).long())[0]
        theirs = hf_model(ids).logits.squeeze(-1)
        reloaded = load_rm(folder)(ids, last)[0]
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reloaded, ours, atol=0, rtol=0)
