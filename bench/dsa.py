"""Dense causal attention vs DSA (lightning indexer + top-k sparse attention) on CPU, by sequence length.

Why: DSA replaces O(L²) attention of width H·(d_qk + d_v) by an O(L²) indexer of width I·d_I plus O(L·k) attention
(DeepSeek-V3.2 §2). GLM-5's proportions are 64 heads × (256 q·k + 256 v) = 32768 MACs
per (query, key) pair against 32 indexer heads × 128 = 4096, top-k 2048; this bench divides heads and top-k by
`--scale` (default 16: 4 heads, 2 indexer heads, top-k 128) so it runs in about a minute on 1-2 CPU cores.

What is timed, per length (batch 1, fp32, one thread unless --threads):
  dense  MLA in MHA mode (training / prefill): F.scaled_dot_product_attention(is_causal=True) over per-head
         q, k (256) and v (256);
  dsa    the indexer (ReLU scores, head weights, causal mask, torch.topk) and attention over the k selected keys in
         MLA's MQA mode, as DSA is built (DeepSeek-V3.2 §2.1: one gathered latent [c_kv ; k_rope] (512 + 64) per
         selected key, shared by all heads, instead of H per-head keys and values), in query blocks so memory stays
         O(block · L).
Then decode: one new token against T cached positions, both sides in MQA mode (dense: all T latents; DSA: the
indexer over T keys, top-k, k gathered latents), best of 20.
Projections are excluded on both sides (the absorbed W_UK / W_UV products cost per token what decompressing K, V
costs). The FLOP ratio counts multiply-adds of the causal pairs actually computed (dense H·512 per pair; DSA
I·128 per pair + H·(576 + 512) per selected pair); the time ratio is dense / DSA (> 1: DSA is faster).

    python bench/dsa.py                      # 2K..16K, scale 16
    python bench/dsa.py --lengths 2048 4096 --scale 8
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

QK, V, INDEX_DIM = 256, 256, 128  # GLM-5 per-head widths (q·k = 192 nope + 64 rope) and indexer head dim
LATENT, ROPE = 512, 64  # MQA mode: keys are [c_kv ; k_rope] (576), values c_kv (512), shared by all heads


def dense_attention(q_HTd, k_HTd, v_HTd):
    return F.scaled_dot_product_attention(q_HTd[None], k_HTd[None], v_HTd[None], is_causal=True)[0]


def indexer_topk(qi_TIE, ki_TE, w_TI, k: int, q0: int, q1: int):
    """Top-k key indices (Tb, min(k, q1)) for queries [q0, q1): causal, ReLU scores weighted per head."""
    scores_TbIS = torch.relu(torch.einsum("tie,se->tis", qi_TIE[q0:q1], ki_TE[:q1]))
    scores_TbS = torch.einsum("ti,tis->ts", w_TI[q0:q1], scores_TbIS)
    causal = torch.arange(q1)[None, :] > torch.arange(q0, q1)[:, None]
    return scores_TbS.masked_fill(causal, float("-inf")).topk(min(k, q1), dim=-1).indices


def sparse_attention(q_TbHc, kv_TC, idx_TbK, q0: int, scale: float, buf=None):
    """MQA-mode attention of queries [q0, q0+Tb) over their selected latents (future picks masked) -> (Tb, H, C).

    buf: a reused gather buffer; a fresh 75 MB tensor per block costs more in page faults than the gather itself.
    """
    Tb, K = idx_TbK.shape
    buf = buf[: Tb * K] if buf is not None else None
    kv_TbKc = torch.index_select(kv_TC, 0, idx_TbK.reshape(-1), out=buf).view(Tb, K, -1)  # shared by all heads
    logits_TbHK = torch.bmm(q_TbHc, kv_TbKc.transpose(1, 2)) * scale
    future = (idx_TbK > torch.arange(q0, q0 + Tb)[:, None])[:, None]
    probs_TbHK = logits_TbHK.masked_fill(future, float("-inf")).softmax(-1)
    return torch.bmm(probs_TbHK, kv_TbKc[..., :LATENT])


def dsa_attention(q_THc, kv_TC, qi_TIE, ki_TE, w_TI, k: int, block: int = 256):
    T, scale = q_THc.shape[0], QK**-0.5
    buf = kv_TC.new_empty(block * min(k, T), kv_TC.shape[1])
    outs = []
    for q0 in range(0, T, block):
        q1 = min(q0 + block, T)
        idx_TbK = indexer_topk(qi_TIE, ki_TE, w_TI, k, q0, q1)
        outs.append(sparse_attention(q_THc[q0:q1], kv_TC, idx_TbK, q0, scale, buf))
    return torch.cat(outs, dim=0)


def flops(T: int, H: int, I: int, k: int) -> tuple[float, float]:
    """Multiply-adds over causal pairs: dense H·(QK+V) per pair; DSA I·E per pair + H·(C+R + C) per selected pair."""
    pairs = T * (T + 1) / 2
    selected = sum(min(k, t + 1) for t in range(T))
    return H * (QK + V) * pairs, I * INDEX_DIM * pairs + H * (2 * LATENT + ROPE) * selected


def inputs(T: int, H: int, I: int, seed: int = 0):
    """Dense per-head q, k, v; MQA-mode absorbed queries and latents; indexer q, k and head weights."""
    g = torch.Generator().manual_seed(seed)
    q, kk, v = (torch.randn(H, T, d, generator=g) for d in (QK, QK, V))
    q_lat = torch.randn(T, H, LATENT + ROPE, generator=g)
    kv = torch.randn(T, LATENT + ROPE, generator=g)
    qi = torch.randn(T, I, INDEX_DIM, generator=g) * INDEX_DIM**-0.5
    ki = torch.randn(T, INDEX_DIM, generator=g)
    w = torch.randn(T, I, generator=g)
    return (q, kk, v), (q_lat, kv), (qi, ki, w)


def timed(fn, repeats: int, *args) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def dense_decode(q_Hc, kv_TC):
    """One decode query over all T cached latents in MQA mode (absorbed MLA, what serving runs) -> (H, C)."""
    probs_HT = (q_Hc @ kv_TC.T * QK**-0.5).softmax(-1)
    return probs_HT @ kv_TC[:, :LATENT]


def dsa_decode(q_Hc, kv_TC, qi_IE, ki_TE, w_I, k: int):
    """One decode query: indexer over all T keys, top-k, attention over the k gathered latents -> (H, C)."""
    scores_T = w_I @ torch.relu(qi_IE @ ki_TE.T)
    kv_KC = kv_TC.index_select(0, scores_T.topk(min(k, kv_TC.shape[0])).indices)
    return dense_decode(q_Hc, kv_KC)


def decode_rows(lengths, H: int, I: int, k: int, repeats: int = 20):
    """Per-token decode time at each context length (1 query, absorbed MQA mode both sides)."""
    print(f"decode, one token, ms:\n{'T':>6} {'dense ms':>9} {'dsa ms':>9} {'time ratio':>10} {'flop ratio':>10}")
    for T in lengths:
        _, (q_lat, kv), (qi, ki, w) = inputs(T, H, I)
        args = (q_lat[-1], kv)
        t_dense = timed(dense_decode, repeats, *args) * 1e3
        t_dsa = timed(dsa_decode, repeats, *args, qi[-1], ki, w[-1], k) * 1e3
        flop_ratio = H * (2 * LATENT + ROPE) * T / (I * INDEX_DIM * T + H * (2 * LATENT + ROPE) * min(k, T))
        print(f"{T:>6} {t_dense:>9.3f} {t_dsa:>9.3f} {t_dense / t_dsa:>10.2f} {flop_ratio:>10.2f}", flush=True)


def check_dense_equivalence(H: int, I: int):
    """With k >= T the MQA-mode DSA path must equal dense causal MQA attention (guards the timed code)."""
    _, (q_lat, kv), idx = inputs(300, H, I, seed=1)
    k_, v_ = kv[None, None].expand(1, H, -1, -1), kv[None, None, :, :LATENT].expand(1, H, -1, -1)
    dense = F.scaled_dot_product_attention(q_lat.transpose(0, 1)[None], k_, v_, is_causal=True, scale=QK**-0.5)
    torch.testing.assert_close(dsa_attention(q_lat, kv, *idx, k=300, block=64), dense[0].transpose(0, 1),
                               atol=1e-4, rtol=1e-4)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--scale", type=int, default=16, help="divide GLM-5's heads, indexer heads and top-k by this")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    H, I, k = 64 // args.scale, 32 // args.scale, 2048 // args.scale
    check_dense_equivalence(H, I)
    print(f"heads {H} x (qk {QK} + v {V}), indexer {I} x {INDEX_DIM}, top-k {k}, threads {args.threads}")
    print(f"prefill (causal, all T queries), s:\n{'T':>6} {'dense s':>9} {'dsa s':>9} {'time ratio':>10} "
          f"{'flop ratio':>10} {'time/flop':>9}")
    with torch.no_grad():
        for T in args.lengths:
            mha, (q_lat, kv), idx = inputs(T, H, I)
            repeats = 2 if T <= 4096 else 1
            t_dense = timed(dense_attention, repeats, *mha)
            t_dsa = timed(dsa_attention, repeats, q_lat, kv, *idx, k)
            f_dense, f_dsa = flops(T, H, I, k)
            speedup, flop_ratio = t_dense / t_dsa, f_dense / f_dsa
            print(f"{T:>6} {t_dense:>9.3f} {t_dsa:>9.3f} {speedup:>10.2f} {flop_ratio:>10.2f} "
                  f"{speedup / flop_ratio:>9.2f}", flush=True)
        decode_rows(args.lengths, H, I, k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
