"""One choice's output as it is generated: token ids -> text deltas, stop strings, log-probs, finish reason.

What: `ChoiceOutput(tokenizer, stops, eos_ids).add(token) -> new text` (held back while a UTF-8 character is
unfinished or while the text could still become a stop string); `.close(finish) -> the rest`. `.stop_hit` says a
stop string ended the choice (the server then cancels its job). Stop strings are excluded from the text (OpenAI).
The same object serves the streamed and the whole answer, so both produce the same text from the same ids.

`chat_logprobs` / `completion_logprobs` format what was collected in OpenAI's two log-prob shapes
(research/serving-protocol.md §3, §4): values are raw log-probs of the model (before temperature / top-k / top-p),
as vLLM's default, which is what an RL trainer's importance ratio needs.
"""

from __future__ import annotations

from itertools import accumulate

from glmstack.serve.scheduler import Finished, Token
from glmstack.serve.scoring import PromptScores


class ChoiceOutput:
    def __init__(self, tokenizer, stops: list[str], eos_ids):
        self.tok, self.stops, self.eos = tokenizer, stops, set(eos_ids)
        self.ids: list[int] = []
        self.tokens: list[Token] = []
        self.text = ""  # decoded text of the ids (eos excluded), before stop-string truncation
        self.shown = 0  # characters of `text` already handed out
        self.stop_hit: str | None = None
        self._done_ids, self._done_text = 0, ""  # ids[:_done_ids] decode to _done_text, ending on a whole character
        self.finish: str | None = None
        self.error: str = ""
        self.prompt_scores: PromptScores | None = None  # echo + logprobs: the prompt tokens' (scoring.py)

    def add(self, token: Token) -> str:
        self.ids.append(token.id)
        self.tokens.append(token)
        if self.stop_hit is not None:
            return ""
        text = self._decoded()
        if text.endswith("\ufffd"):  # byte-level BPE: half a UTF-8 character so far
            return ""
        self.text, self._done_ids, self._done_text = text, len(self.ids), text
        for s in self.stops:
            i = self.text.find(s, max(0, self.shown - len(s)))
            if i >= 0:
                self.stop_hit, self.text = s, self.text[:i]
                return self._take(len(self.text))
        hold = max((_partial(self.text, s) for s in self.stops), default=0)
        return self._take(len(self.text) - hold)

    def close(self, fin: Finished) -> str:
        """The end of the choice: the finish reason, and the text held back until now."""
        if self.stop_hit is not None:
            self.finish = "stop"
        else:
            self.finish, self.error = fin.reason, fin.message
            full = self._decoded()
            if len(full) >= len(self.text):
                self.text = full
        return self._take(len(self.text))

    def _decoded(self) -> str:
        """Text of all ids: only the ids since the last whole character are decoded (byte-level BPE decodes piece
        by piece), so a long answer costs O(tokens), not O(tokens^2)."""
        return self._done_text + self.tok.decode([t for t in self.ids[self._done_ids :] if t not in self.eos])

    def _take(self, upto: int) -> str:
        upto = max(upto, self.shown)
        out, self.shown = self.text[self.shown : upto], upto
        return out

    # ---- log-probs in OpenAI's shapes ----------------------------------------------------------------------
    def piece(self, token_id: int) -> str:
        return self.tok.decode([token_id])

    def chat_logprobs(self, tokens: list[Token]) -> dict:
        def entry(tid, lp):
            text = self.piece(tid)
            return {"token": text, "logprob": max(lp, -9999.0), "bytes": list(text.encode("utf-8"))}

        return {
            "content": [{**entry(t.id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top]} for t in tokens],
            "refusal": None,
        }

    def completion_logprobs(self, tokens: list[Token], offset: int) -> dict:
        """Column-oriented logprobs; `offset` = characters of text before the first of `tokens`."""
        pieces = [self.piece(t.id) for t in tokens]
        offsets, pos = [], offset
        for p in pieces:
            offsets.append(pos)
            pos += len(p)
        return {
            "tokens": pieces,
            "token_logprobs": [max(t.logprob, -9999.0) for t in tokens],
            "top_logprobs": [_top(self.piece, [(t.id, t.logprob), *t.top]) for t in tokens],
            "text_offset": offsets,
        }

    def echo_logprobs(self, ids: list[int], generated: dict) -> dict:
        """Column-oriented logprobs of the prompt tokens followed by the generated ones' (OpenAI's legacy API and
        vLLM). At every prompt position but the first, `top_logprobs` holds the most likely tokens and the token
        itself, as vLLM: lm-eval reads `max(top.values())` there to tell whether a continuation is greedy."""
        sc = self.prompt_scores
        pieces = [self.piece(i) for i in ids]
        offsets = [0, *accumulate(len(p) for p in pieces[:-1])]
        return {"tokens": pieces + generated["tokens"],
                "token_logprobs": [None if lp is None else max(lp, -9999.0) for lp in sc.logprobs]
                + generated["token_logprobs"],
                "top_logprobs": [None if top is None else _top(self.piece, top) for top in sc.top]
                + generated["top_logprobs"],
                "text_offset": offsets + generated["text_offset"]}  # fmt: skip


def _top(piece, alternatives: list[tuple[int, float]]) -> dict[str, float]:
    """{text: log-prob}; two ids with the same text keep the larger log-prob, so the dict's max stays the max."""
    top: dict[str, float] = {}
    for i, lp in alternatives:
        text = piece(i)
        top[text] = max(top.get(text, -9999.0), max(lp, -9999.0))
    return top


def _partial(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
