"""Synthetic SFT sets generated offline, each with a held-out split and a verifier (issue 14, item 3).

Sets (GLM-4.5's three experts at toy scale, research/post-training-recipe.md §5):
  arithmetic  sums, differences, products and word problems; worked reasoning in the thinking block, the checkable
              answer in the content ("The answer is 19.")
  tools       a calculator and a python tool: the assistant calls one, reads the result and answers. Python results
              are what glmstack.sandbox really printed when the set was generated.
  chat        multi-turn chat under a system prompt that names the assistant; questions from small fact tables
  tools_recovery  (not in SETS: opt in with "synthetic:tools_recovery") the tools set's tasks where the first call
              (or the first two) fails with one of agentic RL's injected tool failures (posttrain.tools.FAULTS)
              and the assistant calls again, reads the result and answers: recovery behaviour agentic RL with fault
              injection can then reinforce (docs/agentic.md, session 6)
  search      (opt-in: "synthetic:search") one assistant turn of the agentic `search` environment (follow a chain of
              notes to a secret code, posttrain/agentic/envs/search.py), in the context the agent sees at that turn:
              all tool results, or under keep-last-1 context management every note but the latest replaced by the
              stub (agentic/context.py). Earlier turns are context ("train": false); the turn itself is the next
              call (read the person the latest note names, or 30% of the time the one it says comes after) or the
              answer. Tasks of the environment's training split
  search_unmanaged  (opt-in) the same turns at level 0 (2-3 notes) with every note kept: the data of a teacher
              that never folded its context (issue 40: does RL under management adapt such a policy to it?)
  compare     the larger / smaller of two or three one-digit numbers ("Which is the largest of 3, 8 and 5?"); the
              reasoning orders them, the content gives the answer as the arithmetic set does. A task a tiny model can partly
              solve after SFT (copying one of the numbers scores 1/2 or 1/3), so reasoning RL has room to improve it
              (glmstack.posttrain.rl.tasks' `compare` draws from the same generator and the same held-out split)
Every item comes in two variants, thinking on and off (hybrid reasoning, GLM-4.5 §3.1): with thinking off the
record sets `enable_thinking: false` and has no reasoning, so the template's switch decides.
`thinking_mode` (GLM-5's modes, glmstack.chat.modes) changes that and is written into each record: "interleaved"
and "preserved" records all think (reasoning before every response and tool call; how earlier turns' reasoning is
kept is the mode's layout at encoding time); "turn" switches thinking per user turn in the multi-turn chat set (each
turn on or off at random) and per record elsewhere, the record's `enable_thinking` being its last turn's switch.

Each record is an SFT record (`messages`, `tools`, `enable_thinking`) plus `meta` = {set, split, answer, tool,
prompt_turns}: `messages[:prompt_turns]` is the prompt a held-out evaluation or rejection sampling starts from.
The split is a hash of the prompt text (1 in 5 held out), so train and test never share a prompt.

    glmstack sft-data --out data/sft --n 2000        # writes <set>.train.jsonl and <set>.test.jsonl per set
    glmstack sft-data --out data/sft --thinking-mode preserved    # <set>.preserved.train.jsonl, ...
"""

from __future__ import annotations

import argparse
import functools
import random
import re
from pathlib import Path

from glmstack.chat.modes import MODES
from glmstack.posttrain.tools import CALCULATOR, FAULTS, PYTHON, TOOLS, calculate, run_python
from glmstack.splits import split_of

SETS = ("arithmetic", "tools", "chat", "compare")
# generated only when named (sft-data's and the SFT recipes' defaults: not)
OPT_IN_SETS = ("tools_recovery", "search", "search_unmanaged")
SEARCH_SKIP_P = 0.3  # how often the search teacher skips a note it may skip (search_record)

NAMES = ["Ana", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena", "Milo", "Nora"]
ITEMS = ["apples", "books", "coins", "pens", "shells", "stamps", "marbles", "cards", "eggs", "stones"]
CAPITALS = {
    "France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Germany": "Berlin", "Japan": "Tokyo", "Egypt": "Cairo",
    "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo", "Greece": "Athens", "Canada": "Ottawa", "Chile": "Santiago",
    "Poland": "Warsaw", "Cuba": "Havana", "Ireland": "Dublin", "Portugal": "Lisbon",
}  # fmt: skip
OPPOSITES = {"hot": "cold", "big": "small", "up": "down", "day": "night", "fast": "slow", "open": "closed",
             "early": "late", "light": "dark", "full": "empty", "happy": "sad"}  # fmt: skip
ASSISTANT_NAMES = ["Glim", "Orla", "Pax", "Quill", "Rune", "Sol", "Tova", "Vega", "Wren", "Zed"]
WORDS = ["python", "banana", "keyboard", "sandbox", "rocket", "garden", "window", "thunder", "planet", "silver"]


_PY_OUTPUTS: dict[str, str] = {}  # code -> what the sandbox printed (deterministic programs: run each once)




# ---------------------------------------------------------------------------------------------- arithmetic
def arithmetic_item(rng: random.Random) -> tuple[str, str, int]:
    """(question, worked reasoning, answer)."""
    kind = rng.choice(["add", "sub", "mul", "word_add", "word_sub", "word_mul"])
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if kind in ("add", "word_add"):
        a, b = rng.randint(2, 60), rng.randint(2, 39)
        c, step = a + b, f"{a} + {b} = {a + b}"
    elif kind in ("sub", "word_sub"):
        a = rng.randint(10, 99)
        b = rng.randint(1, a - 1)
        c, step = a - b, f"{a} - {b} = {a - b}"
    else:
        a, b = rng.randint(2, 12), rng.randint(2, 9)
        c, step = a * b, f"{a} * {b} = {a * b}"
    question = {
        "add": f"What is {a} + {b}?",
        "sub": f"What is {a} - {b}?",
        "mul": f"What is {a} times {b}?",
        "word_add": f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
        "word_sub": f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
        "word_mul": f"{name} has {a} bags with {b} {item} in each. How many {item} is that in total?",
    }[kind]
    lead = {"add": "We add.", "sub": "We subtract.", "mul": "We multiply.",
            "word_add": f"{name} starts with {a} and gets {b} more, so we add.",
            "word_sub": f"{name} starts with {a} and gives away {b}, so we subtract.",
            "word_mul": f"{a} bags of {b} each, so we multiply."}[kind]  # fmt: skip
    return question, f"{lead} {step}.", c


def answer_record(set_name: str, item: tuple[str, str, int], thinking: bool) -> dict:
    """A (question, worked reasoning, answer) item as a one-exchange record: "The answer is N.", reasoning when
    thinking."""
    question, reasoning, answer = item
    reply = {"role": "assistant", "content": f"The answer is {answer}."}
    if thinking:
        reply["reasoning_content"] = reasoning
    return _record(set_name, [{"role": "user", "content": question}, reply], None, thinking, str(answer), None)


def arithmetic_record(rng: random.Random, thinking: bool) -> dict:
    return answer_record("arithmetic", arithmetic_item(rng), thinking)


# ---------------------------------------------------------------------------------------------- compare
COMPARE_LEVELS = 4  # the SFT set's levels; numbers to compare: 2 + level // 2 (2, 2, 3, 3); odd levels ask for the
#   smaller one too. RL may go past what SFT showed: levels 4-7 are the same with two-digit numbers.


def compare_item(rng: random.Random, level: int) -> tuple[str, str, int]:
    """(question, worked reasoning, answer): the largest (or smallest) of distinct one-digit numbers; level 0 the
    larger of two, 1 the larger or smaller of two, 2 the largest of three, 3 the largest or smallest of three;
    levels 4-7 the same with two-digit numbers (beyond the SFT set, for RL)."""
    level = max(0, min(level, 7))
    nums = rng.sample(range(10, 100) if level >= 4 else range(10), 2 + (level % 4) // 2)
    want = "smallest" if level % 2 and rng.random() < 0.5 else "largest"
    answer = max(nums) if want == "largest" else min(nums)
    if len(nums) == 2:
        question = f"Which is {'larger' if want == 'largest' else 'smaller'}, {nums[0]} or {nums[1]}?"
    else:
        question = f"Which is the {want} of {', '.join(map(str, nums[:-1]))} and {nums[-1]}?"
    return question, f"In order: {' < '.join(map(str, sorted(nums)))}.", answer


def compare_record(rng: random.Random, thinking: bool) -> dict:
    return answer_record("compare", compare_item(rng, rng.randrange(COMPARE_LEVELS)), thinking)


# ---------------------------------------------------------------------------------------------- tools
def tool_item(rng: random.Random) -> tuple[str, str, dict, str]:
    """(question, tool name, arguments, thought before calling)."""
    if rng.random() < 0.5:
        a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(2, 9)
        expr = rng.choice([f"{a} * {b}", f"{a} * {b} + {c}", f"({a} + {b}) * {c}", f"{a * c} / {c}"])
        question = rng.choice(["Use the calculator to compute {e}.", "Please calculate {e}.", "What is {e}?"])
        return question.format(e=expr), "calculator", {"expression": expr}, f"I will use the calculator for {expr}."
    word, n = rng.choice(WORDS), rng.randint(3, 12)
    kind = rng.choice(["sum", "reverse", "vowels", "square", "factorial"])
    question, code = {
        "sum": (f"Use Python to add up the numbers from 1 to {n}.", f"print(sum(range(1, {n} + 1)))"),
        "reverse": (f"Use Python to reverse the word '{word}'.", f"print('{word}'[::-1])"),
        "vowels": (f"Use Python to count the vowels in '{word}'.", f"print(sum(c in 'aeiou' for c in '{word}'))"),
        "square": (f"Use Python to list the squares of 1 to {n % 6 + 2}.",
                   f"print([i * i for i in range(1, {n % 6 + 2} + 1)])"),
        "factorial": (f"Use Python to compute the factorial of {n}.", f"import math\nprint(math.factorial({n}))"),
    }[kind]  # fmt: skip
    return question, "python", {"code": code}, "I will run Python for this."


def tool_record(rng: random.Random, thinking: bool) -> dict:
    question, tool, args, thought = tool_item(rng)
    if tool == "calculator":
        result = str(calculate(args["expression"]))
    else:
        if args["code"] not in _PY_OUTPUTS:
            _PY_OUTPUTS[args["code"]] = run_python(args["code"])  # the sandbox really runs it
        result = _PY_OUTPUTS[args["code"]]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
            "function": {"name": tool, "arguments": args}}]}  # fmt: skip
    answer = {"role": "assistant", "content": f"The result is {result}."}
    if thinking:
        call["reasoning_content"] = thought
        answer["reasoning_content"] = f"The {tool} returned {result}."
    messages = [{"role": "user", "content": question}, call, {"role": "tool", "content": result}, answer]
    return _record("tools", messages, TOOLS, thinking, result, tool)


def recovery_record(rng: random.Random, thinking: bool) -> dict:
    """A tools-set conversation whose first call (a quarter of the time the first two) returned an injected
    failure; the assistant repeats the same call until it runs. Only the assistant's turns are trained (the
    failure texts are tool messages, context)."""
    rec = tool_record(rng, thinking)
    question, call, result, answer = rec["messages"]
    tool = rec["meta"]["tool"]
    failures = []
    for _ in range(1 if rng.random() < 0.75 else 2):
        failures.append(call)
        failures.append({"role": "tool", "content": FAULTS[rng.choice(sorted(FAULTS))].format(name=tool)})
    retry = dict(call)
    if thinking:
        retry["reasoning_content"] = f"The {tool} call failed; I will call it again."
    messages = [question, *failures, retry, result, answer]
    return _record("tools_recovery", messages, TOOLS, thinking, rec["meta"]["answer"], tool)


def search_record(rng: random.Random, thinking: bool, managed: bool = True) -> dict:
    """One turn of a `search` episode in the context the agent sees then (module docstring); `managed=False`: level 0
    with every note kept (search_unmanaged: a teacher that never folded its context). The teacher skips a note where
    the note names the person after next with probability SEARCH_SKIP_P (a demonstrator that rarely takes the
    shortcut: agentic RL under a call budget has to learn to take it)."""
    import json

    from glmstack.posttrain.agentic.context import STUB
    from glmstack.posttrain.agentic.envs.search import SearchEnv, route

    level = rng.choice([0, 1]) if managed else 0
    spec = SearchEnv.make_spec(rng, level)
    path = route(spec["chain"], rng, SEARCH_SKIP_P)
    turn = rng.randint(0, len(path))
    keep_all = not managed or (level == 0 and rng.random() < 0.5)  # without management; level 1 would not fit then
    messages = [{"role": "user", "content": spec["question"]}]
    for i, who in enumerate(path[:turn]):
        note = spec["notes"][who] if keep_all or i == turn - 1 else STUB
        messages += [_read_note(who) | {"train": False}, {"role": "tool", "content": note}]
    if turn < len(path):
        reply = _read_note(path[turn])
        thought = f"The note names {path[turn]}." if turn else f"I start with the note of {path[0]}."
    else:
        reply = {"role": "assistant", "content": f"The secret code is {spec['code']}."}
        thought = f"The note of {path[-1]} gives the code."
    messages.append(reply | ({"reasoning_content": thought} if thinking else {}))
    meta = {"set": "search" if managed else "search_unmanaged", "split": split_of(json.dumps(spec, sort_keys=True)),
            "answer": str(spec["code"]), "tool": "read_note", "prompt_turns": len(messages) - 1, "level": level}  # fmt: skip
    if turn < len(path):  # the call's result follows (context), so the call ends in <|observation|> as in an episode
        messages.append({"role": "tool", "content": spec["notes"][path[turn]]})
    return {"messages": messages, "tools": SearchEnv.tools, "enable_thinking": thinking, "meta": meta}


def _read_note(who: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "read_note", "arguments": {"name": who}}}]}  # fmt: skip


# ---------------------------------------------------------------------------------------------- chat
def chat_exchange(rng: random.Random, name: str) -> tuple[str, str, str, str]:
    """(question, thought, reply, the word the reply must contain)."""
    kind = rng.choice(["capital", "capital", "opposite", "name"])
    if kind == "capital":
        country = rng.choice(sorted(CAPITALS))
        city = CAPITALS[country]
        return (f"What is the capital of {country}?", f"The capital of {country} is {city}.",
                f"The capital of {country} is {city}.", city)  # fmt: skip
    if kind == "opposite":
        word = rng.choice(sorted(OPPOSITES))
        return (f"What is the opposite of {word}?", f"The opposite of {word} is {OPPOSITES[word]}.",
                f"The opposite of {word} is {OPPOSITES[word]}.", OPPOSITES[word])  # fmt: skip
    return ("What is your name?", f"The system prompt says my name is {name}.", f"My name is {name}.", name)


def chat_record(rng: random.Random, thinking: bool, per_turn: bool = False) -> dict:
    """per_turn: each turn thinks or not at random (turn-level thinking); the record's switch is the last turn's."""
    name = rng.choice(ASSISTANT_NAMES)
    messages = [{"role": "system", "content": f"You are {name}, a helpful assistant. Answer in one sentence."}]
    for turn in range(rng.randint(1, 3)):
        question, thought, reply, must = chat_exchange(rng, name)
        if per_turn:
            thinking = rng.random() < 0.5
        messages.append({"role": "user", "content": question if turn else f"Hello! {question}"})
        messages.append({"role": "assistant", "content": reply} | ({"reasoning_content": thought} if thinking else {}))
    return _record("chat", messages, None, thinking, must, None)


# ---------------------------------------------------------------------------------------------- records
RECORDS = {"arithmetic": arithmetic_record, "tools": tool_record, "tools_recovery": recovery_record,
           "compare": compare_record, "search": search_record, "chat": chat_record,
           "search_unmanaged": functools.partial(search_record, managed=False)}  # fmt: skip


def _record(set_name, messages, tools, thinking, answer, tool) -> dict:
    """The SFT record; the prompt of a held-out evaluation is everything before the first assistant turn after
    the last user turn (for tool items: before the call)."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    key = " | ".join(str(m.get("content")) for m in messages[: last_user + 1])
    meta = {"set": set_name, "split": split_of(key), "answer": answer, "tool": tool, "prompt_turns": last_user + 1}
    return {"messages": messages, "tools": tools, "enable_thinking": thinking, "meta": meta}


def generate(set_name: str, n: int, seed: int = 0, split: str = "train", thinking_mode: str = "") -> list[dict]:
    """`n` records of one set in `split` (half with thinking on, half off; `thinking_mode`: module docstring),
    deterministic in `seed`."""
    if set_name not in SETS + OPT_IN_SETS:
        raise ValueError(f"unknown synthetic set {set_name!r} (expected one of {', '.join(SETS + OPT_IN_SETS)})")
    if thinking_mode and thinking_mode not in MODES:
        raise ValueError(f"unknown thinking mode {thinking_mode!r} (expected one of {', '.join(MODES)})")
    rng = random.Random(f"{set_name}:{seed}")
    out, tries = [], 0
    while len(out) < n and tries < 50 * n + 1000:
        tries += 1
        thinking = len(out) % 2 == 0 or thinking_mode in ("interleaved", "preserved")
        rec = RECORDS[set_name](rng, thinking, **({"per_turn": thinking_mode == "turn"} if set_name == "chat" else {}))
        if rec["meta"]["split"] == split:
            out.append(rec | ({"thinking_mode": thinking_mode} if thinking_mode else {}))
    return out


# ---------------------------------------------------------------------------------------------- verifiers
_INT = re.compile(r"-?\d+")


def verify(meta: dict, reply: dict, tool_calls: list[dict] | None = None) -> bool:
    """Whether the final assistant message `reply` (and, for tool items, the calls made) solves the item."""
    content = reply.get("content") or ""
    if meta["set"] in ("arithmetic", "compare"):
        found = _INT.findall(content)
        return bool(found) and found[-1] == meta["answer"]
    if meta["set"] in ("tools", "tools_recovery"):
        called = [c["function"]["name"] for c in tool_calls or []]
        return meta["tool"] in called and meta["answer"] in content
    return meta["answer"].lower() in content.lower()


def set_file(name: str, split: str, thinking_mode: str = "") -> str:
    """The file name of a written set: `<set>.<split>.jsonl`, `<set>.<mode>.<split>.jsonl` in a thinking mode."""
    return f"{name}.{thinking_mode}.{split}.jsonl" if thinking_mode else f"{name}.{split}.jsonl"


def prompt_of(record: dict) -> list[dict]:
    return record["messages"][: record["meta"]["prompt_turns"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="glmstack sft-data", description="write the synthetic SFT sets as JSONL")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--n", type=int, default=2000, help="training records per set")
    ap.add_argument("--n-test", type=int, default=200, help="held-out records per set")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--thinking-mode",
        default="",
        choices=("", *MODES),
        help="GLM-5 thinking mode written into every record (default: half thinking on, half off)",
    )
    args = ap.parse_args(argv)
    from glmstack.posttrain.sft_data import write_jsonl

    for name in args.sets.split(","):
        for split, n in (("train", args.n), ("test", args.n_test)):
            records = generate(name, n, args.seed, split, args.thinking_mode)
            path = write_jsonl(records, Path(args.out) / set_file(name, split, args.thinking_mode))
            print(f"{path}: {n} records")
    return 0


__all__ = ["CALCULATOR", "OPT_IN_SETS", "PYTHON", "SETS", "TOOLS", "generate", "prompt_of", "verify"]
