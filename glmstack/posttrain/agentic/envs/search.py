"""A long-horizon search over a generated document set: follow a chain of notes to a secret code word.

Each task generates its own small set of notes, one per person on a chain of `hops` people. The model starts at the
first person's note (`read_note`); every note holds filler facts and names the next person to ask ("Ask Ben for the
code."), and, where there is one, the person after ("Ben will send you to Cleo."): a note can be skipped, so the
chain can be walked in about half the calls. The last note holds the code, a word such as "amber" (a two-digit
number is one rare token of the speedrun tokenizer, which the 128-wide model copied 25% of the time; a word of common
pieces it copies like a name). The task is solved when the final answer names the code word and no other.

With the speedrun tokenizer the prompt (tool schema included) is ~250 tokens and a tool turn (call + note) ~90, so at
level 1 (4-5 notes) an episode that reads every note runs past the 512 positions of the speedrun model unless older
notes are folded (posttrain/agentic/context.py): only the latest note is needed to go on, which is what GLM-5's
keep-recent-k context management bets on (research/wave3-facts.md §6). Levels: 0 = 2-3 notes (fits without
management), 1 = 4-5 notes (fits with the older notes stubbed), 2 = 8-10 notes (fits only when old tool turns are
discarded, or with the skips under keep-last-1). With a call budget below the chain's length (EnvOptions.max_tool_calls)
only an agent that skips notes can finish: what agentic RL has to learn beyond a demonstrator that rarely skips.
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
CODES = ["amber", "coral", "ivory", "lemon", "olive", "pearl", "ruby", "sage", "cedar", "maple", "birch", "indigo",
         "copper", "silver", "falcon", "otter", "badger", "heron", "cobalt", "golden"]  # fmt: skip
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
        code = rng.choice(CODES)
        notes = {}
        for i, who in enumerate(chain):
            last = f"The secret code is {code}." if i == len(chain) - 1 else f"Ask {chain[i + 1]} for the code."
            if i + 2 < len(chain):
                last += f" {chain[i + 1]} will send you to {chain[i + 2]}."
            notes[who] = " ".join([f"Note of {who}.", *filler(rng, who), last])
        return {"question": f"Find the secret code. Start with the note of {chain[0]}.", "notes": notes,
                "chain": chain, "code": code}  # fmt: skip

    def call(self, name: str, args: dict) -> str:
        who = str(args.get("name", "")).strip()
        return self.spec["notes"].get(who, f"Error: no note of {who}")

    def success(self) -> bool:
        """The answer names the code word and no other: listing every code word is not a solution."""
        text = str((self.final or {}).get("content") or "")
        return {w for w in re.findall(r"[a-z]+", text.lower()) if w in CODES} == {self.spec["code"]}


def route(chain: list[str], rng: random.Random, skip_p: float) -> list[str]:
    """The notes an agent reads walking `chain`: from each note it skips to the person after next, where the note
    names one, with probability `skip_p` (0: every note, 1: the fewest calls — ceil(len/2) or one more)."""
    i, out = 0, [chain[0]]
    while i < len(chain) - 1:
        i += 2 if i + 2 < len(chain) and rng.random() < skip_p else 1
        out.append(chain[i])
    return out
