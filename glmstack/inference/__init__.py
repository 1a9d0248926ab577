"""Inference: preallocated KV cache, batched sampling, MTP speculative decoding (see docs/inference.md)."""
