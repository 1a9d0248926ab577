"""Best-fit packing vs concatenate-and-split: fewer truncated documents, lower loss on whole documents
(GLM-4.5 §2.3: in mid-training "we adopt best-fit packing (Ding et al., 2024) ... to avoid truncating documents").

Corpus: topic documents (glmstack/ablate/corpora.py): varied lengths (mean 2/3 of the 64-token context), each a
walk on one of 8 Markov chains chosen by its first token, so a fragment cut from its start lacks its topic.
Arms: `data.packing=best_fit` (rows of whole documents, segment_ids keep attention inside a document) vs `concat`
(one stream cut every 64 tokens). Measured: the share of training documents cut into pieces (a property of the
packer: the same for every seed), and the NLL of 128 held-out documents each scored alone from its first token.
"""

import numpy as np

from glmstack.ablate import corpora
from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import token_nll

SEQ = 64
DATA = {"data.kind": "shards", "data.path": "{data}/train", "data.val_path": "{data}/val", "seq_len": SEQ}


def write_corpus(folder):
    corpora.write_docs(folder / "train", corpora.topic_documents(6000, SEQ, seed=1), corpora.TOPIC_VOCAB)
    corpora.write_docs(folder / "val", corpora.topic_documents(128, SEQ, seed=2), corpora.TOPIC_VOCAB)


def truncated_share(folder, packing: str) -> float:
    from glmstack.data.packing import concat_truncated
    from glmstack.data.shards import TokenShards

    lengths = [int(n) for n in TokenShards(folder).doc_len]
    cut = concat_truncated(lengths, SEQ) if packing == "concat" else sum(n > SEQ for n in lengths)
    return cut / len(lengths)


def measure(run) -> dict:
    from glmstack.data.shards import TokenShards

    model, val = run.model(), TokenShards(run.cfg.data.val_path)
    nll = n = 0
    for i in range(val.n_docs):
        doc = np.asarray(val.doc(i))[: SEQ + 1].tolist()
        if len(doc) > 2:
            s, k = token_nll(model, doc, list(range(1, len(doc))))
            nll, n = nll + s, n + k
    return {"truncated": truncated_share(run.cfg.data.path, run.cfg.data.packing), "doc_nll": nll / n}


CLAIM = Claim(
    name="packing",
    source="GLM-4.5 §2.3",
    statement="best-fit packing truncates fewer documents than concatenate-and-split and does not lose loss",
    arms={
        "best_fit": [Stage(name="best_fit", recipe="ablate", overrides=DATA | {"data.packing": "best_fit"}, steps=300,
                           cost=2.0)],
        "concat": [Stage(name="concat", recipe="ablate", overrides=DATA | {"data.packing": "concat"}, steps=300,
                         cost=2.0)],
    },
    measure=measure,
    checks=[
        Check(metric="truncated", treatment="best_fit", control="concat", says="fewer truncated documents"),
        Check(metric="doc_nll", treatment="best_fit", control="concat", says="lower loss on whole documents"),
    ],
    setup="topic documents (8 chains, exponential lengths, mean 43 tokens), seq 64, same steps and rows per step",
    data=write_corpus,
)
