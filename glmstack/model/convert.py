"""`glmstack convert SRC DST`: re-shard an HF-layout GLM checkpoint and/or change its dtype (text models, and the
vision-language glm4v_moe / glm4v folders).

Loads SRC strictly (every tensor checked against config.json), then writes DST atomically with
`model.safetensors.index.json` when it needs more than one shard. Router weights and balancing biases stay fp32.

    glmstack convert ckpt/ ckpt-bf16/ --dtype bf16 --max-shard-size 5GB
"""

from __future__ import annotations

import argparse
import re

from glmstack.model.config import read_config_json
from glmstack.model.hf import DTYPES, load_hf, save_hf
from glmstack.model.vision.config import VL_MODEL_TYPES

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """'5GB' -> 5e9 bytes, '500MiB' -> 500 * 2**20, '123' -> 123."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 5GB, 500MB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="glmstack convert", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="checkpoint folder (config.json + *.safetensors)")
    p.add_argument("dst", help="output folder (replaced atomically)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="output dtype (default: as SRC)")
    p.add_argument("--max-shard-size", type=parse_size, default=parse_size("5GB"),
                   help="largest shard, e.g. 5GB (default), 500MB")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dtype = DTYPES[args.dtype] if args.dtype else None
    if read_config_json(args.src)[1].get("model_type") in VL_MODEL_TYPES:  # GLM-4.5V / GLM-4.1V folders
        from glmstack.model.vision import load_vl_hf, save_vl_hf

        model = load_vl_hf(args.src, dtype=dtype)
        save_vl_hf(model, args.dst, dtype=dtype, max_shard_bytes=args.max_shard_size)
        emb = model.language_model.embed_tokens.weight
    else:
        model = load_hf(args.src, dtype=dtype)
        save_hf(model, args.dst, dtype=dtype, max_shard_bytes=args.max_shard_size)
        emb = model.embed_tokens.weight
    print(f"wrote {args.dst} ({model.num_params() / 1e6:.1f}M parameters, {str(emb.dtype).removeprefix('torch.')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
