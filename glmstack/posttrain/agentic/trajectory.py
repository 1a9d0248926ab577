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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from glmstack.chat import render

_DUMMY = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


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

    def __post_init__(self):
        if not self.mask:
            self.mask = [0] * len(self.ids)
            self.logprobs = [0.0] * len(self.ids)
        self.prompt_len = len(self.ids)

    def add_model(self, ids: list[int], logprobs: list[float], version: int) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled tokens but {len(logprobs)} log-probs")
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += list(logprobs)
        self.versions.append(version)
        self.turns += 1

    def add_context(self, ids: list[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def sample(self):
        """This trajectory as the Sample every RL path trains on (posttrain/sample.py)."""
        from glmstack.posttrain.sample import Sample

        return Sample(tokens=self.ids, loss_mask=self.mask, rollout_logp=self.logprobs, versions=self.versions,
                      group=self.task_id, index=self.index, reward=self.reward, status=self.status,
                      meta={"spec": self.spec}, routes=self.routes)  # fmt: skip

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
