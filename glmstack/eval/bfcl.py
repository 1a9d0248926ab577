"""BFCL (Berkeley Function-Calling Leaderboard v4, the `bfcl-eval` package's data): single-turn tool calling,
checked by the package's own AST checker.

Categories: simple_python / simple_java / simple_javascript, multiple, parallel, parallel_multiple, irrelevance,
live_simple, live_multiple, live_parallel, live_parallel_multiple, live_irrelevance, live_relevance. The
multi-turn, memory and web-search sets need the package's executable backends or the network and are not run.
Each item is one chat request with the question's messages and the functions as OpenAI `tools` (BFCL's Python
type names mapped to JSON schema as the package maps them for function-calling models, dots in names replaced
by `_`; Java/JavaScript parameters become strings, as BFCL asks of FC models, since its checker parses them as
source literals). In process the request goes through GLM's template (glmstack.chat.render with tools) and the
reply through glmstack.chat.parse; an endpoint gets `tools` and returns `tool_calls`.
Scoring: the calls, with the original names, go to bfcl_eval's `ast_checker` with the category's possible
answers; irrelevance items pass when no call is made, live_relevance ones when at least one is.

    glmstack eval --endpoint http://127.0.0.1:8000/v1 --tasks bfcl --limit 50
"""

from __future__ import annotations

import copy
import json
import sys
import types
from pathlib import Path

from glmstack.eval.runner import Item

CATEGORIES = (
    "simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple", "irrelevance",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance", "live_relevance",
)  # fmt: skip
NO_CALL = ("irrelevance", "live_irrelevance")  # pass = no call
ANY_CALL = ("live_relevance",)  # pass = at least one call


def data_dir() -> Path:
    import bfcl_eval

    return Path(bfcl_eval.__file__).parent / "data"


def read_jsonl(path: Path) -> list[dict]:
    """BFCL's `.json` files are JSON Lines."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def language(category: str) -> str:
    return "java" if category.endswith("_java") else "javascript" if category.endswith("_javascript") else "python"


def ast_checker():
    """bfcl_eval's ast_checker and Language, imported without the package's API-client dependencies.

    Its module imports `bfcl_eval.constants.model_config` only for `MODEL_CONFIG_MAPPING[model].underscore_to_dot`;
    that module imports every provider SDK, so a stand-in answering False (names are mapped back here) is put first.
    """
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        stub = types.ModuleType(name)

        class _Config(dict):
            def __missing__(self, key):
                return types.SimpleNamespace(underscore_to_dot=False)

        stub.MODEL_CONFIG_MAPPING = _Config()
        sys.modules[name] = stub
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker as checker

    return checker, Language


# ---------------------------------------------------------------- functions -> OpenAI tools
def to_tool(fn: dict, lang: str) -> dict:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    params = copy.deepcopy(fn.get("parameters") or {"type": "dict", "properties": {}})
    props = params.get("properties") or {}
    if lang == "python":
        _map_types(props, GORILLA_TO_OPENAPI)
    else:  # BFCL's checker parses Java/JS values from source text
        for spec in props.values():
            spec["description"] = (spec.get("description", "") + f" This is {lang} {spec.get('type', 'any')} "
                                   "type parameter in string representation.").strip()  # fmt: skip
            spec["type"] = "string"
            spec.pop("items", None), spec.pop("properties", None)
    params["type"], params["properties"] = "object", props
    return {"type": "function", "function": {"name": api_name(fn["name"]), "description": fn.get("description", ""),
                                             "parameters": params}}  # fmt: skip


def _map_types(props: dict, mapping: dict) -> None:
    for spec in props.values():
        spec["type"] = mapping.get(spec.get("type", "string"), "string")
        if isinstance(spec.get("properties"), dict):
            _map_types(spec["properties"], mapping)
        if isinstance(spec.get("items"), dict):
            _map_types({"_": spec["items"]}, mapping)


def api_name(name: str) -> str:
    """OpenAI function names match ^[a-zA-Z0-9_-]{1,64}$; BFCL's may have dots."""
    return name.replace(".", "_")


# ---------------------------------------------------------------- ground truth -> one correct call list
def ground_truth_calls(answers: list[dict], functions: list[dict], lang: str = "python") -> list[dict]:
    """One call list that the possible answers accept: each parameter's first acceptable value ("" = omit).
    Java/JavaScript values are written as the source literals BFCL's checker parses back."""
    props = {f["name"]: (f.get("parameters") or {}).get("properties") or {} for f in functions}
    calls = []
    for call in answers:
        for fn, args in call.items():
            picked = _pick_args(args)
            if lang != "python":
                picked = {k: source_literal(v, props.get(fn, {}).get(k, {}), lang) for k, v in picked.items()}
            calls.append({"name": api_name(fn), "arguments": picked})
    return calls


def source_literal(value, spec: dict, lang: str) -> str:
    """A Java/JavaScript literal for `value` of the BFCL type in `spec` (what bfcl_eval's type converters read)."""
    kind, item = spec.get("type", "any"), (spec.get("items") or {}).get("type", "String")
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}L" if kind == "long" else f"{value}n" if kind == "Bigint" else str(value)
    if isinstance(value, float):
        return f"{value}f" if lang == "java" and kind == "float" else repr(value)
    if isinstance(value, list):
        parts = [_element(v, item, lang) for v in value]
        if lang == "javascript":
            return "[" + ", ".join(parts) + "]"
        if kind == "ArrayList":
            return f"new ArrayList<>(Arrays.asList({', '.join(parts)}))"
        # the checker's Array parser converts each element by the item type, so String items go unquoted
        parts = [str(v) if isinstance(v, str) else p for v, p in zip(value, parts)]
        return f"new {item}[]{{{', '.join(parts)}}}"
    if isinstance(value, dict):
        if lang == "javascript":
            return "{" + ", ".join(f"{k}: {_element(v, 'any', lang)}" for k, v in value.items()) + "}"
        puts = "".join(f'put("{k}", {_element(v, "any", lang)}); ' for k, v in value.items())
        return f"new HashMap<String, String>() {{{{ {puts}}}}}"
    return str(value)


def _element(value, kind: str, lang: str) -> str:
    if isinstance(value, str):
        return f"'{value}'" if kind == "char" else f'"{value}"'
    return source_literal(value, {"type": kind}, lang)


def _pick_args(args: dict) -> dict:
    picked = {}
    for key, options in args.items():
        # None only where omitting is not allowed: GLM's text format writes null for a string parameter as "null"
        value = next((v for v in options if v != "" and v is not None), "" if "" in options else None)
        if value != "":
            picked[key] = _pick_value(value)
    return picked


def _pick_value(value):
    """Dict values list each key's acceptable values too (and lists of such dicts)."""
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return _pick_args(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_pick_value(v) for v in value]
    return value


# ---------------------------------------------------------------- the task
class BFCLTask:
    name = "bfcl"
    max_tokens = 512

    def __init__(self, categories=CATEGORIES):
        unknown = sorted(set(categories) - set(CATEGORIES))
        if unknown:
            raise ValueError(f"unknown BFCL categories {unknown}; known: {', '.join(CATEGORIES)}")
        self.categories = tuple(categories)
        self.checker, self.Language = ast_checker()

    def items(self, limit: int | None = None) -> list[Item]:
        from glmstack.eval.fim import spread

        root, items = data_dir(), []
        for cat in self.categories:
            records = read_jsonl(root / f"BFCL_v4_{cat}.json")
            answer_file = root / "possible_answer" / f"BFCL_v4_{cat}.json"
            answers = {a["id"]: a["ground_truth"] for a in read_jsonl(answer_file)} if answer_file.exists() else {}
            items += [self._item(cat, rec, answers.get(rec["id"])) for rec in spread(records, limit)]
        return items

    def _item(self, cat: str, rec: dict, truth: list | None) -> Item:
        lang = language(cat)
        tools = [to_tool(fn, lang) for fn in rec["function"]]
        messages = rec["question"][0]
        if cat in NO_CALL:
            oracle = {"text": "None of the given functions can answer this.", "tool_calls": []}
        elif cat in ANY_CALL:
            oracle = {"text": "", "tool_calls": [{"name": tools[0]["function"]["name"], "arguments": {}}]}
        else:
            oracle = {"text": "", "tool_calls": ground_truth_calls(truth, rec["function"], lang)}
        meta = {"group": cat, "functions": rec["function"], "truth": truth,
                "names": {api_name(f["name"]): f["name"] for f in rec["function"]}}  # fmt: skip
        text = "\n".join(m["content"] for m in messages if m["role"] == "user" and isinstance(m["content"], str))
        return Item(rec["id"], {"kind": "chat", "messages": messages, "tools": tools}, oracle, meta, text=text)

    def score(self, items: list[Item], outputs: list[dict]) -> list[dict]:
        return [self.check(it, out) for it, out in zip(items, outputs)]

    def check(self, item: Item, out: dict) -> dict:
        cat, calls = item.meta["group"], out["tool_calls"]
        if cat in NO_CALL:
            return {"passed": not calls, "result": "no call" if not calls else "made a call"}
        if cat in ANY_CALL:
            return {"passed": bool(calls), "result": "called" if calls else "no call"}
        decoded = [{item.meta["names"].get(c["name"], c["name"]): c["arguments"]} for c in calls]
        lang = getattr(self.Language, language(cat).upper())
        try:
            verdict = self.checker(item.meta["functions"], decoded, item.meta["truth"], lang, cat, "glmstack")
        except Exception as e:  # noqa: BLE001 - the checker trips on some malformed outputs: a failure
            return {"passed": False, "result": f"checker error: {type(e).__name__}: {e}"[:300]}
        return {
            "passed": bool(verdict["valid"]),
            "result": "passed" if verdict["valid"] else str(verdict["error"])[:300],
        }
