"""The devcluster's accounting: MariaDB made and started, and what slurmdbd must know
(the cluster, one account, the users). Idempotent: ``up`` runs it on every call.
"""

from __future__ import annotations

import os
import pwd
import time

from hpctrain.devcluster import config, daemons
from hpctrain.devcluster.config import Paths
from hpctrain.errors import SlurmError
from hpctrain.slurm import client


def start_database(paths: Paths, mariadb: daemons.Daemon, env: dict[str, str]) -> None:
    """Initialise the data directory once, start MariaDB and make the accounting database
    and its user (safe to run again)."""
    p = paths
    if not (p.mysql_data / "mysql").is_dir():
        p.mysql_data.mkdir(parents=True, exist_ok=True)
        daemons.run_checked(["chown", "-R", "mysql:mysql", str(p.mysql_data)])
        daemons.run_checked(["/usr/bin/mariadb-install-db", "--no-defaults",
                             f"--datadir={p.mysql_data}", "--user=mysql",
                             "--auth-root-authentication-method=socket",
                             "--skip-test-db"], env=env)
    p.mysql_run.mkdir(exist_ok=True)
    daemons.run_checked(["chown", "mysql:mysql", str(p.mysql_run)])
    daemons.start(mariadb, env)
    deadline = time.monotonic() + 30
    while not p.mysql_socket.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    daemons.run_checked(["/usr/bin/mariadb", "--no-defaults", f"--socket={p.mysql_socket}",
                         "-u", "root"], env=env,
                        input=config.db_setup_sql(p.db_password_file.read_text().strip()))


def register(env: dict[str, str]) -> None:
    """Register the cluster, its account and the users with slurmdbd (idempotent; waits up
    to 30 s for a slurmdbd just started)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            existing = client.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster"],
                                  env=env, timeout=10).stdout.split()
            break
        except SlurmError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    if config.CLUSTER_NAME not in existing:
        client.run(["sacctmgr", "-i", "add", "cluster", config.CLUSTER_NAME], env=env)
    accounts = client.run(["sacctmgr", "-n", "-P", "list", "account", "format=Account"],
                          env=env).stdout.split()
    if config.ACCOUNT not in accounts:
        client.run(["sacctmgr", "-i", "add", "account", config.ACCOUNT,
                    f"cluster={config.CLUSTER_NAME}"], env=env)
    users = client.run(["sacctmgr", "-n", "-P", "list", "user", "format=User"],
                       env=env).stdout.split()
    # PrivateData=jobs: slurmdbd shows a user's own jobs only to a user it knows, as on a
    # site whose admins add every user; here every login account is one
    wanted = {"root", os.environ.get("SUDO_USER") or "root", *config.login_users(
        (e.pw_name, e.pw_uid, e.pw_shell) for e in pwd.getpwall())}
    for user in sorted(wanted - set(users)):
        client.run(["sacctmgr", "-i", "add", "user", user, f"account={config.ACCOUNT}",
                    f"cluster={config.CLUSTER_NAME}"], env=env)
