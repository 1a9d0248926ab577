"""A multi-agent role task: the model plays a writer and then a reviewer of the writer's draft in one episode.

Turn 1 (writer): "Write one sentence that uses the words X and Y." Turn 2 (the environment hands the draft to the
reviewer role as a new user turn): "You are now the reviewer ... reply APPROVE, or REVISE: <corrected sentence>".
Success: the verdict is right (APPROVE exactly when the draft uses both words) and the final text (the draft if
approved, else the revision) uses both words. Both roles' tokens are trained: one policy, two roles (GLM-4.5's
multi-agent role tasks).
"""

from __future__ import annotations

import random
import re
from typing import ClassVar

from glmstack.posttrain.agentic.env import Step, ToolEnv, register

WORDS = ["river", "lamp", "music", "stone", "cloud", "bread", "garden", "window", "forest", "silver"]


def uses(text: str, words: list[str]) -> bool:
    found = set(re.findall(r"[a-z]+", text.lower()))
    return all(w in found for w in words)


@register
class RolesEnv(ToolEnv):
    name = "roles"
    tools: ClassVar[list[dict]] = []

    @classmethod
    def make_spec(cls, rng: random.Random, level: int) -> dict:
        return {"words": rng.sample(WORDS, 2 + min(level, 1))}

    def setup(self, spec: dict) -> None:
        self.draft: str | None = None

    def prompt(self, spec: dict) -> list[dict]:
        words = " and ".join(spec["words"])
        return [{"role": "system", "content": "You are the writer."},
                {"role": "user", "content": f"Write one sentence that uses the words {words}."}]  # fmt: skip

    def call(self, name: str, args: dict) -> str:  # no tools: validate_call rejects every call first
        return f"Error: unknown tool {name!r}"

    def answer(self, message: dict) -> Step:
        if self.draft is None:
            self.draft = (message.get("content") or "").strip()
            words = " and ".join(self.spec["words"])
            review = (f"You are now the reviewer. The draft is: \"{self.draft}\". If it uses the words {words}, "
                      "reply APPROVE. Otherwise reply REVISE: followed by a corrected sentence.")  # fmt: skip
            return Step([{"role": "user", "content": review}], False)
        return super().answer(message)

    def success(self) -> bool:
        verdict = ((self.final or {}).get("content") or "").strip()
        draft_ok = uses(self.draft or "", self.spec["words"])
        if verdict.upper().startswith("APPROVE"):
            return draft_ok
        if verdict.upper().startswith("REVISE"):
            return not draft_ok and uses(verdict.split(":", 1)[-1], self.spec["words"])
        return False
