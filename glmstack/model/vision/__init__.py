"""GLM vision-language models (GLM-4.5V `glm4v_moe`, GLM-4.1V `glm4v`) beside the text model (docs/multimodal.md).

    from glmstack.model.vision import GLMV, VLConfig, load_vl_hf, save_vl_hf, expand_placeholders
"""

from glmstack.model.vision.config import DenseTextConfig, VisionConfig, VLConfig
from glmstack.model.vision.hf import load_vl_hf, save_vl_hf
from glmstack.model.vision.model import GLMV
from glmstack.model.vision.mrope import VisionInputError, rope_index, token_types
from glmstack.model.vision.placeholders import expand_placeholders, tokens_per_image
from glmstack.model.vision.presets import token_ids

__all__ = ["DenseTextConfig", "GLMV", "VLConfig", "VisionConfig", "VisionInputError", "expand_placeholders",
           "load_vl_hf", "rope_index", "save_vl_hf", "token_ids", "token_types", "tokens_per_image"]
