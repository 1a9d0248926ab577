"""The default data recipe: the embedded offline corpus (Python stdlib code and repos, docs, generated math,
template pages) at ~4 MB of raw text through every pipeline stage. It has only a `data` stage.

    glmstack data default --out runs/data --workers 2
"""

from __future__ import annotations

from glmstack.data.pipeline import PipelineConfig


def data() -> PipelineConfig:
    return PipelineConfig()
