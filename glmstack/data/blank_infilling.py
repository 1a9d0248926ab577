"""GLM's autoregressive blank infilling (Du et al. 2021, arXiv 2103.10360 §2.1-2.2) as a data transform.

A document x is corrupted: spans are replaced by one mask token each (Part A), and the spans, in a shuffled order,
are appended, each as `<sop> span` predicting `span <eop>` (Part B). Three objectives (§2.2):
- `[MASK]` (blank infilling): span lengths ~ Poisson(lambda = 3) (at least 1), drawn until they cover >= 15% of
  the tokens, placed at random with at least one token between spans;
- `[sMASK]` (sentence level): whole sentences (ending in a `sentence_end_ids` token), drawn until >= 15% is covered;
- `[gMASK]` (document level, generation): one span at the end, its length uniform in [50%, 100%] of the document.
2D positions (§2.2, Figure 2): row 0 = position in the corrupted text (a span's tokens all carry its mask's
position), row 1 = position inside the span (0 in Part A, 1.. in Part B). Loss on Part B only; the model attends
bidirectionally over Part A and causally over Part B through `prefix_len` (glmstack/model/glm_options.py).

    sample = build_sample(doc, spans, mask_id, sop_id, eop_id, rng)   # Figure 2 for one document
    data = BlankInfilling(SyntheticLM(...), BlankConfig(...), vocab_size=V, seq_len=T)   # batches for the loop
    filled = fill_blanks(model, ids_with_masks, cfg, vocab_size=V)     # generation: greedy, blanks left to right

Positions are 0-based (the paper's figure counts from 1). Every draw comes from numpy's Generator seeded with
(seed, batch, row), so the transform is a pure function of the source batch and the loader position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

OBJECTIVES = ("mask", "smask", "gmask")


@dataclass(kw_only=True)
class BlankConfig:
    weights: dict[str, float] = field(default_factory=lambda: {"mask": 1.0})  # objective -> probability per row
    ratio: float = 0.15  # [MASK]/[sMASK]: fraction of the document the spans cover at least
    poisson_lambda: float = 3.0  # [MASK] span length ~ Poisson(lambda), at least 1
    gmask_range: tuple[float, float] = (0.5, 1.0)  # [gMASK] span length / document length, uniform
    sentence_end_ids: list[int] = field(default_factory=list)  # tokens that end a sentence ([sMASK])
    # token ids of [MASK], [sMASK], [gMASK], <sop>, <eop>; None = the top five ids of the vocabulary in that order
    # (synthetic data: SyntheticLM(reserved_ids=5) keeps them out of the text); a real tokenizer: `special_ids`
    ids: list[int] | None = None
    seed: int = 0

    def __post_init__(self):
        bad = sorted(set(self.weights) - set(OBJECTIVES))
        if bad or not self.weights or min(self.weights.values()) < 0 or sum(self.weights.values()) <= 0:
            raise ValueError(f"BlankConfig.weights: objectives {OBJECTIVES} with weights >= 0, got {self.weights}")
        if not 0 < self.ratio < 1 or self.poisson_lambda <= 0:
            raise ValueError(f"BlankConfig: ratio in (0, 1) and poisson_lambda > 0, got {self.ratio}, "
                             f"{self.poisson_lambda}")
        if self.weights.get("smask") and not self.sentence_end_ids:
            raise ValueError("BlankConfig: the smask objective needs sentence_end_ids")

    def special_ids(self, vocab_size: int) -> dict[str, int]:
        ids = self.ids if self.ids is not None else list(range(vocab_size - 5, vocab_size))
        if len(ids) != 5:
            raise ValueError(f"BlankConfig.ids: five ids ([MASK], [sMASK], [gMASK], <sop>, <eop>), got {ids}")
        return dict(zip(("mask", "smask", "gmask", "sop", "eop"), ids))


def special_ids(tokenizer) -> list[int]:
    """[MASK], [sMASK], [gMASK], <sop>, <eop> of a GLM tokenizer, by name (for BlankConfig.ids)."""
    return [tokenizer.token_id(t) for t in ("[MASK]", "[sMASK]", "[gMASK]", "<sop>", "<eop>")]


# ---------------------------------------------------------------------------------------------------- spans


def place_spans(lengths: list[int], n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Non-overlapping [start, end) spans of the given lengths in order, at least one token apart, uniformly
    placed in a document of n tokens (spans that cannot fit are dropped from the end)."""
    while lengths and sum(lengths) + len(lengths) - 1 > n:
        lengths = lengths[:-1]
    slack = n - sum(lengths) - (len(lengths) - 1)  # free tokens beyond the one-token gaps
    places = np.sort(rng.integers(0, slack + 1, size=len(lengths)))
    spans, offset = [], 0
    for place, length in zip(places.tolist(), lengths):
        spans.append((offset + place, offset + place + length))
        offset += length + 1
    return spans


def mask_spans(n: int, rng: np.random.Generator, ratio: float = 0.15, lam: float = 3.0) -> list[tuple[int, int]]:
    """[MASK]: Poisson(lam) lengths (>= 1) until they cover >= ratio * n tokens, placed at random."""
    lengths, goal = [], math.ceil(ratio * n)
    while sum(lengths) < goal:
        lengths.append(max(1, int(rng.poisson(lam))))
    return place_spans(lengths, n, rng)


def sentence_spans(tokens: np.ndarray, end_ids, rng: np.random.Generator, ratio: float = 0.15):
    """[sMASK]: whole sentences (each ends at a token in end_ids, or at the document end), drawn in random order
    until they cover >= ratio of the tokens; returned in document order."""
    ends = np.flatnonzero(np.isin(tokens, list(end_ids))) + 1
    bounds = [0, *[int(e) for e in ends if e < len(tokens)], len(tokens)]
    sentences = list(zip(bounds[:-1], bounds[1:]))
    chosen, covered = [], 0
    for i in rng.permutation(len(sentences)).tolist():
        if covered >= ratio * len(tokens):
            break
        chosen.append(sentences[i])
        covered += sentences[i][1] - sentences[i][0]
    return sorted(chosen)


def gmask_span(n: int, rng: np.random.Generator, lo: float = 0.5, hi: float = 1.0) -> list[tuple[int, int]]:
    """[gMASK]: one span at the end, its length uniform in [lo * n, hi * n] (at least 1, at most n - 1)."""
    length = int(rng.integers(max(1, math.ceil(lo * n)), max(1, min(n - 1, math.floor(hi * n))) + 1))
    return [(n - length, n)]


# ---------------------------------------------------------------------------------------------------- one sample


def build_sample(tokens, spans, mask_id: int, sop_id: int, eop_id: int, rng: np.random.Generator | None = None,
                 shuffle: bool = True) -> dict[str, np.ndarray]:
    """Figure 2 for one document: -> input_ids (L,), labels (L,) (-100 on Part A), position_ids (2, L),
    prefix_len = |Part A|, span_order (the document spans in Part B order); L = n + 2 * len(spans)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    part_a, mask_pos, prev = [], [], 0
    for s, e in spans:
        part_a += tokens[prev:s].tolist()
        mask_pos.append(len(part_a))
        part_a.append(mask_id)
        prev = e
    part_a += tokens[prev:].tolist()
    order = rng.permutation(len(spans)).tolist() if shuffle and rng is not None else list(range(len(spans)))
    ids, labels = list(part_a), [-100] * len(part_a)
    pos, block = list(range(len(part_a))), [0] * len(part_a)
    for k in order:
        span = tokens[spans[k][0]:spans[k][1]].tolist()
        ids += [sop_id, *span]
        labels += [*span, eop_id]
        pos += [mask_pos[k]] * (len(span) + 1)
        block += list(range(1, len(span) + 2))
    return {"input_ids": np.asarray(ids, np.int64), "labels": np.asarray(labels, np.int64),
            "position_ids": np.asarray([pos, block], np.int64), "prefix_len": len(part_a),
            "span_order": [spans[k] for k in order]}


def pad_sample(sample: dict, length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad to `length`: padding is segment 0 (labels -100, positions 0), the sample segment 1."""
    n = len(sample["input_ids"])
    if n > length:
        raise ValueError(f"a blank-infilling sample of {n} tokens does not fit a row of {length}")
    out = {"input_ids": np.full(length, pad_id, np.int64), "labels": np.full(length, -100, np.int64),
           "position_ids": np.zeros((2, length), np.int64), "segment_ids": np.zeros(length, np.int64),
           "prefix_len": np.int64(sample["prefix_len"])}
    out["input_ids"][:n], out["labels"][:n] = sample["input_ids"], sample["labels"]
    out["position_ids"][:, :n], out["segment_ids"][:n] = sample["position_ids"], 1
    return out


def corrupt(tokens: np.ndarray, objective: str, cfg: BlankConfig, ids: dict, rng: np.random.Generator) -> dict:
    """One document under one objective -> build_sample's dict."""
    n = len(tokens)
    if objective == "mask":
        spans = mask_spans(n, rng, cfg.ratio, cfg.poisson_lambda)
    elif objective == "smask":
        spans = sentence_spans(tokens, cfg.sentence_end_ids, rng, cfg.ratio)
    else:
        spans = gmask_span(n, rng, *cfg.gmask_range)
    return build_sample(tokens, spans, ids[objective], ids["sop"], ids["eop"], rng)


def doc_budget(seq_len: int, objective: str, ratio: float) -> int:
    """Document tokens that fit a row of seq_len with one mask and one <sop> token per span: n + 2 * spans <=
    seq_len. [MASK]/[sMASK] stop once ceil(ratio * n) tokens are covered, so they draw at most that many spans
    (each >= 1 token); [gMASK] one."""
    return seq_len - 2 if objective == "gmask" else seq_len - 2 * math.ceil(ratio * seq_len)


# ---------------------------------------------------------------------------------------------------- loader


class BlankInfilling:
    """Wraps a batch iterable of {"input_ids", "labels"} (B, T) rows (a pre-training loader, SyntheticLM): each row
    (T + 1 tokens) is a document, corrupted under an objective drawn by cfg.weights. Yields input_ids, labels,
    segment_ids (B, T), position_ids (B, 2, T), prefix_len (B,). state_dict: the source's + batches transformed."""

    def __init__(self, source, cfg: BlankConfig, *, vocab_size: int, seq_len: int, pad_id: int | None = None):
        self.source, self.cfg, self.seq_len = source, cfg, seq_len
        self.ids = cfg.special_ids(vocab_size)
        self.pad_id = self.ids["eop"] if pad_id is None else pad_id
        self.objectives = list(cfg.weights)
        w = np.asarray([cfg.weights[o] for o in self.objectives], float)
        self.probs = w / w.sum()
        self.position = 0

    def transform(self, batch: dict, index: int) -> dict[str, torch.Tensor]:
        docs = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1).numpy()  # (B, T + 1)
        rows = []
        for r, doc in enumerate(docs):
            rng = np.random.default_rng([self.cfg.seed, index, r])
            objective = self.objectives[int(rng.choice(len(self.objectives), p=self.probs))]
            n = doc_budget(self.seq_len, objective, self.cfg.ratio)
            rows.append(pad_sample(corrupt(doc[:n], objective, self.cfg, self.ids, rng), self.seq_len, self.pad_id))
        return {k: torch.from_numpy(np.stack([row[k] for row in rows])) for k in rows[0]}

    def __iter__(self):
        for batch in self.source:
            out = self.transform(batch, self.position)
            self.position += 1
            yield out

    def state_dict(self) -> dict:
        return {"source": self.source.state_dict(), "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state["source"])
        self.position = int(state["position"])


# ---------------------------------------------------------------------------------------------------- generation


@torch.no_grad()
def fill_blanks(model, ids: list[int], cfg: BlankConfig, *, vocab_size: int, max_span: int = 32) -> dict:
    """Greedy blank infilling: `ids` is Part A with [MASK] / [sMASK] / [gMASK] tokens; the blanks are filled left
    to right, each generated as `<sop> ...` until <eop> (or max_span tokens), with the spans already generated
    kept in Part B (the paper's order at inference). -> {"spans": [[ids] per blank], "filled": ids}.

    Plain full recomputation per token (no KV cache: Part A is bidirectional), for small models and tests."""
    sp = cfg.special_ids(vocab_size)
    blanks = [i for i, t in enumerate(ids) if t in (sp["mask"], sp["smask"], sp["gmask"])]
    device = next(model.parameters()).device
    seq, pos, block, spans = list(ids), list(range(len(ids))), [0] * len(ids), []
    for b in blanks:
        seq, pos, block = seq + [sp["sop"]], pos + [b], block + [1]
        span = []
        while len(span) < max_span:
            out = model(torch.tensor([seq], device=device), position_ids=torch.tensor([[pos, block]], device=device),
                        prefix_len=torch.tensor([len(ids)], device=device))
            nxt = int(out.logits[0, -1].argmax())
            if nxt == sp["eop"]:
                break
            span.append(nxt)
            seq, pos, block = seq + [nxt], pos + [b], block + [block[-1] + 1]
        spans.append(span)
    filled, prev = [], 0
    for b, span in zip(blanks, spans):
        filled += list(ids[prev:b]) + span
        prev = b + 1
    return {"spans": spans, "filled": filled + list(ids[prev:])}
