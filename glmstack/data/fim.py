"""Fill-in-the-middle (Bavarian et al. 2022, arXiv 2207.14255) with GLM's code sentinels.

A code document is, with probability `rate`, cut at two uniformly random CHARACTER positions into
prefix / middle / suffix and rearranged so a left-to-right model learns to infill:
    PSM:          <|code_prefix|> P <|code_suffix|> S <|code_middle|> M
    SPM (v2):     <|code_prefix|> <|code_suffix|> S <|code_middle|> P M     (bigcode "SPM variant 2")
    SPM (glm):    <|code_suffix|> S <|code_prefix|> P <|code_middle|> M     (CodeGeeX4's documented order)
SPM is chosen with probability `spm_rate` (joint PSM+SPM training is the paper's recommendation). The three
parts are tokenised separately, as in the bigcode reference, so no token straddles a cut. GLM's sentinels are
resolved by NAME from the tokenizer because GLM-4.7/5 shifted their ids.

Every random choice comes from a keyed hash of (seed, key), so the transform is reproducible anywhere.

When: at SAMPLING time, in the loader (`ContextFIM`), not when shards are built. The FIM paper (§4.1, "context-
level") and the GLM spec transform the training context, so every epoch and every up-sampled copy of a document
sees a fresh cut: the key is (document key, copy, epoch, offset of the fragment in the document). Shards stay
plain tokens, deterministic for a config. Pre-training windows split at document ends, each code fragment is
detokenised, cut, re-tokenised, and the window is trimmed (or padded, labels -100) back to its length; a
mid-training chunk is transformed whole; best-fit packing keeps ROOM tokens free beside each code chunk for the
sentinels, and what outgrows that is trimmed from the end.

The plain-string helpers (`fim_split`, `format_fim`, `parse_fim`) are for evaluation harnesses and SFT data.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Literal

import numpy as np

from glmstack.data.mixture import unit_hash

PRE, SUF, MID = "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"
FILE_SEP = "<|file_sep|>"


@dataclass(kw_only=True)
class FIMConfig:
    rate: float = 0.5  # fraction of code documents (or repo file fragments) transformed
    spm_rate: float = 0.5  # of those, the fraction in SPM order rather than PSM
    spm_format: Literal["spm_v2", "spm_glm"] = "spm_v2"  # which SPM layout "spm" means
    seed: int = 0  # with (document, copy, epoch, offset), decides everything


def fim_split(text: str, rng: random.Random) -> tuple[str, str, str]:
    """Character-level cut: two uniform positions in [0, len]; an empty middle is allowed."""
    i, j = sorted((rng.randint(0, len(text)), rng.randint(0, len(text))))
    return text[:i], text[i:j], text[j:]


def format_fim(prefix: str, middle: str, suffix: str, mode: str = "psm") -> str:
    """The FIM layout as a string with sentinel names in place (mode: psm | spm_v2 | spm_glm)."""
    if mode == "psm":
        return f"{PRE}{prefix}{SUF}{suffix}{MID}{middle}"
    if mode == "spm_v2":
        return f"{PRE}{SUF}{suffix}{MID}{prefix}{middle}"
    if mode == "spm_glm":
        return f"{SUF}{suffix}{PRE}{prefix}{MID}{middle}"
    raise ValueError(f"unknown FIM mode {mode!r}; expected psm, spm_v2 or spm_glm")


def parse_fim(text: str, mode: str, prefix_len: int | None = None) -> tuple[str, str, str]:
    """Invert `format_fim`. spm_v2 joins prefix and middle, so its split needs `prefix_len`."""
    if mode == "psm":
        head, middle = text[len(PRE) :].rsplit(MID, 1)
        prefix, suffix = head.split(SUF, 1)
        return prefix, middle, suffix
    if mode == "spm_v2":
        suffix, pm = text[len(PRE) + len(SUF) :].rsplit(MID, 1)
        return pm[:prefix_len], pm[prefix_len:], suffix
    if mode == "spm_glm":
        suffix, rest = text[len(SUF) :].split(PRE, 1)
        prefix, middle = rest.rsplit(MID, 1)
        return prefix, middle, suffix
    raise ValueError(f"unknown FIM mode {mode!r}")


def has_sentinel(text: str) -> bool:
    """A text that already contains a sentinel string cannot be FIM-formatted unambiguously: left as is."""
    return PRE in text or SUF in text or MID in text


def doc_key(doc_id: str) -> int:
    """A 64-bit key of a document id (stored per document in the shards)."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8", "replace"), digest_size=8).digest(), "little")


def choose(key, cfg: FIMConfig, part: int = 0) -> tuple[str | None, random.Random]:
    """(mode or None for no FIM, the rng for the cut) for one `key` (a document id, or the loader's
    (document key, copy, epoch, offset) tuple) and repo file fragment `part`."""
    rng = random.Random(int(unit_hash(cfg.seed, "fim-cut", key, part) * 2**53))
    if unit_hash(cfg.seed, "fim", key, part) >= cfg.rate:
        return None, rng
    spm = unit_hash(cfg.seed, "fim-spm", key, part) < cfg.spm_rate
    return (cfg.spm_format if spm else "psm"), rng


def fim_text(text: str, key, cfg: FIMConfig, part: int = 0) -> str:
    """String-level FIM of one document (identity when not selected)."""
    mode, rng = choose(key, cfg, part)
    return text if mode is None or has_sentinel(text) else format_fim(*fim_split(text, rng), mode=mode)


def fim_ids(text: str, key, tokenizer, cfg: FIMConfig, part: int = 0) -> list[int]:
    """Token-level FIM: each part encoded separately, sentinels by name; no end-of-document token added."""
    mode, rng = choose(key, cfg, part)
    if mode is None or has_sentinel(text):
        return tokenizer.encode(text)
    p, m, s = fim_split(text, rng)
    pre, suf, mid = (tokenizer.token_id(t) for t in (PRE, SUF, MID))
    encode_batch = getattr(tokenizer, "encode_batch", None)  # one call for the three parts where offered
    P, M, S = (
        encode_batch([p, m, s]) if encode_batch else (tokenizer.encode(p), tokenizer.encode(m), tokenizer.encode(s))
    )
    if mode == "psm":
        return [pre, *P, suf, *S, mid, *M]
    if mode == "spm_v2":
        return [pre, suf, *S, mid, *P, *M]
    return [suf, *S, pre, *P, mid, *M]


def repo_fim_ids(text: str, key, tokenizer, cfg: FIMConfig) -> list[int]:
    """Repo documents: FIM each file fragment independently (bigcode's fim_split_sample)."""
    pieces = text.split(FILE_SEP)
    out = tokenizer.encode(pieces[0]) if pieces[0] else []
    for k, frag in enumerate(pieces[1:], 1):
        header, nl, body = frag.partition("\n")
        out += tokenizer.encode(FILE_SEP + header + nl) + (fim_ids(body, key, tokenizer, cfg, k) if body else [])
    return out


# tokens kept free beside a packed code chunk: 3 sentinels + re-tokenising at the two cuts. Measured on whole code
# documents of the default corpus with a 4,096-token BPE: +5.4 on average, at most 7. A repo chunk with several
# transformed files can outgrow it (+21 per whole repo document); the excess is trimmed from the end.
ROOM = 8


class ContextFIM:
    """FIM at sampling time over token shards that carry per-document (key, copy, kind) (shards.DOC_DTYPE).

    `fragment` transforms the tokens of one document seen in a training context; `window` does a pre-training
    window (seq_len + 1 tokens) fragment by fragment. Both are pure functions of (shard contents, epoch), so a
    resumed loader sees exactly the cuts it would have seen, on every rank."""

    def __init__(self, shards, cfg: FIMConfig, tokenizer):
        from glmstack.data.shards import KINDS

        if shards.docs is None:
            raise ValueError(f"{shards.folder}: no per-document metadata (*.docs.npy); rebuild with glmstack data")
        self.shards, self.cfg, self.tok = shards, cfg, tokenizer
        self.code, self.repo = KINDS.index("code"), KINDS.index("repo")
        self.eos = shards.eos_id
        kind = shards.docs["kind"]
        # tokens a packer keeps free beside each chunk of each document: ROOM for code and repo, else 0
        self.room = np.where((kind == self.code) | (kind == self.repo), ROOM, 0)

    def fragment(self, doc: int, start: int, toks: np.ndarray, epoch: int) -> np.ndarray:
        """Tokens [start, start + len(toks)) of document `doc`, transformed; the end-of-document token stays
        last. Prose, math, a fragment cut inside a UTF-8 character and a fragment not drawn are returned as is."""
        key, copy, kind = self.shards.docs[doc]
        k = (int(key), int(copy), epoch, start)
        if (kind != self.code and kind != self.repo) or (kind == self.code and choose(k, self.cfg)[0] is None):
            return toks  # not transformed: the stored tokens, without a detokenise/re-tokenise round trip
        ends = start + len(toks) == int(self.shards.doc_len[doc])
        body = toks[:-1] if ends else toks
        text = self.tok.decode(body.tolist())
        if not text or text[0] == "\ufffd" or text[-1] == "\ufffd":
            return toks  # a window edge split a multi-byte character: re-encoding would change the bytes
        ids = fim_ids(text, k, self.tok, self.cfg) if kind == self.code else repo_fim_ids(text, k, self.tok, self.cfg)
        return np.asarray(ids + [self.eos] if ends else ids, dtype=np.int64)

    def chunk(self, doc: int, start: int, toks: np.ndarray, epoch: int) -> np.ndarray:
        """A packed chunk, transformed; what outgrows the room kept for it (`self.room`) is cut from the end."""
        return self.fragment(doc, start, toks, epoch)[: len(toks) + int(self.room[doc])]

    def window(self, begin: int, toks: np.ndarray, epoch: int) -> tuple[np.ndarray, int]:
        """A pre-training window of the token stream starting at `begin`: every document fragment transformed,
        then trimmed to the window's length or padded with <|endoftext|>. Returns (tokens, real length)."""
        sh, end, out = self.shards, begin + len(toks), []
        d = int(np.searchsorted(sh.doc_start, begin, side="right")) - 1
        while d < sh.n_docs and sh.doc_start[d] < end:
            s, e = max(begin, int(sh.doc_start[d])), min(end, int(sh.doc_start[d] + sh.doc_len[d]))
            out.append(self.fragment(d, s - int(sh.doc_start[d]), toks[s - begin : e - begin], epoch))
            d += 1
        flat = np.concatenate(out)[: len(toks)]
        n = len(flat)
        return np.concatenate([flat, np.full(len(toks) - n, self.eos, np.int64)]), n
