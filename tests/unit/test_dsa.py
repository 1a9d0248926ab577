"""DSA indexer: top-k selection semantics, the two training stages (which parameters get gradient, what the KL
covers), the frozen switch, and IndexShare's layer rule (HF's GlmMoeDsaConfig)."""

import pytest
import torch

from glmstack.model import dsa
from glmstack.model.indexer_loss import attention_target, indexer_kl, topk_recall
from glmstack.model.mla import MLAttention
from glmstack.model.rope import rope_cos_sin


class Cfg:
    hidden_size, num_attention_heads = 32, 4
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim = 16, 12, 8, 6, 10
    index_n_heads, index_head_dim, index_topk = 2, 10, 3


def make(seed=0):
    torch.manual_seed(seed)
    m = MLAttention(Cfg(), 0)
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m


def forward(m, x):
    B, T, _ = x.shape
    cos, sin = rope_cos_sin(torch.arange(T)[None].expand(B, T), Cfg.qk_rope_head_dim, 1e4, x.dtype)
    return m(x, cos, sin)


def grads(m, x):
    m.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    dsa.add_indexer_losses(forward(m, x).square().sum(), m).backward()
    ix = {n for n, p in m.indexer.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    main = {n for n, p in m.named_parameters() if not n.startswith("indexer.") and p.grad is not None}
    return ix, main, x.grad


def test_select_topk_is_causal_and_deterministic():
    scores = torch.randn(2, 6, 6)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()[None].expand(2, 6, 6)
    a, b = dsa.select_topk(scores, mask, 3), dsa.select_topk(scores, mask, 3)
    assert torch.equal(a, b)
    sel = dsa.sparse_mask(a, mask[:, None])
    assert (sel.sum(-1)[:, 0] == torch.tensor([1, 2, 3, 3, 3, 3])).all()  # min(k, allowed) keys per row
    assert not (sel & ~mask[:, None]).any()


@pytest.mark.parametrize("seed", range(5))
def test_select_topk_ties_go_to_the_earliest_key_in_any_layout(seed):
    """Default tie order == a stable descending sort (-0.0 ties +0.0), and left padding only shifts the choice:
    what makes a padded / re-batched row pick the keys it picks alone (issue 24)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(-2, 3, (2, 5, 30), generator=g).float() * 0.5  # many exact ties
    scores[..., ::3] = -scores[..., ::3]  # zeros of both signs
    mask = torch.rand(2, 5, 30, generator=g) < 0.9
    ref = scores.masked_fill(~mask, float("-inf")).sort(dim=-1, descending=True, stable=True).indices[..., :8]
    assert torch.equal(dsa.select_topk(scores, mask, 8), ref)
    pad = torch.zeros(2, 5, 7)
    padded = dsa.select_topk(torch.cat([pad, scores], -1), torch.cat([pad.bool(), mask], -1), 8)
    assert torch.equal(padded - 7, ref)
    assert torch.equal(dsa.select_topk(scores.double(), mask, 8), ref)  # fp64 path: a stable sort


def test_select_mode_gives_indexer_no_gradient():
    m = make()
    ix, main, _ = grads(m, torch.randn(2, 8, Cfg.hidden_size))
    assert ix == set() and main


def test_dense_warmup_trains_indexer_and_keeps_attention_dense():
    m = make()
    x = torch.randn(2, 8, Cfg.hidden_size)
    with torch.no_grad():
        m.indexer.topk = 100
        dense = forward(m, x)
        m.indexer.topk = Cfg.index_topk
    dsa.set_indexer_mode(m, "warmup")
    torch.testing.assert_close(forward(m, x), dense)  # attention is dense during warm-up
    assert m.indexer.last_loss is not None and m.indexer.last_loss > 0
    ix, _, _ = grads(m, x)
    assert ix == {"wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight"}


def test_sparse_stage_detaches_indexer_input():
    """The KL's gradient reaches the indexer but not the layer input; the LM-side gradient is unchanged."""
    m = make()
    x = torch.randn(2, 8, Cfg.hidden_size)
    _, _, gx_select = grads(m, x)
    dsa.set_indexer_mode(m, "sparse", loss_coeff=10.0)
    ix, _, gx_sparse = grads(m, x)
    assert "wq_b.weight" in ix and "weights_proj.weight" in ix
    torch.testing.assert_close(gx_sparse, gx_select)


def test_indexer_gradient_is_coeff_times_kl_gradient_times_backward_scale():
    """(loss · c).backward() scales the indexer's gradient by c, like o_proj's (issue 25: it used to stay put, so
    accumulating n micro-batches gave the indexer n times its share)."""
    m = make()
    dsa.set_indexer_mode(m, "warmup", loss_coeff=0.5)
    x = torch.randn(2, 8, Cfg.hidden_size)
    out = forward(m, x).sum()
    kl = m.indexer.pending_loss
    (0.5 * kl).backward(retain_graph=True)
    want = m.indexer.wq_b.weight.grad.clone()
    m.zero_grad()
    dsa.add_indexer_losses(out, m).backward()
    torch.testing.assert_close(m.indexer.wq_b.weight.grad, want)
    grads_at = {}
    for c in (1.0, 0.25):
        m.zero_grad()
        (dsa.add_indexer_losses(forward(m, x).sum(), m) * c).backward()
        grads_at[c] = (m.indexer.wq_b.weight.grad.clone(), m.o_proj.weight.grad.clone())
    for one, quarter in zip(grads_at[1.0], grads_at[0.25]):
        torch.testing.assert_close(quarter, one * 0.25)


def test_freeze_indexers():
    m = make()
    dsa.set_indexer_mode(m, "sparse")
    dsa.freeze_indexers(m)
    assert m.indexer.mode == "select" and not any(p.requires_grad for p in m.indexer.parameters())
    dsa.freeze_all_but_indexers(m)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("indexer.") for n in trainable)


def test_kl_zero_when_indexer_matches_target():
    T = 5
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    probs = torch.softmax(torch.randn(1, 3, T, T).masked_fill(~mask, float("-inf")), -1)
    p = attention_target(probs)
    assert indexer_kl(probs, p.clamp_min(1e-30).log(), mask).abs() < 1e-5
    assert indexer_kl(probs, torch.zeros(1, T, T), mask) > 0
    assert topk_recall(probs, p.log(), mask, 2) == 1.0


@pytest.mark.parametrize("freq,offset,n,full", [(1, 2, 5, 5), (4, 3, 78, 21)])
def test_index_share_rule_matches_hf(freq, offset, n, full):
    transformers = pytest.importorskip("transformers")
    ours = dsa.indexer_types_from_pattern(n, freq, offset)
    hf = transformers.GlmMoeDsaConfig(num_hidden_layers=n, index_topk_freq=freq, index_skip_topk_offset=offset)
    assert ours == hf.indexer_types and ours.count("full") == full


def test_warmup_raises_recall_of_main_attention_topk():
    """A few dense warm-up steps on one layer: the indexer's top-k finds more of the main attention's top-k."""
    m = make(seed=3)
    dsa.freeze_all_but_indexers(m)
    opt = torch.optim.Adam(m.indexer.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(0)
    x_val = torch.randn(4, 32, Cfg.hidden_size, generator=g)

    def recall():
        dsa.set_indexer_mode(m, "select")
        m.indexer.recall_k = 4
        with torch.no_grad():
            forward(m, x_val)
        m.indexer.recall_k = 0
        return m.indexer.last_recall

    before = recall()
    for _ in range(60):
        dsa.set_indexer_mode(m, "warmup")
        dsa.add_indexer_losses(forward(m, torch.randn(4, 32, Cfg.hidden_size, generator=g)).sum(), m).backward()
        opt.step()
        opt.zero_grad()
    after = recall()
    assert after > before + 0.15, (before, after)
