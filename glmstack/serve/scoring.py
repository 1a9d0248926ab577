"""Prompt log-probs for `echo` + `logprobs` (OpenAI's legacy scoring request; lm-eval's log-likelihood tasks, an RL
trainer's teacher log-probs), computed in chunks of positions on the engine thread.

Why chunks: the log-softmax over the vocabulary at every prompt position is T x V floats at once (a 32K prompt at a
151K vocabulary: ~19 GB of fp32); one trunk forward gives the (T, D) hidden states, then the head and log-softmax run
over `chunk` positions at a time, so at most chunk x V logits exist. Why on the engine thread: a scoring request is
admitted like any other job (it holds a running slot; a full queue is a 429), so scoring cannot run beside the
batch without bound (issue 34).

The values are the plain model's (`model(ids).logits` log-softmaxed, as `GLM` computes them in process): lm-eval's
log-likelihoods through the server equal the in-process ones (tests/integration/test_serve_lm_eval.py).

    scores = score_prompt(model, ids, top=1)   # PromptScores(logprobs=[None, -2.3, ...], top=[None, [(id, lp)], ...])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PromptScores:
    """Per prompt position: the token's raw log-prob given those before it, and the `top` most likely tokens there
    with the token itself added (as vLLM returns prompt logprobs); both None at position 0."""

    logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None]


@torch.inference_mode()
def score_prompt(model, ids: list[int], top: int, chunk_elems: int = 2**22) -> PromptScores:
    lm = getattr(model, "language_model", model)  # a vision-language model scores text with its language model
    device = next(lm.parameters()).device
    x_T = torch.tensor(ids, device=device)
    h_TD = lm(x_T[None], lazy_logits=True).hidden[0]
    V = lm.lm_head.weight.shape[0]
    chunk = max(1, chunk_elems // V)
    logprobs: list[float | None] = [None]
    tops: list[list[tuple[int, float]] | None] = [None]
    for c0 in range(0, len(ids) - 1, chunk):
        c1 = min(c0 + chunk, len(ids) - 1)
        logp_CV = torch.log_softmax(lm.lm_head(h_TD[c0:c1]).float(), dim=-1)
        next_C = x_T[c0 + 1 : c1 + 1]
        own_C = logp_CV.gather(-1, next_C[:, None])[:, 0]
        logprobs += own_C.tolist()
        if top:
            best = torch.topk(logp_CV, min(top, V), dim=-1)
            rows = zip(next_C.tolist(), own_C.tolist(), best.indices.tolist(), best.values.tolist())
            tops += [[(t, lp), *zip(i, v)] for t, lp, i, v in rows]
        else:
            tops += [[(t, lp)] for t, lp in zip(next_C.tolist(), own_C.tolist())]
    return PromptScores(logprobs, tops)
