"""Context management for long-horizon agents: what the sampler sees of an episode once it no longer fits.

GLM-5's search agent (research/wave3-facts.md §6) keeps the k = 5 most recent tool outputs and folds older ones; a
hierarchical mode discards all tool history once the context passes 32K. Here, at the tiny models' scale:
  keep_last_tool_results = k   every tool result but the k latest is replaced by a stub ("[tool output elided]")
  token_budget = B             a view longer than B tokens folds its oldest tool turns, by `budget_action`:
      stub                     the oldest results are stubbed one by one until the view fits (the latest is kept)
      discard                  every tool turn but the latest is dropped, call and result (the hierarchical mode)
      summarize                the model itself summarises every tool result but the latest (`summary_request`:
                               a user turn asking for it over their contents, sampled by the policy like any turn);
                               they are stubbed and the latest stubbed one carries the summary
Folding is checked before every assistant turn (`manage`); what was folded is recorded (`folds`, with the summary).

Tokens in, tokens out: the view is kept as token pieces — the prompt as encoded once, each assistant turn exactly as
sampled, each environment reply as its rendered continuation (trajectory.continuation_ids). A fold re-renders only
the folded replies (their messages with the stub as content) and drops pieces; the model's own tokens are never
re-encoded. After a fold the next prompt no longer extends the previous one, so the trajectory starts a new segment
with the new view (trajectory.py): each assistant turn is trained on exactly the context it was sampled from.
A summary is a turn of its own: the trajectory records its request and sampled tokens as a segment (trained with the
episode's reward, like every sampled token), then the folded view.

    view = Context(tokenizer, prompt_ids, ContextOptions(keep_last_tool_results=2), style="glm-4.5", thinking=False)
    view.add_model(sampled_ids)                                   # an assistant turn, as sampled
    ids = view.add_env([{"role": "tool", "content": "..."}], after=sampled_ids[-1])   # extends view.ids
    fold = view.manage(turn=3)       # None: the view still extends the last one; else a record of what was folded
    view.ids                         # what the sampler sees next
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

STUB = "[tool output elided]"
SUMMARY_REQUEST = "Summarize what these tool results tell you, in one short line:"
SUMMARY_PREFIX = "Summary of earlier tool output: "


@dataclass(kw_only=True)
class ContextOptions:
    keep_last_tool_results: int = 0  # stub every tool result but the k latest (0 = keep all; GLM-5's search agent: 5)
    token_budget: int = 0  # a view longer than this many tokens folds its oldest tool turns (0 = no budget)
    # at the budget: "stub" the oldest results one by one until the view fits, or "discard" every tool turn but the
    # latest, the calls with their results (GLM-5's hierarchical mode)
    budget_action: Literal["stub", "discard", "summarize"] = "stub"
    stub: str = STUB  # the content a folded tool result is replaced with
    summary_tokens: int = 48  # budget_action=summarize: the most tokens a summary may take

    @property
    def active(self) -> bool:
        return bool(self.keep_last_tool_results or self.token_budget)

    def check(self) -> list[str]:
        """What is wrong with these options (one line each)."""
        bad = []
        if self.keep_last_tool_results < 0 or self.token_budget < 0:
            bad.append("keep_last_tool_results and token_budget must be >= 0 (0 = off)")
        if self.budget_action not in ("stub", "discard", "summarize"):
            bad.append(f"budget_action must be stub, discard or summarize (got {self.budget_action!r})")
        if self.budget_action == "summarize" and (not self.token_budget or self.summary_tokens < 1):
            bad.append("budget_action=summarize needs token_budget > 0 (when to summarise) and summary_tokens >= 1")
        return bad


@dataclass
class Piece:
    kind: str  # prompt | model | env
    ids: list[int]
    messages: list[dict] = field(default_factory=list)  # env: the messages it renders
    after: int | None = None  # env: the model's last token before it (trajectory.continuation_ids)
    stubbed: list[bool] = field(default_factory=list)  # env: per message
    dropped: bool = False


class Context:
    """The sampler's view of one episode (see the module docstring)."""

    def __init__(self, tokenizer, prompt_ids: list[int], opts: ContextOptions | None = None, *, style: str = "glm-4.5",
                 thinking: bool = False):  # fmt: skip
        self.tokenizer, self.opts, self.style, self.thinking = tokenizer, opts or ContextOptions(), style, thinking
        self.pieces = [Piece("prompt", list(prompt_ids))]
        self.number: dict[tuple[int, int], int] = {}  # (piece, message) -> the tool result's number in the episode
        self.folds: list[dict] = []

    def __getstate__(self) -> dict:
        """A view travels without its tokenizer (Ray workers send finished trajectories back): it can no longer fold."""
        return {**vars(self), "tokenizer": None}

    @property
    def ids(self) -> list[int]:
        return [x for p in self.pieces if not p.dropped for x in p.ids]

    def __len__(self) -> int:
        return sum(len(p.ids) for p in self.pieces if not p.dropped)

    def add_model(self, ids: list[int]) -> None:
        self.pieces.append(Piece("model", list(ids)))

    def add_env(self, messages: list[dict], after: int | None) -> list[int]:
        """Append an environment reply (tool results or a user turn); returns its ids (the view grew by them)."""
        piece = Piece("env", [], list(messages), after, [False] * len(messages))
        for m, msg in enumerate(messages):
            if msg["role"] == "tool":
                self.number[(len(self.pieces), m)] = len(self.number)
        self.pieces.append(piece)
        piece.ids = self._render(piece)
        return piece.ids

    def _render(self, piece: Piece) -> list[int]:
        from glmstack.posttrain.agentic.trajectory import continuation_ids

        msgs = [m | {"content": self.opts.stub} if s else m for m, s in zip(piece.messages, piece.stubbed)]
        return continuation_ids(self.tokenizer, msgs, self.style, self.thinking, after=piece.after)

    def _results(self) -> list[tuple[int, int]]:
        """(piece, message) of every tool result still in the view, oldest first."""
        return [pm for pm in self.number if not self.pieces[pm[0]].dropped]

    def _stub(self, p: int, m: int) -> bool:
        piece = self.pieces[p]
        if piece.stubbed[m]:
            return False
        piece.stubbed[m] = True
        piece.ids = self._render(piece)
        return True

    def _to_summarize(self) -> list[tuple[int, int]]:
        """budget_action=summarize: the tool results a summary would fold now (every unfolded one but those of the
        latest reply), or [] while the view fits."""
        o, results = self.opts, self._results()
        if o.budget_action != "summarize" or not o.token_budget or len(self) <= o.token_budget or len(results) < 2:
            return []
        latest = results[-1][0]
        return [(p, m) for p, m in results if p != latest and not self.pieces[p].stubbed[m]]

    def summary_request(self) -> list[int] | None:
        """The prompt ids of a summary request when the view is over budget (budget_action=summarize), else None: a
        user turn asking the model to summarise the results to fold, given their contents."""
        from glmstack.chat import render

        fold = self._to_summarize()
        if not fold:
            return None
        contents = "\n".join(str(self.pieces[p].messages[m].get("content") or "") for p, m in fold)
        messages = [{"role": "user", "content": f"{SUMMARY_REQUEST}\n{contents}"}]
        text = render(messages, None, style=self.style, enable_thinking=False, add_generation_prompt=True)
        return self.tokenizer.encode(text)

    def _summarize(self, summary: str) -> list[int]:
        """Stub the results to fold; the latest of them carries the summary. -> their numbers."""
        fold = self._to_summarize()
        for p, m in fold:
            self._stub(p, m)
        p, m = fold[-1]
        piece = self.pieces[p]
        for special in self.tokenizer.special_tokens:  # model-written text must not forge a role or a tool call
            summary = summary.replace(special, "")
        piece.messages[m] = piece.messages[m] | {"content": SUMMARY_PREFIX + summary.strip()}
        piece.stubbed[m] = False  # rendered with its (new) content, not the stub
        piece.ids = self._render(piece)
        return [self.number[r] for r in fold]

    def manage(self, turn: int, summary: str | None = None) -> dict | None:
        """Fold what the options say before assistant turn `turn`; None when nothing changed, else the record.
        `summary`: the model's answer to `summary_request()` (budget_action=summarize)."""
        o, before = self.opts, len(self)
        stubbed, dropped = [], []
        results = self._results()
        if o.keep_last_tool_results:
            stubbed += [self.number[r] for r in results[: -o.keep_last_tool_results] if self._stub(*r)]
        if summary is not None and self._to_summarize():
            stubbed += self._summarize(summary)
        elif o.token_budget and len(self) > o.token_budget and len(results) > 1 and o.budget_action != "summarize":
            latest = results[-1][0]  # the reply the model has not answered yet stays whole
            if o.budget_action == "discard":
                for p in sorted({p for p, _ in results if p != latest}):
                    self.pieces[p].dropped = self.pieces[p - 1].dropped = True  # the call (model piece) with it
                    dropped += [self.number[r] for r in results if r[0] == p]
            else:
                for r in results[:-1]:
                    if len(self) <= o.token_budget:
                        break
                    if r[0] != latest and self._stub(*r):
                        stubbed.append(self.number[r])
        if not (stubbed or dropped):
            return None
        record = {"turn": turn, "stubbed": sorted(set(stubbed)), "dropped": dropped, "tokens_before": before,
                  "tokens_after": len(self)} | ({"summary": summary} if summary is not None else {})  # fmt: skip
        self.folds.append(record)
        return record
