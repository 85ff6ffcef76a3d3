"""What the devcluster writes for Slurm's OCI containers (pure): oci.conf, and the host
image's bundle (the host's directories bound over an empty root)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from hpctrain.devcluster.config import Paths

# ---- containers: Slurm's own OCI support with runc (crun fails on this machine kind) ----
# Host directories the devcluster's image binds (those that exist): the system, Python
# installs under /root (pyenv) and /opt, and homes, /work, /tmp and the devcluster's shared
# storage, so a job's venv, code and checkpoints are where they are on the host.
HOST_IMAGE_BINDS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/root", "/home",
                    "/opt", "/srv", "/work", "/tmp", "/var/lib/hpctrain")
# Never bound whole: runc mounts its own /proc, /dev and /sys, and /var holds the image.
_NOT_BINDABLE = ("/", "/proc", "/dev", "/sys", "/run", "/var")


def image_binds(extra: Sequence[str], exists: Callable[[str], bool] = os.path.exists) -> list[str]:
    """The host directories the image binds: HOST_IMAGE_BINDS and the top-level directory
    of each ``extra`` path (the Python running ``devcluster up``, its venv, the hpctrain
    package: a project cloned to /check/... must find its venv in the container as it
    does on the host), those that exist, each once."""
    tops = [d for d in (_top(p) for p in extra) if d not in _NOT_BINDABLE]
    out: list[str] = []
    for d in (*HOST_IMAGE_BINDS, *tops):
        if d not in out and exists(d):
            out.append(d)
    return out


def _top(path: str) -> str:
    """``/check/work/x`` -> ``/check``; a path under /var/lib/hpctrain stays under it."""
    path = os.path.abspath(path)
    for bind in HOST_IMAGE_BINDS:
        if path == bind or path.startswith(bind.rstrip("/") + "/"):
            return bind
    parts = path.split("/")
    return "/" + parts[1] if len(parts) > 1 and parts[1] else "/"


def oci_conf(paths: Paths) -> str:
    """oci.conf beside slurm.conf: how slurmstepd runs a container (runc; Slurm 22.05 keys).

    Container names carry the node (%n), so the emulated nodes of this one machine never
    share one. Slurm runs RunTimeRun as the job's user (a rootless runc for anyone but
    root) and the others as root, so runc's state directory ``run/runc`` is sticky and
    open to all, like /tmp: each container's state is a directory of its own user's
    (the name carries the user, %u)."""
    runc = f"runc --root={paths.runc_root}"
    name = "%n.%u.%j.%s.%t"
    return f"""\
# Written by `hpctrain devcluster up`. Slurm's OCI containers (srun --container=BUNDLE).
RunTimeQuery="{runc} state {name}"
RunTimeRun="{runc} run {name} -b %b"
RunTimeKill="{runc} kill -a {name}"
RunTimeDelete="{runc} delete --force {name}"
"""


def host_image_config(spec: dict, binds: list[str]) -> dict:
    """The host image's config.json from ``runc spec``'s: the host's directories
    bind-mounted over an empty root, and only a mount namespace (with a pid namespace every
    torchrun agent is pid 1 on one hostname, and the c10d rendezvous across emulated nodes
    hangs; a network namespace would cut the ranks off from each other). No cgroup
    settings: runc needs no cgroup setup then."""
    config = json.loads(json.dumps(spec))
    config["root"] = {"path": "rootfs", "readonly": False}
    config.pop("hostname", None)
    process = config.setdefault("process", {})
    process["terminal"] = False
    linux = config.setdefault("linux", {})
    linux["namespaces"] = [{"type": "mount"}]
    for key in ("resources", "cgroupsPath", "seccomp"):
        linux.pop(key, None)
    mounts = [m for m in config.get("mounts", []) if m.get("destination") not in binds]
    mounts += [{"destination": d, "type": "bind", "source": d, "options": ["rbind", "rw"]}
               for d in binds]
    config["mounts"] = mounts
    return config
