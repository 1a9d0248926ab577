"""Executable BFCL-style functions over several user turns: an inventory API whose calls really change a state.

Like BFCL's multi-turn category, each user turn asks for something the functions can do, later turns build on
earlier ones, and the episode is checked on the final state (every item's stock as the requests imply) plus the
last answer (it must state the stock asked for). A reply without a call moves to the next user turn.
"""

from __future__ import annotations

import random

from glmstack.posttrain.agentic.env import Step, ToolEnv, register

ITEMS = ["apples", "pens", "books", "coins", "cards", "eggs"]


def function(fn_name: str, description: str, **props) -> dict:
    """An OpenAI tool definition whose parameters are all required."""
    return {"type": "function", "function": {"name": fn_name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}  # fmt: skip


FUNCTIONS = [
    function(
        "add_item", "Add qty units of an item to the inventory.", name={"type": "string"}, qty={"type": "integer"}
    ),
    function("remove_item", "Remove qty units of an item.", name={"type": "string"}, qty={"type": "integer"}),
    function("get_stock", "How many units of an item are in stock.", name={"type": "string"}),
]


@register
class FunctionsEnv(ToolEnv):
    name = "functions"
    tools = FUNCTIONS

    @classmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        item = rng.choice(ITEMS)
        add, remove = rng.randint(3, 9), rng.randint(1, 3)
        turns = [f"Add {add} {item} to the inventory.", f"Now remove {remove} {item}. How many {item} are left?"]
        if level > 0:
            other = rng.choice([i for i in ITEMS if i != item])
            turns.insert(1, f"Also add {remove + 1} {other}.")
        return {"turns": turns, "item": item, "add": add, "remove": remove, "level": level}

    def setup(self, spec: dict) -> None:
        self.stock: dict[str, int] = {}
        self.turn = 0

    def prompt(self, spec: dict) -> list[dict]:
        return [{"role": "user", "content": spec["turns"][0]}]

    def call(self, name: str, args: dict) -> str:
        item, qty = str(args.get("name", "")), int(args.get("qty", 0) or 0)
        if name == "get_stock":
            return str(self.stock.get(item, 0))
        if qty <= 0:
            return "Error: qty must be a positive integer"
        if name == "remove_item":
            if self.stock.get(item, 0) < qty:
                return f"Error: only {self.stock.get(item, 0)} {item} in stock"
            qty = -qty
        self.stock[item] = self.stock.get(item, 0) + qty
        return f"ok: {self.stock[item]} {item} in stock"

    def answer(self, message: dict) -> Step:
        self.turn += 1
        if self.turn < len(self.spec["turns"]):
            return Step([{"role": "user", "content": self.spec["turns"][self.turn]}], False)
        return super().answer(message)

    def expected_state(self) -> dict[str, int]:
        s = self.spec
        want = {s["item"]: s["add"] - s["remove"]}
        if s["level"] > 0:
            other = s["turns"][1].split()[-1].rstrip(".")
            want[other] = s["remove"] + 1
        return want

    def success(self) -> bool:
        content = (self.final or {}).get("content") or ""
        want = self.expected_state()
        return self.stock == want and str(want[self.spec["item"]]) in content
