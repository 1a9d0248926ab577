"""FIM on code improves infilling without hurting left-to-right loss (GLM-4.5 §2.2 / §2.3, FIM: Bavarian et al.
2022, arXiv 2207.14255, whose headline is exactly "FIM-for-free": infilling without a left-to-right cost).

Corpus: the tiny data build (embedded stdlib code and prose, 0.6 MB, a 512-token BPE) whose train split asks the
loader for sampling-time FIM on code (rate 0.5, PSM and SPM; glmstack/data/fim.py). Arms: FIM on (the build's
config) vs `data.options.fim=false`, the same windows otherwise. Measured on held-out code (the eval split's code
and repo documents, 48-token windows, 4 fixed random cuts each): the NLL of the middle given prefix and suffix in
PSM format (<|code_prefix|> P <|code_suffix|> S <|code_middle|> M), and the left-to-right NLL of the same windows.
"""

import random

import numpy as np

from glmstack.ablate import corpora
from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import token_nll

DATA = {"data.kind": "shards", "data.path": "{data}/train", "data.val_path": "{data}/eval", "seq_len": 64,
        "model_overrides.vocab_size": 512}
WINDOW, CUTS = 48, 4


def write_corpus(folder):
    corpora.code_corpus(folder, vocab_size=512, size_mb=0.6)


def eval_windows(folder) -> list[list[int]]:
    from glmstack.data.shards import KINDS, TokenShards

    sh = TokenShards(folder)
    code = [i for i in range(sh.n_docs) if sh.docs["kind"][i] in (KINDS.index("code"), KINDS.index("repo"))]
    out = []
    for i in code:
        doc = np.asarray(sh.doc(i))[:-1]
        out += [doc[s : s + WINDOW].tolist() for s in range(0, len(doc) - WINDOW + 1, WINDOW)]
    return out[:64]


def measure(run) -> dict:
    from glmstack.data.fim import MID, PRE, SUF
    from glmstack.tokenizer import Tokenizer

    model = run.model()
    tok = Tokenizer.load(f"{run.cfg.data.path}/../tokenizer")
    pre, suf, mid = (tok.token_id(t) for t in (PRE, SUF, MID))
    infill = [0.0, 0]
    l2r = [0.0, 0]
    for w, ids in enumerate(eval_windows(run.cfg.data.val_path)):
        s, k = token_nll(model, ids, list(range(1, len(ids))))
        l2r = [l2r[0] + s, l2r[1] + k]
        for c in range(CUTS):  # token-level cuts, the same for every arm and seed
            i, j = sorted(random.Random(w * CUTS + c).sample(range(1, len(ids)), 2))
            row = [pre, *ids[:i], suf, *ids[j:], mid, *ids[i:j]]
            s, k = token_nll(model, row, list(range(len(row) - (j - i), len(row))))
            infill = [infill[0] + s, infill[1] + k]
    return {"infill_nll": infill[0] / infill[1], "l2r_nll": l2r[0] / l2r[1]}


CLAIM = Claim(
    name="fim",
    source="GLM-4.5 §2.2",
    statement="FIM on code improves infilling without hurting left-to-right loss",
    arms={
        "fim": [Stage(name="fim", recipe="ablate", overrides=DATA, steps=300, cost=2.0)],
        "no_fim": [Stage(name="no_fim", recipe="ablate", overrides=DATA | {"data.options": {"fim": False}}, steps=300,
                         cost=2.0)],
    },
    measure=measure,
    checks=[
        Check(metric="infill_nll", treatment="fim", control="no_fim", says="improves infilling"),
        Check(metric="l2r_nll", treatment="fim", control="no_fim", kind="no_worse", margin=0.02,
              says="without hurting left-to-right loss"),
    ],
    setup="tiny data build at 0.6 MB (stdlib code + prose), 512-token BPE, seq 64, FIM rate 0.5 on code",
    data=write_corpus,
)
