"""The MTP layer(s) == transformers' own MTP (`modeling_layers.MtpModel`, what `generate(use_mtp=True)` loads).

transformers finds MTP tensors through the main class's `_keys_to_ignore_on_load_unexpected` patterns, which name
only the released depths (layers 92 / 46); for a tiny checkpoint we point that list at layer num_hidden_layers.
"""

import pytest
import torch

from glmstack.model import GLM, load_hf, save_hf
from glmstack.model.model import cross_entropy
from glmstack.model.mtp import mtp_targets

from hf_helpers import randomise_, shifted_labels, tiny_config

pytest.importorskip("transformers")


def _hf_pair(ours: GLM, folder):
    from transformers import Glm4MoeForCausalLM
    from transformers.modeling_layers import MtpModel

    save_hf(ours, folder)
    main = Glm4MoeForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    n = ours.cfg.num_hidden_layers
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n + d}\..*"
                                               for d in range(ours.cfg.num_nextn_predict_layers)]
    return main, MtpModel.from_pretrained(main).eval()


@pytest.mark.parametrize("depths,case", [(1, "base"), (2, "groups_no_norm_topk"), (1, "tied")])
def test_mtp_matches_transformers(depths, case, tmp_path):
    cfg = tiny_config(case, num_nextn_predict_layers=depths)
    ours = GLM(cfg).init_weights(seed=0)
    randomise_(ours, seed=3)
    ours = load_hf(save_hf(ours, tmp_path / "ours"), dtype=torch.float32)  # also: our own round trip with MTP
    main, mtp = _hf_pair(ours, tmp_path / "ours")
    ids = torch.randint(0, cfg.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    labels = shifted_labels(ids)
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        out = ours(ids, labels=labels)
        hf_hidden = main(ids, output_hidden_states=True).hidden_states[-1]
        torch.testing.assert_close(out.hidden, hf_hidden, atol=1e-5, rtol=0)  # MTP reads the final-normed trunk
        h_ours = h_hf = out.hidden
        for d in range(depths):
            next_ids, labels_d = mtp_targets(ids, labels, d + 1)
            h_ours, logits_ours = ours.mtp_step(d, next_ids, h_ours, pos)
            h_hf = mtp.forward_layer(d, h_hf, pos, None, input_ids=next_ids)
            logits_hf = mtp._project_to_logits(h_hf)
            torch.testing.assert_close(logits_ours, logits_hf, atol=1e-4, rtol=0)
            assert torch.equal(logits_ours.argmax(-1), logits_hf.argmax(-1))
            torch.testing.assert_close(out.mtp_loss[d], cross_entropy(logits_hf, labels_d), atol=1e-5, rtol=0)
