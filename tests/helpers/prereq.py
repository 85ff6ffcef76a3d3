"""The house rule for prerequisites (the SLURM devcluster, torch, deepspeed): a test whose
prerequisite is missing skips on a developer's machine but FAILS when CI=true, so CI can
never go green by skipping. Use :func:`require` for any such check, never ``pytest.skip``.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(ok: bool, what: str) -> None:
    """Skip locally, fail in CI, when a prerequisite ``what`` is missing."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a prerequisite is missing: {what}", pytrace=False)
    pytest.skip(f"prerequisite missing: {what} (with CI=true this fails instead)")
