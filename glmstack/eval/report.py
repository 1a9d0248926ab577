"""The report card: results.json (everything), report.md (tables) and plots, written atomically into --out.

write_report(out_dir, {"model": ..., "tasks": {"humaneval": summary, "ppl": {...}}, "decontamination": ...})
"""

from __future__ import annotations

import json
from pathlib import Path

from glmstack.atomic import write_atomic


def markdown(card: dict) -> str:
    lines = [f"# Evaluation of {card['model']}", "", f"settings: {json.dumps(card.get('settings', {}))}", ""]
    tasks = card["tasks"]
    scored = {k: v for k, v in tasks.items() if k != "ppl"}
    if scored:
        ks = sorted({key for s in scored.values() for key in s["overall"] if key.startswith("pass@")},
                    key=lambda x: int(x[5:]))  # fmt: skip
        lines += ["| task | group | items | samples | " + " | ".join(ks) + " |", "|---" * (4 + len(ks)) + "|"]
        notes = []
        for name, s in scored.items():
            for group, st in [("all", s["overall"]), *s["groups"].items()]:
                cells = [f"{100 * st[k]:.1f}" if k in st else "" for k in ks]
                lines.append(f"| {name} | {group} | {st['items']} | {st['samples']} | " + " | ".join(cells) + " |")
            if s["overall"].get("not_generated"):
                notes.append(f"- {name}: {s['overall']['not_generated']} prompts were longer than the model's context "
                             "or rejected by the endpoint (scored as failures).")  # fmt: skip
            if "errors" in s:
                notes.append(f"- {name}: {s['errors']['count']} requests failed (rerun to retry them): "
                             f"{s['errors']['first'][0]}")  # fmt: skip
        lines += ["", *notes]
        lines.append("")
    if "ppl" in tasks:
        p = tasks["ppl"]
        head = (f"Held-out loss {p['loss']:.4f} (perplexity {p['ppl']:.2f}) over {p['sequences']} windows of "
                f"{p['seq_len']} tokens from {p['data']}.")  # fmt: skip
        lines += [head, "", "| positions from | loss |", "|---|---|"]
        lines += [f"| {a} | {m:.4f} |" for a, m in zip(p["bucket_starts"], p["bucket_loss"])] + [""]
    dec = card.get("decontamination")
    if dec:
        head = (f"Decontamination: word {dec['ngram']}-gram overlap with {dec['docs_scanned']} training documents "
                f"of {dec['shards']}.")  # fmt: skip
        lines += [head, "", "| task | items | contaminated | fraction |", "|---|---|---|---|"]
        lines += [f"| {t} | {d['items']} | {d['contaminated']} | {100 * d['fraction']:.2f}% |"
                  for t, d in dec["tasks"].items()] + [""]  # fmt: skip
    return "\n".join(lines)


def plot(card: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    if "ppl" in card["tasks"]:
        curve = card["tasks"]["ppl"]["loss_by_position"]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(range(1, len(curve) + 1), curve)
        ax.set(xlabel="position", ylabel="loss (nats)", title="held-out loss by position")
        fig.tight_layout(), fig.savefig(out / "ppl_by_position.png", dpi=110), plt.close(fig)
        made.append("ppl_by_position.png")
    bars = [(f"{t}/{g}", st.get("pass@1", 0.0)) for t, s in card["tasks"].items() if t != "ppl"
            for g, st in s["groups"].items()]  # fmt: skip
    if bars:
        fig, ax = plt.subplots(figsize=(7, 0.3 * len(bars) + 1.2))
        ax.barh([b[0] for b in bars][::-1], [100 * b[1] for b in bars][::-1])
        ax.set(xlabel="pass@1 (%)", xlim=(0, 100), title=card["model"][:60])
        fig.tight_layout(), fig.savefig(out / "scores.png", dpi=110), plt.close(fig)
        made.append("scores.png")
    return made


def write_report(out_dir, card: dict) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    card = {**card, "plots": plot(card, out)}
    write_atomic(out / "results.json", json.dumps(card, indent=1))
    write_atomic(out / "report.md", markdown(card))
