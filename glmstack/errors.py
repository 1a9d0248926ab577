"""The exceptions bad input raises: one message naming the file or field (and, where it helps, the fix).

Every `glmstack` command catches `GlmstackError` and prints its message as one line with a non-zero exit code, so a
user never sees a traceback for a mistake of theirs; the API raises the typed subclass.

    try: model = load_hf("ckpt/")
    except CheckpointError as e: print(e)      # "ckpt/model-00003-of-00047.safetensors: truncated or corrupt ..."
"""

from __future__ import annotations


class GlmstackError(ValueError):
    """Bad input from the user; the message names the file or field."""


class ConfigError(GlmstackError):
    """A config value or key is invalid; the message names the dotted field."""


class CheckpointError(GlmstackError):
    """A checkpoint folder cannot be read or does not match its config; the message names the file or tensors."""


class TokenizerError(GlmstackError):
    """A tokenizer folder is missing its files or cannot be parsed; the message names the path."""


def one_line(prog: str, err: BaseException) -> str:
    """`prog: message` on one line (a multi-line message is joined), what every CLI prints for bad input."""
    return f"{prog}: " + " ".join(str(err).split("\n"))
