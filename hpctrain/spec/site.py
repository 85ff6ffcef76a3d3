"""Where templates live: the built-in set, layered under a site's own directories.

The built-in templates are the top-level ``templates/`` directory of a source
checkout; an installed wheel carries the same files as ``hpctrain/templates``
(setup.cfg maps the package ``hpctrain.templates`` onto ``templates/``). A site keeps
its own directory outside the package (``HPCTRAIN_TEMPLATES``, ``os.pathsep``
separated, or ``--templates DIR``); a file there shadows the built-in one of the same
relative path.

The devcluster's own partitions (``templates/devcluster/``) are a layer below the built-in
one, on the search path only where the active Slurm is the devcluster: at a real site a
partition of the same name (``debug`` is a common one) is the site's, never the devcluster's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Mapping

from hpctrain.errors import TemplateError

ENV_VAR = "HPCTRAIN_TEMPLATES"


def builtin_templates_dir() -> Path:
    """The built-in templates directory, from a wheel or from a source checkout."""
    here = Path(__file__).resolve().parent.parent  # the hpctrain package
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "base.sbatch.j2").is_file() or (candidate / "partitions").is_dir():
            return candidate
    raise TemplateError(
        f"built-in templates not found next to {here}: reinstall hpctrain "
        "(the wheel must contain hpctrain/templates)"
    )


def devcluster_templates_dir() -> Path:
    """The devcluster's partitions and their templates (under the built-in directory)."""
    return builtin_templates_dir() / "devcluster"


def template_dirs(extra: Iterable[str | os.PathLike[str]] = (),
                  environ: Mapping[str, str] | None = None) -> list[Path]:
    """Template search path, highest priority first: ``extra``, then the env var, then built-in."""
    env = os.environ if environ is None else environ
    dirs = [Path(d) for d in extra]
    dirs += [Path(p) for p in env.get(ENV_VAR, "").split(os.pathsep) if p]
    for d in dirs:
        if not d.is_dir():
            raise TemplateError(f"template directory {str(d)!r} does not exist: "
                                f"fix --templates or ${ENV_VAR}")
    return [*dirs, builtin_templates_dir()]
