"""GLM (2021)'s autoregressive blank infilling vs a causal LM on the same model (arXiv 2103.10360; issue 21).

Moved here from bench/ablate_glm_family.py. Both arms are the same 2D-RoPE model (the glm2021 recipe's
`position_2d`, no MTP), 2 dense layers, hidden 64, vocab 133 (5 reserved for [MASK] ... <eop>), seq 32, Muon at
lr 3e-3; the blank arm trains on the glm2021 objective mix (0.5 [MASK] / 0.25 [sMASK] / 0.25 [gMASK]), the causal
arm on plain next-token prediction of the same chain. Measured on 32 held-out documents of 24 tokens:
  infill_nll  NLL of held-out [MASK] span tokens (a document's first excluded): the blank arm sees both sides
              (Part A), the causal arm scores the same tokens left to right;
  l2r_nll     NLL of each document's second half given its first half ([gMASK] format vs plain LM).
The paper's claim: blank infilling gives a model that infills better and still generates left to right.
"""

import numpy as np
import torch

from glmstack.ablate.claim import Check, Claim, Stage
from glmstack.recipes.glm2021 import blank_options

MICRO = {"vocab_size": 133, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "first_k_dense_replace": 2, "num_nextn_predict_layers": 0, "position_2d": True, "partial_rotary_factor": 1.0}
BASE = {"seq_len": 32, "micro_batch_size": 8, "optim.lr": 3e-3, "optim.muon": True, "model_overrides": MICRO,
        "schedule.mtp_weight": [[0, 0.0]], "schedule.batch_warmup_start_tokens": 0}


def heldout_docs(seed: int, n_docs: int = 32, length: int = 24) -> np.ndarray:
    """Validation-stream documents of the Markov chain the arm trained on (the chain is seeded by the run seed)."""
    from glmstack.train.markov_stream import SyntheticLM

    val = SyntheticLM(vocab_size=MICRO["vocab_size"], seq_len=length - 1, batch_size=n_docs, seed=seed, split="val",
                      reserved_ids=5)
    b = val.batch(0)
    return torch.cat([b["input_ids"], b["labels"][:, -1:]], 1).numpy()


@torch.no_grad()
def nll(model, ids, labels, pos=None, prefix_len=None) -> tuple[float, int]:
    """Summed NLL over labels != -100, and their count, for one row."""
    kw = {"position_ids": torch.tensor([pos])} if pos is not None else {}
    if prefix_len is not None:
        kw["prefix_len"] = torch.tensor([prefix_len])
    logits = model(torch.tensor([ids]), **kw).logits[0]
    lab = torch.tensor(labels)
    keep = lab != -100
    return float(torch.nn.functional.cross_entropy(logits[keep], lab[keep], reduction="sum")), int(keep.sum())


def score(model, doc, spans, mask_id, ids, blank: bool) -> tuple[float, int]:
    from glmstack.data.blank_infilling import build_sample

    s = build_sample(doc, spans, mask_id, ids["sop"], ids["eop"], shuffle=False)
    if blank:  # score the span tokens only (not <eop>), and not a document's first token (as causal)
        labels = [t if t != ids["eop"] else -100 for t in s["labels"].tolist()]
        if spans[0][0] == 0:  # Part B in document order: the first span's first target
            labels[s["prefix_len"]] = -100
        return nll(model, s["input_ids"].tolist(), labels, s["position_ids"].tolist(), s["prefix_len"])
    labels = [-100] * (len(doc) - 1)  # causal LM on the original document, scored on the same tokens
    for a, e in spans:
        for t in range(max(a, 1), e):
            labels[t - 1] = int(doc[t])
    return nll(model, doc[:-1].tolist(), labels)


def measure(run) -> dict:
    from glmstack.data.blank_infilling import BlankConfig, mask_spans

    model, blank = run.model(), run.arm == "blank"
    ids = BlankConfig().special_ids(MICRO["vocab_size"])
    tot = {"infill": [0.0, 0], "l2r": [0.0, 0]}
    for i, doc in enumerate(heldout_docs(run.seed)):
        rng = np.random.default_rng([1234, i])
        for name, spans in {"infill": mask_spans(len(doc), rng), "l2r": [(len(doc) // 2, len(doc))]}.items():
            got = score(model, doc, spans, ids["gmask"] if name == "l2r" else ids["mask"], ids, blank)
            tot[name] = [tot[name][0] + got[0], tot[name][1] + got[1]]
    return {f"{k}_nll": v[0] / v[1] for k, v in tot.items()} | {"train_loss": run.rows()[-1]["loss"]}


CLAIM = Claim(
    name="blank_infilling",
    source="GLM (2021) §2",
    statement="blank infilling infills better than a causal LM and still generates left to right",
    arms={"blank": [Stage(name="blank", recipe="glm2021", overrides=BASE, steps=1000, cost=0.7,
                            warmup_frac=0.01)],
          "causal": [Stage(name="causal", recipe="glm2021", steps=1000, cost=0.7, warmup_frac=0.01,
                           overrides=BASE | {"data.options": {"reserved_ids": 5}})]},
    measure=measure,
    default=False,  # GLM (2021) / GLM-130B, not the GLM-4.5 / GLM-5 set: run when named
    checks=[Check(metric="infill_nll", treatment="blank", control="causal", says="better infilling"),
            Check(metric="l2r_nll", treatment="blank", control="causal", kind="no_worse", margin=0.02,
                  says="still generates left to right")],
    setup=f"2D-RoPE micro model, 2 dense layers, seq 32, Muon lr 3e-3; blank transform {blank_options()['blank_infilling']['weights']}",
)
