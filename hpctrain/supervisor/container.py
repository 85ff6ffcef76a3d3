"""The step's container, where the supervisor has a part in it.

Every runtime: the job log says where the ranks find the hpctrain package in the
container (mounted from the host, in the image, or, when neither can be seen from
outside, that a script importing hpctrain.runtime needs it there).

``srun --container=BUNDLE`` (Slurm's own OCI support) takes an OCI bundle directory and
no mount option, so the job's mounts (the spec's, the partition's, the checkpoint dir and
the submit directory) and its working directory go into a bundle of the job's own: the
image's ``config.json`` with those mounts added and its root pointing at the image's
root file system, written to ``<state dir>/container/``, which every node sees. The
rendered ``--container=IMAGE`` word is then replaced by that bundle. pyxis and apptainer
take everything as flags; the rendered script already has them (hpctrain.render.container).

:func:`bundle_config` is pure; :func:`step_argv` reads the image and writes the bundle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctrain.errors import SupervisorError
from hpctrain.files import atomic_write

BUNDLE_DIR = "container"


def bundle_config(image: Mapping[str, Any], image_dir: str, plan: Mapping[str, Any],
                  submit_dir: str) -> dict[str, Any]:
    """The job's OCI config: ``image`` (the image's config.json) with an absolute root,
    read-only unless ``plan["writable"]``, the plan's mounts and the submit directory
    bind-mounted, and the working directory set (``plan["workdir"]``, else the submit dir)."""
    config = json.loads(json.dumps(image))  # a deep copy of plain JSON
    root = dict(config.get("root") or {"path": "rootfs"})
    if not os.path.isabs(root.get("path", "rootfs")):
        root["path"] = os.path.join(image_dir, root.get("path", "rootfs"))
    root["readonly"] = not plan.get("writable", False)
    config["root"] = root
    mounts = list(config.get("mounts") or [])
    taken = {m.get("destination") for m in mounts}
    wanted = [*plan.get("mounts", []), f"{submit_dir}:{submit_dir}"] if submit_dir \
        else list(plan.get("mounts", []))
    for text in wanted:
        source, target, *flags = text.split(":")
        if target in taken:
            continue
        taken.add(target)
        options = ["rbind", "ro" if "ro" in flags else "rw"]
        mounts.append({"destination": target, "type": "bind", "source": source,
                       "options": options})
    config["mounts"] = mounts
    process = dict(config.get("process") or {})
    process["cwd"] = plan.get("workdir") or submit_dir or process.get("cwd", "/")
    config["process"] = process
    return config


def hpctrain_inside(package_dir: str, binds: Sequence[tuple[str, str]],
                    rootfs: str | None = None) -> str:
    """Where the ranks find the ``hpctrain`` package in the container: a line for the job
    log. ``binds`` are (host source, container target) pairs; ``rootfs`` the image's root
    directory when it can be looked into (an OCI bundle), None for an opaque image."""
    for source, target in binds:
        if source == target and (package_dir == source or
                                 package_dir.startswith(source.rstrip("/") + "/")):
            return f"container: hpctrain is mounted in from the host ({package_dir})"
    if rootfs is not None and os.path.isdir(os.path.join(rootfs, package_dir.lstrip("/"))):
        return f"container: hpctrain is in the image ({package_dir})"
    fix = (f"a script that imports hpctrain.runtime fails there: install hpctrain in the "
           f'image or mount it ([container] mounts = ["{package_dir}"])')
    if rootfs is not None:
        return f"container: hpctrain ({package_dir}) is neither in the image nor mounted in: {fix}"
    return f"container: hpctrain ({package_dir}) is not mounted in; unless the image has it, {fix}"


def step_argv(argv: Sequence[str], plan: Mapping[str, Any] | None, state_dir: Path,
              submit_dir: str) -> tuple[list[str], list[str]]:
    """The launcher argv to run, and lines for the job log (none without a container).

    Raises SupervisorError (the job cannot start: no requeue helps) when the image is
    not an OCI bundle."""
    argv = list(argv)
    if not plan:
        return argv, []
    package = str(Path(__file__).resolve().parents[1])
    if plan.get("runtime") != "oci":
        binds = [tuple(m.split(":")[:2]) for m in plan.get("mounts", [])]
        return argv, [hpctrain_inside(package, [*binds, (submit_dir, submit_dir)])]
    image = str(plan["image"])
    word = f"--container={image}"
    if word not in argv:
        return argv, [f"container: {word} is not in the launcher command (a site template "
                      "changed it): the step runs as rendered"]
    source = Path(image) / "config.json"
    try:
        image_config = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise SupervisorError(f"container image {image!r} is not an OCI bundle ({source}: "
                              f"{getattr(exc, 'strerror', None) or exc}): give a directory "
                              "with config.json and its root file system") from None
    bundle = state_dir / BUNDLE_DIR
    bundle.mkdir(parents=True, exist_ok=True)
    config = bundle_config(image_config, image, plan, submit_dir)
    atomic_write(bundle / "config.json", json.dumps(config, indent=1))
    argv[argv.index(word)] = f"--container={bundle}"
    binds = [(m.get("source", ""), m.get("destination", "")) for m in config["mounts"]
             if m.get("type") == "bind"]
    return argv, [f"container: Slurm OCI bundle {bundle} (image {image}, "
                  f"{len(config['mounts'])} mounts, cwd {config['process']['cwd']})",
                  hpctrain_inside(package, binds, config["root"]["path"])]
