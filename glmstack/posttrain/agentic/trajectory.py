"""A trajectory in tokens: the exact ids the policy saw and produced (tokens in, tokens out), never re-tokenised.

GLM-5's TITO gateway (§3.3) records the token ids of every generation request so the trainer trains on exactly
what was sampled: re-encoding the decoded text can split differently and would attach the rollout log-probs to
the wrong tokens. Here the prompt is encoded once; each assistant turn appends the engine's sampled ids with their
log-probs (trained, mask 1) and each environment reply appends the encoded continuation (context, mask 0): the
tool results or next user turn and the next generation prompt, rendered by glmstack.chat.render so the sequence
stays the chat format the model was trained on.

    t = Trajectory(task_id=3, index=0, spec=spec, messages=msgs, tools=tools, ids=prompt_ids)
    t.add_model(ids, logprobs, version=5)       # an assistant turn, sampled at weight version 5
    t.add_context(continuation_ids(tok, [tool_msg], "glm-4.5", thinking=False, after=ids[-1]))

Context management (context.py) changes what the sampler sees mid-episode: with a `view` (a context.Context) the
environment replies go through it (`add_env`) and `manage()` applies its folds before each turn. When a fold changes
the view, the next prompt no longer extends the last one, so the trajectory starts a new *segment*: `ids` is the
concatenation of segments, `segments` their start offsets, and each segment is a context the sampler really saw
followed by the turns sampled from it (a segment ends at its last sampled token: the replies after it belong to the
next segment's context). Every sampled token is trained once, in the segment it was sampled in; the trainer runs the
segments of a row apart (posttrain/sample.py: `segment_ids`, positions restarting per segment).

    t = Trajectory(..., ids=view.ids, view=view)
    t.manage()                                  # before a turn: a fold starts a new segment with the folded view
    prompt = t.context                          # what the sampler gets (the current segment)
    t.add_model(ids, logprobs, version=5); t.add_env([tool_msg], after=ids[-1])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from glmstack.chat import render

if TYPE_CHECKING:
    from glmstack.posttrain.agentic.context import Context

_DUMMY = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


@dataclass
class Summary:
    """The model's summary of tool results a view folds (context.py, budget_action=summarize), as sampled."""

    prompt: list[int]  # the request's ids (Context.summary_request)
    ids: list[int]  # sampled tokens
    logprobs: list[float]
    version: int
    text: str  # the reply's content


@dataclass
class Trajectory:
    task_id: int  # the group's id in the runner's ledger (one group per task id)
    index: int  # position in the group
    spec: dict  # the task (env name included)
    messages: list[dict]  # the conversation as messages: prompt, parsed assistant turns, environment replies
    tools: list[dict]
    ids: list[int]  # every token, prompt first
    mask: list[int] = field(default_factory=list)  # 1 on the model's own tokens (trained), 0 on context
    logprobs: list[float] = field(default_factory=list)  # rollout log-prob per token (0.0 on context)
    versions: list[int] = field(default_factory=list)  # weight version of each assistant turn
    status: str = "running"  # done | malformed | loop | truncated | env_error (env.Env.status)
    reward: float = 0.0
    success: bool = False
    parts: dict = field(default_factory=dict)
    turns: int = 0
    # routing replay: (n <= len(ids), L, K) int16, the experts the latest turn's engine routed ids[t] to (episode.py)
    routes: Any = None
    view: Context | None = None  # the sampler's view under context management (context.py); None: `ids` as is
    segments: list[int] = field(default_factory=lambda: [0])  # start offset of each segment in `ids`
    masked_turns: list[int] = field(default_factory=list)  # turns taken out of the loss (failed tool calls)

    def __post_init__(self):
        if not self.mask:
            self.mask = [0] * len(self.ids)
            self.logprobs = [0.0] * len(self.ids)
        self.prompt_len = len(self.ids)
        self.last_turn = (len(self.ids), len(self.ids))

    @property
    def context(self) -> list[int]:
        """What the sampler sees next: the current segment."""
        return self.ids[self.segments[-1] :]

    def add_model(self, ids: list[int], logprobs: list[float], version: int) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled tokens but {len(logprobs)} log-probs")
        self.last_turn = (len(self.ids), len(self.ids) + len(ids))
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += list(logprobs)
        self.versions.append(version)
        self.turns += 1
        if self.view is not None:
            self.view.add_model(ids)

    def add_context(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def add_env(self, messages: list[dict], after: int | None) -> None:
        """An environment reply, rendered by the view (which needs the messages to fold them later)."""
        self.add_context(self.view.add_env(messages, after))

    def mask_last_turn(self) -> None:
        """Take the last assistant turn out of the loss (it stays in the context; its log-probs stay recorded)."""
        a, b = self.last_turn
        self.mask[a:b] = [0] * (b - a)
        self.masked_turns.append(self.turns - 1)

    def manage(self, summary: Summary | None = None) -> dict | None:
        """Apply the view's context management before a turn; a changed view starts a new segment. With a `summary`
        (the model's answer to the view's summary request) the request and its sampled tokens are a segment of their
        own, trained like any turn, before the folded view's."""
        fold = self.view.manage(self.turns, summary.text if summary else None) if self.view is not None else None
        if fold is not None:
            start = self.segments[-1]
            end = max((i + 1 for i in range(start, len(self.ids)) if self.mask[i]), default=start)
            del self.ids[end:], self.mask[end:], self.logprobs[end:]  # replies after the last sampled token
            if end == start:  # nothing trained in it: the new view replaces it
                self.segments.pop()
            if summary is not None:
                self.segments.append(len(self.ids))
                self.add_context(summary.prompt)
                self.ids += summary.ids
                self.mask += [1] * len(summary.ids)
                self.logprobs += list(summary.logprobs)
                self.versions.append(summary.version)
            self.segments.append(len(self.ids))
            self.add_context(self.view.ids)
        return fold

    def sample(self):
        """This trajectory as the Sample every RL path trains on (posttrain/sample.py)."""
        from glmstack.posttrain.sample import Sample

        meta = {"spec": self.spec}
        if self.view is not None and self.view.opts.active:
            meta["context"] = {"options": vars(self.view.opts), "folds": self.view.folds}
        if self.masked_turns:
            meta["masked_turns"] = self.masked_turns
        return Sample(tokens=self.ids, loss_mask=self.mask, rollout_logp=self.logprobs, versions=self.versions,
                      group=self.task_id, index=self.index, reward=self.reward, status=self.status, meta=meta,
                      segments=list(self.segments), routes=self.routes)  # fmt: skip

    @property
    def first_version(self) -> int:
        return min(self.versions) if self.versions else -1

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)

    @property
    def retried(self) -> bool | None:
        """After the first failed tool call ("Error: ..."), did the model call a tool again? None: no call failed."""
        for i, m in enumerate(self.messages):
            if m["role"] == "tool" and str(m.get("content") or "").startswith("Error"):
                return any(x.get("tool_calls") for x in self.messages[i + 1 :] if x["role"] == "assistant")
        return None


def continuation_text(messages: list[dict], style: str, thinking: bool) -> str:
    """The chat-format text that follows an assistant turn when `messages` (tool results or a user turn) come next,
    up to and including the next generation prompt. Rendered after a fixed dummy exchange so that the history's
    rendering (which differs with and without a following user turn) cannot leak into the difference."""
    head = render(_DUMMY, None, style=style, enable_thinking=thinking)
    full = render(_DUMMY + list(messages), None, style=style, enable_thinking=thinking, add_generation_prompt=True)
    if not full.startswith(head):
        raise ValueError("chat render: the continuation does not extend the history")
    return full[len(head) :]


def continuation_ids(tokenizer, messages: list[dict], style: str, thinking: bool, after: int | None) -> list[int]:
    """`continuation_text` as ids; its leading role token is dropped when the model's last token already is it
    (GLM's turn-ending stop tokens `<|observation|>` / `<|user|>` are the next turn's role token)."""
    ids = tokenizer.encode(continuation_text(messages, style, thinking))
    return ids[1:] if ids and after is not None and ids[0] == after else ids
