"""Incremental parsing of a streamed GLM completion into OpenAI-style deltas.

What: `StreamParser(tools, style).feed(chunk) -> [delta, ...]` and `.finish() -> [delta, ...]`, where a delta is
`{"reasoning_content": str}`, `{"content": str}`, or `{"tool_calls": [{"index", "id", "type", "function":
{"name", "arguments": ""}}]}` (a call's first delta) followed by `{"tool_calls": [{"index", "function":
{"arguments": piece}}]}` pieces. `accumulate(deltas)` sums them into a message.

Contract: for any text and any way of cutting it into chunks, `accumulate(all deltas) == parse(text)`
(glmstack.chat.parse is the reference; tests/unit/test_chat_stream.py checks random chunkings).

How: text is first cut at the first stop token (as parse() does), then fed to a four-state scanner (start, reasoning, content, inside a call). Text that could be the beginning of a tag
is held back until the next chunk decides it; whitespace at the end of reasoning/content is held back until
something follows it, because parse() strips both. A tool call is held until its `</tool_call>`: only then is it
known to be well formed (otherwise parse() returns it as content), after which its name and its arguments (one
piece per key) are emitted. This trades argument-level streaming for exact agreement with parse(), the trade
SGLang makes in its GLM-4.5 tool-call parser (PR #39493); reasoning and content stream as they arrive.
"""

from __future__ import annotations

import json

from glmstack.chat.parse import (
    CALL_CLOSE,
    CALL_OPEN,
    STOP_TOKENS,
    THINK_CLOSE,
    THINK_OPEN,
    _typers,
    default_in_reasoning,
    parse_call,
    stop_index,
)

_START, _REASONING, _CONTENT, _CALL = "start", "reasoning", "content", "call"


class _Stripped:
    """Emits a stream of text as if `.strip()`ped at the end: leading whitespace dropped, trailing held back."""

    def __init__(self):
        self.started = False
        self.pending = ""

    def push(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        body = text.rstrip()
        if not body:
            self.pending += text
            return ""
        out, self.pending = self.pending + body, text[len(body) :]
        return out


def _held_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class StreamParser:
    def __init__(self, tools=None, style: str = "glm-4.5", in_reasoning: bool | None = None, calls: bool = True):
        self.calls = calls  # False: `<tool_call>` text stays content, as parse(..., calls=False)
        self.in_reasoning = default_in_reasoning(style) if in_reasoning is None else in_reasoning
        self.typers = _typers(tools)
        self.state = _START
        self.buf = ""
        self.n_calls = 0
        self.searched = 0  # inside a call, buf[:searched] holds no "</tool_call>": long calls stay linear
        self.reasoning = _Stripped()
        self.content = _Stripped()
        self.raw = ""  # text not yet known to come before a stop token
        self.stopped = False

    def feed(self, chunk: str) -> list[dict]:
        if not self.stopped:
            self._cut_at_stop(chunk)
        return self._drain(final=False)

    def finish(self) -> list[dict]:
        """Flush at the end of the stream: held text is decided, an unterminated call becomes content."""
        self.buf, self.raw, self.stopped = self.buf + self.raw, "", True
        return self._drain(final=True)

    def _cut_at_stop(self, chunk: str) -> None:
        """Pass text on to the scanner up to the first stop token, holding back a possible partial one."""
        self.raw += chunk
        cut = stop_index(self.raw)
        if cut < len(self.raw):
            self.buf, self.raw, self.stopped = self.buf + self.raw[:cut], "", True
            return
        keep = len(self.raw) - _held_suffix(self.raw, STOP_TOKENS)
        self.buf, self.raw = self.buf + self.raw[:keep], self.raw[keep:]

    # ---- the scanner ---------------------------------------------------------------------------------------

    def _drain(self, final: bool) -> list[dict]:
        out: list[dict] = []
        step = {_START: self._start, _REASONING: self._in_reasoning, _CONTENT: self._in_content, _CALL: self._in_call}
        while step[self.state](out, final):
            pass
        return [d for d in out if any(d.values())]

    def _start(self, out, final) -> bool:
        """Decide whether the completion opens with `<think>` (after optional whitespace)."""
        head = self.buf.lstrip()
        if head.startswith(THINK_OPEN):
            self.buf, self.state = head[len(THINK_OPEN) :], _REASONING
            return True
        if THINK_OPEN.startswith(head) and not final:
            return False  # could still become "<think>"
        self.state = _REASONING if self.in_reasoning else _CONTENT
        return True

    def _in_reasoning(self, out, final) -> bool:
        close, call = self.buf.find(THINK_CLOSE), self.buf.find(CALL_OPEN)
        if close >= 0 and (call < 0 or close < call):
            out.append({"reasoning_content": self.reasoning.push(self.buf[:close])})
            self.buf, self.state = self.buf[close + len(THINK_CLOSE) :], _CONTENT
            return True
        if call >= 0:
            out.append({"reasoning_content": self.reasoning.push(self.buf[:call])})
            self.buf, self.state = self.buf[call:], _CONTENT
            return True
        self._emit_safe(out, "reasoning_content", self.reasoning, (THINK_CLOSE, CALL_OPEN), final)
        return False

    def _in_content(self, out, final) -> bool:
        start = self.buf.find(CALL_OPEN) if self.calls else -1
        if start >= 0:
            out.append({"content": self.content.push(self.buf[:start])})
            self.buf, self.state = self.buf[start + len(CALL_OPEN) :], _CALL
            return True
        self._emit_safe(out, "content", self.content, (CALL_OPEN,) if self.calls else (), final)
        return False

    def _in_call(self, out, final) -> bool:
        end = self.buf.find(CALL_CLOSE, self.searched)
        if end < 0:
            self.searched = max(0, len(self.buf) - len(CALL_CLOSE) + 1)
            if final:  # unterminated: parse() returns it as content
                out.append({"content": self.content.push(CALL_OPEN + self.buf)})
                self.buf = ""
            return False
        body, self.buf, self.state = self.buf[:end], self.buf[end + len(CALL_CLOSE) :], _CONTENT
        self.searched = 0
        call = parse_call(body, self.typers)
        if call is None:
            out.append({"content": self.content.push(CALL_OPEN + body + CALL_CLOSE)})
        else:
            out += self._call_deltas(*call)
        return True

    def _emit_safe(self, out, key, channel: _Stripped, tags, final) -> None:
        hold = 0 if final else _held_suffix(self.buf, tags)
        text, self.buf = self.buf[: len(self.buf) - hold], self.buf[len(self.buf) - hold :]
        out.append({key: channel.push(text)})

    def _call_deltas(self, name: str, args: dict) -> list[dict]:
        index, self.n_calls = self.n_calls, self.n_calls + 1
        head = {"index": index, "id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": ""}}
        pairs = [json.dumps(k, ensure_ascii=False) + ": " + json.dumps(v, ensure_ascii=False) for k, v in args.items()]
        pieces = ["{" + ", ".join(pairs[:1])] + [", " + p for p in pairs[1:]] + ["}"]
        return [{"tool_calls": [head]}] + [
            {"tool_calls": [{"index": index, "function": {"arguments": p}}]} for p in pieces
        ]


def accumulate(deltas) -> dict:
    """Sum deltas into the message parse() returns (None for empty reasoning/content)."""
    reasoning, content, calls = [], [], {}
    for d in deltas:
        reasoning.append(d.get("reasoning_content") or "")
        content.append(d.get("content") or "")
        for tc in d.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"id": tc.get("id"), "type": "function",
                                                  "function": {"name": "", "arguments": ""}})  # fmt: skip
            fn = tc.get("function", {})
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""
    return {
        "role": "assistant",
        "content": "".join(content) or None,
        "reasoning_content": "".join(reasoning) or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
    }
