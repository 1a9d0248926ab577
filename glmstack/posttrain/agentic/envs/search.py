"""A long-horizon search over a generated document set: follow a chain of notes to a secret code.

Each task generates its own small set of notes, one per person on a chain of `hops` people plus a few distractors.
The model starts at the first person's note (`read_note`); every note holds filler facts and names the next person
to ask ("Ask Ben for the code."); the last note holds the code. The task is solved when the final answer states the
code. With the speedrun tokenizer the prompt (tool schema included) is ~250 tokens and a tool turn (call + note)
~80, so at level 1 (4-5 notes) an episode runs past the 512 positions of the speedrun model unless older notes are
folded (posttrain/agentic/context.py): only the latest note is needed to go on, which is what GLM-5's keep-recent-k
context management bets on (research/wave3-facts.md §6). Levels: 0 = 2-3 notes (fits without management),
1 = 4-5 notes (fits with the older notes stubbed), 2 = 8-10 notes (fits only when old tool turns are discarded).
"""

from __future__ import annotations

import random
import re

from glmstack.posttrain.agentic.env import ToolEnv, register
from glmstack.posttrain.agentic.envs.functions import function

PEOPLE = ["Ana", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena", "Milo", "Nora"]
ITEMS = ["apples", "books", "coins", "pens", "shells", "stamps", "marbles", "cards", "eggs", "stones"]
CITIES = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo", "Egypt": "Cairo", "Peru": "Lima",
          "Kenya": "Nairobi", "Norway": "Oslo", "Greece": "Athens", "Chile": "Santiago"}  # fmt: skip
HOPS = {0: (2, 3), 1: (4, 5), 2: (8, 10)}  # notes on the chain, by level
FILLER = 3  # filler sentences per note
SEARCH_TOOLS = [function("read_note", "Read the note of a person.", name={"type": "string"})]


def filler(rng: random.Random, who: str) -> list[str]:
    out = []
    for _ in range(FILLER):
        if rng.random() < 0.5:
            out.append(f"{who} has {rng.randint(2, 9)} {rng.choice(ITEMS)}.")
        else:
            country = rng.choice(sorted(CITIES))
            out.append(f"The capital of {country} is {CITIES[country]}.")
    return out


@register
class SearchEnv(ToolEnv):
    name = "search"
    tools = SEARCH_TOOLS

    @classmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        lo, hi = HOPS.get(level, HOPS[max(HOPS)])
        chain = rng.sample(PEOPLE, rng.randint(lo, hi))
        code = rng.randint(10, 99)
        notes = {}
        for i, who in enumerate(chain):
            last = f"The secret code is {code}." if i == len(chain) - 1 else f"Ask {chain[i + 1]} for the code."
            notes[who] = " ".join([f"Note of {who}.", *filler(rng, who), last])
        return {"question": f"Find the secret code. Start with the note of {chain[0]}.", "notes": notes,
                "chain": chain, "code": code}  # fmt: skip

    def call(self, name: str, args: dict) -> str:
        who = str(args.get("name", "")).strip()
        return self.spec["notes"].get(who, f"Error: no note of {who}")

    def success(self) -> bool:
        text = str((self.final or {}).get("content") or "")
        return str(self.spec["code"]) in re.findall(r"\d+", text)

    @classmethod
    def solution(cls, spec: dict) -> list[tuple[str, dict]]:
        """The calls that solve the task, in order (the SFT set and the tests use it)."""
        return [("read_note", {"name": who}) for who in spec["chain"]]
