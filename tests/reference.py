"""Where tests find the released reference files (official chat templates, zai-org config.json values): the copy
kept in the repository, tests/data/reference/ (its PROVENANCE.md says where each file comes from), so a fresh
clone runs every test that compares against them."""

from __future__ import annotations

from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "data" / "reference"


def reference_file(*parts: str) -> Path:
    """REFERENCE/parts...; a missing file is an error (the copy is part of the repository), never a skip."""
    path = REFERENCE.joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: reference file missing from the repository (see {REFERENCE}/PROVENANCE.md)")
    return path
