"""Strict dataclass configs shared by every component.

Configs are data: `@dataclass(kw_only=True)` classes whose fields carry a comment. This module turns them into
and out of plain dicts/JSON and applies `--set a.b=value` overrides, refusing unknown keys (the error lists the
valid ones) and values of the wrong type, so a typo never silently trains the wrong model.

    cfg = from_dict(TrainConfig, json.load(f))
    cfg = apply_overrides(cfg, ["optim.lr=3e-4", "steps=100"])
    write_json(cfg, "config.json"); differing = diff_fields(old_cfg, cfg)
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import types
import typing
from typing import Any, TypeVar

from glmstack.atomic import write_atomic
from glmstack.errors import ConfigError

T = TypeVar("T")


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp` (recursing into dataclasses, lists, dicts, Optional)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value) and isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {type(value).__name__}")
        return from_dict(tp, value, _prefix=where + ".")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        kt, vt = typing.get_args(tp) or (Any, Any)
        return {k: _coerce(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: dict, *, _prefix: str = "") -> T:
    """Build dataclass `cls` from `data`; unknown keys and wrong types raise ConfigError naming the field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{_prefix.rstrip('.') or cls.__name__}: expected a mapping, got {type(data).__name__}")
    types_ = _field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(_prefix + k for k in unknown)} for {cls.__name__}; "
            f"valid keys: {', '.join(sorted(types_))}"
        )
    kwargs = {k: _coerce(v, types_[k], _prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{cls.__name__}: {e}") from None


def to_dict(cfg) -> dict:
    """Plain-JSON dict of a dataclass config (tuples become lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def to_json(cfg) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=False)


def write_json(cfg_or_dict, path: str | os.PathLike) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a config."""
    data = cfg_or_dict if isinstance(cfg_or_dict, dict) else to_dict(cfg_or_dict)
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def valid_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a dataclass config (for error messages and --help)."""
    keys = []
    for name, tp in _field_types(cls).items():
        if dataclasses.is_dataclass(tp):
            keys += valid_keys(tp, prefix + name + ".")
        else:
            keys.append(prefix + name)
    return keys


def _parse_value(text: str) -> Any:
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError):
            pass
    return text


def apply_overrides(cfg: T, overrides: list[str]) -> T:
    """Return a copy of `cfg` with `key.sub=value` overrides applied (values parsed as JSON, then Python, then str)."""
    data = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key not in valid_keys(type(cfg)) and not _is_dict_path(type(cfg), key):
            raise ConfigError(f"unknown override key {key!r}; valid keys: {', '.join(valid_keys(type(cfg)))}")
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        value = _parse_value(raw)
        if isinstance(node.get(leaf), str) and not isinstance(value, str):
            value = raw  # a string field keeps the literal text ("--set name=123" stays "123")
        node[leaf] = value
    return from_dict(type(cfg), data)


def _is_dict_path(cls, key: str) -> bool:
    head = key.split(".")[0]
    tp = _field_types(cls).get(head)
    return typing.get_origin(tp) is dict


def diff_fields(a, b, prefix: str = "") -> list[str]:
    """Dotted names of the fields where two configs of one type differ."""
    da, db = (x if isinstance(x, dict) else to_dict(x) for x in (a, b))
    out = []
    for k in sorted(set(da) | set(db)):
        va, vb = da.get(k), db.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += diff_fields(va, vb, prefix + k + ".")
        elif va != vb:
            out.append(prefix + k)
    return out
