"""Fill-in-the-middle (Bavarian et al. 2022, arXiv 2207.14255) with GLM's code sentinels.

A code document is, with probability `rate`, cut at two uniformly random CHARACTER positions into
prefix / middle / suffix and rearranged so a left-to-right model learns to infill:
    PSM:          <|code_prefix|> P <|code_suffix|> S <|code_middle|> M
    SPM (v2):     <|code_prefix|> <|code_suffix|> S <|code_middle|> P M     (bigcode "SPM variant 2")
    SPM (glm):    <|code_suffix|> S <|code_prefix|> P <|code_middle|> M     (CodeGeeX4's documented order)
SPM is chosen with probability `spm_rate` (joint PSM+SPM training is the paper's recommendation). The three
parts are tokenised separately, as in the bigcode reference, so no token straddles a cut. GLM's sentinels are
resolved by NAME from the tokenizer because GLM-4.7/5 shifted their ids.

Every random choice comes from a hash of (seed, document id), so the transform is reproducible anywhere.
The plain-string helpers (`fim_split`, `format_fim`, `parse_fim`) are for evaluation harnesses and SFT data.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from glmstack.data.mixture import unit_hash

PRE, SUF, MID = "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"
FILE_SEP = "<|file_sep|>"


@dataclass(kw_only=True)
class FIMConfig:
    rate: float = 0.5  # fraction of code documents (or repo file fragments) transformed
    spm_rate: float = 0.5  # of those, the fraction in SPM order rather than PSM
    spm_format: Literal["spm_v2", "spm_glm"] = "spm_v2"  # which SPM layout "spm" means
    seed: int = 0  # with the document id, decides everything


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


def choose(doc_id: str, cfg: FIMConfig, part: int = 0) -> tuple[str | None, random.Random]:
    """(mode or None for no FIM, the rng for the cut) for one document (or repo fragment `part`)."""
    rng = random.Random(int(unit_hash(cfg.seed, "fim-cut", doc_id, part) * 2**53))
    if unit_hash(cfg.seed, "fim", doc_id, part) >= cfg.rate:
        return None, rng
    spm = unit_hash(cfg.seed, "fim-spm", doc_id, part) < cfg.spm_rate
    return (cfg.spm_format if spm else "psm"), rng


def fim_text(text: str, doc_id: str, cfg: FIMConfig, part: int = 0) -> str:
    """String-level FIM of one document (identity when not selected)."""
    mode, rng = choose(doc_id, cfg, part)
    return text if mode is None or has_sentinel(text) else format_fim(*fim_split(text, rng), mode=mode)


def fim_ids(text: str, doc_id: str, tokenizer, cfg: FIMConfig, part: int = 0) -> list[int]:
    """Token-level FIM: each part encoded separately, sentinels by name; no end-of-document token added."""
    mode, rng = choose(doc_id, cfg, part)
    if mode is None or has_sentinel(text):
        return tokenizer.encode(text)
    p, m, s = fim_split(text, rng)
    pre, suf, mid = (tokenizer.token_id(t) for t in (PRE, SUF, MID))
    P, M, S = tokenizer.encode(p), tokenizer.encode(m), tokenizer.encode(s)
    if mode == "psm":
        return [pre, *P, suf, *S, mid, *M]
    if mode == "spm_v2":
        return [pre, suf, *S, mid, *P, *M]
    return [suf, *S, pre, *P, mid, *M]


def repo_fim_ids(text: str, doc_id: str, tokenizer, cfg: FIMConfig) -> list[int]:
    """Repo documents: FIM each file fragment independently (bigcode's fim_split_sample)."""
    pieces = text.split(FILE_SEP)
    out = tokenizer.encode(pieces[0]) if pieces[0] else []
    for k, frag in enumerate(pieces[1:], 1):
        header, nl, body = frag.partition("\n")
        out += tokenizer.encode(FILE_SEP + header + nl) + (fim_ids(body, doc_id, tokenizer, cfg, k) if body else [])
    return out
