"""Inference: preallocated KV cache, batched sampling, MTP speculative decoding (see docs/inference.md)."""

from glmstack.inference.engine import Delta, Engine, GenerationResult, Request
from glmstack.inference.kv_cache import KVCache
from glmstack.inference.sampling import SamplingParams

__all__ = ["Delta", "Engine", "GenerationResult", "KVCache", "Request", "SamplingParams"]
