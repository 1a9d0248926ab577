"""Atomic file writes: the new content goes to a temporary file beside the target, then `os.replace` moves it into
place, so a reader (or a run resumed after a kill) sees the old file or the new one, never half of one.

    write_atomic("index.json", text)                          # str or bytes
    write_atomic("docs.idx.npy", lambda tmp: np.save(tmp, a))  # or a function that writes the temporary path
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[Path], object]) -> Path:
    """Write `data` to `path` through a temporary sibling (same suffix, so np.save adds none) and os.replace."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        elif isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            data(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
