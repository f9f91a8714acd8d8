"""The one table of device kernels. Build, dispatch and tests all read it."""
from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=None)
def source_root() -> Path:
    """Directory holding csrc/ and flydsl_kernels/: the repo (editable install) or the
    copy shipped inside the installed package (python/mxgemm/_src)."""
    here = Path(__file__).resolve().parent
    for root in (here.parent.parent, here / "_src"):
        if (root / "csrc" / "include").is_dir():
            return root
    raise FileNotFoundError("mxgemm sources (csrc/) not found next to the package")
