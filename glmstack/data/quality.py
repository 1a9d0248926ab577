"""Quality scores: a bag-of-n-grams classifier for prose, a rule score for code.

GLM-4.5 §2.1 buckets web pages by quality score (Nemotron-CC style) and up-samples the top bucket. The reference
classifiers (DCLM fastText, FineWeb-Edu) are hub-only, so we train our own here in seconds, DCLM-style: a linear
model over hashed word 1-2-grams separating reference text (positives) from degraded text (negatives).

Why scikit-learn and not fastText: the `fasttext` 0.9.3 release has no wheel for this Python and would be one
more compiled dependency; HashingVectorizer + LogisticRegression is the same model family (linear over hashed
n-grams), is already a dependency of the `data` extra, and trains on a few thousand documents in about a second
(docs/data.md has held-out accuracy and speed).

Proxy labels (research spec §5.2): positives are the clean documents handed in; negatives are the same documents
degraded four ways (shuffled words, boilerplate-stuffed, line-repeated, markup/noise), so the model learns
"reads like curated prose" rather than a topic.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

import numpy as np

BOILER = [
    "Click here to subscribe!",
    "Accept all cookies",
    "Share this page on Facebook",
    "Sign up now",
    "Advertisement",
    "Home | About | Contact | Login",
    "Copyright 2024. All rights reserved.",
    "Read more >>",
]


@dataclass(kw_only=True)
class QualityConfig:
    enabled: bool = True  # score documents; without scores every document is in the middle bucket
    n_features: int = 2**18  # hashed feature width
    max_train_docs: int = 4000  # positives sampled from the text sources to train on
    seed: int = 0  # sampling and degradation


def degrade(text: str, rng: random.Random) -> str:
    """One of four corruptions that make fluent text look like low-quality web text."""
    words = text.split()
    mode = rng.randrange(4)
    if mode == 0:
        rng.shuffle(words)
        return " ".join(words)
    if mode == 1:
        lines = text.split("\n")
        return "\n".join(ln + ("\n" + rng.choice(BOILER) if rng.random() < 0.5 else "") for ln in lines)
    if mode == 2:
        lines = [ln for ln in text.split("\n") if ln.strip()] or [text]
        return "\n".join(rng.choice(lines) for _ in range(max(3, len(lines))))
    noisy = [w if rng.random() > 0.3 else f"<div class='x{rng.randrange(99)}'>{w}&nbsp;" for w in words]
    return " ".join(noisy)


class QualityModel:
    """`score(texts) -> (N,) float` in [0, 1]: the probability that a text reads like the reference."""

    def __init__(self, cfg: QualityConfig):
        from sklearn.feature_extraction.text import HashingVectorizer

        self.cfg = cfg
        self.vec = HashingVectorizer(
            n_features=cfg.n_features,
            ngram_range=(1, 2),
            alternate_sign=False,
            norm="l2",
            lowercase=True,
            token_pattern=r"(?u)\b\w+\b|[<>&|!]",
        )
        self.clf = None

    def fit(self, positives: list[str]) -> dict:
        """Train on positives vs their degradations; returns held-out accuracy on a 20% split."""
        from sklearn.linear_model import SGDClassifier

        rng = random.Random(self.cfg.seed)
        pos = list(positives)
        rng.shuffle(pos)
        pos = pos[: self.cfg.max_train_docs]
        neg = [degrade(t, rng) for t in pos]
        texts, y = pos + neg, np.array([1] * len(pos) + [0] * len(neg))
        order = np.random.default_rng(self.cfg.seed).permutation(len(texts))
        cut = int(0.8 * len(order))
        X = self.vec.transform([texts[i] for i in order])
        # SGD logistic regression: lbfgs over 2^20 dense weights took ~6 s on 500 documents, SGD ~0.1 s
        self.clf = SGDClassifier(loss="log_loss", alpha=1e-4, max_iter=30, tol=None, random_state=self.cfg.seed)
        self.clf.fit(X[:cut], y[order[:cut]])
        acc = float((self.clf.predict(X[cut:]) == y[order[cut:]]).mean()) if cut < len(order) else float("nan")
        return {"train_docs": len(texts), "heldout_accuracy": acc}

    def score(self, texts: list[str]) -> np.ndarray:
        if self.clf is None:
            return np.full(len(texts), 0.5)
        return self.clf.predict_proba(self.vec.transform(texts))[:, 1]


COMMENT_RE = re.compile(r"^\s*(#|//|\*|/\*)")


def code_score(text: str, lang: str) -> float:
    """Rule score in [0, 1] for code tiers: parses (Python), documented, not one giant function.

    Stands in for GLM's per-language tier models until an annotator exists: syntax validity and comment /
    docstring density are the proxy labels research spec §6.1 proposes.
    """
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if not lines:
        return 0.0
    comments = sum(1 for ln in lines if COMMENT_RE.match(ln)) + text.count('"""') // 2
    density = min(1.0, 4.0 * comments / len(lines))
    parses = 1.0
    if lang == "python":
        try:
            ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            parses = 0.0
    long_lines = sum(1 for ln in lines if len(ln) > 100) / len(lines)
    return 0.5 * parses + 0.4 * density + 0.1 * (1.0 - long_lines)
