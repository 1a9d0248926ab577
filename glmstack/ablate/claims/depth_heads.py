"""Deeper beats wider at equal active parameters; more attention heads help reasoning-style tasks at equal size
(GLM-4.5 §2.1: "we reduce the width (hidden dimension and number of routed experts) and increase the height
(number of layers) ... deeper models exhibited better reasoning capacity", and 2.5x more heads, which "does not
improve training loss ... but consistently improves performance on reasoning benchmarks").

Task: in-context lookup documents (glmstack/ablate/corpora.py): a random table of key -> value pairs, then
queries `q ? f(q) f(f(q))`; only the answers are predictable, and only by looking back across the context.
Arms, at equal active parameters without embeddings (131.8K / 133.6K / 131.7K, tests/unit/test_ablate.py):
  wide        2 layers, hidden 88, 4 heads x 24
  deep        4 layers, hidden 64, 4 heads x 16
  deep_heads  4 layers, hidden 64, 8 heads x 8 (the same q/k/v/o sizes as deep, twice the heads)
Measured on 64 held-out documents: the NLL and greedy accuracy of the answer tokens.
"""

from glmstack.ablate import corpora
from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.ablate.measure import accuracy, token_nll
from glmstack.recipes.ablate import MICRO

DATA = {"data.kind": "shards", "data.path": "{data}/train", "data.val_path": "{data}/val", "data.packing": "best_fit",
        "seq_len": 64, "schedule.mtp_weight": [[0, 0.0]], "model_overrides.num_nextn_predict_layers": 0}
ARMS = {
    "wide": {"model_overrides.hidden_size": 88, "model_overrides.head_dim": 24, "model_overrides.intermediate_size": 176,
             "model_overrides.moe_intermediate_size": 44},
    "deep": {"model_overrides.num_hidden_layers": 4},
    "deep_heads": {"model_overrides.num_hidden_layers": 4, "model_overrides.num_attention_heads": 8,
                   "model_overrides.num_key_value_heads": 4, "model_overrides.head_dim": 8},
}
# every arm states the whole shape, so a larger base recipe (ablate_gpu) cannot unbalance the comparison
BASE = {f"model_overrides.{k}": v for k, v in MICRO.items()} | {"model_overrides.vocab_size": corpora.LOOKUP_VOCAB}
ARMS = {arm: BASE | over for arm, over in ARMS.items()}


def write_corpus(folder):
    corpora.write_docs(folder / "train", corpora.lookup_documents(20000, seed=1), corpora.LOOKUP_VOCAB)
    corpora.write_docs(folder / "val", corpora.lookup_documents(256, seed=2), corpora.LOOKUP_VOCAB)


def measure(run) -> dict:
    import numpy as np

    model = run.model()
    rng = np.random.default_rng(3)
    nll = hits = n = 0
    for _ in range(64):
        doc, answers = corpora.lookup_document(rng)
        ids = doc.tolist()
        s, _ = token_nll(model, ids, answers)
        h, k = accuracy(model, ids, answers)
        nll, hits, n = nll + s, hits + h, n + k
    return {"answer_nll": nll / n, "answer_acc": hits / n}


CLAIM = Claim(
    name="depth_heads",
    source="GLM-4.5 §2.1",
    statement="deeper beats wider at equal active parameters; more attention heads help reasoning-style tasks",
    arms={arm: [Stage(name=arm, recipe="ablate", overrides=DATA | over, steps=300, cost=2.5)]
          for arm, over in ARMS.items()},
    measure=measure,
    checks=[
        Check(metric="answer_nll", treatment="deep", control="wide", says="deeper beats wider"),
        Check(metric="answer_acc", treatment="deep_heads", control="deep", better="higher",
              says="more heads help reasoning"),
    ],
    setup="in-context lookup task (key->value table, 1- and 2-hop queries), seq 64, best-fit packed, no MTP",
    data=write_corpus,
)
