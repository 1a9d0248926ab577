"""MTP speculative decoding: draft k tokens with the MTP layer(s), verify them in ONE main-model forward.

Why: GLM-4.5 and GLM-5 ship MTP layers so that serving can emit several tokens per main-model forward (GLM-5
reports 2.76 accepted tokens per step with 4 draft steps). The output is exactly what plain decoding gives: greedy
drafts are accepted only when they equal the target argmax, sampled drafts by the rejection rule (accept.py), so the
output distribution is unchanged (tests/parity/test_speculative*.py).

How (DeepSeek-V3 §2.2 MTP; the same recursion as vLLM's MTP / EAGLE drafting). The MTP layer at position t
reads (h_t, x_{t+1}): the main model's final-normed hidden state there (out.hidden) and the NEXT token, and
predicts x_{t+2}. One step:
  1. catch up: feed the MTP layer the positions the main model confirmed since the last step (true h, true x);
     its output at the last one drafts d_1.
  2. depth j = 2..k: feed (g, d_{j-1}) one position further, g = the MTP output hidden at the previous depth;
     depth j uses MTP layer min(j, D) - 1 of the D = num_nextn_predict_layers layers (each keeps its own cache,
     fed with the true positions too).
  3. verify: main forward on [x_last, d_1..d_k] -> p_1..p_{k+1}; accept n drafts, emit d_1..d_n + 1 token.
  4. roll back: the main cache forgets the k - n rejected positions (per row), the MTP caches their k - 1
     drafted positions; the n + 1 confirmed (h, x) pairs are the next step's catch-up input.
Rows accept different n, so rows run at different lengths: the cache keeps per-row lengths.
Stats: mean accepted length per verify step (tau = n + 1) and the acceptance rate at each depth (P(n >= j)).
Randomness (sampling): round 0 (prefill) and each verify round i take the row streams' draw keys of step i, 2k + 1
lanes: lane j < k drafts d_{j+1}, lanes k..2k the k accept tests and the next token (accept.accept_sampled). Rows
run their rounds in lockstep whatever the batch, so a row's sampled output does not depend on the other rows.
Shape legend: B rows, K drafts, T positions, D hidden, V vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from glmstack.inference.accept import accept_greedy, accept_sampled
from glmstack.inference.sampling import probs, sample_from_probs


def lanes(k: int) -> int:
    """Draws one row takes per round: k drafts, k accept tests, the next token."""
    return 2 * k + 1


class _Draft:
    """The MTP side: pending confirmed positions, per-layer catch-up, k recursive draft steps."""

    def __init__(self, run, cfg, cache, params, k: int):
        self.run, self.cache, self.params, self.k = run, cache, params, k
        self.vocab = cfg.vocab_size
        n, D = cfg.num_hidden_layers, cfg.num_nextn_predict_layers
        if D < 1:
            raise ValueError("speculative='mtp' needs a checkpoint with MTP layers (num_nextn_predict_layers >= 1)")
        self.cache_idx = lambda layer: n + layer
        self.layer_of_depth = [min(j, D - 1) for j in range(k)]  # 0-based depth -> MTP layer

    def set_pending(self, h_BTD, next_ids_BT, pos_BT, count: list[int], keep: list[int] | None = None):
        """Confirmed positions not yet fed to the MTP layers: row b's first count[b] columns are valid, and its
        cache keeps keep[b] of them (default all; 0 for finished rows, whose caches must stop growing). Only the
        first max(count) columns are fed (at batch 1 exactly the confirmed ones: nothing to rewind)."""
        T = max(count)
        keep = count if keep is None else keep
        self.h, self.ids, self.pos = h_BTD[:, :T], next_ids_BT[:, :T], pos_BT[:, :T]
        dev = next_ids_BT.device
        # every row drafts from column T - 1: an int (last_only then uses the cache's own mask)
        self.last = T - 1 if min(count) == T else torch.tensor(count, device=dev) - 1
        self.drop = None if min(keep) == T else T - torch.tensor(keep, device=dev)

    def _catch_up(self, layer: int):
        """Feed the pending (h, x) pairs to one MTP layer; -> (hidden, logits) at each row's last valid one."""
        g_BD, logits_BV = self.run.mtp_step(layer, self.ids, self.h, self.pos, self.cache, last_B=self.last)
        if self.drop is not None:  # drop the ragged padding columns
            self.cache.rewind(self.drop, layers=[self.cache_idx(layer)])
        return g_BD, logits_BV

    def _pick(self, logits_BV, key_B):
        ids_N = getattr(self.run, "draft_ids", None)  # logits over a draft vocabulary (FastForward draft_vocab)
        if self.params.greedy:
            best_B = logits_BV.argmax(-1)
            return best_B if ids_N is None else ids_N[best_B], None
        if ids_N is not None:  # q is 0 outside the draft vocabulary: rejection sampling stays exact
            full_BV = logits_BV.new_full((logits_BV.shape[0], self.vocab), float("-inf"))
            logits_BV = full_BV.index_copy_(1, ids_N, logits_BV)
        q_BV = probs(logits_BV, self.params)
        return sample_from_probs(q_BV, key_B), q_BV

    def draft(self, keys_BL=None):
        """-> drafts (B, K), draft probabilities (B, K, V) or None when greedy; keys_BL: this round's draw keys."""
        fed, spec_writes = set(), {}
        last = self.last if isinstance(self.last, int) else self.last[:, None]
        last_pos_B1 = self.pos[:, -1:] if isinstance(last, int) else self.pos.gather(1, last)
        drafts, qs = [], []
        for j, layer in enumerate(self.layer_of_depth):
            if layer not in fed:
                g_new, logits_new = self._catch_up(layer)
                fed.add(layer)
                if j == 0:
                    g_BD, logits_BV = g_new, logits_new
            if j > 0:  # one position further along, fed its own previous draft
                pos_B1 = last_pos_B1 + j
                g_B1D, logits_B1V = self.run.mtp_step(layer, drafts[-1][:, None], g_BD[:, None], pos_B1, self.cache)
                g_BD, logits_BV = g_B1D[:, 0], logits_B1V[:, 0]
                spec_writes[layer] = spec_writes.get(layer, 0) + 1
            d_B, q_BV = self._pick(logits_BV, None if keys_BL is None else keys_BL[:, j])
            drafts.append(d_B)
            qs.append(q_BV)
        for layer, n in spec_writes.items():  # drafted positions never stay in the MTP caches
            self.cache.rewind(n, layers=[self.cache_idx(layer)])
        return torch.stack(drafts, 1), (None if self.params.greedy else torch.stack(qs, 1))


def mtp_decode(
    run, cfg, ids_BP, start_B, cache, rows, params, streams, k: int, stats: dict
) -> Iterator[list[list[int]]]:
    """The speculative loop; yields each row's emitted tokens per verify step (see the module docstring).

    run: fast.FastForward or fast.ReferenceForward (forward -> (logits, hidden); mtp_step -> (hidden, logits)).
    streams: sampling.RowStreams with lanes(k) lanes (None when greedy).
    """
    if k < 1:
        raise ValueError(f"draft_k must be >= 1, got {k}")
    B, P = ids_BP.shape
    main_layers = range(cfg.num_hidden_layers)
    drafter = _Draft(run, cfg, cache, params, k)
    draws = (lambda i: None) if params.greedy else streams.keys  # round i -> (B, 2k + 1) draw keys
    dev = ids_BP.device
    # ---- prefill: the main model over the prompt, first token from its last position
    t0 = time.perf_counter()
    pos_BP = (torch.arange(P, device=dev) - start_B[:, None]).clamp_min(0)
    logits_BPV, hidden_BPD = run.forward(ids_BP, pos_BP, cache, last_only=True)
    x_B = _sample_one(logits_BPV[:, -1], params, draws(0))
    stats["prefill_s"] = time.perf_counter() - t0
    yield rows.push([[t] for t in x_B.tolist()])
    drafter.set_pending(hidden_BPD, torch.cat([ids_BP[:, 1:], x_B[:, None]], 1), pos_BP, [P] * B)
    # ---- draft -> verify -> accept -> roll back
    accepted, depth_hits, steps, rnd, t0 = [], [0] * k, 0, 0, time.perf_counter()
    arange_K1 = torch.arange(k + 1, device=dev)
    while not rows.all_done:
        rnd += 1
        keys_BL = draws(rnd)
        d_BK, q_BKV = drafter.draft(keys_BL)
        pos_BK1 = (cache.lengths(0) - start_B)[:, None] + arange_K1
        logits_BKV, hidden_BKD = run.forward(torch.cat([x_B[:, None], d_BK], 1), pos_BK1, cache)
        if q_BKV is None:
            n_B, x_B = accept_greedy(d_BK, logits_BKV)
        else:
            n_B, x_B = accept_sampled(d_BK, q_BKV, probs(logits_BKV, params), keys_BL[:, k:])
        # finished rows ride along in the batch until all are done; they keep nothing of a step, so their caches
        # and positions stop growing (a row that finished early could otherwise outgrow the preallocated cache)
        active = [b for b in range(B) if rows.active(b)]
        n_list = n_B.tolist()  # the round's one host read of the accept result (free on CPU)
        if len(active) < B:
            n_list = [n if rows.active(b) else 0 for b, n in enumerate(n_list)]
            n_B = torch.tensor(n_list, device=dev)
        drop = [k - n if rows.active(b) else k + 1 for b, n in enumerate(n_list)]
        cache.rewind(drop[0] if len(set(drop)) == 1 else torch.tensor(drop, device=dev), layers=main_layers)
        # the confirmed positions of this step: inputs [x_last, d_1..d_n] whose next tokens are [d_1..d_n, x_new]
        next_BK1 = torch.cat([d_BK, d_BK[:, :1]], 1).scatter(1, n_B[:, None], x_B[:, None])
        count = [n + 1 for n in n_list]
        drafter.set_pending(
            hidden_BKD, next_BK1, pos_BK1, count, [c if rows.active(b) else 0 for b, c in enumerate(count)]
        )
        d_list, x_list = d_BK.tolist(), x_B.tolist()
        for b in active:
            accepted.append(n_list[b] + 1)
            for j in range(n_list[b]):
                depth_hits[j] += 1
        steps += len(active)
        yield rows.push([d_list[b][: n_list[b]] + [x_list[b]] for b in range(B)])
    stats.update(
        decode_s=time.perf_counter() - t0,
        verify_steps=steps,
        mean_accepted_length=sum(accepted) / max(len(accepted), 1),
        acceptance_per_depth=[h / max(steps, 1) for h in depth_hits],
    )


def frequent_tokens(token_ids, n: int) -> torch.Tensor:
    """The n most frequent ids of a sample of text (an int tensor, or lists of ids of any lengths): a draft
    vocabulary for Engine.draft_vocab (FR-Spec, Zhao et al. 2025: most drafted tokens are frequent ones)."""
    if not isinstance(token_ids, torch.Tensor):
        token_ids = [t for seq in token_ids for t in (seq if isinstance(seq, (list, tuple)) else [seq])]
    counts = torch.bincount(torch.as_tensor(token_ids).flatten())
    return counts.topk(min(n, int((counts > 0).sum()))).indices.sort().values


def _sample_one(logits_BV, params, keys_BL):
    return logits_BV.argmax(-1) if params.greedy else sample_from_probs(probs(logits_BV, params), keys_BL[:, 0])
