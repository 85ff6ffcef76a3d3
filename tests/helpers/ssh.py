"""The devcluster's SSH login for the tests (``hpctrain devcluster up --ssh``): a real
OpenSSH server on 127.0.0.1 that an ordinary user reaches with her own key, as she would a
cluster's login node (the ``--host`` tests).

:func:`ensure_ssh` is the one way in: any test file calls it (from a fixture that uses the
``cluster`` fixture) and gets the host alias for ``ssh`` and ``hpctrain --host``.
"""

from __future__ import annotations

import sys

from hpctrain.devcluster.sshconf import SSH_ALIAS, SSH_PORT
from helpers import admin

ALIAS = SSH_ALIAS   # the Host block `up --ssh` writes into the user's ~/.ssh
PORT = SSH_PORT     # the tests use the default port
_ready: set[str] = set()


def ensure_ssh(user: str) -> str:
    """Make sure the devcluster's sshd runs and ``user`` logs in with her key: ``devcluster
    up --ssh --ssh-user USER`` as root (through :mod:`helpers.admin`, idempotent), once per
    user and test session. Returns the host alias (``ssh hpctrain-devcluster``)."""
    if user not in _ready:
        admin.run([sys.executable, "-m", "hpctrain", "devcluster", "up", "--ssh",
                   "--ssh-user", user])
        _ready.add(user)
    return ALIAS
