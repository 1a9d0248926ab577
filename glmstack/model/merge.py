"""`glmstack merge BASE ADAPTER --out DIR`: fold a LoRA adapter into its base and write a plain HF checkpoint.

What: loads BASE (an HF GLM folder) in fp32, puts ADAPTER (a PEFT folder: written by a glmstack LoRA stage or by
PEFT itself, model/lora_peft.py) on it, folds every pair in as W + s·BA (model/lora.py: merged_state_dict) and
saves DIR in BASE's dtype (or --dtype), loadable by anything that reads the base: transformers, vLLM, glmstack;
the tokenizer files come along (the adapter folder's, else the base's).
Why fp32 in between: the sum is formed once, rounded once to the output dtype. tests/integration/test_lora_merge.py
checks the merged folder equals the unmerged model within 1e-5 (fp32).

    glmstack merge runs/sft-base/model runs/lora/sft/model --out runs/merged --dtype bf16
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from glmstack.model.config import ModelConfig
from glmstack.model.hf import DTYPES, load_hf, save_hf
from glmstack.model.lora import merged_state_dict
from glmstack.model.lora_peft import load_adapter
from glmstack.model.model import GLM


def merge(base: str | Path, adapter: str | Path, out: str | Path, dtype: torch.dtype | None = None) -> GLM:
    """-> the merged model (fp32), written to `out` in `dtype` (None: the base's config dtype)."""
    meta = ModelConfig.from_hf(base).hf_metadata
    dtype = dtype or DTYPES.get(meta.get("dtype") or meta.get("torch_dtype"), torch.float32)
    model = load_hf(base, dtype=torch.float32, missing_mtp="drop")  # a transformers-written base has no MTP layer
    load_adapter(model, adapter)
    merged = GLM(model.cfg)
    merged.load_state_dict(merged_state_dict(model), assign=True)
    save_hf(merged, out, dtype=dtype)
    copy_tokenizer([adapter, base], out)
    return merged


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def copy_tokenizer(sources: list, out: str | Path) -> None:
    """The first source folder with a tokenizer.json gives its tokenizer files to `out`, so the merged folder serves
    and evaluates as it is (the adapter's first: a stage writes its tokenizer next to its adapter)."""
    import shutil

    for src in map(Path, sources):
        if (src / "tokenizer.json").exists():
            for name in TOKENIZER_FILES:
                if (src / name).exists():
                    shutil.copy2(src / name, Path(out) / name)
            return


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="glmstack merge", description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the base model's HF folder (config.json + *.safetensors)")
    p.add_argument("adapter", help="PEFT adapter folder (adapter_config.json + adapter_model.safetensors)")
    p.add_argument("--out", required=True, help="output folder (replaced atomically)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="output dtype (default: the base's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model = merge(args.base, args.adapter, args.out, DTYPES[args.dtype] if args.dtype else None)
    print(f"wrote {args.out} ({model.num_params() / 1e6:.1f}M parameters, base {args.base} + adapter {args.adapter})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
