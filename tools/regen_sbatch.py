#!/usr/bin/env python3
"""Regenerate the reference scripts in sbatch/ from their specs (sbatch/<name>.toml).

    python tools/regen_sbatch.py          # rewrite sbatch/*.sbatch
    python tools/regen_sbatch.py --check  # exit 1 when any is stale (what the test checks)

Renders with the built-in templates only (no --templates, no $HPCTRAIN_TEMPLATES), so
the references do not depend on the machine they are made on.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "sbatch"


def expected() -> dict[Path, str]:
    """Each reference script path -> what a fresh render produces."""
    from hpctrain.render.script import render_script
    from hpctrain.spec.model import JobSpec

    return {spec.with_suffix(".sbatch"): render_script(JobSpec.load(spec))
            for spec in sorted(EXAMPLES.glob("*.toml"))}


def main(argv: list[str]) -> int:
    stale = [p for p, text in expected().items()
             if not p.is_file() or p.read_text(encoding="utf-8") != text]
    if "--check" in argv:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run: python tools/regen_sbatch.py)")
        return 1 if stale else 0
    for p, text in expected().items():
        p.write_text(text, encoding="utf-8")
        print(f"{'wrote' if p in stale else 'unchanged'}: {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
