"""This user's private directory, on the client, for ``--host``'s unix sockets: ssh's
control sockets (one shared connection per host, :mod:`hpctrain.remote.ssh`) and the local
ends of the warm servers' forwarded sockets (:mod:`hpctrain.remote.warm`).
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain import access
from hpctrain.errors import RemoteError
from hpctrain.jobs.paths import cache_dir

SOCKET_PATH_MAX = 100        # sun_path is 108 bytes; ssh appends a temporary suffix


def control_dir() -> Path:
    """A 0700 directory of this user's for the control sockets: under the cache dir, or
    /tmp/hpctrain-ssh-UID when that path would be too long for a socket."""
    for path in (cache_dir() / "ssh", Path(f"/tmp/hpctrain-ssh-{os.getuid()}")):
        if len(str(path)) + 42 > SOCKET_PATH_MAX:
            continue
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if access.own_dir(path, 0o700) is None:
            return path
    raise RemoteError("no private directory for ssh's control socket (~/.cache/hpctrain/"
                      f"ssh or /tmp/hpctrain-ssh-{os.getuid()}): set HPCTRAIN_CACHE_DIR to "
                      "a short directory of your own")
