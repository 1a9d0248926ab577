"""Procedural RL tasks with held-out splits: problems made on demand from a seed, at a difficulty level.

Why procedural: reasoning RL needs an endless supply of problems with checkable answers and a difficulty knob
(GLM-4.5 §3.2's curriculum moves from moderate to very hard problems); a generator gives both, and a hash of the
problem text decides its split, so a held-out problem is never trained on.

Tasks (`TASKS`, by name; `make_task(name, tokenizer, style)`):
  arithmetic  chat prompts in GLM's format ("What is 7 + 5?"); level 0: sums of one-digit numbers, level 1: sums up
              to 2 digits and differences, level 2+: glmstack.posttrain.synthetic's full arithmetic set (sums,
              differences, products, word problems). Reward `arithmetic` (the SFT set's verifier on the parsed reply).
  compare     "Which is the largest of 3, 8 and 5?": the larger / smaller of two (levels 0-1) or three (level 2+)
              one-digit numbers, from the SFT set's own generator (glmstack.posttrain.synthetic.compare_item) and held-out
              split; a tiny SFT model partly solves it (copying one number scores 1/2 or 1/3). Reward `arithmetic`.
  reasoning_gym:<name>
              a dataset of the `reasoning-gym` package (PyPI; e.g. reasoning_gym:basic_arithmetic, :number_sorting,
              :leg_counting): one problem per draw from the dataset's own generator, seeded by our rng; `level` is the
              dataset's curriculum global level where it has one. Reward `reasoning_gym` (the dataset's scorer).
  code        "Write a Python function f(x) that ..." with hidden unit tests run in glmstack.sandbox (reward `code`).
  tools       the SFT tools set's first turn with the calculator and python tools offered (reward `tool_call`)
  chat        the SFT chat set's first turn under a naming system prompt (reward `chat_fact`)
  toy         token-id prompts, no tokenizer: the first response token is right when its id ≡ prompt[0] + level
              (mod 4) (reward `toy`; a random policy scores 1/4); tiny enough for unit tests and gradient checks.

A Problem is `prompt_ids` (what the rollout engine is given, tokens in) + `meta` (what the reward reads).

    task = make_task("arithmetic", tokenizer, "glm-4.5")
    problems = task.problems(split="train", n=8, seed=3, level=0)
"""

from __future__ import annotations

import abc
import random
from dataclasses import dataclass, field

from glmstack.splits import split_of


@dataclass
class Problem:
    prompt_ids: list[int]
    meta: dict = field(default_factory=dict)  # the task name, the answer, the tests: what the reward reads




class Task(abc.ABC):
    """A generator of problems: `item(rng, level) -> (key text, meta)`; `encode(meta) -> prompt ids`."""

    name = "task"
    rewards: tuple[str, ...] = ()  # the rewards that score it (glmstack.posttrain.rl.rewards)

    def problems(self, *, split: str, n: int, seed: int, level: int = 0) -> list[Problem]:
        """`n` problems of `split` at `level`, a pure function of the arguments."""
        rng = random.Random(f"{self.name}:{level}:{seed}")
        out, tries = [], 0
        while len(out) < n:
            tries += 1
            if tries > 1000 * n + 1000:
                raise ValueError(f"task {self.name} level {level}: cannot find {n} {split} problems")
            key, meta = self.item(rng, level)
            if split_of(key) == split:
                out.append(Problem(self.encode(meta), meta | {"task": self.name, "level": level}))
        return out

    @abc.abstractmethod
    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        """One problem: (the text its held-out split is hashed from, its metadata)."""

    @abc.abstractmethod
    def encode(self, meta: dict) -> list[int]:
        """The prompt's token ids."""


class ChatTask(Task):
    """A task whose prompt is one user message rendered in GLM's chat format with the generation prompt."""

    def __init__(self, tokenizer, style: str = "glm-4.5", thinking: bool = False):
        if tokenizer is None:
            raise ValueError(f"task {self.name} needs a tokenizer (init_from a folder with tokenizer.json)")
        self.tokenizer, self.style, self.thinking = tokenizer, style, thinking

    tools: list[dict] | None = None  # the tools the prompt offers

    def encode(self, meta: dict) -> list[int]:
        from glmstack.chat import render

        messages = meta.get("messages") or [{"role": "user", "content": meta["question"]}]
        text = render(messages, self.tools, style=self.style, enable_thinking=self.thinking,
                      add_generation_prompt=True)  # fmt: skip
        return self.tokenizer.encode(text)


class Arithmetic(ChatTask):
    name = "arithmetic"
    rewards = ("arithmetic",)

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        if level <= 0:
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            q, ans = f"What is {a} + {b}?", a + b
        elif level == 1:
            a, b = rng.randint(2, 60), rng.randint(2, 39)
            q, ans = (f"What is {a} + {b}?", a + b) if rng.random() < 0.5 else (f"What is {a + b} - {b}?", a)
        else:
            from glmstack.posttrain.synthetic import arithmetic_item

            q, _, ans = arithmetic_item(rng)
        return q, {"question": q, "answer": str(ans)}


class Compare(ChatTask):
    name = "compare"
    rewards = ("arithmetic",)  # the last integer of the reply is the answer, as for arithmetic

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        from glmstack.posttrain.synthetic import compare_item

        q, _, ans = compare_item(rng, level)
        return q, {"question": q, "answer": str(ans)}


class ReasoningGym(ChatTask):
    """A reasoning-gym dataset as a task: `reasoning_gym:<dataset>` (the package's 100+ procedural generators)."""

    rewards = ("reasoning_gym",)
    PREFIX = "reasoning_gym:"

    def __init__(self, dataset: str, tokenizer, style: str = "glm-4.5", thinking: bool = False):
        from reasoning_gym import factory

        if dataset not in factory.DATASETS:
            raise ValueError(f"reasoning-gym has no dataset {dataset!r} (e.g. basic_arithmetic, number_sorting)")
        super().__init__(tokenizer, style, thinking)
        self.dataset, self.name = dataset, self.PREFIX + dataset

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        from reasoning_gym import factory

        config = {}
        if factory.has_curriculum(self.dataset):
            curriculum = factory.create_curriculum(self.dataset)
            for _ in range(level):  # past its top level the curriculum stays there
                try:
                    curriculum.increment_global_level()
                except Exception:  # noqa: BLE001 - the package raises different errors at the top level
                    break
            config = vars(curriculum.generate_configuration({"seed": 0, "size": 1}))
        entry = factory.create_dataset(self.dataset, **(config | {"seed": rng.randrange(1 << 30), "size": 1}))[0]
        return entry["question"], {"question": entry["question"], "answer": entry["answer"], "entry": entry}


# (name, description, reference body, hidden tests): functions of one integer argument
CODE_FUNCS = (
    ("add_k", "returns x + {k}", "return x + {k}", "assert f(0) == {k}\nassert f(5) == 5 + {k}\nassert f(-3) == -3 + {k}"),
    ("mul_k", "returns x times {k}", "return x * {k}", "assert f(2) == 2 * {k}\nassert f(7) == 7 * {k}\nassert f(0) == 0"),
    ("is_mult", "returns True when x is a multiple of {k}", "return x % {k} == 0",
     "assert f({k}) is True\nassert f({k} + 1) is False\nassert f(0) is True"),
    ("sq_plus", "returns the square of x plus {k}", "return x * x + {k}", "assert f(3) == 9 + {k}\nassert f(-2) == 4 + {k}"),
)  # fmt: skip


class Code(ChatTask):
    name = "code"
    rewards = ("code",)

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        _, desc, body, tests = rng.choice(CODE_FUNCS[: 2 + max(0, level)])
        k = rng.randint(2, 9)
        q = f"Write a Python function f(x) that {desc.format(k=k)}."
        return q, {"question": q, "tests": tests.format(k=k), "entry_point": "f",
                   "reference": f"def f(x):\n    {body.format(k=k)}\n"}  # fmt: skip


class Toy(Task):
    name = "toy"
    rewards = ("toy",)
    VOCAB = 16  # prompt tokens and answers live in ids [16, 32): any model with vocab_size >= 32

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        ids = [rng.randrange(self.VOCAB) + self.VOCAB for _ in range(rng.randint(2, 4))]
        answer = (ids[0] + level) % 4
        return " ".join(map(str, ids)), {"ids": ids, "answer": answer}

    def encode(self, meta: dict) -> list[int]:
        return list(meta["ids"])


class ToolUse(ChatTask):
    """The SFT tools set's first turn (glmstack.posttrain.synthetic.tool_item): the calculator and python tools
    are offered; right = a call of the expected tool whose arguments validate and compute what the task asks
    (reward `tool_call`)."""

    name = "tools"
    rewards = ("tool_call",)

    @property
    def tools(self):
        from glmstack.posttrain.tools import TOOLS

        return TOOLS

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        from glmstack.posttrain.synthetic import tool_item

        q, tool, args, _ = tool_item(rng)
        return q, {"question": q, "tool": tool, "arguments": args}


class ToolAnswer(ToolUse):
    """The SFT tools set's last turn: the conversation up to the calculator's result (question, the call, the tool's
    reply) is the prompt, with the same tools offered; right = the result in the answer (reward `tool_answer`). The
    turn that copies a tool's result into the answer, which reasoning RL on other tasks is the first to lose
    (docs/speedrun.md)."""

    name = "tool_answer"
    rewards = ("tool_answer",)

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        from glmstack.posttrain.synthetic import tool_item
        from glmstack.posttrain.tools import calculate

        while True:
            q, tool, args, _ = tool_item(rng)
            if tool == "calculator":  # pure: its result needs no sandbox
                break
        result = str(calculate(args["expression"]))
        call = {"type": "function", "function": {"name": tool, "arguments": args}}
        messages = [{"role": "user", "content": q}, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": result}]  # fmt: skip
        return q, {"question": q, "messages": messages, "answer": result}


class ChatFacts(ChatTask):
    """The SFT chat set's first turn (synthetic.chat_exchange) under a system prompt that names the assistant:
    right = the expected word (capital, opposite, own name) in the reply (reward `chat_fact`)."""

    name = "chat"
    rewards = ("chat_fact",)

    def item(self, rng: random.Random, level: int) -> tuple[str, dict]:
        from glmstack.posttrain.synthetic import ASSISTANT_NAMES, chat_exchange

        name = rng.choice(ASSISTANT_NAMES)
        q, _, _, must = chat_exchange(rng, name)
        system = f"You are {name}, a helpful assistant. Answer in one sentence."
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Hello! {q}"}]
        return f"{system} | {q}", {"question": q, "messages": messages, "answer": must}


TASKS = {"arithmetic": Arithmetic, "compare": Compare, "code": Code, "toy": Toy, "tools": ToolUse,
         "tool_answer": ToolAnswer, "chat": ChatFacts}  # fmt: skip


def make_task(name: str, tokenizer=None, style: str = "glm-4.5", thinking: bool = False) -> Task:
    if name.startswith(ReasoningGym.PREFIX):
        return ReasoningGym(name[len(ReasoningGym.PREFIX) :], tokenizer, style, thinking)
    if name not in TASKS:
        raise ValueError(f"unknown RL task {name!r} (expected one of {', '.join(TASKS)})")
    cls = TASKS[name]
    return cls() if not issubclass(cls, ChatTask) else cls(tokenizer, style, thinking)
