"""Procedural math text with worked solutions: arithmetic chains, word problems, linear equations.

The default corpus needs math/reasoning text that ships with no download; GLM-4.5 up-samples math & science
in pre-training and trains on synthetic reasoning in mid-training. Each generator draws from a
`random.Random`, so a seed gives the same problems everywhere. Problems are grouped into short "problem set"
documents, closer to real math pages than one-line records.
"""

from __future__ import annotations

import random

NAMES = [
    "Ava",
    "Ben",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Goran",
    "Hana",
    "Ivan",
    "Jia",
    "Kofi",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tariq",
    "Uma",
    "Victor",
    "Wen",
    "Yusuf",
    "Zoe",
]
ITEMS = [
    ("apple", 2),
    ("notebook", 3),
    ("pencil", 1),
    ("book", 12),
    ("ticket", 15),
    ("sandwich", 6),
    ("marble", 1),
    ("plant", 8),
    ("shirt", 20),
    ("bottle of juice", 4),
]


def arithmetic(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 999)
    op = rng.choice(["+", "-"])
    ab = a * b
    res = ab + c if op == "+" else ab - c
    return (
        f"Compute {a} * {b} {op} {c}.\nSolution: Multiplication comes first: {a} * {b} = {ab}. "
        f"Then {ab} {op} {c} = {res}.\nAnswer: {res}"
    )


def shopping(rng: random.Random) -> str:
    name = rng.choice(NAMES)
    (item, price), n = rng.choice(ITEMS), rng.randint(2, 12)
    money = price * n + rng.randint(0, 50)
    total = price * n
    return (
        f"{name} buys {n} {item}s at ${price} each and pays with ${money}. How much change does {name} get?\n"
        f"Solution: The {item}s cost {n} * {price} = ${total}. The change is {money} - {total} = "
        f"${money - total}.\nAnswer: {money - total}"
    )


def travel(rng: random.Random) -> str:
    name, speed, hours = rng.choice(NAMES), rng.randint(3, 90), rng.randint(2, 9)
    extra = rng.randint(1, 60)
    dist = speed * hours
    return (
        f"{name} travels at {speed} km per hour for {hours} hours, then walks another {extra} km. "
        f"How far does {name} go in total?\nSolution: Riding covers {speed} * {hours} = {dist} km. "
        f"Adding the walk gives {dist} + {extra} = {dist + extra} km.\nAnswer: {dist + extra}"
    )


def sharing(rng: random.Random) -> str:
    a, b = rng.sample(NAMES, 2)
    k, each = rng.randint(2, 9), rng.randint(3, 40)
    total, kept = k * each, rng.randint(1, 20)
    return (
        f"{a} has {total + kept} stickers, keeps {kept} and shares the rest equally among {k} friends, "
        f"including {b}. How many stickers does {b} get?\nSolution: {a} shares {total + kept} - {kept} = "
        f"{total} stickers. Each friend gets {total} / {k} = {each}.\nAnswer: {each}"
    )


def percent(rng: random.Random) -> str:
    price, pct = rng.randint(2, 60) * 10, rng.choice([5, 10, 15, 20, 25, 30, 40, 50])
    off = price * pct // 100
    return (
        f"A jacket costs ${price}. It is on sale for {pct}% off. What is the sale price?\n"
        f"Solution: {pct}% of {price} is {price} * {pct} / 100 = {off}. The sale price is {price} - {off} = "
        f"${price - off}.\nAnswer: {price - off}"
    )


def linear(rng: random.Random) -> str:
    a, x, b = rng.randint(2, 12), rng.randint(-20, 20), rng.randint(-50, 50)
    c = a * x + b
    return (
        (
            f"Solve for x: {a}x + {b} = {c}.\nSolution: Subtract {b} from both sides: {a}x = {c} - {b} = {c - b}. "
            f"Divide by {a}: x = {c - b} / {a} = {x}.\nAnswer: x = {x}"
        )
        .replace("+ -", "- ")
        .replace("- -", "+ ")
    )


GENERATORS = [arithmetic, shopping, travel, sharing, percent, linear]


def problem_set(rng: random.Random, n: int = 6) -> str:
    """A short document of `n` problems drawn from the generators."""
    title = rng.choice(["Practice problems", "Worked examples", "Homework solutions", "Exercise set"])
    probs = [f"Problem {i + 1}. {rng.choice(GENERATORS)(rng)}" for i in range(n)]
    return f"{title}\n\n" + "\n\n".join(probs) + "\n"
