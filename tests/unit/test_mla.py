"""MLA: the absorbed-weights (MQA-mode) path equals the plain reference, forward and backward; decoding token by
token through a KV cache equals one full forward (with and without DSA); the cache holds the compressed latent."""

import pytest
import torch

from glmstack.inference.kv_cache import KVCache
from glmstack.model.attention import SimpleKVCache
from glmstack.model.mla import MLAttention, apply_rope
from glmstack.model.rope import rope_cos_sin


class Cfg:
    hidden_size, num_attention_heads = 32, 4
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim = 16, 12, 8, 6, 10
    index_n_heads, index_head_dim, index_topk = 2, 10, 4
    rope_theta = 10000.0


def make(seed=0, dsa=True, **kw):
    torch.manual_seed(seed)
    cfg = Cfg()
    for k, v in kw.items():
        setattr(cfg, k, v)
    m = MLAttention(cfg, 0, use_indexer=dsa).double()
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m


def rope(T, offset=0, B=2):
    pos = (torch.arange(T) + offset)[None].expand(B, T)
    return rope_cos_sin(pos, Cfg.qk_rope_head_dim, Cfg.rope_theta, torch.float64)


def qkv(m, T=7):
    x = torch.randn(2, T, Cfg.hidden_size, dtype=torch.float64)
    q_nope, q_rope, ckv, k_rope, _, _ = m.project(x, *rope(T))
    mask = torch.rand(2, 1, T, T) < 0.6
    mask |= torch.eye(T, dtype=torch.bool)  # every row keeps one key
    return q_nope, q_rope, ckv, k_rope, mask


def test_absorbed_equals_plain_forward_and_backward():
    m = make(dsa=False)
    inputs = qkv(m)
    plain = m.attend_plain(*inputs)
    absorbed = m.attend_absorbed(*inputs)
    torch.testing.assert_close(absorbed, plain, atol=1e-10, rtol=1e-10)
    g = torch.randn_like(plain)
    grads_plain = torch.autograd.grad((plain * g).sum(), list(m.parameters()), allow_unused=True, retain_graph=True)
    grads_abs = torch.autograd.grad((absorbed * g).sum(), list(m.parameters()), allow_unused=True)
    for a, b in zip(grads_abs, grads_plain):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dsa", [False, True])
@pytest.mark.parametrize("cache_cls", [SimpleKVCache, lambda: KVCache(2, 16)])
@pytest.mark.parametrize("absorb", [False, True])
def test_decode_with_cache_equals_full_forward(dsa, cache_cls, absorb):
    m = make(dsa=dsa).eval()
    m.absorb = absorb
    T, prompt = 9, 4
    x = torch.randn(2, T, Cfg.hidden_size, dtype=torch.float64)
    with torch.no_grad():
        full = m(x, *rope(T))
        cache = cache_cls()
        outs = [m(x[:, :prompt], *rope(prompt), cache=cache)]
        for t in range(prompt, T):
            outs.append(m(x[:, t : t + 1], *rope(1, offset=t), cache=cache))
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-10, rtol=1e-10)


def test_cache_stores_latent_and_rope_key_only():
    m = make(dsa=True)
    cache = SimpleKVCache()
    with torch.no_grad():
        m(torch.randn(2, 5, Cfg.hidden_size, dtype=torch.float64), *rope(5), cache=cache)
    assert cache.k[0].shape == (2, 1, 5, Cfg.kv_lora_rank)
    assert cache.v[0].shape == (2, 1, 5, Cfg.qk_rope_head_dim + Cfg.index_head_dim)
    assert m.cache_dims() == (Cfg.kv_lora_rank, Cfg.qk_rope_head_dim + Cfg.index_head_dim)


def test_interleaved_rope_is_pairwise_rotation():
    """[evens | odds] layout of a textbook pairwise rotation: dot products at positions (m, n) depend on m - n."""
    x, y = torch.randn(2, 6, dtype=torch.float64)
    def dot(pm, pn):
        cm, sm = rope_cos_sin(torch.tensor([[pm]]), 6, 100.0, torch.float64)
        cn, sn = rope_cos_sin(torch.tensor([[pn]]), 6, 100.0, torch.float64)
        return (apply_rope(x, cm[0, 0, :3], sm[0, 0, :3]) * apply_rope(y, cn[0, 0, :3], sn[0, 0, :3])).sum()
    torch.testing.assert_close(dot(5, 2), dot(13, 10))
    c, s = rope_cos_sin(torch.tensor([[1]]), 6, 100.0, torch.float64)
    rotated = apply_rope(x, c[0, 0, :3], s[0, 0, :3])
    pair0 = torch.stack([rotated[0], rotated[3]])  # first pair lands at positions 0 and R/2
    want = torch.stack([x[0] * c[0, 0, 0] - x[1] * s[0, 0, 0], x[1] * c[0, 0, 0] + x[0] * s[0, 0, 0]])
    torch.testing.assert_close(pair0, want)


def test_sparse_gather_equals_masked_absorbed():
    """Attention over the gathered top-k latents == absorbed attention with the top-k as a mask."""
    from glmstack.model.dsa import select_topk, sparse_mask

    m = make(dsa=False)
    q_nope, q_rope, ckv, k_rope, _ = qkv(m, T=9)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()[None, None]
    topk = select_topk(torch.randn(2, 9, 9), causal[:, 0], 4)  # early rows name future keys: must stay masked
    want = m.attend_absorbed(q_nope, q_rope, ckv, k_rope, sparse_mask(topk, causal))
    got = m.attend_sparse(q_nope, q_rope, ckv, k_rope, topk, causal)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_sdpa_plain_equals_eager_forward_and_backward():
    m = make(dsa=False)
    inputs = qkv(m)
    eager = m.attend_plain(*inputs)
    fused = m.attend_plain(*inputs, sdpa=True)
    torch.testing.assert_close(fused, eager, atol=1e-10, rtol=1e-10)
    g = torch.randn_like(eager)
    params = [p for n, p in m.named_parameters() if n.startswith(("q_", "kv_"))]
    ga = torch.autograd.grad((eager * g).sum(), params, retain_graph=True)
    gb = torch.autograd.grad((fused * g).sum(), params)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
