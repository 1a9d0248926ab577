"""Byte-level BPE tokenizer with GLM's special tokens, on Hugging Face `tokenizers`.

What: `Tokenizer.train(texts, vocab_size)` learns a byte-level BPE (GLM-4's pre-tokenizer regex, every byte in the
alphabet, so any string round-trips exactly) and appends GLM-4.5's 36 added tokens after the merges, in GLM's
order (that of GLM-4.5's released tokenizer_config.json `added_tokens_decoder`): `<|endoftext|>`, `[MASK]`, `[gMASK]`, ..., `<think>`, `<tool_call>`, ...
`Tokenizer.load(folder)` reads a real GLM tokenizer folder (tokenizer.json + tokenizer_config.json) and keeps its
ids; `save(folder)` writes the same Hugging Face layout, so `transformers.AutoTokenizer.from_pretrained(folder)`
encodes to identical ids.

Why: every later stage (data shards, chat encoding, serving) speaks token ids; the chat format needs each tag
(`<|user|>`, `<arg_key>`, ...) to be ONE id so loss masks fall on token boundaries (glmstack.chat.encode).

How to run:
    glmstack tokenizer train --input corpus/*.txt --vocab-size 32768 --out runs/tok
    glmstack tokenizer encode --tokenizer runs/tok "<|user|>Hello"
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as _HFTokenizer

from glmstack.errors import TokenizerError

# GLM-4.5's added tokens in id order (151329..151364 in GLM-4.5, 154820.. in GLM-4.7-Flash/GLM-5).
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>", "<|end_of_transcription|>",
    "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "/nothink", "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>",
)  # fmt: skip

# Generation stops on these (config.json `eos_token_id` order: [<|endoftext|>, <|user|>, <|observation|>]).
EOS_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|user|>", "<|observation|>")

# GLM-4's pre-tokenizer split (the cl100k pattern): letters, 1-3 digit groups, punctuation runs, newlines.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class Tokenizer:
    """GLM tokenizer: `encode`/`decode`, `token_id(name)` for special tokens, `vocab_size`, `eos_ids`."""

    def __init__(self, hf: _HFTokenizer, config: dict | None = None):
        self._tok = hf
        self._config = dict(config or {})
        self._special = {t.content: i for i, t in hf.get_added_tokens_decoder().items()}

    # ---- construction ------------------------------------------------------------------------------------

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
        """Learn `vocab_size - 36` byte-level BPE tokens from `texts`, then append the special tokens."""
        n_bpe = vocab_size - len(SPECIAL_TOKENS)
        if n_bpe < 256:
            raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (256 bytes + special tokens)")
        hf = _HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=n_bpe,
            min_frequency=min_frequency,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: no unknown tokens, exact round trip
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer)
        # Added after training so they take the ids after the merges, as in GLM's own vocabulary.
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
        return cls(hf)

    @classmethod
    def load(cls, folder: str | os.PathLike) -> Tokenizer:
        """Read a Hugging Face tokenizer folder (a released GLM one or one written by `save`)."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{path}: not found (a tokenizer folder holds tokenizer.json and "
                                 f"tokenizer_config.json, as `glmstack tokenizer train --out` writes them)")
        config_path = folder / "tokenizer_config.json"
        try:
            config = json.loads(config_path.read_text()) if config_path.exists() else {}
            hf = _HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception for a malformed file
            bad = config_path if isinstance(e, json.JSONDecodeError) else path
            raise TokenizerError(f"{bad}: cannot be read as a tokenizer file ({e})") from None
        template_path = folder / "chat_template.jinja"  # transformers 5 keeps the template in its own file
        if template_path.exists() and "chat_template" not in config:
            config["chat_template"] = template_path.read_text()
        return cls(hf, config)

    def save(self, folder: str | os.PathLike, chat_style: str | None = "glm-4.5") -> None:
        """Write tokenizer.json + tokenizer_config.json (+ special_tokens_map.json) for transformers.

        A tokenizer without a chat template gets the official one of `chat_style` (None: none), so
        `apply_chat_template` on the saved folder gives the same ids as `glmstack.chat.encode`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / "tokenizer.json"))
        config = dict(self._config or self._default_config())
        if chat_style is not None and "chat_template" not in config:
            from glmstack.chat.render import official_template

            config["chat_template"] = official_template(chat_style)
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        specials = {"eos_token": config.get("eos_token"), "pad_token": config.get("pad_token")}
        (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")

    def _default_config(self) -> dict:
        added = {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for t, i in sorted(self._special.items(), key=lambda kv: kv[1])
        }  # fmt: skip
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "clean_up_tokenization_spaces": False,
            "do_lower_case": False,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072,
            "padding_side": "left",
            "remove_space": False,
        }

    # ---- the contract -------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it become their single ids. No BOS is added:
        `[gMASK]<sop>` comes from the chat template (GLM's released chat_template starts every prompt with it)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` over many texts at once, parallel in Rust (the data pipeline's path)."""
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, special tokens included, so `decode(encode(s)) == s` for every string."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_id(self, name: str) -> int:
        """Id of a special token such as `"<|user|>"`; KeyError when this vocabulary lacks it."""
        if name not in self._special:
            raise KeyError(f"{name!r} is not a special token of this tokenizer")
        return self._special[name]

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @property
    def vocab_size(self) -> int:
        """Number of ids in use (merges + added tokens); the model's embedding may have padding rows beyond."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_ids(self) -> list[int]:
        """Ids that end an assistant turn: `<|endoftext|>`, `<|user|>`, `<|observation|>`."""
        return [self._special[t] for t in EOS_TOKENS if t in self._special]

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    @property
    def backend(self) -> _HFTokenizer:
        """The underlying `tokenizers.Tokenizer` (for offsets, padding, truncation)."""
        return self._tok


# ---- command line ---------------------------------------------------------------------------------------------


def iter_texts(paths: Iterable[str], chunk_chars: int = 1 << 16) -> Iterator[str]:
    """Documents from files: the `text` field of each .jsonl line, else ~64K-character pieces cut at newlines."""
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            if path.endswith(".jsonl"):
                yield from (json.loads(line).get("text", "") for line in f if line.strip())
                continue
            buf: list[str] = []
            size = 0
            for line in f:
                buf.append(line)
                size += len(line)
                if size >= chunk_chars:
                    yield "".join(buf)
                    buf, size = [], 0
            if buf:
                yield "".join(buf)


def _counting(texts: Iterable[str], counter: list[int]) -> Iterator[str]:
    for t in texts:
        counter[0] += len(t.encode("utf-8"))
        yield t


def _train_cmd(args: argparse.Namespace) -> int:
    nbytes = [0]
    start = time.perf_counter()
    tok = Tokenizer.train(_counting(iter_texts(args.input), nbytes), args.vocab_size, args.min_frequency)
    seconds = time.perf_counter() - start
    tok.save(args.out)
    mb = nbytes[0] / 1e6
    print(f"trained {tok.vocab_size} tokens on {mb:.1f} MB in {seconds:.1f} s ({mb / seconds:.2f} MB/s) -> {args.out}")
    return 0


def _encode_cmd(args: argparse.Namespace) -> int:
    tok = Tokenizer.load(args.tokenizer)
    ids = tok.encode(args.text)
    print(json.dumps(ids))
    if args.verbose:
        print(json.dumps([tok.decode([i]) for i in ids], ensure_ascii=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmstack tokenizer", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train", help="train a byte-level BPE with GLM's special tokens")
    tr.add_argument("--input", nargs="+", required=True, help="text files (.jsonl: the 'text' field of each line)")
    tr.add_argument("--vocab-size", type=int, required=True, help="total ids including the 36 special tokens")
    tr.add_argument("--min-frequency", type=int, default=2, help="least count for a merge")
    tr.add_argument("--out", required=True, help="folder for tokenizer.json + tokenizer_config.json")
    tr.set_defaults(func=_train_cmd)
    en = sub.add_parser("encode", help="print the token ids of a text")
    en.add_argument("--tokenizer", required=True, help="tokenizer folder")
    en.add_argument("--verbose", "-v", action="store_true", help="also print each token's text")
    en.add_argument("text")
    en.set_defaults(func=_encode_cmd)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
