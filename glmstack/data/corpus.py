"""The default corpus: offline, deterministic from a seed, sized by one knob.

What it holds (research spec §10), all from the running interpreter or our own generators:
  - stdlib-code   top-level standard-library modules, one code document per file;
  - stdlib-repos  standard-library packages as repositories (a top-level package = a repo), one repo-level
                  document each, files in import order (repo.py);
  - pydoc         the `pydoc_data.topics` reference pages (English prose);
  - docstrings    module / class / function docstrings of at least 30 words (English prose);
  - math          procedural problem sets with worked solutions (mathgen.py);
  - templates     pages stamped from a few templates with different slot values: MinHash keeps them (the
                  slots break word 5-grams), SemDeDup should not (GLM-4.5 §2.1's motivating case).
A seeded hash of each document id puts `eval_fraction` of documents in a held-out "eval" split that the
"train" split never contains (plus the first document of every part with at least 4, so tiny corpora still
have a held-out document of each kind). `size_mb` caps the raw text: a few MB for a tiny speedrun, ~0.2 for tests.

    docs = list(corpus_docs(CorpusConfig(size_mb=0.5, seed=0), split="train"))
"""

from __future__ import annotations

import ast
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from glmstack.data.doc import Doc
from glmstack.data.mathgen import problem_set
from glmstack.data.mixture import unit_hash
from glmstack.data.repo import repo_document

# skipped stdlib folders: tests are huge and repetitive; the rest are vendored or platform-specific
SKIP_PACKAGES = {
    "test",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "ensurepip",
    "turtledemo",
    "__pycache__",
    "tkinter",
    "config-3.11-x86_64-linux-gnu",
    "pydoc_data",
    "lib-dynload",
}


@dataclass(kw_only=True)
class CorpusConfig:
    size_mb: float = 4.0  # raw text budget over all parts (before filtering and dedup)
    seed: int = 0  # picks files, problems, template slots and the eval split
    eval_fraction: float = 0.02  # share of documents held out for evaluation (never trained on)
    shares: dict[str, float] = field(
        default_factory=lambda: {
            "stdlib-code": 0.3,
            "stdlib-repos": 0.25,
            "pydoc": 0.12,
            "docstrings": 0.13,
            "math": 0.15,
            "templates": 0.05,
        }
    )  # fraction of size_mb per part; a missing part is skipped
    max_repo_kb: int = 256  # packages larger than this are left out of stdlib-repos


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _take(items: list, budget: int, size, seed: int, name: str) -> list:
    """Seeded shuffle of `items`, then greedily those that fit in `budget` bytes (the smallest if none fits)."""
    items = sorted(items)
    random.Random(f"{seed}:{name}").shuffle(items)
    out, used = [], 0
    for it in items:
        n = size(it)
        if used + n > budget:
            continue
        out.append(it)
        used += n
        if used >= budget:
            break
    return out or sorted(items, key=size)[:1]


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def stdlib_code(budget: int, seed: int) -> Iterator[Doc]:
    files = [p for p in stdlib_root().glob("*.py")]
    for p in sorted(_take(files, budget, lambda p: p.stat().st_size, seed, "code")):
        yield Doc(
            id=f"stdlib-code/{p.name}", text=_read(p), source="stdlib-code", kind="code", lang="python", path=p.name
        )


def _package_files(pkg: Path) -> dict[str, str]:
    return {
        str(p.relative_to(pkg)): _read(p)
        for p in sorted(pkg.rglob("*.py"))
        if "__pycache__" not in p.parts and "tests" not in p.parts
    }


def stdlib_repos(budget: int, seed: int, max_kb: int) -> Iterator[Doc]:
    pkgs = [
        p
        for p in stdlib_root().iterdir()
        if p.is_dir() and (p / "__init__.py").exists() and p.name not in SKIP_PACKAGES
    ]
    sizes = {p: sum(f.stat().st_size for f in p.rglob("*.py")) for p in pkgs}
    pkgs = [p for p in pkgs if sizes[p] <= max_kb * 1024]
    for p in sorted(_take(pkgs, budget, sizes.get, seed, "repos")):
        yield Doc(
            id=f"stdlib-repos/{p.name}",
            text=repo_document(p.name, _package_files(p), seed),
            source="stdlib-repos",
            kind="repo",
            lang="python",
            path=p.name,
        )


def pydoc_pages(budget: int, seed: int) -> Iterator[Doc]:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    for name in sorted(_take(list(topics), budget, lambda k: len(topics[k]), seed, "pydoc")):
        yield Doc(id=f"pydoc/{name}", text=topics[name], source="pydoc")


def docstrings(budget: int, seed: int, min_words: int = 30) -> Iterator[Doc]:
    """Walk seeded-shuffled stdlib modules, yielding long docstrings until the budget is spent."""
    files = sorted(stdlib_root().glob("*.py"))
    random.Random(f"{seed}:docstrings").shuffle(files)
    used = 0
    for p in files:
        try:
            tree = ast.parse(_read(p))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= min_words:
                    name = getattr(node, "name", "")
                    yield Doc(
                        id=f"docstrings/{p.stem}.{name}:{node.lineno if name else 0}", text=doc, source="docstrings"
                    )
                    used += len(doc)
                    if used >= budget:
                        return


def math_sets(budget: int, seed: int) -> Iterator[Doc]:
    rng, used, i = random.Random(f"{seed}:math"), 0, 0
    while used < budget:
        text = problem_set(rng, n=rng.randint(3, 8))
        yield Doc(id=f"math/{i}", text=text, source="math", kind="math")
        used, i = used + len(text), i + 1


TEMPLATES = [
    (
        "Welcome to {city} {svc} Services, the {svc} specialists of {city}. Since {year} our {count} licensed "
        "technicians have helped homeowners in {area} with every kind of job, large or small. Every visit begins "
        "with a free consultation by {person} and an honest written estimate. Our team arrives within {n} hours, "
        "keeps the work area clean, and explains each step before it starts. Call {phone} to book an appointment "
        "today. We also offer emergency visits on {day}, a {pct} percent senior discount, and flexible payment "
        "plans, and every job is backed by our {n2} year guarantee. Find us at {num} {street} Street, open from "
        "{hour} in the morning."
    ),
    (
        "{name} is a {adj} {room} apartment in the {area} district of {city}. This listing offers a fully "
        "equipped kitchen, {n} beds, fast wireless internet, and a washing machine for longer stays. Guests love "
        "the view of {street} Park and the {n2} minute walk to cafes, shops and public transport. The host, "
        "{person}, has welcomed {count} guests since {year} and is happy to share tips about {city}. Check-in is "
        "from {hour} in the afternoon. The nightly price is {price} dollars, with a {pct} percent discount for "
        "stays of a week or more. Smoking and parties are not allowed on {day}. Book {name} today."
    ),
]
FIRST = ["Maria", "John", "Aiko", "Pedro", "Grace", "Omar", "Linh", "Sara", "Tom", "Ines", "Kwame", "Yara", "Lars"]
LAST = ["Smith", "Garcia", "Tanaka", "Okafor", "Novak", "Silva", "Khan", "Berg", "Rossi", "Cohen", "Park"]
SLOTS = {
    "city": [
        "Springfield",
        "Riverton",
        "Lakeside",
        "Fairview",
        "Georgetown",
        "Salem",
        "Madison",
        "Clinton",
        "Arlington",
        "Ashland",
        "Bristol",
        "Dover",
        "Milton",
        "Oxford",
        "Newport",
        "Auburn",
        "Dayton",
    ],
    "svc": ["plumbing", "roofing", "painting", "electrical", "landscaping", "moving", "cleaning", "flooring"],
    "street": ["Oak", "Main", "Elm", "Pine", "Maple", "Cedar", "Lake", "Hill", "Park", "Walnut", "Birch"],
    "area": ["north", "south", "east", "west", "old town", "harbor", "university", "market", "river"],
    "day": ["weekends", "holidays", "Sundays", "Mondays", "public holidays", "Saturdays"],
    "adj": ["cozy", "bright", "spacious", "modern", "charming", "quiet", "sunny", "elegant"],
    "room": ["one bedroom", "two bedroom", "studio", "three bedroom", "loft", "garden"],
    "name": [
        "Sunny Loft",
        "Garden View",
        "Blue Door",
        "Old Mill",
        "The Nest",
        "Harbor Rest",
        "Green Corner",
        "Red Roof",
        "Quiet Place",
        "City Nook",
    ],
}


def _slot_values(rng: random.Random) -> dict:
    vals = {k: rng.choice(v) for k, v in SLOTS.items()}
    vals.update(
        phone=f"555-{rng.randint(1000, 9999)}",
        n=rng.randint(2, 48),
        n2=rng.randint(2, 30),
        num=rng.randint(1, 999),
        year=rng.randint(1950, 2023),
        count=rng.randint(3, 900),
        pct=rng.randint(5, 40),
        hour=rng.choice(["six", "seven", "eight", "nine", "ten", "two", "three"]),
        price=rng.randint(40, 400),
        person=f"{rng.choice(FIRST)} {rng.choice(LAST)}",
    )
    return vals


def template_pages(budget: int, seed: int) -> Iterator[Doc]:
    rng, used, i = random.Random(f"{seed}:templates"), 0, 0
    while used < budget:
        text = TEMPLATES[i % len(TEMPLATES)].format(**_slot_values(rng))
        yield Doc(id=f"templates/{i}", text=text, source="templates", meta={"template": i % len(TEMPLATES)})
        used, i = used + len(text), i + 1


def all_docs(cfg: CorpusConfig) -> Iterator[Doc]:
    budget = {k: int(v * cfg.size_mb * 1e6) for k, v in cfg.shares.items()}
    parts = {
        "stdlib-code": lambda b: stdlib_code(b, cfg.seed),
        "stdlib-repos": lambda b: stdlib_repos(b, cfg.seed, cfg.max_repo_kb),
        "pydoc": lambda b: pydoc_pages(b, cfg.seed),
        "docstrings": lambda b: docstrings(b, cfg.seed),
        "math": lambda b: math_sets(b, cfg.seed),
        "templates": lambda b: template_pages(b, cfg.seed),
    }
    unknown = set(budget) - set(parts)
    if unknown:
        raise ValueError(f"unknown corpus part(s) {sorted(unknown)}; valid: {sorted(parts)}")
    for name, make in parts.items():
        if budget.get(name, 0) > 0:
            yield from _tag_splits(make(budget[name]), cfg)


def split_of(doc_id: str, cfg: CorpusConfig) -> str:
    return "eval" if unit_hash(cfg.seed, "split", doc_id) < cfg.eval_fraction else "train"


def _tag_splits(docs: Iterator[Doc], cfg: CorpusConfig, hold: int = 4) -> Iterator[Doc]:
    """Set meta["split"] by hash; in a part with at least `hold` documents the shortest of the first `hold` is
    always eval too, so every part is represented in the held-out split even at tiny sizes, without taking a
    big share of a tiny corpus (and a part of 1-3 documents is never emptied for training)."""
    head: list[Doc] | None = []
    for doc in docs:
        doc.meta["split"] = split_of(doc.id, cfg)
        if head is not None and len(head) < hold:
            head.append(doc)
            continue
        if head:
            yield from _hold_out_shortest(head)
            head = None
        yield doc
    if head:
        yield from _hold_out_shortest(head) if len(head) >= hold else head


def _hold_out_shortest(head: list[Doc]) -> list[Doc]:
    min(head, key=lambda d: len(d.text)).meta["split"] = "eval"
    return head


def corpus_docs(cfg: CorpusConfig, split: Literal["train", "eval", "all"] = "train") -> Iterator[Doc]:
    """Documents of one split (meta["split"] says which), in a fixed order."""
    for doc in all_docs(cfg):
        if split == "all" or doc.meta["split"] == split:
            yield doc


def write_jsonl(cfg: CorpusConfig, path: str | os.PathLike, split: str = "train") -> int:
    """Write the corpus as JSONL (for tools that want files); returns the number of documents."""
    import json

    n = 0
    with open(path, "w") as f:
        for doc in corpus_docs(cfg, split):
            f.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")
            n += 1
    return n
