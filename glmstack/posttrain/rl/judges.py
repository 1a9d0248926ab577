"""Model-based rewards for general RL: an outcome reward model (`rm:<folder>`) and a generative judge (`judge:<url>`).

GLM-5 §3.4 (research/rl-recipe.md §1.3, post-training-recipe.md §4): general RL mixes rule rewards, outcome reward
models and generative reward models. Both are reward families in the registry (rewards.py resolves "family:arg"
names here), so `rl.rewards` mixes them with rule rewards:

    --set rl.rewards='[["rm:runs/speedrun/rm/model", 1.0], ["format", 0.5]]'
    --set rl.rewards='[["judge:http://127.0.0.1:8000|glm", 1.0]]'       # "|model" optional: default the first served

  rm:<folder>     the reward model `glmstack rm` wrote (posttrain/rm/model.py), its tokenizer from the same folder:
                  prompt + parsed reply rendered in the sample's chat style, scored at the last token; the raw
                  score (unbounded; GRPO's group normalisation makes its scale irrelevant)
  judge:<url>     any OpenAI-compatible chat endpoint (ours: `glmstack serve`; vLLM, SGLang, hosted APIs) asked
                  JUDGE_PROMPT at temperature 0 with thinking off (`chat_template_kwargs.enable_thinking=false`,
                  what GLM servers and `glmstack serve` take: a GLM judge thinks by default and would spend a small
                  budget reasoning) and JUDGE_MAX_TOKENS; the first number of its answer in [0, 10], divided by
                  10, any `<think>` part ignored (a server that reasons anyway); a reply without one scores 0
                  (counted in the `judge_unparsed` figure of the last call). The API key comes from
                  $GLMSTACK_JUDGE_API_KEY (none needed for a local server).

The prompt is the problem's chat messages (`meta["messages"]`) or its one user question (`meta["question"]`).
"""

from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor

import torch

JUDGE_PROMPT = (
    "You are a strict grader. Read the question and the answer, then rate how correct and helpful the answer is "
    "on a scale from 0 (wrong or useless) to 10 (correct and helpful). Reply with the number only.\n\n"
    "Question:\n{question}\n\nAnswer:\n{answer}"
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# The reply is a number with thinking off; the budget leaves room for a server that reasons anyway (issue 35: with
# 8 tokens a GLM judge, thinking on by default, never reached its answer and every score was 0).
JUDGE_MAX_TOKENS = 1024
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def prompt_messages(meta: dict) -> list[dict]:
    if "messages" in meta:
        return list(meta["messages"])
    if "question" in meta:
        return [{"role": "user", "content": meta["question"]}]
    raise ValueError("a model-based reward needs a chat task (meta 'messages' or 'question'), not token prompts")


def reply_message(sample) -> dict:
    from glmstack.chat import parse

    msg = parse(sample.text, None, style=sample.style, in_reasoning=False)
    return {"role": "assistant", **{k: v for k, v in msg.items() if k != "role"}}


# ---------------------------------------------------------------------------------------------- reward model
@functools.lru_cache(maxsize=4)
def _load(folder: str):
    from glmstack.posttrain.rm.model import load_rm
    from glmstack.tokenizer import Tokenizer

    return load_rm(folder), Tokenizer.load(folder)


def reward_model(folder: str, batch_size: int = 32):
    """The `rm:<folder>` reward: samples -> the reward model's scalar per sample."""
    from glmstack.chat import render
    from glmstack.posttrain.rm.data import pad_rows

    rm, tok = _load(folder)
    pad = tok.token_id("<|endoftext|>")

    @torch.no_grad()  # a reward is a number: no autograd graph through the reward model
    def score(samples) -> list[float]:
        rows = [tok.encode(render(prompt_messages(s.meta) + [reply_message(s)], None, style=s.style,
                                  enable_thinking=False)) for s in samples]  # fmt: skip
        out = []
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            b = pad_rows(chunk, max(map(len, chunk)), pad)
            out += rm(b["input_ids"], b["last"], segment_ids=b["segment_ids"])[0].tolist()
        return out

    return score


# ---------------------------------------------------------------------------------------------- judge
def answer_part(text: str) -> str:
    """A reply without its reasoning: what follows the last `</think>` (also when the template opened `<think>`
    itself); nothing when a `<think>` was never closed (the budget ran out while reasoning)."""
    text = text or ""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    return text.split("<think>", 1)[0]


def parse_score(text: str) -> float | None:
    """The first number of a judge's answer (reasoning ignored) on the 0-10 scale -> [0, 1]; None when there is
    none or it is off-scale."""
    m = _NUMBER.search(answer_part(text))
    if m is None:
        return None
    value = float(m.group())
    return value / 10 if 0 <= value <= 10 else None


def judge(spec: str, concurrency: int = 8, max_tokens: int = JUDGE_MAX_TOKENS):
    """The `judge:<url>[|model]` reward: one chat completion per sample, concurrently."""
    from openai import OpenAI

    url, _, model = spec.partition("|")
    client = OpenAI(base_url=url.rstrip("/") + "/v1", api_key=os.environ.get("GLMSTACK_JUDGE_API_KEY", "none"))
    model = model or client.models.list().data[0].id
    stats = {"judge_unparsed": 0.0}

    def one(sample) -> float:
        question = "\n".join(str(m.get("content") or "") for m in prompt_messages(sample.meta) if m["role"] == "user")
        answer = reply_message(sample).get("content") or ""
        r = client.chat.completions.create(model=model, temperature=0.0, max_tokens=max_tokens, extra_body=NO_THINKING,
                                           messages=[{"role": "user", "content": JUDGE_PROMPT.format(
                                               question=question, answer=answer)}])  # fmt: skip
        return parse_score(r.choices[0].message.content or "")  # reasoning_content (a reasoning parser's) unread

    def score(samples) -> list[float]:
        with ThreadPoolExecutor(concurrency) as pool:
            values = list(pool.map(one, samples))
        stats["judge_unparsed"] = sum(v is None for v in values) / max(len(values), 1)
        return [v or 0.0 for v in values]

    score.stats = stats
    return score
