"""The step's container, where the supervisor has a part in it.

Every runtime: the job log says where the ranks find the hpctrain package in the
container (mounted from the host, in the image, or, when neither can be seen from
outside, that a script importing hpctrain.runtime needs it there).

``srun --container=BUNDLE`` (Slurm's own OCI support) takes an OCI bundle directory and
no mount option, so the job's mounts (the spec's, the partition's, the checkpoint dir and
the submit directory) and its working directory go into a bundle of the job's own,
written to ``<state dir>/container/``, which every node sees: the image's
``config.json`` with those mounts added, over a root of mount points for the image's root
(:func:`bundle_config` says why). The
rendered ``--container=IMAGE`` word is then replaced by that bundle. pyxis and apptainer
take everything as flags; the rendered script already has them (hpctrain.render.container).

:func:`bundle_config` is pure; :func:`step_argv` reads the image and writes the bundle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctrain.errors import SupervisorError
from hpctrain.files import atomic_write

BUNDLE_DIR = "container"


def image_root(image: Mapping[str, Any], image_dir: str) -> str:
    """The image's root file system, as an absolute path."""
    path = str((image.get("root") or {}).get("path", "rootfs"))
    return path if os.path.isabs(path) else os.path.join(image_dir, path)


def bundle_config(image: Mapping[str, Any], image_dir: str, plan: Mapping[str, Any],
                  submit_dir: str, entries: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The job's OCI config: ``image`` (the image's config.json) over a root of its own.

    Slurm 22.05 always runs ``<bundle>/rootfs`` (it rewrites ``root.path``) and runc
    refuses a symlink there, so the job's root is a directory of mount points: each
    top-level entry of the image's root (``entries``: name, "dir" | "file") is
    bind-mounted from the image, first, then come the image's own mounts, the plan's
    mounts and the submit directory. Read-only unless ``plan["writable"]``; the working
    directory is ``plan["workdir"]``, else the submit dir."""
    config = json.loads(json.dumps(image))  # a deep copy of plain JSON
    ro = "rw" if plan.get("writable", False) else "ro"
    config["root"] = {"path": "rootfs", "readonly": ro == "ro"}
    own = list(config.get("mounts") or [])
    taken = {m.get("destination") for m in own}
    root = image_root(image, image_dir)
    mounts = [{"destination": f"/{name}", "type": "bind", "source": os.path.join(root, name),
               "options": ["rbind", ro]}
              for name, _ in entries if f"/{name}" not in taken]
    mounts += own
    wanted = [*plan.get("mounts", []), f"{submit_dir}:{submit_dir}"] if submit_dir \
        else list(plan.get("mounts", []))
    for text in wanted:
        source, target, *flags = text.split(":")
        if target in taken:
            continue
        taken.add(target)
        mounts.append({"destination": target, "type": "bind", "source": source,
                       "options": ["rbind", "ro" if "ro" in flags else "rw"]})
    config["mounts"] = mounts
    process = dict(config.get("process") or {})
    process["cwd"] = plan.get("workdir") or submit_dir or process.get("cwd", "/")
    config["process"] = process
    return config


# what an unprivileged user may not mount in a user namespace that does not own the host's
# pid, network and IPC namespaces: bound from the host instead (as `runc spec --rootless`)
_ROOTLESS_BIND = {"proc": "/proc", "sysfs": "/sys"}
_ROOTLESS_DROP = {"cgroup", "mqueue"}   # no cgroups here; POSIX queues need an IPC namespace


def rootless(config: dict[str, Any], uid: int, gid: int,
             reachable: Callable[[str], bool] = os.path.exists
             ) -> dict[str, Any]:
    """``config`` for runc run by an ordinary user (Slurm starts the container as the job's
    user), as ``runc spec --rootless`` makes it: a user namespace in which the user is
    root (runc 1.1 requires a mapping of root; files the ranks write are the user's on
    the host), and the mounts a user namespace may not make (proc, sysfs: bound from
    the host; cgroup, mqueue: left out; devpts without gid=5). A bind whose source the
    user cannot reach (``reachable``: it cannot even stat it, like another user's home or
    /root) is left out: it would fail the whole container, and the user could not read
    it anyway."""
    config = json.loads(json.dumps(config))
    linux = config.setdefault("linux", {})
    spaces = [n for n in linux.get("namespaces") or [] if n.get("type") != "user"]
    linux["namespaces"] = [*spaces, {"type": "user"}]
    linux["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
    linux["gidMappings"] = [{"containerID": 0, "hostID": gid, "size": 1}]
    process = config.setdefault("process", {})
    process["user"] = {"uid": 0, "gid": 0}
    mounts = []
    for m in config.get("mounts") or []:
        kind = m.get("type")
        if kind in _ROOTLESS_DROP:
            continue
        if kind in _ROOTLESS_BIND:
            m = {"destination": m["destination"], "type": "bind",
                 "source": _ROOTLESS_BIND[kind],
                 "options": ["rbind", "nosuid", "noexec", "nodev",
                             *(["ro"] if "ro" in (m.get("options") or []) else [])]}
        elif kind == "bind" and not reachable(m.get("source", "")):
            continue
        elif kind == "devpts":
            m = {**m, "options": [o for o in m.get("options") or [] if not o.startswith("gid=")]}
        mounts.append(m)
    config["mounts"] = mounts
    return config


def root_entries(root: str) -> list[tuple[str, str, str]]:
    """(name, "dir" | "file" | "symlink", symlink target) of a root file system's top level."""
    out = []
    with os.scandir(root) as it:
        for entry in sorted(it, key=lambda e: e.name):
            if entry.is_symlink():
                out.append((entry.name, "symlink", os.readlink(entry.path)))
            elif entry.is_dir():
                out.append((entry.name, "dir", ""))
            else:
                out.append((entry.name, "file", ""))
    return out


def build_root(rootfs: Path, entries: Sequence[tuple[str, str, str]]) -> None:
    """The job's root: a mount point per directory or file, the image's symlinks as they are
    (merged /usr: /bin -> usr/bin)."""
    rootfs.mkdir(parents=True, exist_ok=True)
    for name, kind, target in entries:
        path = rootfs / name
        if kind == "symlink":
            if not path.is_symlink():
                path.symlink_to(target)
        elif kind == "dir":
            path.mkdir(exist_ok=True)
        else:
            path.touch(exist_ok=True)


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
    root = image_root(image_config, image)
    try:
        entries = root_entries(root)
        build_root(bundle / "rootfs", entries)
    except OSError as exc:
        raise SupervisorError(f"cannot build the job's OCI bundle in {bundle} from the image's "
                              f"root {root}: {exc.strerror or exc}") from None
    config = bundle_config(image_config, image, plan, submit_dir,
                           [(n, k) for n, k, _ in entries if k != "symlink"])
    if os.geteuid() != 0:  # Slurm runs the job user's runc: a rootless container
        config = rootless(config, os.geteuid(), os.getegid())
    atomic_write(bundle / "config.json", json.dumps(config, indent=1))
    argv[argv.index(word)] = f"--container={bundle}"
    binds = [(m.get("source", ""), m.get("destination", "")) for m in config["mounts"]
             if m.get("type") == "bind"]
    return argv, [f"container: Slurm OCI bundle {bundle} (image {image}, "
                  f"{len(config['mounts'])} mounts, cwd {config['process']['cwd']})",
                  hpctrain_inside(package, binds, root)]
