"""Small document corpora some claims train on, written as token shards (glmstack/data/shards.py) once per --out.

- `topic_documents`: documents of varied length (mean ~2/3 of the context), each a walk on one of several Markov
  chains chosen by its first token (its "topic"), so a fragment cut from its start is harder to predict: the
  setting where GLM-4.5's best-fit packing (no truncated documents) should matter.
- `lookup_documents`: a reasoning-style task: a random table of key -> value pairs, then queries `q ? f(q) f(f(q))`
  (one and two hops through the table); only the answers are predictable, and only by looking back across the
  context — what GLM-4.5's "more attention heads help reasoning" is about.
- `code_corpus`: the tiny recipe's data build (embedded stdlib code and prose) with a small BPE vocabulary,
  with FIM configured for sampling time (glmstack/data/fim.py), for the FIM claim.

Every generator is a pure function of its seed: the corpus is the same for every arm and seed of a claim.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from glmstack.data.shards import ShardWriter

TOPIC_VOCAB, N_TOPICS, BRANCHING = 128, 8, 3
LOOKUP_VOCAB, N_SYMBOLS, N_KEYS, N_QUERIES = 128, 32, 4, 3
QUERY = 120  # the lookup task's query marker (above the symbols)
EOS = 127


def write_docs(folder: Path, docs: list[np.ndarray], vocab_size: int, kind: str = "text") -> Path:
    """Documents (each ending with EOS) to a shard folder with per-document metadata; index.json last."""
    w = ShardWriter(folder, shard_tokens=1 << 22, eos_id=EOS, vocab_size=vocab_size)
    for i, d in enumerate(docs):
        w.add(np.append(d, EOS), (i, 0, kind))
    w.close()
    return folder


def topic_documents(n_docs: int, seq_len: int, seed: int) -> list[np.ndarray]:
    """`n_docs` documents drawn with `seed`; the chains are the same for every seed (train and val share them)."""
    chains = np.random.default_rng(0).integers(N_TOPICS, EOS, size=(N_TOPICS, TOPIC_VOCAB, BRANCHING))  # (topic, token, succ.)
    rng = np.random.default_rng(seed + 1)
    docs = []
    for _ in range(n_docs):
        n = int(np.clip(rng.exponential(seq_len * 2 / 3), 4, 3 * seq_len))
        topic = int(rng.integers(N_TOPICS))
        toks = [topic, int(rng.integers(N_TOPICS, EOS))]
        for _ in range(n - 2):
            toks.append(int(chains[topic, toks[-1], rng.integers(BRANCHING)]))
        docs.append(np.asarray(toks))
    return docs


def lookup_document(rng: np.random.Generator) -> tuple[np.ndarray, list[int]]:
    """(tokens, positions of answer tokens): pairs k v (a random cycle over N_KEYS symbols), then queries."""
    keys = rng.choice(N_SYMBOLS, size=N_KEYS, replace=False)
    nxt = {int(keys[i]): int(keys[(i + 1) % N_KEYS]) for i in range(N_KEYS)}  # f: one cycle, so f(f(q)) != q
    order = rng.permutation(N_KEYS)
    toks = [t for i in order for t in (int(keys[i]), nxt[int(keys[i])])]
    answers = []
    for q in rng.choice(keys, size=N_QUERIES, replace=False):
        toks += [QUERY, int(q)]
        answers += [len(toks), len(toks) + 1]
        toks += [nxt[int(q)], nxt[nxt[int(q)]]]
    return np.asarray(toks), answers


def lookup_documents(n_docs: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [lookup_document(rng)[0] for _ in range(n_docs)]


def code_corpus(folder: Path, vocab_size: int = 512, size_mb: float = 0.2) -> Path:
    """The tiny data build (train/ with sampling-time FIM on code, eval/ without, tokenizer/) into `folder`."""
    from glmstack.data.cli import main

    if not (folder / "train" / "index.json").exists():
        code = main(["tiny", "--out", str(folder), "--vocab-size", str(vocab_size), "--set", f"corpus.size_mb={size_mb}"])
        if code:
            raise RuntimeError(f"the data build into {folder} failed (exit code {code})")
    return folder
