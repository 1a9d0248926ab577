"""The environments, and the lookup by name (`make_env`, `env_class`). Each module registers its classes in
env.ENVS; the lookup lives here, above them, because it needs them all loaded (with it in env.py, env.py and the
environments imported each other: issue 35).

calculator  arithmetic questions to answer with the calculator tool (the SFT tool set's calculator items)
python      small programs to solve by running code in glmstack.sandbox (the SFT tool set's python items)
functions   executable BFCL-style functions over several user turns, checked on the final state
files       create or fix files in a sandbox directory; checked by running tests in the sandbox
roles       a multi-agent role task: the model writes a sentence, then reviews its own draft as the reviewer
search      follow a chain of notes to a secret code: episodes longer than the context without management

    from glmstack.posttrain.agentic.envs import make_env
    env = make_env("calculator", EnvOptions(fault_p=0.2), seed=7)
"""

from __future__ import annotations

import importlib

from glmstack.posttrain.agentic.env import ENVS, Env, EnvOptions
from glmstack.posttrain.agentic.envs import files, functions, roles, search, tools  # noqa: F401 (registration)


def env_class(name: str) -> type[Env]:
    """A built-in environment by name, or your own `Env` subclass by import path ("package.module:Class"; Ray
    actors import it by the same path)."""
    if ":" in name:
        return _imported(name)
    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r} (expected one of {', '.join(sorted(ENVS))})")
    return ENVS[name]


def _imported(path: str) -> type[Env]:
    module, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"environment {path!r} cannot be imported ({e})") from None
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise ValueError(f"environment {path!r} is not an Env subclass")  # noqa: TRY004 (check() reports ValueError)
    return cls


def make_env(name: str, opts: EnvOptions | None = None, seed: int = 0) -> Env:
    return env_class(name)(opts, seed)
