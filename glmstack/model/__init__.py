"""The GLM-4.5 model family: config, model, Hugging Face checkpoints in and out (see docs/model.md)."""

from glmstack.model.config import ModelConfig
from glmstack.model.model import GLM, GLMOutput
from glmstack.model.attention import SimpleKVCache
from glmstack.model.hf import load_hf, save_hf

__all__ = ["ModelConfig", "GLM", "GLMOutput", "SimpleKVCache", "load_hf", "save_hf"]
