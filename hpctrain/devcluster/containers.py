"""The devcluster's container runtime: Slurm's own OCI support run by runc.

``devcluster up`` writes oci.conf beside slurm.conf (slurmstepd reads it for each
container step, so no daemon restarts) and an OCI bundle of this host at
``<devcluster>/images/host``: an empty root with the host's system, Python installs, homes
and shared storage bind-mounted (no registry is reachable here). A job runs in it with

    [container]
    image = "/var/lib/hpctrain/devcluster/images/host"

docs/containers.md and docs/devcluster.md have the details; the facts behind the choices
(runc works here, crun does not; one task per node per container step, each with the
same Slurm variables) are in hpctrain.devcluster.config and hpctrain.spec.container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hpctrain.devcluster import ociconf
from hpctrain.devcluster.config import Paths
from hpctrain.errors import DevclusterError
from hpctrain.files import atomic_write


def runc_default_spec() -> dict:
    """``runc spec``'s default config.json (the runc installed here knows its own schema)."""
    with tempfile.TemporaryDirectory(prefix="hpctrain-runc-spec-") as tmp:
        proc = subprocess.run(["runc", "spec", "--bundle", tmp], capture_output=True,
                              text=True, timeout=30)
        if proc.returncode != 0:
            raise DevclusterError(f"`runc spec` failed: {proc.stderr.strip() or proc.returncode}"
                                  " (is runc installed? `apt-get install runc`)")
        return json.loads((Path(tmp) / "config.json").read_text())


def ensure_host_image(paths: Paths) -> Path:
    """Write oci.conf and the host image (idempotent); the image's directory."""
    for d in (paths.images, paths.runc_root):
        d.mkdir(parents=True, exist_ok=True)
    paths.runc_root.chmod(0o1777)  # like /tmp: every user's runc makes its own state dir
    _write_if_changed(paths.oci_conf, ociconf.oci_conf(paths))
    here = [sys.prefix, sys.base_prefix, os.path.realpath(sys.executable),
            str(Path(__file__).resolve().parents[2])]
    binds = ociconf.image_binds(here)
    image = paths.host_image
    rootfs = image / "rootfs"
    for d in ("proc", "dev", "sys", *(b.lstrip("/") for b in binds)):
        (rootfs / d).mkdir(parents=True, exist_ok=True)  # mount points in the empty root
    _write_if_changed(image / "config.json",
                      json.dumps(ociconf.host_image_config(runc_default_spec(), binds),
                                 indent=1) + "\n")
    return image


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    atomic_write(path, text)
