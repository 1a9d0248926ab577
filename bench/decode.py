"""Decode speed of glmstack's Engine vs transformers' generate(), and MTP speculative decoding speedup.

Part 1 (engine vs transformers): the `tiny-moe` preset (hidden 256, 4 layers, 16 experts top-4), one set of
weights (glmstack `save_hf` -> transformers `from_pretrained`), the same random 32-token prompt, greedy, N new
tokens, batch 1 and batch 8. Both are warmed up; runs alternate ours / transformers so that load on a shared
machine hits both alike, and the figures are medians (wall clock, and CPU time of the process, which a
busy machine inflates less). The greedy tokens of both are compared as a sanity check.

Part 2 (MTP): the same model (with its MTP layer) is trained for 150 AdamW steps (8 x 32 tokens) on synthetic
repetitive text (random "phrases" of 6-12 tokens strung together: predictable inside a phrase, not at its
boundaries), then decodes a held-out prompt greedily with plain decoding and with speculative="mtp", k = 1..4:
mean accepted length per verify step, acceptance per depth, wall-clock speedup (medians, interleaved).

    python bench/decode.py                          # ~4 minutes on 1 busy CPU thread
    python bench/decode.py --skip-mtp --repeats 9   # part 1 only
    python bench/decode.py --skip-hf --mtp-layers 16  # part 2 with a 16-layer trunk

Part 3 (true on-policy, rl.true_on_policy): the cost of decoding with model/invariant.py's batch-invariant ops
(the plain model forward, fixed-shape GEMM blocks, attention in fixed key chunks) against the default engine (fast
path) and the plain forward without them, sampled at temperature 1 as RL rollouts are, batch 1, 8 and 64.

    python bench/decode.py --skip-hf --skip-mtp     # part 3 only

Part 1 also prints a bound: the self time of our GEMM kernels per step (torch.profiler), which removing overhead
cannot reduce; transformers' step time over it is the largest speedup left on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from glmstack.inference import Engine
from glmstack.inference.spec_cost import phase_costs, speedup_bound
from glmstack.inference.speculative import frequent_tokens
from glmstack.model import GLM, ModelConfig, load_hf, save_hf


def build(seed: int = 0):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # transformers ignores the MTP layer's weights and would list each one
    ours = GLM(ModelConfig.preset("tiny-moe")).init_weights(seed=seed).eval()
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(ours, tmp)
        hf = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    return ours, hf


def time_ours(engine, prompts, n, cpu: list | None = None, **kw):
    t, c = time.perf_counter(), time.process_time()
    res = engine.generate(prompts, n, stop_ids=[], **kw)
    if cpu is not None:
        cpu.append(time.process_time() - c)
    return time.perf_counter() - t, res


def time_hf(hf, prompts, n, cpu: list | None = None):
    ids = torch.tensor(prompts)
    with torch.inference_mode():
        t, c = time.perf_counter(), time.process_time()
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        if cpu is not None:
            cpu.append(time.process_time() - c)
        return time.perf_counter() - t, out[:, ids.shape[1] :].tolist()


# ---------------------------------------------------------------- part 1: engine vs transformers
def engine_vs_hf(ours, hf, n: int, repeats: int, batches=(1, 8)) -> list[dict]:
    engine, rows = Engine(ours), []
    g = torch.Generator().manual_seed(1)
    for B in batches:
        prompts = torch.randint(1, ours.cfg.vocab_size, (B, 32), generator=g).tolist()
        time_ours(engine, prompts, 8), time_hf(hf, prompts, 8)  # warm-up
        t_ours, t_hf, ratios, cpu_ours, cpu_hf = [], [], [], [], []
        for _ in range(repeats):
            a, res = time_ours(engine, prompts, n, cpu_ours)
            b, hf_tokens = time_hf(hf, prompts, n, cpu_hf)
            t_ours.append(a), t_hf.append(b), ratios.append(b / a)
        same = sum(x == y for r, h in zip(res.tokens, hf_tokens) for x, y in zip(r, h)) / (B * n)
        row = {
            "batch": B,
            "new_tokens": n,
            "ours_ms_per_step": 1e3 * statistics.median(t_ours) / n,
            "hf_ms_per_step": 1e3 * statistics.median(t_hf) / n,
            "speedup": statistics.median(ratios),
            "ours_tok_s": B * n / statistics.median(t_ours),
            "hf_tok_s": B * n / statistics.median(t_hf),
            "same_tokens": same,
            "cpu_time_speedup": statistics.median(cpu_hf) / statistics.median(cpu_ours),
        }
        row["ours_gemm_ms_per_step"] = gemm_ms_per_step(engine, prompts, n)
        row["bound"] = row["hf_ms_per_step"] / row["ours_gemm_ms_per_step"]
        print(
            f"batch {B}: ours {row['ours_ms_per_step']:.2f} ms/step ({row['ours_tok_s']:.0f} tok/s), "
            f"transformers {row['hf_ms_per_step']:.2f} ms/step ({row['hf_tok_s']:.0f} tok/s), "
            f"speedup x{row['speedup']:.2f} (median of pairs; CPU-time x{row['cpu_time_speedup']:.2f}), "
            f"same greedy tokens {100 * same:.0f}%\n  bound: our GEMMs alone take {row['ours_gemm_ms_per_step']:.2f} "
            f"ms/step -> with every other op free, at most x{row['bound']:.2f}",
            flush=True,
        )
        rows.append(row)
    return rows


# ---------------------------------------------------------------- part 3: true on-policy decode
def true_on_policy_cost(model, n: int, repeats: int, batches=(1, 8, 64)) -> list[dict]:
    """ms per decode step: the default engine, the plain forward (fast=False), the plain forward in batch-invariant
    mode (what rl.true_on_policy samples with); medians of interleaved runs, sampled with per-row seeds."""
    from glmstack.model.invariant import batch_invariant

    variants = {"default": (Engine(model), False), "plain": (Engine(model, fast=False), False),
                "invariant": (Engine(model, fast=False), True)}  # fmt: skip
    g, rows = torch.Generator().manual_seed(3), []
    for B in batches:
        prompts = torch.randint(1, model.cfg.vocab_size, (B, 32), generator=g).tolist()
        times: dict[str, list[float]] = {k: [] for k in variants}
        first: dict[str, float] = {}
        for r in range(repeats + 1):  # the first round is each variant's first call at this batch (reported apart)
            for name, (engine, inv) in variants.items():
                with batch_invariant(inv):
                    t, _ = time_ours(engine, prompts, n, temperature=1.0, seed=r)
                (times[name].append(t) if r else first.__setitem__(name, t))
        ms = {k: 1e3 * statistics.median(v) / n for k, v in times.items()}
        row = {"batch": B, "new_tokens": n} | {f"{k}_ms_per_step": v for k, v in ms.items()}
        row |= {f"{k}_first_call_s": v for k, v in first.items()}
        row["invariant_over_default"] = ms["invariant"] / ms["default"]
        print(f"true on-policy, batch {B}: default {ms['default']:.2f} ms/step, plain forward {ms['plain']:.2f}, "
              f"batch-invariant {ms['invariant']:.2f} (x{row['invariant_over_default']:.2f} the default); first "
              f"call (whole generate): {first['default']:.2f} s / {first['plain']:.2f} s / {first['invariant']:.2f} s",
              flush=True)  # fmt: skip
        rows.append(row)
    return rows


GEMM_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::mv",
    "aten::addmv",
    "aten::_grouped_mm",
    "mkldnn::_linear_pointwise",
}


def gemm_ms_per_step(engine, prompts, n: int) -> float:
    """Self time of the GEMM kernels per decode step (torch.profiler, one run): the part no removal of overhead can
    touch, since the FLOPs and weight bytes are the model's. transformers' step / this = the best speedup left."""
    from torch.profiler import profile

    with profile() as prof:
        engine.generate(prompts, n, stop_ids=[])
    us = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in GEMM_OPS)
    return us / 1e3 / n


# ---------------------------------------------------------------- part 2: MTP speculative decoding
def phrase_stream(vocab: int, n_phrases: int = 48, seed: int = 0):
    """A sampler of sequences made of random phrases: inside a phrase the next token is determined."""
    g = torch.Generator().manual_seed(seed)
    phrases = [
        torch.randint(1, vocab, (int(torch.randint(6, 13, (), generator=g)),), generator=g) for _ in range(n_phrases)
    ]

    def sample(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
        out = []
        for _ in range(batch):
            seq = torch.cat([phrases[int(i)] for i in torch.randint(0, n_phrases, (length // 6 + 1,), generator=gen)])
            out.append(seq[:length])
        return torch.stack(out)

    return sample


def train_mtp(model, steps: int, batch: int = 8, seq: int = 32, lr: float = 3e-3):
    """Plain AdamW on the whole model (trunk + MTP) with a full-weight MTP loss."""
    sample = phrase_stream(model.cfg.vocab_size)
    gen = torch.Generator().manual_seed(2)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(steps):
        x = sample(batch, seq + 1, gen)
        out = model(x[:, :-1], labels=x[:, 1:], mtp_weight=1.0)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            mtp = [round(m.item(), 3) for m in out.mtp_loss]
            print(
                f"train step {step:4d} lm {out.lm_loss.item():.3f} mtp {mtp} ({time.perf_counter() - t0:.0f}s)",
                flush=True,
            )
    return model.eval(), sample


@torch.no_grad()
def deepen(model, n_layers: int):
    """The trained model with n_layers: its own layers first, then copies of its MoE layers whose output
    projections (attention o_proj, every expert's and the shared expert's down_proj) are zero. Those add exactly
    nothing to the residual stream (the outputs, and so the MTP layer's acceptance, are the trained model's) but
    cost what a real layer costs: the same GEMM shapes, the same expert choices. A stand-in for a trained deep trunk,
    which this shared 2-core machine cannot train in a session (a 12-layer run took ~7 s a step under load)."""
    cfg = model.cfg
    deep = GLM(ModelConfig.preset("tiny-moe", num_hidden_layers=n_layers)).init_weights(seed=0)
    state, n = model.state_dict(), cfg.num_hidden_layers
    moe_layers = list(range(cfg.first_k_dense_replace, n))
    new = {}
    for name, t in deep.state_dict().items():
        if name.startswith("layers."):
            i, rest = int(name.split(".")[1]), name.split(".", 2)[2]
            src = i if i < n else moe_layers[(i - n) % len(moe_layers)]
            t = state[f"layers.{src}.{rest}"].clone()
            if i >= n and rest.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                t.zero_()
        else:
            t = state[name]
        new[name] = t
    deep.load_state_dict(new)
    return deep.eval()


def speculative_speedup(
    model, sample, n: int, repeats: int, batch: int = 1, ks=(1, 2, 3, 4), draft_vocab: int = 0
) -> list[dict]:
    """Plain greedy vs speculative k = ks (and, with draft_vocab = N > 0, also drafting over the N most frequent
    tokens of 64 training sequences: FR-Spec), interleaved; each checked equal to plain greedy."""
    engine = Engine(model)
    prompts = sample(batch, 32, torch.Generator().manual_seed(99)).tolist()
    plain_ref = engine.generate(prompts, n, stop_ids=[]).tokens
    vocab = frequent_tokens(sample(64, 32, torch.Generator().manual_seed(5)), draft_vocab) if draft_vocab else None
    variants = [(0, None)] + [(k, None) for k in ks] + ([(k, vocab) for k in ks] if draft_vocab else [])
    times = {v[0] if v[1] is None else (v[0], "dv"): [] for v in variants}
    cpu = {key: [] for key in times}  # CPU time of the process: less inflated than wall clock by a busy machine
    stats = {}
    for _ in range(repeats):
        for (k, dv), key in zip(variants, times):
            engine.draft_vocab = dv
            kw = {"speculative": "mtp", "draft_k": k} if k else {}
            t, res = time_ours(engine, prompts, n, cpu[key], **kw)
            assert res.tokens == plain_ref, "speculative output differs from plain greedy"
            times[key].append(t)
            stats[key] = res.stats
    engine.draft_vocab = None
    base = statistics.median(times[0])
    rows = []
    for key in list(times)[1:]:
        k = key if isinstance(key, int) else key[0]
        row = {
            "batch": batch,
            "k": k,
            "draft_vocab": draft_vocab if not isinstance(key, int) else None,
            "mean_accepted_length": stats[key]["mean_accepted_length"],
            "acceptance_per_depth": [round(a, 3) for a in stats[key]["acceptance_per_depth"]],
            "ms_per_token": 1e3 * statistics.median(times[key]) / n,
            "plain_ms_per_token": 1e3 * base / n,
            "speedup": base / statistics.median(times[key]),
            "cpu_time_speedup": statistics.median(cpu[0]) / statistics.median(cpu[key]),
        }
        print(
            f"batch {batch} k={k}{'' if row['draft_vocab'] is None else f' draft vocab {draft_vocab}'}: accepted "
            f"length {row['mean_accepted_length']:.2f}, per depth {row['acceptance_per_depth']}, "
            f"{row['ms_per_token']:.2f} ms/token vs plain {row['plain_ms_per_token']:.2f}: x{row['speedup']:.2f} "
            f"(CPU time x{row['cpu_time_speedup']:.2f})",
            flush=True,
        )
        rows.append(row)
    return rows


def phase_times(model, sample, ks, repeats: int = 30, draft_vocab=None) -> dict:
    """Per-phase costs at batch 1 after a 32-token prompt (ms, medians over `repeats` rounds): a plain step, a
    verify block per k, one MTP step (glmstack.inference.spec_cost.phase_costs)."""
    engine = Engine(model)
    engine.draft_vocab = draft_vocab
    return phase_costs(engine, sample(1, 40, torch.Generator().manual_seed(99)), ks, repeats)


def bound(phases: dict, k: int, accepted: float) -> float:
    """Speedup at most: accepted tokens per round x plain step / (verify + catch-up + k - 1 draft steps)."""
    return speedup_bound(phases, k, accepted)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-steps", type=int, default=150)
    ap.add_argument("--skip-mtp", action="store_true")
    ap.add_argument("--mtp-layers", type=int, default=0, help="part 2 on a trunk of this many layers (0: 4)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-true-on-policy", action="store_true", help="skip part 3")
    ap.add_argument("--mtp-model", help="part 2: load the trained model from this folder, or train and save it there")
    ap.add_argument("--ks", default="1,2,3,4", help="part 2: draft counts at batch 1")
    ap.add_argument("--deepen", type=int, default=0, help="part 2: the trained model deepened to this many layers")
    ap.add_argument("--draft-vocab", type=int, default=0, help="part 2: also draft over the N most frequent tokens")
    ap.add_argument("--skip-batch8", action="store_true", help="part 2: batch 1 only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ours, hf = build()
    result = {"threads": args.threads}
    if not args.skip_hf:
        result["engine_vs_transformers"] = engine_vs_hf(ours, hf, args.new_tokens, args.repeats)
    if not args.skip_true_on_policy:
        result["true_on_policy"] = true_on_policy_cost(ours, args.new_tokens, args.repeats)
    if not args.skip_mtp:
        if args.mtp_layers:  # a deeper trunk: drafting becomes cheap next to the main model, as in real GLMs
            ours = GLM(ModelConfig.preset("tiny-moe", num_hidden_layers=args.mtp_layers)).init_weights(seed=0)
        if args.mtp_model and (Path(args.mtp_model) / "config.json").exists():
            model, sample = load_hf(args.mtp_model, dtype=torch.float32).eval(), phrase_stream(ours.cfg.vocab_size)
        else:
            model, sample = train_mtp(ours, args.train_steps)
            if args.mtp_model:
                save_hf(model, args.mtp_model)
        if args.deepen:
            model = deepen(model, args.deepen)
        ks = tuple(int(k) for k in args.ks.split(","))
        result["mtp"] = speculative_speedup(model, sample, args.new_tokens, args.repeats, ks=ks,
                                            draft_vocab=args.draft_vocab)
        vocab = None
        if args.draft_vocab:
            vocab = frequent_tokens(sample(64, 32, torch.Generator().manual_seed(5)), args.draft_vocab)
        for dv in (None, vocab) if vocab is not None else (None,):
            phases = phase_times(model, sample, ks, draft_vocab=dv)
            print(f"phases (ms{'' if dv is None else f', draft vocab {len(dv)}'}): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()), flush=True)
            for row in result["mtp"]:
                if row["batch"] == 1 and (row["draft_vocab"] is None) == (dv is None):
                    row["bound"] = bound(phases, row["k"], row["mean_accepted_length"])
                    print(f"  k={row['k']}: bound x{row['bound']:.2f} (accepted {row['mean_accepted_length']:.2f}), "
                          f"measured x{row['speedup']:.2f}", flush=True)
        if not args.skip_batch8:
            result["mtp"] += speculative_speedup(model, sample, args.new_tokens, args.repeats, batch=8, ks=(2, 4))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
