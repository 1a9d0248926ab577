"""Where tests find the released reference files (official chat templates, zai-org config.json files): the
`shared/reference` folder beside the repository checkout (../shared/reference), or $GLMSTACK_REFERENCE. A test
that needs one and does not find it skips, naming the path it looked at."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REFERENCE = Path(os.environ.get("GLMSTACK_REFERENCE", Path(__file__).resolve().parents[2] / "shared" / "reference"))


def reference_file(*parts: str) -> Path:
    """REFERENCE/parts..., or skip the calling test with the path that is missing."""
    path = REFERENCE.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found (reference files: ../shared/reference beside the checkout, or $GLMSTACK_REFERENCE)")
    return path
