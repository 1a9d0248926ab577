"""Issue 21: GLM (2021) blank infilling and GLM-130B's stabilisers, each behind a ModelConfig flag.

Figure 2 of arXiv 2103.10360 (0-based positions), the Part A / Part B mask, span sampling statistics, the batch
transform, the generate path against teacher forcing, DeepNorm's block and init, and the embedding-gradient shrink
(exactly a times the unshrunk gradient). The default model's HF parity is tests/parity/test_hf_glm4_moe.py.
"""

import math

import numpy as np
import pytest
import torch

from glmstack.data.blank_infilling import (BlankConfig, BlankInfilling, build_sample, fill_blanks, gmask_span,
                                           mask_spans, sentence_spans)
from glmstack.model import GLM, ModelConfig
from glmstack.model.glm_options import deepnorm_alpha, deepnorm_beta, prefix_lm_mask
from glmstack.train.markov_stream import SyntheticLM

M, S, E = 90, 91, 92  # [MASK], <sop>, <eop> for the hand-made case
X = [11, 12, 13, 14, 15, 16]  # x1 .. x6


def _small(**kw):
    over = dict(num_nextn_predict_layers=0, num_hidden_layers=2, first_k_dense_replace=1, partial_rotary_factor=1.0)
    return GLM(ModelConfig.preset("tiny", **{**over, **kw})).init_weights(seed=0).eval()


def test_figure2_construction():
    """x = [x1..x6], spans {x3} and {x5 x6}; Part B in the order [x5 x6], [x3] (the figure's shuffle)."""
    orders = set()
    for seed in range(20):
        s = build_sample(X, [(2, 3), (4, 6)], M, S, E, np.random.default_rng(seed))
        orders.add(tuple(s["span_order"]))
        if s["span_order"] != [(4, 6), (2, 3)]:
            continue
        assert s["input_ids"].tolist() == [11, 12, M, 14, M, S, 15, 16, S, 13]
        assert s["labels"].tolist() == [-100] * 5 + [15, 16, E, 13, E]
        assert s["position_ids"][0].tolist() == [p - 1 for p in [1, 2, 3, 4, 5, 5, 5, 5, 3, 3]]  # paper: 1-based
        assert s["position_ids"][1].tolist() == [0, 0, 0, 0, 0, 1, 2, 3, 1, 2]
        assert s["prefix_len"] == 5
    assert orders == {((2, 3), (4, 6)), ((4, 6), (2, 3))}  # the order is shuffled, both occur


def test_figure2_mask_and_model_attention():
    """Figure 2(d): Part A (5 tokens) sees all of Part A; Part B sees Part A and its own past."""
    mask = prefix_lm_mask(torch.tensor([5]), 10)[0, 0]
    want = torch.zeros(10, 10, dtype=torch.bool)
    want[:, :5] = True
    for i in range(5, 10):
        want[i, 5 : i + 1] = True
    assert torch.equal(mask, want)
    model = _small(position_2d=True)
    s = build_sample(X, [(2, 3), (4, 6)], M, S, E, shuffle=False)
    ids, pos = torch.from_numpy(s["input_ids"])[None], torch.from_numpy(s["position_ids"])[None]
    run = lambda i: model(i, position_ids=pos, prefix_len=torch.tensor([5])).logits[0]
    base = run(ids)
    later_a, later_b = ids.clone(), ids.clone()
    later_a[0, 3] = 7  # a Part A token changes every Part A output before it (bidirectional)
    later_b[0, 8] = 7  # a Part B token changes nothing before it
    assert not torch.allclose(run(later_a)[0], base[0])
    torch.testing.assert_close(run(later_b)[:8], base[:8])


def test_span_sampling_follows_the_paper():
    rng = np.random.default_rng(0)
    lengths, n = [], 400
    for _ in range(50):
        spans = mask_spans(n, rng)
        covered = sum(e - s for s, e in spans)
        assert covered >= math.ceil(0.15 * n) and all(b[0] > a[1] for a, b in zip(spans, spans[1:]))
        lengths += [e - s for s, e in spans]
    assert 2.9 < np.mean(lengths) < 3.6  # Poisson(3) with zeros raised to 1: mean 3 + e^-3 = 3.05
    for _ in range(50):
        (s, e), = gmask_span(n, rng)
        assert e == n and 0.5 * n <= e - s <= n
    doc = np.array([5, 6, 0, 7, 8, 9, 1, 5, 0, 6, 6, 6, 6, 2])  # sentences end at ids 0, 1, 2
    spans = sentence_spans(doc, [0, 1, 2], rng, 0.15)
    assert sum(e - s for s, e in spans) >= 0.15 * len(doc)
    assert all(s in (0, 3, 7, 9) and e in (3, 7, 9, 14) for s, e in spans)  # whole sentences only


def test_loader_rows_fit_and_resume():
    cfg = BlankConfig(weights={"mask": 0.5, "smask": 0.25, "gmask": 0.25}, sentence_end_ids=list(range(32)), seed=1)
    make = lambda: BlankInfilling(SyntheticLM(vocab_size=133, seq_len=48, batch_size=8, reserved_ids=5), cfg,
                                  vocab_size=133, seq_len=48)
    data = make()
    it = iter(data)
    first = [next(it) for _ in range(3)]
    b = first[0]
    assert b["input_ids"].shape == (8, 48) and b["position_ids"].shape == (8, 2, 48) and b["prefix_len"].shape == (8,)
    for r in range(8):
        a = int(b["prefix_len"][r])
        assert (b["labels"][r, :a] == -100).all() and (b["labels"][r, a:] != -100).any()
        assert (b["input_ids"][r, :a] >= 128).sum() >= 1  # at least one mask token in Part A
    state = data.state_dict()
    nxt = next(it)
    again = make()
    again.load_state_dict(state)
    assert all(torch.equal(nxt[k], v) for k, v in next(iter(again)).items())


def test_fill_blanks_matches_teacher_forcing():
    """The generate path's spans are what the training format's argmax predicts for them (Part B in order)."""
    model, cfg = _small(position_2d=True), BlankConfig()
    sp = cfg.special_ids(512)
    ids = [3, 4, sp["mask"], 9, 10, sp["mask"], 12]
    out = fill_blanks(model, ids, cfg, vocab_size=512, max_span=3)
    assert len(out["spans"]) == 2 and len(out["filled"]) == 5 + sum(map(len, out["spans"]))
    doc, spans, p = [], [], 0
    for t in ids:
        if t == sp["mask"]:
            span = out["spans"][len(spans)]
            spans.append((len(doc), len(doc) + len(span)))
            doc += span
        else:
            doc.append(t)
    assert doc == out["filled"]
    s = build_sample(doc, spans, sp["mask"], sp["sop"], sp["eop"], shuffle=False)
    logits = model(torch.from_numpy(s["input_ids"])[None], position_ids=torch.from_numpy(s["position_ids"])[None],
                   prefix_len=torch.tensor([s["prefix_len"]])).logits[0]
    starts = [len(ids), len(ids) + 1 + len(out["spans"][0])]  # <sop> of each span in Part B
    for (a, e), start in zip(spans, starts):
        assert logits[start : start + e - a].argmax(-1).tolist() == doc[a:e]


def test_embedding_grad_shrink_is_exactly_a_times():
    ids = torch.randperm(512)[:24].view(2, 12)  # unique ids: each embedding row gets one gradient term
    grads, losses = [], []
    for a in (1.0, 0.1):
        model = _small(embedding_grad_shrink=a)
        out = model(ids, labels=ids)
        out.loss.backward()
        grads.append(model.embed_tokens.weight.grad)
        losses.append(out.loss.detach())
    assert torch.equal(losses[0], losses[1])  # same forward value, bit for bit
    assert torch.equal(grads[1], 0.1 * grads[0])


def test_deepnorm_block_and_init():
    n = 2
    model, plain = _small(deepnorm=True), _small()
    beta, alpha = deepnorm_beta(n), deepnorm_alpha(n)
    assert (alpha, beta) == (2.0, 4.0**-1)
    w, w0 = dict(model.named_parameters()), dict(plain.named_parameters())
    for name in ("layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight", "layers.0.mlp.up_proj.weight",
                 "layers.1.mlp.experts.gate_up_proj", "layers.1.mlp.shared_experts.down_proj.weight"):
        torch.testing.assert_close(w[name], beta * w0[name])  # the same draws, scaled
    for name in ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight", "embed_tokens.weight",
                 "layers.1.mlp.gate.weight", "lm_head.weight"):
        assert torch.equal(w[name], w0[name])
    block, x = model.layers[0], torch.randn(1, 5, 64)
    from glmstack.model.rope import rope_cos_sin

    cos, sin = rope_cos_sin(torch.arange(5)[None], 16, 1e4, x.dtype)
    h = block.input_layernorm(alpha * x + block.self_attn(x, cos, sin))  # Post-LN: norm(alpha * x + f(x))
    want = block.post_attention_layernorm(alpha * h + block.mlp(h))
    torch.testing.assert_close(block(x, cos, sin)[0], want)


def test_options_stay_out_of_a_default_config_json():
    default = ModelConfig.preset("tiny")
    assert not {"position_2d", "deepnorm", "embedding_grad_shrink"} & set(default.to_hf())
    opt = ModelConfig.preset("tiny", deepnorm=True, position_2d=True, embedding_grad_shrink=0.1)
    back = ModelConfig.from_hf(opt.to_hf())
    assert back.deepnorm and back.position_2d and back.embedding_grad_shrink == 1.0  # shrink: training-only
    with pytest.raises(Exception, match="position_2d"):
        ModelConfig.preset("tiny", position_2d=True, partial_rotary_factor=0.125)  # rotary dim 2: not two halves


def test_glm2021_recipe_trains_on_the_one_loop(tmp_path):
    from glmstack.recipes import load_config
    from glmstack.train.stage import run

    cfg = load_config("glm2021", "pretrain", [
        "steps=3", "seq_len=32", "micro_batch_size=2", f"out_dir={tmp_path}", "log.progress=false",
        "log.plots=false", "log.val_every=0", "ckpt.every=3", "schedule.warmup_steps=1",
        "schedule.batch_warmup_tokens=0", "schedule.batch_warmup_start_tokens=0"])
    result = run(cfg)
    assert result["stopped"] == "done" and math.isfinite(result["loss"])
    saved = ModelConfig.from_hf(result["checkpoint"])
    assert saved.position_2d and not saved.deepnorm


def test_bad_blank_options_are_one_config_error():
    from glmstack.config import ConfigError
    from glmstack.recipes import load_config

    with pytest.raises(ConfigError, match="data.options.blank_infilling: .*bogus"):
        load_config("glm2021", "pretrain", ['data.options={"blank_infilling": {"weights": {"bogus": 1}}}'])
