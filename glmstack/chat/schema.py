"""Message checking and argument typing for the GLM chat format.

What: `check_messages` validates OpenAI-shape messages (ValueError naming the message index), `visible_text`
mirrors the official template's macro, `call_arguments` turns a tool call's arguments (dict or JSON string)
into a dict, and `ArgTyper` types a parsed `<arg_value>` string by the tool's JSON schema.

Why: GLM's tool-call wire format carries no types (`"2"` and `2` both serialise as `2` inside `<arg_value>`), so
the parser must consult the request's schema: string parameters stay raw text, everything else is JSON, then a
Python literal, then raw text (the order vLLM's and SGLang's GLM-4.5 tool parsers use). BFCL's schemas use
Python/Java type names (`dict`, `float`, `tuple`, `any`, `String`, `HashMap`, ...), mapped here to JSON-schema kinds.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping

ROLES = ("system", "user", "assistant", "tool")

# Schema type names (JSON schema, Python, Java/JavaScript as in BFCL) -> one canonical kind.
_KIND = {
    **dict.fromkeys(("string", "str", "String", "char", "Character"), "string"),
    **dict.fromkeys(("integer", "int", "long", "Long", "Integer", "short", "byte"), "integer"),
    **dict.fromkeys(("number", "float", "double", "Double", "Float"), "number"),
    **dict.fromkeys(("boolean", "bool", "Boolean"), "boolean"),
    **dict.fromkeys(("array", "list", "tuple", "Array", "ArrayList", "List", "set"), "array"),
    **dict.fromkeys(("object", "dict", "HashMap", "Map", "map"), "object"),
    "null": "null",
    "NoneType": "null",
}
_MATCHES = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, (list, tuple)),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
    "string": lambda v: isinstance(v, str),
}
_MISSING = object()


# ---- messages --------------------------------------------------------------------------------------------------


def visible_text(content) -> str:
    """The template's `visible_text`: strings as-is; lists join `{"type": "text"}` items and bare strings.

    None becomes "" (the jinja template would print "None", which nobody wants to train on)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for item in content:
        if isinstance(item, Mapping) and item.get("type") == "text":
            text = item.get("text")
            parts.append("" if text is None else str(text))
        elif isinstance(item, str):
            parts.append(item)
    return "".join(parts)


def check_messages(messages) -> list[Mapping]:
    """Validate roles, contents and tool calls; errors name the offending message index."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"message {i}: expected a mapping, got {type(m).__name__}")  # noqa: TRY004 (one error type for bad conversations)
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"message {i}: unknown role {role!r} (expected one of {', '.join(ROLES)})")
        content = m.get("content")
        allowed = (str, list, tuple, Mapping) if role == "tool" else (str, list, tuple)
        if content is not None and not isinstance(content, allowed):
            raise ValueError(f"message {i}: content must be a string or a list, got {type(content).__name__}")
        if role == "assistant":
            tool_calls(m, i)  # raises on a bad call
        out.append(m)
    return out


def tool_calls(message: Mapping, index: int) -> list[tuple[str, dict]]:
    """(name, arguments dict) of each call; OpenAI `{"function": {...}}` envelopes are unwrapped."""
    calls = []
    for j, tc in enumerate(message.get("tool_calls") or []):
        if not isinstance(tc, Mapping):
            raise ValueError(f"message {index}: tool call {j} must be a mapping")  # noqa: TRY004
        fn = tc.get("function") or tc  # the template unwraps `tc.function` when present
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"message {index}: tool call {j} has no name")
        calls.append((name, call_arguments(fn.get("arguments"), index, j)))
    return calls


def call_arguments(args, index: int = 0, j: int = 0) -> dict:
    """Arguments as a dict: a mapping, a JSON object string, or None/"" (no arguments)."""
    if args is None or args == "":
        return {}
    if isinstance(args, Mapping):
        return dict(args)
    if isinstance(args, str):
        try:
            value = json.loads(args)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
    raise ValueError(f"message {index}: tool call {j} arguments are neither a mapping nor a JSON object: {args!r:.80}")


def trains(message: Mapping) -> bool:
    """Whether an assistant message counts in the loss (`"train": False` or `"loss": False` excludes it)."""
    return bool(message.get("train", True)) and bool(message.get("loss", True))


# ---- argument typing -------------------------------------------------------------------------------------------


def tool_parameters(tools) -> dict[str, dict]:
    """Tool name -> its `parameters` schema, for OpenAI envelopes and bare function dicts alike."""
    out = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else {}
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = params if isinstance(params, Mapping) else {}
    return out


class ArgTyper:
    """Types the raw `<arg_value>` text of one tool's parameters by its JSON schema."""

    def __init__(self, parameters: Mapping | None):
        self.root = parameters or {}
        props = self.root.get("properties")
        self.props = props if isinstance(props, Mapping) else {}

    def __call__(self, key: str, raw: str):
        kinds = self.kinds(self.props.get(key))
        if kinds == {"string"}:
            return raw  # kept verbatim: whitespace matters for code-editing tools
        value = decode_value(raw)
        if value is _MISSING:
            return raw
        if "string" in kinds and "any" not in kinds and not any(_MATCHES[k](value) for k in kinds - {"string"}):
            return raw  # e.g. anyOf[string, integer] with text "abc" or with "[1]": keep the text
        return value

    def kinds(self, schema, depth: int = 0) -> set[str]:
        """Canonical kinds a schema allows; {"any"} when it says nothing usable."""
        if not isinstance(schema, Mapping) or depth > 16:
            return {"any"}
        if isinstance(schema.get("$ref"), str):
            return self.kinds(self._resolve(schema["$ref"]), depth + 1)
        for union in ("anyOf", "oneOf", "allOf"):
            if isinstance(schema.get(union), list) and schema[union]:
                return set().union(*(self.kinds(s, depth + 1) for s in schema[union]))
        t = schema.get("type")
        names = t if isinstance(t, list) else [t] if t is not None else []
        kinds = {_KIND.get(n, "any") for n in names if isinstance(n, str)}
        if not kinds and isinstance(schema.get("enum"), list) and schema["enum"]:
            kinds = {"string"} if all(isinstance(v, str) for v in schema["enum"]) else {"any"}
        if not kinds and "properties" in schema:
            kinds = {"object"}
        if not kinds and "items" in schema:
            kinds = {"array"}
        return kinds or {"any"}

    def _resolve(self, ref: str):
        node = self.root
        for part in ref.lstrip("#/").split("/"):
            node = node.get(part) if isinstance(node, Mapping) else None
        return node


def decode_value(raw: str):
    """JSON, then a Python literal (True, None, tuples, single quotes), else _MISSING."""
    text = raw.strip()
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _MISSING
    return value if _json_safe(value) else _MISSING


def _json_safe(value, depth: int = 0) -> bool:
    """Only values json.dumps writes back faithfully (no sets, bytes, complex numbers, non-string keys)."""
    if depth > 64:
        return False
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_safe(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_safe(v, depth + 1) for k, v in value.items())
    return False
